//! One module per subcommand.

pub(crate) mod audit;
mod client_args;
pub(crate) mod completions;
pub(crate) mod coordinator;
pub(crate) mod dev;
pub(crate) mod exec;
pub(crate) mod keys;
pub(crate) mod lock;
pub(crate) mod log_level;
pub(crate) mod member;
mod node_http;
pub(crate) mod proxy;
pub(crate) mod status;
pub(crate) mod top;

use std::time::Duration;

/// Parses `500ms`, `30s`, `5m`, `1h` (humantime syntax).
pub(crate) fn parse_duration(s: &str) -> Result<Duration, String> {
    humantime::parse_duration(s.trim()).map_err(|e| format!("{s:?} is not a duration like 500ms, 30s or 5m: {e}"))
}

/// Waits for SIGINT or SIGTERM: the one stop signal of every long-running
/// command (`dev`, `coordinator`, `proxy`, `bench`).
pub(crate) async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = match signal(SignalKind::terminate()) {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!(error = %e, "cannot listen for SIGTERM; only Ctrl-C stops the process");
            let _ = tokio::signal::ctrl_c().await;
            return;
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => tracing::info!("SIGINT received; shutting down"),
        _ = term.recv() => tracing::info!("SIGTERM received; shutting down"),
    }
}
