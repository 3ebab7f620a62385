//! Client library for fencer (DESIGN §5): take a lock, keep it, know when
//! you lost it, and make every write carry its fencing token.
//!
//! - [`Client`] knows several coordinator endpoints, finds the leader,
//!   follows NOT_LEADER hints and reconnects.
//! - [`Client::acquire`] returns a [`Lease`] that renews itself every ttl/3
//!   (±10 %) and reports [`LeaseState`]: **Held** (work may start),
//!   **Uncertain** (a renewal failed or is late: start nothing new),
//!   **Lost** (final: stop). The local deadline is counted from the *send*
//!   time of the last successful renewal, minus a safety margin.
//! - Unknown outcomes are retried with the same request id, so a retry never
//!   creates a second lease or a second waiter (I7).
//! - Calls in flight at once on one connection share Batch requests, each
//!   still answered on its own ([`Client::with_batching`]).
//! - [`Client::acquire_all`] takes several locks in sorted order within one
//!   timeout (not atomic).
//! - [`StampLayer`] stamps `Fencing-Token` on outgoing HTTP requests and
//!   refuses to send them unless the lease is Held; with
//!   [`Lease::signed_stamp_layer`] it sends the token the coordinator signed
//!   ([`LeaseHandle::signed_token`], DESIGN P7) for proxies that verify signatures.
//!
//! The guide is `docs/client.md` in the repository.
//!
//! # Layout
//! - `client` — [`Client`]: endpoints, leader discovery, one call per operation.
//! - `batch` — the per-connection queue that sends calls made while the
//!   connection is busy as one Batch request ([`Client::with_batching`]).
//! - `acquire` — [`AcquireBuilder`]: retries with a stable request id, the
//!   first deadline, [`AcquireError`].
//! - `lease` — [`Lease`] and [`LeaseHandle`] (the views of a lease, once),
//!   and inside it `state` ([`LeaseState`], [`LostReason`]), `renewal` (the
//!   renewal task and its timing) and `release` (release and
//!   release-on-drop).
//! - `acquire_all` — ordered multi-lock acquisition, [`LeaseSet`].
//! - `stamp` — the tower layer, [`Stamp`], [`PlainToken`] and [`SignedStamp`].
//! - `clock` — the only place time and timing randomness are read.
//! - [`FencingToken`], [`LeaseId`] — fencer-token's, the nouns every fencer
//!   crate shares.
//! - `error` — [`ClientError`] and [`Reason`], decoded from `google.rpc.ErrorInfo`.
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use std::time::Duration;
//! use fencer_client::Client;
//!
//! let client = Client::new(["127.0.0.1:7420"])?;
//! let lease = client.acquire("orders/42").ttl(Duration::from_secs(30)).wait(Duration::from_secs(5)).await?;
//! while lease.is_held() {
//!     // one bounded piece of work, sending lease.token() with every write
//!     # break;
//! }
//! lease.release().await?;
//! # Ok(()) }
//! ```
//!
//! A doc test that runs without a server:
//!
//! ```
//! use fencer_client::{Client, FencingToken, LeaseState, LostReason, Reason};
//!
//! assert!(Client::new(Vec::<String>::new()).is_err());
//! assert_eq!(Reason::parse("LOCK_HELD"), Reason::LockHeld);
//! assert!(LeaseState::Lost(LostReason::DeadlinePassed).is_lost());
//! assert!(!LeaseState::Uncertain.is_held());
//! assert_eq!(FencingToken(42).to_string(), "42");
//! ```

mod acquire;
mod acquire_all;
mod batch;
mod client;
mod clock;
mod error;
mod lease;
mod stamp;

pub use self::acquire::{AcquireBuilder, AcquireError, DEFAULT_RETRY_BUDGET, Grant};
pub use self::acquire_all::{AcquireAll, AcquireAllError, LeaseSet};
pub use self::batch::DEFAULT_BATCHING;
pub use self::client::{Client, ClientTls, DEFAULT_ENDPOINT, default_holder, new_request_id};
pub use self::clock::Instant;
pub use self::error::{ClientError, Reason};
pub use self::lease::{Lease, LeaseHandle, LeaseState, LostReason, ReleaseError, Released};
pub use self::stamp::{
    Claim, FENCING_RESOURCE_HEADER, FENCING_TOKEN_HEADER, PlainToken, SignedStamp, Stamp, StampError, StampLayer,
    Stamped, StampedError, StampedFuture,
};
pub use fencer_proto::v1::{
    AcquireResponse, ForceReleaseResponse, GetLockResponse, ListLocksResponse, ListSigningKeysResponse, NodeStatus,
    ReleaseResponse, RenewResponse, RetireSigningKeyResponse, RotateSigningKeyResponse, SigningKey, StatusResponse,
};
pub use fencer_token::{FencingToken, LeaseId};
