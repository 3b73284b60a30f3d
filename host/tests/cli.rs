//! The `qwasi` binary as a user runs it: the demo model with no setup,
//! JSON output, tokenize, one-line errors for bad model directories, and the
//! prefix-cache benchmark on the CPU.

use serde_json::Value;
use std::process::{Command, Output};

fn qwasi(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_qwasi"))
        .args(args)
        .output()
        .expect("run qwasi")
}

fn json_of(out: &Output) -> Value {
    assert!(
        out.status.success(),
        "stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("stdout is one JSON value")
}

#[test]
fn generate_on_the_demo_model_prints_text() {
    let out = qwasi(&["generate", "--prompt", "hi", "--max-tokens", "8"]);
    assert!(
        out.status.success(),
        "stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!String::from_utf8_lossy(&out.stdout).trim().is_empty());
    assert!(String::from_utf8_lossy(&out.stderr).contains("demo model"));
}

#[test]
fn generate_json_with_logprobs_is_deterministic() {
    let args = [
        "generate",
        "--prompt",
        "Hello, world",
        "--max-tokens",
        "6",
        "--ignore-eos",
        "--logprobs",
        "3",
        "--json",
    ];
    let a = json_of(&qwasi(&args));
    let b = json_of(&qwasi(&args));
    assert_eq!(
        a["tokens"], b["tokens"],
        "greedy decoding must be deterministic"
    );
    // The prompt is encoded exactly as `qwasi tokenize` encodes it.
    assert_eq!(
        a["prompt_tokens"],
        json_of(&qwasi(&["tokenize", "Hello, world"]))
    );
    assert_eq!(a["tokens"].as_array().unwrap().len(), 6);
    assert_eq!(a["finish_reason"], "length");
    let lps = a["logprobs"].as_array().unwrap();
    assert_eq!(lps.len(), 6);
    for (step, tok) in lps.iter().zip(a["tokens"].as_array().unwrap()) {
        assert_eq!(&step["token"], tok);
        let top = step["top"].as_array().unwrap();
        assert_eq!(top.len(), 3);
        // Greedy: the chosen token is the most likely one.
        assert_eq!(&top[0][0], tok);
        assert!(step["logprob"].as_f64().unwrap() <= 0.0);
    }
    assert!(a["text"].is_string());
}

#[test]
fn seeded_sampling_repeats() {
    let args = [
        "generate",
        "--prompt-tokens",
        "9707,11,1879",
        "--max-tokens",
        "8",
        "--ignore-eos",
        "--temperature",
        "1.0",
        "--top-p",
        "0.9",
        "--seed",
        "42",
        "--json",
    ];
    let a = json_of(&qwasi(&args));
    let b = json_of(&qwasi(&args));
    assert_eq!(a["tokens"], b["tokens"]);
    assert_eq!(a["prompt_tokens"], serde_json::json!([9707, 11, 1879]));
}

#[test]
fn tokenize_prints_ids() {
    let out = qwasi(&["tokenize", "<|im_start|>user\nhi<|im_end|>"]);
    let ids = json_of(&out);
    let ids: Vec<u64> = ids
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap())
        .collect();
    assert_eq!(ids.first(), Some(&248045));
    assert_eq!(ids.last(), Some(&248046));
}

#[test]
fn bad_model_directory_is_a_one_line_error() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("config.json"),
        r#"{"architectures": ["GPT2LMHeadModel"]}"#,
    )
    .unwrap();
    let out = qwasi(&[
        "generate",
        "--model",
        dir.path().to_str().unwrap(),
        "--prompt-tokens",
        "1",
    ]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    assert!(
        err.starts_with("error: ") && err.contains("unsupported architecture"),
        "{err}"
    );

    let out = qwasi(&[
        "generate",
        "--model",
        "/no/such/dir",
        "--prompt-tokens",
        "1",
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    assert!(err.contains("/no/such/dir"), "{err}");
}

/// `qwasi bench --workload prefix-cache` on the demo model (the CPU): every
/// prefix is a hit of exactly its length (the bench fails otherwise), the
/// cached request's tokens and logprobs equal the cold one's, and the report
/// says so; the CPU has no per-kernel profile of the cached request, and
/// none of its cached requests resumes in the snapshot's own memory.
#[test]
fn prefix_cache_bench_on_the_demo_model_is_exact() {
    let out = std::env::temp_dir().join(format!("qwasi-pc-bench-{}.json", std::process::id()));
    let run = qwasi(&[
        "bench",
        "--workload",
        "prefix-cache",
        "--prefixes",
        "64,200",
        "--new-tokens",
        "16",
        "--runs",
        "1",
        "--intervals",
        "none",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(
        run.status.success(),
        "stderr: {}",
        String::from_utf8_lossy(&run.stderr)
    );
    let report: Value = serde_json::from_slice(&std::fs::read(&out).unwrap()).unwrap();
    let _ = std::fs::remove_file(&out);
    assert_eq!(report["workload"], "prefix-cache");
    assert_eq!(report["backend"], "cpu");
    assert_eq!(report["exactness_pass"], true);
    let rows = report["ttft"].as_array().unwrap();
    let prefixes: Vec<u64> = rows
        .iter()
        .map(|r| r["prefix_tokens"].as_u64().unwrap())
        .collect();
    assert_eq!(prefixes, [64, 200]);
    for r in rows {
        assert_eq!(r["new_tokens"], 16);
        assert_eq!(r["exactness"]["pass"], true, "{r}");
        assert_eq!(r["exactness"]["same_tokens"], true, "{r}");
        assert!(r["cached_ttft_ms_median"].as_f64().unwrap() > 0.0);
        assert_eq!(r["cached_request_profile_ms"], serde_json::json!([]));
        // The CPU shares pages copy-on-write: no run resumes in place.
        assert_eq!(
            r["cached_resumed_in_place_runs"],
            serde_json::json!([false])
        );
    }
}

/// `qwasi bench --workload tokenize`: the report's prompt has the asked
/// tokens, both encoders' ids are checked equal, and the parallel pieces
/// are used on a multi-threaded pool.
#[test]
fn tokenize_bench_reports_and_checks_ids() {
    let out = std::env::temp_dir().join(format!("qwasi-tok-bench-{}.json", std::process::id()));
    let run = qwasi(&[
        "bench",
        "--workload",
        "tokenize",
        "--tokenize-tokens",
        "4096",
        "--runs",
        "2",
        "--threads",
        "2",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(
        run.status.success(),
        "stderr: {}",
        String::from_utf8_lossy(&run.stderr)
    );
    let report: Value = serde_json::from_slice(&std::fs::read(&out).unwrap()).unwrap();
    let _ = std::fs::remove_file(&out);
    assert_eq!(report["workload"], "tokenize");
    assert!(report["tokens"].as_u64().unwrap() >= 4096, "{report}");
    assert_eq!(report["ids_equal"], true);
    assert_eq!(report["parallel_pieces"], true);
    assert!(report["whole_ms_median"].as_f64().unwrap() > 0.0);
    assert!(report["encode_ms_median"].as_f64().unwrap() > 0.0);
}

/// `--prefill-precision` is a GPU mode: the cpu backend (the f32 reference)
/// refuses `bf16` and `fp8` before loading anything, accepts the default `split`, and
/// an unknown value says what the flag takes.
/// `serve --synthetic` makes its weights on the GPU: the cpu backend refuses
/// it in one line, and it excludes --model; --layers needs it.
#[test]
fn serve_synthetic_needs_a_gpu_backend() {
    let out = qwasi(&["serve", "--synthetic", "qwen3.6-35b-a3b", "--port", "0"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(err.contains("--synthetic needs --backend"), "{err}");
    let out = qwasi(&["serve", "--synthetic", "no-such-preset", "--port", "0"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("no-such-preset"),
        "{err}"
    );
    for args in [
        &["serve", "--synthetic", "qwen3.6-35b-a3b", "--model", "."][..],
        &["serve", "--layers", "4"][..],
    ] {
        let out = qwasi(args);
        assert!(!out.status.success(), "{args:?}");
    }
}

#[test]
fn the_cpu_backend_refuses_bf16_prompt_precision() {
    for (cmd, mode) in [("generate", "bf16"), ("serve", "bf16"), ("generate", "fp8")] {
        let mut args = vec![cmd, "--prefill-precision", mode];
        if cmd == "generate" {
            args.extend(["--prompt", "hi"]);
        }
        let out = qwasi(&args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{cmd}: {err}");
        assert!(
            err.contains("the cpu backend computes prompts in f32"),
            "{cmd}: {err}"
        );
    }
    let out = qwasi(&[
        "generate",
        "--prefill-precision",
        "split",
        "--prompt",
        "hi",
        "--max-tokens",
        "2",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = qwasi(&["generate", "--prefill-precision", "fp16", "--prompt", "hi"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("split, bf16, fp8"),
        "{err}"
    );
    let out = qwasi(&[
        "bench",
        "--workload",
        "tokenize",
        "--prefill-precision",
        "bf16",
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--serve-args"), "{err}");
}
