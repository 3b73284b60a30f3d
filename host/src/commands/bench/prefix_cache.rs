//! `qwasi bench --workload prefix-cache`: time to first token (TTFT) through
//! the engine service for a prompt of `prefix + new` tokens, cold (nothing
//! cached) vs resumed from the snapshot a previous request left at the end of
//! `prefix`, at several prefix lengths (median of `--runs`); the same build
//! checks that the cached request yields the cold request's greedy tokens and
//! logprobs; and a sweep of `--snapshot-interval` values measures what the
//! extra prefill splits and snapshots cost a cold prefill (how the default
//! was chosen).
//!
//! Backends. The CPU (`--model DIR` or the embedded demo model) unless
//! `--backend` says otherwise (without it the speed workload takes the GPU of
//! the build, this one the CPU). `--backend cuda|hip` (a `--features cuda|hip` build) runs the
//! speed workload's synthetic model (`--synthetic`, `--layers`, same seed)
//! after the reference fixtures (`--fixtures`) have checked this build, and
//! differs from the CPU run where the device does:
//! * exactness: cold and cached prefills split the prompt differently (16K
//!   prefill passes, chunked GDN chunks, attention tiles), so the logprobs
//!   may differ by rounding: same greedy tokens and max |Δ logprob| ≤ 0.05
//!   (top alternatives matched by id) pass; the CPU keeps 1e-5;
//! * a GPU snapshot copies the GDN states and holds the sequence's whole KV
//!   slab (shared with the snapshots of the same sequence: its capacity,
//!   up to about twice the position; the cached request resumes in it, no
//!   copy, once the prefix request is gone: `cached_resumed_in_place_runs`,
//!   from the `qwasi_prefix_cache_resumed_in_place_total` metric, says
//!   whether each did), so the TTFT runs snapshot only at
//!   prompt and generation ends (`--snapshot-interval` 0), the sweep is off
//!   unless `--intervals` is given, and the budget defaults to 32 GiB (a
//!   131K prefix is 5.4 GB of f32 KV rows); it is checked against the
//!   longest prefix before the runs;
//! * one untimed warm-up request, a progress line per request on stderr,
//!   and the device memory in use sampled every 20 ms (its maximum) in the
//!   report;
//! * with `QWASI_GPU_PROFILE=1`, the per-kernel GPU time of the last run's
//!   cached request per prefix (`cached_request_profile_ms`; with one run it
//!   also holds the first run's 8 generated tokens).
//!
//! Every backend: each cached request's time before its first token by step
//! (`cached_request_phases_ms`: prefix lookup, restore, prefill, snapshot
//! copies, sampling; from `qwasi_first_token_phase_seconds_total`), so what
//! the TTFT holds beyond the prefill is visible.

use super::{Args, command, machine, median, ms};
use anyhow::{Context, Result, bail};
use qwasi_engine::backend::Backend;
use qwasi_engine::cpu::CpuModel;
use qwasi_engine::generate::GenerateRequest;
use qwasi_engine::model::LoadedModel;
use qwasi_engine::prefix_cache::CacheStats;
use qwasi_engine::sampling::{Sampled, SamplingParams};
use qwasi_engine::service::{EngineService, Event, Phase, ServiceConfig, SubmitOptions, Usage};
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Options of the prefix-cache workload (flattened into `qwasi bench`).
#[derive(clap::Args)]
pub struct PrefixCacheArgs {
    /// Cached prefix lengths, in tokens.
    #[arg(long, value_delimiter = ',', default_value = "256,1024,4096")]
    prefixes: Vec<usize>,
    /// New tokens after the prefix.
    #[arg(long, default_value_t = 256)]
    new_tokens: usize,
    /// Snapshot intervals to sweep (0 = none) on a cold prompt of the
    /// longest prefix + new tokens; '' or none to skip (default
    /// 0,256,512,1024,2048 on the CPU, none on a GPU).
    #[arg(long, value_name = "N,..|none", value_parser = parse_intervals)]
    intervals: Option<Intervals>,
    /// Prefix-cache budget for the runs (default 4096 on the CPU, 32768 on a GPU).
    #[arg(long, value_name = "MIB")]
    prefix_cache_mib: Option<usize>,
    /// Host-memory tier for a GPU backend's snapshots (0 = none). With a
    /// small --prefix-cache-mib, cached requests resume from host memory.
    #[arg(long, value_name = "MIB", default_value_t = 0)]
    prefix_cache_host_mib: usize,
    /// Snapshot interval of the TTFT runs (default: the service's, 1024, on
    /// the CPU; 0 on a GPU, so that the cold runs time the prefill alone).
    #[arg(long, value_name = "TOKENS")]
    snapshot_interval: Option<usize>,
}

/// `--intervals`: a comma-separated list, empty when '' or `none`.
#[derive(Clone, Debug)]
pub struct Intervals(Vec<usize>);

fn parse_intervals(s: &str) -> Result<Intervals, String> {
    let s = s.trim();
    if s.is_empty() || s.eq_ignore_ascii_case("none") {
        return Ok(Intervals(Vec::new()));
    }
    s.split(',')
        .map(|v| {
            v.trim()
                .parse()
                .map_err(|e| format!("{v:?} is not a token count ({e})"))
        })
        .collect::<Result<_, _>>()
        .map(Intervals)
}

/// Exactness threshold on the CPU: cold and cached prefills run the same
/// operations on the same values.
const CPU_TOLERANCE: f32 = 1e-5;
/// On a GPU: where the cached prefix ends inside a cold run's 16K prefill
/// pass, the two runs hand cuBLAS different row counts and it picks kernels
/// that round differently (~1e-7); 40 layers of random weights, whose router
/// top-8 sits on near-ties, amplify that. Measured on the H200 at an 8K
/// prefix + 1K: 0.016 (0.0023 with per-expert cuBLAS MoE, 0.023 with CUDA-core
/// attention); at 16K-aligned prefixes the runs are bit-identical (0.0).
#[cfg_attr(not(any(feature = "cuda", feature = "hip")), allow(dead_code))]
const GPU_TOLERANCE: f32 = 0.05;
/// Greedy tokens the first run of each prefix compares.
const COMPARED: usize = 8;

pub fn run(a: &Args) -> Result<()> {
    let backend = a.speed.backend.as_deref().unwrap_or("cpu");
    match backend {
        "cpu" => cpu(a),
        "cuda" if !cfg!(feature = "cuda") => {
            bail!("this qwasi was built without the cuda backend; rebuild with `--features cuda`")
        }
        "hip" if !cfg!(all(feature = "hip", not(feature = "cuda"))) => bail!(
            "this qwasi was built without the hip backend; rebuild with `--features hip` (without cuda)"
        ),
        "cuda" | "hip" => gpu(a, backend),
        other => {
            bail!("--workload prefix-cache supports --backend cpu, cuda or hip (got {other:?})")
        }
    }
}

/// What the measurement runs with, after the per-backend defaults.
struct Plan {
    runs: usize,
    prefix_cache_mib: usize,
    prefix_cache_host_mib: usize,
    /// Snapshot interval of the TTFT runs.
    interval: usize,
    /// Intervals swept.
    intervals: Vec<usize>,
    /// GPU: exactness by [`GPU_TOLERANCE`], progress lines.
    gpu: bool,
    /// Tokens of an untimed first request (0: none).
    warmup: usize,
}

impl Plan {
    /// Defaults for the backend and the checks that need no model weights:
    /// every prompt (and the greedy tokens compared) must fit `context`.
    fn new(a: &Args, gpu: bool, context: usize) -> Result<Self> {
        let p = &a.prefix_cache;
        let runs = a.runs.unwrap_or(3);
        if runs == 0 || p.prefixes.is_empty() {
            bail!("--runs and --prefixes must be non-empty");
        }
        for &len in &p.prefixes {
            if len == 0 {
                bail!("--prefixes: a cached prefix needs at least one token");
            }
            if len + p.new_tokens + COMPARED > context {
                bail!(
                    "prefix {len} + {} new tokens (+ {COMPARED} generated) exceed the model's \
                     context length of {context} tokens; use shorter --prefixes or --new-tokens",
                    p.new_tokens
                );
            }
        }
        let cpu_intervals = [0, 256, 512, 1024, 2048];
        Ok(Plan {
            runs,
            prefix_cache_mib: p.prefix_cache_mib.unwrap_or(if gpu { 32768 } else { 4096 }),
            prefix_cache_host_mib: p.prefix_cache_host_mib,
            interval: p.snapshot_interval.unwrap_or(if gpu {
                0
            } else {
                ServiceConfig::default().snapshot_interval
            }),
            intervals: match &p.intervals {
                Some(Intervals(v)) => v.clone(),
                None if gpu => Vec::new(),
                None => cpu_intervals.to_vec(),
            },
            gpu,
            // Kernels, libraries and work buffers up to a full 16K prefill pass.
            warmup: if gpu {
                (p.prefixes.iter().max().expect("non-empty") + p.new_tokens).min(16_384)
            } else {
                0
            },
        })
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

/// The value of the metric line starting `name ` (0 when absent).
fn metric(svc: &EngineService, name: &str) -> f64 {
    svc.metrics_text()
        .lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0.0)
}

/// `qwasi_prefix_cache_resumed_in_place_total`: whether a cached request
/// resumed in the snapshot's own KV memory (GPU) rather than a copy.
fn in_place_resumes(svc: &EngineService) -> u64 {
    metric(svc, "qwasi_prefix_cache_resumed_in_place_total") as u64
}

/// The steps before the first token (`qwasi_first_token_phase_seconds_total`,
/// in [`Phase::ALL`]'s order), summed over the service's requests so far, in ms.
fn phases_ms(svc: &EngineService) -> [f64; Phase::ALL.len()] {
    Phase::ALL.map(|p| {
        let series = format!(
            "qwasi_first_token_phase_seconds_total{{phase=\"{}\"}}",
            p.name()
        );
        1e3 * metric(svc, &series)
    })
}

/// Max |Δ logprob| between the cold (`c`) and cached (`h`) steps: the
/// sampled token's and the top alternatives'. The CPU compares the top lists
/// position by position (a different id is infinitely far: the ranking must
/// be identical); a GPU matches them by id, since a near tie may swap two
/// ranks, and counts the ids found in only one list.
fn logprob_diff(c: &[Sampled], h: &[Sampled], by_id: bool) -> (f32, usize) {
    let mut unmatched = 0;
    let mut dmax = 0f32;
    for (x, y) in c.iter().zip(h) {
        dmax = dmax.max((x.logprob - y.logprob).abs());
        if by_id {
            for p in &x.top {
                match y.top.iter().find(|q| q.0 == p.0) {
                    Some(q) => dmax = dmax.max((p.1 - q.1).abs()),
                    None => unmatched += 1,
                }
            }
        } else {
            for (p, q) in x.top.iter().zip(&y.top) {
                dmax = dmax.max(if p.0 == q.0 {
                    (p.1 - q.1).abs()
                } else {
                    f32::INFINITY
                });
            }
        }
    }
    (dmax, unmatched)
}

struct Measured {
    rows: Vec<Value>,
    exact_all: bool,
    worst_dlogprob: f32,
    stats: CacheStats,
    sweep: Vec<Value>,
}

/// Per-kernel GPU times since the last call (`QWASI_GPU_PROFILE=1`; empty
/// where the backend has no profile).
type Profile<'a> = &'a dyn Fn() -> Vec<(&'static str, usize, f64)>;

/// Both parts of the workload on `model`: TTFT cold vs cached with the
/// exactness check (1), and the snapshot-interval sweep (2). `profile` is
/// read around the last run's cached request of every prefix.
fn measure<M: Backend + 'static>(
    a: &Args,
    plan: &Plan,
    model: &Arc<M>,
    model_id: &str,
    on: &str,
    profile: Profile,
) -> Result<Measured> {
    let p = &a.prefix_cache;
    let runs = plan.runs;
    let vocab = model.config().vocab_size;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let service = |interval: usize, budget_mib: usize| {
        EngineService::start(
            model.clone(),
            None,
            model_id.to_string(),
            ServiceConfig {
                max_queue: 4,
                queue_timeout: Duration::ZERO,
                prefix_cache_bytes: budget_mib << 20,
                prefix_cache_host_bytes: plan.prefix_cache_host_mib << 20,
                snapshot_interval: interval,
                ..ServiceConfig::default()
            },
        )
    };
    // A request, with a progress line around it on a GPU (a 131K cold
    // prefill takes about a minute).
    let request = |svc: &EngineService, what: &str, prompt: Vec<u32>, n: usize, salt: &str| {
        if plan.gpu {
            eprintln!("  [prefix-cache] {what}: {} tokens ...", prompt.len());
        }
        let r = rt.block_on(timed(svc, prompt, n, salt));
        if plan.gpu
            && let Ok(r) = &r
        {
            eprintln!(
                "  [prefix-cache] {what}: TTFT {:.1} ms, {} cached tokens",
                ms(r.ttft),
                r.usage.cached_tokens
            );
        }
        r
    };
    eprintln!(
        "bench prefix-cache: model {model_id}, prefixes {:?} + {} new tokens, {} runs, on {on}",
        p.prefixes, p.new_tokens, runs
    );
    if plan.warmup > 0 {
        let svc = service(0, 0);
        let prompt = tokens(plan.warmup, 0x3a3a, vocab);
        request(&svc, "warm-up (untimed, no cache)", prompt, 2, "warm-up")?;
    }

    // 1. TTFT cold vs cached, and exactness.
    let svc = service(plan.interval, plan.prefix_cache_mib);
    let tolerance = if plan.gpu {
        GPU_TOLERANCE
    } else {
        CPU_TOLERANCE
    };
    let mut rows = Vec::new();
    let mut exact_all = true;
    let mut worst_dlogprob = 0f32;
    for &len in &p.prefixes {
        let (mut cold, mut cached, mut warm) = (vec![], vec![], vec![]);
        let mut in_place = vec![];
        let mut phases = vec![];
        let mut exact = json!(null);
        let mut cached_profile = Vec::new();
        for run in 0..runs {
            let seed = (len as u64) << 8 | run as u64;
            let prefix = tokens(len, seed, vocab);
            let mut full = prefix.clone();
            full.extend(tokens(p.new_tokens, seed ^ 0xabcdef, vocab));
            // Only the first run checks several generated tokens (exactness);
            // TTFT does not depend on max_tokens.
            let n = if run == 0 { COMPARED } else { 1 };
            let (ws, cs) = (format!("w{seed}"), format!("c{seed}"));
            let tag = |what: &str| format!("prefix {len} run {run}: {what}");
            let w = request(&svc, &tag("prefix only"), prefix.clone(), 1, &ws)?;
            let c = request(&svc, &tag("cold"), full.clone(), n, &cs)?;
            let last = run + 1 == runs;
            if last {
                profile();
            }
            let resumed_before = in_place_resumes(&svc);
            let phases_before = phases_ms(&svc);
            let h = request(&svc, &tag("cached"), full.clone(), n, &ws)?;
            in_place.push(in_place_resumes(&svc) > resumed_before);
            let after = phases_ms(&svc);
            phases.push(std::array::from_fn::<f64, { Phase::ALL.len() }, _>(|i| {
                after[i] - phases_before[i]
            }));
            if last {
                cached_profile = profile();
            }
            if c.usage.cached_tokens != 0 || h.usage.cached_tokens as usize != len {
                bail!(
                    "prefix {len}: expected a miss then a hit of {len} tokens, got {} and {} \
                     (is --prefix-cache-mib {} large enough?)",
                    c.usage.cached_tokens,
                    h.usage.cached_tokens,
                    plan.prefix_cache_mib
                );
            }
            warm.push(ms(w.ttft));
            cold.push(ms(c.ttft));
            cached.push(ms(h.ttft));
            if run == 0 {
                let same_tokens = c.tokens == h.tokens;
                let (dmax, unmatched) = logprob_diff(&c.steps, &h.steps, plan.gpu);
                let ok = same_tokens && dmax <= tolerance && c.steps.len() == h.steps.len();
                exact_all &= ok;
                worst_dlogprob = worst_dlogprob.max(dmax);
                exact = json!({
                    "greedy_tokens_compared": c.tokens.len(),
                    "same_tokens": same_tokens,
                    "max_abs_logprob_diff": dmax,
                    "pass": ok,
                });
                if plan.gpu {
                    exact["tolerance"] = json!(tolerance);
                    exact["top_ids_in_one_list_only"] = json!(unmatched);
                }
            }
        }
        let (c, h) = (median(&cold), median(&cached));
        eprintln!(
            "  prefix {len:>6} + {:>4} new: cold TTFT {c:>9.1} ms   cached {h:>8.1} ms   speedup {:>5.1}x   exact {}",
            p.new_tokens,
            c / h,
            exact["pass"]
        );
        for r in &phases {
            let parts: Vec<String> = Phase::ALL
                .iter()
                .zip(r)
                .map(|(k, v)| format!("{} {v:.2}", k.name()))
                .collect();
            eprintln!(
                "  cached request before its first token (ms): {}",
                parts.join(", ")
            );
        }
        super::speed::print_profile(
            &format!("cached request ({len} + {})", p.new_tokens),
            &cached_profile,
            1,
        );
        rows.push(json!({
            "prefix_tokens": len,
            "new_tokens": p.new_tokens,
            "cold_ttft_ms_median": c,
            "cached_ttft_ms_median": h,
            "speedup": c / h,
            "cold_ttft_ms_runs": cold,
            "cached_ttft_ms_runs": cached,
            "prefix_only_request_ms_runs": warm,
            "cached_resumed_in_place_runs": in_place,
            "exactness": exact,
            "cached_request_profile_ms": super::speed::profile_json(&cached_profile),
            "cached_request_phases_ms": phases
                .iter()
                .map(|r| {
                    let named = Phase::ALL.iter().zip(r);
                    named.map(|(k, v)| (k.name().to_string(), json!(v))).collect()
                })
                .collect::<Vec<serde_json::Map<_, _>>>(),
        }));
    }
    let stats = svc.prefix_cache_stats().unwrap_or_default();
    // Free the snapshots now (device memory), not when the worker exits.
    svc.prefix_cache().inspect(|c| c.clear());
    drop(svc);

    // 2. Snapshot-interval sweep: cold prefill of the longest prompt.
    let longest = *p.prefixes.iter().max().expect("non-empty") + p.new_tokens;
    let mut sweep = Vec::new();
    for &interval in &plan.intervals {
        let svc = service(interval, plan.prefix_cache_mib);
        let mut t = vec![];
        let mut snaps = 0;
        let mut bytes = 0;
        for run in 0..runs {
            let seed = 0x5eed_0000 + run as u64;
            let r = request(
                &svc,
                &format!("interval {interval} run {run}"),
                tokens(longest, seed, vocab),
                1,
                &format!("s{run}"),
            )?;
            t.push(ms(r.ttft));
            let s = svc.prefix_cache_stats().unwrap_or_default();
            if run == 0 {
                (snaps, bytes) = (s.snapshots, s.bytes);
            }
        }
        svc.prefix_cache().inspect(|c| c.clear());
        drop(svc);
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
    Ok(Measured {
        rows,
        exact_all,
        worst_dlogprob,
        stats,
        sweep,
    })
}

/// The report's common part.
fn report(
    backend: &str,
    model_id: &str,
    commit: String,
    machine: Value,
    config: Value,
    m: &Measured,
    started: Instant,
) -> Value {
    json!({
        "workload": "prefix-cache",
        "backend": backend,
        "model": model_id,
        "commit": commit,
        "command": command(),
        "machine": machine,
        "config": config,
        "ttft": m.rows,
        "exactness_pass": m.exact_all,
        "exactness_max_abs_logprob_diff": m.worst_dlogprob,
        "snapshot_interval_sweep": m.sweep,
        "cache_after_ttft_runs": {
            "snapshots": m.stats.snapshots,
            "bytes": m.stats.bytes,
            "evictions": m.stats.evictions,
            "host_bytes": m.stats.host_bytes,
            "demotions": m.stats.demotions,
            "promotions": m.stats.promotions,
        },
        "wall_s": started.elapsed().as_secs_f64(),
    })
}

/// The command line, an empty or unusual argument single-quoted (`--intervals ''`).
/// Writes the report, prints it, and fails when `ok` is false.
fn write(report: &Value, out: &Path, ok: bool, failure: &str) -> Result<()> {
    let text = serde_json::to_string_pretty(report)? + "\n";
    if let Some(dir) = out.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(out, &text).with_context(|| format!("writing {}", out.display()))?;
    println!("{text}");
    eprintln!("wrote {}", out.display());
    if !ok {
        bail!("{failure}");
    }
    Ok(())
}

fn cpu(a: &Args) -> Result<()> {
    let out = a
        .out
        .clone()
        .unwrap_or_else(|| PathBuf::from("benchmarks/prefix-cache-cpu.json"));
    let started = Instant::now();
    let machine = machine();
    let loaded = LoadedModel::load(a.model.model.as_deref())?;
    let model_id = loaded.id.clone();
    let plan = Plan::new(a, false, loaded.config.max_position_embeddings)?;
    let model = Arc::new(CpuModel::new(loaded.config, loaded.weights));
    let commit = super::commit();
    let m = measure(
        a,
        &plan,
        &model,
        &model_id,
        &machine["cpu"].to_string(),
        &Vec::new,
    )?;
    let config = json!({
        "runs": plan.runs,
        "snapshot_interval": plan.interval,
        "prefix_cache_mib": plan.prefix_cache_mib,
        "kv_page_tokens": qwasi_engine::cpu::attention::PAGE_TOKENS,
    });
    let report = report("cpu", &model_id, commit, machine, config, &m, started);
    write(
        &report,
        &out,
        m.exact_all,
        "exactness check failed: cached and cold requests differ",
    )
}

#[cfg(not(any(feature = "cuda", feature = "hip")))]
fn gpu(_a: &Args, _backend: &str) -> Result<()> {
    unreachable!("run() refuses every GPU backend in a build without GPU features")
}

/// Bytes a GPU snapshot at `pos` tokens holds at most (`GpuModel::snapshot`):
/// `(kv, gdn)`: the K and V buffers of every attention layer (the sequence's,
/// shared; their capacity stays under 2 pos + 4096 rows) and the copied conv
/// windows and states of every GDN layer.
#[cfg(any(feature = "cuda", feature = "hip"))]
fn gpu_snapshot_bytes(
    cfg: &qwasi_engine::config::ModelConfig,
    kv_f32: bool,
    pos: usize,
) -> (usize, usize) {
    use qwasi_engine::config::LayerKind;
    let row = cfg.num_key_value_heads * cfg.head_dim * if kv_f32 { 4 } else { 2 };
    let gdn = 4
        * (cfg.linear_conv_dim() * (cfg.linear_conv_kernel - 1)
            + cfg.linear_num_value_heads * cfg.linear_key_head_dim * cfg.linear_value_head_dim);
    let count = |kind: LayerKind| cfg.layer_kinds.iter().filter(|&&k| k == kind).count();
    (
        count(LayerKind::Full) * 2 * (2 * pos + 4096) * row,
        count(LayerKind::Linear) * gdn,
    )
}

#[cfg(any(feature = "cuda", feature = "hip"))]
fn gpu(a: &Args, backend: &str) -> Result<()> {
    use super::speed;
    if a.model.model.is_some() {
        bail!(
            "--backend {backend}: the prefix-cache workload runs the --synthetic model \
             (--model is for the CPU)"
        );
    }
    let out = a
        .out
        .clone()
        .unwrap_or_else(|| format!("benchmarks/prefix-cache-{backend}.json").into());
    let started = Instant::now();
    // What needs no device first: the preset, --layers, the context length.
    let mut cfg = qwasi_engine::presets::by_name(&a.speed.synthetic)?;
    if let Some(n) = a.speed.layers {
        cfg = qwasi_engine::presets::with_layers(cfg, n)?;
    }
    let plan = Plan::new(a, true, cfg.max_position_embeddings)?;
    // The longest prefix's snapshot must stay cached until its cached
    // request, behind the cold request's two (prompt end, generation end).
    // KV precision as the engine picks it (QWASI_KV=bf16 halves it).
    let kv_f32 = std::env::var("QWASI_KV").as_deref() != Ok("bf16");
    let longest = *a.prefix_cache.prefixes.iter().max().expect("non-empty");
    let prompt = longest + a.prefix_cache.new_tokens;
    let snap = |pos| gpu_snapshot_bytes(&cfg, kv_f32, pos);
    // The cold request's two snapshots share its KV buffers.
    let ((kv_prefix, gdn), (kv_prompt, _)) = (snap(longest), snap(prompt + COMPARED));
    let need = kv_prefix + kv_prompt + 3 * gdn + 3 * 4 * cfg.vocab_size;
    let budget = (plan.prefix_cache_mib + plan.prefix_cache_host_mib) << 20;
    if need > budget {
        bail!(
            "--prefix-cache-mib {} (+ --prefix-cache-host-mib {}): the {longest}-token prefix \
             needs up to {} MiB (its snapshot and the cold request's two, which hold the \
             sequences' KV buffers)",
            plan.prefix_cache_mib,
            plan.prefix_cache_host_mib,
            need.div_ceil(1 << 20)
        );
    }
    let machine = machine();

    // 1. Correctness of this build: every reference fixture.
    let correctness = speed::fixture_check(&a.speed.fixtures)?;

    // 2. The synthetic model (the speed workload's: same seed).
    let t0 = Instant::now();
    let model = Arc::new(speed::synthetic_model(&a.speed)?);
    let load_s = t0.elapsed().as_secs_f64();
    Plan::new(a, true, cfg.max_position_embeddings.min(model.max_len))?;
    let model_id = format!("synthetic:{}", a.speed.synthetic);
    let (after_load, total) = model.memory_used();
    let gpu_name = model.device_name().to_string();
    eprintln!(
        "[prefix-cache] {gpu_name}: model in {load_s:.1} s, {:.1} of {:.1} GB in use",
        after_load as f64 / 1e9,
        total as f64 / 1e9
    );

    // Beyond the cache: the running sequence (its KV capacity is at most
    // twice the prompt while it grows) and the request's two staged snapshots.
    let want = budget + 2 * kv_prompt;
    if want > total.saturating_sub(after_load) {
        eprintln!(
            "[prefix-cache] warning: the cache budget, the sequence and its snapshots may need \
             {:.1} GB, {:.1} GB are free",
            want as f64 / 1e9,
            total.saturating_sub(after_load) as f64 / 1e9
        );
    }

    // 3. The runs, with the device memory in use sampled every 20 ms (the
    // whole device, as cudaMemGetInfo sees it).
    let used = || model.memory_used().0;
    let (measured, peak) = super::with_peak_gauge(&used, |gauge| {
        let measured = measure(a, &plan, &model, &model_id, &gpu_name, &|| {
            model.take_profile()
        });
        (measured, gauge.take().max(after_load))
    });
    let measured = measured?;

    let config = json!({
        "runs": plan.runs,
        "snapshot_interval": plan.interval,
        "prefix_cache_mib": plan.prefix_cache_mib,
        "prefix_cache_host_mib": plan.prefix_cache_host_mib,
        "kv_cache": if model.kv_f32 { "f32" } else { "bf16" },
        "warmup_prompt_tokens": plan.warmup,
        "exactness_tolerance": GPU_TOLERANCE,
    });
    let mut r = report(
        backend,
        &model_id,
        super::commit(),
        machine,
        config,
        &measured,
        started,
    );
    r["gpu"] = json!(gpu_name);
    r["preset"] = json!(a.speed.synthetic);
    r["layers"] = json!(cfg.num_layers());
    r["seed"] = json!(format!("{:#x}", speed::SEED));
    r["load_s"] = json!(load_s);
    r["correctness"] = correctness;
    r["device_memory"] = json!({
        "total_bytes": total,
        "used_after_load_bytes": after_load,
        "used_peak_bytes": peak,
        "how": "cudaMemGetInfo of the whole device, sampled every 20 ms during the runs",
    });
    r["snapshots"] = json!({
        "storage": "device: a copy of the GDN states per snapshot and the sequence's KV buffers, shared by its snapshots (one page each, counted once)",
        "bytes_at_longest_prefix_at_most": kv_prefix + gdn,
    });
    let fixtures_ok = r["correctness"]["pass"].as_bool() != Some(false);
    write(
        &r,
        &out,
        fixtures_ok && measured.exact_all,
        &format!(
            "bench prefix-cache: {} FAILED (see {})",
            if fixtures_ok {
                "exactness (cached vs cold)"
            } else {
                "the fixture check"
            },
            out.display()
        ),
    )
}
