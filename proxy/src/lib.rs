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
//! One fence core, two front ends (DESIGN §4a):
//! - `core`: the protocol-neutral part: the fence (P1–P3, P8; G4–G6), the
//!   per-resource state with its fair guard and quarantine, the epoch store
//!   and rejection log, the signed-token check (P7), the one accept loop
//!   (connection limit, first-byte timeout, owned connection tasks), TLS,
//!   the admin API and its client, metrics.
//! - `http`: the HTTP front end: routes (P5, P6), the tower layer stack,
//!   forwarding, problem+json refusals.
//! - `postgres`: the PostgreSQL front end (G1–G10): the wire protocol
//!   relayed message by message, token declarations, transactions as the
//!   unit in flight, older backends ended through an admin connection.
//! - `config`: `proxy.toml` (both protocols) with every limit and timeout;
//!   it builds no runtime object.
//! - `server`: startup ([`start`]), [`check_files`], shutdown.
//! - `fuzzing` (feature `fuzzing`): the checks the cargo-fuzz targets run.
//! - `testing` (feature `test-support`): test upstreams and clients.
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

mod config;
mod core;
#[cfg(any(test, feature = "fuzzing"))]
pub mod fuzzing;
mod http;
mod postgres;
mod server;
#[cfg(any(test, feature = "test-support"))]
pub mod testing;

pub use self::{
    config::{
        ConfigError, DEFAULT_ADMIN_ADDR, DEFAULT_CLOCK_SKEW, DEFAULT_MAX_EPOCH_JUMP, Frontend, Limits, ListenerTls,
        ProxyConfig, SigningConfig, Timeouts,
    },
    core::{
        admin::{
            ADMIN_TOKEN_FILE_ENV, AdminClient, AdminClientError, AdminTokenError, ClearIndeterminateRequest,
            ClearIndeterminateResponse, DEFAULT_PAGE, MAX_ADMIN_BODY_BYTES, MAX_ADMIN_HEAD_BYTES, MAX_ADMIN_HEADERS,
            MAX_ADMIN_TOKEN_BYTES, MAX_OPERATOR_TEXT_BYTES, MAX_PAGE, MIN_ADMIN_TOKEN_BYTES, RaiseEpochRequest,
            ResourcesPage, admin_token_from_env,
        },
        epoch_store::{
            AUDIT_LOG_FILE, EpochStore, OpenError, REJECTION_LOG_FILE, REJECTION_QUEUE_MAX, STORE_FILE, StoreError,
            StoreSnapshot,
        },
        log_level::{LogControl, LogControlHandle},
        names::{FencingToken, MAX_RESOURCE_NAME_BYTES, ResourceName, ResourceNameError, TokenParseError},
        rejections::{PROBLEM_TYPE_PREFIX, RejectReason, RejectionRecord, RejectionsPage},
        signing::{KeyReloader, KeysError, KeysLoaded},
        state::{IndeterminateStatus, ResourceStatus},
        tls::{TlsError, certificate_identity, load_certs, load_key},
    },
    http::{
        HttpConfig, SimpleConfig, UpstreamTls,
        body::{BoxError, ProxyBody},
        fence::{Fence, FenceLayer},
        forward::Forward,
        routes::{PatternError, Route, RouteKind, Router},
    },
    postgres::{
        PostgresStartError,
        config::{
            DEFAULT_DRAIN_TIMEOUT, PgAddress, PgAdmin, PgResource, PgSecret, PostgresConfig, PostgresSimpleConfig,
        },
    },
    server::{ProxyHandle, StartError, check_files, start, start_with_shutdown},
};
