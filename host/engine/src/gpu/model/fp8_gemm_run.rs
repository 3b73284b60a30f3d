//! One FP8-activation projection (`--prefill-precision fp8`'s path) on
//! given operands, for `verify`'s check of it against the f64 product of
//! its quantized operands (`gpu/verify_fp8_gemm.rs`).

use super::GpuModel;
use super::ops::{FP8_ROWS, Scratch};
use anyhow::Result;

/// What the device made of one projection: the activations' E4M3 bytes
/// [t, cols], their scales [cols / 128, t] and the output [t, rows].
pub struct Fp8GemmRun {
    pub xq: Vec<u8>,
    pub xs: Vec<f32>,
    pub y: Vec<f32>,
}

impl GpuModel {
    /// Whether this device runs the FP8-activation projections.
    pub fn fp8_gemm_available(&self) -> bool {
        self.dev.fp8_gemm()
    }

    /// `y0 + x . W^T` (`y0` zero when absent) for f32 `x` [t, cols] and the
    /// block-FP8 W (`wq` [rows, cols], `ws` [rows / 128, cols / 128]) through
    /// `linear_fp8`, the prompt passes' own code.
    #[allow(clippy::too_many_arguments)]
    pub fn fp8_gemm_run(
        &self,
        x: &[f32],
        t: usize,
        (wq, ws): (&[u8], &[f32]),
        rows: usize,
        cols: usize,
        y0: Option<&[f32]>,
    ) -> Result<Fp8GemmRun> {
        let d = &self.dev;
        d.bind()?;
        let (xd, wqd, wsd) = (d.upload(x)?, d.upload(wq)?, d.upload(ws)?);
        let yd = match y0 {
            Some(v) => d.upload(v)?,
            None => d.alloc_zeroed(t * rows * 4)?,
        };
        let mut sc = Scratch::default();
        let (w, y) = ((wqd.ptr(), wsd.ptr()), yd.ptr());
        self.linear_fp8(&mut sc, xd.ptr(), t, w, rows, cols, y, y0.is_some())?;
        d.sync()?;
        let mut out = Fp8GemmRun {
            xq: vec![0; t * cols],
            xs: vec![0.0; t * cols / 128],
            y: vec![0.0; t * rows],
        };
        // The bytes of the rows given, and their scales: column g of the
        // padded scale matrix starts at g * padded rows.
        let xq = sc.get(d, "x_fp8", 0)?;
        let tp = t.next_multiple_of(FP8_ROWS);
        d.dtoh(&mut out.xq, xq)?;
        let mut xs = vec![0f32; tp * cols / 128];
        d.dtoh(&mut xs, xq + (tp * cols) as u64)?;
        for g in 0..cols / 128 {
            out.xs[g * t..(g + 1) * t].copy_from_slice(&xs[g * tp..g * tp + t]);
        }
        d.dtoh(&mut out.y, y)?;
        Ok(out)
    }
}
