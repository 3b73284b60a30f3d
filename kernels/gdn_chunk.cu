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
// Limits: dk, dv <= 128 and multiples of 4 (the host checks). Block 256 threads
// everywhere. Phases 1 and 3 keep 4 x 8 (or 4 x 4) outputs per thread and read
// shared memory as float4 rows (~0.1 shared loads per FMA), so they are bound
// by the FMAs, not by shared-memory bandwidth.
// Scratch layouts (nch = ceil(T / 64)):
//   WT [nv][nch][dk][64], U [nv][T][dv], Gc [nv][T], Sc [nv][nch][dk][dv].
#include "compat.h"

#define GC_C 64     // chunk length
#define GC_D 128    // max dk / dv
#define GC_LD 132   // padded row stride of [64][128] tiles: float4 rows, 8 rows hit distinct banks
#define GC_LDA 68   // padded row stride of [64][64] tiles
#define GC_LDX 48   // row stride of the inverse's [16][48] scratch
#define GC_SL 32    // rows of S_c staged at a time by phase 3

__device__ __forceinline__ float gc_f4(const float4& v, int i) { return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w; }

// acc[r][s] += sum_{d < dlen} X[(xr + 16r) GC_LD + d] Y[(yr + 16s) GC_LD + d]; dlen % 4 == 0.
__device__ __forceinline__ void gc_tile_dots(const float* X, const float* Y, int xr, int yr, int dlen,
                                             float (&acc)[4][4]) {
    for (int d = 0; d < dlen; d += 4) {
        float4 x[4], y[4];
#pragma unroll
        for (int r = 0; r < 4; r++) x[r] = *reinterpret_cast<const float4*>(X + (xr + 16 * r) * GC_LD + d);
#pragma unroll
        for (int s = 0; s < 4; s++) y[s] = *reinterpret_cast<const float4*>(Y + (yr + 16 * s) * GC_LD + d);
#pragma unroll
        for (int r = 0; r < 4; r++)
#pragma unroll
            for (int s = 0; s < 4; s++) {
                acc[r][s] += x[r].x * y[s].x;
                acc[r][s] += x[r].y * y[s].y;
                acc[r][s] += x[r].z * y[s].z;
                acc[r][s] += x[r].w * y[s].w;
            }
    }
}

// acc[r][q] += sum_{j < jn} M[(mr + 16r) ldm + j] B[j GC_LD + col(q)], col(q) = q for
// q < 4 and C2 + q - 4 above (two float4 column groups); jn % 4 == 0, in order of j.
template <int C2>
__device__ __forceinline__ void gc_tile_rows(const float* M, int ldm, int mr, const float* B, int jn,
                                             float (&acc)[4][8]) {
    for (int j = 0; j < jn; j += 4) {
        float4 m[4];
#pragma unroll
        for (int r = 0; r < 4; r++) m[r] = *reinterpret_cast<const float4*>(M + (mr + 16 * r) * ldm + j);
#pragma unroll
        for (int jj = 0; jj < 4; jj++) {
            const float* br = B + (j + jj) * GC_LD;
            const float4 b0 = *reinterpret_cast<const float4*>(br), b1 = *reinterpret_cast<const float4*>(br + C2);
#pragma unroll
            for (int r = 0; r < 4; r++) {
                const float mv = gc_f4(m[r], jj);
                acc[r][0] += mv * b0.x;
                acc[r][1] += mv * b0.y;
                acc[r][2] += mv * b0.z;
                acc[r][3] += mv * b0.w;
                acc[r][4] += mv * b1.x;
                acc[r][5] += mv * b1.y;
                acc[r][6] += mv * b1.z;
                acc[r][7] += mv * b1.w;
            }
        }
    }
}

// As ([64][GC_LDA]) holds a strictly lower a (zero on and above the diagonal);
// replaces it by T = (I - a)^-1, unit lower triangular. Blocked, so the block
// meets 7 barriers instead of two per row: each 16 x 16 diagonal block by
// forward substitution in one warp (L_ij = a_ij + sum_{j<m<i} a_im L_mj), then
// block rows I = 1..3: T_IJ = T_II sum_{J<=M<I} a_IM T_MJ. Xs: [16][GC_LDX] scratch.
__device__ __forceinline__ void gc_unit_lower_inverse(float* As, float* Xs) {
    const int tid = threadIdx.x, w = tid / 32, lane = tid % 32;
    if (w < 4) {
        float* B = As + 16 * w * (GC_LDA + 1);
        const int j = lane & 15, half = lane >> 4;
        for (int i = 1; i < 16; i++) {
            float sum = 0.f;
            if (j < i)
                for (int m = j + 1 + half; m < i; m += 2) sum += B[i * GC_LDA + m] * B[m * GC_LDA + j];
            sum += SHFL_XOR(sum, 16);
            const float val = j < i ? B[i * GC_LDA + j] + sum : 0.f;
            QW_SYNCWARP();
            if (half == 0 && j < i) B[i * GC_LDA + j] = val;
            QW_SYNCWARP();
        }
    }
    __syncthreads();
    const int r = tid / 16, c = tid % 16;
    for (int I = 1; I < 4; I++) {
        // X_IJ[r][c] = a_IJ[r][c] (T_JJ's unit diagonal) + sum_{16J <= k < 16I} a[16I + r][k] T[k][16J + c]
        // (T_JJ's strict lower part and the finished block rows below it are in As).
        const float* ar = As + (16 * I + r) * GC_LDA;
        for (int J = 0; J < I; J++) {
            float x = ar[16 * J + c];
            for (int k = 16 * J; k < 16 * I; k++) x += ar[k] * As[k * GC_LDA + 16 * J + c];
            Xs[r * GC_LDX + 16 * J + c] = x;
        }
        __syncthreads();
        // T_IJ[r][c] = X[r][c] + sum_{m<r} L_II[r][m] X[m][c], over a_IJ (no longer needed).
        for (int J = 0; J < I; J++) {
            float t = Xs[r * GC_LDX + 16 * J + c];
            for (int m = 0; m < r; m++) t += ar[16 * I + m] * Xs[m * GC_LDX + 16 * J + c];
            As[(16 * I + r) * GC_LDA + 16 * J + c] = t;
        }
        __syncthreads();
    }
    if (tid < GC_C) As[tid * GC_LDA + tid] = 1.f;
    __syncthreads();
}

// Phase 1. grid (nch, nv), block 256, dynamic smem GC_PREP_SMEM floats:
// Ks [64][GC_LD], Vs [64][GC_LD], As [64][GC_LDA], Xs [16][GC_LDX], Gs, Bs, Eg [64].
// Needs dk, dv multiples of 4 (float4 shared loads; the host checks).
QW_KERNEL void QW_BOUNDS(256) gdn_chunk_prep(const float* __restrict__ qkv, int stride, int nk, int nv, int dk,
                                             int dv, const float* __restrict__ g, const float* __restrict__ beta,
                                             float* __restrict__ WT, float* __restrict__ U, float* __restrict__ Gc,
                                             int T) {
    QW_DYN_SMEM(float, smem);
    float* Ks = smem;                  // [64][GC_LD]
    float* Vs = Ks + GC_C * GC_LD;     // [64][GC_LD]
    float* As = Vs + GC_C * GC_LD;     // [64][GC_LDA]
    float* Xs = As + GC_C * GC_LDA;    // [16][GC_LDX]
    float* Gs = Xs + 16 * GC_LDX;      // [64]
    float* Bs = Gs + GC_C;             // [64]
    float* Eg = Bs + GC_C;             // [64]: e^{G_i}
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
    if (tid < GC_C) Eg[tid] = expf(Gs[tid]);
    if (tid < n) Gc[(size_t)hv * T + c0 + tid] = Gs[tid];

    const int a = tid % 16, b = tid / 16;
    // As[i][j] = -beta_i k_i.k_j e^{G_i - G_j} for j < i < n, else 0; tile i = b + 16r, j = a + 16s.
    {
        float acc[4][4] = {};
        gc_tile_dots(Ks, Ks, b, a, (dk + 3) & ~3, acc);
#pragma unroll
        for (int r = 0; r < 4; r++)
#pragma unroll
            for (int s = 0; s < 4; s++) {
                int i = b + 16 * r, j = a + 16 * s;
                As[i * GC_LDA + j] = (j < i && i < n) ? -Bs[i] * acc[r][s] * expf(Gs[i] - Gs[j]) : 0.f;
            }
    }
    __syncthreads();
    gc_unit_lower_inverse(As, Xs);
    // Ks row j *= beta_j e^{G_j}, Vs row j *= beta_j.
    for (int idx = tid; idx < GC_C * GC_D / 4; idx += 256) {
        int jr = idx / (GC_D / 4), d = 4 * (idx % (GC_D / 4));
        float bj = Bs[jr], bk = bj * Eg[jr];
        float4* kp = reinterpret_cast<float4*>(Ks + jr * GC_LD + d);
        float4* vp = reinterpret_cast<float4*>(Vs + jr * GC_LD + d);
        float4 k4 = *kp, v4 = *vp;
        *kp = make_float4(k4.x * bk, k4.y * bk, k4.z * bk, k4.w * bk);
        *vp = make_float4(v4.x * bj, v4.y * bj, v4.z * bj, v4.w * bj);
    }
    __syncthreads();

    const int n4 = (n + 3) & ~3;  // T columns >= n and K/V rows >= n are zero
    // W[i][d] = sum_j T[i][j] Ks'[j][d]; tile i = a + 16r, d = 8b + q; stored
    // transposed: WT[hv][ch][d][i] (all 64 i; rows i >= n are zero).
    {
        float acc[4][8] = {};
        gc_tile_rows<4>(As, GC_LDA, a, Ks + 8 * b, n4, acc);
        float* wt = WT + ((size_t)hv * nch + ch) * dk * GC_C;
#pragma unroll
        for (int q = 0; q < 8; q++) {
            int d = 8 * b + q;
            if (d < dk)
#pragma unroll
                for (int r = 0; r < 4; r++) wt[(size_t)d * GC_C + a + 16 * r] = acc[r][q];
        }
    }
    // U[i][c] = sum_j T[i][j] Vs'[j][c]; tile i = b + 16r, c = 4a + 64h + q; U[hv][c0 + i][c].
    {
        float acc[4][8] = {};
        gc_tile_rows<64>(As, GC_LDA, b, Vs + 4 * a, n4, acc);
#pragma unroll
        for (int r = 0; r < 4; r++) {
            int i = b + 16 * r;
            if (i < n) {
                float* u = U + ((size_t)hv * T + c0 + i) * dv;
#pragma unroll
                for (int h = 0; h < 2; h++)
                    if (4 * a + 64 * h < dv)
                        *reinterpret_cast<float4*>(u + 4 * a + 64 * h) =
                            make_float4(acc[r][4 * h], acc[r][4 * h + 1], acc[r][4 * h + 2], acc[r][4 * h + 3]);
            }
        }
    }
}

// Phase 2. grid (nv, ceil(dv / 32)), block 512 (16 groups of 32 threads), dynamic smem
// GC_STATE_SMEM floats: WTs [128][64], Ks [64][128], Us [64][32], Ss [128][32],
// Ps [128][32] (the second half's partial sums), Gs [64], Ef [64].
// Thread (w = tid / 32, lane): column c = tile*32 + lane, half = w / 8, wr = w % 8.
// Both products are split in two halves of their reduction, so each thread's
// serial work per chunk is half of a 256-thread block's (the chunks are a
// serial chain: per-chunk latency is the cost): v_new rows i = wr*8 + r (r < 8)
// over d in [64 half, 64 half + 64); state rows d = wr*16 + r (r < 16) over
// tokens i in [32 half, 32 half + 32); the halves meet in shared memory. The
// next chunk's W, k, U and G are loaded into registers while the current
// chunk computes.
QW_KERNEL void QW_BOUNDS(512) gdn_chunk_state(const float* __restrict__ qkv, int stride, int nk, int nv, int dk,
                                              int dv, const float* __restrict__ WT, float* __restrict__ U,
                                              const float* __restrict__ Gc, float* __restrict__ S,
                                              float* __restrict__ Sc, int T) {
    QW_DYN_SMEM(float, smem);
    float* WTs = smem;                 // [128][64]
    float* Ks = WTs + GC_D * GC_C;     // [64][128]
    float* Us = Ks + GC_C * GC_D;      // [64][32]
    float* Ss = Us + GC_C * 32;        // [128][32]
    float* Ps = Ss + GC_D * 32;        // [128][32]
    float* Gs = Ps + GC_D * 32;        // [64]
    float* Ef = Gs + GC_C;             // [64]: e^{G_last - G_i}
    const int hv = blockIdx.x;
    const int tid = threadIdx.x, w = tid / 32, lane = tid % 32;
    const int half = w / 8, wr = w % 8;
    const int c = blockIdx.y * 32 + lane;
    const bool cvalid = c < dv;
    const int hk = hv / (nv / nk);
    const int key_dim = nk * dk;
    const int nch = (T + GC_C - 1) / GC_C;
    const float* kbase = qkv + key_dim + hk * dk;
    float* Sh = S + (size_t)hv * dk * dv;

    // Zero the padding once (WTs rows >= dk and Ks columns >= dk are never loaded).
    for (int idx = tid; idx < GC_D * GC_C; idx += 512) {
        WTs[idx] = 0.f;
        Ks[idx] = 0.f;
    }
#pragma unroll
    for (int r = 0; r < 8; r++) {
        int d = w * 8 + r;
        Ss[d * 32 + lane] = (d < dk && cvalid) ? Sh[(size_t)d * dv + c] : 0.f;
    }
    __syncthreads();  // the zeros land before the first chunk's rows overwrite them

    // Prefetch registers: W^T (dk*16 float4s), k (n*dk), U tile (64 x 32), G (64).
    float4 pw[4];
    float pk[16], pu[4], pg;
    auto fetch = [&](int ch) {
        const int c0 = ch * GC_C;
        const int n = min(GC_C, T - c0);
        const float4* src = reinterpret_cast<const float4*>(WT + ((size_t)hv * nch + ch) * dk * GC_C);
#pragma unroll
        for (int m = 0; m < 4; m++) {
            int idx = tid + 512 * m;
            pw[m] = idx < dk * 16 ? src[idx] : make_float4(0.f, 0.f, 0.f, 0.f);
        }
#pragma unroll
        for (int m = 0; m < 16; m++) {
            int idx = tid + 512 * m;
            int i = idx / dk, d = idx - i * dk;
            pk[m] = idx < n * dk ? kbase[(size_t)(c0 + i) * stride + d] : 0.f;
        }
#pragma unroll
        for (int m = 0; m < 4; m++) {
            int i = m * 16 + w;  // (tid + 512 m) / 32
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
            for (int m = 0; m < 4; m++) {
                int idx = tid + 512 * m;
                if (idx < dk * 16) dst[idx] = pw[m];
            }
#pragma unroll
            for (int m = 0; m < 16; m++) {
                int idx = tid + 512 * m;
                int i = idx / dk, d = idx - i * dk;
                if (idx < n * dk) Ks[i * GC_D + d] = pk[m];
            }
#pragma unroll
            for (int m = 0; m < 4; m++) Us[tid + 512 * m] = pu[m];
            if (tid < GC_C) Gs[tid] = pg;
        }
        __syncthreads();
        if (ch + 1 < nch) fetch(ch + 1);
        const float glast = Gs[n - 1];
        if (tid < GC_C) Ef[tid] = tid < n ? expf(glast - Gs[tid]) : 0.f;

        // v_new[i][c] = U[i][c] - sum_d W[i][d] S[d][c], i = wr*8 + r; this half's d.
        float acc[16];
        {
#pragma unroll
            for (int r = 0; r < 8; r++) acc[r] = 0.f;
            const int d0 = half * 64;
#pragma unroll 4
            for (int d = d0; d < d0 + 64; d++) {
                float s = Ss[d * 32 + lane];
                float4 x = *reinterpret_cast<const float4*>(WTs + d * GC_C + wr * 8);
                float4 y = *reinterpret_cast<const float4*>(WTs + d * GC_C + wr * 8 + 4);
                acc[0] += x.x * s;
                acc[1] += x.y * s;
                acc[2] += x.z * s;
                acc[3] += x.w * s;
                acc[4] += y.x * s;
                acc[5] += y.y * s;
                acc[6] += y.z * s;
                acc[7] += y.w * s;
            }
            if (half)
#pragma unroll
                for (int r = 0; r < 8; r++) Ps[(wr * 8 + r) * 32 + lane] = acc[r];
        }
        __syncthreads();
        if (!half)
#pragma unroll
            for (int r = 0; r < 8; r++) {
                int i = wr * 8 + r;
                float vn = Us[i * 32 + lane] - (acc[r] + Ps[i * 32 + lane]);
                Us[i * 32 + lane] = vn;
                if (i < n && cvalid) U[((size_t)hv * T + c0 + i) * dv + c] = vn;
            }
        __syncthreads();

        // Save S_c (the chunk's starting state) for phase 3, then
        // S[d][c] = e^{G_last} S[d][c] + sum_{i<n} k_i[d] (e^{G_last-G_i} v_new[i][c]),
        // d = wr*16 + r; the first half takes the decay and tokens [0, 32), the second [32, 64).
        {
            const float el = expf(glast);
            float* sc = Sc + ((size_t)hv * nch + ch) * dk * dv;
#pragma unroll
            for (int r = 0; r < 16; r++) {
                int d = wr * 16 + r;
                float s = Ss[d * 32 + lane];
                if (!half && d < dk && cvalid) sc[(size_t)d * dv + c] = s;
                acc[r] = half ? 0.f : s * el;
            }
            const int i1 = min(n, 32 * half + 32);
#pragma unroll 2
            for (int i = 32 * half; i < i1; i++) {
                float vn = Us[i * 32 + lane] * Ef[i];
                const float4* kr = reinterpret_cast<const float4*>(Ks + i * GC_D + wr * 16);
#pragma unroll
                for (int q = 0; q < 4; q++) {
                    float4 k4 = kr[q];
                    acc[4 * q + 0] += k4.x * vn;
                    acc[4 * q + 1] += k4.y * vn;
                    acc[4 * q + 2] += k4.z * vn;
                    acc[4 * q + 3] += k4.w * vn;
                }
            }
            if (half)
#pragma unroll
                for (int r = 0; r < 16; r++) Ps[(wr * 16 + r) * 32 + lane] = acc[r];
        }
        __syncthreads();
        if (!half)
#pragma unroll
            for (int r = 0; r < 16; r++) {
                const int d = wr * 16 + r;
                Ss[d * 32 + lane] = acc[r] + Ps[d * 32 + lane];
            }
        __syncthreads();
    }
#pragma unroll
    for (int r = 0; r < 8; r++) {
        int d = w * 8 + r;
        if (d < dk && cvalid) Sh[(size_t)d * dv + c] = Ss[d * 32 + lane];
    }
}

// Phase 3. grid (nch, nv), block 256, dynamic smem GC_OUT_SMEM floats:
// Qs [64][GC_LD], Ks [64][GC_LD] (v_new rows after P), Ps [64][GC_LDA],
// Ss [GC_SL][GC_LD] (a slice of S_c's rows), Gs [64].
// Thread tile: rows i = b + 16r (r < 4), columns c = 4a + 64h + q (h < 2, q < 4).
QW_KERNEL void QW_BOUNDS(256) gdn_chunk_out(const float* __restrict__ qkv, int stride, int nk, int nv, int dk,
                                            int dv, const float* __restrict__ U, const float* __restrict__ Gc,
                                            const float* __restrict__ Sc, float* __restrict__ out, int T) {
    QW_DYN_SMEM(float, smem);
    float* Qs = smem;                  // [64][GC_LD]
    float* Ks = Qs + GC_C * GC_LD;     // [64][GC_LD]
    float* Ps = Ks + GC_C * GC_LD;     // [64][GC_LDA]
    float* Ss = Ps + GC_C * GC_LDA;    // [GC_SL][GC_LD]
    float* Gs = Ss + GC_SL * GC_LD;    // [64]
    float* Vs = Ks;                    // [64][GC_LD], v_new rows once P is done
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
        float acc[4][4] = {};
        gc_tile_dots(Qs, Ks, b, a, (dk + 3) & ~3, acc);
#pragma unroll
        for (int r = 0; r < 4; r++)
#pragma unroll
            for (int s = 0; s < 4; s++) {
                int i = b + 16 * r, j = a + 16 * s;
                Ps[i * GC_LDA + j] = (j <= i && i < n) ? acc[r][s] * expf(Gs[i] - Gs[j]) : 0.f;
            }
    }
    __syncthreads();  // Ks is dead from here: v_new rows (zero from row n and column dv)
    for (int idx = tid; idx < GC_C * GC_D / 4; idx += 256) {
        const int j = idx / (GC_D / 4), c = 4 * (idx % (GC_D / 4));
        *reinterpret_cast<float4*>(Vs + j * GC_LD + c) =
            (j < n && c < dv) ? *reinterpret_cast<const float4*>(U + ((size_t)hv * T + c0 + j) * dv + c)
                              : make_float4(0.f, 0.f, 0.f, 0.f);
    }

    // o_i = e^{G_i} q_i S_c + sum_j P[i][j] v_new_j, the q S_c part over slices of S_c's rows.
    float acc[4][8] = {};
    const float* sc = Sc + ((size_t)hv * nch + ch) * dk * dv;
    for (int ds = 0; ds < dk; ds += GC_SL) {
        for (int idx = tid; idx < GC_SL * GC_D / 4; idx += 256) {
            const int dd = idx / (GC_D / 4), c = 4 * (idx % (GC_D / 4));
            *reinterpret_cast<float4*>(Ss + dd * GC_LD + c) =
                (ds + dd < dk && c < dv) ? *reinterpret_cast<const float4*>(sc + (size_t)(ds + dd) * dv + c)
                                         : make_float4(0.f, 0.f, 0.f, 0.f);
        }
        __syncthreads();
        gc_tile_rows<64>(Qs + ds, GC_LD, b, Ss + 4 * a, GC_SL, acc);
        __syncthreads();
    }
#pragma unroll
    for (int r = 0; r < 4; r++) {
        const float e = expf(Gs[b + 16 * r]);
#pragma unroll
        for (int q = 0; q < 8; q++) acc[r][q] *= e;
    }
    gc_tile_rows<64>(Ps, GC_LDA, b, Vs + 4 * a, (n + 3) & ~3, acc);
#pragma unroll
    for (int r = 0; r < 4; r++) {
        const int i = b + 16 * r;
        if (i < n) {
            float* o = out + ((size_t)(c0 + i) * nv + hv) * dv;
#pragma unroll
            for (int h = 0; h < 2; h++)
                if (4 * a + 64 * h < dv)
                    *reinterpret_cast<float4*>(o + 4 * a + 64 * h) =
                        make_float4(acc[r][4 * h], acc[r][4 * h + 1], acc[r][4 * h + 2], acc[r][4 * h + 3]);
        }
    }
}

// A prefix-cache snapshot inside a prompt pass: every value head's state at
// the start of chunk `ch` (phase 2's saved S_c, [nv][nch][dk][dv], `n` =
// dk * dv floats per head), i.e. after the pass's first 64 ch tokens, copied
// into a sequence's state layout [nv][dk][dv].
// grid (ceil(n / 256), nv), block 256.
QW_KERNEL void QW_BOUNDS(256) gdn_state_capture(const float* __restrict__ Sc, int nch, int ch, int n,
                                                float* __restrict__ dst) {
    QW_GRID_WAIT();
    QW_GRID_LAUNCH();
    const int hv = blockIdx.y;
    const float* src = Sc + ((size_t)hv * nch + ch) * n;
    float* out = dst + (size_t)hv * n;
    for (int i = blockIdx.x * 256 + threadIdx.x; i < n; i += gridDim.x * 256) out[i] = src[i];
}
