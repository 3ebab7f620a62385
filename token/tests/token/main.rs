//! The signed fencing-token format (P7) through its public API:
//!
//! - `t10_verify` — what verification accepts and refuses, and why.
//! - `t11_properties` — round trips, bit flips, arbitrary bytes (proptest).

mod t10_verify;
mod t11_properties;
