// The CUDA/HIP subset the kernels use, as plain C++, so a kernel source runs
// on the CPU for logic tests (compat.h includes this under QW_CPU). Every
// thread of a block is a std::thread (qw_cpu::launch); __syncthreads and
// warp shuffles are barriers; a `__shared__` variable is a function static
// and dynamic shared memory one static buffer, so blocks run one at a time.
#pragma once
#include <algorithm>
#include <atomic>
#include <barrier>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <functional>
#include <math.h>
#include <memory>
#include <thread>
#include <vector>

#define WARP 32
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __restrict__
#define __shared__ static
#define __align__(n) alignas(n)

struct float4 { float x, y, z, w; };
struct float2 { float x, y; };
struct uint4 { unsigned x, y, z, w; };
struct uint2 { unsigned x, y; };
struct dim3 { unsigned x = 1, y = 1, z = 1; };
inline uint4 make_uint4(unsigned a, unsigned b, unsigned c, unsigned d) { return {a, b, c, d}; }
inline uint2 make_uint2(unsigned a, unsigned b) { return {a, b}; }
inline float4 make_float4(float a, float b, float c, float d) { return {a, b, c, d}; }
inline float2 make_float2(float a, float b) { return {a, b}; }

inline thread_local dim3 threadIdx, blockIdx;
inline dim3 blockDim, gridDim;

namespace qw_cpu {
// This thread's index in its block (x fastest, as warps are formed on a GPU).
inline thread_local unsigned tid;
inline std::unique_ptr<std::barrier<>> block_barrier;
inline std::vector<std::unique_ptr<std::barrier<>>> warp_barriers;
inline std::vector<std::unique_ptr<std::barrier<>>> warpgroup_barriers;  // 4 warps each
inline unsigned long long slots[1024];  // one exchange slot per thread
alignas(16) inline unsigned char dyn_smem[256 * 1024];

inline void sync_warp() { warp_barriers[tid / WARP]->arrive_and_wait(); }
inline void sync_warpgroup() { warpgroup_barriers[tid / (4 * WARP)]->arrive_and_wait(); }

// `v` of lane (lane ^ m) of this thread's warp; every lane must call it.
template <typename T>
T shfl_xor(T v, int m) {
    static_assert(sizeof(T) <= 8);
    const unsigned lane = tid % WARP, base = tid - lane;
    std::memcpy(&slots[tid], &v, sizeof(T));
    sync_warp();
    T o;
    std::memcpy(&o, &slots[base + (lane ^ (unsigned)m)], sizeof(T));
    sync_warp();
    return o;
}

// Runs `kernel` for every block of `grid` with `block` threads each: one
// std::thread per thread of a block, the blocks one after another. A thread
// that returns leaves the block's barriers (as an exited GPU thread does)
// and waits for the others before the next block starts.
inline void launch(dim3 grid, dim3 block, const std::function<void()>& kernel) {
    gridDim = grid;
    blockDim = block;
    const unsigned n = block.x * block.y * block.z, blocks = grid.x * grid.y * grid.z;
    auto fresh = [n]() noexcept {
        block_barrier = std::make_unique<std::barrier<>>(n);
        warp_barriers.clear();
        for (unsigned w = 0; w * WARP < n; w++)
            warp_barriers.push_back(std::make_unique<std::barrier<>>(std::min<unsigned>(WARP, n - w * WARP)));
        warpgroup_barriers.clear();
        for (unsigned w = 0; w * 4 * WARP < n; w++)
            warpgroup_barriers.push_back(
                std::make_unique<std::barrier<>>(std::min<unsigned>(4 * WARP, n - w * 4 * WARP)));
    };
    fresh();
    std::barrier next(n, fresh);
    std::vector<std::thread> ts;
    for (unsigned t = 0; t < n; t++)
        ts.emplace_back([&, t] {
            qw_cpu::tid = t;
            threadIdx = {t % block.x, t / block.x % block.y, t / (block.x * block.y)};
            for (unsigned b = 0; b < blocks; b++) {
                blockIdx = {b % grid.x, b / grid.x % grid.y, b / (grid.x * grid.y)};
                kernel();
                block_barrier->arrive_and_drop();
                warp_barriers[t / WARP]->arrive_and_drop();
                warpgroup_barriers[t / (4 * WARP)]->arrive_and_drop();
                next.arrive_and_wait();
            }
        });
    for (auto& t : ts) t.join();
}
}  // namespace qw_cpu

#define SHFL_XOR(v, m) qw_cpu::shfl_xor((v), (m))
#define QW_SYNCWARP() qw_cpu::sync_warp()
inline void __syncthreads() { qw_cpu::block_barrier->arrive_and_wait(); }
// Dynamic shared memory (QW_DYN_SMEM in compat.h).
#define QW_CPU_DYN_SMEM(T, name) T* name = reinterpret_cast<T*>(qw_cpu::dyn_smem)

inline float __uint_as_float(unsigned u) { float f; std::memcpy(&f, &u, 4); return f; }
inline unsigned __float_as_uint(float f) { unsigned u; std::memcpy(&u, &f, 4); return u; }
inline float __int_as_float(int u) { float f; std::memcpy(&f, &u, 4); return f; }
inline int __float_as_int(float f) { int u; std::memcpy(&u, &f, 4); return u; }
inline float rsqrtf(float x) { return 1.f / std::sqrt(x); }
// IEEE operations, rounded one at a time (the harness builds without -ffast-math
// and x86-64 does not contract a * b + c unless asked).
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline double __dadd_rn(double a, double b) { return a + b; }
template <typename T>
inline T __ldg(const T* p) { return *p; }
// CUDA's integer min/max overloads.
inline int min(int a, int b) { return a < b ? a : b; }
inline int max(int a, int b) { return a > b ? a : b; }
inline unsigned min(unsigned a, unsigned b) { return a < b ? a : b; }
inline unsigned max(unsigned a, unsigned b) { return a > b ? a : b; }
inline long long min(long long a, long long b) { return a < b ? a : b; }
inline long long max(long long a, long long b) { return a > b ? a : b; }
// Shared-memory atomics and bit counts as the kernels use them.
inline unsigned long long atomicOr(unsigned long long* a, unsigned long long v) {
    return std::atomic_ref<unsigned long long>(*a).fetch_or(v);
}
inline int __popcll(unsigned long long v) { return std::popcount(v); }
