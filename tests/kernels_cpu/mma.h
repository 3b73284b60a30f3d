// A CPU stand-in for kernels/mma.h + compat.h, so a kernel source runs as
// plain C++: every thread of a block is a std::thread, __syncthreads and warp
// operations are barriers, shared memory is one static array (blocks run one
// after another). Only what the checked kernels use is here.
#pragma once
#include <barrier>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <algorithm>
#include <math.h>

#define WARP 32
#define QW_KERNEL
#define QW_BOUNDS(n)
#define QW_BOUNDS_MIN(n, m)
#define QW_GRID_WAIT() ((void)0)
#define QW_GRID_LAUNCH() ((void)0)
#define __device__
#define __forceinline__ inline
#define __restrict__
#define __shared__

typedef unsigned short bf16_t;
struct float4 { float x, y, z, w; };
struct uint4 { unsigned x, y, z, w; };
struct dim3 { unsigned x = 0, y = 0, z = 0; };
inline uint4 make_uint4(unsigned a, unsigned b, unsigned c, unsigned d) { return {a, b, c, d}; }

inline thread_local dim3 threadIdx, blockIdx;
inline dim3 blockDim, gridDim;
inline std::barrier<>* block_barrier;
inline std::barrier<>* warp_barriers[32];
// One slot per thread for warp exchanges.
inline float warp_slots[1024];

inline void __syncthreads() { block_barrier->arrive_and_wait(); }
inline void QW_SYNCWARP() { warp_barriers[threadIdx.x / WARP]->arrive_and_wait(); }

inline float __uint_as_float(unsigned u) {
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}
inline float bf_lo(unsigned w) { return __uint_as_float(w << 16); }
inline float bf_hi(unsigned w) { return __uint_as_float(w & 0xffff0000u); }

// Butterfly order as the GPU's SHFL_XOR reductions.
template <typename Op>
inline float warp_reduce(float v, Op op) {
    const unsigned lane = threadIdx.x % WARP, base = threadIdx.x - lane;
    for (unsigned m = WARP / 2; m > 0; m >>= 1) {
        warp_slots[threadIdx.x] = v;
        QW_SYNCWARP();
        float o = warp_slots[base + (lane ^ m)];
        QW_SYNCWARP();
        v = op(v, o);
    }
    return v;
}
inline float warp_sum(float v) { return warp_reduce(v, [](float a, float b) { return a + b; }); }
inline float warp_max(float v) { return warp_reduce(v, [](float a, float b) { return std::fmax(a, b); }); }
using std::min;
