//! The operator console of fencer: the web page every coordinator node and
//! every proxy serves at `/ui/` (docs/operations.md, "The console"). This
//! crate holds what both servers share — the page itself, embedded in the
//! binary, the security headers of every console answer, the page token
//! that console actions must carry, and the live series behind the charts.
//! The data endpoints under `/ui/api/` belong to each server (they read its
//! own state): the coordinator's in `fencer_coordinator`'s `api::console`,
//! the proxy's in `fencer_proxy`'s `core::admin::console`.
//!
//! The page is plain HTML, CSS and JavaScript modules written by hand, with
//! hand-drawn SVG charts: nothing is built at compile time beyond
//! `include_str!`, and the page fetches nothing but its own server's
//! `/ui/` paths (the Content-Security-Policy says so to the browser).
//!
//! # Layout
//! - `assets` — the embedded files and [`assets_router`], which serves them
//!   under `/ui/`.
//! - `headers` — [`secured`]: the Content-Security-Policy and the other
//!   headers on every console answer.
//! - `page_token` — [`PageToken`], the per-process token a console action
//!   must present in a header (CSRF: never a cookie).
//! - `series` — [`Series`], 15 minutes of one-second samples for the charts.
//! - `histogram` — [`Histogram`]: one histogram's buckets read from the
//!   Prometheus text exposition, subtracted and turned into quantiles.
//!
//! ```
//! use fencer_console::Histogram;
//!
//! let text = "\
//! lat_bucket{op=\"acquire\",le=\"0.001\"} 2\n\
//! lat_bucket{op=\"acquire\",le=\"0.01\"} 10\n\
//! lat_bucket{op=\"acquire\",le=\"+Inf\"} 10\n";
//! let h = Histogram::parse(text, "lat", ("op", "acquire")).unwrap();
//! // Eight of ten observations fell between 1 ms and 10 ms: the median is
//! // interpolated inside that bucket, as Prometheus' histogram_quantile does.
//! let p50 = h.quantile(0.5).unwrap();
//! assert!(p50 > 0.001 && p50 < 0.01, "{p50}");
//! ```

mod assets;
mod headers;
mod histogram;
mod page_token;
mod series;

pub use self::assets::{ASSETS, Asset, assets_router};
pub use self::headers::{CONTENT_SECURITY_POLICY, secured};
pub use self::histogram::Histogram;
pub use self::page_token::{PAGE_TOKEN_HEADER, PageToken, PageTokenRefused};
pub use self::series::{SAMPLE_PERIOD, Series, SeriesView, WINDOW, WINDOW_SAMPLES, per_second};
