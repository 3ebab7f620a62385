//! The fencer lock coordinator: a raft-replicated lock table that grants
//! exclusive leases with monotonically increasing fencing tokens
//! (DESIGN.md §1–§3).
//!
//! A [`Node`] runs one member of a cluster: openraft for consensus, an
//! append-only write-ahead log and snapshot files for storage, and one TCP
//! port serving the gRPC API (`fencer.v1.Lock`, `fencer.v1.Admin`), the
//! internal raft transport, JSON over HTTP, `/metrics`, `/livez`, `/readyz`
//! and the operator endpoints (optionally also on a separate status port). Every node writes an audit
//! log of the changes it applies (`docs/operations.md`).
//!
//! # Layout
//! - `raft` — the openraft type configuration ([`TypeConfig`]) and
//!   [`RaftHandle`], declared once at the root.
//! - `types` — the validated newtypes of the API edges ([`RequestId`],
//!   [`Holder`], [`AuditText`]) and [`InvalidField`]; [`ResourceName`],
//!   [`LeaseId`] and [`FencingToken`] are `fencer_token`'s, shared by every
//!   crate.
//! - `state_machine` — the pure, deterministic [`LockState::apply`] of every
//!   command, with a proptest reference model: `command` (the log entry),
//!   `outcome` (what apply answers and reports), `record` (what the state
//!   holds).
//!   - **the FIFO queue** of a lock: [`ResourceState`]`::waiters`; `apply`
//!     promotes its head when the lease ends, with that entry's index as
//!     the token.
//!   - **request-id dedup** (I7): [`DedupRecord`]s keyed by [`RequestKey`];
//!     a retried acquire is answered from them, `PruneDedup` forgets them.
//! - `store` — openraft's log and state-machine storage (group commit):
//!   `log_store` on `wal` (the write-ahead log's segment files), `sm_store`
//!   (the `RaftStateMachine`), `persister` (the thread that writes the
//!   audit log), `tables` (the redb state file of earlier versions).
//!   - **snapshots**: `store::snapshot` — formats and their migration,
//!     building, installing, the snapshot files.
//! - `network` — the raft transport over gRPC, with a fault-injection hook.
//! - `bootstrap` — identity of a data dir, forming and joining a cluster.
//! - `leadership` — the leader's life cycle: take over inherited leases,
//!   expire overdue ones, step back on quorum loss.
//! - `server` — the accept loop of the node's port; owns every connection,
//!   runs TLS handshakes, bounds connections.
//! - `tenants` — the tenants file, callers, permissions, per-tenant limits.
//! - `tls` — rustls configs, peer and client certificate checks, the local
//!   CA of `fencer dev --tls`.
//! - `lease_clock` — leader-local lease deadlines (the only lease timing).
//! - `clock` — the only place time is read.
//! - `waiters` — parked Acquire calls; promotion wakes exactly one.
//! - `policy` — every request bound.
//! - `service` — [`LockService`] and its error type [`LockError`]: `locks`
//!   (acquire and its wait, renew, release, get, list), `status` (status,
//!   health, hot resources, membership), `keys` (signing-key operations).
//! - `signing` — this node's token-signing keys (P7): kept in the data dir,
//!   registered through the log, used to sign every grant.
//! - `api` — gRPC and JSON front ends: `call` (what both do around a call),
//!   `grpc`, `http`, and `errors`, the one error→status mapping; `console`,
//!   the operator console's data endpoints under `/ui/api/` and the sampler
//!   of its charts (the page itself is `fencer_console`'s).
//! - `node` — assembling it all, bootstrap, leader duties, shutdown.
//! - `metrics` — Prometheus metrics.
//! - `audit` — the audit log: one JSON line per applied change, exactly once.
//! - `hot` — the busiest resources, in bounded memory (space-saving top-k).
//! - `log_level` — changing the log filter at run time.
//!
//! ```
//! use fencer_coordinator::{AcquireCmd, Command, LockState, LogCommand, Outcome, ResourceName, RequestId, Holder, LeaseId};
//!
//! let mut state = LockState::new();
//! let acquire = LogCommand {
//!     at_ms: 0,
//!     cmd: Command::Acquire(AcquireCmd {
//!         request_id: RequestId::new("attempt-0001").unwrap(),
//!         resource: ResourceName::new("orders/42").unwrap(),
//!         holder: Holder::new("worker-1").unwrap(),
//!         ttl_ms: 30_000,
//!         wait: false,
//!         lease_id: LeaseId::from_u128(1),
//!         max_waiters: 1024,
//!     }),
//! };
//! // The fencing token is the index of the log entry that granted the lock.
//! match state.apply(17, &acquire).outcome {
//!     Outcome::Granted(g) => assert_eq!(g.token.0, 17),
//!     other => panic!("{other:?}"),
//! }
//! ```

mod api;
mod audit;
mod bootstrap;
mod clock;
mod coalesce;
#[cfg(any(test, feature = "fuzzing"))]
pub mod fuzzing;
#[cfg(test)]
mod golden;
mod hot;
mod leadership;
mod lease_clock;
mod log_level;
mod metrics;
mod network;
mod node;
mod policy;
mod raft;
mod server;
mod service;
mod signing;
mod snapshot_schedule;
mod state_machine;
mod store;
mod tenants;
mod tls;
mod types;
mod waiters;

pub use self::api::{grpc_code, http_status, to_status};
pub use self::audit::{
    AUDIT_DIR, AUDIT_FILE, AuditConfig, AuditLog, AuditOp, AuditOutcome, AuditRecord, DEFAULT_AUDIT_FILE_BYTES,
    DEFAULT_AUDIT_FILES, audit_files, read_audit_file,
};
pub use self::clock::{Clock, Instant};
pub use self::hot::{DEFAULT_HOT_CAPACITY, HOT_HALF_LIFE, HotOrder, HotResource, HotResources};
pub use self::lease_clock::{LeaseClock, Overdue};
pub use self::log_level::{LogControl, LogControlHandle};
pub use self::metrics::{Metrics, OPS, OUTCOMES, SNAPSHOT_REFUSALS};
pub use self::network::{FaultAction, Faults};
pub use self::node::{
    DEFAULT_ELECTION_TIMEOUT, DEFAULT_HEARTBEAT, DEFAULT_REPLICATION_INTERVAL, DEFAULT_SNAPSHOT_CATCHUP_ENTRIES,
    DEFAULT_SNAPSHOT_EVERY, MAX_REQUEST_BYTES, Node, NodeConfig, SINGLE_VOTER_COMMIT_GAP, StartError,
    default_commit_gap,
};
pub use self::policy::Policy;
pub use self::raft::{RaftHandle, TypeConfig};
pub use self::server::ConnectionLimits;
pub use self::service::{
    AcquireRequest, ForceReleased, Granted, Health, LockError, LockService, LockView, MemberView, Released, Renewed,
    StatusView,
};
pub use self::signing::{SIGNING_DIR, SigningKeyError, SigningKeyView, key_set};
pub use self::state_machine::{
    AcquireCmd, AcquireFingerprint, Applied, CancelOutcome, Command, DedupOutcome, DedupRecord, EndReason, EndedGrant,
    EndedLease, Event, Grant, KeyChange, KeyRefusal, LockRecord, LockState, LogCommand, Outcome, Quota, QuotaLimit,
    Rejection, RequestKey, ResourceHash, ResourceState, Reuse, SigningKeyRecord, Waiter, current_signing_key,
};
pub use self::store::{
    ApplyObserver, LEGACY_LOG_FILE, LOG_DIR, LogReader, LogStore, NoObserver, SNAPSHOT_DIR, STATE_FILE, SnapshotBody,
    StateMachineStore, WalOptions,
};
pub use self::tenants::{Authenticator, Caller, Permission, Tenant, Tenants, TenantsError, bearer_token_sha256};
pub use self::tls::{
    CertFiles, CertUse, ConnInfo, DEFAULT_TLS_HANDSHAKE_TIMEOUT, DevCa, DevPki, NodeTls, TlsError, certificate_identity,
};
pub use self::types::{
    AuditText, FencingToken, Holder, InvalidField, LeaseId, MAX_AUDIT_TEXT_LEN, MAX_HOLDER_LEN, MAX_REQUEST_ID_LEN,
    MAX_RESOURCE_LEN, MIN_REQUEST_ID_LEN, NodeId, RequestId, ResourceName,
};
pub use self::waiters::{ParkedCalls, Wake};
