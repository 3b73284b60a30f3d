//! `qwasi start` / `status` / `stop` round trip with a private state directory.

mod common;

use common::*;
use std::time::Duration;

#[test]
fn start_status_stop_round_trip() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().to_str().unwrap();
    let port = free_port().to_string();
    let started = start(state, &port, &[]);
    assert_eq!(started["started"], true);
    let pid = started["pid"].as_u64().unwrap();
    let addr = format!("127.0.0.1:{port}");
    // It serves, and `start` has returned (the server runs detached).
    assert_eq!(request(&addr, "GET", "/ok", &[], "").status, 200);

    // A second instance on the same host:port is refused.
    let out = qwasi(&as_strs(&start_args(state, &port, &[])));
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
    let stopped = stop(state, &port);
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

/// `qwasi start` of the fixture model with the misbehaving test guest on
/// `port`, recorded in `state`, with `extra` flags.
fn start_args(state: &str, port: &str, extra: &[&str]) -> Vec<String> {
    let (model, cache, guest) = (fixture_model(), compile_cache(), misbehave_guest());
    let common = [
        "start",
        "--port",
        port,
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
    common.iter().chain(extra).map(|a| a.to_string()).collect()
}

fn as_strs(args: &[String]) -> Vec<&str> {
    args.iter().map(String::as_str).collect()
}

/// `start_args`' server, started; asserts it started and returns the report.
fn start(state: &str, port: &str, extra: &[&str]) -> serde_json::Value {
    let out = qwasi(&as_strs(&start_args(state, port, extra)));
    assert!(
        out.status.success(),
        "start failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// `qwasi stop` (graceful, 60 s drain) of the server on `port`; asserts it
/// succeeded and returns its JSON report.
fn stop(state: &str, port: &str) -> serde_json::Value {
    let out = qwasi(&[
        "stop",
        "--state-dir",
        state,
        "--port",
        port,
        "--timeout",
        "60s",
    ]);
    assert!(
        out.status.success(),
        "stop failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// Stops a server started by a test even when an assertion fails.
struct KillOnDrop(u64);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = std::process::Command::new("kill")
            .arg(self.0.to_string())
            .status();
    }
}

#[test]
fn start_passes_api_keys_through_the_environment_not_the_command_line() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().to_str().unwrap();
    let port = free_port().to_string();
    let (k1, k2) = ("sk-daemon-first-4f1c", "sk-daemon-second-9a2e");
    let started = start(state, &port, &["--api-key", k1, &format!("--api-key={k2}")]);
    let pid = started["pid"].as_u64().unwrap();
    let guard = KillOnDrop(pid);
    let addr = format!("127.0.0.1:{port}");

    // The background server enforces both keys.
    let get = |key: Option<&str>| {
        let auth = key.map(|k| format!("Bearer {k}"));
        let headers: Vec<(&str, &str)> =
            auth.iter().map(|a| ("Authorization", a.as_str())).collect();
        request(&addr, "GET", "/ok", &headers, "").status
    };
    assert_eq!(get(None), 401);
    assert_eq!(get(Some("sk-wrong")), 401);
    assert_eq!(get(Some(k1)), 200);
    assert_eq!(get(Some(k2)), 200);

    // Neither key is on its command line; it got them in its environment.
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap();
    let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
    assert!(cmdline.contains(" serve "), "{cmdline}");
    for k in [k1, k2] {
        assert!(!cmdline.contains(k), "key on the command line: {cmdline}");
    }
    assert!(!cmdline.contains("--api-key"), "{cmdline}");
    let environ = std::fs::read(format!("/proc/{pid}/environ")).unwrap();
    let environ = String::from_utf8_lossy(&environ);
    assert!(
        environ
            .split('\0')
            .any(|v| v == format!("QWASI_API_KEY={k1},{k2}")),
        "QWASI_API_KEY not passed"
    );
    // Nor in the log.
    let log =
        std::fs::read_to_string(dir.path().join(format!("server-127.0.0.1-{port}.log"))).unwrap();
    assert!(!log.contains(k1) && !log.contains(k2), "{log}");

    stop(state, &port);
    // Stopped: nothing left to kill (its pid may be reused).
    std::mem::forget(guard);
}

/// What `qwasi stop` does on Windows (no signals there): it writes the
/// server's stop file, which `serve` watches on every platform. A stop file
/// left over from an earlier run does not stop the next server.
#[test]
fn the_stop_file_drains_and_stops_the_server() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().to_str().unwrap();
    let port = free_port().to_string();
    let stop_file = dir.path().join(format!("server-127.0.0.1-{port}.stop"));
    std::fs::write(&stop_file, "stale").unwrap();
    let started = start(state, &port, &[]);
    let guard = KillOnDrop(started["pid"].as_u64().unwrap());
    let addr = format!("127.0.0.1:{port}");
    assert!(!stop_file.exists(), "the stale stop file was not cleared");
    // Longer than the server's poll of its stop file: still serving.
    std::thread::sleep(Duration::from_millis(600));
    assert_eq!(request(&addr, "GET", "/ok", &[], "").status, 200);

    std::fs::write(&stop_file, "stop\n").unwrap();
    wait_until("port closed", Duration::from_secs(30), || {
        std::net::TcpStream::connect(&addr).is_err()
    });
    let state_file = dir.path().join(format!("server-127.0.0.1-{port}.json"));
    wait_until("state file removed", Duration::from_secs(10), || {
        !state_file.exists()
    });
    assert!(!stop_file.exists());
    let log =
        std::fs::read_to_string(dir.path().join(format!("server-127.0.0.1-{port}.log"))).unwrap();
    assert!(log.contains("drained"), "{log}");
    std::mem::forget(guard);
}
