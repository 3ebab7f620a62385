//! The lock API end to end over gRPC on one in-process node (the kit's
//! `node` fixture): grant, conflict, FIFO waiting, wait timeout, a departed
//! waiter, stale release (I4), retries (I7), expiry and promotion, invalid
//! input, paging.
//!
//! One test binary per area (STYLE "Tests by area, one fixture module");
//! the fixtures are `fencer_testkit`'s. docs/testing.md maps every test.

mod t20_lock_api;
mod t36_json_api;
mod t37_connections;
mod t38_batch;
