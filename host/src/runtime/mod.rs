//! The wasmtime side of the server: one `Engine` (async, epoch interruption
//! with one ticker thread, pooling allocator, per-instance memory cap), one
//! `Linker` per world built once, the guests pre-instantiated once, and a
//! fresh `Store` + instance per request.

pub mod bindings;
pub mod host;
pub mod limits;
pub mod policy;

use anyhow::{Context, Result};
use bindings::api::qwasi::inference::types::ModelInfo;
use host::{DenyEgress, HostState};
use limits::{CpuMeter, EPOCH_TICK};
use policy::PolicyState;
use qwasi_engine::service::EngineService;
use qwasi_engine::tokenizer::Tokenizer;
use sha2::{Digest, Sha256};
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use wasmtime::component::{Component, HasSelf, Linker, ResourceTable};
use wasmtime::{
    Config, Engine, InstanceAllocationStrategy, PoolingAllocationConfig, Store, StoreLimitsBuilder,
};
use wasmtime_wasi::WasiCtxBuilder;
use wasmtime_wasi_http::WasiHttpCtx;
use wasmtime_wasi_http::p2::bindings::ProxyPre;

/// The guests bundled into the binary by `host/build.rs`.
pub mod bundled {
    include!(concat!(env!("OUT_DIR"), "/guests.rs"));
}

/// Operator settings for the guests.
#[derive(Clone, Debug)]
pub struct RuntimeConfig {
    /// Linear-memory cap per guest instance, in bytes.
    pub memory_limit: usize,
    /// WebAssembly execution time allowed per request (0 = unlimited).
    pub guest_cpu_limit: Duration,
    /// Where compiled components are cached (`None`: don't cache).
    pub cache_dir: Option<PathBuf>,
    /// Settings handed to the policy guest through `policy-config`.
    pub policy_settings: Vec<(String, String)>,
    /// Let guests write to the server's stderr (their logs).
    pub guest_stderr: bool,
}

/// What every request's store shares.
pub struct Shared {
    pub service: EngineService,
    pub tokenizer: Option<Tokenizer>,
    pub model_id: String,
    pub model_info: ModelInfo,
}

pub struct Runtime {
    pub engine: Engine,
    api: ProxyPre<HostState>,
    policy: Option<bindings::policy::PolicyPre<PolicyState>>,
    /// `policy-state` counters, shared by all policy instances.
    policy_counters: Arc<policy::Counters>,
    pub shared: Arc<Shared>,
    cfg: RuntimeConfig,
}

impl Runtime {
    /// Compiles (or loads from the cache) and pre-instantiates the guests.
    pub fn new(
        cfg: RuntimeConfig,
        shared: Arc<Shared>,
        api_wasm: &[u8],
        policy_wasm: Option<&[u8]>,
    ) -> Result<Self> {
        let engine = new_engine(&cfg)?;
        spawn_epoch_ticker(&engine);

        let api_component =
            load_component(&engine, api_wasm, cfg.cache_dir.as_deref(), "API guest")?;
        let mut linker: Linker<HostState> = Linker::new(&engine);
        wasmtime_wasi::p2::add_to_linker_async(&mut linker).map_err(anyhow::Error::from)?;
        wasmtime_wasi_http::p2::add_only_http_to_linker_async(&mut linker)
            .map_err(anyhow::Error::from)?;
        bindings::api::qwasi::inference::types::add_to_linker::<_, HasSelf<_>>(&mut linker, |s| s)
            .map_err(anyhow::Error::from)?;
        bindings::api::qwasi::inference::tokenizer::add_to_linker::<_, HasSelf<_>>(
            &mut linker,
            |s| s,
        )
        .map_err(anyhow::Error::from)?;
        bindings::api::qwasi::inference::inference::add_to_linker::<_, HasSelf<_>>(
            &mut linker,
            |s| s,
        )
        .map_err(anyhow::Error::from)?;
        let pre = linker
            .instantiate_pre(&api_component)
            .map_err(anyhow::Error::from)
            .context("the API guest's imports can't be satisfied (is it built for the qwasi:inference/api world?)")?;
        let api = ProxyPre::new(pre)
            .map_err(anyhow::Error::from)
            .context("the API guest doesn't export wasi:http/incoming-handler")?;

        let policy = match policy_wasm {
            None => None,
            Some(bytes) => {
                let component =
                    load_component(&engine, bytes, cfg.cache_dir.as_deref(), "policy guest")?;
                let mut linker: Linker<PolicyState> = Linker::new(&engine);
                wasmtime_wasi::p2::add_to_linker_async(&mut linker).map_err(anyhow::Error::from)?;
                bindings::policy::qwasi::inference::policy_config::add_to_linker::<_, HasSelf<_>>(
                    &mut linker,
                    |s| s,
                )
                .map_err(anyhow::Error::from)?;
                bindings::policy::qwasi::inference::policy_state::add_to_linker::<_, HasSelf<_>>(
                    &mut linker,
                    |s| s,
                )
                .map_err(anyhow::Error::from)?;
                let pre = linker
                    .instantiate_pre(&component)
                    .map_err(anyhow::Error::from)
                    .context("the policy guest's imports can't be satisfied (is it built for the qwasi:inference/policy world?)")?;
                Some(
                    bindings::policy::PolicyPre::new(pre)
                        .map_err(anyhow::Error::from)
                        .context("the policy guest doesn't export qwasi:inference/admission")?,
                )
            }
        };
        Ok(Runtime {
            engine,
            api,
            policy,
            policy_counters: Arc::default(),
            shared,
            cfg,
        })
    }

    pub fn api_pre(&self) -> &ProxyPre<HostState> {
        &self.api
    }

    pub fn policy_pre(&self) -> Option<&bindings::policy::PolicyPre<PolicyState>> {
        self.policy.as_ref()
    }

    fn wasi_ctx(&self) -> wasmtime_wasi::WasiCtx {
        // Locked down: no preopens, env, args, stdin, sockets or name lookup.
        let mut b = WasiCtxBuilder::new();
        b.allow_tcp(false)
            .allow_udp(false)
            .allow_ip_name_lookup(false)
            .socket_addr_check(|_, _| Box::pin(async { false }));
        if self.cfg.guest_stderr {
            b.inherit_stderr();
        }
        b.build()
    }

    fn limits(&self) -> wasmtime::StoreLimits {
        StoreLimitsBuilder::new()
            .memory_size(self.cfg.memory_limit)
            .trap_on_grow_failure(false)
            .build()
    }

    /// A fresh store for one request to the API guest.
    pub fn api_store(&self, caller: Option<String>) -> Store<HostState> {
        let state = HostState {
            wasi: self.wasi_ctx(),
            http: WasiHttpCtx::new(),
            hooks: DenyEgress,
            table: ResourceTable::new(),
            limits: self.limits(),
            cpu: CpuMeter::new(self.cfg.guest_cpu_limit),
            shared: self.shared.clone(),
            caller,
        };
        let mut store = Store::new(&self.engine, state);
        store.limiter(|s| &mut s.limits);
        limits::install(&mut store, |s: &mut HostState| &mut s.cpu);
        store
    }

    /// A fresh store for one policy check.
    pub fn policy_store(&self) -> Store<PolicyState> {
        let state = PolicyState {
            wasi: self.wasi_ctx(),
            table: ResourceTable::new(),
            limits: self.limits(),
            cpu: CpuMeter::new(self.cfg.guest_cpu_limit),
            settings: self.cfg.policy_settings.clone(),
            counters: self.policy_counters.clone(),
        };
        let mut store = Store::new(&self.engine, state);
        store.limiter(|s| &mut s.limits);
        limits::install(&mut store, |s: &mut PolicyState| &mut s.cpu);
        store
    }
}

fn new_engine(cfg: &RuntimeConfig) -> Result<Engine> {
    let mut config = Config::new();
    config.wasm_component_model(true);
    config.epoch_interruption(true);
    let mut pool = PoolingAllocationConfig::default();
    pool.max_memory_size(cfg.memory_limit);
    config.allocation_strategy(InstanceAllocationStrategy::Pooling(pool));
    Engine::new(&config)
        .map_err(anyhow::Error::from)
        .context("cannot create the wasmtime engine")
}

/// One ticker thread per engine drives epoch interruption.
fn spawn_epoch_ticker(engine: &Engine) {
    let weak = engine.weak();
    std::thread::Builder::new()
        .name("qwasi-epoch".into())
        .spawn(move || {
            loop {
                std::thread::sleep(EPOCH_TICK);
                match weak.upgrade() {
                    Some(e) => e.increment_epoch(),
                    None => break,
                }
            }
        })
        .expect("cannot spawn the epoch ticker thread");
}

/// The default compiled-component cache: `$XDG_CACHE_HOME/qwasi/components`
/// or `~/.cache/qwasi/components`.
pub fn default_cache_dir() -> Option<PathBuf> {
    let base = std::env::var_os("XDG_CACHE_HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
    Some(base.join("qwasi").join("components"))
}

/// Compiles `wasm`, or loads it from `cache_dir` where an earlier run compiled
/// the same bytes with a compatible engine.
pub fn load_component(
    engine: &Engine,
    wasm: &[u8],
    cache_dir: Option<&Path>,
    what: &str,
) -> Result<Component> {
    let compile = || {
        Component::new(engine, wasm)
            .map_err(anyhow::Error::from)
            .with_context(|| format!("cannot compile the {what}"))
    };
    let Some(dir) = cache_dir else {
        return compile();
    };
    let mut h = Sha256::new();
    h.update(wasm);
    let mut eh = std::collections::hash_map::DefaultHasher::new();
    engine.precompile_compatibility_hash().hash(&mut eh);
    env!("CARGO_PKG_VERSION").hash(&mut eh);
    h.update(eh.finish().to_le_bytes());
    let key: String = h
        .finalize()
        .iter()
        .take(16)
        .map(|b| format!("{b:02x}"))
        .collect();
    let path = dir.join(format!("{key}.cwasm"));
    if path.exists() {
        // SAFETY: the cache directory holds only artifacts this program wrote
        // with `Component::serialize` for this engine configuration (the key
        // covers the bytes and the engine's compatibility hash).
        match unsafe { Component::deserialize_file(engine, &path) } {
            Ok(c) => return Ok(c),
            Err(_) => {
                let _ = std::fs::remove_file(&path);
            }
        }
    }
    let component = compile()?;
    if let Ok(bytes) = component.serialize() {
        let _ = std::fs::create_dir_all(dir);
        let tmp = dir.join(format!("{key}.{}.tmp", std::process::id()));
        if std::fs::write(&tmp, bytes).is_ok() {
            let _ = std::fs::rename(&tmp, &path);
        }
    }
    Ok(component)
}
