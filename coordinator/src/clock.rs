//! The only place the coordinator reads time (STYLE.md habit 7).
//!
//! Monotonic time comes from `tokio::time::Instant`, so tests can pause and
//! advance it; wall-clock time is used only for audit records, dedup retention
//! and the informative `expires_at_unix_ms`, never for lease safety.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Monotonic instant used for lease deadlines.
pub type Instant = tokio::time::Instant;

/// A handle to the node's clocks.
#[derive(Debug, Clone, Copy, Default)]
pub struct Clock;

impl Clock {
    /// Monotonic now.
    pub fn now(&self) -> Instant {
        Instant::now()
    }

    /// Wall-clock milliseconds since the Unix epoch (0 if the clock is before it).
    pub fn wall_ms(&self) -> u64 {
        SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
    }

    /// The wall-clock estimate of a monotonic instant, in Unix milliseconds.
    pub fn to_wall_ms(&self, at: Instant) -> u64 {
        let now = self.now();
        let wall = self.wall_ms();
        if at >= now {
            wall.saturating_add((at - now).as_millis() as u64)
        } else {
            wall.saturating_sub((now - at).as_millis() as u64)
        }
    }

    /// Milliseconds until `at`, 0 if it has passed.
    pub fn millis_until(&self, at: Instant) -> u64 {
        at.saturating_duration_since(self.now()).as_millis() as u64
    }

    /// `now + d`.
    pub fn after(&self, d: Duration) -> Instant {
        self.now() + d
    }
}
