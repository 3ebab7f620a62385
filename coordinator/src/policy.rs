//! Request policy: every bound a caller can hit, in one place (DESIGN §2).

use std::time::Duration;

use crate::types::InvalidField;

/// Bounds and defaults applied to lock requests. Every limit is explicit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Policy {
    /// Lease length when the request gives none.
    pub default_ttl: Duration,
    /// Shortest lease accepted; at least 1.5 × the election timeout.
    pub min_ttl: Duration,
    /// Longest lease accepted.
    pub max_ttl: Duration,
    /// Longest wait in a queue.
    pub max_wait: Duration,
    /// Queue length per resource; further waiters get TOO_MANY_WAITERS.
    pub max_waiters_per_resource: u32,
    /// Queued requests over all resources on this cluster.
    pub max_waiters_total: u64,
    /// How long request ids (I7) and ended-lease records are remembered.
    pub dedup_retention: Duration,
    /// How long a write may wait for its commit before the answer is
    /// "outcome unknown" (UNAVAILABLE).
    pub write_timeout: Duration,
    /// How long a queue slot whose parked call was lost (leader change) waits
    /// to be reclaimed by a retry before it is cancelled.
    pub unclaimed_slot_grace: Duration,
    /// Largest ListLocks page.
    pub max_page_size: u32,
    /// Write every renewal as a raft entry (each node then applies it and
    /// its audit log records it). Off: a renewal is confirmed by a quorum
    /// round on the leader without an entry (DESIGN §3.2), a third less log
    /// traffic at the seed mix.
    pub renewals_in_log: bool,
}

impl Policy {
    /// The defaults of DESIGN §2 for a given election timeout.
    pub fn for_election_timeout(election_timeout: Duration) -> Self {
        Self {
            default_ttl: Duration::from_secs(30),
            min_ttl: (election_timeout * 3 / 2).max(Duration::from_millis(500)),
            max_ttl: Duration::from_secs(600),
            max_wait: Duration::from_secs(300),
            max_waiters_per_resource: 1024,
            max_waiters_total: 100_000,
            dedup_retention: Duration::from_secs(120),
            write_timeout: Duration::from_secs(5),
            unclaimed_slot_grace: Duration::from_secs(10),
            max_page_size: 1000,
            renewals_in_log: false,
        }
    }

    /// The ttl to use for a request, or why it is refused (never clamped):
    /// none asked for → the default; an explicit value, 0 included, must be
    /// within the bounds.
    pub fn ttl(&self, requested_ms: Option<u64>) -> Result<Duration, InvalidField> {
        let Some(requested_ms) = requested_ms else {
            return Ok(self.default_ttl);
        };
        let (min, max) = (self.min_ttl.as_millis() as u64, self.max_ttl.as_millis() as u64);
        if requested_ms < min || requested_ms > max {
            return Err(InvalidField::Ttl { value: requested_ms, min, max });
        }
        Ok(Duration::from_millis(requested_ms))
    }

    /// The wait to use for a request, or why it is refused.
    pub fn wait(&self, requested_ms: u64) -> Result<Duration, InvalidField> {
        let max = self.max_wait.as_millis() as u64;
        if requested_ms > max {
            return Err(InvalidField::WaitTimeout { value: requested_ms, max });
        }
        Ok(Duration::from_millis(requested_ms))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ttl_outside_bounds_is_refused_not_clamped() {
        let p = Policy::for_election_timeout(Duration::from_secs(2));
        assert_eq!(p.min_ttl, Duration::from_secs(3));
        assert_eq!(p.ttl(None).unwrap(), Duration::from_secs(30), "none asked for: the default");
        assert!(
            matches!(p.ttl(Some(0)), Err(InvalidField::Ttl { value: 0, min: 3000, max: 600_000 })),
            "an explicit 0 is refused, not replaced by the default"
        );
        assert!(matches!(p.ttl(Some(2999)), Err(InvalidField::Ttl { value: 2999, min: 3000, max: 600_000 })));
        assert!(p.ttl(Some(600_001)).is_err());
        assert_eq!(p.ttl(Some(600_000)).unwrap(), Duration::from_secs(600), "the maximum itself");
        assert_eq!(p.ttl(Some(3000)).unwrap(), Duration::from_secs(3));
        assert_eq!(p.wait(300_000).unwrap(), Duration::from_secs(300), "the maximum itself");
        assert!(p.wait(300_001).is_err());
        assert_eq!(p.wait(0).unwrap(), Duration::ZERO);
    }
}
