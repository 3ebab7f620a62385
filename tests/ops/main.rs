//! What operators use (issue 7): metrics, dashboards and alerts, the audit
//! CLI, `top`, `status`, `log-level`.
//!
//! - `t70_metrics` — metrics move through one end-to-end scenario.
//! - `t71_deploy_metrics` — every metric the dashboard and alerts query exists.
//! - `t72_audit_cli` — `fencer audit` across kill -9.
//! - `t73_operator_cli` — `top`, `status`, `log-level` on real processes.
//! - `stack` — a node and a proxy in one process, scraped.

mod stack;
mod t70_metrics;
mod t71_deploy_metrics;
mod t72_audit_cli;
mod t73_operator_cli;
