//! The policy guest's store state and the host side of `policy-config` and
//! `policy-state`.

use super::bindings::policy::qwasi::inference::{policy_config, policy_state};
use super::limits::CpuMeter;
use super::memory::GuestLimits;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};
use wasmtime::Result;
use wasmtime::component::ResourceTable;
use wasmtime_wasi::{WasiCtx, WasiCtxView, WasiView};

pub use super::bindings::policy::exports::qwasi::inference::admission::{Decision, RequestMeta};

pub struct PolicyState {
    pub(super) wasi: WasiCtx,
    pub(super) table: ResourceTable,
    pub(super) limits: GuestLimits,
    pub(super) cpu: CpuMeter,
    pub(super) settings: Vec<(String, String)>,
    pub(super) counters: Arc<Counters>,
}

/// `policy-state` counters, shared by every policy instance of a runtime:
/// (key, window secs, window start in Unix seconds) -> requests counted in
/// that window. The window size is part of the key so that a key counted
/// under two window sizes keeps two counters, and each can be swept on time.
#[derive(Default)]
pub struct Counters(Mutex<HashMap<(String, u32, u64), u64>>);

/// Longest key kept (longer keys are truncated on a char boundary).
const MAX_KEY_BYTES: usize = 256;

impl Counters {
    /// Adds 1 to `key`'s counter for the fixed window of `window_secs`
    /// (aligned to the wall clock) containing `now` (Unix seconds); returns
    /// the new count and the whole seconds until the window ends. Counters of
    /// windows that have ended are swept when a new counter is inserted.
    pub fn incr_at(&self, key: &str, window_secs: u32, now: u64) -> (u64, u32) {
        let window_secs = window_secs.max(1);
        let window = u64::from(window_secs);
        let start = now - now % window;
        let mut end = key.len().min(MAX_KEY_BYTES);
        while !key.is_char_boundary(end) {
            end -= 1;
        }
        let entry = (key[..end].to_string(), window_secs, start);
        let mut map = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if !map.contains_key(&entry) {
            map.retain(|(_, w, s), _| s + u64::from(*w) > now);
        }
        let count = map.entry(entry).or_insert(0);
        *count = count.saturating_add(1);
        (*count, (start + window - now) as u32)
    }
}

impl WasiView for PolicyState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: &mut self.wasi,
            table: &mut self.table,
        }
    }
}

impl policy_config::Host for PolicyState {
    async fn settings(&mut self) -> Result<Vec<(String, String)>> {
        Ok(self.settings.clone())
    }
}

impl policy_state::Host for PolicyState {
    async fn incr(&mut self, key: String, window_secs: u32) -> Result<policy_state::WindowCount> {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        let (count, reset_after) = self.counters.incr_at(&key, window_secs, now);
        Ok(policy_state::WindowCount { count, reset_after })
    }
}

#[cfg(test)]
mod tests {
    use super::Counters;

    #[test]
    fn fixed_windows_per_key_and_sweep() {
        let c = Counters::default();
        assert_eq!(c.incr_at("a", 60, 120), (1, 60));
        assert_eq!(c.incr_at("a", 60, 150), (2, 30));
        assert_eq!(c.incr_at("b", 60, 179), (1, 1));
        assert_eq!(c.incr_at("a", 3600, 179), (1, 3421));
        // A new window: a fresh count, and the ended 60 s windows are swept.
        assert_eq!(c.incr_at("a", 60, 180), (1, 60));
        assert_eq!(c.0.lock().unwrap().len(), 2);
    }
}
