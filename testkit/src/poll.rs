//! Waiting for a condition: poll until it holds, and fail with a message
//! naming it when the bound passes. Never fall through: a test that goes on
//! after a wait that did not succeed asserts on the wrong state, or on
//! nothing.
//!
//! Time is tokio's clock (`tokio::time::Instant`), which also works outside
//! a runtime; under `tokio::time::pause()` the async form advances with the
//! paused clock.

use std::future::Future;
use std::time::Duration;

use tokio::time::Instant;

/// How often [`eventually`] and [`eventually_blocking`] ask.
pub const POLL_EVERY: Duration = Duration::from_millis(20);

/// Polls `f` every [`POLL_EVERY`] until it returns `Some`, and returns that
/// value. Panics naming `what` if it has not within `timeout`.
pub async fn eventually<T, F, Fut>(what: &str, timeout: Duration, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out after {timeout:?} waiting for: {what}");
        tokio::time::sleep(POLL_EVERY).await;
    }
}

/// [`eventually`] for synchronous tests (no runtime): the thread sleeps
/// between polls.
pub fn eventually_blocking<T>(what: &str, timeout: Duration, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out after {timeout:?} waiting for: {what}");
        std::thread::sleep(POLL_EVERY);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[should_panic(expected = "timed out after 50ms waiting for: the impossible")]
    fn a_condition_that_never_holds_fails_naming_it() {
        eventually_blocking("the impossible", Duration::from_millis(50), || None::<()>);
    }

    #[tokio::test]
    #[should_panic(expected = "waiting for: the impossible")]
    async fn the_async_form_fails_too() {
        eventually("the impossible", Duration::from_millis(50), || async { None::<()> }).await;
    }

    #[test]
    fn the_value_that_ended_the_wait_is_returned() {
        let mut n = 0;
        let got = eventually_blocking("n reaches 3", Duration::from_secs(5), || {
            n += 1;
            (n == 3).then_some(n * 10)
        });
        assert_eq!(got, 30);
    }
}
