//! Where a sequence's device state lives: all GDN states in one allocation
//! (one cuMemAlloc and one copy per snapshot or restore instead of two per
//! layer: about 30 µs each), and all attention layers' K and V buffers in one
//! KV space ([`KvSpace`]) shared with the sequence's snapshots.
//!
//! A KV space's rows `[0, pos)` are never written again once a snapshot at
//! `pos` holds them, so snapshots share the space instead of copying it. A
//! sequence resumed from a snapshot adopts the space itself, appending in
//! place, when nothing else can see the rows it will write: no live sequence
//! writes the space and no snapshot reads past `pos` ([`KvOwnership`]). That
//! is the next turn of a conversation, resumed from the end of the previous
//! one; it saves every KV row's copy (5.4 GB at 131K tokens with the f32
//! cache). Otherwise it fills a space of its own: the snapshot's full pages
//! mapped, the rest copied ([`KvSpace::fill_from`]).

use super::kv_space::KvSpace;
use crate::gpu::Vendor;
use crate::gpu::device::RawDevice;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

/// Device allocations are aligned at least this much; GDN spans too.
const ALIGN: usize = 256;

fn aligned(bytes: usize) -> usize {
    bytes.next_multiple_of(ALIGN)
}

/// The start of a part of a device allocation owned elsewhere (the GDN
/// state allocation or a KV space).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct Span {
    ptr: u64,
}

impl Span {
    pub fn at(ptr: u64) -> Self {
        Span { ptr }
    }
    pub fn ptr(&self) -> u64 {
        self.ptr
    }
}

/// Byte layout of the GDN states of all linear-attention layers in one
/// allocation: per layer its conv window, then its recurrent state.
#[derive(Clone, Copy, Debug)]
pub(super) struct GdnLayout {
    pub conv_bytes: usize,
    pub state_bytes: usize,
    pub layers: usize,
}

impl GdnLayout {
    fn stride(&self) -> usize {
        aligned(self.conv_bytes) + aligned(self.state_bytes)
    }
    /// Bytes of the whole allocation.
    pub fn bytes(&self) -> usize {
        self.stride() * self.layers
    }
    /// Linear layer `i`'s (conv window, recurrent state) in the allocation at `base`.
    pub fn spans(&self, base: u64, i: usize) -> (Span, Span) {
        debug_assert!(i < self.layers);
        let at = base + (i * self.stride()) as u64;
        (
            Span { ptr: at },
            Span {
                ptr: at + aligned(self.conv_bytes) as u64,
            },
        )
    }
}

/// Who may append to a KV space. Rows below `sealed` are read by a snapshot
/// (the deepest one ever taken of the space: the mark never goes down, so an
/// evicted snapshot only makes adoption rarer); at most one live sequence,
/// the writer, appends past them.
#[derive(Debug)]
pub(super) struct KvOwnership {
    sealed: AtomicUsize,
    writer: AtomicBool,
}

impl KvOwnership {
    /// A new space, written by the sequence that made it.
    pub fn written() -> Self {
        KvOwnership {
            sealed: AtomicUsize::new(0),
            writer: AtomicBool::new(true),
        }
    }

    /// The deepest snapshot's position: rows below it are read by one.
    pub fn sealed(&self) -> usize {
        self.sealed.load(Ordering::Acquire)
    }

    /// A snapshot at `pos` reads rows `[0, pos)` from now on (called by the
    /// writer, the only one that can raise the mark).
    pub fn seal(&self, pos: usize) {
        self.sealed.fetch_max(pos, Ordering::AcqRel);
    }

    /// Makes the caller the writer of a sequence resuming at `pos`: only when
    /// no live sequence writes the space and no snapshot reads past `pos`.
    pub fn try_adopt(&self, pos: usize) -> bool {
        if self
            .writer
            .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
            .is_err()
        {
            return false;
        }
        // Holding the writer role, no one else can raise the mark.
        if self.sealed.load(Ordering::Acquire) > pos {
            self.release();
            return false;
        }
        true
    }

    /// The writer is gone (its sequence dropped, moved into another space, or
    /// it refused adoption).
    pub fn release(&self) {
        self.writer.store(false, Ordering::Release);
    }
}

/// A live sequence's hold on the KV space it appends to; gives the writer
/// role up when dropped, and with it the pages past the deepest snapshot's
/// rows (no one reads them any more).
pub(super) struct KvWriter<R: RawDevice = Vendor>(Arc<KvSpace<R>>);

impl<R: RawDevice> KvWriter<R> {
    /// The writer of a space it just made.
    pub fn fresh(space: KvSpace<R>) -> Self {
        KvWriter(Arc::new(space))
    }

    /// The writer of a snapshot's space, resuming at `pos`, if it may append in place.
    pub fn adopt(space: &Arc<KvSpace<R>>, pos: usize) -> Option<Self> {
        space
            .ownership()
            .try_adopt(pos)
            .then(|| KvWriter(space.clone()))
    }

    pub fn space(&self) -> &Arc<KvSpace<R>> {
        &self.0
    }
}

impl<R: RawDevice> Drop for KvWriter<R> {
    fn drop(&mut self) {
        if Arc::strong_count(&self.0) > 1 {
            // Still the writer: the mark cannot move under us.
            self.0.trim(self.0.ownership().sealed());
        }
        self.0.ownership().release();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gdn_spans_are_aligned_and_disjoint() {
        let l = GdnLayout {
            conv_bytes: 3 * 8192 * 4 + 4,
            state_bytes: 32 * 128 * 128 * 4,
            layers: 30,
        };
        let mut end = 0u64;
        for i in 0..l.layers {
            let (c, s) = l.spans(4096, i);
            assert_eq!(c.ptr() % ALIGN as u64, 0);
            assert_eq!(s.ptr() % ALIGN as u64, 0);
            assert!(c.ptr() >= end && c.ptr() + l.conv_bytes as u64 <= s.ptr());
            end = s.ptr() + l.state_bytes as u64;
        }
        assert!(end <= 4096 + l.bytes() as u64);
    }

    #[test]
    fn the_writer_keeps_the_space_until_it_lets_go() {
        let o = KvOwnership::written();
        o.seal(100);
        // The sequence that took the snapshot still appends: no adoption.
        assert!(!o.try_adopt(100));
        o.release();
        assert!(o.try_adopt(100));
        // One adopter at a time: a second request resuming there copies.
        assert!(!o.try_adopt(100));
        o.release();
        assert!(o.try_adopt(100));
    }

    #[test]
    fn a_deeper_snapshot_blocks_adoption_for_good() {
        let o = KvOwnership::written();
        o.seal(100);
        o.seal(164); // the same conversation's next snapshot
        o.seal(120); // the mark never goes down
        o.release();
        // Resuming at 100 would overwrite rows [100, 164) the snapshot at 164 reads.
        assert!(!o.try_adopt(100));
        // The refusal gave the writer role back.
        assert!(o.try_adopt(164));
        o.seal(200); // the adopter's own snapshot, further on
        o.release();
        assert!(!o.try_adopt(164));
        assert!(o.try_adopt(200));
    }

    #[test]
    fn racing_restores_adopt_at_most_once() {
        let o = Arc::new(KvOwnership::written());
        o.seal(64);
        o.release();
        let wins: usize = (0..8)
            .map(|_| {
                let o = o.clone();
                std::thread::spawn(move || o.try_adopt(64) as usize)
            })
            .collect::<Vec<_>>()
            .into_iter()
            .map(|h| h.join().unwrap())
            .sum();
        assert_eq!(wins, 1);
    }
}
