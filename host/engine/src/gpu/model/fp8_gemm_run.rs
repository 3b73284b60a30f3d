//! `--prefill-precision fp8`'s kernels on given operands: one projection
//! through its own path, and the grouped expert kernel over a given tile
//! table, for `verify`'s checks of them against the f64 products of their
//! quantized operands (`gpu/verify_fp8_gemm.rs`).

use super::GpuModel;
use super::moe_q8::Q8Rows;
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

    /// `verify`'s run of `moe_gemm_wg_q8` on given operands: E4M3 rows `aq`
    /// [r, cols] with scales `ascale` [cols / 128, stride], experts `q` [e *
    /// rows, cols] with scales `s`, the plan's tile table `tiles`; returns Y
    /// [r, rows] (NaN where no tile wrote; `r` may pass the tiles' rows).
    #[allow(clippy::too_many_arguments)]
    pub fn fp8_expert_run(
        &self,
        (aq, ascale, stride): (&[u8], &[f32], usize),
        (q, s): (&[u8], &[f32]),
        tiles: &[i32],
        (r, rows, cols): (usize, usize, usize),
    ) -> Result<Vec<f32>> {
        let d = &self.dev;
        d.bind()?;
        let (aqd, asd, qd, sd, td) = (
            d.upload(aq)?,
            d.upload(ascale)?,
            d.upload(q)?,
            d.upload(s)?,
            d.upload(tiles)?,
        );
        let y = vec![f32::NAN; r * rows];
        let yd = d.upload(&y)?;
        let a = Q8Rows {
            bytes: aqd.ptr(),
            scales: asd.ptr(),
            stride,
        };
        let most = tiles[0] as u32 + 2; // two block rows past the tiles, which must return
        self.q8_launch(
            &a,
            (qd.ptr(), sd.ptr(), rows, cols),
            (td.ptr(), most),
            yd.ptr(),
        )?;
        d.sync()?;
        let mut out = y;
        d.dtoh(&mut out, yd.ptr())?;
        Ok(out)
    }
}
