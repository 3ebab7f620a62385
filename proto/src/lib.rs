//! Generated gRPC code for fencer.
//!
//! - [`v1`]: the public lock API (`fencer.v1.Lock`, `fencer.v1.Admin`), see
//!   DESIGN.md §2 and `proto/fencer/v1/lock.proto`.
//! - [`raft`]: the internal transport between coordinator nodes. Its payloads
//!   are opaque bytes encoded by `fencer-coordinator`.
//!
//! The code is generated at build time by `protox` (a pure-Rust protobuf
//! compiler) and `tonic-prost-build`; no system `protoc` is needed.
//!
//! ```
//! use fencer_proto::v1::AcquireRequest;
//!
//! let req = AcquireRequest { resource: "orders/42".into(), ..Default::default() };
//! assert_eq!(req.wait_timeout_ms, 0);
//! ```

/// The public lock API, package `fencer.v1`.
#[allow(missing_docs, unreachable_pub, clippy::all)]
pub mod v1 {
    tonic::include_proto!("fencer.v1");
}

/// The internal raft transport, package `fencer.raft.v1`.
#[allow(missing_docs, unreachable_pub, clippy::all)]
pub mod raft {
    tonic::include_proto!("fencer.raft.v1");
}

/// The error domain used in `google.rpc.ErrorInfo` details.
pub const ERROR_DOMAIN: &str = "fencer.dev";

/// Response header carrying the leader's address on NOT_LEADER answers.
pub const LEADER_ADDR_HEADER: &str = "fencer-leader-addr";

/// Request header of a lock call naming, comma separated, the nodes (as the
/// client addressed them) that this call could not use as leader: their
/// connection broke, they had no quorum, or they were stopping. A follower
/// whose leader is one of them, or that knows no leader, holds the call
/// until it knows another leader (bounded), instead of sending the client
/// back to the node that just failed.
pub const UNREACHABLE_HEADER: &str = "fencer-unreachable";

/// A batch item's error is the status the same call sent alone ends with:
/// its code, message and `grpc-status-details-bin` bytes (the ErrorInfo
/// with the reason), so both decode the same way.
impl From<&tonic::Status> for v1::BatchError {
    fn from(s: &tonic::Status) -> Self {
        Self { code: s.code().into(), message: s.message().to_string(), details: s.details().to_vec() }
    }
}

/// The status a batch item's error stands for (see `From<&Status>`).
impl From<&v1::BatchError> for tonic::Status {
    fn from(e: &v1::BatchError) -> Self {
        tonic::Status::with_details(e.code.into(), e.message.clone(), e.details.clone().into())
    }
}

#[cfg(test)]
mod tests {
    use super::v1::BatchError;

    #[test]
    fn a_batch_error_carries_a_status_whole() {
        let alone = tonic::Status::with_details(tonic::Code::Aborted, "lock held", vec![1, 2, 3].into());
        let back = tonic::Status::from(&BatchError::from(&alone));
        assert_eq!((back.code(), back.message(), back.details()), (alone.code(), alone.message(), alone.details()));
        // A code this version does not know stays an error (UNKNOWN), never OK.
        let odd = BatchError { code: 99, message: "?".into(), details: Vec::new() };
        assert_eq!(tonic::Status::from(&odd).code(), tonic::Code::Unknown);
    }
}
