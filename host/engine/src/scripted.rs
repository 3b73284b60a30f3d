//! A scripted token source for end-to-end tests (`qwasi serve --scripted-turns FILE`).
//!
//! [`ScriptedBackend`] implements [`Backend`] without a model: each request
//! (each fresh sequence) takes the next *turn* of a script, the turn's text
//! tokenized with the model's real tokenizer, and `forward` returns logits
//! that force exactly those tokens, then an end-of-sequence token. The
//! tokenizer, engine service, sampling, guests and HTTP are all real, so a
//! test can drive a whole agent loop with known model output.
//!
//! The file is JSON: an array of turns, each a string or `{"text": "..."}`,
//! used one per request, in order.

use std::collections::VecDeque;
use std::path::Path;
use std::sync::{Arc, Mutex};

use anyhow::{Context, Result, anyhow, bail};

use crate::backend::{Backend, BatchItem, SeqSnapshot, StepOut, Want, step_one};
use crate::config::ModelConfig;
use crate::sampling::{RowPlanner, Sampled, TopLogits, WeightedRow, Weighting};
use crate::tokenizer::Tokenizer;

pub struct ScriptedBackend {
    config: ModelConfig,
    turns: Mutex<VecDeque<Arc<Vec<u32>>>>,
    eos: u32,
}

pub struct ScriptedSequence {
    position: usize,
    /// The turn this sequence replays (taken at its first forward).
    turn: Option<Arc<Vec<u32>>>,
    /// Tokens of the turn forced so far.
    next: usize,
}

impl ScriptedBackend {
    /// Turns given as texts, tokenized with `tokenizer`.
    pub fn new(config: ModelConfig, tokenizer: &Tokenizer, texts: &[String]) -> Result<Self> {
        let eos = *config
            .eos_token_ids
            .first()
            .ok_or_else(|| anyhow!("the model has no end-of-sequence token"))?;
        let turns = texts
            .iter()
            .map(|t| tokenizer.encode(t).map(Arc::new))
            .collect::<Result<VecDeque<_>>>()?;
        for t in &turns {
            if let Some(&bad) = t.iter().find(|&&id| id as usize >= config.vocab_size) {
                bail!("scripted token {bad} is outside the vocabulary");
            }
        }
        Ok(ScriptedBackend {
            config,
            turns: Mutex::new(turns),
            eos,
        })
    }

    /// Reads the script file (a JSON array of strings or `{"text": ...}`).
    pub fn from_file(path: &Path, config: ModelConfig, tokenizer: &Tokenizer) -> Result<Self> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read the scripted turns {}", path.display()))?;
        Self::new(config, tokenizer, &parse_turns(&text)?)
    }

    fn take_turn(&self) -> Result<Arc<Vec<u32>>> {
        self.turns
            .lock()
            .map_err(|_| anyhow!("scripted turns poisoned"))?
            .pop_front()
            .ok_or_else(|| anyhow!("the scripted turns are used up"))
    }
}

pub fn parse_turns(json: &str) -> Result<Vec<String>> {
    let v: serde_json::Value = serde_json::from_str(json).context("scripted turns: bad JSON")?;
    let arr = v
        .as_array()
        .ok_or_else(|| anyhow!("scripted turns: expected a JSON array"))?;
    arr.iter()
        .map(|t| match t {
            serde_json::Value::String(s) => Ok(s.clone()),
            serde_json::Value::Object(o) => o
                .get("text")
                .and_then(|x| x.as_str())
                .map(str::to_owned)
                .ok_or_else(|| anyhow!("scripted turns: an object turn needs \"text\"")),
            _ => bail!("scripted turns: each turn is a string or {{\"text\": ...}}"),
        })
        .collect()
}

impl Backend for ScriptedBackend {
    type Sequence = ScriptedSequence;

    fn name(&self) -> &'static str {
        "scripted"
    }

    fn config(&self) -> &ModelConfig {
        &self.config
    }

    fn new_sequence(&self) -> ScriptedSequence {
        ScriptedSequence {
            position: 0,
            turn: None,
            next: 0,
        }
    }

    fn position(&self, seq: &ScriptedSequence) -> usize {
        seq.position
    }

    fn extend(&self, seq: &mut ScriptedSequence, tokens: &[u32]) -> Result<()> {
        if seq.turn.is_none() {
            seq.turn = Some(self.take_turn()?);
        }
        seq.position += tokens.len();
        Ok(())
    }

    fn forward(&self, seq: &mut ScriptedSequence, tokens: &[u32]) -> Result<Vec<f32>> {
        self.extend(seq, tokens)?;
        let turn = seq.turn.as_ref().expect("taken by extend");
        let id = turn.get(seq.next).copied().unwrap_or(self.eos);
        seq.next += 1;
        let mut logits = vec![-1.0e9f32; self.config.vocab_size];
        logits[id as usize] = 0.0;
        Ok(logits)
    }
}

/// A backend, or (with a script) the scripted backend in its place: lets
/// `serve` switch with one line while keeping its backend type.
#[allow(clippy::large_enum_variant)] // chosen once per server
pub enum Scripted<B: Backend> {
    Real(B),
    Script(ScriptedBackend),
}

#[allow(clippy::large_enum_variant)]
pub enum ScriptedSeq<S> {
    Real(S),
    Script(ScriptedSequence),
}

impl<B: Backend> Scripted<B> {
    /// `inner`, or the scripted backend over `inner`'s config when `turns` is given.
    pub fn wrap(inner: B, turns: Option<&Path>, tokenizer: Option<&Tokenizer>) -> Result<Self> {
        match turns {
            None => Ok(Scripted::Real(inner)),
            Some(path) => {
                let tok = tokenizer.ok_or_else(|| anyhow!("--scripted-turns needs a tokenizer"))?;
                Ok(Scripted::Script(ScriptedBackend::from_file(
                    path,
                    inner.config().clone(),
                    tok,
                )?))
            }
        }
    }
}

impl<B: Backend> Backend for Scripted<B> {
    type Sequence = ScriptedSeq<B::Sequence>;

    fn name(&self) -> &'static str {
        match self {
            Scripted::Real(b) => b.name(),
            Scripted::Script(s) => s.name(),
        }
    }

    fn config(&self) -> &ModelConfig {
        match self {
            Scripted::Real(b) => b.config(),
            Scripted::Script(s) => s.config(),
        }
    }

    fn new_sequence(&self) -> Self::Sequence {
        match self {
            Scripted::Real(b) => ScriptedSeq::Real(b.new_sequence()),
            Scripted::Script(s) => ScriptedSeq::Script(s.new_sequence()),
        }
    }

    fn position(&self, seq: &Self::Sequence) -> usize {
        match (self, seq) {
            (Scripted::Real(b), ScriptedSeq::Real(q)) => b.position(q),
            (Scripted::Script(s), ScriptedSeq::Script(q)) => s.position(q),
            _ => unreachable!("a sequence of the other backend"),
        }
    }

    fn forward(&self, seq: &mut Self::Sequence, tokens: &[u32]) -> Result<Vec<f32>> {
        match (self, seq) {
            (Scripted::Real(b), ScriptedSeq::Real(q)) => b.forward(q, tokens),
            (Scripted::Script(s), ScriptedSeq::Script(q)) => s.forward(q, tokens),
            _ => bail!("a sequence of the other backend"),
        }
    }

    fn extend(&self, seq: &mut Self::Sequence, tokens: &[u32]) -> Result<()> {
        match (self, seq) {
            (Scripted::Real(b), ScriptedSeq::Real(q)) => b.extend(q, tokens),
            (Scripted::Script(s), ScriptedSeq::Script(q)) => s.extend(q, tokens),
            _ => bail!("a sequence of the other backend"),
        }
    }

    fn snapshot(&self, seq: &Self::Sequence) -> Option<Box<dyn SeqSnapshot>> {
        match (self, seq) {
            (Scripted::Real(b), ScriptedSeq::Real(q)) => b.snapshot(q),
            _ => None,
        }
    }

    fn pass_snapshot_stride(&self) -> Option<usize> {
        match self {
            Scripted::Real(b) => b.pass_snapshot_stride(),
            Scripted::Script(_) => None,
        }
    }

    fn plan(&self, seq: &mut Self::Sequence, tokens: usize) {
        if let (Scripted::Real(b), ScriptedSeq::Real(s)) = (self, seq) {
            b.plan(s, tokens);
        }
    }

    fn restore(&self, snap: &dyn SeqSnapshot) -> Option<Self::Sequence> {
        match self {
            Scripted::Real(b) => b.restore(snap).map(ScriptedSeq::Real),
            Scripted::Script(_) => None,
        }
    }

    fn resumed_in_place(&self, seq: &Self::Sequence) -> bool {
        match (self, seq) {
            (Scripted::Real(b), ScriptedSeq::Real(s)) => b.resumed_in_place(s),
            _ => false,
        }
    }

    fn last_logits(&self, seq: &Self::Sequence) -> Option<Vec<f32>> {
        match (self, seq) {
            (Scripted::Real(b), ScriptedSeq::Real(s)) => b.last_logits(s),
            _ => None,
        }
    }

    fn demote(&self, snap: &dyn SeqSnapshot) -> Option<Box<dyn SeqSnapshot>> {
        match self {
            Scripted::Real(b) => b.demote(snap),
            Scripted::Script(_) => None,
        }
    }

    fn forward_greedy(&self, seq: &mut Self::Sequence, tokens: &[u32]) -> Result<Sampled> {
        match (self, seq) {
            (Scripted::Real(b), ScriptedSeq::Real(q)) => b.forward_greedy(q, tokens),
            (Scripted::Script(s), ScriptedSeq::Script(q)) => s.forward_greedy(q, tokens),
            _ => bail!("a sequence of the other backend"),
        }
    }

    fn forward_top(&self, seq: &mut Self::Sequence, tokens: &[u32], k: usize) -> Result<TopLogits> {
        match (self, seq) {
            (Scripted::Real(b), ScriptedSeq::Real(q)) => b.forward_top(q, tokens, k),
            (Scripted::Script(s), ScriptedSeq::Script(q)) => s.forward_top(q, tokens, k),
            _ => bail!("a sequence of the other backend"),
        }
    }

    fn forward_weighted(
        &self,
        seq: &mut Self::Sequence,
        tokens: &[u32],
        w: Weighting,
        plan: &mut RowPlanner,
    ) -> Result<WeightedRow> {
        match (self, seq) {
            (Scripted::Real(b), ScriptedSeq::Real(q)) => b.forward_weighted(q, tokens, w, plan),
            (Scripted::Script(s), ScriptedSeq::Script(q)) => s.forward_weighted(q, tokens, w, plan),
            _ => bail!("a sequence of the other backend"),
        }
    }

    fn logits_on_device(&self) -> bool {
        match self {
            Scripted::Real(b) => b.logits_on_device(),
            Scripted::Script(s) => s.logits_on_device(),
        }
    }

    fn step(&self, batch: &mut [BatchItem<'_, Self::Sequence>]) -> Vec<Result<StepOut>> {
        match self {
            Scripted::Real(b) => {
                // The inner backend's own (batched) step over the inner sequences.
                let mut inner = Vec::with_capacity(batch.len());
                for item in batch.iter_mut() {
                    let ScriptedSeq::Real(seq) = &mut *item.seq else {
                        unreachable!("a sequence of the other backend")
                    };
                    inner.push(BatchItem {
                        seq,
                        tokens: item.tokens,
                        want: std::mem::replace(&mut item.want, Want::Nothing),
                        mask: item.mask.take(),
                        snapshots: std::mem::take(&mut item.snapshots),
                    });
                }
                let out = b.step(&mut inner);
                let taken: Vec<_> = inner.into_iter().map(|it| it.snapshots).collect();
                for (item, snaps) in batch.iter_mut().zip(taken) {
                    item.snapshots = snaps;
                }
                out
            }
            Scripted::Script(_) => batch.iter_mut().map(|it| step_one(self, it)).collect(),
        }
    }

    fn sequence_bytes(&self, tokens: usize) -> usize {
        match self {
            Scripted::Real(b) => b.sequence_bytes(tokens),
            Scripted::Script(_) => 0,
        }
    }

    fn kv_capacity(&self) -> Option<usize> {
        match self {
            Scripted::Real(b) => b.kv_capacity(),
            Scripted::Script(_) => None,
        }
    }

    fn default_max_num_seqs(&self) -> usize {
        match self {
            Scripted::Real(b) => b.default_max_num_seqs(),
            Scripted::Script(s) => s.default_max_num_seqs(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::{PassSnapshots, step_split_snapshots};
    use crate::cpu::{CpuModel, CpuSequence};

    /// The demo CPU model with in-pass snapshots every 16 tokens.
    struct Strided(CpuModel);

    impl Backend for Strided {
        type Sequence = CpuSequence;
        fn name(&self) -> &'static str {
            "strided"
        }
        fn config(&self) -> &ModelConfig {
            self.0.config()
        }
        fn new_sequence(&self) -> CpuSequence {
            self.0.new_sequence()
        }
        fn position(&self, seq: &CpuSequence) -> usize {
            seq.position()
        }
        fn forward(&self, seq: &mut CpuSequence, tokens: &[u32]) -> Result<Vec<f32>> {
            self.0.forward(seq, tokens)
        }
        fn snapshot(&self, seq: &CpuSequence) -> Option<Box<dyn SeqSnapshot>> {
            self.0.snapshot(seq)
        }
        fn pass_snapshot_stride(&self) -> Option<usize> {
            Some(16)
        }
        fn step(&self, batch: &mut [BatchItem<'_, CpuSequence>]) -> Vec<Result<StepOut>> {
            let rows = batch.iter_mut();
            rows.map(|it| step_split_snapshots(self, it)).collect()
        }
    }

    /// The server wraps its backend: the wrapper must pass the in-pass
    /// snapshots through (the stride, and each row's points and snapshots).
    #[test]
    fn the_real_backend_keeps_its_in_pass_snapshots() {
        let cfg = crate::demo::config();
        let weights = crate::weights::Weights::load(&cfg, &crate::demo::RandomWeights::default());
        let b = Scripted::wrap(Strided(CpuModel::new(cfg, weights.unwrap())), None, None).unwrap();
        assert_eq!(b.pass_snapshot_stride(), Some(16));
        let mut seq = b.new_sequence();
        let tokens: Vec<u32> = (1..=40).collect();
        let mut items = [BatchItem {
            seq: &mut seq,
            tokens: &tokens,
            want: Want::Greedy,
            mask: None,
            snapshots: PassSnapshots {
                at: vec![16, 32],
                taken: Vec::new(),
            },
        }];
        let out = b.step(&mut items);
        assert!(matches!(out[..], [Ok(StepOut::Greedy(_))]));
        let at: Vec<usize> = items[0].snapshots.taken.iter().map(|t| t.0).collect();
        assert_eq!(at, vec![16, 32]);
        assert!(
            items[0]
                .snapshots
                .taken
                .iter()
                .all(|t| t.1.position() == t.0)
        );
    }

    #[test]
    fn forces_each_turn_then_eos() {
        let tok = crate::tokenizer::Tokenizer::qwen36().unwrap();
        let mut config = crate::demo::config();
        config.vocab_size = tok.vocab_size();
        let b = ScriptedBackend::new(config, &tok, &["Hi there".into(), "Bye".into()]).unwrap();
        let argmax = |l: &[f32]| {
            l.iter()
                .enumerate()
                .max_by(|a, b| a.1.total_cmp(b.1))
                .unwrap()
                .0 as u32
        };
        for text in ["Hi there", "Bye"] {
            let mut s = b.new_sequence();
            let mut out = vec![];
            let mut id = argmax(&b.forward(&mut s, &[1, 2, 3]).unwrap());
            while id != b.eos {
                out.push(id);
                id = argmax(&b.forward(&mut s, &[id]).unwrap());
            }
            assert_eq!(tok.decode(&out, false).unwrap(), text);
        }
        assert!(b.forward(&mut b.new_sequence(), &[1]).is_err());
        assert_eq!(
            parse_turns(r#"["a", {"text": "b"}]"#).unwrap(),
            vec!["a".to_string(), "b".to_string()]
        );
    }
}
