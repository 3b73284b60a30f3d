// Chunked Gated DeltaNet prefill (the WY / UT-transform form of
// host/engine/src/cpu/gdn.rs `chunked`, chunk 64), all f32 on CUDA cores, in
// three launches:
//   1. gdn_chunk_prep  (chunk, value head) in parallel: G = cumulative log-decay
//      within the chunk, T = (I + A)^-1 with A[i][j] = beta_i k_i.k_j e^{G_i-G_j}
//      (strictly lower) by forward substitution, W = T (beta k e^G) (stored
//      transposed, [dk][64] per chunk), U = T (beta v) ([T][dv] per head), G.
//   2. gdn_chunk_state (value head, 32-column dv tile), serial over chunks:
//      v_new = U - W S (written over U), S_c saved per chunk, then
//      S = e^{G_last} S + sum_i (k_i e^{G_last-G_i}) v_new_i^T; final S written back.
//   3. gdn_chunk_out   (chunk, value head) in parallel:
//      o_i = e^{G_i} q_i S_c + sum_{j<=i} (q_i.k_j) e^{G_i-G_j} v_new_j.
// q/k/v are read from the conv output rows `qkv` (row stride `stride`): q at
// row[hk*dk + d], k at row[key_dim + hk*dk + d], v at row[2*key_dim + hv*dv + c],
// hk = hv / (nv / nk). g, beta [T][nv]; S [nv][dk][dv]; out [T][nv][dv].
// Limits: dk, dv <= 128 (the host checks). Block 256 threads everywhere.
// Scratch layouts (nch = ceil(T / 64)):
//   WT [nv][nch][dk][64], U [nv][T][dv], Gc [nv][T], Sc [nv][nch][dk][dv].
#include "compat.h"

#define GC_C 64     // chunk length
#define GC_D 128    // max dk / dv
#define GC_LD 129   // padded row stride of [64][128] tiles (conflict-free column walks)
#define GC_LDA 65   // padded row stride of [64][64] tiles

// Phase 1. grid (nch, nv), block 256, dynamic smem GC_PREP_SMEM floats:
// Ks [64][129], Vs [64][129], As [64][65], Gs [64], Bs [64].
QW_KERNEL void QW_BOUNDS(256) gdn_chunk_prep(const float* __restrict__ qkv, int stride, int nk, int nv, int dk,
                                             int dv, const float* __restrict__ g, const float* __restrict__ beta,
                                             float* __restrict__ WT, float* __restrict__ U, float* __restrict__ Gc,
                                             int T) {
    QW_DYN_SMEM(float, smem);
    float* Ks = smem;                  // [64][GC_LD]
    float* Vs = Ks + GC_C * GC_LD;     // [64][GC_LD]
    float* As = Vs + GC_C * GC_LD;     // [64][GC_LDA]
    float* Gs = As + GC_C * GC_LDA;    // [64]
    float* Bs = Gs + GC_C;             // [64]
    const int ch = blockIdx.x, hv = blockIdx.y, nch = gridDim.x;
    const int tid = threadIdx.x;
    const int c0 = ch * GC_C;
    const int n = min(GC_C, T - c0);
    const int hk = hv / (nv / nk);
    const int key_dim = nk * dk;

    // Loads (rows i >= n and columns >= dk/dv are zero).
#pragma unroll 8
    for (int m = 0; m < GC_C * GC_D / 256; m++) {
        int idx = tid + 256 * m;
        int i = idx / GC_D, d = idx % GC_D;
        const float* row = qkv + (size_t)(c0 + i) * stride;
        Ks[i * GC_LD + d] = (i < n && d < dk) ? row[key_dim + hk * dk + d] : 0.f;
        Vs[i * GC_LD + d] = (i < n && d < dv) ? row[2 * key_dim + hv * dv + d] : 0.f;
    }
    if (tid < GC_C) {
        Bs[tid] = tid < n ? beta[(size_t)(c0 + tid) * nv + hv] : 0.f;
        Gs[tid] = tid < n ? g[(size_t)(c0 + tid) * nv + hv] : 0.f;
    }
    __syncthreads();
    if (tid == 0) {
        float acc = 0.f;  // inclusive cumulative sum, in token order (as the CPU)
        for (int i = 0; i < GC_C; i++) {
            acc += Gs[i];
            Gs[i] = acc;
        }
    }
    __syncthreads();
    if (tid < n) Gc[(size_t)hv * T + c0 + tid] = Gs[tid];

    // As[i][j] = -beta_i k_i.k_j e^{G_i - G_j} for j < i < n, else 0.
    // Thread tile: i = b + 16r, j = a + 16s (a = tid % 16, b = tid / 16).
    {
        const int a = tid % 16, b = tid / 16;
        float acc[4][4];
#pragma unroll
        for (int r = 0; r < 4; r++)
#pragma unroll
            for (int s = 0; s < 4; s++) acc[r][s] = 0.f;
        for (int d = 0; d < dk; d++) {
            float ki[4], kj[4];
#pragma unroll
            for (int r = 0; r < 4; r++) ki[r] = Ks[(b + 16 * r) * GC_LD + d];
#pragma unroll
            for (int s = 0; s < 4; s++) kj[s] = Ks[(a + 16 * s) * GC_LD + d];
#pragma unroll
            for (int r = 0; r < 4; r++)
#pragma unroll
                for (int s = 0; s < 4; s++) acc[r][s] += ki[r] * kj[s];
        }
#pragma unroll
        for (int r = 0; r < 4; r++)
#pragma unroll
            for (int s = 0; s < 4; s++) {
                int i = b + 16 * r, j = a + 16 * s;
                As[i * GC_LDA + j] = (j < i && i < n) ? -Bs[i] * acc[r][s] * expf(Gs[i] - Gs[j]) : 0.f;
            }
    }
    __syncthreads();

    // Forward substitution, row by row: T[i][j] = a[i][j] + sum_{j<m<i} a[i][m] T[m][j]
    // (a = the row as stored above, T rows < i final). Four threads per j.
    {
        const int j = tid / 4, part = tid % 4;
        for (int i = 1; i < n; i++) {
            float sum = 0.f;
            if (j < i)
                for (int m = j + 1 + part; m < i; m += 4) sum += As[i * GC_LDA + m] * As[m * GC_LDA + j];
            sum += SHFL_XOR(sum, 1);
            sum += SHFL_XOR(sum, 2);
            float val = (j < i) ? As[i * GC_LDA + j] + sum : 0.f;
            __syncthreads();
            if (part == 0 && j < i) As[i * GC_LDA + j] = val;
            __syncthreads();
        }
    }
    // Unit diagonal (rows < n); Ks row j *= beta_j e^{G_j}, Vs row j *= beta_j.
    if (tid < n) As[tid * GC_LDA + tid] = 1.f;
    for (int idx = tid; idx < GC_C * GC_D; idx += 256) {
        int jr = idx / GC_D, d = idx % GC_D;
        float bj = Bs[jr];
        Ks[jr * GC_LD + d] *= bj * expf(Gs[jr]);
        Vs[jr * GC_LD + d] *= bj;
    }
    __syncthreads();

    const int a = tid % 16, b = tid / 16;
    // W[i][d] = sum_j T[i][j] Ks'[j][d]; thread tile i = a + 16r, d = b + 16c; stored
    // transposed: WT[hv][ch][d][i] (all 64 i; rows i >= n are zero).
    {
        float acc[4][8];
#pragma unroll
        for (int r = 0; r < 4; r++)
#pragma unroll
            for (int c = 0; c < 8; c++) acc[r][c] = 0.f;
        for (int j = 0; j < n; j++) {
            float t[4], kk[8];
#pragma unroll
            for (int r = 0; r < 4; r++) t[r] = As[(a + 16 * r) * GC_LDA + j];
#pragma unroll
            for (int c = 0; c < 8; c++) kk[c] = Ks[j * GC_LD + b + 16 * c];
#pragma unroll
            for (int r = 0; r < 4; r++)
#pragma unroll
                for (int c = 0; c < 8; c++) acc[r][c] += t[r] * kk[c];
        }
        float* wt = WT + ((size_t)hv * nch + ch) * dk * GC_C;
#pragma unroll
        for (int c = 0; c < 8; c++) {
            int d = b + 16 * c;
            if (d < dk)
#pragma unroll
                for (int r = 0; r < 4; r++) wt[(size_t)d * GC_C + a + 16 * r] = acc[r][c];
        }
    }
    // U[i][c] = sum_j T[i][j] Vs'[j][c]; thread tile i = b + 16r, c = a + 16s; U[hv][c0 + i][c].
    {
        float acc[4][8];
#pragma unroll
        for (int r = 0; r < 4; r++)
#pragma unroll
            for (int s = 0; s < 8; s++) acc[r][s] = 0.f;
        for (int j = 0; j < n; j++) {
            float t[4], vv[8];
#pragma unroll
            for (int r = 0; r < 4; r++) t[r] = As[(b + 16 * r) * GC_LDA + j];
#pragma unroll
            for (int s = 0; s < 8; s++) vv[s] = Vs[j * GC_LD + a + 16 * s];
#pragma unroll
            for (int r = 0; r < 4; r++)
#pragma unroll
                for (int s = 0; s < 8; s++) acc[r][s] += t[r] * vv[s];
        }
#pragma unroll
        for (int r = 0; r < 4; r++) {
            int i = b + 16 * r;
            if (i < n) {
                float* u = U + ((size_t)hv * T + c0 + i) * dv;
#pragma unroll
                for (int s = 0; s < 8; s++) {
                    int c = a + 16 * s;
                    if (c < dv) u[c] = acc[r][s];
                }
            }
        }
    }
}

// Phase 2. grid (nv, ceil(dv / 32)), block 256 (8 groups of 32 threads), dynamic smem
// GC_STATE_SMEM floats: WTs [128][64], Ks [64][128], Us [64][32], Ss [128][32], Gs [64], Ef [64].
// Thread (w = tid / 32, lane): column c = tile*32 + lane; v_new rows i = w*8 + r (r < 8);
// state rows d = w*16 + r (r < 16). The next chunk's W, k, U and G are loaded into
// registers while the current chunk computes.
QW_KERNEL void QW_BOUNDS(256) gdn_chunk_state(const float* __restrict__ qkv, int stride, int nk, int nv, int dk,
                                              int dv, const float* __restrict__ WT, float* __restrict__ U,
                                              const float* __restrict__ Gc, float* __restrict__ S,
                                              float* __restrict__ Sc, int T) {
    QW_DYN_SMEM(float, smem);
    float* WTs = smem;                 // [128][64]
    float* Ks = WTs + GC_D * GC_C;     // [64][128]
    float* Us = Ks + GC_C * GC_D;      // [64][32]
    float* Ss = Us + GC_C * 32;        // [128][32]
    float* Gs = Ss + GC_D * 32;        // [64]
    float* Ef = Gs + GC_C;             // [64]: e^{G_last - G_i}
    const int hv = blockIdx.x;
    const int tid = threadIdx.x, w = tid / 32, lane = tid % 32;
    const int c = blockIdx.y * 32 + lane;
    const bool cvalid = c < dv;
    const int hk = hv / (nv / nk);
    const int key_dim = nk * dk;
    const int nch = (T + GC_C - 1) / GC_C;
    const float* kbase = qkv + key_dim + hk * dk;
    float* Sh = S + (size_t)hv * dk * dv;

    // Zero the padding once (WTs rows >= dk and Ks columns >= dk are never loaded).
    for (int idx = tid; idx < GC_D * GC_C; idx += 256) {
        WTs[idx] = 0.f;
        Ks[idx] = 0.f;
    }
#pragma unroll
    for (int r = 0; r < 16; r++) {
        int d = w * 16 + r;
        Ss[d * 32 + lane] = (d < dk && cvalid) ? Sh[(size_t)d * dv + c] : 0.f;
    }
    __syncthreads();  // the zeros land before the first chunk's rows overwrite them

    // Prefetch registers: W^T (dk*16 float4s), k (n*dk), U tile (64 x 32), G (64).
    float4 pw[8];
    float pk[32], pu[8], pg;
    auto fetch = [&](int ch) {
        const int c0 = ch * GC_C;
        const int n = min(GC_C, T - c0);
        const float4* src = reinterpret_cast<const float4*>(WT + ((size_t)hv * nch + ch) * dk * GC_C);
#pragma unroll
        for (int m = 0; m < 8; m++) {
            int idx = tid + 256 * m;
            pw[m] = idx < dk * 16 ? src[idx] : make_float4(0.f, 0.f, 0.f, 0.f);
        }
#pragma unroll
        for (int m = 0; m < 32; m++) {
            int idx = tid + 256 * m;
            int i = idx / dk, d = idx - i * dk;
            pk[m] = idx < n * dk ? kbase[(size_t)(c0 + i) * stride + d] : 0.f;
        }
#pragma unroll
        for (int m = 0; m < 8; m++) {
            int i = m * 8 + w;  // (tid + 256 m) / 32
            pu[m] = (i < n && cvalid) ? U[((size_t)hv * T + c0 + i) * dv + c] : 0.f;
        }
        pg = tid < n ? Gc[(size_t)hv * T + c0 + tid] : 0.f;
    };
    fetch(0);

    for (int ch = 0; ch < nch; ch++) {
        const int c0 = ch * GC_C;
        const int n = min(GC_C, T - c0);
        // Registers -> shared (the previous chunk's readers are past the last barrier).
        {
            float4* dst = reinterpret_cast<float4*>(WTs);
#pragma unroll
            for (int m = 0; m < 8; m++) {
                int idx = tid + 256 * m;
                if (idx < dk * 16) dst[idx] = pw[m];
            }
#pragma unroll
            for (int m = 0; m < 32; m++) {
                int idx = tid + 256 * m;
                int i = idx / dk, d = idx - i * dk;
                if (idx < n * dk) Ks[i * GC_D + d] = pk[m];
            }
#pragma unroll
            for (int m = 0; m < 8; m++) Us[tid + 256 * m] = pu[m];
            if (tid < GC_C) Gs[tid] = pg;
        }
        __syncthreads();
        if (ch + 1 < nch) fetch(ch + 1);
        const float glast = Gs[n - 1];
        if (tid < GC_C) Ef[tid] = tid < n ? expf(glast - Gs[tid]) : 0.f;

        // v_new[i][c] = U[i][c] - sum_d W[i][d] S[d][c], i = w*8 + r.
        {
            float acc[8];
#pragma unroll
            for (int r = 0; r < 8; r++) acc[r] = 0.f;
#pragma unroll 4
            for (int d = 0; d < dk; d++) {
                float s = Ss[d * 32 + lane];
                float4 x = *reinterpret_cast<const float4*>(WTs + d * GC_C + w * 8);
                float4 y = *reinterpret_cast<const float4*>(WTs + d * GC_C + w * 8 + 4);
                acc[0] += x.x * s;
                acc[1] += x.y * s;
                acc[2] += x.z * s;
                acc[3] += x.w * s;
                acc[4] += y.x * s;
                acc[5] += y.y * s;
                acc[6] += y.z * s;
                acc[7] += y.w * s;
            }
#pragma unroll
            for (int r = 0; r < 8; r++) {
                int i = w * 8 + r;
                float vn = Us[i * 32 + lane] - acc[r];
                Us[i * 32 + lane] = vn;
                if (i < n && cvalid) U[((size_t)hv * T + c0 + i) * dv + c] = vn;
            }
        }
        __syncthreads();

        // Save S_c (the chunk's starting state) for phase 3, then
        // S[d][c] = e^{G_last} S[d][c] + sum_{i<n} k_i[d] (e^{G_last-G_i} v_new[i][c]), d = w*16 + r.
        {
            const float el = expf(glast);
            float acc[16];
            float* sc = Sc + ((size_t)hv * nch + ch) * dk * dv;
#pragma unroll
            for (int r = 0; r < 16; r++) {
                int d = w * 16 + r;
                float s = Ss[d * 32 + lane];
                if (d < dk && cvalid) sc[(size_t)d * dv + c] = s;
                acc[r] = s * el;
            }
#pragma unroll 2
            for (int i = 0; i < n; i++) {
                float vn = Us[i * 32 + lane] * Ef[i];
                const float4* kr = reinterpret_cast<const float4*>(Ks + i * GC_D + w * 16);
#pragma unroll
                for (int q = 0; q < 4; q++) {
                    float4 k4 = kr[q];
                    acc[4 * q + 0] += k4.x * vn;
                    acc[4 * q + 1] += k4.y * vn;
                    acc[4 * q + 2] += k4.z * vn;
                    acc[4 * q + 3] += k4.w * vn;
                }
            }
#pragma unroll
            for (int r = 0; r < 16; r++) Ss[(w * 16 + r) * 32 + lane] = acc[r];
        }
        __syncthreads();
    }
#pragma unroll
    for (int r = 0; r < 16; r++) {
        int d = w * 16 + r;
        if (d < dk && cvalid) Sh[(size_t)d * dv + c] = Ss[d * 32 + lane];
    }
}

// Phase 3. grid (nch, nv), block 256, dynamic smem GC_OUT_SMEM floats:
// Qs [64][129], Ks [64][129] (after P: S tile [128][32] + v_new tile [64][32]), Ps [64][65], Gs [64].
QW_KERNEL void QW_BOUNDS(256) gdn_chunk_out(const float* __restrict__ qkv, int stride, int nk, int nv, int dk,
                                            int dv, const float* __restrict__ U, const float* __restrict__ Gc,
                                            const float* __restrict__ Sc, float* __restrict__ out, int T) {
    QW_DYN_SMEM(float, smem);
    float* Qs = smem;                  // [64][GC_LD]
    float* Ks = Qs + GC_C * GC_LD;     // [64][GC_LD]
    float* Ps = Ks + GC_C * GC_LD;     // [64][GC_LDA]
    float* Gs = Ps + GC_C * GC_LDA;    // [64]
    float* St = Ks;                    // [128][32], reuses Ks after P
    float* Vt = Ks + GC_D * 32;        // [64][32]
    const int ch = blockIdx.x, hv = blockIdx.y, nch = gridDim.x;
    const int tid = threadIdx.x;
    const int c0 = ch * GC_C;
    const int n = min(GC_C, T - c0);
    const int hk = hv / (nv / nk);
    const int key_dim = nk * dk;

#pragma unroll 8
    for (int m = 0; m < GC_C * GC_D / 256; m++) {
        int idx = tid + 256 * m;
        int i = idx / GC_D, d = idx % GC_D;
        const float* row = qkv + (size_t)(c0 + i) * stride;
        bool ok = i < n && d < dk;
        Qs[i * GC_LD + d] = ok ? row[hk * dk + d] : 0.f;
        Ks[i * GC_LD + d] = ok ? row[key_dim + hk * dk + d] : 0.f;
    }
    if (tid < GC_C) Gs[tid] = tid < n ? Gc[(size_t)hv * T + c0 + tid] : 0.f;
    __syncthreads();

    const int a = tid % 16, b = tid / 16;
    // P[i][j] = q_i.k_j e^{G_i - G_j} for j <= i < n, else 0; tile i = b + 16r, j = a + 16s.
    {
        float acc[4][4];
#pragma unroll
        for (int r = 0; r < 4; r++)
#pragma unroll
            for (int s = 0; s < 4; s++) acc[r][s] = 0.f;
        for (int d = 0; d < dk; d++) {
            float qi[4], kj[4];
#pragma unroll
            for (int r = 0; r < 4; r++) qi[r] = Qs[(b + 16 * r) * GC_LD + d];
#pragma unroll
            for (int s = 0; s < 4; s++) kj[s] = Ks[(a + 16 * s) * GC_LD + d];
#pragma unroll
            for (int r = 0; r < 4; r++)
#pragma unroll
                for (int s = 0; s < 4; s++) acc[r][s] += qi[r] * kj[s];
        }
#pragma unroll
        for (int r = 0; r < 4; r++)
#pragma unroll
            for (int s = 0; s < 4; s++) {
                int i = b + 16 * r, j = a + 16 * s;
                Ps[i * GC_LDA + j] = (j <= i && i < n) ? acc[r][s] * expf(Gs[i] - Gs[j]) : 0.f;
            }
    }
    __syncthreads();  // Ks is dead from here: St / Vt reuse it

    const float* sc = Sc + ((size_t)hv * nch + ch) * dk * dv;
    for (int t0 = 0; t0 < dv; t0 += 32) {
#pragma unroll
        for (int m = 0; m < GC_D * 32 / 256; m++) {
            int idx = tid + 256 * m;
            int d = idx / 32, cc = idx % 32;
            St[idx] = (d < dk && t0 + cc < dv) ? sc[(size_t)d * dv + t0 + cc] : 0.f;
        }
#pragma unroll
        for (int m = 0; m < GC_C * 32 / 256; m++) {
            int idx = tid + 256 * m;
            int j = idx / 32, cc = idx % 32;
            Vt[idx] = (j < n && t0 + cc < dv) ? U[((size_t)hv * T + c0 + j) * dv + t0 + cc] : 0.f;
        }
        __syncthreads();
        // Tile i = b + 16r (r < 4), column t0 + a + 16s (s < 2).
        float acc[4][2];
#pragma unroll
        for (int r = 0; r < 4; r++) acc[r][0] = acc[r][1] = 0.f;
        for (int d = 0; d < dk; d++) {
            float s0 = St[d * 32 + a], s1 = St[d * 32 + a + 16];
#pragma unroll
            for (int r = 0; r < 4; r++) {
                float q = Qs[(b + 16 * r) * GC_LD + d];
                acc[r][0] += q * s0;
                acc[r][1] += q * s1;
            }
        }
#pragma unroll
        for (int r = 0; r < 4; r++) {
            float e = expf(Gs[b + 16 * r]);
            acc[r][0] *= e;
            acc[r][1] *= e;
        }
        for (int j = 0; j < n; j++) {
            float v0 = Vt[j * 32 + a], v1 = Vt[j * 32 + a + 16];
#pragma unroll
            for (int r = 0; r < 4; r++) {
                float p = Ps[(b + 16 * r) * GC_LDA + j];
                acc[r][0] += p * v0;
                acc[r][1] += p * v1;
            }
        }
#pragma unroll
        for (int r = 0; r < 4; r++) {
            int i = b + 16 * r;
            if (i < n) {
                float* o = out + ((size_t)(c0 + i) * nv + hv) * dv + t0;
                if (t0 + a < dv) o[a] = acc[r][0];
                if (t0 + a + 16 < dv) o[a + 16] = acc[r][1];
            }
        }
        __syncthreads();
    }
}
