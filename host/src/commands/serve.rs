//! `qwasi serve`: the HTTP server in the foreground.

use super::ModelArgs;
use super::engine::{CPU_PREFIX_CACHE_MIB, ModelSource, StartedEngine, start_engine};
use super::limits::LimitArgs;
use super::platform::StopRequests;
use super::serving::ServingArgs;
use super::state::{self, StateFile};
use crate::runtime::{self, GuestSource, Mount, Runtime, RuntimeConfig};
use crate::server::{self, AppState, ServerConfig};
use anyhow::{Context, Result, bail};
use qwasi_engine::service::ServiceConfig;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The environment variable `--api-key` falls back to (comma-separated keys);
/// `qwasi start` hands the keys to the background server through it.
pub const API_KEY_ENV: &str = "QWASI_API_KEY";

#[derive(clap::Args, Clone, Debug)]
pub struct Args {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Serve seeded random weights of a built-in geometry generated on the
    /// GPU (qwen3.6-35b-a3b, or qwen3.6-35b-a3b-fp8) instead of --model: for
    /// benchmarks, with no checkpoint to write or load (the text is
    /// meaningless). Needs --backend cuda (or hip).
    #[arg(long, value_name = "PRESET", conflicts_with = "model")]
    pub synthetic: Option<String>,
    /// With --synthetic: only the first N layers.
    #[arg(long, requires = "synthetic")]
    pub layers: Option<usize>,
    #[command(flatten)]
    pub serving: ServingArgs,
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// Port to listen on (0 = any free port; the banner prints it).
    #[arg(long, default_value_t = 8000)]
    pub port: u16,
    /// API key clients must send (`Authorization: Bearer KEY`); repeat or
    /// separate with commas for several. Also read from QWASI_API_KEY
    /// (comma-separated), which keeps keys off the command line.
    #[arg(
        long,
        env = API_KEY_ENV,
        value_delimiter = ',',
        hide_env_values = true
    )]
    pub api_key: Vec<String>,
    /// Allow listening on a non-loopback address without an API key.
    #[arg(long)]
    pub allow_unauthenticated: bool,
    /// Requests that may wait for the engine; beyond it: 429 queue_full.
    #[arg(long, default_value_t = 64)]
    pub max_queue: usize,
    /// How long a request may wait in the queue before 503 queue_timeout (0 = forever).
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    pub queue_timeout: Duration,
    /// Wall-clock limit for a whole request, streamed response included.
    #[arg(long, default_value = "600s", value_parser = parse_duration)]
    pub request_timeout: Duration,
    /// Longest prompt + completion (0 = the model's context length).
    #[arg(long, default_value_t = 0)]
    pub max_model_len: usize,
    /// Longest prompt accepted, in tokens (0 = no cap).
    #[arg(long, default_value_t = 0)]
    pub max_prompt_tokens: usize,
    /// Largest max_tokens accepted (0 = no cap).
    #[arg(long, default_value_t = 0)]
    pub max_completion_tokens: usize,
    /// API guest component (wasi:http incoming-handler, qwasi:inference/api)
    /// mounted at PREFIX (longest matching path prefix wins); a plain FILE is
    /// mounted at / instead of the bundled OpenAI guest. Repeatable; the files
    /// are watched and reloaded when they change.
    #[arg(long, value_name = "[PREFIX=]FILE")]
    pub guest: Vec<String>,
    /// Don't mount the bundled guests (OpenAI at /, Anthropic Messages at
    /// /v1/messages); paths no --guest matches get 404.
    #[arg(long)]
    pub no_default_guest: bool,
    /// How often guest files are checked for changes (0 = don't watch; SIGHUP
    /// and POST /admin/reload still reload).
    #[arg(long, default_value = "1s", value_parser = parse_duration)]
    pub watch_interval: Duration,
    /// Policy guest component (qwasi:inference/policy) instead of the bundled
    /// API-key policy.
    #[arg(long, value_name = "FILE")]
    pub policy: Option<PathBuf>,
    /// Extra KEY=VALUE settings for the policy guest (repeatable).
    #[arg(long, value_name = "KEY=VALUE")]
    pub policy_setting: Vec<String>,
    #[command(flatten)]
    pub limits: LimitArgs,
    /// WebAssembly execution time allowed per request (0 = unlimited).
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub guest_cpu_limit: Duration,
    /// Directory for compiled guests (default: ~/.cache/qwasi/components).
    #[arg(long, value_name = "DIR")]
    pub compile_cache: Option<PathBuf>,
    /// Compile the guests at every start instead of caching them.
    #[arg(long)]
    pub no_compile_cache: bool,
    /// How long a graceful shutdown waits for running and queued requests.
    #[arg(long, default_value = "120s", value_parser = parse_duration)]
    pub drain_timeout: Duration,
    /// Compute backend.
    #[arg(long, default_value = "cpu")]
    pub backend: String,
    #[command(flatten)]
    pub precision: super::PrecisionArgs,
    /// CPU threads for the cpu backend (default: all cores).
    #[arg(long)]
    pub threads: Option<usize>,
    /// Record this server in DIR (for `qwasi status` / `qwasi stop`).
    #[arg(long, value_name = "DIR")]
    pub state_dir: Option<PathBuf>,
    /// Prefix-cache budget in MiB (0 = off): host memory on the cpu backend
    /// (default 1024), device memory on cuda/hip (default: a quarter of what
    /// the weights and the work reserve leave free), where a snapshot is a full copy of the KV
    /// prefix (~40 KiB per token of the 35B-A3B model with the f32 KV cache).
    #[arg(long)]
    pub prefix_cache_mib: Option<usize>,
    /// Host-memory tier of the prefix cache on cuda/hip, in MiB (0 = none):
    /// snapshots the device budget pushes out are copied to host memory and
    /// resumed from there instead of being dropped (no effect on cpu).
    #[arg(long, default_value_t = 0)]
    pub prefix_cache_host_mib: usize,
    /// Snapshot every N prompt tokens during long prefills (0 = only at
    /// prompt ends, message boundaries and generation ends).
    #[arg(long, default_value_t = qwasi_engine::service::DEFAULT_SNAPSHOT_INTERVAL)]
    pub snapshot_interval: usize,
    /// Requests that run at once: every engine step decodes all of them
    /// (default: the backend's, 16 on cpu, at least 64 on cuda/hip).
    #[arg(long, default_value_t = 0, hide_default_value = true)]
    pub max_num_seqs: usize,
    /// Tokens one engine step may run: every running request's decode token,
    /// then chunks of the prompts being read (at least --max-num-seqs).
    #[arg(long, default_value_t = qwasi_engine::service::DEFAULT_MAX_NUM_BATCHED_TOKENS)]
    pub max_num_batched_tokens: usize,
    /// Prompt tokens one engine step may read while other requests are
    /// generating: lower keeps their inter-token latency down while a long
    /// prompt is read, at the cost of that prompt's time to first token
    /// (0 = up to --max-num-batched-tokens).
    #[arg(long, default_value_t = 0)]
    pub prefill_while_decoding: usize,
    /// Prompt tokens one engine step may read of a prompt longer than
    /// --max-num-batched-tokens while other requests are generating, so
    /// their streams keep flowing while it is read (shorter prompts are not
    /// cut; 0 = no limit).
    #[arg(long, default_value_t = 0)]
    pub long_prompt_chunk: usize,
    /// Memory the running requests' states (KV cache, recurrent state) may
    /// hold together, in MiB (0 = the backend's: on cuda/hip three quarters
    /// of the device memory the weights leave free past a work reserve; not
    /// limited on cpu). Requests are admitted by it and the newest is
    /// preempted (and resumed later) when running ones outgrow it. It
    /// replaces the backend's budget: above it, a long prompt's pass may
    /// run out of device memory.
    #[arg(long, default_value_t = 0)]
    pub kv_cache_mib: usize,
    /// Testing: force the model's output to the turns of a JSON file, one per request.
    #[arg(long, value_name = "FILE", hide = true)]
    pub scripted_turns: Option<PathBuf>,
}

pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let (num, unit) = match s.find(|c: char| !(c.is_ascii_digit() || c == '.')) {
        Some(i) => (&s[..i], s[i..].trim()),
        None => (s, "s"),
    };
    let v: f64 = num
        .parse()
        .map_err(|_| format!("invalid duration {s:?} (e.g. 30s, 500ms, 2m)"))?;
    let secs = match unit {
        "ms" => v / 1e3,
        "s" | "sec" => v,
        "m" | "min" => v * 60.0,
        "h" => v * 3600.0,
        _ => {
            return Err(format!(
                "invalid duration unit in {s:?} (use ms, s, m or h)"
            ));
        }
    };
    if !secs.is_finite() || secs < 0.0 {
        return Err(format!("invalid duration {s:?}"));
    }
    Ok(Duration::from_secs_f64(secs))
}

pub fn parse_size(s: &str) -> Result<usize, String> {
    let s = s.trim();
    let i = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let v: usize = s[..i]
        .parse()
        .map_err(|_| format!("invalid size {s:?} (e.g. 64MiB)"))?;
    let mult = match s[i..].trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kib" | "kb" => 1 << 10,
        "m" | "mib" | "mb" => 1 << 20,
        "g" | "gib" | "gb" => 1 << 30,
        u => return Err(format!("invalid size unit {u:?} (use KiB, MiB or GiB)")),
    };
    v.checked_mul(mult)
        .ok_or_else(|| format!("size {s:?} is too large"))
}

fn is_loopback(host: &str) -> bool {
    host == "localhost" || host.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

#[cfg(feature = "cuda")]
const AVAILABLE_BACKENDS: &str = "cpu, cuda";
#[cfg(all(feature = "hip", not(feature = "cuda")))]
const AVAILABLE_BACKENDS: &str = "cpu, hip";
#[cfg(not(any(feature = "cuda", feature = "hip")))]
const AVAILABLE_BACKENDS: &str = "cpu";

/// Checks that need no model: refuse an unauthenticated public bind, an
/// unknown backend.
pub fn preflight(a: &Args) -> Result<()> {
    crate::server::keys::validate(&a.api_key).map_err(|e| anyhow::anyhow!("{e}"))?;
    let keys: Vec<&String> = a.api_key.iter().filter(|k| !k.is_empty()).collect();
    if !is_loopback(&a.host) && keys.is_empty() && !a.allow_unauthenticated && a.policy.is_none() {
        bail!(
            "refusing to listen on {} without an API key: anyone who can reach this address could use the server. \
             Pass --api-key KEY (or set QWASI_API_KEY), or --allow-unauthenticated if that is really intended",
            a.host
        );
    }
    check_backend(&a.backend)?;
    a.precision.apply(&a.backend)?;
    a.limits.check()?;
    if a.threads == Some(0) {
        bail!("--threads must be at least 1");
    }
    for s in &a.policy_setting {
        if !s.contains('=') {
            bail!("--policy-setting {s:?} is not KEY=VALUE");
        }
    }
    // Fail before loading the model when a guest file can't be read.
    let files = mounts(a)?
        .into_iter()
        .filter_map(|m| m.source.file().map(|f| ("API guest", f.to_path_buf())))
        .chain(a.policy.iter().map(|p| ("policy guest", p.clone())));
    for (what, file) in files {
        std::fs::File::open(&file)
            .with_context(|| format!("cannot read the {what} {}", file.display()))?;
    }
    Ok(())
}

/// Refuses a backend this build can't run.
pub fn check_backend(backend: &str) -> Result<()> {
    match backend {
        "cpu" => Ok(()),
        "cuda" if cfg!(feature = "cuda") => Ok(()),
        "hip" if cfg!(all(feature = "hip", not(feature = "cuda"))) => Ok(()),
        "cuda" | "hip" => bail!(
            "backend {backend:?} is not available in this build (available: {AVAILABLE_BACKENDS}; build with `--features cuda` for cuda, `--features hip` (without cuda) for hip)"
        ),
        other => bail!("unknown backend {other:?} (available: {AVAILABLE_BACKENDS})"),
    }
}

/// Parses one `--guest` value: `PREFIX=FILE`, or `FILE` (mounted at `/`).
pub fn parse_guest(value: &str) -> Result<(String, PathBuf)> {
    if let Some((prefix, file)) = value.split_once('=')
        && prefix.starts_with('/')
        && !Path::new(value).exists()
    {
        if file.is_empty() {
            bail!("--guest {value:?}: no file after {prefix}=");
        }
        let prefix = runtime::normalize_prefix(prefix)
            .map_err(|e| anyhow::anyhow!("--guest {value:?}: {e}"))?;
        return Ok((prefix, PathBuf::from(file)));
    }
    if value.is_empty() {
        bail!("--guest needs a FILE or PREFIX=FILE");
    }
    Ok(("/".into(), PathBuf::from(value)))
}

/// Where the bundled Anthropic Messages guest is mounted.
pub const ANTHROPIC_PREFIX: &str = "/v1/messages";

/// The API guests to mount: every `--guest`, plus the bundled OpenAI guest at
/// `/` and the bundled Anthropic guest at `/v1/messages`, each unless a
/// guest is mounted there or `--no-default-guest`.
pub fn mounts(a: &Args) -> Result<Vec<Mount>> {
    let mut mounts: Vec<Mount> = Vec::new();
    for g in &a.guest {
        let (prefix, file) = parse_guest(g)?;
        if let Some(m) = mounts.iter().find(|m| m.prefix == prefix) {
            bail!(
                "two API guests are mounted at {prefix} ({} and {})",
                m.source.describe(),
                file.display()
            );
        }
        mounts.push(Mount {
            prefix,
            source: GuestSource::File(file),
        });
    }
    if !a.no_default_guest && !mounts.iter().any(|m| m.prefix == "/") {
        match runtime::bundled::OPENAI {
            Some(bytes) => mounts.push(Mount {
                prefix: "/".into(),
                source: GuestSource::Bundled("OpenAI guest", bytes),
            }),
            None if mounts.is_empty() => {
                bail!("this build has no bundled OpenAI guest; pass --guest FILE")
            }
            None => {}
        }
    }
    if !a.no_default_guest
        && !mounts.iter().any(|m| m.prefix == ANTHROPIC_PREFIX)
        && let Some(bytes) = runtime::bundled::ANTHROPIC
    {
        mounts.push(Mount {
            prefix: ANTHROPIC_PREFIX.into(),
            source: GuestSource::Bundled("Anthropic guest", bytes),
        });
    }
    if mounts.is_empty() {
        bail!("no API guest to serve: --no-default-guest needs at least one --guest PREFIX=FILE");
    }
    Ok(mounts)
}

pub fn run(a: Args) -> Result<()> {
    preflight(&a)?;
    if let Some(n) = a.threads {
        rayon::ThreadPoolBuilder::new()
            .num_threads(n)
            .build_global()
            .context("cannot configure the CPU thread pool")?;
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("qwasi-http")
        .build()
        .context("cannot start the async runtime")?;
    rt.block_on(serve(a))
}

async fn serve(a: Args) -> Result<()> {
    let addr_text = format!("{}:{}", a.host, a.port);
    let listener = tokio::net::TcpListener::bind(&addr_text)
        .await
        .with_context(|| format!("cannot listen on {addr_text}"))?;
    let local: SocketAddr = listener.local_addr()?;
    let model_label = match (&a.model.model, &a.synthetic) {
        (Some(d), _) => d.display().to_string(),
        (None, Some(preset)) => format!("synthetic {preset}"),
        (None, None) => qwasi_engine::demo::DEMO_MODEL_ID.to_string(),
    };
    let limits = a.limits.server_limits()?;
    let state = AppState::new(
        ServerConfig {
            limits,
            request_timeout: a.request_timeout,
            admin_keys: a
                .api_key
                .iter()
                .filter(|k| !k.is_empty())
                .cloned()
                .collect(),
            loopback: is_loopback(&a.host),
        },
        model_label,
    );
    let state_file = match &a.state_dir {
        Some(dir) => {
            let sf = StateFile::new(dir, &a.host, local.port());
            sf.write(&state::Record {
                pid: std::process::id(),
                host: a.host.clone(),
                port: local.port(),
                url: format!("http://{}", state::connect_addr(&a.host, local.port())),
                started_at: SystemTime::now()
                    .duration_since(UNIX_EPOCH)
                    .unwrap_or_default()
                    .as_secs(),
                log_file: sf.log_path().display().to_string(),
                model: a.model.model.as_ref().map(|m| m.display().to_string()),
            })?;
            Some(sf)
        }
        None => None,
    };

    // Serve /health and /ready (503 "loading") while the model loads.
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(server::serve(listener, state.clone(), async move {
        let _ = stop_rx.await;
    }));
    let mut signals = StopRequests::new(state_file.as_ref().map(StateFile::stop_path))?;
    #[cfg(unix)]
    spawn_sighup_reloader(state.clone())?;

    eprintln!("qwasi: loading {} ...", state.model_label);
    let load = {
        let a = a.clone();
        tokio::task::spawn_blocking(move || load(&a))
    };
    let loaded = tokio::select! {
        r = load => r.context("model loading panicked")?,
        _ = signals.recv() => {
            eprintln!("qwasi: interrupted while loading");
            if let Some(sf) = &state_file { sf.remove(); }
            return Ok(());
        }
    };
    let (runtime, banner) = match loaded {
        Ok(x) => x,
        Err(e) => {
            state.set_failed();
            if let Some(sf) = &state_file {
                sf.remove();
            }
            return Err(e);
        }
    };
    let runtime = Arc::new(runtime);
    state.set_ready(runtime.clone());
    if !a.watch_interval.is_zero() {
        spawn_watcher(&runtime, a.watch_interval);
    }
    println!("{banner}");
    println!("qwasi: listening on http://{local}");
    use std::io::Write;
    let _ = std::io::stdout().flush();

    // Run until SIGINT/SIGTERM, then drain.
    signals.recv().await;
    eprintln!(
        "qwasi: shutting down: refusing new requests, finishing {} in flight (up to {:.0} s)",
        state.in_flight(),
        a.drain_timeout.as_secs_f64()
    );
    state.begin_drain();
    let t0 = std::time::Instant::now();
    let outcome = tokio::select! {
        _ = state.drained() => StopOutcome::Drained,
        _ = tokio::time::sleep(a.drain_timeout) => StopOutcome::DrainTimeout,
        _ = signals.recv() => StopOutcome::SecondSignal,
    };
    let cut = state.in_flight();
    if outcome != StopOutcome::Drained {
        eprintln!(
            "qwasi: {}: cancelling the {cut} request(s) still in flight",
            outcome.describe()
        );
        // Each stream still ends with its final chunk and [DONE].
        runtime.shared.hard_stop.fire();
        tokio::select! {
            _ = state.requests_done() => {}
            _ = tokio::time::sleep(HARD_STOP_GRACE) => {}
            _ = signals.recv() => {}
        }
    } else {
        eprintln!("qwasi: drained; exiting");
    }
    // Let the connections flush what the last responses wrote.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let _ = stop_tx.send(());
    let _ = tokio::time::timeout(Duration::from_secs(1), server).await;
    if let Some(sf) = &state_file {
        sf.write_stop_report(&state::StopReport {
            pid: std::process::id(),
            outcome: outcome.name().into(),
            drained: outcome == StopOutcome::Drained,
            cut_requests: if outcome == StopOutcome::Drained {
                0
            } else {
                cut
            },
            stop_s: t0.elapsed().as_secs_f64(),
        });
        sf.remove();
    }
    match outcome {
        StopOutcome::Drained => Ok(()),
        _ => bail!(
            "stopped without draining ({}): {cut} request(s) in flight were cancelled",
            outcome.describe()
        ),
    }
}

/// How long a hard stop waits for the cancelled streams to end.
const HARD_STOP_GRACE: Duration = Duration::from_secs(5);

/// How a graceful stop ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum StopOutcome {
    Drained,
    DrainTimeout,
    SecondSignal,
}

impl StopOutcome {
    fn name(self) -> &'static str {
        match self {
            StopOutcome::Drained => "drained",
            StopOutcome::DrainTimeout => "drain_timeout",
            StopOutcome::SecondSignal => "second_signal",
        }
    }

    fn describe(self) -> &'static str {
        match self {
            StopOutcome::Drained => "drained",
            StopOutcome::DrainTimeout => "the drain timeout (--drain-timeout) ran out",
            StopOutcome::SecondSignal => "a second stop signal arrived",
        }
    }
}

/// Loads the model, starts the engine and compiles the guests (blocking).
fn load(a: &Args) -> Result<(Runtime, String)> {
    let service_config = ServiceConfig {
        max_queue: a.max_queue,
        queue_timeout: a.queue_timeout,
        max_model_len: a.max_model_len,
        max_prompt_tokens: a.max_prompt_tokens,
        max_completion_tokens: a.max_completion_tokens,
        prefix_cache_bytes: a.prefix_cache_mib.unwrap_or(CPU_PREFIX_CACHE_MIB) << 20,
        prefix_cache_host_bytes: a.prefix_cache_host_mib << 20,
        snapshot_interval: a.snapshot_interval,
        max_num_seqs: a.max_num_seqs,
        max_num_batched_tokens: a.max_num_batched_tokens,
        prefill_while_decoding: a.prefill_while_decoding,
        long_prompt_chunk: a.long_prompt_chunk,
        kv_cache_bytes: a.kv_cache_mib << 20,
    };
    let StartedEngine {
        shared,
        id,
        is_demo,
        load_s,
    } = start_engine(
        match &a.synthetic {
            Some(preset) => ModelSource::Synthetic {
                preset,
                layers: a.layers,
            },
            None => ModelSource::Dir(a.model.model.as_deref()),
        },
        &a.backend,
        service_config,
        a.prefix_cache_mib.is_none(),
        a.scripted_turns.as_deref(),
        &a.serving,
    )?;

    let t1 = std::time::Instant::now();
    let mounts = mounts(a)?;
    let keys: Vec<String> = a
        .api_key
        .iter()
        .filter(|k| !k.is_empty())
        .cloned()
        .collect();
    let policy = match &a.policy {
        Some(p) => Some(GuestSource::File(p.clone())),
        None if !keys.is_empty() || !a.policy_setting.is_empty() => Some(GuestSource::Bundled(
            "policy guest",
            runtime::bundled::POLICY
                .context("this build has no bundled policy guest, which --api-key and --policy-setting need; pass --policy FILE")?,
        )),
        None => None,
    };
    let mut policy_settings: Vec<(String, String)> = keys
        .iter()
        .map(|k| ("api-key".to_string(), k.clone()))
        .collect();
    for s in &a.policy_setting {
        let (k, v) = s.split_once('=').expect("checked in preflight");
        policy_settings.push((k.to_string(), v.to_string()));
    }
    let cfg = RuntimeConfig {
        memory_limit: a.limits.guest_memory(),
        guest_cpu_limit: a.guest_cpu_limit,
        cache_dir: if a.no_compile_cache {
            None
        } else {
            a.compile_cache.clone().or_else(runtime::default_cache_dir)
        },
        policy_settings,
        guest_stderr: true,
        // One API and one policy instance per connection at most.
        instance_slots: u32::try_from(a.limits.connections()?).unwrap_or(u32::MAX),
    };
    let mount_list = mounts
        .iter()
        .map(|m| format!("{} = {}", m.prefix, m.source.describe()))
        .collect::<Vec<_>>()
        .join(", ");
    let runtime = Runtime::new(cfg, shared, mounts, policy)?;
    let guests_s = t1.elapsed().as_secs_f64();

    let mut banner = format!("qwasi {}: serving model {id}", env!("CARGO_PKG_VERSION"));
    if is_demo {
        banner.push_str(" (demo model: text is meaningless)");
    }
    banner.push_str(&format!(
        "\nqwasi: backend {}, model loaded in {load_s:.1} s, guests ready in {guests_s:.2} s; API guests: {mount_list}; policy: {}",
        a.backend,
        match (&a.policy, keys.is_empty()) {
            (Some(p), _) => p.display().to_string(),
            (None, false) => format!("bundled (API key required, {} key(s))", keys.len()),
            (None, true) if !a.policy_setting.is_empty() => {
                "bundled (no API key: unauthenticated, settings applied)".into()
            }
            (None, true) => "none (no API key: unauthenticated)".into(),
        }
    ));
    let l = &a.limits;
    banner.push_str(&format!(
        "\nqwasi: limits: {} connections; bodies up to {} within {:.0} s, {} pending ({} per client); guest memory {}",
        l.connections()?,
        server::human_size(l.max_body_size),
        l.body_timeout.as_secs_f64(),
        l.max_pending_bodies,
        l.max_pending_bodies_per_client,
        server::human_size(l.guest_memory()),
    ));
    Ok((runtime, banner))
}

/// Polls the guest files every `interval` and reloads the ones that changed.
fn spawn_watcher(runtime: &Arc<Runtime>, interval: Duration) {
    let weak = Arc::downgrade(runtime);
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(interval).await;
            let Some(rt) = weak.upgrade() else { break };
            let _ = tokio::task::spawn_blocking(move || rt.poll_files()).await;
        }
    });
}

/// SIGHUP reloads every file-backed guest (the default action, exiting, is
/// replaced from the start, so a SIGHUP while loading is just ignored).
/// Unix only; `--watch-interval` reloads changed files everywhere.
#[cfg(unix)]
fn spawn_sighup_reloader(state: Arc<AppState>) -> Result<()> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut hup = signal(SignalKind::hangup())?;
    tokio::spawn(async move {
        while hup.recv().await.is_some() {
            match state.runtime().cloned() {
                Some(rt) => {
                    eprintln!("qwasi: SIGHUP: reloading the guests");
                    let _ = tokio::task::spawn_blocking(move || rt.reload_all("SIGHUP")).await;
                }
                None => eprintln!("qwasi: SIGHUP ignored: still loading"),
            }
        }
    });
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_and_sizes() {
        assert_eq!(parse_duration("30s").unwrap(), Duration::from_secs(30));
        assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_duration("2m").unwrap(), Duration::from_secs(120));
        assert_eq!(parse_duration("7").unwrap(), Duration::from_secs(7));
        assert!(parse_duration("x").is_err());
        assert_eq!(parse_size("64MiB").unwrap(), 64 << 20);
        assert_eq!(parse_size("1g").unwrap(), 1 << 30);
        assert!(parse_size("12 parsecs").is_err());
    }

    #[test]
    fn guest_flags() {
        assert_eq!(
            parse_guest("/v1=a.wasm").unwrap(),
            ("/v1".to_string(), PathBuf::from("a.wasm"))
        );
        assert_eq!(
            parse_guest("/api/=dir/o=k.wasm").unwrap(),
            ("/api".to_string(), PathBuf::from("dir/o=k.wasm"))
        );
        assert_eq!(
            parse_guest("guest.wasm").unwrap(),
            ("/".to_string(), PathBuf::from("guest.wasm"))
        );
        // Not a prefix: the whole value is the file.
        assert_eq!(
            parse_guest("a=b.wasm").unwrap(),
            ("/".to_string(), PathBuf::from("a=b.wasm"))
        );
        assert!(parse_guest("/v1=").is_err());
        assert!(parse_guest("").is_err());
    }

    #[test]
    fn loopback() {
        assert!(is_loopback("127.0.0.1"));
        assert!(is_loopback("::1"));
        assert!(is_loopback("localhost"));
        assert!(!is_loopback("0.0.0.0"));
        assert!(!is_loopback("10.1.2.3"));
    }
}
