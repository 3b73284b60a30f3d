//! Hot reload of guest files: on change (the watcher), on SIGHUP and on
//! `POST /admin/reload`. The mounted file switches between
//! tests/guests/misbehave (answers `ok` everywhere, streams `/gen`) and the
//! OpenAI guest (answers `/v1/models` with a JSON list), so a response shows
//! which version served it.

mod common;

use common::*;
use std::io::Read;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

#[derive(Debug, PartialEq)]
enum Version {
    Misbehave,
    OpenAi,
}

/// Which guest answered `GET /v1/models`, or why the request failed.
fn which(r: &Resp) -> Result<Version, String> {
    if r.status == 200 && r.body == "ok" {
        return Ok(Version::Misbehave);
    }
    if r.status == 200
        && serde_json::from_str::<serde_json::Value>(&r.body).is_ok_and(|j| j["object"] == "list")
    {
        return Ok(Version::OpenAi);
    }
    Err(format!("{} {:?}", r.status, r.body))
}

fn serving(s: &Server) -> Result<Version, String> {
    which(&s.get("/v1/models"))
}

fn read(p: &str) -> Vec<u8> {
    std::fs::read(p).unwrap()
}

/// A guest file in a temporary directory, starting as the misbehave guest.
fn guest_file(dir: &Path) -> std::path::PathBuf {
    let f = dir.join("guest.wasm");
    std::fs::write(&f, read(&misbehave_guest())).unwrap();
    f
}

#[test]
fn file_changes_reload_without_failing_a_request() {
    let dir = tempfile::tempdir().unwrap();
    let file = guest_file(dir.path());
    let s = Arc::new(Server::start(&[
        "--guest",
        file.to_str().unwrap(),
        "--watch-interval",
        "100ms",
    ]));
    assert_eq!(serving(&s), Ok(Version::Misbehave));

    // Clients keep requests going through every swap.
    let stop = Arc::new(AtomicBool::new(false));
    let counts = Arc::new([AtomicU64::new(0), AtomicU64::new(0)]);
    let failures = Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let clients: Vec<_> = (0..4)
        .map(|_| {
            let (s, stop, counts, failures) =
                (s.clone(), stop.clone(), counts.clone(), failures.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    match serving(&s) {
                        Ok(Version::Misbehave) => counts[0].fetch_add(1, Ordering::Relaxed),
                        Ok(Version::OpenAi) => counts[1].fetch_add(1, Ordering::Relaxed),
                        Err(e) => {
                            failures.lock().unwrap().push(e);
                            0
                        }
                    };
                }
            })
        })
        .collect();

    // A long streamed request started on the misbehave version.
    let mut stream = send(&s.addr, "GET", "/gen?n=4000", &[], "");
    assert_eq!(read_head(&mut stream).0, 200);

    // 1. Swap to the OpenAI guest.
    replace_file(&file, &read(&openai_guest()));
    wait_until("the OpenAI guest serving", Duration::from_secs(60), || {
        serving(&s) == Ok(Version::OpenAi)
    });
    // The request in flight was still running at the swap, and finished on
    // the version it started with.
    assert_eq!(running(&s), 1, "the streamed request ended before the swap");
    let mut rest = String::new();
    let _ = stream.read_to_string(&mut rest);
    assert!(
        rest.contains("finished FinishReason::Length 4000"),
        "the in-flight stream did not finish: ...{:?}",
        &rest[rest.len().saturating_sub(200)..]
    );

    // 2. Garbage: rejected, the OpenAI guest keeps serving, the error is counted.
    let error_metric = "qwasi_guest_reloads_total{guest=\"/\",result=\"error\"}";
    replace_file(&file, b"\0asm garbage, not a component");
    wait_until("the reload error counted", Duration::from_secs(30), || {
        metric(&s, error_metric) == Some(1.0)
    });
    assert_eq!(serving(&s), Ok(Version::OpenAi));
    s.wait_for_log(
        "is not a valid WebAssembly component",
        Duration::from_secs(10),
    );

    // 3. Back to the misbehave guest.
    replace_file(&file, &read(&misbehave_guest()));
    wait_until(
        "the misbehave guest serving",
        Duration::from_secs(60),
        || serving(&s) == Ok(Version::Misbehave),
    );
    // Let the clients see it for a moment, then stop them.
    std::thread::sleep(Duration::from_millis(300));
    stop.store(true, Ordering::Relaxed);
    for c in clients {
        c.join().unwrap();
    }

    let failures = failures.lock().unwrap();
    assert!(failures.is_empty(), "failed requests: {failures:?}");
    let (m, o) = (
        counts[0].load(Ordering::Relaxed),
        counts[1].load(Ordering::Relaxed),
    );
    eprintln!("requests served: {m} by misbehave, {o} by the OpenAI guest");
    assert!(m > 0 && o > 0, "misbehave {m}, openai {o}");
    assert_eq!(
        metric(&s, "qwasi_guest_reloads_total{guest=\"/\",result=\"ok\"}"),
        Some(2.0)
    );
    assert_eq!(metric(&s, error_metric), Some(1.0));
    assert_eq!(metric(&s, "qwasi_guest_version{guest=\"/\"}"), Some(3.0));
}

#[test]
fn sighup_reloads_when_not_watching() {
    let dir = tempfile::tempdir().unwrap();
    let file = guest_file(dir.path());
    let s = Server::start(&[
        "--guest",
        &format!("/={}", file.display()),
        "--watch-interval",
        "0",
    ]);
    replace_file(&file, &read(&openai_guest()));
    // Not watched: nothing changes by itself.
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(serving(&s), Ok(Version::Misbehave));
    s.signal("HUP");
    wait_until("the OpenAI guest serving", Duration::from_secs(60), || {
        serving(&s) == Ok(Version::OpenAi)
    });
    assert_eq!(
        metric(&s, "qwasi_guest_reloads_total{guest=\"/\",result=\"ok\"}"),
        Some(1.0)
    );
    // A second SIGHUP with the same file changes nothing.
    s.signal("HUP");
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(metric(&s, "qwasi_guest_version{guest=\"/\"}"), Some(2.0));
    assert_eq!(serving(&s), Ok(Version::OpenAi));
}

fn admin(s: &Server, auth: Option<&str>) -> Resp {
    let h = auth.map(|k| format!("Bearer {k}"));
    let headers: Vec<(&str, &str)> = h.iter().map(|v| ("Authorization", v.as_str())).collect();
    request(&s.addr, "POST", "/admin/reload", &headers, "")
}

#[test]
fn admin_reload_on_loopback_without_keys() {
    let dir = tempfile::tempdir().unwrap();
    let file = guest_file(dir.path());
    let s = Server::start(&[
        "--guest",
        &format!("/v1={}", file.display()),
        "--watch-interval",
        "0",
    ]);
    let r = admin(&s, None);
    assert_eq!(r.status, 200, "{r:?}");
    let j = r.json();
    assert_eq!(j["ok"], true);
    assert_eq!(j["guests"][0]["guest"], "/v1");
    assert_eq!(j["guests"][0]["result"], "unchanged");

    // A bad file: 422 with the error, the old version keeps serving.
    replace_file(&file, b"garbage");
    let r = admin(&s, None);
    assert_eq!(r.status, 422, "{r:?}");
    let j = r.json();
    assert_eq!(j["ok"], false);
    assert_eq!(j["error"]["code"], "guest_reload_failed");
    assert_eq!(j["guests"][0]["result"], "error");
    let msg = j["guests"][0]["error"].as_str().unwrap();
    assert!(
        msg.contains(&file.display().to_string())
            && msg.contains("is not a valid WebAssembly component"),
        "{msg}"
    );
    assert_eq!(serving(&s), Ok(Version::Misbehave));
    assert_eq!(
        metric(
            &s,
            "qwasi_guest_reloads_total{guest=\"/v1\",result=\"error\"}"
        ),
        Some(1.0)
    );

    // A valid new version: swapped.
    replace_file(&file, &read(&openai_guest()));
    let r = admin(&s, None);
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(r.json()["guests"][0]["result"], "ok");
    assert_eq!(r.json()["guests"][0]["version"], 2);
    assert_eq!(serving(&s), Ok(Version::OpenAi));

    // Only POST.
    let r = s.get("/admin/reload");
    assert_eq!(r.status, 405, "{r:?}");
    assert_eq!(r.header("allow"), Some("POST"));
    assert_eq!(r.error_code(), "method_not_allowed");
}

#[test]
fn admin_reload_needs_the_api_key() {
    let dir = tempfile::tempdir().unwrap();
    let file = guest_file(dir.path());
    let s = Server::start(&[
        "--guest",
        file.to_str().unwrap(),
        "--watch-interval",
        "0",
        "--api-key",
        "ops:sk-admin-secret",
    ]);
    replace_file(&file, &read(&openai_guest()));
    for auth in [None, Some("sk-wrong"), Some("ops:sk-admin-secret")] {
        let r = admin(&s, auth);
        assert_eq!(r.status, 401, "{auth:?}: {r:?}");
        assert_eq!(r.error_code(), "invalid_api_key");
        assert_eq!(r.json()["error"]["type"], "authentication_error");
    }
    // Nothing was reloaded.
    let r = request(
        &s.addr,
        "GET",
        "/v1/models",
        &[("Authorization", "Bearer sk-admin-secret")],
        "",
    );
    assert_eq!(which(&r), Ok(Version::Misbehave));

    let r = admin(&s, Some("sk-admin-secret"));
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(r.json()["guests"][0]["result"], "ok");
    let r = request(
        &s.addr,
        "GET",
        "/v1/models",
        &[("Authorization", "Bearer sk-admin-secret")],
        "",
    );
    assert_eq!(which(&r), Ok(Version::OpenAi));
}

#[test]
fn admin_reload_is_refused_on_a_public_bind_without_keys() {
    let s = Server::start(&[
        "--host",
        "0.0.0.0",
        "--allow-unauthenticated",
        "--guest",
        &misbehave_guest(),
    ]);
    let r = admin(&s, None);
    assert_eq!(r.status, 403, "{r:?}");
    assert_eq!(r.error_code(), "admin_disabled");
    assert_eq!(r.json()["error"]["type"], "authentication_error");
}

#[test]
fn policy_file_reloads_too() {
    let dir = tempfile::tempdir().unwrap();
    let policy = dir.path().join("policy.wasm");
    let original = read(&policy_guest());
    std::fs::write(&policy, &original).unwrap();
    let s = Server::start(&[
        "--guest",
        &misbehave_guest(),
        "--policy",
        policy.to_str().unwrap(),
        "--api-key",
        "sk-p",
        "--watch-interval",
        "100ms",
    ]);
    let get = |key: Option<&str>| {
        let h = key.map(|k| format!("Bearer {k}"));
        let headers: Vec<(&str, &str)> = h.iter().map(|v| ("Authorization", v.as_str())).collect();
        request(&s.addr, "GET", "/x", &headers, "").status
    };
    assert_eq!((get(None), get(Some("sk-p"))), (401, 200));

    // A component of the wrong world is refused; the policy keeps enforcing.
    replace_file(&policy, &read(&misbehave_guest()));
    wait_until("the reload error counted", Duration::from_secs(30), || {
        metric(
            &s,
            "qwasi_guest_reloads_total{guest=\"policy\",result=\"error\"}",
        ) == Some(1.0)
    });
    s.wait_for_log(
        "imports something the host does not provide",
        Duration::from_secs(10),
    );
    assert_eq!((get(None), get(Some("sk-p"))), (401, 200));

    // A new build of the policy (other bytes) is swapped in.
    replace_file(&policy, &with_custom_section(&original, "v2"));
    wait_until("policy version 2", Duration::from_secs(30), || {
        metric(&s, "qwasi_guest_version{guest=\"policy\"}") == Some(2.0)
    });
    assert_eq!((get(None), get(Some("sk-p"))), (401, 200));
    let r = admin(&s, Some("sk-p"));
    assert_eq!(r.status, 200, "{r:?}");
    let guests = r.json()["guests"].as_array().unwrap().clone();
    assert_eq!(guests.len(), 2, "{guests:?}");
    assert!(
        guests
            .iter()
            .all(|g| g["result"] == "unchanged" && (g["guest"] == "/" || g["guest"] == "policy")),
        "{guests:?}"
    );
}
