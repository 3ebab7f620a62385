//! fencer-proxy: a sidecar that fences writes at a database's boundary.
//!
//! The proxy sits in front of one HTTP service (InfluxDB, an object store,
//! any API that cannot check fencing tokens itself). For each lock resource
//! it keeps, durably in redb, the epoch E: the highest fencing token it has
//! accepted. A write carrying a token below E is refused with 409, so a
//! client that lost its lock cannot change the data any more; a higher token
//! waits for older writes in flight, is persisted, then forwarded. The rules
//! are P1–P10 in DESIGN §4; `docs/proxy.md` explains them for operators.
//!
//! # Layout
//! - `config`: `proxy.toml` and the flag form, every limit and timeout.
//! - `routes`: route classification: read allow-list (P5), resource (P6).
//! - `names`: [`ResourceName`] and [`FencingToken`].
//! - `signing`: the token check before the fence: plain or signed, verified
//!   against the reloadable key ring (P7).
//! - `fence`: the tower layer that checks tokens (P1–P4, P8).
//! - `state`: per-resource epoch, fair guard, in-flight count, indeterminate.
//! - `epoch_store`: the redb store (P2, P10) and the bounded rejection table.
//! - `forward`: the pooled upstream client (plain or TLS) and its timeouts.
//! - `body`: streaming body wrappers (idle timeout, guard until the end).
//! - `server`: startup, the layer stack, graceful shutdown.
//! - `listener`: client connections: the connection limit, the TLS
//!   handshake and the mTLS caller identity.
//! - `tls`: rustls configs for the listener and the upstream, PEM loading.
//! - `fuzzing` (feature `fuzzing`): the checks the cargo-fuzz targets run.
//! - `admin`, `admin_client`: the admin API and its client.
//! - `problem`: the one place refusals become HTTP statuses.
//! - `metrics`, `rejections`, `clock`.
//! - `log_level`: changing the log filter at run time.
//!
//! # Example
//! ```
//! use fencer_proxy::{EpochStore, ResourceName};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let dir = tempfile::tempdir()?;
//! // P10: a new store needs a floor.
//! assert!(EpochStore::open(dir.path(), None, 100).is_err());
//! let (store, snapshot) = EpochStore::open(dir.path(), Some(10), 100)?;
//! assert_eq!(snapshot.floor, 10);
//! let orders = ResourceName::new("db/orders")?;
//! // P2: durable (immediate commit) when `raise` returns.
//! assert_eq!(store.raise(&orders, 42).await?, 42);
//! // P8: never lowered.
//! assert_eq!(store.raise(&orders, 41).await?, 42);
//! store.close(true).await;
//! # Ok(())
//! # }
//! ```

mod admin;
mod admin_client;
mod body;
mod clock;
mod config;
mod epoch_store;
mod fence;
mod forward;
#[cfg(any(test, feature = "fuzzing"))]
pub mod fuzzing;
mod listener;
mod log_level;
mod metrics;
mod names;
#[allow(dead_code)] // until the PostgreSQL front end (issue 14) uses it
mod postgres;
mod problem;
mod rejections;
mod routes;
mod server;
mod signing;
mod state;
#[cfg(any(test, feature = "test-support"))]
pub mod testing;
mod tls;

pub use self::{
    admin::{
        ClearIndeterminateRequest, ClearIndeterminateResponse, DEFAULT_PAGE, MAX_PAGE, RaiseEpochRequest, ResourcesPage,
    },
    admin_client::{AdminClient, AdminClientError},
    body::{BoxError, ProxyBody},
    config::{
        ConfigError, DEFAULT_ADMIN_ADDR, DEFAULT_CLOCK_SKEW, DEFAULT_MAX_EPOCH_JUMP, Limits, ListenerTls, ProxyConfig,
        SigningConfig, SimpleConfig, Timeouts, UpstreamTls,
    },
    epoch_store::{
        AUDIT_LOG_FILE, EpochStore, OpenError, REJECTION_LOG_FILE, REJECTION_QUEUE_MAX, STORE_FILE, StoreError,
        StoreSnapshot,
    },
    fence::{Fence, FenceLayer},
    forward::Forward,
    log_level::{LogControl, LogControlHandle},
    names::{FencingToken, MAX_RESOURCE_NAME_BYTES, ResourceName, ResourceNameError, TokenParseError},
    problem::PROBLEM_TYPE_PREFIX,
    rejections::{RejectReason, RejectionRecord, RejectionsPage},
    routes::{PatternError, Route, RouteKind, Router},
    server::{ProxyHandle, StartError, start, start_with_shutdown},
    signing::{KeyReloader, KeysError, KeysLoaded},
    state::{IndeterminateStatus, ResourceStatus},
    tls::{TlsError, certificate_identity, load_certs, load_key},
};
