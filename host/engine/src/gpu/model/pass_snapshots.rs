//! Prefix-cache snapshots taken inside a prompt pass (issue 27): the prompt
//! runs as one pass, and at each requested position on the GDN chunk grid
//! the pass copies every GDN layer's conv window and recurrent state into
//! the snapshot's own state allocation while it runs. The chunked delta rule
//! already computes the state at every chunk boundary (`gdn_chunk_state`
//! saves it for the output phase), and the conv window at a position is the
//! three projection rows before it, so a capture costs two small copies per
//! layer. The attention layers' KV rows below the position are written by
//! the same pass into the sequence's KV space, which the snapshot shares
//! ([`super::snapshot`]).

use super::kv_space::KvSpace;
use super::{DBuf, GpuModel, SeqLayer};
use crate::backend::{SeqSnapshot, Taken};
use anyhow::Result;
use std::sync::Arc;

/// Tokens between capture points: the chunked GDN's chunk, the grid on which
/// it has the state.
pub(super) const STRIDE: usize = super::gdn_prefill::CHUNK;

/// One snapshot a pass takes: after its first `off` tokens (a positive
/// multiple of [`STRIDE`] below the pass's length), each GDN layer's state
/// goes into `layers`, the spans of `gdn`.
pub(super) struct Capture {
    pub off: usize,
    pub layers: Vec<SeqLayer>,
    gdn: DBuf,
}

/// Snapshots asked of the next prompt passes of sequence `seq` (set by a row
/// that runs on its own, read by [`GpuModel::run_passes`]), and those taken.
pub(super) struct PassCaptures {
    pub seq: u64,
    pub at: Vec<usize>,
    pub taken: Taken,
}

impl Capture {
    /// Layer `li`'s (conv window, recurrent state) destination, for a GDN layer.
    pub fn gdn(&self, li: usize) -> Option<(u64, u64)> {
        match self.layers.get(li) {
            Some(&SeqLayer::Gdn { conv, s }) => Some((conv.ptr(), s.ptr())),
            _ => None,
        }
    }
}

impl GpuModel {
    /// Whether passes can capture: the chunked GDN runs every prompt pass.
    pub(super) fn captures_in_pass(&self) -> bool {
        self.opts.chunked_gdn && self.chunked_gdn_fits()
    }

    /// The captures a pass of `t` tokens from `pos0` takes for the positions
    /// `at` strictly inside it on the grid, each with its state allocation
    /// (a position whose allocation fails is left out: no snapshot there).
    pub(super) fn captures(&self, pos0: usize, t: usize, at: &[usize]) -> Vec<Capture> {
        if !self.captures_in_pass() {
            return Vec::new();
        }
        at.iter()
            .filter(|&&q| q > pos0 && q < pos0 + t && (q - pos0).is_multiple_of(STRIDE))
            .filter_map(|&q| {
                let gdn = self.dev.alloc(self.gdn_layout().bytes()).ok()?;
                Some(Capture {
                    off: q - pos0,
                    layers: self.seq_layers(gdn.ptr(), None),
                    gdn,
                })
            })
            .collect()
    }

    /// The snapshots of a pass's captures, once the pass has run from `pos0`
    /// over the sequence's KV space `kv`.
    pub(super) fn captured(&self, pos0: usize, kv: &Arc<KvSpace>, caps: Vec<Capture>) -> Taken {
        caps.into_iter()
            .map(|c| {
                let pos = pos0 + c.off;
                let snap: Box<dyn SeqSnapshot> = Box::new(self.device_snapshot(pos, c.gdn, kv));
                (pos, snap)
            })
            .collect()
    }

    /// Runs `f` over the prompt passes of a row that runs on its own, with
    /// the snapshots it asks for (`at`) taken inside them; returns `f`'s
    /// result and the snapshots.
    pub(super) fn with_pass_captures<T>(
        &self,
        seq: u64,
        at: Vec<usize>,
        f: impl FnOnce() -> Result<T>,
    ) -> (Result<T>, Taken) {
        if at.is_empty() {
            return (f(), Vec::new());
        }
        self.scratch.lock().unwrap().captures = Some(PassCaptures {
            seq,
            at,
            taken: Vec::new(),
        });
        let out = f();
        let taken = self.scratch.lock().unwrap().captures.take();
        (out, taken.map(|c| c.taken).unwrap_or_default())
    }
}
