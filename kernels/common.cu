// Elementwise ops, norms, the batch-1 GEMV, a portable tiled GEMM, and the
// seeded weight generator. Activations f32, weights bf16, f32 accumulation.
#include "compat.h"
#include "fp8.h"

// out[t, :] = bf16 embedding row tokens[t], as f32.
QW_KERNEL void embed_gather(const bf16_t* __restrict__ emb, const unsigned int* __restrict__ tokens,
                            float* __restrict__ out, int T, int H) {
    QW_GRID_WAIT();
    QW_GRID_LAUNCH();
    int t = blockIdx.x;
    const bf16_t* row = emb + (size_t)tokens[t] * H;
    for (int i = threadIdx.x; i < H; i += blockDim.x) out[(size_t)t * H + i] = bf2f(row[i]);
}

// out[r] = x[r] * rsqrt(mean(x[r]^2) + eps) * w   (w already holds 1+w for Qwen's norms).
// One block per row; in/out rows have their own strides (may alias when equal).
QW_KERNEL void QW_BOUNDS(256) rmsnorm(const float* x, int x_stride, const float* __restrict__ w,
                                      float* out, int out_stride, int rows, int dim, float eps) {
    QW_GRID_WAIT();
    QW_GRID_LAUNCH();
    __shared__ float scratch[32];
    int r = blockIdx.x;
    if (r >= rows) return;
    const float* xr = x + (size_t)r * x_stride;
    float ss = 0.f;
    for (int i = threadIdx.x; i < dim; i += blockDim.x) ss += xr[i] * xr[i];
    ss = block_sum(ss, scratch);
    float inv = rsqrtf(ss / dim + eps);
    float* o = out + (size_t)r * out_stride;
    for (int i = threadIdx.x; i < dim; i += blockDim.x) o[i] = xr[i] * inv * w[i];
}

// x[r] += y[r], then out[r] = rmsnorm(x[r]) * w: a block's residual add and
// the next block's input norm in one launch (prompt and batched passes),
// each thread adding the elements it then sums and scales exactly as
// add_inplace then rmsnorm. Rows of dim, contiguous; one block per row.
// Rows of up to ROW_REG * blockDim elements stay in registers: the loads of
// a thread's elements are all in flight at once and the norm does not read
// the row back (few rows are latency-bound: one block per row).
#define ROW_REG 8
QW_KERNEL void QW_BOUNDS(256) add_rmsnorm(float* __restrict__ x, const float* __restrict__ y,
                                          const float* __restrict__ w, float* __restrict__ out, int rows, int dim,
                                          float eps) {
    QW_GRID_WAIT();
    QW_GRID_LAUNCH();
    __shared__ float scratch[32];
    const int r = blockIdx.x;
    if (r >= rows) return;
    float* xr = x + (size_t)r * dim;
    const float* yr = y + (size_t)r * dim;
    float* o = out + (size_t)r * dim;
    const int nt = blockDim.x;
    if (dim <= ROW_REG * nt) {
        float v[ROW_REG], wv[ROW_REG];
#pragma unroll
        for (int m = 0; m < ROW_REG; m++) {
            const int i = threadIdx.x + m * nt;
            v[m] = i < dim ? xr[i] + yr[i] : 0.f;
            wv[m] = i < dim ? w[i] : 0.f;
        }
        float ss = 0.f;
#pragma unroll
        for (int m = 0; m < ROW_REG; m++) {
            const int i = threadIdx.x + m * nt;
            if (i < dim) {
                xr[i] = v[m];
                ss += v[m] * v[m];
            }
        }
        ss = block_sum(ss, scratch);
        const float inv = rsqrtf(ss / dim + eps);
#pragma unroll
        for (int m = 0; m < ROW_REG; m++) {
            const int i = threadIdx.x + m * nt;
            if (i < dim) o[i] = v[m] * inv * wv[m];
        }
        return;
    }
    float ss = 0.f;
    for (int i = threadIdx.x; i < dim; i += nt) {
        const float v = xr[i] + yr[i];
        xr[i] = v;
        ss += v * v;
    }
    ss = block_sum(ss, scratch);
    const float inv = rsqrtf(ss / dim + eps);
    for (int i = threadIdx.x; i < dim; i += nt) o[i] = xr[i] * inv * w[i];
}

// x += y, n elements.
QW_KERNEL void add_inplace(float* __restrict__ x, const float* __restrict__ y, long long n) {
    QW_GRID_WAIT();
    QW_GRID_LAUNCH();
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] += y[i];
}

// x[t, :] += sigmoid(g[t * g_stride]) * y[t, :]  (the shared expert's gate).
QW_KERNEL void add_sigmoid_scaled(float* __restrict__ x, const float* __restrict__ y,
                                  const float* __restrict__ g, int g_stride, int T, int H) {
    QW_GRID_WAIT();
    QW_GRID_LAUNCH();
    int t = blockIdx.y;
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < H && t < T) x[(size_t)t * H + i] += sigmoid_f(g[(size_t)t * g_stride]) * y[(size_t)t * H + i];
}

// y[i] = (accumulate ? y[i] : 0) + (p[i] + p[n + i]), i < n: the hi and lo
// halves of a split projection run as one GEMM over stacked rows.
QW_KERNEL void add_halves(const float* __restrict__ p, float* __restrict__ y, long long n, int accumulate) {
    QW_GRID_WAIT();
    QW_GRID_LAUNCH();
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const float v = p[i] + p[n + i];
    y[i] = accumulate ? y[i] + v : v;
}

QW_KERNEL void f32_to_bf16(const float* __restrict__ x, bf16_t* __restrict__ y, long long n) {
    QW_GRID_WAIT();
    QW_GRID_LAUNCH();
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = f2bf(x[i]);
}

// out[r, i] = silu(in[r, gate_off + i]) * in[r, up_off + i], i < I.
QW_KERNEL void silu_mul(const float* __restrict__ in, int in_stride, int gate_off, int up_off,
                        float* __restrict__ out, int I, int rows) {
    QW_GRID_WAIT();
    QW_GRID_LAUNCH();
    int r = blockIdx.y;
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < I && r < rows) {
        const float* row = in + (size_t)r * in_stride;
        out[(size_t)r * I + i] = silu_f(row[gate_off + i]) * row[up_off + i];
    }
}

// Dot product of a bf16 row with an f32 vector by one warp; 16-byte loads when aligned.
__device__ __forceinline__ float warp_dot(const bf16_t* __restrict__ w, const float* __restrict__ x, int n) {
    int lane = threadIdx.x % WARP;
    float acc = 0.f;
    if (((n & 7) == 0) && ((((size_t)w) & 15) == 0) && ((((size_t)x) & 15) == 0)) {
        const uint4* w4 = (const uint4*)w;
        const float4* x4 = (const float4*)x;
        int n8 = n >> 3;
        for (int c = lane; c < n8; c += WARP) {
            uint4 wv = w4[c];
            float4 a = x4[2 * c], b = x4[2 * c + 1];
            acc += bf_lo(wv.x) * a.x + bf_hi(wv.x) * a.y + bf_lo(wv.y) * a.z + bf_hi(wv.y) * a.w;
            acc += bf_lo(wv.z) * b.x + bf_hi(wv.z) * b.y + bf_lo(wv.w) * b.z + bf_hi(wv.w) * b.w;
        }
    } else {
        for (int c = lane; c < n; c += WARP) acc += bf2f(w[c]) * x[c];
    }
    return warp_sum(acc);
}

// y[t, r] (+)= W[r, :] . x[t, :] for t < T (T small: one weight pass per token;
// memory-bound at T = 1). One warp per row, blockDim.x / WARP rows per block.
QW_KERNEL void QW_BOUNDS(256) gemv_bf16(const bf16_t* __restrict__ W, const float* __restrict__ x,
                                        float* __restrict__ y, int rows, int cols, int T, int accumulate) {
    int r = blockIdx.x * (blockDim.x / WARP) + threadIdx.x / WARP;
    int t = blockIdx.y;
    if (r >= rows) return;
    float v = warp_dot(W + (size_t)r * cols, x + (size_t)t * cols, cols);
    if (threadIdx.x % WARP == 0) {
        float* o = y + (size_t)t * rows + r;
        *o = accumulate ? *o + v : v;
    }
}

// Portable tiled GEMM: Y[T, R] (+)= X[T, C] (f32) . W[R, C]^T (bf16), f32 math.
// 64x64 output tile per 256-thread block, 4x4 per thread.
#define GT 64
#define GK 16
QW_KERNEL void QW_BOUNDS(256) gemm_tiled(const float* __restrict__ X, const bf16_t* __restrict__ W,
                                         float* __restrict__ Y, int T, int R, int C, int accumulate) {
    __shared__ float xs[GK][GT + 1];
    __shared__ float ws[GK][GT + 1];
    int t0 = blockIdx.y * GT, r0 = blockIdx.x * GT;
    int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
    float acc[4][4];
#pragma unroll
    for (int i = 0; i < 4; i++)
#pragma unroll
        for (int j = 0; j < 4; j++) acc[i][j] = 0.f;
    for (int k0 = 0; k0 < C; k0 += GK) {
        for (int e = threadIdx.x; e < GK * GT; e += 256) {
            int row = e / GK, kk = e % GK;
            int t = t0 + row, r = r0 + row, k = k0 + kk;
            xs[kk][row] = (t < T && k < C) ? X[(size_t)t * C + k] : 0.f;
            ws[kk][row] = (r < R && k < C) ? bf2f(W[(size_t)r * C + k]) : 0.f;
        }
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < GK; kk++) {
            float a[4], b[4];
#pragma unroll
            for (int i = 0; i < 4; i++) a[i] = xs[kk][ty * 4 + i];
#pragma unroll
            for (int j = 0; j < 4; j++) b[j] = ws[kk][tx * 4 + j];
#pragma unroll
            for (int i = 0; i < 4; i++)
#pragma unroll
                for (int j = 0; j < 4; j++) acc[i][j] += a[i] * b[j];
        }
        __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < 4; i++) {
        int t = t0 + ty * 4 + i;
        if (t >= T) continue;
#pragma unroll
        for (int j = 0; j < 4; j++) {
            int r = r0 + tx * 4 + j;
            if (r < R) {
                float* o = Y + (size_t)t * R + r;
                *o = accumulate ? *o + acc[i][j] : acc[i][j];
            }
        }
    }
}

// dst[i, :] = src[rows[i] * src_stride + (0..dim)]
QW_KERNEL void gather_rows(const float* __restrict__ src, int src_stride, const int* __restrict__ rows,
                           int n, int dim, float* __restrict__ dst) {
    QW_GRID_WAIT();
    QW_GRID_LAUNCH();
    int i = blockIdx.y;
    int d = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n && d < dim) dst[(size_t)i * dim + d] = src[(size_t)rows[i] * src_stride + d];
}

// dst[rows[i], :] += w[i] * src[i, :]   (rows distinct within one launch).
QW_KERNEL void scatter_add_rows(const float* __restrict__ src, const int* __restrict__ rows,
                                const float* __restrict__ w, int n, int dim, float* __restrict__ dst) {
    int i = blockIdx.y;
    int d = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n && d < dim) dst[(size_t)rows[i] * dim + d] += w[i] * src[(size_t)i * dim + d];
}

// Seeded weights generated on the device: splitmix64 of (seed, index) -> uniform
// in [-1, 1) * scale + offset.
__device__ __forceinline__ float hash_uniform(unsigned long long seed, unsigned long long i) {
    unsigned long long z = seed + (i + 1) * 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    return (float)(z >> 40) * (1.0f / 8388608.0f) - 1.0f;
}

QW_KERNEL void fill_uniform_bf16(bf16_t* __restrict__ p, long long n, unsigned long long seed, float scale, float offset) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    long long stride = (long long)gridDim.x * blockDim.x;
    for (; i < n; i += stride) p[i] = f2bf(hash_uniform(seed, (unsigned long long)i) * scale + offset);
}

// Seeded block-FP8 weights: E4M3 codes of uniform values in [-448, 448)
// (times a block scale, a uniform in [-1, 1) * scale, as fill_uniform_bf16).
QW_KERNEL void fill_uniform_fp8(unsigned char* __restrict__ p, long long n, unsigned long long seed) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    long long stride = (long long)gridDim.x * blockDim.x;
    for (; i < n; i += stride) p[i] = f32_e4m3_trunc(hash_uniform(seed, (unsigned long long)i) * 447.99f);
}

QW_KERNEL void fill_uniform_f32(float* __restrict__ p, long long n, unsigned long long seed, float scale, float offset) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    long long stride = (long long)gridDim.x * blockDim.x;
    for (; i < n; i += stride) p[i] = hash_uniform(seed, (unsigned long long)i) * scale + offset;
}

// p[i] = log(1 + 7.5 (u + 1)) with u uniform in [-1, 1)  (A_log-like values).
QW_KERNEL void fill_alog_f32(float* __restrict__ p, long long n, unsigned long long seed) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) p[i] = logf(1.f + 7.5f * (hash_uniform(seed, (unsigned long long)i) + 1.f));
}

// Greedy pick and log-softmax statistics of one logits row: out[0] = argmax (as
// float bits of an int), out[1] = max, out[2] = log(sum(exp(x - max))).
QW_KERNEL void QW_BOUNDS(1024) logits_stats(const float* __restrict__ x, int n, float* __restrict__ out) {
    __shared__ float sv[32];
    __shared__ int si[32];
    __shared__ float scratch[32];
    float best = -INFINITY;
    int bi = 0x7fffffff;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        float v = x[i];
        if (v > best) { best = v; bi = i; }
    }
    for (int m = WARP / 2; m > 0; m >>= 1) {
        float ov = SHFL_XOR(best, m);
        int oi = SHFL_XOR(bi, m);
        if (ov > best || (ov == best && oi < bi)) { best = ov; bi = oi; }
    }
    int lane = threadIdx.x % WARP, w = threadIdx.x / WARP, nw = blockDim.x / WARP;
    if (lane == 0) { sv[w] = best; si[w] = bi; }
    __syncthreads();
    best = sv[0]; bi = si[0];
    for (int i = 1; i < nw; i++)
        if (sv[i] > best || (sv[i] == best && si[i] < bi)) { best = sv[i]; bi = si[i]; }
    float s = 0.f;
    for (int i = threadIdx.x; i < n; i += blockDim.x) s += expf(x[i] - best);
    s = block_sum(s, scratch);
    if (threadIdx.x == 0) {
        out[0] = __int_as_float(bi);
        out[1] = best;
        out[2] = logf(s);
    }
}

// Split f32 activations into two bf16 terms, x ~= hi + lo (hi = bf16(x),
// lo = bf16(x - hi)): two bf16 tensor-core GEMMs with f32 accumulation then give
// ~16 mantissa bits of activation precision instead of 8. lo == nullptr: hi
// alone (`--prefill-precision bf16`'s single GEMM; f32_to_bf16 with four
// elements per thread).
QW_KERNEL void f32_to_bf16_split(const float* __restrict__ x, bf16_t* __restrict__ hi,
                                 bf16_t* __restrict__ lo, long long n) {
    QW_GRID_WAIT();
    QW_GRID_LAUNCH();
    // Four elements per thread where x allows 16-byte loads and hi, lo 8-byte stores.
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if ((n & 3) == 0 && ((((size_t)x & 15) | (((size_t)hi | (size_t)lo) & 7))) == 0) {
        if (4 * i >= n) return;
        const float4 v = ((const float4*)x)[i];
        if (lo) split4(v, hi + 4 * i, lo + 4 * i);
        else *(uint2*)(hi + 4 * i) = make_uint2(f2bf(v.x) | ((unsigned)f2bf(v.y) << 16),
                                                f2bf(v.z) | ((unsigned)f2bf(v.w) << 16));
    } else {
        for (long long e = 4 * i; e < min(n, 4 * i + 4); e++) {
            if (lo) split1(x[e], hi + e, lo + e);
            else hi[e] = f2bf(x[e]);
        }
    }
}
