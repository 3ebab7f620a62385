//! What the console tests share: the browser, the screenshots, the checks
//! every test ends with.

use std::path::{Path, PathBuf};
use std::time::Duration;

use fencer_testkit::browser::Browser;
use serde_json::json;

/// The bound of a wait that should take well under a second.
pub(crate) const SOON: Duration = Duration::from_secs(10);

/// Where the screenshots go: the test output, and the docs on request.
pub(crate) fn shots_dir() -> PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR")).join("console-screenshots")
}

/// Takes a screenshot of the page as `name`; with
/// `FENCER_REFRESH_DOCS_IMAGES=1` it also replaces the docs' image.
pub(crate) async fn shot(browser: &Browser, name: &str) {
    let path = browser.screenshot(&shots_dir(), name).await;
    if std::env::var("FENCER_REFRESH_DOCS_IMAGES").is_ok_and(|v| v == "1") {
        let docs = Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/images/console");
        std::fs::create_dir_all(&docs).unwrap();
        std::fs::copy(&path, docs.join(format!("{name}.png"))).unwrap();
    }
}

/// Waits until the page shows the console's navigation (the session was
/// read and the page mounted).
pub(crate) async fn wait_loaded(browser: &Browser) {
    browser
        .wait_for("the console to load", SOON, "return document.querySelectorAll('#nav a').length > 0", vec![])
        .await;
}

/// Opens `#/hash` of the console at `base` and waits until `css` is on the page.
pub(crate) async fn open(browser: &Browser, base: &str, hash: &str, css: &str) {
    browser.goto(&format!("{base}/ui/#/{hash}")).await;
    wait_loaded(browser).await;
    browser
        .wait_for(
            &format!("{css} on #/{hash}"),
            SOON,
            "return document.querySelector(arguments[0]) !== null",
            vec![json!(css)],
        )
        .await;
}

/// The page loaded only `origin`'s files, and the browser logged no error
/// but the ones `expected` names (a refusal the test provoked).
pub(crate) async fn assert_clean(browser: &Browser, origin: &str, expected: &[&str]) {
    for url in browser.loaded_urls().await {
        assert!(url.starts_with(&format!("{origin}/ui/")), "the page loaded {url}, not from {origin}/ui/");
    }
    let errors: Vec<String> =
        browser.severe_logs().await.into_iter().filter(|m| !expected.iter().any(|e| m.contains(e))).collect();
    assert!(errors.is_empty(), "the browser logged errors: {errors:#?}");
}
