//! The in-process nodes' logs, off by default: set `FENCER_TEST_LOG` to a
//! tracing filter (`FENCER_TEST_LOG=openraft=info,fencer_coordinator=debug`)
//! and the harness prints them through the test writer, so `cargo test`
//! shows them for a failing test (or for all with `--nocapture`).

/// Installs the log subscriber once per test binary when `FENCER_TEST_LOG`
/// is set; a second call, or a subscriber installed already, is a no-op.
pub fn init_from_env() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let Ok(filter) = std::env::var("FENCER_TEST_LOG") else { return };
        let filter = tracing_subscriber::EnvFilter::try_new(&filter)
            .unwrap_or_else(|e| panic!("FENCER_TEST_LOG={filter:?} is not a tracing filter: {e}"));
        let _ = tracing_subscriber::fmt().with_env_filter(filter).with_test_writer().try_init();
    });
}
