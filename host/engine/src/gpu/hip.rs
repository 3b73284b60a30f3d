//! The HIP device layer (AMD): a minimal binding to libamdhip64 loaded at run
//! time, enough to load the embedded code objects and launch kernels. It is
//! compile-checked on machines without AMD GPUs; the model forward is wired to
//! the CUDA layer first (`gpu::model`), and this layer mirrors its interface
//! (alloc / copy / module load / launch) so the same model code can follow.

use super::Arg;
use anyhow::{Context, Result, bail};
use std::collections::HashMap;
use std::ffi::{CString, c_void};

mod images {
    include!(concat!(env!("OUT_DIR"), "/kernels_hip.rs"));
}

type HipError = i32;
type HipModule = *mut c_void;
type HipFunction = *mut c_void;

struct Api {
    _lib: libloading::Library,
    init: unsafe extern "C" fn(u32) -> HipError,
    set_device: unsafe extern "C" fn(i32) -> HipError,
    malloc: unsafe extern "C" fn(*mut *mut c_void, usize) -> HipError,
    free: unsafe extern "C" fn(*mut c_void) -> HipError,
    memcpy: unsafe extern "C" fn(*mut c_void, *const c_void, usize, i32) -> HipError,
    memset: unsafe extern "C" fn(*mut c_void, i32, usize) -> HipError,
    sync: unsafe extern "C" fn() -> HipError,
    module_load_data: unsafe extern "C" fn(*mut HipModule, *const c_void) -> HipError,
    module_get_function: unsafe extern "C" fn(*mut HipFunction, HipModule, *const i8) -> HipError,
    #[allow(clippy::type_complexity)]
    launch: unsafe extern "C" fn(
        HipFunction,
        u32,
        u32,
        u32,
        u32,
        u32,
        u32,
        u32,
        *mut c_void,
        *mut *mut c_void,
        *mut *mut c_void,
    ) -> HipError,
}

const H2D: i32 = 1;
const D2H: i32 = 2;
const D2D: i32 = 3;

fn check(e: HipError, what: &str) -> Result<()> {
    if e != 0 {
        bail!("HIP error {e} in {what}");
    }
    Ok(())
}

/// Owned HIP device memory (freed through [`HipDevice::free`]).
pub struct HipBuf {
    pub ptr: u64,
    pub bytes: usize,
}

pub struct HipDevice {
    api: Api,
    funcs: HashMap<String, HipFunction>,
}

unsafe impl Send for HipDevice {}
unsafe impl Sync for HipDevice {}

impl HipDevice {
    pub fn new() -> Result<Self> {
        let lib = unsafe { libloading::Library::new("libamdhip64.so") }
            .or_else(|_| unsafe { libloading::Library::new("libamdhip64.so.6") })
            .or_else(|_| unsafe { libloading::Library::new("libamdhip64.so.5") })
            .context(
                "no HIP runtime found (libamdhip64.so); the hip backend needs ROCm and an AMD GPU",
            )?;
        unsafe {
            macro_rules! sym {
                ($n:literal) => {
                    *lib.get($n).with_context(|| {
                        format!("libamdhip64 lacks {}", String::from_utf8_lossy($n))
                    })?
                };
            }
            let api = Api {
                init: sym!(b"hipInit"),
                set_device: sym!(b"hipSetDevice"),
                malloc: sym!(b"hipMalloc"),
                free: sym!(b"hipFree"),
                memcpy: sym!(b"hipMemcpy"),
                memset: sym!(b"hipMemset"),
                sync: sym!(b"hipDeviceSynchronize"),
                module_load_data: sym!(b"hipModuleLoadData"),
                module_get_function: sym!(b"hipModuleGetFunction"),
                launch: sym!(b"hipModuleLaunchKernel"),
                _lib: lib,
            };
            check((api.init)(0), "hipInit")?;
            check((api.set_device)(0), "hipSetDevice")?;
            let mut funcs = HashMap::new();
            for (_module, image, names) in images::MODULES {
                let mut m: HipModule = std::ptr::null_mut();
                check(
                    (api.module_load_data)(&mut m, image.as_ptr() as *const c_void),
                    "hipModuleLoadData",
                )?;
                for name in names.iter() {
                    let mut f: HipFunction = std::ptr::null_mut();
                    let cname = CString::new(*name).unwrap();
                    if (api.module_get_function)(&mut f, m, cname.as_ptr()) == 0 {
                        funcs.insert(name.to_string(), f);
                    }
                }
            }
            Ok(HipDevice { api, funcs })
        }
    }

    pub fn alloc(&self, bytes: usize) -> Result<HipBuf> {
        let mut p: *mut c_void = std::ptr::null_mut();
        check(
            unsafe { (self.api.malloc)(&mut p, bytes.max(16)) },
            "hipMalloc",
        )?;
        Ok(HipBuf {
            ptr: p as u64,
            bytes,
        })
    }

    pub fn alloc_zeroed(&self, bytes: usize) -> Result<HipBuf> {
        let b = self.alloc(bytes)?;
        check(
            unsafe { (self.api.memset)(b.ptr as *mut c_void, 0, bytes.max(16)) },
            "hipMemset",
        )?;
        Ok(b)
    }

    pub fn free(&self, b: HipBuf) -> Result<()> {
        check(unsafe { (self.api.free)(b.ptr as *mut c_void) }, "hipFree")
    }

    pub fn htod<T: Copy>(&self, dst: u64, data: &[T]) -> Result<()> {
        check(
            unsafe {
                (self.api.memcpy)(
                    dst as *mut c_void,
                    data.as_ptr() as *const c_void,
                    std::mem::size_of_val(data),
                    H2D,
                )
            },
            "hipMemcpy H2D",
        )
    }

    pub fn dtoh<T: Copy>(&self, dst: &mut [T], src: u64) -> Result<()> {
        check(
            unsafe {
                (self.api.memcpy)(
                    dst.as_mut_ptr() as *mut c_void,
                    src as *const c_void,
                    std::mem::size_of_val(dst),
                    D2H,
                )
            },
            "hipMemcpy D2H",
        )
    }

    pub fn dtod(&self, dst: u64, src: u64, bytes: usize) -> Result<()> {
        check(
            unsafe { (self.api.memcpy)(dst as *mut c_void, src as *const c_void, bytes, D2D) },
            "hipMemcpy D2D",
        )
    }

    pub fn sync(&self) -> Result<()> {
        check(unsafe { (self.api.sync)() }, "hipDeviceSynchronize")
    }

    pub fn launch(
        &self,
        name: &str,
        grid: (u32, u32, u32),
        block: (u32, u32, u32),
        smem: u32,
        args: &[Arg],
    ) -> Result<()> {
        let f = *self
            .funcs
            .get(name)
            .with_context(|| format!("kernel {name} not in the HIP code objects"))?;
        let mut params: Vec<*mut c_void> = args.iter().map(Arg::addr).collect();
        check(
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
                    std::ptr::null_mut(),
                    params.as_mut_ptr(),
                    std::ptr::null_mut(),
                )
            },
            name,
        )
    }
}
