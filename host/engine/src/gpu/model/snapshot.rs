//! Sequence snapshots for the prefix cache: on the device (a copy of the GDN
//! states, the KV space shared), resumed by adopting the space or filling one
//! of its own (full pages shared, the rest copied), and demoted to host
//! memory (page-locked where the driver grants it).

use super::kv_space::KvSpace;
use super::seq_state::KvWriter;
use super::sequence::kv_capacity;
use super::{DBuf, GpuModel, GpuSequence, HostBuf, SeqLayer};
use crate::backend::{Backend, SeqSnapshot};
use crate::config::LayerKind;
use std::sync::Arc;

impl GpuModel {
    /// A device copy of the GDN states (66 MB for the 35B model, one
    /// allocation) and a shared reference to the KV space. `None` when the copy
    /// cannot be allocated.
    pub(super) fn snapshot_seq(&self, seq: &GpuSequence) -> Option<Box<dyn SeqSnapshot>> {
        let _guard = self.scratch.lock().unwrap();
        self.dev.bind().ok()?;
        self.snapshot_locked(seq)
    }

    /// [`GpuModel::snapshot_seq`] where the caller holds the scratch lock.
    pub(super) fn snapshot_locked(&self, seq: &GpuSequence) -> Option<Box<dyn SeqSnapshot>> {
        let (Some(gdn), Some(kv)) = (&seq.gdn, &seq.kv) else {
            return None; // nothing run yet
        };
        let copy = self.dev.alloc(gdn.bytes()).ok()?;
        self.dev.dtod(copy.ptr(), gdn.ptr(), gdn.bytes()).ok()?;
        Some(Box::new(self.device_snapshot(seq.pos, copy, kv.space())))
    }

    /// The snapshot at `pos` made of the GDN state allocation `gdn` (its own)
    /// and the KV space `kv`, whose rows below `pos` no one writes from now on.
    pub(super) fn device_snapshot(&self, pos: usize, gdn: DBuf, kv: &Arc<KvSpace>) -> GpuSnapshot {
        kv.ownership().seal(pos);
        GpuSnapshot {
            pos,
            kv_f32: self.kv_f32,
            layers: self.seq_layers(gdn.ptr(), Some(kv)),
            gdn,
            kv: kv.clone(),
        }
    }

    /// From a device snapshot: a copy of its GDN states, and its KV space
    /// itself when no one else can see what the sequence appends
    /// ([`super::seq_state::KvOwnership`]), otherwise a space of its own with
    /// the snapshot's rows (full pages shared, [`KvSpace::fill_from`]). From
    /// its host copy ([`Backend::demote`]): uploads. A new space is planned
    /// with room for the turn that follows, so resuming does not begin by
    /// growing the KV cache.
    pub(super) fn restore_seq(&self, snap: &dyn SeqSnapshot) -> Option<GpuSequence> {
        let any = snap.as_any();
        let (device, host) = (
            any.downcast_ref::<GpuSnapshot>(),
            any.downcast_ref::<GpuHostSnapshot>(),
        );
        // Only a snapshot of this model's geometry and KV precision.
        let attn = self.count_layers(LayerKind::Full);
        let (pos, kv_f32, gdn_bytes, same_kv) = match (device, host) {
            (Some(s), _) => (
                s.pos,
                s.kv_f32,
                s.gdn.bytes(),
                s.layers.len() == self.cfg.num_layers(),
            ),
            (_, Some(h)) => {
                let rows = h.pos * self.kv_row_bytes();
                let rows_ok = h.kv.iter().all(|(k, v)| k.len() == rows && v.len() == rows);
                (h.pos, h.kv_f32, h.gdn.len(), h.kv.len() == attn && rows_ok)
            }
            _ => return None,
        };
        let layout = self.gdn_layout();
        if kv_f32 != self.kv_f32 || gdn_bytes != layout.bytes() || !same_kv {
            return None;
        }
        let _guard = self.scratch.lock().unwrap();
        self.dev.bind().ok()?;
        let d = &self.dev;
        let gdn = d.alloc(layout.bytes()).ok()?;
        // Its layers' spans come with its KV space (set_kv below).
        let mut seq = GpuSequence {
            gdn: Some(gdn),
            pos,
            ..self.new_sequence()
        };
        let gdn = seq.gdn.as_ref()?.ptr();
        if let Some(s) = device {
            d.dtod(gdn, s.gdn.ptr(), layout.bytes()).ok()?;
            if let Some(kv) = KvWriter::adopt(&s.kv, pos) {
                let cap = if kv.space().is_paged() {
                    kv_capacity(pos, 0, self.max_len)
                } else {
                    kv.space().rows()
                };
                self.set_kv(&mut seq, kv, cap);
                seq.adopted_kv = true;
            } else {
                let cap = kv_capacity(pos, 0, self.max_len);
                let space = self.new_kv(cap, pos).ok()?;
                space.fill_from(d, &s.kv, pos, pos).ok()?;
                self.set_kv(&mut seq, KvWriter::fresh(space), cap);
            }
        } else if let Some(h) = host {
            d.htod(gdn, &h.gdn[..]).ok()?;
            let cap = kv_capacity(pos, 0, self.max_len);
            let space = self.new_kv(cap, pos).ok()?;
            space.grow(d, pos).ok()?.then_some(())?;
            self.set_kv(&mut seq, KvWriter::fresh(space), cap);
            let attn = seq.layers.iter().filter_map(|l| match l {
                SeqLayer::Attn { k, v } => Some((k, v)),
                SeqLayer::Gdn { .. } => None,
            });
            for ((k, v), (hk, hv)) in attn.zip(&h.kv) {
                d.htod(k.ptr(), &hk[..]).ok()?;
                d.htod(v.ptr(), &hv[..]).ok()?;
            }
        }
        Some(seq)
    }

    /// Every GDN layer's (conv window, recurrent state) of a device
    /// snapshot, downloaded (`qwasi verify` compares them).
    pub fn snapshot_gdn(&self, snap: &dyn SeqSnapshot) -> Option<Vec<(Vec<f32>, Vec<f32>)>> {
        let snap = snap.as_any().downcast_ref::<GpuSnapshot>()?;
        let layout = self.gdn_layout();
        let _guard = self.scratch.lock().unwrap();
        self.dev.bind().ok()?;
        let mut out = Vec::new();
        for l in &snap.layers {
            if let SeqLayer::Gdn { conv, s } = l {
                let mut c = vec![0f32; layout.conv_bytes / 4];
                let mut st = vec![0f32; layout.state_bytes / 4];
                self.dev.dtoh(&mut c, conv.ptr()).ok()?;
                self.dev.dtoh(&mut st, s.ptr()).ok()?;
                out.push((c, st));
            }
        }
        Some(out)
    }

    /// A host-memory copy of a device snapshot: the GDN states and the KV
    /// rows it covers (not the space's spare capacity).
    pub(super) fn demote_snapshot(&self, snap: &dyn SeqSnapshot) -> Option<Box<dyn SeqSnapshot>> {
        let snap = snap.as_any().downcast_ref::<GpuSnapshot>()?;
        let _guard = self.scratch.lock().unwrap();
        self.dev.bind().ok()?;
        let rows = snap.pos * self.kv_row_bytes();
        let copy = |ptr: u64, bytes: usize| -> Option<HostBytes> {
            if self.opts.pinned_host_tier
                && let Ok(b) = self.dev.download_pinned(ptr, bytes)
            {
                return Some(HostBytes::Pinned(b));
            }
            let mut v = vec![0u8; bytes];
            self.dev.dtoh(&mut v, ptr).ok()?;
            Some(HostBytes::Pageable(v))
        };
        let gdn = copy(snap.gdn.ptr(), snap.gdn.bytes())?;
        let mut kv = Vec::new();
        for l in &snap.layers {
            if let SeqLayer::Attn { k, v } = l {
                kv.push((copy(k.ptr(), rows)?, copy(v.ptr(), rows)?));
            }
        }
        let bytes = gdn.len() + kv.iter().map(|(k, v)| k.len() + v.len()).sum::<usize>();
        Some(Box::new(GpuHostSnapshot {
            pos: snap.pos,
            kv_f32: snap.kv_f32,
            gdn,
            kv,
            bytes,
        }))
    }
}

/// Host memory of a demoted snapshot: page-locked where the driver grants
/// it, so restoring uploads at the link's speed (pageable uploads are
/// staged by the driver, about 7 GB/s on the H200 host); ordinary memory
/// otherwise, or with `QWASI_HOST_TIER=pageable`.
enum HostBytes {
    Pinned(HostBuf),
    Pageable(Vec<u8>),
}

impl std::ops::Deref for HostBytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            HostBytes::Pinned(b) => b,
            HostBytes::Pageable(v) => v,
        }
    }
}

/// A snapshot moved to host memory by the prefix cache's host tier; owns
/// all its bytes: the GDN state allocation as it was on the device, and per
/// attention layer its K and V rows `[0, pos)`.
pub struct GpuHostSnapshot {
    pos: usize,
    kv_f32: bool,
    gdn: HostBytes,
    kv: Vec<(HostBytes, HostBytes)>,
    bytes: usize,
}

impl SeqSnapshot for GpuHostSnapshot {
    fn position(&self) -> usize {
        self.pos
    }
    fn private_bytes(&self) -> usize {
        self.bytes
    }
    fn pages(&self) -> Vec<(u64, usize)> {
        Vec::new()
    }
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

/// A sequence at one position: a device copy of its GDN states and a shared
/// reference to its KV space (whose rows `[0, pos)` no one writes again).
pub struct GpuSnapshot {
    pos: usize,
    kv_f32: bool,
    /// Spans of `gdn` and `kv`, per layer.
    layers: Vec<SeqLayer>,
    gdn: DBuf,
    kv: Arc<KvSpace>,
}

impl SeqSnapshot for GpuSnapshot {
    fn position(&self) -> usize {
        self.pos
    }
    fn private_bytes(&self) -> usize {
        self.gdn.bytes()
    }
    /// The KV pages holding its rows (a slab: the whole slab, by address),
    /// each unique while alive, so the prefix cache counts a page shared by
    /// several snapshots once.
    fn pages(&self) -> Vec<(u64, usize)> {
        self.kv.pages(self.pos)
    }
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}
