//! The state-machine store (DESIGN §3.4): the lock state lives in memory
//! for fast reads and applies, and is persisted only in snapshot files.
//!
//! Between two snapshots the raft log is the durable record: after a restart
//! the state is the newest snapshot file's, and openraft re-applies the
//! committed log entries past it (apply is deterministic; openraft's
//! "transient state machine" recovery). A snapshot is taken from an O(1)
//! clone of the state (its maps are persistent, module `state_machine`) at
//! exactly the last applied entry, and encoded and written on a blocking
//! thread while applies go on. Its file is written durably before openraft
//! may purge the log behind it.
//!
//! The audit log (module `audit`) rides along: apply derives each entry's
//! audit records and the persister thread writes them in log order; they
//! are synced before every snapshot file, so the audit file is never behind
//! the persisted state, and the writer skips lines it already holds when
//! entries are re-applied after a restart. A persister failure is sticky:
//! the next apply returns it and raft stops, rather than let the audit log
//! skip a batch. No file is written on an async worker thread.
//!
//! Data dirs from before this layout kept the state in a redb file
//! (`state.redb`, written every 25 ms); it is moved into a snapshot file the
//! first time the store opens and then removed.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock, RwLockReadGuard};

use futures::{Stream, TryStreamExt};
use openraft::entry::RaftEntry;
use openraft::storage::{EntryResponder, RaftSnapshotBuilder, RaftStateMachine};
use openraft::{EntryPayload, OptionalSend, StoredMembership};
use tokio::sync::{mpsc, oneshot};

use super::codec::io_err;
use super::persister::{PERSIST_QUEUE, PersistOp, Persister, persister_gone};
use super::snapshot::{SnapshotBody, build, current_snapshot, install, open_state};
use super::{LogIdT, Membership, Snapshot, SnapshotMeta};
use crate::audit::{AuditLog, AuditRecord, records_for};
use crate::clock::Clock;
use crate::metrics::Metrics;
use crate::raft::TypeConfig;
use crate::state_machine::{Applied, LockState, LogCommand, Outcome};

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

/// The [`RaftStateMachine`]: the state in memory, persisted in snapshot
/// files. Clones share one state.
#[derive(Clone)]
pub struct StateMachineStore {
    shared: Arc<Shared>,
}

fn read_lock<T>(l: &RwLock<T>) -> RwLockReadGuard<'_, T> {
    l.read().unwrap_or_else(|p| p.into_inner())
}

impl StateMachineStore {
    /// Loads the state of the newest snapshot file in `snapshot_dir` (moving
    /// a state file left at `legacy_state_file` by an earlier version into
    /// one first); with `audit`, records every applied change there (module
    /// `audit`). Blocking: call it from `spawn_blocking` or before serving.
    pub fn open(
        legacy_state_file: &Path,
        snapshot_dir: &Path,
        observer: Arc<dyn ApplyObserver>,
        metrics: Arc<Metrics>,
        clock: Clock,
        audit: Option<AuditLog>,
    ) -> io::Result<Self> {
        std::fs::create_dir_all(snapshot_dir)
            .map_err(|e| io_err(&format!("create snapshot dir {}", snapshot_dir.display()), e))?;
        let (state, applied, membership) = open_state(legacy_state_file, snapshot_dir)?;
        metrics.locks_held.set(state.lock_count() as i64);
        metrics.waiters.set(state.waiter_count() as i64);
        let (persist, rx) = mpsc::channel(PERSIST_QUEUE);
        let failed = Arc::new(Mutex::new(None));
        let (closed, closed_rx) = tokio::sync::watch::channel(());
        let audit_renewals = audit.as_ref().map(AuditLog::renewals);
        let persister = Persister {
            _closed: closed,
            failed: failed.clone(),
            clock,
            last_sync_ms: clock.wall_ms(),
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

    /// A receiver whose `changed()` fails once the audit file is closed (every
    /// store handle dropped and the persister ended).
    pub fn closed(&self) -> tokio::sync::watch::Receiver<()> {
        self.shared.closed.clone()
    }

    /// The persister's first failure, if the audit file could not be
    /// written (the node then applies nothing more until restarted).
    pub fn failure_message(&self) -> Option<String> {
        self.shared.failed.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Builds a snapshot of the state as applied now (what openraft does
    /// through [`RaftStateMachine::get_snapshot_builder`]).
    pub async fn build_snapshot(&mut self) -> io::Result<Snapshot> {
        self.get_snapshot_builder().await.build_snapshot().await
    }

    /// Makes the audit lines of everything applied so far durable (the
    /// state itself is durable in the raft log and the snapshot files).
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
        failed.as_ref().map(|m| io_err("the audit file could not be written", m))
    }
}

/// One entry of a batch, reduced to what apply needs.
enum Item {
    Command(u64, LogCommand),
    Membership(Membership),
    Blank,
}

/// Applies a batch in memory (CPU only: the state lock, the observer, the
/// audit records) and returns the outcomes and the persister's work.
fn apply_in_memory(shared: &Shared, items: Vec<(LogIdT, Item)>) -> io::Result<(Vec<Outcome>, Option<PersistOp>)> {
    let started = shared.clock.now();
    let mut outcomes = Vec::with_capacity(items.len());
    let mut last = None;
    let mut membership = None;
    let mut audit = Vec::new();
    {
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
    }
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
    let op = (!audit.is_empty()).then_some(PersistOp::Audit { records: audit });
    Ok((outcomes, op))
}

impl RaftStateMachine<TypeConfig> for StateMachineStore {
    type SnapshotData = SnapshotBody;
    type SnapshotBuilder = SnapshotView;

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

    /// Called by openraft between two applies: the view is the state at
    /// exactly the last applied entry (an O(1) clone of its maps).
    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        let state = read_lock(&self.shared.state).clone();
        let (last_log_id, last_membership) = self.shared.applied.lock().unwrap_or_else(|p| p.into_inner()).clone();
        SnapshotView { shared: self.shared.clone(), state, meta: SnapshotMeta { last_log_id, last_membership } }
    }

    async fn install_snapshot(&mut self, meta: &SnapshotMeta, snapshot: Self::SnapshotData) -> Result<(), io::Error> {
        install(&self.shared, meta.clone(), snapshot).await
    }

    async fn get_current_snapshot(&mut self) -> Result<Option<Snapshot>, io::Error> {
        current_snapshot(&self.shared.snapshot_dir).await
    }
}

/// The state as of one applied entry, for a snapshot built while applies go on.
pub struct SnapshotView {
    shared: Arc<Shared>,
    state: LockState,
    meta: SnapshotMeta,
}

impl RaftSnapshotBuilder<TypeConfig> for SnapshotView {
    type SnapshotData = SnapshotBody;

    async fn build_snapshot(&mut self) -> Result<Snapshot, io::Error> {
        // A clone (O(1)), not a take: building twice must write the same state.
        build(&self.shared, self.state.clone(), self.meta.clone()).await
    }
}
