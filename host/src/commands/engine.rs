//! Loading the model and starting the engine service on a backend, shared
//! by `qwasi serve` and `qwasi run`.

use super::serving::ServingArgs;
use crate::runtime::{self, Shared};
use anyhow::{Result, bail};
use qwasi_engine::config::ModelConfig;
use qwasi_engine::cpu::CpuModel;
use qwasi_engine::model::LoadedModel;
use qwasi_engine::service::{EngineService, ServiceConfig};
use qwasi_engine::tokenizer::Tokenizer;
use qwasi_engine::weights::Weights;
use std::path::Path;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

/// The engine service and what guests see of it.
pub struct StartedEngine {
    pub shared: Arc<Shared>,
    pub id: String,
    pub is_demo: bool,
    pub load_s: f64,
}

/// The prefix-cache budget of the cpu backend without `--prefix-cache-mib`.
pub const CPU_PREFIX_CACHE_MIB: usize = 1024;

/// Seed of `--synthetic` weights: those `qwasi verify --synthetic` checks.
#[cfg(any(feature = "cuda", feature = "hip"))]
const SYNTHETIC_SEED: u64 = qwasi_engine::gpu::verify::SYNTHETIC_SEED;

/// The device-memory prefix-cache budget without `--prefix-cache-mib`: a
/// quarter of what the weights and the work reserve leave free, the rest
/// for the running sequences (an H200 with the 35B model: ~17 GB, a
/// 131K-token prefix is 5.4 GB; an 80 GB card: ~1.5 GB).
#[cfg(any(feature = "cuda", feature = "hip"))]
fn gpu_prefix_cache(gpu: &qwasi_engine::gpu::model::GpuModel, config: &mut ServiceConfig) {
    config.prefix_cache_bytes = (gpu.free_past_work_reserve() / 4) & !((1 << 20) - 1);
    eprintln!(
        "[gpu] prefix cache: {} MiB of device memory (a quarter of the free memory past the work reserve; --prefix-cache-mib sets it)",
        config.prefix_cache_bytes >> 20
    );
}

/// Where the engine's weights come from.
#[derive(Clone, Copy)]
pub enum ModelSource<'a> {
    /// A model directory, or the embedded demo model (`None`).
    Dir(Option<&'a Path>),
    /// Seeded random weights of a built-in geometry (its first `layers`
    /// layers when given), generated on the GPU: served benchmarks without a
    /// checkpoint to write and load (as vLLM's `--load-format dummy`).
    Synthetic {
        preset: &'a str,
        layers: Option<usize>,
    },
}

/// What `start_engine` loads before the backend: the model's description
/// and its weights (`None`: synthetic, made on the GPU).
struct Model {
    id: String,
    config: ModelConfig,
    weights: Option<Weights>,
    tokenizer: Option<Tokenizer>,
    chat_template: Option<String>,
    is_demo: bool,
}

fn load_model(source: ModelSource<'_>) -> Result<Model> {
    match source {
        ModelSource::Dir(dir) => {
            let m = LoadedModel::load(dir)?;
            Ok(Model {
                id: m.id,
                config: m.config,
                weights: Some(m.weights),
                tokenizer: m.tokenizer,
                chat_template: m.chat_template,
                is_demo: m.is_demo,
            })
        }
        ModelSource::Synthetic { preset, layers } => {
            let mut config = qwasi_engine::presets::by_name(preset)?;
            if let Some(n) = layers {
                config = qwasi_engine::presets::with_layers(config, n)?;
            }
            Ok(Model {
                id: preset.to_owned(),
                config,
                weights: None,
                tokenizer: Tokenizer::qwen36().ok(),
                chat_template: None,
                is_demo: false,
            })
        }
    }
}

/// Loads the model on `backend` and starts the engine service (blocking;
/// `serve` and `run` share it). `service_config`
/// carries the prefix-cache budget; with `gpu_budget_auto` a GPU backend sizes
/// it from its free device memory instead.
pub fn start_engine(
    model: ModelSource<'_>,
    backend: &str,
    service_config: ServiceConfig,
    gpu_budget_auto: bool,
    scripted_turns: Option<&Path>,
    serving: &ServingArgs,
) -> Result<StartedEngine> {
    let mut service_config = service_config;
    #[cfg(not(any(feature = "cuda", feature = "hip")))]
    let _ = gpu_budget_auto;
    let t0 = std::time::Instant::now();
    let max_prompt_tokens = service_config.max_prompt_tokens as u32;
    let max_completion_tokens = service_config.max_completion_tokens as u32;
    serving.apply(String::new(), None)?; // bad options fail before the weights load
    let Model {
        id,
        config,
        weights,
        tokenizer,
        chat_template,
        is_demo,
    } = load_model(model)?;
    let serving = serving.apply(id, chat_template)?;
    let (id, chat_template) = (serving.id, serving.chat_template);
    let vocab_size = config.vocab_size as u32;
    let eos_token_ids = config.eos_token_ids.clone();
    let service = match backend {
        #[cfg(any(feature = "cuda", feature = "hip"))]
        b if b == super::GPU_BACKEND => {
            let gpu = match weights {
                Some(w) => qwasi_engine::gpu::model::GpuModel::new(config, &w)?,
                None => {
                    eprintln!(
                        "note: synthetic {id}: seeded random weights (its text is meaningless)"
                    );
                    qwasi_engine::gpu::model::GpuModel::synthetic(config, SYNTHETIC_SEED)?
                }
            };
            if gpu_budget_auto {
                gpu_prefix_cache(&gpu, &mut service_config);
            }
            start_service(gpu, scripted_turns, &tokenizer, &id, service_config)?
        }
        _ => {
            let Some(weights) = weights else {
                bail!(
                    "--synthetic needs --backend {}: its weights are generated on the GPU",
                    super::GPU_BACKEND
                );
            };
            if service_config.prefix_cache_host_bytes > 0 {
                eprintln!(
                    "[cpu] --prefix-cache-host-mib has no effect: cpu snapshots already live in host memory (--prefix-cache-mib)"
                );
                service_config.prefix_cache_host_bytes = 0;
            }
            start_service(
                CpuModel::new(config, weights),
                scripted_turns,
                &tokenizer,
                &id,
                service_config,
            )?
        }
    };
    let model_info = runtime::bindings::api::qwasi::inference::types::ModelInfo {
        id: id.clone(),
        context_length: service.max_model_len() as u32,
        vocab_size,
        eos_token_ids,
        chat_template,
        created: SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_secs(),
        max_prompt_tokens,
        max_completion_tokens,
    };
    let load_s = t0.elapsed().as_secs_f64();
    let shared = Arc::new(Shared {
        service,
        tokenizer,
        model_id: id.clone(),
        model_info,
        constraints: Default::default(),
        serving: serving.config,
        hard_stop: Default::default(),
    });
    Ok(StartedEngine {
        shared,
        id,
        is_demo,
        load_s,
    })
}

/// Starts the engine service on `backend` (wrapped for `--scripted-turns`).
fn start_service<B: qwasi_engine::backend::Backend + 'static>(
    backend: B,
    scripted_turns: Option<&Path>,
    tokenizer: &Option<qwasi_engine::tokenizer::Tokenizer>,
    id: &str,
    config: ServiceConfig,
) -> Result<EngineService> {
    let backend =
        qwasi_engine::scripted::Scripted::wrap(backend, scripted_turns, tokenizer.as_ref())?;
    Ok(EngineService::start(
        backend,
        tokenizer.clone(),
        id.to_owned(),
        config,
    ))
}
