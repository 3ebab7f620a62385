//! The state-machine store (DESIGN §3.4): the lock state lives in memory for
//! fast reads and applies; a dedicated persister thread writes every applied
//! batch to its own redb file — the changed keys, the last applied log id and
//! the membership in one transaction, so state and dedup table never disagree
//! with `applied`.
//!
//! Applying is in memory and answers at once; persisting follows in log
//! order, several batches per transaction when busy. That is safe because the
//! raft log is the durable record: after a crash the state file holds some
//! consistent prefix and openraft re-applies the tail (apply is
//! deterministic). Batch commits use `Durability::None`, one per second and
//! every snapshot `Durability::Immediate`, so a snapshot never covers state
//! the disk does not hold before raft purges the log behind it. A persister
//! failure is sticky: the next apply returns it and raft stops, rather than
//! let the file skip a batch. No redb call runs on an async worker thread.
//!
//! The audit log (module `audit`) rides along: apply derives each entry's
//! audit records, the persister writes them before it commits the state
//! they describe and syncs them before every durable commit, so the audit
//! file is never behind the state file.

use std::collections::BTreeMap;
use std::io::{self, Cursor, Write as _};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock, RwLockReadGuard};

use tokio::sync::{mpsc, oneshot};

use futures::{Stream, TryStreamExt};
use openraft::entry::RaftEntry;
use openraft::storage::{EntryResponder, RaftSnapshotBuilder, RaftStateMachine};
use openraft::{EntryPayload, LogId, OptionalSend, StoredMembership};
use redb::{Database, Durability, ReadableDatabase, ReadableTable, TableDefinition, TableHandle};
use serde::{Deserialize, Serialize};

use super::codec::{decode, encode, io_err};
use crate::audit::{AuditLog, AuditRecord, records_for};
use crate::clock::Clock;
use crate::metrics::Metrics;
use crate::raft::TypeConfig;
use crate::state_machine::{Applied, Changes, LockState, LogCommand, Outcome, RequestKey};
use crate::types::{LeaseId, RequestId, ResourceName};
use fencer_token::KeyId;

type LogIdT = LogId<openraft::alias::CommittedLeaderIdOf<TypeConfig>>;
type Membership = StoredMembership<openraft::alias::CommittedLeaderIdOf<TypeConfig>, u64, openraft::BasicNode>;
type SnapshotMeta = openraft::alias::SnapshotMetaOf<TypeConfig>;
type Snapshot = openraft::alias::SnapshotOf<TypeConfig, Cursor<Vec<u8>>>;

const RESOURCES: TableDefinition<'_, &str, &[u8]> = TableDefinition::new("resources");
/// Dedup records by [`RequestKey`] (state files since snapshot format 4).
const DEDUP: TableDefinition<'_, u128, &[u8]> = TableDefinition::new("dedup_by_key");
/// Dedup records by request id text, as files before format 4 kept them;
/// moved into [`DEDUP`] when such a file is opened.
const LEGACY_DEDUP: TableDefinition<'_, &str, &[u8]> = TableDefinition::new("dedup");
const ENDED: TableDefinition<'_, u128, &[u8]> = TableDefinition::new("ended");
const SM_META: TableDefinition<'_, &str, &[u8]> = TableDefinition::new("sm_meta");
/// Token-signing public keys by key id (DESIGN P7); added in snapshot format 3.
const SIGNING_KEYS: TableDefinition<'_, &str, &[u8]> = TableDefinition::new("signing_keys");

const KEY_APPLIED: &str = "applied";
const KEY_MEMBERSHIP: &str = "membership";
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
/// redb's page cache for the state file (its default is 1 GiB). The state is
/// served from memory; redb's cache only speeds up batch commits.
pub(crate) const STATE_CACHE_BYTES: usize = 8 << 20;

/// Told about every applied entry, on the applying thread, in log order.
pub trait ApplyObserver: Send + Sync + 'static {
    /// One normal entry was applied at `index`.
    fn on_applied(&self, index: u64, entry: &LogCommand, applied: &Applied);
    /// The whole state was replaced by a snapshot.
    fn on_state_replaced(&self, state: &LockState);
}

/// An observer that ignores everything (tests of the store alone).
pub struct NoObserver;

impl ApplyObserver for NoObserver {
    fn on_applied(&self, _: u64, _: &LogCommand, _: &Applied) {}
    fn on_state_replaced(&self, _: &LockState) {}
}

struct Shared {
    state: RwLock<LockState>,
    applied: Mutex<(Option<LogIdT>, Membership)>,
    snapshot_dir: PathBuf,
    /// Orders to the persister thread, in apply order.
    persist: mpsc::Sender<PersistOp>,
    /// Fails `changed()` once the persister ended and closed the file.
    closed: tokio::sync::watch::Receiver<()>,
    /// The persister's first failure; once set, applies fail.
    failed: Arc<Mutex<Option<String>>>,
    observer: Arc<dyn ApplyObserver>,
    metrics: Arc<Metrics>,
    clock: Clock,
    /// `Some(renewals recorded?)` when an audit log is written.
    audit: Option<bool>,
}

/// Batches queued for the persister before applies wait for it.
const PERSIST_QUEUE: usize = 1024;
/// How long the persister keeps adding batches to one transaction before it
/// commits. A redb commit costs the same for one batch as for fifty (it
/// rewrites every touched page and its checksums): committing each apply
/// batch (~375 a second at the seed workload) made the persister a fifth of
/// a node's CPU. The file may lag the applied state by this much more, which
/// only lengthens the log tail replayed after a crash; a snapshot or `sync`
/// commits at once.
const PERSIST_COMMIT_EVERY: std::time::Duration = std::time::Duration::from_millis(25);

/// Work for the persister thread.
enum PersistOp {
    /// Write a batch's audit lines, then its changed keys and applied id
    /// (merged with neighbours).
    Batch { writes: Writes, applied: LogIdT, membership: Option<Membership>, audit: Vec<AuditRecord> },
    /// Make everything so far durable.
    Sync { done: oneshot::Sender<io::Result<()>> },
    /// Make everything so far durable and dump the tables at that point.
    /// The reply's read transaction sees exactly the tables at `meta`; the
    /// body is encoded from it on another thread, row by row.
    Snapshot { done: oneshot::Sender<io::Result<(SnapshotMeta, redb::ReadTransaction)>> },
    /// Replace every table with a snapshot's (and say so in the audit log).
    Replace {
        meta: SnapshotMeta,
        dump: Arc<TableDump>,
        audit: Option<Box<AuditRecord>>,
        done: oneshot::Sender<io::Result<()>>,
    },
}

/// The redb-backed [`RaftStateMachine`]. Clones share one state.
#[derive(Clone)]
pub struct StateMachineStore {
    shared: Arc<Shared>,
}

/// The snapshot file's header. The file is `[u32 LE header length][header][state]`,
/// so `get_current_snapshot` needs nothing else and the state is written
/// without another copy.
#[derive(Serialize, Deserialize)]
struct SnapshotHeader {
    format: u32,
    meta: SnapshotMeta,
}

fn read_lock<T>(l: &RwLock<T>) -> RwLockReadGuard<'_, T> {
    l.read().unwrap_or_else(|p| p.into_inner())
}

impl StateMachineStore {
    /// Opens (or creates) the state file and loads the state into memory;
    /// with `audit`, records every applied change there (module `audit`).
    /// Blocking: call it from `spawn_blocking` or before serving.
    pub fn open(
        path: &Path,
        snapshot_dir: &Path,
        observer: Arc<dyn ApplyObserver>,
        metrics: Arc<Metrics>,
        clock: Clock,
        audit: Option<AuditLog>,
    ) -> io::Result<Self> {
        std::fs::create_dir_all(snapshot_dir)
            .map_err(|e| io_err(&format!("create snapshot dir {}", snapshot_dir.display()), e))?;
        let db = Database::builder()
            .set_cache_size(STATE_CACHE_BYTES)
            .create(path)
            .map_err(|e| io_err(&format!("open state file {}", path.display()), e))?;
        {
            let w = db.begin_write().map_err(|e| io_err("begin", e))?;
            w.open_table(RESOURCES).map_err(|e| io_err("open resources", e))?;
            w.open_table(DEDUP).map_err(|e| io_err("open dedup", e))?;
            migrate_legacy_dedup(&w)?;
            w.open_table(ENDED).map_err(|e| io_err("open ended", e))?;
            w.open_table(SM_META).map_err(|e| io_err("open sm_meta", e))?;
            w.open_table(SIGNING_KEYS).map_err(|e| io_err("open signing_keys", e))?;
            w.commit().map_err(|e| io_err("commit", e))?;
        }
        let (state, applied, membership) = load(&db)?;
        metrics.locks_held.set(state.lock_count() as i64);
        metrics.waiters.set(state.waiter_count() as i64);
        let (persist, rx) = mpsc::channel(PERSIST_QUEUE);
        let failed = Arc::new(Mutex::new(None));
        let (closed, closed_rx) = tokio::sync::watch::channel(());
        let audit_renewals = audit.as_ref().map(AuditLog::renewals);
        let persister = Persister {
            db,
            _closed: closed,
            failed: failed.clone(),
            clock,
            applied,
            membership: membership.clone(),
            last_immediate_ms: clock.wall_ms(),
            audit,
            metrics: metrics.clone(),
        };
        let timer = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .map_err(|e| io_err("build the state persister's timer", e))?;
        std::thread::Builder::new()
            .name("fencer-state-persist".into())
            .spawn(move || persister.run(rx, timer))
            .map_err(|e| io_err("spawn state persister", e))?;
        Ok(Self {
            shared: Arc::new(Shared {
                state: RwLock::new(state),
                applied: Mutex::new((applied, membership)),
                snapshot_dir: snapshot_dir.to_path_buf(),
                persist,
                failed,
                closed: closed_rx,
                observer,
                metrics,
                clock,
                audit: audit_renewals,
            }),
        })
    }

    /// Read access to the applied lock state.
    pub fn read(&self) -> RwLockReadGuard<'_, LockState> {
        read_lock(&self.shared.state)
    }

    /// The last applied log index.
    pub fn applied_index(&self) -> Option<u64> {
        self.shared.applied.lock().unwrap_or_else(|p| p.into_inner()).0.as_ref().map(|l| l.index)
    }

    /// A receiver whose `changed()` fails once the state file is closed (every
    /// store handle dropped and the persister ended).
    pub fn closed(&self) -> tokio::sync::watch::Receiver<()> {
        self.shared.closed.clone()
    }

    /// The persister's first failure, if the state or audit file could not
    /// be written (the node then applies nothing more until restarted).
    pub fn failure_message(&self) -> Option<String> {
        self.shared.failed.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Makes everything applied so far durable.
    pub async fn sync(&self) -> io::Result<()> {
        let (done, rx) = oneshot::channel();
        self.shared.send(PersistOp::Sync { done }).await?;
        rx.await.map_err(|_| persister_gone())?
    }
}

fn persister_gone() -> io::Error {
    io::Error::other("the state persister has stopped")
}

impl Shared {
    /// Hands work to the persister, waiting while its queue is full.
    async fn send(&self, op: PersistOp) -> io::Result<()> {
        self.persist.send(op).await.map_err(|_| persister_gone())
    }

    fn failure(&self) -> Option<io::Error> {
        let failed = self.failed.lock().unwrap_or_else(|p| p.into_inner());
        failed.as_ref().map(|m| io_err("the state file could not be written", m))
    }
}

/// The state tables, values still encoded: what a snapshot carries
/// (format 4, after [`FORMAT_4_TAG`]).
#[derive(Debug, Default, Serialize, Deserialize)]
struct TableDump {
    resources: Vec<(String, Vec<u8>)>,
    dedup: Vec<(u128, Vec<u8>)>,
    ended: Vec<(u128, Vec<u8>)>,
    signing_keys: Vec<(String, Vec<u8>)>,
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
fn migrate_legacy_dedup(w: &redb::WriteTransaction) -> io::Result<()> {
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

/// Reads every state table from one consistent read transaction.
fn dump_tables(r: &redb::ReadTransaction) -> io::Result<TableDump> {
    Ok(TableDump {
        resources: read_rows(r, RESOURCES, "resources")?,
        dedup: read_rows(r, DEDUP, "dedup")?,
        ended: read_rows(r, ENDED, "ended")?,
        signing_keys: read_rows(r, SIGNING_KEYS, "signing_keys")?,
    })
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

/// A state table's key as dumps and batches hold it: text (`resources`,
/// `signing_keys`) or a 128-bit number (`dedup`, `ended`).
trait RowKey: Sized {
    /// The key type of the redb table.
    type Stored: redb::Key + 'static;
    /// The key as the table takes it.
    fn stored(&self) -> <Self::Stored as redb::Value>::SelfType<'_>;
    /// The key as read from the table.
    fn owned(key: <Self::Stored as redb::Value>::SelfType<'_>) -> Self;
}

impl RowKey for String {
    type Stored = &'static str;
    fn stored(&self) -> &str {
        self.as_str()
    }
    fn owned(key: &str) -> Self {
        key.to_string()
    }
}

impl RowKey for u128 {
    type Stored = u128;
    fn stored(&self) -> u128 {
        *self
    }
    fn owned(key: u128) -> Self {
        key
    }
}

/// A state table whose rows are keyed by `K`.
type StateTable<K> = TableDefinition<'static, <K as RowKey>::Stored, &'static [u8]>;

/// Every row of a state table.
fn read_rows<K: RowKey>(r: &redb::ReadTransaction, def: StateTable<K>, what: &str) -> io::Result<Vec<(K, Vec<u8>)>> {
    let mut rows = Vec::new();
    for item in r.open_table(def).map_err(|e| io_err("open", e))?.iter().map_err(|e| io_err("iter", e))? {
        let (k, v) = item.map_err(|e| io_err(&format!("read {what}"), e))?;
        rows.push((K::owned(k.value()), v.value().to_vec()));
    }
    Ok(rows)
}

/// Puts (`Some`) or removes (`None`) rows of a state table.
fn write_rows<K: RowKey>(
    tx: &redb::WriteTransaction,
    def: StateTable<K>,
    rows: &[(K, Option<Vec<u8>>)],
    what: &str,
) -> io::Result<()> {
    if rows.is_empty() {
        return Ok(()); // most batches change no signing key: do not even open the table
    }
    let mut t = tx.open_table(def).map_err(|e| io_err("open", e))?;
    for (k, v) in rows {
        match v {
            Some(v) => t.insert(k.stored(), v.as_slice()).map(|_| ()),
            None => t.remove(k.stored()).map(|_| ()),
        }
        .map_err(|e| io_err(&format!("write {what}"), e))?;
    }
    Ok(())
}

/// Empties a state table and fills it with `rows`.
fn replace_rows<K: RowKey>(
    tx: &redb::WriteTransaction,
    def: StateTable<K>,
    rows: &[(K, Vec<u8>)],
    what: &str,
) -> io::Result<()> {
    let mut t = tx.open_table(def).map_err(|e| io_err("open", e))?;
    t.retain(|_, _| false).map_err(|e| io_err(&format!("clear {what}"), e))?;
    for (k, v) in rows {
        t.insert(k.stored(), v.as_slice()).map_err(|e| io_err(&format!("write {what}"), e))?;
    }
    Ok(())
}

/// Decodes a dump into a lock state, validating every name and record.
fn state_from_dump(dump: &TableDump) -> io::Result<LockState> {
    let mut resources = BTreeMap::new();
    for (k, v) in &dump.resources {
        let name = ResourceName::new(k.as_str()).map_err(|e| io_err("stored resource name", e))?;
        resources.insert(name, decode(v, "resource state")?);
    }
    let mut dedup = BTreeMap::new();
    for (k, v) in &dump.dedup {
        dedup.insert(RequestKey::from_u128(*k), decode(v, "dedup record")?);
    }
    let mut ended = BTreeMap::new();
    for (k, v) in &dump.ended {
        ended.insert(LeaseId::from_u128(*k), decode(v, "ended lease")?);
    }
    let mut keys = BTreeMap::new();
    for (k, v) in &dump.signing_keys {
        let kid = KeyId::new(k.as_str()).map_err(|e| io_err("stored signing key id", e))?;
        keys.insert(kid, decode(v, "signing key")?);
    }
    Ok(LockState::from_parts(resources, dedup, ended).with_signing_keys(keys))
}

fn load(db: &Database) -> io::Result<(LockState, Option<LogIdT>, Membership)> {
    let r = db.begin_read().map_err(|e| io_err("begin read", e))?;
    let state = state_from_dump(&dump_tables(&r)?)?;
    let meta = r.open_table(SM_META).map_err(|e| io_err("open", e))?;
    let applied = match meta.get(KEY_APPLIED).map_err(|e| io_err("read applied", e))? {
        Some(v) => Some(decode(v.value(), "applied log id")?),
        None => None,
    };
    let membership = match meta.get(KEY_MEMBERSHIP).map_err(|e| io_err("read membership", e))? {
        Some(v) => decode(v.value(), "membership")?,
        None => Membership::default(),
    };
    Ok((state, applied, membership))
}

/// The encoded values of the keys a batch changed, gathered under the state lock.
#[derive(Default)]
struct Writes {
    resources: Vec<(String, Option<Vec<u8>>)>,
    dedup: Vec<(u128, Option<Vec<u8>>)>,
    ended: Vec<(u128, Option<Vec<u8>>)>,
    signing_keys: Vec<(String, Option<Vec<u8>>)>,
}

fn gather(state: &LockState, changes: Changes) -> io::Result<Writes> {
    let mut w = Writes::default();
    for name in changes.resources {
        let value = state.resource(&name).map(encode).transpose()?;
        w.resources.push((name.as_str().to_string(), value));
    }
    for key in changes.dedup_put {
        let value = state.dedup_by_key(&key).map(encode).transpose()?;
        w.dedup.push((key.to_u128(), value));
    }
    for key in changes.dedup_del {
        w.dedup.push((key.to_u128(), None));
    }
    for id in changes.ended_put {
        let value = state.ended(&id).map(encode).transpose()?;
        w.ended.push((id.to_u128(), value));
    }
    for id in changes.ended_del {
        w.ended.push((id.to_u128(), None));
    }
    for kid in changes.signing_keys {
        let value = state.signing_keys().get(&kid).map(encode).transpose()?;
        w.signing_keys.push((kid.as_str().to_string(), value));
    }
    Ok(w)
}

/// Writes a batch's changes into an open transaction.
fn write_changes(
    tx: &redb::WriteTransaction,
    writes: &Writes,
    applied: &LogIdT,
    membership: Option<&Membership>,
) -> io::Result<()> {
    write_rows(tx, RESOURCES, &writes.resources, "resource")?;
    write_rows(tx, DEDUP, &writes.dedup, "dedup")?;
    write_rows(tx, ENDED, &writes.ended, "ended")?;
    write_rows(tx, SIGNING_KEYS, &writes.signing_keys, "signing key")?;
    let mut t = tx.open_table(SM_META).map_err(|e| io_err("open", e))?;
    t.insert(KEY_APPLIED, encode(applied)?.as_slice()).map_err(|e| io_err("write applied", e))?;
    if let Some(m) = membership {
        t.insert(KEY_MEMBERSHIP, encode(m)?.as_slice()).map_err(|e| io_err("write membership", e))?;
    }
    Ok(())
}

/// The thread that writes applied batches to the state file, in order.
struct Persister {
    db: Database,
    failed: Arc<Mutex<Option<String>>>,
    clock: Clock,
    /// What the file holds once the open transaction commits.
    applied: Option<LogIdT>,
    membership: Membership,
    last_immediate_ms: u64,
    /// Written before every commit, synced before every durable one.
    audit: Option<AuditLog>,
    metrics: Arc<Metrics>,
    /// Dropped last (after `db` and `audit`) when the thread ends: the files are closed.
    _closed: tokio::sync::watch::Sender<()>,
}

impl Persister {
    /// Handles ops in order, keeping one transaction open for up to
    /// [`PERSIST_COMMIT_EVERY`]; `timer` only waits for the next op with a
    /// deadline (this thread never runs async work).
    fn run(mut self, mut rx: mpsc::Receiver<PersistOp>, timer: tokio::runtime::Runtime) {
        let mut open: Option<redb::WriteTransaction> = None;
        let mut opened_at = self.clock.now();
        loop {
            let next = if open.is_none() {
                rx.blocking_recv()
            } else {
                let left = PERSIST_COMMIT_EVERY.saturating_sub(opened_at.elapsed());
                match timer.block_on(async { tokio::time::timeout(left, rx.recv()).await }) {
                    Ok(op) => op,
                    Err(_) => {
                        // The transaction is old enough: commit it.
                        if let Some(tx) = open.take()
                            && let Err(e) = self.commit(tx, false)
                        {
                            self.fail(&e);
                        }
                        continue;
                    }
                }
            };
            let Some(op) = next else { break };
            let was_open = open.is_some();
            if let Err(e) = self.handle(op, &mut open) {
                self.fail(&e);
                // A batch may have been written in part: never commit it.
                // The file stays at the last whole batch, and the log
                // replays the rest after the restart.
                if let Some(tx) = open.take() {
                    let _ = tx.abort();
                }
            }
            if open.is_some() && !was_open {
                opened_at = self.clock.now();
            }
        }
        if let Some(tx) = open.take()
            && let Err(e) = self.commit(tx, false)
        {
            self.fail(&e);
        }
        // Every store handle is gone: leave the file durable.
        if self.failed.lock().unwrap_or_else(|p| p.into_inner()).is_none()
            && let Ok(tx) = self.db.begin_write()
        {
            let _ = self.commit(tx, true);
        }
    }

    fn fail(&self, e: &io::Error) {
        let mut failed = self.failed.lock().unwrap_or_else(|p| p.into_inner());
        if failed.is_none() {
            tracing::error!(error = %e, "state or audit file write failed; the node stops applying until restarted");
            *failed = Some(e.to_string());
        }
    }

    fn is_failed(&self) -> Option<io::Error> {
        let failed = self.failed.lock().unwrap_or_else(|p| p.into_inner());
        failed.as_ref().map(|m| io_err("the state file could not be written earlier", m))
    }

    /// Commits, durably when asked or when the last durable commit is a
    /// second old. The audit lines of everything in the transaction reach
    /// the audit file first, and its disk before a durable commit.
    fn commit(&mut self, mut tx: redb::WriteTransaction, durable: bool) -> io::Result<()> {
        let started = self.clock.now();
        let now_ms = self.clock.wall_ms();
        let durable = durable || now_ms.saturating_sub(self.last_immediate_ms) >= 1_000;
        if let Some(audit) = &mut self.audit {
            if durable { audit.sync()? } else { audit.flush()? }
        }
        tx.set_durability(if durable { Durability::Immediate } else { Durability::None })
            .map_err(|e| io_err("set durability", e))?;
        tx.commit().map_err(|e| io_err("commit state", e))?;
        self.metrics.state_persist_seconds.observe(started.elapsed().as_secs_f64());
        if durable {
            self.last_immediate_ms = now_ms;
        }
        Ok(())
    }

    /// Commits the open transaction (if any) durably, or an empty one.
    fn commit_durable(&mut self, open: &mut Option<redb::WriteTransaction>) -> io::Result<()> {
        let tx = match open.take() {
            Some(tx) => tx,
            None => self.db.begin_write().map_err(|e| io_err("begin", e))?,
        };
        self.commit(tx, true)
    }

    fn handle(&mut self, op: PersistOp, open: &mut Option<redb::WriteTransaction>) -> io::Result<()> {
        match op {
            PersistOp::Batch { writes, applied, membership, audit } => {
                if let Some(e) = self.is_failed() {
                    return Err(e);
                }
                if let Some(log) = &mut self.audit {
                    log.append(&audit)?;
                }
                if open.is_none() {
                    *open = Some(self.db.begin_write().map_err(|e| io_err("begin state write", e))?);
                }
                let tx = open.as_ref().expect("just opened");
                write_changes(tx, &writes, &applied, membership.as_ref())?;
                self.applied = Some(applied);
                if let Some(m) = membership {
                    self.membership = m;
                }
                Ok(())
            }
            PersistOp::Sync { done } => {
                let r = self.is_failed().map_or_else(|| self.commit_durable(open), Err);
                let reply = r.as_ref().map(|_| ()).map_err(|e| io::Error::new(e.kind(), e.to_string()));
                let _ = done.send(reply);
                r
            }
            PersistOp::Snapshot { done } => {
                let r = self.is_failed().map_or_else(|| self.dump(open), Err);
                let (reply, result) = match r {
                    Ok(v) => (Ok(v), Ok(())),
                    Err(e) => (Err(io::Error::new(e.kind(), e.to_string())), Err(e)),
                };
                let _ = done.send(reply);
                result
            }
            PersistOp::Replace { meta, dump, audit, done } => {
                let r = self.replace(open, &meta, &dump, audit);
                let reply = r.as_ref().map(|_| ()).map_err(|e| io::Error::new(e.kind(), e.to_string()));
                let _ = done.send(reply);
                r
            }
        }
    }

    /// Durable commit, then the tables as of exactly `self.applied`.
    fn dump(&mut self, open: &mut Option<redb::WriteTransaction>) -> io::Result<(SnapshotMeta, redb::ReadTransaction)> {
        self.commit_durable(open)?;
        let view = self.db.begin_read().map_err(|e| io_err("begin read", e))?;
        let meta = SnapshotMeta { last_log_id: self.applied, last_membership: self.membership.clone() };
        Ok((meta, view))
    }

    fn replace(
        &mut self,
        open: &mut Option<redb::WriteTransaction>,
        meta: &SnapshotMeta,
        dump: &TableDump,
        audit: Option<Box<AuditRecord>>,
    ) -> io::Result<()> {
        if let Some(tx) = open.take() {
            self.commit(tx, false)?;
        }
        if let (Some(log), Some(record)) = (&mut self.audit, audit) {
            log.append(&[*record])?;
        }
        let tx = self.db.begin_write().map_err(|e| io_err("begin", e))?;
        {
            replace_rows(&tx, RESOURCES, &dump.resources, "resources")?;
            replace_rows(&tx, DEDUP, &dump.dedup, "dedup")?;
            replace_rows(&tx, ENDED, &dump.ended, "ended")?;
            replace_rows(&tx, SIGNING_KEYS, &dump.signing_keys, "signing_keys")?;
            let mut t = tx.open_table(SM_META).map_err(|e| io_err("open", e))?;
            match &meta.last_log_id {
                Some(l) => t.insert(KEY_APPLIED, encode(l)?.as_slice()).map(|_| ()),
                None => t.remove(KEY_APPLIED).map(|_| ()),
            }
            .map_err(|e| io_err("write applied", e))?;
            t.insert(KEY_MEMBERSHIP, encode(&meta.last_membership)?.as_slice())
                .map_err(|e| io_err("write membership", e))?;
        }
        self.commit(tx, true)?;
        // A successful install starts a fresh, consistent file.
        *self.failed.lock().unwrap_or_else(|p| p.into_inner()) = None;
        self.applied = meta.last_log_id;
        self.membership = meta.last_membership.clone();
        Ok(())
    }
}

/// One entry of a batch, reduced to what apply needs.
enum Item {
    Command(u64, LogCommand),
    Membership(Membership),
    Blank,
}

/// Applies a batch in memory (CPU only: the state lock, the observer, and
/// encoding the changed keys) and returns the outcomes and the persister's work.
fn apply_in_memory(shared: &Shared, items: Vec<(LogIdT, Item)>) -> io::Result<(Vec<Outcome>, Option<PersistOp>)> {
    let started = shared.clock.now();
    let mut outcomes = Vec::with_capacity(items.len());
    let mut last = None;
    let mut membership = None;
    let mut audit = Vec::new();
    let writes = {
        let mut state = shared.state.write().unwrap_or_else(|p| p.into_inner());
        for (log_id, item) in items {
            match item {
                Item::Command(index, cmd) => {
                    let applied = state.apply(index, &cmd);
                    shared.observer.on_applied(index, &cmd, &applied);
                    if let Some(renewals) = shared.audit {
                        records_for(index, &cmd, &applied, renewals, &mut audit);
                    }
                    tracing::debug!(
                        log_index = index,
                        op = cmd.cmd.name(),
                        resource = cmd.cmd.resource().map(|r| r.as_str()),
                        request_id = cmd.cmd.acquire().map(|a| a.request_id.as_str()),
                        outcome = applied.outcome.name(),
                        "applied"
                    );
                    outcomes.push(applied.outcome);
                }
                Item::Membership(m) => {
                    if shared.audit.is_some() {
                        let config = m.membership();
                        audit.push(AuditRecord::membership(
                            log_id.index,
                            shared.clock.wall_ms(),
                            config.voter_ids().collect(),
                            config.learner_ids().collect(),
                        ));
                    }
                    membership = Some(m);
                    outcomes.push(Outcome::Noop);
                }
                Item::Blank => outcomes.push(Outcome::Noop),
            }
            last = Some(log_id);
        }
        shared.metrics.locks_held.set(state.lock_count() as i64);
        shared.metrics.waiters.set(state.waiter_count() as i64);
        let changes = state.take_changes();
        gather(&state, changes)?
    };
    let Some(last) = last else { return Ok((outcomes, None)) };
    {
        let mut applied = shared.applied.lock().unwrap_or_else(|p| p.into_inner());
        applied.0 = Some(last);
        if let Some(m) = &membership {
            applied.1 = m.clone();
        }
    }
    shared.metrics.applied_index.set(last.index as i64);
    shared.metrics.apply_seconds.observe(started.elapsed().as_secs_f64());
    shared.metrics.apply_batch_entries.observe(outcomes.len() as f64);
    Ok((outcomes, Some(PersistOp::Batch { writes, applied: last, membership, audit })))
}

impl RaftStateMachine<TypeConfig> for StateMachineStore {
    type SnapshotData = Cursor<Vec<u8>>;
    type SnapshotBuilder = Self;

    async fn applied_state(&mut self) -> Result<(Option<LogIdT>, Membership), io::Error> {
        let applied = self.shared.applied.lock().unwrap_or_else(|p| p.into_inner());
        Ok((applied.0, applied.1.clone()))
    }

    async fn apply<Strm>(&mut self, mut entries: Strm) -> Result<(), io::Error>
    where
        Strm: Stream<Item = Result<EntryResponder<TypeConfig>, io::Error>> + Unpin + OptionalSend,
    {
        let mut items = Vec::new();
        let mut responders = Vec::new();
        while let Some((entry, responder)) = entries.try_next().await? {
            let log_id = entry.log_id();
            let index = entry.index();
            let item = match entry.payload {
                EntryPayload::Blank => Item::Blank,
                EntryPayload::Normal(cmd) => Item::Command(index, cmd),
                EntryPayload::Membership(m) => Item::Membership(StoredMembership::new(Some(log_id), m)),
            };
            items.push((log_id, item));
            responders.push(responder);
        }
        if items.is_empty() {
            return Ok(());
        }
        if let Some(e) = self.shared.failure() {
            return Err(e);
        }
        let (outcomes, persist) = apply_in_memory(&self.shared, items)?;
        if let Some(op) = persist {
            self.shared.send(op).await?;
        }
        for (responder, outcome) in responders.into_iter().zip(outcomes) {
            if let Some(r) = responder {
                r.send(outcome);
            }
        }
        Ok(())
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        self.clone()
    }

    async fn install_snapshot(&mut self, meta: &SnapshotMeta, snapshot: Self::SnapshotData) -> Result<(), io::Error> {
        install(&self.shared, meta.clone(), snapshot.into_inner()).await
    }

    async fn get_current_snapshot(&mut self) -> Result<Option<Snapshot>, io::Error> {
        let dir = self.shared.snapshot_dir.clone();
        tokio::task::spawn_blocking(move || {
            let Some(path) = latest_snapshot(&dir)? else { return Ok(None) };
            let mut bytes = std::fs::read(&path).map_err(|e| io_err(&format!("read {}", path.display()), e))?;
            let damaged = || io_err("snapshot", format!("{} is truncated or damaged", path.display()));
            let len =
                bytes.get(..4).map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize).ok_or_else(damaged)?;
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
}

impl RaftSnapshotBuilder<TypeConfig> for StateMachineStore {
    type SnapshotData = Cursor<Vec<u8>>;

    async fn build_snapshot(&mut self) -> Result<Snapshot, io::Error> {
        build(&self.shared).await
    }
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
async fn build(shared: &Shared) -> io::Result<Snapshot> {
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
async fn install(shared: &Shared, meta: SnapshotMeta, bytes: Vec<u8>) -> io::Result<()> {
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
    //! snapshots (before signing keys) still load.

    use futures::stream;
    use openraft::alias::EntryOf;
    use openraft::storage::{RaftSnapshotBuilder, RaftStateMachine};
    use tempfile::TempDir;

    use super::*;
    use crate::state_machine::{AcquireCmd, Command};
    use crate::store::{SNAPSHOT_DIR, STATE_FILE};

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
