// Block-FP8 weights to bf16 (kernels/fp8.h) for the paths without a native
// FP8 kernel: prompt GEMMs, grouped expert GEMMs, the batched step's
// few-row kernels. They read the bf16 copy this writes into a work buffer.
#include "fp8.h"

// out = the bf16 values of slabs of `rows` x `cols` E4M3 weights q with
// scales s ([rows / 128 per slab, ceil(cols / 128)], rows a multiple of 128,
// cols of 8): slab e = idx[blockIdx.y] (the experts a pass routes to; the
// other slabs of out are left as they are) or e = blockIdx.y when idx is
// null. Slab e of out is at the same place as slab e of q, so a kernel that
// indexes experts in the bf16 tensor reads out unchanged; with `packed`,
// slab idx[y] goes to place y instead (out holds only the routed slabs, read
// through the indices 0, 1, ...). 8 weights a thread.
// No QW_GRID_LAUNCH(): the next kernel reads `out` as its weights, which a
// PDL kernel may load before its QW_GRID_WAIT(), so it must not start before
// this grid has finished (the implicit trigger at its end). The wait comes
// first: the kernel before may still read `out`'s last contents.
QW_KERNEL void QW_BOUNDS(256) fp8_dequant(const unsigned char* __restrict__ q, const float* __restrict__ s,
                                          const int* __restrict__ idx, int rows, int cols, int packed,
                                          bf16_t* __restrict__ out) {
    QW_GRID_WAIT();
    const long long e = idx ? idx[blockIdx.y] : blockIdx.y, place = packed ? blockIdx.y : e;
    // Within a slab in 32 bits (a slab's groups number far below 2^32; the
    // host checks): 64-bit division per 8 weights would cost more than the
    // conversion.
    const unsigned c8 = cols / 8, n8 = (unsigned)rows * c8, cb = (cols + 127) / 128;
    const long long base = e * n8, to = place * n8;
    const float* se = s + e * (rows >> 7) * cb;
    for (unsigned u = blockIdx.x * blockDim.x + threadIdx.x; u < n8; u += gridDim.x * blockDim.x) {
        const unsigned r = u / c8, c = (u - r * c8) * 8;
        ((uint4*)out)[to + u] = fp8x8_bf16(((const uint2*)q)[base + u], se[(r >> 7) * cb + (c >> 7)]);
    }
}

// Activations for the FP8 tensor-core prompt GEMMs (`--prefill-precision
// fp8`): rows x[idx[r] * x_stride ..] (idx null: r), cols f32 each (a
// multiple of 128; the grouped experts gather their plan's rows this way), as
// E4M3 q [t_pad, cols] with
// one f32 scale per row and 128 columns, s[g * t_pad + r] (column-group-major,
// the layout cuBLASLt's VEC128_32F scales take; rows t..t_pad, padding that
// keeps those columns 16-byte aligned, are zeros). As transformers' FP8Linear and
// the FP8 serving engines quantize them: scale = amax / 448, q = x / scale
// rounded to nearest (an all-zero group takes a tiny scale instead of 0, so
// it quantizes to zeros, not NaN). One warp per row and group, 4 values a lane.
QW_KERNEL void QW_BOUNDS(256) fp8_quant_rows(const float* __restrict__ x, int x_stride, const int* __restrict__ idx,
                                              int t, int t_pad, int cols, unsigned char* __restrict__ q,
                                              float* __restrict__ s) {
    QW_GRID_WAIT();
    QW_GRID_LAUNCH();
    const int lane = threadIdx.x % WARP, groups = cols / 128;
    const long long w = ((long long)blockIdx.x * blockDim.x + threadIdx.x) / WARP;
    if (w >= (long long)t_pad * groups) return;
    const int r = (int)(w / groups), g = (int)(w - (long long)r * groups);
    const long long at = (long long)r * cols + g * 128 + lane * 4;
    const float4 v = r < t ? *(const float4*)(x + (long long)(idx ? idx[r] : r) * x_stride + g * 128 + lane * 4)
                           : make_float4(0.f, 0.f, 0.f, 0.f);
    float m = fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w)));
    for (int o = WARP / 2; o > 0; o /= 2) m = fmaxf(m, SHFL_XOR(m, o));
    const float sc = fmaxf(m, 1e-30f) / 448.f;
#if defined(QW_FP8_CVT)
    unsigned short lo, hi;
    // cvt.rn.satfinite.e4m3x2.f32 d, a, b puts a in the upper byte.
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(lo) : "f"(v.y / sc), "f"(v.x / sc));
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(hi) : "f"(v.w / sc), "f"(v.z / sc));
    *(unsigned*)(q + at) = (unsigned)lo | ((unsigned)hi << 16);
#else
    *(unsigned*)(q + at) = (unsigned)f32_e4m3_rn(v.x / sc) | ((unsigned)f32_e4m3_rn(v.y / sc) << 8) |
                           ((unsigned)f32_e4m3_rn(v.z / sc) << 16) | ((unsigned)f32_e4m3_rn(v.w / sc) << 24);
#endif
    if (lane == 0) s[(long long)g * t_pad + r] = sc;
}
