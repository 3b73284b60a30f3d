//! `qwasi run`: one component of the `qwasi:inference/command` world
//! (`wasi:cli/command` plus the tokenizer and inference imports) run to
//! completion with the process's stdin/stdout/stderr, on the same engine
//! service the server uses.
//!
//! Nothing else is granted unless asked: no environment variables, no
//! preopened directories, no sockets or name lookup.

use super::host::HostState;
use super::{RuntimeConfig, Shared, add_qwasi_to_linker, load_component, new_host_store, one_line};
use anyhow::{Result, anyhow};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use wasmtime::component::Linker;
use wasmtime_wasi::p2::bindings::CommandPre;
use wasmtime_wasi::{FsPerms, I32Exit, WasiCtxBuilder};

/// What the command may see besides stdio.
#[derive(Clone, Debug, Default)]
pub struct CommandOptions {
    /// `argv`, its first element the program name.
    pub args: Vec<String>,
    pub env: Vec<(String, String)>,
    /// (host directory, guest path, read-only).
    pub dirs: Vec<(PathBuf, String, bool)>,
    /// WebAssembly execution time allowed (zero: unlimited).
    pub cpu_limit: Duration,
}

/// A compiled command, validated against the host's imports.
pub struct Prepared {
    engine: wasmtime::Engine,
    pre: CommandPre<HostState>,
    name: String,
}

/// Compiles and validates `wasm` (read from `file`) as a command: a
/// component exporting `wasi:cli/run` that imports only WASI and
/// `qwasi:inference`. Errors are one line naming the file.
pub fn prepare(cfg: &RuntimeConfig, file: &Path, wasm: &[u8]) -> Result<Prepared> {
    let engine = super::new_engine(cfg)?;
    let mut linker: Linker<HostState> = Linker::new(&engine);
    wasmtime_wasi::p2::add_to_linker_async(&mut linker).map_err(anyhow::Error::from)?;
    add_qwasi_to_linker(&mut linker)?;

    let name = file.display().to_string();
    let component = load_component(&engine, wasm, cfg.cache_dir.as_deref()).map_err(|e| {
        anyhow!(
            "{name} is not a valid WebAssembly component: {}",
            one_line(&e)
        )
    })?;
    let not_a_command = || {
        anyhow!(
            "{name} is not a command component: it does not export wasi:cli/run (build it for \
             the qwasi:inference/command world; API guests run under `qwasi serve --guest`)"
        )
    };
    let exports_run = component
        .component_type()
        .exports(&engine)
        .any(|(n, _)| n.starts_with("wasi:cli/run@0.2"));
    if !exports_run {
        return Err(not_a_command());
    }
    let pre = linker.instantiate_pre(&component).map_err(|e| {
        anyhow!(
            "{name} imports something `qwasi run` does not provide (build it for the \
             qwasi:inference/command world): {}",
            one_line(&anyhow::Error::from(e))
        )
    })?;
    let pre = CommandPre::new(pre).map_err(|_| not_a_command())?;
    Ok(Prepared { engine, pre, name })
}

/// Runs a prepared command and returns its exit status (`wasi:cli/exit`
/// code, 1 for `run` returning an error). Traps are errors.
pub async fn run(
    cfg: &RuntimeConfig,
    prepared: Prepared,
    shared: Arc<Shared>,
    opts: CommandOptions,
) -> Result<i32> {
    let Prepared { engine, pre, name } = prepared;
    super::spawn_epoch_ticker(&engine);
    let mut b = WasiCtxBuilder::new();
    b.inherit_stdio()
        .args(&opts.args)
        .envs(&opts.env)
        .allow_tcp(false)
        .allow_udp(false)
        .allow_ip_name_lookup(false)
        .socket_addr_check(|_, _| Box::pin(async { false }));
    for (host, guest, read_only) in &opts.dirs {
        let perms = if *read_only {
            FsPerms::ReadOnly
        } else {
            FsPerms::ReadWrite
        };
        b.preopened_dir(host, guest, perms).map_err(|e| {
            anyhow!(
                "cannot open the directory {} for --dir: {}",
                host.display(),
                one_line(&anyhow::Error::from(e))
            )
        })?;
    }
    let limits = super::memory::GuestLimits::new(cfg.memory_limit);
    let mut store = new_host_store(&engine, b.build(), limits, opts.cpu_limit, shared, None);

    let outcome = async {
        let cmd = pre.instantiate_async(&mut store).await?;
        cmd.wasi_cli_run().call_run(&mut store).await
    }
    .await;
    match outcome {
        Ok(Ok(())) => Ok(0),
        Ok(Err(())) => Ok(1),
        Err(e) => match e.downcast_ref::<I32Exit>() {
            Some(exit) => Ok(exit.0),
            None => {
                let e = anyhow::Error::from(e);
                let root = e.root_cause().to_string();
                Err(anyhow!(
                    "{name} failed: {}",
                    root.lines().next().unwrap_or("trap")
                ))
            }
        },
    }
}
