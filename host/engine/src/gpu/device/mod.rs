//! The vendor-neutral device layer: one [`Device`] over a vendor's
//! [`RawDevice`] (CUDA: `gpu::cuda`, HIP: `gpu::hip`), which supplies only the
//! driver calls. Written once here: device buffers freed on drop ([`DBuf`]),
//! graph capture and replay ([`Graph`]), kernel lookup by [`Kernel`] from the
//! embedded modules, the launch policy (empty grids skipped, shared-memory
//! limit and opt-in, programmatic dependent launch only where the device has
//! it and neither debugging nor profiling is on), the per-launch event
//! profile, BLAS GEMM shape checks, and the error messages.
//!
//! Kernels are launched through the typed functions `build.rs` generates
//! from the kernel sources (`gpu::kernels`); [`Device::launch_raw`] is their
//! untyped back end.

#[cfg(test)]
pub(crate) mod mock;
pub mod pages;
pub mod raw;
#[cfg(test)]
mod tests;

use super::HostBuf;
use anyhow::{Context, Result, anyhow, bail};
pub use raw::{DeviceInfo, RawDevice, RawError, RawResult};
use std::collections::HashMap;
use std::ffi::{CString, c_void};
use std::sync::{Arc, Mutex};

/// A device address, as kernels take pointers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[repr(transparent)]
pub struct DevPtr(pub u64);

/// `u64` device address -> [`DevPtr`] (a kernel's pointer argument).
pub fn dptr(addr: u64) -> DevPtr {
    DevPtr(addr)
}

/// How a kernel is launched: grid and block in (x, y, z), dynamic shared
/// memory in bytes, and whether it may overlap its predecessor's tail
/// (programmatic dependent launch: only for kernels that touch nothing but
/// read-only inputs before `QW_GRID_WAIT()`; ignored where unsupported).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Launch {
    pub grid: (u32, u32, u32),
    pub block: (u32, u32, u32),
    pub smem: u32,
    pub pdl: bool,
}

impl Launch {
    pub fn new(grid: (u32, u32, u32), block: (u32, u32, u32), smem: u32) -> Self {
        Launch {
            grid,
            block,
            smem,
            pdl: false,
        }
    }

    /// A launch with programmatic dependent launch requested.
    pub fn pdl(grid: (u32, u32, u32), block: (u32, u32, u32), smem: u32) -> Self {
        Launch {
            pdl: true,
            ..Launch::new(grid, block, smem)
        }
    }
}

/// An entry point of the embedded kernel modules. The generated
/// `gpu::kernels` defines one constant per kernel (`Kernel::dec_gemv`) and
/// `Kernel::ALL`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Kernel {
    index: u16,
    name: &'static str,
    module: &'static str,
}

impl Kernel {
    /// Kernel `index` of the table it is listed in, `name` in the module
    /// built from `kernels/{module}.cu`.
    pub const fn new(index: usize, name: &'static str, module: &'static str) -> Self {
        assert!(index < u16::MAX as usize);
        Kernel {
            index: index as u16,
            name,
            module,
        }
    }
    pub fn name(self) -> &'static str {
        self.name
    }
    pub fn module(self) -> &'static str {
        self.module
    }
}

/// Switches of the device layer, read once with the other GPU options
/// (`gpu::options`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DeviceOptions {
    /// `QWASI_PDL=0`: no programmatic dependent launch (CUDA, sm_90+).
    pub pdl: bool,
    /// `QWASI_GPU_DEBUG=1`: synchronise after every launch and name the failing kernel.
    pub debug: bool,
    /// `QWASI_GPU_PROFILE=1`: an event pair around every launch and GEMM
    /// (see [`Device::take_profile`]).
    pub profile: bool,
}

/// Owned device memory; freed on drop.
pub struct DBuf<R: RawDevice> {
    ptr: u64,
    bytes: usize,
    raw: Arc<R>,
}

impl<R: RawDevice> DBuf<R> {
    pub fn ptr(&self) -> u64 {
        self.ptr
    }
    /// The address `off` bytes in.
    pub fn at(&self, off: usize) -> u64 {
        debug_assert!(off <= self.bytes);
        self.ptr + off as u64
    }
    pub fn bytes(&self) -> usize {
        self.bytes
    }
}

impl<R: RawDevice> Drop for DBuf<R> {
    fn drop(&mut self) {
        if self.ptr != 0 {
            // SAFETY: from `malloc`, owned by this value alone.
            unsafe { self.raw.free(self.ptr) }
        }
    }
}

/// An instantiated graph (one captured decode step).
pub struct Graph<R: RawDevice> {
    graph: R::Graph,
    raw: Arc<R>,
}

impl<R: RawDevice> Drop for Graph<R> {
    fn drop(&mut self) {
        self.raw.graph_destroy(&mut self.graph);
    }
}

// Only used from the thread that holds the model's lock.
unsafe impl<R: RawDevice> Send for Graph<R> {}

/// A profiled launch: kernel name, start and end events.
type Timing<E> = (&'static str, E, E);

pub struct Device<R: RawDevice> {
    raw: Arc<R>,
    /// Indexed by [`Kernel`]'s index.
    funcs: Vec<R::Function>,
    pub name: String,
    pub sm_count: u32,
    /// Synchronise after every launch and name the failing kernel.
    pub debug: bool,
    info: DeviceInfo,
    /// Programmatic dependent launch in effect (device, options, and neither
    /// debugging nor profiling, which want launches to serialise).
    pdl: bool,
    profile: Option<Mutex<Vec<Timing<R::Event>>>>,
    /// The loaded modules and the aligned images given to the driver, kept
    /// for the device's lifetime.
    _modules: Vec<R::Module>,
    _images: Vec<Vec<u64>>,
    /// Released physical pages kept for reuse ([`pages::PagePool`]).
    pages: Arc<pages::PagePool<R>>,
}

impl<R: RawDevice> Drop for Device<R> {
    fn drop(&mut self) {
        self.pages.clear_parked();
    }
}

// The raw handles are only used from one thread at a time (the model
// serialises forward passes behind a mutex).
unsafe impl<R: RawDevice> Send for Device<R> {}
unsafe impl<R: RawDevice> Sync for Device<R> {}

impl<R: RawDevice> Device<R> {
    /// GPU 0 with `kernels` (every kernel of `R::IMAGES`) looked up, or a
    /// clear error when there is no driver or no device.
    pub fn open(kernels: &[Kernel], opts: DeviceOptions) -> Result<Self> {
        let (raw, info) = R::open()?;
        let raw = Arc::new(raw);
        let mut funcs = vec![None; kernels.len()];
        let (mut modules, mut images) = (Vec::new(), Vec::new());
        for (module, image) in R::IMAGES {
            // The driver parses the image in place: copy it to an aligned
            // buffer (the embedded bytes are 'static but may be unaligned).
            let mut aligned = vec![0u64; image.len().div_ceil(8) + 1];
            // SAFETY: `aligned` holds at least `image.len()` bytes.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    image.as_ptr(),
                    aligned.as_mut_ptr().cast(),
                    image.len(),
                );
            }
            // SAFETY: the same bytes, viewed as bytes.
            let bytes =
                unsafe { std::slice::from_raw_parts(aligned.as_ptr().cast::<u8>(), image.len()) };
            let m = raw
                .load_module(bytes)
                .map_err(|e| anyhow!("loading kernel module {module} on {}: {e}", info.name))?;
            for (i, k) in kernels.iter().enumerate() {
                if k.module == *module {
                    debug_assert_eq!(k.index as usize, i);
                    let name = CString::new(k.name).expect("kernel names have no NUL");
                    let f = raw
                        .function(&m, &name)
                        .map_err(|e| anyhow!("kernel {} in module {module}: {e}", k.name))?;
                    funcs[i] = Some(f);
                }
            }
            modules.push(m);
            images.push(aligned);
        }
        let funcs = kernels
            .iter()
            .zip(funcs)
            .map(|(k, f)| {
                f.with_context(|| format!("kernel {} not found in the embedded modules", k.name))
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Device {
            pdl: info.pdl && opts.pdl && !opts.debug && !opts.profile,
            name: info.name.clone(),
            sm_count: info.sm_count.max(1),
            debug: opts.debug,
            profile: opts.profile.then(Default::default),
            pages: pages::PagePool::new(raw.clone()),
            raw,
            funcs,
            info,
            _modules: modules,
            _images: images,
        })
    }

    /// Largest dynamic shared memory one block may use, in bytes
    /// (`usize::MAX` when the runtime does not say).
    pub fn max_shared_per_block(&self) -> usize {
        if self.info.max_smem == 0 {
            usize::MAX
        } else {
            self.info.max_smem
        }
    }

    /// Whether kernels can use bulk copies into shared memory (`cp.async.bulk`
    /// with mbarriers: CUDA compute capability 9.0 and later).
    pub fn bulk_copies(&self) -> bool {
        self.info.bulk_copies
    }

    /// Whether the sm_90a kernels with warpgroup MMA (`wgmma`) run here.
    pub fn wgmma(&self) -> bool {
        self.info.wgmma
    }

    /// Whether block-scaled FP8 GEMMs ([`Self::gemm_fp8_blocks`]) run here.
    pub fn fp8_gemm(&self) -> bool {
        self.info.fp8_gemm
    }

    /// Whether this runtime has stream capture and graphs.
    pub fn graphs_supported(&self) -> bool {
        self.info.graphs
    }

    /// Why BLAS GEMMs are unavailable, if they are.
    pub fn blas_error(&self) -> Option<&str> {
        self.info.blas_error.as_deref()
    }

    pub fn profiling(&self) -> bool {
        self.profile.is_some()
    }

    /// Makes the device current on this thread.
    pub fn bind(&self) -> Result<()> {
        self.raw
            .bind()
            .map_err(|e| anyhow!("binding the {} device: {e}", R::VENDOR))
    }

    /// (free, total) device memory in bytes ((0, 0) if the runtime fails).
    pub fn mem_info(&self) -> (usize, usize) {
        self.raw.mem_info().unwrap_or((0, 0))
    }

    pub fn sync(&self) -> Result<()> {
        self.raw
            .sync()
            .map_err(|e| anyhow!("{} error: {e}", R::VENDOR))
    }

    pub fn alloc(&self, bytes: usize) -> Result<DBuf<R>> {
        let ptr = self
            .raw
            .malloc(bytes.max(16))
            .map_err(|e| anyhow!("{} allocation of {bytes} bytes failed: {e}", R::VENDOR))?;
        Ok(DBuf {
            ptr,
            bytes,
            raw: self.raw.clone(),
        })
    }

    pub fn alloc_zeroed(&self, bytes: usize) -> Result<DBuf<R>> {
        let b = self.alloc(bytes)?;
        // SAFETY: the whole (rounded-up) allocation.
        unsafe { self.raw.memset_zero(b.ptr, bytes.max(16)) }
            .map_err(|e| anyhow!("zeroing {bytes} bytes: {e}"))?;
        Ok(b)
    }

    pub fn upload<T: Copy>(&self, data: &[T]) -> Result<DBuf<R>> {
        let b = self.alloc(std::mem::size_of_val(data))?;
        self.htod(b.ptr, data)?;
        Ok(b)
    }

    /// `bytes` at `src` copied into new page-locked host memory (filled by
    /// the copy before anyone can read it).
    pub fn download_pinned(&self, src: u64, bytes: usize) -> Result<HostBuf> {
        let ptr = self
            .raw
            .host_malloc(bytes.max(16))
            .map_err(|e| anyhow!("pinned host allocation of {bytes} bytes failed: {e}"))?;
        let raw = self.raw.clone();
        // SAFETY (release): the pointer from `host_malloc`, released once by HostBuf's drop.
        let b = HostBuf::new(ptr, bytes, move |p| unsafe { raw.host_free(p) });
        if bytes > 0 {
            // SAFETY: `ptr` holds at least `bytes` bytes.
            unsafe { self.raw.dtoh(ptr.cast(), src, bytes) }
                .map_err(|e| anyhow!("copy from device: {e}"))?;
        }
        Ok(b)
    }

    pub fn htod<T: Copy>(&self, dst: u64, data: &[T]) -> Result<()> {
        if data.is_empty() {
            return Ok(());
        }
        // SAFETY: `data` is readable for its size; `dst` is the caller's device range.
        unsafe {
            self.raw
                .htod(dst, data.as_ptr().cast(), std::mem::size_of_val(data))
        }
        .map_err(|e| anyhow!("copy to device: {e}"))
    }

    pub fn dtoh<T: Copy>(&self, dst: &mut [T], src: u64) -> Result<()> {
        if dst.is_empty() {
            return Ok(());
        }
        // SAFETY: `dst` is writable for its size; `T: Copy` has no invariants
        // the device's bytes could break for the plain types used here.
        unsafe {
            self.raw
                .dtoh(dst.as_mut_ptr().cast(), src, std::mem::size_of_val(dst))
        }
        .map_err(|e| anyhow!("copy from device: {e}"))
    }

    pub fn dtod(&self, dst: u64, src: u64, bytes: usize) -> Result<()> {
        if bytes == 0 {
            return Ok(());
        }
        // SAFETY: the caller's device ranges.
        unsafe { self.raw.dtod(dst, src, bytes) }.map_err(|e| anyhow!("device copy: {e}"))
    }

    /// Starts recording this thread's launches into a graph instead of running them.
    pub fn begin_capture(&self) -> Result<()> {
        self.raw
            .begin_capture()
            .map_err(|e| anyhow!("beginning {} graph capture: {e}", R::VENDOR))
    }

    /// Ends the capture begun by [`Device::begin_capture`] and instantiates it.
    pub fn end_capture(&self) -> Result<Graph<R>> {
        let graph = self
            .raw
            .end_capture()
            .map_err(|e| anyhow!("ending {} graph capture: {e}", R::VENDOR))?;
        Ok(Graph {
            graph,
            raw: self.raw.clone(),
        })
    }

    pub fn launch_graph(&self, g: &Graph<R>) -> Result<()> {
        self.raw
            .graph_launch(&g.graph)
            .map_err(|e| anyhow!("launching a {} graph: {e}", R::VENDOR))?;
        if self.debug {
            self.sync()
                .with_context(|| format!("{} graph", R::VENDOR))?;
        }
        Ok(())
    }

    /// Resident blocks per multiprocessor of kernel `k` at this block size
    /// and dynamic shared memory (at least 1).
    pub fn occupancy(&self, k: Kernel, block: u32, smem: u32) -> u32 {
        self.raw
            .occupancy(self.funcs[k.index as usize], block, smem)
            .map_or(1, |n| n.max(1))
    }

    /// Launches kernel `k` with `args`, one pointer per kernel parameter.
    /// Called by the typed launches of `gpu::kernels`.
    ///
    /// # Safety
    /// `args` must match `k`'s parameter list: one pointer per parameter, in
    /// order, each to a value of the parameter's type.
    pub unsafe fn launch_raw(&self, k: Kernel, l: Launch, args: &[*const c_void]) -> Result<()> {
        let (grid, block, smem) = (l.grid, l.block, l.smem);
        if grid.0 == 0 || grid.1 == 0 || grid.2 == 0 {
            return Ok(());
        }
        if smem as usize > self.max_shared_per_block() {
            bail!(
                "kernel {} needs {smem} bytes of shared memory per block; {} allows {}",
                k.name,
                self.name,
                self.info.max_smem
            );
        }
        let f = self.funcs[k.index as usize];
        self.raw.allow_smem(f, smem);
        let pdl = l.pdl && self.pdl;
        self.profiled(k.name, || {
            // SAFETY: the caller's contract.
            unsafe { self.raw.launch(f, &l, pdl, args) }
                .map_err(|e| anyhow!("launching {}: {e}", k.name))
        })?;
        if self.debug {
            self.sync().with_context(|| {
                format!(
                    "kernel {} grid {grid:?} block {block:?} smem {smem}",
                    k.name
                )
            })?;
        }
        Ok(())
    }

    /// `Y[T, R] = X[T, C] . W[R, C]^T` (`+=` with `accumulate`) with block-FP8
    /// X (a scale per row and 128 columns, column-group-major) and W (one per
    /// 128x128 block), f32 Y: see [`RawDevice::gemm_fp8_blocks`].
    #[allow(clippy::too_many_arguments)]
    pub fn gemm_fp8_blocks(
        &self,
        (x, xs): (u64, u64),
        (w, ws): (u64, u64),
        y: u64,
        t: usize,
        r: usize,
        c: usize,
        accumulate: bool,
    ) -> Result<()> {
        self.blas_call("cublaslt_gemm_fp8", (t, r, c), |shape| {
            // SAFETY: the caller's buffers of these shapes.
            unsafe { self.raw.gemm_fp8_blocks(x, xs, w, ws, y, shape, accumulate) }
        })
    }

    /// `Y[T, R] = X[T, C] . W[R, C]^T` (`+=` with `accumulate`) with bf16 X
    /// and W (row-major), f32 Y, f32 compute, on the vendor's BLAS.
    #[allow(clippy::too_many_arguments)]
    pub fn gemm_bf16(
        &self,
        x_bf16: u64,
        w: u64,
        y: u64,
        t: usize,
        r: usize,
        c: usize,
        accumulate: bool,
    ) -> Result<()> {
        self.blas_call(R::GEMM_LABEL, (t, r, c), |(t, r, c)| {
            // SAFETY: the caller's buffers of these shapes.
            unsafe { self.raw.gemm_bf16(x_bf16, w, y, t, r, c, accumulate) }
        })
    }

    /// One vendor-library GEMM of `(t, r, c)` as `call` takes them (i32),
    /// profiled under `label`; errors name the call and its shape.
    fn blas_call(
        &self,
        label: &'static str,
        (t, r, c): (usize, usize, usize),
        call: impl FnOnce((i32, i32, i32)) -> RawResult<()>,
    ) -> Result<()> {
        let dim = |v: usize| {
            i32::try_from(v).map_err(|_| anyhow!("{label} {t}x{r}x{c}: dimension {v} exceeds i32"))
        };
        let shape = (dim(t)?, dim(r)?, dim(c)?);
        self.profiled(label, || {
            call(shape).map_err(|e| anyhow!("{label} {t}x{r}x{c}: {e}"))
        })
    }

    /// Runs `enqueue` between two recorded events when profiling.
    fn profiled(&self, name: &'static str, enqueue: impl FnOnce() -> Result<()>) -> Result<()> {
        let Some(p) = &self.profile else {
            return enqueue();
        };
        let new = || {
            self.raw
                .event_create()
                .map_err(|e| anyhow!("creating a profile event: {e}"))
        };
        let (a, b) = (new()?, new()?);
        self.raw.event_record(a);
        enqueue()?;
        self.raw.event_record(b);
        p.lock().unwrap().push((name, a, b));
        Ok(())
    }

    /// Starts (`true`) or stops the range an attached profiler such as
    /// `ncu --profile-from-start off` collects.
    pub fn profiler_range(&self, on: bool) {
        self.raw.profiler_range(on)
    }

    /// Per-kernel GPU time since the last call, `(name, launches, ms)` by total
    /// time, when profiling (empty otherwise). Synchronises.
    pub fn take_profile(&self) -> Vec<(&'static str, usize, f64)> {
        let Some(p) = &self.profile else {
            return Vec::new();
        };
        let _ = self.sync();
        let mut agg: HashMap<&'static str, (usize, f64)> = HashMap::new();
        for (name, a, b) in p.lock().unwrap().drain(..) {
            let ms = self.raw.event_elapsed(a, b);
            self.raw.event_destroy(a);
            self.raw.event_destroy(b);
            let e = agg.entry(name).or_default();
            e.0 += 1;
            e.1 += ms as f64;
        }
        let mut v: Vec<_> = agg.into_iter().map(|(k, (n, t))| (k, n, t)).collect();
        v.sort_by(|a, b| b.2.total_cmp(&a.2));
        v
    }
}
