//! `qwasi run COMPONENT [-- ARGS...]`: runs a component of the
//! `qwasi:inference/command` world on the engine (the same model loading and
//! engine service as `serve`), with stdin/stdout/stderr inherited; its exit
//! code becomes qwasi's.

use super::ModelArgs;
use super::engine::{self, StartedEngine};
use super::serve::{check_backend, parse_duration, parse_size};
use crate::runtime::command::{self, CommandOptions};
use crate::runtime::{self, RuntimeConfig};
use anyhow::{Context, Result, bail};
use qwasi_engine::service::ServiceConfig;
use std::path::PathBuf;
use std::time::Duration;

#[derive(clap::Args, Clone, Debug)]
pub struct Args {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Compute backend: cpu, or cuda (builds with `--features cuda`) or hip
    /// (builds with `--features hip`).
    #[arg(long, default_value = "cpu")]
    pub backend: String,
    #[command(flatten)]
    pub precision: super::PrecisionArgs,
    /// CPU threads for the cpu backend (default: all cores).
    #[arg(long)]
    pub threads: Option<usize>,
    /// Linear-memory cap of the component (e.g. 256MiB, 1GiB).
    #[arg(long, default_value = "1GiB", value_parser = parse_size)]
    pub guest_memory: usize,
    /// WebAssembly execution time allowed (0 = unlimited; time spent waiting
    /// for the engine does not count).
    #[arg(long, default_value = "0", value_parser = parse_duration)]
    pub cpu_limit: Duration,
    /// Grant a host directory: HOST::GUEST (read-write) or HOST::GUEST:ro.
    /// Repeatable; nothing of the filesystem is visible otherwise.
    #[arg(long, value_name = "HOST::GUEST[:ro]")]
    pub dir: Vec<String>,
    /// Set an environment variable for the component (repeatable); none is
    /// passed otherwise.
    #[arg(long, value_name = "KEY=VALUE")]
    pub env: Vec<String>,
    /// Longest prompt + completion (0 = the model's context length).
    #[arg(long, default_value_t = 0)]
    pub max_model_len: usize,
    /// Prefix-cache budget in MiB (0 = off; default as `qwasi serve`: 1024
    /// on the cpu backend, a quarter of the free device memory on cuda/hip).
    #[arg(long)]
    pub prefix_cache_mib: Option<usize>,
    /// Host-memory tier of the prefix cache on cuda/hip, in MiB (0 = none; as `qwasi serve`).
    #[arg(long, default_value_t = 0)]
    pub prefix_cache_host_mib: usize,
    /// Directory for compiled components (default: ~/.cache/qwasi/components).
    #[arg(long, value_name = "DIR")]
    pub compile_cache: Option<PathBuf>,
    /// Compile the component at every run instead of caching it.
    #[arg(long)]
    pub no_compile_cache: bool,
    /// The command component (.wasm).
    #[arg(value_name = "COMPONENT")]
    pub component: PathBuf,
    /// Arguments for the component (after `--`).
    #[arg(
        value_name = "ARGS",
        trailing_var_arg = true,
        allow_hyphen_values = true
    )]
    pub args: Vec<String>,
}

/// `HOST::GUEST[:ro]`.
fn parse_dir(s: &str) -> Result<(PathBuf, String, bool)> {
    let Some((host, guest)) = s.split_once("::") else {
        bail!("--dir {s:?} is not HOST::GUEST (e.g. --dir ./data::/data)");
    };
    let (guest, ro) = match guest.strip_suffix(":ro") {
        Some(g) => (g, true),
        None => (guest, false),
    };
    if host.is_empty() || guest.is_empty() {
        bail!("--dir {s:?} is not HOST::GUEST (e.g. --dir ./data::/data)");
    }
    Ok((PathBuf::from(host), guest.to_string(), ro))
}

pub fn run(a: Args) -> Result<i32> {
    check_backend(&a.backend)?;
    a.precision.apply(&a.backend)?;
    if a.threads == Some(0) {
        bail!("--threads must be at least 1");
    }
    let dirs = a
        .dir
        .iter()
        .map(|d| parse_dir(d))
        .collect::<Result<Vec<_>>>()?;
    for (host, _, _) in &dirs {
        if !host.is_dir() {
            bail!("--dir: {} is not a directory", host.display());
        }
    }
    let mut env = Vec::new();
    for e in &a.env {
        match e.split_once('=') {
            Some((k, v)) if !k.is_empty() => env.push((k.to_string(), v.to_string())),
            _ => bail!("--env {e:?} is not KEY=VALUE"),
        }
    }
    let wasm = std::fs::read(&a.component)
        .with_context(|| format!("cannot read the component {}", a.component.display()))?;
    if let Some(n) = a.threads {
        rayon::ThreadPoolBuilder::new()
            .num_threads(n)
            .build_global()
            .context("cannot configure the CPU thread pool")?;
    }
    let cfg = RuntimeConfig {
        memory_limit: a.guest_memory,
        guest_cpu_limit: a.cpu_limit,
        cache_dir: if a.no_compile_cache {
            None
        } else {
            a.compile_cache.clone().or_else(runtime::default_cache_dir)
        },
        policy_settings: Vec::new(),
        guest_stderr: true,
        // One command instance.
        instance_slots: 1,
    };
    // Validate the component before loading the model.
    let prepared = command::prepare(&cfg, &a.component, &wasm)?;
    let service_config = ServiceConfig {
        max_queue: 64,
        // A command's requests wait as long as they need to.
        queue_timeout: Duration::ZERO,
        max_model_len: a.max_model_len,
        prefix_cache_bytes: a.prefix_cache_mib.unwrap_or(engine::CPU_PREFIX_CACHE_MIB) << 20,
        prefix_cache_host_bytes: a.prefix_cache_host_mib << 20,
        ..ServiceConfig::default()
    };
    let StartedEngine {
        shared, is_demo, ..
    } = engine::start_engine(
        engine::ModelSource::Dir(a.model.model.as_deref()),
        &a.backend,
        service_config,
        a.prefix_cache_mib.is_none(),
        None,
        &Default::default(),
    )?;
    if is_demo {
        eprintln!("note: using the embedded demo model (random weights: its text is meaningless)");
    }
    let program = a
        .component
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "command".into());
    let mut args = vec![program];
    args.extend(a.args.iter().cloned());
    let opts = CommandOptions {
        args,
        env,
        dirs,
        cpu_limit: a.cpu_limit,
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("qwasi-run")
        .build()
        .context("cannot start the async runtime")?;
    let code = rt.block_on(command::run(&cfg, prepared, shared, opts))?;
    // Don't wait for stdin readers blocked in the background.
    rt.shutdown_timeout(Duration::from_millis(100));
    Ok(code)
}

#[cfg(test)]
mod tests {
    use super::parse_dir;

    #[test]
    fn dirs() {
        let (h, g, ro) = parse_dir("./data::/data").unwrap();
        assert_eq!(
            (h.to_str().unwrap(), g.as_str(), ro),
            ("./data", "/data", false)
        );
        let (_, g, ro) = parse_dir("/x::/y:ro").unwrap();
        assert_eq!((g.as_str(), ro), ("/y", true));
        assert!(parse_dir("/x:/y").is_err());
        assert!(parse_dir("::/y").is_err());
    }
}
