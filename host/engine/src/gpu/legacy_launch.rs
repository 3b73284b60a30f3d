//! TEMPORARY: the string-named launch path, until the model's call sites
//! move to the typed launches of `gpu::kernels` (after the h-split merge).

use super::Device;
use super::device::{AsKernel, Kernel, Launch};
use anyhow::{Context, Result};

/// A kernel argument, passed by address to the launch call.
#[derive(Clone, Copy, Debug)]
pub enum Arg {
    Ptr(u64),
    I32(i32),
    I64(i64),
    U64(u64),
    F32(f32),
}

impl Arg {
    fn addr(&self) -> *const std::ffi::c_void {
        match self {
            Arg::Ptr(v) | Arg::U64(v) => v as *const u64 as *const _,
            Arg::I32(v) => v as *const i32 as *const _,
            Arg::I64(v) => v as *const i64 as *const _,
            Arg::F32(v) => v as *const f32 as *const _,
        }
    }
}

pub fn i(v: usize) -> Arg {
    Arg::I32(i32::try_from(v).expect("kernel int argument overflows i32"))
}
pub fn f(v: f32) -> Arg {
    Arg::F32(v)
}

fn kernel(name: &str) -> Result<Kernel> {
    Kernel::ALL
        .iter()
        .copied()
        .find(|k| k.name() == name)
        .with_context(|| format!("kernel {name} not found in the embedded modules"))
}

impl Device {
    pub fn launch(
        &self,
        name: &'static str,
        grid: (u32, u32, u32),
        block: (u32, u32, u32),
        smem: u32,
        args: &[Arg],
    ) -> Result<()> {
        let a: Vec<_> = args.iter().map(Arg::addr).collect();
        unsafe { self.launch_raw(kernel(name)?, Launch::new(grid, block, smem), &a) }
    }

    pub fn launch_pdl(
        &self,
        name: &'static str,
        grid: (u32, u32, u32),
        block: (u32, u32, u32),
        smem: u32,
        args: &[Arg],
    ) -> Result<()> {
        let a: Vec<_> = args.iter().map(Arg::addr).collect();
        unsafe { self.launch_raw(kernel(name)?, Launch::pdl(grid, block, smem), &a) }
    }
}

impl AsKernel for &str {
    fn kernel(self) -> Option<Kernel> {
        kernel(self).ok()
    }
}
