//! Guest CPU accounting.
//!
//! Epoch interruption alone can't tell a guest spinning in WebAssembly from one
//! waiting in a host call (a streamed generation may legitimately take
//! minutes): epochs advance with wall time either way. So every store records,
//! through wasmtime's call hook, how long it actually ran WebAssembly, and the
//! epoch callback (once per tick while the guest runs wasm) traps when that
//! time is over the limit, otherwise yields to the async executor so one guest
//! never hogs a runtime worker thread.

use std::time::{Duration, Instant};
use wasmtime::{CallHook, StoreContextMut, UpdateDeadline};

/// Epoch tick period (one ticker thread per engine).
pub const EPOCH_TICK: Duration = Duration::from_millis(10);

/// The message of the trap raised when a guest runs out of CPU time.
pub const CPU_LIMIT_MESSAGE: &str = "the guest exceeded its CPU time limit";

pub struct CpuMeter {
    limit: Duration,
    used: Duration,
    /// When the guest last (re-)entered WebAssembly, while it runs it.
    entered: Option<Instant>,
}

impl CpuMeter {
    pub fn new(limit: Duration) -> Self {
        CpuMeter {
            limit,
            used: Duration::ZERO,
            entered: None,
        }
    }

    pub fn hook(&mut self, h: CallHook) {
        match h {
            CallHook::CallingWasm | CallHook::ReturningFromHost => {
                self.entered = Some(Instant::now());
            }
            CallHook::CallingHost | CallHook::ReturningFromWasm => {
                if let Some(t) = self.entered.take() {
                    self.used += t.elapsed();
                }
            }
        }
    }

    pub fn used(&self) -> Duration {
        self.used + self.entered.map(|t| t.elapsed()).unwrap_or_default()
    }

    pub fn exceeded(&self) -> bool {
        !self.limit.is_zero() && self.used() > self.limit
    }
}

/// Installs the call hook and the epoch callback on a store whose data holds a
/// [`CpuMeter`] (reached through `meter`).
pub fn install<T: Send + 'static>(
    store: &mut wasmtime::Store<T>,
    meter: fn(&mut T) -> &mut CpuMeter,
) {
    store.call_hook(move |mut cx: StoreContextMut<'_, T>, h| {
        meter(cx.data_mut()).hook(h);
        Ok(())
    });
    store.set_epoch_deadline(1);
    store.epoch_deadline_callback(move |mut cx: StoreContextMut<'_, T>| {
        let m = meter(cx.data_mut());
        if m.exceeded() {
            return Err(wasmtime::Error::msg(format!(
                "{CPU_LIMIT_MESSAGE} ({:.1} s)",
                m.limit.as_secs_f64()
            )));
        }
        Ok(UpdateDeadline::Yield(1))
    });
}
