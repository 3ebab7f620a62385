//! What a gRPC answer means to a test: its `ErrorInfo` reason, and a status
//! or a client error as a [`history`](crate::history) answer, known or
//! unknown, one rule for every harness.

use fencer_client::ClientError;
use tonic_types::StatusExt;

use crate::history::Answer;

/// The `ErrorInfo` reason of a status ("" when it has none).
pub fn reason(status: &tonic::Status) -> String {
    status.get_error_details().error_info().map(|i| i.reason.clone()).unwrap_or_default()
}

/// A status as a history answer. UNAVAILABLE, UNKNOWN, CANCELLED, INTERNAL
/// and a DEADLINE_EXCEEDED that is not the server's `WAIT_TIMEOUT` (a
/// client-side deadline, a cut connection) leave the outcome unknown:
/// the write may have committed. Anything else is a known refusal.
pub fn answer_of(status: &tonic::Status) -> Answer {
    let reason = reason(status);
    let unknown = match status.code() {
        tonic::Code::Unavailable | tonic::Code::Unknown | tonic::Code::Cancelled | tonic::Code::Internal => true,
        tonic::Code::DeadlineExceeded => reason != "WAIT_TIMEOUT",
        _ => false,
    };
    if unknown {
        Answer::Unavailable { reason: format!("{reason} {}", status.message()) }
    } else {
        Answer::Refused { reason }
    }
}

/// A `fencer_client` error as a history answer: a refusal is known (its
/// reason), anything else leaves the outcome unknown.
pub fn client_answer(e: &ClientError) -> Answer {
    match e {
        ClientError::Refused { reason, .. } => Answer::Refused { reason: reason.as_str().to_string() },
        other => Answer::Unavailable { reason: other.to_string() },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tonic_types::ErrorDetails;

    fn with_reason(code: tonic::Code, reason: &str) -> tonic::Status {
        tonic::Status::with_error_details(
            code,
            "m",
            ErrorDetails::with_error_info(reason, fencer_proto::ERROR_DOMAIN, std::collections::HashMap::new()),
        )
    }

    #[test]
    fn refusals_are_known_and_lost_answers_unknown() {
        assert_eq!(
            answer_of(&with_reason(tonic::Code::Aborted, "LOCK_HELD")),
            Answer::Refused { reason: "LOCK_HELD".into() }
        );
        assert_eq!(
            answer_of(&with_reason(tonic::Code::DeadlineExceeded, "WAIT_TIMEOUT")),
            Answer::Refused { reason: "WAIT_TIMEOUT".into() }
        );
        for s in [
            tonic::Status::deadline_exceeded("client deadline"),
            tonic::Status::unavailable("connection reset"),
            with_reason(tonic::Code::Unavailable, "NO_QUORUM"),
            tonic::Status::internal("h2 protocol error"),
        ] {
            assert!(matches!(answer_of(&s), Answer::Unavailable { .. }), "{s:?}");
        }
        let Answer::Unavailable { reason } = answer_of(&with_reason(tonic::Code::Unavailable, "NO_QUORUM")) else {
            unreachable!()
        };
        assert!(reason.starts_with("NO_QUORUM"), "{reason}");
    }
}
