//! `fencer dev --tls` as a real process: it creates a local CA and
//! certificates once (private keys 0600) and reuses them, prints the client
//! command line that works, refuses plaintext clients, and the CLI's TLS
//! flags (`--ca`, `--cert`, `--key`) reach it.

use std::os::unix::fs::PermissionsExt as _;
use std::time::Duration;

use fencer_testkit::{free_port, run, run_json, spawn_fencer, wait_ready};

#[test]
fn t87_dev_tls_prints_working_client_flags_and_refuses_plaintext() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let (port, status_port) = (free_port(), free_port());
    let ep = format!("127.0.0.1:{port}");
    let args = [
        "dev",
        "--tls",
        "--data-dir",
        data.to_str().unwrap(),
        "--listen",
        &ep,
        "--status-listen",
        &format!("127.0.0.1:{status_port}"),
    ];
    let mut node = spawn_fencer(&args, &dir.path().join("dev1.log"));
    wait_ready(status_port, Duration::from_secs(20), &mut node);

    let tls = data.join("tls");
    for key in ["ca.key", "node.key", "client.key"] {
        let mode = std::fs::metadata(tls.join(key)).unwrap().permissions().mode();
        assert_eq!(mode & 0o077, 0, "{key} is readable by others: {mode:o}");
    }
    let banner = node.log_text();
    let line = format!(
        "fencer acquire orders/42 --endpoints {ep} --ca {}",
        std::fs::canonicalize(tls.join("ca.pem")).unwrap().display()
    );
    assert!(banner.contains(&line) && banner.contains("--cert ") && banner.contains("--key "), "{banner}");
    assert!(banner.contains("INSECURE"), "the banner states what is insecure: {banner}");

    let (ca, cert, key) = (tls.join("ca.pem"), tls.join("client.pem"), tls.join("client.key"));
    let flags = [
        "--endpoints",
        &ep,
        "--ca",
        ca.to_str().unwrap(),
        "--cert",
        cert.to_str().unwrap(),
        "--key",
        key.to_str().unwrap(),
    ];
    let with = |cmd: &[&str]| -> Vec<String> { cmd.iter().chain(&flags).map(|s| s.to_string()).collect() };
    let acquire = with(&["acquire", "tls/orders", "-o", "json"]);
    let (code, v) = run_json(&acquire.iter().map(String::as_str).collect::<Vec<_>>());
    assert_eq!(code, 0, "{v}");

    // The same command in plaintext does not reach the lock API.
    let (code, _, err) = run(&["get", "tls/orders", "--endpoints", &ep]);
    assert_ne!(code, 0, "plaintext get succeeded against a TLS node");
    assert!(!err.is_empty());

    // fencer status (gRPC, every member it learns of) works over TLS too.
    let status = with(&["status", "-o", "json"]);
    let (code, out, err) = run(&status.iter().map(String::as_str).collect::<Vec<_>>());
    assert_eq!(code, 0, "{out}{err}");

    // fencer top speaks the JSON endpoints with the same flags.
    let top = with(&["top", "-o", "json"]);
    let (code, out, err) = run(&top.iter().map(String::as_str).collect::<Vec<_>>());
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("tls/orders"), "{out}");

    // TLS without the client certificate: mTLS is required.
    let (code, _, err) = run(&["get", "tls/orders", "--endpoints", &ep, "--ca", ca.to_str().unwrap()]);
    assert_ne!(code, 0, "a client without a certificate was served");
    assert!(err.contains("UNAUTHENTICATED"), "{err}");

    // A restart reuses the certificates.
    let before = std::fs::read(&ca).unwrap();
    assert!(node.terminate(Duration::from_secs(10)).is_some_and(|s| s.success()));
    let mut node = spawn_fencer(&args, &dir.path().join("dev2.log"));
    wait_ready(status_port, Duration::from_secs(20), &mut node);
    assert_eq!(std::fs::read(&ca).unwrap(), before, "the CA was replaced on restart");
    let get = with(&["get", "tls/orders", "-o", "json"]);
    let (code, v) = run_json(&get.iter().map(String::as_str).collect::<Vec<_>>());
    assert_eq!((code, v["held"].as_bool()), (0, Some(true)), "{v}");
}
