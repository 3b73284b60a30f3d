//! A sequence on the device: where each layer's state is (spans of one GDN
//! state allocation and of a KV slab, [`super::seq_state`]), and how the KV
//! slab grows.

use super::seq_state::{GdnLayout, KvSlab, KvWriter, Span};
use super::{B, DBuf, F, GpuModel};
use crate::config::LayerKind;
use anyhow::{Context, Result};

/// A sequence's device state: the GDN layers' conv windows and f32 states in
/// one allocation, the attention layers' KV caches in one slab grown on demand
/// (doubling) up to `max_len` and shared with the sequence's snapshots
/// ([`super::seq_state`]).
pub struct GpuSequence {
    /// Unique per sequence: a captured decode graph is valid for one sequence's buffers.
    pub(super) id: u64,
    pub(super) pos: usize,
    /// Per layer, where its state is (empty before the first pass).
    pub(super) layers: Vec<SeqLayer>,
    pub(super) gdn: Option<DBuf>,
    pub(super) kv: Option<KvWriter>,
    /// Resumed from a snapshot by adopting its KV slab (no copy).
    pub(super) adopted_kv: bool,
}

impl GpuSequence {
    /// KV rows per layer: the slab's capacity (0 before the first pass).
    pub(super) fn cap(&self) -> usize {
        self.kv.as_ref().map_or(0, |kv| kv.slab().cap())
    }
}

/// One layer's state: spans of the sequence's (or snapshot's) GDN allocation
/// and KV slab.
#[derive(Clone, Copy)]
pub(super) enum SeqLayer {
    Gdn {
        conv: Span,
        s: Span,
    },
    /// Rows `[0, pos)` of a KV slab are never written again once a snapshot
    /// holds them (the cache only appends).
    Attn {
        k: Span,
        v: Span,
    },
}

/// KV rows to allocate for `need` tokens when `cur` are allocated: room for
/// what usually follows (the next prompt pass, the reply; also more key
/// splits for decode attention, whose count follows the capacity), at least
/// doubling, at most `max_len` (unless `need` is more: the caller refuses it).
pub(super) fn kv_capacity(need: usize, cur: usize, max_len: usize) -> usize {
    (need + 4096.max(need / 8))
        .max(cur * 2)
        .min(max_len.max(need))
}

fn next_sequence_id() -> u64 {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

impl GpuModel {
    /// A sequence before its first pass (no state allocated yet).
    pub(super) fn empty_sequence(&self) -> GpuSequence {
        GpuSequence {
            id: next_sequence_id(),
            pos: 0,
            layers: Vec::new(),
            gdn: None,
            kv: None,
            adopted_kv: false,
        }
    }

    pub(super) fn init_sequence(&self, seq: &mut GpuSequence) -> Result<()> {
        if !seq.layers.is_empty() {
            return Ok(());
        }
        let gdn = self.dev.alloc_zeroed(self.gdn_layout().bytes())?;
        seq.layers = self.seq_layers(gdn.ptr(), None);
        seq.gdn = Some(gdn);
        seq.kv = None;
        Ok(())
    }

    /// Where the GDN states sit in a sequence's (or snapshot's) state allocation.
    pub(super) fn gdn_layout(&self) -> GdnLayout {
        let c = &self.cfg;
        GdnLayout {
            conv_bytes: c.linear_conv_dim() * (c.linear_conv_kernel - 1) * F,
            state_bytes: c.linear_num_value_heads
                * c.linear_key_head_dim
                * c.linear_value_head_dim
                * F,
            layers: self.count_layers(LayerKind::Linear),
        }
    }

    pub(super) fn count_layers(&self, kind: LayerKind) -> usize {
        self.cfg.layer_kinds.iter().filter(|&&k| k == kind).count()
    }

    /// Every layer's spans in a GDN state allocation at `gdn` and a KV slab
    /// (null spans without one: a sequence before its first [`Self::reserve`]).
    pub(super) fn seq_layers(&self, gdn: u64, kv: Option<&KvSlab>) -> Vec<SeqLayer> {
        let layout = self.gdn_layout();
        let (mut li, mut ai) = (0, 0);
        let null = Span::default();
        self.cfg
            .layer_kinds
            .iter()
            .map(|kind| match kind {
                LayerKind::Linear => {
                    let (conv, s) = layout.spans(gdn, li);
                    li += 1;
                    SeqLayer::Gdn { conv, s }
                }
                LayerKind::Full => {
                    let (k, v) = kv.map_or((null, null), |kv| kv.spans(ai));
                    ai += 1;
                    SeqLayer::Attn { k, v }
                }
            })
            .collect()
    }

    pub(super) fn kv_row_bytes(&self) -> usize {
        self.cfg.num_key_value_heads * self.cfg.head_dim * if self.kv_f32 { F } else { B }
    }

    /// Device bytes a sequence of `tokens` tokens holds: its GDN states and
    /// the KV slab [`GpuModel::reserve`] grows to for that many.
    pub(super) fn state_bytes(&self, tokens: usize) -> usize {
        let cap = kv_capacity(tokens.max(1), 0, self.max_len);
        self.gdn_layout().bytes()
            + KvSlab::bytes_for(self.count_layers(LayerKind::Full), cap, self.kv_row_bytes())
    }

    /// The sequences' share of the device memory the weights leave free:
    /// three quarters (the prefix cache's default budget is the other
    /// quarter, `qwasi serve`) less [`WORK_RESERVE`] for the passes' work
    /// buffers, the decode step's buffers and graphs.
    pub(super) fn measure_state_budget(&self) -> usize {
        let (used, total) = self.memory_used();
        (total.saturating_sub(used) / 4 * 3).saturating_sub(WORK_RESERVE)
    }

    /// A KV slab of `cap` rows per attention layer, written by its allocator.
    pub(super) fn alloc_kv(&self, cap: usize) -> Result<KvSlab> {
        let row = self.kv_row_bytes();
        let bytes = KvSlab::bytes_for(self.count_layers(LayerKind::Full), cap, row);
        Ok(KvSlab::new(self.dev.alloc(bytes)?, cap, row))
    }

    /// Points the sequence at `kv` (its attention layers' spans).
    pub(super) fn set_kv(&self, seq: &mut GpuSequence, kv: KvWriter) {
        let gdn = seq.gdn.as_ref().map_or(0, DBuf::ptr);
        seq.layers = self.seq_layers(gdn, Some(kv.slab()));
        seq.kv = Some(kv);
    }

    /// Copies rows `[0, rows)` of every attention layer's K and V from the
    /// spans of `from` to those of `to` (both in layer order).
    pub(super) fn copy_kv_rows(
        &self,
        to: &[SeqLayer],
        from: &[SeqLayer],
        rows: usize,
    ) -> Result<()> {
        let bytes = rows * self.kv_row_bytes();
        for (t, f) in to.iter().zip(from) {
            if let (SeqLayer::Attn { k, v }, SeqLayer::Attn { k: fk, v: fv }) = (t, f) {
                self.dev.dtod(k.ptr(), fk.ptr(), bytes)?;
                self.dev.dtod(v.ptr(), fv.ptr(), bytes)?;
            }
        }
        Ok(())
    }

    /// Grows the sequence's KV slab to hold `need` tokens (a new slab, the
    /// rows so far copied; snapshots keep the old one).
    pub(super) fn reserve(&self, seq: &mut GpuSequence, need: usize) -> Result<()> {
        if need <= seq.cap() {
            return Ok(());
        }
        let cap = kv_capacity(need, seq.cap(), self.max_len);
        let slab = self.alloc_kv(cap).context("growing the KV cache")?;
        let (old, old_kv) = (seq.layers.clone(), seq.kv.take());
        self.set_kv(seq, KvWriter::fresh(slab));
        if seq.pos > 0 {
            self.copy_kv_rows(&seq.layers, &old, seq.pos)?;
        }
        // The old slab (freed here unless a snapshot holds it) after the copies.
        drop(old_kv);
        Ok(())
    }
}

/// Device memory kept out of the sequences' budget for work buffers (a
/// 16K-token prefill pass of the 35B geometry takes about 10 GB).
const WORK_RESERVE: usize = 12 << 30;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kv_capacity_leaves_room_doubles_and_stops_at_the_limit() {
        // A fresh 512-token prompt: 4,096 rows of room.
        assert_eq!(kv_capacity(512, 0, 262_144), 4608);
        // Growing: at least double what is there.
        assert_eq!(kv_capacity(4609, 4608, 262_144), 9216);
        // Long prompts: an eighth more.
        assert_eq!(kv_capacity(131_072, 0, 262_144), 147_456);
        // Never past the limit, unless the need itself is.
        assert_eq!(kv_capacity(260_000, 160_000, 262_144), 262_144);
        assert_eq!(kv_capacity(300_000, 0, 262_144), 300_000);
    }
}
