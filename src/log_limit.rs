//! Repeated warnings of the libraries fencer runs on, written a few times
//! and then counted. openraft warns once per failed heartbeat: with a
//! follower down, its leader wrote ~50 identical lines a second (4,571 in
//! 92 s, docs/performance.md), for as long as the follower stayed down.
//!
//! The rule ([`RepeatLimit`]): an event at WARN or ERROR whose target is
//! not fencer's own is written at most [`BURST`] times per line of code (its
//! callsite) in each [`WINDOW`]; the rest are counted, and when the window
//! ends one line at the same level says how many were not written and where
//! they came from. Everything else is written as it comes: fencer's own
//! events (their repeats are bounded where they are logged), and any event
//! below WARN (those are asked for with `--log`, to be read in full). What
//! is kept per callsite is two counters, and callsites are the finite set
//! compiled into the binary.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tracing::callsite::Identifier;
use tracing::{Event, Level, Metadata, Subscriber};
use tracing_subscriber::Layer;
use tracing_subscriber::layer::Context;

/// Lines written per callsite in one window.
pub(crate) const BURST: u32 = 5;
/// The window: counts restart, and the suppressed are reported, this often.
pub(crate) const WINDOW: Duration = Duration::from_secs(10);

/// The target of the lines that report what was not written.
const TARGET: &str = "fencer::log";

/// What one callsite wrote and withheld in the current window.
struct Seen {
    meta: &'static Metadata<'static>,
    written: u32,
    withheld: u64,
}

/// The layer: decides per event (`event_enabled`), so a withheld event is
/// formatted by no layer.
#[derive(Clone, Default)]
pub(crate) struct RepeatLimit {
    seen: Arc<Mutex<HashMap<Identifier, Seen>>>,
}

/// Whether the rule applies to events of this callsite.
fn limited(meta: &Metadata<'_>) -> bool {
    let target = meta.target();
    let ours = target == "fencer" || target.starts_with("fencer_") || target.starts_with("fencer::");
    // `Level` orders by verbosity: ERROR < WARN < INFO.
    meta.is_event() && *meta.level() <= Level::WARN && !ours
}

impl RepeatLimit {
    /// A limit whose windows end every [`WINDOW`] on a thread of its own,
    /// which writes the reports through the global subscriber (so it must
    /// be the limit of that subscriber).
    pub(crate) fn with_window_thread() -> std::io::Result<Self> {
        let limit = Self::default();
        let ticking = limit.clone();
        std::thread::Builder::new().name("log-repeats".into()).spawn(move || {
            loop {
                std::thread::sleep(WINDOW);
                ticking.end_window();
            }
        })?;
        Ok(limit)
    }

    /// Counts the event; whether it is written.
    fn admit(&self, meta: &'static Metadata<'static>) -> bool {
        if !limited(meta) {
            return true;
        }
        let mut seen = self.seen.lock().unwrap_or_else(PoisonError::into_inner);
        let s = seen.entry(meta.callsite()).or_insert(Seen { meta, written: 0, withheld: 0 });
        if s.written < BURST {
            s.written += 1;
            true
        } else {
            s.withheld += 1;
            false
        }
    }

    /// Ends the window: what each callsite withheld in it (none listed when
    /// it withheld nothing), and every count starts again from zero.
    fn take_window(&self) -> Vec<(&'static Metadata<'static>, u64)> {
        let mut seen = self.seen.lock().unwrap_or_else(PoisonError::into_inner);
        let mut withheld: Vec<_> = seen.values().filter(|s| s.withheld > 0).map(|s| (s.meta, s.withheld)).collect();
        seen.clear();
        withheld.sort_by_key(|(meta, _)| (meta.target(), meta.line()));
        withheld
    }

    /// Ends the window and writes one line per callsite that withheld lines
    /// in it, at that callsite's level, through the current subscriber.
    pub(crate) fn end_window(&self) {
        let window = WINDOW.as_secs();
        for (meta, withheld) in self.take_window() {
            let source = meta.target();
            let at = format!("{}:{}", short_file(meta.file().unwrap_or("?")), meta.line().unwrap_or(0));
            if *meta.level() == Level::ERROR {
                tracing::error!(
                    target: TARGET, source, at, withheld,
                    "repeats of a dependency's line were not written (at most {BURST} per line every {window} s)"
                );
            } else {
                tracing::warn!(
                    target: TARGET, source, at, withheld,
                    "repeats of a dependency's line were not written (at most {BURST} per line every {window} s)"
                );
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
        self.admit(event.metadata())
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
        let reports: Vec<_> = lines.iter().filter(|l| l.contains("fencer::log")).collect();
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
        let reports: Vec<_> = lines.iter().filter(|l| l.contains("fencer::log")).collect();
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
    fn a_target_that_only_starts_like_fencer_is_a_dependency() {
        let lines = logged(|_| {
            for _ in 0..20 {
                tracing::warn!(target: "fencerly", "not ours");
            }
        });
        assert_eq!(count(&lines, "not ours"), BURST as usize, "{lines:#?}");
    }
}
