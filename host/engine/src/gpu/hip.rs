//! The HIP device layer (AMD): libamdhip64 (and libhipblas for GEMMs) loaded at
//! run time, the embedded code objects (built by hipcc from the same kernels as
//! the CUDA build), device buffers, launches on one stream (capturable into HIP
//! graphs), hipBLAS GEMMs, and an optional per-kernel event profile. It has the
//! same inherent API as [`super::cuda::Device`], so `gpu::model` runs on either
//! (`--features hip` without `cuda`).
//!
//! Compile-checked only (kernels by hipcc from ROCm 5.2 for gfx1030; the enum
//! values below checked against the ROCm 5.2 and 7.1 headers): it has not run
//! on AMD hardware yet.

use super::{Arg, HostBuf};
use anyhow::{Context, Result, bail};
use std::collections::HashMap;
use std::ffi::{CStr, CString, c_char, c_void};
use std::sync::{Arc, Mutex};

mod images {
    include!(concat!(env!("OUT_DIR"), "/kernels_hip.rs"));
}

type HipError = i32;
type Handle = *mut c_void;

// hip_runtime_api.h enum values (the same in ROCm 5.2 and 7.1).
const H2D: i32 = 1;
const D2H: i32 = 2;
const D2D: i32 = 3;
const ATTR_MULTIPROCESSOR_COUNT: i32 = 63;
const ATTR_MAX_SHARED_MEMORY_PER_BLOCK: i32 = 74;
const CAPTURE_MODE_THREAD_LOCAL: i32 = 1;

// hipBLAS: hipblasOperation_t, hipDataType, hipblasComputeType_t, hipblasGemmAlgo_t.
const HIPBLAS_OP_N: i32 = 111;
const HIPBLAS_OP_T: i32 = 112;
const HIP_R_32F: i32 = 0;
const HIP_R_16BF: i32 = 14;
const HIPBLAS_COMPUTE_32F: i32 = 2;
const HIPBLAS_GEMM_DEFAULT: i32 = 160;

/// The HIP architectures the embedded code objects were built for.
const ARCHS: &str = match option_env!("QWASI_HIP_ARCHS") {
    Some(a) => a,
    None => "gfx1030",
};

type LaunchFn = unsafe extern "C" fn(
    Handle,
    u32,
    u32,
    u32,
    u32,
    u32,
    u32,
    u32,
    Handle,
    *mut *mut c_void,
    *mut *mut c_void,
) -> HipError;

struct Api {
    get_error_string: unsafe extern "C" fn(HipError) -> *const c_char,
    set_device: unsafe extern "C" fn(i32) -> HipError,
    device_get_attribute: unsafe extern "C" fn(*mut i32, i32, i32) -> HipError,
    mem_get_info: unsafe extern "C" fn(*mut usize, *mut usize) -> HipError,
    malloc: unsafe extern "C" fn(*mut *mut c_void, usize) -> HipError,
    free: unsafe extern "C" fn(*mut c_void) -> HipError,
    host_malloc: unsafe extern "C" fn(*mut *mut c_void, usize, u32) -> HipError,
    host_free: unsafe extern "C" fn(*mut c_void) -> HipError,
    memcpy_async: unsafe extern "C" fn(*mut c_void, *const c_void, usize, i32, Handle) -> HipError,
    memset_async: unsafe extern "C" fn(*mut c_void, i32, usize, Handle) -> HipError,
    stream_destroy: unsafe extern "C" fn(Handle) -> HipError,
    stream_sync: unsafe extern "C" fn(Handle) -> HipError,
    device_sync: unsafe extern "C" fn() -> HipError,
    launch: LaunchFn,
    event_create: unsafe extern "C" fn(*mut Handle) -> HipError,
    event_record: unsafe extern "C" fn(Handle, Handle) -> HipError,
    event_elapsed: unsafe extern "C" fn(*mut f32, Handle, Handle) -> HipError,
    event_destroy: unsafe extern "C" fn(Handle) -> HipError,
    /// `hipModuleOccupancyMaxActiveBlocksPerMultiprocessor` (optional).
    occupancy: Option<unsafe extern "C" fn(*mut i32, Handle, i32, usize) -> HipError>,
    /// Stream capture and graphs (optional: without them decode runs eagerly).
    capture: Option<CaptureApi>,
    // Last: the function pointers above point into it.
    _lib: libloading::Library,
}

struct CaptureApi {
    begin: unsafe extern "C" fn(Handle, i32) -> HipError,
    end: unsafe extern "C" fn(Handle, *mut Handle) -> HipError,
    instantiate:
        unsafe extern "C" fn(*mut Handle, Handle, *mut Handle, *mut c_char, usize) -> HipError,
    launch: unsafe extern "C" fn(Handle, Handle) -> HipError,
    exec_destroy: unsafe extern "C" fn(Handle) -> HipError,
    graph_destroy: unsafe extern "C" fn(Handle) -> HipError,
}

impl Api {
    fn error(&self, e: HipError) -> String {
        let s = unsafe { (self.get_error_string)(e) };
        if s.is_null() {
            format!("HIP error {e}")
        } else {
            let msg = unsafe { CStr::from_ptr(s) }.to_string_lossy();
            format!("{msg} (HIP error {e})")
        }
    }

    fn check(&self, e: HipError, what: &str) -> Result<()> {
        if e == 0 {
            Ok(())
        } else {
            bail!("{what}: {}", self.error(e))
        }
    }
}

/// hipBLAS, loaded with the device (optional: without it prompts use the tiled GEMM kernel).
struct Blas {
    handle: Handle,
    /// `hipblasGemmEx_v2` (ROCm 6.x) or `hipblasGemmEx` of hipBLAS >= 3 (ROCm 7):
    /// hipDataType operands, hipblasComputeType_t compute type.
    #[allow(clippy::type_complexity)]
    gemm_ex: unsafe extern "C" fn(
        Handle,
        i32,
        i32,
        i32,
        i32,
        i32,
        *const c_void,
        *const c_void,
        i32,
        i32,
        *const c_void,
        i32,
        i32,
        *const c_void,
        *mut c_void,
        i32,
        i32,
        i32,
        i32,
    ) -> i32,
    destroy: unsafe extern "C" fn(Handle) -> i32,
    _lib: libloading::Library,
}

impl Blas {
    fn load(stream: Handle) -> std::result::Result<Blas, String> {
        let lib = [
            "libhipblas.so",
            "libhipblas.so.3",
            "libhipblas.so.2",
            "libhipblas.so.1",
            "libhipblas.so.0",
        ]
        .iter()
        .find_map(|n| unsafe { libloading::Library::new(n) }.ok())
        .ok_or("libhipblas.so could not be loaded (install ROCm's hipblas)")?;
        unsafe {
            let create = *lib
                .get::<unsafe extern "C" fn(*mut Handle) -> i32>(b"hipblasCreate")
                .map_err(|e| format!("libhipblas lacks hipblasCreate: {e}"))?;
            let set_stream = *lib
                .get::<unsafe extern "C" fn(Handle, Handle) -> i32>(b"hipblasSetStream")
                .map_err(|e| format!("libhipblas lacks hipblasSetStream: {e}"))?;
            let destroy = *lib
                .get::<unsafe extern "C" fn(Handle) -> i32>(b"hipblasDestroy")
                .map_err(|e| format!("libhipblas lacks hipblasDestroy: {e}"))?;
            // hipBLAS 2.x (ROCm 6) exports the hipDataType GemmEx as `_v2`; hipBLAS 3
            // (ROCm 7) renamed it to `hipblasGemmEx`. Before ROCm 6 `hipblasGemmEx`
            // took hipblasDatatype_t (other enum values) and there is no `_v2`, nor
            // `hipblasSetMathMode` (added in ROCm 6.1).
            let gemm_ex = match lib.get(b"hipblasGemmEx_v2") {
                Ok(s) => *s,
                Err(_) if lib.get::<*const c_void>(b"hipblasSetMathMode").is_ok() => *lib
                    .get(b"hipblasGemmEx")
                    .map_err(|e| format!("libhipblas lacks hipblasGemmEx: {e}"))?,
                Err(_) => {
                    return Err(
                        "this hipBLAS predates ROCm 6 (no hipblasGemmEx_v2); the hip backend needs ROCm >= 6.2"
                            .into(),
                    );
                }
            };
            let mut handle: Handle = std::ptr::null_mut();
            let r = create(&mut handle);
            if r != 0 {
                return Err(format!("hipblasCreate failed (hipblasStatus {r})"));
            }
            let r = set_stream(handle, stream);
            if r != 0 {
                destroy(handle);
                return Err(format!("hipblasSetStream failed (hipblasStatus {r})"));
            }
            Ok(Blas {
                handle,
                gemm_ex,
                destroy,
                _lib: lib,
            })
        }
    }
}

/// Owned device memory; freed on drop.
pub struct DBuf {
    ptr: u64,
    bytes: usize,
    api: Arc<Api>,
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
            unsafe {
                let _ = (self.api.free)(self.ptr as *mut c_void);
            }
        }
    }
}

/// An instantiated HIP graph (one captured decode step).
pub struct Graph {
    exec: Handle,
    graph: Handle,
    api: Arc<Api>,
}

impl Drop for Graph {
    fn drop(&mut self) {
        if let Some(c) = &self.api.capture {
            unsafe {
                (c.exec_destroy)(self.exec);
                (c.graph_destroy)(self.graph);
            }
        }
    }
}

// Only used from the thread that holds the model's lock.
unsafe impl Send for Graph {}

/// A profiled launch: kernel name, start and end events.
type Timing = (&'static str, Handle, Handle);

pub struct Device {
    api: Arc<Api>,
    funcs: HashMap<String, Handle>,
    /// Every launch, copy and GEMM goes here (copies are asynchronous on it,
    /// then synchronised), so the order is the program order.
    stream: Handle,
    blas: std::result::Result<Blas, String>,
    pub name: String,
    pub sm_count: u32,
    /// Largest dynamic + static shared memory of one block, in bytes (0: unknown).
    max_smem: usize,
    /// `QWASI_GPU_DEBUG=1`: synchronise after every launch and name the failing kernel.
    pub debug: bool,
    /// `QWASI_GPU_PROFILE=1`: an event pair around every launch (see [`Device::take_profile`]).
    profile: Option<Mutex<Vec<Timing>>>,
    /// The aligned copies of the code objects given to `hipModuleLoadData`,
    /// kept for the modules' lifetime.
    _images: Vec<Vec<u64>>,
}

// The raw handles are only used from one thread at a time (the model
// serialises forward passes behind a mutex).
unsafe impl Send for Device {}
unsafe impl Sync for Device {}

const NO_RUNTIME: &str = "no HIP runtime found (libamdhip64.so could not be loaded); the hip backend needs ROCm >= 6.2 and an AMD GPU";

impl Device {
    /// GPU 0, or a clear error when there is no HIP runtime or no AMD GPU.
    pub fn new(opts: &super::options::DeviceOptions) -> Result<Self> {
        let lib = [
            "libamdhip64.so",
            "libamdhip64.so.7",
            "libamdhip64.so.6",
            "libamdhip64.so.5",
        ]
        .iter()
        .find_map(|n| unsafe { libloading::Library::new(n) }.ok())
        .context(NO_RUNTIME)?;
        let (api, init, device_count, device_get, device_get_name, stream_create, load, get) = unsafe {
            macro_rules! sym {
                ($n:literal) => {
                    *lib.get($n).with_context(|| {
                        format!(
                            "libamdhip64 lacks {}; the hip backend needs ROCm >= 6.2",
                            String::from_utf8_lossy($n)
                        )
                    })?
                };
            }
            macro_rules! opt {
                ($n:literal) => {
                    lib.get($n).ok().map(|s| *s)
                };
            }
            let init: unsafe extern "C" fn(u32) -> HipError = sym!(b"hipInit");
            let device_count: unsafe extern "C" fn(*mut i32) -> HipError =
                sym!(b"hipGetDeviceCount");
            let device_get: unsafe extern "C" fn(*mut i32, i32) -> HipError = sym!(b"hipDeviceGet");
            let device_get_name: unsafe extern "C" fn(*mut c_char, i32, i32) -> HipError =
                sym!(b"hipDeviceGetName");
            let stream_create: unsafe extern "C" fn(*mut Handle) -> HipError =
                sym!(b"hipStreamCreate");
            let load: unsafe extern "C" fn(*mut Handle, *const c_void) -> HipError =
                sym!(b"hipModuleLoadData");
            let get: unsafe extern "C" fn(*mut Handle, Handle, *const c_char) -> HipError =
                sym!(b"hipModuleGetFunction");
            let capture = (|| {
                Some(CaptureApi {
                    begin: opt!(b"hipStreamBeginCapture")?,
                    end: opt!(b"hipStreamEndCapture")?,
                    instantiate: opt!(b"hipGraphInstantiate")?,
                    launch: opt!(b"hipGraphLaunch")?,
                    exec_destroy: opt!(b"hipGraphExecDestroy")?,
                    graph_destroy: opt!(b"hipGraphDestroy")?,
                })
            })();
            let api = Api {
                get_error_string: sym!(b"hipGetErrorString"),
                set_device: sym!(b"hipSetDevice"),
                device_get_attribute: sym!(b"hipDeviceGetAttribute"),
                mem_get_info: sym!(b"hipMemGetInfo"),
                malloc: sym!(b"hipMalloc"),
                free: sym!(b"hipFree"),
                host_malloc: sym!(b"hipHostMalloc"),
                host_free: sym!(b"hipHostFree"),
                memcpy_async: sym!(b"hipMemcpyAsync"),
                memset_async: sym!(b"hipMemsetAsync"),
                stream_destroy: sym!(b"hipStreamDestroy"),
                stream_sync: sym!(b"hipStreamSynchronize"),
                device_sync: sym!(b"hipDeviceSynchronize"),
                launch: sym!(b"hipModuleLaunchKernel"),
                event_create: sym!(b"hipEventCreate"),
                event_record: sym!(b"hipEventRecord"),
                event_elapsed: sym!(b"hipEventElapsedTime"),
                event_destroy: sym!(b"hipEventDestroy"),
                occupancy: opt!(b"hipModuleOccupancyMaxActiveBlocksPerMultiprocessor"),
                capture,
                _lib: lib,
            };
            (
                Arc::new(api),
                init,
                device_count,
                device_get,
                device_get_name,
                stream_create,
                load,
                get,
            )
        };
        let no_device = |what: String| {
            anyhow::anyhow!(
                "no HIP device found ({what}); the hip backend needs an AMD GPU and ROCm >= 6.2 (is /dev/kfd accessible?)"
            )
        };
        let r = unsafe { init(0) };
        if r != 0 {
            return Err(no_device(format!("hipInit: {}", api.error(r))));
        }
        let mut count = 0i32;
        let r = unsafe { device_count(&mut count) };
        if r != 0 || count == 0 {
            return Err(no_device(if r != 0 {
                format!("hipGetDeviceCount: {}", api.error(r))
            } else {
                "hipGetDeviceCount: 0 devices".into()
            }));
        }
        api.check(unsafe { (api.set_device)(0) }, "hipSetDevice(0)")?;
        let mut dev = 0i32;
        api.check(unsafe { device_get(&mut dev, 0) }, "hipDeviceGet(0)")?;
        let mut buf = [0 as c_char; 256];
        let name = if unsafe { device_get_name(buf.as_mut_ptr(), buf.len() as i32, dev) } == 0 {
            unsafe { CStr::from_ptr(buf.as_ptr()) }
                .to_string_lossy()
                .into_owned()
        } else {
            "AMD GPU".into()
        };
        let attr = |a: i32| -> Result<i32> {
            let mut v = 0i32;
            api.check(
                unsafe { (api.device_get_attribute)(&mut v, a, dev) },
                "hipDeviceGetAttribute",
            )?;
            Ok(v)
        };
        let sms = attr(ATTR_MULTIPROCESSOR_COUNT)?;
        let max_smem = attr(ATTR_MAX_SHARED_MEMORY_PER_BLOCK).unwrap_or(0).max(0) as usize;
        let mut funcs = HashMap::new();
        let mut kept = Vec::new();
        for (module, image, names) in images::MODULES {
            // The runtime parses the image in place: copy it to an aligned buffer
            // (the embedded bytes are 'static but may be unaligned).
            let mut aligned = vec![0u64; image.len().div_ceil(8) + 1];
            unsafe {
                std::ptr::copy_nonoverlapping(
                    image.as_ptr(),
                    aligned.as_mut_ptr() as *mut u8,
                    image.len(),
                );
            }
            let mut m: Handle = std::ptr::null_mut();
            api.check(
                unsafe { load(&mut m, aligned.as_ptr() as *const c_void) },
                &format!(
                    "loading kernel module {module} on {name} (code objects built for {ARCHS}; \
                     rebuild with QWASI_HIP_ARCHS set to this GPU's gfx target)"
                ),
            )?;
            for kname in names.iter() {
                let mut f: Handle = std::ptr::null_mut();
                let cname = CString::new(*kname).unwrap();
                api.check(
                    unsafe { get(&mut f, m, cname.as_ptr()) },
                    &format!("kernel {kname} in module {module}"),
                )?;
                funcs.insert(kname.to_string(), f);
            }
            kept.push(aligned);
        }
        let mut stream: Handle = std::ptr::null_mut();
        api.check(
            unsafe { stream_create(&mut stream) },
            "creating a HIP stream",
        )?;
        let blas = Blas::load(stream);
        Ok(Device {
            api,
            funcs,
            stream,
            blas,
            name,
            sm_count: sms.max(1) as u32,
            max_smem,
            debug: opts.debug,
            profile: opts.profile.then(Default::default),
            _images: kept,
        })
    }

    /// Why hipBLAS GEMMs are unavailable, if they are.
    pub fn blas_error(&self) -> Option<&str> {
        self.blas.as_ref().err().map(String::as_str)
    }

    /// Bulk copies into shared memory (`cp.async.bulk`) are CUDA-only.
    pub fn bulk_copies(&self) -> bool {
        false
    }

    /// No warpgroup MMA on AMD GPUs.
    pub fn wgmma(&self) -> bool {
        false
    }

    /// Whether this runtime has stream capture and graphs.
    pub fn graphs_supported(&self) -> bool {
        self.api.capture.is_some()
    }

    /// Largest shared memory one block may use, in bytes (`usize::MAX` when unknown).
    pub fn max_shared_per_block(&self) -> usize {
        if self.max_smem == 0 {
            usize::MAX
        } else {
            self.max_smem
        }
    }

    fn capture_api(&self) -> Result<&CaptureApi> {
        self.api
            .capture
            .as_ref()
            .context("HIP graphs are not available (libamdhip64 lacks hipStreamBeginCapture or hipGraphInstantiate)")
    }

    /// Starts recording this thread's launches into a graph instead of running them.
    pub fn begin_capture(&self) -> Result<()> {
        let c = self.capture_api()?;
        self.api.check(
            unsafe { (c.begin)(self.stream, CAPTURE_MODE_THREAD_LOCAL) },
            "beginning graph capture",
        )
    }

    /// Ends the capture begun by [`Device::begin_capture`] and instantiates it.
    pub fn end_capture(&self) -> Result<Graph> {
        let c = self.capture_api()?;
        let mut graph: Handle = std::ptr::null_mut();
        self.api.check(
            unsafe { (c.end)(self.stream, &mut graph) },
            "ending graph capture",
        )?;
        let mut exec: Handle = std::ptr::null_mut();
        let r = unsafe {
            (c.instantiate)(
                &mut exec,
                graph,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                0,
            )
        };
        if r != 0 {
            unsafe { (c.graph_destroy)(graph) };
            bail!("instantiating a HIP graph: {}", self.api.error(r));
        }
        Ok(Graph {
            exec,
            graph,
            api: self.api.clone(),
        })
    }

    pub fn launch_graph(&self, g: &Graph) -> Result<()> {
        let c = self.capture_api()?;
        self.api.check(
            unsafe { (c.launch)(g.exec, self.stream) },
            "launching a HIP graph",
        )?;
        if self.debug {
            self.sync().context("HIP graph")?;
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
                (self.api.event_elapsed)(&mut ms, a, b);
                (self.api.event_destroy)(a);
                (self.api.event_destroy)(b);
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

    /// Makes GPU 0 current on this thread (HIP's current device is per thread).
    pub fn bind(&self) -> Result<()> {
        self.api
            .check(unsafe { (self.api.set_device)(0) }, "hipSetDevice(0)")
    }

    /// (free, total) device memory in bytes.
    pub fn mem_info(&self) -> (usize, usize) {
        let (mut free, mut total) = (0usize, 0usize);
        if unsafe { (self.api.mem_get_info)(&mut free, &mut total) } == 0 {
            (free, total)
        } else {
            (0, 0)
        }
    }

    pub fn alloc(&self, bytes: usize) -> Result<DBuf> {
        let mut p: *mut c_void = std::ptr::null_mut();
        self.api.check(
            unsafe { (self.api.malloc)(&mut p, bytes.max(16)) },
            &format!("hipMalloc of {bytes} bytes failed"),
        )?;
        Ok(DBuf {
            ptr: p as u64,
            bytes,
            api: self.api.clone(),
        })
    }

    /// `bytes` at `src` copied into new page-locked host memory (filled by
    /// the copy before anyone can read it).
    pub fn download_pinned(&self, src: u64, bytes: usize) -> Result<HostBuf> {
        let mut p: *mut c_void = std::ptr::null_mut();
        self.api.check(
            unsafe { (self.api.host_malloc)(&mut p, bytes.max(16), 0) },
            &format!("hipHostMalloc of {bytes} bytes failed"),
        )?;
        let api = self.api.clone();
        let b = HostBuf::new(p.cast(), bytes, move |p| unsafe {
            let _ = (api.host_free)(p);
        });
        if bytes > 0 {
            self.copy(p, src as *const c_void, bytes, D2H)?;
        }
        Ok(b)
    }

    pub fn alloc_zeroed(&self, bytes: usize) -> Result<DBuf> {
        let b = self.alloc(bytes)?;
        self.api.check(
            unsafe { (self.api.memset_async)(b.ptr as *mut c_void, 0, bytes.max(16), self.stream) },
            "hipMemsetAsync",
        )?;
        self.stream_sync("hipMemsetAsync")?;
        Ok(b)
    }

    pub fn upload<T: Copy>(&self, data: &[T]) -> Result<DBuf> {
        let b = self.alloc(std::mem::size_of_val(data))?;
        self.htod(b.ptr, data)?;
        Ok(b)
    }

    fn stream_sync(&self, what: &str) -> Result<()> {
        self.api
            .check(unsafe { (self.api.stream_sync)(self.stream) }, what)
    }

    /// A copy on the stream (after all earlier work), complete on return.
    fn copy(&self, dst: *mut c_void, src: *const c_void, bytes: usize, kind: i32) -> Result<()> {
        let what = match kind {
            H2D => "copy to device",
            D2H => "copy from device",
            _ => "device copy",
        };
        self.api.check(
            unsafe { (self.api.memcpy_async)(dst, src, bytes, kind, self.stream) },
            what,
        )?;
        self.stream_sync(what)
    }

    pub fn htod<T: Copy>(&self, dst: u64, data: &[T]) -> Result<()> {
        if data.is_empty() {
            return Ok(());
        }
        self.copy(
            dst as *mut c_void,
            data.as_ptr() as *const c_void,
            std::mem::size_of_val(data),
            H2D,
        )
    }

    pub fn dtoh<T: Copy>(&self, dst: &mut [T], src: u64) -> Result<()> {
        if dst.is_empty() {
            return Ok(());
        }
        self.copy(
            dst.as_mut_ptr() as *mut c_void,
            src as *const c_void,
            std::mem::size_of_val(dst),
            D2H,
        )
    }

    pub fn dtod(&self, dst: u64, src: u64, bytes: usize) -> Result<()> {
        if bytes == 0 {
            return Ok(());
        }
        self.copy(dst as *mut c_void, src as *const c_void, bytes, D2D)
    }

    pub fn sync(&self) -> Result<()> {
        self.api.check(
            unsafe { (self.api.device_sync)() },
            "HIP error (hipDeviceSynchronize)",
        )
    }

    /// Resident blocks per multiprocessor of kernel `name` at this block size
    /// and dynamic shared memory (at least 1).
    pub fn occupancy(&self, name: &str, block: u32, smem: u32) -> u32 {
        let (Some(&f), Some(occ)) = (self.funcs.get(name), self.api.occupancy) else {
            return 1;
        };
        let mut n = 0i32;
        if unsafe { occ(&mut n, f, block as i32, smem as usize) } == 0 {
            n.max(1) as u32
        } else {
            1
        }
    }

    /// [`Device::launch`]: HIP has no programmatic dependent launch (the
    /// kernels' `QW_GRID_WAIT()` is a no-op there), so launches serialise.
    pub fn launch_pdl(
        &self,
        name: &'static str,
        grid: (u32, u32, u32),
        block: (u32, u32, u32),
        smem: u32,
        args: &[Arg],
    ) -> Result<()> {
        self.launch(name, grid, block, smem, args)
    }

    pub fn launch(
        &self,
        name: &'static str,
        grid: (u32, u32, u32),
        block: (u32, u32, u32),
        smem: u32,
        args: &[Arg],
    ) -> Result<()> {
        let f = *self
            .funcs
            .get(name)
            .with_context(|| format!("kernel {name} not found in the embedded code objects"))?;
        if grid.0 == 0 || grid.1 == 0 || grid.2 == 0 {
            return Ok(());
        }
        // No opt-in for large dynamic shared memory on AMD (CUDA's
        // cuFuncSetAttribute above 48 KB): any size up to the device limit launches.
        if smem as usize > self.max_shared_per_block() {
            bail!(
                "kernel {name} needs {smem} bytes of shared memory per block; {} allows {}",
                self.name,
                self.max_smem
            );
        }
        let mut params: Vec<*mut c_void> = args.iter().map(Arg::addr).collect();
        let events = self.profile.as_ref().map(|_| {
            let mut ev: [Handle; 2] = [std::ptr::null_mut(); 2];
            for e in &mut ev {
                unsafe {
                    (self.api.event_create)(e);
                }
            }
            unsafe { (self.api.event_record)(ev[0], self.stream) };
            ev
        });
        self.api.check(
            unsafe {
                (self.api.launch)(
                    f,
                    grid.0,
                    grid.1,
                    grid.2,
                    block.0,
                    block.1,
                    block.2,
                    smem,
                    self.stream,
                    params.as_mut_ptr(),
                    std::ptr::null_mut(),
                )
            },
            &format!("launching {name}"),
        )?;
        if let (Some(ev), Some(p)) = (events, &self.profile) {
            unsafe { (self.api.event_record)(ev[1], self.stream) };
            p.lock().unwrap().push((name, ev[0], ev[1]));
        }
        if self.debug {
            self.sync().with_context(|| {
                format!("kernel {name} grid {grid:?} block {block:?} smem {smem}")
            })?;
        }
        Ok(())
    }

    /// `Y[T, R] = X[T, C] . W[R, C]^T` with bf16 X and W (row-major), f32 Y, f32
    /// compute: the same column-major hipBLAS call as the CUDA layer's cuBLAS one.
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
        let blas = match &self.blas {
            Ok(b) => b,
            Err(e) => bail!("hipBLAS is not available: {e} (QWASI_GEMM=tiled avoids it)"),
        };
        let alpha = 1.0f32;
        let beta = if accumulate { 1.0f32 } else { 0.0 };
        let st = unsafe {
            (blas.gemm_ex)(
                blas.handle,
                HIPBLAS_OP_T,
                HIPBLAS_OP_N,
                r as i32,
                t as i32,
                c as i32,
                &alpha as *const f32 as *const c_void,
                w as *const c_void,
                HIP_R_16BF,
                c as i32,
                x_bf16 as *const c_void,
                HIP_R_16BF,
                c as i32,
                &beta as *const f32 as *const c_void,
                y as *mut c_void,
                HIP_R_32F,
                r as i32,
                HIPBLAS_COMPUTE_32F,
                HIPBLAS_GEMM_DEFAULT,
            )
        };
        if st != 0 {
            bail!("hipblasGemmEx {t}x{r}x{c}: hipblasStatus {st}");
        }
        Ok(())
    }
}

impl Drop for Device {
    fn drop(&mut self) {
        unsafe {
            if let Ok(b) = &self.blas {
                (b.destroy)(b.handle);
            }
            (self.api.stream_destroy)(self.stream);
        }
    }
}
