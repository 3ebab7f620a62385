//! The renewal task of a [`Lease`](super::Lease) and its timing (DESIGN §5).
//!
//! - A renewal is due every ttl/3 with ±10 % jitter, counted from the send
//!   time of the last successful one.
//! - The local deadline is the *send* time of the last successful renewal
//!   (or of the granted acquire) + ttl − safety margin — never the time an
//!   answer arrived, which can be arbitrarily later (I6).
//! - Held turns Uncertain when a renewal fails or has not succeeded
//!   `late_after` (half an interval) after it was due; Uncertain turns Held
//!   again on the next success.
//! - Lost is final: at the deadline (checked first whenever the task wakes,
//!   so a task that slept through a pause never renews past it), or when the
//!   server answers NOT_HOLDER or LEASE_EXPIRED.
//!
//! The loop is generic over [`Renewer`] so that its timing is tested with
//! tokio's paused clock and a scripted server.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::sleep_until;
use tokio_util::sync::CancellationToken;

use super::release::release_in_background;
use super::state::{LeaseCore, LeaseState, LostReason};
use crate::client::Client;
use crate::clock::{self, Instant, jitter};
use crate::error::{ClientError, Reason};
use fencer_token::LeaseId;

/// Spread of the renewal interval (±10 %).
const RENEW_JITTER: f64 = 0.1;

/// The timing of one lease, derived from its ttl.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Timing {
    /// Lease length granted by the server.
    pub(crate) ttl: Duration,
    /// Subtracted from every deadline: covers clock-rate differences between
    /// client and leader and the time needed to stop work.
    pub(crate) margin: Duration,
    /// Renewal period before jitter (ttl/3).
    pub(crate) interval: Duration,
    /// How late a renewal may be before the lease turns Uncertain.
    pub(crate) late_after: Duration,
    /// Pause between renewal attempts after a failure.
    pub(crate) retry_pause: Duration,
}

impl Timing {
    /// Default safety margin: a tenth of the ttl.
    pub(crate) fn default_margin(ttl: Duration) -> Duration {
        ttl / 10
    }

    pub(crate) fn new(ttl: Duration, margin: Option<Duration>) -> Self {
        let margin = margin.unwrap_or_else(|| Self::default_margin(ttl)).min(ttl / 2);
        let interval = ttl / 3;
        Self {
            ttl,
            margin,
            interval,
            late_after: interval / 2,
            retry_pause: (ttl / 20).clamp(Duration::from_millis(10), Duration::from_secs(1)),
        }
    }

    /// The local deadline for a renewal (or grant) sent at `sent`.
    pub(crate) fn deadline_from(&self, sent: Instant) -> Instant {
        sent + self.ttl - self.margin
    }

    /// When the renewal after one sent at `sent` is due.
    pub(crate) fn next_due_from(&self, sent: Instant) -> Instant {
        sent + jitter(self.interval, RENEW_JITTER)
    }
}

/// The two calls the renewal task makes.
pub(crate) trait Renewer: Send + Sync + 'static {
    /// One renewal; Ok carries the ttl the server granted.
    fn renew(&self) -> impl Future<Output = Result<Duration, ClientError>> + Send;
    /// Releases the lease without waiting (after the local deadline passed).
    fn release_in_background(&self);
}

/// The real renewer: Renew through the client's leader routing.
pub(crate) struct ClientRenewer {
    client: Client,
    resource: String,
    lease_id: LeaseId,
}

impl ClientRenewer {
    pub(crate) fn new(client: Client, resource: String, lease_id: LeaseId) -> Self {
        Self { client, resource, lease_id }
    }
}

impl Renewer for ClientRenewer {
    async fn renew(&self) -> Result<Duration, ClientError> {
        let r = self.client.renew(&self.resource, &self.lease_id.to_string()).await?;
        Ok(Duration::from_millis(r.ttl_ms))
    }

    fn release_in_background(&self) {
        release_in_background(self.client.clone(), self.resource.clone(), self.lease_id);
    }
}

/// Marks the lease lost at its deadline and gives it back early: releasing
/// a stale lease id never frees a newer holder (I4), and it frees the lock
/// sooner if the server still has it.
fn expire<R: Renewer>(core: &LeaseCore, renewer: &R) {
    if core.lose(LostReason::DeadlinePassed) {
        tracing::warn!(resource = %core.resource, token = %core.token, "lease lost: the local deadline passed without a successful renewal");
        renewer.release_in_background();
    }
}

/// Renews until stopped or lost. Owned by the [`Lease`](super::Lease), which cancels
/// `stop` when it is released or dropped.
pub(crate) async fn run<R: Renewer>(core: Arc<LeaseCore>, renewer: R, stop: CancellationToken) {
    let timing = core.timing;
    loop {
        let times = core.times();
        // The deadline first: after a stall both timers may have fired.
        if clock::now() >= times.deadline {
            return expire(&core, &renewer);
        }
        tokio::select! {
            biased;
            () = stop.cancelled() => return,
            () = sleep_until(times.deadline) => return expire(&core, &renewer),
            () = sleep_until(times.next_due) => {}
        }
        let sent = clock::now();
        let deadline = core.times().deadline;
        if sent >= deadline {
            return expire(&core, &renewer);
        }
        // Late relative to when it was due, not to when this task got to run.
        let late_at = times.next_due + timing.late_after;
        let call = renewer.renew();
        tokio::pin!(call);
        let mut late = false;
        let outcome = loop {
            tokio::select! {
                biased;
                () = stop.cancelled() => return,
                () = sleep_until(deadline) => break None,
                result = &mut call => break Some(result),
                () = sleep_until(late_at), if !late => {
                    late = true;
                    tracing::debug!(resource = %core.resource, "renewal is late; lease uncertain");
                    core.set(LeaseState::Uncertain);
                }
            }
        };
        match outcome {
            None => return expire(&core, &renewer),
            Some(Ok(ttl)) => {
                // Never trust a longer ttl than the lease was granted with.
                let ttl = ttl.min(timing.ttl);
                core.set_times(|t| {
                    t.deadline = t.deadline.max(sent + ttl - timing.margin);
                    t.next_due = timing.next_due_from(sent);
                });
                core.set(LeaseState::Held);
            }
            Some(Err(e)) => match e.reason() {
                Some(Reason::NotHolder) if !e.is_unavailable() => {
                    tracing::warn!(resource = %core.resource, token = %core.token, "lease lost: the server says it is not the holder");
                    core.lose(LostReason::NotHolder);
                    return;
                }
                Some(Reason::LeaseExpired) if !e.is_unavailable() => {
                    tracing::warn!(resource = %core.resource, token = %core.token, "lease lost: the server says it expired");
                    core.lose(LostReason::LeaseExpired);
                    return;
                }
                _ => {
                    tracing::debug!(resource = %core.resource, error = %e, "renewal failed; lease uncertain");
                    core.set(LeaseState::Uncertain);
                    core.set_times(|t| t.next_due = clock::now() + jitter(timing.retry_pause, 0.5));
                }
            },
        }
    }
}

#[cfg(test)]
mod tests {
    //! The renewal rules on tokio's paused clock against a scripted server.

    use std::sync::Mutex;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;
    use crate::lease::test_core as core;

    #[derive(Clone)]
    pub(crate) enum Answer {
        /// Succeeds after this long.
        Ok(Duration),
        /// Fails as unavailable (outcome unknown).
        Unavailable,
        /// Refused with this reason.
        Refused(Reason),
        /// Never answers.
        Hang,
    }

    #[derive(Clone)]
    pub(crate) struct Scripted {
        pub(crate) ttl: Duration,
        pub(crate) calls: Arc<Mutex<Vec<Instant>>>,
        pub(crate) released: Arc<AtomicUsize>,
        pub(crate) script: Arc<dyn Fn(usize) -> Answer + Send + Sync>,
    }

    impl Scripted {
        pub(crate) fn new(ttl: Duration, script: impl Fn(usize) -> Answer + Send + Sync + 'static) -> Self {
            Self { ttl, calls: Default::default(), released: Default::default(), script: Arc::new(script) }
        }

        pub(crate) fn calls(&self) -> Vec<Instant> {
            self.calls.lock().unwrap().clone()
        }
    }

    impl Renewer for Scripted {
        fn renew(&self) -> impl Future<Output = Result<Duration, ClientError>> + Send {
            let n = {
                let mut calls = self.calls.lock().unwrap();
                calls.push(clock::now());
                calls.len() - 1
            };
            let answer = (self.script)(n);
            let ttl = self.ttl;
            async move {
                match answer {
                    Answer::Ok(after) => {
                        tokio::time::sleep(after).await;
                        Ok(ttl)
                    }
                    Answer::Unavailable => Err(ClientError::Unavailable {
                        reason: None,
                        message: "connection refused".into(),
                        metadata: Default::default(),
                    }),
                    Answer::Refused(reason) => Err(ClientError::Refused {
                        code: tonic::Code::FailedPrecondition,
                        reason,
                        message: "refused".into(),
                        metadata: Default::default(),
                    }),
                    Answer::Hang => std::future::pending().await,
                }
            }
        }

        fn release_in_background(&self) {
            self.released.fetch_add(1, Ordering::SeqCst);
        }
    }

    const TTL: Duration = Duration::from_secs(30);

    #[tokio::test(start_paused = true)]
    async fn renews_every_third_of_the_ttl_with_jitter_and_stays_held() {
        let start = clock::now();
        let core = core(TTL, start);
        let server = Scripted::new(TTL, |_| Answer::Ok(Duration::from_millis(5)));
        let stop = CancellationToken::new();
        let task = tokio::spawn(run(core.clone(), server.clone(), stop.clone()));
        let states = core.subscribe();
        tokio::time::sleep(TTL * 10).await;
        assert_eq!(core.check(), LeaseState::Held);
        assert!(!states.has_changed().unwrap(), "the state never left Held");
        let calls = server.calls();
        assert!((27..=34).contains(&calls.len()), "{} renewals in 10 ttls", calls.len());
        // The first renewal comes a third of the ttl after the grant; every
        // next one ttl/3 ±10 % after the *send* of the previous one.
        let mut previous = start;
        for (i, at) in calls.iter().enumerate() {
            let gap = *at - previous;
            let (lo, hi) = if i == 0 { (TTL / 3, TTL / 3) } else { ((TTL / 3).mul_f64(0.9), (TTL / 3).mul_f64(1.1)) };
            assert!(gap >= lo && gap <= hi, "renewal {i} came {gap:?} after the previous one");
            previous = *at;
        }
        // The deadline counts from the last send, not from the answer 5 ms later.
        assert_eq!(core.times().deadline, *calls.last().unwrap() + TTL - TTL / 10);
        stop.cancel();
        task.await.unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn deadline_counts_from_the_send_time_not_the_answer() {
        let start = clock::now();
        let core = core(TTL, start);
        // Every answer takes 4 s (less than late_after, 5 s).
        let server = Scripted::new(TTL, |_| Answer::Ok(Duration::from_secs(4)));
        let stop = CancellationToken::new();
        let _task = tokio::spawn(run(core.clone(), server.clone(), stop.clone()));
        tokio::time::sleep(TTL / 3 + Duration::from_secs(5)).await;
        let sent = server.calls()[0];
        assert_eq!(core.times().deadline, sent + TTL - TTL / 10);
        assert_eq!(core.check(), LeaseState::Held);
        stop.cancel();
    }

    #[tokio::test(start_paused = true)]
    async fn failing_renewals_make_it_uncertain_then_lost_exactly_at_the_deadline() {
        let start = clock::now();
        let core = core(TTL, start);
        let server = Scripted::new(TTL, |n| if n < 2 { Answer::Ok(Duration::ZERO) } else { Answer::Unavailable });
        let _task = tokio::spawn(run(core.clone(), server.clone(), CancellationToken::new()));
        let mut states = core.subscribe();
        states.wait_for(|s| *s == LeaseState::Uncertain).await.unwrap();
        let last_ok_sent = server.calls()[1];
        let deadline = last_ok_sent + TTL - TTL / 10;
        assert_eq!(core.times().deadline, deadline);
        assert!(clock::now() < deadline);
        tokio::time::sleep_until(deadline - Duration::from_millis(1)).await;
        assert_eq!(core.check(), LeaseState::Uncertain, "still uncertain just before the deadline");
        let reason =
            tokio::time::timeout_at(deadline + Duration::from_millis(1), super::super::state::tests_wait_lost(&core))
                .await
                .expect("lost by the deadline");
        assert_eq!(reason, LostReason::DeadlinePassed);
        assert_eq!(server.released.load(Ordering::SeqCst), 1, "an expired lease is given back");
        // Renewals kept being retried until then.
        assert!(server.calls().len() > 10);
    }

    #[tokio::test(start_paused = true)]
    async fn a_hanging_renewal_is_late_then_lost() {
        let start = clock::now();
        let core = core(TTL, start);
        let server = Scripted::new(TTL, |_| Answer::Hang);
        let _task = tokio::spawn(run(core.clone(), server.clone(), CancellationToken::new()));
        let mut states = core.subscribe();
        states.wait_for(|s| *s == LeaseState::Uncertain).await.unwrap();
        // Late = half an interval after it was due.
        assert_eq!(clock::now(), start + TTL / 3 + TTL / 6);
        states.wait_for(|s| s.is_lost()).await.unwrap();
        assert_eq!(clock::now(), start + TTL - TTL / 10);
        assert_eq!(core.check(), LeaseState::Lost(LostReason::DeadlinePassed));
    }

    #[tokio::test(start_paused = true)]
    async fn the_server_saying_not_holder_or_expired_is_lost_at_once() {
        for (reason, lost) in
            [(Reason::NotHolder, LostReason::NotHolder), (Reason::LeaseExpired, LostReason::LeaseExpired)]
        {
            let start = clock::now();
            let core = core(TTL, start);
            let server = Scripted::new(TTL, move |_| Answer::Refused(reason.clone()));
            let task = tokio::spawn(run(core.clone(), server.clone(), CancellationToken::new()));
            task.await.unwrap();
            assert_eq!(clock::now(), start + TTL / 3, "lost at the first renewal");
            assert_eq!(core.check(), LeaseState::Lost(lost));
            assert_eq!(server.calls().len(), 1);
        }
    }

    #[tokio::test(start_paused = true)]
    async fn an_uncertain_lease_recovers_on_the_next_success() {
        let start = clock::now();
        let core = core(TTL, start);
        let server = Scripted::new(TTL, |n| if n == 1 { Answer::Unavailable } else { Answer::Ok(Duration::ZERO) });
        let _task = tokio::spawn(run(core.clone(), server.clone(), CancellationToken::new()));
        let mut states = core.subscribe();
        states.wait_for(|s| *s == LeaseState::Uncertain).await.unwrap();
        states.wait_for(|s| *s == LeaseState::Held).await.unwrap();
        assert_eq!(server.calls().len(), 3);
    }

    #[tokio::test(start_paused = true)]
    async fn the_check_sees_the_deadline_even_if_the_task_never_ran() {
        let start = clock::now();
        let core = core(TTL, start);
        // No renewal task at all, as if the process had been paused.
        assert_eq!(core.check(), LeaseState::Held);
        tokio::time::advance(TTL / 3 + TTL / 6).await;
        assert_eq!(core.check(), LeaseState::Uncertain, "a renewal is late");
        tokio::time::advance(TTL).await;
        assert_eq!(core.check(), LeaseState::Lost(LostReason::DeadlinePassed));
        assert_eq!(core.published(), LeaseState::Held, "nobody published anything");
    }
}
