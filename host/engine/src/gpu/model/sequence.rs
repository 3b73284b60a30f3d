//! A sequence on the device: where each layer's state is (spans of one GDN
//! state allocation and of a KV space, [`super::seq_state`]), and how the KV
//! cache grows.

use super::kv_space::{KvSpace, paged_bytes, slab_bytes};
use super::seq_state::{GdnLayout, KvWriter, Span};
use super::{B, DBuf, F, GpuModel};
use crate::config::LayerKind;
use anyhow::{Context, Result, bail};

/// A sequence's device state: the GDN layers' conv windows and f32 states in
/// one allocation, the attention layers' KV caches in one space grown on
/// demand up to `max_len` and shared with the sequence's snapshots
/// ([`super::seq_state`], [`super::kv_space`]).
pub struct GpuSequence {
    /// Unique per sequence: a captured decode graph is valid for one sequence's buffers.
    pub(super) id: u64,
    pub(super) pos: usize,
    /// Per layer, where its state is (empty before the first pass).
    pub(super) layers: Vec<SeqLayer>,
    pub(super) gdn: Option<DBuf>,
    pub(super) kv: Option<KvWriter>,
    /// The KV capacity the decode step plans for ([`kv_capacity`]'s
    /// schedule; a slab's rows): its key splits follow it, and a captured
    /// graph is kept while it stays. Paged spaces hold pages for the rows
    /// written, not for this.
    pub(super) kv_cap: usize,
    /// Resumed from a snapshot by adopting its KV space (no copy).
    pub(super) adopted_kv: bool,
    /// The context it was admitted to read
    /// ([`crate::backend::Backend::plan`]): its KV space is sized for it at
    /// the first pass, not grown (a slab copied, a parked space's pages
    /// unmapped and mapped again) as a chunked prompt comes.
    pub(super) planned: usize,
}

impl GpuSequence {
    /// KV rows per layer the decode step plans for (0 before the first pass).
    pub(super) fn cap(&self) -> usize {
        self.kv_cap
    }
}

/// One layer's state: spans of the sequence's (or snapshot's) GDN allocation
/// and KV space.
#[derive(Clone, Copy)]
pub(super) enum SeqLayer {
    Gdn {
        conv: Span,
        s: Span,
    },
    /// Rows `[0, pos)` of a KV cache are never written again once a snapshot
    /// holds them (the cache only appends).
    Attn {
        k: Span,
        v: Span,
    },
}

/// KV rows to plan for `need` tokens when `cur` are planned: room for what
/// usually follows (the next prompt pass, the reply; also more key splits for
/// decode attention, whose count follows the capacity), at least doubling, at
/// most `max_len` (unless `need` is more: the caller refuses it). A slab
/// allocates all of it; a paged space only the pages its rows fill.
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
            kv_cap: 0,
            adopted_kv: false,
            planned: 0,
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
        seq.kv_cap = 0;
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

    /// Every layer's spans in a GDN state allocation at `gdn` and a KV space
    /// (null spans without one: a sequence before its first [`Self::reserve`]).
    pub(super) fn seq_layers(&self, gdn: u64, kv: Option<&KvSpace>) -> Vec<SeqLayer> {
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
    /// the KV pages its rows fill, or the slab [`GpuModel::reserve`] grows to
    /// for that many.
    pub(super) fn state_bytes(&self, tokens: usize) -> usize {
        let (buffers, row) = (self.kv_buffers(), self.kv_row_bytes());
        let kv = match self.kv_page_size() {
            Some(page) => paged_bytes(buffers, tokens.max(1), row, page),
            None => slab_bytes(buffers, kv_capacity(tokens.max(1), 0, self.max_len), row),
        };
        self.gdn_layout().bytes() + kv
    }

    /// The sequences' share of the device memory the weights leave free:
    /// three quarters of what is left past [`WORK_RESERVE`] (the prefix
    /// cache's default budget is the other quarter, `qwasi serve`).
    pub(super) fn measure_state_budget(&self) -> usize {
        self.free_past_work_reserve() / 4 * 3
    }

    /// Device memory free now, less [`WORK_RESERVE`]: what the sequences
    /// and the prefix cache may share.
    pub fn free_past_work_reserve(&self) -> usize {
        let (used, total) = self.memory_used();
        total.saturating_sub(used).saturating_sub(WORK_RESERVE)
    }

    /// K and V of every attention layer: the KV space's buffers.
    fn kv_buffers(&self) -> usize {
        2 * self.count_layers(LayerKind::Full)
    }

    /// The page size of paged KV spaces, where they are in use.
    pub(super) fn kv_page_size(&self) -> Option<usize> {
        self.opts.kv_pages.then(|| self.dev.page_size()).flatten()
    }

    /// An empty KV space planned for `cap` rows, about to hold `rows`:
    /// paged (addresses for `max_len` rows, or `cap` if more; pages mapped
    /// by [`KvSpace::grow`], or still mapped in a parked space's addresses)
    /// where the device maps pages, otherwise a slab of `cap` rows.
    pub(super) fn new_kv(&self, cap: usize, rows: usize) -> Result<KvSpace> {
        let (buffers, row) = (self.kv_buffers(), self.kv_row_bytes());
        if self.kv_page_size().is_some()
            && let Some(space) =
                KvSpace::paged(&self.dev, buffers, self.max_len.max(cap), row, rows)
        {
            return space;
        }
        let buf = self.dev.alloc(slab_bytes(buffers, cap, row))?;
        Ok(KvSpace::slab(buf, buffers, cap, row))
    }

    /// Points the sequence at `kv` (its attention layers' spans), planned for
    /// `cap` rows.
    pub(super) fn set_kv(&self, seq: &mut GpuSequence, kv: KvWriter, cap: usize) {
        let gdn = seq.gdn.as_ref().map_or(0, DBuf::ptr);
        seq.layers = self.seq_layers(gdn, Some(kv.space()));
        seq.kv = Some(kv);
        seq.kv_cap = cap;
    }

    /// Makes room for `need` tokens (or the planned context, if more) in the
    /// sequence's KV cache: pages mapped in place (paged), or a larger slab
    /// with the rows so far copied (snapshots keep the old one).
    pub(super) fn reserve(&self, seq: &mut GpuSequence, need: usize) -> Result<()> {
        let need = need.max(seq.planned.min(self.max_len));
        let cap = if need > seq.kv_cap {
            kv_capacity(need, seq.kv_cap, self.max_len)
        } else {
            seq.kv_cap
        };
        if let Some(kv) = &seq.kv
            && kv
                .space()
                .grow(&self.dev, need)
                .context("growing the KV cache")?
        {
            seq.kv_cap = cap;
            return Ok(());
        }
        let space = self.new_kv(cap, need).context("growing the KV cache")?;
        match &seq.kv {
            Some(old) => space.fill_from(&self.dev, old.space(), seq.pos, need)?,
            None => {
                if !space
                    .grow(&self.dev, need)
                    .context("growing the KV cache")?
                {
                    bail!("a new KV cache cannot hold {need} tokens");
                }
            }
        }
        // The old space (freed here unless a snapshot holds it) after the copies.
        self.set_kv(seq, KvWriter::fresh(space), cap);
        Ok(())
    }
}

/// Device memory kept out of the sequences' and the prefix cache's budgets:
/// the work buffers of a [`super::PREFILL_CHUNK`]-token pass (about 7.6 GB
/// for the 35B geometry: the speed bench's device peak at a 32K-token prompt,
/// `benchmarks/speed-h200-a7b33d3.json`, less the weights and the prompt's
/// KV), the up to 1 GiB of KV pages kept for reuse, and the decode steps'
/// buffers and graphs.
const WORK_RESERVE: usize = 9 << 30;

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
