//! The only place the proxy reads time (STYLE habit 7). Monotonic time is
//! tokio's, so tests can pause and advance it; wall time is used only for
//! the timestamps operators read in logs.

use std::time::{SystemTime, UNIX_EPOCH};

pub(crate) use tokio::time::Instant;

/// Monotonic now, for deadlines, quarantine and latency.
pub(crate) fn now() -> Instant {
    Instant::now()
}

/// Wall-clock time as RFC 3339 with milliseconds, for log records.
pub(crate) fn wall_rfc3339() -> String {
    humantime::format_rfc3339_millis(SystemTime::now()).to_string()
}

/// Wall-clock milliseconds since the Unix epoch, for request ids.
pub(crate) fn unix_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}
