//! `qwasi start` / `status` / `stop` round trip with a private state directory.

mod common;

use common::*;
use std::process::Command;
use std::time::Duration;

fn qwasi(args: &[&str]) -> std::process::Output {
    Command::new(QWASI)
        .args(args)
        .env_remove("QWASI_API_KEY")
        .output()
        .expect("run qwasi")
}

#[test]
fn start_status_stop_round_trip() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().to_str().unwrap();
    let port = free_port().to_string();
    let model = fixture_model();
    let cache = compile_cache();
    let guest = misbehave_guest();
    let start_args = [
        "start",
        "--port",
        &port,
        "--state-dir",
        state,
        "--model",
        &model,
        "--guest",
        &guest,
        "--compile-cache",
        &cache,
        "--wait-timeout",
        "120s",
    ];

    let out = qwasi(&start_args);
    assert!(
        out.status.success(),
        "start failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let started: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(started["started"], true);
    let pid = started["pid"].as_u64().unwrap();
    let addr = format!("127.0.0.1:{port}");
    // It serves, and `start` has returned (the server runs detached).
    assert_eq!(request(&addr, "GET", "/ok", &[], "").status, 200);

    // A second instance on the same host:port is refused.
    let out = qwasi(&start_args);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("already running"), "{err}");

    // status: JSON from the state file and /health.
    let out = qwasi(&["status", "--state-dir", state]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let st: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(st["running"], true);
    assert_eq!(st["healthy"], true);
    assert_eq!(st["state"], "ready");
    assert_eq!(st["pid"].as_u64(), Some(pid));
    assert_eq!(st["health"]["queue"]["capacity"], 64);

    // stop: graceful drain, the process exits.
    let out = qwasi(&[
        "stop",
        "--state-dir",
        state,
        "--port",
        &port,
        "--timeout",
        "60s",
    ]);
    assert!(
        out.status.success(),
        "stop failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stopped: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(stopped["stopped"], true);
    wait_until("port closed", Duration::from_secs(10), || {
        std::net::TcpStream::connect(&addr).is_err()
    });

    // Not running any more: status fails.
    let out = qwasi(&["status", "--state-dir", state]);
    assert!(!out.status.success());
    // The log file has the banner and the drain.
    let log =
        std::fs::read_to_string(dir.path().join(format!("server-127.0.0.1-{port}.log"))).unwrap();
    assert!(log.contains("listening on"), "{log}");
    assert!(log.contains("drained"), "{log}");
}

#[test]
fn start_with_port_zero_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let out = qwasi(&[
        "start",
        "--port",
        "0",
        "--state-dir",
        dir.path().to_str().unwrap(),
    ]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("fixed --port"));
}

#[test]
fn stop_without_a_server_fails_clearly() {
    let dir = tempfile::tempdir().unwrap();
    let out = qwasi(&["stop", "--state-dir", dir.path().to_str().unwrap()]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("no qwasi server is recorded"));
}
