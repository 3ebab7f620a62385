//! A real headless Chromium, driven through WebDriver by `chromedriver`, for
//! the operator console's browser tests (Debian `chromium` and
//! `chromium-driver`; `.ci/run` installs them).
//!
//! [`Browser::start`] starts chromedriver on a free loopback port as a
//! [`Proc`] (stopped by PID when dropped) and opens one Chromium session
//! with a fresh profile in a temporary dir. The network is blocked except
//! loopback: every other host goes to a proxy address nothing listens on,
//! and no host name resolves, so a page that tried to fetch anything from
//! elsewhere would fail, and the failure would show in the browser's log
//! ([`Browser::severe_logs`]).
//!
//! The DOM is read with small scripts ([`Browser::eval`]) rather than
//! element by element: one round trip per question, and the question reads
//! like the page's own code.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use fantoccini::wd::WebDriverCompatibleCommand;
use serde_json::{Value, json};

use crate::{Proc, external, free_addr};

/// The browser Debian installs.
pub const CHROMIUM: &str = "/usr/bin/chromium";
/// Its WebDriver server.
pub const CHROMEDRIVER: &str = "/usr/bin/chromedriver";
/// How to install both.
pub const INSTALL: &str = "apt-get install chromium chromium-driver";
/// How often [`Browser::wait_for`] asks the page.
const POLL_EVERY: Duration = Duration::from_millis(100);
/// The window size of every session (and so of every screenshot).
pub const WINDOW: (u32, u32) = (1280, 860);

/// One browser session and the chromedriver behind it.
pub struct Browser {
    client: fantoccini::Client,
    _driver: Proc,
    _profile: tempfile::TempDir,
}

/// chromedriver's log command (a Selenium extension it serves in W3C mode):
/// the browser's console and network messages since the last call.
#[derive(Debug)]
struct BrowserLog;

impl WebDriverCompatibleCommand for BrowserLog {
    fn endpoint(&self, base: &url::Url, session: Option<&str>) -> Result<url::Url, url::ParseError> {
        base.join(&format!("session/{}/se/log", session.unwrap_or_default()))
    }

    fn method_and_body(&self, _url: &url::Url) -> (http::Method, Option<String>) {
        (http::Method::POST, Some(json!({ "type": "browser" }).to_string()))
    }
}

/// Whether chromedriver at `addr` answers its WebDriver `GET /status` as
/// ready: what listens there is chromedriver, not another process that took
/// the port between its choice and chromedriver's bind.
async fn driver_ready(addr: std::net::SocketAddr) -> bool {
    crate::http_get(addr, "/status", Duration::from_secs(2))
        .await
        .is_ok_and(|(code, body)| code == 200 && body.replace(' ', "").contains("\"ready\":true"))
}

/// Starts chromedriver on a free loopback port and waits until it answers
/// as ready; on a port taken meanwhile (chromedriver exits, or another
/// process answers), tries a fresh one, three times at most.
async fn start_driver(log_dir: &Path) -> (Proc, std::net::SocketAddr) {
    const ATTEMPTS: usize = 3;
    let log = log_dir.join("chromedriver.log");
    for attempt in 1..=ATTEMPTS {
        let port = free_addr().port();
        let mut cmd = Command::new(CHROMEDRIVER);
        cmd.arg(format!("--port={port}"))
            .arg(format!("--log-path={}", log_dir.join("chromedriver.verbose.log").display()));
        let mut driver = Proc::spawn("chromedriver", &mut cmd, &log);
        // chromedriver listens on localhost; the free address only chose the port.
        let local = std::net::SocketAddr::from(([127, 0, 0, 1], port));
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        loop {
            if driver_ready(local).await {
                return (driver, local);
            }
            if let Some(status) = driver.exited() {
                assert!(
                    attempt < ATTEMPTS,
                    "chromedriver exited ({status}) {ATTEMPTS} times; its log:\n{}",
                    driver.log_text()
                );
                break;
            }
            if tokio::time::Instant::now() >= deadline {
                assert!(
                    attempt < ATTEMPTS,
                    "chromedriver did not answer as ready on {local} within 20 s, {ATTEMPTS} times; its log:\n{}",
                    driver.log_text()
                );
                break;
            }
            tokio::time::sleep(POLL_EVERY).await;
        }
    }
    unreachable!("every attempt either returns or panics on the last one")
}

impl Browser {
    /// Starts chromedriver and a headless Chromium; `None` (after a loud
    /// `SKIPPED` naming `test`) when either is not installed, and a panic
    /// instead under `CI=true` (see [`external::require`]). Its log goes to
    /// `log_dir/chromedriver.log`.
    pub async fn start(test: &str, log_dir: &Path) -> Option<Self> {
        if !external::require(test, Path::new(CHROMIUM), INSTALL)
            || !external::require(test, Path::new(CHROMEDRIVER), INSTALL)
        {
            return None;
        }
        let (driver, local) = start_driver(log_dir).await;
        let profile = tempfile::tempdir().expect("a temporary dir for the browser profile");
        let args = vec![
            "--headless=new".to_string(),
            // Tests run as root on CI machines, where the sandbox cannot start.
            "--no-sandbox".to_string(),
            "--disable-gpu".to_string(),
            "--disable-dev-shm-usage".to_string(),
            format!("--window-size={},{}", WINDOW.0, WINDOW.1),
            format!("--user-data-dir={}", profile.path().display()),
            "--no-first-run".to_string(),
            "--no-default-browser-check".to_string(),
            "--disable-background-networking".to_string(),
            "--disable-component-update".to_string(),
            "--disable-sync".to_string(),
            "--disable-extensions".to_string(),
            // The network, blocked but for loopback: Chromium sends loopback
            // directly and everything else (names included: the proxy would
            // resolve them) to this proxy address, where nothing listens.
            "--proxy-server=http://127.0.0.1:9".to_string(),
        ];
        let mut caps = serde_json::Map::new();
        caps.insert("browserName".into(), json!("chrome"));
        caps.insert("goog:chromeOptions".into(), json!({ "binary": CHROMIUM, "args": args }));
        caps.insert("goog:loggingPrefs".into(), json!({ "browser": "ALL" }));
        let connector = hyper_util::client::legacy::connect::HttpConnector::new();
        let client = fantoccini::ClientBuilder::new(connector)
            .capabilities(caps)
            .connect(&format!("http://{local}"))
            .await
            .unwrap_or_else(|e| {
                panic!("chromedriver would not open a Chromium session: {e}; its log:\n{}", driver.log_text())
            });
        Some(Self { client, _driver: driver, _profile: profile })
    }

    /// The session, for what the helpers below do not cover.
    pub fn client(&self) -> &fantoccini::Client {
        &self.client
    }

    /// Opens `url` and waits for the document to load.
    pub async fn goto(&self, url: &str) {
        self.client.goto(url).await.unwrap_or_else(|e| panic!("open {url}: {e}"));
    }

    /// Runs `script` (a function body; `arguments` are `args`) in the page
    /// and returns what it returns.
    pub async fn eval(&self, script: &str, args: Vec<Value>) -> Value {
        self.client.execute(script, args).await.unwrap_or_else(|e| panic!("script failed: {e}\n{script}"))
    }

    /// Polls `script` until it returns something other than `null`,
    /// `false` or `undefined`, and returns that; panics naming `what`, with
    /// the page's text, when `timeout` passes.
    pub async fn wait_for(&self, what: &str, timeout: Duration, script: &str, args: Vec<Value>) -> Value {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let v = self.eval(script, args.clone()).await;
            if !v.is_null() && v != Value::Bool(false) {
                return v;
            }
            if tokio::time::Instant::now() >= deadline {
                let text = self.eval("return document.body.innerText", vec![]).await;
                panic!(
                    "timed out after {timeout:?} waiting for: {what}; the page says:\n{}",
                    text.as_str().unwrap_or("")
                );
            }
            tokio::time::sleep(POLL_EVERY).await;
        }
    }

    /// Clicks the element `css` selects. A page that re-renders while the
    /// click is on its way (the console refreshes its tables every second)
    /// leaves a stale element: found again and clicked again, within 10 s.
    pub async fn click(&self, css: &str) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        loop {
            let clicked = match self.client.find(fantoccini::Locator::Css(css)).await {
                Ok(el) => el.click().await,
                Err(e) => Err(e),
            };
            match clicked {
                Ok(()) => return,
                Err(e) if e.to_string().contains("stale element") && tokio::time::Instant::now() < deadline => {
                    tokio::time::sleep(POLL_EVERY).await;
                }
                Err(e) => panic!("click {css}: {e}"),
            }
        }
    }

    /// Replaces the value of the input `css` selects with `text`, typed.
    pub async fn type_into(&self, css: &str, text: &str) {
        let el = self.client.find(fantoccini::Locator::Css(css)).await.unwrap_or_else(|e| panic!("no {css}: {e}"));
        el.clear().await.unwrap_or_else(|e| panic!("clear {css}: {e}"));
        el.send_keys(text).await.unwrap_or_else(|e| panic!("type into {css}: {e}"));
    }

    /// A PNG of the window, written to `dir/name.png`; returns its path.
    pub async fn screenshot(&self, dir: &Path, name: &str) -> PathBuf {
        let png = self.client.screenshot().await.unwrap_or_else(|e| panic!("screenshot {name}: {e}"));
        std::fs::create_dir_all(dir).unwrap_or_else(|e| panic!("create {}: {e}", dir.display()));
        let path = dir.join(format!("{name}.png"));
        std::fs::write(&path, png).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
        path
    }

    /// The browser's log entries of level `SEVERE` since the last call:
    /// script errors, console errors, refused policies, failed loads. Each
    /// is its message.
    pub async fn severe_logs(&self) -> Vec<String> {
        let v = self.client.issue_cmd(BrowserLog).await.unwrap_or_else(|e| panic!("read the browser log: {e}"));
        v.as_array()
            .into_iter()
            .flatten()
            .filter(|e| e["level"] == "SEVERE")
            .map(|e| e["message"].as_str().unwrap_or_default().to_string())
            .collect()
    }

    /// Every resource the page loaded (scripts, styles, images, fetches),
    /// by URL, from the page's resource timing entries.
    pub async fn loaded_urls(&self) -> Vec<String> {
        let v = self
            .eval("return performance.getEntriesByType('resource').map(e => e.name).concat([location.href])", vec![])
            .await;
        v.as_array().into_iter().flatten().filter_map(|u| u.as_str().map(str::to_string)).collect()
    }

    /// Ends the session (the browser exits); chromedriver stops when the
    /// value is dropped.
    pub async fn close(self) {
        let _ = self.client.close().await;
    }
}
