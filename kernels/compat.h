// Portability header: the CUDA/HIP common subset the Qwasi kernels are written in.
// One source builds with nvcc (CUDA) and hipcc (HIP, RDNA wave32 or CDNA wave64).
// bf16 is handled by hand with bit operations so no vendor bf16 header is needed
// (ROCm 5.2 has no hip_bf16.h).
#pragma once

#if defined(QW_CPU)
// Plain C++ for kernel-logic tests on the CPU (tests/kernels_cpu/cpu_runtime.h,
// scripts/check-kernels-cpu.sh): the HIP path's code, no asm.
#include "cpu_runtime.h"
#elif defined(__HIPCC__) || defined(__HIP_PLATFORM_AMD__) || defined(__HIP__)
#include <hip/hip_runtime.h>
#define QW_HIP 1
// Every reduction in these kernels works on groups of 32 lanes, so they are also
// correct on wave64 hardware (two independent groups per wavefront).
#define WARP 32
#define SHFL_XOR(v, m) __shfl_xor((v), (m), WARP)
#define QW_SYNCWARP() __builtin_amdgcn_wave_barrier()
#else
#include <cuda_runtime.h>
#define QW_CUDA 1
#define WARP 32
#define SHFL_XOR(v, m) __shfl_xor_sync(0xffffffffu, (v), (m), WARP)
#define QW_SYNCWARP() __syncwarp()
#endif

#if defined(QW_CPU)
#define QW_KERNEL
// Dynamic shared memory, `extern __shared__ T name[]` on a GPU.
#define QW_DYN_SMEM(T, name) QW_CPU_DYN_SMEM(T, name)
#else
#define QW_KERNEL extern "C" __global__
#define QW_DYN_SMEM(T, name) extern __shared__ T name[]
#endif

// Programmatic dependent launch (Hopper): a kernel launched with the PDL
// attribute may start while its predecessor finishes; QW_GRID_WAIT() blocks
// until the predecessor's results are visible (only read-only inputs, i.e.
// weights, may be touched before it), QW_GRID_LAUNCH() lets the successor
// start early. No-ops elsewhere (HIP, pre-sm_90), where launches serialise.
#if defined(QW_CUDA) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define QW_GRID_WAIT() asm volatile("griddepcontrol.wait;" ::: "memory")
#define QW_GRID_LAUNCH() asm volatile("griddepcontrol.launch_dependents;" ::: "memory")
#else
#define QW_GRID_WAIT() ((void)0)
#define QW_GRID_LAUNCH() ((void)0)
#endif
// A load cached in L2 only: coherent across the grid, so it may read a
// result of a kernel that finished before the predecessor (PDL) without
// QW_GRID_WAIT(); HIP launches serialise, a plain load does.
#if defined(QW_CUDA)
#define QW_LDCG(p) __ldcg(p)
#else
#define QW_LDCG(p) (*(p))
#endif
#if defined(QW_CPU)
#define QW_BOUNDS(n)
#define QW_BOUNDS_MIN(n, m)
#else
#define QW_BOUNDS(n) __launch_bounds__(n)
// At most n threads per block and at least m resident blocks per multiprocessor.
#define QW_BOUNDS_MIN(n, m) __launch_bounds__(n, m)
#endif

typedef unsigned short bf16_t;

// Largest expert count and top-k the MoE kernels handle (the host checks at load).
#define MOE_MAXE 1024
#define MOE_MAXK 32

__device__ __forceinline__ float bf2f(bf16_t x) {
    return __uint_as_float(((unsigned int)x) << 16);
}

// Round to nearest even, NaN kept quiet.
__device__ __forceinline__ bf16_t f2bf(float f) {
    unsigned int u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (bf16_t)0x7fc0;
    u += 0x7fffu + ((u >> 16) & 1u);
    return (bf16_t)(u >> 16);
}

// Low and high bf16 of a 32-bit word.
__device__ __forceinline__ float bf_lo(unsigned int w) { return __uint_as_float(w << 16); }
__device__ __forceinline__ float bf_hi(unsigned int w) { return __uint_as_float(w & 0xffff0000u); }

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int m = WARP / 2; m > 0; m >>= 1) v += SHFL_XOR(v, m);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int m = WARP / 2; m > 0; m >>= 1) v = fmaxf(v, SHFL_XOR(v, m));
    return v;
}

// Sum over a block of blockDim.x threads (a multiple of WARP, at most 1024).
__device__ __forceinline__ float block_sum(float v, float* scratch /* >= 32 floats */) {
    int lane = threadIdx.x % WARP, w = threadIdx.x / WARP, nw = (blockDim.x + WARP - 1) / WARP;
    v = warp_sum(v);
    __syncthreads();
    if (lane == 0) scratch[w] = v;
    __syncthreads();
    float t = 0.f;
    for (int i = 0; i < nw; i++) t += scratch[i];
    return t;
}

__device__ __forceinline__ float block_max(float v, float* scratch) {
    int lane = threadIdx.x % WARP, w = threadIdx.x / WARP, nw = (blockDim.x + WARP - 1) / WARP;
    v = warp_max(v);
    __syncthreads();
    if (lane == 0) scratch[w] = v;
    __syncthreads();
    float t = -INFINITY;
    for (int i = 0; i < nw; i++) t = fmaxf(t, scratch[i]);
    return t;
}

__device__ __forceinline__ float silu_f(float x) { return x / (1.f + expf(-x)); }
__device__ __forceinline__ float sigmoid_f(float x) { return 1.f / (1.f + expf(-x)); }
__device__ __forceinline__ float softplus_f(float x) { return x > 20.f ? x : log1pf(expf(x)); }

// x ~= hi + lo with hi = bf16(x), lo = bf16(x - hi): ~16 mantissa bits in two
// bf16 terms for split-precision tensor-core products. lo == nullptr: hi
// alone (`--prefill-precision bf16` reads no lo terms).
__device__ __forceinline__ void split1(float v, bf16_t* hi, bf16_t* lo) {
    const bf16_t h = f2bf(v);
    *hi = h;
    if (lo) *lo = f2bf(v - bf2f(h));
}

// Four at once (hi and lo 8-byte aligned).
__device__ __forceinline__ void split4(float4 v, bf16_t* hi, bf16_t* lo) {
    const bf16_t h0 = f2bf(v.x), h1 = f2bf(v.y), h2 = f2bf(v.z), h3 = f2bf(v.w);
    *(uint2*)hi = make_uint2(h0 | ((unsigned)h1 << 16), h2 | ((unsigned)h3 << 16));
    if (lo)
        *(uint2*)lo = make_uint2(f2bf(v.x - bf2f(h0)) | ((unsigned)f2bf(v.y - bf2f(h1)) << 16),
                                 f2bf(v.z - bf2f(h2)) | ((unsigned)f2bf(v.w - bf2f(h3)) << 16));
}

// Split a row of n floats into hi/lo (lo may be nullptr), vectorised where
// the pointers allow; one block.
__device__ __forceinline__ void split_row(const float* __restrict__ x, bf16_t* __restrict__ hi,
                                          bf16_t* __restrict__ lo, int n) {
    if ((n & 3) == 0 && (((size_t)x & 15) | ((size_t)hi & 7) | ((size_t)lo & 7)) == 0) {
        for (int c = threadIdx.x; c < n / 4; c += blockDim.x)
            split4(((const float4*)x)[c], hi + 4 * c, lo ? lo + 4 * c : nullptr);
    } else {
        for (int c = threadIdx.x; c < n; c += blockDim.x) split1(x[c], hi + c, lo ? lo + c : nullptr);
    }
}
