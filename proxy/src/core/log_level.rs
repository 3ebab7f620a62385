//! Changing the log filter of a running proxy. The process that owns the
//! tracing subscriber (the `fencer` binary, with a `reload` layer) puts a
//! [`LogControlHandle`] in the [`ProxyConfig`](crate::ProxyConfig);
//! `GET`/`PUT /v1/log-level` on the admin API read and replace the filter.

use std::fmt;
use std::sync::Arc;

/// Reads and replaces the process's log filter (tracing `EnvFilter` syntax,
/// e.g. `info,fencer_proxy=debug`).
pub trait LogControl: Send + Sync + 'static {
    /// The filter in force.
    fn current(&self) -> String;
    /// Replaces the filter; a filter that does not parse is refused and the
    /// old one stays.
    fn set(&self, filter: &str) -> Result<(), String>;
}

/// A shared [`LogControl`]; its `Debug` form only says that one is set.
#[derive(Clone)]
pub struct LogControlHandle(pub Arc<dyn LogControl>);

impl fmt::Debug for LogControlHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("LogControlHandle(..)")
    }
}
