//! GPU backends. One vendor-neutral device layer, [`device`] (buffers,
//! graphs, launches, profiling, GEMM checks, error messages), over the raw
//! driver calls of one vendor — [`cuda`] through cudarc's driver API and
//! cuBLAS, [`hip`] a dlopen binding to libamdhip64 and libhipblas
//! (compile-checked, not yet run on AMD hardware) — and
//! [`model::GpuModel`], the whole Qwen3.5/3.6 forward as a
//! [`crate::backend::Backend`], on CUDA with `--features cuda` and on HIP
//! with `--features hip` alone (cuda wins when both are on).
//!
//! Kernels live in `kernels/*.cu` (one source for nvcc and hipcc), are
//! embedded by `build.rs`, and are launched through [`kernels`]: a typed
//! function per kernel generated from its C++ signature.

#[cfg(feature = "cuda")]
pub mod cuda;
#[cfg(feature = "cuda")]
mod cuda_fp8_gemm;
#[cfg(any(feature = "cuda", feature = "hip", test))]
pub mod device;
#[cfg(feature = "hip")]
pub mod hip;
#[cfg(any(feature = "cuda", feature = "hip", test))]
mod host_buf;
#[cfg(any(feature = "cuda", feature = "hip", test))]
pub use host_buf::HostBuf;
#[cfg(test)]
mod kernel_sigs;
#[cfg(any(feature = "cuda", feature = "hip"))]
pub mod kernels;
#[cfg(any(feature = "cuda", feature = "hip"))]
pub mod model;
#[cfg(any(feature = "cuda", feature = "hip"))]
pub mod options;
#[cfg(any(feature = "cuda", feature = "hip"))]
pub mod verify;
#[cfg(any(feature = "cuda", feature = "hip"))]
mod verify_batch;
#[cfg(any(feature = "cuda", feature = "hip"))]
mod verify_compare;
#[cfg(any(feature = "cuda", feature = "hip"))]
mod verify_constrained;
#[cfg(any(feature = "cuda", feature = "hip"))]
mod verify_fp8;
#[cfg(any(feature = "cuda", feature = "hip"))]
mod verify_fp8_gemm;
#[cfg(any(feature = "cuda", feature = "hip"))]
mod verify_pass_snapshots;
#[cfg(any(feature = "cuda", feature = "hip"))]
mod verify_weighted;

/// The driver the model runs on: CUDA when the feature is on, else HIP.
#[cfg(feature = "cuda")]
pub type Vendor = cuda::Cuda;
#[cfg(all(feature = "hip", not(feature = "cuda")))]
pub type Vendor = hip::Hip;
#[cfg(any(feature = "cuda", feature = "hip"))]
pub type Device = device::Device<Vendor>;
#[cfg(any(feature = "cuda", feature = "hip"))]
pub type DBuf = device::DBuf<Vendor>;
#[cfg(any(feature = "cuda", feature = "hip"))]
pub type Graph = device::Graph<Vendor>;

#[cfg(any(feature = "cuda", feature = "hip"))]
impl Device {
    /// GPU 0 with every embedded kernel.
    pub fn new(opts: &device::DeviceOptions) -> anyhow::Result<Self> {
        Self::open(device::Kernel::ALL, *opts)
    }
}

#[cfg(any(feature = "cuda", feature = "hip", test))]
pub use device::dptr;

/// `usize` -> a kernel's `int` argument (shapes and strides fit in 32 bits).
pub fn i(v: usize) -> i32 {
    i32::try_from(v).expect("kernel int argument overflows i32")
}
