//! The client library (`fencer_client`) against an in-process node, through
//! the kit's lost-answer layer where a test needs one:
//!
//! - `t38_batching` — calls in flight at once share Batch requests;
//!   batching off; a server without Batch gets the calls one by one.
//! - `t40_renewal` — renewal, Uncertain then Lost by the deadline, the
//!   deadline counted from the send time (t41, t42).
//! - `t43_server_expiry` — a paused client is Lost and its stamping layer
//!   refuses to send; a lease ended by the server is Lost at once (t44).
//! - `t45_retries` — a lost answer is retried with the same request id;
//!   retries of a waiting acquire never queue twice (t46).
//! - `t47_acquire_all` — all or nothing.

mod t38_batching;
mod t40_renewal;
mod t43_server_expiry;
mod t45_retries;
mod t47_acquire_all;
