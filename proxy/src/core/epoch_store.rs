//! The durable epoch store (P2, P8, P10) and the bounded rejection table, in
//! one redb file, `epochs.redb`, under the data directory.
//!
//! redb calls block, so they never run on async worker threads: one
//! dedicated thread owns every write transaction, and reads run under
//! `spawn_blocking`. The writer group-commits: raises that queue while a
//! commit is running go into the next transaction together, each answered
//! only after `Durability::Immediate` has returned.

use std::collections::VecDeque;
use std::fs::{File, OpenOptions};
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};

use redb::{Database, Durability, ReadableDatabase, ReadableTable, ReadableTableMetadata, TableDefinition};
use tokio::sync::oneshot;

use crate::core::names::ResourceName;
use crate::core::rejections::{RejectionRecord, RejectionsPage};

const EPOCHS: TableDefinition<'_, &str, u64> = TableDefinition::new("epochs");
const META: TableDefinition<'_, &str, u64> = TableDefinition::new("meta");
const REJECTIONS: TableDefinition<'_, u64, &[u8]> = TableDefinition::new("rejections");

const META_FLOOR: &str = "floor";
const META_FORMAT: &str = "format_version";
/// 1 after a graceful close, 0 while a process has the store open.
const META_CLEAN: &str = "clean_shutdown";
const FORMAT_VERSION: u64 = 1;

/// File names inside the data directory.
pub const STORE_FILE: &str = "epochs.redb";
/// The rejection log, JSON lines, never truncated by the proxy.
pub const REJECTION_LOG_FILE: &str = "rejections.jsonl";
/// The admin audit log (raise-epoch, clear-indeterminate), JSON lines,
/// fsynced before the admin call returns.
pub const AUDIT_LOG_FILE: &str = "audit.jsonl";

/// Rejections waiting for the writer thread; beyond it they are dropped and
/// counted (an old-token flood must not grow memory without bound).
pub const REJECTION_QUEUE_MAX: usize = 8192;

/// Why the store could not be opened. The proxy does not start.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    /// P10: no epoch store exists and no floor was given.
    #[error(
        "the epoch store {path} is empty (new data directory); refusing to serve without a floor. \
         Pass --floor N with N at least the coordinator's current commit index (every token ever \
         issued is at or below it), or point --data-dir at the existing store (P10)"
    )]
    EmptyStoreNeedsFloor {
        /// The store file.
        path: PathBuf,
    },
    /// The data directory or a log file could not be created or opened.
    #[error("cannot open {path}: {source}")]
    Io {
        /// The path.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// redb refused the file (corrupt, locked by another process, …).
    #[error("cannot open the epoch store {path}: {source}")]
    Database {
        /// The store file.
        path: PathBuf,
        /// The redb error.
        source: Box<redb::Error>,
    },
    /// The file was written by an incompatible version.
    #[error("the epoch store {path} has format version {found}; this proxy reads version {FORMAT_VERSION}")]
    Format {
        /// The store file.
        path: PathBuf,
        /// The version found.
        found: u64,
    },
    /// A stored resource name no longer validates.
    #[error("the epoch store {path} holds an invalid resource name {name:?}")]
    BadName {
        /// The store file.
        path: PathBuf,
        /// The stored name.
        name: String,
    },
}

/// Why a store operation failed. The request that needed it is refused
/// (503); nothing moves upstream.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// redb failed.
    #[error("epoch store: {0}")]
    Database(#[from] Box<redb::Error>),
    /// Writing a log file failed.
    #[error("epoch store log file: {0}")]
    Io(#[from] std::io::Error),
    /// The writer thread has stopped (the proxy is shutting down).
    #[error("the epoch store is closed")]
    Closed,
}

fn db_err(e: impl Into<redb::Error>) -> Box<redb::Error> {
    Box::new(e.into())
}

fn set_meta(db: &Database, key: &str, value: u64) -> Result<(), Box<redb::Error>> {
    let mut wtx = db.begin_write().map_err(db_err)?;
    wtx.set_durability(Durability::Immediate).map_err(db_err)?;
    wtx.open_table(META).map_err(db_err)?.insert(key, value).map_err(db_err)?;
    wtx.commit().map_err(db_err)
}

/// What the store held when it was opened.
#[derive(Debug, Clone)]
pub struct StoreSnapshot {
    /// Every resource with a stored epoch.
    pub epochs: Vec<(ResourceName, u64)>,
    /// The floor: the epoch of every resource not in `epochs` (P10).
    pub floor: u64,
    /// Whether the previous process closed the store gracefully. When it did
    /// not (kill -9, crash, power loss), writes it had in flight may still
    /// be applied upstream.
    pub clean_shutdown: bool,
}

enum Command {
    Raise { resource: String, epoch: u64, audit: Option<Vec<u8>>, reply: oneshot::Sender<Result<u64, StoreError>> },
    Audit { line: Vec<u8>, reply: oneshot::Sender<Result<(), StoreError>> },
    FlushRejections,
    Close { clean: bool, reply: oneshot::Sender<()> },
}

struct Pending {
    queue: VecDeque<RejectionRecord>,
    nudged: bool,
}

/// Handle to the epoch store; cheap to clone.
#[derive(Clone)]
pub struct EpochStore {
    tx: mpsc::Sender<Command>,
    db: Arc<Database>,
    pending: Arc<Mutex<Pending>>,
    table_max: u64,
}

impl std::fmt::Debug for EpochStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EpochStore").field("table_max", &self.table_max).finish_non_exhaustive()
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A panic while holding this lock cannot leave the queue inconsistent.
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl EpochStore {
    /// Opens (or, with a floor, creates) the store in `dir`. Blocking: call
    /// it from `spawn_blocking` or before the runtime starts.
    ///
    /// `floor` initialises an empty store (P10). On an existing store a
    /// higher floor raises it; a lower one is ignored (P8: never lower).
    pub fn open(dir: &Path, floor: Option<u64>, rejection_table_max: u64) -> Result<(Self, StoreSnapshot), OpenError> {
        let path = dir.join(STORE_FILE);
        let io = |path: &Path| {
            let path = path.to_owned();
            move |source| OpenError::Io { path, source }
        };
        let dbe = |source: redb::Error| OpenError::Database { path: path.clone(), source: Box::new(source) };
        let exists = path.try_exists().map_err(io(&path))?;
        if !exists && floor.is_none() {
            return Err(OpenError::EmptyStoreNeedsFloor { path });
        }
        std::fs::create_dir_all(dir).map_err(io(dir))?;
        let db = Database::create(&path).map_err(|e| dbe(e.into()))?;

        let (stored_floor, format, clean) = {
            let rtx = db.begin_read().map_err(|e| dbe(e.into()))?;
            match rtx.open_table(META) {
                Ok(t) => (
                    t.get(META_FLOOR).map_err(|e| dbe(e.into()))?.map(|v| v.value()),
                    t.get(META_FORMAT).map_err(|e| dbe(e.into()))?.map(|v| v.value()),
                    t.get(META_CLEAN).map_err(|e| dbe(e.into()))?.is_none_or(|v| v.value() == 1),
                ),
                Err(redb::TableError::TableDoesNotExist(_)) => (None, None, true),
                Err(e) => return Err(dbe(e.into())),
            }
        };
        if let Some(found) = format
            && found != FORMAT_VERSION
        {
            return Err(OpenError::Format { path, found });
        }
        let floor = match (stored_floor, floor) {
            (None, None) => return Err(OpenError::EmptyStoreNeedsFloor { path }),
            (Some(s), None) => s,
            (Some(s), Some(f)) if f <= s => {
                if f < s {
                    tracing::warn!(
                        stored = s,
                        given = f,
                        "--floor is below the stored floor; keeping the stored one (P8)"
                    );
                }
                s
            }
            (_, Some(f)) => {
                let mut wtx = db.begin_write().map_err(|e| dbe(e.into()))?;
                wtx.set_durability(Durability::Immediate).map_err(|e| dbe(e.into()))?;
                {
                    let mut meta = wtx.open_table(META).map_err(|e| dbe(e.into()))?;
                    meta.insert(META_FLOOR, f).map_err(|e| dbe(e.into()))?;
                    meta.insert(META_FORMAT, FORMAT_VERSION).map_err(|e| dbe(e.into()))?;
                    wtx.open_table(EPOCHS).map_err(|e| dbe(e.into()))?;
                    wtx.open_table(REJECTIONS).map_err(|e| dbe(e.into()))?;
                }
                wtx.commit().map_err(|e| dbe(e.into()))?;
                tracing::info!(floor = f, "epoch store floor set");
                f
            }
        };

        // From now on a crash is an unclean stop.
        set_meta(&db, META_CLEAN, 0).map_err(|e| OpenError::Database { path: path.clone(), source: e })?;

        let (epochs, rejection_count, next_seq) = {
            let rtx = db.begin_read().map_err(|e| dbe(e.into()))?;
            let table = rtx.open_table(EPOCHS).map_err(|e| dbe(e.into()))?;
            let mut epochs = Vec::new();
            for entry in table.iter().map_err(|e| dbe(e.into()))? {
                let (k, v) = entry.map_err(|e| dbe(e.into()))?;
                let name = ResourceName::new(k.value())
                    .map_err(|_| OpenError::BadName { path: path.clone(), name: k.value().to_owned() })?;
                epochs.push((name, v.value()));
            }
            let rej = rtx.open_table(REJECTIONS).map_err(|e| dbe(e.into()))?;
            let count = rej.len().map_err(|e| dbe(e.into()))?;
            let next = rej.last().map_err(|e| dbe(e.into()))?.map_or(1, |(k, _)| k.value() + 1);
            (epochs, count, next)
        };

        let open_append = |name: &str| -> Result<File, OpenError> {
            let p = dir.join(name);
            OpenOptions::new().create(true).append(true).open(&p).map_err(io(&p))
        };
        let rejection_log = BufWriter::new(open_append(REJECTION_LOG_FILE)?);
        let audit_log = open_append(AUDIT_LOG_FILE)?;

        let db = Arc::new(db);
        let pending = Arc::new(Mutex::new(Pending { queue: VecDeque::new(), nudged: false }));
        let (tx, rx) = mpsc::channel();
        let writer = Writer {
            db: db.clone(),
            pending: pending.clone(),
            rejection_log,
            audit_log,
            table_max: rejection_table_max,
            rejection_count,
            next_seq,
        };
        std::thread::Builder::new().name("fencer-epoch-store".into()).spawn(move || writer.run(rx)).map_err(io(dir))?;
        Ok((
            Self { tx, db, pending, table_max: rejection_table_max },
            StoreSnapshot { epochs, floor, clean_shutdown: clean },
        ))
    }

    /// Durably raises `resource`'s stored epoch to at least `epoch` and
    /// returns the stored value. Returns only after an immediate-durability
    /// commit (P2). Never lowers (P8).
    pub async fn raise(&self, resource: &ResourceName, epoch: u64) -> Result<u64, StoreError> {
        self.raise_inner(resource, epoch, None).await
    }

    /// [`raise`](Self::raise), with an audit line appended (and fsynced) to
    /// `audit.jsonl` after the commit.
    pub(crate) async fn raise_audited(
        &self,
        resource: &ResourceName,
        epoch: u64,
        audit: Vec<u8>,
    ) -> Result<u64, StoreError> {
        self.raise_inner(resource, epoch, Some(audit)).await
    }

    async fn raise_inner(
        &self,
        resource: &ResourceName,
        epoch: u64,
        audit: Option<Vec<u8>>,
    ) -> Result<u64, StoreError> {
        let (reply, rx) = oneshot::channel();
        self.tx
            .send(Command::Raise { resource: resource.as_str().to_owned(), epoch, audit, reply })
            .map_err(|_| StoreError::Closed)?;
        rx.await.map_err(|_| StoreError::Closed)?
    }

    /// Appends one line to the audit log and fsyncs it.
    pub(crate) async fn audit(&self, line: Vec<u8>) -> Result<(), StoreError> {
        let (reply, rx) = oneshot::channel();
        self.tx.send(Command::Audit { line, reply }).map_err(|_| StoreError::Closed)?;
        rx.await.map_err(|_| StoreError::Closed)?
    }

    /// Queues a rejection for the table and the JSON-lines log. Never
    /// blocks; returns `false` when the queue is full and the record was
    /// dropped.
    pub fn log_rejection(&self, record: RejectionRecord) -> bool {
        let nudge = {
            let mut p = lock(&self.pending);
            if p.queue.len() >= REJECTION_QUEUE_MAX {
                return false;
            }
            p.queue.push_back(record);
            !std::mem::replace(&mut p.nudged, true)
        };
        if nudge {
            let _ = self.tx.send(Command::FlushRejections);
        }
        true
    }

    /// A page of stored rejections, newest first, with `seq < before`.
    pub async fn rejections(&self, before: Option<u64>, limit: usize) -> Result<RejectionsPage, StoreError> {
        let db = self.db.clone();
        let table_max = self.table_max;
        tokio::task::spawn_blocking(move || -> Result<RejectionsPage, StoreError> {
            let rtx = db.begin_read().map_err(db_err)?;
            let table = rtx.open_table(REJECTIONS).map_err(db_err)?;
            let range = table.range(..before.unwrap_or(u64::MAX)).map_err(db_err)?;
            let mut out = Vec::new();
            let mut more = false;
            for entry in range.rev() {
                let (_, v) = entry.map_err(db_err)?;
                if out.len() == limit {
                    more = true;
                    break;
                }
                if let Ok(record) = serde_json::from_slice::<RejectionRecord>(v.value()) {
                    out.push(record);
                }
            }
            let next_before = if more { out.last().map(|r| r.seq) } else { None };
            Ok(RejectionsPage { rejections: out, next_before, table_max })
        })
        .await
        .map_err(|_| StoreError::Closed)?
    }

    /// Checks the store answers a read (for `/readyz`).
    pub async fn ping(&self) -> Result<(), StoreError> {
        let db = self.db.clone();
        tokio::task::spawn_blocking(move || db.begin_read().map(drop).map_err(db_err).map_err(StoreError::from))
            .await
            .map_err(|_| StoreError::Closed)?
    }

    /// Flushes queued rejections and stops the writer thread. `clean`
    /// records that nothing this process forwarded can still land upstream;
    /// otherwise the next start treats every resource as indeterminate until
    /// the quarantine passes. The file is released once every clone of this
    /// handle is dropped too.
    pub async fn close(&self, clean: bool) {
        let (reply, rx) = oneshot::channel();
        if self.tx.send(Command::Close { clean, reply }).is_ok() {
            let _ = rx.await;
        }
    }
}

struct Writer {
    db: Arc<Database>,
    pending: Arc<Mutex<Pending>>,
    rejection_log: BufWriter<File>,
    audit_log: File,
    table_max: u64,
    rejection_count: u64,
    next_seq: u64,
}

/// A queued raise: resource, epoch, audit line, reply.
type RaiseCmd = (String, u64, Option<Vec<u8>>, oneshot::Sender<Result<u64, StoreError>>);

impl Writer {
    fn run(mut self, rx: mpsc::Receiver<Command>) {
        let mut close_reply = None;
        while close_reply.is_none() {
            let Ok(first) = rx.recv() else { break };
            let mut batch = vec![first];
            // Group commit: everything that queued while we were busy.
            while batch.len() < 1024 {
                match rx.try_recv() {
                    Ok(c) => batch.push(c),
                    Err(_) => break,
                }
            }
            let mut raises = Vec::new();
            let mut audits = Vec::new();
            for c in batch {
                match c {
                    Command::Raise { resource, epoch, audit, reply } => raises.push((resource, epoch, audit, reply)),
                    Command::Audit { line, reply } => audits.push((line, reply)),
                    Command::FlushRejections => {}
                    Command::Close { clean, reply } => close_reply = Some((clean, reply)),
                }
            }
            self.commit(raises);
            for (line, reply) in audits {
                let _ = reply.send(self.append_audit(&line).map_err(StoreError::from));
            }
        }
        // Closing or every handle dropped: keep what is queued, and let go
        // of the database before saying we are done.
        self.commit(Vec::new());
        if let Some((true, _)) = &close_reply
            && let Err(e) = set_meta(&self.db, META_CLEAN, 1)
        {
            tracing::error!(error = %e, "cannot mark the epoch store closed cleanly");
        }
        drop(self);
        if let Some((_, reply)) = close_reply {
            let _ = reply.send(());
        }
    }

    fn append_audit(&mut self, line: &[u8]) -> std::io::Result<()> {
        self.audit_log.write_all(line)?;
        self.audit_log.write_all(b"\n")?;
        self.audit_log.sync_data()
    }

    fn commit(&mut self, raises: Vec<RaiseCmd>) {
        let rejections: Vec<RejectionRecord> = {
            let mut p = lock(&self.pending);
            p.nudged = false;
            p.queue.drain(..).collect()
        };
        if raises.is_empty() && rejections.is_empty() {
            return;
        }
        let first_seq = self.next_seq;
        match self.write_txn(&raises, rejections) {
            Ok((results, lines)) => {
                if !lines.is_empty() {
                    let written = self.rejection_log.write_all(&lines).and_then(|()| self.rejection_log.flush());
                    if let Err(e) = written {
                        tracing::error!(error = %e, "cannot append to {REJECTION_LOG_FILE}");
                    }
                }
                for ((_, _, audit, reply), stored) in raises.into_iter().zip(results) {
                    let mut result = Ok(stored);
                    if let Some(line) = audit
                        && let Err(e) = self.append_audit(&line)
                    {
                        result = Err(e.into());
                    }
                    let _ = reply.send(result);
                }
            }
            Err(e) => {
                self.next_seq = first_seq;
                tracing::error!(error = %e, "epoch store commit failed");
                let msg = e.to_string();
                for (_, _, _, reply) in raises {
                    let _ = reply.send(Err(StoreError::Io(std::io::Error::other(msg.clone()))));
                }
            }
        }
    }

    /// One transaction: every raise and every queued rejection. Returns the
    /// stored epoch per raise and the JSON lines for the log file.
    fn write_txn(
        &mut self,
        raises: &[RaiseCmd],
        rejections: Vec<RejectionRecord>,
    ) -> Result<(Vec<u64>, Vec<u8>), Box<redb::Error>> {
        let mut wtx = self.db.begin_write().map_err(db_err)?;
        wtx.set_durability(Durability::Immediate).map_err(db_err)?;
        let mut results = Vec::with_capacity(raises.len());
        let mut lines = Vec::new();
        let mut count = self.rejection_count;
        {
            let mut epochs = wtx.open_table(EPOCHS).map_err(db_err)?;
            for (resource, epoch, _, _) in raises {
                let stored = epochs.get(resource.as_str()).map_err(db_err)?.map_or(0, |v| v.value());
                let new = stored.max(*epoch); // P8: never lower.
                if new != stored {
                    epochs.insert(resource.as_str(), new).map_err(db_err)?;
                }
                results.push(new);
            }
            let mut table = wtx.open_table(REJECTIONS).map_err(db_err)?;
            for mut record in rejections {
                record.seq = self.next_seq;
                self.next_seq += 1;
                let json = serde_json::to_vec(&record).unwrap_or_default();
                table.insert(record.seq, json.as_slice()).map_err(db_err)?;
                lines.extend_from_slice(&json);
                lines.push(b'\n');
                count += 1;
            }
            while count > self.table_max {
                if table.pop_first().map_err(db_err)?.is_none() {
                    break;
                }
                count -= 1;
            }
        }
        wtx.commit().map_err(db_err)?;
        self.rejection_count = count;
        Ok((results, lines))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::rejections::RejectReason;

    fn record(resource: &str) -> RejectionRecord {
        RejectionRecord {
            seq: 0,
            time: "t".into(),
            resource: Some(resource.into()),
            presented_token: Some(1),
            current_epoch: Some(2),
            caller: "127.0.0.1:1".into(),
            method: "POST".into(),
            route: Some("/write".into()),
            request_id: "r".into(),
            reason: RejectReason::StaleToken,
            status: 409,
            sqlstate: None,
        }
    }

    #[test]
    fn p10_an_empty_store_needs_a_floor() {
        let dir = tempfile::tempdir().unwrap();
        let err = EpochStore::open(dir.path(), None, 10).unwrap_err();
        assert!(matches!(err, OpenError::EmptyStoreNeedsFloor { .. }), "{err}");
        assert!(!dir.path().join(STORE_FILE).exists(), "refusing must not create the store");
    }

    #[tokio::test]
    async fn raises_survive_reopen_and_never_lower() {
        let dir = tempfile::tempdir().unwrap();
        let r = ResourceName::new("db/a").unwrap();
        {
            let (store, snap) = EpochStore::open(dir.path(), Some(5), 10).unwrap();
            assert_eq!(snap.floor, 5);
            assert_eq!(store.raise(&r, 42).await.unwrap(), 42);
            assert_eq!(store.raise(&r, 41).await.unwrap(), 42, "P8: a lower raise keeps the stored epoch");
            store.close(true).await;
        }
        let (store, snap) = EpochStore::open(dir.path(), Some(3), 10).unwrap();
        assert_eq!(snap.floor, 5, "a lower --floor is ignored");
        assert_eq!(snap.epochs, vec![(r, 42)]);
        store.close(true).await;
        drop(store);
        let (_, snap) = EpochStore::open(dir.path(), None, 10).unwrap();
        assert_eq!(snap.floor, 5);
    }

    #[tokio::test]
    async fn the_rejection_table_is_bounded_and_paged_newest_first() {
        let dir = tempfile::tempdir().unwrap();
        let (store, _) = EpochStore::open(dir.path(), Some(0), 3).unwrap();
        for i in 0..5 {
            assert!(store.log_rejection(record(&format!("r{i}"))));
        }
        store.close(true).await;
        drop(store);
        let (store, _) = EpochStore::open(dir.path(), None, 3).unwrap();
        let page = store.rejections(None, 2).await.unwrap();
        let names: Vec<_> = page.rejections.iter().map(|r| r.resource.clone().unwrap()).collect();
        assert_eq!(names, ["r4", "r3"]);
        let page = store.rejections(page.next_before, 2).await.unwrap();
        let names: Vec<_> = page.rejections.iter().map(|r| r.resource.clone().unwrap()).collect();
        assert_eq!(names, ["r2"], "only 3 are kept");
        assert_eq!(page.next_before, None);
        let lines = std::fs::read_to_string(dir.path().join(REJECTION_LOG_FILE)).unwrap();
        assert_eq!(lines.lines().count(), 5, "the JSON-lines log keeps everything");
        // New records continue the sequence after a reopen.
        assert!(store.log_rejection(record("r5")));
        store.close(true).await;
        drop(store);
        let (store, _) = EpochStore::open(dir.path(), None, 3).unwrap();
        assert_eq!(store.rejections(None, 1).await.unwrap().rejections[0].seq, 6);
    }
}
