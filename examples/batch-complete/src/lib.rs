//! `batch-complete`: a `qwasi:inference/command` component that completes
//! prompts in bulk.
//!
//! ```sh
//! printf '%s\n' '{"prompt": "The capital of France is", "max_tokens": 8}' 'Hello' |
//!   qwasi run batch_complete.wasm -- --max-tokens 16
//! ```
//!
//! Each input line is a JSON object (`{"prompt": "...", "max_tokens": N,
//! "temperature": T, "top_p": P, "seed": S}`, only `prompt` required) or, when
//! it does not start with `{`, a plain-text prompt; blank lines are skipped.
//! Each prompt is completed through the host's `inference` import (no chat
//! template: the text is continued) and one JSON line is written:
//! `{"prompt", "text", "tokens", "finish_reason"}`. A line that can't be
//! completed gives `{"line", "prompt", "error"}` and processing goes on.
//!
//! Exit status: 0 when every line succeeded, 3 when some failed, 2 for bad
//! arguments.
//!
//! The logic here is plain Rust over the [`Engine`] trait so it unit-tests
//! natively; `component.rs` (wasm32 only) implements the trait over
//! `qwasi:inference` and exports `wasi:cli/run`.

use serde::Deserialize;
use serde_json::json;
use std::io::{BufRead, Write};

#[cfg(target_arch = "wasm32")]
mod component;

/// Exit status when some lines failed.
pub const EXIT_SOME_FAILED: u8 = 3;
/// Exit status for bad arguments.
pub const EXIT_USAGE: u8 = 2;

pub const USAGE: &str = "usage: batch-complete [--max-tokens N] [--temperature T] [--top-p P] [--seed S]
Reads prompts from stdin, one per line: a JSON object
  {\"prompt\": \"...\", \"max_tokens\": N, \"temperature\": T, \"top_p\": P, \"seed\": S}
or plain text, and writes one JSON line per prompt to stdout:
  {\"prompt\": \"...\", \"text\": \"...\", \"tokens\": N, \"finish_reason\": \"stop|length|cancelled\"}";

/// One completion to run.
#[derive(Clone, Debug, PartialEq)]
pub struct Job {
    pub prompt: String,
    pub max_tokens: u32,
    pub temperature: f32,
    pub top_p: f32,
    pub seed: Option<u64>,
}

/// What the engine returned for a job.
#[derive(Clone, Debug, PartialEq)]
pub struct Completion {
    pub text: String,
    /// Completion tokens generated.
    pub tokens: u32,
    /// `stop`, `length` or `cancelled`.
    pub finish_reason: &'static str,
}

/// Completes jobs (the host's inference import, or a fake in tests).
pub trait Engine {
    fn complete(&self, job: &Job) -> Result<Completion, String>;
}

/// Command-line defaults for lines that don't set a field.
#[derive(Clone, Debug, PartialEq)]
pub struct Defaults {
    pub max_tokens: u32,
    pub temperature: f32,
    pub top_p: f32,
    pub seed: Option<u64>,
}

impl Default for Defaults {
    fn default() -> Self {
        Defaults {
            max_tokens: 64,
            temperature: 0.0,
            top_p: 1.0,
            seed: None,
        }
    }
}

/// What the arguments ask for.
#[derive(Debug, PartialEq)]
pub enum Action {
    Run(Defaults),
    Help,
}

/// Parses the arguments after the program name.
pub fn parse_args(args: &[String]) -> Result<Action, String> {
    let mut d = Defaults::default();
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        let (flag, inline) = match arg.split_once('=') {
            Some((f, v)) if f.starts_with("--") => (f, Some(v.to_string())),
            _ => (arg.as_str(), None),
        };
        if flag == "--help" || flag == "-h" {
            return Ok(Action::Help);
        }
        let mut value = || {
            inline
                .clone()
                .or_else(|| it.next().cloned())
                .ok_or_else(|| format!("{flag} needs a value"))
        };
        match flag {
            "--max-tokens" => d.max_tokens = parse_num(flag, &value()?)?,
            "--temperature" => d.temperature = parse_num(flag, &value()?)?,
            "--top-p" => d.top_p = parse_num(flag, &value()?)?,
            "--seed" => d.seed = Some(parse_num(flag, &value()?)?),
            _ => return Err(format!("unknown argument {arg:?}")),
        }
    }
    check(d.max_tokens, d.temperature, d.top_p)?;
    Ok(Action::Run(d))
}

fn parse_num<T: std::str::FromStr>(flag: &str, v: &str) -> Result<T, String> {
    v.trim()
        .parse()
        .map_err(|_| format!("{flag}: {v:?} is not a valid number"))
}

fn check(max_tokens: u32, temperature: f32, top_p: f32) -> Result<(), String> {
    if max_tokens == 0 {
        return Err("max_tokens must be at least 1".into());
    }
    if !(0.0..=2.0).contains(&temperature) {
        return Err(format!("temperature must be in [0, 2], got {temperature}"));
    }
    if !(top_p > 0.0 && top_p <= 1.0) {
        return Err(format!("top_p must be in (0, 1], got {top_p}"));
    }
    Ok(())
}

#[derive(Deserialize)]
struct LineJson {
    prompt: Option<serde_json::Value>,
    max_tokens: Option<u32>,
    temperature: Option<f32>,
    top_p: Option<f32>,
    seed: Option<u64>,
}

/// Parses one input line; `Ok(None)` for a blank line. The error carries the
/// prompt when one could be read.
pub fn parse_line(line: &str, d: &Defaults) -> Result<Option<Job>, (Option<String>, String)> {
    let line = line.trim_end_matches(['\r', '\n']);
    if line.trim().is_empty() {
        return Ok(None);
    }
    if !line.trim_start().starts_with('{') {
        return Ok(Some(Job {
            prompt: line.to_string(),
            max_tokens: d.max_tokens,
            temperature: d.temperature,
            top_p: d.top_p,
            seed: d.seed,
        }));
    }
    let j: LineJson =
        serde_json::from_str(line).map_err(|e| (None, format!("invalid JSON: {e}")))?;
    let prompt = match j.prompt {
        Some(serde_json::Value::String(p)) => p,
        Some(_) => return Err((None, "\"prompt\" must be a string".into())),
        None => return Err((None, "missing \"prompt\"".into())),
    };
    let job = Job {
        max_tokens: j.max_tokens.unwrap_or(d.max_tokens),
        temperature: j.temperature.unwrap_or(d.temperature),
        top_p: j.top_p.unwrap_or(d.top_p),
        seed: j.seed.or(d.seed),
        prompt,
    };
    check(job.max_tokens, job.temperature, job.top_p).map_err(|e| (Some(job.prompt.clone()), e))?;
    Ok(Some(job))
}

/// Runs the batch: reads `input`, writes JSONL to `out`, diagnostics to
/// `err`; returns the exit status.
pub fn run_batch(
    args: &[String],
    input: impl BufRead,
    mut out: impl Write,
    mut err: impl Write,
    engine: &dyn Engine,
) -> u8 {
    let d = match parse_args(args) {
        Ok(Action::Run(d)) => d,
        Ok(Action::Help) => {
            let _ = writeln!(out, "{USAGE}");
            return 0;
        }
        Err(e) => {
            let _ = writeln!(err, "batch-complete: {e}\n{USAGE}");
            return EXIT_USAGE;
        }
    };
    let mut failed = 0usize;
    for (i, line) in input.lines().enumerate() {
        let n = i + 1;
        let line = match line {
            Ok(l) => l,
            Err(e) => {
                let _ = writeln!(err, "batch-complete: cannot read line {n}: {e}");
                return EXIT_SOME_FAILED;
            }
        };
        let result = match parse_line(&line, &d) {
            Ok(None) => continue,
            Ok(Some(job)) => match engine.complete(&job) {
                Ok(c) => Ok(json!({
                    "prompt": job.prompt,
                    "text": c.text,
                    "tokens": c.tokens,
                    "finish_reason": c.finish_reason,
                })),
                Err(e) => Err((Some(job.prompt), e)),
            },
            Err(e) => Err(e),
        };
        let v = result.unwrap_or_else(|(prompt, e)| {
            failed += 1;
            let _ = writeln!(err, "batch-complete: line {n}: {e}");
            json!({"line": n, "prompt": prompt, "error": e})
        });
        if writeln!(out, "{v}").and_then(|_| out.flush()).is_err() {
            // stdout closed: nothing more can be reported.
            return EXIT_SOME_FAILED;
        }
    }
    if failed > 0 { EXIT_SOME_FAILED } else { 0 }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Fake;

    impl Engine for Fake {
        fn complete(&self, job: &Job) -> Result<Completion, String> {
            if job.prompt == "fail" {
                return Err("engine says no".into());
            }
            Ok(Completion {
                text: format!("<{}>", job.prompt.len()),
                tokens: job.max_tokens,
                finish_reason: "length",
            })
        }
    }

    fn args(a: &[&str]) -> Vec<String> {
        a.iter().map(|s| s.to_string()).collect()
    }

    fn batch(a: &[&str], input: &str) -> (u8, Vec<serde_json::Value>, String) {
        let (mut out, mut err) = (Vec::new(), Vec::new());
        let code = run_batch(&args(a), input.as_bytes(), &mut out, &mut err, &Fake);
        let lines = String::from_utf8(out)
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        (code, lines, String::from_utf8(err).unwrap())
    }

    #[test]
    fn json_and_text_lines() {
        let (code, lines, _) = batch(
            &["--max-tokens", "5"],
            "{\"prompt\": \"abc\", \"max_tokens\": 2}\n\nplain text\r\n",
        );
        assert_eq!(code, 0);
        assert_eq!(lines.len(), 2);
        assert_eq!(
            lines[0],
            json!({"prompt": "abc", "text": "<3>", "tokens": 2, "finish_reason": "length"})
        );
        assert_eq!(lines[1]["prompt"], "plain text");
        assert_eq!(lines[1]["tokens"], 5);
    }

    #[test]
    fn bad_lines_are_reported_and_processing_goes_on() {
        let (code, lines, err) = batch(
            &[],
            "{\"prompt\": 1}\n{oops\nfail\n{\"prompt\": \"x\", \"temperature\": 9}\nok\n",
        );
        assert_eq!(code, EXIT_SOME_FAILED);
        assert_eq!(lines.len(), 5);
        assert_eq!(lines[0]["line"], 1);
        assert!(lines[1]["error"].as_str().unwrap().contains("invalid JSON"));
        assert_eq!(lines[2]["error"], "engine says no");
        assert_eq!(lines[2]["prompt"], "fail");
        assert!(lines[3]["error"].as_str().unwrap().contains("temperature"));
        assert_eq!(lines[4]["text"], "<2>");
        assert!(err.contains("line 2"));
    }

    #[test]
    fn arguments() {
        assert_eq!(batch(&["--bogus"], "").0, EXIT_USAGE);
        assert_eq!(batch(&["--max-tokens"], "").0, EXIT_USAGE);
        assert_eq!(batch(&["--max-tokens", "0"], "").0, EXIT_USAGE);
        let mut out = Vec::new();
        let code = run_batch(&args(&["--help"]), &b""[..], &mut out, Vec::new(), &Fake);
        assert_eq!(code, 0);
        assert!(String::from_utf8(out).unwrap().starts_with("usage:"));
        assert_eq!(
            parse_args(&args(&[
                "--temperature=0.5",
                "--seed",
                "7",
                "--top-p",
                "0.9"
            ])),
            Ok(Action::Run(Defaults {
                max_tokens: 64,
                temperature: 0.5,
                top_p: 0.9,
                seed: Some(7),
            }))
        );
    }
}
