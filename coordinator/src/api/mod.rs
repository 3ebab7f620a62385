//! The node's front ends on its one port: the gRPC services (`fencer.v1.Lock`,
//! `fencer.v1.Admin`), JSON over HTTP for curl users, health, metrics and
//! the operator endpoints (also on the optional status port).
//! Errors become statuses in exactly one place, [`errors`]; what both front
//! ends do around a call (the caller's checks, span and metrics, request
//! conversion) is in `call`. The operator console's data endpoints are in
//! `console`.

mod call;
mod console;
mod errors;
mod grpc;
mod http;

pub(crate) use self::console::Console;
pub use self::errors::{grpc_code, http_status, to_status};
pub(crate) use self::grpc::{AdminApi, LockApi};
pub(crate) use self::http::{router, status_router};
