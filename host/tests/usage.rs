//! `generation.usage` (WIT 0.1.2) and serving components built against an
//! older 0.1.x of `qwasi:inference`.
//!
//! * A stop string ends a generation before its `finished` event; the
//!   OpenAI guest takes the cached-token count from `generation.usage()`.
//! * wasmtime resolves an import of `qwasi:inference/x@0.1.N` to the host's
//!   `@0.1.M` definitions (semver-compatible names, M >= N). The test guest
//!   tests/guests/misbehave, built against the current WIT, is rewritten to
//!   import `@0.1.3` down to `@0.1.0` (it uses nothing newer: exactly what a
//!   build against those versions imports) and must serve as before.

mod common;

use common::*;

/// The package version in wit/qwasi.wit.
fn wit_version() -> String {
    let wit = std::fs::read_to_string(repo_root().join("wit/qwasi.wit")).unwrap();
    wit.lines()
        .find_map(|l| l.strip_prefix("package qwasi:inference@"))
        .and_then(|l| l.strip_suffix(';'))
        .expect("a package line in wit/qwasi.wit")
        .to_string()
}

fn replace_all(bytes: &mut [u8], from: &[u8], to: &[u8]) -> usize {
    assert_eq!(from.len(), to.len(), "same-length rewrite only");
    let mut n = 0;
    let mut i = 0;
    while i + from.len() <= bytes.len() {
        if &bytes[i..i + from.len()] == from {
            bytes[i..i + from.len()].copy_from_slice(to);
            n += 1;
            i += from.len();
        } else {
            i += 1;
        }
    }
    n
}

/// The misbehave guest with every `qwasi:inference` name moved to `version`.
fn misbehave_at(version: &str, dir: &std::path::Path) -> String {
    let current = wit_version();
    let mut wasm = std::fs::read(misbehave_guest()).unwrap();
    let mut imports = 0;
    for item in ["/types", "/tokenizer", "/inference", ""] {
        let from = format!("qwasi:inference{item}@{current}");
        let to = format!("qwasi:inference{item}@{version}");
        let n = replace_all(&mut wasm, from.as_bytes(), to.as_bytes());
        if !item.is_empty() {
            imports += n;
        }
    }
    assert!(imports > 0, "the misbehave guest imports qwasi:inference");
    let needle = format!("@{current}");
    assert!(
        !wasm
            .windows(needle.len() + 16)
            .any(|w| w.starts_with(b"qwasi:inference") && w.ends_with(needle.as_bytes())),
        "a qwasi:inference@{current} name is left"
    );
    let path = dir.join(format!("misbehave-{version}.wasm"));
    std::fs::write(&path, wasm).unwrap();
    path.display().to_string()
}

#[test]
fn components_built_against_older_minor_versions_still_serve() {
    assert_ne!(wit_version(), "0.1.3", "this test expects a newer WIT");
    let dir = tempfile::tempdir().unwrap();
    for version in ["0.1.3", "0.1.2", "0.1.1", "0.1.0"] {
        let guest = misbehave_at(version, dir.path());
        let s = Server::start(&["--guest", &guest]);
        let r = s.get("/gen?n=3");
        assert_eq!(r.status, 200, "{version}: {r:?}\n{}", s.log_text());
        assert!(r.body.contains("finished"), "{version}: {r:?}");
    }
}

fn completion(s: &Server, body: &serde_json::Value) -> serde_json::Value {
    let r = request(&s.addr, "POST", "/v1/completions", &[], &body.to_string());
    assert_eq!(r.status, 200, "{r:?}");
    r.json()
}

#[test]
fn stop_string_reports_cached_tokens() {
    // The embedded demo model (it has the real tokenizer, so text and stop strings).
    let s = Server::start_with(&[], false);
    let model = s.get("/v1/models").json()["data"][0]["id"]
        .as_str()
        .unwrap()
        .to_string();
    let mut body = serde_json::json!({
        "model": model, "prompt": "The prefix cache remembers this prompt, word for word.",
        "max_tokens": 24, "temperature": 0, "seed": 7, "ignore_eos": true,
    });
    let first = completion(&s, &body);
    let text: Vec<char> = first["choices"][0]["text"]
        .as_str()
        .unwrap()
        .chars()
        .collect();
    assert_eq!(first["choices"][0]["finish_reason"], "length", "{first}");
    assert!(text.len() >= 8, "too little text to cut: {first}");
    // Greedy, so the second request generates the same text and stops at
    // (or before) this piece of it, with `finished` pre-empted.
    let stop: String = text[4..7].iter().collect();
    body["stop"] = serde_json::json!([stop]);
    let second = completion(&s, &body);
    assert_eq!(second["choices"][0]["finish_reason"], "stop", "{second}");
    let cut = second["choices"][0]["text"].as_str().unwrap();
    assert!(
        text.iter().collect::<String>().starts_with(cut) && cut.chars().count() <= 4,
        "{cut:?} vs {first}"
    );
    let u = &second["usage"];
    let prompt = u["prompt_tokens"].as_u64().unwrap();
    let cached = u["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap();
    assert_eq!(prompt, first["usage"]["prompt_tokens"].as_u64().unwrap());
    assert!(cached > 0 && cached <= prompt, "{second}");
    let completion_tokens = u["completion_tokens"].as_u64().unwrap();
    assert!(
        (1..=24).contains(&completion_tokens),
        "the tokens the output used: {second}"
    );
    assert_eq!(
        u["total_tokens"].as_u64().unwrap(),
        prompt + completion_tokens
    );
}
