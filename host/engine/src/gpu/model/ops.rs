//! The prefill building blocks every layer kind uses: projections (GEMV at
//! T = 1, the few-row tensor-core kernel up to 16 rows, cuBLAS or the tiled
//! kernel otherwise, per `GemmPath` and `PrefillPrecision`; cuBLASLt's FP8
//! GEMM for block-FP8 weights under `--prefill-precision fp8`), the (1+w)
//! RMSNorm, the residual add, and the pass's work buffers.

use super::pass::Norms;
use super::weights::{DevMat, MatWeights};
use super::{B, DBuf, Device, F, GemmPath, GpuModel};
use crate::gpu::kernels::{self, Launch, Typed, sig, typed};
use crate::gpu::options::{BULK_MAX_STAGES, GemmStack, PrefillPrecision};
use crate::gpu::{dptr, i};
use anyhow::Result;
use std::collections::HashMap;

/// Most rows `gemm_rows` takes. The kernel handles 64 (8 tiles of 8), but
/// every warp reads all the rows' activations for its 32 weight rows, and
/// past 16 rows that traffic outweighs the weights' (H200, 64 rows: 13.1 ms
/// per step against cuBLAS's 4.6): cuBLAS takes them.
const GEMM_ROWS_MAX: usize = 16;
/// Most rows the ring kernels take (`gemm_rows_bulk32`, `QWASI_GEMM_ROWS=bulk32`).
const RING_ROWS_MAX: usize = 32;
/// Most rows of a block-FP8 projection through the ring in launches of at
/// most `RING_ROWS_MAX` rows (`QWASI_GEMM_ROWS=bulk32`): each reads the E4M3
/// bytes once, where cuBLAS needs the matrix dequantized into bf16 first
/// (written and read again: three times the FP8 bytes) for its one read.
const RING_ROWS_MAX_FP8: usize = 64;
/// The FP8-activation projections' rows run in multiples of this
/// (`linear_fp8`).
pub(super) const FP8_ROWS: usize = 16;
/// Their columns come in multiples of this (`fp8_activations`).
pub(super) const FP8_COLS: usize = 512;
/// Most rows whose split projection runs as one cuBLAS GEMM over the
/// stacked hi and lo halves (a batched decode step past `GEMM_ROWS_MAX`);
/// longer prompts run the two halves as two GEMMs (no 2x work buffer).
const STACKED_MAX: usize = 64;
/// Warps `gemm_rows` aims for per multiprocessor (with the K slices), and
/// the fewest columns of a slice.
const GEMM_ROWS_WARPS_PER_SM: usize = 16;
const GEMM_ROWS_MIN_SLICE: usize = 256;

/// The ring kernel of a few-row projection (`rows_bulk_plan`): 2-8 or 9-16
/// rows, or 17-32 in K slices; bf16 or block-FP8 weights (the same
/// signatures but for the scales).
#[derive(Clone, Copy)]
enum RingKernel {
    Bf16(Typed<sig::gemm_rows_bulk>),
    Fp8(Typed<sig::gemm_rows_bulk_fp8>),
    Bf16Sliced(Typed<sig::gemm_rows_bulk32>),
    Fp8Sliced(Typed<sig::gemm_rows_bulk32_fp8>),
}

impl RingKernel {
    fn kernel(self) -> kernels::Kernel {
        match self {
            RingKernel::Bf16(k) => k.kernel,
            RingKernel::Fp8(k) => k.kernel,
            RingKernel::Bf16Sliced(k) => k.kernel,
            RingKernel::Fp8Sliced(k) => k.kernel,
        }
    }
}

/// A launch shape of the ring kernels (`rows_bulk_plan`).
struct RowsBulk {
    kernel: RingKernel,
    /// K slices (grid rows), summed by `gemm_rows_reduce` when more than one.
    slices: usize,
    threads: u32,
    smem: u32,
    stages: usize,
    /// Blocks resident at once over the GPU.
    resident: u32,
}

/// The fewest K slices of `cols` columns, each a whole number of `unit`s
/// (a warp's columns; FP8: scale blocks) and at most `max_slice` columns.
fn ring_slices(cols: usize, unit: usize, max_slice: usize) -> Option<usize> {
    (cols.div_ceil(max_slice)..=cols / unit)
        .find(|&s| cols.is_multiple_of(s) && (cols / s).is_multiple_of(unit))
}

/// `t` rows cut into the fewest launches of at most `max` rows, as even as
/// possible: (first row, rows) of each.
fn ring_chunks(t: usize, max: usize) -> impl Iterator<Item = (usize, usize)> {
    let n = t.div_ceil(max).max(1);
    (0..n).map(move |c| (c * t / n, (c + 1) * t / n - c * t / n))
}

/// Work buffers, grown on demand and reused across passes.
#[derive(Default)]
pub(super) struct Scratch {
    bufs: HashMap<&'static str, DBuf>,
    /// Where `logits_device` left the last logits: (sequence id, the
    /// position they follow, device pointer), for `last_logits`.
    pub last_logits: Option<(u64, usize, u64)>,
    /// The same for every row of the last batched step that read its
    /// logits (their rows of `bat_logits`, valid until the next batched step).
    pub batch_logits: Vec<(u64, usize, u64)>,
    /// The stream-K plan of the warpgroup prompt attention on the device:
    /// (tokens, first position, blocks, buffer) it was made for.
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    pub attn_plan: Option<(usize, usize, usize, u64)>,
    /// Counts the allocations: a graph captured over these buffers is valid
    /// while it is unchanged.
    pub generation: u64,
    /// Captured batched decode steps (`batch.rs`).
    pub batch_graphs: super::batch::BatchGraphs,
    /// Snapshots a row running alone asks of its prompt passes, and those
    /// taken (`pass_snapshots.rs`).
    pub captures: Option<super::pass_snapshots::PassCaptures>,
    /// The launches being recorded are a batched decode step without prompt
    /// chunks (set by `batch.rs` around them): `GemmStack::Decode` applies.
    pub decode_rows: bool,
}

impl Scratch {
    pub fn get(&mut self, dev: &Device, name: &'static str, bytes: usize) -> Result<u64> {
        let need = bytes.max(256);
        if let Some(b) = self.bufs.get(name)
            && b.bytes() >= need
        {
            return Ok(b.ptr());
        }
        self.bufs.remove(name);
        self.generation += 1;
        let b = dev.alloc(need.next_power_of_two())?;
        let p = b.ptr();
        self.bufs.insert(name, b);
        Ok(p)
    }
}

impl GpuModel {
    /// `y[t, :] = W x[t, :]` for T rows of x (f32) into y (f32). A
    /// block-FP8 W is read as stored by the few-row kernels (2-16 rows),
    /// else dequantized into its work buffer first (`fp8.rs`).
    pub(super) fn linear(
        &self,
        sc: &mut Scratch,
        x: u64,
        t: usize,
        w: &DevMat,
        y: u64,
        accumulate: bool,
    ) -> Result<()> {
        if let wt @ MatWeights::Fp8 { .. } = w.weights()
            && self.few_rows(x, t, wt, w.rows, w.cols)
            && w.cols.is_multiple_of(128)
        {
            return self.gemm_rows(sc, x, t, wt, w.rows, w.cols, y, accumulate);
        }
        if let MatWeights::Fp8 { q, s } = w.weights()
            && self.fp8_activations(sc, x, t, w.rows, w.cols)
        {
            return self.linear_fp8(sc, x, t, (q, s), w.rows, w.cols, y, accumulate);
        }
        let wb = self.bf16_weights(w, super::fp8::Slot::Mat)?;
        self.linear_raw(sc, x, t, wb, w.rows, w.cols, y, accumulate)
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn linear_raw(
        &self,
        sc: &mut Scratch,
        x: u64,
        t: usize,
        w: u64,
        rows: usize,
        cols: usize,
        y: u64,
        accumulate: bool,
    ) -> Result<()> {
        let d = &self.dev;
        if self.few_rows(x, t, MatWeights::Bf16(w), rows, cols) {
            let wt = MatWeights::Bf16(w);
            return self.gemm_rows(sc, x, t, wt, rows, cols, y, accumulate);
        }
        if t == 1 {
            return kernels::gemv_bf16(
                d,
                Launch::new(((rows as u32).div_ceil(8), t as u32, 1), (256, 1, 1), 0),
                dptr(w),
                dptr(x),
                dptr(y),
                i(rows),
                i(cols),
                i(t),
                i(accumulate as usize),
            );
        }
        match self.gemm {
            GemmPath::Tiled => kernels::gemm_tiled(
                d,
                Launch::new(
                    ((rows as u32).div_ceil(64), (t as u32).div_ceil(64), 1),
                    (256, 1, 1),
                    0,
                ),
                dptr(x),
                dptr(w),
                dptr(y),
                i(t),
                i(rows),
                i(cols),
                i(accumulate as usize),
            ),
            GemmPath::Cublas => {
                let n = t * cols;
                let xb = sc.get(d, "x_bf16", n * B)?;
                kernels::f32_to_bf16(
                    d,
                    Launch::pdl(((n as u32).div_ceil(256), 1, 1), (256, 1, 1), 0),
                    dptr(x),
                    dptr(xb),
                    n as i64,
                )?;
                d.gemm_bf16(xb, w, y, t, rows, cols, accumulate)
            }
            GemmPath::CublasSplit if self.single_bf16(sc) => {
                // `--prefill-precision bf16`: one GEMM on the rounded
                // activations (the split kernel without lo: 4 per thread).
                let n = t * cols;
                let xb = sc.get(d, "x_bf16", n * B)?;
                kernels::f32_to_bf16_split(
                    d,
                    Launch::pdl(((n as u32).div_ceil(4 * 256), 1, 1), (256, 1, 1), 0),
                    dptr(x),
                    dptr(xb),
                    dptr(0),
                    n as i64,
                )?;
                d.gemm_bf16(xb, w, y, t, rows, cols, accumulate)
            }
            GemmPath::CublasSplit => {
                let n = t * cols;
                let hi = sc.get(d, "x_bf16", 2 * n * B)?;
                let lo = hi + (n * B) as u64;
                kernels::f32_to_bf16_split(
                    d,
                    Launch::pdl(((n as u32).div_ceil(4 * 256), 1, 1), (256, 1, 1), 0),
                    dptr(x),
                    dptr(hi),
                    dptr(lo),
                    n as i64,
                )?;
                let stack = match self.opts.gemm_stack {
                    GemmStack::On => true,
                    GemmStack::Decode => sc.decode_rows,
                    GemmStack::Off => false,
                };
                if t <= STACKED_MAX && stack {
                    // Few rows: the weights dominate, so one GEMM over the
                    // stacked [hi; lo] rows reads them once instead of twice.
                    let p = sc.get(d, "stacked", 2 * t * rows * F)?;
                    d.gemm_bf16(hi, w, p, 2 * t, rows, cols, false)?;
                    let n = t * rows;
                    return kernels::add_halves(
                        d,
                        Launch::pdl(((n as u32).div_ceil(256), 1, 1), (256, 1, 1), 0),
                        dptr(p),
                        dptr(y),
                        n as i64,
                        i(accumulate as usize),
                    );
                }
                d.gemm_bf16(hi, w, y, t, rows, cols, accumulate)?;
                d.gemm_bf16(lo, w, y, t, rows, cols, true)
            }
        }
    }

    /// Whether a projection of `t` rows of `cols` at `x` onto `rows` block-FP8
    /// rows takes FP8 activations (`--prefill-precision fp8`): where
    /// `single_bf16` applies, past the few-row kernels, on a device with
    /// cuBLASLt's block-scaled GEMMs, with whole scale blocks and 16-byte
    /// aligned rows. cuBLASLt reads W's scale rows at a 16-byte aligned
    /// stride, so it takes the checkpoint's `[rows / 128, cols / 128]` scales
    /// as stored only where `cols / 128` is a multiple of 4 (every FP8 matrix
    /// of the Qwen3.5/3.6 MoE models: 512, 2048 and 4096 columns); others,
    /// measured wrong by `verify` at 256-768 columns, keep the bf16 path.
    fn fp8_activations(&self, sc: &Scratch, x: u64, t: usize, rows: usize, cols: usize) -> bool {
        self.opts.prefill == PrefillPrecision::Fp8
            && self.single_bf16(sc)
            && self.gemm == GemmPath::CublasSplit
            && self.dev.fp8_gemm()
            && t > 1
            && cols.is_multiple_of(FP8_COLS)
            && rows.is_multiple_of(128)
            && x.is_multiple_of(16)
    }

    /// `y (+)= W x` with x quantized to E4M3 per row and 128 columns
    /// (`fp8_quant_rows`) and W's block-FP8 bytes as stored, on FP8 tensor
    /// cores (`Device::gemm_fp8_blocks`): no bf16 copy of W, one product.
    /// cuBLASLt takes the activations' scale columns 16-byte aligned and has
    /// no algorithm for some row counts (37, 70 on the H100), so the rows run
    /// padded with zeros to a multiple of `FP8_ROWS`, into a work buffer
    /// where that adds rows.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn linear_fp8(
        &self,
        sc: &mut Scratch,
        x: u64,
        t: usize,
        w: (u64, u64),
        rows: usize,
        cols: usize,
        y: u64,
        accumulate: bool,
    ) -> Result<()> {
        let d = &self.dev;
        let a = self.q8_rows(sc, "x_fp8", x, cols, 0, t, cols)?;
        let (xq, xs, tp) = (a.bytes, a.scales, a.stride);
        if tp == t {
            return d.gemm_fp8_blocks((xq, xs), w, y, t, rows, cols, accumulate);
        }
        let out = sc.get(d, "y_fp8", tp * rows * F)?;
        if accumulate {
            d.dtod(out, y, t * rows * F)?;
        }
        d.gemm_fp8_blocks((xq, xs), w, out, tp, rows, cols, accumulate)?;
        d.dtod(y, out, t * rows * F)
    }

    /// Whether this pass's multi-token products run on activations rounded
    /// to one bf16 term (`--prefill-precision bf16`, and `fp8`'s products that
    /// do not take FP8 activations): prompt passes and
    /// batched steps that carry a prompt chunk (their decode rows too);
    /// decode-only batched steps keep split activations, as do the few-row
    /// kernels and the decode step's GEMVs, which never ask.
    pub(super) fn single_bf16(&self, sc: &Scratch) -> bool {
        self.opts.prefill != PrefillPrecision::Split && !sc.decode_rows
    }

    /// Whether the few-row kernels take `t` rows (at most `max`) of `cols`
    /// at `x`: on the split path of a CUDA build (tensor cores), whole
    /// 32-column steps, 16-byte aligned rows.
    pub(super) fn rows_kernel_fits(&self, x: u64, t: usize, cols: usize, max: usize) -> bool {
        cfg!(feature = "cuda")
            && self.opts.rows.few_row_kernels()
            && self.gemm == GemmPath::CublasSplit
            && (2..=max).contains(&t)
            && cols.is_multiple_of(32)
            && x.is_multiple_of(16)
    }

    /// Whether `gemm_rows` takes this projection: 2-16 rows where the
    /// few-row kernels fit, 17-32 only through the ring (`QWASI_GEMM_ROWS=bulk32`;
    /// the register-load kernels lose to cuBLAS past 16 rows).
    fn few_rows(&self, x: u64, t: usize, wt: MatWeights, rows: usize, cols: usize) -> bool {
        let most = match wt {
            MatWeights::Fp8 { .. } => RING_ROWS_MAX_FP8,
            MatWeights::Bf16(_) => RING_ROWS_MAX,
        };
        self.rows_kernel_fits(x, t, cols, GEMM_ROWS_MAX)
            || (t > GEMM_ROWS_MAX
                && self.rows_kernel_fits(x, t, cols, most)
                && ring_chunks(t, RING_ROWS_MAX)
                    .all(|(_, n)| self.rows_bulk_plan(n, wt, rows, cols).is_some()))
    }

    /// `y = W x` over `t` (2..=32) rows with each weight read once
    /// (kernels/gemm_rows.cu): through the bulk-copy ring where it applies
    /// (`rows_bulk_plan`; past 16 rows only there), else the K dimension
    /// split into as many slices (each of at least `GEMM_ROWS_MIN_SLICE`
    /// columns) as fill the GPU with warps, summed in order by
    /// `gemm_rows_reduce`. Block-FP8 weights take up to 64 rows through the
    /// ring, in launches of at most 32 (`ring_chunks`), each row's sums as
    /// in a launch of its chunk's size.
    #[allow(clippy::too_many_arguments)]
    fn gemm_rows(
        &self,
        sc: &mut Scratch,
        x: u64,
        t: usize,
        wt: MatWeights,
        rows: usize,
        cols: usize,
        y: u64,
        accumulate: bool,
    ) -> Result<()> {
        let d = &self.dev;
        if t > RING_ROWS_MAX {
            for (r0, n) in ring_chunks(t, RING_ROWS_MAX) {
                let (x, y) = (x + (r0 * cols * F) as u64, y + (r0 * rows * F) as u64);
                self.gemm_rows(sc, x, n, wt, rows, cols, y, accumulate)?;
            }
            return Ok(());
        }
        if let Some(p) = self.rows_bulk_plan(t, wt, rows, cols) {
            return self.rows_ring(sc, &p, x, t, wt, rows, cols, y, accumulate);
        }
        let groups = rows.div_ceil(32);
        let target = d.sm_count as usize * GEMM_ROWS_WARPS_PER_SM;
        // Slices of whole steps: 32 columns, 64 for FP8 (16-byte loads of two).
        let step = match wt {
            MatWeights::Bf16(_) => 32,
            MatWeights::Fp8 { .. } => 64,
        };
        let mut slices = 1;
        while groups * slices * 2 <= target
            && (cols / step).is_multiple_of(slices * 2)
            && cols / (slices * 2) >= GEMM_ROWS_MIN_SLICE
        {
            slices *= 2;
        }
        let part = if slices > 1 {
            sc.get(d, "rows_part", slices * t * rows * F)?
        } else {
            0
        };
        let l = Launch::pdl(((groups * slices).div_ceil(4) as u32, 1, 1), (128, 1, 1), 0);
        let (t_, rows_, cols_, s_, acc_) =
            (i(t), i(rows), i(cols), i(slices), i(accumulate as usize));
        match wt {
            MatWeights::Bf16(w) => {
                let kernel = match t {
                    ..=8 => kernels::gemm_rows8,
                    9..=16 => kernels::gemm_rows16,
                    17..=32 => kernels::gemm_rows32,
                    _ => kernels::gemm_rows64,
                };
                kernel(
                    d,
                    l,
                    dptr(x),
                    dptr(w),
                    dptr(y),
                    dptr(part),
                    t_,
                    rows_,
                    cols_,
                    s_,
                    acc_,
                )?
            }
            MatWeights::Fp8 { q, s } => {
                let kernel = match t {
                    ..=8 => kernels::gemm_rows8_fp8,
                    9..=16 => kernels::gemm_rows16_fp8,
                    _ => anyhow::bail!("{t} rows: the FP8 few-row kernels take at most 16"),
                };
                let (q, s) = (dptr(q), dptr(s));
                kernel(
                    d,
                    l,
                    dptr(x),
                    q,
                    s,
                    dptr(y),
                    dptr(part),
                    t_,
                    rows_,
                    cols_,
                    s_,
                    acc_,
                )?
            }
        }
        if slices > 1 {
            let n = t * rows;
            kernels::gemm_rows_reduce(
                d,
                Launch::pdl(((n as u32).div_ceil(256), 1, 1), (256, 1, 1), 0),
                dptr(part),
                dptr(y),
                n as i64,
                i(slices),
                i(accumulate as usize),
            )?;
        }
        Ok(())
    }

    /// One ring launch of `rows_bulk_plan`'s plan `p`, and with K slices
    /// their ordered sum.
    #[allow(clippy::too_many_arguments)]
    fn rows_ring(
        &self,
        sc: &mut Scratch,
        p: &RowsBulk,
        x: u64,
        t: usize,
        wt: MatWeights,
        rows: usize,
        cols: usize,
        y: u64,
        accumulate: bool,
    ) -> Result<()> {
        let d = &self.dev;
        let per_slice = (p.resident as usize / p.slices).max(1);
        let grid = rows.div_ceil(8).min(per_slice) as u32;
        let l = Launch::pdl((grid, p.slices as u32, 1), (p.threads, 1, 1), p.smem);
        let part = if p.slices > 1 {
            sc.get(d, "rows_part", p.slices * t * rows * F)?
        } else {
            0
        };
        let (x, yp, tt, n, k) = (dptr(x), dptr(y), i(t), i(rows), i(cols));
        let (acc, st, pp) = (i(accumulate as usize), i(p.stages), dptr(part));
        match (p.kernel, wt) {
            (RingKernel::Bf16(kr), MatWeights::Bf16(w)) => {
                return (kr.launch)(d, l, x, dptr(w), yp, tt, n, k, acc, st);
            }
            (RingKernel::Fp8(kr), MatWeights::Fp8 { q, s }) => {
                return (kr.launch)(d, l, x, dptr(q), dptr(s), yp, tt, n, k, acc, st);
            }
            (RingKernel::Bf16Sliced(kr), MatWeights::Bf16(w)) => {
                (kr.launch)(d, l, x, dptr(w), yp, pp, tt, n, k, acc, st)?
            }
            (RingKernel::Fp8Sliced(kr), MatWeights::Fp8 { q, s }) => {
                (kr.launch)(d, l, x, dptr(q), dptr(s), yp, pp, tt, n, k, acc, st)?
            }
            _ => unreachable!("rows_bulk_plan picks the kernel of the weights' format"),
        }
        if p.slices > 1 {
            let n = t * rows;
            kernels::gemm_rows_reduce(
                d,
                Launch::pdl(((n as u32).div_ceil(256), 1, 1), (256, 1, 1), 0),
                dptr(part),
                dptr(y),
                n as i64,
                i(p.slices),
                i(accumulate as usize),
            )?;
        }
        Ok(())
    }

    /// The ring of `gemm_rows_bulk` (2-8 rows), `gemm_rows_bulk16` (9-16) or
    /// `gemm_rows_bulk32` (17-32, with `QWASI_GEMM_ROWS=bulk32`), or their
    /// `_fp8` forms, for `t` rows of a `rows` x `cols` matrix: K slices,
    /// slots, dynamic shared memory and how many blocks are resident at
    /// once; `None` where it does not apply: no bulk copies, more rows than
    /// `QWASI_GEMM_ROWS` takes through the ring, columns not whole warps'
    /// (256 a warp up to 4,096 columns; 128 up to 2,048 for 9-16 rows, whose
    /// activations take twice the registers; 64 a warp for 17-32 rows, in
    /// K slices of at most 1,024 columns), unaligned weights, FP8 rows not in
    /// whole 128-row blocks. Slots of 8 rows, `QWASI_BULK_STAGES` of them as
    /// they fit beside the kernel's static shared memory (8.3 KB; 16.3 KB for
    /// 9-16 rows, 32.3 KB for 17-32); FP8 slots hold half the bytes, so twice
    /// as many (at most 8): the same bytes in flight.
    fn rows_bulk_plan(
        &self,
        t: usize,
        wt: MatWeights,
        rows: usize,
        cols: usize,
    ) -> Option<RowsBulk> {
        let d = &self.dev;
        let fp8 = matches!(wt, MatWeights::Fp8 { .. });
        if t > self.opts.rows.bulk_max() {
            return None;
        }
        // By row count: columns a warp, most columns a slice, static shared
        // memory; the kernel also by the weights' format.
        let (warp_cols, max_slice, static_smem) = match t {
            0..=8 => (256, 4096, 9 << 10),
            9..=16 => (128, 2048, 17 << 10),
            _ => (64, 1024, 33 << 10),
        };
        let kernel = match (t, fp8) {
            (..=8, false) => RingKernel::Bf16(typed::gemm_rows_bulk),
            (..=16, false) => RingKernel::Bf16(typed::gemm_rows_bulk16),
            (_, false) => RingKernel::Bf16Sliced(typed::gemm_rows_bulk32),
            (..=8, true) => RingKernel::Fp8(typed::gemm_rows_bulk_fp8),
            (..=16, true) => RingKernel::Fp8(typed::gemm_rows_bulk16_fp8),
            (_, true) => RingKernel::Fp8Sliced(typed::gemm_rows_bulk32_fp8),
        };
        let sliced = matches!(kernel, RingKernel::Bf16Sliced(_) | RingKernel::Fp8Sliced(_));
        let slices = if sliced {
            ring_slices(cols, if fp8 { 128 } else { warp_cols }, max_slice)?
        } else {
            1
        };
        let ks = cols / slices;
        if !d.bulk_copies()
            || !ks.is_multiple_of(warp_cols)
            || ks > max_slice
            || !wt.ptr().is_multiple_of(16)
            || (fp8 && !(rows.is_multiple_of(128) && cols.is_multiple_of(128)))
        {
            return None;
        }
        // A slot row's bytes and padding (kernels/gemm_rows.cu: RbBf16, RbFp8).
        let (slot, max_stages) = if fp8 {
            (
                8 * (ks + 32),
                (2 * self.opts.bulk_stages).min(BULK_MAX_STAGES),
            )
        } else {
            (8 * (2 * ks + 64), self.opts.bulk_stages)
        };
        let stages = max_stages.min(d.max_shared_per_block().saturating_sub(static_smem) / slot);
        if stages == 0 {
            return None;
        }
        let (threads, smem) = ((ks * 32 / warp_cols) as u32, (stages * slot) as u32);
        Some(RowsBulk {
            kernel,
            slices,
            threads,
            smem,
            stages,
            resident: d.occupancy(kernel.kernel(), threads, smem) * d.sm_count,
        })
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn rmsnorm(
        &self,
        x: u64,
        x_stride: usize,
        w: &DBuf,
        out: u64,
        out_stride: usize,
        rows: usize,
        dim: usize,
    ) -> Result<()> {
        kernels::rmsnorm(
            &self.dev,
            Launch::pdl((rows as u32, 1, 1), (256, 1, 1), 0),
            dptr(x),
            i(x_stride),
            dptr(w.ptr()),
            dptr(out),
            i(out_stride),
            i(rows),
            i(dim),
            self.cfg.rms_norm_eps,
        )
    }

    /// A block's input: `n = norm(x)` over `t` rows unless the block before
    /// wrote it ([`Norms::ready`]).
    pub(super) fn block_input(&self, x: u64, n: u64, t: usize, nm: Norms) -> Result<()> {
        let h = self.cfg.hidden_size;
        if nm.ready {
            return Ok(());
        }
        self.rmsnorm(x, h, nm.input, n, h, t, h)
    }

    /// A block's residual add `x += mixed` over `t` rows, then the next
    /// block's input `n = next(x)` in the same launch where there is one.
    pub(super) fn block_output(
        &self,
        x: u64,
        mixed: u64,
        n: u64,
        t: usize,
        nm: Norms,
    ) -> Result<()> {
        let (d, h) = (&self.dev, self.cfg.hidden_size);
        let Some(w) = nm.next else {
            return self.residual_add(x, mixed, t);
        };
        kernels::add_rmsnorm(
            d,
            Launch::pdl((t as u32, 1, 1), (256, 1, 1), 0),
            dptr(x),
            dptr(mixed),
            dptr(w.ptr()),
            dptr(n),
            i(t),
            i(h),
            self.cfg.rms_norm_eps,
        )
    }

    /// `x += y` over `t` rows of the residual stream.
    pub(super) fn residual_add(&self, x: u64, mixed: u64, t: usize) -> Result<()> {
        let (d, h) = (&self.dev, self.cfg.hidden_size);
        let nel = t * h;
        kernels::add_inplace(
            d,
            Launch::pdl(((nel as u32).div_ceil(256), 1, 1), (256, 1, 1), 0),
            dptr(x),
            dptr(mixed),
            nel as i64,
        )?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::{ring_chunks, ring_slices};

    #[test]
    fn ring_chunks_cover_the_rows_evenly() {
        let chunks = |t| ring_chunks(t, 32).collect::<Vec<_>>();
        assert_eq!(chunks(20), [(0, 20)]);
        assert_eq!(chunks(32), [(0, 32)]);
        assert_eq!(chunks(33), [(0, 16), (16, 17)]);
        assert_eq!(chunks(40), [(0, 20), (20, 20)]);
        assert_eq!(chunks(64), [(0, 32), (32, 32)]);
        for t in 2..=64 {
            let c = chunks(t);
            assert_eq!(c.iter().map(|&(_, n)| n).sum::<usize>(), t);
            assert!(c.windows(2).all(|w| w[0].0 + w[0].1 == w[1].0));
            assert!(c.iter().all(|&(_, n)| (1..=32).contains(&n)));
            let (lo, hi) = (c.iter().map(|x| x.1).min(), c.iter().map(|x| x.1).max());
            assert!(hi.unwrap() - lo.unwrap() <= 1, "{t}: {c:?}");
        }
    }

    #[test]
    fn ring_slices_are_whole_units_within_the_limit() {
        // The 35B model's 2,048- and 4,096-column projections, and 512 (shared down).
        assert_eq!(ring_slices(2048, 64, 1024), Some(2));
        assert_eq!(ring_slices(4096, 64, 1024), Some(4));
        assert_eq!(ring_slices(512, 64, 1024), Some(1));
        assert_eq!(ring_slices(512, 128, 1024), Some(1));
        // 1,536 = 2 x 768 (768 a multiple of 64 and of 128).
        assert_eq!(ring_slices(1536, 64, 1024), Some(2));
        // 1,088 = 17 x 64: no slice of at most 1,024 whole warps but 17 of 64.
        assert_eq!(ring_slices(1088, 64, 1024), Some(17));
        // Narrower than a unit, or no whole-unit split: none.
        assert_eq!(ring_slices(32, 64, 1024), None);
        assert_eq!(ring_slices(1088, 128, 1024), None);
    }
}
