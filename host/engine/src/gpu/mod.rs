//! GPU backends. One small device layer (alloc/free/copy/launch/module load,
//! one stream, graphs, GEMMs) per vendor with the same inherent API — [`cuda`]
//! through cudarc's driver API and cuBLAS, [`hip`] a dlopen binding to
//! libamdhip64 and libhipblas (compile-checked, not yet run on AMD hardware) —
//! and [`model::GpuModel`], the whole Qwen3.5/3.6 forward as a
//! [`crate::backend::Backend`], on the CUDA layer with `--features cuda` and on
//! the HIP layer with `--features hip` alone (cuda wins when both are on).
//!
//! Kernels live in `kernels/*.cu` (one source for nvcc and hipcc) and are
//! embedded by `build.rs`.

#[cfg(feature = "cuda")]
pub mod cuda;
#[cfg(feature = "hip")]
pub mod hip;
#[cfg(any(feature = "cuda", feature = "hip"))]
mod host_buf;
#[cfg(any(feature = "cuda", feature = "hip"))]
pub use host_buf::HostBuf;
#[cfg(any(feature = "cuda", feature = "hip"))]
pub mod model;
#[cfg(any(feature = "cuda", feature = "hip"))]
pub mod options;
#[cfg(any(feature = "cuda", feature = "hip"))]
pub mod verify;

/// A kernel argument, passed by address to the launch call.
#[derive(Clone, Copy, Debug)]
pub enum Arg {
    /// A device pointer.
    Ptr(u64),
    I32(i32),
    I64(i64),
    U64(u64),
    F32(f32),
}

impl Arg {
    /// The address of the payload, as the driver's `void** kernelParams` wants it.
    pub fn addr(&self) -> *mut std::ffi::c_void {
        match self {
            Arg::Ptr(v) | Arg::U64(v) => v as *const u64 as *mut _,
            Arg::I32(v) => v as *const i32 as *mut _,
            Arg::I64(v) => v as *const i64 as *mut _,
            Arg::F32(v) => v as *const f32 as *mut _,
        }
    }
}

/// `usize` -> `Arg::I32` (shapes and strides fit in 32 bits).
pub fn i(v: usize) -> Arg {
    Arg::I32(i32::try_from(v).expect("kernel int argument overflows i32"))
}
pub fn f(v: f32) -> Arg {
    Arg::F32(v)
}
