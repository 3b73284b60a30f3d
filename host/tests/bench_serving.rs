//! `qwasi bench --workload serving` end to end: the bench starts `qwasi serve`
//! on the demo model, loads it over real HTTP at two concurrencies and one
//! Poisson rate, and writes a report whose counts add up.

use serde_json::Value;
use std::process::Command;

#[test]
fn serving_bench_loads_a_started_server_and_reports_each_level() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("serving.json");
    let status = Command::new(env!("CARGO_BIN_EXE_qwasi"))
        .args([
            "bench",
            "--workload",
            "serving",
            "--concurrency",
            "1,3",
            "--request-rate",
            "20",
            "--prompt-tokens",
            "12",
            "--output-tokens",
            "5",
            "--num-prompts",
            "6",
            "--out",
        ])
        .arg(&out)
        .status()
        .unwrap();
    assert!(status.success());
    let r: Value = serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
    assert_eq!(r["workload"], "serving");
    let levels = r["levels"].as_array().unwrap();
    assert_eq!(levels.len(), 3);
    assert_eq!(levels[0]["concurrency"], 1);
    assert_eq!(levels[1]["concurrency"], 3);
    assert_eq!(levels[2]["request_rate"], 20.0);
    for l in levels {
        assert_eq!(l["requests"], 6, "{l}");
        assert_eq!(l["failed"], 0, "{l}");
        // ignore_eos: every request generates exactly --output-tokens.
        assert_eq!(l["output_tokens"], 30, "{l}");
        assert!(l["output_tok_per_s"].as_f64().unwrap() > 0.0);
        let ttft = &l["ttft_ms"];
        assert!(ttft["p50"].as_f64().unwrap() <= ttft["p99"].as_f64().unwrap());
        assert!(l["itl_ms"]["p50"].as_f64().unwrap() > 0.0);
    }
}
