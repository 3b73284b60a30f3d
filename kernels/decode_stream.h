// The decode kernels' weight streaming (decode.cu's GEMVs, decode_moe.cu's
// experts): 16-byte loads that bypass L1, rows read in chunks of CH loads per
// lane, dot products of 8 bf16 weights, the split-row kernels' epilogue, and
// the same loads for block-FP8 weights (fp8.h), which widen each weight to
// its bf16 value so the FP8 kernels keep the bf16 kernels' arithmetic.
#pragma once
#include "compat.h"
#include "fp8.h"

// 16-byte weight load that bypasses L1 (weights are read once per token).
__device__ __forceinline__ uint4 ld_stream(const uint4* p) {
#if defined(QW_CUDA)
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
    return v;
#else
    return *p;
#endif
}

// 8 bf16 weights . 8 f32 activations (xs 16-byte aligned).
__device__ __forceinline__ float dot8(uint4 w, const float* xs) {
    float4 a = *(const float4*)xs, b = *(const float4*)(xs + 4);
    return bf_lo(w.x) * a.x + bf_hi(w.x) * a.y + bf_lo(w.y) * a.z + bf_hi(w.y) * a.w +
           bf_lo(w.z) * b.x + bf_hi(w.z) * b.y + bf_lo(w.w) * b.z + bf_hi(w.w) * b.w;
}

// One warp: W row (bf16, `cols` long) . xs (f32, shared memory); used where
// rows are short and few (the shared expert's tail of a scalar path).
__device__ __forceinline__ float row_dot(const bf16_t* __restrict__ w, const float* xs, int cols, int lane) {
    float acc = 0.f;
    if ((cols & 7) == 0) {
        const uint4* w4 = (const uint4*)w;
        int n8 = cols >> 3;
        for (int base = lane; base < n8; base += 4 * WARP) {
            uint4 v[4];
#pragma unroll
            for (int u = 0; u < 4; u++) {
                int c = base + u * WARP;
                v[u] = c < n8 ? ld_stream(w4 + c) : make_uint4(0u, 0u, 0u, 0u);
            }
#pragma unroll
            for (int u = 0; u < 4; u++) {
                int c = base + u * WARP;
                if (c < n8) acc += dot8(v[u], xs + 8 * c);
            }
        }
    } else {
        for (int c = lane; c < cols; c += WARP) acc += bf2f(w[c]) * xs[c];
    }
    return warp_sum(acc);
}

#define DEC_WARPS 8  // warps per block; each warp owns whole rows
#define CH 8         // 16-byte loads per lane per chunk (a chunk = 2048 columns)

// Chunk `base` (in 16-byte units, lane offset added here) of row r, or zeros
// past the matrix.
__device__ __forceinline__ void load_chunk(const bf16_t* __restrict__ W, int r, int rows, int cols, int base,
                                           int lane, uint4 (&v)[CH]) {
    const uint4* w4 = (const uint4*)(W + (size_t)r * cols);
    int n8 = cols >> 3;
#pragma unroll
    for (int u = 0; u < CH; u++) {
        int c = base + lane + u * WARP;
        v[u] = (r < rows && c < n8) ? ld_stream(w4 + c) : make_uint4(0u, 0u, 0u, 0u);
    }
}

// 8 bf16 weights . 8 activations read through L1 (x, and nw when set: x * nw).
__device__ __forceinline__ float dot8g(uint4 w, const float* __restrict__ x, const float* __restrict__ nw) {
    float4 a = __ldg((const float4*)x), b = __ldg((const float4*)(x + 4));
    if (nw) {
        float4 p = __ldg((const float4*)nw), q = __ldg((const float4*)(nw + 4));
        a.x *= p.x; a.y *= p.y; a.z *= p.z; a.w *= p.w;
        b.x *= q.x; b.y *= q.y; b.z *= q.z; b.w *= q.w;
    }
    return bf_lo(w.x) * a.x + bf_hi(w.x) * a.y + bf_lo(w.y) * a.z + bf_hi(w.y) * a.w +
           bf_lo(w.z) * b.x + bf_hi(w.z) * b.y + bf_lo(w.w) * b.z + bf_hi(w.w) * b.w;
}

// Epilogue of the split-row kernels: each warp's lane-partial dot of its
// slice (slice w % P of row r) is reduced, the row's P slices meet in shared
// memory, and the row's first warp adds the total into y[r] (or stores it).
// Returns y[r]^2 on that lane, 0 elsewhere (for write_ssq). Whole block.
__device__ __forceinline__ float rows_epilogue(float acc, int r, int rows, int P, bool accumulate,
                                               float* __restrict__ y) {
    __shared__ float dots[32];
    const int w = threadIdx.x / WARP, lane = threadIdx.x % WARP;
    acc = warp_sum(acc);
    if (lane == 0) dots[w] = acc;
    __syncthreads();
    if (w % P != 0 || lane != 0 || r >= rows) return 0.f;
    float d = 0.f;
    for (int q = 0; q < P; q++) d += dots[w + q];
    const float o = accumulate ? y[r] + d : d;
    y[r] = o;
    return o * o;
}

// ---- Block-FP8 weights (kernels/fp8.h): E4M3 bytes and block scales
// instead of bf16 (half the bytes). Columns are whole 128-column blocks (the
// host keeps only such matrices in FP8).

// 8 E4M3 weights (8 bytes) that bypass L1.
__device__ __forceinline__ uint2 ld_stream8(const uint2* p) {
#if defined(QW_CUDA)
    uint2 v;
    asm volatile("ld.global.nc.L1::no_allocate.v2.u32 {%0, %1}, [%2];" : "=r"(v.x), "=r"(v.y) : "l"(p));
    return v;
#else
    return *p;
#endif
}

// A chunk of a lane's 8-weight groups: E4M3 bytes and each group's block scale.
struct Fp8Chunk {
    uint2 q[CH];
    float s[CH];
};

// Group `c` (8 columns) of row r of Q (cols columns, scales S with cb columns)
// into slot u of v, or zeros where `in` is false.
__device__ __forceinline__ void fp8_group(const unsigned char* __restrict__ Q, const float* __restrict__ S,
                                          size_t r, int cols, int cb, int c, bool in, Fp8Chunk& v, int u) {
    v.q[u] = in ? ld_stream8((const uint2*)(Q + r * cols) + c) : make_uint2(0u, 0u);
    v.s[u] = in ? S[(r >> 7) * cb + (c >> 4)] : 0.f;
}

// load_chunk for block-FP8 rows.
__device__ __forceinline__ void load_chunk_fp8(const unsigned char* __restrict__ Q, const float* __restrict__ S,
                                               int r, int rows, int cols, int base, int lane, Fp8Chunk& v) {
    const int n8 = cols >> 3, cb = (cols + 127) >> 7;
#pragma unroll
    for (int u = 0; u < CH; u++) {
        int c = base + lane + u * WARP;
        fp8_group(Q, S, (size_t)(r < rows ? r : 0), cols, cb, c, r < rows && c < n8, v, u);
    }
}
