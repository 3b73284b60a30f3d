//! The CPU backend against transformers: every fixture under
//! tests/fixtures/models (written by scripts/make_fixtures.py) must generate
//! the same greedy tokens with logprobs within 1e-3.

use qwasi_engine::backend::Backend;
use qwasi_engine::cpu::CpuModel;
use qwasi_engine::cpu::gdn::GdnPrefill;
use qwasi_engine::generate::{GenerateRequest, generate};
use qwasi_engine::model::LoadedModel;
use qwasi_engine::sampling::{SamplingParams, log_softmax};
use serde::Deserialize;
use std::ops::ControlFlow;
use std::path::{Path, PathBuf};

#[derive(Deserialize)]
struct Expected {
    cases: Vec<Case>,
}

#[derive(Deserialize)]
struct Case {
    name: String,
    prompt_tokens: Vec<u32>,
    generated: Vec<u32>,
    steps: Vec<Step>,
}

#[derive(Deserialize)]
struct Step {
    token: u32,
    logprob: f32,
    top: Vec<(u32, f32)>,
    margin: f32,
}

/// Greedy choices closer than this (in logits) are ties under f32 rounding.
const TIE_MARGIN: f32 = 1e-3;
const LOGPROB_TOL: f32 = 1e-3;

fn fixture_dirs() -> Vec<PathBuf> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/models");
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(&root)
        .unwrap_or_else(|e| panic!("{}: {e}", root.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.join("expected.json").exists())
        .collect();
    dirs.sort();
    assert!(
        dirs.len() >= 3,
        "expected at least 3 fixtures in {}",
        root.display()
    );
    dirs
}

fn load(dir: &Path) -> (CpuModel, Expected) {
    let m = LoadedModel::from_dir(dir).unwrap_or_else(|e| panic!("{}: {e:#}", dir.display()));
    let text = std::fs::read_to_string(dir.join("expected.json")).unwrap();
    (
        CpuModel::new(m.config, m.weights),
        serde_json::from_str(&text).unwrap(),
    )
}

#[test]
fn greedy_generation_matches_transformers() {
    for dir in fixture_dirs() {
        let (model, expected) = load(&dir);
        for case in &expected.cases {
            let label = format!(
                "{}/{}",
                dir.file_name().unwrap().to_string_lossy(),
                case.name
            );
            let req = GenerateRequest {
                prompt: case.prompt_tokens.clone(),
                max_tokens: case.generated.len(),
                stop_token_ids: vec![],
                ignore_eos: true,
                sampling: SamplingParams {
                    logprobs: Some(8),
                    ..Default::default()
                },
            };
            let out = generate(&model, &req, |_, _| ControlFlow::Continue(())).unwrap();
            let mut same = 0;
            for (i, (ours, theirs)) in out.steps.iter().zip(&case.steps).enumerate() {
                if ours.token != theirs.token {
                    assert!(
                        theirs.margin < TIE_MARGIN,
                        "{label}: step {i}: got token {} but transformers chose {} with margin {}",
                        ours.token,
                        theirs.token,
                        theirs.margin
                    );
                    break;
                }
                assert!(
                    (ours.logprob - theirs.logprob).abs() < LOGPROB_TOL,
                    "{label}: step {i}: logprob {} vs {}",
                    ours.logprob,
                    theirs.logprob
                );
                same += 1;
            }
            assert!(
                same >= 24.min(case.generated.len()),
                "{label}: only {same} identical tokens"
            );
            assert_eq!(case.generated.len(), case.steps.len());
        }
    }
}

#[test]
fn first_token_logprobs_match_transformers() {
    for dir in fixture_dirs() {
        let (model, expected) = load(&dir);
        for case in &expected.cases {
            let mut seq = model.new_sequence();
            let logits = model.forward(&mut seq, &case.prompt_tokens).unwrap();
            let lp = log_softmax(&logits);
            for &(id, want) in &case.steps[0].top {
                let got = lp[id as usize];
                assert!(
                    (got - want).abs() < LOGPROB_TOL,
                    "{}/{}: token {id}: logprob {got} vs transformers {want}",
                    dir.display(),
                    case.name
                );
            }
        }
    }
}

fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

#[test]
fn chunked_prefill_equals_serial_recurrence_on_a_whole_model() {
    let dir = &fixture_dirs()[0];
    let (mut model, expected) = load(dir);
    let prompt = &expected
        .cases
        .iter()
        .max_by_key(|c| c.prompt_tokens.len())
        .unwrap()
        .prompt_tokens;
    model.gdn_prefill = GdnPrefill::Chunked;
    let mut seq = model.new_sequence();
    let chunked = model.forward_all(&mut seq, prompt).unwrap();
    model.gdn_prefill = GdnPrefill::Serial;
    let mut seq = model.new_sequence();
    let serial = model.forward_all(&mut seq, prompt).unwrap();
    let d = max_diff(&chunked, &serial);
    assert!(d < 1e-3, "chunked vs serial logits differ by {d}");
}

#[test]
fn incremental_prefill_equals_one_pass() {
    // Splits inside a GDN chunk, at a chunk boundary, and token by token.
    let dir = &fixture_dirs()[0];
    let (model, expected) = load(dir);
    let prompt = &expected
        .cases
        .iter()
        .max_by_key(|c| c.prompt_tokens.len())
        .unwrap()
        .prompt_tokens;
    let prompt = &prompt[..prompt.len().min(150)];
    let mut seq = model.new_sequence();
    let whole = model.forward(&mut seq, prompt).unwrap();
    for split in [1, 37, 64, 65, 128, prompt.len() - 1] {
        let mut seq = model.new_sequence();
        model.forward(&mut seq, &prompt[..split]).unwrap();
        let logits = model.forward(&mut seq, &prompt[split..]).unwrap();
        let d = max_diff(&whole, &logits);
        assert!(d < 1e-3, "split at {split}: logits differ by {d}");
        assert_eq!(model.position(&seq), prompt.len());
    }
}

/// The FP8 fixture (scripts/make_fp8_fixture.py) really is served from its
/// E4M3 weights: the Linear layers that transformers quantizes are FP8 with
/// their block scales, the modules it keeps in BF16 are BF16.
#[test]
fn fp8_fixture_is_loaded_from_fp8_weights() {
    use qwasi_engine::weights::{Mixer, Mlp};
    let dir = fixture_dirs()
        .into_iter()
        .find(|d| d.ends_with("moe-fp8"))
        .expect("the moe-fp8 fixture");
    let m = LoadedModel::from_dir(&dir).unwrap();
    assert!(m.config.quantization.is_some());
    assert!(m.weights.embed.fp8().is_none() && m.weights.lm_head().fp8().is_none());
    for layer in &m.weights.layers {
        match &layer.mixer {
            Mixer::Gdn(g) => {
                assert!(g.in_proj_qkv.fp8().is_some() && g.in_proj_z.fp8().is_some());
                assert!(g.out_proj.fp8().is_some());
                assert!(g.in_proj_a.fp8().is_none() && g.in_proj_b.fp8().is_none());
            }
            Mixer::Attention(a) => {
                for w in [&a.q_proj, &a.k_proj, &a.v_proj, &a.o_proj] {
                    assert!(w.fp8().is_some());
                }
            }
        }
        let Mlp::Moe {
            router,
            experts,
            shared,
            shared_gate,
        } = &layer.mlp
        else {
            panic!("moe-fp8 is a MoE model");
        };
        assert!(router.fp8().is_none() && shared_gate.fp8().is_none());
        for e in experts.iter().chain([shared]) {
            assert!(e.gate.fp8().is_some() && e.up.fp8().is_some() && e.down.fp8().is_some());
        }
    }
    // Loading keeps FP8 weights as they are on disk ...
    let loaded = m.weights.mats();
    assert!(
        loaded
            .iter()
            .filter_map(|w| w.fp8())
            .all(|(t, _)| t.cached().is_none())
    );
    // ... what a GPU upload reads is dequantized per matrix, not kept ...
    let uploads: Vec<Vec<_>> = loaded.iter().map(|w| w.host_bf16().into_owned()).collect();
    assert!(
        loaded
            .iter()
            .filter_map(|w| w.fp8())
            .all(|(t, _)| t.cached().is_none())
    );
    drop(loaded);
    // ... equals the copies the CPU backend dequantizes when it is built.
    let cpu = CpuModel::new(m.config, m.weights);
    let mats = cpu.weights().mats();
    let fp8: Vec<_> = mats.iter().filter_map(|w| w.fp8()).collect();
    assert!(!fp8.is_empty() && fp8.iter().all(|(t, _)| t.cached().is_some()));
    for (w, up) in mats.iter().zip(&uploads) {
        assert!(w.data() == up.as_slice());
    }
}
