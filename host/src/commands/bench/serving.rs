//! `qwasi bench --workload serving`: what concurrent users see, over real HTTP
//! through the OpenAI guest (in the spirit of `vllm bench serve`).
//!
//! A load generator sends streaming `/v1/completions` requests whose prompts
//! are token arrays (seeded random ids, a different first token per request so
//! no two share a cached prefix) with `max_tokens = --output-tokens` and
//! `ignore_eos`, at each fixed concurrency of `--concurrency` (a request starts
//! as soon as one finishes) and then at each Poisson arrival rate of
//! `--request-rate`. Per level it reports aggregate output tok/s, time to first
//! token and inter-token latency (p50/p99; the gap between two streamed chunks
//! that carry text, so a chunk holding several tokens counts once), the time
//! per output token, and the preemptions the server counted meanwhile
//! (`qwasi_preemptions_total` on `/metrics`, absent on servers without a
//! scheduler).
//!
//! The server is `--url`, or else `qwasi serve` started by the bench itself
//! (this binary, `--model` and `--serve-args`) on a free loopback port and
//! stopped at the end, so the model loader is on the measured path. In a GPU
//! build the reference fixtures are checked first (the correctness of the same
//! build goes into the report).

use anyhow::{Context, Result, bail};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::Request;
use hyper_util::rt::TokioIo;
use qwasi_engine::service::{STEP_DURATION, STEP_PHASES};
use serde_json::{Value, json};
use std::path::Path;
use std::time::{Duration, Instant};
use tokio::net::TcpStream;

#[derive(clap::Args)]
pub struct ServingArgs {
    /// Server to load, e.g. http://127.0.0.1:8000 (default: start `qwasi
    /// serve` with `--model` and `--serve-args` on a free loopback port).
    #[arg(long)]
    url: Option<String>,
    /// Extra `qwasi serve` flags for the server the bench starts (one string,
    /// split at white space), e.g. "--backend cuda".
    #[arg(long, default_value = "", allow_hyphen_values = true)]
    serve_args: String,
    /// Fixed concurrency levels (default 1,8,16,32,64; none when only
    /// --request-rate is given).
    #[arg(long, value_delimiter = ',')]
    concurrency: Option<Vec<usize>>,
    /// Poisson arrival rates (requests per second), run after the fixed levels.
    #[arg(long, value_delimiter = ',')]
    request_rate: Vec<f64>,
    /// Prompt lengths in tokens.
    #[arg(long, value_delimiter = ',', default_value = "1024")]
    prompt_tokens: Vec<usize>,
    /// Tokens generated per request (`ignore_eos`: always this many).
    #[arg(long, default_value_t = 256)]
    output_tokens: usize,
    /// Requests per level (default: 4 per concurrent stream, at least 8; for
    /// a rate, 4 seconds' worth, at least 8).
    #[arg(long)]
    num_prompts: Option<usize>,
    /// Seconds the started server may take to become ready.
    #[arg(long, default_value_t = 600)]
    ready_timeout: u64,
}

pub fn run(a: &ServingArgs, model: Option<&Path>, fixtures: &Path, out: &Path) -> Result<()> {
    // Correctness of this build first (GPU builds: the reference fixtures).
    #[cfg(any(feature = "cuda", feature = "hip"))]
    let correctness = super::speed::fixture_check(fixtures)?;
    #[cfg(not(any(feature = "cuda", feature = "hip")))]
    let correctness = {
        let _ = fixtures;
        json!({"fixtures": "not run: a CPU build serves the reference backend itself"})
    };
    if correctness.get("pass") == Some(&Value::Bool(false)) {
        bail!("the reference fixtures fail on this build: no speed numbers ({correctness})");
    }
    let mut server = match &a.url {
        Some(u) => Server::External(u.trim_end_matches('/').to_string()),
        None => Server::start(model, &a.serve_args, a.ready_timeout)?,
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let result = rt.block_on(load(a, server.url()));
    server.stop();
    let levels = result?;
    let report = json!({
        "workload": "serving",
        "commit": super::commit(),
        "command": super::command(),
        "machine": super::machine(),
        "gpu": gpu_name(),
        "server": match &a.url { Some(u) => json!({"url": u}), None => json!({"started": true, "model": model, "serve_args": a.serve_args}) },
        "correctness": correctness,
        "prompt_tokens": a.prompt_tokens,
        "output_tokens": a.output_tokens,
        "itl_definition": "gap between consecutive streamed chunks carrying text",
        "levels": levels,
    });
    if let Some(dir) = out.parent() {
        std::fs::create_dir_all(dir).ok();
    }
    std::fs::write(out, serde_json::to_string_pretty(&report)? + "\n")
        .with_context(|| format!("cannot write {}", out.display()))?;
    eprintln!("[bench] report: {}", out.display());
    Ok(())
}

/// One load level: a fixed concurrency or a Poisson rate.
#[derive(Clone, Copy, Debug)]
enum Level {
    Concurrency(usize),
    Rate(f64),
}

/// The levels to run: the fixed concurrencies, then the Poisson rates. With
/// neither given, the default concurrencies; with rates alone, only those.
fn plan(a: &ServingArgs) -> Vec<Level> {
    let fixed = match &a.concurrency {
        Some(c) => c.clone(),
        None if a.request_rate.is_empty() => vec![1, 8, 16, 32, 64],
        None => Vec::new(),
    };
    let rates = a.request_rate.iter().map(|&r| Level::Rate(r));
    fixed
        .into_iter()
        .map(Level::Concurrency)
        .chain(rates)
        .collect()
}

async fn load(a: &ServingArgs, base: &str) -> Result<Vec<Value>> {
    let model = served_model(base).await?;
    let mut levels = Vec::new();
    for &len in &a.prompt_tokens {
        // One untimed request per length: compilation, graph capture, first allocations.
        let mut rng = SplitMix(len as u64 ^ 0x5157_4153);
        let warm = one_request(base, &model, &prompt(&mut rng, len, u64::MAX), 8).await;
        if let Some(e) = warm.error {
            bail!("the warm-up request failed: {e}");
        }
        timed(&warm)?;
        for (n_level, level) in plan(a).into_iter().enumerate() {
            let n = a.num_prompts.unwrap_or(match level {
                Level::Concurrency(c) => (4 * c).max(8),
                Level::Rate(r) => ((4.0 * r) as usize).max(8),
            });
            let before = Counters::read(base).await;
            let r = run_level(base, &model, level, len, n, a.output_tokens, n_level as u64).await?;
            let after = Counters::read(base).await;
            let row = summarize(level, len, &r, &after.since(&before));
            eprintln!("[bench] {}", line(&row));
            levels.push(row);
        }
    }
    Ok(levels)
}

/// What one request saw.
struct Outcome {
    start: Instant,
    first: Option<Duration>,
    end: Duration,
    /// Gaps between consecutive text chunks.
    gaps: Vec<Duration>,
    tokens: usize,
    error: Option<String>,
}

/// Latencies are timed at chunks carrying text: a model without a tokenizer
/// streams none, and every TTFT and ITL would be missing, so the bench stops.
fn timed(o: &Outcome) -> Result<()> {
    if o.tokens > 0 && o.first.is_none() {
        bail!(
            "the server streamed {} tokens without text (does the model directory have a \
             tokenizer.json?): TTFT and inter-token latency cannot be timed",
            o.tokens
        );
    }
    Ok(())
}

async fn run_level(
    base: &str,
    model: &str,
    level: Level,
    len: usize,
    n: usize,
    out_tokens: usize,
    salt: u64,
) -> Result<(Duration, Vec<Outcome>)> {
    let mut rng = SplitMix((len as u64) << 20 ^ salt ^ 0x9e37);
    let prompts: Vec<Vec<u32>> = (0..n).map(|i| prompt(&mut rng, len, i as u64)).collect();
    let t0 = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    match level {
        Level::Concurrency(c) => {
            let sem = std::sync::Arc::new(tokio::sync::Semaphore::new(c.max(1)));
            for p in prompts {
                let permit = sem.clone().acquire_owned().await?;
                let (base, model) = (base.to_string(), model.to_string());
                tasks.spawn(async move {
                    let o = one_request(&base, &model, &p, out_tokens).await;
                    drop(permit);
                    o
                });
            }
        }
        Level::Rate(r) => {
            for p in prompts {
                let wait = -(1.0 - rng.unit()).ln() / r.max(1e-9);
                tokio::time::sleep(Duration::from_secs_f64(wait)).await;
                let (base, model) = (base.to_string(), model.to_string());
                tasks.spawn(async move { one_request(&base, &model, &p, out_tokens).await });
            }
        }
    }
    let mut outcomes = Vec::with_capacity(n);
    while let Some(o) = tasks.join_next().await {
        outcomes.push(o?);
    }
    Ok((t0.elapsed(), outcomes))
}

/// A seeded prompt of `len` ids in 100..100_000 (ordinary tokens of the Qwen
/// vocabularies); `first` (unless `u64::MAX`) makes its first token unique.
fn prompt(rng: &mut SplitMix, len: usize, first: u64) -> Vec<u32> {
    (0..len)
        .map(|i| {
            if i == 0 && first != u64::MAX {
                100 + (first % 99_900) as u32
            } else {
                100 + (rng.next() % 99_900) as u32
            }
        })
        .collect()
}

async fn one_request(base: &str, model: &str, prompt: &[u32], max_tokens: usize) -> Outcome {
    let start = Instant::now();
    let mut o = Outcome {
        start,
        first: None,
        end: Duration::ZERO,
        gaps: Vec::new(),
        tokens: 0,
        error: None,
    };
    let body = json!({
        "model": model, "prompt": prompt, "max_tokens": max_tokens, "ignore_eos": true,
        "temperature": 0, "stream": true, "stream_options": {"include_usage": true},
    });
    if let Err(e) = stream(base, "/v1/completions", &body, &mut o).await {
        o.error = Some(format!("{e:#}"));
    }
    o.end = start.elapsed();
    o
}

/// Sends `body` and reads the SSE stream into `o`.
async fn stream(base: &str, path: &str, body: &Value, o: &mut Outcome) -> Result<()> {
    let mut resp = send(base, "POST", path, Some(body)).await?;
    if !resp.status().is_success() {
        let b = resp.into_body().collect().await?.to_bytes();
        bail!("HTTP error: {}", String::from_utf8_lossy(&b));
    }
    let mut buf = Vec::new();
    let mut last: Option<Instant> = None;
    while let Some(frame) = resp.body_mut().frame().await {
        let Ok(data) = frame?.into_data() else {
            continue;
        };
        buf.extend_from_slice(&data);
        while let Some(end) = find(&buf, b"\n\n") {
            let event: Vec<u8> = buf.drain(..end + 2).collect();
            let text = String::from_utf8_lossy(&event);
            let Some(payload) = text.trim().strip_prefix("data:").map(str::trim) else {
                continue;
            };
            if payload == "[DONE]" {
                return Ok(());
            }
            let v: Value = serde_json::from_str(payload).context("bad SSE event")?;
            if let Some(err) = v.get("error") {
                bail!("stream error: {err}");
            }
            if let Some(n) = v
                .pointer("/usage/completion_tokens")
                .and_then(Value::as_u64)
            {
                o.tokens = n as usize;
            }
            let has_text = v
                .pointer("/choices/0/text")
                .and_then(Value::as_str)
                .is_some_and(|t| !t.is_empty());
            if has_text {
                let now = Instant::now();
                match last {
                    None => o.first = Some(now - o.start),
                    Some(l) => o.gaps.push(now - l),
                }
                last = Some(now);
            }
        }
    }
    bail!("stream ended without [DONE]")
}

fn find(h: &[u8], n: &[u8]) -> Option<usize> {
    h.windows(n.len()).position(|w| w == n)
}

/// One HTTP/1.1 request over a fresh loopback connection.
async fn send(
    base: &str,
    method: &str,
    path: &str,
    body: Option<&Value>,
) -> Result<hyper::Response<hyper::body::Incoming>> {
    let authority = base
        .strip_prefix("http://")
        .context("--url must start with http://")?;
    let tcp = TcpStream::connect(authority)
        .await
        .with_context(|| format!("cannot connect to {authority}"))?;
    tcp.set_nodelay(true)?;
    let (mut tx, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp)).await?;
    tokio::spawn(conn);
    let bytes = body.map(|b| Bytes::from(b.to_string())).unwrap_or_default();
    let req = Request::builder()
        .method(method)
        .uri(path)
        .header("host", authority)
        .header("content-type", "application/json")
        .body(Full::new(bytes))?;
    Ok(tx.send_request(req).await?)
}

async fn get_text(base: &str, path: &str) -> Result<String> {
    let resp = send(base, "GET", path, None).await?;
    let ok = resp.status().is_success();
    let b = resp.into_body().collect().await?.to_bytes();
    let s = String::from_utf8_lossy(&b).into_owned();
    if !ok {
        bail!("GET {path}: {s}");
    }
    Ok(s)
}

/// The first model id the server lists.
async fn served_model(base: &str) -> Result<String> {
    let v: Value = serde_json::from_str(&get_text(base, "/v1/models").await?)?;
    v.pointer("/data/0/id")
        .and_then(Value::as_str)
        .map(str::to_string)
        .context("the server lists no model")
}

/// What the server counted on `/metrics` (each `None` where it has no such
/// series): preemptions, and the engine steps' count and seconds by phase
/// ([`STEP_PHASES`]: decode rows only, carrying prompt tokens).
#[derive(Default)]
struct Counters {
    preemptions: Option<f64>,
    steps: [Option<(f64, f64)>; 2],
}

impl Counters {
    async fn read(base: &str) -> Counters {
        match get_text(base, "/metrics").await {
            Ok(text) => Counters::parse(&text),
            Err(_) => Counters::default(),
        }
    }

    fn parse(text: &str) -> Counters {
        let value = |name: &str| {
            text.lines()
                .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
        };
        let step = |phase: &str| {
            let at = |what: &str| value(&format!("{STEP_DURATION}_{what}{{phase=\"{phase}\"}}"));
            at("count").zip(at("sum"))
        };
        Counters {
            preemptions: value("qwasi_preemptions_total"),
            steps: STEP_PHASES.map(step),
        }
    }

    /// The counts from `before` to `self`.
    fn since(&self, before: &Counters) -> Counters {
        let d = |a: Option<f64>, b: Option<f64>| Some(a? - b?);
        let mut steps = [None; 2];
        for (i, s) in steps.iter_mut().enumerate() {
            if let (Some(a), Some(b)) = (self.steps[i], before.steps[i]) {
                *s = Some((a.0 - b.0, a.1 - b.1));
            }
        }
        Counters {
            preemptions: d(self.preemptions, before.preemptions),
            steps,
        }
    }

    /// Per phase the steps and their mean milliseconds, and `busy`: the
    /// fraction of `wall` the engine spent in steps (the rest is the
    /// server's own time between steps, or waiting for requests).
    fn steps_json(&self, wall: Duration) -> Value {
        let mut o = serde_json::Map::new();
        let mut busy = 0.0;
        for (phase, s) in STEP_PHASES.iter().zip(self.steps) {
            let Some((n, secs)) = s else {
                return Value::Null;
            };
            busy += secs;
            let mean = if n > 0.0 { secs * 1e3 / n } else { 0.0 };
            o.insert(phase.to_string(), json!({"steps": n, "mean_ms": mean}));
        }
        o.insert("busy".into(), json!(busy / wall.as_secs_f64()));
        Value::Object(o)
    }
}

fn summarize(
    level: Level,
    len: usize,
    (wall, os): &(Duration, Vec<Outcome>),
    server: &Counters,
) -> Value {
    let ok: Vec<&Outcome> = os.iter().filter(|o| o.error.is_none()).collect();
    let errors: Vec<&str> = os
        .iter()
        .filter_map(|o| o.error.as_deref())
        .take(3)
        .collect();
    let tokens: usize = ok.iter().map(|o| o.tokens).sum();
    let ms = |d: &Duration| d.as_secs_f64() * 1e3;
    let ttft: Vec<f64> = ok.iter().filter_map(|o| o.first.as_ref().map(ms)).collect();
    let itl: Vec<f64> = ok.iter().flat_map(|o| o.gaps.iter().map(ms)).collect();
    let tpot: Vec<f64> = ok
        .iter()
        .filter(|o| o.tokens > 1)
        .filter_map(|o| Some((ms(&o.end) - ms(o.first.as_ref()?)) / (o.tokens - 1) as f64))
        .collect();
    let (kind, value) = match level {
        Level::Concurrency(c) => ("concurrency", json!(c)),
        Level::Rate(r) => ("request_rate", json!(r)),
    };
    json!({
        kind: value,
        "prompt_tokens": len,
        "requests": os.len(),
        "failed": os.len() - ok.len(),
        "errors": errors,
        "duration_s": wall.as_secs_f64(),
        "output_tokens": tokens,
        "output_tok_per_s": tokens as f64 / wall.as_secs_f64(),
        "ttft_ms": pct(&ttft),
        "itl_ms": pct(&itl),
        "tpot_ms": pct(&tpot),
        "preemptions": server.preemptions,
        "engine_steps": server.steps_json(*wall),
    })
}

/// p50 / p99 / mean / max.
fn pct(v: &[f64]) -> Value {
    if v.is_empty() {
        return Value::Null;
    }
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    let at = |q: f64| s[((q * (s.len() - 1) as f64).round() as usize).min(s.len() - 1)];
    json!({"p50": at(0.5), "p99": at(0.99), "mean": s.iter().sum::<f64>() / s.len() as f64, "max": s[s.len() - 1]})
}

fn line(r: &Value) -> String {
    let level = r
        .get("concurrency")
        .map(|c| format!("c={c}"))
        .or_else(|| r.get("request_rate").map(|x| format!("rate={x}/s")))
        .unwrap_or_default();
    let g = |p: &str| r.pointer(p).and_then(Value::as_f64).unwrap_or(f64::NAN);
    let steps = if r["engine_steps"].is_object() {
        format!(
            ", steps: decode {} x {:.2} ms, prompt {} x {:.2} ms, busy {:.0}%",
            g("/engine_steps/decode/steps"),
            g("/engine_steps/decode/mean_ms"),
            g("/engine_steps/prompt/steps"),
            g("/engine_steps/prompt/mean_ms"),
            g("/engine_steps/busy") * 100.0,
        )
    } else {
        String::new()
    };
    format!(
        "{level} prompt {}: {:.1} tok/s, TTFT p50 {:.1} / p99 {:.1} ms, ITL p50 {:.2} / p99 {:.2} ms, {} failed{steps}",
        r["prompt_tokens"],
        g("/output_tok_per_s"),
        g("/ttft_ms/p50"),
        g("/ttft_ms/p99"),
        g("/itl_ms/p50"),
        g("/itl_ms/p99"),
        r["failed"],
    )
}

fn gpu_name() -> Value {
    std::process::Command::new("nvidia-smi")
        .args(["--query-gpu=name,driver_version", "--format=csv,noheader"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| json!(String::from_utf8_lossy(&o.stdout).trim()))
        .unwrap_or(Value::Null)
}

/// splitmix64: seeded, reproducible prompts and arrival gaps.
struct SplitMix(u64);

impl SplitMix {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    /// Uniform in [0, 1).
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// The server under load.
enum Server {
    External(String),
    Started {
        url: String,
        child: std::process::Child,
    },
}

impl Server {
    /// `qwasi serve` (this binary) on a free loopback port, once `/ready` says so.
    fn start(model: Option<&Path>, extra: &str, timeout_s: u64) -> Result<Self> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let mut cmd = std::process::Command::new(std::env::current_exe()?);
        cmd.args(["serve", "--host", "127.0.0.1", "--port", &port.to_string()]);
        if let Some(m) = model {
            cmd.arg("--model").arg(m);
        }
        cmd.args(extra.split_whitespace());
        eprintln!("[bench] starting {cmd:?}");
        let child = cmd.spawn().context("cannot start qwasi serve")?;
        let url = format!("http://127.0.0.1:{port}");
        let mut s = Server::Started {
            url: url.clone(),
            child,
        };
        let t0 = Instant::now();
        loop {
            if let Server::Started { child, .. } = &mut s
                && let Some(status) = child.try_wait()?
            {
                bail!("qwasi serve exited before it was ready: {status}");
            }
            let ready = std::net::TcpStream::connect(("127.0.0.1", port)).is_ok_and(|mut c| {
                use std::io::{Read, Write};
                let _ = c.set_read_timeout(Some(Duration::from_secs(2)));
                let _ = write!(
                    c,
                    "GET /ready HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
                );
                let mut r = String::new();
                let _ = c.read_to_string(&mut r);
                r.starts_with("HTTP/1.1 200")
            });
            if ready {
                eprintln!(
                    "[bench] server ready in {:.1} s",
                    t0.elapsed().as_secs_f64()
                );
                return Ok(s);
            }
            if t0.elapsed() > Duration::from_secs(timeout_s) {
                s.stop();
                bail!("qwasi serve was not ready within {timeout_s} s");
            }
            std::thread::sleep(Duration::from_millis(250));
        }
    }

    fn url(&self) -> &str {
        match self {
            Server::External(u) | Server::Started { url: u, .. } => u,
        }
    }

    /// SIGTERM (graceful), then wait; kill after 30 s.
    fn stop(&mut self) {
        if let Server::Started { child, .. } = self {
            crate::commands::platform::stop_child(child);
            let t0 = Instant::now();
            while t0.elapsed() < Duration::from_secs(30) {
                if let Ok(Some(_)) = child.try_wait() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_and_prompts() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        let p = pct(&v);
        assert_eq!(p["p50"], json!(51.0));
        assert_eq!(p["p99"], json!(99.0));
        assert_eq!(p["max"], json!(100.0));
        assert_eq!(pct(&[]), Value::Null);
        let mut r = SplitMix(1);
        let a = prompt(&mut r, 16, 7);
        assert_eq!(a.len(), 16);
        assert_eq!(a[0], 107);
        assert!(a.iter().all(|&t| (100..100_000).contains(&t)));
        let mut r2 = SplitMix(1);
        assert_eq!(prompt(&mut r2, 16, 7), a, "seeded prompts repeat");
    }

    /// The levels a command line asks for, as `c=N` and `r=R`.
    fn levels(args: &[&str]) -> Vec<String> {
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            a: ServingArgs,
        }
        let cli =
            <Cli as clap::Parser>::parse_from(std::iter::once("bench").chain(args.iter().copied()));
        plan(&cli.a)
            .into_iter()
            .map(|l| match l {
                Level::Concurrency(c) => format!("c={c}"),
                Level::Rate(r) => format!("r={r}"),
            })
            .collect()
    }

    #[test]
    fn a_stream_without_text_stops_the_bench() {
        let mut o = Outcome {
            start: Instant::now(),
            first: None,
            end: Duration::ZERO,
            gaps: Vec::new(),
            tokens: 8,
            error: None,
        };
        let e = timed(&o).unwrap_err().to_string();
        assert!(e.contains("tokenizer.json"), "{e}");
        o.first = Some(Duration::from_millis(5));
        timed(&o).unwrap();
    }

    #[test]
    fn server_counters_are_read_and_differenced() {
        let at = |pre: f64, decode: (f64, f64), prompt: (f64, f64)| {
            format!(
                "qwasi_preemptions_total_x 9\nqwasi_preemptions_total {pre}\n\
                 qwasi_step_duration_seconds_bucket{{phase=\"decode\",le=\"+Inf\"}} {}\n\
                 qwasi_step_duration_seconds_sum{{phase=\"decode\"}} {}\n\
                 qwasi_step_duration_seconds_count{{phase=\"decode\"}} {}\n\
                 qwasi_step_duration_seconds_sum{{phase=\"prompt\"}} {}\n\
                 qwasi_step_duration_seconds_count{{phase=\"prompt\"}} {}\n",
                decode.0, decode.1, decode.0, prompt.1, prompt.0
            )
        };
        let before = Counters::parse(&at(1.0, (10.0, 0.1), (2.0, 0.1)));
        let after = Counters::parse(&at(3.0, (110.0, 1.1), (12.0, 0.6)));
        let d = after.since(&before);
        assert_eq!(d.preemptions, Some(2.0));
        let v = d.steps_json(Duration::from_secs(2));
        assert_eq!(v["decode"]["steps"], json!(100.0));
        assert!((v["decode"]["mean_ms"].as_f64().unwrap() - 10.0).abs() < 1e-9);
        assert_eq!(v["prompt"]["steps"], json!(10.0));
        assert!((v["prompt"]["mean_ms"].as_f64().unwrap() - 50.0).abs() < 1e-9);
        assert!((v["busy"].as_f64().unwrap() - 0.75).abs() < 1e-9);
        // A server without the series (another engine): nothing reported.
        let none = Counters::parse("up 1\n");
        assert_eq!(none.since(&none).preemptions, None);
        assert_eq!(
            none.since(&none).steps_json(Duration::from_secs(1)),
            Value::Null
        );
    }

    #[test]
    fn rates_alone_run_without_the_default_concurrencies() {
        assert_eq!(levels(&[]), ["c=1", "c=8", "c=16", "c=32", "c=64"]);
        assert_eq!(levels(&["--request-rate", "2,4.5"]), ["r=2", "r=4.5"]);
        assert_eq!(
            levels(&["--concurrency", "8", "--request-rate", "2"]),
            ["c=8", "r=2"]
        );
    }
}
