//! Several API guests at once: `--guest PREFIX=FILE` mounts, routed by the
//! longest matching path prefix (on a segment boundary), with the native
//! endpoints first and an OpenAI-style 404 for unmatched paths; startup
//! validation of the guest files. Real server, real HTTP, real components:
//! the bundled OpenAI guest (from a file) and tests/guests/misbehave, which
//! answers `ok` for any path but its test paths.

mod common;

use common::*;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn is_model_list(r: &Resp) -> bool {
    r.status == 200
        && serde_json::from_str::<serde_json::Value>(&r.body).is_ok_and(|j| j["object"] == "list")
}

#[test]
fn two_guests_on_two_prefixes() {
    let s = Server::start(&[
        "--guest",
        &format!("/v1={}", openai_guest()),
        "--guest",
        &format!("/t/={}", misbehave_guest()),
        "--no-default-guest",
    ]);
    // The OpenAI guest at /v1 sees the whole path.
    let r = s.get("/v1/models");
    assert!(is_model_list(&r), "{r:?}");
    let r = request(
        &s.addr,
        "POST",
        "/v1/completions",
        &[],
        &format!(
            r#"{{"model": {}, "prompt": [1, 2, 3], "max_tokens": 3, "temperature": 0}}"#,
            r.json()["data"][0]["id"]
        ),
    );
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(r.json()["object"], "text_completion");

    // The misbehave guest at /t (mounted as "/t/": the slash is dropped).
    for p in ["/t", "/t/", "/t/anything/deeper?x=1"] {
        let r = s.get(p);
        assert_eq!((r.status, r.body.as_str()), (200, "ok"), "{p}");
    }
    let r = request(&s.addr, "POST", "/t/x", &[], "{}");
    assert_eq!((r.status, r.body.as_str()), (200, "ok"));

    // Unmatched paths (segment boundary: /tx is not under /t): the host's 404.
    for p in ["/tx", "/v2/models", "/", "/nothing"] {
        let r = s.get(p);
        assert_eq!(r.status, 404, "{p}: {r:?}");
        let j = r.json();
        assert_eq!(j["error"]["code"], "not_found", "{p}");
        assert_eq!(j["error"]["type"], "invalid_request_error", "{p}");
        assert!(
            j["error"]["message"]
                .as_str()
                .unwrap()
                .contains(&format!("GET {}", p.split('?').next().unwrap())),
            "{j}"
        );
    }

    // The native endpoints keep priority.
    assert_eq!(s.get("/health").json()["state"], "ready");
    assert_eq!(s.get("/ready").status, 200);
    let m = s.get("/metrics");
    assert_eq!(m.status, 200);
    for line in [
        "qwasi_guest_version{guest=\"/v1\"} 1",
        "qwasi_guest_version{guest=\"/t\"} 1",
        "qwasi_guest_reloads_total{guest=\"/t\",result=\"ok\"} 0",
        "qwasi_requests_total{status=\"404\"}",
    ] {
        assert!(
            m.body.contains(line),
            "/metrics lacks {line:?}:\n{}",
            m.body
        );
    }
}

#[test]
fn bundled_guest_stays_at_root_and_longest_prefix_wins() {
    let s = Server::start(&[
        "--guest",
        &format!("/t={}", misbehave_guest()),
        "--guest",
        &format!("/t/deep={}", openai_guest()),
    ]);
    // The bundled OpenAI guest still serves / ...
    let r = s.get("/v1/models");
    assert!(is_model_list(&r), "{r:?}");
    // ... and answers unknown paths with its own 404.
    let r = s.get("/nothing");
    assert_eq!(r.status, 404, "{r:?}");
    assert_eq!(r.error_code(), "not_found");
    // /t goes to misbehave, /t/deep to the OpenAI guest (which knows no
    // /t/deep/... path: its 404 proves the request reached it).
    assert_eq!(s.get("/t/x").body, "ok");
    assert_eq!(s.get("/t/deeper").body, "ok");
    let r = s.get("/t/deep/v1/models");
    assert_eq!(r.status, 404, "{r:?}");
    assert!(
        r.json()["error"]["message"]
            .as_str()
            .unwrap()
            .contains("/t/deep/v1/models"),
        "{r:?}"
    );
}

/// The bundled Anthropic Messages guest: mounted at /v1/messages beside the
/// OpenAI guest at / (longest prefix wins), with `x-api-key` auth through the
/// bundled policy and host errors readable as Anthropic errors.
#[test]
fn bundled_anthropic_guest_at_v1_messages() {
    // The embedded demo model: the chat APIs need its tokenizer.
    let s = Server::start_with(&["--api-key", "sk-anthropic-test", "--threads", "1"], false);
    let body = r#"{"model": "claude-x", "max_tokens": 3, "temperature": 0, "messages": [{"role": "user", "content": "Hi"}]}"#;
    let key = [
        ("x-api-key", "sk-anthropic-test"),
        ("anthropic-version", "2023-06-01"),
    ];
    let r = request(&s.addr, "POST", "/v1/messages", &key, body);
    assert_eq!(r.status, 200, "{r:?}");
    let m = r.json();
    assert_eq!(m["type"], "message");
    assert_eq!(m["model"], "claude-x");
    assert_eq!(m["usage"]["output_tokens"], 3);
    assert_eq!(m["stop_reason"], "max_tokens");
    let r = request(&s.addr, "POST", "/v1/messages/count_tokens", &key, body);
    assert_eq!(r.status, 200, "{r:?}");
    assert!(r.json()["input_tokens"].as_u64().unwrap() > 0);
    // The Anthropic guest's own errors, in its shape.
    let r = request(&s.addr, "POST", "/v1/messages", &key, r#"{"model": "m"}"#);
    assert_eq!(r.status, 400, "{r:?}");
    assert_eq!(r.json()["type"], "error");
    assert_eq!(r.json()["error"]["type"], "invalid_request_error");
    // No key: the host's 401, readable by both SDKs.
    let r = request(&s.addr, "POST", "/v1/messages", &[], body);
    assert_eq!(r.status, 401, "{r:?}");
    assert_eq!(r.json()["type"], "error");
    assert_eq!(r.json()["error"]["type"], "authentication_error");
    // Everything else still goes to the OpenAI guest at /, Bearer auth too.
    let r = request(
        &s.addr,
        "GET",
        "/v1/models",
        &[("authorization", "Bearer sk-anthropic-test")],
        "",
    );
    assert!(is_model_list(&r), "{r:?}");
    // Segment boundary: /v1/messagesX is not under /v1/messages.
    let r = request(&s.addr, "POST", "/v1/messagesX", &key, "{}");
    assert_eq!((r.status, r.error_code().as_str()), (404, "not_found"));
    assert!(s.log_text().contains("/v1/messages"), "{}", s.log_text());
}

/// `--guest` at /v1/messages replaces the bundled Anthropic guest, and
/// `--no-default-guest` drops it with the OpenAI one.
#[test]
fn flags_rule_over_the_bundled_anthropic_guest() {
    let s = Server::start(&["--guest", &format!("/v1/messages={}", misbehave_guest())]);
    assert_eq!(s.get("/v1/messages/anything").body, "ok");
    assert!(is_model_list(&s.get("/v1/models")));
    drop(s);
    let s = Server::start(&[
        "--no-default-guest",
        "--guest",
        &format!("/v1={}", openai_guest()),
    ]);
    // The OpenAI guest at /v1 gets /v1/messages: its own 404.
    let r = request(&s.addr, "POST", "/v1/messages", &[], "{}");
    assert_eq!(r.status, 404, "{r:?}");
    assert_eq!(r.error_code(), "not_found");
    assert!(
        r.json()["error"]["message"]
            .as_str()
            .unwrap()
            .contains("/v1/messages")
    );
}

#[test]
fn plain_file_replaces_the_bundled_guest() {
    let s = Server::start(&["--guest", &misbehave_guest()]);
    assert_eq!(s.get("/v1/models").body, "ok");
    assert_eq!(s.get("/anything").body, "ok");
}

/// `qwasi serve ARGS` that must fail: its exit status and stderr.
fn serve_fails(args: &[&str]) -> String {
    let mut child = Command::new(QWASI)
        .args(["serve", "--port", "0", "--compile-cache", &compile_cache()])
        .args(["--model", &fixture_model(), "--threads", "1"])
        .args(args)
        .env_remove("QWASI_API_KEY")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let t0 = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if t0.elapsed() > Duration::from_secs(120) {
            let _ = child.kill();
            panic!("qwasi serve {args:?} kept running");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = child.wait_with_output().unwrap();
    assert!(!out.status.success(), "qwasi serve {args:?} succeeded");
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    let last = err.lines().last().unwrap_or_default().to_string();
    assert!(last.starts_with("error: "), "{err}");
    last
}

#[test]
fn bad_components_at_startup_are_one_clear_line() {
    let dir = tempfile::tempdir().unwrap();
    let garbage = dir.path().join("garbage.wasm");
    std::fs::write(&garbage, b"this is not wasm").unwrap();
    let garbage = garbage.display().to_string();

    let e = serve_fails(&["--guest", &format!("/x={garbage}")]);
    assert!(
        e.contains(&format!(
            "the API guest {garbage} (mounted at /x) is not a valid WebAssembly component"
        )),
        "{e}"
    );

    // A component of another world: the command example exports no handler.
    let e = serve_fails(&["--guest", &format!("/x={}", batch_complete())]);
    assert!(
        e.contains(&batch_complete())
            && e.contains("does not export wasi:http/incoming-handler")
            && e.contains("qwasi:inference/api"),
        "{e}"
    );

    // An API guest as the policy: it imports what a policy can't have.
    let e = serve_fails(&["--policy", &misbehave_guest()]);
    assert!(
        e.contains(&format!("the policy guest {}", misbehave_guest()))
            && e.contains("imports something the host does not provide")
            && e.contains("qwasi:inference/policy"),
        "{e}"
    );

    // A missing file fails before the model loads.
    let e = serve_fails(&["--guest", "/x=/nonexistent/guest.wasm"]);
    assert!(
        e.contains("cannot read the API guest /nonexistent/guest.wasm"),
        "{e}"
    );

    let e = serve_fails(&[
        "--guest",
        &format!("/a={}", misbehave_guest()),
        "--guest",
        &format!("/a/={}", openai_guest()),
    ]);
    assert!(e.contains("two API guests are mounted at /a"), "{e}");

    let e = serve_fails(&["--guest", "/a b=x.wasm"]);
    assert!(e.contains("is not a plain URL path"), "{e}");

    let e = serve_fails(&["--no-default-guest"]);
    assert!(e.contains("no API guest to serve"), "{e}");
}
