//! The HIP driver calls of the device layer ([`super::device::RawDevice`]),
//! for AMD GPUs: libamdhip64 (and libhipblas for GEMMs) loaded at run time,
//! the code objects hipcc built from the same kernels as the CUDA build, one
//! stream that every launch and copy is ordered on, HIP graphs where the
//! runtime has them, hipBLAS GEMMs. No programmatic dependent launch (the
//! kernels' `QW_GRID_WAIT()` is a no-op there, launches serialise) and no
//! shared-memory opt-in (any size up to the device limit launches).
//!
//! The libraries are found by their Linux names (`libamdhip64.so.N`,
//! `libhipblas.so.N`) or their Windows ones (`amdhip64_N.dll`, from the AMD
//! driver or the HIP SDK, and `hipblas.dll`, also tried under `%HIP_PATH%\bin`).
//!
//! Compile-checked only (kernels by clang 19 for gfx1100 and gfx1151, see
//! docs/AMD.md; the host for Linux and for Windows; the enum values below
//! checked against the ROCm 5.2 and 7.1 headers): it has not run on AMD
//! hardware yet.

use super::device::{DeviceInfo, Launch, RawDevice, RawError, RawResult};
use anyhow::{Context, Result};
use std::ffi::{CStr, c_char, c_void};

mod images {
    include!(concat!(env!("OUT_DIR"), "/kernel_images_hip.rs"));
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

/// The HIP architectures the embedded code objects were built for (build.rs:
/// `QWASI_HIP_ARCHS`, default gfx1100,gfx1151).
const ARCHS: &str = env!("QWASI_HIP_ARCHS_BUILT");

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
    module_load: unsafe extern "C" fn(*mut Handle, *const c_void) -> HipError,
    module_function: unsafe extern "C" fn(*mut Handle, Handle, *const c_char) -> HipError,
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

    fn ck(&self, e: HipError) -> RawResult<()> {
        if e == 0 {
            Ok(())
        } else {
            Err(RawError(self.error(e)))
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
        let lib = load_first(BLAS_LIBS).ok_or(
            "hipBLAS could not be loaded (libhipblas.so or hipblas.dll: install ROCm's or the HIP SDK's hipblas)",
        )?;
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

/// GPU 0 through the HIP runtime: its stream and hipBLAS.
pub struct Hip {
    /// Every launch, copy and GEMM goes here (copies are asynchronous on it,
    /// then synchronised), so the order is the program order.
    stream: Handle,
    blas: std::result::Result<Blas, String>,
    api: Api,
}

// The raw handles are only used from one thread at a time (the model
// serialises forward passes behind a mutex).
unsafe impl Send for Hip {}
unsafe impl Sync for Hip {}

const NO_RUNTIME: &str = if cfg!(windows) {
    "no HIP runtime found (amdhip64_7.dll / amdhip64_6.dll could not be loaded); the hip backend needs an AMD GPU with its driver or the HIP SDK >= 6.2"
} else {
    "no HIP runtime found (libamdhip64.so could not be loaded); the hip backend needs ROCm >= 6.2 and an AMD GPU"
};

/// The HIP runtime's file names, newest first: ROCm's sonames, and the DLLs
/// of the AMD driver and HIP SDK on Windows (`amdhip64_6.dll` from 6.0,
/// `amdhip64.dll` before).
const RUNTIME_LIBS: &[&str] = if cfg!(windows) {
    &["amdhip64_7.dll", "amdhip64_6.dll", "amdhip64.dll"]
} else {
    &[
        "libamdhip64.so",
        "libamdhip64.so.7",
        "libamdhip64.so.6",
        "libamdhip64.so.5",
    ]
};

/// hipBLAS's file names, newest first.
const BLAS_LIBS: &[&str] = if cfg!(windows) {
    &["hipblas.dll", "libhipblas.dll"]
} else {
    &[
        "libhipblas.so",
        "libhipblas.so.3",
        "libhipblas.so.2",
        "libhipblas.so.1",
        "libhipblas.so.0",
    ]
};

/// The first of `names` that loads: from the system's search path, and on
/// Windows also from the HIP SDK's `%HIP_PATH%\bin` (the SDK's installer sets
/// `HIP_PATH` but does not put its `bin` on `PATH`).
fn load_first(names: &[&str]) -> Option<libloading::Library> {
    let sdk_bin = std::env::var_os("HIP_PATH")
        .filter(|_| cfg!(windows))
        .map(|p| std::path::PathBuf::from(p).join("bin"));
    names.iter().find_map(|n| {
        // SAFETY: loading the vendor's runtime library runs its initialisers,
        // which is what using it requires.
        unsafe { libloading::Library::new(n) }.ok().or_else(|| {
            let p = sdk_bin.as_ref()?.join(n);
            unsafe { libloading::Library::new(p) }.ok()
        })
    })
}

impl Hip {
    fn capture_api(&self) -> RawResult<&CaptureApi> {
        self.api.capture.as_ref().ok_or_else(|| {
            RawError(
                "HIP graphs are not available (libamdhip64 lacks hipStreamBeginCapture or hipGraphInstantiate)"
                    .into(),
            )
        })
    }

    /// A copy on the stream (after all earlier work), complete on return.
    unsafe fn copy(
        &self,
        dst: *mut c_void,
        src: *const c_void,
        bytes: usize,
        kind: i32,
    ) -> RawResult<()> {
        self.api
            .ck(unsafe { (self.api.memcpy_async)(dst, src, bytes, kind, self.stream) })?;
        self.api.ck(unsafe { (self.api.stream_sync)(self.stream) })
    }
}

// The handle arguments are the driver's opaque handles, passed back to it
// and never dereferenced here.
#[allow(clippy::not_unsafe_ptr_arg_deref)]
unsafe impl RawDevice for Hip {
    type Module = Handle;
    type Function = Handle;
    type Event = Handle;
    type Graph = (Handle, Handle);
    const VENDOR: &'static str = "HIP";
    const GEMM_LABEL: &'static str = "hipblas_gemm_bf16";
    const IMAGES: &'static [(&'static str, &'static [u8])] = images::IMAGES;

    fn open() -> Result<(Self, DeviceInfo)> {
        let lib = load_first(RUNTIME_LIBS).context(NO_RUNTIME)?;
        let (api, init, device_count, device_get, device_get_name, stream_create) = unsafe {
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
                module_load: sym!(b"hipModuleLoadData"),
                module_function: sym!(b"hipModuleGetFunction"),
                event_create: sym!(b"hipEventCreate"),
                event_record: sym!(b"hipEventRecord"),
                event_elapsed: sym!(b"hipEventElapsedTime"),
                event_destroy: sym!(b"hipEventDestroy"),
                occupancy: opt!(b"hipModuleOccupancyMaxActiveBlocksPerMultiprocessor"),
                capture,
                _lib: lib,
            };
            (
                api,
                init,
                device_count,
                device_get,
                device_get_name,
                stream_create,
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
        let fail = |what: &str, e: RawError| anyhow::anyhow!("{what}: {e}");
        api.ck(unsafe { (api.set_device)(0) })
            .map_err(|e| fail("hipSetDevice(0)", e))?;
        let mut dev = 0i32;
        api.ck(unsafe { device_get(&mut dev, 0) })
            .map_err(|e| fail("hipDeviceGet(0)", e))?;
        let mut buf = [0 as c_char; 256];
        let name = if unsafe { device_get_name(buf.as_mut_ptr(), buf.len() as i32, dev) } == 0 {
            unsafe { CStr::from_ptr(buf.as_ptr()) }
                .to_string_lossy()
                .into_owned()
        } else {
            "AMD GPU".into()
        };
        let attr = |a: i32| -> RawResult<i32> {
            let mut v = 0i32;
            api.ck(unsafe { (api.device_get_attribute)(&mut v, a, dev) })?;
            Ok(v)
        };
        let sms = attr(ATTR_MULTIPROCESSOR_COUNT).map_err(|e| fail("hipDeviceGetAttribute", e))?;
        // Dynamic + static shared memory of one block (0: unknown).
        let max_smem = attr(ATTR_MAX_SHARED_MEMORY_PER_BLOCK).unwrap_or(0).max(0) as usize;
        let mut stream: Handle = std::ptr::null_mut();
        api.ck(unsafe { stream_create(&mut stream) })
            .map_err(|e| fail("creating a HIP stream", e))?;
        let blas = Blas::load(stream);
        let info = DeviceInfo {
            name,
            sm_count: sms.max(1) as u32,
            max_smem,
            pdl: false,
            bulk_copies: false,
            wgmma: false,
            fp8_gemm: false,
            graphs: api.capture.is_some(),
            blas_error: blas.as_ref().err().cloned(),
        };
        Ok((Hip { stream, blas, api }, info))
    }

    /// Makes GPU 0 current on this thread (HIP's current device is per thread).
    fn bind(&self) -> RawResult<()> {
        self.api.ck(unsafe { (self.api.set_device)(0) })
    }

    fn mem_info(&self) -> RawResult<(usize, usize)> {
        let (mut free, mut total) = (0usize, 0usize);
        self.api
            .ck(unsafe { (self.api.mem_get_info)(&mut free, &mut total) })?;
        Ok((free, total))
    }

    fn malloc(&self, bytes: usize) -> RawResult<u64> {
        let mut p: *mut c_void = std::ptr::null_mut();
        self.api.ck(unsafe { (self.api.malloc)(&mut p, bytes) })?;
        Ok(p as u64)
    }

    unsafe fn free(&self, ptr: u64) {
        let _ = unsafe { (self.api.free)(ptr as *mut c_void) };
    }

    fn host_malloc(&self, bytes: usize) -> RawResult<*mut u8> {
        let mut p: *mut c_void = std::ptr::null_mut();
        self.api
            .ck(unsafe { (self.api.host_malloc)(&mut p, bytes, 0) })?;
        Ok(p.cast())
    }

    unsafe fn host_free(&self, ptr: *mut c_void) {
        let _ = unsafe { (self.api.host_free)(ptr) };
    }

    unsafe fn memset_zero(&self, ptr: u64, bytes: usize) -> RawResult<()> {
        self.api
            .ck(unsafe { (self.api.memset_async)(ptr as *mut c_void, 0, bytes, self.stream) })?;
        self.api.ck(unsafe { (self.api.stream_sync)(self.stream) })
    }

    unsafe fn htod(&self, dst: u64, src: *const c_void, bytes: usize) -> RawResult<()> {
        unsafe { self.copy(dst as *mut c_void, src, bytes, H2D) }
    }

    unsafe fn dtoh(&self, dst: *mut c_void, src: u64, bytes: usize) -> RawResult<()> {
        unsafe { self.copy(dst, src as *const c_void, bytes, D2H) }
    }

    unsafe fn dtod(&self, dst: u64, src: u64, bytes: usize) -> RawResult<()> {
        unsafe { self.copy(dst as *mut c_void, src as *const c_void, bytes, D2D) }
    }

    fn sync(&self) -> RawResult<()> {
        self.api.ck(unsafe { (self.api.device_sync)() })
    }

    fn load_module(&self, image: &[u8]) -> RawResult<Handle> {
        let mut m: Handle = std::ptr::null_mut();
        self.api
            .ck(unsafe { (self.api.module_load)(&mut m, image.as_ptr().cast()) })
            .map_err(|e| {
                RawError(format!(
                    "{e} (code objects built for {ARCHS}; rebuild with QWASI_HIP_ARCHS set to this GPU's gfx target)"
                ))
            })?;
        Ok(m)
    }

    fn function(&self, module: &Handle, name: &CStr) -> RawResult<Handle> {
        let mut f: Handle = std::ptr::null_mut();
        self.api
            .ck(unsafe { (self.api.module_function)(&mut f, *module, name.as_ptr()) })?;
        Ok(f)
    }

    /// No opt-in for large dynamic shared memory on AMD (CUDA's
    /// `cuFuncSetAttribute` above 48 KB): any size up to the device limit launches.
    fn allow_smem(&self, _f: Handle, _smem: u32) {}

    fn occupancy(&self, f: Handle, block: u32, smem: u32) -> Option<u32> {
        let occ = self.api.occupancy?;
        let mut n = 0i32;
        (unsafe { occ(&mut n, f, block as i32, smem as usize) } == 0).then_some(n.max(0) as u32)
    }

    unsafe fn launch(
        &self,
        f: Handle,
        l: &Launch,
        _pdl: bool,
        args: &[*const c_void],
    ) -> RawResult<()> {
        let (g, b) = (l.grid, l.block);
        self.api.ck(unsafe {
            (self.api.launch)(
                f,
                g.0,
                g.1,
                g.2,
                b.0,
                b.1,
                b.2,
                l.smem,
                self.stream,
                // The runtime reads the parameters through `void**` and never writes them.
                args.as_ptr() as *mut *mut c_void,
                std::ptr::null_mut(),
            )
        })
    }

    fn event_create(&self) -> RawResult<Handle> {
        let mut e: Handle = std::ptr::null_mut();
        self.api.ck(unsafe { (self.api.event_create)(&mut e) })?;
        Ok(e)
    }

    fn event_record(&self, e: Handle) {
        unsafe { (self.api.event_record)(e, self.stream) };
    }

    fn event_elapsed(&self, start: Handle, end: Handle) -> f32 {
        let mut ms = 0f32;
        unsafe { (self.api.event_elapsed)(&mut ms, start, end) };
        ms
    }

    fn event_destroy(&self, e: Handle) {
        unsafe { (self.api.event_destroy)(e) };
    }

    fn begin_capture(&self) -> RawResult<()> {
        let c = self.capture_api()?;
        self.api
            .ck(unsafe { (c.begin)(self.stream, CAPTURE_MODE_THREAD_LOCAL) })
    }

    fn end_capture(&self) -> RawResult<(Handle, Handle)> {
        let c = self.capture_api()?;
        let mut graph: Handle = std::ptr::null_mut();
        self.api.ck(unsafe { (c.end)(self.stream, &mut graph) })?;
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
            return Err(RawError(format!(
                "instantiating the graph: {}",
                self.api.error(r)
            )));
        }
        Ok((exec, graph))
    }

    fn graph_launch(&self, g: &(Handle, Handle)) -> RawResult<()> {
        let c = self.capture_api()?;
        self.api.ck(unsafe { (c.launch)(g.0, self.stream) })
    }

    fn graph_destroy(&self, g: &mut (Handle, Handle)) {
        if let Some(c) = &self.api.capture {
            unsafe {
                (c.exec_destroy)(g.0);
                (c.graph_destroy)(g.1);
            }
        }
    }

    /// The same column-major call as the CUDA layer's cuBLAS one.
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
        let blas = match &self.blas {
            Ok(b) => b,
            Err(e) => {
                return Err(RawError(format!(
                    "hipBLAS is not available: {e} (QWASI_GEMM=tiled avoids it)"
                )));
            }
        };
        let alpha = 1.0f32;
        let beta = if accumulate { 1.0f32 } else { 0.0 };
        let st = unsafe {
            (blas.gemm_ex)(
                blas.handle,
                HIPBLAS_OP_T,
                HIPBLAS_OP_N,
                r,
                t,
                c,
                &alpha as *const f32 as *const c_void,
                w as *const c_void,
                HIP_R_16BF,
                c,
                x_bf16 as *const c_void,
                HIP_R_16BF,
                c,
                &beta as *const f32 as *const c_void,
                y as *mut c_void,
                HIP_R_32F,
                r,
                HIPBLAS_COMPUTE_32F,
                HIPBLAS_GEMM_DEFAULT,
            )
        };
        if st != 0 {
            return Err(RawError(format!("hipblasStatus {st}")));
        }
        Ok(())
    }
}

impl Drop for Hip {
    fn drop(&mut self) {
        unsafe {
            if let Ok(b) = &self.blas {
                (b.destroy)(b.handle);
            }
            (self.api.stream_destroy)(self.stream);
        }
    }
}
