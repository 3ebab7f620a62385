//! The persister: the one thread that writes the audit log (DESIGN §3.4,
//! §6). The lock state itself is persisted only in snapshot files (module
//! `snapshot`); between two snapshots the raft log is its durable record.
//! Applied batches' audit lines arrive in log order; the thread flushes them
//! within [`PERSIST_FLUSH_EVERY`], syncs them once a second and before
//! every snapshot file, and its first failure is sticky (module `sm_store`).

use std::io;
use std::sync::{Arc, Mutex};

use tokio::sync::{mpsc, oneshot};

use super::codec::io_err;
use crate::audit::{AuditLog, AuditRecord};
use crate::clock::Clock;
use crate::metrics::Metrics;

/// Batches queued for the persister before applies wait for it.
pub(super) const PERSIST_QUEUE: usize = 1024;

/// How long written audit lines may wait in the writer's buffer before they
/// are flushed to the file (a flush per apply batch, ~375 a second at the
/// seed workload, would be a write call each).
const PERSIST_FLUSH_EVERY: std::time::Duration = std::time::Duration::from_millis(25);

/// How long flushed lines may wait for an `fdatasync`.
const PERSIST_SYNC_EVERY_MS: u64 = 1_000;

/// Work for the persister thread.
pub(super) enum PersistOp {
    /// Write a batch's audit lines (flushed within [`PERSIST_FLUSH_EVERY`]).
    Audit { records: Vec<AuditRecord> },
    /// Make every line so far durable: before a snapshot file is written, so
    /// the audit log is never behind the persisted state.
    Sync { done: oneshot::Sender<io::Result<()>> },
    /// A snapshot is being installed instead of applying entries: write and
    /// sync its line. Success clears an earlier failure (the state is
    /// replaced whole, and the line says what was not applied here).
    Installed { record: Option<Box<AuditRecord>>, done: oneshot::Sender<io::Result<()>> },
}

pub(super) fn persister_gone() -> io::Error {
    io::Error::other("the state persister has stopped")
}

/// The thread that writes applied batches' audit lines, in order.
pub(super) struct Persister {
    pub(super) failed: Arc<Mutex<Option<String>>>,
    pub(super) clock: Clock,
    pub(super) last_sync_ms: u64,
    pub(super) audit: Option<AuditLog>,
    pub(super) metrics: Arc<Metrics>,
    /// Dropped last (after `audit`) when the thread ends: the files are closed.
    pub(super) _closed: tokio::sync::watch::Sender<()>,
}

impl Persister {
    /// Handles ops in order, flushing written lines within
    /// [`PERSIST_FLUSH_EVERY`]; `timer` only waits for the next op with a
    /// deadline (this thread never runs async work).
    pub(super) fn run(mut self, mut rx: mpsc::Receiver<PersistOp>, timer: tokio::runtime::Runtime) {
        let mut dirty = false;
        let mut dirty_at = self.clock.now();
        loop {
            let next = if !dirty {
                rx.blocking_recv()
            } else {
                let left = PERSIST_FLUSH_EVERY.saturating_sub(dirty_at.elapsed());
                match timer.block_on(async { tokio::time::timeout(left, rx.recv()).await }) {
                    Ok(op) => op,
                    Err(_) => {
                        dirty = false;
                        if let Err(e) = self.flush(false) {
                            self.fail(&e);
                        }
                        continue;
                    }
                }
            };
            let Some(op) = next else { break };
            let was_dirty = dirty;
            match self.handle(op) {
                Ok(wrote) => dirty |= wrote,
                Err(e) => {
                    self.fail(&e);
                    dirty = false;
                }
            }
            if dirty && !was_dirty {
                dirty_at = self.clock.now();
            }
        }
        if self.failed.lock().unwrap_or_else(|p| p.into_inner()).is_none()
            && let Err(e) = self.flush(true)
        {
            self.fail(&e);
        }
    }

    fn fail(&self, e: &io::Error) {
        let mut failed = self.failed.lock().unwrap_or_else(|p| p.into_inner());
        if failed.is_none() {
            tracing::error!(error = %e, "audit file write failed; the node stops applying until restarted");
            *failed = Some(e.to_string());
        }
    }

    fn is_failed(&self) -> Option<io::Error> {
        let failed = self.failed.lock().unwrap_or_else(|p| p.into_inner());
        failed.as_ref().map(|m| io_err("the audit file could not be written earlier", m))
    }

    /// Flushes the written lines to the file, and syncs them when asked or
    /// when the last sync is a second old.
    fn flush(&mut self, durable: bool) -> io::Result<()> {
        let Some(audit) = &mut self.audit else { return Ok(()) };
        let started = self.clock.now();
        let now_ms = self.clock.wall_ms();
        let durable = durable || now_ms.saturating_sub(self.last_sync_ms) >= PERSIST_SYNC_EVERY_MS;
        if durable {
            audit.sync()?
        } else {
            audit.flush()?
        }
        self.metrics.state_persist_seconds.observe(started.elapsed().as_secs_f64());
        if durable {
            self.last_sync_ms = now_ms;
        }
        Ok(())
    }

    /// Handles one op; returns whether lines were written and not flushed.
    fn handle(&mut self, op: PersistOp) -> io::Result<bool> {
        match op {
            PersistOp::Audit { records } => {
                if let Some(e) = self.is_failed() {
                    return Err(e);
                }
                match &mut self.audit {
                    Some(log) => log.append(&records).map(|()| true),
                    None => Ok(false),
                }
            }
            PersistOp::Sync { done } => {
                let r = self.is_failed().map_or_else(|| self.flush(true), Err);
                let reply = r.as_ref().map(|_| ()).map_err(|e| io::Error::new(e.kind(), e.to_string()));
                let _ = done.send(reply);
                r.map(|()| false)
            }
            PersistOp::Installed { record, done } => {
                let r = self.installed(record);
                let reply = r.as_ref().map(|_| ()).map_err(|e| io::Error::new(e.kind(), e.to_string()));
                let _ = done.send(reply);
                r.map(|()| false)
            }
        }
    }

    fn installed(&mut self, record: Option<Box<AuditRecord>>) -> io::Result<()> {
        if let (Some(log), Some(record)) = (&mut self.audit, record) {
            log.append(&[*record])?;
        }
        self.flush(true)?;
        // The state is replaced whole: what failed before no longer matters.
        *self.failed.lock().unwrap_or_else(|p| p.into_inner()) = None;
        Ok(())
    }
}
