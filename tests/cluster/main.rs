//! Clusters of real `fencer coordinator` processes on 127.0.0.x
//! (`fencer_testkit::ProcCluster`), SIGSTOP and kill -9 by PID:
//!
//! - `t55_paused_leader` — a leader paused past the election timeout comes
//!   back as a follower without a second holder.
//! - `t56_cluster_cli` — `fencer status`, failover, rejoin, a foreign data
//!   dir, replacing a node.
//! - `t59_failover_window` — with the default timing: a held lock keeps its
//!   token across leader kills, an isolated leader refuses before anyone
//!   else grants; measurements (ignored) of the unavailability window of 10
//!   kills and 10 isolations.

mod t55_paused_leader;
mod t56_cluster_cli;
mod t59_failover_window;

/// One cluster of this area at a time: their 150 ms election timeouts
/// assume the nodes get the CPU when their timers fire, which two clusters
/// on two cores would not give them (as separate binaries they never met).
pub(crate) async fn one_cluster_at_a_time() -> tokio::sync::MutexGuard<'static, ()> {
    static TURN: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
    TURN.lock().await
}
