//! `qwasi run`: the example command component examples/batch-complete on the
//! demo model, exit codes, and clear errors for components that are not
//! commands.

mod common;

use common::*;
use serde_json::Value;
use std::io::Write;
use std::process::{Command, Output, Stdio};

fn run(args: &[&str], stdin: &str) -> Output {
    let mut child = Command::new(QWASI)
        .args(["run", "--compile-cache", &compile_cache(), "--threads", "1"])
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut input = child.stdin.take().unwrap();
    input.write_all(stdin.as_bytes()).unwrap();
    drop(input);
    child.wait_with_output().unwrap()
}

fn lines(out: &Output) -> Vec<Value> {
    String::from_utf8(out.stdout.clone())
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l:?}")))
        .collect()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).to_string()
}

#[test]
fn batch_complete_on_the_demo_model() {
    let input = "{\"prompt\": \"The capital of France is\", \"max_tokens\": 3}\n\
                 \n\
                 Hello, world\n\
                 {\"prompt\": \"Once upon a time\", \"temperature\": 0.8, \"seed\": 7}\n";
    let out = run(&[&batch_complete(), "--", "--max-tokens", "5"], input);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let v = lines(&out);
    assert_eq!(v.len(), 3, "{v:?}");
    let prompts: Vec<&str> = v.iter().map(|l| l["prompt"].as_str().unwrap()).collect();
    assert_eq!(
        prompts,
        [
            "The capital of France is",
            "Hello, world",
            "Once upon a time"
        ]
    );
    for (l, max) in v.iter().zip([3, 5, 5]) {
        let obj = l.as_object().unwrap();
        let mut keys: Vec<&str> = obj.keys().map(String::as_str).collect();
        keys.sort();
        assert_eq!(keys, ["finish_reason", "prompt", "text", "tokens"], "{l}");
        let tokens = l["tokens"].as_u64().unwrap();
        assert!(tokens >= 1 && tokens <= max, "{l}");
        assert!(l["text"].is_string(), "{l}");
        let reason = l["finish_reason"].as_str().unwrap();
        assert!(reason == "length" || reason == "stop", "{l}");
        if reason == "length" {
            assert_eq!(tokens, max, "{l}");
        }
    }
    // Greedy lines are deterministic.
    let again = run(&[&batch_complete(), "--max-tokens", "5"], "Hello, world\n");
    assert_eq!(again.status.code(), Some(0), "{}", stderr(&again));
    assert_eq!(lines(&again)[0], v[1]);
}

#[test]
fn exit_codes_propagate() {
    // Failed lines: reported in place, processing goes on, exit status 3.
    let out = run(
        &[&batch_complete()],
        "{\"prompt\": \"a\", \"max_tokens\": 2}\n{not json\n{\"prompt\": \"b\", \"max_tokens\": 0}\nplain\n",
    );
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    let v = lines(&out);
    assert_eq!(v.len(), 4, "{v:?}");
    assert_eq!(v[0]["tokens"], 2);
    assert_eq!(v[1]["line"], 2);
    assert!(v[1]["error"].as_str().unwrap().contains("invalid JSON"));
    assert_eq!(v[2]["prompt"], "b");
    assert!(v[2]["error"].as_str().unwrap().contains("max_tokens"));
    assert_eq!(v[3]["prompt"], "plain");
    assert!(stderr(&out).contains("batch-complete: line 2"));

    // Bad arguments: exit status 2 and the usage on stderr.
    let out = run(&[&batch_complete(), "--", "--bogus"], "");
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("unknown argument \"--bogus\""));
    assert!(out.stdout.is_empty());

    let out = run(&[&batch_complete(), "--", "--help"], "");
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("usage: batch-complete"));
}

#[test]
fn components_that_are_not_commands_are_one_clear_line() {
    let check = |file: &str, expect: &str| {
        let out = run(&[file], "");
        assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
        let err = stderr(&out);
        let last = err.lines().last().unwrap_or_default();
        assert!(
            last.starts_with("error: ") && last.contains(expect),
            "expected {expect:?} in:\n{err}"
        );
        // Validated before the model loads.
        assert!(!err.contains("demo model"), "{err}");
    };
    check(
        &misbehave_guest(),
        &format!(
            "{} is not a command component: it does not export wasi:cli/run",
            misbehave_guest()
        ),
    );
    let dir = tempfile::tempdir().unwrap();
    let garbage = dir.path().join("garbage.wasm");
    std::fs::write(&garbage, b"not wasm at all").unwrap();
    check(
        garbage.to_str().unwrap(),
        "is not a valid WebAssembly component",
    );
    check(
        "/nonexistent/job.wasm",
        "cannot read the component /nonexistent/job.wasm",
    );
    let out = run(&["--dir", "/nonexistent::/data", &batch_complete()], "");
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("error: --dir: /nonexistent is not a directory"),
        "{}",
        stderr(&out)
    );
}
