//! Shared by the batching tests (batching.rs, scheduling.rs): the tiny CPU
//! model, the engine service around a backend, and the request helpers.

use qwasi_engine::backend::Backend;
use qwasi_engine::config::ModelConfig;
use qwasi_engine::cpu::CpuModel;
use qwasi_engine::demo::RandomWeights;
use qwasi_engine::generate::{GenerateRequest, generate};
use qwasi_engine::sampling::SamplingParams;
use qwasi_engine::service::{EngineService, Event, GenerationHandle, ServiceConfig};
use qwasi_engine::weights::Weights;
use std::ops::ControlFlow;
use std::time::Duration;

#[path = "../common/mod.rs"]
mod common;

pub const EOS: u32 = 299;

pub fn cpu(kv_budget: Option<usize>) -> CpuModel {
    let cfg = ModelConfig::from_json(&common::tiny_moe_config(EOS)).unwrap();
    let weights = Weights::load(&cfg, &RandomWeights { seed: 7 }).unwrap();
    CpuModel::new(cfg, weights).with_kv_budget(kv_budget)
}

/// A prompt of `n` tokens (ids from `seed`).
pub fn prompt(n: usize, seed: u32) -> Vec<u32> {
    (0..n as u32)
        .map(|i| (i * 37 + seed * 11 + 1) % 290)
        .collect()
}

pub fn start<B: Backend + 'static>(b: B, cfg: ServiceConfig) -> EngineService {
    EngineService::start(b, None, "tiny".into(), cfg)
}

pub fn req(prompt: &[u32], max_tokens: usize, sampling: SamplingParams) -> GenerateRequest {
    GenerateRequest {
        prompt: prompt.to_vec(),
        max_tokens,
        stop_token_ids: vec![],
        ignore_eos: false,
        sampling,
    }
}

pub fn seeded(seed: u64) -> SamplingParams {
    SamplingParams {
        temperature: 0.8,
        top_p: 0.9,
        seed: Some(seed),
        frequency_penalty: 0.3,
        logprobs: Some(2),
        ..Default::default()
    }
}

/// The request's tokens and logprobs run alone.
pub fn expected(m: &CpuModel, r: &GenerateRequest) -> Vec<(u32, Option<f32>)> {
    let g = generate(m, r, |_, _| ControlFlow::Continue(())).unwrap();
    g.tokens
        .iter()
        .zip(&g.steps)
        .map(|(&t, s)| (t, r.sampling.logprobs.map(|_| s.logprob)))
        .collect()
}

#[path = "../common/drain.rs"]
mod drain;

/// Drains a handle to its terminal event (120 s at most).
pub async fn collect(h: &mut GenerationHandle) -> Vec<Event> {
    drain::drain(h, Duration::from_secs(120)).await
}

pub fn got(events: &[Event]) -> Vec<(u32, Option<f32>)> {
    events
        .iter()
        .filter_map(|e| match e {
            Event::Token { id, logprob, .. } => Some((*id, logprob.as_ref().map(|s| s.logprob))),
            _ => None,
        })
        .collect()
}

/// Value of an unlabelled sample.
pub fn metric(svc: &EngineService, name: &str) -> f64 {
    let text = svc.metrics_text();
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
        .unwrap_or_else(|| panic!("no sample {name} in\n{text}"))
        .parse()
        .unwrap()
}
