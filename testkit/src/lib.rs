//! The one test kit of the fencer workspace (a dev-dependency of every
//! crate's tests, never published): the fixtures that the in-process tests,
//! the process-level tests, the fault runs and `fencer bench` share, each in
//! one place instead of a copy per test folder.
//!
//! Two rules hold throughout:
//! - **A wait fails loudly.** Every poll ([`eventually`], [`wait_http`],
//!   [`node::start`], [`ProcCluster::settled`], …) panics with what it
//!   waited for and what it saw when its bound passes; none falls through.
//! - **Processes are stopped by their PID.** A [`Proc`] is killed when it is
//!   dropped, never by name (no `pkill`), and only loopback is a target.
//!
//! # Layout
//! Always built (std and tokio only):
//! - [`poll`] — [`eventually`] and [`eventually_blocking`].
//! - [`net`] — free loopback ports and addresses, spread over 127.0.0.0/8.
//! - [`process`] — [`Proc`], the child-process guard; the `fencer` binary
//!   under test ([`fencer_bin`], [`spawn_fencer`], [`run`], [`run_json`],
//!   [`spawn_dev`]).
//! - [`http`] — a minimal HTTP/1.1 GET ([`http_get`], [`http_get_blocking`])
//!   and [`wait_http`] for a process to answer.
//! - [`history`] — the operation history of a run and one checker per
//!   invariant (I1–I4, I7), with the report that shows each violation.
//! - [`metrics`] — a parser of the Prometheus text exposition.
//! - [`external`] — servers the kit does not ship ([`external::require`]:
//!   a loud `SKIPPED` when absent, a failure when `CI=true`), and
//!   [`influxdb`], a throwaway InfluxDB 1.x server.
//!
//! With the default feature `fixtures` (fencer's own crates):
//! - [`node`] — one in-process coordinator node with fast timings, started
//!   and waited on until it leads with its state applied.
//! - [`cluster`] — the in-process cluster harness with named faults
//!   (`isolate`, `cut`, `drop_one_way`, `delay`, `drop_response_after_commit`,
//!   `crash`, `restart`, `heal`) and replica agreement.
//! - [`proc_cluster`] — a cluster of real `fencer coordinator` processes,
//!   optionally each behind a [`relay`] that can lose raft messages by
//!   direction and acquire answers after commit.
//! - [`fault`] — the lost-answer layer between a client and one node.
//! - [`grpc`] — a status's reason, and a status or client error as a
//!   history answer.
//! - [`proxy_config`] — the proxy's TOML configuration, built.
//!
//! With the feature `browser` (fantoccini):
//! - [`browser`] — a headless Chromium driven through chromedriver, the
//!   network blocked but for loopback, for the operator console's tests.
//!
//! With the feature `postgres` (tokio-postgres):
//! - [`postgres`] — a throwaway PostgreSQL server with the roles the
//!   PostgreSQL sidecar's tests use, and client helpers.
//!
//! # Adding a fixture
//! A new fixture (a throwaway PostgreSQL server, a headless browser) is a
//! module of its own beside [`influxdb`]: it starts its server on loopback
//! as a [`Proc`] with its data in a temporary dir, waits with a bound that
//! fails loudly, and calls [`external::require`] when the server's binary
//! is not installed. A fixture that needs a heavy dependency puts it behind
//! a feature of its own, so crates that do not use it do not build it.
//!
//! ```
//! use std::time::Duration;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let mut tries = 0;
//! let n = fencer_testkit::eventually("the third try", Duration::from_secs(5), || {
//!     tries += 1;
//!     let now = tries;
//!     async move { (now == 3).then_some(now) }
//! })
//! .await;
//! assert_eq!(n, 3);
//! # }
//! ```

#[cfg(feature = "browser")]
pub mod browser;
pub mod external;
pub mod history;
pub mod http;
pub mod influxdb;
pub mod metrics;
pub mod net;
pub mod poll;
#[cfg(feature = "postgres")]
pub mod postgres;
pub mod process;

#[cfg(feature = "fixtures")]
pub mod cluster;
#[cfg(feature = "fixtures")]
pub mod fault;
#[cfg(feature = "fixtures")]
pub mod grpc;
#[cfg(feature = "fixtures")]
pub mod log;
#[cfg(feature = "fixtures")]
pub mod node;
#[cfg(feature = "fixtures")]
pub mod proc_cluster;
#[cfg(feature = "fixtures")]
pub mod proxy_config;
#[cfg(feature = "fixtures")]
pub mod relay;

pub use self::http::{http_get, http_get_blocking, spawn_http_proxy, wait_http};
pub use self::net::{free_addr, free_port, free_ports};
pub use self::poll::{eventually, eventually_blocking};
pub use self::process::{
    Proc, Signal, fencer_bin, run, run_fencer, run_json, signal, signal_group, spawn_dev, spawn_fencer, wait_ready,
};

#[cfg(feature = "fixtures")]
pub use self::{cluster::Cluster, proc_cluster::ProcCluster, proxy_config::ProxyConfigBuilder};
