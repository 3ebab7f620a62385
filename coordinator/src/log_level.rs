//! Changing the log filter of a running node. The process that owns the
//! tracing subscriber (the `fencer` binary, with a `reload` layer) hands the
//! node a [`LogControl`]; `GET`/`PUT /v1/admin/log-level` read and replace
//! the filter. A library embedding without one answers 501.

use std::sync::Arc;

/// Reads and replaces the process's log filter (tracing `EnvFilter` syntax,
/// e.g. `info,fencer_coordinator=debug`).
pub trait LogControl: Send + Sync + 'static {
    /// The filter in force.
    fn current(&self) -> String;
    /// Replaces the filter; a filter that does not parse is refused and the
    /// old one stays.
    fn set(&self, filter: &str) -> Result<(), String>;
}

/// A shared [`LogControl`].
pub type LogControlHandle = Arc<dyn LogControl>;
