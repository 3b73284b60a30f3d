//! The contract a vendor layer implements: the raw driver calls, nothing
//! else. Everything they have in common (buffer ownership, kernel lookup,
//! launch policy, profiling, error messages) is in [`super::Device`].

use super::Launch;
use std::ffi::{CStr, c_void};

/// A driver call's failure, as the vendor names it (`CUDA_ERROR_OUT_OF_MEMORY`,
/// `out of memory (HIP error 2)`); [`super::Device`] says which operation failed.
#[derive(Debug)]
pub struct RawError(pub String);

impl std::fmt::Display for RawError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

pub type RawResult<T> = Result<T, RawError>;

/// What [`RawDevice::open`] learns about the device.
#[derive(Clone, Debug, Default)]
pub struct DeviceInfo {
    pub name: String,
    pub sm_count: u32,
    /// Largest dynamic shared memory of one block in bytes (0: unknown).
    pub max_smem: usize,
    /// Programmatic dependent launch is available.
    pub pdl: bool,
    /// Bulk copies into shared memory with mbarriers (sm_90+).
    pub bulk_copies: bool,
    /// The sm_90a warpgroup-MMA kernels run here.
    pub wgmma: bool,
    /// Block-scaled FP8 GEMMs run here ([`RawDevice::gemm_fp8_blocks`]:
    /// cuBLASLt's 1x128 / 128x128 scale modes exist on sm_90 only).
    pub fp8_gemm: bool,
    /// Stream capture and graphs are available.
    pub graphs: bool,
    /// Why the vendor BLAS is unavailable, if it is.
    pub blas_error: Option<String>,
}

/// One vendor's driver: a device with one stream that every launch, copy
/// and GEMM is ordered on. Implementations own their handles and release
/// them on drop; [`super::Device`] keeps the raw device alive (in an `Arc`)
/// for as long as any buffer or graph made from it.
///
/// # Safety
/// Implementations must be usable from any thread one at a time (the model
/// serialises forward passes behind a mutex), hence `Send + Sync`.
pub unsafe trait RawDevice: Send + Sync + Sized + 'static {
    type Module;
    type Function: Copy;
    type Event: Copy;
    type Graph;
    /// "CUDA" or "HIP", for messages.
    const VENDOR: &'static str;
    /// The profile's name for a BLAS GEMM.
    const GEMM_LABEL: &'static str;
    /// The embedded kernel images: (source file stem, fatbin or code object).
    const IMAGES: &'static [(&'static str, &'static [u8])];

    /// GPU 0, or an error saying what is missing (driver, runtime, device).
    fn open() -> anyhow::Result<(Self, DeviceInfo)>;
    /// Makes the device current on this thread.
    fn bind(&self) -> RawResult<()>;
    /// (free, total) bytes.
    fn mem_info(&self) -> RawResult<(usize, usize)>;

    fn malloc(&self, bytes: usize) -> RawResult<u64>;
    /// # Safety
    /// `ptr` came from [`RawDevice::malloc`] and is not used again.
    unsafe fn free(&self, ptr: u64);
    fn host_malloc(&self, bytes: usize) -> RawResult<*mut u8>;
    /// # Safety
    /// `ptr` came from [`RawDevice::host_malloc`] and is not used again.
    unsafe fn host_free(&self, ptr: *mut c_void);
    /// Zeroes `bytes` at `ptr`, complete on return.
    ///
    /// # Safety
    /// The range is device memory of this device.
    unsafe fn memset_zero(&self, ptr: u64, bytes: usize) -> RawResult<()>;
    /// Copies after all earlier work on the stream, complete on return.
    ///
    /// # Safety
    /// `src` is readable for `bytes` bytes of host memory, `dst` device memory.
    unsafe fn htod(&self, dst: u64, src: *const c_void, bytes: usize) -> RawResult<()>;
    /// # Safety
    /// `dst` is writable for `bytes` bytes of host memory, `src` device memory.
    unsafe fn dtoh(&self, dst: *mut c_void, src: u64, bytes: usize) -> RawResult<()>;
    /// # Safety
    /// Both ranges are device memory of this device.
    unsafe fn dtod(&self, dst: u64, src: u64, bytes: usize) -> RawResult<()>;
    /// Waits for all work on the device.
    fn sync(&self) -> RawResult<()>;

    /// Loads an image (8-byte aligned, kept alive by the caller).
    fn load_module(&self, image: &[u8]) -> RawResult<Self::Module>;
    fn function(&self, module: &Self::Module, name: &CStr) -> RawResult<Self::Function>;
    /// Lets `f` use `smem` bytes of dynamic shared memory where the vendor
    /// needs an opt-in for that much.
    fn allow_smem(&self, f: Self::Function, smem: u32);
    /// Resident blocks per multiprocessor, if the runtime can say.
    fn occupancy(&self, f: Self::Function, block: u32, smem: u32) -> Option<u32>;
    /// Enqueues `f` on the stream, with the programmatic-dependent-launch
    /// attribute when `pdl`.
    ///
    /// # Safety
    /// `args` holds one pointer per kernel parameter, to a value of its type.
    unsafe fn launch(
        &self,
        f: Self::Function,
        launch: &Launch,
        pdl: bool,
        args: &[*const c_void],
    ) -> RawResult<()>;

    fn event_create(&self) -> RawResult<Self::Event>;
    fn event_record(&self, e: Self::Event);
    /// Milliseconds between two recorded events (after a sync).
    fn event_elapsed(&self, start: Self::Event, end: Self::Event) -> f32;
    fn event_destroy(&self, e: Self::Event);

    /// The size of a physical page of device memory that [`RawDevice::map`]
    /// maps (CUDA's virtual memory management, 2 MB on the H200); `None`
    /// where the driver cannot map pages into reserved addresses, and the
    /// callers keep to [`RawDevice::malloc`].
    fn page_size(&self) -> Option<usize> {
        None
    }
    /// Reserves `bytes` (a multiple of the page size) of device address space, unbacked.
    fn va_reserve(&self, _bytes: usize) -> RawResult<u64> {
        Err(RawError("no virtual memory management".into()))
    }
    /// # Safety
    /// The range came from [`RawDevice::va_reserve`], nothing is mapped in it,
    /// and it is not used again.
    unsafe fn va_free(&self, _ptr: u64, _bytes: usize) {}
    /// A physical page of [`RawDevice::page_size`] bytes; its handle.
    fn page_create(&self) -> RawResult<u64> {
        Err(RawError("no virtual memory management".into()))
    }
    /// # Safety
    /// The handle came from [`RawDevice::page_create`]; no mapping of it is
    /// used again (a page released while mapped lives until unmapped).
    unsafe fn page_release(&self, _page: u64) {}
    /// Maps `page` at `va` (page-aligned, reserved, unmapped); no access
    /// until [`RawDevice::grant_access`].
    ///
    /// # Safety
    /// `va` lies in a reserved range of this device.
    unsafe fn map(&self, _va: u64, _page: u64) -> RawResult<()> {
        Err(RawError("no virtual memory management".into()))
    }
    /// Makes `bytes` at `va` (whole pages, all mapped, maybe several)
    /// readable and writable by this device: one call for a run of pages.
    ///
    /// # Safety
    /// Every page of the range is mapped.
    unsafe fn grant_access(&self, _va: u64, _bytes: usize) -> RawResult<()> {
        Err(RawError("no virtual memory management".into()))
    }
    /// Unmaps the page at `va`.
    ///
    /// # Safety
    /// A page is mapped at `va`, the work that used it is complete, and none
    /// queued later reads it.
    unsafe fn unmap(&self, _va: u64) {}

    /// Starts recording this thread's launches on the stream into a graph.
    fn begin_capture(&self) -> RawResult<()>;
    /// Ends the capture and instantiates it.
    fn end_capture(&self) -> RawResult<Self::Graph>;
    fn graph_launch(&self, g: &Self::Graph) -> RawResult<()>;
    fn graph_destroy(&self, g: &mut Self::Graph);
    /// Starts or stops the range an attached profiler collects (`ncu
    /// --profile-from-start off`); nothing without one, or where the
    /// vendor layer has no such call.
    fn profiler_range(&self, _on: bool) {}

    /// `Y[T, R] (+)= X[T, C] . W[R, C]^T`, bf16 X and W row-major, f32 Y and
    /// compute, on the stream (shapes checked by the caller).
    ///
    /// # Safety
    /// The pointers are device memory of the stated shapes.
    #[allow(clippy::too_many_arguments)]
    unsafe fn gemm_bf16(
        &self,
        x_bf16: u64,
        w: u64,
        y: u64,
        t: i32,
        r: i32,
        c: i32,
        accumulate: bool,
    ) -> RawResult<()>;

    /// `Y[T, R] (+)= (X[T, C] . W[R, C]^T)` on FP8 tensor cores: E4M3 X
    /// with an f32 scale per row and 128 columns (`xs[(c / 128) * T + t]`),
    /// E4M3 W with one per 128x128 block (`ws[(r / 128) * C / 128 + c /
    /// 128]`), f32 Y and accumulation. Only where `DeviceInfo::fp8_gemm`.
    ///
    /// # Safety
    /// The pointers are device memory of the stated shapes.
    #[allow(clippy::too_many_arguments)]
    unsafe fn gemm_fp8_blocks(
        &self,
        _x: u64,
        _xs: u64,
        _w: u64,
        _ws: u64,
        _y: u64,
        _shape: (i32, i32, i32),
        _accumulate: bool,
    ) -> RawResult<()> {
        Err(RawError(format!(
            "{}: no block-scaled FP8 GEMMs on this device",
            Self::VENDOR
        )))
    }
}
