//! The wasmtime side of the server: one `Engine` (async, epoch interruption
//! with one ticker thread, pooling allocator, per-instance memory cap), one
//! `Linker` per world built once, the guests pre-instantiated once, and a
//! fresh `Store` + instance per request.
//!
//! Each guest lives in a [`Slot`]: an API guest mounted at a path prefix, or
//! the policy. A slot holds an `Arc` of its current pre-instantiated version;
//! a reload compiles and validates the new file first and only then swaps the
//! `Arc`, so requests that already took the old version finish on it. The
//! `command` module runs `qwasi run`'s command components on the same pieces.

pub mod bindings;
pub mod command;
pub mod constraint;
pub mod host;
pub mod limits;
pub mod memory;
pub mod policy;
pub mod pool;
pub mod stop;

use anyhow::{Context, Result, anyhow, bail};
use bindings::api::qwasi::inference::types::ModelInfo;
use host::{DenyEgress, HostState};
use limits::{CpuMeter, EPOCH_TICK};
use memory::GuestLimits;
use policy::PolicyState;
use pool::Slots;
use qwasi_engine::service::EngineService;
use qwasi_engine::tokenizer::Tokenizer;
use sha2::{Digest, Sha256};
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;
use wasmtime::component::{Component, HasSelf, Linker, ResourceTable};
use wasmtime::{Config, Engine, InstanceAllocationStrategy, Store};
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
    /// Guest instances of each kind (API, policy) that may live at once; the
    /// instance pool is sized for all of them (see [`pool`]).
    pub instance_slots: u32,
}

/// What every request's store shares.
pub struct Shared {
    pub service: EngineService,
    pub tokenizer: Option<Tokenizer>,
    pub model_id: String,
    pub model_info: ModelInfo,
    /// Compiles `generate-constrained`'s constraints.
    pub constraints: constraint::Constraints,
    /// `inference.serving-config` (WIT 0.1.3).
    pub serving: bindings::api::qwasi::inference::inference::ServingConfiguration,
    /// Cancels every live generation when the server stops without draining.
    pub hard_stop: stop::HardStop,
}

/// Which world a guest implements.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// `qwasi:inference/api`: exports `wasi:http/incoming-handler`.
    Api,
    /// `qwasi:inference/policy`: exports `qwasi:inference/admission`.
    Policy,
}

impl Kind {
    pub fn what(self) -> &'static str {
        match self {
            Kind::Api => "API guest",
            Kind::Policy => "policy guest",
        }
    }

    fn world(self) -> &'static str {
        match self {
            Kind::Api => "qwasi:inference/api",
            Kind::Policy => "qwasi:inference/policy",
        }
    }

    fn export(self) -> &'static str {
        match self {
            Kind::Api => "wasi:http/incoming-handler",
            Kind::Policy => "qwasi:inference/admission",
        }
    }
}

/// Where a guest's component comes from.
#[derive(Clone, Debug)]
pub enum GuestSource {
    /// Embedded in the binary (name, bytes).
    Bundled(&'static str, &'static [u8]),
    /// A file, watched and reloadable.
    File(PathBuf),
}

impl GuestSource {
    pub fn describe(&self) -> String {
        match self {
            GuestSource::Bundled(name, _) => format!("bundled {name}"),
            GuestSource::File(p) => p.display().to_string(),
        }
    }

    pub fn file(&self) -> Option<&Path> {
        match self {
            GuestSource::File(p) => Some(p),
            GuestSource::Bundled(..) => None,
        }
    }

    fn bytes(&self, kind: Kind) -> Result<Vec<u8>> {
        match self {
            GuestSource::Bundled(_, b) => Ok(b.to_vec()),
            GuestSource::File(p) => std::fs::read(p)
                .with_context(|| format!("cannot read the {} {}", kind.what(), p.display())),
        }
    }
}

/// An API guest mounted at a path prefix.
#[derive(Clone, Debug)]
pub struct Mount {
    /// `/` or `/seg[/seg...]` without a trailing slash.
    pub prefix: String,
    pub source: GuestSource,
}

/// Parses a mount prefix: must start with `/`; a trailing `/` is dropped.
pub fn normalize_prefix(p: &str) -> std::result::Result<String, String> {
    if !p.starts_with('/') {
        return Err(format!("the mount prefix {p:?} must start with /"));
    }
    if p.contains(['?', '#']) || p.chars().any(char::is_whitespace) || p.contains("//") {
        return Err(format!("the mount prefix {p:?} is not a plain URL path"));
    }
    let t = p.trim_end_matches('/');
    Ok(if t.is_empty() { "/".into() } else { t.into() })
}

/// Whether `path` (no query) is under `prefix`, on a segment boundary.
pub fn prefix_matches(prefix: &str, path: &str) -> bool {
    prefix == "/"
        || path
            .strip_prefix(prefix)
            .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
}

/// A compiled, validated, pre-instantiated guest.
pub enum Prepared {
    Api(ProxyPre<HostState>),
    Policy(bindings::policy::PolicyPre<PolicyState>),
}

/// One version of a guest; requests hold it while they run.
pub struct Loaded {
    pub prepared: Prepared,
    /// SHA-256 of the component bytes.
    pub sha256: [u8; 32],
    /// 1 at startup, +1 per successful reload.
    pub version: u64,
}

impl Loaded {
    pub fn api(&self) -> &ProxyPre<HostState> {
        match &self.prepared {
            Prepared::Api(p) => p,
            Prepared::Policy(_) => unreachable!("an API slot holds an API guest"),
        }
    }

    pub fn policy(&self) -> &bindings::policy::PolicyPre<PolicyState> {
        match &self.prepared {
            Prepared::Policy(p) => p,
            Prepared::Api(_) => unreachable!("the policy slot holds a policy guest"),
        }
    }
}

/// A file's identity as the watcher sees it (a rename or rewrite changes it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FileSig {
    len: u64,
    mtime: Option<std::time::SystemTime>,
    ino: u64,
}

pub fn file_sig(p: &Path) -> Option<FileSig> {
    let m = std::fs::metadata(p).ok()?;
    #[cfg(unix)]
    let ino = std::os::unix::fs::MetadataExt::ino(&m);
    // Windows' file index needs an open handle (std's is unstable): a
    // rename over the file is seen through its length and time.
    #[cfg(not(unix))]
    let ino = 0;
    Some(FileSig {
        len: m.len(),
        mtime: m.modified().ok(),
        ino,
    })
}

#[derive(Default)]
struct WatchState {
    /// Seen at the last poll (a change is acted on once it is stable for one poll).
    pending: Option<FileSig>,
    /// What the last load or reload attempt read.
    applied: Option<FileSig>,
}

/// A guest that can be swapped at run time: an API mount or the policy.
pub struct Slot {
    /// The mount prefix, or `policy`.
    pub name: String,
    pub kind: Kind,
    pub source: GuestSource,
    current: RwLock<Arc<Loaded>>,
    watch: Mutex<WatchState>,
    pub reloads_ok: AtomicU64,
    pub reloads_err: AtomicU64,
}

impl Slot {
    /// The version new requests use.
    pub fn current(&self) -> Arc<Loaded> {
        self.current
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    fn swap(&self, new: Arc<Loaded>) {
        *self.current.write().unwrap_or_else(|e| e.into_inner()) = new;
    }

    fn label(&self) -> String {
        match self.kind {
            Kind::Api => format!("API guest {} ({})", self.name, self.source.describe()),
            Kind::Policy => format!("policy guest ({})", self.source.describe()),
        }
    }
}

/// The result of reloading one guest.
#[derive(Clone, Debug, serde::Serialize)]
pub struct ReloadOutcome {
    pub guest: String,
    pub file: String,
    /// `ok`, `unchanged` or `error`.
    pub result: &'static str,
    pub version: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// An error chain on one line.
pub fn one_line(e: &anyhow::Error) -> String {
    format!("{e:#}")
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join(" ")
}

pub struct Runtime {
    pub engine: Engine,
    api_linker: Linker<HostState>,
    policy_linker: Linker<PolicyState>,
    /// API guests, longest prefix first.
    mounts: Vec<Arc<Slot>>,
    policy: Option<Arc<Slot>>,
    /// `policy-state` counters, shared by all policy instances (and versions).
    policy_counters: Arc<policy::Counters>,
    pub shared: Arc<Shared>,
    cfg: RuntimeConfig,
    /// One reload at a time.
    reload_lock: Mutex<()>,
    api_slots: Slots,
    policy_slots: Slots,
}

impl Runtime {
    /// Compiles (or loads from the cache), validates and pre-instantiates the
    /// guests. Errors are one line naming the file.
    pub fn new(
        cfg: RuntimeConfig,
        shared: Arc<Shared>,
        mounts: Vec<Mount>,
        policy: Option<GuestSource>,
    ) -> Result<Self> {
        let engine = new_engine(&cfg)?;
        spawn_epoch_ticker(&engine);

        let mut api_linker: Linker<HostState> = Linker::new(&engine);
        wasmtime_wasi::p2::add_to_linker_async(&mut api_linker).map_err(anyhow::Error::from)?;
        wasmtime_wasi_http::p2::add_only_http_to_linker_async(&mut api_linker)
            .map_err(anyhow::Error::from)?;
        add_qwasi_to_linker(&mut api_linker)?;

        let mut policy_linker: Linker<PolicyState> = Linker::new(&engine);
        wasmtime_wasi::p2::add_to_linker_async(&mut policy_linker).map_err(anyhow::Error::from)?;
        bindings::policy::qwasi::inference::policy_config::add_to_linker::<_, HasSelf<_>>(
            &mut policy_linker,
            |s| s,
        )
        .map_err(anyhow::Error::from)?;
        bindings::policy::qwasi::inference::policy_state::add_to_linker::<_, HasSelf<_>>(
            &mut policy_linker,
            |s| s,
        )
        .map_err(anyhow::Error::from)?;

        let mut rt = Runtime {
            engine,
            api_linker,
            policy_linker,
            mounts: Vec::new(),
            policy: None,
            policy_counters: Arc::default(),
            shared,
            api_slots: Slots::new(cfg.instance_slots),
            policy_slots: Slots::new(cfg.instance_slots),
            cfg,
            reload_lock: Mutex::new(()),
        };
        let mut seen = std::collections::HashSet::new();
        for m in mounts {
            if !seen.insert(m.prefix.clone()) {
                bail!("two API guests are mounted at {}", m.prefix);
            }
            let slot = rt.initial_slot(Kind::Api, m.prefix, m.source)?;
            rt.mounts.push(Arc::new(slot));
        }
        rt.mounts
            .sort_by(|a, b| b.name.len().cmp(&a.name.len()).then(a.name.cmp(&b.name)));
        if let Some(source) = policy {
            rt.policy = Some(Arc::new(rt.initial_slot(
                Kind::Policy,
                "policy".into(),
                source,
            )?));
        }
        Ok(rt)
    }

    fn initial_slot(&self, kind: Kind, name: String, source: GuestSource) -> Result<Slot> {
        let sig = source.file().and_then(file_sig);
        let bytes = source.bytes(kind)?;
        let prepared = self.prepare(kind, &bytes).map_err(|e| {
            let at = match kind {
                Kind::Api => format!(" (mounted at {name})"),
                Kind::Policy => String::new(),
            };
            anyhow!(
                "the {} {}{at} {}",
                kind.what(),
                source.describe(),
                one_line(&e)
            )
        })?;
        Ok(Slot {
            name,
            kind,
            source,
            current: RwLock::new(Arc::new(Loaded {
                prepared,
                sha256: Sha256::digest(&bytes).into(),
                version: 1,
            })),
            watch: Mutex::new(WatchState {
                pending: sig,
                applied: sig,
            }),
            reloads_ok: AtomicU64::new(0),
            reloads_err: AtomicU64::new(0),
        })
    }

    /// Compiles `wasm` and checks it against `kind`'s world: it must be a
    /// component, import only what the host provides, and export the world's
    /// interface. Errors read after "the guest FILE ...".
    pub fn prepare(&self, kind: Kind, wasm: &[u8]) -> Result<Prepared> {
        let component = load_component(&self.engine, wasm, self.cfg.cache_dir.as_deref())
            .map_err(|e| anyhow!("is not a valid WebAssembly component: {}", one_line(&e)))?;
        let world = kind.world();
        let imports_err = |e: wasmtime::Error| {
            anyhow!(
                "imports something the host does not provide (build it for the {world} world): {}",
                one_line(&anyhow::Error::from(e))
            )
        };
        let exports_err = |_| {
            anyhow!(
                "does not export {} (build it for the {world} world)",
                kind.export()
            )
        };
        Ok(match kind {
            Kind::Api => {
                let pre = self
                    .api_linker
                    .instantiate_pre(&component)
                    .map_err(imports_err)?;
                Prepared::Api(ProxyPre::new(pre).map_err(exports_err)?)
            }
            Kind::Policy => {
                let pre = self
                    .policy_linker
                    .instantiate_pre(&component)
                    .map_err(imports_err)?;
                Prepared::Policy(bindings::policy::PolicyPre::new(pre).map_err(exports_err)?)
            }
        })
    }

    /// The API guest for `path` (no query): the longest matching prefix.
    pub fn route(&self, path: &str) -> Option<&Arc<Slot>> {
        self.mounts.iter().find(|m| prefix_matches(&m.name, path))
    }

    pub fn policy(&self) -> Option<&Arc<Slot>> {
        self.policy.as_ref()
    }

    /// Every guest slot: the mounts, then the policy.
    pub fn slots(&self) -> impl Iterator<Item = &Arc<Slot>> {
        self.mounts.iter().chain(self.policy.iter())
    }

    /// Reloads one guest from its file (blocking: compiles). The new version
    /// is validated before the swap; on failure the old one keeps serving.
    pub fn reload(&self, slot: &Slot, trigger: &str) -> ReloadOutcome {
        let _one = self.reload_lock.lock().unwrap_or_else(|e| e.into_inner());
        let file = slot.source.describe();
        let current = slot.current();
        let mut outcome = ReloadOutcome {
            guest: slot.name.clone(),
            file: file.clone(),
            result: "unchanged",
            version: current.version,
            error: None,
        };
        let Some(path) = slot.source.file() else {
            return outcome;
        };
        let t0 = std::time::Instant::now();
        let sig = file_sig(path);
        let attempt = slot.source.bytes(slot.kind).and_then(|bytes| {
            let sha: [u8; 32] = Sha256::digest(&bytes).into();
            if sha == current.sha256 {
                return Ok(None);
            }
            let prepared = self
                .prepare(slot.kind, &bytes)
                .map_err(|e| anyhow!("{file} {}", one_line(&e)))?;
            Ok(Some((prepared, sha)))
        });
        {
            let mut w = slot.watch.lock().unwrap_or_else(|e| e.into_inner());
            w.applied = sig;
            w.pending = sig;
        }
        match attempt {
            Ok(None) => outcome,
            Ok(Some((prepared, sha256))) => {
                let version = current.version + 1;
                slot.swap(Arc::new(Loaded {
                    prepared,
                    sha256,
                    version,
                }));
                slot.reloads_ok.fetch_add(1, Ordering::Relaxed);
                eprintln!(
                    "qwasi: reloaded the {} (version {version}, {trigger}) in {:.2} s",
                    slot.label(),
                    t0.elapsed().as_secs_f64()
                );
                outcome.result = "ok";
                outcome.version = version;
                outcome
            }
            Err(e) => {
                let msg = one_line(&e);
                eprintln!(
                    "qwasi: error: reloading the {} ({trigger}) failed; still serving version {}: {msg}",
                    slot.label(),
                    current.version
                );
                // Counted after the log line, so whoever sees the count
                // finds the reason already logged.
                slot.reloads_err.fetch_add(1, Ordering::Relaxed);
                outcome.result = "error";
                outcome.error = Some(msg);
                outcome
            }
        }
    }

    /// Reloads every file-backed guest (SIGHUP, `POST /admin/reload`).
    pub fn reload_all(&self, trigger: &str) -> Vec<ReloadOutcome> {
        self.slots()
            .filter(|s| s.source.file().is_some())
            .map(|s| self.reload(s, trigger))
            .collect()
    }

    /// One watcher poll: reloads the guests whose file changed and has been
    /// stable since the previous poll.
    pub fn poll_files(&self) -> Vec<ReloadOutcome> {
        let mut out = Vec::new();
        for slot in self.slots() {
            let Some(path) = slot.source.file() else {
                continue;
            };
            let sig = file_sig(path);
            let due = {
                let mut w = slot.watch.lock().unwrap_or_else(|e| e.into_inner());
                if sig != w.pending {
                    w.pending = sig;
                    false
                } else {
                    sig.is_some() && sig != w.applied
                }
            };
            if due {
                out.push(self.reload(slot, "file changed"));
            }
        }
        out
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

    fn limits(&self) -> GuestLimits {
        GuestLimits::new(self.cfg.memory_limit)
    }

    /// Slots of live API-guest instances.
    pub fn api_slots(&self) -> &Slots {
        &self.api_slots
    }

    /// Slots of live policy-guest instances (separate from the API guests',
    /// so that requests holding API instances never starve admission).
    pub fn policy_slots(&self) -> &Slots {
        &self.policy_slots
    }

    /// A fresh store for one request to the API guest.
    pub fn api_store(&self, caller: Option<String>) -> Store<HostState> {
        new_host_store(
            &self.engine,
            self.wasi_ctx(),
            self.limits(),
            self.cfg.guest_cpu_limit,
            self.shared.clone(),
            caller,
        )
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

/// The host's `qwasi:inference` imports (types, tokenizer, inference).
pub fn add_qwasi_to_linker(linker: &mut Linker<HostState>) -> Result<()> {
    bindings::api::qwasi::inference::types::add_to_linker::<_, HasSelf<_>>(linker, |s| s)
        .map_err(anyhow::Error::from)?;
    bindings::api::qwasi::inference::tokenizer::add_to_linker::<_, HasSelf<_>>(linker, |s| s)
        .map_err(anyhow::Error::from)?;
    bindings::api::qwasi::inference::inference::add_to_linker::<_, HasSelf<_>>(linker, |s| s)
        .map_err(anyhow::Error::from)?;
    Ok(())
}

/// A store for an API guest or a command.
pub fn new_host_store(
    engine: &Engine,
    wasi: wasmtime_wasi::WasiCtx,
    limits: GuestLimits,
    cpu_limit: Duration,
    shared: Arc<Shared>,
    caller: Option<String>,
) -> Store<HostState> {
    let state = HostState {
        wasi,
        http: WasiHttpCtx::new(),
        hooks: DenyEgress,
        table: ResourceTable::new(),
        limits,
        cpu: CpuMeter::new(cpu_limit),
        shared,
        caller,
    };
    let mut store = Store::new(engine, state);
    store.limiter(|s| &mut s.limits);
    limits::install(&mut store, |s: &mut HostState| &mut s.cpu);
    store
}

pub fn new_engine(cfg: &RuntimeConfig) -> Result<Engine> {
    let mut config = Config::new();
    config.wasm_component_model(true);
    config.epoch_interruption(true);
    // Proposals no guest needs stay off: less reachable runtime code (GC
    // subtyping and atomics without the gc/threads cargo features aborted
    // the host before 48.0.9: GHSA-rc4p-x33f-vpr2, GHSA-2674-w29h-wqvj).
    config.wasm_features(
        wasmtime::WasmFeatures::GC
            | wasmtime::WasmFeatures::FUNCTION_REFERENCES
            | wasmtime::WasmFeatures::THREADS,
        false,
    );
    let pool = pool::pooling_config(cfg.memory_limit, cfg.instance_slots);
    config.allocation_strategy(InstanceAllocationStrategy::Pooling(pool));
    Engine::new(&config)
        .map_err(anyhow::Error::from)
        .context("cannot create the wasmtime engine")
}

/// One ticker thread per engine drives epoch interruption.
pub fn spawn_epoch_ticker(engine: &Engine) {
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
pub fn load_component(engine: &Engine, wasm: &[u8], cache_dir: Option<&Path>) -> Result<Component> {
    let compile = || Component::new(engine, wasm).map_err(anyhow::Error::from);
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

#[cfg(test)]
mod tests {
    use super::{normalize_prefix, prefix_matches};

    #[test]
    fn prefixes_match_on_segment_boundaries() {
        assert!(prefix_matches("/", "/anything"));
        assert!(prefix_matches("/api", "/api"));
        assert!(prefix_matches("/api", "/api/"));
        assert!(prefix_matches("/api", "/api/x/y"));
        assert!(!prefix_matches("/api", "/apix"));
        assert!(!prefix_matches("/api", "/ap"));
        assert!(!prefix_matches("/api/v1", "/api"));
    }

    #[test]
    fn prefixes_are_normalized() {
        assert_eq!(normalize_prefix("/").unwrap(), "/");
        assert!(
            normalize_prefix("//")
                .unwrap_err()
                .contains("plain URL path")
        );
        assert_eq!(normalize_prefix("/v1/").unwrap(), "/v1");
        assert_eq!(normalize_prefix("/a/b").unwrap(), "/a/b");
        assert!(normalize_prefix("v1").is_err());
        assert!(normalize_prefix("/a?b").is_err());
        assert!(normalize_prefix("/a b").is_err());
    }
}
