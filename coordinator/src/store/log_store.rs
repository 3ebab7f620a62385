//! The raft log and vote ([`RaftLogStorage`]) on the write-ahead log of
//! module `wal`, with group commit (DESIGN §3.4).
//!
//! `append` makes entries readable at once (in the shared cache) and hands
//! them to a dedicated flusher thread. The flusher drains everything queued,
//! writes it with one `pwrite` and one `fdatasync`, and only then
//! acknowledges every entry it covered. Votes travel the same queue and
//! `save_vote` returns only after the group holding the vote is durable.
//! Truncation and purge are queued too, so disk order equals call order.
//! No file is written on an async worker thread: writes run on the flusher,
//! cold reads on `spawn_blocking`.
//!
//! Data dirs from before the write-ahead log kept the log in a redb file
//! (`raft-log.redb`): it is copied into the new log the first time the
//! store opens, then removed.

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::io;
use std::ops::{Bound, RangeBounds};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc as std_mpsc;
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread;

use openraft::entry::RaftEntry;
use openraft::storage::{IOFlushed, LogState, RaftLogReader, RaftLogStorage};
use openraft::{LogId, OptionalSend};
use redb::{Database, ReadableDatabase, TableDefinition};
use tokio::sync::oneshot;

use super::codec::{decode, encode, io_err};
use super::wal::{Meta, WalIndex, WalOp, WalOptions, WalWriter};
use crate::metrics::Metrics;
use crate::raft::TypeConfig;

type Entry = <TypeConfig as openraft::RaftTypeConfig>::Entry;
type Vote = <TypeConfig as openraft::RaftTypeConfig>::Vote;
type LogIdT = LogId<openraft::alias::CommittedLeaderIdOf<TypeConfig>>;

/// The raft log file of versions before the write-ahead log, in the data dir.
pub const LEGACY_LOG_FILE: &str = "raft-log.redb";
const LEGACY_LOG: TableDefinition<'_, u64, &[u8]> = TableDefinition::new("log");
const LEGACY_META: TableDefinition<'_, &str, &[u8]> = TableDefinition::new("meta");
const KEY_VOTE: &str = "vote";
const KEY_COMMITTED: &str = "committed";
const KEY_PURGED: &str = "last_purged";

/// Flushed entries kept in memory for replication reads, beyond unflushed ones.
const CACHE_FLUSHED_ENTRIES: usize = 8_192;
/// Most operations one group commit covers.
const MAX_GROUP: usize = 4_096;

/// State shared by the store handle, its readers and the flusher thread.
struct Shared {
    /// The entries on disk, for reads past the cache.
    disk: Arc<WalIndex>,
    mem: Mutex<Mem>,
    metrics: Arc<Metrics>,
    /// The commit gap in nanoseconds (see [`LogStore::open_with`]), read by
    /// the flusher before each durable group; [`LogStore::set_commit_gap`]
    /// changes it while the node runs.
    commit_gap_ns: AtomicU64,
    /// Dropped (after `disk`) when the last handle goes: the files are closed.
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
    /// Entries at consecutive indexes from `first`, encoded.
    Append {
        first: u64,
        entries: Vec<Vec<u8>>,
        callback: IOFlushed<TypeConfig>,
    },
    Vote {
        bytes: Vec<u8>,
        done: oneshot::Sender<io::Result<()>>,
    },
    Committed {
        bytes: Vec<u8>,
    },
    TruncateAfter {
        from: u64,
        done: oneshot::Sender<io::Result<()>>,
    },
    Purge {
        upto: u64,
        bytes: Vec<u8>,
    },
    Sync {
        done: oneshot::Sender<io::Result<()>>,
    },
}

impl Op {
    /// What the write-ahead log writes for this op.
    fn wal_op(&self) -> Option<WalOp<'_>> {
        Some(match self {
            Op::Append { first, entries, .. } => WalOp::Entries { first: *first, entries },
            Op::Vote { bytes, .. } => WalOp::Vote(bytes),
            Op::Committed { bytes } => WalOp::Committed(bytes),
            Op::TruncateAfter { from, .. } => WalOp::TruncateFrom(*from),
            Op::Purge { upto, bytes } => WalOp::Purge { index: *upto, bytes },
            Op::Sync { .. } => return None,
        })
    }
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
    /// Opens (or creates) the log in the directory `dir` and starts its
    /// flusher thread. A redb log of an earlier version next to it
    /// ([`LEGACY_LOG_FILE`]) is moved into it first. Blocking: call it from
    /// `spawn_blocking` or before the runtime is busy. Durable group commits
    /// start at least a node's default gap apart
    /// ([`crate::DEFAULT_REPLICATION_INTERVAL`], see [`Self::open_with`]).
    pub fn open(dir: &Path, metrics: Arc<Metrics>) -> io::Result<Self> {
        Self::open_with(dir, metrics, WalOptions::default(), crate::node::DEFAULT_REPLICATION_INTERVAL)
    }

    /// [`Self::open`] with the given segment sizes (tests use small ones)
    /// and `commit_gap`, the least time from the start of one durable group
    /// commit to the start of the next. Under load, each commit costs CPU
    /// beyond its fsync (a write, wake-ups, acknowledgements); waiting out
    /// the rest of the gap gathers the appends that arrive meanwhile into
    /// one commit. On a disk slower than the gap nothing waits, and a
    /// write after a quiet spell never does. Zero: each group as soon as
    /// the previous one is durable.
    pub fn open_with(
        dir: &Path,
        metrics: Arc<Metrics>,
        options: WalOptions,
        commit_gap: std::time::Duration,
    ) -> io::Result<Self> {
        migrate_legacy(dir, options)?;
        let (writer, disk, recovered) = WalWriter::open(dir, options)?;
        let Meta { vote, committed, purged } = &recovered.meta;
        let vote: Option<Vote> = vote.as_deref().map(|b| decode(b, "vote")).transpose()?;
        let committed: Option<LogIdT> = committed.as_deref().map(|b| decode(b, "committed")).transpose()?;
        let last_purged: Option<LogIdT> = purged.as_ref().map(|(_, b)| decode(b, "last purged")).transpose()?;
        let last_entry = match &recovered.last_entry {
            Some(b) => Some(decode::<Entry>(b, "log entry")?.log_id()),
            None => None,
        };
        let last_log_id = last_entry.or(last_purged);
        let flushed_upto = last_log_id.as_ref().map(|l| l.index);
        let (closed, closed_rx) = tokio::sync::watch::channel(());
        let shared = Arc::new(Shared {
            disk,
            mem: Mutex::new(Mem { cache: BTreeMap::new(), flushed_upto, last_log_id, last_purged, vote, committed }),
            metrics,
            commit_gap_ns: AtomicU64::new(duration_ns(commit_gap)),
            _closed: closed,
        });
        let (tx, rx) = std_mpsc::channel();
        let flusher = shared.clone();
        thread::Builder::new()
            .name("fencer-log-flush".into())
            .spawn(move || flusher_loop(flusher, writer, rx))
            .map_err(|e| io_err("spawn log flusher", e))?;
        Ok(Self { shared, tx, closed: closed_rx })
    }

    /// Changes the commit gap (see [`Self::open_with`]) from the next
    /// durable group on: a node sets it as its cluster's voters change
    /// (module `node`).
    pub fn set_commit_gap(&self, gap: std::time::Duration) {
        self.shared.commit_gap_ns.store(duration_ns(gap), Ordering::Relaxed);
    }

    /// The commit gap now in force.
    pub fn commit_gap(&self) -> std::time::Duration {
        std::time::Duration::from_nanos(self.shared.commit_gap_ns.load(Ordering::Relaxed))
    }

    /// Whether the log in the directory `dir` (or the redb log of an
    /// earlier version next to it) holds raft data: an entry, a purged id
    /// or a vote beyond term 0 (a pristine node's log holds none until it
    /// joins a cluster). Reads without writing, so the files are free again
    /// on return. Blocking.
    pub fn holds_raft_data(dir: &Path) -> io::Result<bool> {
        use openraft::vote::RaftLeaderId;
        let term_above_0 = |b: &[u8]| decode::<Vote>(b, "vote").is_ok_and(|v| v.leader_id.term() > 0);
        if super::wal::holds_data(dir, term_above_0)? {
            return Ok(true);
        }
        let legacy = legacy_path(dir);
        if !legacy.exists() {
            return Ok(false);
        }
        let saved = read_legacy(&legacy)?;
        Ok(!saved.entries.is_empty() || saved.purged.is_some() || saved.vote.as_deref().is_some_and(term_above_0))
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

/// The redb log of an earlier version that belongs next to the log dir `dir`.
fn legacy_path(dir: &Path) -> PathBuf {
    dir.with_file_name(LEGACY_LOG_FILE)
}

/// What a redb log of an earlier version holds, encoded as it was.
struct LegacyLog {
    vote: Option<Vec<u8>>,
    committed: Option<Vec<u8>>,
    purged: Option<(u64, Vec<u8>)>,
    /// Entries past the purge marker, by index.
    entries: Vec<(u64, Vec<u8>)>,
}

/// Reads a redb log of an earlier version without writing to it. Blocking.
fn read_legacy(path: &Path) -> io::Result<LegacyLog> {
    let db = Database::builder()
        .set_cache_size(8 << 20)
        .create(path)
        .map_err(|e| io_err(&format!("open the earlier raft log {}", path.display()), e))?;
    let r = db.begin_read().map_err(|e| io_err("begin read", e))?;
    let (vote, committed, purged_bytes) = match r.open_table(LEGACY_META) {
        Ok(meta) => {
            let get = |k: &str| -> io::Result<Option<Vec<u8>>> {
                Ok(meta.get(k).map_err(|e| io_err("read meta", e))?.map(|v| v.value().to_vec()))
            };
            (get(KEY_VOTE)?, get(KEY_COMMITTED)?, get(KEY_PURGED)?)
        }
        Err(redb::TableError::TableDoesNotExist(_)) => (None, None, None),
        Err(e) => return Err(io_err("open meta table", e)),
    };
    let purged = match purged_bytes {
        Some(b) => Some((decode::<LogIdT>(&b, "last purged")?.index, b)),
        None => None,
    };
    let mut entries = Vec::new();
    match r.open_table(LEGACY_LOG) {
        Ok(log) => {
            let from = purged.as_ref().map_or(0, |(p, _)| p + 1);
            for item in log.range(from..).map_err(|e| io_err("read log", e))? {
                let (k, v) = item.map_err(|e| io_err("read log", e))?;
                entries.push((k.value(), v.value().to_vec()));
            }
        }
        Err(redb::TableError::TableDoesNotExist(_)) => {}
        Err(e) => return Err(io_err("open log table", e)),
    }
    Ok(LegacyLog { vote, committed, purged, entries })
}

/// Moves a redb log of an earlier version into a new write-ahead log at
/// `dir`: written to a temporary dir, synced, renamed into place, then the
/// redb file is removed. A crash at any point leaves either the redb file
/// alone (redone at the next start) or the new log (the redb file is then
/// removed). Blocking.
fn migrate_legacy(dir: &Path, options: WalOptions) -> io::Result<()> {
    let legacy = legacy_path(dir);
    if !legacy.exists() {
        return Ok(());
    }
    let parent = dir.parent().unwrap_or(Path::new("."));
    if !dir.exists() {
        let saved = read_legacy(&legacy)?;
        let tmp = dir.with_extension("migrating");
        if tmp.exists() {
            std::fs::remove_dir_all(&tmp).map_err(|e| io_err(&format!("remove {}", tmp.display()), e))?;
        }
        {
            let (mut writer, _, _) = WalWriter::open(&tmp, options)?;
            let mut ops = Vec::new();
            if let Some(v) = &saved.vote {
                ops.push(WalOp::Vote(v));
            }
            if let Some(c) = &saved.committed {
                ops.push(WalOp::Committed(c));
            }
            if let Some((index, bytes)) = &saved.purged {
                ops.push(WalOp::Purge { index: *index, bytes });
            }
            writer.write_group(&ops, true)?;
            // Contiguous runs (the log has no gaps past its purge marker).
            let mut run_first = 0;
            let mut run: Vec<Vec<u8>> = Vec::new();
            for (index, bytes) in saved.entries {
                if !run.is_empty() && index != run_first + run.len() as u64 {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidData,
                        format!(
                            "the earlier raft log {} has a gap before entry {index}; restore this node from a peer (an empty data dir with --join)",
                            legacy.display()
                        ),
                    ));
                }
                if run.is_empty() {
                    run_first = index;
                }
                run.push(bytes);
                if run.len() == 4096 {
                    writer.write_group(&[WalOp::Entries { first: run_first, entries: &run }], false)?;
                    run_first += run.len() as u64;
                    run.clear();
                }
            }
            writer.write_group(&[WalOp::Entries { first: run_first, entries: &run }], true)?;
        }
        std::fs::rename(&tmp, dir)
            .map_err(|e| io_err(&format!("move the migrated raft log {} into place", tmp.display()), e))?;
        std::fs::File::open(parent)
            .and_then(|d| d.sync_all())
            .map_err(|e| io_err(&format!("sync {}", parent.display()), e))?;
        tracing::info!(from = %legacy.display(), to = %dir.display(), "moved the raft log into the write-ahead log");
    }
    std::fs::remove_file(&legacy)
        .map_err(|e| io_err(&format!("remove the earlier raft log {}", legacy.display()), e))?;
    Ok(())
}

/// A gap in whole nanoseconds (saturating: a gap is at most a heartbeat).
fn duration_ns(gap: std::time::Duration) -> u64 {
    u64::try_from(gap.as_nanos()).unwrap_or(u64::MAX)
}

fn flusher_loop(shared: Arc<Shared>, mut wal: WalWriter, rx: std_mpsc::Receiver<Op>) {
    let mut last_durable: Option<tokio::time::Instant> = None;
    while let Ok(first) = rx.recv() {
        let mut durable = first.needs_fsync();
        let mut ops = vec![first];
        let take_queued = |ops: &mut Vec<Op>, durable: &mut bool| {
            while ops.len() < MAX_GROUP {
                let Ok(op) = rx.try_recv() else { break };
                *durable |= op.needs_fsync();
                ops.push(op);
            }
        };
        take_queued(&mut ops, &mut durable);
        // A durable group waits out the rest of the gap after the previous
        // one asleep, not woken by every append that arrives meanwhile (a
        // wake-up and a context switch each), then takes what is queued.
        let commit_gap = std::time::Duration::from_nanos(shared.commit_gap_ns.load(Ordering::Relaxed));
        if durable
            && ops.len() < MAX_GROUP
            && let Some(left) =
                last_durable.and_then(|t| (t + commit_gap).checked_duration_since(tokio::time::Instant::now()))
        {
            std::thread::sleep(left);
            take_queued(&mut ops, &mut durable);
        }
        let started = tokio::time::Instant::now();
        // A group that only records the committed index (a restart hint
        // that may be lost: openraft then re-learns it from the leader) is
        // written without fsync and becomes durable with the next group.
        let wal_ops: Vec<WalOp<'_>> = ops.iter().filter_map(Op::wal_op).collect();
        let result = wal.write_group(&wal_ops, durable);
        drop(wal_ops);
        if durable {
            last_durable = Some(started);
            shared.metrics.observe_log_flush(started.elapsed(), ops.len());
        }
        let mut highest = None;
        for op in &ops {
            if let Op::Append { first, entries, .. } = op
                && !entries.is_empty()
            {
                highest = Some(first + entries.len() as u64 - 1);
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
        let disk = self.shared.disk.clone();
        let mut from_disk = tokio::task::spawn_blocking(move || -> io::Result<BTreeMap<u64, Entry>> {
            let mut out = BTreeMap::new();
            if end.is_some_and(|end| end <= start) {
                return Ok(out);
            }
            for (index, bytes) in disk.read(start, end)? {
                out.insert(index, decode::<Entry>(&bytes, "log entry")?);
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
        let mut decoded: Vec<Entry> = Vec::new();
        for e in entries {
            if let Some(prev) = decoded.last()
                && e.index() != prev.index() + 1
            {
                return Err(io::Error::other(format!("append of entry {} after entry {}", e.index(), prev.index())));
            }
            encoded.push(encode(&e)?);
            decoded.push(e);
        }
        let (Some(first), Some(last)) = (decoded.first().map(|e| e.index()), decoded.last().map(|e| e.log_id())) else {
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
        self.send(Op::Append { first, entries: encoded, callback })
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
