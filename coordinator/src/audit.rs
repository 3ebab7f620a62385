//! The audit log (DESIGN §6): one JSON line per change of the replicated
//! lock state, apart from the operational logs, written by every node for
//! the entries it applies, in log order. Never a payload: names, ids,
//! tokens, holders and the operator's own words.
//!
//! # What produces a line
//! Each applied log entry yields zero or more [`AuditRecord`]s, numbered by
//! `part` (0, 1, …) within the entry, so `(log_index, part)` names a line:
//!
//! | entry | line(s) |
//! |---|---|
//! | Acquire that takes a free lock | `acquire`/`granted` (token = the index) |
//! | Acquire that joins the queue | `acquire`/`queued` (the lease id it will get) |
//! | Renew of the current lease | `renew`/`renewed` (omitted when renewals are off) |
//! | Release, Expire, ForceRelease of the current lease | `release`/`released`, `expire`/`expired`, `force_release`/`released`; then, if a request was queued, `promote`/`granted` with the same index as its token |
//! | ForceRelease of a free lock | `force_release`/`not_held`: every operator action is recorded |
//! | CancelWait of a queued request | `cancel_wait`/`cancelled` |
//! | membership change | `membership`/`changed` with the voters and learners |
//! | snapshot installed instead of applying entries | `snapshot_installed`/`installed`: entries up to this index were not applied here |
//! | RegisterSigningKey that registers a key | `signing_key_register`/`registered` with the key id, node, public key and window (never a secret) |
//! | RetireSigningKey that moves a key's end | `signing_key_retire`/`retired` with the key id, node and new window |
//!
//! Refusals (LOCK_HELD, TOO_MANY_WAITERS, NOT_HOLDER, …), retries answered
//! from the request-id table, expiries of already renewed leases and request
//! id pruning change no lock and write nothing.
//!
//! # Guarantees
//! The state persister writes the lines of a batch before it commits the
//! state they describe, and syncs the audit file before every durable state
//! commit; so the audit file is always at least as far as the state file.
//! After a crash, openraft re-applies the entries past the state file; the
//! writer knows the last `(log_index, part)` in its files and skips the
//! lines it already holds: exactly one line per change, across crashes. A
//! torn last line (a crash in the middle of a write) is cut off at start and
//! written again when its entry is re-applied. A write or sync failure stops
//! the node like a state-file failure: no line is ever silently lost.
//!
//! # Files
//! `audit.jsonl` in the audit dir (default `DATA_DIR/audit`), rotated by
//! size: when a line would take the file past `max_file_bytes`, it becomes
//! `audit.jsonl.1` (older ones shift to `.2`, …) and at most `max_files`
//! files are kept. Files are created `0640`, the dir `0750`: lease ids are
//! capabilities.

use std::fs::{File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use crate::metrics::Metrics;
use crate::state_machine::{AcquireCmd, Applied, Command, EndReason, Event, LogCommand, Outcome};

/// Name of the audit dir inside a data dir (the default audit location).
pub const AUDIT_DIR: &str = "audit";
/// Name of the current audit file; rotated files add `.1`, `.2`, ….
pub const AUDIT_FILE: &str = "audit.jsonl";
/// Default size at which the current file is rotated.
pub const DEFAULT_AUDIT_FILE_BYTES: u64 = 64 << 20;
/// Default number of files kept, the current one included.
pub const DEFAULT_AUDIT_FILES: u32 = 16;

/// Where and how a node writes its audit log. Every limit is explicit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuditConfig {
    /// The audit dir; `None` → `DATA_DIR/audit`.
    pub dir: Option<PathBuf>,
    /// The current file is rotated before a line would take it past this
    /// size (default 64 MiB; at least 4 KiB).
    pub max_file_bytes: u64,
    /// Files kept, the current one included; older ones are deleted
    /// (default 16; at least 2). Disk use is at most about
    /// `max_file_bytes × max_files`.
    pub max_files: u32,
    /// Whether renewals are recorded (default true). At the seed scale they
    /// are a third of all lines.
    pub renewals: bool,
}

impl Default for AuditConfig {
    fn default() -> Self {
        Self { dir: None, max_file_bytes: DEFAULT_AUDIT_FILE_BYTES, max_files: DEFAULT_AUDIT_FILES, renewals: true }
    }
}

impl AuditConfig {
    /// The audit dir for a node whose data dir is `data_dir`.
    pub fn dir_for(&self, data_dir: &Path) -> PathBuf {
        self.dir.clone().unwrap_or_else(|| data_dir.join(AUDIT_DIR))
    }

    fn validate(&self) -> io::Result<()> {
        if self.max_file_bytes < 4096 {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "audit max_file_bytes must be at least 4096"));
        }
        if self.max_files < 2 {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "audit max_files must be at least 2"));
        }
        Ok(())
    }
}

/// The kind of change a line records.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AuditOp {
    /// An Acquire that took the lock or joined its queue.
    Acquire,
    /// A renewal of the current lease.
    Renew,
    /// The holder gave the lock up.
    Release,
    /// The leader ended an overdue lease.
    Expire,
    /// An operator freed the lock.
    ForceRelease,
    /// A queued request was granted because the lease before it ended (same
    /// log index as that release, expiry or force-release).
    Promote,
    /// A queued request left the queue without the lock.
    CancelWait,
    /// The cluster's members changed.
    Membership,
    /// A snapshot replaced the state; entries up to its index were not
    /// applied (nor audited) on this node.
    SnapshotInstalled,
    /// A node's token-signing public key was registered.
    SigningKeyRegister,
    /// A token-signing key's end of validity was set or moved earlier.
    SigningKeyRetire,
}

impl AuditOp {
    /// The name used in the file and on the command line.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Acquire => "acquire",
            Self::Renew => "renew",
            Self::Release => "release",
            Self::Expire => "expire",
            Self::ForceRelease => "force_release",
            Self::Promote => "promote",
            Self::CancelWait => "cancel_wait",
            Self::Membership => "membership",
            Self::SnapshotInstalled => "snapshot_installed",
            Self::SigningKeyRegister => "signing_key_register",
            Self::SigningKeyRetire => "signing_key_retire",
        }
    }

    /// Every op, for parsing and help texts.
    pub const ALL: [AuditOp; 11] = [
        Self::Acquire,
        Self::Renew,
        Self::Release,
        Self::Expire,
        Self::ForceRelease,
        Self::Promote,
        Self::CancelWait,
        Self::Membership,
        Self::SnapshotInstalled,
        Self::SigningKeyRegister,
        Self::SigningKeyRetire,
    ];
}

impl std::str::FromStr for AuditOp {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::ALL.into_iter().find(|op| op.as_str() == s).ok_or_else(|| {
            let names: Vec<&str> = Self::ALL.iter().map(|op| op.as_str()).collect();
            format!("{s:?} is not an audit op ({})", names.join(", "))
        })
    }
}

/// What the change did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AuditOutcome {
    /// A lease started.
    Granted,
    /// A request joined the queue.
    Queued,
    /// A lease was extended.
    Renewed,
    /// A lease ended by release or force-release.
    Released,
    /// A lease ended by expiry.
    Expired,
    /// A force-release found the lock free.
    NotHeld,
    /// A queued request left the queue.
    Cancelled,
    /// The membership changed.
    Changed,
    /// A snapshot was installed.
    Installed,
    /// A signing key was registered.
    Registered,
    /// A signing key was retired.
    Retired,
}

/// One line of the audit log.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuditRecord {
    /// Index of the log entry whose application made the change.
    pub log_index: u64,
    /// Position of this change among the changes of its entry (0, 1, …).
    pub part: u32,
    /// The leader's wall time when it proposed the entry, RFC 3339 UTC with
    /// milliseconds; the same on every node. Membership and snapshot lines
    /// carry this node's time of applying instead.
    pub time: String,
    /// What changed.
    pub op: AuditOp,
    /// With what result.
    pub outcome: AuditOutcome,
    /// The lock.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resource: Option<String>,
    /// The lease concerned: granted, renewed, ended, or (queued, cancelled)
    /// the one the request would get.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease_id: Option<String>,
    /// The lease's fencing token.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token: Option<u64>,
    /// Who holds (or held, or waits for) the lease.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub holder: Option<String>,
    /// The request id of the Acquire behind a grant, queue slot or cancel.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_id: Option<String>,
    /// The lease's ttl.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl_ms: Option<u64>,
    /// 1-based place in the queue of a queued request.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue_position: Option<u32>,
    /// How long the ended lease was held, by the leader's clock.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub held_ms: Option<u64>,
    /// Who asked for a force-release.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub caller: Option<String>,
    /// Why, in the operator's words.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Voters after a membership change.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub voters: Option<Vec<u64>>,
    /// Learners after a membership change.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub learners: Option<Vec<u64>>,
    /// The signing key (`kid`) a key line is about.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_id: Option<String>,
    /// The node holding that signing key's secret.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_node: Option<u64>,
    /// The signing key's public half, base64url (never the secret).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub public_key: Option<String>,
    /// The signing key's start of validity, Unix milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub not_before_unix_ms: Option<u64>,
    /// The signing key's end of validity (exclusive), Unix milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub not_after_unix_ms: Option<u64>,
}

impl AuditRecord {
    fn new(log_index: u64, time: String, op: AuditOp, outcome: AuditOutcome) -> Self {
        Self {
            log_index,
            part: 0,
            time,
            op,
            outcome,
            resource: None,
            lease_id: None,
            token: None,
            holder: None,
            request_id: None,
            ttl_ms: None,
            queue_position: None,
            held_ms: None,
            caller: None,
            reason: None,
            voters: None,
            learners: None,
            key_id: None,
            key_node: None,
            public_key: None,
            not_before_unix_ms: None,
            not_after_unix_ms: None,
        }
    }

    /// The line's place in the log: `(log_index, part)`.
    pub fn position(&self) -> (u64, u32) {
        (self.log_index, self.part)
    }

    /// The record's time in Unix milliseconds, if it parses.
    pub fn unix_ms(&self) -> Option<u64> {
        let t = humantime::parse_rfc3339_weak(&self.time).ok()?;
        t.duration_since(UNIX_EPOCH).ok().map(|d| d.as_millis() as u64)
    }

    /// A membership change at `log_index`, at this node's wall time.
    pub(crate) fn membership(log_index: u64, wall_ms: u64, voters: Vec<u64>, learners: Vec<u64>) -> Self {
        let mut r = Self::new(log_index, rfc3339_ms(wall_ms), AuditOp::Membership, AuditOutcome::Changed);
        r.voters = Some(voters);
        r.learners = Some(learners);
        r
    }

    /// A snapshot covering entries up to `log_index` was installed.
    pub(crate) fn snapshot_installed(log_index: u64, wall_ms: u64) -> Self {
        Self::new(log_index, rfc3339_ms(wall_ms), AuditOp::SnapshotInstalled, AuditOutcome::Installed)
    }
}

/// RFC 3339 UTC with milliseconds of a Unix-milliseconds time.
pub(crate) fn rfc3339_ms(unix_ms: u64) -> String {
    humantime::format_rfc3339_millis(UNIX_EPOCH + Duration::from_millis(unix_ms)).to_string()
}

/// Appends the audit records of the entry at `index` to `out`: the pure
/// mapping of the module documentation, from the command and what its
/// application did.
pub(crate) fn records_for(
    index: u64,
    entry: &LogCommand,
    applied: &Applied,
    renewals: bool,
    out: &mut Vec<AuditRecord>,
) {
    let time = || rfc3339_ms(entry.at_ms);
    let first = out.len();
    for event in &applied.events {
        let record = match event {
            Event::LeaseStarted { resource, lease_id, token, ttl_ms, request_id, holder, waited } => {
                let op = if *waited { AuditOp::Promote } else { AuditOp::Acquire };
                let mut r = AuditRecord::new(index, time(), op, AuditOutcome::Granted);
                r.resource = Some(resource.to_string());
                r.lease_id = Some(lease_id.to_string());
                r.token = Some(token.0);
                r.holder = Some(holder.to_string());
                r.request_id = Some(request_id.to_string());
                r.ttl_ms = Some(*ttl_ms);
                r
            }
            Event::WaiterQueued { resource, request_id } => {
                let mut r = AuditRecord::new(index, time(), AuditOp::Acquire, AuditOutcome::Queued);
                r.resource = Some(resource.to_string());
                r.request_id = Some(request_id.to_string());
                if let Some(AcquireCmd { holder, lease_id, ttl_ms, .. }) = entry.cmd.acquire() {
                    r.lease_id = Some(lease_id.to_string());
                    r.holder = Some(holder.to_string());
                    r.ttl_ms = Some(*ttl_ms);
                }
                if let Outcome::Queued { position, .. } = &applied.outcome {
                    r.queue_position = Some(*position);
                }
                r
            }
            Event::LeaseRenewed { resource, lease_id, token, holder, ttl_ms, .. } => {
                if !renewals {
                    continue;
                }
                let mut r = AuditRecord::new(index, time(), AuditOp::Renew, AuditOutcome::Renewed);
                r.resource = Some(resource.to_string());
                r.lease_id = Some(lease_id.to_string());
                r.token = Some(token.0);
                r.holder = Some(holder.to_string());
                r.ttl_ms = Some(*ttl_ms);
                r
            }
            Event::LeaseEnded { resource, lease_id, token, holder, granted_at_ms, reason } => {
                let (op, outcome) = match reason {
                    EndReason::Released => (AuditOp::Release, AuditOutcome::Released),
                    EndReason::Expired => (AuditOp::Expire, AuditOutcome::Expired),
                    EndReason::ForceReleased => (AuditOp::ForceRelease, AuditOutcome::Released),
                };
                let mut r = AuditRecord::new(index, time(), op, outcome);
                r.resource = Some(resource.to_string());
                r.lease_id = Some(lease_id.to_string());
                r.token = Some(token.0);
                r.holder = Some(holder.to_string());
                r.held_ms = Some(entry.at_ms.saturating_sub(*granted_at_ms));
                if let Command::ForceRelease { caller, reason, .. } = &entry.cmd {
                    r.caller = Some(caller.to_string());
                    r.reason = Some(reason.to_string());
                }
                r
            }
            Event::WaiterCancelled { resource, request_id, holder, lease_id } => {
                let mut r = AuditRecord::new(index, time(), AuditOp::CancelWait, AuditOutcome::Cancelled);
                r.resource = Some(resource.to_string());
                r.request_id = Some(request_id.to_string());
                r.holder = Some(holder.to_string());
                r.lease_id = Some(lease_id.to_string());
                r
            }
            Event::SigningKeyRegistered { kid, key } | Event::SigningKeyRetired { kid, key } => {
                let (op, outcome) = match event {
                    Event::SigningKeyRegistered { .. } => (AuditOp::SigningKeyRegister, AuditOutcome::Registered),
                    _ => (AuditOp::SigningKeyRetire, AuditOutcome::Retired),
                };
                let mut r = AuditRecord::new(index, time(), op, outcome);
                r.key_id = Some(kid.to_string());
                r.key_node = Some(key.node_id);
                r.public_key = fencer_token::PublicKey::from_bytes(&key.public_key).ok().map(|k| k.to_base64url());
                r.not_before_unix_ms = Some(key.not_before_unix_ms);
                r.not_after_unix_ms = key.not_after_unix_ms;
                r
            }
            Event::DedupHit { .. } => continue,
        };
        out.push(record);
    }
    // An operator action is recorded even when it found nothing to free.
    if let (Command::ForceRelease { resource, caller, reason }, Outcome::ForceReleased { released_token: None }) =
        (&entry.cmd, &applied.outcome)
    {
        let mut r = AuditRecord::new(index, time(), AuditOp::ForceRelease, AuditOutcome::NotHeld);
        r.resource = Some(resource.to_string());
        r.caller = Some(caller.to_string());
        r.reason = Some(reason.to_string());
        out.push(r);
    }
    for (part, r) in out[first..].iter_mut().enumerate() {
        r.part = part as u32;
    }
}

fn invalid(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg)
}

/// The path of the `n`th file of an audit dir: 0 is the current file, 1 the
/// newest rotated one.
fn nth_file(dir: &Path, n: u32) -> PathBuf {
    if n == 0 { dir.join(AUDIT_FILE) } else { dir.join(format!("{AUDIT_FILE}.{n}")) }
}

/// The audit files of `dir`, oldest first (the current file last). Only
/// files named like the writer names them are listed.
pub fn audit_files(dir: &Path) -> io::Result<Vec<PathBuf>> {
    let mut rotated: Vec<(u32, PathBuf)> = Vec::new();
    let mut current = None;
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        let Some(name) = path.file_name().and_then(|n| n.to_str()) else { continue };
        if name == AUDIT_FILE {
            current = Some(path.clone());
        } else if let Some(n) = name.strip_prefix(AUDIT_FILE).and_then(|s| s.strip_prefix('.'))
            && let Ok(n) = n.parse::<u32>()
        {
            rotated.push((n, path.clone()));
        }
    }
    rotated.sort_by_key(|r| std::cmp::Reverse(r.0));
    let mut files: Vec<PathBuf> = rotated.into_iter().map(|(_, p)| p).collect();
    files.extend(current);
    Ok(files)
}

/// Reads the records of one audit file, in order. A line that does not
/// parse (a torn last line after a crash) is counted in `skipped`, never
/// an error.
pub fn read_audit_file(path: &Path, skipped: &mut u64) -> io::Result<Vec<AuditRecord>> {
    let text = std::fs::read(path)?;
    let mut out = Vec::new();
    for line in text.split(|b| *b == b'\n') {
        if line.is_empty() {
            continue;
        }
        match serde_json::from_slice::<AuditRecord>(line) {
            Ok(r) => out.push(r),
            Err(_) => *skipped += 1,
        }
    }
    Ok(out)
}

/// Scans the tail of a file: the position of its last parseable line, and
/// the offset just past its last newline (bytes after it are a torn write).
/// Reads backwards in growing windows, so a large file costs only its tail.
/// A complete line that does not parse is left in place (readers skip it):
/// only the torn fragment is ever cut.
fn scan_tail(file: &mut File) -> io::Result<(Option<(u64, u32)>, u64)> {
    let size = file.metadata()?.len();
    let mut window: u64 = 64 << 10;
    let mut complete_end: Option<u64> = None;
    loop {
        let start = size.saturating_sub(window);
        let mut buf = Vec::with_capacity((size - start) as usize);
        file.seek(SeekFrom::Start(start))?;
        Read::by_ref(file).take(size - start).read_to_end(&mut buf)?;
        let complete = match complete_end {
            Some(c) => c,
            None => match buf.iter().rposition(|b| *b == b'\n') {
                Some(i) => *complete_end.insert(start + i as u64 + 1),
                None if start == 0 => return Ok((None, 0)),
                None => {
                    window = window.saturating_mul(2);
                    continue;
                }
            },
        };
        // buf[end] is the newline that ends the line under test.
        let mut end = (complete - start) as usize - 1;
        loop {
            let line_start = buf[..end].iter().rposition(|b| *b == b'\n').map_or(0, |i| i + 1);
            // The first line of a window that does not start the file may be cut.
            if line_start == 0 && start > 0 {
                break;
            }
            if let Ok(r) = serde_json::from_slice::<AuditRecord>(&buf[line_start..end]) {
                return Ok((Some(r.position()), complete));
            }
            if line_start == 0 {
                return Ok((None, complete));
            }
            end = line_start - 1;
        }
        window = window.saturating_mul(2);
    }
}

/// The writer of a node's audit log, owned by the state persister thread:
/// blocking file I/O, never on an async worker.
pub struct AuditLog {
    dir: PathBuf,
    config: AuditConfig,
    file: File,
    /// Bytes in the current file.
    size: u64,
    /// Lines appended but not yet written to the file.
    pending: Vec<u8>,
    /// The last line written or pending.
    last: Option<(u64, u32)>,
    metrics: Arc<Metrics>,
}

impl AuditLog {
    /// Opens (or creates) the audit log in `dir`: finds the last line it
    /// holds, cuts a torn tail, and appends from there. Blocking.
    pub fn open(dir: &Path, config: &AuditConfig, metrics: Arc<Metrics>) -> io::Result<Self> {
        config.validate()?;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o750)
            .create(dir)
            .map_err(|e| io::Error::new(e.kind(), format!("create audit dir {}: {e}", dir.display())))?;
        let path = nth_file(dir, 0);
        let mut file = OpenOptions::new()
            .read(true)
            .append(true)
            .create(true)
            .mode(0o640)
            .open(&path)
            .map_err(|e| io::Error::new(e.kind(), format!("open {}: {e}", path.display())))?;
        let (mut last, valid) = scan_tail(&mut file)?;
        let size = file.metadata()?.len();
        if valid < size {
            tracing::warn!(file = %path.display(), bytes = size - valid, "audit log: cutting off a torn tail left by a crash; its entries are recorded again as they are re-applied");
            file.set_len(valid)?;
            file.sync_data()?;
        }
        // Just rotated before a crash: the last line is in an older file.
        let mut n = 1;
        while last.is_none() && n < config.max_files {
            let older = nth_file(dir, n);
            match File::open(&older) {
                Ok(mut f) => last = scan_tail(&mut f)?.0,
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(io::Error::new(e.kind(), format!("open {}: {e}", older.display()))),
            }
            n += 1;
        }
        if let Some((index, part)) = last {
            tracing::info!(dir = %dir.display(), index, part, "audit log resumes after its last line");
        }
        Ok(Self {
            dir: dir.to_path_buf(),
            config: config.clone(),
            file,
            size: valid,
            pending: Vec::new(),
            last,
            metrics,
        })
    }

    /// Whether renewals are recorded.
    pub(crate) fn renewals(&self) -> bool {
        self.config.renewals
    }

    /// The last line written or pending.
    pub fn last_position(&self) -> Option<(u64, u32)> {
        self.last
    }

    /// Appends records in log order. Records at or before the last line
    /// held (an entry re-applied after a crash) are skipped. Rotates the
    /// file when a line would take it past its size limit.
    pub(crate) fn append(&mut self, records: &[AuditRecord]) -> io::Result<()> {
        let mut skipped = 0u64;
        for r in records {
            if self.last.is_some_and(|last| r.position() <= last) {
                skipped += 1;
                continue;
            }
            let mut line = serde_json::to_vec(r).map_err(|e| invalid(format!("encode audit record: {e}")))?;
            line.push(b'\n');
            let used = self.size + self.pending.len() as u64;
            if used > 0 && used + line.len() as u64 > self.config.max_file_bytes {
                self.rotate()?;
            }
            self.pending.extend_from_slice(&line);
            self.last = Some(r.position());
            self.metrics.audit_lines.inc();
        }
        if skipped > 0 {
            self.metrics.audit_lines_skipped.inc_by(skipped);
            tracing::debug!(skipped, "audit log: re-applied entries were recorded before; not written again");
        }
        Ok(())
    }

    /// Writes the pending lines to the file (not synced).
    pub(crate) fn flush(&mut self) -> io::Result<()> {
        if self.pending.is_empty() {
            return Ok(());
        }
        self.file.write_all(&self.pending).map_err(|e| io::Error::new(e.kind(), format!("write audit log: {e}")))?;
        self.size += self.pending.len() as u64;
        self.pending.clear();
        Ok(())
    }

    /// Writes the pending lines and makes the file durable.
    pub(crate) fn sync(&mut self) -> io::Result<()> {
        self.flush()?;
        self.file.sync_data().map_err(|e| io::Error::new(e.kind(), format!("sync audit log: {e}")))
    }

    /// Closes the current file durably and starts a new one: `audit.jsonl`
    /// becomes `.1`, `.1` becomes `.2`, …, and the oldest beyond
    /// `max_files` is deleted.
    fn rotate(&mut self) -> io::Result<()> {
        self.sync()?;
        let ctx = |what: &str, p: &Path, e: io::Error| io::Error::new(e.kind(), format!("{what} {}: {e}", p.display()));
        let oldest = nth_file(&self.dir, self.config.max_files - 1);
        match std::fs::remove_file(&oldest) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(ctx("remove", &oldest, e)),
        }
        for n in (0..self.config.max_files - 1).rev() {
            let from = nth_file(&self.dir, n);
            match std::fs::rename(&from, nth_file(&self.dir, n + 1)) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(ctx("rotate", &from, e)),
            }
        }
        let path = nth_file(&self.dir, 0);
        self.file = OpenOptions::new()
            .append(true)
            .create(true)
            .mode(0o640)
            .open(&path)
            .map_err(|e| ctx("create", &path, e))?;
        File::open(&self.dir).and_then(|d| d.sync_all()).map_err(|e| ctx("sync", &self.dir, e))?;
        self.size = 0;
        self.metrics.audit_rotations.inc();
        tracing::info!(dir = %self.dir.display(), "audit log rotated");
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state_machine::LockState;
    use crate::types::{AuditText, Holder, LeaseId, RequestId, ResourceName};

    fn cmd(at_ms: u64, cmd: Command) -> LogCommand {
        LogCommand { at_ms, cmd }
    }

    fn acquire(id: &str, holder: &str, wait: bool, lease: u128) -> Command {
        Command::Acquire(AcquireCmd {
            request_id: RequestId::new(id).unwrap(),
            resource: ResourceName::new("orders/42").unwrap(),
            holder: Holder::new(holder).unwrap(),
            ttl_ms: 30_000,
            wait,
            lease_id: LeaseId::from_u128(lease),
            max_waiters: 8,
        })
    }

    /// Applies `entries` from index 1 and returns every record with its index.
    fn audit_of(entries: Vec<Command>) -> Vec<AuditRecord> {
        let mut state = LockState::new();
        let mut out = Vec::new();
        for (i, c) in entries.into_iter().enumerate() {
            let index = i as u64 + 1;
            let entry = cmd(1_000 * index, c);
            let applied = state.apply(index, &entry);
            records_for(index, &entry, &applied, true, &mut out);
        }
        out
    }

    fn summary(records: &[AuditRecord]) -> Vec<(u64, u32, &'static str, Option<u64>)> {
        records.iter().map(|r| (r.log_index, r.part, r.op.as_str(), r.token)).collect()
    }

    #[test]
    fn t10_each_change_is_one_line_and_refusals_are_none() {
        let res = || ResourceName::new("orders/42").unwrap();
        let records = audit_of(vec![
            acquire("req-0001", "a", false, 1),                                    // 1 granted
            acquire("req-0002", "b", false, 2),                                    // 2 LOCK_HELD: nothing
            acquire("req-0003", "c", true, 3),                                     // 3 queued
            Command::Renew { resource: res(), lease_id: LeaseId::from_u128(1) },   // 4 renewed
            Command::Renew { resource: res(), lease_id: LeaseId::from_u128(9) },   // 5 NOT_HOLDER: nothing
            acquire("req-0001", "a", false, 1),                                    // 6 dedup hit: nothing
            Command::Release { resource: res(), lease_id: LeaseId::from_u128(1) }, // 7 released + promote
            Command::Release { resource: res(), lease_id: LeaseId::from_u128(1) }, // 8 retried: nothing
            Command::Expire { resource: res(), lease_id: LeaseId::from_u128(3), basis_index: 1 }, // 9 stale: nothing
            Command::Expire { resource: res(), lease_id: LeaseId::from_u128(3), basis_index: 7 }, // 10 expired
            acquire("req-0004", "d", true, 4),                                     // 11 granted (free)
            acquire("req-0005", "e", true, 5),                                     // 12 queued
            Command::CancelWait { resource: res(), request_id: RequestId::new("req-0005").unwrap() }, // 13
            Command::PruneDedup { older_than_ms: 0 },                              // 14 nothing
        ]);
        assert_eq!(
            summary(&records),
            vec![
                (1, 0, "acquire", Some(1)),
                (3, 0, "acquire", None),
                (4, 0, "renew", Some(1)),
                (7, 0, "release", Some(1)),
                (7, 1, "promote", Some(7)),
                (10, 0, "expire", Some(7)),
                (11, 0, "acquire", Some(11)),
                (12, 0, "acquire", None),
                (13, 0, "cancel_wait", None),
            ]
        );
        let queued = &records[1];
        assert_eq!(queued.outcome, AuditOutcome::Queued);
        assert_eq!(queued.lease_id.as_deref(), Some(LeaseId::from_u128(3).to_string().as_str()));
        assert_eq!((queued.holder.as_deref(), queued.queue_position), (Some("c"), Some(1)));
        let promoted = &records[4];
        assert_eq!((promoted.holder.as_deref(), promoted.request_id.as_deref()), (Some("c"), Some("req-0003")));
        assert_eq!(records[3].held_ms, Some(6_000), "granted at 1 s, released at 7 s");
        assert_eq!(records[0].time, "1970-01-01T00:00:01.000Z");
    }

    #[test]
    fn t11_force_release_records_who_and_why_even_when_free() {
        let force = || Command::ForceRelease {
            resource: ResourceName::new("orders/42").unwrap(),
            caller: AuditText::new("alice", "caller").unwrap(),
            reason: AuditText::new("stuck job OPS-7", "reason").unwrap(),
        };
        let records = audit_of(vec![acquire("req-0001", "a", false, 1), force(), force()]);
        assert_eq!(
            summary(&records),
            vec![(1, 0, "acquire", Some(1)), (2, 0, "force_release", Some(1)), (3, 0, "force_release", None)]
        );
        for r in &records[1..] {
            assert_eq!((r.caller.as_deref(), r.reason.as_deref()), (Some("alice"), Some("stuck job OPS-7")));
        }
        assert_eq!((records[1].outcome, records[2].outcome), (AuditOutcome::Released, AuditOutcome::NotHeld));
    }

    #[test]
    fn t12_renewals_can_be_left_out() {
        let mut state = LockState::new();
        let mut out = Vec::new();
        let grant = cmd(1, acquire("req-0001", "a", false, 1));
        let applied = state.apply(1, &grant);
        records_for(1, &grant, &applied, false, &mut out);
        let renew = cmd(
            2,
            Command::Renew { resource: ResourceName::new("orders/42").unwrap(), lease_id: LeaseId::from_u128(1) },
        );
        let applied = state.apply(2, &renew);
        records_for(2, &renew, &applied, false, &mut out);
        assert_eq!(summary(&out), vec![(1, 0, "acquire", Some(1))]);
    }

    fn record(index: u64, part: u32) -> AuditRecord {
        let mut r = AuditRecord::new(index, rfc3339_ms(index), AuditOp::Acquire, AuditOutcome::Granted);
        r.part = part;
        r.resource = Some("orders/42".into());
        r
    }

    fn positions(dir: &Path) -> Vec<(u64, u32)> {
        let mut skipped = 0;
        let mut out = Vec::new();
        for f in audit_files(dir).unwrap() {
            out.extend(read_audit_file(&f, &mut skipped).unwrap().iter().map(AuditRecord::position));
        }
        assert_eq!(skipped, 0, "every line parses");
        out
    }

    #[test]
    fn t20_reapplied_entries_are_not_written_twice() {
        let dir = tempfile::tempdir().unwrap();
        let config = AuditConfig::default();
        let mut log = AuditLog::open(dir.path(), &config, Metrics::new()).unwrap();
        log.append(&[record(1, 0), record(2, 0), record(2, 1), record(3, 0)]).unwrap();
        log.sync().unwrap();
        drop(log);
        // A restart whose state file was at index 1: entries 2.. are re-applied.
        let metrics = Metrics::new();
        let mut log = AuditLog::open(dir.path(), &config, metrics.clone()).unwrap();
        assert_eq!(log.last_position(), Some((3, 0)));
        log.append(&[record(2, 0), record(2, 1), record(3, 0), record(4, 0)]).unwrap();
        log.sync().unwrap();
        assert_eq!(positions(dir.path()), vec![(1, 0), (2, 0), (2, 1), (3, 0), (4, 0)]);
        assert_eq!(metrics.audit_lines_skipped.get(), 3);
    }

    #[test]
    fn t21_a_torn_tail_is_cut_and_its_lines_written_again() {
        let dir = tempfile::tempdir().unwrap();
        let config = AuditConfig::default();
        let mut log = AuditLog::open(dir.path(), &config, Metrics::new()).unwrap();
        log.append(&[record(1, 0), record(2, 0)]).unwrap();
        log.sync().unwrap();
        drop(log);
        // A crash in the middle of writing entry 2's second line.
        let path = dir.path().join(AUDIT_FILE);
        let mut f = OpenOptions::new().append(true).open(&path).unwrap();
        f.write_all(br#"{"log_index":2,"part":1,"ti"#).unwrap();
        drop(f);
        let mut log = AuditLog::open(dir.path(), &config, Metrics::new()).unwrap();
        assert_eq!(log.last_position(), Some((2, 0)));
        log.append(&[record(2, 0), record(2, 1), record(3, 0)]).unwrap();
        log.sync().unwrap();
        assert_eq!(positions(dir.path()), vec![(1, 0), (2, 0), (2, 1), (3, 0)]);
    }

    #[test]
    fn t22_rotation_keeps_max_files_of_bounded_size_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let config = AuditConfig { max_file_bytes: 4096, max_files: 3, ..AuditConfig::default() };
        let mut log = AuditLog::open(dir.path(), &config, Metrics::new()).unwrap();
        let line_len = serde_json::to_vec(&record(100, 0)).unwrap().len() as u64 + 1;
        let per_file = 4096 / line_len;
        // Enough for five files: only the newest three are kept.
        let total = per_file * 5;
        for i in 0..total {
            log.append(&[record(100 + i, 0)]).unwrap();
            if i % 7 == 0 {
                log.flush().unwrap();
            }
        }
        log.sync().unwrap();
        let files = audit_files(dir.path()).unwrap();
        assert_eq!(files.len(), 3);
        for f in &files {
            assert!(std::fs::metadata(f).unwrap().len() <= 4096, "{} stays under the limit", f.display());
        }
        let got = positions(dir.path());
        let first = got[0].0;
        let want: Vec<(u64, u32)> = (first..100 + total).map(|i| (i, 0)).collect();
        assert_eq!(got, want, "the kept files hold a contiguous, ordered tail");
        // Rotated just before a crash: the position is found in `.1`.
        let mut log = log;
        log.rotate().unwrap();
        drop(log);
        assert_eq!(std::fs::metadata(dir.path().join(AUDIT_FILE)).unwrap().len(), 0);
        let log = AuditLog::open(dir.path(), &config, Metrics::new()).unwrap();
        assert_eq!(log.last_position(), Some((100 + total - 1, 0)));
    }
}
