//! The whole Qwen3.5/3.6 forward on one GPU: bf16 weights, f32 activations and
//! accumulation, f32 GDN state, f32 (or bf16) KV cache. One sequence per
//! decode step, or a batch of them ([`batch`]).
//!
//! Laid out like `cpu/`: one module per layer kind, each owning its device
//! weights and its prefill and decode launch sequences, and this file only
//! sequencing them ([`GpuModel::walk`], the one loop over the layers that
//! prompts and decode steps share; the interface is in [`pass`]).
//!
//! | module | what it holds |
//! |---|---|
//! | [`gdn`] | Gated DeltaNet layer (the chunked prompt recurrence in [`gdn_prefill`]) |
//! | [`attention`] | gated attention layer ([`attn_prefill`]: tensor-core prompt kernels; [`attn_decode`]: decode kernel choice) |
//! | [`moe`] | MoE layer with the shared expert ([`moe_grouped`]: a prompt's grouped expert GEMMs) |
//! | [`mlp`] | dense SwiGLU MLP layer |
//! | [`embed`] | embedding, final norm, lm_head |
//! | [`ops`] | prefill projections, RMSNorm, residual add, work buffers |
//! | [`decode`] | the decode step's buffers and graph; [`gemv`] its GEMVs |
//! | [`weights`] | upload and seeded generation of the weights |
//! | [`sequence`], [`seq_state`], [`kv_space`] | a sequence's GDN states and KV cache (paged or a slab) |
//! | [`snapshot`] | prefix-cache snapshots, restore, host tier |
//! | [`batch`] | the batched decode step: one token of each of B sequences ([`batch_readout`]: its rows' readouts) |
//! | [`readout`] | what the `Backend` readouts copy back ([`weighted_rows`]: many rows' weighted readouts at once) |
//! | [`probes`] | bandwidth floor, copy bandwidth, memory, profile |
//!
//! Kernel-path switches come from [`crate::gpu::options::GpuOptions`], read
//! once when the model loads.

mod attention;
mod attn_decode;
mod attn_prefill;
pub use attn_prefill::AttnAgreement;
mod batch;
mod batch_readout;
mod decode;
mod embed;
mod fp8;
mod fp8_gemm_run;
mod gdn;
mod gdn_prefill;
mod gemv;
mod kv_space;
mod masks;
mod mlp;
mod moe;
mod moe_grouped;
mod moe_q8;
mod ops;
mod pass;
mod pass_snapshots;
mod probes;
pub use fp8_gemm_run::Fp8GemmRun;
pub use probes::StepBytes;
mod readout;
mod seq_state;
mod sequence;
pub use sequence::GpuSequence;
mod snapshot;
pub use snapshot::{GpuHostSnapshot, GpuSnapshot};
mod weighted_rows;
pub use weighted_rows::{ReadoutCase, ReadoutGot};
mod weights;

use super::HostBuf;
pub use super::options::GemmPath;
use super::options::GpuOptions;
use super::{DBuf, Device, Graph};
use crate::backend::{Backend, BatchItem, SeqSnapshot, StepOut};
use crate::config::{MlpConfig, ModelConfig};
use crate::sampling::{RowPlanner, Sampled, TopLogits, WeightedRow, Weighting};
use anyhow::{Result, bail};
use half::bf16;
use moe_grouped::router_out_of_range;
use ops::Scratch;
use pass::{Norms, Pass, Prefill};
use sequence::SeqLayer;
use std::sync::Mutex;
use weights::CONV_TPT;

/// KV pages the device keeps for reuse, released or still mapped in a
/// dropped sequence's parked space (1 GiB: 512 pages of 2 MB, the turnover
/// of a dozen 1K-token sequences or two 8K ones): memory outside the
/// scheduler's count, taken from the passes' work reserve.
const KEPT_KV_PAGES: usize = 1 << 30;

/// A layer's token mixer.
enum LayerMixer {
    Gdn(gdn::GdnLayer),
    Attn(attention::AttnLayer),
}

/// A layer's feed-forward part.
enum LayerMlp {
    Moe(moe::MoeLayer),
    Dense(mlp::DenseLayer),
}

/// One decoder layer: `x += mixer(norm(x)); x += mlp(norm(x))`.
struct DLayer {
    input_norm: DBuf,
    post_norm: DBuf,
    mixer: LayerMixer,
    mlp: LayerMlp,
}

pub struct GpuModel {
    dev: Device,
    cfg: ModelConfig,
    head: embed::EmbedHead,
    layers: Vec<DLayer>,
    /// bf16 work buffers for block-FP8 matrices read by kernels without an
    /// FP8 path (`fp8.rs`); empty for a bf16 model.
    fp8_work: fp8::Fp8Work,
    scratch: Mutex<Scratch>,
    /// Buffers and graph of the fused decode step (`decode.rs`); `None` until the first step.
    decode: Mutex<Option<decode::DecodeState>>,
    /// The kernel-path switches (docs/GPU.md, "Options").
    opts: GpuOptions,
    /// Decode GEMVs fed by bulk copies (`kernels/gemv_bulk.cu`), where the
    /// GPU has them, unless `QWASI_GEMV=rows|stream`.
    bulk_gemv: Option<gemv::BulkGemv>,
    /// KV capacity limit per sequence (tokens).
    pub max_len: usize,
    /// How multi-token projections run (`QWASI_GEMM`; the tiled kernel on a
    /// HIP runtime without hipBLAS).
    pub gemm: GemmPath,
    /// KV cache in f32 (the default) or bf16 (`QWASI_KV=bf16`).
    pub kv_f32: bool,
    /// Device bytes the running sequences' states may hold together
    /// ([`Backend::kv_capacity`]), measured the first time it is asked.
    state_budget: std::sync::OnceLock<usize>,
}

/// Longest token run one pass handles (longer prompts are split).
const PREFILL_CHUNK: usize = 16_384;

const F: usize = 4; // bytes per f32
const B: usize = 2; // bytes per bf16

fn mlp_dims(cfg: &ModelConfig) -> (usize, usize, usize, usize) {
    match cfg.mlp {
        MlpConfig::Moe {
            num_experts,
            top_k,
            intermediate,
            shared_intermediate,
        } => (num_experts, top_k, intermediate, shared_intermediate),
        MlpConfig::Dense { intermediate } => (0, 0, intermediate, 0),
    }
}

impl GpuModel {
    /// The model over its uploaded weights, with the FP8 work buffers its
    /// paths need (allocated here, once the GEMM path is known).
    fn assemble(
        dev: Device,
        cfg: ModelConfig,
        head: embed::EmbedHead,
        layers: Vec<DLayer>,
        opts: GpuOptions,
    ) -> Result<Self> {
        let gemm = opts.gemm;
        // HIP: without hipBLAS, multi-token projections take the tiled kernel.
        #[cfg(all(feature = "hip", not(feature = "cuda")))]
        let gemm = match dev.blas_error() {
            Some(e) if gemm != GemmPath::Tiled => {
                eprintln!("[hip] {e}: prompts use the tiled GEMM kernel (QWASI_GEMM=tiled)");
                GemmPath::Tiled
            }
            _ => gemm,
        };
        let bulk_gemv = gemv::BulkGemv::new(&dev, &opts);
        if opts.kv_pages {
            // Released KV pages reused instead of created anew (PagePool).
            dev.keep_pages(KEPT_KV_PAGES);
        }
        let mut m = GpuModel {
            max_len: cfg.max_position_embeddings,
            dev,
            cfg,
            head,
            layers,
            fp8_work: fp8::Fp8Work::default(),
            scratch: Mutex::new(Scratch::default()),
            decode: Mutex::new(None),
            bulk_gemv,
            gemm,
            kv_f32: opts.kv_f32,
            opts,
            state_budget: std::sync::OnceLock::new(),
        };
        let top_k = mlp_dims(&m.cfg).1;
        m.fp8_work = fp8::Fp8Work::new(&m.dev, &m.layers, m.fp8_expert_work(), top_k)?;
        m.dev.sync()?;
        Ok(m)
    }

    pub fn device_name(&self) -> &str {
        &self.dev.name
    }

    /// The precision of this model's prompt passes (`--prefill-precision`).
    pub fn prefill_precision(&self) -> super::options::PrefillPrecision {
        self.opts.prefill
    }

    fn lm_head(&self) -> &weights::DevMat {
        self.head.lm_head()
    }

    /// The one walk over the layers: each layer's mixer then its MLP, as a
    /// prompt pass or a decode step (see [`pass`]).
    fn walk(&self, pass: &mut Pass) -> Result<()> {
        // Prompt and batched passes fuse each block's input norm into the
        // residual add before it (`Norms`); the decode step folds norms into
        // its GEMVs instead.
        let fuse = !matches!(pass, Pass::Decode(_));
        let mut ready = false;
        for (li, l) in self.layers.iter().enumerate() {
            let (norm, post) = (&l.input_norm, &l.post_norm);
            let nm = Norms {
                input: norm,
                ready,
                next: fuse.then_some(post),
            };
            match (&l.mixer, &mut *pass) {
                (LayerMixer::Gdn(g), Pass::Prefill(pf)) => g.prefill(self, pf, nm, li)?,
                (LayerMixer::Gdn(g), Pass::Decode(dc)) => g.decode(self, dc, norm, li)?,
                (LayerMixer::Attn(a), Pass::Prefill(pf)) => a.prefill(self, pf, nm, li)?,
                (LayerMixer::Attn(a), Pass::Decode(dc)) => a.decode(self, dc, norm, li)?,
                (LayerMixer::Gdn(g), Pass::Batch(bt)) => g.batch(self, bt, nm, li)?,
                (LayerMixer::Attn(a), Pass::Batch(bt)) => a.batch(self, bt, nm, li)?,
            }
            let next = self.layers.get(li + 1).filter(|_| fuse);
            let nm = Norms {
                input: post,
                ready: fuse,
                next: next.map(|n| &n.input_norm),
            };
            match (&l.mlp, &mut *pass) {
                (LayerMlp::Moe(e), Pass::Prefill(pf)) => e.prefill(self, pf, nm)?,
                (LayerMlp::Moe(e), Pass::Decode(dc)) => e.decode(self, dc, post)?,
                (LayerMlp::Dense(m), Pass::Prefill(pf)) => m.prefill(self, pf, nm)?,
                (LayerMlp::Dense(m), Pass::Decode(dc)) => m.decode(self, dc, post)?,
                (LayerMlp::Moe(e), Pass::Batch(bt)) => e.prefill(self, &mut bt.pf, nm)?,
                (LayerMlp::Dense(m), Pass::Batch(bt)) => m.prefill(self, &mut bt.pf, nm)?,
            }
            ready = next.is_some();
        }
        Ok(())
    }

    /// Runs `tokens` and returns the final-normed hidden state of the last one (device f32 [H]).
    fn run(
        &self,
        seq: &mut GpuSequence,
        tokens: &[u32],
        sc: &mut Scratch,
        captures: &[pass_snapshots::Capture],
    ) -> Result<u64> {
        let d = &self.dev;
        let t = tokens.len();
        let h = self.cfg.hidden_size;
        let pos0 = seq.pos;
        let fast = t > 1 && self.opts.fast_prefill;
        self.init_sequence(seq)?;
        self.reserve(seq, pos0 + t)?;

        let tok = sc.get(d, "tokens", t * 4)?;
        d.htod(tok, tokens)?;
        let x = sc.get(d, "x", t * h * F)?;
        let n = sc.get(d, "n", t * h * F)?;
        let mixed = sc.get(d, "mixed", t * h * F)?;
        self.head.prefill(self, tok, x, t)?;
        let bad_words = sc.get(d, "moe_bad", self.layers.len() * 4)?;
        let mut pf = Prefill {
            sc: &mut *sc,
            states: &seq.layers,
            captures,
            t,
            pos0,
            fast,
            x,
            n,
            mixed,
            bad_words,
            planned: 0,
            experts: 0,
        };
        self.walk(&mut Pass::Prefill(&mut pf))?;
        let (planned, experts) = (pf.planned, pf.experts);
        let nf = self.head.last_norm(self, sc, x, t)?;
        if planned > 0 {
            let mut bad = vec![0i32; planned];
            d.dtoh(&mut bad, bad_words)?;
            if let Some(&b) = bad.iter().find(|&&b| b != 0) {
                return Err(router_out_of_range(b, experts));
            }
        }
        seq.pos += t;
        Ok(nf)
    }

    /// Runs `tokens` (checked) in passes of at most [`PREFILL_CHUNK`]: bounded
    /// work buffers, and every grid's y dimension (tokens) stays under the
    /// 65,535 launch limit. The KV cache is grown for all of them first (a
    /// slab: one allocation instead of a doubling per pass, each of which
    /// would copy the rows so far and hold two slabs at once). Takes the
    /// snapshots a row running alone asked for ([`Scratch::captures`]).
    fn run_passes(&self, seq: &mut GpuSequence, tokens: &[u32], sc: &mut Scratch) -> Result<u64> {
        self.init_sequence(seq)?;
        self.reserve(seq, seq.pos + tokens.len())?;
        let mut asked = sc.captures.take().filter(|c| c.seq == seq.id);
        let end = seq.pos + tokens.len();
        let mut nf = 0;
        for chunk in tokens.chunks(PREFILL_CHUNK) {
            let pos0 = seq.pos;
            let Some(asked) = asked.as_mut() else {
                nf = self.run(seq, chunk, sc, &[])?;
                continue;
            };
            let caps = self.captures(pos0, chunk.len(), &asked.at);
            nf = self.run(seq, chunk, sc, &caps)?;
            let kv = seq
                .kv
                .as_ref()
                .expect("a pass reserves the KV cache")
                .space();
            asked.taken.extend(self.captured(pos0, kv, caps));
            // A point where one pass ends and the next begins.
            if seq.pos < end
                && asked.at.contains(&seq.pos)
                && let Some(snap) = self.snapshot_locked(seq)
            {
                asked.taken.push((seq.pos, snap));
            }
        }
        sc.captures = asked;
        Ok(nf)
    }

    fn check_tokens(&self, seq: &GpuSequence, tokens: &[u32]) -> Result<()> {
        if tokens.is_empty() {
            bail!("forward needs at least one token");
        }
        let c = &self.cfg;
        for &t in tokens {
            if t as usize >= c.vocab_size {
                bail!(
                    "token id {t} is out of range (vocabulary size {})",
                    c.vocab_size
                );
            }
        }
        if seq.pos + tokens.len() > c.max_position_embeddings.min(self.max_len) {
            bail!(
                "sequence of {} tokens exceeds the context limit {}",
                seq.pos + tokens.len(),
                c.max_position_embeddings.min(self.max_len)
            );
        }
        Ok(())
    }
}

impl Backend for GpuModel {
    type Sequence = GpuSequence;

    #[cfg(feature = "cuda")]
    fn name(&self) -> &'static str {
        "cuda"
    }

    #[cfg(all(feature = "hip", not(feature = "cuda")))]
    fn name(&self) -> &'static str {
        "hip"
    }

    fn config(&self) -> &ModelConfig {
        &self.cfg
    }

    fn new_sequence(&self) -> GpuSequence {
        self.empty_sequence()
    }

    fn position(&self, seq: &GpuSequence) -> usize {
        seq.pos
    }

    fn forward(&self, seq: &mut GpuSequence, tokens: &[u32]) -> Result<Vec<f32>> {
        self.read_logits(seq, tokens)
    }

    fn forward_greedy(&self, seq: &mut GpuSequence, tokens: &[u32]) -> Result<Sampled> {
        self.read_greedy(seq, tokens)
    }

    fn forward_top(&self, seq: &mut GpuSequence, tokens: &[u32], k: usize) -> Result<TopLogits> {
        self.read_top(seq, tokens, k)
    }

    fn forward_weighted(
        &self,
        seq: &mut GpuSequence,
        tokens: &[u32],
        w: Weighting,
        plan: &mut RowPlanner,
    ) -> Result<WeightedRow> {
        self.read_weighted(seq, tokens, w, plan)
    }

    fn logits_on_device(&self) -> bool {
        true
    }

    fn last_logits(&self, seq: &GpuSequence) -> Option<Vec<f32>> {
        self.read_last_logits(seq)
    }

    fn extend(&self, seq: &mut GpuSequence, tokens: &[u32]) -> Result<()> {
        if tokens.is_empty() {
            bail!("extend needs at least one token");
        }
        self.check_tokens(seq, tokens)?;
        let mut sc = self.scratch.lock().unwrap();
        self.dev.bind()?;
        self.run_passes(seq, tokens, &mut sc).map(|_| ())
    }

    fn snapshot(&self, seq: &GpuSequence) -> Option<Box<dyn SeqSnapshot>> {
        self.snapshot_seq(seq)
    }

    fn pass_snapshot_stride(&self) -> Option<usize> {
        self.captures_in_pass().then_some(pass_snapshots::STRIDE)
    }

    fn restore(&self, snap: &dyn SeqSnapshot) -> Option<GpuSequence> {
        self.restore_seq(snap)
    }

    fn resumed_in_place(&self, seq: &GpuSequence) -> bool {
        seq.adopted_kv
    }

    fn demote(&self, snap: &dyn SeqSnapshot) -> Option<Box<dyn SeqSnapshot>> {
        self.demote_snapshot(snap)
    }

    fn plan(&self, seq: &mut GpuSequence, tokens: usize) {
        seq.planned = tokens;
    }

    fn step(&self, batch: &mut [BatchItem<'_, GpuSequence>]) -> Vec<Result<StepOut>> {
        self.step_rows(batch)
    }

    fn sequence_bytes(&self, tokens: usize) -> usize {
        self.state_bytes(tokens)
    }

    fn kv_capacity(&self) -> Option<usize> {
        Some(
            *self
                .state_budget
                .get_or_init(|| self.measure_state_budget()),
        )
    }
}

/// Host-side bf16 helper for tests.
pub fn to_bf16(v: &[f32]) -> Vec<bf16> {
    v.iter().map(|&x| bf16::from_f32(x)).collect()
}
