//! The one mapping from [`LockError`] to a gRPC status and to an HTTP answer
//! (STYLE.md habit 4). Reasons travel as a `google.rpc.ErrorInfo` detail;
//! NOT_LEADER also carries the leader's address in ErrorInfo metadata and in
//! the `fencer-leader-addr` header; INVALID_ARGUMENT carries a BadRequest
//! naming the field.

use std::collections::HashMap;

use fencer_proto::{ERROR_DOMAIN, LEADER_ADDR_HEADER};
use tonic::{Code, Status};
use tonic_types::{ErrorDetails, StatusExt};

use crate::service::LockError;

/// The gRPC code of an error.
pub fn grpc_code(e: &LockError) -> Code {
    match e {
        LockError::Invalid(_) => Code::InvalidArgument,
        LockError::LockHeld { .. } => Code::Aborted,
        LockError::WaitTimeout => Code::DeadlineExceeded,
        LockError::TooManyWaiters { .. } => Code::ResourceExhausted,
        LockError::NotHolder | LockError::LeaseExpired | LockError::RequestIdReused => Code::FailedPrecondition,
        LockError::NotLeader { .. }
        | LockError::NoQuorum
        | LockError::Unknown(_)
        | LockError::LeaderChanged
        | LockError::ShuttingDown => Code::Unavailable,
        LockError::UnknownSigningKey(_) => Code::NotFound,
        LockError::SigningKeyRefused(_) => Code::FailedPrecondition,
        LockError::Internal(_) => Code::Internal,
        LockError::Unauthenticated(_) => Code::Unauthenticated,
        LockError::PermissionDenied { .. } => Code::PermissionDenied,
        LockError::TenantLimit { .. } => Code::ResourceExhausted,
    }
}

/// The HTTP status of an error for the JSON API.
pub fn http_status(e: &LockError) -> u16 {
    match e {
        LockError::Invalid(_) => 400,
        LockError::LockHeld { .. } => 409,
        LockError::WaitTimeout => 408,
        LockError::TooManyWaiters { .. } => 429,
        LockError::NotHolder | LockError::LeaseExpired | LockError::RequestIdReused => 412,
        LockError::NotLeader { .. }
        | LockError::NoQuorum
        | LockError::Unknown(_)
        | LockError::LeaderChanged
        | LockError::ShuttingDown => 503,
        LockError::UnknownSigningKey(_) => 404,
        LockError::SigningKeyRefused(_) => 412,
        LockError::Internal(_) => 500,
        LockError::Unauthenticated(_) => 401,
        LockError::PermissionDenied { .. } => 403,
        LockError::TenantLimit { .. } => 429,
    }
}

/// The ErrorInfo metadata of an error.
pub(crate) fn metadata(e: &LockError) -> HashMap<String, String> {
    let mut m = HashMap::new();
    match e {
        LockError::NotLeader { leader_id, leader_addr } => {
            if let Some(id) = leader_id {
                m.insert("leader_id".into(), id.to_string());
            }
            if let Some(addr) = leader_addr {
                m.insert("leader_addr".into(), addr.clone());
            }
        }
        LockError::LockHeld { holder, token } => {
            m.insert("holder".into(), holder.clone());
            m.insert("token".into(), token.to_string());
        }
        LockError::TooManyWaiters { limit } => {
            m.insert("limit".into(), limit.to_string());
        }
        LockError::Invalid(f) => {
            m.insert("field".into(), f.field().into());
        }
        LockError::PermissionDenied { tenant, permission, resource } => {
            m.insert("tenant".into(), tenant.clone());
            m.insert("permission".into(), (*permission).into());
            m.insert("resource".into(), resource.clone());
        }
        LockError::TenantLimit { tenant, limit, value } => {
            if !tenant.is_empty() {
                m.insert("tenant".into(), tenant.clone());
            }
            m.insert("limit".into(), (*limit).into());
            m.insert("value".into(), value.to_string());
        }
        _ => {}
    }
    m
}

/// The gRPC status of an error, with its structured details.
pub fn to_status(e: &LockError) -> Status {
    let mut details = ErrorDetails::with_error_info(e.reason(), ERROR_DOMAIN, metadata(e));
    if let LockError::Invalid(f) = e {
        details.add_bad_request_violation(f.field(), f.to_string());
    }
    let mut status = Status::with_error_details(grpc_code(e), e.to_string(), details);
    if let LockError::NotLeader { leader_addr: Some(addr), .. } = e
        && let Ok(v) = addr.parse()
    {
        status.metadata_mut().insert(LEADER_ADDR_HEADER, v);
    }
    status
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::{FencingToken, InvalidField};

    #[test]
    fn reasons_travel_as_error_info() {
        let status = to_status(&LockError::LockHeld { holder: "h".into(), token: FencingToken(7) });
        assert_eq!(status.code(), Code::Aborted);
        let info = status.get_error_details().error_info().cloned().unwrap();
        assert_eq!(info.reason, "LOCK_HELD");
        assert_eq!(info.domain, ERROR_DOMAIN);
        assert_eq!(info.metadata["token"], "7");
    }

    #[test]
    fn not_leader_carries_the_leader_address() {
        let e = LockError::NotLeader { leader_id: Some(2), leader_addr: Some("127.0.0.2:7420".into()) };
        let status = to_status(&e);
        assert_eq!(status.code(), Code::Unavailable);
        assert_eq!(status.metadata().get(LEADER_ADDR_HEADER).unwrap(), "127.0.0.2:7420");
        let info = status.get_error_details().error_info().cloned().unwrap();
        assert_eq!(info.metadata["leader_addr"], "127.0.0.2:7420");
    }

    #[test]
    fn invalid_argument_names_the_field() {
        let status = to_status(&LockError::Invalid(InvalidField::ResourceDotDot));
        let bad = status.get_error_details().bad_request().cloned().unwrap();
        assert_eq!(bad.field_violations[0].field, "resource");
    }
}
