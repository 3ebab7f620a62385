//! Snapshots (DESIGN §3.4): their formats, building and installing them,
//! and their files.
//!
//! A snapshot body is the state tables with their values still encoded
//! ([`TableDump`]). Format 4 (today's) starts with a tag and keys dedup
//! records by [`RequestKey`]; formats 3 and 2 (dedup by request id text;
//! 2 without signing keys) are still read, from files and from leaders not
//! upgraded yet, and a state file from before format 4 is migrated when
//! moved into a snapshot file when opened. A snapshot file is
//! `[u32 LE header length][header][body]`, written atomically; every body
//! this store hands out is format 4. The newest snapshot file is the
//! persisted lock state (module `sm_store`).

use std::io::{self, Write as _};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use redb::{ReadableTable, TableHandle};
use serde::{Deserialize, Serialize};
use tokio::sync::oneshot;

use super::codec::{decode, encode, io_err};
use super::persister::{PersistOp, persister_gone};
use super::sm_store::Shared;
use super::stream::{Streamed, state_from_body};
use super::tables::{DEDUP, LEGACY_DEDUP, TableDump, load_state_file, state_from_dump, write_rows};
use super::{LogIdT, Membership, Snapshot, SnapshotMeta};
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
pub(super) const FORMAT_4_TAG: u64 = u64::from_be_bytes(*b"fencer04");

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

/// A format-4 body encoded straight from a lock state, row by row: the same
/// bytes as the [`TableDump`] of its records, without first collecting the
/// encoded rows (at the seed workload ~500,000 of them).
pub(super) struct BodyFromState<'a>(pub(super) &'a LockState);

/// The tables of [`BodyFromState`], in [`TableDump`]'s field order.
struct TablesFrom<'a>(&'a LockState);

/// One table's rows as a postcard sequence of `(key, encoded value)` pairs:
/// its length and a function that yields the rows (called once per
/// serialization, so the value can be serialized any number of times).
struct RowsFrom<F>(usize, F);

impl Serialize for BodyFromState<'_> {
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
        let st = self.0;
        let enc = |what: &'static str| move |e: io::Error| format!("encode {what}: {e}");
        let mut tables = s.serialize_struct("TableDump", 4)?;
        let resources = || st.resources().iter().map(|(k, v)| Ok((k.as_str(), encode(v).map_err(enc("resource"))?)));
        tables.serialize_field("resources", &RowsFrom(st.resources().len(), resources))?;
        let dedup = || {
            st.dedup_records()
                .iter()
                .map(|(k, v)| Ok((k.to_u128(), v.to_stored().map_err(|e| format!("encode dedup record: {e}"))?)))
        };
        tables.serialize_field("dedup", &RowsFrom(st.dedup_records().len(), dedup))?;
        let ended =
            || st.ended_records().iter().map(|(k, v)| Ok((k.to_u128(), encode(v).map_err(enc("ended lease"))?)));
        tables.serialize_field("ended", &RowsFrom(st.ended_records().len(), ended))?;
        let keys = || st.signing_keys().iter().map(|(k, v)| Ok((k.as_str(), encode(v).map_err(enc("signing key"))?)));
        tables.serialize_field("signing_keys", &RowsFrom(st.signing_keys().len(), keys))?;
        tables.end()
    }
}

impl<F, I, K> Serialize for RowsFrom<F>
where
    F: Fn() -> I,
    I: Iterator<Item = Result<(K, Vec<u8>), String>>,
    K: Serialize,
{
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::{Error as _, SerializeSeq as _};
        let mut seq = s.serialize_seq(Some(self.0))?;
        for row in (self.1)() {
            let (k, v) = row.map_err(S::Error::custom)?;
            seq.serialize_element(&(k, v.as_slice()))?;
        }
        seq.end()
    }
}

/// Encodes a lock state as a format-4 body into `out`, row by row, so the
/// body is never whole in memory.
fn encode_state_into(state: &LockState, out: &mut ChunkSynced) -> io::Result<()> {
    match postcard::to_io(&BodyFromState(state), &mut *out) {
        Ok(_) => Ok(()),
        // postcard reports every write error as a full buffer: the
        // writer kept the real one.
        Err(e) => Err(out.failure.take().unwrap_or_else(|| io_err("encode snapshot", e))),
    }
}

/// The newest snapshot file, its body in today's format (module docs). A
/// format-4 body is left in its file and read when it is sent, a chunk at a
/// time ([`SnapshotBody::read_chunk`]): sending a snapshot to a follower
/// does not hold the ~30 MB body in memory. An older body is read whole and
/// re-encoded.
pub(super) async fn current_snapshot(dir: &Path) -> io::Result<Option<Snapshot>> {
    let dir = dir.to_path_buf();
    tokio::task::spawn_blocking(move || open_latest(&dir)).await.map_err(|e| io_err("snapshot task", e))?
}

/// The newest snapshot file as a [`Snapshot`] (see [`current_snapshot`]). Blocking.
fn open_latest(dir: &Path) -> io::Result<Option<Snapshot>> {
    // A build that finishes between the listing and the open removes the
    // file listed: list again, for the newer one (a few times at most, each
    // needs a build to finish in between).
    let mut attempts = 0;
    let (path, file) = loop {
        let Some(path) = latest_snapshot(dir)? else { return Ok(None) };
        match std::fs::File::open(&path) {
            Ok(file) => break (path, file),
            Err(e) if e.kind() == io::ErrorKind::NotFound && attempts < 3 => attempts += 1,
            Err(e) => return Err(named(e, "open", &path)),
        }
    };
    let size = file.metadata().map_err(|e| named(e, "stat", &path))?.len();
    let (header, start) = read_header(&file, &path, size)?;
    let shown = path.display().to_string();
    let body = SnapshotBody(Body::File { file: Arc::new(file), path, start, len: size - start });
    let snapshot = match header.format {
        SNAPSHOT_FORMAT => body,
        // An older file: re-encode its body in today's format, so
        // every body this store hands out is format 4.
        f @ (SNAPSHOT_FORMAT_V3 | SNAPSHOT_FORMAT_V2) => {
            SnapshotBody::from_bytes(TableDump::decode_format(&body.read_all()?, f)?.encode_body()?)
        }
        other => return Err(io_err("snapshot", format!("unknown format {other} in {shown}"))),
    };
    Ok(Some(Snapshot { meta: header.meta, snapshot }))
}

/// A snapshot file's header, and where its body starts. `size` is the
/// file's. Blocking.
fn read_header(file: &std::fs::File, path: &Path, size: u64) -> io::Result<(SnapshotHeader, u64)> {
    use std::os::unix::fs::FileExt as _;
    let damaged = || io_err("snapshot", format!("{} is truncated or damaged", path.display()));
    let read = |buf: &mut [u8], at: u64| file.read_exact_at(buf, at).map_err(|e| named(e, "read", path));
    let mut len = [0u8; 4];
    if size < 4 {
        return Err(damaged());
    }
    read(&mut len, 0)?;
    let len = u64::from(u32::from_le_bytes(len));
    if 4 + len > size {
        return Err(damaged());
    }
    let mut header = vec![0u8; len as usize];
    read(&mut header, 4)?;
    Ok((decode(&header, "snapshot header")?, 4 + len))
}

/// The persisted lock state at open: the newest snapshot file's, or the
/// state file of an earlier version when it is newer (written into a
/// snapshot file first). A legacy state file is removed once a snapshot file
/// holds at least its state. Blocking.
pub(super) fn open_state(legacy_state_file: &Path, dir: &Path) -> io::Result<(LockState, Option<LogIdT>, Membership)> {
    let newest = match open_latest(dir)? {
        // `open_latest` hands out every body in format 4, whatever the file's.
        Some(latest) => match state_from_body(latest.snapshot.reader(), latest.snapshot.len()) {
            Ok(Streamed::State(state)) => Some((state, latest.meta)),
            Ok(Streamed::NotFormat4) => {
                let text = format!("snapshot in {}: not a format-4 body (its tag is wrong)", dir.display());
                return Err(io::Error::new(io::ErrorKind::InvalidData, text));
            }
            Err(e) => return Err(io::Error::new(e.kind(), format!("snapshot in {}: {e}", dir.display()))),
        },
        None => None,
    };
    let snapshot_applied = newest.as_ref().and_then(|(_, m)| m.last_log_id);
    let mut newest = newest.map(|(state, m)| (state, m.last_log_id, m.last_membership));
    if legacy_state_file.exists() {
        let (state, applied, membership) = load_state_file(legacy_state_file)?;
        if applied > snapshot_applied {
            let meta = SnapshotMeta { last_log_id: applied, last_membership: membership.clone() };
            write_snapshot_file(dir, &meta, |out| encode_state_into(&state, out))?;
            tracing::info!(
                index = ?applied.as_ref().map(|l| l.index),
                file = %legacy_state_file.display(),
                "moved the state file of an earlier version into a snapshot file"
            );
            newest = Some((state, applied, membership));
        }
        std::fs::remove_file(legacy_state_file)
            .map_err(|e| io_err(&format!("remove {}", legacy_state_file.display()), e))?;
        if let Some(parent) = legacy_state_file.parent() {
            std::fs::File::open(parent).and_then(|d| d.sync_all()).map_err(|e| io_err("fsync data dir", e))?;
        }
    }
    Ok(newest.unwrap_or_else(|| (LockState::new(), None, Membership::default())))
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

/// A snapshot file is written and synced this much at a time.
const SNAPSHOT_SYNC_CHUNK: usize = 4 << 20;

/// The buffer between the encoder and a snapshot file.
const SNAPSHOT_WRITE_BUFFER: usize = 256 << 10;

/// The snapshot file being written: buffered, and synced every
/// [`SNAPSHOT_SYNC_CHUNK`] bytes. Written whole and synced once, ~30 MB of
/// dirty pages went to the disk in one burst and the raft log's
/// `fdatasync`s queued behind it (10–40 ms instead of 0.3 ms, on every node
/// at once; issue 18).
struct ChunkSynced {
    out: std::io::BufWriter<std::fs::File>,
    path: PathBuf,
    unsynced: usize,
    /// The first write or sync error, named with the file (postcard, which
    /// encodes into this writer, keeps only that a write failed).
    failure: Option<io::Error>,
}

impl ChunkSynced {
    /// Writes to `file` (named `path` in errors) through a buffer of `buffer` bytes.
    fn new(file: std::fs::File, path: PathBuf, buffer: usize) -> Self {
        Self { out: std::io::BufWriter::with_capacity(buffer, file), path, unsynced: 0, failure: None }
    }

    /// Names `e` with the file, keeps the first such error, and returns a
    /// copy (the kind, say `StorageFull`, is kept in both).
    fn fail(&mut self, what: &str, e: io::Error) -> io::Error {
        let text = format!("{what} {}: {e}", self.path.display());
        self.failure.get_or_insert_with(|| io::Error::new(e.kind(), text.clone()));
        io::Error::new(e.kind(), text)
    }

    /// Writes what is buffered and syncs it.
    fn sync(&mut self) -> io::Result<()> {
        self.out.flush().map_err(|e| self.fail("write", e))?;
        self.out.get_ref().sync_data().map_err(|e| self.fail("fsync", e))?;
        self.unsynced = 0;
        Ok(())
    }
}

impl io::Write for ChunkSynced {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.out.write(buf).map_err(|e| self.fail("write", e))?;
        self.unsynced += n;
        if self.unsynced >= SNAPSHOT_SYNC_CHUNK {
            self.sync()?;
        }
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.out.flush().map_err(|e| self.fail("write", e))
    }
}

/// Writes a snapshot file atomically (temp file, fsync, rename, fsync dir)
/// and removes older ones; `body` writes the body. Returns the body, in
/// the file just written. Blocking.
fn write_snapshot_file(
    dir: &Path,
    meta: &SnapshotMeta,
    body: impl FnOnce(&mut ChunkSynced) -> io::Result<()>,
) -> io::Result<SnapshotBody> {
    let index = meta.last_log_id.as_ref().map_or(0, |l| l.index);
    let header = encode(&SnapshotHeader { format: SNAPSHOT_FORMAT, meta: meta.clone() })?;
    let final_path = dir.join(snapshot_name(index));
    let tmp = dir.join(format!("{}.tmp", snapshot_name(index)));
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(&tmp)
        .map_err(|e| io_err(&format!("create {}", tmp.display()), e))?;
    let mut out = ChunkSynced::new(file, tmp.clone(), SNAPSHOT_WRITE_BUFFER);
    let written = (|| {
        out.write_all(&(header.len() as u32).to_le_bytes())?;
        out.write_all(&header)?;
        body(&mut out)?;
        out.sync()
    })();
    if let Err(e) = written {
        // Every error above already names the file and keeps its kind.
        drop(out);
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    let file = out.out.into_inner().map_err(|e| io_err(&format!("write {}", tmp.display()), e.into_error()))?;
    file.sync_all().map_err(|e| io_err(&format!("fsync {}", tmp.display()), e))?;
    let size = file.metadata().map_err(|e| io_err(&format!("stat {}", tmp.display()), e))?.len();
    std::fs::rename(&tmp, &final_path).map_err(|e| io_err("rename snapshot", e))?;
    std::fs::File::open(dir).and_then(|d| d.sync_all()).map_err(|e| io_err("fsync snapshot dir", e))?;
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or_default().to_string();
        if name.starts_with("snapshot-") && path != final_path {
            let _ = std::fs::remove_file(&path);
        }
    }
    let start = 4 + header.len() as u64;
    Ok(SnapshotBody(Body::File { file: Arc::new(file), path: final_path, start, len: size - start }))
}

/// A snapshot's body as openraft carries it (`SnapshotData`): in its file
/// when built or read to be sent, in a file without a name when received
/// to be installed ([`ReceivedSnapshot`]), in memory only when re-encoded
/// from an older format. openraft keeps only the meta of a build, so a
/// build does not read its ~30 MB body back, a body sent to a follower is
/// read a chunk at a time, and one installed is decoded as it is read (the
/// memory peaks of issue 18); the file stays readable through the open
/// handle even after a later build removed it.
#[derive(Debug)]
pub struct SnapshotBody(Body);

#[derive(Debug)]
enum Body {
    Bytes(Vec<u8>),
    /// `len` bytes from `start` in `file` (the file at `path` when opened).
    File {
        file: Arc<std::fs::File>,
        path: PathBuf,
        start: u64,
        len: u64,
    },
}

impl SnapshotBody {
    pub(crate) fn from_bytes(bytes: Vec<u8>) -> Self {
        Self(Body::Bytes(bytes))
    }

    /// A body of `len` bytes from `start` in `file`, for tests of readers.
    #[cfg(test)]
    pub(crate) fn in_file(file: std::fs::File, path: PathBuf, start: u64, len: u64) -> Self {
        Self(Body::File { file: Arc::new(file), path, start, len })
    }

    /// The body's length in bytes.
    pub(crate) fn len(&self) -> u64 {
        match &self.0 {
            Body::Bytes(bytes) => bytes.len() as u64,
            Body::File { len, .. } => *len,
        }
    }

    /// The encoded body (a format-4 body, module docs). Reads the file, on
    /// a blocking thread, when the body is in one.
    #[cfg(test)]
    pub(crate) async fn into_bytes(mut self) -> io::Result<Vec<u8>> {
        if let Body::Bytes(bytes) = &mut self.0 {
            return Ok(std::mem::take(bytes));
        }
        tokio::task::spawn_blocking(move || self.read_all()).await.map_err(|e| io_err("snapshot read task", e))?
    }

    /// The body's bytes from `at`, at most `max` of them (fewer only at the
    /// end; none from the end on). Reads the file, on a blocking thread,
    /// when the body is in one; an error names the file.
    pub(crate) async fn read_chunk(&self, at: u64, max: usize) -> io::Result<Vec<u8>> {
        let (at, n) = (at.min(self.len()), self.len().saturating_sub(at).min(max as u64) as usize);
        match &self.0 {
            Body::Bytes(_) => self.read_range(at, n),
            Body::File { file, path, start, .. } => {
                let (file, path, from) = (file.clone(), path.clone(), start + at);
                tokio::task::spawn_blocking(move || read_file_range(&file, &path, from, n))
                    .await
                    .map_err(|e| io_err("snapshot read task", e))?
            }
        }
    }

    /// The whole body. Blocking.
    fn read_all(mut self) -> io::Result<Vec<u8>> {
        match &mut self.0 {
            Body::Bytes(bytes) => Ok(std::mem::take(bytes)),
            Body::File { .. } => self.read_range(0, self.len() as usize),
        }
    }

    /// `n` bytes of the body from `at` (the caller keeps within its
    /// length). Blocking when the body is in a file.
    fn read_range(&self, at: u64, n: usize) -> io::Result<Vec<u8>> {
        match &self.0 {
            Body::Bytes(bytes) => Ok(bytes[at as usize..at as usize + n].to_vec()),
            Body::File { file, path, start, .. } => read_file_range(file, path, start + at, n),
        }
    }

    /// Writes the whole body to `out`, [`COPY_PIECE`] bytes at a time; an
    /// error names the file it read or wrote (a body shorter than its
    /// length is one). Blocking.
    fn copy_into(&self, out: &mut impl io::Write) -> io::Result<()> {
        let mut at = 0;
        while at < self.len() {
            let n = (self.len() - at).min(COPY_PIECE as u64) as usize;
            out.write_all(&self.read_range(at, n)?)?;
            at += n as u64;
        }
        Ok(())
    }

    /// Reads the body from its start; a read error names the file.
    /// Blocking. Reads share no file position with other readers.
    fn reader(&self) -> BodyReader<'_> {
        BodyReader { body: self, at: 0 }
    }
}

/// A snapshot body being received from the leader: written to a file
/// without a name in the snapshot dir as its chunks arrive, so a follower
/// never holds the whole body (~30 MB at the seed state) in memory; the
/// file is gone when the body is dropped, also after a crash. Installing it
/// reads it back ([`install`]).
#[derive(Debug)]
pub(crate) struct ReceivedSnapshot {
    body: SnapshotBody,
    /// The length its sender declared (`None`: a sender of a version before
    /// the declaration).
    declared: Option<u64>,
}

impl ReceivedSnapshot {
    /// An empty body, in a new unnamed file in `dir`, of the length its
    /// sender `declared`.
    pub(crate) async fn create(dir: &Path, declared: Option<u64>) -> io::Result<Self> {
        let dir = dir.to_path_buf();
        tokio::task::spawn_blocking(move || {
            let file = tempfile::tempfile_in(&dir)
                .map_err(|e| named(e, "create a file for a snapshot being received in", &dir))?;
            let path = dir.join("(a snapshot being received)");
            let body = SnapshotBody(Body::File { file: Arc::new(file), path, start: 0, len: 0 });
            Ok(Self { body, declared })
        })
        .await
        .map_err(|e| io_err("snapshot receive task", e))?
    }

    /// Appends `data` to the body, on a blocking thread. A write error
    /// (a full disk, say) keeps its kind and names the directory.
    pub(crate) async fn append(&mut self, data: Vec<u8>) -> io::Result<()> {
        use std::os::unix::fs::FileExt as _;
        let Body::File { file, path, len, .. } = &mut self.body.0 else {
            return Err(io_err("receive a snapshot", "its body is not in a file")); // `create` makes one
        };
        let (handle, at) = (file.clone(), *len);
        tokio::task::spawn_blocking(move || handle.write_all_at(&data, at).map(|()| data.len()))
            .await
            .map_err(|e| io_err("snapshot receive task", e))?
            .map(|n| *len += n as u64)
            .map_err(|e| named(e, "write", path))
    }

    /// A body received into `file`, for tests of a failing disk.
    #[cfg(test)]
    pub(crate) fn in_file(file: std::fs::File, path: PathBuf) -> Self {
        Self { body: SnapshotBody(Body::File { file: Arc::new(file), path, start: 0, len: 0 }), declared: None }
    }

    /// The declared length, when `more` bytes would take the body past it.
    pub(crate) fn would_exceed(&self, more: usize) -> Option<u64> {
        self.declared.filter(|declared| self.body.len() + more as u64 > *declared)
    }

    /// The body, when it is whole; `Err((received, declared))` when the
    /// stream ended short of its declared length (a stream its sender
    /// cancelled ends like a finished one, see the raft proto's
    /// `body_len`). A body whose length was not declared is taken as whole.
    pub(crate) fn whole(self) -> Result<SnapshotBody, (u64, u64)> {
        match self.declared {
            Some(declared) if self.body.len() != declared => Err((self.body.len(), declared)),
            _ => Ok(self.body),
        }
    }

    /// The body received, whole or not.
    #[cfg(test)]
    pub(crate) fn body(self) -> SnapshotBody {
        self.body
    }
}

/// A received body is copied into its snapshot file this much at a time.
const COPY_PIECE: usize = 1 << 20;

/// [`SnapshotBody::reader`].
struct BodyReader<'a> {
    body: &'a SnapshotBody,
    at: u64,
}

impl io::Read for BodyReader<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        use std::os::unix::fs::FileExt as _;
        let n = self.body.len().saturating_sub(self.at).min(buf.len() as u64) as usize;
        let got = match &self.body.0 {
            Body::Bytes(bytes) => {
                buf[..n].copy_from_slice(&bytes[self.at as usize..self.at as usize + n]);
                n
            }
            Body::File { file, path, start, .. } => {
                file.read_at(&mut buf[..n], start + self.at).map_err(|e| named(e, "read the snapshot body in", path))?
            }
        };
        self.at += got as u64;
        Ok(got)
    }
}

impl Drop for SnapshotBody {
    /// Closing the last handle on a file that a later build removed frees
    /// its blocks (~30 MB at the seed state): a file system call, so it is
    /// moved off the async worker threads when dropped inside the runtime.
    fn drop(&mut self) {
        if matches!(self.0, Body::File { .. })
            && let Ok(runtime) = tokio::runtime::Handle::try_current()
        {
            let body = std::mem::replace(&mut self.0, Body::Bytes(Vec::new()));
            drop(runtime.spawn_blocking(move || drop(body)));
        }
    }
}

/// `e`, its kind kept, with what was done to which file.
fn named(e: io::Error, what: &str, path: &Path) -> io::Error {
    io::Error::new(e.kind(), format!("{what} {}: {e}", path.display()))
}

/// `n` bytes of `file` (opened at `path`) from `at`. Blocking.
fn read_file_range(file: &std::fs::File, path: &Path, at: u64, n: usize) -> io::Result<Vec<u8>> {
    use std::os::unix::fs::FileExt as _;
    let mut buf = vec![0u8; n];
    file.read_exact_at(&mut buf, at).map_err(|e| named(e, "read the snapshot body in", path))?;
    Ok(buf)
}

/// The niceness of the thread that encodes and writes a snapshot.
const SNAPSHOT_NICE: i32 = 10;

/// Lowers the calling thread's CPU priority to [`SNAPSHOT_NICE`] (on Linux
/// `setpriority(PRIO_PROCESS, 0)` applies to the calling thread only). A
/// snapshot is a burst of CPU — encoding the whole state, ~30 MB at the
/// seed state, ~0.6 s of one core — that every node of a cluster makes at
/// the same log index; at normal priority it took the CPU from the nodes'
/// requests and held every commit for as long (acquire p99 220–420 ms at
/// twice the seed rate, 17 ms without snapshots; issue 18). At niceness 10
/// it gets a tenth of a contended CPU and all of an idle one; nothing waits
/// for it but the log purge behind it. Refused (a seccomp policy, say), it
/// builds at normal priority and says so at debug level.
fn lower_priority() {
    if let Err(e) = rustix::process::setpriority_process(None, SNAPSHOT_NICE) {
        tracing::debug!(error = %e, "could not lower the snapshot thread's priority");
    }
}

/// Builds a snapshot from `state`, the state at exactly `meta` (a clone
/// taken between two applies): the audit lines up to it are synced first,
/// then the body is encoded and its file written on a thread of its own,
/// at a lower CPU priority, while applies go on.
pub(super) async fn build(shared: &Shared, state: LockState, meta: SnapshotMeta) -> io::Result<Snapshot> {
    let started = shared.clock.now();
    let (done, rx) = oneshot::channel();
    shared.send(PersistOp::Sync { done }).await?;
    rx.await.map_err(|_| persister_gone())??;
    let synced = started.elapsed();
    let dir = shared.snapshot_dir.clone();
    let file_meta = meta.clone();
    let (tx, rx) = oneshot::channel();
    std::thread::Builder::new()
        .name("fencer-snapshot".into())
        .spawn(move || {
            lower_priority();
            // Encoded straight into the file: the body is never whole in
            // memory (at the seed state ~30 MB, the peak of every build).
            let built = write_snapshot_file(&dir, &file_meta, |out| encode_state_into(&state, out));
            drop(state);
            let _ = tx.send(built);
        })
        .map_err(|e| io_err("spawn the snapshot thread", e))?;
    let body = rx.await.map_err(|_| io_err("snapshot thread", "it ended without an answer"))??;
    shared.metrics.snapshot_bytes.set(body.len() as i64);
    shared.metrics.snapshot_build_seconds.observe(started.elapsed().as_secs_f64());
    tracing::info!(
        index = ?meta.last_log_id.as_ref().map(|l| l.index),
        bytes = body.len(),
        audit_sync_ms = synced.as_millis() as u64,
        total_ms = started.elapsed().as_millis() as u64,
        // The history runs count this message in the nodes' logs
        // (tests/history/workload): reword both together.
        "built snapshot"
    );
    Ok(Snapshot { meta, snapshot: body })
}

/// Decodes a snapshot body into its lock state, and says which format it
/// was in. A format-4 body is decoded as it is read (module `stream`): at
/// the seed state, neither the ~30 MB body nor its rows are ever whole in
/// memory. An older body (from a leader not upgraded yet) is read whole and
/// decoded the older ways. Blocking.
fn decode_state(body: &SnapshotBody) -> io::Result<(LockState, u32)> {
    match state_from_body(body.reader(), body.len())? {
        Streamed::State(state) => Ok((state, SNAPSHOT_FORMAT)),
        Streamed::NotFormat4 => {
            let bytes = body.read_range(0, body.len() as usize)?;
            let (dump, format) = TableDump::decode_any(&bytes)?;
            Ok((state_from_dump(&dump)?, format))
        }
    }
}

/// Installs a snapshot: lets the old state go, decodes the new one,
/// records it in the audit log, writes the snapshot file, then puts the new
/// state in place. The body is decoded as it is read, and a format-4 body
/// is copied into the file as received; an older one is written in today's
/// format, from the state.
///
/// The old state is freed before the new one is decoded, not after the
/// swap: both at once put a follower catching up at the seed state ~90 MB
/// above its plateau (docs/performance.md, "A follower's install without
/// the old state"). Only a follower installs, and a follower answers no
/// lock reads (they are the leader's, linearizable): in between, what sees
/// the empty state is this node's status and console counts and its
/// signing-key check, which at worst proposes its key's registration again
/// (answered `AlreadyRegistered`: one log entry that changes nothing).
/// A failed install stops this node's raft (a storage error) either way;
/// its snapshot file and log are untouched, and a restart loads them.
pub(super) async fn install(shared: &Shared, meta: SnapshotMeta, body: SnapshotBody) -> io::Result<()> {
    let old = std::mem::take(&mut *shared.state.write().unwrap_or_else(|p| p.into_inner()));
    let (new_state, format, body) = tokio::task::spawn_blocking(move || -> io::Result<_> {
        // ~500,000 rows at the seed state, freed before the decode starts,
        // so the two never add up.
        drop(old);
        let (state, format) = decode_state(&body)?;
        Ok((state, format, body))
    })
    .await
    .map_err(|e| io_err("install task", e))??;
    let (done, rx) = oneshot::channel();
    let record = match (shared.audit, &meta.last_log_id) {
        (Some(_), Some(l)) => Some(Box::new(AuditRecord::snapshot_installed(l.index, shared.clock.wall_ms()))),
        _ => None,
    };
    shared.send(PersistOp::Installed { record, done }).await?;
    rx.await.map_err(|_| persister_gone())??;
    let (dir, file_meta) = (shared.snapshot_dir.clone(), meta.clone());
    let new_state = tokio::task::spawn_blocking(move || -> io::Result<LockState> {
        write_snapshot_file(&dir, &file_meta, |out| {
            if format == SNAPSHOT_FORMAT { body.copy_into(out) } else { encode_state_into(&new_state, out) }
        })?;
        Ok(new_state)
    })
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
    // Counted in the nodes' logs by the history runs, like "built snapshot".
    tracing::info!(index = ?meta.last_log_id.as_ref().map(|l| l.index), "installed snapshot");
    Ok(())
}

#[cfg(test)]
mod tests {
    //! Signing keys survive a restart and travel in snapshots; format-2
    //! and 3 snapshots, and state files from before format 4, still load.

    use std::sync::Arc;

    use futures::stream;
    use openraft::alias::EntryOf;
    use openraft::entry::RaftEntry as _;
    use openraft::storage::{RaftSnapshotBuilder as _, RaftStateMachine};
    use redb::Database;
    use tempfile::TempDir;

    use super::*;
    use crate::clock::Clock;
    use crate::metrics::Metrics;
    use crate::raft::TypeConfig;
    use crate::state_machine::{AcquireCmd, Command, LogCommand};
    use crate::store::snapshot::ReceivedSnapshot;
    use crate::store::{NoObserver, SNAPSHOT_DIR, STATE_FILE, StateMachineStore};
    use crate::types::{LeaseId, ResourceName};
    use fencer_token::KeyId;

    fn try_open(dir: &Path) -> io::Result<StateMachineStore> {
        StateMachineStore::open(
            &dir.join(STATE_FILE),
            &dir.join(SNAPSHOT_DIR),
            Arc::new(NoObserver),
            Metrics::new(),
            Clock,
            None,
        )
    }

    fn open(dir: &Path) -> StateMachineStore {
        try_open(dir).unwrap()
    }

    /// Reopens a data dir once the previous store's persister let it go.
    async fn reopen(dir: &Path) -> StateMachineStore {
        for _ in 0..200 {
            if let Ok(sm) = try_open(dir) {
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

    /// Applies `cmds` at indexes 1, 2, …; returns the last index.
    async fn apply_from_one(sm: &mut StateMachineStore, cmds: Vec<Command>) -> u64 {
        let n = cmds.len() as u64;
        let entries = cmds.into_iter().enumerate().map(|(i, c)| Ok((entry(i as u64 + 1, c), None)));
        sm.apply(stream::iter(entries)).await.unwrap();
        n
    }

    /// A store in `dir` holding a signing key and the lock of
    /// [`acquire_cmd`]; returns it and its last index.
    async fn with_keys_and_a_lock(dir: &Path) -> (StateMachineStore, u64) {
        let mut sm = open(dir);
        let mut cmds = keys_cmds();
        cmds.push(acquire_cmd());
        let n = apply_from_one(&mut sm, cmds).await;
        (sm, n)
    }

    /// Releases the lock of [`acquire_cmd`] at `index`.
    async fn release_the_lock(sm: &mut StateMachineStore, index: u64) {
        let release =
            Command::Release { resource: ResourceName::new("orders/1").unwrap(), lease_id: LeaseId::from_u128(7) };
        sm.apply(stream::iter([Ok((entry(index, release), None))])).await.unwrap();
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
        apply_from_one(&mut sm, keys_cmds()).await;
        let expected = sm.read().signing_keys().clone();
        assert_eq!(expected.len(), 1);
        assert_eq!(expected.values().next().unwrap().not_after_unix_ms, Some(99));
        let snapshot = sm.build_snapshot().await.unwrap();
        sm.sync().await.unwrap();
        drop(sm);

        let sm = reopen(dir.path()).await;
        assert_eq!(sm.read().signing_keys(), &expected, "the snapshot file holds the keys");
        drop(sm);

        let other = TempDir::new().unwrap();
        let mut fresh = open(other.path());
        let body = snapshot.snapshot.into_bytes().await.unwrap();
        fresh.install_snapshot(&snapshot.meta, SnapshotBody::from_bytes(body)).await.unwrap();
        assert_eq!(fresh.read().signing_keys(), &expected, "a snapshot carries the keys");
        let current = fresh.get_current_snapshot().await.unwrap().expect("installed snapshot kept");
        let current = current.snapshot.into_bytes().await.unwrap();
        assert_eq!(TableDump::decode_format(&current, SNAPSHOT_FORMAT).unwrap().signing_keys.len(), 1);
    }

    fn acquire_cmd() -> Command {
        acquire_of("request-0001", "orders/1", 7)
    }

    /// An acquire of `resource` by request `request_id`, under lease `lease`.
    fn acquire_of(request_id: &str, resource: &str, lease: u128) -> Command {
        Command::Acquire(AcquireCmd {
            request_id: RequestId::new(request_id).unwrap(),
            resource: ResourceName::new(resource).unwrap(),
            holder: crate::types::Holder::new("h").unwrap(),
            ttl_ms: 30_000,
            wait: false,
            lease_id: LeaseId::from_u128(lease),
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
        let (v4, v4_body) = (v4.meta, v4.snapshot.into_bytes().await.unwrap());
        let dump = TableDump::decode_format(&v4_body, SNAPSHOT_FORMAT).unwrap();
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
            assert!(TableDump::decode_format(&v4_body, format).is_err(), "format 4 is not format {format}");
        }
        assert!(TableDump::decode_format(&v2, SNAPSHOT_FORMAT_V3).is_err(), "format 2 is not format 3");
        assert!(TableDump::decode_format(&v3, SNAPSHOT_FORMAT_V2).is_err(), "format 3 is not format 2");

        for (body, format) in [(v3, SNAPSHOT_FORMAT_V3), (v2, SNAPSHOT_FORMAT_V2)] {
            // Sent by a leader that was not upgraded yet.
            let dst = TempDir::new().unwrap();
            let mut fresh = open(dst.path());
            fresh.install_snapshot(&v4, SnapshotBody::from_bytes(body.clone())).await.unwrap();
            assert_retry_replays(&fresh, &format!("format-{format} body installed"));

            // A file left by the previous version, read at start.
            let dir = dst.path().join(SNAPSHOT_DIR);
            for f in std::fs::read_dir(&dir).unwrap() {
                std::fs::remove_file(f.unwrap().path()).unwrap();
            }
            let header = encode(&SnapshotHeader { format, meta: v4.clone() }).unwrap();
            let mut file = (header.len() as u32).to_le_bytes().to_vec();
            file.extend_from_slice(&header);
            file.extend_from_slice(&body);
            std::fs::write(dir.join(snapshot_name(1)), file).unwrap();
            let current = fresh.get_current_snapshot().await.unwrap().expect("the old file is read");
            let today =
                TableDump::decode_format(&current.snapshot.into_bytes().await.unwrap(), SNAPSHOT_FORMAT).unwrap();
            assert_eq!((today.resources.len(), today.dedup.len()), (1, 1), "format {format} handed out as format 4");
        }
    }

    /// Writes a state file the way versions before snapshot-only
    /// persistence kept the state, from `dump` at `meta`; with
    /// `text_dedup`, dedup rows keyed by request id text as before format 4.
    fn write_legacy_state_file(path: &Path, dump: &TableDump, meta: &SnapshotMeta, text_dedup: Option<&str>) {
        use crate::store::tables::{ENDED, KEY_APPLIED, KEY_MEMBERSHIP, RESOURCES, SIGNING_KEYS, SM_META};
        let db = Database::create(path).unwrap();
        let w = db.begin_write().unwrap();
        {
            let mut t = w.open_table(RESOURCES).unwrap();
            for (k, v) in &dump.resources {
                t.insert(k.as_str(), v.as_slice()).unwrap();
            }
            match text_dedup {
                Some(id) => {
                    assert_eq!(dump.dedup.len(), 1);
                    w.open_table(LEGACY_DEDUP).unwrap().insert(id, dump.dedup[0].1.as_slice()).unwrap();
                }
                None => {
                    let mut t = w.open_table(DEDUP).unwrap();
                    for (k, v) in &dump.dedup {
                        t.insert(*k, v.as_slice()).unwrap();
                    }
                }
            }
            let mut t = w.open_table(ENDED).unwrap();
            for (k, v) in &dump.ended {
                t.insert(*k, v.as_slice()).unwrap();
            }
            let mut t = w.open_table(SIGNING_KEYS).unwrap();
            for (k, v) in &dump.signing_keys {
                t.insert(k.as_str(), v.as_slice()).unwrap();
            }
            let mut t = w.open_table(SM_META).unwrap();
            t.insert(KEY_APPLIED, encode(&meta.last_log_id.unwrap()).unwrap().as_slice()).unwrap();
            t.insert(KEY_MEMBERSHIP, encode(&meta.last_membership).unwrap().as_slice()).unwrap();
        }
        w.commit().unwrap();
    }

    fn clear_snapshots(dir: &Path) {
        for f in std::fs::read_dir(dir.join(SNAPSHOT_DIR)).unwrap() {
            std::fs::remove_file(f.unwrap().path()).unwrap();
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn t32_a_state_file_of_an_earlier_version_is_moved_into_a_snapshot_on_open() {
        let dir = TempDir::new().unwrap();
        let mut sm = open(dir.path());
        sm.apply(stream::iter([Ok((entry(1, acquire_cmd()), None))])).await.unwrap();
        let built = sm.build_snapshot().await.unwrap();
        drop(sm);
        let body = built.snapshot.into_bytes().await.unwrap();
        let dump = TableDump::decode_format(&body, SNAPSHOT_FORMAT).unwrap();
        let state_file = dir.path().join(STATE_FILE);

        // Text-keyed dedup rows (before format 4), and no snapshot file.
        clear_snapshots(dir.path());
        write_legacy_state_file(&state_file, &dump, &built.meta, Some("request-0001"));
        let mut sm = reopen(dir.path()).await;
        assert_retry_replays(&sm, "after the move");
        assert_eq!(sm.applied_state().await.unwrap().0, built.meta.last_log_id, "the file's applied id is kept");
        assert!(!state_file.exists(), "the state file is removed once moved");
        let current = sm.get_current_snapshot().await.unwrap().expect("a snapshot file holds the moved state");
        assert_eq!(current.meta.last_log_id, built.meta.last_log_id);
        drop(sm);
        let sm = reopen(dir.path()).await;
        assert_retry_replays(&sm, "reopened once more, from the snapshot file");
        drop(sm);

        // A state file older than the snapshot file is dropped, not loaded.
        let older = SnapshotMeta {
            last_log_id: Some(openraft::testing::log_id::<TypeConfig>(1, 1, 0)),
            last_membership: built.meta.last_membership.clone(),
        };
        write_legacy_state_file(&state_file, &TableDump::default(), &older, None);
        let mut sm = reopen(dir.path()).await;
        assert_retry_replays(&sm, "the newer snapshot wins");
        assert_eq!(sm.applied_state().await.unwrap().0, built.meta.last_log_id);
        assert!(!state_file.exists(), "the stale state file is removed");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn t33_a_snapshot_body_streamed_from_the_state_is_its_dump_and_decodes_back() {
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
        apply_from_one(&mut sm, cmds).await;
        let built = sm.build_snapshot().await.unwrap();

        let state = sm.read().clone();
        let dump = TableDump {
            resources: state.resources().iter().map(|(k, v)| (k.as_str().to_string(), encode(v).unwrap())).collect(),
            dedup: state.dedup_records().iter().map(|(k, v)| (k.to_u128(), v.to_stored().unwrap())).collect(),
            ended: state.ended_records().iter().map(|(k, v)| (k.to_u128(), encode(v).unwrap())).collect(),
            signing_keys: state
                .signing_keys()
                .iter()
                .map(|(k, v)| (k.as_str().to_string(), encode(v).unwrap()))
                .collect(),
        };
        let rows = (dump.resources.len(), dump.dedup.len(), dump.ended.len(), dump.signing_keys.len());
        assert_eq!(rows, (1, 2, 1, 1), "every table has rows");
        let built = built.snapshot.into_bytes().await.unwrap();
        assert_eq!(built, dump.encode_body().unwrap(), "the streamed body is the dump's");
        let decoded = TableDump::decode_format(&built, SNAPSHOT_FORMAT).unwrap();
        assert_eq!(state_from_dump(&decoded).unwrap(), state, "the body decodes to the same state");
        drop(sm);
        let sm = reopen(dir.path()).await;
        assert_eq!(*sm.read(), state, "a restart loads the snapshot's state");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn t33_a_built_body_is_read_from_its_file_even_after_a_later_build_removed_it() {
        let dir = TempDir::new().unwrap();
        let (mut sm, n) = with_keys_and_a_lock(dir.path()).await;
        let first = sm.build_snapshot().await.unwrap();
        let current = sm.get_current_snapshot().await.unwrap().expect("the build wrote its file");
        let on_disk = current.snapshot.into_bytes().await.unwrap();

        release_the_lock(&mut sm, n + 1).await;
        let second = sm.build_snapshot().await.unwrap();
        let files: Vec<_> =
            std::fs::read_dir(dir.path().join(SNAPSHOT_DIR)).unwrap().map(|f| f.unwrap().file_name()).collect();
        assert_eq!(files.len(), 1, "the second build removed the first file: {files:?}");

        let first = first.snapshot.into_bytes().await.unwrap();
        assert_eq!(first, on_disk, "the first build's body, read through its handle, is what its file held");
        let second = second.snapshot.into_bytes().await.unwrap();
        assert_ne!(first, second, "each build reads back its own body");
        let decoded = TableDump::decode_format(&second, SNAPSHOT_FORMAT).unwrap();
        assert_eq!(state_from_dump(&decoded).unwrap(), *sm.read());
    }

    /// What a leader sends a follower is read from the snapshot file a
    /// chunk at a time (issue 18: the ~30 MB body was read whole, then
    /// copied into chunks), and the chunks are exactly the built body, even
    /// once a later build removed the file.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn t33_the_current_snapshot_is_read_from_its_file_a_chunk_at_a_time() {
        let dir = TempDir::new().unwrap();
        let (mut sm, n) = with_keys_and_a_lock(dir.path()).await;
        let built = sm.build_snapshot().await.unwrap().snapshot.into_bytes().await.unwrap();
        let current = sm.get_current_snapshot().await.unwrap().expect("the build wrote its file");
        assert!(matches!(current.snapshot.0, Body::File { .. }), "a format-4 file is not read to be sent");
        assert_eq!(current.snapshot.len(), built.len() as u64);

        release_the_lock(&mut sm, n + 1).await;
        sm.build_snapshot().await.unwrap();

        // A chunk size that does not divide the body: the last chunk is short.
        let size = 7;
        assert_ne!(built.len() % size, 0, "the body's length is a multiple of {size}; pick another size");
        let mut sent = Vec::new();
        while (sent.len() as u64) < current.snapshot.len() {
            let chunk = current.snapshot.read_chunk(sent.len() as u64, size).await.unwrap();
            assert!(!chunk.is_empty() && chunk.len() <= size, "chunk of {} bytes", chunk.len());
            sent.extend_from_slice(&chunk);
        }
        assert_eq!(sent, built, "the chunks are the built body, read through the handle after its file went");
        let end = current.snapshot.len();
        assert!(current.snapshot.read_chunk(end, size).await.unwrap().is_empty(), "nothing from the end");
        assert!(current.snapshot.read_chunk(end + 10, size).await.unwrap().is_empty(), "nothing past the end");
        let bytes = SnapshotBody::from_bytes(built.clone());
        assert_eq!(bytes.read_chunk(3, size).await.unwrap(), built[3..3 + size], "a body in memory chunks the same");
    }

    /// A body whose file cannot be read: the error names the file and keeps
    /// the cause's kind.
    #[tokio::test]
    async fn t33_a_read_error_while_sending_names_the_snapshot_file() {
        let dir = TempDir::new().unwrap();
        let path = dir.path().join("snapshot-00000000000000000042.bin");
        std::fs::write(&path, [0u8; 64]).unwrap();
        let write_only = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        let body = SnapshotBody::in_file(write_only, path.clone(), 4, 60);
        let e = body.read_chunk(0, 16).await.unwrap_err();
        assert!(e.to_string().contains(&path.display().to_string()), "{e}");
        let bad_fd = io::Error::from_raw_os_error(rustix::io::Errno::BADF.raw_os_error());
        assert_eq!(e.kind(), bad_fd.kind(), "{e}");
    }

    /// A full disk while the body is encoded into the file: the error names
    /// the file and the cause (postcard itself only says a write failed).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn t33_a_write_error_while_encoding_names_the_file_and_the_cause() {
        let Ok(full) = std::fs::OpenOptions::new().write(true).open("/dev/full") else {
            eprintln!("SKIP: /dev/full is not available here");
            return;
        };
        let dir = TempDir::new().unwrap();
        let mut sm = open(dir.path());
        sm.apply(stream::iter([Ok((entry(1, acquire_cmd()), None))])).await.unwrap();
        let state = sm.read().clone();
        // A buffer smaller than the body, so postcard's own writes meet the error.
        let mut out = ChunkSynced::new(full, PathBuf::from("/dev/full"), 8);
        let e = encode_state_into(&state, &mut out).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::StorageFull, "{e}");
        let text = e.to_string();
        assert!(text.contains("write /dev/full"), "{text}");
        assert!(text.contains("No space left on device"), "{text}");
    }

    /// A full disk while a snapshot is received: the write error keeps its
    /// kind (the receive handler refuses the snapshot as UNAVAILABLE) and
    /// names the file; the body's length counts only what was written.
    #[tokio::test]
    async fn t34_a_full_disk_while_receiving_a_snapshot_is_a_storage_full_error_by_name() {
        let Ok(full) = std::fs::OpenOptions::new().write(true).open("/dev/full") else {
            eprintln!("SKIP: /dev/full is not available here");
            return;
        };
        let mut received = ReceivedSnapshot::in_file(full, PathBuf::from("/dev/full"));
        let e = received.append(vec![7; 4096]).await.unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::StorageFull, "{e}");
        assert!(e.to_string().contains("write /dev/full"), "{e}");
        assert_eq!(received.body().len(), 0, "nothing counted as received");
    }

    /// A received body is whole only at its declared length: one short of
    /// it (a stream its sender cancelled) is refused, and so is a chunk
    /// that would take it past; an undeclared length (an older sender) is
    /// taken as whole.
    #[tokio::test]
    async fn t34_a_received_body_is_whole_only_at_its_declared_length() {
        let dir = TempDir::new().unwrap();
        let mut received = ReceivedSnapshot::create(dir.path(), Some(10)).await.unwrap();
        received.append(vec![1; 6]).await.unwrap();
        assert_eq!(received.would_exceed(4), None);
        assert_eq!(received.would_exceed(5), Some(10), "past the declared length");
        assert_eq!(received.whole().unwrap_err(), (6, 10), "short of it");
        let mut received = ReceivedSnapshot::create(dir.path(), Some(10)).await.unwrap();
        received.append(vec![1; 10]).await.unwrap();
        assert_eq!(received.whole().map(|b| b.len()).unwrap(), 10);
        let mut older = ReceivedSnapshot::create(dir.path(), None).await.unwrap();
        older.append(vec![1; 6]).await.unwrap();
        assert_eq!(older.would_exceed(1 << 20), None);
        assert_eq!(older.whole().map(|b| b.len()).unwrap(), 6);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn t33_a_snapshot_view_built_twice_writes_the_same_state_twice() {
        let dir = TempDir::new().unwrap();
        let (mut sm, _) = with_keys_and_a_lock(dir.path()).await;
        let state = sm.read().clone();
        let mut view = sm.get_snapshot_builder().await;
        let first = view.build_snapshot().await.unwrap();
        let second = view.build_snapshot().await.unwrap();
        assert_eq!(first.meta, second.meta);
        let (first, second) = (first.snapshot.into_bytes().await.unwrap(), second.snapshot.into_bytes().await.unwrap());
        assert_eq!(second, first, "the second build is not of an emptied view");
        drop((view, sm));
        let sm = reopen(dir.path()).await;
        assert_eq!(*sm.read(), state, "the file the second build wrote holds the state");
    }

    /// The names in a data dir's snapshot dir.
    fn snapshot_files(dir: &Path) -> Vec<String> {
        let mut names: Vec<_> = std::fs::read_dir(dir.join(SNAPSHOT_DIR))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn t34_a_snapshot_received_into_a_file_installs_and_is_kept_as_received() {
        let dir = TempDir::new().unwrap();
        let (mut sm, n) = with_keys_and_a_lock(dir.path()).await;
        let second = acquire_of("request-0002", "orders/2", 8);
        sm.apply(stream::iter([Ok((entry(n + 1, second), None))])).await.unwrap();
        let built = sm.build_snapshot().await.unwrap();
        // The rows in an order no build writes, so a body re-encoded from
        // the state would differ from the one received.
        let mut dump = TableDump::decode_format(&built.snapshot.into_bytes().await.unwrap(), SNAPSHOT_FORMAT).unwrap();
        assert!(dump.resources.len() >= 2 && dump.dedup.len() >= 2);
        dump.resources.reverse();
        dump.dedup.reverse();
        let sent = dump.encode_body().unwrap();

        let other = TempDir::new().unwrap();
        let mut fresh = open(other.path());
        let spool = other.path().join(SNAPSHOT_DIR);
        // A damaged body is refused by name, and changes nothing.
        let mut damaged = ReceivedSnapshot::create(&spool, None).await.unwrap();
        damaged.append(sent[..sent.len() - 1].to_vec()).await.unwrap();
        let e = fresh.install_snapshot(&built.meta, damaged.body()).await.unwrap_err();
        assert!(e.to_string().contains("decode snapshot"), "{e}");
        assert_eq!(*fresh.read(), LockState::new(), "nothing installed");
        assert_eq!(snapshot_files(other.path()), Vec::<String>::new(), "the refused install wrote no snapshot file");

        let mut received = ReceivedSnapshot::create(&spool, None).await.unwrap();
        assert_eq!(snapshot_files(other.path()), Vec::<String>::new(), "the file being received has no name");
        for piece in sent.chunks(sent.len() / 3 + 1) {
            received.append(piece.to_vec()).await.unwrap();
        }
        fresh.install_snapshot(&built.meta, received.body()).await.unwrap();
        assert_eq!(*fresh.read(), *sm.read(), "the installed state is the built one");
        let index = built.meta.last_log_id.as_ref().unwrap().index;
        assert_eq!(snapshot_files(other.path()), vec![snapshot_name(index)], "only the installed snapshot's file");
        let kept = fresh.get_current_snapshot().await.unwrap().expect("the installed snapshot is kept");
        assert_eq!(kept.snapshot.into_bytes().await.unwrap(), sent, "kept as received, not re-encoded");
        drop(fresh);
        let fresh = reopen(other.path()).await;
        assert_eq!(*fresh.read(), *sm.read(), "a restart loads the installed snapshot's file");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn t34_a_format_4_file_whose_body_is_not_format_4_refuses_the_start() {
        let dir = TempDir::new().unwrap();
        let (mut sm, _) = with_keys_and_a_lock(dir.path()).await;
        let built = sm.build_snapshot().await.unwrap();
        drop(sm);
        // Three zero bytes are a whole format-2 body (no rows): a file that
        // says format 4 must not open as it, nor as an empty state.
        let index = built.meta.last_log_id.as_ref().unwrap().index;
        let path = dir.path().join(SNAPSHOT_DIR).join(snapshot_name(index));
        let file = std::fs::read(&path).unwrap();
        let start = file.len() - built.snapshot.len() as usize;
        std::fs::write(&path, [&file[..start], &[0, 0, 0][..]].concat()).unwrap();
        // Tried until the previous store let the data dir go (see `reopen`).
        let mut e = try_open(dir.path()).err().expect("a damaged snapshot file refuses the start");
        for _ in 0..200 {
            if e.to_string().contains("not a format-4 body") {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            e = try_open(dir.path()).err().expect("a damaged snapshot file refuses the start");
        }
        assert!(e.to_string().contains("not a format-4 body"), "{e}");
        assert!(e.to_string().contains(&dir.path().join(SNAPSHOT_DIR).display().to_string()), "{e}");
    }
}
