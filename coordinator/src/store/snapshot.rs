//! Snapshots (DESIGN §3.4): their formats, building and installing them,
//! and their files.
//!
//! A snapshot body is the state tables with their values still encoded
//! ([`TableDump`]). Format 4 (today's) starts with a tag and keys dedup
//! records by [`RequestKey`]; formats 3 and 2 (dedup by request id text;
//! 2 without signing keys) are still read, from files and from leaders not
//! upgraded yet, and a state file from before format 4 is migrated when
//! opened. A snapshot file is `[u32 LE header length][header][body]`,
//! written atomically; every body this store hands out is format 4.

use std::io::{self, Cursor, Write as _};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use redb::{ReadableTable, TableDefinition, TableHandle};
use serde::{Deserialize, Serialize};
use tokio::sync::oneshot;

use super::codec::{decode, encode, io_err};
use super::persister::{PersistOp, persister_gone};
use super::sm_store::Shared;
use super::tables::{DEDUP, ENDED, LEGACY_DEDUP, RESOURCES, SIGNING_KEYS, TableDump, state_from_dump, write_rows};
use super::{Snapshot, SnapshotMeta};
use crate::audit::AuditRecord;
use crate::state_machine::{LockState, RequestKey};
use crate::types::RequestId;

/// The snapshot format written: 4 keys dedup records by [`RequestKey`] and
/// starts its body with [`FORMAT_4_TAG`]; 3 added the signing keys. Format 3
/// and 2 files and bodies are still read.
const SNAPSHOT_FORMAT: u32 = 4;

/// Dedup records by request id text, with signing keys; still accepted.
const SNAPSHOT_FORMAT_V3: u32 = 3;

/// No signing keys; still accepted.
const SNAPSHOT_FORMAT_V2: u32 = 2;

/// The first value of a format-4 body ("fencer04"). Bodies sent between
/// nodes carry no format number; formats 2 and 3 begin with the number of
/// resources, which is never this large, so no body passes for another
/// format.
const FORMAT_4_TAG: u64 = u64::from_be_bytes(*b"fencer04");

/// The snapshot file's header. The file is `[u32 LE header length][header][state]`,
/// so `get_current_snapshot` needs nothing else and the state is written
/// without another copy.
#[derive(Serialize, Deserialize)]
struct SnapshotHeader {
    format: u32,
    meta: SnapshotMeta,
}

/// A format-4 body as written: the tag, then the tables.
#[derive(Serialize)]
struct TaggedDumpRef<'a> {
    tag: u64,
    dump: &'a TableDump,
}

/// A format-4 body as read.
#[derive(Deserialize)]
struct TaggedDump {
    tag: u64,
    dump: TableDump,
}

/// A format-3 snapshot body: dedup records by request id text.
#[derive(Debug, Default, Serialize, Deserialize)]
struct TableDumpV3 {
    resources: Vec<(String, Vec<u8>)>,
    dedup: Vec<(String, Vec<u8>)>,
    ended: Vec<(u128, Vec<u8>)>,
    signing_keys: Vec<(String, Vec<u8>)>,
}

/// A format-2 snapshot body: the tables before signing keys existed.
#[derive(Debug, Default, Serialize, Deserialize)]
struct TableDumpV2 {
    resources: Vec<(String, Vec<u8>)>,
    dedup: Vec<(String, Vec<u8>)>,
    ended: Vec<(u128, Vec<u8>)>,
}

/// Re-keys dedup rows stored by request id text (formats 2 and 3).
fn keyed_dedup(rows: Vec<(String, Vec<u8>)>) -> io::Result<Vec<(u128, Vec<u8>)>> {
    rows.into_iter()
        .map(|(id, v)| {
            let id = RequestId::new(id).map_err(|e| io_err("stored request id", e))?;
            Ok((RequestKey::of(&id).to_u128(), v))
        })
        .collect()
}

impl TableDump {
    /// Encodes the tables as a format-4 body.
    fn encode_body(&self) -> io::Result<Vec<u8>> {
        encode(&TaggedDumpRef { tag: FORMAT_4_TAG, dump: self })
    }

    /// Decodes a snapshot body of format `format` (4, 3 or 2).
    fn decode_format(bytes: &[u8], format: u32) -> io::Result<Self> {
        match format {
            SNAPSHOT_FORMAT => {
                let body: TaggedDump = exact(bytes, "snapshot")?;
                if body.tag != FORMAT_4_TAG {
                    return Err(io_err("decode snapshot", "not a format-4 body (its tag is wrong)"));
                }
                Ok(body.dump)
            }
            SNAPSHOT_FORMAT_V3 => {
                let v3: TableDumpV3 = exact(bytes, "format-3 snapshot")?;
                Ok(Self {
                    resources: v3.resources,
                    dedup: keyed_dedup(v3.dedup)?,
                    ended: v3.ended,
                    signing_keys: v3.signing_keys,
                })
            }
            SNAPSHOT_FORMAT_V2 => {
                let v2: TableDumpV2 = exact(bytes, "format-2 snapshot")?;
                Ok(Self {
                    resources: v2.resources,
                    dedup: keyed_dedup(v2.dedup)?,
                    ended: v2.ended,
                    signing_keys: Vec::new(),
                })
            }
            other => Err(io_err("snapshot", format!("unknown snapshot format {other}"))),
        }
    }

    /// Decodes a snapshot body received from a leader, which carries no
    /// format number: format 4 (it starts with its tag), else 3, else 2 (a
    /// leader not upgraded yet). A format-2 body is exactly the first three
    /// lists, so it never decodes as format 3 (the fourth list is missing),
    /// and a format-3 body never decodes exactly as format 2 (bytes would be
    /// left over). Returns the dump and the format it was in.
    fn decode_any(bytes: &[u8]) -> io::Result<(Self, u32)> {
        let mut errors = Vec::new();
        for format in [SNAPSHOT_FORMAT, SNAPSHOT_FORMAT_V3, SNAPSHOT_FORMAT_V2] {
            match Self::decode_format(bytes, format) {
                Ok(dump) => return Ok((dump, format)),
                Err(e) => errors.push(format!("format {format}: {e}")),
            }
        }
        Err(io_err("snapshot", format!("no known format fits ({})", errors.join("; "))))
    }
}

/// Moves the dedup rows of a file written before format 4 (keyed by request
/// id text) into the table keyed by [`RequestKey`], and drops the old table,
/// in the caller's transaction.
pub(super) fn migrate_legacy_dedup(w: &redb::WriteTransaction) -> io::Result<()> {
    let legacy = w.list_tables().map_err(|e| io_err("list tables", e))?.any(|t| t.name() == LEGACY_DEDUP.name());
    if !legacy {
        return Ok(());
    }
    let mut rows = Vec::new();
    for item in
        w.open_table(LEGACY_DEDUP).map_err(|e| io_err("open dedup", e))?.iter().map_err(|e| io_err("iter", e))?
    {
        let (k, v) = item.map_err(|e| io_err("read dedup", e))?;
        rows.push((k.value().to_string(), v.value().to_vec()));
    }
    let rows: Vec<_> = keyed_dedup(rows)?.into_iter().map(|(k, v)| (k, Some(v))).collect();
    write_rows(w, DEDUP, &rows, "dedup")?;
    w.delete_table(LEGACY_DEDUP).map_err(|e| io_err("drop the old dedup table", e))?;
    tracing::info!(records = rows.len(), "moved dedup records to the format-4 table");
    Ok(())
}

/// Decodes a postcard value that must use every byte.
fn exact<T: serde::de::DeserializeOwned>(bytes: &[u8], what: &str) -> io::Result<T> {
    let (value, rest) = postcard::take_from_bytes(bytes).map_err(|e| {
        io::Error::new(io::ErrorKind::InvalidData, format!("decode {what}: {e} ({} bytes)", bytes.len()))
    })?;
    if !rest.is_empty() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("decode {what}: {} bytes left over", rest.len()),
        ));
    }
    Ok(value)
}

/// A format-4 body encoded straight from the state file's tables, row by
/// row: the same bytes as `dump_tables(r)?.encode_body()`, without first
/// copying every row into a [`TableDump`] (at the seed workload that copy was
/// ~80 MB in ~500,000 small allocations, at every snapshot).
struct BodyFromTables<'a>(&'a redb::ReadTransaction);

/// The tables of [`BodyFromTables`], in [`TableDump`]'s field order.
struct TablesFrom<'a>(&'a redb::ReadTransaction);

/// One table's rows as a postcard sequence of `(key, value)` pairs.
struct RowsFrom<'a, K: redb::Key + 'static> {
    r: &'a redb::ReadTransaction,
    def: TableDefinition<'static, K, &'static [u8]>,
}

impl Serialize for BodyFromTables<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct as _;
        let mut body = s.serialize_struct("TaggedDump", 2)?;
        body.serialize_field("tag", &FORMAT_4_TAG)?;
        body.serialize_field("dump", &TablesFrom(self.0))?;
        body.end()
    }
}

impl Serialize for TablesFrom<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct as _;
        let r = self.0;
        let mut tables = s.serialize_struct("TableDump", 4)?;
        tables.serialize_field("resources", &RowsFrom { r, def: RESOURCES })?;
        tables.serialize_field("dedup", &RowsFrom { r, def: DEDUP })?;
        tables.serialize_field("ended", &RowsFrom { r, def: ENDED })?;
        tables.serialize_field("signing_keys", &RowsFrom { r, def: SIGNING_KEYS })?;
        tables.end()
    }
}

impl<K> Serialize for RowsFrom<'_, K>
where
    K: redb::Key + 'static,
    for<'k> K::SelfType<'k>: Serialize,
{
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use redb::ReadableTableMetadata as _;
        use serde::ser::{Error as _, SerializeSeq as _};
        let err = |e: &dyn std::fmt::Display| S::Error::custom(format!("read {}: {e}", self.def));
        let table = self.r.open_table(self.def).map_err(|e| err(&e))?;
        let len = usize::try_from(table.len().map_err(|e| err(&e))?).map_err(|e| err(&e))?;
        let mut seq = s.serialize_seq(Some(len))?;
        for item in table.iter().map_err(|e| err(&e))? {
            let (k, v) = item.map_err(|e| err(&e))?;
            seq.serialize_element(&(k.value(), v.value()))?;
        }
        seq.end()
    }
}

/// The newest snapshot file, its body in today's format (module docs).
pub(super) async fn current_snapshot(dir: &Path) -> io::Result<Option<Snapshot>> {
    let dir = dir.to_path_buf();
    tokio::task::spawn_blocking(move || {
        let Some(path) = latest_snapshot(&dir)? else { return Ok(None) };
        let mut bytes = std::fs::read(&path).map_err(|e| io_err(&format!("read {}", path.display()), e))?;
        let damaged = || io_err("snapshot", format!("{} is truncated or damaged", path.display()));
        let len = bytes.get(..4).map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize).ok_or_else(damaged)?;
        let header: SnapshotHeader = decode(bytes.get(4..4 + len).ok_or_else(damaged)?, "snapshot header")?;
        let state = bytes.split_off(4 + len);
        let state = match header.format {
            SNAPSHOT_FORMAT => state,
            // An older file: re-encode its body in today's format, so
            // every body this store hands out is format 4.
            f @ (SNAPSHOT_FORMAT_V3 | SNAPSHOT_FORMAT_V2) => TableDump::decode_format(&state, f)?.encode_body()?,
            other => {
                return Err(io_err("snapshot", format!("unknown format {other} in {}", path.display())));
            }
        };
        Ok(Some(Snapshot { meta: header.meta, snapshot: Cursor::new(state) }))
    })
    .await
    .map_err(|e| io_err("snapshot task", e))?
}

fn snapshot_name(index: u64) -> String {
    format!("snapshot-{index:020}.bin")
}

fn latest_snapshot(dir: &Path) -> io::Result<Option<PathBuf>> {
    let mut best: Option<PathBuf> = None;
    for entry in std::fs::read_dir(dir).map_err(|e| io_err(&format!("list {}", dir.display()), e))? {
        let path = entry?.path();
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or_default();
        if name.starts_with("snapshot-") && name.ends_with(".bin") && best.as_ref().is_none_or(|b| path > *b) {
            best = Some(path);
        }
    }
    Ok(best)
}

/// Writes the snapshot file atomically (temp file, fsync, rename, fsync dir)
/// and removes older ones.
fn write_snapshot_file(dir: &Path, meta: &SnapshotMeta, state: &[u8]) -> io::Result<usize> {
    let index = meta.last_log_id.as_ref().map_or(0, |l| l.index);
    let header = encode(&SnapshotHeader { format: SNAPSHOT_FORMAT, meta: meta.clone() })?;
    let final_path = dir.join(snapshot_name(index));
    let tmp = dir.join(format!("{}.tmp", snapshot_name(index)));
    {
        let mut f = std::fs::File::create(&tmp).map_err(|e| io_err(&format!("create {}", tmp.display()), e))?;
        let mut write = |b: &[u8]| f.write_all(b).map_err(|e| io_err(&format!("write {}", tmp.display()), e));
        write(&(header.len() as u32).to_le_bytes())?;
        write(&header)?;
        write(state)?;
        f.sync_all().map_err(|e| io_err(&format!("fsync {}", tmp.display()), e))?;
    }
    std::fs::rename(&tmp, &final_path).map_err(|e| io_err("rename snapshot", e))?;
    std::fs::File::open(dir).and_then(|d| d.sync_all()).map_err(|e| io_err("fsync snapshot dir", e))?;
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or_default().to_string();
        if name.starts_with("snapshot-") && path != final_path {
            let _ = std::fs::remove_file(&path);
        }
    }
    Ok(4 + header.len() + state.len())
}

/// Builds a snapshot without stalling applies: the persister makes the state
/// file durable and dumps it at exactly the last persisted batch (applies go
/// on meanwhile, queueing for the persister); encoding and writing the file
/// happen on a blocking thread.
pub(super) async fn build(shared: &Shared) -> io::Result<Snapshot> {
    let started = shared.clock.now();
    let (done, rx) = oneshot::channel();
    shared.send(PersistOp::Snapshot { done }).await?;
    let (meta, view) = rx.await.map_err(|_| persister_gone())??;
    let dumped = started.elapsed();
    let dir = shared.snapshot_dir.clone();
    let file_meta = meta.clone();
    // Sized like the previous body, so the buffer does not double its way up.
    let hint = usize::try_from(shared.metrics.snapshot_bytes.get()).unwrap_or(0);
    let (body, size) = tokio::task::spawn_blocking(move || -> io::Result<(Vec<u8>, usize)> {
        let body = postcard::to_extend(&BodyFromTables(&view), Vec::with_capacity(hint + hint / 16))
            .map_err(|e| io_err("encode snapshot", e))?;
        drop(view);
        let size = write_snapshot_file(&dir, &file_meta, &body)?;
        Ok((body, size))
    })
    .await
    .map_err(|e| io_err("snapshot task", e))??;
    shared.metrics.snapshot_bytes.set(size as i64);
    shared.metrics.snapshot_build_seconds.observe(started.elapsed().as_secs_f64());
    tracing::info!(
        index = ?meta.last_log_id.as_ref().map(|l| l.index),
        bytes = size,
        dump_ms = dumped.as_millis() as u64,
        total_ms = started.elapsed().as_millis() as u64,
        "built snapshot"
    );
    Ok(Snapshot { meta, snapshot: Cursor::new(body) })
}

/// Installs a snapshot: validates it, has the persister replace every table,
/// writes the snapshot file, then swaps the in-memory state. The file comes
/// after the tables (as in `build`): a snapshot file on disk never runs ahead
/// of the state file.
pub(super) async fn install(shared: &Shared, meta: SnapshotMeta, bytes: Vec<u8>) -> io::Result<()> {
    let (dump, new_state, body) =
        tokio::task::spawn_blocking(move || -> io::Result<(TableDump, LockState, Vec<u8>)> {
            let (dump, format) = TableDump::decode_any(&bytes)?;
            let state = state_from_dump(&dump)?;
            // The file always holds today's format, whatever the leader sent.
            let body = if format == SNAPSHOT_FORMAT { bytes } else { dump.encode_body()? };
            Ok((dump, state, body))
        })
        .await
        .map_err(|e| io_err("install task", e))??;
    let (done, rx) = oneshot::channel();
    let audit = match (shared.audit, &meta.last_log_id) {
        (Some(_), Some(l)) => Some(Box::new(AuditRecord::snapshot_installed(l.index, shared.clock.wall_ms()))),
        _ => None,
    };
    shared.send(PersistOp::Replace { meta: meta.clone(), dump: Arc::new(dump), audit, done }).await?;
    rx.await.map_err(|_| persister_gone())??;
    let (dir, file_meta) = (shared.snapshot_dir.clone(), meta.clone());
    tokio::task::spawn_blocking(move || write_snapshot_file(&dir, &file_meta, &body))
        .await
        .map_err(|e| io_err("install task", e))??;
    {
        let mut state = shared.state.write().unwrap_or_else(|p| p.into_inner());
        *state = new_state;
        shared.metrics.locks_held.set(state.lock_count() as i64);
        shared.metrics.waiters.set(state.waiter_count() as i64);
        shared.observer.on_state_replaced(&state);
    }
    let mut applied = shared.applied.lock().unwrap_or_else(|p| p.into_inner());
    *applied = (meta.last_log_id, meta.last_membership.clone());
    tracing::info!(index = ?meta.last_log_id.as_ref().map(|l| l.index), "installed snapshot");
    Ok(())
}

#[cfg(test)]
mod tests {
    //! Signing keys survive a restart and travel in snapshots; format-2
    //! and 3 snapshots, and state files from before format 4, still load.

    use futures::stream;
    use openraft::alias::EntryOf;
    use openraft::entry::RaftEntry as _;
    use openraft::storage::{RaftSnapshotBuilder, RaftStateMachine};
    use redb::{Database, ReadableDatabase};
    use tempfile::TempDir;

    use super::*;
    use crate::clock::Clock;
    use crate::metrics::Metrics;
    use crate::raft::TypeConfig;
    use crate::state_machine::{AcquireCmd, Command, LogCommand};
    use crate::store::tables::dump_tables;
    use crate::store::{NoObserver, SNAPSHOT_DIR, STATE_FILE, StateMachineStore};
    use crate::types::{LeaseId, ResourceName};
    use fencer_token::KeyId;

    fn open(dir: &Path) -> StateMachineStore {
        StateMachineStore::open(
            &dir.join(STATE_FILE),
            &dir.join(SNAPSHOT_DIR),
            Arc::new(NoObserver),
            Metrics::new(),
            Clock,
            None,
        )
        .unwrap()
    }

    /// Reopens a data dir once the previous store's persister let it go.
    async fn reopen(dir: &Path) -> StateMachineStore {
        for _ in 0..200 {
            if let Ok(sm) = StateMachineStore::open(
                &dir.join(STATE_FILE),
                &dir.join(SNAPSHOT_DIR),
                Arc::new(NoObserver),
                Metrics::new(),
                Clock,
                None,
            ) {
                return sm;
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        panic!("the state file did not reopen");
    }

    fn entry(index: u64, cmd: Command) -> EntryOf<TypeConfig> {
        EntryOf::<TypeConfig>::new_normal(
            openraft::testing::log_id::<TypeConfig>(1, 1, index),
            LogCommand { at_ms: index, cmd },
        )
    }

    fn keys_cmds() -> Vec<Command> {
        let signer = fencer_token::Signer::from_secret_bytes(KeyId::new("k").unwrap(), &[9; 32]);
        vec![
            Command::RegisterSigningKey {
                kid: KeyId::new("n1-a").unwrap(),
                node_id: 1,
                public_key: signer.public_key().to_bytes(),
                not_before_unix_ms: 10,
            },
            Command::RetireSigningKey { kid: KeyId::new("n1-a").unwrap(), not_after_unix_ms: 99 },
        ]
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn t30_signing_keys_survive_restart_and_snapshot_install() {
        let dir = TempDir::new().unwrap();
        let mut sm = open(dir.path());
        let entries: Vec<_> = keys_cmds().into_iter().enumerate().map(|(i, c)| entry(i as u64 + 1, c)).collect();
        sm.apply(stream::iter(entries.into_iter().map(|e| Ok((e, None))))).await.unwrap();
        let expected = sm.read().signing_keys().clone();
        assert_eq!(expected.len(), 1);
        assert_eq!(expected.values().next().unwrap().not_after_unix_ms, Some(99));
        let snapshot = sm.build_snapshot().await.unwrap();
        sm.sync().await.unwrap();
        drop(sm);

        let sm = reopen(dir.path()).await;
        assert_eq!(sm.read().signing_keys(), &expected, "the state file holds the keys");
        drop(sm);

        let other = TempDir::new().unwrap();
        let mut fresh = open(other.path());
        let body = snapshot.snapshot.into_inner();
        fresh.install_snapshot(&snapshot.meta, Cursor::new(body)).await.unwrap();
        assert_eq!(fresh.read().signing_keys(), &expected, "a snapshot carries the keys");
        let current = fresh.get_current_snapshot().await.unwrap().expect("installed snapshot kept");
        assert_eq!(
            TableDump::decode_format(current.snapshot.get_ref(), SNAPSHOT_FORMAT).unwrap().signing_keys.len(),
            1
        );
    }

    fn acquire_cmd() -> Command {
        Command::Acquire(AcquireCmd {
            request_id: RequestId::new("request-0001").unwrap(),
            resource: ResourceName::new("orders/1").unwrap(),
            holder: crate::types::Holder::new("h").unwrap(),
            ttl_ms: 30_000,
            wait: false,
            lease_id: LeaseId::from_u128(7),
            max_waiters: 8,
        })
    }

    /// The one acquire's retry still finds its record (I7).
    fn assert_retry_replays(sm: &StateMachineStore, what: &str) {
        let state = sm.read();
        assert!(state.resource(&ResourceName::new("orders/1").unwrap()).is_some(), "{what}: the lock");
        let record = state.dedup(&RequestId::new("request-0001").unwrap());
        assert!(
            matches!(record.map(|r| &r.outcome), Some(crate::state_machine::DedupOutcome::Granted { lease_id, .. }) if lease_id.to_u128() == 7),
            "{what}: the request id's record, found by its text: {record:?}"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn t31_format_2_and_3_snapshots_still_load() {
        // A state with one held lock and its dedup record, dumped the way
        // formats 3 (dedup by request id text) and 2 (no signing keys) did.
        let src = TempDir::new().unwrap();
        let mut sm = open(src.path());
        sm.apply(stream::iter([Ok((entry(1, acquire_cmd()), None))])).await.unwrap();
        let v4 = sm.build_snapshot().await.unwrap();
        let dump = TableDump::decode_format(v4.snapshot.get_ref(), SNAPSHOT_FORMAT).unwrap();
        assert_eq!(dump.dedup.len(), 1);
        let text_dedup = vec![("request-0001".to_string(), dump.dedup[0].1.clone())];
        let v3 = encode(&TableDumpV3 {
            resources: dump.resources.clone(),
            dedup: text_dedup.clone(),
            ended: dump.ended.clone(),
            signing_keys: dump.signing_keys.clone(),
        })
        .unwrap();
        let v2 = encode(&TableDumpV2 { resources: dump.resources, dedup: text_dedup, ended: dump.ended }).unwrap();
        for (body, format) in [(&v3, SNAPSHOT_FORMAT_V3), (&v2, SNAPSHOT_FORMAT_V2)] {
            assert!(TableDump::decode_format(body, SNAPSHOT_FORMAT).is_err(), "format {format} is not format 4");
            assert!(
                TableDump::decode_format(v4.snapshot.get_ref(), format).is_err(),
                "format 4 is not format {format}"
            );
        }
        assert!(TableDump::decode_format(&v2, SNAPSHOT_FORMAT_V3).is_err(), "format 2 is not format 3");
        assert!(TableDump::decode_format(&v3, SNAPSHOT_FORMAT_V2).is_err(), "format 3 is not format 2");

        for (body, format) in [(v3, SNAPSHOT_FORMAT_V3), (v2, SNAPSHOT_FORMAT_V2)] {
            // Sent by a leader that was not upgraded yet.
            let dst = TempDir::new().unwrap();
            let mut fresh = open(dst.path());
            fresh.install_snapshot(&v4.meta, Cursor::new(body.clone())).await.unwrap();
            assert_retry_replays(&fresh, &format!("format-{format} body installed"));

            // A file left by the previous version, read at start.
            let dir = dst.path().join(SNAPSHOT_DIR);
            for f in std::fs::read_dir(&dir).unwrap() {
                std::fs::remove_file(f.unwrap().path()).unwrap();
            }
            let header = encode(&SnapshotHeader { format, meta: v4.meta.clone() }).unwrap();
            let mut file = (header.len() as u32).to_le_bytes().to_vec();
            file.extend_from_slice(&header);
            file.extend_from_slice(&body);
            std::fs::write(dir.join(snapshot_name(1)), file).unwrap();
            let current = fresh.get_current_snapshot().await.unwrap().expect("the old file is read");
            let today = TableDump::decode_format(current.snapshot.get_ref(), SNAPSHOT_FORMAT).unwrap();
            assert_eq!((today.resources.len(), today.dedup.len()), (1, 1), "format {format} handed out as format 4");
        }
    }

    /// The state file opened with redb alone, once the store's persister
    /// has let go of it.
    async fn raw_db(dir: &Path) -> Database {
        for _ in 0..200 {
            if let Ok(db) = Database::create(dir.join(STATE_FILE)) {
                return db;
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        panic!("the state file stayed locked");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn t32_a_state_file_with_text_keyed_dedup_is_moved_on_open() {
        let dir = TempDir::new().unwrap();
        let mut sm = open(dir.path());
        sm.apply(stream::iter([Ok((entry(1, acquire_cmd()), None))])).await.unwrap();
        sm.sync().await.unwrap();
        drop(sm);
        // Rewrite the file the way versions before format 4 kept dedup rows.
        {
            let db = raw_db(dir.path()).await;
            let w = db.begin_write().unwrap();
            let rows = {
                let t = w.open_table(DEDUP).unwrap();
                t.iter().unwrap().map(|i| i.unwrap().1.value().to_vec()).collect::<Vec<_>>()
            };
            assert_eq!(rows.len(), 1);
            w.open_table(LEGACY_DEDUP).unwrap().insert("request-0001", rows[0].as_slice()).unwrap();
            assert!(w.delete_table(DEDUP).unwrap());
            w.commit().unwrap();
        }
        let sm = reopen(dir.path()).await;
        assert_retry_replays(&sm, "after the move");
        drop(sm);
        let sm = reopen(dir.path()).await;
        assert_retry_replays(&sm, "reopened once more");
        drop(sm);
        let db = raw_db(dir.path()).await;
        let r = db.begin_read().unwrap();
        assert!(r.list_tables().unwrap().all(|t| t.name() != LEGACY_DEDUP.name()), "the old table is dropped");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn t33_a_snapshot_body_streamed_from_the_tables_is_the_dumped_one() {
        let dir = TempDir::new().unwrap();
        let mut sm = open(dir.path());
        let mut cmds = keys_cmds();
        cmds.push(acquire_cmd());
        cmds.push(Command::Release {
            resource: ResourceName::new("orders/1").unwrap(),
            lease_id: LeaseId::from_u128(7),
        });
        cmds.push(Command::Acquire(AcquireCmd {
            request_id: RequestId::new("request-0002").unwrap(),
            resource: ResourceName::new("orders/2").unwrap(),
            holder: crate::types::Holder::new("h").unwrap(),
            ttl_ms: 30_000,
            wait: false,
            lease_id: LeaseId::from_u128(u128::MAX - 1),
            max_waiters: 8,
        }));
        let entries: Vec<_> = cmds.into_iter().enumerate().map(|(i, c)| entry(i as u64 + 1, c)).collect();
        sm.apply(stream::iter(entries.into_iter().map(|e| Ok((e, None))))).await.unwrap();
        let built = sm.build_snapshot().await.unwrap();
        sm.sync().await.unwrap();
        drop(sm);

        let db = raw_db(dir.path()).await;
        let r = db.begin_read().unwrap();
        let dump = dump_tables(&r).unwrap();
        let rows = (dump.resources.len(), dump.dedup.len(), dump.ended.len(), dump.signing_keys.len());
        assert_eq!(rows, (1, 2, 1, 1), "every table has rows");
        let streamed = postcard::to_stdvec(&BodyFromTables(&r)).unwrap();
        assert_eq!(streamed, dump.encode_body().unwrap());
        assert_eq!(built.snapshot.get_ref(), &streamed, "build_snapshot hands out the streamed body");
    }
}
