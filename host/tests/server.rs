//! End-to-end tests of `qwasi serve`: a real server process on 127.0.0.1, real
//! HTTP, real guests (the bundled ones and tests/guests/misbehave) and the real
//! engine on the tiny dense fixture model.
//!
//! The misbehave guest's `/gen?n=N` generates N tokens (greedy, ignore EOS)
//! and streams `id|` per token, so queue tests don't depend on the OpenAI
//! guest's output format.

mod common;

use common::*;
use std::io::Read;
use std::time::{Duration, Instant};

/// Long enough to keep the engine busy for a few seconds (context is 4096).
const LONG: &str = "/gen?n=4000";

#[test]
fn health_ready_and_metrics() {
    let s = Server::start(&["--guest", &misbehave_guest()]);
    let h = s.get("/health");
    assert_eq!(h.status, 200);
    let j = h.json();
    assert_eq!(j["status"], "ok");
    assert_eq!(j["state"], "ready");
    assert_eq!(j["queue"]["capacity"], 64);
    assert_eq!(s.get("/ready").status, 200);

    let r = s.get("/gen?n=3");
    assert_eq!(r.status, 200, "{r:?}");
    assert!(r.body.contains("finished"), "{r:?}");

    let m = s.get("/metrics");
    assert_eq!(m.status, 200);
    assert!(m.header("content-type").unwrap().starts_with("text/plain"));
    for name in [
        "qwasi_ready 1",
        "qwasi_guest_instances_total 1",
        "qwasi_http_requests_in_flight 0",
        "qwasi_queue_depth",
        "qwasi_requests_total{status=\"200\"} 1",
        "qwasi_completion_tokens_total",
        "qwasi_guest_traps_total 0",
    ] {
        assert!(
            m.body.contains(name),
            "/metrics lacks {name:?}:\n{}",
            m.body
        );
    }
}

#[test]
fn queue_full_is_429_with_retry_after() {
    let s = Server::start(&[
        "--guest",
        &misbehave_guest(),
        "--max-queue",
        "1",
        "--max-num-seqs",
        "1",
    ]);
    // A runs, B waits in the queue, C finds the queue full.
    let mut a = send(&s.addr, "GET", LONG, &[], "");
    assert_eq!(read_head(&mut a).0, 200);
    let b = send(&s.addr, "GET", "/gen?n=2", &[], "");
    wait_until("B queued", Duration::from_secs(10), || queued(&s) == 1);
    let c = request(&s.addr, "GET", "/gen?n=2", &[], "");
    assert_eq!(c.status, 429, "{c:?}");
    assert_eq!(c.body, "queue_full");
    let retry: u32 = c
        .header("retry-after")
        .expect("Retry-After")
        .parse()
        .unwrap();
    assert!(retry >= 1);
    drop(a); // cancels A, B runs
    let b = read_response(b);
    assert_eq!(b.status, 200, "{b:?}");
    assert!(b.body.contains("finished"));
}

#[test]
fn queue_timeout_is_503() {
    let s = Server::start(&[
        "--guest",
        &misbehave_guest(),
        "--queue-timeout",
        "300ms",
        "--max-num-seqs",
        "1",
    ]);
    let mut a = send(&s.addr, "GET", LONG, &[], "");
    assert_eq!(read_head(&mut a).0, 200);
    let t0 = Instant::now();
    let b = request(&s.addr, "GET", "/gen?n=2", &[], "");
    assert_eq!(b.status, 503, "{b:?}");
    assert_eq!(b.body, "queue_timeout");
    assert!(
        t0.elapsed() >= Duration::from_millis(280),
        "{:?}",
        t0.elapsed()
    );
    assert!(t0.elapsed() < Duration::from_secs(3), "{:?}", t0.elapsed());
}

#[test]
fn disconnect_cancels_the_generation_at_once() {
    let s = Server::start(&["--guest", &misbehave_guest(), "--max-num-seqs", "1"]);
    // Baseline: how long a short request takes on an idle engine.
    let t0 = Instant::now();
    assert_eq!(request(&s.addr, "GET", "/gen?n=2", &[], "").status, 200);
    let idle = t0.elapsed();

    // Disconnect mid-stream: the next request must start at once.
    let mut a = send(&s.addr, "GET", LONG, &[], "");
    assert_eq!(read_head(&mut a).0, 200);
    let mut buf = [0u8; 64];
    let _ = a.read(&mut buf).unwrap(); // tokens are flowing
    assert_eq!(running(&s), 1);
    drop(a);
    let t1 = Instant::now();
    let r = request(&s.addr, "GET", "/gen?n=2", &[], "");
    let after = t1.elapsed();
    assert_eq!(r.status, 200, "{r:?}");
    eprintln!("short request: idle {idle:?}, right after a disconnect {after:?}");
    // A 4000-token generation takes seconds; a cancelled one frees the engine
    // within one decode step.
    assert!(
        after < Duration::from_millis(1500),
        "next request took {after:?} (idle: {idle:?})"
    );
    let m = s.get("/metrics").body;
    assert!(
        m.contains("qwasi_requests_finished_total{reason=\"cancelled\"} 1"),
        "{m}"
    );

    // Disconnect while queued (before any response head): a closed socket
    // looks half-closed until the server writes (half-closed clients are
    // served: docs/SECURITY.md), so B leaves when the engine reaches it and
    // its first write fails, without generating its 4000 tokens.
    let mut a = send(&s.addr, "GET", LONG, &[], "");
    assert_eq!(read_head(&mut a).0, 200);
    let b = send(&s.addr, "GET", LONG, &[], "");
    wait_until("B queued", Duration::from_secs(10), || queued(&s) == 1);
    drop(b);
    drop(a);
    wait_until("engine idle", Duration::from_secs(5), || {
        running(&s) == 0 && queued(&s) == 0
    });
    let m = s.get("/metrics").body;
    assert!(
        m.contains("qwasi_requests_finished_total{reason=\"cancelled\"} 3"),
        "{m}"
    );
}

/// Continuous batching over real HTTP: streams sent together through the
/// OpenAI guest on the demo model all run at once — each one's first token
/// arrives before the first stream ends — and the engine's steps held
/// several sequences.
#[test]
fn concurrent_streams_progress_together() {
    let s = Server::start_with(&["--max-num-seqs", "4"], false);
    let model = s.get("/v1/models").json()["data"][0]["id"]
        .as_str()
        .unwrap()
        .to_string();
    let t0 = Instant::now();
    let streams: Vec<_> = (0..4)
        .map(|i| {
            let body = serde_json::json!({
                "model": model, "prompt": format!("Stream number {i} says"),
                "max_tokens": 40, "temperature": 0, "ignore_eos": true, "stream": true,
            })
            .to_string();
            let addr = s.addr.clone();
            std::thread::spawn(move || {
                let mut c = send(&addr, "POST", "/v1/completions", &[], &body);
                let (status, mut seen) = read_head(&mut c);
                assert_eq!(status, 200);
                let mut first = None;
                let mut buf = [0u8; 4096];
                loop {
                    if first.is_none() && String::from_utf8_lossy(&seen).contains("\"text\"") {
                        first = Some(t0.elapsed());
                    }
                    let n = c.read(&mut buf).unwrap();
                    if n == 0 {
                        break;
                    }
                    seen.extend_from_slice(&buf[..n]);
                }
                let body = dechunk(&String::from_utf8_lossy(&seen));
                assert!(body.contains("[DONE]"), "{body}");
                (first.expect("no token streamed"), t0.elapsed())
            })
        })
        .collect();
    let times: Vec<(Duration, Duration)> = streams.into_iter().map(|t| t.join().unwrap()).collect();
    let first_end = times.iter().map(|t| t.1).min().unwrap();
    for (i, (first, end)) in times.iter().enumerate() {
        eprintln!("stream {i}: first token {first:?}, end {end:?}");
        assert!(
            *first < first_end,
            "stream {i}'s first token came at {first:?}, after a stream ended at {first_end:?}"
        );
    }
    let steps = metric(&s, "qwasi_batch_size_count").unwrap();
    let rows = metric(&s, "qwasi_batch_size_sum").unwrap();
    assert!(rows >= steps * 2.0, "{rows} sequences in {steps} steps");
    // The gauge follows the engine's step, which can end after a client has
    // read its stream's last chunk.
    wait_until("no sequence running", Duration::from_secs(5), || {
        metric(&s, "qwasi_sequences_running") == Some(0.0)
    });
}

#[test]
fn drain_refuses_new_requests_and_finishes_running_ones() {
    let mut s = Server::start(&["--guest", &misbehave_guest(), "--max-num-seqs", "1"]);
    let mut a = send(&s.addr, "GET", "/gen?n=1500", &[], "");
    assert_eq!(read_head(&mut a).0, 200);
    let b = send(&s.addr, "GET", "/gen?n=5", &[], "");
    wait_until("B queued", Duration::from_secs(10), || queued(&s) == 1);
    s.signal("TERM");
    wait_until("draining", Duration::from_secs(5), || {
        s.get("/ready").status == 503
    });
    let c = request(&s.addr, "GET", "/gen?n=2", &[], "");
    assert_eq!(c.status, 503, "{c:?}");
    assert_eq!(c.error_code(), "service_shutting_down");
    assert_eq!(s.get("/health").json()["state"], "draining");
    // The running and the queued request both complete.
    let mut rest = Vec::new();
    a.read_to_end(&mut rest).unwrap();
    let body = dechunk(&String::from_utf8_lossy(&rest));
    assert!(
        body.contains("finished") && body.contains("Length 1500"),
        "{body}"
    );
    let b = read_response(b);
    assert_eq!(b.status, 200);
    assert!(b.body.contains("Length 5"), "{b:?}");
    let status = s.wait_exit(Duration::from_secs(20));
    assert!(status.success(), "{status}");
    s.wait_for_log("drained", Duration::from_secs(10));
}

#[test]
fn misbehaving_guests_fail_only_their_own_request() {
    let s = Server::start(&[
        "--guest",
        &misbehave_guest(),
        "--guest-cpu-limit",
        "500ms",
        "--guest-memory",
        "32MiB",
    ]);
    for path in ["/trap", "/oom", "/loop"] {
        let t0 = Instant::now();
        let r = s.get(path);
        assert_eq!(r.status, 500, "{path}: {r:?}");
        let j = r.json();
        assert_eq!(j["error"]["type"], "server_error", "{path}");
        assert_eq!(j["error"]["code"], "guest_error", "{path}");
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "{path} took {:?}",
            t0.elapsed()
        );
        if path == "/loop" {
            assert!(
                j["error"]["message"]
                    .as_str()
                    .unwrap()
                    .contains("CPU time limit"),
                "{j}"
            );
        }
        // The server keeps serving, guests and engine alike.
        let ok = s.get("/ok");
        assert_eq!(ok.status, 200, "after {path}");
        assert_eq!(ok.body, "ok");
        assert_eq!(s.get("/gen?n=2").status, 200, "after {path}");
    }
    let m = s.get("/metrics").body;
    assert!(m.contains("qwasi_guest_traps_total 3"), "{m}");
    assert!(m.contains("qwasi_guest_cpu_limit_exceeded_total 1"), "{m}");
}

#[test]
fn request_timeout_stops_a_spinning_guest_without_a_cpu_limit() {
    let s = Server::start(&[
        "--guest",
        &misbehave_guest(),
        "--request-timeout",
        "400ms",
        "--guest-cpu-limit",
        "0",
    ]);
    let t0 = Instant::now();
    let r = s.get("/loop");
    assert_eq!(r.status, 504, "{r:?}");
    assert_eq!(r.error_code(), "request_timeout");
    assert!(
        t0.elapsed() >= Duration::from_millis(380),
        "{:?}",
        t0.elapsed()
    );
    assert!(t0.elapsed() < Duration::from_secs(3), "{:?}", t0.elapsed());
    assert_eq!(s.get("/ok").status, 200);
    assert!(
        s.get("/metrics")
            .body
            .contains("qwasi_request_timeouts_total 1")
    );
}

#[test]
fn api_key_is_enforced_by_the_bundled_policy() {
    let s = Server::start(&["--guest", &misbehave_guest(), "--api-key", "sekrit"]);
    let r = s.get("/ok");
    assert_eq!(r.status, 401, "{r:?}");
    assert!(r.json()["error"]["code"].is_string(), "{r:?}");
    let r = request(
        &s.addr,
        "GET",
        "/ok",
        &[("Authorization", "Bearer wrong")],
        "",
    );
    assert_eq!(r.status, 401, "{r:?}");
    let r = request(
        &s.addr,
        "GET",
        "/ok",
        &[("Authorization", "Bearer sekrit")],
        "",
    );
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(r.body, "ok");
    // Native routes need no key.
    assert_eq!(s.get("/health").status, 200);
    assert_eq!(s.get("/ready").status, 200);
    assert!(
        s.get("/metrics")
            .body
            .contains("qwasi_policy_denials_total 2")
    );
}

#[test]
fn without_a_key_everything_is_open_on_loopback() {
    let s = Server::start(&["--guest", &misbehave_guest()]);
    let r = request(
        &s.addr,
        "GET",
        "/ok",
        &[("Authorization", "Bearer whatever")],
        "",
    );
    assert_eq!(r.status, 200, "{r:?}");
}

#[test]
fn bundled_openai_guest_answers() {
    let s = Server::start(&["--api-key", "k1"]);
    assert_eq!(s.get("/v1/models").status, 401);
    let r = request(
        &s.addr,
        "GET",
        "/v1/models",
        &[("Authorization", "Bearer k1")],
        "",
    );
    assert_eq!(r.status, 200, "{r:?}");
    assert!(r.body.contains("dense"), "{r:?}");
}

#[test]
fn non_loopback_bind_needs_an_api_key() {
    let out = std::process::Command::new(QWASI)
        .args([
            "serve",
            "--host",
            "0.0.0.0",
            "--port",
            "0",
            "--model",
            &fixture_model(),
        ])
        .env_remove("QWASI_API_KEY")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("refusing to listen on 0.0.0.0 without an API key"),
        "{err}"
    );
    assert!(err.contains("--allow-unauthenticated"), "{err}");

    // With --allow-unauthenticated it starts.
    let s = Server::start(&[
        "--guest",
        &misbehave_guest(),
        "--host",
        "0.0.0.0",
        "--allow-unauthenticated",
    ]);
    assert_eq!(s.get("/ready").status, 200);
}

#[test]
fn unknown_backend_is_a_clear_error() {
    let out = std::process::Command::new(QWASI)
        .args(["serve", "--port", "0", "--backend", "cuda"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("backend \"cuda\" is not available"), "{err}");
}

#[test]
fn openai_guest_maps_a_full_queue_to_429() {
    // The demo model (a tokenizer): A streams text, so a client that goes
    // away is noticed at A's next chunk (a half-closed client still gets its
    // response, so a read EOF alone does not cancel: docs/SECURITY.md).
    let s = Server::start_with(&["--max-queue", "1", "--max-num-seqs", "1"], false);
    let long = r#"{"model":"qwasi-demo","prompt":"hi","max_tokens":30000,"ignore_eos":true,"stream":true}"#;
    let short = r#"{"model":"qwasi-demo","prompt":[1,2,3],"max_tokens":2,"ignore_eos":true}"#;
    let mut a = send(&s.addr, "POST", "/v1/completions", &[], long);
    assert_eq!(read_head(&mut a).0, 200);
    let b = send(&s.addr, "POST", "/v1/completions", &[], short);
    wait_until("B queued", Duration::from_secs(10), || queued(&s) == 1);
    let c = request(&s.addr, "POST", "/v1/completions", &[], short);
    assert_eq!(c.status, 429, "{c:?}");
    assert_eq!(c.error_code(), "queue_full");
    assert!(c.header("retry-after").is_some(), "{c:?}");
    drop(a); // the client goes away: A is cancelled and B runs at once
    let t0 = Instant::now();
    let b = read_response(b);
    assert_eq!(b.status, 200, "{b:?}");
    assert_eq!(b.json()["usage"]["completion_tokens"], 2, "{b:?}");
    assert!(
        t0.elapsed() < Duration::from_millis(1500),
        "{:?}",
        t0.elapsed()
    );
}

/// Waits out the last seconds of a wall-clock minute, so that a test's few
/// requests fall into one fixed 60 s rate-limit window.
fn avoid_minute_boundary() {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    if secs % 60 >= 50 {
        std::thread::sleep(Duration::from_secs(61 - secs % 60));
    }
}

#[test]
fn rate_limit_per_api_key_through_host_counters() {
    let s = Server::start(&[
        "--api-key",
        "a:ka",
        "--api-key",
        "b:kb",
        "--policy-setting",
        "max-requests-per-minute=2",
    ]);
    avoid_minute_boundary();
    let models = |key: &str| {
        let auth = format!("Bearer {key}");
        request(
            &s.addr,
            "GET",
            "/v1/models",
            &[("Authorization", &auth)],
            "",
        )
    };
    for _ in 0..2 {
        let r = models("ka");
        assert_eq!(r.status, 200, "{r:?}");
    }
    let r = models("ka");
    assert_eq!(r.status, 429, "{r:?}");
    assert_eq!(r.error_code(), "rate_limit_exceeded", "{r:?}");
    let retry: u32 = r
        .header("retry-after")
        .expect("Retry-After")
        .parse()
        .unwrap();
    assert!((1..=60).contains(&retry), "{r:?}");
    // Another key has its own counter.
    for _ in 0..2 {
        let r = models("kb");
        assert_eq!(r.status, 200, "{r:?}");
    }
    assert_eq!(models("kb").status, 429);
}

#[test]
fn rate_limit_without_api_keys_is_per_client_ip() {
    // A --policy-setting alone loads the bundled policy.
    let s = Server::start(&["--policy-setting", "max-requests-per-minute=1"]);
    avoid_minute_boundary();
    assert_eq!(s.get("/v1/models").status, 200);
    let r = s.get("/v1/models");
    assert_eq!(r.status, 429, "{r:?}");
    assert_eq!(r.error_code(), "rate_limit_exceeded", "{r:?}");
    assert!(r.header("retry-after").is_some(), "{r:?}");
}
