//! The only place the client reads time or draws randomness for timing
//! (STYLE habit 7). Time is tokio's, so tests can pause and advance it.

use std::time::Duration;

pub use tokio::time::Instant;

/// Now, on the monotonic clock every lease deadline is measured on.
pub(crate) fn now() -> Instant {
    Instant::now()
}

/// A uniformly random fraction in `[0, 1)` from the OS CSPRNG (0.5 if it fails:
/// jitter only spreads load, it is never needed for safety).
pub(crate) fn random_fraction() -> f64 {
    let mut bytes = [0u8; 8];
    if getrandom::fill(&mut bytes).is_err() {
        return 0.5;
    }
    (u64::from_le_bytes(bytes) >> 11) as f64 / (1u64 << 53) as f64
}

/// `d` scaled by a random factor in `[1 − spread, 1 + spread)`.
pub(crate) fn jitter(d: Duration, spread: f64) -> Duration {
    d.mul_f64(1.0 - spread + 2.0 * spread * random_fraction())
}

/// Exponential backoff with full jitter: a random pause in `[base/2, cap]`
/// growing with `attempt` (1, 2, …).
pub(crate) fn backoff(attempt: u32, base: Duration, cap: Duration) -> Duration {
    let ceiling = base.saturating_mul(1u32 << attempt.saturating_sub(1).min(16)).min(cap);
    let floor = (base / 2).min(ceiling);
    floor + (ceiling - floor).mul_f64(random_fraction())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jitter_stays_within_its_spread() {
        for _ in 0..1000 {
            let d = jitter(Duration::from_millis(1000), 0.1);
            assert!(d >= Duration::from_millis(900) && d < Duration::from_millis(1100), "{d:?}");
        }
    }

    #[test]
    fn backoff_grows_and_is_capped() {
        let (base, cap) = (Duration::from_millis(50), Duration::from_secs(2));
        for attempt in 1..40 {
            let d = backoff(attempt, base, cap);
            assert!(d >= base / 2 && d <= cap, "attempt {attempt}: {d:?}");
        }
        assert!(backoff(1, base, cap) <= base);
    }
}
