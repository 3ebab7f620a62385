//! The operator console (issue 19) in a real headless Chromium, driven
//! through WebDriver, against real `fencer dev` and `fencer proxy`
//! processes. Each test skips with a loud message when `chromium` or
//! `chromedriver` is not installed, and fails then under `CI=true`.
//!
//! - `t90_coordinator` — a lock taken with the CLI shows on the locks page
//!   within 2 s with its token and its queued waiter, and leaves it when
//!   released; the lock, audit, hot, cluster and chart pages (non-zero
//!   rates under a short bounded load); the read-only status port.
//! - `t91_proxy` — a quarantined resource with its countdown, cleared in
//!   the page; a stale write in the rejection log with its reason; an
//!   epoch raised in the page and audited like `POST /v1/raise-epoch`; the
//!   accepted/rejected chart.
//! - `t92_tenants` — tenant A's pages never show tenant B's locks; a
//!   `read` tenant gets no force-release button and its POST is refused;
//!   an action without the page token is refused; an admin force-releases
//!   in the page, audited like `fencer force-release`.
//!
//! Every test also checks that the page loaded nothing but its own server's
//! files (the browser's network is blocked but for loopback) and that the
//! browser logged no error. Screenshots of every page are written under
//! the test's output (`target/tmp/console-screenshots/`); with
//! `FENCER_REFRESH_DOCS_IMAGES=1` they also replace the images of
//! docs/operations.md (`docs/images/console/`).

mod fixture;
mod t90_coordinator;
mod t91_proxy;
mod t92_tenants;
