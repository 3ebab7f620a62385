//! Client library for fencer (DESIGN §5).
//!
//! This is the connection layer: a [`Client`] that knows several coordinator
//! endpoints, finds the leader, follows NOT_LEADER hints, reconnects, and
//! turns statuses into a typed [`ClientError`] that keeps "the server refused"
//! apart from "the outcome is unknown".
//!
//! # Layout
//! - `client` — [`Client`]: endpoints, leader discovery, one call per operation.
//! - `error` — [`ClientError`] and [`Reason`], decoded from `google.rpc.ErrorInfo`.
//!
//! ```no_run
//! # async fn demo() -> Result<(), fencer_client::ClientError> {
//! use fencer_client::{AcquireOptions, Client};
//!
//! let client = Client::new(["127.0.0.1:7420"])?;
//! let lease = client.acquire(AcquireOptions::new("orders/42")).await?;
//! println!("token {}", lease.fencing_token);
//! client.release("orders/42", &lease.lease_id).await?;
//! # Ok(()) }
//! ```
//!
//! A doc test that runs without a server:
//!
//! ```
//! use fencer_client::{Client, Reason};
//!
//! assert!(Client::new(Vec::<String>::new()).is_err());
//! assert_eq!(Reason::parse("LOCK_HELD"), Reason::LockHeld);
//! ```

mod client;
mod error;

pub use self::client::{AcquireOptions, Client, DEFAULT_ENDPOINT, new_request_id};
pub use self::error::{ClientError, Reason};
pub use fencer_proto::v1::{
    AcquireResponse, ForceReleaseResponse, GetLockResponse, ListLocksResponse, NodeStatus, ReleaseResponse,
    RenewResponse, StatusResponse,
};
