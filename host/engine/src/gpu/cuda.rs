//! The CUDA driver calls of the device layer ([`super::device::RawDevice`]):
//! a primary context on GPU 0 through cudarc's driver API, one blocking
//! stream, programmatic dependent launch (`cuLaunchKernelEx`), CUDA graphs,
//! and cuBLAS `GemmEx` for the bf16 GEMMs.

use super::cuda_fp8_gemm::Fp8Gemm;
use super::device::{DeviceInfo, Launch, RawDevice, RawError, RawResult};
use anyhow::{Result, bail};
use cudarc::cublas::sys as cbs;
use cudarc::driver::{CudaContext, result, sys};
use std::ffi::{CStr, c_void};
use std::sync::{Arc, Mutex};

mod images {
    include!(concat!(env!("OUT_DIR"), "/kernel_images_cuda.rs"));
}

/// Dynamic shared memory a kernel may use without opting in.
const DEFAULT_SMEM: u32 = 48 * 1024;

fn ck(r: sys::CUresult) -> RawResult<()> {
    if r == sys::CUresult::CUDA_SUCCESS {
        Ok(())
    } else {
        Err(RawError(format!("{r:?}")))
    }
}

fn err(e: impl std::fmt::Debug) -> RawError {
    RawError(format!("{e:?}"))
}

/// GPU 0's context, stream and cuBLAS handle.
pub struct Cuda {
    ctx: Arc<CudaContext>,
    cublas: cbs::cublasHandle_t,
    /// Every launch and GEMM goes here. A blocking stream: the synchronous
    /// copies (legacy default stream) stay ordered with it.
    stream: sys::CUstream,
    /// Physical page size of the virtual memory management calls, where the
    /// device has them.
    page: Option<usize>,
    /// cuBLASLt's block-scaled FP8 GEMMs, made at the first one.
    fp8_gemm: Mutex<Option<Fp8Gemm>>,
}

/// Device memory on GPU 0, as `cuMemCreate` and its granularity query take it.
fn page_prop() -> sys::CUmemAllocationProp {
    // SAFETY: a plain C struct; all zeroes is its documented default.
    let mut p: sys::CUmemAllocationProp = unsafe { std::mem::zeroed() };
    p.type_ = sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED;
    p.location.type_ = sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE;
    p.location.id = 0;
    p
}

/// The minimum granularity of mapped pages, if the device manages virtual memory.
fn page_size(vmm: bool) -> Option<usize> {
    if !vmm {
        return None;
    }
    let mut g = 0usize;
    let prop = page_prop();
    let flag = sys::CUmemAllocationGranularity_flags::CU_MEM_ALLOC_GRANULARITY_MINIMUM;
    ck(unsafe { sys::cuMemGetAllocationGranularity(&mut g, &prop, flag) }).ok()?;
    (g > 0).then_some(g)
}

/// An instantiated CUDA graph.
pub struct CudaGraph {
    exec: sys::CUgraphExec,
    graph: sys::CUgraph,
}

// The raw handles are only used with the context bound, from one thread at a
// time (the model serialises forward passes behind a mutex).
unsafe impl Send for Cuda {}
unsafe impl Sync for Cuda {}

// The handle arguments are the driver's opaque handles, passed back to it
// and never dereferenced here.
#[allow(clippy::not_unsafe_ptr_arg_deref)]
unsafe impl RawDevice for Cuda {
    type Module = sys::CUmodule;
    type Function = sys::CUfunction;
    type Event = sys::CUevent;
    type Graph = CudaGraph;
    const VENDOR: &'static str = "CUDA";
    const GEMM_LABEL: &'static str = "cublas_gemm_bf16";
    const IMAGES: &'static [(&'static str, &'static [u8])] = images::IMAGES;

    fn open() -> Result<(Self, DeviceInfo)> {
        if !unsafe { sys::is_culib_present() } {
            bail!(
                "no CUDA driver found (libcuda.so could not be loaded); the cuda backend needs an NVIDIA GPU and driver"
            );
        }
        let ctx =
            CudaContext::new(0).map_err(|e| anyhow::anyhow!("cannot open CUDA device 0: {e:?}"))?;
        ctx.bind_to_thread().map_err(|e| anyhow::anyhow!("{e:?}"))?;
        let name = result::device::get_name(ctx.cu_device()).unwrap_or_else(|_| "CUDA GPU".into());
        let cublas = cudarc::cublas::result::create_handle()
            .map_err(|e| anyhow::anyhow!("cuBLAS: {e:?}"))?;
        let mut stream: sys::CUstream = std::ptr::null_mut();
        ck(unsafe { sys::cuStreamCreate(&mut stream, 0) })
            .map_err(|e| anyhow::anyhow!("creating a CUDA stream: {e}"))?;
        let mut dev = Cuda {
            ctx,
            cublas,
            stream,
            page: None,
            fp8_gemm: Mutex::new(None),
        };
        unsafe { cbs::cublasSetStream_v2(cublas, stream as cbs::cudaStream_t) }
            .result()
            .map_err(|e| anyhow::anyhow!("cuBLAS stream: {e:?}"))?;
        let attr = |a: sys::CUdevice_attribute| -> Result<i32> {
            let mut v = 0i32;
            ck(unsafe { sys::cuDeviceGetAttribute(&mut v, a, dev.ctx.cu_device()) })
                .map_err(|e| anyhow::anyhow!("device attribute: {e}"))?;
            Ok(v)
        };
        use sys::CUdevice_attribute as A;
        let sms = attr(A::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?;
        let major = attr(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?;
        // Opt-in shared memory per block (227 KB on H100/H200, 163 KB on
        // A100, 99 KB on sm_86/89).
        let max_smem = attr(A::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)?;
        let vmm = attr(A::CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED)? != 0;
        dev.page = page_size(vmm);
        let info = DeviceInfo {
            name,
            sm_count: sms.max(1) as u32,
            max_smem: max_smem.max(0) as usize,
            pdl: major >= 9,
            bulk_copies: major >= 9,
            // The kernels' sm_90a code runs on 9.x only.
            wgmma: major == 9,
            fp8_gemm: major == 9,
            graphs: true,
            blas_error: None,
        };
        Ok((dev, info))
    }

    fn bind(&self) -> RawResult<()> {
        self.ctx.bind_to_thread().map_err(err)
    }

    fn mem_info(&self) -> RawResult<(usize, usize)> {
        result::mem_get_info().map_err(err)
    }

    fn malloc(&self, bytes: usize) -> RawResult<u64> {
        unsafe { result::malloc_sync(bytes) }.map_err(err)
    }

    unsafe fn free(&self, ptr: u64) {
        let _ = self.ctx.bind_to_thread();
        let _ = unsafe { result::free_sync(ptr) };
    }

    fn host_malloc(&self, bytes: usize) -> RawResult<*mut u8> {
        unsafe { result::malloc_host(bytes, 0) }
            .map(|p| p.cast())
            .map_err(err)
    }

    unsafe fn host_free(&self, ptr: *mut c_void) {
        let _ = self.ctx.bind_to_thread();
        let _ = unsafe { result::free_host(ptr) };
    }

    unsafe fn memset_zero(&self, ptr: u64, bytes: usize) -> RawResult<()> {
        unsafe { result::memset_d8_sync(ptr, 0, bytes) }.map_err(err)
    }

    unsafe fn htod(&self, dst: u64, src: *const c_void, bytes: usize) -> RawResult<()> {
        ck(unsafe { sys::cuMemcpyHtoD_v2(dst, src, bytes) })
    }

    unsafe fn dtoh(&self, dst: *mut c_void, src: u64, bytes: usize) -> RawResult<()> {
        ck(unsafe { sys::cuMemcpyDtoH_v2(dst, src, bytes) })
    }

    unsafe fn dtod(&self, dst: u64, src: u64, bytes: usize) -> RawResult<()> {
        ck(unsafe { sys::cuMemcpyDtoD_v2(dst, src, bytes) })
    }

    fn sync(&self) -> RawResult<()> {
        self.ctx.synchronize().map_err(err)
    }

    fn page_size(&self) -> Option<usize> {
        self.page
    }

    fn va_reserve(&self, bytes: usize) -> RawResult<u64> {
        let mut va = 0;
        ck(unsafe { sys::cuMemAddressReserve(&mut va, bytes, 0, 0, 0) })?;
        Ok(va)
    }

    unsafe fn va_free(&self, ptr: u64, bytes: usize) {
        let _ = self.ctx.bind_to_thread();
        let _ = unsafe { sys::cuMemAddressFree(ptr, bytes) };
    }

    fn page_create(&self) -> RawResult<u64> {
        let bytes = self
            .page
            .ok_or_else(|| RawError("no virtual memory management".into()))?;
        let mut h = 0;
        ck(unsafe { sys::cuMemCreate(&mut h, bytes, &page_prop(), 0) })?;
        Ok(h)
    }

    unsafe fn page_release(&self, page: u64) {
        let _ = self.ctx.bind_to_thread();
        let _ = unsafe { sys::cuMemRelease(page) };
    }

    unsafe fn map(&self, va: u64, page: u64) -> RawResult<()> {
        let bytes = self
            .page
            .ok_or_else(|| RawError("no virtual memory management".into()))?;
        ck(unsafe { sys::cuMemMap(va, bytes, 0, page, 0) })
    }

    unsafe fn grant_access(&self, va: u64, bytes: usize) -> RawResult<()> {
        let access = sys::CUmemAccessDesc {
            location: page_prop().location,
            flags: sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
        };
        ck(unsafe { sys::cuMemSetAccess(va, bytes, &access, 1) })
    }

    unsafe fn unmap(&self, va: u64) {
        if let Some(bytes) = self.page {
            let _ = self.ctx.bind_to_thread();
            let _ = unsafe { sys::cuMemUnmap(va, bytes) };
        }
    }

    fn load_module(&self, image: &[u8]) -> RawResult<sys::CUmodule> {
        unsafe { result::module::load_data(image.as_ptr().cast()) }.map_err(err)
    }

    fn function(&self, module: &sys::CUmodule, name: &CStr) -> RawResult<sys::CUfunction> {
        unsafe { result::module::get_function(*module, name.to_owned()) }.map_err(err)
    }

    fn allow_smem(&self, f: sys::CUfunction, smem: u32) {
        if smem > DEFAULT_SMEM {
            unsafe {
                sys::cuFuncSetAttribute(
                    f,
                    sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                    smem as i32,
                );
            }
        }
    }

    fn occupancy(&self, f: sys::CUfunction, block: u32, smem: u32) -> Option<u32> {
        let mut n = 0i32;
        let r = unsafe {
            sys::cuOccupancyMaxActiveBlocksPerMultiprocessor(&mut n, f, block as i32, smem as usize)
        };
        (r == sys::CUresult::CUDA_SUCCESS).then_some(n.max(0) as u32)
    }

    unsafe fn launch(
        &self,
        f: sys::CUfunction,
        l: &Launch,
        pdl: bool,
        args: &[*const c_void],
    ) -> RawResult<()> {
        // The driver reads the parameters through `void**` and never writes them.
        let params = args.as_ptr() as *mut *mut c_void;
        if !pdl {
            let (g, b) = (l.grid, l.block);
            return ck(unsafe {
                sys::cuLaunchKernel(
                    f,
                    g.0,
                    g.1,
                    g.2,
                    b.0,
                    b.1,
                    b.2,
                    l.smem,
                    self.stream,
                    params,
                    std::ptr::null_mut(),
                )
            });
        }
        let mut attr: sys::CUlaunchAttribute = unsafe { std::mem::zeroed() };
        attr.id = sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
        attr.value.programmaticStreamSerializationAllowed = 1;
        let cfg = sys::CUlaunchConfig {
            gridDimX: l.grid.0,
            gridDimY: l.grid.1,
            gridDimZ: l.grid.2,
            blockDimX: l.block.0,
            blockDimY: l.block.1,
            blockDimZ: l.block.2,
            sharedMemBytes: l.smem,
            hStream: self.stream,
            attrs: &mut attr,
            numAttrs: 1,
        };
        ck(unsafe { sys::cuLaunchKernelEx(&cfg, f, params, std::ptr::null_mut()) })
    }

    fn event_create(&self) -> RawResult<sys::CUevent> {
        let mut e = std::ptr::null_mut();
        ck(unsafe { sys::cuEventCreate(&mut e, 0) })?;
        Ok(e)
    }

    fn event_record(&self, e: sys::CUevent) {
        unsafe { sys::cuEventRecord(e, self.stream) };
    }

    fn event_elapsed(&self, start: sys::CUevent, end: sys::CUevent) -> f32 {
        let mut ms = 0f32;
        unsafe { sys::cuEventElapsedTime_v2(&mut ms, start, end) };
        ms
    }

    fn event_destroy(&self, e: sys::CUevent) {
        unsafe { sys::cuEventDestroy_v2(e) };
    }

    fn profiler_range(&self, on: bool) {
        // Without a profiler attached both calls succeed and do nothing.
        let _ = unsafe {
            if on {
                sys::cuProfilerStart()
            } else {
                sys::cuProfilerStop()
            }
        };
    }

    fn begin_capture(&self) -> RawResult<()> {
        ck(unsafe {
            sys::cuStreamBeginCapture_v2(
                self.stream,
                sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
            )
        })
    }

    fn end_capture(&self) -> RawResult<CudaGraph> {
        let mut graph: sys::CUgraph = std::ptr::null_mut();
        ck(unsafe { sys::cuStreamEndCapture(self.stream, &mut graph) })?;
        let mut exec: sys::CUgraphExec = std::ptr::null_mut();
        let r = unsafe { sys::cuGraphInstantiateWithFlags(&mut exec, graph, 0) };
        if r != sys::CUresult::CUDA_SUCCESS {
            unsafe { sys::cuGraphDestroy(graph) };
            return Err(RawError(format!("instantiating the graph: {r:?}")));
        }
        Ok(CudaGraph { exec, graph })
    }

    fn graph_launch(&self, g: &CudaGraph) -> RawResult<()> {
        ck(unsafe { sys::cuGraphLaunch(g.exec, self.stream) })
    }

    fn graph_destroy(&self, g: &mut CudaGraph) {
        unsafe {
            sys::cuGraphExecDestroy(g.exec);
            sys::cuGraphDestroy(g.graph);
        }
    }

    unsafe fn gemm_bf16(
        &self,
        x_bf16: u64,
        w: u64,
        y: u64,
        t: i32,
        r: i32,
        c: i32,
        accumulate: bool,
    ) -> RawResult<()> {
        // Column-major: Y^T[R, T] = W^T . X^T, i.e. op(W) = T over W[R, C].
        let alpha = 1.0f32;
        let beta = if accumulate { 1.0f32 } else { 0.0 };
        unsafe {
            cudarc::cublas::result::gemm_ex(
                self.cublas,
                cbs::cublasOperation_t::CUBLAS_OP_T,
                cbs::cublasOperation_t::CUBLAS_OP_N,
                r,
                t,
                c,
                &alpha as *const f32 as *const c_void,
                w as *const c_void,
                cbs::cudaDataType::CUDA_R_16BF,
                c,
                x_bf16 as *const c_void,
                cbs::cudaDataType::CUDA_R_16BF,
                c,
                &beta as *const f32 as *const c_void,
                y as *mut c_void,
                cbs::cudaDataType::CUDA_R_32F,
                r,
                cbs::cublasComputeType_t::CUBLAS_COMPUTE_32F,
                cbs::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
            )
        }
        .map_err(err)
    }

    unsafe fn gemm_fp8_blocks(
        &self,
        x: u64,
        xs: u64,
        w: u64,
        ws: u64,
        y: u64,
        shape: (i32, i32, i32),
        accumulate: bool,
    ) -> RawResult<()> {
        let mut g = self.fp8_gemm.lock().unwrap_or_else(|e| e.into_inner());
        if g.is_none() {
            *g = Some(Fp8Gemm::new()?);
        }
        let g = g.as_mut().expect("made above");
        // SAFETY: the caller's buffers, on this device's stream.
        unsafe { g.run(self.stream, (x, xs), (w, ws), y, shape, accumulate) }
    }
}

impl Drop for Cuda {
    fn drop(&mut self) {
        let _ = self.ctx.bind_to_thread();
        // Its workspace is freed while the context is still bound.
        drop(
            self.fp8_gemm
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .take(),
        );
        unsafe {
            let _ = cudarc::cublas::result::destroy_handle(self.cublas);
            sys::cuStreamDestroy_v2(self.stream);
        }
    }
}
