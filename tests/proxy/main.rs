//! The sidecar proxy (DESIGN §4, P1–P10) in process, as a process and in
//! front of InfluxDB. Test names number locally within this area, by rule:
//!
//! - `fence` — the fence in process: P1–P8 against a gated test upstream
//!   (t10–t61).
//! - `process` — `fencer proxy` as a process: P10, P2 across kill -9, config
//!   validation (t70–t72).
//! - `signed` — signed tokens, P7 (t80–t86).
//! - `tls` — TLS listener, mTLS, TLS upstream, connection limits (t90–t95).
//! - `influxdb` — the zombie writer against a real InfluxDB (t90).
//! - `admin` — the admin API's refusals, operator text bounds, the bearer
//!   token (t110–t113).
//! - `edges` — hostile and clumsy clients: head, idle and body timeouts, a
//!   client that stops reading, half-close, oversize chunked bodies,
//!   refusals of the head (t100–t106).
//! - `t74_coordinator_signed_tokens` — coordinator → `fencer keys export` →
//!   proxy.

mod admin;
mod edges;
mod fence;
mod influxdb;
mod process;
mod signed;
mod t74_coordinator_signed_tokens;
mod tls;
