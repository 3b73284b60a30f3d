//! `qwasi bench --workload NAME`: benchmarks that print a table and write a
//! JSON report, one module per workload: [`prefix_cache`] (TTFT cold vs
//! cached prefix, on the CPU or a GPU), [`speed`] (GPU batch-1 TTFT and
//! decode), [`batch`] (the GPU engine decoding B sequences together),
//! [`serving`] (concurrent streams over HTTP through `qwasi serve`) and
//! [`tokenize`] (encoding a long prompt). Add a variant to [`Workload`] and
//! a module for more.

use super::ModelArgs;
use anyhow::{Context, Result};
use std::path::PathBuf;
use std::time::Duration;

mod batch;
#[cfg(any(feature = "cuda", feature = "hip"))]
mod constrained;
mod prefix_cache;
mod serving;
mod speed;
mod tokenize;

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Workload {
    /// TTFT cold vs cached prefix + new tokens; exactness; snapshot-interval
    /// sweep. On the CPU (`--model` or the demo model) unless `--backend
    /// cuda|hip` is given explicitly (then the `--synthetic` model, in a
    /// `--features cuda|hip` build).
    PrefixCache,
    /// GPU batch-1 speed: TTFT and greedy decode at several prompt lengths
    /// (`--backend cuda --synthetic PRESET`), against the bandwidth floor.
    Speed,
    /// GPU engine alone, B sequences decoding together through the batched
    /// step (`--batches`, `--lens`, `--synthetic`): aggregate tok/s and step
    /// time per batch size.
    Batch,
    /// Concurrent streaming requests over HTTP through the OpenAI guest of
    /// `qwasi serve` (started by the bench, or `--url`): aggregate output
    /// tok/s, TTFT and inter-token latency per concurrency level or arrival rate.
    Serving,
    /// Encoding a long prompt (`--tokenize-tokens`, default 8192, or
    /// `--text FILE`): `tokenizers` on the whole text against the engine's
    /// encoder (parallel pieces), same ids checked; each way of encoding the
    /// pieces timed at several piece sizes.
    Tokenize,
}

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    model: ModelArgs,
    #[arg(long, value_enum)]
    workload: Workload,
    #[command(flatten)]
    prefix_cache: prefix_cache::PrefixCacheArgs,
    /// Runs per measurement (the median is reported; default 3, speed: 5).
    #[arg(long)]
    runs: Option<usize>,
    /// Where to write the JSON report (default prefix-cache:
    /// benchmarks/prefix-cache-<backend>.json, speed: benchmarks/speed-<backend>.json).
    #[arg(long)]
    out: Option<PathBuf>,
    #[command(flatten)]
    speed: speed::SpeedArgs,
    #[command(flatten)]
    serving: serving::ServingArgs,
    #[command(flatten)]
    batch: batch::BatchArgs,
    #[command(flatten)]
    tokenize: tokenize::TokenizeArgs,
    /// CPU threads (default: all cores).
    #[arg(long)]
    threads: Option<usize>,
    #[command(flatten)]
    precision: super::PrecisionArgs,
}

pub fn run(a: Args) -> Result<()> {
    if let Some(n) = a.threads {
        rayon::ThreadPoolBuilder::new()
            .num_threads(n)
            .build_global()
            .context("cannot size the CPU thread pool")?;
    }
    // The model the workload loads in this process (serving's server takes
    // its flags through --serve-args).
    match a.workload {
        Workload::PrefixCache => a
            .precision
            .apply(a.speed.backend.as_deref().unwrap_or("cpu"))?,
        Workload::Speed | Workload::Batch => a.precision.apply(a.speed.gpu_backend())?,
        Workload::Serving | Workload::Tokenize if a.precision.prefill_precision.is_some() => {
            anyhow::bail!(
                "--prefill-precision applies to the speed, batch and prefix-cache workloads \
                 (serving: pass it to the server in --serve-args)"
            )
        }
        Workload::Serving | Workload::Tokenize => {}
    }
    match a.workload {
        Workload::PrefixCache => prefix_cache::run(&a),
        Workload::Speed => speed::run(
            &a.speed,
            a.runs.unwrap_or(5),
            a.out.clone().unwrap_or_else(|| {
                format!("benchmarks/speed-{}.json", a.speed.gpu_backend()).into()
            }),
        ),
        Workload::Batch => batch::run(
            &a.speed,
            &a.batch,
            &a.out.clone().unwrap_or_else(|| {
                format!("benchmarks/batch-{}.json", a.speed.gpu_backend()).into()
            }),
        ),
        Workload::Serving => serving::run(
            &a.serving,
            a.model.model.as_deref(),
            &a.speed.fixtures,
            &a.out
                .clone()
                .unwrap_or_else(|| "benchmarks/serving.json".into()),
        ),
        Workload::Tokenize => tokenize::run(
            &a.tokenize,
            a.model.model.as_deref(),
            a.runs.unwrap_or(20),
            &a.out
                .clone()
                .unwrap_or_else(|| "benchmarks/tokenize.json".into()),
        ),
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

/// This process's command line, shell-quoted where needed (for reports).
fn command() -> String {
    std::env::args()
        .map(|a| {
            let plain = !a.is_empty()
                && a.chars()
                    .all(|c| c.is_ascii_alphanumeric() || "_-./=:,@+%".contains(c));
            if plain {
                a
            } else {
                format!("'{}'", a.replace('\'', r"'\''"))
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// The CPU this report was measured on.
fn machine() -> serde_json::Value {
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
    serde_json::json!({
        "cpu": cpu,
        "cores": cores,
        "rayon_threads": rayon::current_num_threads(),
        "loadavg_1m_at_start": load,
        "os": std::env::consts::OS,
        "arch": std::env::consts::ARCH,
    })
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// The commit of this binary: `QWASI_COMMIT` at build time (how the GPU
/// binaries carried to the device are stamped), else `git rev-parse HEAD` in
/// the current directory. Reports read it when they start.
fn commit() -> String {
    if let Some(c) = option_env!("QWASI_COMMIT") {
        return c.to_string();
    }
    std::process::Command::new("git")
        .args(["rev-parse", "HEAD"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_else(|| "unknown".into())
}

/// The peak of a memory gauge while a benchmark runs: a thread samples
/// `used()` every 20 ms (device memory as cudaMemGetInfo sees it changes at
/// allocations the engine makes inside its calls, so sampling between calls
/// would miss a prefill's scratch). `take` returns the highest value since
/// the last `take` and starts the next interval.
#[cfg(any(feature = "cuda", feature = "hip"))]
pub(crate) struct PeakGauge<'a> {
    used: &'a (dyn Fn() -> usize + Sync),
    peak: std::sync::atomic::AtomicUsize,
}

#[cfg(any(feature = "cuda", feature = "hip"))]
impl PeakGauge<'_> {
    pub(crate) fn take(&self) -> usize {
        let now = (self.used)();
        self.peak
            .swap(now, std::sync::atomic::Ordering::Relaxed)
            .max(now)
    }
}

/// Runs `f` with a [`PeakGauge`] over `used` sampled on a scoped thread,
/// which stops however `f` ends.
#[cfg(any(feature = "cuda", feature = "hip"))]
pub(crate) fn with_peak_gauge<T>(
    used: &(dyn Fn() -> usize + Sync),
    f: impl FnOnce(&PeakGauge) -> T,
) -> T {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::Relaxed};
    let gauge = PeakGauge {
        used,
        peak: AtomicUsize::new(used()),
    };
    let done = AtomicBool::new(false);
    struct Stop<'a>(&'a AtomicBool);
    impl Drop for Stop<'_> {
        fn drop(&mut self) {
            self.0.store(true, Relaxed);
        }
    }
    std::thread::scope(|s| {
        s.spawn(|| {
            while !done.load(Relaxed) {
                gauge.peak.fetch_max((gauge.used)(), Relaxed);
                std::thread::sleep(Duration::from_millis(20));
            }
        });
        let _stop = Stop(&done);
        f(&gauge)
    })
}
