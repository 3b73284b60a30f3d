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
