//! Servers the kit does not ship (InfluxDB today; PostgreSQL, a browser
//! later). A test that needs one asks [`require`] first: when the program is
//! missing the test is skipped with a message nobody can overlook, unless
//! `CI=true`, where a missing server is a broken CI machine and fails the
//! test.

use std::path::Path;

/// Whether `program` is installed. When it is not, prints a loud `SKIPPED`
/// naming `test` and how to install it (`install`), and returns `false`;
/// with `CI=true` it panics instead.
pub fn require(test: &str, program: &Path, install: &str) -> bool {
    if program.exists() {
        return true;
    }
    let why = format!("{test}: {} not found; install it with {install}", program.display());
    assert!(!on_ci(), "{why} (CI=true: a CI machine must have it)");
    let bar = "!".repeat(72);
    eprintln!("\n\n{bar}\n!! SKIPPED {why}\n{bar}\n");
    false
}

/// Whether this runs on CI (`CI=true`, as CI services set it).
pub fn on_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v.eq_ignore_ascii_case("true") || v == "1")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_installed_program_is_required_silently() {
        assert!(require("self", &std::env::current_exe().unwrap(), "cargo"));
    }

    #[test]
    fn a_missing_program_skips_or_fails_on_ci() {
        let missing = Path::new("/nonexistent/fencer-testkit-no-such-server");
        let r = std::panic::catch_unwind(|| require("self", missing, "nothing"));
        if on_ci() {
            assert!(r.is_err(), "CI=true must fail the test");
        } else {
            assert!(!r.unwrap(), "a missing server skips");
        }
    }
}
