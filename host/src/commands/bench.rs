//! `qwasi bench --workload NAME`: engine benchmarks that print a table and
//! write a JSON report. One workload today (`prefix-cache`); add a variant to
//! [`Workload`] and a `run_*` function for more.
//!
//! `prefix-cache`: time to first token (TTFT) through the engine service for
//! a prompt of `prefix + new` tokens, cold (nothing cached) vs resumed from
//! the snapshot a previous request left at the end of `prefix`, at several
//! prefix lengths (median of `--runs`); the same build checks that the cached
//! request yields the cold request's greedy tokens and logprobs; and a sweep
//! of `--snapshot-interval` values measures what the extra prefill splits and
//! snapshots cost a cold prefill (how the default was chosen).

use super::ModelArgs;
use anyhow::{Context, Result, bail};
use qwasi_engine::backend::{Backend, SeqSnapshot};
use qwasi_engine::config::ModelConfig;
use qwasi_engine::cpu::{CpuModel, CpuSequence};
use qwasi_engine::generate::GenerateRequest;
use qwasi_engine::model::LoadedModel;
use qwasi_engine::sampling::{Sampled, SamplingParams};
use qwasi_engine::service::{EngineService, Event, ServiceConfig, SubmitOptions, Usage};
use serde_json::{Value, json};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

mod speed;

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Workload {
    /// TTFT cold vs cached prefix + new tokens; exactness; snapshot-interval sweep.
    PrefixCache,
    /// GPU batch-1 speed: TTFT and greedy decode at several prompt lengths
    /// (`--backend cuda --synthetic PRESET`), against the bandwidth floor.
    Speed,
}

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    model: ModelArgs,
    #[arg(long, value_enum)]
    workload: Workload,
    /// Cached prefix lengths, in tokens.
    #[arg(long, value_delimiter = ',', default_value = "256,1024,4096")]
    prefixes: Vec<usize>,
    /// New tokens after the prefix.
    #[arg(long, default_value_t = 256)]
    new_tokens: usize,
    /// Runs per measurement (the median is reported; default 3, speed: 5).
    #[arg(long)]
    runs: Option<usize>,
    /// Snapshot intervals to sweep (0 = none) on a cold prompt of the
    /// longest prefix + new tokens; empty to skip.
    #[arg(long, value_delimiter = ',', default_value = "0,256,512,1024,2048")]
    intervals: Vec<usize>,
    /// Prefix-cache budget for the runs.
    #[arg(long, default_value_t = 4096)]
    prefix_cache_mib: usize,
    /// Where to write the JSON report (default benchmarks/prefix-cache-cpu.json,
    /// speed: benchmarks/speed-<backend>.json).
    #[arg(long)]
    out: Option<PathBuf>,
    #[command(flatten)]
    speed: speed::SpeedArgs,
    /// CPU threads (default: all cores).
    #[arg(long)]
    threads: Option<usize>,
}

pub fn run(a: Args) -> Result<()> {
    if let Some(n) = a.threads {
        rayon::ThreadPoolBuilder::new()
            .num_threads(n)
            .build_global()
            .context("cannot size the CPU thread pool")?;
    }
    match a.workload {
        Workload::PrefixCache => prefix_cache(&a),
        Workload::Speed => speed::run(
            &a.speed,
            a.runs.unwrap_or(5),
            a.out
                .clone()
                .unwrap_or_else(|| format!("benchmarks/speed-{}.json", a.speed.backend).into()),
        ),
    }
}

/// Lets several services share one loaded model.
struct Shared(Arc<CpuModel>);

impl Backend for Shared {
    type Sequence = CpuSequence;
    fn name(&self) -> &'static str {
        self.0.name()
    }
    fn config(&self) -> &ModelConfig {
        self.0.config()
    }
    fn new_sequence(&self) -> CpuSequence {
        self.0.new_sequence()
    }
    fn position(&self, seq: &CpuSequence) -> usize {
        self.0.position(seq)
    }
    fn forward(&self, seq: &mut CpuSequence, tokens: &[u32]) -> Result<Vec<f32>> {
        self.0.forward(seq, tokens)
    }
    fn extend(&self, seq: &mut CpuSequence, tokens: &[u32]) -> Result<()> {
        self.0.extend(seq, tokens)
    }
    fn snapshot(&self, seq: &CpuSequence) -> Option<Box<dyn SeqSnapshot>> {
        self.0.snapshot(seq)
    }
    fn restore(&self, snap: &dyn SeqSnapshot) -> Option<CpuSequence> {
        self.0.restore(snap)
    }
}

/// Seeded ordinary (non-special) token ids.
fn tokens(n: usize, seed: u64, vocab: usize) -> Vec<u32> {
    let mut s = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let top = vocab.min(150_000) as u64;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s % top) as u32
        })
        .collect()
}

struct Timed {
    ttft: Duration,
    tokens: Vec<u32>,
    steps: Vec<Sampled>,
    usage: Usage,
}

async fn timed(
    svc: &EngineService,
    prompt: Vec<u32>,
    max_tokens: usize,
    salt: &str,
) -> Result<Timed> {
    let req = GenerateRequest {
        prompt,
        max_tokens,
        stop_token_ids: vec![],
        ignore_eos: true,
        sampling: SamplingParams {
            logprobs: Some(5),
            ..Default::default()
        },
    };
    let opts = SubmitOptions {
        cache_salt: Some(salt.into()),
        ..Default::default()
    };
    let t0 = Instant::now();
    let mut h = svc
        .submit(req, opts)
        .await
        .map_err(|e| anyhow::anyhow!("submit: {e}"))?;
    let mut out = Timed {
        ttft: Duration::ZERO,
        tokens: vec![],
        steps: vec![],
        usage: Usage::default(),
    };
    loop {
        h.wait().await;
        for ev in h.try_next() {
            match ev {
                Event::Token { id, logprob, .. } => {
                    if out.tokens.is_empty() {
                        out.ttft = t0.elapsed();
                    }
                    out.tokens.push(id);
                    out.steps.extend(logprob);
                }
                Event::Finished { usage, .. } => {
                    out.usage = usage;
                    return Ok(out);
                }
                Event::Failed(m) => bail!("request failed: {m}"),
            }
        }
    }
}

/// The middle value (the mean of the two middle ones for an even count); NaN when empty.
fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    match s.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => s[n / 2],
        n => (s[n / 2 - 1] + s[n / 2]) / 2.0,
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn machine() -> Value {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let cpu = cpuinfo
        .lines()
        .find(|l| l.starts_with("model name"))
        .and_then(|l| l.split(':').nth(1))
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|| "unknown".into());
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let load = std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next().map(str::to_string));
    json!({
        "cpu": cpu,
        "cores": cores,
        "rayon_threads": rayon::current_num_threads(),
        "loadavg_1m_at_start": load,
        "os": std::env::consts::OS,
        "arch": std::env::consts::ARCH,
    })
}

fn commit() -> String {
    std::process::Command::new("git")
        .args(["rev-parse", "HEAD"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_else(|| "unknown".into())
}

fn prefix_cache(a: &Args) -> Result<()> {
    let runs = a.runs.unwrap_or(3);
    let out = a
        .out
        .clone()
        .unwrap_or_else(|| PathBuf::from("benchmarks/prefix-cache-cpu.json"));
    if runs == 0 || a.prefixes.is_empty() {
        bail!("--runs and --prefixes must be non-empty");
    }
    let started = Instant::now();
    let machine = machine();
    let loaded = LoadedModel::load(a.model.model.as_deref())?;
    let model_id = loaded.id.clone();
    let model = Arc::new(CpuModel::new(loaded.config, loaded.weights));
    let vocab = model.config().vocab_size;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let service = |interval: usize| {
        EngineService::start(
            Shared(model.clone()),
            None,
            model_id.clone(),
            ServiceConfig {
                max_queue: 4,
                queue_timeout: Duration::ZERO,
                prefix_cache_bytes: a.prefix_cache_mib << 20,
                snapshot_interval: interval,
                ..ServiceConfig::default()
            },
        )
    };
    let default_interval = ServiceConfig::default().snapshot_interval;
    eprintln!(
        "bench prefix-cache: model {model_id}, prefixes {:?} + {} new tokens, {} runs, on {}",
        a.prefixes, a.new_tokens, runs, machine["cpu"]
    );

    // 1. TTFT cold vs cached, and exactness.
    let svc = service(default_interval);
    let mut rows = Vec::new();
    let mut exact_all = true;
    let mut worst_dlogprob = 0f32;
    for &len in &a.prefixes {
        let (mut cold, mut cached, mut warm) = (vec![], vec![], vec![]);
        let mut exact = json!(null);
        for run in 0..runs {
            let seed = (len as u64) << 8 | run as u64;
            let prefix = tokens(len, seed, vocab);
            let mut full = prefix.clone();
            full.extend(tokens(a.new_tokens, seed ^ 0xabcdef, vocab));
            // Only the first run checks several generated tokens (exactness);
            // TTFT does not depend on max_tokens.
            let n = if run == 0 { 8 } else { 1 };
            let (ws, cs) = (format!("w{seed}"), format!("c{seed}"));
            let w = rt.block_on(timed(&svc, prefix.clone(), 1, &ws))?;
            let c = rt.block_on(timed(&svc, full.clone(), n, &cs))?;
            let h = rt.block_on(timed(&svc, full.clone(), n, &ws))?;
            if c.usage.cached_tokens != 0 || h.usage.cached_tokens as usize != len {
                bail!(
                    "prefix {len}: expected a miss then a hit of {len} tokens, got {} and {}",
                    c.usage.cached_tokens,
                    h.usage.cached_tokens
                );
            }
            warm.push(ms(w.ttft));
            cold.push(ms(c.ttft));
            cached.push(ms(h.ttft));
            if run == 0 {
                let same_tokens = c.tokens == h.tokens;
                let dmax = c
                    .steps
                    .iter()
                    .zip(&h.steps)
                    .flat_map(|(x, y)| {
                        std::iter::once((x.logprob - y.logprob).abs()).chain(
                            x.top.iter().zip(&y.top).map(|(p, q)| {
                                if p.0 == q.0 {
                                    (p.1 - q.1).abs()
                                } else {
                                    f32::INFINITY
                                }
                            }),
                        )
                    })
                    .fold(0f32, f32::max);
                let ok = same_tokens && dmax <= 1e-5 && c.steps.len() == h.steps.len();
                exact_all &= ok;
                worst_dlogprob = worst_dlogprob.max(dmax);
                exact = json!({
                    "greedy_tokens_compared": c.tokens.len(),
                    "same_tokens": same_tokens,
                    "max_abs_logprob_diff": dmax,
                    "pass": ok,
                });
            }
        }
        let (c, h) = (median(&cold), median(&cached));
        eprintln!(
            "  prefix {len:>6} + {:>4} new: cold TTFT {c:>9.1} ms   cached {h:>8.1} ms   speedup {:>5.1}x   exact {}",
            a.new_tokens,
            c / h,
            exact["pass"]
        );
        rows.push(json!({
            "prefix_tokens": len,
            "new_tokens": a.new_tokens,
            "cold_ttft_ms_median": c,
            "cached_ttft_ms_median": h,
            "speedup": c / h,
            "cold_ttft_ms_runs": cold,
            "cached_ttft_ms_runs": cached,
            "prefix_only_request_ms_runs": warm,
            "exactness": exact,
        }));
    }
    let stats = svc.prefix_cache_stats().unwrap_or_default();
    drop(svc);

    // 2. Snapshot-interval sweep: cold prefill of the longest prompt.
    let longest = *a.prefixes.iter().max().expect("non-empty") + a.new_tokens;
    let mut sweep = Vec::new();
    for &interval in &a.intervals {
        let svc = service(interval);
        let mut t = vec![];
        let mut snaps = 0;
        let mut bytes = 0;
        for run in 0..runs {
            let seed = 0x5eed_0000 + run as u64;
            let r = rt.block_on(timed(
                &svc,
                tokens(longest, seed, vocab),
                1,
                &format!("s{run}"),
            ))?;
            t.push(ms(r.ttft));
            let s = svc.prefix_cache_stats().unwrap_or_default();
            if run == 0 {
                (snaps, bytes) = (s.snapshots, s.bytes);
            }
        }
        let m = median(&t);
        eprintln!(
            "  interval {interval:>5}: cold TTFT of {longest} tokens {m:>9.1} ms, {snaps} snapshots, {:.1} MiB",
            bytes as f64 / (1 << 20) as f64
        );
        sweep.push(json!({
            "snapshot_interval": interval,
            "prompt_tokens": longest,
            "cold_ttft_ms_median": m,
            "cold_ttft_ms_runs": t,
            "snapshots_per_prompt": snaps,
            "bytes_per_prompt": bytes,
        }));
    }

    let report = json!({
        "workload": "prefix-cache",
        "backend": "cpu",
        "model": model_id,
        "commit": commit(),
        "command": std::env::args().collect::<Vec<_>>().join(" "),
        "machine": machine,
        "config": {
            "runs": runs,
            "snapshot_interval": default_interval,
            "prefix_cache_mib": a.prefix_cache_mib,
            "kv_page_tokens": qwasi_engine::cpu::attention::PAGE_TOKENS,
        },
        "ttft": rows,
        "exactness_pass": exact_all,
        "exactness_max_abs_logprob_diff": worst_dlogprob,
        "snapshot_interval_sweep": sweep,
        "cache_after_ttft_runs": {
            "snapshots": stats.snapshots,
            "bytes": stats.bytes,
            "evictions": stats.evictions,
        },
        "wall_s": started.elapsed().as_secs_f64(),
    });
    let text = serde_json::to_string_pretty(&report)? + "\n";
    if let Some(dir) = out.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(&out, &text).with_context(|| format!("writing {}", out.display()))?;
    println!("{text}");
    eprintln!("wrote {}", out.display());
    if !exact_all {
        bail!("exactness check failed: cached and cold requests differ");
    }
    Ok(())
}
