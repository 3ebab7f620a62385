//! Exit codes of the `fencer` command. They do not overlap, so scripts can
//! tell "not acquired" from "the cluster is unavailable" from a usage error.
//!
//! | code | meaning |
//! |---|---|
//! | 0 | success |
//! | 1 | other error (internal, I/O, unexpected answer) |
//! | 2 | usage error (bad flags; printed by the argument parser) |
//! | 3 | not acquired: LOCK_HELD, WAIT_TIMEOUT, TOO_MANY_WAITERS |
//! | 4 | not the holder: NOT_HOLDER, LEASE_EXPIRED |
//! | 5 | unavailable or outcome unknown: no leader, NO_QUORUM, timeouts |
//! | 6 | refused as invalid: INVALID_ARGUMENT, REQUEST_ID_REUSED |

use std::process::ExitCode;

use fencer_client::{ClientError, Reason};

/// Any other failure.
pub(crate) const ERROR: u8 = 1;
/// The lock was not acquired.
pub(crate) const NOT_ACQUIRED: u8 = 3;
/// The lease is not (or no longer) the holder.
pub(crate) const NOT_HOLDER: u8 = 4;
/// The cluster could not answer, or the outcome is unknown.
pub(crate) const UNAVAILABLE: u8 = 5;
/// The request was refused as invalid.
pub(crate) const INVALID: u8 = 6;

/// The exit code for a client error.
pub(crate) fn for_error(e: &ClientError) -> ExitCode {
    let code = match e {
        ClientError::Unavailable { .. } => UNAVAILABLE,
        ClientError::Config(_) => INVALID,
        ClientError::Refused { reason, .. } => match reason {
            Reason::LockHeld | Reason::WaitTimeout | Reason::TooManyWaiters => NOT_ACQUIRED,
            Reason::NotHolder | Reason::LeaseExpired => NOT_HOLDER,
            Reason::InvalidArgument | Reason::RequestIdReused => INVALID,
            Reason::NotLeader
            | Reason::NoQuorum
            | Reason::OutcomeUnknown
            | Reason::LeaderChanged
            | Reason::ShuttingDown => UNAVAILABLE,
            Reason::Other(_) => ERROR,
        },
    };
    ExitCode::from(code)
}
