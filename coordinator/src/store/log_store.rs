//! The raft log and vote in one redb file, with group commit (DESIGN §3.4).
//!
//! `append` makes entries readable at once (in the shared cache) and hands
//! them to a dedicated flusher thread. The flusher drains everything queued,
//! writes it in one redb transaction with `Durability::Immediate`, and only
//! then acknowledges every entry it covered. Votes travel the same queue and
//! `save_vote` returns only after the transaction holding the vote is durable.
//! Truncation and purge are queued too, so disk order equals call order.
//! No redb call runs on an async worker thread: writes run on the flusher,
//! cold reads on `spawn_blocking`.

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::io;
use std::ops::{Bound, RangeBounds};
use std::path::Path;
use std::sync::mpsc as std_mpsc;
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread;

use openraft::entry::RaftEntry;
use openraft::storage::{IOFlushed, LogState, RaftLogReader, RaftLogStorage};
use openraft::{LogId, OptionalSend};
use redb::{Database, Durability, ReadableDatabase, ReadableTable, TableDefinition};
use tokio::sync::oneshot;

use super::codec::{decode, encode, io_err};
use crate::metrics::Metrics;
use crate::raft::TypeConfig;

type Entry = <TypeConfig as openraft::RaftTypeConfig>::Entry;
type Vote = <TypeConfig as openraft::RaftTypeConfig>::Vote;
type LogIdT = LogId<openraft::alias::CommittedLeaderIdOf<TypeConfig>>;

const LOG: TableDefinition<'_, u64, &[u8]> = TableDefinition::new("log");
const META: TableDefinition<'_, &str, &[u8]> = TableDefinition::new("meta");

const KEY_VOTE: &str = "vote";
const KEY_COMMITTED: &str = "committed";
const KEY_PURGED: &str = "last_purged";

/// Flushed entries kept in memory for replication reads, beyond unflushed ones.
const CACHE_FLUSHED_ENTRIES: usize = 8_192;
/// redb's page cache for the log file (its default is 1 GiB). Replication
/// reads recent entries from the in-memory cache above, so this stays small.
pub(crate) const LOG_CACHE_BYTES: usize = 8 << 20;
/// Most operations one group commit covers.
const MAX_GROUP: usize = 4_096;
/// The least time from the start of one durable group commit to the start
/// of the next. On a disk whose fsync takes 0.2 ms a busy node otherwise
/// commits after almost every append (~5,000 commits a second at the seed
/// workload, ~1.7 entries each), and each redb commit costs CPU beyond the
/// fsync itself. Waiting out the rest of this gap gathers the appends that
/// arrive meanwhile into one commit. On a slower disk a commit takes longer
/// than the gap and nothing waits; an idle node's first write never waits.
const MIN_COMMIT_GAP: std::time::Duration = std::time::Duration::from_millis(1);

/// State shared by the store handle, its readers and the flusher thread.
struct Shared {
    db: Arc<Database>,
    mem: Mutex<Mem>,
    metrics: Arc<Metrics>,
    /// Dropped (after `db`) when the last handle goes: the file is closed.
    _closed: tokio::sync::watch::Sender<()>,
}

/// The in-memory view: what readers see before and after it reaches disk.
struct Mem {
    /// Unflushed entries plus the most recent flushed ones, by index.
    cache: BTreeMap<u64, Entry>,
    /// Highest index known durable.
    flushed_upto: Option<u64>,
    last_log_id: Option<LogIdT>,
    last_purged: Option<LogIdT>,
    vote: Option<Vote>,
    committed: Option<LogIdT>,
}

enum Op {
    Append { entries: Vec<(u64, Vec<u8>)>, last: u64, callback: IOFlushed<TypeConfig> },
    Vote { bytes: Vec<u8>, done: oneshot::Sender<io::Result<()>> },
    Committed { bytes: Vec<u8> },
    TruncateAfter { from: u64, done: oneshot::Sender<io::Result<()>> },
    Purge { upto: u64, bytes: Vec<u8> },
    Sync { done: oneshot::Sender<io::Result<()>> },
}

impl Op {
    /// Whether the group holding this op must reach the disk before it is
    /// acknowledged: everything but a committed-index update.
    fn needs_fsync(&self) -> bool {
        !matches!(self, Op::Committed { .. })
    }
}

/// The redb-backed [`RaftLogStorage`].
#[derive(Clone)]
pub struct LogStore {
    shared: Arc<Shared>,
    tx: std_mpsc::Sender<Op>,
    closed: tokio::sync::watch::Receiver<()>,
}

/// A reader of the log (cheap clone of the store's shared state).
#[derive(Clone)]
pub struct LogReader {
    shared: Arc<Shared>,
}

fn lock(m: &Mutex<Mem>) -> MutexGuard<'_, Mem> {
    // A panic while holding the lock leaves plain data behind; keep serving.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl LogStore {
    /// Opens (or creates) the log file at `path` and starts its flusher thread.
    /// Blocking: call it from `spawn_blocking` or before the runtime is busy.
    pub fn open(path: &Path, metrics: Arc<Metrics>) -> io::Result<Self> {
        let db = Database::builder()
            .set_cache_size(LOG_CACHE_BYTES)
            .create(path)
            .map_err(|e| io_err(&format!("open raft log {}", path.display()), e))?;
        let db = Arc::new(db);
        let (vote, committed, last_purged, last_log_id) = read_saved(&db)?;
        let flushed_upto = last_log_id.as_ref().map(|l| l.index);
        let (closed, closed_rx) = tokio::sync::watch::channel(());
        let shared = Arc::new(Shared {
            db,
            mem: Mutex::new(Mem { cache: BTreeMap::new(), flushed_upto, last_log_id, last_purged, vote, committed }),
            metrics,
            _closed: closed,
        });
        let (tx, rx) = std_mpsc::channel();
        let flusher = shared.clone();
        thread::Builder::new()
            .name("fencer-log-flush".into())
            .spawn(move || flusher_loop(flusher, rx))
            .map_err(|e| io_err("spawn log flusher", e))?;
        Ok(Self { shared, tx, closed: closed_rx })
    }

    /// Whether the log file at `path` holds raft data: an entry, a purged
    /// id or a vote beyond term 0 (a pristine node's log holds none until it
    /// joins a cluster). Opens and closes the file without starting a
    /// flusher, so the file is free again on return. Blocking.
    pub fn holds_raft_data(path: &Path) -> io::Result<bool> {
        use openraft::vote::RaftLeaderId;
        if !path.exists() {
            return Ok(false);
        }
        let db = Database::create(path).map_err(|e| io_err(&format!("open raft log {}", path.display()), e))?;
        let (vote, _, last_purged, last_log_id) = read_saved(&db)?;
        Ok(last_log_id.is_some() || last_purged.is_some() || vote.is_some_and(|v| v.leader_id.term() > 0))
    }

    /// The committed log id saved by raft, read at open (for status and recovery).
    pub fn saved_committed(&self) -> Option<u64> {
        lock(&self.shared.mem).committed.as_ref().map(|l| l.index)
    }

    fn send(&self, op: Op) -> io::Result<()> {
        self.tx.send(op).map_err(|_| io::Error::other("the raft log flusher has stopped"))
    }

    /// A receiver whose `changed()` fails once the log file is closed (every
    /// handle and reader dropped), so a stopping node can wait for it.
    pub fn closed(&self) -> tokio::sync::watch::Receiver<()> {
        self.closed.clone()
    }

    /// Waits until everything queued so far is durable.
    pub async fn sync(&self) -> io::Result<()> {
        let (done, rx) = oneshot::channel();
        self.send(Op::Sync { done })?;
        rx.await.map_err(|_| io::Error::other("the raft log flusher has stopped"))?
    }
}

/// What a log file holds: vote, committed id, last purged id, last log id.
type Saved = (Option<Vote>, Option<LogIdT>, Option<LogIdT>, Option<LogIdT>);

fn read_saved(db: &Database) -> io::Result<Saved> {
    let w = db.begin_write().map_err(|e| io_err("begin", e))?;
    w.open_table(LOG).map_err(|e| io_err("open log table", e))?;
    w.open_table(META).map_err(|e| io_err("open meta table", e))?;
    w.commit().map_err(|e| io_err("commit", e))?;
    let r = db.begin_read().map_err(|e| io_err("begin read", e))?;
    let meta = r.open_table(META).map_err(|e| io_err("open meta table", e))?;
    let get = |k: &str| -> io::Result<Option<Vec<u8>>> {
        Ok(meta.get(k).map_err(|e| io_err("read meta", e))?.map(|v| v.value().to_vec()))
    };
    let vote: Option<Vote> = get(KEY_VOTE)?.map(|b| decode(&b, "vote")).transpose()?;
    let committed: Option<LogIdT> = get(KEY_COMMITTED)?.map(|b| decode(&b, "committed")).transpose()?;
    let last_purged: Option<LogIdT> = get(KEY_PURGED)?.map(|b| decode(&b, "last purged")).transpose()?;
    let log = r.open_table(LOG).map_err(|e| io_err("open log table", e))?;
    let last = match log.last().map_err(|e| io_err("read log", e))? {
        Some((_, v)) => Some(decode::<Entry>(v.value(), "log entry")?.log_id()),
        None => None,
    };
    Ok((vote, committed, last_purged, last.or(last_purged)))
}

fn flusher_loop(shared: Arc<Shared>, rx: std_mpsc::Receiver<Op>) {
    let mut last_durable: Option<tokio::time::Instant> = None;
    while let Ok(first) = rx.recv() {
        let mut durable = first.needs_fsync();
        let mut ops = vec![first];
        let gather_until = last_durable.map(|t| t + MIN_COMMIT_GAP);
        while ops.len() < MAX_GROUP {
            let next = match gather_until {
                Some(until) if durable => match until.checked_duration_since(tokio::time::Instant::now()) {
                    Some(left) => rx.recv_timeout(left).ok(),
                    None => rx.try_recv().ok(),
                },
                _ => rx.try_recv().ok(),
            };
            match next {
                Some(op) => {
                    durable |= op.needs_fsync();
                    ops.push(op);
                }
                None => break,
            }
        }
        let started = tokio::time::Instant::now();
        let result = write_group(&shared.db, &ops, durable);
        if durable {
            last_durable = Some(started);
            shared.metrics.observe_log_flush(started.elapsed(), ops.len());
        }
        let mut highest = None;
        for op in &ops {
            if let Op::Append { last, .. } = op {
                highest = Some(*last);
            }
        }
        if result.is_ok() {
            let mut mem = lock(&shared.mem);
            if let Some(h) = highest {
                mem.flushed_upto = Some(mem.flushed_upto.map_or(h, |f| f.max(h)));
            }
            // Keep the newest flushed entries for replication; never evict unflushed ones.
            let flushed = mem.flushed_upto.unwrap_or(0);
            while mem.cache.len() > CACHE_FLUSHED_ENTRIES {
                match mem.cache.first_key_value() {
                    Some((k, _)) if *k <= flushed => {
                        mem.cache.pop_first();
                    }
                    _ => break,
                }
            }
        } else if let Err(e) = &result {
            tracing::error!(error = %e, "raft log write failed; the node cannot make progress until the disk recovers");
        }
        for op in ops {
            let r = result.as_ref().map(|_| ()).map_err(|e| io::Error::new(e.kind(), e.to_string()));
            match op {
                Op::Append { callback, .. } => callback.io_completed(r),
                Op::Vote { done, .. } | Op::TruncateAfter { done, .. } | Op::Sync { done } => {
                    let _ = done.send(r);
                }
                Op::Committed { .. } | Op::Purge { .. } => {}
            }
        }
    }
}

/// Writes a group in one transaction; `durable` unless it only records the
/// committed index, which is a restart hint that may be lost (openraft then
/// re-learns it from the leader): it rides along with the next durable commit.
fn write_group(db: &Database, ops: &[Op], durable: bool) -> io::Result<()> {
    let mut w = db.begin_write().map_err(|e| io_err("begin log write", e))?;
    let durability = if durable { Durability::Immediate } else { Durability::None };
    w.set_durability(durability).map_err(|e| io_err("set durability", e))?;
    {
        let mut log = w.open_table(LOG).map_err(|e| io_err("open log table", e))?;
        let mut meta = w.open_table(META).map_err(|e| io_err("open meta table", e))?;
        for op in ops {
            match op {
                Op::Append { entries, .. } => {
                    for (index, bytes) in entries {
                        log.insert(*index, bytes.as_slice()).map_err(|e| io_err("append", e))?;
                    }
                }
                Op::Vote { bytes, .. } => {
                    meta.insert(KEY_VOTE, bytes.as_slice()).map_err(|e| io_err("save vote", e))?;
                }
                Op::Committed { bytes } => {
                    meta.insert(KEY_COMMITTED, bytes.as_slice()).map_err(|e| io_err("save committed", e))?;
                }
                Op::TruncateAfter { from, .. } => {
                    log.retain_in(*from.., |_, _| false).map_err(|e| io_err("truncate", e))?;
                }
                Op::Purge { upto, bytes } => {
                    // The purge marker goes first: entries at or below it are
                    // ignored on open even if a crash leaves some behind.
                    meta.insert(KEY_PURGED, bytes.as_slice()).map_err(|e| io_err("save purge marker", e))?;
                    log.retain_in(..=*upto, |_, _| false).map_err(|e| io_err("purge", e))?;
                }
                Op::Sync { .. } => {}
            }
        }
    }
    w.commit().map_err(|e| io_err("commit raft log", e))
}

fn bounds<RB: RangeBounds<u64>>(range: &RB) -> (u64, Option<u64>) {
    let start = match range.start_bound() {
        Bound::Included(x) => *x,
        Bound::Excluded(x) => x.saturating_add(1),
        Bound::Unbounded => 0,
    };
    let end = match range.end_bound() {
        Bound::Included(x) => Some(x.saturating_add(1)),
        Bound::Excluded(x) => Some(*x),
        Bound::Unbounded => None,
    };
    (start, end)
}

impl LogReader {
    async fn read_range(&self, start: u64, end: Option<u64>) -> io::Result<Vec<Entry>> {
        let (cached, need_disk, purged) = {
            let mem = lock(&self.shared.mem);
            let first_cached = mem.cache.first_key_value().map(|(k, _)| *k);
            let upper = end.map_or(Bound::Unbounded, Bound::Excluded);
            let cached: Vec<Entry> = mem.cache.range((Bound::Included(start), upper)).map(|(_, e)| e.clone()).collect();
            let need_disk = first_cached.is_none_or(|f| f > start);
            (cached, need_disk, mem.last_purged.as_ref().map(|l| l.index))
        };
        // Entries at or below the purge marker are gone, whatever is left on disk.
        let start = match purged {
            Some(p) if p >= start => p + 1,
            _ => start,
        };
        if !need_disk {
            return Ok(cached.into_iter().filter(|e| e.index() >= start).collect());
        }
        let db = self.shared.db.clone();
        let mut from_disk = tokio::task::spawn_blocking(move || -> io::Result<BTreeMap<u64, Entry>> {
            let r = db.begin_read().map_err(|e| io_err("begin read", e))?;
            let log = r.open_table(LOG).map_err(|e| io_err("open log table", e))?;
            let mut out = BTreeMap::new();
            let iter = match end {
                Some(end) if end <= start => return Ok(out),
                Some(end) => log.range(start..end),
                None => log.range(start..),
            }
            .map_err(|e| io_err("read log", e))?;
            for item in iter {
                let (k, v) = item.map_err(|e| io_err("read log", e))?;
                out.insert(k.value(), decode::<Entry>(v.value(), "log entry")?);
            }
            Ok(out)
        })
        .await
        .map_err(|e| io_err("log read task", e))??;
        for e in cached {
            from_disk.insert(e.index(), e);
        }
        Ok(from_disk.into_values().filter(|e| e.index() >= start).collect())
    }
}

impl RaftLogReader<TypeConfig> for LogReader {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry>, io::Error> {
        let (start, end) = bounds(&range);
        self.read_range(start, end).await
    }

    async fn read_vote(&mut self) -> Result<Option<Vote>, io::Error> {
        Ok(lock(&self.shared.mem).vote)
    }
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry>, io::Error> {
        LogReader { shared: self.shared.clone() }.try_get_log_entries(range).await
    }

    async fn read_vote(&mut self) -> Result<Option<Vote>, io::Error> {
        Ok(lock(&self.shared.mem).vote)
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = LogReader;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, io::Error> {
        let mem = lock(&self.shared.mem);
        Ok(LogState { last_purged_log_id: mem.last_purged, last_log_id: mem.last_log_id })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        LogReader { shared: self.shared.clone() }
    }

    async fn save_vote(&mut self, vote: &Vote) -> Result<(), io::Error> {
        let bytes = encode(vote)?;
        let (done, rx) = oneshot::channel();
        self.send(Op::Vote { bytes, done })?;
        rx.await.map_err(|_| io::Error::other("the raft log flusher has stopped"))??;
        lock(&self.shared.mem).vote = Some(*vote);
        Ok(())
    }

    async fn save_committed(&mut self, committed: Option<LogIdT>) -> Result<(), io::Error> {
        if let Some(c) = &committed {
            self.send(Op::Committed { bytes: encode(c)? })?;
        }
        lock(&self.shared.mem).committed = committed;
        Ok(())
    }

    async fn read_committed(&mut self) -> Result<Option<LogIdT>, io::Error> {
        Ok(lock(&self.shared.mem).committed)
    }

    async fn append<I>(&mut self, entries: I, callback: IOFlushed<TypeConfig>) -> Result<(), io::Error>
    where
        I: IntoIterator<Item = Entry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let mut encoded = Vec::new();
        let mut decoded = Vec::new();
        for e in entries {
            encoded.push((e.index(), encode(&e)?));
            decoded.push(e);
        }
        let Some(last) = decoded.last().map(|e| e.log_id()) else {
            callback.io_completed(Ok(()));
            return Ok(());
        };
        {
            let mut mem = lock(&self.shared.mem);
            for e in decoded {
                mem.cache.insert(e.index(), e);
            }
            mem.last_log_id = Some(last);
        }
        self.send(Op::Append { entries: encoded, last: last.index, callback })
    }

    async fn truncate_after(&mut self, last_log_id: Option<LogIdT>) -> Result<(), io::Error> {
        let from = last_log_id.as_ref().map_or(0, |l| l.index + 1);
        {
            let mut mem = lock(&self.shared.mem);
            mem.cache.retain(|k, _| *k < from);
            if mem.last_log_id.as_ref().is_some_and(|l| l.index >= from) {
                mem.last_log_id = last_log_id.or(mem.last_purged);
            }
            if mem.flushed_upto.is_some_and(|f| f >= from) {
                mem.flushed_upto = from.checked_sub(1);
            }
        }
        let (done, rx) = oneshot::channel();
        self.send(Op::TruncateAfter { from, done })?;
        rx.await.map_err(|_| io::Error::other("the raft log flusher has stopped"))?
    }

    async fn purge(&mut self, log_id: LogIdT) -> Result<(), io::Error> {
        let bytes = encode(&log_id)?;
        {
            let mut mem = lock(&self.shared.mem);
            mem.cache.retain(|k, _| *k > log_id.index);
            if mem.last_log_id.as_ref().is_none_or(|l| l.index < log_id.index) {
                mem.last_log_id = Some(log_id);
            }
            mem.last_purged = Some(log_id);
        }
        self.send(Op::Purge { upto: log_id.index, bytes })
    }
}
