//! Repeated warnings of the libraries fencer runs on, written a few times
//! and then counted. openraft warns once per failed heartbeat: with a
//! follower down, its leader wrote ~50 identical lines a second (4,571 in
//! 92 s, docs/performance.md), for as long as the follower stayed down.
//!
//! The rule ([`RepeatLimit`]): an event at WARN or ERROR whose target is
//! not fencer's own (`fencer`, `fencer_…`, `fencer::…`) is written at most
//! [`BURST`] times per line of code in each [`WINDOW`]; the rest are
//! counted, and when the window ends one line at the same level says how
//! many were not written and where they came from. A line of code is a
//! tracing callsite, or, for a library that logs through the `log` crate
//! (which tracing-log forwards through one callsite per level), the
//! record's own target, file and line. Everything else is written as it
//! comes: fencer's own events, and any event below WARN (those are asked
//! for with `--log`, to be read in full). What is kept per line is two
//! counters, and the lines are the finite set compiled into the binary.

use std::collections::HashMap;
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::Duration;

use tracing::callsite::Identifier;
use tracing::{Event, Level, Metadata, Subscriber};
use tracing_log::NormalizeEvent;
use tracing_subscriber::Layer;
use tracing_subscriber::layer::Context;

/// Lines written per line of code in one window.
pub(crate) const BURST: u32 = 5;
/// The window: counts restart, and the withheld are reported, this often.
pub(crate) const WINDOW: Duration = Duration::from_secs(10);

/// The target of the lines that report what was not written.
const TARGET: &str = "fencer::log";

/// One line of code that logs.
#[derive(PartialEq, Eq, Hash)]
enum Source {
    /// A tracing callsite.
    Callsite(Identifier),
    /// A `log` record's target, file and line.
    Log(String, Option<String>, Option<u32>),
}

/// What one line of code wrote and withheld in the current window.
struct Seen {
    level: Level,
    target: String,
    at: String,
    written: u32,
    withheld: u64,
}

/// The layer: decides per event (`event_enabled`), so a withheld event is
/// formatted by no layer.
#[derive(Clone, Default)]
pub(crate) struct RepeatLimit {
    seen: Arc<Mutex<HashMap<Source, Seen>>>,
}

/// Whether the rule applies to events of this metadata.
fn limited(meta: &Metadata<'_>) -> bool {
    let target = meta.target();
    let ours = target == "fencer" || target.starts_with("fencer_") || target.starts_with("fencer::");
    // `Level` orders by verbosity: ERROR < WARN < INFO.
    meta.is_event() && *meta.level() <= Level::WARN && !ours
}

/// Ends the windows of a [`RepeatLimit`] on a thread of its own; dropping
/// it (at the end of `main`) stops the thread, which reports the window
/// in progress first, so no count is lost at exit.
pub(crate) struct Windows {
    stop: Option<mpsc::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl Drop for Windows {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl RepeatLimit {
    /// Starts the thread that ends a window every [`WINDOW`] and writes the
    /// reports through `dispatch`, or the global subscriber when `None` (the
    /// limit must be a layer of that subscriber), until the returned guard
    /// is dropped.
    pub(crate) fn start_windows(&self, dispatch: Option<tracing::Dispatch>) -> std::io::Result<Windows> {
        let ending = self.clone();
        let (stop, stopped) = mpsc::channel::<()>();
        let thread = std::thread::Builder::new().name("log-windows".into()).spawn(move || {
            loop {
                let last = !matches!(stopped.recv_timeout(WINDOW), Err(RecvTimeoutError::Timeout));
                match &dispatch {
                    Some(d) => tracing::dispatcher::with_default(d, || ending.end_window()),
                    None => ending.end_window(),
                }
                if last {
                    return;
                }
            }
        })?;
        Ok(Windows { stop: Some(stop), thread: Some(thread) })
    }

    /// Counts the event; whether it is written.
    fn admit(&self, event: &Event<'_>) -> bool {
        let normalized = event.normalized_metadata();
        let meta = normalized.as_ref().unwrap_or(event.metadata());
        if !limited(meta) {
            return true;
        }
        let source = match &normalized {
            Some(m) => Source::Log(m.target().to_owned(), m.file().map(str::to_owned), m.line()),
            None => Source::Callsite(event.metadata().callsite()),
        };
        let mut seen = self.seen.lock().unwrap_or_else(PoisonError::into_inner);
        let s = seen.entry(source).or_insert_with(|| Seen {
            level: *meta.level(),
            target: meta.target().to_owned(),
            at: format!("{}:{}", short_file(meta.file().unwrap_or("?")), meta.line().unwrap_or(0)),
            written: 0,
            withheld: 0,
        });
        if s.written < BURST {
            s.written += 1;
            true
        } else {
            s.withheld += 1;
            false
        }
    }

    /// Ends the window: what each line of code withheld in it (none listed
    /// when it withheld nothing), and every count starts again from zero.
    fn take_window(&self) -> Vec<Seen> {
        let mut seen = self.seen.lock().unwrap_or_else(PoisonError::into_inner);
        let mut withheld: Vec<Seen> = seen.drain().map(|(_, s)| s).filter(|s| s.withheld > 0).collect();
        withheld.sort_by(|a, b| (&a.target, &a.at).cmp(&(&b.target, &b.at)));
        withheld
    }

    /// Ends the window and writes one line per line of code that withheld
    /// lines in it, at that line's level, through the current subscriber.
    /// An event of the new window may be written before these reports.
    pub(crate) fn end_window(&self) {
        let window = WINDOW.as_secs();
        // A tracing level is part of its callsite, so one report per level.
        macro_rules! report {
            ($at_level:ident, $source:expr, $at:expr, $withheld:expr) => {
                tracing::$at_level!(
                    target: TARGET, source = $source, at = $at, withheld = $withheld,
                    "repeats of a dependency's line were not written (at most {BURST} per line every {window} s)"
                )
            };
        }
        for Seen { level, target, at, withheld, .. } in self.take_window() {
            if level == Level::ERROR {
                report!(error, target, at, withheld);
            } else {
                report!(warn, target, at, withheld);
            }
        }
    }
}

/// A source file as a crate's own path, with its version, when it comes from
/// cargo's registry: `openraft-0.10.0-alpha.37/src/core/heartbeat/worker.rs`
/// rather than the whole path of the machine that built the binary.
fn short_file(file: &str) -> &str {
    match file.find("/registry/src/") {
        Some(at) => {
            let rest = &file[at + "/registry/src/".len()..];
            rest.split_once('/').map_or(rest, |(_index, path)| path)
        }
        None => file,
    }
}

impl<S: Subscriber> Layer<S> for RepeatLimit {
    fn event_enabled(&self, event: &Event<'_>, _ctx: Context<'_, S>) -> bool {
        self.admit(event)
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;
    use std::sync::{Arc, Mutex};

    use tracing_subscriber::fmt::MakeWriter;
    use tracing_subscriber::prelude::*;

    use super::{BURST, RepeatLimit, short_file};

    /// Everything written, shared with the test.
    #[derive(Clone, Default)]
    struct Written(Arc<Mutex<Vec<u8>>>);

    impl Written {
        fn lines(&self) -> Vec<String> {
            String::from_utf8(self.0.lock().unwrap().clone()).unwrap().lines().map(str::to_string).collect()
        }
    }

    impl Write for Written {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl<'a> MakeWriter<'a> for Written {
        type Writer = Written;
        fn make_writer(&'a self) -> Self::Writer {
            self.clone()
        }
    }

    /// Runs `f` under a subscriber as the binary builds it (the filter
    /// `trace`, the limit, text lines into the returned buffer).
    fn logged(f: impl FnOnce(&RepeatLimit)) -> Vec<String> {
        let out = Written::default();
        let limit = RepeatLimit::default();
        let subscriber = tracing_subscriber::registry()
            .with(tracing_subscriber::EnvFilter::new("trace"))
            .with(limit.clone())
            .with(tracing_subscriber::fmt::layer().with_ansi(false).without_time().with_writer(out.clone()));
        tracing::subscriber::with_default(subscriber, || f(&limit));
        out.lines()
    }

    /// The level a text line was written at.
    fn level(line: &str) -> &str {
        line.split_whitespace().next().unwrap_or_default()
    }

    /// The lines that report withheld repeats.
    fn reports(lines: &[String]) -> Vec<&String> {
        lines.iter().filter(|l| l.contains("fencer::log")).collect()
    }

    fn count(lines: &[String], what: &str) -> usize {
        lines.iter().filter(|l| l.contains(what)).count()
    }

    #[test]
    fn a_dependency_warning_is_written_a_few_times_per_window_then_counted() {
        let lines = logged(|limit| {
            for i in 0..50 {
                tracing::warn!(target: "openraft::core::heartbeat::worker", i, "failed to send a heartbeat");
            }
            limit.end_window();
            for i in 0..3 {
                tracing::warn!(target: "openraft::core::heartbeat::worker", i, "failed to send a heartbeat");
            }
            limit.end_window();
        });
        let heartbeats = count(&lines, "failed to send a heartbeat");
        assert_eq!(heartbeats, BURST as usize + 3, "{lines:#?}");
        // The first window's first lines are the ones written.
        assert!(lines[0].contains("i=0") && lines[BURST as usize - 1].contains(&format!("i={}", BURST - 1)));
        let reports = reports(&lines);
        assert_eq!(reports.len(), 1, "one report, for the window that withheld lines: {lines:#?}");
        let report = reports[0];
        assert_eq!(level(report), "WARN", "{report}");
        assert!(report.contains(&format!("withheld={}", 50 - BURST)), "{report}");
        assert!(report.contains("openraft::core::heartbeat::worker"), "{report}");
        assert!(report.contains("at=\"src/log_limit.rs:"), "names the line: {report}");
        // It comes after the lines it counts and before the next window's.
        let at = lines.iter().position(|l| l == report).unwrap();
        assert_eq!(at, BURST as usize, "{lines:#?}");
    }

    #[test]
    fn each_line_of_code_has_its_own_count_and_errors_are_reported_as_errors() {
        let lines = logged(|limit| {
            for _ in 0..20 {
                tracing::warn!(target: "h2::proto", "one line");
                tracing::error!(target: "h2::proto", "another line");
            }
            limit.end_window();
        });
        assert_eq!(count(&lines, "one line"), BURST as usize, "{lines:#?}");
        assert_eq!(count(&lines, "another line"), BURST as usize, "{lines:#?}");
        let reports = reports(&lines);
        assert_eq!(reports.len(), 2, "{lines:#?}");
        for (lvl, what) in [("ERROR", "another line"), ("WARN", "one line")] {
            let withheld = format!("withheld={}", 20 - BURST);
            assert!(reports.iter().any(|l| level(l) == lvl && l.contains(&withheld)), "{what}: {reports:#?}");
        }
    }

    #[test]
    fn fencers_own_events_and_events_below_warn_are_all_written() {
        let lines = logged(|limit| {
            for _ in 0..20 {
                tracing::warn!(target: "fencer_coordinator::service", "ours");
                tracing::error!(target: "fencer", "ours too");
                tracing::warn!(target: "fencer::log", "and this");
                tracing::info!(target: "openraft::replication", "asked for");
                tracing::debug!(target: "openraft::engine", "asked for too");
            }
            limit.end_window();
        });
        for what in ["ours", "ours too", "and this", "asked for", "asked for too"] {
            let n = lines.iter().filter(|l| l.ends_with(what)).count();
            assert_eq!(n, 20, "{what}: {lines:#?}");
        }
        assert_eq!(lines.len(), 100, "no report when nothing was withheld: {lines:#?}");
    }

    #[test]
    fn a_registry_path_is_shortened_to_the_crate_and_its_version() {
        assert_eq!(
            short_file(
                "/root/.cargo/registry/src/index.crates.io-1949cf8c6b5b557f/openraft-0.10.0-alpha.37/src/core/x.rs"
            ),
            "openraft-0.10.0-alpha.37/src/core/x.rs"
        );
        assert_eq!(short_file("src/log_limit.rs"), "src/log_limit.rs");
        assert_eq!(short_file("/x/registry/src/"), "");
        assert_eq!(short_file("/x/registry/src/index"), "index");
    }

    #[test]
    fn log_crate_records_are_counted_per_line_of_their_own_code() {
        // tracing-log forwards every `log` record of a level through one
        // callsite; each record's own target, file and line is its line.
        let record = |target: &'static str, line: u32| {
            let args = format_args!("a log record");
            let r = log::Record::builder()
                .level(log::Level::Warn)
                .target(target)
                .file(Some("/root/.cargo/registry/src/index.crates.io-0/tokio-postgres-0.7.0/src/connect.rs"))
                .line(Some(line))
                .args(args)
                .build();
            tracing_log::format_trace(&r).unwrap();
        };
        let lines = logged(|limit| {
            for _ in 0..20 {
                record("tokio_postgres::connect", 10);
                record("tokio_postgres::connect", 20);
                record("rustls::conn", 10);
            }
            limit.end_window();
        });
        assert_eq!(count(&lines, "a log record"), 3 * BURST as usize, "{lines:#?}");
        let reports = reports(&lines);
        assert_eq!(reports.len(), 3, "{lines:#?}");
        for (source, at) in [
            ("tokio_postgres::connect", "tokio-postgres-0.7.0/src/connect.rs:10"),
            ("tokio_postgres::connect", "tokio-postgres-0.7.0/src/connect.rs:20"),
            ("rustls::conn", "tokio-postgres-0.7.0/src/connect.rs:10"),
        ] {
            let want = [format!("source=\"{source}\""), format!("at=\"{at}\""), format!("withheld={}", 20 - BURST)];
            assert!(reports.iter().any(|r| want.iter().all(|w| r.contains(w))), "{want:?}: {reports:#?}");
        }
    }

    #[test]
    fn the_windows_thread_reports_the_window_in_progress_when_its_guard_is_dropped() {
        let out = Written::default();
        let limit = RepeatLimit::default();
        let dispatch = tracing::Dispatch::new(
            tracing_subscriber::registry()
                .with(limit.clone())
                .with(tracing_subscriber::fmt::layer().with_ansi(false).without_time().with_writer(out.clone())),
        );
        let windows = limit.start_windows(Some(dispatch.clone())).unwrap();
        tracing::dispatcher::with_default(&dispatch, || {
            for _ in 0..12 {
                tracing::warn!(target: "h2::proto", "late line");
            }
        });
        let started = tokio::time::Instant::now();
        drop(windows);
        assert!(started.elapsed() < super::WINDOW, "the guard stops the thread at once");
        let lines = out.lines();
        assert_eq!(count(&lines, "late line"), BURST as usize, "{lines:#?}");
        let report = lines.last().unwrap();
        assert!(report.contains("fencer::log") && report.contains("withheld=7"), "{lines:#?}");
    }

    #[test]
    fn a_target_that_only_starts_like_fencer_is_a_dependency() {
        let lines = logged(|_| {
            for _ in 0..20 {
                tracing::warn!(target: "fencerly", "not ours");
            }
        });
        assert_eq!(count(&lines, "not ours"), BURST as usize, "{lines:#?}");
    }
}
