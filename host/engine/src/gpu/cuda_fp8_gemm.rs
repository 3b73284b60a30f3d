//! Block-scaled FP8 GEMMs through cuBLASLt (`--prefill-precision fp8`):
//! E4M3 activations with an f32 scale per row and 128 columns
//! (`VEC128_32F`) times E4M3 weights with one per 128x128 block
//! (`BLK128x128_32F`, the checkpoint's own `weight_scale_inv`), f32 out.
//! cuBLASLt has these scale modes on sm_90 only (CUDA 12.9+); it is NVIDIA's
//! maintained kernel for exactly this product, so the dense projections use
//! it rather than a GEMM of our own (the grouped experts, which it does not
//! cover without a host-side plan, have `moe_gemm_wg_q8`). The handle, a workspace and one
//! plan (descriptors and the heuristic's algorithm) per shape are made on
//! first use and kept.

use cudarc::cublaslt::sys as lt;
use cudarc::driver::{result, sys};
use std::collections::HashMap;
use std::ffi::c_void;
use std::mem::size_of;

use super::device::{RawError, RawResult};

/// cuBLASLt's workspace: what its split-K algorithms may use.
const WORKSPACE: usize = 32 << 20;
/// Plans kept; a prompt pass uses a handful of shapes per length.
const MAX_PLANS: usize = 512;

fn ck(s: lt::cublasStatus_t, what: &str) -> RawResult<()> {
    if s == lt::cublasStatus_t::CUBLAS_STATUS_SUCCESS {
        Ok(())
    } else {
        Err(RawError(format!("cuBLASLt {what}: {s:?}")))
    }
}

/// Descriptors of one (T, R, C, accumulate) product and its algorithm.
struct Plan {
    desc: lt::cublasLtMatmulDesc_t,
    /// W (A: C x R column-major, transposed), X (B: C x T), Y (C and D: R x T).
    layouts: [lt::cublasLtMatrixLayout_t; 3],
    algo: lt::cublasLtMatmulAlgo_t,
}

impl Drop for Plan {
    fn drop(&mut self) {
        // SAFETY: made by `Fp8Gemm::plan` (null where it stopped early), destroyed once.
        unsafe {
            for l in self.layouts {
                lt::cublasLtMatrixLayoutDestroy(l);
            }
            lt::cublasLtMatmulDescDestroy(self.desc);
        }
    }
}

/// The cuBLASLt handle, its workspace and the plans made so far.
pub(super) struct Fp8Gemm {
    handle: lt::cublasLtHandle_t,
    workspace: sys::CUdeviceptr,
    plans: HashMap<(i32, i32, i32, bool), Plan>,
}

impl Fp8Gemm {
    /// With the device's context bound.
    pub fn new() -> RawResult<Self> {
        // SAFETY: only asks the loader.
        if !unsafe { lt::is_culib_present() } {
            return Err(RawError("libcublasLt could not be loaded".into()));
        }
        let mut handle = std::ptr::null_mut();
        // SAFETY: an out-pointer for the new handle.
        ck(unsafe { lt::cublasLtCreate(&mut handle) }, "create")?;
        // SAFETY: a plain device allocation, freed in Drop.
        let workspace = unsafe { result::malloc_sync(WORKSPACE) }.map_err(|e| {
            // SAFETY: the handle just made, not used elsewhere.
            unsafe { lt::cublasLtDestroy(handle) };
            RawError(format!("cuBLASLt workspace: {e:?}"))
        })?;
        Ok(Fp8Gemm {
            handle,
            workspace,
            plans: HashMap::new(),
        })
    }

    /// `y (+)= x . w^T` on `stream`; see `RawDevice::gemm_fp8_blocks`.
    ///
    /// # Safety
    /// Device pointers of the stated shapes, the context bound.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn run(
        &mut self,
        stream: sys::CUstream,
        (x, xs): (u64, u64),
        (w, ws): (u64, u64),
        y: u64,
        (t, r, c): (i32, i32, i32),
        accumulate: bool,
    ) -> RawResult<()> {
        if self.plans.len() >= MAX_PLANS {
            self.plans.clear();
        }
        let key = (t, r, c, accumulate);
        if let Some(p) = self.plans.get(&key) {
            // SAFETY: a live descriptor.
            unsafe { set_scales(p.desc, xs, ws) }?;
        } else {
            // SAFETY: the handle is live.
            let p = unsafe { self.plan((t, r, c), accumulate, (xs, ws)) }?;
            self.plans.insert(key, p);
        }
        let p = &self.plans[&key];
        let (alpha, beta) = (1.0f32, if accumulate { 1.0f32 } else { 0.0 });
        let [la, lb, ly] = p.layouts;
        // SAFETY: the caller's buffers; C and D are the same matrix, which
        // cuBLASLt allows with equal layouts.
        ck(
            unsafe {
                lt::cublasLtMatmul(
                    self.handle,
                    p.desc,
                    (&alpha as *const f32).cast(),
                    w as *const c_void,
                    la,
                    x as *const c_void,
                    lb,
                    (&beta as *const f32).cast(),
                    y as *const c_void,
                    ly,
                    y as *mut c_void,
                    ly,
                    &p.algo,
                    self.workspace as *mut c_void,
                    WORKSPACE,
                    stream as lt::cudaStream_t,
                )
            },
            "matmul",
        )
    }

    /// Column-major, as cuBLAS sees our row-major buffers: Y^T[R, T] =
    /// op(W)[R, C] . X^T[C, T] with op = transpose over W stored C x R.
    /// The heuristic asks for the scale pointers (it refuses null ones).
    unsafe fn plan(
        &self,
        (t, r, c): (i32, i32, i32),
        accumulate: bool,
        (xs, ws): (u64, u64),
    ) -> RawResult<Plan> {
        use lt::cublasLtMatmulDescAttributes_t as D;
        use lt::cublasLtMatmulMatrixScale_t as S;
        let mut desc = std::ptr::null_mut();
        // SAFETY: out-pointers and attribute buffers of the stated sizes.
        unsafe {
            ck(
                lt::cublasLtMatmulDescCreate(
                    &mut desc,
                    lt::cublasComputeType_t::CUBLAS_COMPUTE_32F,
                    lt::cudaDataType::CUDA_R_32F,
                ),
                "descriptor",
            )?;
            let mut p = Plan {
                desc,
                layouts: [std::ptr::null_mut(); 3],
                algo: std::mem::zeroed(),
            };
            let attr = |a: D, v: i32| {
                ck(
                    lt::cublasLtMatmulDescSetAttribute(
                        desc,
                        a,
                        (&v as *const i32).cast(),
                        size_of::<i32>(),
                    ),
                    "descriptor attribute",
                )
            };
            attr(
                D::CUBLASLT_MATMUL_DESC_TRANSA,
                cudarc::cublas::sys::cublasOperation_t::CUBLAS_OP_T as i32,
            )?;
            attr(
                D::CUBLASLT_MATMUL_DESC_TRANSB,
                cudarc::cublas::sys::cublasOperation_t::CUBLAS_OP_N as i32,
            )?;
            attr(
                D::CUBLASLT_MATMUL_DESC_A_SCALE_MODE,
                S::CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F as i32,
            )?;
            attr(
                D::CUBLASLT_MATMUL_DESC_B_SCALE_MODE,
                S::CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F as i32,
            )?;
            set_scales(desc, xs, ws)?;
            let shapes = [
                (lt::cudaDataType::CUDA_R_8F_E4M3, c, r, c),
                (lt::cudaDataType::CUDA_R_8F_E4M3, c, t, c),
                (lt::cudaDataType::CUDA_R_32F, r, t, r),
            ];
            for (slot, (ty, rows, cols, ld)) in p.layouts.iter_mut().zip(shapes) {
                ck(
                    lt::cublasLtMatrixLayoutCreate(slot, ty, rows as u64, cols as u64, ld as i64),
                    "layout",
                )?;
            }
            let mut pref = std::ptr::null_mut();
            ck(lt::cublasLtMatmulPreferenceCreate(&mut pref), "preference")?;
            let ws = WORKSPACE;
            let found = ck(
                lt::cublasLtMatmulPreferenceSetAttribute(
                    pref,
                    lt::cublasLtMatmulPreferenceAttributes_t::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                    (&ws as *const usize).cast(),
                    size_of::<usize>(),
                ),
                "preference attribute",
            )
            .and_then(|()| {
                let mut res: lt::cublasLtMatmulHeuristicResult_t = std::mem::zeroed();
                let mut n = 0;
                ck(
                    lt::cublasLtMatmulAlgoGetHeuristic(
                        self.handle,
                        desc,
                        p.layouts[0],
                        p.layouts[1],
                        p.layouts[2],
                        p.layouts[2],
                        pref,
                        1,
                        &mut res,
                        &mut n,
                    ),
                    "heuristic",
                )?;
                if n == 0 {
                    return Err(RawError(format!(
                        "cuBLASLt has no block-scaled FP8 algorithm for {t}x{r}x{c}{}",
                        if accumulate { " (accumulating)" } else { "" }
                    )));
                }
                Ok(res.algo)
            });
            lt::cublasLtMatmulPreferenceDestroy(pref);
            p.algo = found?;
            Ok(p)
        }
    }
}

/// The per-call operands' scale pointers: W's blocks as A's, X's as B's.
///
/// # Safety
/// `desc` is a live descriptor.
unsafe fn set_scales(desc: lt::cublasLtMatmulDesc_t, xs: u64, ws: u64) -> RawResult<()> {
    use lt::cublasLtMatmulDescAttributes_t as D;
    for (a, v) in [
        (D::CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, ws),
        (D::CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, xs),
    ] {
        // SAFETY: a pointer-sized attribute of a live descriptor.
        ck(
            unsafe {
                lt::cublasLtMatmulDescSetAttribute(
                    desc,
                    a,
                    (&v as *const u64).cast(),
                    size_of::<u64>(),
                )
            },
            "scale pointer",
        )?;
    }
    Ok(())
}

impl Drop for Fp8Gemm {
    fn drop(&mut self) {
        self.plans.clear();
        // SAFETY: made in `new`, freed once, after the plans that use them.
        unsafe {
            let _ = result::free_sync(self.workspace);
            lt::cublasLtDestroy(self.handle);
        }
    }
}
