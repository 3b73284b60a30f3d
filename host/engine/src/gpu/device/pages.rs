//! Physical pages mapped into reserved device addresses (CUDA's virtual
//! memory management): what paged KV caches are built from. A range of
//! addresses can be reserved far larger than the memory behind it, pages are
//! mapped into it as it fills, and one page can be mapped into several
//! ranges at once, which is how sequences share the KV rows of a prefix
//! without copying them while kernels still see one contiguous buffer.

use super::{Device, RawDevice};
use anyhow::{Result, anyhow, bail};
use std::sync::{Arc, Mutex};

/// What the last owners of pages and ranges let go, kept (up to `keep`
/// pages in all) for the next one asked for. Creating a page costs the
/// driver tens of microseconds and mapping one ~29 µs (the H200: an 8K
/// prompt's 180 KV pages added ~8 ms to its 360 ms when created, ~5 ms when
/// only mapped); taking a kept page costs nothing, and a parked range hands
/// its pages over still mapped. Kept pages stay allocated: `keep` is memory
/// outside anyone's count (0 until [`Device::keep_pages`]).
pub struct PagePool<R: RawDevice> {
    raw: Arc<R>,
    kept: Mutex<Kept<R>>,
    keep: std::sync::atomic::AtomicUsize,
}

struct Kept<R: RawDevice> {
    /// Unmapped pages.
    free: Vec<u64>,
    /// Ranges with the pages only they held still mapped (oldest first).
    parked: Vec<MappedRange<R>>,
    /// Pages mapped in `parked`.
    parked_pages: usize,
}

impl<R: RawDevice> Kept<R> {
    fn pages(&self) -> usize {
        self.free.len() + self.parked_pages
    }
}

impl<R: RawDevice> PagePool<R> {
    pub(super) fn new(raw: Arc<R>) -> Arc<Self> {
        Arc::new(PagePool {
            raw,
            kept: Mutex::new(Kept {
                free: Vec::new(),
                parked: Vec::new(),
                parked_pages: 0,
            }),
            keep: Default::default(),
        })
    }

    fn keep(&self) -> usize {
        self.keep.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Takes `handle` back: kept for reuse, or released past `keep`.
    fn put(&self, handle: u64) {
        let mut kept = self.kept.lock().unwrap();
        if kept.pages() < self.keep() {
            kept.free.push(handle);
        } else {
            drop(kept);
            // SAFETY: from `page_create`, its last owner gone: released once, here.
            unsafe { self.raw.page_release(handle) }
        }
    }

    /// Keeps `range` (its `pool` already cleared) with its pages mapped if
    /// they fit under `keep`; otherwise hands it back, for the caller to drop
    /// outside the lock (dropping it puts its pages here).
    fn park(&self, range: MappedRange<R>) -> Option<MappedRange<R>> {
        let pages = range.mapped();
        let mut kept = self.kept.lock().unwrap();
        if pages == 0 || kept.pages() + pages > self.keep() {
            return Some(range);
        }
        kept.parked_pages += pages;
        kept.parked.push(range);
        None
    }

    /// The parked range of `slots` slots best fit for `want` mapped pages:
    /// the fewest at or above it, else the most below it.
    fn unpark(&self, slots: usize, want: usize) -> Option<MappedRange<R>> {
        let mut kept = self.kept.lock().unwrap();
        let fit = |r: &MappedRange<R>| {
            let n = r.mapped();
            // Above `want`: fewer is better; below: more is better, and any
            // above beats any below.
            if n >= want {
                (1, usize::MAX - n)
            } else {
                (0, n)
            }
        };
        let i = (0..kept.parked.len())
            .filter(|&i| kept.parked[i].slots() == slots)
            .max_by_key(|&i| fit(&kept.parked[i]))?;
        let range = kept.parked.remove(i);
        kept.parked_pages -= range.mapped();
        Some(range)
    }

    /// Keeps nothing from now on and drops the parked ranges: they hold
    /// pages, which hold this pool, so the device breaks that cycle when it
    /// goes (ranges still live then are given back when they go).
    pub(super) fn clear_parked(&self) {
        self.keep.store(0, std::sync::atomic::Ordering::Relaxed);
        let parked = {
            let mut kept = self.kept.lock().unwrap();
            kept.parked_pages = 0;
            std::mem::take(&mut kept.parked)
        };
        drop(parked);
    }
}

impl<R: RawDevice> Drop for PagePool<R> {
    fn drop(&mut self) {
        for h in self.kept.get_mut().unwrap().free.drain(..) {
            // SAFETY: kept here, owned by no page any more.
            unsafe { self.raw.page_release(h) }
        }
    }
}

/// One physical page of device memory ([`Device::page_size`] bytes),
/// handed back to the pool when the last owner drops it (the memory itself
/// lives until its last mapping is gone too).
pub struct Page<R: RawDevice> {
    handle: u64,
    pool: Arc<PagePool<R>>,
}

impl<R: RawDevice> Page<R> {
    /// Unique among live pages (the driver's handle): how the prefix cache
    /// counts a page held by several snapshots once.
    pub fn id(&self) -> u64 {
        self.handle
    }
}

impl<R: RawDevice> Drop for Page<R> {
    fn drop(&mut self) {
        self.pool.put(self.handle)
    }
}

/// Reserved device addresses, cut into page-sized slots, with nothing behind
/// a slot until a page is mapped there. On drop, parked in the device's pool
/// with the pages no other range maps still mapped, where it has room
/// (the next range of the same size is that one: [`Device::reserve_range`]);
/// otherwise unmaps its pages (after the work queued so far) and gives the
/// addresses back.
pub struct MappedRange<R: RawDevice> {
    ptr: u64,
    page: usize,
    slots: Vec<Option<Arc<Page<R>>>>,
    raw: Arc<R>,
    /// Where it parks on drop (`None` while parked).
    pool: Option<Arc<PagePool<R>>>,
}

impl<R: RawDevice> MappedRange<R> {
    pub fn ptr(&self) -> u64 {
        self.ptr
    }
    pub fn page_bytes(&self) -> usize {
        self.page
    }
    pub fn slots(&self) -> usize {
        self.slots.len()
    }
    /// The page mapped at slot `i`, if any.
    pub fn page(&self, i: usize) -> Option<&Arc<Page<R>>> {
        self.slots.get(i)?.as_ref()
    }
    /// How many slots have a page mapped.
    pub fn mapped(&self) -> usize {
        self.slots.iter().filter(|s| s.is_some()).count()
    }

    /// Maps `pages` at the empty slots `first..`, then makes them
    /// accessible with one call for the whole run; all or nothing (a failure
    /// unmaps what it mapped).
    pub fn map_run(&mut self, first: usize, pages: Vec<Arc<Page<R>>>) -> Result<()> {
        let end = first + pages.len();
        if end > self.slots.len() {
            bail!(
                "page slots {first}..{end} past the {} reserved",
                self.slots.len()
            );
        }
        if let Some(i) = (first..end).find(|&i| self.slots[i].is_some()) {
            bail!("page slot {i} is already mapped");
        }
        let va = |i: usize| self.ptr + (i * self.page) as u64;
        let mut mapped = 0;
        let mut result = Ok(());
        for (i, page) in (first..).zip(&pages) {
            // SAFETY: a page-aligned, unmapped slot of the reserved range.
            result = unsafe { self.raw.map(va(i), page.handle) };
            if result.is_err() {
                break;
            }
            mapped += 1;
        }
        if result.is_ok() && mapped > 0 {
            // SAFETY: every page of the run was just mapped.
            result = unsafe { self.raw.grant_access(va(first), mapped * self.page) };
        }
        if let Err(e) = result {
            for i in first..first + mapped {
                // SAFETY: mapped above and never accessible: nothing used it.
                unsafe { self.raw.unmap(va(i)) }
            }
            bail!("mapping {} {} pages: {e}", pages.len(), R::VENDOR);
        }
        for (i, page) in (first..).zip(pages) {
            self.slots[i] = Some(page);
        }
        Ok(())
    }

    /// Unmaps the pages at `slots`, once the work queued so far is complete
    /// (one wait for all of them).
    ///
    /// # Safety
    /// No work queued later reads the addresses of those slots.
    pub unsafe fn unmap(&mut self, slots: impl IntoIterator<Item = usize>) {
        let gone: Vec<usize> = slots
            .into_iter()
            .filter(|&i| self.slots.get(i).is_some_and(Option::is_some))
            .collect();
        if gone.is_empty() {
            return;
        }
        let _ = self.raw.sync();
        for i in gone {
            // SAFETY: mapped here, and the work that used it is done.
            unsafe { self.raw.unmap(self.ptr + (i * self.page) as u64) }
            // Unmapped before its page can go back to the pool.
            self.slots[i] = None;
        }
    }
}

impl<R: RawDevice> Drop for MappedRange<R> {
    fn drop(&mut self) {
        if let Some(pool) = self.pool.take()
            && pool.keep() > 0
        {
            // Pages other ranges map are theirs to read: the next owner of
            // these addresses must not write them. The rest it may, after
            // the work queued so far (the device runs it in order).
            let shared = (0..self.slots.len())
                .filter(|&i| self.page(i).is_some_and(|p| Arc::strong_count(p) > 1));
            let shared: Vec<usize> = shared.collect();
            // SAFETY: the range's owner is gone, so no later work reads it.
            unsafe { self.unmap(shared) };
            let parked = MappedRange {
                ptr: self.ptr,
                page: self.page,
                slots: std::mem::take(&mut self.slots),
                raw: self.raw.clone(),
                pool: None,
            };
            // Refused (no room), it is dropped here, outside the pool's lock.
            drop(pool.park(parked));
            return;
        }
        // SAFETY: the range's owner is gone, so no later work reads it.
        unsafe { self.unmap(0..self.slots.len()) };
        // SAFETY: from `va_reserve`, nothing mapped in it any more.
        unsafe { self.raw.va_free(self.ptr, self.slots.len() * self.page) }
    }
}

impl<R: RawDevice> Device<R> {
    /// The physical page size where the device maps pages into reserved
    /// addresses; `None` where it does not (callers allocate whole buffers).
    pub fn page_size(&self) -> Option<usize> {
        self.raw.page_size()
    }

    /// `slots` pages' worth of device addresses: a parked range of that size
    /// if there is one (the one whose mapped pages best fit `want`; pages
    /// still mapped at any of its slots, with contents undefined), otherwise
    /// new addresses with nothing behind them.
    pub fn reserve_range(&self, slots: usize, want: usize) -> Result<MappedRange<R>> {
        let page = self
            .page_size()
            .ok_or_else(|| anyhow!("{} has no virtual memory management", self.name))?;
        if let Some(mut range) = self.pages.unpark(slots.max(1), want) {
            range.pool = Some(self.pages.clone());
            return Ok(range);
        }
        let bytes = slots.max(1) * page;
        let ptr = self
            .raw
            .va_reserve(bytes)
            .map_err(|e| anyhow!("reserving {bytes} bytes of {} addresses: {e}", R::VENDOR))?;
        Ok(MappedRange {
            ptr,
            page,
            slots: (0..slots.max(1)).map(|_| None).collect(),
            raw: self.raw.clone(),
            pool: Some(self.pages.clone()),
        })
    }

    /// Keeps up to `bytes` of released pages and of parked ranges' pages
    /// for reuse instead of giving them back to the driver.
    pub fn keep_pages(&self, bytes: usize) {
        let n = bytes / self.page_size().unwrap_or(usize::MAX).max(1);
        self.pages
            .keep
            .store(n, std::sync::atomic::Ordering::Relaxed);
    }

    /// A physical page (its contents undefined: a kept one holds what its
    /// last owner wrote).
    pub fn new_page(&self) -> Result<Arc<Page<R>>> {
        let kept = self.pages.kept.lock().unwrap().free.pop();
        if let Some(handle) = kept {
            return Ok(Arc::new(Page {
                handle,
                pool: self.pages.clone(),
            }));
        }
        let bytes = self.page_size().unwrap_or(0);
        let handle = self.raw.page_create().map_err(|e| {
            anyhow!(
                "{} allocation of a {bytes}-byte page failed: {e}",
                R::VENDOR
            )
        })?;
        Ok(Arc::new(Page {
            handle,
            pool: self.pages.clone(),
        }))
    }
}
