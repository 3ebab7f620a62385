//! History-checked runs (DESIGN §8, docs/testing.md): the checkers of
//! `fencer_testkit::history` over what clients, relays and the upstream
//! recorded.
//!
//! - `t60_history` — the workload runner under the nemesis (short, against
//!   InfluxDB, and the long ignored run).
//! - `t61_zombie_writer` — the zombie writer with real processes throughout
//!   (the binary starts itself again as `t61_zombie_writer::zombie_client_process`).
//! - `t62_checkers` — the checkers on hand-made histories.
//! - `workload` — the runner: clients, nemesis, proxy process, upstreams.

mod t60_history;
mod t61_zombie_writer;
mod t62_checkers;
mod workload;
