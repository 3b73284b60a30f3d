//! Continuous batching on the CPU: the batched step is bit-exact with each
//! sequence alone, and requests in mixed batches (chunked prompts, arrivals
//! mid-stream, device readouts, constraints) get the tokens they get alone.
//! The scheduler's limits, cancellation and preemption: scheduling.rs.

mod batching_support;

use anyhow::Result;
use batching_support::*;
use qwasi_engine::backend::{Backend, BatchItem, StepOut, Want};
use qwasi_engine::config::ModelConfig;
use qwasi_engine::cpu::{CpuModel, CpuSequence};
use qwasi_engine::generate::GenerateRequest;
use qwasi_engine::sampling::{SamplingParams, greedy, top_logits};
use qwasi_engine::service::{ServiceConfig, SubmitOptions};
use std::ops::ControlFlow;
use std::sync::Arc;

fn bits(l: &[f32]) -> Vec<u32> {
    l.iter().map(|v| v.to_bits()).collect()
}

/// Runs `prompt` alone, then `n` greedy tokens: the logits after the
/// prompt and after each token.
fn alone(m: &CpuModel, prompt: &[u32], n: usize) -> Vec<Vec<f32>> {
    let mut seq = m.new_sequence();
    let mut out = vec![m.forward(&mut seq, prompt).unwrap()];
    for _ in 0..n {
        let t = greedy(out.last().unwrap()).token;
        out.push(m.forward(&mut seq, &[t]).unwrap());
    }
    out
}

#[test]
fn a_batched_step_is_bit_exact_with_each_sequence_alone() {
    let m = cpu(None);
    // Prompt lengths across a KV page (64) and chunk sizes per sequence.
    let cases: [(usize, usize); 5] = [(1, 1), (5, 5), (70, 16), (130, 64), (9, 4)];
    let prompts: Vec<Vec<u32>> = cases
        .iter()
        .enumerate()
        .map(|(i, &(n, _))| prompt(n, i as u32))
        .collect();
    const DECODE: usize = 6;
    let want: Vec<Vec<Vec<f32>>> = prompts.iter().map(|p| alone(&m, p, DECODE)).collect();
    let mut seqs: Vec<CpuSequence> = prompts.iter().map(|_| m.new_sequence()).collect();
    // Per sequence: its context, how much is computed, the readouts it got.
    let mut ctx = prompts.clone();
    let mut done = vec![0usize; prompts.len()];
    let mut got: Vec<Vec<Vec<f32>>> = vec![Vec::new(); prompts.len()];
    let mut step = 0;
    while got.iter().any(|g| g.len() <= DECODE) {
        step += 1;
        // Sequences join one step apart (arrivals mid-stream); each row's
        // readout rotates through the kinds.
        let mut rows = Vec::new();
        let mut items: Vec<BatchItem<'_, CpuSequence>> = Vec::new();
        for (i, seq) in seqs.iter_mut().enumerate() {
            if i >= step || got[i].len() > DECODE {
                continue;
            }
            let chunk = cases[i].1.min(ctx[i].len() - done[i]);
            let end = done[i] + chunk == ctx[i].len();
            let want = match (end, (step + i) % 3) {
                (false, _) => Want::Nothing,
                (true, 0) => Want::Logits,
                (true, 1) => Want::Greedy,
                (true, _) => Want::Top(8),
            };
            rows.push((i, chunk));
            items.push(BatchItem {
                seq,
                tokens: &ctx[i][done[i]..done[i] + chunk],
                want,
                mask: None,
                snapshots: Default::default(),
            });
        }
        let outs = m.step(&mut items);
        drop(items);
        assert_eq!(outs.len(), rows.len());
        for ((i, chunk), out) in rows.into_iter().zip(outs) {
            done[i] += chunk;
            let reference = &want[i][got[i].len()];
            let next = match out.unwrap() {
                StepOut::Extended => continue,
                StepOut::Logits(l) => {
                    assert_eq!(bits(&l), bits(reference), "seq {i} step {step}");
                    greedy(&l).token
                }
                StepOut::Greedy(s) => {
                    assert_eq!(s, greedy(reference), "seq {i} step {step}");
                    s.token
                }
                StepOut::Top(t) => {
                    assert_eq!(t, top_logits(reference, 8), "seq {i} step {step}");
                    t.top[0].0
                }
                StepOut::Weighted(_) => unreachable!(),
            };
            got[i].push(reference.clone());
            ctx[i].push(next);
        }
    }
    // A bad row fails alone; its batch-mates run.
    let (mut a, mut b) = (m.new_sequence(), m.new_sequence());
    let outs = m.step(&mut [
        BatchItem {
            seq: &mut a,
            tokens: &[1, 300],
            want: Want::Logits,
            mask: None,
            snapshots: Default::default(),
        },
        BatchItem {
            seq: &mut b,
            tokens: &prompts[1],
            want: Want::Logits,
            mask: None,
            snapshots: Default::default(),
        },
    ]);
    assert!(format!("{:#}", outs[0].as_ref().unwrap_err()).contains("out of range"));
    match &outs[1] {
        Ok(StepOut::Logits(l)) => assert_eq!(bits(l), bits(&want[1][0])),
        o => panic!("{o:?}"),
    }
    assert_eq!((m.position(&a), m.position(&b)), (0, 5));
    // A step where no row reads anything back (prompt chunks only).
    let outs = m.step(&mut [
        BatchItem {
            seq: &mut a,
            tokens: &[1, 2],
            want: Want::Nothing,
            mask: None,
            snapshots: Default::default(),
        },
        BatchItem {
            seq: &mut b,
            tokens: &[3],
            want: Want::Nothing,
            mask: None,
            snapshots: Default::default(),
        },
    ]);
    assert!(outs.iter().all(|o| matches!(o, Ok(StepOut::Extended))));
    assert_eq!((m.position(&a), m.position(&b)), (2, 6));
}

/// Requests in one batch (greedy and seeded sampling, prompts chunked into
/// decode steps, some arriving while others stream) get the tokens and
/// logprobs each gets alone.
#[tokio::test]
async fn batched_requests_get_the_tokens_they_get_alone() {
    let m = cpu(None);
    let svc = start(
        cpu(None),
        ServiceConfig {
            max_num_seqs: 8,
            max_num_batched_tokens: 12,
            ..ServiceConfig::default()
        },
    );
    assert_eq!((svc.max_num_seqs(), svc.max_num_batched_tokens()), (8, 12));
    let reqs: Vec<GenerateRequest> = (0..7)
        .map(|i| {
            let sampling = if i % 2 == 0 {
                SamplingParams::default()
            } else {
                seeded(100 + i as u64)
            };
            GenerateRequest {
                ignore_eos: true,
                ..req(
                    &prompt([3, 40, 1, 75, 9, 130, 20][i], i as u32),
                    24,
                    sampling,
                )
            }
        })
        .collect();
    let mut handles = Vec::new();
    for (i, r) in reqs.iter().enumerate() {
        let h = svc
            .submit(r.clone(), SubmitOptions::default())
            .await
            .unwrap();
        if i == 2 {
            // The rest arrive while the first ones stream.
            h.wait().await;
        }
        handles.push(h);
    }
    for (i, (r, mut h)) in reqs.iter().zip(handles).enumerate() {
        let events = collect(&mut h).await;
        assert_eq!(got(&events), expected(&m, r), "request {i}");
    }
    let steps = metric(&svc, "qwasi_batch_size_count");
    let rows = metric(&svc, "qwasi_batch_size_sum");
    assert!(
        rows > steps * 1.5,
        "{rows} rows in {steps} steps: little batching"
    );
    assert_eq!(metric(&svc, "qwasi_batch_size_bucket{le=\"8\"}"), steps);
    // Prompts were chunked under the step budget (130 tokens at most 12 a step).
    assert_eq!(
        metric(&svc, "qwasi_step_prefill_tokens_bucket{le=\"16\"}"),
        steps
    );
    assert!(metric(&svc, "qwasi_step_prefill_tokens_sum") >= 278.0);
}

/// The CPU model posing as a backend that keeps the logits where they are
/// (as the GPU does): requests read back the greedy token, the row's head
/// or its weights, in batches.
struct OnDevice(Arc<CpuModel>);

impl Backend for OnDevice {
    type Sequence = CpuSequence;
    fn name(&self) -> &'static str {
        "on-device"
    }
    fn config(&self) -> &ModelConfig {
        self.0.config()
    }
    fn new_sequence(&self) -> CpuSequence {
        self.0.new_sequence()
    }
    fn position(&self, seq: &CpuSequence) -> usize {
        self.0.position(seq)
    }
    fn forward(&self, seq: &mut CpuSequence, tokens: &[u32]) -> Result<Vec<f32>> {
        self.0.forward(seq, tokens)
    }
    fn step(&self, batch: &mut [BatchItem<'_, CpuSequence>]) -> Vec<Result<StepOut>> {
        self.0.step(batch)
    }
    fn logits_on_device(&self) -> bool {
        true
    }
}

/// Batched rows that read back less than the logits (greedy, the head,
/// the weighted row: each request's RNG stream drawn in its own row) give
/// the tokens the host sampler gives alone.
#[tokio::test]
async fn batched_device_readouts_give_the_tokens_alone() {
    let m = Arc::new(cpu(None));
    let svc = start(
        OnDevice(m.clone()),
        ServiceConfig {
            max_num_seqs: 6,
            max_num_batched_tokens: 16,
            ..ServiceConfig::default()
        },
    );
    let samplings = [
        SamplingParams::default(),
        SamplingParams {
            temperature: 0.7,
            top_k: 20,
            seed: Some(3),
            ..Default::default()
        },
        SamplingParams {
            temperature: 0.9,
            top_p: 0.8,
            seed: Some(4),
            logprobs: Some(1),
            ..Default::default()
        },
        SamplingParams {
            temperature: 1.2,
            min_p: 0.05,
            seed: Some(5),
            ..Default::default()
        },
    ];
    let reqs: Vec<GenerateRequest> = samplings
        .iter()
        .enumerate()
        .map(|(i, s)| GenerateRequest {
            ignore_eos: true,
            ..req(&prompt(7 + 23 * i, i as u32), 20, s.clone())
        })
        .collect();
    let mut handles = Vec::new();
    for r in &reqs {
        handles.push(
            svc.submit(r.clone(), SubmitOptions::default())
                .await
                .unwrap(),
        );
    }
    for (i, (r, mut h)) in reqs.iter().zip(handles).enumerate() {
        let events = collect(&mut h).await;
        assert_eq!(got(&events), expected(&m, r), "request {i}");
    }
    assert!(metric(&svc, "qwasi_batch_size_sum") > metric(&svc, "qwasi_batch_size_count"));
}

/// Constrained requests keep their device readouts (greedy, the head, the
/// weighted row), the mask going with each step, in batches beside
/// unconstrained ones: every request gets the tokens and logprobs the host
/// mask gives it alone on the CPU (the logits readout, the constraint
/// applied to the row).
#[tokio::test]
async fn constrained_rows_keep_their_device_readouts() {
    use qwasi_engine::constraint::{Compiler, ConstraintSpec, Grammar};
    use qwasi_engine::generate::generate_with;
    use qwasi_engine::model::LoadedModel;
    let demo = LoadedModel::demo().unwrap();
    let tok = demo.tokenizer.clone().unwrap();
    let cfg = demo.config.clone();
    let m = Arc::new(CpuModel::new(demo.config, demo.weights));
    let compiler = Compiler::new(&tok, cfg.vocab_size, &cfg.eos_token_ids).unwrap();
    let grammars = [
        Grammar::JsonSchema {
            schema: serde_json::json!({"type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 99}}, "required": ["n"], "additionalProperties": false}),
            strict: true,
        },
        Grammar::Regex("[a-z]{2,6}-[0-9]{1,3}".into()),
        Grammar::Choice(vec!["alpha".into(), "beta gamma".into()]),
    ];
    let samplings = [
        SamplingParams::default(),
        SamplingParams {
            temperature: 0.8,
            top_k: 20,
            seed: Some(3),
            logprobs: Some(2),
            ..Default::default()
        },
        SamplingParams {
            temperature: 1.0,
            top_p: 0.9,
            seed: Some(4),
            logprobs: Some(1),
            ..Default::default()
        },
    ];
    let svc = start(
        OnDevice(m.clone()),
        ServiceConfig {
            max_num_seqs: 8,
            max_num_batched_tokens: 64,
            ..ServiceConfig::default()
        },
    );
    let chat = tok
        .encode("<|im_start|>user\nAnswer<|im_end|>\n<|im_start|>assistant\n")
        .unwrap();
    let mut runs = Vec::new();
    for (i, g) in grammars.iter().enumerate() {
        let compiled = compiler
            .compile(&ConstraintSpec {
                grammar: g.clone(),
                start_after: None,
            })
            .unwrap();
        for (k, s) in samplings.iter().enumerate() {
            let r = GenerateRequest {
                prompt: chat.clone(),
                max_tokens: 24,
                stop_token_ids: vec![],
                ignore_eos: false,
                sampling: s.clone(),
            };
            let host = generate_with(&*m, &r, Some(compiled.start()), |_, _| {
                ControlFlow::Continue(())
            })
            .unwrap();
            let want: Vec<(u32, Option<f32>)> = host
                .tokens
                .iter()
                .zip(&host.steps)
                .map(|(&t, st)| (t, s.logprobs.map(|_| st.logprob)))
                .collect();
            let opts = SubmitOptions {
                constraint: Some(compiled.clone()),
                ..Default::default()
            };
            let h = svc.submit(r.clone(), opts).await.unwrap();
            // An unconstrained neighbour in the same batches.
            let free = GenerateRequest {
                ignore_eos: true,
                ..req(&prompt(5 + i + k, k as u32), 12, s.clone())
            };
            let hf = svc
                .submit(free.clone(), SubmitOptions::default())
                .await
                .unwrap();
            runs.push((format!("grammar {i} sampling {k}"), h, want, hf, free));
        }
    }
    for (what, mut h, want, mut hf, free) in runs {
        assert_eq!(got(&collect(&mut h).await), want, "{what}");
        assert_eq!(
            got(&collect(&mut hf).await),
            expected(&m, &free),
            "{what}: its neighbour"
        );
    }
    assert!(metric(&svc, "qwasi_batch_size_sum") > metric(&svc, "qwasi_batch_size_count"));
}
