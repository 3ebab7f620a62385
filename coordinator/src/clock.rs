//! The only place the coordinator reads time (STYLE.md habit 7).
//!
//! Monotonic time comes from `tokio::time::Instant`, so tests can pause and
//! advance it; wall-clock time is used only for audit records, dedup retention
//! and the informative `expires_at_unix_ms`, never for lease safety.

use std::sync::atomic::{AtomicU64, Ordering};
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

/// When something last happened, lock-free (touched on a hot path: every
/// append from the leader). Counted in microseconds from when it was made.
#[derive(Debug)]
pub(crate) struct LastSeen {
    base: Instant,
    /// Microseconds after `base` + 1; 0: never.
    at_us: AtomicU64,
}

impl LastSeen {
    pub(crate) fn never() -> Self {
        Self { base: Instant::now(), at_us: AtomicU64::new(0) }
    }

    /// It happened now.
    pub(crate) fn touch(&self) {
        let us = u64::try_from(self.base.elapsed().as_micros()).unwrap_or(u64::MAX - 1);
        self.at_us.fetch_max(us.saturating_add(1), Ordering::Relaxed);
    }

    /// How long ago it last happened; `None`: never.
    pub(crate) fn age(&self) -> Option<Duration> {
        match self.at_us.load(Ordering::Relaxed) {
            0 => None,
            at => Some(self.base.elapsed().saturating_sub(Duration::from_micros(at - 1))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn last_seen_counts_from_the_latest_touch() {
        let seen = LastSeen::never();
        assert_eq!(seen.age(), None, "never touched");
        tokio::time::advance(Duration::from_millis(50)).await;
        seen.touch();
        assert_eq!(seen.age(), Some(Duration::ZERO));
        tokio::time::advance(Duration::from_millis(300)).await;
        assert_eq!(seen.age(), Some(Duration::from_millis(300)));
        seen.touch();
        tokio::time::advance(Duration::from_millis(7)).await;
        assert_eq!(seen.age(), Some(Duration::from_millis(7)));
    }
}
