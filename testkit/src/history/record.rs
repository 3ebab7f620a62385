//! A record of client operations, as the clients saw them: what was sent,
//! when (on one monotonic clock, since the history began), and the answer.
//! Lock calls (acquire, renew, release) and writes through the proxy share
//! one history, so a checker can relate a write's token to its lease.
//! Plain data and std only.

use std::sync::Mutex;
use std::time::Duration;

/// What a client asked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Call {
    /// Take `resource` for `ttl_ms`, idempotent by `request_id`.
    Acquire {
        /// The resource.
        resource: String,
        /// The request id (a retry sends the same one).
        request_id: String,
        /// The ttl asked for.
        ttl_ms: u64,
    },
    /// Extend lease `lease_id` of `resource`.
    Renew {
        /// The resource.
        resource: String,
        /// The lease.
        lease_id: String,
    },
    /// Give lease `lease_id` of `resource` up.
    Release {
        /// The resource.
        resource: String,
        /// The lease.
        lease_id: String,
    },
    /// A write through the proxy to `resource`, carrying `token`. `write_id`
    /// is unique per write and travels in the body, so the upstream's record
    /// names it.
    Write {
        /// The resource the write's route names.
        resource: String,
        /// The fencing token it carried.
        token: u64,
        /// Its unique id.
        write_id: String,
    },
}

impl Call {
    /// The resource the call is about.
    pub fn resource(&self) -> &str {
        match self {
            Call::Acquire { resource, .. }
            | Call::Renew { resource, .. }
            | Call::Release { resource, .. }
            | Call::Write { resource, .. } => resource,
        }
    }

    /// A short name of the kind of call.
    pub fn kind(&self) -> &'static str {
        match self {
            Call::Acquire { .. } => "acquire",
            Call::Renew { .. } => "renew",
            Call::Release { .. } => "release",
            Call::Write { .. } => "write",
        }
    }
}

/// What it was told.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    /// Acquire succeeded.
    Granted {
        /// The new lease.
        lease_id: String,
        /// Its fencing token.
        token: u64,
        /// Its ttl.
        ttl_ms: u64,
    },
    /// Renew succeeded; the lease's token.
    Renewed {
        /// The token the renewal reported.
        token: u64,
    },
    /// Release succeeded and the lease was the current one (`was_holder`).
    Released,
    /// Release succeeded as the retry of a release that had already ended
    /// the lease (`was_holder` false): nothing changed.
    AlreadyReleased,
    /// The server refused; the outcome is known (LOCK_HELD, NOT_HOLDER, …).
    Refused {
        /// The refusal's reason.
        reason: String,
    },
    /// No answer, or UNAVAILABLE: the outcome is unknown.
    Unavailable {
        /// What was seen instead of an answer.
        reason: String,
    },
    /// The proxy forwarded the write and the upstream answered 2xx.
    Written {
        /// The upstream's status code.
        status: u16,
    },
    /// The proxy refused the write as stale (409): its epoch then.
    Fenced {
        /// The resource's epoch the proxy reported.
        epoch: u64,
    },
}

impl Answer {
    /// A short name of the kind of answer.
    pub fn kind(&self) -> &'static str {
        match self {
            Answer::Granted { .. } => "granted",
            Answer::Renewed { .. } => "renewed",
            Answer::Released => "released",
            Answer::AlreadyReleased => "already-released",
            Answer::Refused { .. } => "refused",
            Answer::Unavailable { .. } => "unknown",
            Answer::Written { .. } => "written",
            Answer::Fenced { .. } => "fenced",
        }
    }
}

/// One operation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Op {
    /// Who sent it (free text: client name, node it went to).
    pub client: String,
    /// What it asked.
    pub call: Call,
    /// When the request was sent, since the history began.
    pub sent: Duration,
    /// When the answer arrived.
    pub answered: Duration,
    /// What it was told.
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
    /// An empty history; its clock starts now.
    pub fn new() -> Self {
        Self { start: tokio::time::Instant::now(), ops: Mutex::new(Vec::new()) }
    }

    /// Time since the history began.
    pub fn now(&self) -> Duration {
        self.start.elapsed()
    }

    /// Adds one operation (at its answer).
    pub fn record(&self, op: Op) {
        self.ops.lock().unwrap_or_else(|p| p.into_inner()).push(op);
    }

    /// Every operation, in the order they were recorded (answer order).
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
