//! The persister: the one thread that writes the state file (DESIGN
//! §3.4). Applied batches arrive in log order; it merges them into one
//! transaction for up to [`PERSIST_COMMIT_EVERY`], writes their audit lines
//! first, commits with `Durability::None` except once a second and for
//! every snapshot, and replaces every table when a snapshot is installed.
//! Its first failure is sticky (module `sm_store`).

use std::io;
use std::sync::{Arc, Mutex};

use redb::{Database, Durability, ReadableDatabase};
use tokio::sync::{mpsc, oneshot};

use super::codec::{encode, io_err};
use super::tables::{
    DEDUP, ENDED, KEY_APPLIED, KEY_MEMBERSHIP, RESOURCES, SIGNING_KEYS, SM_META, TableDump, replace_rows, write_rows,
};
use super::{LogIdT, Membership, SnapshotMeta};
use crate::audit::{AuditLog, AuditRecord};
use crate::clock::Clock;
use crate::metrics::Metrics;
use crate::state_machine::{Changes, LockState};

/// Batches queued for the persister before applies wait for it.
pub(super) const PERSIST_QUEUE: usize = 1024;

/// How long the persister keeps adding batches to one transaction before it
/// commits. A redb commit costs the same for one batch as for fifty (it
/// rewrites every touched page and its checksums): committing each apply
/// batch (~375 a second at the seed workload) made the persister a fifth of
/// a node's CPU. The file may lag the applied state by this much more, which
/// only lengthens the log tail replayed after a crash; a snapshot or `sync`
/// commits at once.
const PERSIST_COMMIT_EVERY: std::time::Duration = std::time::Duration::from_millis(25);

/// Work for the persister thread.
pub(super) enum PersistOp {
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

pub(super) fn persister_gone() -> io::Error {
    io::Error::other("the state persister has stopped")
}

/// The encoded values of the keys a batch changed, gathered under the state lock.
#[derive(Default)]
pub(super) struct Writes {
    pub(super) resources: Vec<(String, Option<Vec<u8>>)>,
    pub(super) dedup: Vec<(u128, Option<Vec<u8>>)>,
    pub(super) ended: Vec<(u128, Option<Vec<u8>>)>,
    pub(super) signing_keys: Vec<(String, Option<Vec<u8>>)>,
}

pub(super) fn gather(state: &LockState, changes: Changes) -> io::Result<Writes> {
    let mut w = Writes::default();
    for name in changes.resources {
        let value = state.resource(&name).map(encode).transpose()?;
        w.resources.push((name.as_str().to_string(), value));
    }
    for key in changes.dedup_put {
        let value = state
            .dedup_by_key(&key)
            .map(|r| r.to_stored().map_err(|e| io_err("encode dedup record", e)))
            .transpose()?;
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
pub(super) struct Persister {
    pub(super) db: Database,
    pub(super) failed: Arc<Mutex<Option<String>>>,
    pub(super) clock: Clock,
    /// What the file holds once the open transaction commits.
    pub(super) applied: Option<LogIdT>,
    pub(super) membership: Membership,
    pub(super) last_immediate_ms: u64,
    /// Written before every commit, synced before every durable one.
    pub(super) audit: Option<AuditLog>,
    pub(super) metrics: Arc<Metrics>,
    /// Dropped last (after `db` and `audit`) when the thread ends: the files are closed.
    pub(super) _closed: tokio::sync::watch::Sender<()>,
}

impl Persister {
    /// Handles ops in order, keeping one transaction open for up to
    /// [`PERSIST_COMMIT_EVERY`]; `timer` only waits for the next op with a
    /// deadline (this thread never runs async work).
    pub(super) fn run(mut self, mut rx: mpsc::Receiver<PersistOp>, timer: tokio::runtime::Runtime) {
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
