//! Constrained decoding's device readouts against the host mask (issue 24).
//!
//! For a few grammars (a JSON schema, a regex, a choice; on the Qwen3.6
//! vocabulary also one that starts after `</think>`) and three samplings
//! (greedy, top-k from the head, top-p from the weighted row, seeded), one
//! request decodes through the GPU's masked readouts (the mask uploaded,
//! the readout kernels skipping what it leaves out) and again with the
//! logits read back and masked on the host (the path of a backend without
//! device readouts). Both read the same logits, so the tokens must be equal
//! and the log-probabilities within the fixtures' tolerance. Then the same
//! in batches: the constrained request as a row beside two unconstrained
//! ones, its readout on the device against the same batches with its row
//! read back whole and masked on the host; the neighbours' tokens must not
//! change either.

use super::model::{GpuModel, GpuSequence};
use crate::backend::{Backend, BatchItem, Want};
use crate::config::ModelConfig;
use crate::constraint::{Compiled, Compiler, ConstraintSpec, Grammar, Step};
use crate::generate::{GenerateRequest, generate_with};
use crate::model::LoadedModel;
use crate::readout::mask::MaskSource;
use crate::readout::{Next, Readout};
use crate::sampling::{Sampled, Sampler, SamplingParams};
use crate::tokenizer::Tokenizer;
use anyhow::{Context, Result, anyhow, bail};
use serde::Serialize;
use std::ops::ControlFlow;
use std::path::Path;

/// Largest |log-probability difference| between the device and host masks
/// (the fixtures' first-token tolerance; both read the same logits, so the
/// difference is the readouts' summation order, ~1e-6).
pub const MASK_LOGPROB_TOL: f32 = 0.05;

#[derive(Serialize, Clone, Debug)]
pub struct ConstrainedReport {
    /// Grammar x sampling runs, each alone and batched.
    pub runs: usize,
    /// Runs whose tokens equal the host mask's, alone and batched.
    pub alone_equal: usize,
    pub batched_equal: usize,
    /// Batched runs whose unconstrained neighbours decoded the same tokens.
    pub neighbours_equal: usize,
    /// Tokens compared in all.
    pub tokens: usize,
    pub max_dlogprob: f32,
    /// The first mismatch, if any (what, where).
    pub first_mismatch: Option<String>,
    pub pass: bool,
}

/// The GPU model read through the logits only: a constrained request's
/// mask then goes on the host ([`Readout::Logits`]), the reference.
struct HostMask<'a>(&'a GpuModel);

impl Backend for HostMask<'_> {
    type Sequence = GpuSequence;
    fn name(&self) -> &'static str {
        "host-mask"
    }
    fn config(&self) -> &ModelConfig {
        self.0.config()
    }
    fn new_sequence(&self) -> GpuSequence {
        self.0.new_sequence()
    }
    fn position(&self, seq: &GpuSequence) -> usize {
        self.0.position(seq)
    }
    fn forward(&self, seq: &mut GpuSequence, tokens: &[u32]) -> Result<Vec<f32>> {
        self.0.forward(seq, tokens)
    }
}

/// The grammars checked; `think_end`: the `</think>` token, where the
/// vocabulary has one.
fn specs(think_end: Option<u32>) -> Vec<ConstraintSpec> {
    let plain = |grammar| ConstraintSpec {
        grammar,
        start_after: None,
    };
    let mut v = vec![
        plain(Grammar::JsonSchema {
            schema: serde_json::json!({"type": "object", "properties": {
                "n": {"type": "integer", "minimum": 0, "maximum": 999},
                "tag": {"enum": ["x", "yy"]}}, "required": ["n", "tag"], "additionalProperties": false}),
            strict: true,
        }),
        plain(Grammar::Regex("[a-z]{2,8}-[0-9]{1,4}".into())),
        plain(Grammar::Choice(vec!["alpha".into(), "beta gamma".into()])),
    ];
    if let Some(t) = think_end {
        v.push(ConstraintSpec {
            grammar: Grammar::Regex("[0-9]{3}".into()),
            start_after: Some(t),
        });
    }
    v
}

fn samplings() -> [SamplingParams; 3] {
    [
        SamplingParams::default(),
        SamplingParams {
            temperature: 0.8,
            top_k: 20,
            seed: Some(7),
            logprobs: Some(2),
            ..Default::default()
        },
        SamplingParams {
            temperature: 1.0,
            top_p: 0.9,
            seed: Some(8),
            logprobs: Some(1),
            ..Default::default()
        },
    ]
}

/// A vocabulary of the 256 bytes (ids 0-255, byte-level BPE without
/// merges) for the fixtures' 1024-token models, which ship no tokenizer.
pub fn byte_tokenizer() -> Result<Tokenizer> {
    // GPT-2's byte-to-character map (the ByteLevel pre-tokenizer's alphabet).
    let shown: Vec<u32> = (0x21..=0x7e)
        .chain(0xa1..=0xac)
        .chain(0xae..=0xff)
        .collect();
    let mut chars = vec![0u32; 256];
    let mut extra = 0;
    for b in 0..256u32 {
        chars[b as usize] = if shown.contains(&b) {
            b
        } else {
            extra += 1;
            255 + extra
        };
    }
    let vocab: serde_json::Map<String, serde_json::Value> = (0..256)
        .map(|b| {
            let c = char::from_u32(chars[b]).expect("a valid character");
            (c.to_string(), serde_json::json!(b))
        })
        .collect();
    let json = serde_json::json!({
        "version": "1.0", "truncation": null, "padding": null, "added_tokens": [],
        "normalizer": null,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true},
        "post_processor": null,
        "decoder": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true},
        "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
                  "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false,
                  "vocab": vocab, "merges": []}
    });
    Tokenizer::from_json_bytes(&serde_json::to_vec(&json)?)
}

/// [`constrained_check`] on a fixture (the byte vocabulary, EOS the
/// model's or its last id) from its first case's prompt.
pub fn verify_fixture_constrained(dir: &Path) -> Result<ConstrainedReport> {
    let lm = LoadedModel::from_dir(dir)?;
    let expected: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("expected.json"))?)
            .with_context(|| format!("{}/expected.json", dir.display()))?;
    let prompt: Vec<u32> = serde_json::from_value(expected["cases"][0]["prompt_tokens"].clone())
        .with_context(|| format!("{}/expected.json: no first case's prompt", dir.display()))?;
    let eos = match lm.config.eos_token_ids.is_empty() {
        true => vec![lm.config.vocab_size as u32 - 1],
        false => lm.config.eos_token_ids.clone(),
    };
    let gpu = GpuModel::new(lm.config.clone(), &lm.weights)?;
    constrained_check(&gpu, &byte_tokenizer()?, &eos, &prompt, 16)
}

/// The check over `m` with `tok`'s vocabulary (ending at `eos`, the model's
/// or a stand-in), from `prompt`, `n` tokens per run.
pub fn constrained_check(
    m: &GpuModel,
    tok: &Tokenizer,
    eos: &[u32],
    prompt: &[u32],
    n: usize,
) -> Result<ConstrainedReport> {
    let vocab = m.config().vocab_size;
    let compiler = Compiler::new(tok, vocab, eos)?;
    let mut r = ConstrainedReport {
        runs: 0,
        alone_equal: 0,
        batched_equal: 0,
        neighbours_equal: 0,
        tokens: 0,
        max_dlogprob: 0.0,
        first_mismatch: None,
        pass: false,
    };
    let neighbours: Vec<Vec<u32>> = (0..2u32)
        .map(|k| (0..5 + 3 * k).map(|t| (t * 131 + k * 17) % 256).collect())
        .collect();
    for (i, spec) in specs(tok.token_id("</think>")).iter().enumerate() {
        let c = compiler
            .compile(spec)
            .map_err(|e| anyhow!("grammar {i}: {e}"))?;
        for (k, sampling) in samplings().iter().enumerate() {
            let what = format!("grammar {i}, sampling {k}");
            r.runs += 1;
            let req = GenerateRequest {
                prompt: prompt.to_vec(),
                max_tokens: n,
                stop_token_ids: Vec::new(),
                ignore_eos: false,
                sampling: sampling.clone(),
            };
            let dev = generate_with(m, &req, Some(c.start()), go_on)?;
            let host = generate_with(&HostMask(m), &req, Some(c.start()), go_on)?;
            if compare(&mut r, &what, "alone", &dev.steps, &host.steps) {
                r.alone_equal += 1;
            }
            let (dev_row, dev_nb) = batched(m, &c, sampling, prompt, &neighbours, n, false)?;
            let (host_row, host_nb) = batched(m, &c, sampling, prompt, &neighbours, n, true)?;
            if compare(&mut r, &what, "batched", &dev_row, &host_row) {
                r.batched_equal += 1;
            }
            if dev_nb == host_nb {
                r.neighbours_equal += 1;
            } else if r.first_mismatch.is_none() {
                r.first_mismatch = Some(format!("{what}: an unconstrained neighbour changed"));
            }
        }
    }
    r.pass = r.alone_equal == r.runs
        && r.batched_equal == r.runs
        && r.neighbours_equal == r.runs
        && r.max_dlogprob <= MASK_LOGPROB_TOL;
    Ok(r)
}

fn go_on(_: &Sampled, _: bool) -> ControlFlow<()> {
    ControlFlow::Continue(())
}

/// The largest |log-probability difference| of `dev`'s draws from
/// `host`'s, the tokens' and the alternatives' both report.
pub(super) fn max_dlogprob(dev: &[Sampled], host: &[Sampled]) -> f32 {
    let mut d = 0f32;
    for (a, b) in dev.iter().zip(host) {
        d = d.max((a.logprob - b.logprob).abs());
        for (x, y) in a.top.iter().zip(&b.top) {
            if x.0 == y.0 {
                d = d.max((x.1 - y.1).abs());
            }
        }
    }
    d
}

/// Whether `dev`'s tokens equal `host`'s; their logprobs (and the top
/// alternatives') go into the report's largest difference.
fn compare(
    r: &mut ConstrainedReport,
    what: &str,
    how: &str,
    dev: &[Sampled],
    host: &[Sampled],
) -> bool {
    r.tokens += host.len();
    r.max_dlogprob = r.max_dlogprob.max(max_dlogprob(dev, host));
    let dt: Vec<u32> = dev.iter().map(|s| s.token).collect();
    let ht: Vec<u32> = host.iter().map(|s| s.token).collect();
    let same = dt == ht;
    if !same && r.first_mismatch.is_none() {
        r.first_mismatch = Some(format!("{what} {how}: device {dt:?}, host {ht:?}"));
    }
    same
}

/// The constrained request as row 0 of `n` batched steps beside
/// `neighbours` (greedy, unconstrained): row 0 read on the device under its
/// mask, or (`host`) read back whole and masked on the host. Returns row
/// 0's draws and the neighbours' tokens.
#[allow(clippy::type_complexity)]
fn batched(
    m: &GpuModel,
    c: &Compiled,
    sampling: &SamplingParams,
    prompt: &[u32],
    neighbours: &[Vec<u32>],
    n: usize,
    host: bool,
) -> Result<(Vec<Sampled>, Vec<Vec<u32>>)> {
    let mut seqs: Vec<GpuSequence> = (0..=neighbours.len()).map(|_| m.new_sequence()).collect();
    let mut inputs: Vec<Vec<u32>> = std::iter::once(prompt.to_vec())
        .chain(neighbours.iter().cloned())
        .collect();
    let mut constraint = c.start();
    let mut sampler = Sampler::new(sampling.clone());
    let readout = if host {
        Readout::Logits
    } else {
        Readout::choose(sampling, m)
    };
    let mut context = prompt.to_vec();
    let (mut row, mut nb) = (Vec::new(), vec![Vec::new(); neighbours.len()]);
    let eos = &m.config().eos_token_ids;
    for _ in 0..n {
        let mut draw = None;
        let outs = {
            let (first, rest) = seqs.split_first_mut().expect("rows");
            let mask = (!host).then(|| Box::new(|| constraint.token_mask()) as Box<MaskSource<'_>>);
            let mut items = vec![BatchItem {
                seq: first,
                tokens: &inputs[0],
                want: readout.want(&mut sampler, &mut draw),
                mask,
                snapshots: Default::default(),
            }];
            for (s, t) in rest.iter_mut().zip(&inputs[1..]) {
                items.push(BatchItem {
                    seq: s,
                    tokens: t,
                    want: Want::Greedy,
                    mask: None,
                    snapshots: Default::default(),
                });
            }
            m.step(&mut items)
        };
        let mut outs = outs.into_iter();
        let first = outs.next().ok_or_else(|| anyhow!("no row 0"))??;
        let s = match Readout::next(first, &mut sampler, &mut draw)? {
            Some(Next::Sampled(s)) => s,
            Some(Next::Logits(l)) => sampler.sample(constraint.masked(&l)?, &context, prompt.len()),
            None => bail!("row 0 read nothing"),
        };
        for (j, out) in outs.enumerate() {
            let t = match out? {
                crate::backend::StepOut::Greedy(g) => g.token,
                other => bail!("a neighbour returned {other:?}"),
            };
            nb[j].push(t);
            inputs[j + 1] = vec![t];
        }
        let token = s.token;
        row.push(s);
        if eos.contains(&token) || constraint.advance(token)? == Step::Done {
            break;
        }
        context.push(token);
        inputs[0] = vec![token];
    }
    Ok((row, nb))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The fixtures' stand-in vocabulary spells every byte as itself, and
    /// each checked grammar compiles over it with its first tokens right.
    #[test]
    fn the_byte_vocabulary_spells_every_byte_and_takes_the_grammars() {
        let tok = byte_tokenizer().unwrap();
        assert_eq!(tok.vocab_size(), 256);
        for b in 0..=255u8 {
            assert_eq!(tok.decode_bytes(b as u32), vec![b], "byte {b}");
        }
        let compiler = Compiler::new(&tok, 1024, &[1023]).unwrap();
        let firsts: [&[u8]; 3] = [b"{", b"abcdefghijklmnopqrstuvwxyz", b"ab"];
        for (spec, first) in specs(None).iter().zip(firsts) {
            let mask = compiler
                .compile(spec)
                .unwrap()
                .start()
                .token_mask()
                .unwrap();
            assert_eq!(mask.words().len(), 32);
            let allowed: Vec<u32> = (0..1024).filter(|&t| mask.allows(t)).collect();
            let want: Vec<u32> = first.iter().map(|&b| b as u32).collect();
            assert_eq!(allowed, want, "{spec:?}");
        }
    }
}
