//! The chunked GDN prefill (`kernels/gdn_chunk.cu`): the WY / UT-transform form
//! of `cpu::gdn::chunked` (chunk 64) in three launches — per (chunk, value head)
//! the intra-chunk transform (W, U, cumulative decay), per (value head, 32-column
//! value tile) the state carried serially over chunks (v_new = U - W S and each
//! chunk's starting state saved), then per (chunk, value head) the outputs. Same
//! o and final S as the token-serial `gdn_recurrent`, to f32 rounding.

use super::{F, GpuModel, Scratch};
use crate::gpu::kernels::{self, Launch};
use crate::gpu::{dptr, i};
use anyhow::{Result, bail};

/// Chunk length (`GC_C` in the kernels).
pub(super) const CHUNK: usize = 64;
/// Largest key / value head dimension the kernels handle (`GC_D`).
const MAX_DIM: usize = 128;
/// Padded row strides of the kernels' shared tiles (`GC_LD`, `GC_LDA`, `GC_LDX`)
/// and the rows of S_c the output kernel stages at a time (`GC_SL`).
const LD: usize = MAX_DIM + 4;
const LDA: usize = CHUNK + 4;
const LDX: usize = 48;
const SLICE: usize = 32;
/// Dynamic shared memory of the three kernels, in floats (see the kernel comments).
const PREP_SMEM: usize = 2 * CHUNK * LD + CHUNK * LDA + 16 * LDX + 3 * CHUNK;
const STATE_SMEM: usize = 2 * MAX_DIM * CHUNK + CHUNK * 32 + 2 * MAX_DIM * 32 + 2 * CHUNK;
const OUT_SMEM: usize = 2 * CHUNK * LD + CHUNK * LDA + SLICE * LD + CHUNK;

impl GpuModel {
    /// The delta rule over `t` tokens for every value head: q/k/v from the conv
    /// output rows `proj` (row stride `p`), `g`/`beta` `[t][nv]`, state `s`
    /// `[nv][dk][dv]` updated in place, outputs `o` `[t][nv][dv]`. The chunked
    /// kernels for prompts; the token-serial kernel for one token, with
    /// `QWASI_GDN=serial`, for head dimensions above 128 or not multiples of 4,
    /// and where the chunked kernels' shared memory does not fit (RDNA's 64 KB
    /// per block). `caps`: (token offset on the chunk grid, state) where
    /// the state after that many tokens is copied (chunked kernels only).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn gdn_recurrence(
        &self,
        sc: &mut Scratch,
        proj: u64,
        p: usize,
        g: u64,
        beta: u64,
        s: u64,
        o: u64,
        t: usize,
        caps: &[(usize, u64)],
    ) -> Result<()> {
        if t == 0 {
            return Ok(());
        }
        if t >= 2 && self.opts.chunked_gdn && self.chunked_gdn_fits() {
            self.gdn_chunked(sc, proj, p, g, beta, s, o, t, caps)
        } else if caps.is_empty() {
            self.gdn_serial(proj, p, g, beta, s, o, t)
        } else {
            bail!("states inside a pass need the chunked GDN kernels")
        }
    }

    pub(super) fn chunked_gdn_fits(&self) -> bool {
        let c = &self.cfg;
        let (nk, nv) = (c.linear_num_key_heads, c.linear_num_value_heads);
        let (dk, dv) = (c.linear_key_head_dim, c.linear_value_head_dim);
        let dims_ok =
            dk <= MAX_DIM && dv <= MAX_DIM && dk % 4 == 0 && dv % 4 == 0 && nk != 0 && nv % nk == 0;
        #[cfg(all(feature = "hip", not(feature = "cuda")))]
        let dims_ok = dims_ok
            && PREP_SMEM.max(STATE_SMEM).max(OUT_SMEM) * F <= self.dev.max_shared_per_block();
        dims_ok
    }

    /// The token-serial kernel (`gdn_recurrent`): the state stays in shared memory.
    #[allow(clippy::too_many_arguments)]
    fn gdn_serial(
        &self,
        proj: u64,
        p: usize,
        g: u64,
        beta: u64,
        s: u64,
        o: u64,
        t: usize,
    ) -> Result<()> {
        let c = &self.cfg;
        let (nk, nv, dk, dv) = c.linear_heads();
        let smem = ((dk * 32 + 2 * dk + 256) * F) as u32;
        kernels::gdn_recurrent(
            &self.dev,
            Launch::new((nv as u32, (dv as u32).div_ceil(32), 1), (32, 8, 1), smem),
            dptr(proj),
            i(p),
            i(nk),
            i(nv),
            i(dk),
            i(dv),
            dptr(g),
            dptr(beta),
            dptr(s),
            dptr(o),
            i(t),
        )
    }

    /// The chunked (WY) form in three launches, and a copy of the state at
    /// each capture's chunk boundary after the second.
    #[allow(clippy::too_many_arguments)]
    fn gdn_chunked(
        &self,
        sc: &mut Scratch,
        proj: u64,
        p: usize,
        g: u64,
        beta: u64,
        s: u64,
        o: u64,
        t: usize,
        caps: &[(usize, u64)],
    ) -> Result<()> {
        let c = &self.cfg;
        let d = &self.dev;
        let (nk, nv, dk, dv) = c.linear_heads();
        let nch = t.div_ceil(CHUNK);
        let wt = sc.get(d, "gdn_chunk_wt", nv * nch * dk * CHUNK * F)?;
        let u = sc.get(d, "gdn_chunk_u", nv * t * dv * F)?;
        let gc = sc.get(d, "gdn_chunk_g", nv * t * F)?;
        let sc_states = sc.get(d, "gdn_chunk_s", nv * nch * dk * dv * F)?;
        kernels::gdn_chunk_prep(
            d,
            Launch::new(
                (nch as u32, nv as u32, 1),
                (256, 1, 1),
                (PREP_SMEM * F) as u32,
            ),
            dptr(proj),
            i(p),
            i(nk),
            i(nv),
            i(dk),
            i(dv),
            dptr(g),
            dptr(beta),
            dptr(wt),
            dptr(u),
            dptr(gc),
            i(t),
        )?;
        kernels::gdn_chunk_state(
            d,
            Launch::new(
                (nv as u32, (dv as u32).div_ceil(32), 1),
                (512, 1, 1),
                (STATE_SMEM * F) as u32,
            ),
            dptr(proj),
            i(p),
            i(nk),
            i(nv),
            i(dk),
            i(dv),
            dptr(wt),
            dptr(u),
            dptr(gc),
            dptr(s),
            dptr(sc_states),
            i(t),
        )?;
        let n = dk * dv;
        for &(off, dst) in caps {
            if off == 0 || off >= t || !off.is_multiple_of(CHUNK) {
                bail!("a state capture at token {off} of a {t}-token pass is off the chunk grid");
            }
            kernels::gdn_state_capture(
                d,
                Launch::new(((n as u32).div_ceil(256), nv as u32, 1), (256, 1, 1), 0),
                dptr(sc_states),
                i(nch),
                i(off / CHUNK),
                i(n),
                dptr(dst),
            )?;
        }
        kernels::gdn_chunk_out(
            d,
            Launch::new(
                (nch as u32, nv as u32, 1),
                (256, 1, 1),
                (OUT_SMEM * F) as u32,
            ),
            dptr(proj),
            i(p),
            i(nk),
            i(nv),
            i(dk),
            i(dv),
            dptr(u),
            dptr(gc),
            dptr(sc_states),
            dptr(o),
            i(t),
        )
    }
}
