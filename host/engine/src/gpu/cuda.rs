//! The CUDA device layer: a primary context on GPU 0, the embedded kernel
//! modules, device buffers, launches on one stream (capturable into CUDA
//! graphs), cuBLAS GEMMs, and an optional per-kernel event profile.

use super::{Arg, HostBuf};
use anyhow::{Context, Result, bail};
use cudarc::cublas::sys as cbs;
use cudarc::driver::{CudaContext, result, sys};
use std::collections::HashMap;
use std::ffi::{CString, c_void};
use std::sync::Arc;

mod images {
    include!(concat!(env!("OUT_DIR"), "/kernels_cuda.rs"));
}

/// Owned device memory; freed on drop.
pub struct DBuf {
    ptr: u64,
    bytes: usize,
    ctx: Arc<CudaContext>,
}

impl DBuf {
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

impl Drop for DBuf {
    fn drop(&mut self) {
        if self.ptr != 0 {
            let _ = self.ctx.bind_to_thread();
            unsafe {
                let _ = result::free_sync(self.ptr);
            }
        }
    }
}

pub struct Device {
    ctx: Arc<CudaContext>,
    funcs: HashMap<String, sys::CUfunction>,
    cublas: cbs::cublasHandle_t,
    /// Every launch and GEMM goes here. A blocking stream: the synchronous
    /// copies (legacy default stream) stay ordered with it.
    stream: sys::CUstream,
    pub name: String,
    pub sm_count: u32,
    /// Opt-in shared memory per block, bytes (227 KB on H100/H200, 163 KB on
    /// A100, 99 KB on sm_86/89).
    max_smem: usize,
    /// `QWASI_GPU_DEBUG=1`: synchronise after every launch and name the failing kernel.
    pub debug: bool,
    /// Programmatic dependent launch (compute capability >= 9.0, unless
    /// `QWASI_PDL=0`): see [`Device::launch_pdl`].
    pdl: bool,
    /// Compute capability 9.0 or later (bulk copies, mbarrier transactions).
    sm90: bool,
    /// Warpgroup MMA (`wgmma`): the kernels' sm_90a code runs on 9.x only.
    wgmma: bool,
    /// `QWASI_GPU_PROFILE=1`: an event pair around every launch (see [`Device::take_profile`]).
    profile: Option<std::sync::Mutex<Vec<Timing>>>,
}

/// A profiled launch: kernel name, start and end events.
type Timing = (&'static str, sys::CUevent, sys::CUevent);

/// An instantiated CUDA graph (one captured decode step).
pub struct Graph {
    exec: sys::CUgraphExec,
    graph: sys::CUgraph,
}

impl Drop for Graph {
    fn drop(&mut self) {
        unsafe {
            sys::cuGraphExecDestroy(self.exec);
            sys::cuGraphDestroy(self.graph);
        }
    }
}

// Only used from the thread that holds the model's lock, with the context bound.
unsafe impl Send for Graph {}

fn check(r: sys::CUresult, what: &str) -> Result<()> {
    if r == sys::CUresult::CUDA_SUCCESS {
        Ok(())
    } else {
        bail!("{what}: {r:?}")
    }
}

// The raw handles are only used with the context bound, from one thread at a time
// (the model serialises forward passes behind a mutex).
unsafe impl Send for Device {}
unsafe impl Sync for Device {}

impl Device {
    /// GPU 0, or a clear error when there is no CUDA driver or no GPU.
    pub fn new(opts: &super::options::DeviceOptions) -> Result<Self> {
        if !unsafe { sys::is_culib_present() } {
            bail!(
                "no CUDA driver found (libcuda.so could not be loaded); the cuda backend needs an NVIDIA GPU and driver"
            );
        }
        let ctx =
            CudaContext::new(0).map_err(|e| anyhow::anyhow!("cannot open CUDA device 0: {e:?}"))?;
        ctx.bind_to_thread().map_err(|e| anyhow::anyhow!("{e:?}"))?;
        let name = cudarc::driver::result::device::get_name(ctx.cu_device())
            .unwrap_or_else(|_| "CUDA GPU".into());
        let mut funcs = HashMap::new();
        for (module, image, names) in images::MODULES {
            // The driver wants the image in memory that stays valid during the call; the
            // embedded bytes are 'static but may be unaligned, so copy to an aligned buffer.
            let mut aligned = vec![0u64; image.len().div_ceil(8) + 1];
            unsafe {
                std::ptr::copy_nonoverlapping(
                    image.as_ptr(),
                    aligned.as_mut_ptr() as *mut u8,
                    image.len(),
                );
            }
            let m = unsafe { result::module::load_data(aligned.as_ptr() as *const c_void) }
                .map_err(|e| anyhow::anyhow!("loading kernel module {module}: {e:?}"))?;
            for name in names.iter() {
                let f = unsafe { result::module::get_function(m, CString::new(*name).unwrap()) }
                    .map_err(|e| anyhow::anyhow!("kernel {name} in module {module}: {e:?}"))?;
                funcs.insert(name.to_string(), f);
            }
        }
        let cublas = cudarc::cublas::result::create_handle()
            .map_err(|e| anyhow::anyhow!("cuBLAS: {e:?}"))?;
        let mut stream: sys::CUstream = std::ptr::null_mut();
        check(
            unsafe { sys::cuStreamCreate(&mut stream, 0) },
            "creating a CUDA stream",
        )?;
        unsafe { cbs::cublasSetStream_v2(cublas, stream as cbs::cudaStream_t) }
            .result()
            .map_err(|e| anyhow::anyhow!("cuBLAS stream: {e:?}"))?;
        let attr = |a: sys::CUdevice_attribute| -> Result<i32> {
            let mut v = 0i32;
            check(
                unsafe { sys::cuDeviceGetAttribute(&mut v, a, ctx.cu_device()) },
                "device attribute",
            )?;
            Ok(v)
        };
        use sys::CUdevice_attribute as A;
        let sms = attr(A::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?;
        let major = attr(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?;
        let max_smem = attr(A::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)?;
        Ok(Device {
            pdl: major >= 9 && opts.pdl,
            sm90: major >= 9,
            wgmma: major == 9,
            ctx,
            funcs,
            cublas,
            stream,
            name,
            sm_count: sms.max(1) as u32,
            max_smem: max_smem.max(0) as usize,
            debug: opts.debug,
            profile: opts.profile.then(Default::default),
        })
    }

    /// Largest (opt-in) dynamic shared memory one block may use, in bytes.
    pub fn max_shared_per_block(&self) -> usize {
        self.max_smem
    }

    /// Whether kernels can use bulk copies into shared memory (`cp.async.bulk`
    /// with mbarriers: compute capability 9.0 and later).
    pub fn bulk_copies(&self) -> bool {
        self.sm90
    }

    /// Whether the sm_90a kernels with warpgroup MMA (`wgmma`) run here
    /// (compute capability 9.x).
    pub fn wgmma(&self) -> bool {
        self.wgmma
    }

    /// Starts recording this thread's launches into a graph instead of running them.
    pub fn begin_capture(&self) -> Result<()> {
        check(
            unsafe {
                sys::cuStreamBeginCapture_v2(
                    self.stream,
                    sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
                )
            },
            "beginning graph capture",
        )
    }

    /// Ends the capture begun by [`Device::begin_capture`] and instantiates it.
    pub fn end_capture(&self) -> Result<Graph> {
        let mut graph: sys::CUgraph = std::ptr::null_mut();
        check(
            unsafe { sys::cuStreamEndCapture(self.stream, &mut graph) },
            "ending graph capture",
        )?;
        let mut exec: sys::CUgraphExec = std::ptr::null_mut();
        let r = unsafe { sys::cuGraphInstantiateWithFlags(&mut exec, graph, 0) };
        if r != sys::CUresult::CUDA_SUCCESS {
            unsafe { sys::cuGraphDestroy(graph) };
            bail!("instantiating a CUDA graph: {r:?}");
        }
        Ok(Graph { exec, graph })
    }

    pub fn launch_graph(&self, g: &Graph) -> Result<()> {
        check(
            unsafe { sys::cuGraphLaunch(g.exec, self.stream) },
            "launching a CUDA graph",
        )?;
        if self.debug {
            self.sync().context("CUDA graph")?;
        }
        Ok(())
    }

    /// Per-kernel GPU time since the last call, `(name, launches, ms)` by total
    /// time, when `QWASI_GPU_PROFILE=1` (empty otherwise). Synchronises.
    pub fn take_profile(&self) -> Vec<(&'static str, usize, f64)> {
        let Some(p) = &self.profile else {
            return Vec::new();
        };
        let _ = self.sync();
        let mut agg: HashMap<&'static str, (usize, f64)> = HashMap::new();
        for (name, a, b) in p.lock().unwrap().drain(..) {
            let mut ms = 0f32;
            unsafe {
                sys::cuEventElapsedTime_v2(&mut ms, a, b);
                sys::cuEventDestroy_v2(a);
                sys::cuEventDestroy_v2(b);
            }
            let e = agg.entry(name).or_default();
            e.0 += 1;
            e.1 += ms as f64;
        }
        let mut v: Vec<_> = agg.into_iter().map(|(k, (n, t))| (k, n, t)).collect();
        v.sort_by(|a, b| b.2.total_cmp(&a.2));
        v
    }

    pub fn profiling(&self) -> bool {
        self.profile.is_some()
    }

    pub fn bind(&self) -> Result<()> {
        self.ctx
            .bind_to_thread()
            .map_err(|e| anyhow::anyhow!("{e:?}"))
    }

    /// (free, total) device memory in bytes.
    pub fn mem_info(&self) -> (usize, usize) {
        result::mem_get_info().unwrap_or((0, 0))
    }

    pub fn alloc(&self, bytes: usize) -> Result<DBuf> {
        let ptr = unsafe { result::malloc_sync(bytes.max(16)) }
            .map_err(|e| anyhow::anyhow!("cudaMalloc of {bytes} bytes failed: {e:?}"))?;
        Ok(DBuf {
            ptr,
            bytes,
            ctx: self.ctx.clone(),
        })
    }

    /// `bytes` at `src` copied into new page-locked host memory (filled by
    /// the copy before anyone can read it).
    pub fn download_pinned(&self, src: u64, bytes: usize) -> Result<HostBuf> {
        let ptr = unsafe { result::malloc_host(bytes.max(16), 0) }
            .map_err(|e| anyhow::anyhow!("cuMemHostAlloc of {bytes} bytes failed: {e:?}"))?;
        let ctx = self.ctx.clone();
        let b = HostBuf::new(ptr.cast(), bytes, move |p| {
            let _ = ctx.bind_to_thread();
            unsafe {
                let _ = result::free_host(p);
            }
        });
        if bytes > 0 {
            unsafe { sys::cuMemcpyDtoH_v2(ptr, src, bytes).result() }
                .map_err(|e| anyhow::anyhow!("copy from device: {e:?}"))?;
        }
        Ok(b)
    }

    pub fn alloc_zeroed(&self, bytes: usize) -> Result<DBuf> {
        let b = self.alloc(bytes)?;
        unsafe { result::memset_d8_sync(b.ptr, 0, bytes.max(16)) }
            .map_err(|e| anyhow::anyhow!("{e:?}"))?;
        Ok(b)
    }

    pub fn upload<T: Copy>(&self, data: &[T]) -> Result<DBuf> {
        let b = self.alloc(std::mem::size_of_val(data))?;
        self.htod(b.ptr, data)?;
        Ok(b)
    }

    pub fn htod<T: Copy>(&self, dst: u64, data: &[T]) -> Result<()> {
        if data.is_empty() {
            return Ok(());
        }
        unsafe { result::memcpy_htod_sync(dst, data) }
            .map_err(|e| anyhow::anyhow!("copy to device: {e:?}"))
    }

    pub fn dtoh<T: Copy>(&self, dst: &mut [T], src: u64) -> Result<()> {
        if dst.is_empty() {
            return Ok(());
        }
        unsafe { result::memcpy_dtoh_sync(dst, src) }
            .map_err(|e| anyhow::anyhow!("copy from device: {e:?}"))
    }

    pub fn dtod(&self, dst: u64, src: u64, bytes: usize) -> Result<()> {
        if bytes == 0 {
            return Ok(());
        }
        unsafe { result::memcpy_dtod_sync(dst, src, bytes) }
            .map_err(|e| anyhow::anyhow!("device copy: {e:?}"))
    }

    pub fn sync(&self) -> Result<()> {
        self.ctx
            .synchronize()
            .map_err(|e| anyhow::anyhow!("CUDA error: {e:?}"))
    }

    fn kernel(&self, name: &str) -> Result<sys::CUfunction> {
        self.funcs
            .get(name)
            .copied()
            .with_context(|| format!("kernel {name} not found in the embedded modules"))
    }

    /// Kernel `name`, opted in to `smem` bytes of dynamic shared memory where
    /// that is above the default 48 KB.
    fn kernel_with_smem(&self, name: &str, smem: u32) -> Result<sys::CUfunction> {
        let f = self.kernel(name)?;
        if smem > 48 * 1024 {
            unsafe {
                sys::cuFuncSetAttribute(
                    f,
                    sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                    smem as i32,
                );
            }
        }
        Ok(f)
    }

    /// Resident blocks per multiprocessor of kernel `name` at this block size
    /// and dynamic shared memory (at least 1).
    pub fn occupancy(&self, name: &str, block: u32, smem: u32) -> u32 {
        let Some(&f) = self.funcs.get(name) else {
            return 1;
        };
        let mut n = 0i32;
        let r = unsafe {
            sys::cuOccupancyMaxActiveBlocksPerMultiprocessor(&mut n, f, block as i32, smem as usize)
        };
        if r == sys::CUresult::CUDA_SUCCESS {
            n.max(1) as u32
        } else {
            1
        }
    }

    /// Like [`Device::launch`], but the kernel may start while its predecessor
    /// finishes (programmatic dependent launch): only for kernels that touch
    /// nothing but read-only inputs before `QW_GRID_WAIT()`.
    pub fn launch_pdl(
        &self,
        name: &'static str,
        grid: (u32, u32, u32),
        block: (u32, u32, u32),
        smem: u32,
        args: &[Arg],
    ) -> Result<()> {
        if !self.pdl || self.profile.is_some() || self.debug {
            return self.launch(name, grid, block, smem, args);
        }
        if grid.0 == 0 || grid.1 == 0 || grid.2 == 0 {
            return Ok(());
        }
        let f = self.kernel_with_smem(name, smem)?;
        let mut attr: sys::CUlaunchAttribute = unsafe { std::mem::zeroed() };
        attr.id = sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
        attr.value.programmaticStreamSerializationAllowed = 1;
        let cfg = sys::CUlaunchConfig {
            gridDimX: grid.0,
            gridDimY: grid.1,
            gridDimZ: grid.2,
            blockDimX: block.0,
            blockDimY: block.1,
            blockDimZ: block.2,
            sharedMemBytes: smem,
            hStream: self.stream,
            attrs: &mut attr,
            numAttrs: 1,
        };
        let mut params: Vec<*mut c_void> = args.iter().map(Arg::addr).collect();
        check(
            unsafe { sys::cuLaunchKernelEx(&cfg, f, params.as_mut_ptr(), std::ptr::null_mut()) },
            &format!("launching {name}"),
        )
    }

    pub fn launch(
        &self,
        name: &'static str,
        grid: (u32, u32, u32),
        block: (u32, u32, u32),
        smem: u32,
        args: &[Arg],
    ) -> Result<()> {
        if grid.0 == 0 || grid.1 == 0 || grid.2 == 0 {
            return Ok(());
        }
        let f = self.kernel_with_smem(name, smem)?;
        let mut params: Vec<*mut c_void> = args.iter().map(Arg::addr).collect();
        self.profiled(name, || {
            unsafe { result::launch_kernel(f, grid, block, smem, self.stream, &mut params) }
                .map_err(|e| anyhow::anyhow!("launching {name}: {e:?}"))
        })?;
        if self.debug {
            self.sync().with_context(|| {
                format!("kernel {name} grid {grid:?} block {block:?} smem {smem}")
            })?;
        }
        Ok(())
    }

    /// Runs `enqueue` between two recorded events when profiling (`QWASI_GPU_PROFILE=1`).
    fn profiled(&self, name: &'static str, enqueue: impl FnOnce() -> Result<()>) -> Result<()> {
        let Some(p) = &self.profile else {
            return enqueue();
        };
        let mut ev = [std::ptr::null_mut(); 2];
        for e in &mut ev {
            unsafe { sys::cuEventCreate(e, 0) };
        }
        unsafe { sys::cuEventRecord(ev[0], self.stream) };
        enqueue()?;
        unsafe { sys::cuEventRecord(ev[1], self.stream) };
        p.lock().unwrap().push((name, ev[0], ev[1]));
        Ok(())
    }

    /// `Y[T, R] = X[T, C] . W[R, C]^T` with bf16 X and W (row-major), f32 Y, f32 compute.
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
        let alpha = 1.0f32;
        let beta = if accumulate { 1.0f32 } else { 0.0 };
        self.profiled("cublas_gemm_bf16", || unsafe {
            cudarc::cublas::result::gemm_ex(
                self.cublas,
                cbs::cublasOperation_t::CUBLAS_OP_T,
                cbs::cublasOperation_t::CUBLAS_OP_N,
                r as i32,
                t as i32,
                c as i32,
                &alpha as *const f32 as *const c_void,
                w as *const c_void,
                cbs::cudaDataType::CUDA_R_16BF,
                c as i32,
                x_bf16 as *const c_void,
                cbs::cudaDataType::CUDA_R_16BF,
                c as i32,
                &beta as *const f32 as *const c_void,
                y as *mut c_void,
                cbs::cudaDataType::CUDA_R_32F,
                r as i32,
                cbs::cublasComputeType_t::CUBLAS_COMPUTE_32F,
                cbs::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
            )
            .map_err(|e| anyhow::anyhow!("cublasGemmEx {t}x{r}x{c}: {e:?}"))
        })
    }
}

impl Drop for Device {
    fn drop(&mut self) {
        let _ = self.ctx.bind_to_thread();
        unsafe {
            let _ = cudarc::cublas::result::destroy_handle(self.cublas);
            sys::cuStreamDestroy_v2(self.stream);
        }
    }
}
