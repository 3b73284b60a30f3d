//! The policy guest's store state and the host side of `policy-config`.

use super::bindings::policy::qwasi::inference::policy_config;
use super::limits::CpuMeter;
use wasmtime::component::ResourceTable;
use wasmtime::{Result, StoreLimits};
use wasmtime_wasi::{WasiCtx, WasiCtxView, WasiView};

pub use super::bindings::policy::exports::qwasi::inference::admission::{Decision, RequestMeta};

pub struct PolicyState {
    pub(super) wasi: WasiCtx,
    pub(super) table: ResourceTable,
    pub(super) limits: StoreLimits,
    pub(super) cpu: CpuMeter,
    pub(super) settings: Vec<(String, String)>,
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
