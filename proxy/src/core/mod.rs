//! The protocol-neutral fence core, shared by the HTTP and the PostgreSQL
//! front ends (DESIGN §4, §4a: "the fence core is shared; only the front end
//! differs").
//!
//! - `fence`: [`FenceCore`](fence::FenceCore): admits a token for a resource
//!   under its fair guard (P1–P3, P8), persists a raise before anything is
//!   forwarded (P2/G6), and records refusals in the rejection log.
//! - `state`: per-resource epoch, the fair shared/exclusive guard, the
//!   in-flight count and the indeterminate marker with its quarantine (P4/G7).
//! - `epoch_store`: the redb store (P2, P10) and the bounded rejection table.
//! - `signing`: the token check before the fence: plain or signed, verified
//!   against the reloadable key ring (P7).
//! - `listener`: the one accept loop: connection limit (refusals logged and
//!   counted), first-byte timeout, owned connection tasks, graceful shutdown.
//! - `tls`: rustls configs, PEM loading, certificate identities.
//! - `admin`: the admin API (both protocols), its errors and its client.
//! - `names`, `rejections`, `metrics`, `clock`, `log_level`.

pub(crate) mod admin;
pub(crate) mod clock;
pub(crate) mod epoch_store;
pub(crate) mod fence;
pub(crate) mod listener;
pub(crate) mod log_level;
pub(crate) mod metrics;
pub(crate) mod names;
pub(crate) mod rejections;
pub(crate) mod signing;
pub(crate) mod state;
pub(crate) mod tls;
