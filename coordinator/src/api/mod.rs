//! The node's front ends on its one port: the gRPC services (`fencer.v1.Lock`,
//! `fencer.v1.Admin`), JSON over HTTP for curl users, health, metrics and
//! the operator endpoints (also on the optional status port).
//! Errors become statuses in exactly one place, [`errors`]; what both front
//! ends do around a call (the caller's checks, span and metrics, request
//! conversion) is in `call`; how the JSON front end refuses what it cannot
//! take (not JSON, unknown fields or paths) is in `json`; the OpenAPI
//! document of the JSON API, and the test that keeps it true, in `openapi`. The operator console's data endpoints are in `console`.

mod call;
mod console;
mod errors;
mod grpc;
mod http;
mod json;
mod openapi;

pub(crate) use self::console::Console;
pub use self::errors::{grpc_code, http_status, to_status};
pub(crate) use self::grpc::{AdminApi, LockApi};
pub(crate) use self::http::{router, status_router};
pub(crate) use self::json::with_json_errors;
