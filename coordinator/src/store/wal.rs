//! The raft log on disk: an append-only write-ahead log in segment files.
//!
//! A redb transaction per group commit cost ~130 µs of CPU (B-tree pages
//! copied, checksummed and written at scattered offsets) against ~35 µs for
//! one `pwrite` and `fdatasync` into space written with zeros beforehand
//! (issue 18; docs/coordinator.md "Storage"). This module is that log; the
//! group commit, the cache and openraft's traits stay in `log_store`.
//!
//! # Layout
//!
//! `DATA_DIR/raft-log/` holds segment files `<seq>.wal` (20 digits, in the
//! order they were created). A segment is a 16-byte header (`FNCRWAL1` and
//! its sequence number) followed by records:
//!
//! ```text
//! len: u32 LE | crc: u32 LE | kind: u8 | body: len - 1 bytes
//! ```
//!
//! `crc` is the CRC-32 (`crc32fast`) of the segment's sequence number,
//! `len`, `kind` and `body`, so a record left over from another file in
//! reused disk blocks never checks out here. A `len` of 0
//! (the zeros the writer lays ahead of itself) or the end of the file ends
//! the segment. Kinds:
//!
//! | kind | body |
//! |---|---|
//! | 1 entries | first index u64, count u32, then per entry: length u32, postcard bytes |
//! | 2 vote | postcard `Vote` |
//! | 3 committed | postcard `LogId` |
//! | 4 truncate | u64: entries at or above it are removed |
//! | 5 purge | index u64, postcard `LogId`: entries at or below it are removed |
//! | 6 checkpoint | vote, committed, purged (each: present u8, then as kinds 2, 3, 5) |
//! | 7 seal | nothing: the segment ends here |
//!
//! Every segment starts with a checkpoint of the vote, committed and purge
//! marker as they were, so deleting the segments before it loses nothing.
//! Every segment but the newest ends with a seal record.
//!
//! # Recovery
//!
//! Segments are replayed in order. A record that does not check out in a
//! sealed segment is corruption: the node refuses to start and names the
//! file and offset. In the newest segment it is the torn tail of a group
//! that was never acknowledged (a group is acknowledged only after its
//! `fdatasync`), so the log ends there, as RocksDB's point-in-time recovery
//! does; a warning says where. That segment is then synced (what the page
//! cache still held of the crashed process is made durable before raft
//! counts on it), sealed, and a new segment is started: a segment is never
//! written again after a restart, so bytes past a torn tail are never read.
//!
//! # Writing
//!
//! One writer (the log's flusher thread) appends each group with one
//! `pwrite` and, for durable groups, one `fdatasync`. Ahead of the write
//! position it writes zeros [`ZERO_CHUNK`] at a time, so the file's size
//! changes once per chunk instead of at every commit. A segment full up to
//! its size limit is sealed and the next one created (written to a
//! temporary name, synced, renamed, and the directory synced). Any write
//! or sync failure is sticky: after an `fdatasync` error Linux may have
//! dropped the dirty pages and a second `fdatasync` would report success,
//! so nothing more is written until the node restarts and recovers from
//! what is on disk.
//!
//! Readers take entries by index through [`WalIndex`] (`pread` on the
//! segment files; blocking, called from `spawn_blocking`).

use std::collections::{BTreeMap, VecDeque};
use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use super::codec::io_err;

/// Directory of the raft log inside a data dir.
pub const LOG_DIR: &str = "raft-log";

const MAGIC: &[u8; 8] = b"FNCRWAL1";
const HEADER_LEN: u64 = 16;
/// `len` and `crc`.
const RECORD_HEAD: usize = 8;
/// Room kept at the end of a segment for its seal record.
const SEAL_RESERVE: u64 = 64;
/// Zeros written ahead of the write position at a time.
pub(crate) const ZERO_CHUNK: u64 = 4 << 20;

const KIND_ENTRIES: u8 = 1;
const KIND_VOTE: u8 = 2;
const KIND_COMMITTED: u8 = 3;
const KIND_TRUNCATE: u8 = 4;
const KIND_PURGE: u8 = 5;
const KIND_CHECKPOINT: u8 = 6;
const KIND_SEAL: u8 = 7;

/// Sizes of the log's files.
#[derive(Debug, Clone, Copy)]
pub struct WalOptions {
    /// Largest segment file, header and seal included.
    pub segment_bytes: u64,
    /// Zeros written ahead of the write position at a time.
    pub zero_chunk: u64,
}

impl Default for WalOptions {
    fn default() -> Self {
        Self { segment_bytes: 64 << 20, zero_chunk: ZERO_CHUNK }
    }
}

impl WalOptions {
    fn check(&self) -> io::Result<()> {
        if self.segment_bytes < 4096 || self.segment_bytes > u64::from(u32::MAX) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("raft log segment size {} is outside 4 KiB ..= 4 GiB", self.segment_bytes),
            ));
        }
        if self.zero_chunk == 0 {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "raft log zero chunk of 0 bytes"));
        }
        Ok(())
    }
}

/// The vote, committed id and purge marker, as postcard bytes (the log
/// store owns their types); the purge marker with its index.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Meta {
    pub(crate) vote: Option<Vec<u8>>,
    pub(crate) committed: Option<Vec<u8>>,
    pub(crate) purged: Option<(u64, Vec<u8>)>,
}

/// One operation of a group, as the writer puts it on disk.
#[derive(Debug)]
pub(crate) enum WalOp<'a> {
    /// Entries at consecutive indexes from `first`, postcard-encoded.
    Entries {
        first: u64,
        entries: &'a [Vec<u8>],
    },
    Vote(&'a [u8]),
    Committed(&'a [u8]),
    /// Removes the entries at or above this index.
    TruncateFrom(u64),
    /// Removes the entries at or below `index`; `bytes` is the log id.
    Purge {
        index: u64,
        bytes: &'a [u8],
    },
}

/// Where one entry's bytes are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Loc {
    seq: u64,
    offset: u32,
    len: u32,
}

/// What recovery found.
#[derive(Debug)]
pub(crate) struct Recovered {
    pub(crate) meta: Meta,
    /// The bytes of the last entry held, to learn its log id.
    pub(crate) last_entry: Option<Vec<u8>>,
}

/// The entries on disk by index, shared by the writer and the readers.
pub(crate) struct WalIndex {
    inner: Mutex<IndexInner>,
}

struct IndexInner {
    /// Index of `locs[0]`.
    first: u64,
    locs: VecDeque<Loc>,
    files: BTreeMap<u64, Arc<File>>,
}

fn lock(m: &Mutex<IndexInner>) -> MutexGuard<'_, IndexInner> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl IndexInner {
    fn next_index(&self) -> u64 {
        self.first + self.locs.len() as u64
    }

    fn push(&mut self, index: u64, loc: Loc) -> Result<(), String> {
        if self.locs.is_empty() {
            self.first = index;
        } else if index != self.next_index() {
            return Err(format!("entry {index} follows entry {} (a gap or an overlap)", self.next_index() - 1));
        }
        self.locs.push_back(loc);
        Ok(())
    }

    fn truncate_from(&mut self, from: u64) {
        let keep = from.saturating_sub(self.first).min(self.locs.len() as u64);
        self.locs.truncate(keep as usize);
    }

    fn purge_upto(&mut self, index: u64) {
        while !self.locs.is_empty() && self.first <= index {
            self.locs.pop_front();
            self.first += 1;
        }
        if self.locs.is_empty() {
            self.first = self.first.max(index.saturating_add(1));
        }
    }

    fn range(&self) -> Option<(u64, u64)> {
        (!self.locs.is_empty()).then(|| (self.first, self.next_index() - 1))
    }
}

impl WalIndex {
    /// The bytes of the entries held in `start..end` (`end` exclusive,
    /// `None`: to the last), in order. Blocking: `pread`s.
    pub(crate) fn read(&self, start: u64, end: Option<u64>) -> io::Result<Vec<(u64, Vec<u8>)>> {
        let wanted: Vec<(u64, Loc, Arc<File>)> = {
            let inner = lock(&self.inner);
            let from = start.max(inner.first);
            let to = end.unwrap_or(u64::MAX).min(inner.next_index());
            let mut out = Vec::with_capacity(to.saturating_sub(from) as usize);
            for index in from..to {
                let loc = inner.locs[(index - inner.first) as usize];
                let file = inner.files.get(&loc.seq).cloned().ok_or_else(|| {
                    io::Error::other(format!("raft log entry {index} is in segment {} which is not open", loc.seq))
                })?;
                out.push((index, loc, file));
            }
            out
        };
        let mut out = Vec::with_capacity(wanted.len());
        for (index, loc, file) in wanted {
            let mut buf = vec![0; loc.len as usize];
            file.read_exact_at(&mut buf, u64::from(loc.offset))
                .map_err(|e| io_err(&format!("read raft log entry {index} from segment {}", loc.seq), e))?;
            out.push((index, buf));
        }
        Ok(out)
    }

    /// The first and last index held.
    #[cfg(test)]
    pub(crate) fn range(&self) -> Option<(u64, u64)> {
        lock(&self.inner).range()
    }
}

fn segment_name(seq: u64) -> String {
    format!("{seq:020}.wal")
}

/// The sequence number of a segment file name, `None` for other names.
fn segment_seq(name: &str) -> Option<u64> {
    let digits = name.strip_suffix(".wal")?;
    (digits.len() == 20 && digits.bytes().all(|b| b.is_ascii_digit())).then(|| digits.parse().ok()).flatten()
}

fn crc(seq: u64, len: u32, kind: u8, body: &[u8]) -> u32 {
    let mut h = crc32fast::Hasher::new();
    h.update(&seq.to_le_bytes());
    h.update(&len.to_le_bytes());
    h.update(&[kind]);
    h.update(body);
    h.finalize()
}

/// Appends one record to `buf`.
fn put_record(buf: &mut Vec<u8>, seq: u64, kind: u8, body: &[u8]) {
    let len = (body.len() + 1) as u32;
    buf.extend_from_slice(&len.to_le_bytes());
    buf.extend_from_slice(&crc(seq, len, kind, body).to_le_bytes());
    buf.push(kind);
    buf.extend_from_slice(body);
}

fn put_blob(body: &mut Vec<u8>, blob: Option<&[u8]>) {
    match blob {
        None => body.push(0),
        Some(b) => {
            body.push(1);
            body.extend_from_slice(&(b.len() as u32).to_le_bytes());
            body.extend_from_slice(b);
        }
    }
}

fn checkpoint_body(meta: &Meta) -> Vec<u8> {
    let mut body = Vec::new();
    put_blob(&mut body, meta.vote.as_deref());
    put_blob(&mut body, meta.committed.as_deref());
    match &meta.purged {
        None => body.push(0),
        Some((index, bytes)) => {
            body.push(1);
            body.extend_from_slice(&index.to_le_bytes());
            body.extend_from_slice(&(bytes.len() as u32).to_le_bytes());
            body.extend_from_slice(bytes);
        }
    }
    body
}

/// A cursor over a record body that reports a short body instead of panicking.
struct Body<'a>(&'a [u8]);

impl<'a> Body<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.0.len() < n {
            return None;
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Some(head)
    }

    fn u8(&mut self) -> Option<u8> {
        self.take(1).map(|b| b[0])
    }

    fn u32(&mut self) -> Option<u32> {
        self.take(4).map(|b| u32::from_le_bytes(b.try_into().unwrap_or_default()))
    }

    fn u64(&mut self) -> Option<u64> {
        self.take(8).map(|b| u64::from_le_bytes(b.try_into().unwrap_or_default()))
    }

    fn blob(&mut self) -> Option<Option<&'a [u8]>> {
        match self.u8()? {
            0 => Some(None),
            1 => {
                let n = self.u32()? as usize;
                self.take(n).map(Some)
            }
            _ => None,
        }
    }

    fn done(&self) -> bool {
        self.0.is_empty()
    }
}

/// One record read back.
enum Parsed<'a> {
    Entries { first: u64, entries: Vec<(u32, u32)> },
    Vote(&'a [u8]),
    Committed(&'a [u8]),
    TruncateFrom(u64),
    Purge(u64, &'a [u8]),
    Checkpoint(Meta),
    Seal,
}

/// Parses a record body whose checksum held; `body_offset` is its offset in
/// the segment (entries are located by offset). `None`: malformed.
fn parse(kind: u8, body: &[u8], body_offset: u64) -> Option<Parsed<'_>> {
    let mut b = Body(body);
    let parsed = match kind {
        KIND_ENTRIES => {
            let first = b.u64()?;
            let count = b.u32()?;
            let mut entries = Vec::with_capacity(count.min(1 << 16) as usize);
            for _ in 0..count {
                let len = b.u32()?;
                let offset = body_offset + (body.len() - b.0.len()) as u64;
                b.take(len as usize)?;
                entries.push((u32::try_from(offset).ok()?, len));
            }
            first.checked_add(u64::from(count))?;
            Parsed::Entries { first, entries }
        }
        KIND_VOTE => Parsed::Vote(b.take(body.len())?),
        KIND_COMMITTED => Parsed::Committed(b.take(body.len())?),
        KIND_TRUNCATE => Parsed::TruncateFrom(b.u64()?),
        KIND_PURGE => {
            let index = b.u64()?;
            Parsed::Purge(index, b.take(b.0.len())?)
        }
        KIND_CHECKPOINT => {
            let vote = b.blob()?.map(<[u8]>::to_vec);
            let committed = b.blob()?.map(<[u8]>::to_vec);
            let purged = match b.u8()? {
                0 => None,
                1 => {
                    let index = b.u64()?;
                    let n = b.u32()? as usize;
                    Some((index, b.take(n)?.to_vec()))
                }
                _ => return None,
            };
            Parsed::Checkpoint(Meta { vote, committed, purged })
        }
        KIND_SEAL => Parsed::Seal,
        _ => return None,
    };
    b.done().then_some(parsed)
}

/// How a segment's records ended.
#[derive(Debug, PartialEq, Eq)]
enum End {
    Sealed,
    /// Zeros or the end of the file at this offset.
    Clean(u64),
    /// A record that does not check out at this offset.
    Broken(u64, String),
}

/// Replays one segment's records into `index` and `meta`.
fn replay_segment(
    seq: u64,
    bytes: &[u8],
    index: &mut IndexInner,
    meta: &mut Meta,
    path: &Path,
) -> io::Result<(End, Option<u64>)> {
    let corrupt = |what: String| {
        io::Error::new(io::ErrorKind::InvalidData, format!("raft log segment {}: {what}", path.display()))
    };
    if bytes.len() < HEADER_LEN as usize || &bytes[..8] != MAGIC {
        return Err(corrupt("not a fencer raft log segment (bad header)".into()));
    }
    let header_seq = u64::from_le_bytes(bytes[8..16].try_into().unwrap_or_default());
    if header_seq != seq {
        return Err(corrupt(format!("header says segment {header_seq}, the file name {seq}")));
    }
    let mut pos = HEADER_LEN as usize;
    let mut max_index: Option<u64> = None;
    loop {
        if bytes.len() - pos < RECORD_HEAD {
            return Ok((End::Clean(pos as u64), max_index));
        }
        let len = u32::from_le_bytes(bytes[pos..pos + 4].try_into().unwrap_or_default());
        let sum = u32::from_le_bytes(bytes[pos + 4..pos + 8].try_into().unwrap_or_default());
        if len == 0 && sum == 0 {
            return Ok((End::Clean(pos as u64), max_index));
        }
        let body_start = pos + RECORD_HEAD;
        if len == 0 || (len as usize) > bytes.len() - body_start {
            return Ok((End::Broken(pos as u64, format!("record length {len} runs past the file")), max_index));
        }
        let kind = bytes[body_start];
        let body = &bytes[body_start + 1..body_start + len as usize];
        if crc(seq, len, kind, body) != sum {
            return Ok((End::Broken(pos as u64, "checksum mismatch".into()), max_index));
        }
        let Some(record) = parse(kind, body, (body_start + 1) as u64) else {
            return Ok((End::Broken(pos as u64, format!("malformed record of kind {kind}")), max_index));
        };
        let at = pos;
        pos = body_start + len as usize;
        match record {
            Parsed::Entries { first, entries } => {
                for (k, (offset, len)) in entries.into_iter().enumerate() {
                    let i = first + k as u64;
                    max_index = Some(max_index.map_or(i, |m| m.max(i)));
                    if meta.purged.as_ref().is_some_and(|(p, _)| i <= *p) {
                        continue;
                    }
                    index
                        .push(i, Loc { seq, offset, len })
                        .map_err(|e| corrupt(format!("record at offset {at}: {e}")))?;
                }
            }
            Parsed::Vote(v) => meta.vote = Some(v.to_vec()),
            Parsed::Committed(c) => meta.committed = Some(c.to_vec()),
            Parsed::TruncateFrom(from) => index.truncate_from(from),
            Parsed::Purge(p, bytes) => {
                index.purge_upto(p);
                if meta.purged.as_ref().is_none_or(|(old, _)| p >= *old) {
                    meta.purged = Some((p, bytes.to_vec()));
                }
            }
            Parsed::Checkpoint(m) => {
                if let Some((p, _)) = &m.purged {
                    index.purge_upto(*p);
                }
                // A checkpoint never moves the purge marker back (a segment
                // a crash kept from deletion may precede newer ones).
                let purged = match (meta.purged.take(), m.purged) {
                    (Some(old), Some(new)) => Some(if new.0 >= old.0 { new } else { old }),
                    (old, new) => new.or(old),
                };
                *meta = Meta {
                    vote: m.vote.or(meta.vote.take()),
                    committed: m.committed.or(meta.committed.take()),
                    purged,
                };
            }
            Parsed::Seal => return Ok((End::Sealed, max_index)),
        }
    }
}

/// A segment the writer knows.
struct Segment {
    seq: u64,
    /// The highest entry index ever written to it (truncated and purged
    /// ones included); `None` if it never held an entry.
    max_index: Option<u64>,
}

/// The one writer of the log (the flusher thread owns it).
pub(crate) struct WalWriter {
    dir: PathBuf,
    opts: WalOptions,
    index: Arc<WalIndex>,
    /// Sealed segments, oldest first (never the active one).
    sealed: VecDeque<Segment>,
    active: Segment,
    file: Arc<File>,
    /// Where the next record goes.
    pos: u64,
    /// Where the active segment's first record after its checkpoint goes.
    start: u64,
    /// Up to where the active file holds zeros or records.
    zeroed_to: u64,
    /// The meta as written so far (the next checkpoint's contents).
    meta: Meta,
    buf: Vec<u8>,
    /// The first write failure; nothing is written after it.
    failed: Option<String>,
}

fn zeros() -> &'static [u8] {
    static ZEROS: [u8; 64 << 10] = [0; 64 << 10];
    &ZEROS
}

fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir).and_then(|d| d.sync_all()).map_err(|e| io_err(&format!("sync directory {}", dir.display()), e))
}

/// The segment files in `dir`, by sequence number; with `tidy`, leftover
/// temporary files (a segment being created when the process stopped) are
/// removed.
fn list_segments(dir: &Path, tidy: bool) -> io::Result<Vec<(u64, PathBuf)>> {
    let mut out = Vec::new();
    let entries = fs::read_dir(dir).map_err(|e| io_err(&format!("list raft log dir {}", dir.display()), e))?;
    for entry in entries {
        let entry = entry.map_err(|e| io_err(&format!("list raft log dir {}", dir.display()), e))?;
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        if let Some(seq) = segment_seq(name) {
            out.push((seq, entry.path()));
        } else if tidy && name.ends_with(".wal.tmp") {
            fs::remove_file(entry.path())
                .map_err(|e| io_err(&format!("remove unfinished segment {}", entry.path().display()), e))?;
        }
    }
    out.sort();
    Ok(out)
}

/// Whether the log directory `dir` holds raft data: an entry, a purge
/// marker or a vote (`has_vote` decides whether a vote's bytes count).
/// Reads without writing anything. Blocking.
pub(crate) fn holds_data(dir: &Path, has_vote: impl Fn(&[u8]) -> bool) -> io::Result<bool> {
    if !dir.exists() {
        return Ok(false);
    }
    let replayed = replay_dir(dir, false)?;
    Ok(replayed.index.range().is_some()
        || replayed.meta.purged.is_some()
        || replayed.meta.vote.as_deref().is_some_and(has_vote))
}

/// What replaying a log directory found.
struct Replayed {
    index: IndexInner,
    meta: Meta,
    /// Every segment, oldest first, with the highest entry index ever
    /// written to it (truncated and purged ones included).
    segments: Vec<(u64, PathBuf, Option<u64>)>,
    /// Where the newest segment's records end, when it is not sealed.
    unsealed_end: Option<u64>,
}

/// Replays every segment in `dir` (with `tidy`, removing leftover
/// temporary files).
fn replay_dir(dir: &Path, tidy: bool) -> io::Result<Replayed> {
    let listed = list_segments(dir, tidy)?;
    if let Some(gap) = listed.windows(2).find(|w| w[1].0 != w[0].0 + 1) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!(
                "raft log in {} misses segment {} (segments {} and {} are there); restore this node from a peer (an empty data dir with --join)",
                dir.display(),
                gap[0].0 + 1,
                gap[0].0,
                gap[1].0
            ),
        ));
    }
    let mut index = IndexInner { first: 0, locs: VecDeque::new(), files: BTreeMap::new() };
    let mut meta = Meta::default();
    let mut segments = Vec::with_capacity(listed.len());
    let mut unsealed_end = None;
    let count = listed.len();
    for (i, (seq, path)) in listed.into_iter().enumerate() {
        let bytes = fs::read(&path).map_err(|e| io_err(&format!("read raft log segment {}", path.display()), e))?;
        let (end, max_index) = replay_segment(seq, &bytes, &mut index, &mut meta, &path)?;
        let newest = i + 1 == count;
        match end {
            End::Sealed => {}
            End::Clean(at) if newest => unsealed_end = Some(at),
            End::Broken(at, why) if newest => {
                let trailing = bytes[at as usize..].iter().take(1 << 20).filter(|b| **b != 0).count();
                tracing::warn!(
                    segment = %path.display(),
                    offset = at,
                    nonzero_bytes_after = trailing,
                    "the raft log ends in a record that does not check out ({why}): the torn write of a group that was never acknowledged; the log ends before it"
                );
                unsealed_end = Some(at);
            }
            End::Clean(at) => {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!(
                        "raft log segment {} ends at offset {at} without its seal record, and newer segments follow: the file was cut short; restore this node from a peer (an empty data dir with --join)",
                        path.display()
                    ),
                ));
            }
            End::Broken(at, why) => {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!(
                        "raft log segment {} is corrupt at offset {at} ({why}), and newer segments follow; restore this node from a peer (an empty data dir with --join)",
                        path.display()
                    ),
                ));
            }
        }
        segments.push((seq, path, max_index));
    }
    if let (Some((p, _)), Some((first, _))) = (&meta.purged, index.range())
        && first != p + 1
    {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!(
                "raft log in {} holds entries from {first} but is purged only up to {p}: entries are missing",
                dir.display()
            ),
        ));
    }
    if index.locs.is_empty()
        && let Some((p, _)) = &meta.purged
    {
        index.first = p + 1;
    }
    Ok(Replayed { index, meta, segments, unsealed_end })
}

impl WalWriter {
    /// Opens the log in `dir` (creating it), recovers it, seals its newest
    /// segment and starts a new one. Blocking.
    pub(crate) fn open(dir: &Path, opts: WalOptions) -> io::Result<(Self, Arc<WalIndex>, Recovered)> {
        opts.check()?;
        fs::create_dir_all(dir).map_err(|e| io_err(&format!("create raft log dir {}", dir.display()), e))?;
        let Replayed { index: mut inner, meta, segments, unsealed_end } = replay_dir(dir, true)?;
        let mut sealed = VecDeque::with_capacity(segments.len());
        for (seq, path, max_index) in &segments {
            let file = OpenOptions::new()
                .read(true)
                .write(true)
                .open(path)
                .map_err(|e| io_err(&format!("open raft log segment {}", path.display()), e))?;
            inner.files.insert(*seq, Arc::new(file));
            sealed.push_back(Segment { seq: *seq, max_index: *max_index });
        }
        let mut next_seq = 1;
        if let Some((seq, path, _)) = segments.last() {
            next_seq = seq + 1;
            let file = inner.files.get(seq).cloned().ok_or_else(|| io::Error::other("newest segment not open"))?;
            // A segment is never written again after a restart: it is
            // sealed where its records end, so whatever a torn write left
            // past that point is never read. What the crashed process left
            // in the page cache is made durable before raft relies on it.
            // The zeros past the seal are given back to the filesystem.
            if let Some(end) = unsealed_end {
                let mut seal = Vec::new();
                put_record(&mut seal, *seq, KIND_SEAL, &[]);
                file.write_all_at(&seal, end)
                    .map_err(|e| io_err(&format!("seal raft log segment {}", path.display()), e))?;
                file.set_len(end + seal.len() as u64)
                    .map_err(|e| io_err(&format!("trim raft log segment {}", path.display()), e))?;
            }
            file.sync_all().map_err(|e| io_err(&format!("sync raft log segment {}", path.display()), e))?;
        }
        let last_entry = match inner.range() {
            Some((_, last)) => {
                let loc = inner.locs[(last - inner.first) as usize];
                let file = inner.files.get(&loc.seq).cloned().ok_or_else(|| io::Error::other("segment not open"))?;
                let mut buf = vec![0; loc.len as usize];
                file.read_exact_at(&mut buf, u64::from(loc.offset))
                    .map_err(|e| io_err(&format!("read raft log entry {last}"), e))?;
                Some(buf)
            }
            None => None,
        };
        let (active, file, pos) = create_segment(dir, next_seq, &meta, opts)?;
        inner.files.insert(next_seq, file.clone());
        let index = Arc::new(WalIndex { inner: Mutex::new(inner) });
        let mut writer = Self {
            dir: dir.to_path_buf(),
            opts,
            index: index.clone(),
            sealed,
            active,
            file,
            pos,
            start: pos,
            zeroed_to: (pos + opts.zero_chunk).min(opts.segment_bytes),
            meta: meta.clone(),
            buf: Vec::new(),
            failed: None,
        };
        writer.delete_purged()?;
        Ok((writer, index, Recovered { meta, last_entry }))
    }

    /// Writes a group; with `durable`, returns once it is on disk.
    pub(crate) fn write_group(&mut self, ops: &[WalOp<'_>], durable: bool) -> io::Result<()> {
        if let Some(why) = &self.failed {
            return Err(io::Error::other(format!(
                "an earlier raft log write failed ({why}); restart the node once the disk is fixed"
            )));
        }
        let result = self.write_group_inner(ops, durable);
        if let Err(e) = &result {
            self.failed = Some(e.to_string());
        }
        result
    }

    fn write_group_inner(&mut self, ops: &[WalOp<'_>], durable: bool) -> io::Result<()> {
        self.buf.clear();
        let mut purged = false;
        let mut index_changes: Vec<IndexChange> = Vec::new();
        for op in ops {
            match *op {
                WalOp::Entries { first, entries } => {
                    let mut done = 0;
                    while done < entries.len() {
                        // As many entries as fit in the rest of this segment,
                        // in a new segment if none does.
                        let room = self.room();
                        let mut size = (RECORD_HEAD + 1 + 12) as u64;
                        let mut n = 0;
                        for e in &entries[done..] {
                            let add = 4 + e.len() as u64;
                            if size + add > room {
                                break;
                            }
                            size += add;
                            n += 1;
                        }
                        if n == 0 {
                            if self.fresh() {
                                return Err(io::Error::new(
                                    io::ErrorKind::InvalidInput,
                                    format!(
                                        "raft log entry {} is {} bytes, more than a segment of {} bytes holds",
                                        first + done as u64,
                                        entries[done].len(),
                                        self.opts.segment_bytes
                                    ),
                                ));
                            }
                            self.roll(&mut index_changes)?;
                            continue;
                        }
                        let chunk = &entries[done..done + n];
                        let at = first + done as u64;
                        let mut body = Vec::with_capacity(size as usize);
                        body.extend_from_slice(&at.to_le_bytes());
                        body.extend_from_slice(&(n as u32).to_le_bytes());
                        let body_at = self.pos + self.buf.len() as u64 + RECORD_HEAD as u64 + 1;
                        let mut locs = Vec::with_capacity(n);
                        for e in chunk {
                            body.extend_from_slice(&(e.len() as u32).to_le_bytes());
                            let offset = body_at + body.len() as u64;
                            locs.push(Loc { seq: self.active.seq, offset: offset as u32, len: e.len() as u32 });
                            body.extend_from_slice(e);
                        }
                        put_record(&mut self.buf, self.active.seq, KIND_ENTRIES, &body);
                        let last = at + n as u64 - 1;
                        self.active.max_index = Some(self.active.max_index.map_or(last, |m| m.max(last)));
                        index_changes.push(IndexChange::Push(at, locs));
                        done += n;
                    }
                }
                WalOp::Vote(bytes) => {
                    self.record(KIND_VOTE, bytes, &mut index_changes)?;
                    self.meta.vote = Some(bytes.to_vec());
                }
                WalOp::Committed(bytes) => {
                    self.record(KIND_COMMITTED, bytes, &mut index_changes)?;
                    self.meta.committed = Some(bytes.to_vec());
                }
                WalOp::TruncateFrom(from) => {
                    self.record(KIND_TRUNCATE, &from.to_le_bytes(), &mut index_changes)?;
                    index_changes.push(IndexChange::TruncateFrom(from));
                }
                WalOp::Purge { index, bytes } => {
                    let mut body = index.to_le_bytes().to_vec();
                    body.extend_from_slice(bytes);
                    self.record(KIND_PURGE, &body, &mut index_changes)?;
                    if self.meta.purged.as_ref().is_none_or(|(p, _)| index >= *p) {
                        self.meta.purged = Some((index, bytes.to_vec()));
                    }
                    index_changes.push(IndexChange::PurgeUpto(index));
                    purged = true;
                }
            }
        }
        self.write_buf()?;
        if durable {
            self.file.sync_data().map_err(|e| io_err("sync raft log", e))?;
        }
        self.apply_index(index_changes)?;
        if purged && durable {
            self.delete_purged()?;
        }
        Ok(())
    }

    /// Bytes left in the active segment for records, the seal's room kept.
    fn room(&self) -> u64 {
        self.opts.segment_bytes.saturating_sub(SEAL_RESERVE).saturating_sub(self.pos + self.buf.len() as u64)
    }

    /// Whether the active segment holds nothing but its checkpoint.
    fn fresh(&self) -> bool {
        self.pos == self.start && self.buf.is_empty()
    }

    /// Adds a record of `kind` to the group, in a new segment if it does not fit.
    fn record(&mut self, kind: u8, body: &[u8], changes: &mut Vec<IndexChange>) -> io::Result<()> {
        let size = (RECORD_HEAD + 1 + body.len()) as u64;
        if size > self.room() {
            if self.fresh() {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("a raft log record of {size} bytes does not fit in a segment"),
                ));
            }
            self.roll(changes)?;
        }
        put_record(&mut self.buf, self.active.seq, kind, body);
        Ok(())
    }

    /// Writes the group so far to the active segment, with zeros ahead of it.
    fn write_buf(&mut self) -> io::Result<()> {
        if self.buf.is_empty() {
            return Ok(());
        }
        let end = self.pos + self.buf.len() as u64;
        if end > self.zeroed_to {
            let to = (end + self.opts.zero_chunk).min(self.opts.segment_bytes).max(end);
            let mut at = self.zeroed_to;
            while at < to {
                let n = (to - at).min(zeros().len() as u64);
                self.file.write_all_at(&zeros()[..n as usize], at).map_err(|e| io_err("extend raft log segment", e))?;
                at += n;
            }
            self.zeroed_to = to;
        }
        self.file.write_all_at(&self.buf, self.pos).map_err(|e| io_err("write raft log", e))?;
        self.pos = end;
        self.buf.clear();
        Ok(())
    }

    /// Writes what the group holds so far, seals the active segment, syncs
    /// it and starts the next one.
    fn roll(&mut self, changes: &mut Vec<IndexChange>) -> io::Result<()> {
        let seq = self.active.seq;
        put_record(&mut self.buf, seq, KIND_SEAL, &[]);
        self.write_buf()?;
        self.file.sync_data().map_err(|e| io_err("sync raft log segment before sealing it", e))?;
        let (next, file, pos) = create_segment(&self.dir, seq + 1, &self.meta, self.opts)?;
        let old = std::mem::replace(&mut self.active, next);
        self.sealed.push_back(old);
        self.pos = pos;
        self.start = pos;
        self.zeroed_to = (pos + self.opts.zero_chunk).min(self.opts.segment_bytes);
        self.file = file.clone();
        changes.push(IndexChange::File(seq + 1, file));
        Ok(())
    }

    fn apply_index(&mut self, changes: Vec<IndexChange>) -> io::Result<()> {
        let mut inner = lock(&self.index.inner);
        for c in changes {
            match c {
                IndexChange::Push(first, locs) => {
                    // The writer's index mirrors what recovery would build.
                    if !inner.locs.is_empty() && first < inner.next_index() {
                        inner.truncate_from(first);
                    }
                    for (k, loc) in locs.into_iter().enumerate() {
                        let i = first + k as u64;
                        if inner.locs.is_empty() {
                            inner.first = i;
                        }
                        inner.push(i, loc).map_err(io::Error::other)?;
                    }
                }
                IndexChange::TruncateFrom(from) => inner.truncate_from(from),
                IndexChange::PurgeUpto(p) => inner.purge_upto(p),
                IndexChange::File(seq, file) => {
                    inner.files.insert(seq, file);
                }
            }
        }
        Ok(())
    }

    /// Deletes the oldest sealed segments while every entry they held is
    /// purged, or they never held one: what they say of the vote, the
    /// committed id and the purge marker the next segment's checkpoint
    /// says too, and a truncation in them could only concern entries of
    /// segments before them, of which there are none.
    fn delete_purged(&mut self) -> io::Result<()> {
        let purged = self.meta.purged.as_ref().map(|(p, _)| *p);
        let mut deleted = false;
        while let Some(s) = self.sealed.front() {
            let unneeded = match s.max_index {
                None => true,
                Some(max) => purged.is_some_and(|p| max <= p),
            };
            if !unneeded {
                break;
            }
            let seq = s.seq;
            let path = self.dir.join(segment_name(seq));
            fs::remove_file(&path).map_err(|e| io_err(&format!("delete purged segment {}", path.display()), e))?;
            lock(&self.index.inner).files.remove(&seq);
            self.sealed.pop_front();
            deleted = true;
        }
        if deleted {
            sync_dir(&self.dir)?;
        }
        Ok(())
    }

    /// The number of segment files (the active one included).
    #[cfg(test)]
    pub(crate) fn segment_count(&self) -> usize {
        self.sealed.len() + 1
    }
}

enum IndexChange {
    Push(u64, Vec<Loc>),
    TruncateFrom(u64),
    PurgeUpto(u64),
    File(u64, Arc<File>),
}

/// Creates segment `seq` starting with a checkpoint of `meta`: written
/// under a temporary name with zeros after it, synced, renamed, and the
/// directory synced. Returns it with where its next record goes.
fn create_segment(dir: &Path, seq: u64, meta: &Meta, opts: WalOptions) -> io::Result<(Segment, Arc<File>, u64)> {
    let path = dir.join(segment_name(seq));
    let tmp = dir.join(format!("{}.tmp", segment_name(seq)));
    let mut head = Vec::with_capacity(256);
    head.extend_from_slice(MAGIC);
    head.extend_from_slice(&seq.to_le_bytes());
    put_record(&mut head, seq, KIND_CHECKPOINT, &checkpoint_body(meta));
    if head.len() as u64 + SEAL_RESERVE > opts.segment_bytes {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "raft log segment too small for its checkpoint"));
    }
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(&tmp)
        .map_err(|e| io_err(&format!("create raft log segment {}", tmp.display()), e))?;
    let zeroed = (head.len() as u64 + opts.zero_chunk).min(opts.segment_bytes);
    let mut at = head.len() as u64;
    file.write_all_at(&head, 0).map_err(|e| io_err("write raft log segment header", e))?;
    while at < zeroed {
        let n = (zeroed - at).min(zeros().len() as u64);
        file.write_all_at(&zeros()[..n as usize], at).map_err(|e| io_err("write raft log segment", e))?;
        at += n;
    }
    file.sync_all().map_err(|e| io_err("sync new raft log segment", e))?;
    fs::rename(&tmp, &path).map_err(|e| io_err(&format!("rename {} into place", tmp.display()), e))?;
    sync_dir(dir)?;
    Ok((Segment { seq, max_index: None }, Arc::new(file), head.len() as u64))
}

#[cfg(test)]
mod tests {
    //! The write-ahead log against a model: every sequence of appends,
    //! votes, truncations and purges reads back the same after a reopen,
    //! across segment boundaries; torn tails end the log, corruption in a
    //! sealed segment refuses to start.

    use std::collections::BTreeMap;

    use proptest::prelude::*;

    use super::*;

    /// Tiny segments, so a few hundred bytes roll to the next one.
    const SMALL: WalOptions = WalOptions { segment_bytes: 4096, zero_chunk: 1024 };

    #[derive(Debug, Default, Clone, PartialEq)]
    struct Model {
        entries: BTreeMap<u64, Vec<u8>>,
        vote: Option<Vec<u8>>,
        committed: Option<Vec<u8>>,
        purged: Option<u64>,
        next: u64,
    }

    impl Model {
        fn new() -> Self {
            Self { next: 1, ..Self::default() }
        }

        fn meta(&self) -> Meta {
            Meta {
                vote: self.vote.clone(),
                committed: self.committed.clone(),
                purged: self.purged.map(|p| (p, p.to_le_bytes().to_vec())),
            }
        }

        fn floor(&self) -> u64 {
            self.purged.map_or(0, |p| p + 1)
        }
    }

    #[derive(Debug, Clone)]
    enum Step {
        Append(Vec<usize>),
        Vote(u8),
        Committed(u8),
        /// Truncate at a point chosen by this fraction of the held range.
        Truncate(u8),
        /// Purge up to a point chosen by this fraction (past the end too).
        Purge(u8),
        Reopen,
    }

    fn step() -> impl Strategy<Value = Step> {
        prop_oneof![
            6 => proptest::collection::vec(1usize..300, 1..6).prop_map(Step::Append),
            1 => any::<u8>().prop_map(Step::Vote),
            1 => any::<u8>().prop_map(Step::Committed),
            1 => any::<u8>().prop_map(Step::Truncate),
            1 => any::<u8>().prop_map(Step::Purge),
            1 => Just(Step::Reopen),
        ]
    }

    fn pick(lo: u64, hi: u64, f: u8) -> u64 {
        lo + (hi.saturating_sub(lo)) * u64::from(f) / 255
    }

    fn entry(index: u64, len: usize) -> Vec<u8> {
        (0..len).map(|k| (index as usize * 31 + k) as u8).collect()
    }

    fn check(index: &WalIndex, model: &Model) {
        let held: BTreeMap<u64, Vec<u8>> = index.read(0, None).unwrap().into_iter().collect();
        assert_eq!(held, model.entries, "entries differ from the model");
    }

    fn reopen(dir: &Path) -> (WalWriter, Arc<WalIndex>, Recovered) {
        WalWriter::open(dir, SMALL).unwrap()
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

        #[test]
        fn t10_the_log_reads_back_as_written_across_segments_and_reopens(steps in proptest::collection::vec(step(), 1..60)) {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join(LOG_DIR);
            let (mut w, mut index, _) = reopen(&path);
            let mut model = Model::new();
            for step in steps {
                match step {
                    Step::Append(lens) => {
                        let first = model.next;
                        let entries: Vec<Vec<u8>> =
                            lens.iter().enumerate().map(|(k, len)| entry(first + k as u64, *len)).collect();
                        w.write_group(&[WalOp::Entries { first, entries: &entries }], true).unwrap();
                        for (k, e) in entries.into_iter().enumerate() {
                            model.entries.insert(first + k as u64, e);
                        }
                        model.next = first + lens.len() as u64;
                    }
                    Step::Vote(v) => {
                        w.write_group(&[WalOp::Vote(&[v, 1])], true).unwrap();
                        model.vote = Some(vec![v, 1]);
                    }
                    Step::Committed(c) => {
                        // Not durable: it rides with the next group, and a
                        // reopen in the same process still reads it.
                        w.write_group(&[WalOp::Committed(&[c, 2])], false).unwrap();
                        model.committed = Some(vec![c, 2]);
                    }
                    Step::Truncate(f) => {
                        let from = pick(model.floor(), model.next, f).max(model.floor());
                        w.write_group(&[WalOp::TruncateFrom(from)], true).unwrap();
                        model.entries.retain(|i, _| *i < from);
                        model.next = model.next.min(from).max(model.floor());
                    }
                    Step::Purge(f) => {
                        let upto = pick(model.floor(), model.next + 3, f).max(model.purged.unwrap_or(0));
                        w.write_group(&[WalOp::Purge { index: upto, bytes: &upto.to_le_bytes() }], true).unwrap();
                        model.purged = Some(upto);
                        model.entries.retain(|i, _| *i > upto);
                        model.next = model.next.max(upto + 1);
                    }
                    Step::Reopen => {
                        drop(w);
                        let recovered;
                        (w, index, recovered) = reopen(&path);
                        prop_assert_eq!(&recovered.meta, &model.meta());
                        prop_assert_eq!(recovered.last_entry.as_ref(), model.entries.values().last());
                    }
                }
                check(&index, &model);
            }
            drop(w);
            let (_, index, recovered) = reopen(&path);
            prop_assert_eq!(&recovered.meta, &model.meta());
            check(&index, &model);
        }
    }

    /// Writes `n` groups of one 100-byte entry each from index 1.
    fn fill(w: &mut WalWriter, from: u64, n: u64) {
        for i in from..from + n {
            w.write_group(&[WalOp::Entries { first: i, entries: &[entry(i, 100)] }], true).unwrap();
        }
    }

    #[test]
    fn t11_a_torn_last_group_ends_the_log_and_the_next_start_writes_past_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(LOG_DIR);
        let (mut w, _, _) = reopen(&path);
        fill(&mut w, 1, 3);
        let torn_at = w.pos;
        let seq = w.active.seq;
        fill(&mut w, 4, 1);
        drop(w);
        // The crash tore entry 4's record: a byte of its body never reached the disk.
        let file = OpenOptions::new().write(true).open(path.join(segment_name(seq))).unwrap();
        file.write_all_at(&[0xff], torn_at + 20).unwrap();
        drop(file);
        let (mut w, index, recovered) = reopen(&path);
        assert_eq!(index.range(), Some((1, 3)), "the log ends before the torn record");
        assert_eq!(recovered.last_entry, Some(entry(3, 100)));
        // The new start writes a new segment; the torn one is sealed.
        fill(&mut w, 4, 2);
        drop(w);
        let (_, index, _) = reopen(&path);
        assert_eq!(index.read(0, None).unwrap(), (1..=5).map(|i| (i, entry(i, 100))).collect::<Vec<_>>());
    }

    #[test]
    fn t12_a_record_that_does_not_check_out_in_a_sealed_segment_refuses_the_start() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(LOG_DIR);
        let (mut w, _, _) = reopen(&path);
        fill(&mut w, 1, 100);
        assert!(w.segment_count() > 2, "the entries span several segments");
        drop(w);
        let first = path.join(segment_name(1));
        let file = OpenOptions::new().write(true).open(&first).unwrap();
        file.write_all_at(&[0xff, 0xff], 300).unwrap();
        drop(file);
        let e = WalWriter::open(&path, SMALL).err().expect("a corrupt sealed segment");
        let msg = e.to_string();
        assert!(msg.contains(&first.display().to_string()) && msg.contains("corrupt at offset"), "{msg}");
    }

    #[test]
    fn t13_a_missing_segment_refuses_the_start() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(LOG_DIR);
        let (mut w, _, _) = reopen(&path);
        fill(&mut w, 1, 100);
        drop(w);
        fs::remove_file(path.join(segment_name(2))).unwrap();
        let msg = WalWriter::open(&path, SMALL).err().expect("a missing segment").to_string();
        assert!(msg.contains("misses segment 2"), "{msg}");
    }

    #[test]
    fn t14_a_record_left_in_reused_blocks_by_another_segment_is_not_read() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(LOG_DIR);
        let (mut w, _, _) = reopen(&path);
        fill(&mut w, 1, 100);
        let end = w.pos;
        let seq = w.active.seq;
        drop(w);
        // Segment 1's first entry record, copied where the newest segment's
        // zeros are: what stale disk blocks could hold after a crash.
        let one = fs::read(path.join(segment_name(1))).unwrap();
        let checkpoint_len = u32::from_le_bytes(one[16..20].try_into().unwrap()) as usize;
        let rec_at = 16 + RECORD_HEAD + checkpoint_len;
        let rec_len = RECORD_HEAD + u32::from_le_bytes(one[rec_at..rec_at + 4].try_into().unwrap()) as usize;
        let stale = &one[rec_at..rec_at + rec_len];
        let file = OpenOptions::new().write(true).open(path.join(segment_name(seq))).unwrap();
        file.write_all_at(stale, end).unwrap();
        drop(file);
        let (_, index, _) = reopen(&path);
        assert_eq!(index.range(), Some((1, 100)), "the stale record's checksum names another segment");
    }

    #[test]
    fn t15_an_entry_larger_than_a_segment_is_refused_by_name() {
        let dir = tempfile::tempdir().unwrap();
        let (mut w, _, _) = reopen(&dir.path().join(LOG_DIR));
        let msg =
            w.write_group(&[WalOp::Entries { first: 1, entries: &[vec![7; 5000]] }], true).unwrap_err().to_string();
        assert!(msg.contains("entry 1 is 5000 bytes"), "{msg}");
        // The failure is sticky: nothing is written after it.
        let msg = w.write_group(&[WalOp::Vote(&[1])], true).unwrap_err().to_string();
        assert!(msg.contains("an earlier raft log write failed"), "{msg}");
    }

    #[test]
    fn t16_purging_deletes_whole_segments_and_keeps_the_vote() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(LOG_DIR);
        let (mut w, _, _) = reopen(&path);
        w.write_group(&[WalOp::Vote(b"vote")], true).unwrap();
        fill(&mut w, 1, 200);
        let before = w.segment_count();
        w.write_group(&[WalOp::Purge { index: 190, bytes: b"p190" }], true).unwrap();
        assert!(w.segment_count() <= 2, "{} of {before} segments left", w.segment_count());
        assert!(!path.join(segment_name(1)).exists());
        drop(w);
        let (_, index, recovered) = reopen(&path);
        assert_eq!(index.range(), Some((191, 200)));
        assert_eq!(recovered.meta.vote.as_deref(), Some(&b"vote"[..]), "the checkpoints carried the vote");
        assert_eq!(recovered.meta.purged, Some((190, b"p190".to_vec())));
        // Restarts add a segment each (sealed where its records end, so a
        // few hundred bytes); those that never held an entry go once they
        // are the oldest, i.e. with the next purge.
        for _ in 0..5 {
            drop(reopen(&path));
        }
        let (mut w, _, _) = reopen(&path);
        assert!((7..=9).contains(&w.segment_count()), "the entries' one or two, 6 from restarts, the active one");
        let restarted = fs::metadata(path.join(segment_name(w.active.seq - 1))).unwrap().len();
        assert!(restarted < 256, "a restart's empty segment is trimmed to {restarted} bytes");
        fill(&mut w, 201, 1);
        w.write_group(&[WalOp::Purge { index: 201, bytes: b"p201" }], true).unwrap();
        assert_eq!(w.segment_count(), 1, "everything before the active segment went");
    }

    #[test]
    fn t17_a_segment_file_of_another_kind_is_refused_by_name() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(LOG_DIR);
        fs::create_dir_all(&path).unwrap();
        fs::write(path.join(segment_name(1)), b"not a segment at all").unwrap();
        let msg = WalWriter::open(&path, SMALL).err().expect("a foreign file").to_string();
        assert!(msg.contains("not a fencer raft log segment"), "{msg}");
    }
}
