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

use std::io::{self, Cursor};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock, RwLockReadGuard};

use futures::{Stream, TryStreamExt};
use openraft::entry::RaftEntry;
use openraft::storage::{EntryResponder, RaftSnapshotBuilder, RaftStateMachine};
use openraft::{EntryPayload, OptionalSend, StoredMembership};
use redb::Database;
use tokio::sync::{mpsc, oneshot};

use super::codec::io_err;
use super::persister::{PERSIST_QUEUE, PersistOp, Persister, gather, persister_gone};
use super::snapshot::{build, current_snapshot, install, migrate_legacy_dedup};
use super::tables::{DEDUP, ENDED, RESOURCES, SIGNING_KEYS, SM_META, load};
use super::{LogIdT, Membership, Snapshot, SnapshotMeta};
use crate::audit::{AuditLog, AuditRecord, records_for};
use crate::clock::Clock;
use crate::metrics::Metrics;
use crate::raft::TypeConfig;
use crate::state_machine::{Applied, LockState, LogCommand, Outcome};

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

pub(super) struct Shared {
    pub(super) state: RwLock<LockState>,
    pub(super) applied: Mutex<(Option<LogIdT>, Membership)>,
    pub(super) snapshot_dir: PathBuf,
    /// Orders to the persister thread, in apply order.
    pub(super) persist: mpsc::Sender<PersistOp>,
    /// Fails `changed()` once the persister ended and closed the file.
    pub(super) closed: tokio::sync::watch::Receiver<()>,
    /// The persister's first failure; once set, applies fail.
    pub(super) failed: Arc<Mutex<Option<String>>>,
    pub(super) observer: Arc<dyn ApplyObserver>,
    pub(super) metrics: Arc<Metrics>,
    pub(super) clock: Clock,
    /// `Some(renewals recorded?)` when an audit log is written.
    pub(super) audit: Option<bool>,
}

/// The redb-backed [`RaftStateMachine`]. Clones share one state.
#[derive(Clone)]
pub struct StateMachineStore {
    shared: Arc<Shared>,
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

impl Shared {
    /// Hands work to the persister, waiting while its queue is full.
    pub(super) async fn send(&self, op: PersistOp) -> io::Result<()> {
        self.persist.send(op).await.map_err(|_| persister_gone())
    }

    pub(super) fn failure(&self) -> Option<io::Error> {
        let failed = self.failed.lock().unwrap_or_else(|p| p.into_inner());
        failed.as_ref().map(|m| io_err("the state file could not be written", m))
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
        current_snapshot(&self.shared.snapshot_dir).await
    }
}

impl RaftSnapshotBuilder<TypeConfig> for StateMachineStore {
    type SnapshotData = Cursor<Vec<u8>>;

    async fn build_snapshot(&mut self) -> Result<Snapshot, io::Error> {
        build(&self.shared).await
    }
}
