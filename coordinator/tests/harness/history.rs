//! A record of client operations against the cluster, as the clients saw
//! them: what was sent, when (since the history began), and the answer.
//! Plain data and std only, so the process-level tests share it
//! (`tests/common/cluster.rs` includes this file).

use std::sync::Mutex;
use std::time::Duration;

/// What a client asked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Call {
    Acquire { resource: String, request_id: String, ttl_ms: u64 },
    Renew { resource: String, lease_id: String },
    Release { resource: String, lease_id: String },
}

/// What it was told.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    /// Acquire succeeded.
    Granted { lease_id: String, token: u64, ttl_ms: u64 },
    /// Renew succeeded; the lease's token.
    Renewed { token: u64 },
    /// Release succeeded.
    Released,
    /// The server refused; the outcome is known (LOCK_HELD, NOT_HOLDER, …).
    Refused { reason: String },
    /// No answer, or UNAVAILABLE: the outcome is unknown.
    Unavailable { reason: String },
}

/// One operation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Op {
    /// Who sent it (free text: client name, node it went to).
    pub client: String,
    pub call: Call,
    /// When the request was sent, since the history began.
    pub sent: Duration,
    /// When the answer arrived.
    pub answered: Duration,
    pub answer: Answer,
}

/// Operations recorded by many concurrent clients.
pub struct History {
    start: tokio::time::Instant,
    ops: Mutex<Vec<Op>>,
}

impl Default for History {
    fn default() -> Self {
        Self::new()
    }
}

impl History {
    pub fn new() -> Self {
        Self { start: tokio::time::Instant::now(), ops: Mutex::new(Vec::new()) }
    }

    /// Time since the history began.
    pub fn now(&self) -> Duration {
        self.start.elapsed()
    }

    pub fn record(&self, op: Op) {
        self.ops.lock().unwrap_or_else(|p| p.into_inner()).push(op);
    }

    pub fn ops(&self) -> Vec<Op> {
        self.ops.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Every acknowledged grant: (request id, lease id, token).
    pub fn grants(&self) -> Vec<(String, String, u64)> {
        let mut out: Vec<_> = self
            .ops()
            .into_iter()
            .filter_map(|op| match (op.call, op.answer) {
                (Call::Acquire { request_id, .. }, Answer::Granted { lease_id, token, .. }) => {
                    Some((request_id, lease_id, token))
                }
                _ => None,
            })
            .collect();
        out.sort();
        out.dedup();
        out
    }
}
