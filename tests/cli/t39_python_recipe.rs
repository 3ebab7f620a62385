//! The Python JSON recipe of docs/client.md, run as written (issue 15
//! item 9) against a real `fencer dev`: the block after the
//! `<!-- recipe: python-json -->` marker. Skipped with a loud message when
//! there is no `python3` (failing under `CI=true`).

use std::process::Command;

use fencer_testkit::{free_port, spawn_dev};

/// The first fenced block after `marker` in `doc`.
fn block_after<'a>(doc: &'a str, marker: &str) -> &'a str {
    let rest = &doc[doc.find(marker).unwrap_or_else(|| panic!("docs/client.md has {marker}"))..];
    let start = rest.find("```python\n").expect("a python block") + "```python\n".len();
    let len = rest[start..].find("\n```").expect("the end of the block");
    &rest[start..start + len]
}

#[test]
fn t39_the_python_json_recipe_runs_against_fencer_dev() {
    if Command::new("python3").arg("--version").output().is_err() {
        assert!(std::env::var("CI").as_deref() != Ok("true"), "python3 is required under CI=true");
        eprintln!("SKIPPED t39: no python3 on this machine");
        return;
    }
    let doc = include_str!("../../docs/client.md");
    let recipe = block_after(doc, "<!-- recipe: python-json -->");
    let tmp = tempfile::tempdir().unwrap();
    let script = tmp.path().join("recipe.py");
    std::fs::write(&script, recipe).unwrap();
    let port = free_port();
    let mut node = spawn_dev(&tmp.path().join("data"), port, &tmp.path().join("dev.log"));
    let out =
        Command::new("python3").arg(&script).env("FENCER_URL", format!("http://127.0.0.1:{port}")).output().unwrap();
    node.terminate(std::time::Duration::from_secs(10));
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "the recipe failed: {stdout}\n{stderr}");
    for line in [
        "acquired recipes/python token ",
        "second acquire refused: LOCK_HELD held with token ",
        "renewed until ",
        "retry after release: LEASE_ENDED original token ",
        "unknown field refused: INVALID_ARGUMENT ttl",
    ] {
        assert!(stdout.contains(line), "the recipe printed {line:?}: {stdout}");
    }
}
