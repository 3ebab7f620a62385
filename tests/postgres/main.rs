//! The PostgreSQL sidecar against a real PostgreSQL (DESIGN §4a, G1–G10).
//! Every test starts its own throwaway server (`fixture.rs`) and a sidecar
//! in front of it; each names the rule it protects and fails when that
//! rule is broken.
//!
//! - `classifier`: the statement classifier and the startup-options reader
//!   agree with PostgreSQL (G2, G3, G8).
//! - `fencing`: token declarations and the check (G2–G4, G8, G10).
//! - `transactions`: the transaction as the unit in flight, older
//!   transactions ended through the admin connection (G5).
//! - `failures`: persist before forward across kill -9 (G6/P2), unknown
//!   outcomes (G7).
//! - `deployment`: signed tokens only (P7), one resource per database over
//!   a unix socket (G10), the binary's flag form and `--check-config`.
//! - `raw`: malformed frames close only their connection; FunctionCall is
//!   fenced (G1, G3).
//! - `protocol`: the relay (G1): extended protocol with pipelining, COPY,
//!   cancel, NOTIFY, TLS, SCRAM, a large COPY, many idle connections.

#![allow(unreachable_pub)]

mod classifier;
mod deployment;
mod failures;
mod fencing;
mod fixture;
mod protocol;
mod raw;
mod transactions;

use std::time::Duration;

/// How long a test waits for something that should happen soon.
pub const SOON: Duration = Duration::from_secs(30);

/// Asserts a statement failed with `code`; returns its message.
#[track_caller]
pub fn expect_code<T: std::fmt::Debug>(result: Result<T, tokio_postgres::Error>, code: &str) -> String {
    match result {
        Ok(v) => panic!("expected SQLSTATE {code}, but the statement succeeded: {v:?}"),
        Err(e) => {
            let (got, message) = fixture::code_of(&e);
            assert_eq!(got, code, "expected SQLSTATE {code}, got {got}: {message}");
            message
        }
    }
}
