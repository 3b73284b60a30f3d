//! The prefix cache: per `cache_salt`, a radix tree (token ids) of immutable
//! sequence snapshots, with transactional commits, a byte budget and LRU
//! eviction of whole snapshots.
//!
//! * **Lookup** ([`PrefixCache::lookup`]) returns a snapshot exactly at the
//!   prompt's end if it carries the logits predicting the next token (a
//!   *full hit*: the request runs no prefill at all), and otherwise the
//!   deepest snapshot whose tokens are a prefix of the prompt and strictly
//!   shorter than it (at least one prompt token must run to produce logits),
//!   as a [`Lease`] that pins the snapshot (never evicted while leased).
//!   Lookups change nothing else: the LRU clock of the snapshot used is
//!   advanced only when the request commits.
//! * **Transactions**: a request stages its new snapshots in a [`Staged`] list
//!   and hands them to [`PrefixCache::commit`] only when it succeeds; a failed,
//!   cancelled or timed-out request drops the list and the cache is exactly as
//!   before (the dropped snapshots release their KV pages).
//! * **Atomicity**: everything is behind one mutex; a snapshot is inserted
//!   whole and never mutated afterwards (shared as `Arc<dyn SeqSnapshot>`), so
//!   readers never see a half-written snapshot. [`PrefixCache::stats`] reads
//!   totals published at the end of each change instead, so a metrics scrape
//!   never waits for a commit's copies to the host tier.
//! * **Bytes**: each snapshot's private bytes (recurrent states) and stored
//!   logits, plus every distinct KV page referenced by any snapshot, once
//!   (pages are counted by id with a reference count inside the cache). Over the budget, the least
//!   recently used unpinned snapshots are evicted; a page's memory is freed
//!   when its last reference (cache or running sequence) goes.
//! * **Host tier** (backends with device memory): with a host budget, a
//!   snapshot pushed out of the (device) budget is first *demoted*: the
//!   backend copies it to host memory ([`crate::backend::Backend::demote`])
//!   and the entry stays findable, restored from there; the host tier has its
//!   own budget and LRU eviction. A request that resumed from a host copy
//!   stages a device snapshot of the restored state; its commit *promotes*
//!   the entry back to the device (the host copy is dropped) unless the
//!   device budget pushes it out again at once, in which case the entry
//!   keeps its host copy (no second copy is made).

mod trie;

use crate::backend::SeqSnapshot;
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

/// A snapshot a request made, to be committed if the request succeeds.
pub struct StagedSnapshot {
    /// The tokens the snapshot covers (`tokens.len() == snap.position()`).
    pub tokens: Vec<u32>,
    pub snap: Box<dyn SeqSnapshot>,
    /// The logits (`vocab_size` f32) the backend returned for the last of
    /// `tokens`, i.e. the distribution of the token after them. Stored with
    /// end-of-prompt and end-of-generation snapshots so that a prompt equal
    /// to their tokens needs no forward pass at all; `None` elsewhere
    /// (intervals, guest marks).
    pub logits: Option<Vec<f32>>,
}

/// Snapshots a request made, to be committed on success, and the bytes they
/// hold (states, logits and distinct pages), kept as snapshots come and go.
#[derive(Default)]
pub struct Staged {
    snaps: VecDeque<StagedSnapshot>,
    /// Private state and logit bytes of `snaps`.
    own: usize,
    /// Page id -> (bytes, how many of `snaps` hold it).
    pages: HashMap<u64, (usize, usize)>,
    page_bytes: usize,
}

impl Staged {
    /// Appends `s`, then drops the oldest (the shallowest: positions grow)
    /// while they hold more than `budget` bytes, so a long prompt cannot pin
    /// more memory in pending snapshots than the cache may hold (snapshots
    /// that own their KV rows, as full copies would, cost GBs each at long
    /// contexts). Pages shared between them count once.
    pub fn push_bounded(&mut self, s: StagedSnapshot, budget: usize) {
        self.own += s.snap.private_bytes() + logit_bytes(s.logits.as_deref());
        for (id, bytes) in s.snap.pages() {
            let e = self.pages.entry(id).or_insert((bytes, 0));
            if e.1 == 0 {
                self.page_bytes += bytes;
            }
            e.1 += 1;
        }
        self.snaps.push_back(s);
        while self.bytes() > budget
            && let Some(old) = self.snaps.pop_front()
        {
            self.own -= old.snap.private_bytes() + logit_bytes(old.logits.as_deref());
            for (id, _) in old.snap.pages() {
                let e = self.pages.get_mut(&id).expect("counted when staged");
                e.1 -= 1;
                if e.1 == 0 {
                    self.page_bytes -= e.0;
                    self.pages.remove(&id);
                }
            }
        }
    }

    /// Bytes held: states, logits and distinct pages.
    pub fn bytes(&self) -> usize {
        self.own + self.page_bytes
    }

    pub fn len(&self) -> usize {
        self.snaps.len()
    }

    pub fn is_empty(&self) -> bool {
        self.snaps.is_empty()
    }

    pub fn iter(&self) -> impl Iterator<Item = &StagedSnapshot> {
        self.snaps.iter()
    }
}

impl IntoIterator for Staged {
    type Item = StagedSnapshot;
    type IntoIter = std::collections::vec_deque::IntoIter<StagedSnapshot>;
    fn into_iter(self) -> Self::IntoIter {
        self.snaps.into_iter()
    }
}

fn logit_bytes(logits: Option<&[f32]>) -> usize {
    logits.map_or(0, std::mem::size_of_val)
}

/// A snapshot's private bytes and all its pages (what a copy of it owns).
fn snapshot_bytes(snap: &dyn SeqSnapshot) -> usize {
    snap.private_bytes() + snap.pages().iter().map(|p| p.1).sum::<usize>()
}

/// Copies a snapshot into host memory (the backend's
/// [`crate::backend::Backend::demote`]); `None` if it cannot.
pub type Demote<'a> = &'a dyn Fn(&dyn SeqSnapshot) -> Option<Box<dyn SeqSnapshot>>;

/// One cached snapshot.
struct Entry {
    salt: Option<String>,
    tokens: Vec<u32>,
    snap: Arc<dyn SeqSnapshot>,
    /// Demoted: `snap` is the backend's host-memory copy (counted in the
    /// host tier's bytes, no shared pages).
    host: bool,
    /// The logits after `tokens` (end-of-prompt and end-of-generation snapshots).
    logits: Option<Arc<[f32]>>,
    last_used: u64,
    /// Leases held by running requests (never evicted while > 0).
    pins: Arc<AtomicUsize>,
}

#[derive(Default)]
struct Inner {
    trees: HashMap<Option<String>, trie::Node>,
    entries: HashMap<u64, Entry>,
    /// Distinct pages held by the cache's snapshots: id -> (references, bytes).
    pages: HashMap<u64, (usize, usize)>,
    page_bytes: usize,
    /// Private state bytes plus stored logits of every snapshot not demoted.
    private_bytes: usize,
    /// Everything demoted snapshots hold (they own their bytes) plus their logits.
    host_bytes: usize,
    next_id: u64,
    clock: u64,
    evictions: u64,
    demotions: u64,
    promotions: u64,
}

/// A pinned snapshot handed to a request by [`PrefixCache::lookup`].
pub struct Lease {
    id: u64,
    snap: Arc<dyn SeqSnapshot>,
    pins: Arc<AtomicUsize>,
    /// Set on a full hit only: the snapshot covers the whole prompt.
    logits: Option<Arc<[f32]>>,
    host: bool,
}

impl Lease {
    pub fn snapshot(&self) -> &dyn SeqSnapshot {
        &*self.snap
    }

    /// Tokens the snapshot covers.
    pub fn position(&self) -> usize {
        self.snap.position()
    }

    /// On a full hit (the snapshot covers the whole prompt), the stored
    /// logits that predict the first generated token; `None` otherwise.
    pub fn logits(&self) -> Option<&[f32]> {
        self.logits.as_deref()
    }

    /// The snapshot is a host-memory copy (the host tier): a snapshot of the
    /// state restored from it, committed at the same tokens, promotes the
    /// entry back to the device.
    pub fn in_host_memory(&self) -> bool {
        self.host
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.pins.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Totals for metrics and tests.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CacheStats {
    /// Snapshots in both tiers.
    pub snapshots: usize,
    /// Bytes held in the backend's own memory: private state bytes +
    /// distinct page bytes of snapshots not demoted.
    pub bytes: usize,
    pub pages: usize,
    /// Snapshots dropped from the cache (from either tier).
    pub evictions: u64,
    pub budget: usize,
    /// Bytes of snapshots demoted to host memory, and their budget (0: no host tier).
    pub host_bytes: usize,
    pub host_budget: usize,
    /// Snapshots moved to the host tier.
    pub demotions: u64,
    /// Host-tier snapshots moved back to the device after a hit.
    pub promotions: u64,
}

/// One entry in [`PrefixCache::dump`]: `(salt, tokens, position, bytes the
/// entry owns alone (private state + stored logits), has logits, in the
/// host tier)`.
pub type DumpEntry = (Option<String>, Vec<u32>, usize, usize, bool, bool);

pub struct PrefixCache {
    budget: usize,
    host_budget: usize,
    inner: Mutex<Inner>,
    /// The totals as of the last change (see [`Self::stats`]).
    published: Mutex<CacheStats>,
}

impl PrefixCache {
    /// A cache holding at most `budget_bytes` (0 holds nothing).
    pub fn new(budget_bytes: usize) -> Self {
        Self::with_host_tier(budget_bytes, 0)
    }

    /// A cache of `budget_bytes` in the backend's memory whose overflow moves
    /// to host memory (up to `host_budget_bytes`) where the backend can
    /// demote snapshots, instead of being evicted.
    pub fn with_host_tier(budget_bytes: usize, host_budget_bytes: usize) -> Self {
        PrefixCache {
            budget: budget_bytes,
            host_budget: host_budget_bytes,
            inner: Mutex::default(),
            published: Mutex::new(CacheStats {
                budget: budget_bytes,
                host_budget: host_budget_bytes,
                ..CacheStats::default()
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // Every critical section leaves the maps consistent before it can panic.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn budget(&self) -> usize {
        self.budget
    }

    /// The most a request's pending snapshots may hold: what one commit can
    /// keep, in the backend's memory or, with a host tier, in host memory
    /// (a snapshot over the device budget is demoted when committed).
    pub fn staging_budget(&self) -> usize {
        self.budget.max(self.host_budget)
    }

    /// For `salt`: the snapshot at exactly `prompt` if it carries logits (a
    /// full hit: [`Lease::logits`] is set), else the deepest snapshot whose
    /// tokens are a prefix of `prompt` and shorter than it; pinned until the
    /// lease is dropped.
    pub fn lookup(&self, salt: Option<&str>, prompt: &[u32]) -> Option<Lease> {
        let inner = self.lock();
        let tree = inner.trees.get(&salt.map(str::to_owned))?;
        let full = tree
            .get(prompt)
            .filter(|id| inner.entries[id].logits.is_some());
        let id = match full {
            Some(id) => id,
            None => tree.deepest(prompt, prompt.len().saturating_sub(1))?.0,
        };
        let e = &inner.entries[&id];
        e.pins.fetch_add(1, Ordering::SeqCst);
        Some(Lease {
            id,
            snap: e.snap.clone(),
            pins: e.pins.clone(),
            logits: full.and(e.logits.clone()),
            host: e.host,
        })
    }

    /// True if a snapshot at exactly `tokens` exists for `salt`.
    pub fn contains(&self, salt: Option<&str>, tokens: &[u32]) -> bool {
        let inner = self.lock();
        inner
            .trees
            .get(&salt.map(str::to_owned))
            .is_some_and(|t| t.get(tokens).is_some())
    }

    /// True if a snapshot at exactly `tokens` exists for `salt`, carries the
    /// logits after them (it can serve an identical prompt) and is in the
    /// backend's memory. (A host copy is worth staging again: the commit
    /// promotes it.)
    pub fn contains_with_logits(&self, salt: Option<&str>, tokens: &[u32]) -> bool {
        let inner = self.lock();
        inner
            .trees
            .get(&salt.map(str::to_owned))
            .and_then(|t| t.get(tokens))
            .is_some_and(|id| inner.entries[&id].logits.is_some() && !inner.entries[&id].host)
    }

    /// Commits a successful request: marks the snapshot it resumed from (if
    /// any) as used, inserts its staged snapshots (an existing snapshot at
    /// the same tokens is kept and the new one dropped, except that a staged
    /// snapshot replaces an existing one without logits if it has them (same
    /// tokens, so the same state, now able to serve an identical prompt) and
    /// an existing host copy (a promotion back to the device), then moves
    /// least recently used unpinned snapshots out until the cache fits its
    /// budget: to the host tier through `demote` where there is one, else
    /// out of the cache. Returns how many snapshots were inserted or replaced.
    pub fn commit(
        &self,
        salt: Option<&str>,
        used: Option<&Lease>,
        staged: Staged,
        demote: Option<Demote>,
    ) -> usize {
        let salt = salt.map(str::to_owned);
        let mut inner = self.lock();
        let inner = &mut *inner;
        inner.clock += 1;
        if let Some(l) = used
            && let Some(e) = inner.entries.get_mut(&l.id)
        {
            e.last_used = inner.clock;
        }
        // What one snapshot may hold: the backend's budget, or the host
        // tier's when it can take what that budget pushes out.
        let limit = if demote.is_some() {
            self.staging_budget()
        } else {
            self.budget
        };
        let mut inserted = 0;
        // Promoted entries' host copies, kept until `fit` has settled which
        // entries stay on the device.
        let mut promoted = HashMap::new();
        for StagedSnapshot {
            tokens,
            snap,
            logits,
        } in staged
        {
            debug_assert_eq!(tokens.len(), snap.position());
            if tokens.is_empty() || tokens.len() != snap.position() {
                continue;
            }
            // A snapshot larger than the whole budget can never be held.
            let own = snapshot_bytes(&*snap) + logit_bytes(logits.as_deref());
            let existing = inner.trees.get(&salt).and_then(|t| t.get(&tokens));
            if let Some(id) = existing {
                let e = inner.entries.get_mut(&id).expect("indexed");
                e.last_used = inner.clock;
                let upgrade = e.logits.is_none() && logits.is_some();
                // A promotion alone must fit the device budget itself.
                if !(upgrade && own <= limit || e.host && own <= self.budget) {
                    continue;
                }
                // Replace in place (same id, node and pins): a request
                // holding a lease on the old snapshot keeps its own `Arc`.
                let snap: Arc<dyn SeqSnapshot> = Arc::from(snap);
                let logits: Option<Arc<[f32]>> = logits.map(Arc::from).or(e.logits.clone());
                let old_snap = std::mem::replace(&mut e.snap, snap.clone());
                let old_logits = std::mem::replace(&mut e.logits, logits.clone());
                let was_host = std::mem::replace(&mut e.host, false);
                Self::account_add(inner, &*snap, logits.as_deref(), false);
                Self::account_sub(inner, &*old_snap, old_logits.as_deref(), was_host);
                if was_host {
                    promoted.insert(id, old_snap);
                }
                inserted += 1;
                continue;
            }
            if own > limit {
                continue;
            }
            inner.next_id += 1;
            let id = inner.next_id;
            inner
                .trees
                .entry(salt.clone())
                .or_default()
                .insert(&tokens, id);
            let snap: Arc<dyn SeqSnapshot> = Arc::from(snap);
            let logits: Option<Arc<[f32]>> = logits.map(Arc::from);
            Self::account_add(inner, &*snap, logits.as_deref(), false);
            inner.entries.insert(
                id,
                Entry {
                    salt: salt.clone(),
                    tokens,
                    snap,
                    host: false,
                    logits,
                    last_used: inner.clock,
                    pins: Arc::default(),
                },
            );
            inserted += 1;
        }
        self.fit(inner, demote, &mut promoted);
        inner.promotions += promoted.len() as u64;
        self.publish(inner);
        inserted
    }

    /// Counts a snapshot's private bytes, logits and pages as held (in the
    /// host tier's total when `host`).
    fn account_add(inner: &mut Inner, snap: &dyn SeqSnapshot, logits: Option<&[f32]>, host: bool) {
        if host {
            inner.host_bytes += snapshot_bytes(snap) + logit_bytes(logits);
            return;
        }
        inner.private_bytes += snap.private_bytes() + logit_bytes(logits);
        for (pid, bytes) in snap.pages() {
            let slot = inner.pages.entry(pid).or_insert((0, bytes));
            if slot.0 == 0 {
                inner.page_bytes += bytes;
            }
            slot.0 += 1;
        }
    }

    /// The reverse of [`Self::account_add`]; a page no snapshot holds any
    /// more stops being counted.
    fn account_sub(inner: &mut Inner, snap: &dyn SeqSnapshot, logits: Option<&[f32]>, host: bool) {
        if host {
            inner.host_bytes -= snapshot_bytes(snap) + logit_bytes(logits);
            return;
        }
        inner.private_bytes -= snap.private_bytes() + logit_bytes(logits);
        for (pid, _) in snap.pages() {
            if let Some(slot) = inner.pages.get_mut(&pid) {
                slot.0 -= 1;
                if slot.0 == 0 {
                    inner.page_bytes -= slot.1;
                    inner.pages.remove(&pid);
                }
            }
        }
    }

    fn bytes(inner: &Inner) -> usize {
        inner.private_bytes + inner.page_bytes
    }

    /// The least recently used unpinned snapshot of one tier.
    fn lru(inner: &Inner, host: bool) -> Option<u64> {
        inner
            .entries
            .iter()
            .filter(|(_, e)| e.host == host && e.pins.load(Ordering::SeqCst) == 0)
            .min_by_key(|(id, e)| (e.last_used, **id))
            .map(|(id, _)| *id)
    }

    /// Moves LRU unpinned snapshots out of the backend's memory until
    /// `bytes <= budget` (demoted where the host tier takes them, else
    /// evicted), then evicts LRU host snapshots until the host tier fits.
    /// An entry promoted by this commit that has to go again gets its host
    /// copy back from `promoted` (removed there) instead of a new copy.
    fn fit(
        &self,
        inner: &mut Inner,
        demote: Option<Demote>,
        promoted: &mut HashMap<u64, Arc<dyn SeqSnapshot>>,
    ) {
        while Self::bytes(inner) > self.budget {
            let Some(id) = Self::lru(inner, false) else {
                break;
            };
            if let Some(h) = promoted.remove(&id) {
                let e = inner.entries.get_mut(&id).expect("chosen above");
                let device = std::mem::replace(&mut e.snap, h);
                e.host = true;
                let (host, logits) = (e.snap.clone(), e.logits.clone());
                Self::account_sub(inner, &*device, logits.as_deref(), false);
                Self::account_add(inner, &*host, logits.as_deref(), true);
                continue;
            }
            let demoted = match demote {
                Some(demote) if self.host_budget > 0 => {
                    let e = &inner.entries[&id];
                    let logits = logit_bytes(e.logits.as_deref());
                    // Not worth a copy that cannot fit.
                    (snapshot_bytes(&*e.snap) + logits <= self.host_budget)
                        .then(|| demote(&*e.snap))
                        .flatten()
                        .filter(|h| snapshot_bytes(&**h) + logits <= self.host_budget)
                }
                _ => None,
            };
            match demoted {
                Some(h) => {
                    let e = inner.entries.get_mut(&id).expect("chosen above");
                    let old = std::mem::replace(&mut e.snap, Arc::from(h));
                    e.host = true;
                    let (new, logits) = (e.snap.clone(), e.logits.clone());
                    Self::account_sub(inner, &*old, logits.as_deref(), false);
                    Self::account_add(inner, &*new, logits.as_deref(), true);
                    inner.demotions += 1;
                }
                None => {
                    Self::remove(inner, id);
                    inner.evictions += 1;
                }
            }
        }
        while inner.host_bytes > self.host_budget {
            let Some(id) = Self::lru(inner, true) else {
                break;
            };
            Self::remove(inner, id);
            inner.evictions += 1;
        }
    }

    fn remove(inner: &mut Inner, id: u64) {
        let Some(e) = inner.entries.remove(&id) else {
            return;
        };
        if let Some(tree) = inner.trees.get_mut(&e.salt) {
            tree.remove(&e.tokens, id);
            if tree.is_empty() {
                inner.trees.remove(&e.salt);
            }
        }
        Self::account_sub(inner, &*e.snap, e.logits.as_deref(), e.host);
    }

    /// Drops every unpinned snapshot (not counted as evictions).
    pub fn clear(&self) {
        let mut inner = self.lock();
        let ids: Vec<u64> = inner
            .entries
            .iter()
            .filter(|(_, e)| e.pins.load(Ordering::SeqCst) == 0)
            .map(|(id, _)| *id)
            .collect();
        for id in ids {
            Self::remove(&mut inner, id);
        }
        self.publish(&inner);
    }

    /// The totals as of the last commit or clear (never waits for one in
    /// progress).
    pub fn stats(&self) -> CacheStats {
        *self.published.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn publish(&self, inner: &Inner) {
        *self.published.lock().unwrap_or_else(|e| e.into_inner()) = CacheStats {
            snapshots: inner.entries.len(),
            bytes: Self::bytes(inner),
            pages: inner.pages.len(),
            evictions: inner.evictions,
            budget: self.budget,
            host_bytes: inner.host_bytes,
            host_budget: self.host_budget,
            demotions: inner.demotions,
            promotions: inner.promotions,
        };
    }

    /// Every snapshot, sorted (for tests: compare the cache before and after).
    pub fn dump(&self) -> Vec<DumpEntry> {
        let inner = self.lock();
        let mut v: Vec<DumpEntry> = inner
            .entries
            .values()
            .map(|e| {
                (
                    e.salt.clone(),
                    e.tokens.clone(),
                    e.snap.position(),
                    e.snap.private_bytes() + logit_bytes(e.logits.as_deref()),
                    e.logits.is_some(),
                    e.host,
                )
            })
            .collect();
        v.sort();
        v
    }

    /// Radix-tree nodes over all salts (for structural checks).
    pub fn node_count(&self) -> usize {
        self.lock().trees.values().map(trie::Node::node_count).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::any::Any;

    /// A snapshot of `pos` tokens owning `own` bytes and holding `pages`.
    struct Fake {
        pos: usize,
        own: usize,
        pages: Vec<(u64, usize)>,
    }

    impl SeqSnapshot for Fake {
        fn position(&self) -> usize {
            self.pos
        }
        fn private_bytes(&self) -> usize {
            self.own
        }
        fn pages(&self) -> Vec<(u64, usize)> {
            self.pages.clone()
        }
        fn as_any(&self) -> &dyn Any {
            self
        }
    }

    fn staged(pos: usize, own: usize, pages: &[u64]) -> StagedSnapshot {
        StagedSnapshot {
            tokens: vec![1; pos],
            snap: Box::new(Fake {
                pos,
                own,
                pages: pages.iter().map(|&p| (p, 1000)).collect(),
            }),
            logits: None,
        }
    }

    /// A host copy: owns every byte of the original, no pages; `fail`
    /// refuses (a host allocation that failed).
    fn demoter(fail: bool) -> impl Fn(&dyn SeqSnapshot) -> Option<Box<dyn SeqSnapshot>> {
        move |s: &dyn SeqSnapshot| {
            (!fail).then(|| {
                Box::new(Fake {
                    pos: s.position(),
                    own: snapshot_bytes(s),
                    pages: Vec::new(),
                }) as Box<dyn SeqSnapshot>
            })
        }
    }

    /// Commits one snapshot at `len` tokens of `tok` (own bytes, pages).
    fn put(
        c: &PrefixCache,
        tok: u32,
        len: usize,
        own: usize,
        pages: &[u64],
        demote: Option<Demote>,
    ) {
        let mut st = Staged::default();
        let mut s = staged(len, own, pages);
        s.tokens = vec![tok; len];
        st.push_bounded(s, usize::MAX);
        c.commit(None, None, st, demote);
    }

    #[test]
    fn the_device_budget_demotes_to_the_host_tier_which_evicts_lru() {
        // Device room for two 100-byte snapshots, host room for three.
        let c = PrefixCache::with_host_tier(200, 300);
        let d = demoter(false);
        for tok in 1..=4 {
            put(&c, tok, 4, 100, &[], Some(&d));
        }
        let s = c.stats();
        assert_eq!((s.snapshots, s.bytes, s.host_bytes), (4, 200, 200), "{s:?}");
        assert_eq!((s.demotions, s.evictions), (2, 0));
        // Demoted snapshots are still found, as host copies.
        let l = c
            .lookup(None, &[1, 1, 1, 1, 1])
            .expect("demoted, not dropped");
        assert_eq!((l.position(), l.snapshot().pages().len()), (4, 0));
        drop(l);
        // Two more: the host tier holds three, so the oldest host copy goes.
        put(&c, 5, 4, 100, &[], Some(&d));
        put(&c, 6, 4, 100, &[], Some(&d));
        let s = c.stats();
        assert_eq!((s.snapshots, s.bytes, s.host_bytes), (5, 200, 300), "{s:?}");
        assert_eq!((s.demotions, s.evictions), (4, 1));
        assert!(c.lookup(None, &[1; 5]).is_none());
        assert!(c.lookup(None, &[2; 5]).is_some());
        c.clear();
        let s = c.stats();
        assert_eq!((s.snapshots, s.bytes, s.host_bytes, s.pages), (0, 0, 0, 0));
    }

    #[test]
    fn demoting_counts_shared_pages_until_their_last_device_holder_goes() {
        // Two snapshots over one 1000-byte page: demoting the older keeps the
        // page on the device (the newer holds it); its copy owns 1010 bytes.
        let c = PrefixCache::with_host_tier(1025, 5000);
        let d = demoter(false);
        put(&c, 1, 4, 10, &[7], Some(&d));
        put(&c, 2, 4, 10, &[7], Some(&d));
        let s = c.stats();
        assert_eq!((s.bytes, s.host_bytes, s.pages), (1020, 0, 1));
        put(&c, 3, 4, 10, &[8], Some(&d));
        let s = c.stats();
        // 2030 on the device: snapshot 1 goes (1020 left counting both
        // pages), then snapshot 2 (page 7 freed): 1010.
        assert_eq!((s.bytes, s.host_bytes, s.pages), (1010, 2020, 1), "{s:?}");
        assert_eq!(s.demotions, 2);
    }

    #[test]
    fn without_a_host_copy_or_a_host_tier_the_device_budget_evicts() {
        for (host, fail) in [(0, false), (1000, true)] {
            let c = PrefixCache::with_host_tier(200, host);
            let d = demoter(fail);
            for tok in 1..=3 {
                put(&c, tok, 4, 100, &[], Some(&d));
            }
            let s = c.stats();
            assert_eq!((s.snapshots, s.bytes, s.host_bytes), (2, 200, 0), "{s:?}");
            assert_eq!((s.demotions, s.evictions), (0, 1));
        }
        // A snapshot larger than the device budget goes straight to the host
        // tier; one larger than both budgets is not kept.
        let c = PrefixCache::with_host_tier(200, 1000);
        let d = demoter(false);
        put(&c, 1, 4, 500, &[], Some(&d));
        put(&c, 2, 4, 5000, &[], Some(&d));
        let s = c.stats();
        assert_eq!(
            (s.snapshots, s.bytes, s.host_bytes, s.demotions),
            (1, 0, 500, 1),
            "{s:?}"
        );
    }

    #[test]
    fn pinned_snapshots_are_neither_demoted_nor_evicted() {
        let c = PrefixCache::with_host_tier(100, 100);
        let d = demoter(false);
        put(&c, 1, 4, 100, &[], Some(&d));
        let lease = c.lookup(None, &[1; 5]).unwrap();
        put(&c, 2, 4, 100, &[], Some(&d));
        let s = c.stats();
        // Snapshot 1 is pinned: snapshot 2 (the only unpinned) is demoted.
        assert_eq!(
            (s.snapshots, s.bytes, s.host_bytes, s.demotions),
            (2, 100, 100, 1),
            "{s:?}"
        );
        assert!(c.lookup(None, &[2; 5]).is_some());
        drop(lease);
    }

    #[test]
    fn a_hit_on_a_host_copy_promotes_it_back_to_the_device() {
        // Device room for two 100-byte snapshots: the third commit demotes 1.
        let c = PrefixCache::with_host_tier(200, 300);
        let d = demoter(false);
        for tok in 1..=3 {
            put(&c, tok, 4, 100, &[], Some(&d));
        }
        let lease = c.lookup(None, &[1; 5]).unwrap();
        assert!(lease.in_host_memory());
        assert!(!c.lookup(None, &[3; 5]).unwrap().in_host_memory());
        // The request that resumed from it stages the restored (device) state.
        let mut st = Staged::default();
        st.push_bounded(staged(4, 100, &[]), usize::MAX);
        assert_eq!(c.commit(None, Some(&lease), st, Some(&d)), 1);
        drop(lease);
        let s = c.stats();
        // 1 is on the device again; 2, now the least recently used, went to the host.
        assert_eq!((s.snapshots, s.bytes, s.host_bytes), (3, 200, 100), "{s:?}");
        assert_eq!((s.promotions, s.demotions, s.evictions), (1, 2, 0));
        let host: Vec<(u32, bool)> = c.dump().iter().map(|e| (e.1[0], e.5)).collect();
        assert_eq!(host, [(1, false), (2, true), (3, false)]);
    }

    #[test]
    fn a_promotion_the_device_budget_cannot_keep_reuses_the_host_copy() {
        let c = PrefixCache::with_host_tier(100, 1000);
        let copies = AtomicUsize::new(0);
        let inner = demoter(false);
        let d = |s: &dyn SeqSnapshot| {
            copies.fetch_add(1, Ordering::SeqCst);
            inner(s)
        };
        put(&c, 1, 4, 100, &[], Some(&d));
        put(&c, 2, 4, 100, &[], Some(&d));
        assert_eq!(copies.load(Ordering::SeqCst), 1);
        // One commit promotes 1 and adds a deeper snapshot: room for one only.
        // 2 (older) is demoted, then 1 (same clock, older id) goes back to
        // its host copy without a new one.
        let mut st = Staged::default();
        st.push_bounded(staged(4, 100, &[]), usize::MAX);
        st.push_bounded(staged(8, 100, &[]), usize::MAX);
        assert_eq!(c.commit(None, None, st, Some(&d)), 2);
        let s = c.stats();
        assert_eq!((s.snapshots, s.bytes, s.host_bytes), (3, 100, 200), "{s:?}");
        assert_eq!((s.promotions, s.demotions), (0, 2));
        assert_eq!(copies.load(Ordering::SeqCst), 2);
        let tiers: Vec<(usize, bool)> = c.dump().iter().map(|e| (e.2, e.5)).collect();
        assert_eq!(tiers, [(4, true), (8, false), (4, true)]);
    }

    #[test]
    fn stats_do_not_wait_for_a_commit_copying_to_the_host_tier() {
        use std::sync::mpsc;
        use std::time::Duration;
        let c = Arc::new(PrefixCache::with_host_tier(100, 1000));
        put(&c, 1, 4, 100, &[], None);
        let (copying, copying_rx) = mpsc::channel();
        let (release, release_rx) = mpsc::channel::<()>();
        let committer = {
            let c = c.clone();
            std::thread::spawn(move || {
                let copy = demoter(false);
                let d = move |s: &dyn SeqSnapshot| {
                    copying.send(()).unwrap();
                    release_rx.recv().unwrap();
                    copy(s)
                };
                put(&c, 2, 4, 100, &[], Some(&d));
            })
        };
        // The commit holds the cache lock while it demotes snapshot 1.
        copying_rx.recv().unwrap();
        let (got, got_rx) = mpsc::channel();
        let reader = {
            let c = c.clone();
            std::thread::spawn(move || got.send(c.stats()).unwrap())
        };
        let during = got_rx.recv_timeout(Duration::from_secs(10));
        release.send(()).unwrap();
        committer.join().unwrap();
        reader.join().unwrap();
        let during = during.expect("stats() waited for the commit");
        assert_eq!((during.snapshots, during.demotions), (1, 0));
        let after = c.stats();
        assert_eq!(
            (after.snapshots, after.demotions, after.host_bytes),
            (2, 1, 100)
        );
    }

    #[test]
    fn pending_snapshots_stay_within_the_budget_keeping_the_deepest() {
        // Full copies (no shared pages), 100 bytes each, budget for 2.5.
        let mut s = Staged::default();
        for pos in 1..=5 {
            s.push_bounded(staged(pos, 100, &[]), 250);
            assert!(s.bytes() <= 250);
        }
        let kept: Vec<usize> = s.iter().map(|x| x.snap.position()).collect();
        assert_eq!(kept, [4, 5]);
        // One snapshot larger than the whole budget is never held.
        s.push_bounded(staged(6, 300, &[]), 250);
        assert!(s.is_empty());
    }

    #[test]
    fn shared_pages_count_once_while_staged() {
        // Copy-on-write snapshots over the same pages: 3 x 10 own + 2 pages.
        let mut s = Staged::default();
        s.push_bounded(staged(1, 10, &[7]), 3030);
        s.push_bounded(staged(2, 10, &[7, 8]), 3030);
        s.push_bounded(staged(3, 10, &[7, 8]), 3030);
        assert_eq!(s.len(), 3);
        assert_eq!(s.bytes(), 2030);
        // A third page: 3040 bytes with all four, so the shallowest goes.
        s.push_bounded(staged(4, 10, &[7, 8, 9]), 3030);
        let kept: Vec<usize> = s.iter().map(|x| x.snap.position()).collect();
        assert_eq!(kept, [2, 3, 4]);
        assert_eq!(s.bytes(), 3030);
    }
}
