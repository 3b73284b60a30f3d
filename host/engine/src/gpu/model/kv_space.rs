//! A sequence's KV cache on the device: K and V of every attention layer,
//! buffer `b` (layer j's K at `2j`, its V at `2j + 1`) of `[rows][nkv][head_dim]`,
//! each at an address that never moves.
//!
//! Paged where the device maps physical pages into reserved addresses (CUDA's
//! virtual memory management): every buffer has addresses reserved for the
//! whole context and pages (2 MB on the H200: 1,024 f32 rows of the 35B
//! model's attention) are mapped as its rows fill. The GPU's page tables are
//! the sequence's block table, so the attention kernels read one contiguous
//! buffer and need no indirection. What paging buys: a sequence holds the
//! pages its tokens fill, not a slab with room for what may follow; growing
//! never copies or moves the rows (a captured decode graph stays valid); and
//! a sequence resumed from a snapshot it cannot append to in place maps the
//! snapshot's full pages into its own addresses and copies only the last,
//! partly filled page of each buffer (copy-on-write at page granularity).
//!
//! Elsewhere (a driver without it) one slab of `cap` rows per buffer, grown
//! by copying into a larger one and copied whole when a snapshot is resumed.

use super::seq_state::{KvOwnership, Span};
use crate::gpu::Vendor;
use crate::gpu::device::pages::MappedRange;
use crate::gpu::device::{DBuf, Device, RawDevice};
use anyhow::{Result, bail};
use std::sync::Mutex;

/// Rows mapped past those a pass needs: room for a kernel's masked reads of
/// a tile that straddles the last row (their loads are predicated, so this
/// is a margin, not a requirement).
const SLACK_ROWS: usize = 64;

/// Device allocations are aligned at least this much; buffers inside a slab too.
const ALIGN: usize = 256;

pub(super) struct KvSpace<R: RawDevice = Vendor> {
    store: Store<R>,
    buffers: usize,
    row_bytes: usize,
    own: KvOwnership,
}

enum Store<R: RawDevice> {
    /// One allocation, `stride` bytes per buffer, `cap` rows each.
    Slab {
        buf: DBuf<R>,
        cap: usize,
        stride: usize,
    },
    /// One reserved range at `base`, `slots` pages (`stride` bytes) per
    /// buffer; the first `mapped` slots of every buffer have pages (and
    /// some past them may: a parked range's, [`KvSpace::paged`]).
    Paged {
        range: Mutex<Mapped<R>>,
        slots: usize,
        base: u64,
        stride: usize,
    },
}

struct Mapped<R: RawDevice> {
    range: MappedRange<R>,
    mapped: usize,
}

/// Bytes of a slab of `buffers` buffers of `cap` rows of `row_bytes`.
pub(super) fn slab_bytes(buffers: usize, cap: usize, row_bytes: usize) -> usize {
    buffers * (cap * row_bytes).next_multiple_of(ALIGN)
}

/// Pages needed to hold `bytes` bytes of `page`-byte pages.
fn pages_for(bytes: usize, page: usize) -> usize {
    bytes.div_ceil(page)
}

/// Pages a buffer maps to hold `rows` rows of `row_bytes` (and the slack).
fn pages_to_hold(rows: usize, row_bytes: usize, page: usize) -> usize {
    pages_for((rows + SLACK_ROWS) * row_bytes, page)
}

/// The slots of `range` in `within` with no page, as runs.
fn empty_runs<R: RawDevice>(
    range: &MappedRange<R>,
    within: std::ops::Range<usize>,
) -> Vec<std::ops::Range<usize>> {
    let mut runs: Vec<std::ops::Range<usize>> = Vec::new();
    for i in within.filter(|&i| range.page(i).is_none()) {
        match runs.last_mut() {
            Some(run) if run.end == i => run.end += 1,
            _ => runs.push(i..i + 1),
        }
    }
    runs
}

/// Slots `per` of each of `buffers` buffers of `slots` slots.
fn in_each(
    buffers: usize,
    slots: usize,
    per: std::ops::Range<usize>,
) -> impl Iterator<Item = usize> {
    (0..buffers).flat_map(move |b| b * slots + per.start..b * slots + per.end)
}

/// Bytes a paged space of `buffers` buffers maps for `rows` rows of
/// `row_bytes` in `page`-byte pages (what the scheduler counts).
pub(super) fn paged_bytes(buffers: usize, rows: usize, row_bytes: usize, page: usize) -> usize {
    buffers * pages_to_hold(rows, row_bytes, page) * page
}

impl<R: RawDevice> KvSpace<R> {
    /// A paged space for `buffers` buffers of up to `max_rows` rows of
    /// `row_bytes`, about to hold `rows` rows; `None` where the device maps
    /// no pages. Nothing written yet: the addresses of a space dropped
    /// earlier, if the device parked one (its pages mapped, for the rows it
    /// held that no one else reads: no map calls for those), or fresh ones.
    /// Either way it holds no pages past those `rows` need, which is what
    /// the scheduler counts ([`paged_bytes`]).
    pub fn paged(
        dev: &Device<R>,
        buffers: usize,
        max_rows: usize,
        row_bytes: usize,
        rows: usize,
    ) -> Option<Result<Self>> {
        let page = dev.page_size()?;
        let slots = pages_to_hold(max_rows, row_bytes, page);
        let need = pages_to_hold(rows, row_bytes, page).min(slots);
        let mut range = match dev.reserve_range(buffers * slots, buffers * need) {
            Ok(range) => range,
            Err(e) => return Some(Err(e)),
        };
        // SAFETY: a new space: no work reads its addresses yet.
        unsafe { range.unmap(in_each(buffers, slots, need..slots)) };
        let space = KvSpace {
            store: Store::Paged {
                base: range.ptr(),
                stride: slots * page,
                range: Mutex::new(Mapped { range, mapped: 0 }),
                slots,
            },
            buffers,
            row_bytes,
            own: KvOwnership::written(),
        };
        space.refresh_mapped();
        Some(Ok(space))
    }

    /// Sets `mapped` to the slots every buffer has a page at, from the first.
    fn refresh_mapped(&self) {
        if let Store::Paged { range, slots, .. } = &self.store {
            let mut m = range.lock().unwrap();
            let first_empty = |b: usize| {
                (0..*slots)
                    .find(|&s| m.range.page(b * slots + s).is_none())
                    .unwrap_or(*slots)
            };
            m.mapped = (0..self.buffers).map(first_empty).min().unwrap_or(0);
        }
    }

    /// A slab of `cap` rows per buffer in `buf` ([`slab_bytes`] bytes).
    pub fn slab(buf: DBuf<R>, buffers: usize, cap: usize, row_bytes: usize) -> Self {
        KvSpace {
            store: Store::Slab {
                buf,
                cap,
                stride: (cap * row_bytes).next_multiple_of(ALIGN),
            },
            buffers,
            row_bytes,
            own: KvOwnership::written(),
        }
    }

    pub fn is_paged(&self) -> bool {
        matches!(self.store, Store::Paged { .. })
    }

    /// Rows every buffer can hold at its address now.
    pub fn rows(&self) -> usize {
        match &self.store {
            Store::Slab { cap, .. } => *cap,
            Store::Paged { range, .. } => {
                let m = range.lock().unwrap();
                (m.mapped * m.range.page_bytes() / self.row_bytes).saturating_sub(SLACK_ROWS)
            }
        }
    }

    /// Makes room for `rows` rows in every buffer without moving any:
    /// maps pages (paged); `false` where that is impossible (a slab too
    /// small, or past the reserved addresses), and the caller moves the rows
    /// into a larger space.
    pub fn grow(&self, dev: &Device<R>, rows: usize) -> Result<bool> {
        let Store::Paged { range, slots, .. } = &self.store else {
            return Ok(rows <= self.rows());
        };
        let mut m = range.lock().unwrap();
        let need = pages_to_hold(rows, self.row_bytes, m.range.page_bytes());
        if need > *slots {
            return Ok(false);
        }
        if m.mapped >= need {
            return Ok(true);
        }
        for b in 0..self.buffers {
            // Each run of a buffer's empty slots mapped at once; pages
            // already there (a parked range's, or a failed growth's: runs
            // are all or nothing) stay.
            for run in empty_runs(&m.range, b * slots + m.mapped..b * slots + need) {
                let pages = run
                    .clone()
                    .map(|_| dev.new_page())
                    .collect::<Result<Vec<_>>>()?;
                m.range.map_run(run.start, pages)?;
            }
        }
        m.mapped = need;
        Ok(true)
    }

    /// Attention layer `j`'s (K, V) buffers.
    pub fn spans(&self, j: usize) -> (Span, Span) {
        let at = |b: usize| -> u64 {
            match &self.store {
                Store::Slab { buf, stride, .. } => buf.at(b * stride),
                Store::Paged { base, stride, .. } => base + (b * stride) as u64,
            }
        };
        (Span::at(at(2 * j)), Span::at(at(2 * j + 1)))
    }

    /// The memory rows `[0, pos)` live in, as the prefix cache counts it
    /// (each page once by its id, however many snapshots or sequences map
    /// it): the pages holding them, or the whole slab.
    pub fn pages(&self, pos: usize) -> Vec<(u64, usize)> {
        match &self.store {
            Store::Slab { buf, .. } => vec![(buf.ptr(), buf.bytes())],
            Store::Paged { range, slots, .. } => {
                let m = range.lock().unwrap();
                let page = m.range.page_bytes();
                let n = pages_for(pos * self.row_bytes, page).min(m.mapped);
                in_each(self.buffers, *slots, 0..n)
                    .filter_map(|i| m.range.page(i).map(|p| (p.id(), page)))
                    .collect()
            }
        }
    }

    /// Rows `[0, pos)` of `from` (of the same geometry) into this space,
    /// which has nothing written yet: both paged, the pages `from` holds
    /// full below `pos` are mapped here too (never written again: `from`
    /// only appends past `pos`) and the last partial page is copied;
    /// otherwise every row is copied. Leaves room for `room` rows.
    pub fn fill_from(
        &self,
        dev: &Device<R>,
        from: &KvSpace<R>,
        pos: usize,
        room: usize,
    ) -> Result<()> {
        if from.buffers != self.buffers || from.row_bytes != self.row_bytes {
            bail!("KV spaces of different geometry");
        }
        let shared = match (&self.store, &from.store) {
            (
                Store::Paged { range, slots, .. },
                Store::Paged {
                    range: src,
                    slots: src_slots,
                    ..
                },
            ) if slots == src_slots => {
                let src = src.lock().unwrap();
                let mut m = range.lock().unwrap();
                let page = m.range.page_bytes();
                let full = (pos * self.row_bytes / page).min(src.mapped);
                // A parked range's own pages where the shared ones go.
                // SAFETY: nothing written here yet, so no work reads them.
                unsafe { m.range.unmap(in_each(self.buffers, *slots, 0..full)) };
                for b in 0..self.buffers {
                    let run = (0..full)
                        .map(|s| src.range.page(b * slots + s).expect("mapped").clone())
                        .collect();
                    m.range.map_run(b * slots, run)?;
                }
                drop(m);
                self.refresh_mapped();
                full * page
            }
            _ => 0,
        };
        if !self.grow(dev, room.max(pos))? {
            bail!("the KV space cannot hold {} rows", room.max(pos));
        }
        let bytes = pos * self.row_bytes;
        if bytes > shared {
            for j in 0..self.buffers / 2 {
                let ((k, v), (fk, fv)) = (self.spans(j), from.spans(j));
                let off = shared as u64;
                dev.dtod(k.ptr() + off, fk.ptr() + off, bytes - shared)?;
                dev.dtod(v.ptr() + off, fv.ptr() + off, bytes - shared)?;
            }
        }
        Ok(())
    }

    /// Unmaps the pages past those holding rows `[0, rows)` (paged; a slab
    /// keeps its size): the writer's rows past the deepest snapshot once it
    /// is gone, which no one reads any more.
    pub fn trim(&self, rows: usize) {
        if let Store::Paged { range, slots, .. } = &self.store {
            let mut m = range.lock().unwrap();
            let keep = pages_for(rows * self.row_bytes, m.range.page_bytes());
            // SAFETY: only the writer appends past the rows kept, and it is
            // gone; snapshots read below them.
            unsafe { m.range.unmap(in_each(self.buffers, *slots, keep..*slots)) };
            m.mapped = m.mapped.min(keep);
        }
    }

    pub fn ownership(&self) -> &KvOwnership {
        &self.own
    }
}

#[cfg(test)]
mod tests {
    use super::super::seq_state::KvWriter;
    use super::*;
    use crate::gpu::device::mock::{Mock, log, open_paged};
    use std::sync::Arc;

    /// 64-byte pages of 16-byte rows: 4 rows a page, 2 attention layers.
    const PAGE: usize = 64;
    const ROW: usize = 16;
    const BUFS: usize = 4;

    /// Row `r` of buffer `b` as written by [`write_rows`].
    fn row(b: usize, r: usize, tag: u8) -> Vec<u8> {
        (0..ROW).map(|i| tag ^ (b * 64 + r * 7 + i) as u8).collect()
    }

    fn write_rows(d: &Device<Mock>, s: &KvSpace<Mock>, rows: std::ops::Range<usize>, tag: u8) {
        for j in 0..BUFS / 2 {
            let (k, v) = s.spans(j);
            for (b, span) in [(2 * j, k), (2 * j + 1, v)] {
                for r in rows.clone() {
                    d.htod(span.ptr() + (r * ROW) as u64, &row(b, r, tag))
                        .unwrap();
                }
            }
        }
    }

    fn assert_rows(d: &Device<Mock>, s: &KvSpace<Mock>, rows: std::ops::Range<usize>, tag: u8) {
        for j in 0..BUFS / 2 {
            let (k, v) = s.spans(j);
            for (b, span) in [(2 * j, k), (2 * j + 1, v)] {
                for r in rows.clone() {
                    let mut got = vec![0u8; ROW];
                    d.dtoh(&mut got, span.ptr() + (r * ROW) as u64).unwrap();
                    assert_eq!(got, row(b, r, tag), "buffer {b} row {r}");
                }
            }
        }
    }

    fn paged(d: &Device<Mock>, max_rows: usize) -> KvSpace<Mock> {
        // SLACK_ROWS rows past any need are mapped too: scale the test's
        // rows by whole pages of them.
        KvSpace::paged(d, BUFS, max_rows, ROW, 0).unwrap().unwrap()
    }

    /// Pages a buffer maps to hold `rows` rows.
    fn pages(rows: usize) -> usize {
        pages_to_hold(rows, ROW, PAGE)
    }

    #[test]
    fn pages_are_mapped_as_rows_fill_and_never_move() {
        let d = open_paged(Some(PAGE));
        let l = log();
        let s = paged(&d, 1000);
        assert_eq!((s.rows(), l.lock().unwrap().pages_live), (0, 0));
        let k0 = s.spans(0).0.ptr();
        let grants = l.lock().unwrap().grants;
        assert!(s.grow(&d, 10).unwrap());
        assert_eq!(l.lock().unwrap().pages_live, (BUFS * pages(10)) as i64);
        assert_eq!(
            l.lock().unwrap().grants,
            grants + BUFS,
            "one access grant a buffer"
        );
        assert_eq!(s.rows(), pages(10) * PAGE / ROW - SLACK_ROWS);
        write_rows(&d, &s, 0..10, 1);
        assert!(s.grow(&d, 300).unwrap());
        assert_eq!(l.lock().unwrap().pages_live, (BUFS * pages(300)) as i64);
        assert_eq!(s.spans(0).0.ptr(), k0, "growing moves nothing");
        assert_rows(&d, &s, 0..10, 1);
        assert!(!s.grow(&d, 1001).unwrap(), "past the reserved addresses");
        // Buffers do not overlap: each holds its own rows.
        write_rows(&d, &s, 0..300, 2);
        assert_rows(&d, &s, 0..300, 2);
        drop(s);
        let g = l.lock().unwrap();
        assert_eq!((g.pages_live, g.vas_live), (0, 0));
    }

    #[test]
    fn a_resumed_space_shares_full_pages_and_copies_the_last() {
        let d = open_paged(Some(PAGE));
        let l = log();
        let src = paged(&d, 1000);
        let pos = 4 * 10 + 2; // ten full pages of a buffer, two rows into the 11th
        src.grow(&d, pos).unwrap();
        write_rows(&d, &src, 0..pos, 3);
        let before = l.lock().unwrap().pages_live;
        let dst = paged(&d, 1000);
        dst.fill_from(&d, &src, pos, pos + 8).unwrap();
        assert_rows(&d, &dst, 0..pos, 3);
        // Only the pages past the ten shared ones are new.
        let fresh = BUFS * (pages(pos + 8) - 10);
        assert_eq!(l.lock().unwrap().pages_live, before + fresh as i64);
        let (sp, dp) = (src.pages(pos), dst.pages(pos));
        assert_eq!(sp.len(), BUFS * 11);
        let shared = sp.iter().filter(|p| dp.contains(p)).count();
        assert_eq!(shared, BUFS * 10, "the partial page is a copy");
        // Appending to either leaves the other's rows as they were.
        write_rows(&d, &dst, pos..pos + 8, 4);
        write_rows(&d, &src, pos..pos + 8, 5);
        assert_rows(&d, &src, 0..pos, 3);
        assert_rows(&d, &dst, 0..pos, 3);
        assert_rows(&d, &dst, pos..pos + 8, 4);
        // The shared pages outlive the space they came from.
        drop(src);
        assert_rows(&d, &dst, 0..pos, 3);
        drop(dst);
        assert_eq!(l.lock().unwrap().pages_live, 0);
    }

    #[test]
    fn the_writer_gives_back_the_pages_past_the_deepest_snapshot() {
        let d = open_paged(Some(PAGE));
        let l = log();
        let w = KvWriter::fresh(paged(&d, 1000));
        w.space().grow(&d, 400).unwrap();
        write_rows(&d, w.space(), 0..400, 6);
        // A snapshot at 100 shares the space.
        let snap: Arc<KvSpace<Mock>> = w.space().clone();
        snap.ownership().seal(100);
        drop(w);
        assert_eq!(
            l.lock().unwrap().pages_live,
            (BUFS * (100 * ROW).div_ceil(PAGE)) as i64,
            "only the snapshot's rows stay mapped"
        );
        assert_rows(&d, &snap, 0..100, 6);
        // A sequence resuming there appends in place, mapping pages again.
        let w = KvWriter::adopt(&snap, 100).expect("no writer left");
        assert!(w.space().grow(&d, 200).unwrap());
        write_rows(&d, w.space(), 100..200, 7);
        assert_rows(&d, &snap, 0..100, 6);
        drop((w, snap));
        assert_eq!(l.lock().unwrap().pages_live, 0);
    }

    /// Live mappings (maps less unmaps so far).
    fn live_maps(l: &std::sync::Mutex<crate::gpu::device::mock::Log>) -> usize {
        let g = l.lock().unwrap();
        g.maps - g.unmaps
    }

    #[test]
    fn a_new_space_takes_a_dropped_ones_pages_still_mapped() {
        let d = open_paged(Some(PAGE));
        let l = log();
        d.keep_pages(1024 * PAGE);
        let s = paged(&d, 1000);
        s.grow(&d, 300).unwrap();
        write_rows(&d, &s, 0..300, 1);
        let base = s.spans(0).0.ptr();
        drop(s);
        let (maps, pages_live) = {
            let g = l.lock().unwrap();
            (g.maps, g.pages_live)
        };
        // For 10 rows: the same addresses, no more pages mapped than 10 need.
        let s = KvSpace::paged(&d, BUFS, 1000, ROW, 10).unwrap().unwrap();
        assert_eq!(s.spans(0).0.ptr(), base);
        assert_eq!(live_maps(&l), BUFS * pages(10), "what the scheduler counts");
        assert_eq!(s.rows(), pages(10) * PAGE / ROW - SLACK_ROWS);
        assert!(s.grow(&d, 10).unwrap());
        assert_eq!(l.lock().unwrap().maps, maps, "no map call");
        // Growing further maps the pages the trim kept aside; none created.
        assert!(s.grow(&d, 300).unwrap());
        assert_eq!(l.lock().unwrap().pages_live, pages_live);
        write_rows(&d, &s, 0..300, 2);
        assert_rows(&d, &s, 0..300, 2);
        drop(s);
        drop(d);
        assert_eq!(l.lock().unwrap().pages_live, 0);
    }

    #[test]
    fn a_reused_space_never_writes_the_pages_it_shared() {
        let d = open_paged(Some(PAGE));
        let l = log();
        d.keep_pages(1024 * PAGE);
        let src = paged(&d, 1000);
        let pos = 4 * 10 + 2;
        src.grow(&d, pos).unwrap();
        write_rows(&d, &src, 0..pos, 3);
        // dst shares src's ten full pages, then is dropped: parked with
        // only its own pages, the shared slots empty.
        let dst = paged(&d, 1000);
        dst.fill_from(&d, &src, pos, pos + 8).unwrap();
        let base = dst.spans(0).0.ptr();
        drop(dst);
        let again = KvSpace::paged(&d, BUFS, 1000, ROW, pos + 8)
            .unwrap()
            .unwrap();
        assert_eq!(again.spans(0).0.ptr(), base);
        assert_eq!(again.rows(), 0, "its first slots are holes");
        assert!(again.grow(&d, pos + 8).unwrap());
        write_rows(&d, &again, 0..pos + 8, 9);
        assert_rows(&d, &again, 0..pos + 8, 9);
        assert_rows(&d, &src, 0..pos, 3);
        drop(again);
        // Filled from src again: its own pages where the shared ones go
        // are unmapped first.
        let again = KvSpace::paged(&d, BUFS, 1000, ROW, pos).unwrap().unwrap();
        assert_eq!(again.spans(0).0.ptr(), base);
        again.fill_from(&d, &src, pos, pos).unwrap();
        assert_rows(&d, &again, 0..pos, 3);
        let shared = src
            .pages(pos)
            .iter()
            .filter(|p| again.pages(pos).contains(p))
            .count();
        assert_eq!(shared, BUFS * 10);
        write_rows(&d, &again, pos..pos + 2, 4);
        assert_rows(&d, &src, 0..pos, 3);
        drop((again, src));
        drop(d);
        assert_eq!(l.lock().unwrap().pages_live, 0);
    }

    #[test]
    fn without_page_mapping_a_slab_is_copied_whole() {
        let d = open_paged(None);
        assert!(KvSpace::<Mock>::paged(&d, BUFS, 1000, ROW, 0).is_none());
        let new = |cap| {
            let buf = d.alloc(slab_bytes(BUFS, cap, ROW)).unwrap();
            KvSpace::slab(buf, BUFS, cap, ROW)
        };
        let src = new(64);
        assert!(!src.is_paged() && src.grow(&d, 64).unwrap());
        assert!(!src.grow(&d, 65).unwrap(), "a slab does not grow in place");
        write_rows(&d, &src, 0..50, 8);
        let dst = new(128);
        dst.fill_from(&d, &src, 50, 100).unwrap();
        assert_rows(&d, &dst, 0..50, 8);
        assert_eq!(
            src.pages(50),
            [(src.spans(0).0.ptr(), slab_bytes(BUFS, 64, ROW))]
        );
    }
}
