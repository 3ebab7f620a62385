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
//! | 141 | stdout was a closed pipe (`fencer audit … \| head -1`): nothing more was printed, quietly, as a Unix tool killed by SIGPIPE (128 + 13) |
//!
//! `fencer exec` passes its command's status through (0–255, or 128 + N
//! when the command was killed by signal N), so its own outcomes live in a
//! reserved range that ordinary programs do not use: **200 + the code above**
//! for the same failure, plus 207.
//!
//! | code | `fencer exec` |
//! |---|---|
//! | 201 | other fencer error; the command may not have run |
//! | 202 | usage error; nothing ran |
//! | 203 | not acquired; the command did not run |
//! | 204 | the lock was lost (or in doubt) while the command ran, and fencer stopped it |
//! | 205 | unavailable or outcome unknown while acquiring; the command did not run |
//! | 206 | refused as invalid (resource name, ttl); the command did not run |
//! | 207 | the command could not be started (not found, not executable) |
//!
//! A command that itself exits with 201–207 cannot be told apart from these;
//! fencer also logs its own outcome on stderr.

use std::process::ExitCode;

use fencer_client::{ClientError, Reason};

/// Any other failure.
pub(crate) const ERROR: u8 = 1;
/// Bad flags (clap's own code).
pub(crate) const USAGE: u8 = 2;
/// The lock was not acquired.
pub(crate) const NOT_ACQUIRED: u8 = 3;
/// The lease is not (or no longer) the holder.
pub(crate) const NOT_HOLDER: u8 = 4;
/// The cluster could not answer, or the outcome is unknown.
pub(crate) const UNAVAILABLE: u8 = 5;
/// The request was refused as invalid.
pub(crate) const INVALID: u8 = 6;
/// Stdout is a closed pipe: 128 + SIGPIPE, as a Unix tool ends then.
pub(crate) const CLOSED_PIPE: u8 = 141;

/// `fencer exec`'s own outcomes: 200 + the code of the same failure.
pub(crate) mod exec {
    /// Added to the other commands' codes.
    pub(crate) const OFFSET: u8 = 200;
    /// Any other failure.
    pub(crate) const ERROR: u8 = OFFSET + super::ERROR;
    /// Bad flags.
    pub(crate) const USAGE: u8 = OFFSET + super::USAGE;
    /// The lock was lost (or in doubt) while the command ran; it was stopped.
    pub(crate) const LOCK_LOST: u8 = OFFSET + super::NOT_HOLDER;
    /// The command could not be started.
    pub(crate) const CANNOT_START: u8 = OFFSET + 7;
}

/// The code of a client error, for every command but `exec`.
pub(crate) fn code_for(e: &ClientError) -> u8 {
    match e {
        ClientError::Unavailable { .. } => UNAVAILABLE,
        ClientError::Config(_) => INVALID,
        ClientError::Refused { reason, .. } => match reason {
            Reason::LockHeld | Reason::WaitTimeout | Reason::TooManyWaiters => NOT_ACQUIRED,
            Reason::NotHolder | Reason::LeaseExpired | Reason::LeaseEnded => NOT_HOLDER,
            Reason::InvalidArgument | Reason::RequestIdReused => INVALID,
            Reason::Other(r) if r == "UNKNOWN_SIGNING_KEY" || r == "SIGNING_KEY_REFUSED" => INVALID,
            Reason::NotLeader
            | Reason::NoQuorum
            | Reason::OutcomeUnknown
            | Reason::LeaderChanged
            | Reason::ShuttingDown => UNAVAILABLE,
            Reason::Unauthenticated | Reason::PermissionDenied | Reason::TenantLimit | Reason::Other(_) => ERROR,
        },
    }
}

/// The exit code for a client error.
pub(crate) fn for_error(e: &ClientError) -> ExitCode {
    ExitCode::from(code_for(e))
}

/// `fencer exec`'s code for a client error before the command ran.
pub(crate) fn exec_for_error(e: &ClientError) -> ExitCode {
    ExitCode::from(exec::OFFSET + code_for(e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exec_codes_do_not_overlap_signal_codes_or_each_other() {
        let ours = [exec::ERROR, exec::USAGE, 203, exec::LOCK_LOST, 205, 206, exec::CANNOT_START];
        // Shells report a death by signal N as 128 + N, N ≤ 64.
        assert!(ours.iter().all(|c| *c > 128 + 64));
        let mut sorted = ours.to_vec();
        sorted.dedup();
        assert_eq!(sorted.len(), ours.len());
        let refused = |reason| ClientError::Refused {
            code: tonic::Code::Aborted,
            reason,
            message: String::new(),
            metadata: Default::default(),
        };
        assert_eq!(exec_for_error(&refused(Reason::LockHeld)), ExitCode::from(203));
        assert_eq!(exec_for_error(&refused(Reason::InvalidArgument)), ExitCode::from(206));
    }
}
