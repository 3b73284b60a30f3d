// Tensor-core primitives of sm_80 and later (CUDA; emulated under QW_CPU for
// the CPU harness): bf16 mma.sync m16n8k16 with f32 accumulation, ldmatrix and
// cp.async. Fragment layouts (lane l, g = l >> 2, c = l & 3): A (16x16, row)
// a0 = A[g][2c..], a1 = A[g+8][2c..], a2 = A[g][2c+8..], a3 = A[g+8][2c+8..];
// B (16x8, col) b0 = B[2c..][g], b1 = B[2c+8..][g]; C (16x8) c0,c1 = C[g][2c..],
// c2,c3 = C[g+8][2c..].
#pragma once
#include "compat.h"
#include "fp8.h"

#if defined(QW_CUDA)

// d += a * b for one 16x8x16 tile.
__device__ __forceinline__ void mma_16816(float* d, const unsigned* a, unsigned b0, unsigned b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// A generic pointer into shared memory as a shared-window address.
__device__ __forceinline__ unsigned smem_addr(const void* p) { return (unsigned)__cvta_generic_to_shared(p); }

// Four 8x8 b16 matrices from shared memory; lane l addresses row l % 8 of
// matrix l / 8; register i of lane (g, c) gets M_i[g][2c, 2c+1].
__device__ __forceinline__ void ldmatrix_x4(unsigned* r, unsigned saddr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(saddr));
}
__device__ __forceinline__ void ldmatrix_x4(unsigned* r, const void* smem_row) {
    ldmatrix_x4(r, smem_addr(smem_row));
}

// The same, transposed: register i of lane (g, c) gets M_i[2c, 2c+1][g].
__device__ __forceinline__ void ldmatrix_x4_trans(unsigned* r, unsigned saddr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(saddr));
}

// 16 bytes global -> shared, asynchronously; zero-filled when !valid (gmem is not read).
__device__ __forceinline__ void cp_async16(unsigned saddr, const void* gmem, bool valid) {
    int n = valid ? 16 : 0;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(saddr), "l"(gmem), "r"(n));
}
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem, bool valid) {
    cp_async16(smem_addr(smem), gmem, valid);
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}
// One step of a ring of `stages` (1..4) shared-memory tiles: commits this
// thread's copies of the newest tile, then waits until the oldest has landed
// (at most stages - 1 later groups still pending).
__device__ __forceinline__ void cp_async_ring_step(int stages) {
    cp_async_commit();
    if (stages >= 4) cp_async_wait<3>();
    else if (stages == 3) cp_async_wait<2>();
    else if (stages == 2) cp_async_wait<1>();
    else cp_async_wait<0>();
}

// Two floats as bf16x2 (round to nearest even), x0 in the low half (the lower k / column).
__device__ __forceinline__ unsigned pack_bf16x2(float x0, float x1) {
    unsigned d;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(d) : "f"(x1), "f"(x0));
    return d;
}

#elif defined(QW_CPU)
// The CPU harness (tests/kernels_cpu) emulates the warp-wide product: every
// lane posts its fragments, then computes its four outputs from all of them
// (the bf16 products are exact in f32; the sum order differs from the
// hardware's, which the checks' tolerances cover).
__device__ __forceinline__ void mma_16816(float* d, const unsigned* a, unsigned b0, unsigned b1) {
    static unsigned frag[1024][6];
    const unsigned lane = qw_cpu::tid % WARP, base = qw_cpu::tid - lane;
    for (int i = 0; i < 4; i++) frag[qw_cpu::tid][i] = a[i];
    frag[qw_cpu::tid][4] = b0;
    frag[qw_cpu::tid][5] = b1;
    qw_cpu::sync_warp();
    auto half = [](unsigned w, int k) { return k & 1 ? bf_hi(w) : bf_lo(w); };
    // A[r][k]: lane 4 (r % 8) + (k % 8) / 2, register (r >= 8) + 2 (k >= 8);
    // B[k][n]: lane 4 n + (k % 8) / 2, register 4 + (k >= 8).
    auto A = [&](int r, int k) { return half(frag[base + 4 * (r % 8) + (k % 8) / 2][(r >= 8) + 2 * (k >= 8)], k); };
    auto B = [&](int k, int n) { return half(frag[base + 4 * n + (k % 8) / 2][4 + (k >= 8)], k); };
    const int g = lane >> 2, c = lane & 3;
    for (int e = 0; e < 4; e++) {
        const int r = g + 8 * (e >> 1), n = 2 * c + (e & 1);
        float t = d[e];
        for (int k = 0; k < 16; k++) t += A(r, k) * B(k, n);
        d[e] = t;
    }
    qw_cpu::sync_warp();
}

__device__ __forceinline__ unsigned pack_bf16x2(float x0, float x1) {
    return (unsigned)f2bf(x0) | ((unsigned)f2bf(x1) << 16);
}

// A shared-window address is the byte offset into the harness's dynamic shared
// memory (the only shared memory the kernels address by an `unsigned`).
__device__ __forceinline__ unsigned smem_addr(const void* p) {
    return (unsigned)((const unsigned char*)p - qw_cpu::dyn_smem);
}

// ldmatrix, warp-cooperative like mma_16816: every lane posts the row it
// supplies (lanes 8i..8i+7: rows 0..7 of matrix i, 16 contiguous bytes each),
// then register i of lane (g, c) takes M_i[g][2c], M_i[g][2c+1] (.trans:
// M_i[2c][g], M_i[2c+1][g]), the first in the low half.
__device__ __forceinline__ void ldmatrix_x4_cpu(unsigned* r, const void* row, bool trans) {
    static const unsigned char* rows[1024];
    const unsigned lane = qw_cpu::tid % WARP, base = qw_cpu::tid - lane;
    rows[qw_cpu::tid] = (const unsigned char*)row;
    qw_cpu::sync_warp();
    auto el = [&](int i, int y, int x) {  // M_i[y][x]
        bf16_t v;
        std::memcpy(&v, rows[base + 8 * i + y] + 2 * x, 2);
        return (unsigned)v;
    };
    const int g = lane >> 2, c = lane & 3;
    for (int i = 0; i < 4; i++)
        r[i] = trans ? el(i, 2 * c, g) | el(i, 2 * c + 1, g) << 16 : el(i, g, 2 * c) | el(i, g, 2 * c + 1) << 16;
    qw_cpu::sync_warp();
}
__device__ __forceinline__ void ldmatrix_x4(unsigned* r, unsigned saddr) {
    ldmatrix_x4_cpu(r, qw_cpu::dyn_smem + saddr, false);
}
// Any shared memory (a `__shared__` static too), as on the GPU.
__device__ __forceinline__ void ldmatrix_x4(unsigned* r, const void* smem_row) { ldmatrix_x4_cpu(r, smem_row, false); }
__device__ __forceinline__ void ldmatrix_x4_trans(unsigned* r, unsigned saddr) {
    ldmatrix_x4_cpu(r, qw_cpu::dyn_smem + saddr, true);
}

// cp.async as a synchronous copy (zeros when !valid, gmem not read): the data
// has landed when the call returns, so commit / wait are no-ops. The pointer
// form takes any shared memory, the address form dynamic shared memory.
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem, bool valid) {
    if (valid) std::memcpy(smem, gmem, 16);
    else std::memset(smem, 0, 16);
}
__device__ __forceinline__ void cp_async16(unsigned saddr, const void* gmem, bool valid) {
    cp_async16(qw_cpu::dyn_smem + saddr, gmem, valid);
}
__device__ __forceinline__ void cp_async_commit() {}
template <int N>
__device__ __forceinline__ void cp_async_wait() {}
__device__ __forceinline__ void cp_async_ring_step(int) {}
#endif

// Warpgroup MMA (sm_90a; QW_WGMMA where this compilation targets it): a
// warpgroup of 4 warps multiplies operands read straight from shared memory,
// described by 64-bit descriptors (A may instead come from registers, in
// mma_16816's A layout per warp of 16 rows). Only K-major bf16 operands are
// used here, unswizzled or in the 64-byte swizzle (`wg_desc`, `wg_desc_sw64`
// below); unswizzled: "core matrices" of 8 rows x 16 bytes stored contiguously
// (row y at byte 16 y), the two 8-element k halves of a k16 step `lbo` bytes
// apart, consecutive groups of 8 rows `sbo` bytes apart. Accumulator
// fragments of m64nN (thread t of the warpgroup, w = t / 32, g = (t % 32) / 4,
// c = t % 4): d[4j + e] = D[16w + g + 8(e / 2)][8j + 2c + e % 2].
#if defined(QW_CUDA) && defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define QW_WGMMA 1
// Orders this thread's generic-proxy shared-memory writes (cp.async included,
// once landed) before later async-proxy reads (wgmma operands).
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_wait0() { asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory"); }
// All but the newest committed group done.
__device__ __forceinline__ void wgmma_wait1() { asm volatile("wgmma.wait_group.sync.aligned 1;\n" ::: "memory"); }
// Pins the accumulators in place around the asynchronous products: the
// compiler must not read or move them between issue and wgmma_wait0.
__device__ __forceinline__ void wgmma_fence_operands(float* d, int n) {
#pragma unroll
    for (int i = 0; i < n; i++) asm volatile("" : "+f"(d[i])::"memory");
}
// The same for A fragments held in registers (read until the products are done).
__device__ __forceinline__ void wgmma_fence_operands(unsigned* a, int n) {
#pragma unroll
    for (int i = 0; i < n; i++) asm volatile("" : "+r"(a[i])::"memory");
}
// The operand lists of the wgmma wrappers: the accumulator registers as
// "%0, %1, ..." in groups of 16, and d[i .. i + 16) as in-out operands.
#define QW_R16_0 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15"
#define QW_R16_16 "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
#define QW_R16_32 "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47"
#define QW_R16_48 "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
#define QW_R16_64 "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79"
#define QW_R16_80 "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95"
#define QW_R16_96 "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111"
#define QW_R16_112 "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127"
#define QW_R32 QW_R16_0 ", " QW_R16_16
#define QW_R64 QW_R32 ", " QW_R16_32 ", " QW_R16_48
#define QW_R128 QW_R64 ", " QW_R16_64 ", " QW_R16_80 ", " QW_R16_96 ", " QW_R16_112
#define QW_ACC4(d, i) "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3])
#define QW_ACC16(d, i) QW_ACC4(d, i), QW_ACC4(d, i + 4), QW_ACC4(d, i + 8), QW_ACC4(d, i + 12)
#define QW_ACC64(d, i) QW_ACC16(d, i), QW_ACC16(d, i + 16), QW_ACC16(d, i + 32), QW_ACC16(d, i + 48)
// One wgmma, always accumulating (scale-d true), bf16 operands unscaled and
// K-major: A and B from shared memory (SS: the descriptors `descs`) or A from
// registers (RS: `a_desc`, the four A registers then B's descriptor).
#define QW_WGMMA_SS(shape, dregs, descs)                                                        \
    "{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\nwgmma.mma_async.sync.aligned." shape ".f32.bf16.bf16 {" \
    dregs "}, " descs ", p, 1, 1, 0, 0;\n}\n"
#define QW_WGMMA_RS(shape, dregs, a_desc)                                                       \
    "{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\nwgmma.mma_async.sync.aligned." shape ".f32.bf16.bf16 {" \
    dregs "}, " a_desc ", p, 1, 1, 0;\n}\n"

// D (64 x N f32, the warpgroup's fragments) += A (64 x 16) B^T (N x 16), bf16,
// both K-major in shared memory (`wg_desc`, `wg_desc_sw64`), N = 32 .. 256.
__device__ __forceinline__ void wgmma_m64n32k16(float* d, unsigned long long da, unsigned long long db) {
    asm volatile(QW_WGMMA_SS("m64n32k16", QW_R16_0, "%16, %17") : QW_ACC16(d, 0) : "l"(da), "l"(db));
}
__device__ __forceinline__ void wgmma_m64n64k16(float* d, unsigned long long da, unsigned long long db) {
    asm volatile(QW_WGMMA_SS("m64n64k16", QW_R32, "%32, %33")
                 : QW_ACC16(d, 0), QW_ACC16(d, 16)
                 : "l"(da), "l"(db));
}
__device__ __forceinline__ void wgmma_m64n128k16(float* d, unsigned long long da, unsigned long long db) {
    asm volatile(QW_WGMMA_SS("m64n128k16", QW_R64, "%64, %65")
                 : QW_ACC64(d, 0)
                 : "l"(da), "l"(db));
}
__device__ __forceinline__ void wgmma_m64n256k16(float* d, unsigned long long da, unsigned long long db) {
    asm volatile(QW_WGMMA_SS("m64n256k16", QW_R128, "%128, %129")
                 : QW_ACC64(d, 0), QW_ACC64(d, 64)
                 : "l"(da), "l"(db));
}
// D (64 x N) += A (64 x 16, this warpgroup's registers in the mma.sync A
// layout, warp w holding rows 16w..16w+15) B^T (N x 16, shared memory).
__device__ __forceinline__ void wgmma_m64n32k16_rs(float* d, const unsigned* a, unsigned long long db) {
    asm volatile(QW_WGMMA_RS("m64n32k16", QW_R16_0, "{%16, %17, %18, %19}, %20")
                 : QW_ACC16(d, 0)
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db));
}
__device__ __forceinline__ void wgmma_m64n256k16_rs(float* d, const unsigned* a, unsigned long long db) {
    asm volatile(QW_WGMMA_RS("m64n256k16", QW_R128, "{%128, %129, %130, %131}, %132")
                 : QW_ACC64(d, 0), QW_ACC64(d, 64)
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db));
}
// D (64 x 128 f32) += A (64 x 32) B^T (128 x 32), E4M3 operands K-major in
// shared memory: a k32 step is 32 bytes of a row, as a bf16 k16 step is, so
// the same descriptors serve (FP8 wgmma has no transpose operands).
__device__ __forceinline__ void wgmma_m64n128k32_e4m3(float* d, unsigned long long da, unsigned long long db) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\nwgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3 {" QW_R64
        "}, %64, %65, p, 1, 1;\n}\n"
        : QW_ACC64(d, 0)
        : "l"(da), "l"(db));
}
#elif defined(QW_CPU)
// The descriptors (below) hold the operand's offset into the harness's dynamic
// shared memory; the product reads the operands through the layout the
// descriptors describe, each thread its own fragments (no exchange: both
// operands are in shared memory).
__device__ __forceinline__ void fence_proxy_async() {}
__device__ __forceinline__ void wgmma_fence() {}
__device__ __forceinline__ void wgmma_commit() {}
__device__ __forceinline__ void wgmma_wait0() {}
__device__ __forceinline__ void wgmma_wait1() {}
__device__ __forceinline__ void wgmma_fence_operands(float*, int) {}
__device__ __forceinline__ void wgmma_fence_operands(unsigned*, int) {}
// Element (row, k) of the operand a descriptor describes (no swizzle, or the
// 64-byte swizzle applied to the byte address).
__device__ __forceinline__ float wg_elem(unsigned long long desc, int row, int k) {
    const unsigned addr = (unsigned)(desc & 0x3fff) << 4, lbo = (unsigned)(desc >> 16 & 0x3fff) << 4,
                   sbo = (unsigned)(desc >> 32 & 0x3fff) << 4, layout = (unsigned)(desc >> 62);
    unsigned a;
    if (layout == 2) {
        a = addr + (row / 8) * sbo + (row % 8) * 64 + k * 2;
        a ^= ((a >> 7) & 3) << 4;
    } else {
        a = addr + (k / 8) * lbo + (row / 8) * sbo + (row % 8) * 16 + (k % 8) * 2;
    }
    bf16_t v;
    std::memcpy(&v, qw_cpu::dyn_smem + a, 2);
    return bf2f(v);
}
template <int NC>
__device__ __forceinline__ void wgmma_cpu(float* d, unsigned long long da, unsigned long long db) {
    const unsigned t = qw_cpu::tid % 128, w = t / 32, g = (t % 32) / 4, c = t % 4;
    for (int j = 0; j < NC / 8; j++)
        for (int e = 0; e < 4; e++) {
            const int row = 16 * w + g + 8 * (e / 2), col = 8 * j + 2 * c + e % 2;
            float acc = d[4 * j + e];
            for (int k = 0; k < 16; k++) acc += wg_elem(da, row, k) * wg_elem(db, col, k);
            d[4 * j + e] = acc;
        }
}
__device__ __forceinline__ void wgmma_m64n128k16(float* d, unsigned long long da, unsigned long long db) {
    wgmma_cpu<128>(d, da, db);
}
__device__ __forceinline__ void wgmma_m64n256k16(float* d, unsigned long long da, unsigned long long db) {
    wgmma_cpu<256>(d, da, db);
}
__device__ __forceinline__ void wgmma_m64n32k16(float* d, unsigned long long da, unsigned long long db) {
    wgmma_cpu<32>(d, da, db);
}
__device__ __forceinline__ void wgmma_m64n64k16(float* d, unsigned long long da, unsigned long long db) {
    wgmma_cpu<64>(d, da, db);
}
// A from registers: every thread of the warpgroup posts its fragment, then
// reads A[row][k] from warp row / 16's lanes in the mma_16816 A layout.
template <int NC>
__device__ __forceinline__ void wgmma_rs_cpu(float* d, const unsigned* a, unsigned long long db) {
    static unsigned frag[1024][4];
    const unsigned t = qw_cpu::tid % 128, base = qw_cpu::tid - t, w = t / 32, g = (t % 32) / 4, c = t % 4;
    for (int i = 0; i < 4; i++) frag[qw_cpu::tid][i] = a[i];
    qw_cpu::sync_warpgroup();
    auto A = [&](int row, int k) {
        const int r = row % 16;
        const unsigned v = frag[base + 32 * (row / 16) + 4 * (r % 8) + (k % 8) / 2][(r >= 8) + 2 * (k >= 8)];
        return k & 1 ? bf_hi(v) : bf_lo(v);
    };
    for (int j = 0; j < NC / 8; j++)
        for (int e = 0; e < 4; e++) {
            const int row = 16 * w + g + 8 * (e / 2), col = 8 * j + 2 * c + e % 2;
            float acc = d[4 * j + e];
            for (int k = 0; k < 16; k++) acc += A(row, k) * wg_elem(db, col, k);
            d[4 * j + e] = acc;
        }
    qw_cpu::sync_warpgroup();
}
__device__ __forceinline__ void wgmma_m64n32k16_rs(float* d, const unsigned* a, unsigned long long db) {
    wgmma_rs_cpu<32>(d, a, db);
}
__device__ __forceinline__ void wgmma_m64n256k16_rs(float* d, const unsigned* a, unsigned long long db) {
    wgmma_rs_cpu<256>(d, a, db);
}
// E4M3 operands: byte (row, k) at the same byte address a bf16 element (row,
// k / 2) would start at, decoded exactly (kernels/fp8.h).
__device__ __forceinline__ float wg_elem8(unsigned long long desc, int row, int k) {
    const unsigned addr = (unsigned)(desc & 0x3fff) << 4, lbo = (unsigned)(desc >> 16 & 0x3fff) << 4,
                   sbo = (unsigned)(desc >> 32 & 0x3fff) << 4, layout = (unsigned)(desc >> 62);
    unsigned a;
    if (layout == 2) {
        a = addr + (row / 8) * sbo + (row % 8) * 64 + k;
        a ^= ((a >> 7) & 3) << 4;
    } else {
        a = addr + (k / 16) * lbo + (row / 8) * sbo + (row % 8) * 16 + k % 16;
    }
    return e4m3_f32(qw_cpu::dyn_smem[a]);
}
__device__ __forceinline__ void wgmma_m64n128k32_e4m3(float* d, unsigned long long da, unsigned long long db) {
    const unsigned t = qw_cpu::tid % 128, w = t / 32, g = (t % 32) / 4, c = t % 4;
    for (int j = 0; j < 16; j++)
        for (int e = 0; e < 4; e++) {
            const int row = 16 * w + g + 8 * (e / 2), col = 8 * j + 2 * c + e % 2;
            float acc = d[4 * j + e];
            for (int k = 0; k < 32; k++) acc += wg_elem8(da, row, k) * wg_elem8(db, col, k);
            d[4 * j + e] = acc;
        }
}
#endif
#if defined(QW_WGMMA) || defined(QW_CPU)
// Descriptor of a K-major, unswizzled operand at `smem` (16-byte aligned).
__device__ __forceinline__ unsigned long long wg_desc(const void* smem, unsigned lbo, unsigned sbo) {
    return (unsigned long long)((smem_addr(smem) >> 4) & 0x3fff) | (unsigned long long)((lbo >> 4) & 0x3fff) << 16 |
           (unsigned long long)((sbo >> 4) & 0x3fff) << 32;
}
// The same for a K-major operand in the 64-byte swizzle: rows of 64 bytes
// (32 bf16: one k step of 32), 8-row groups `sbo` bytes apart, each row's 16-byte
// chunk c stored at chunk c ^ ((row >> 1) & 3) (byte address bits 4-5 ^= bits
// 7-8, so groups must be 512-byte aligned); a k16 step starts 32 bytes into the row.
__device__ __forceinline__ unsigned long long wg_desc_sw64(const void* smem, unsigned sbo) {
    return wg_desc(smem, 16, sbo) | 2ull << 62;
}
// Byte offset of 16-byte chunk c (0..3) of row r in a [rows][64 B] tile in that
// swizzle (the tile 512-byte aligned): where a copy puts it.
__device__ __forceinline__ unsigned sw64_off(int r, int c) { return (unsigned)(r * 64 + ((c ^ ((r >> 1) & 3)) << 4)); }
#endif

#if defined(QW_CUDA) || defined(QW_CPU)
// hi = bf16(x), lo = bf16(x - hi), for a pair: split-precision operands.
__device__ __forceinline__ void split_bf16x2(float x0, float x1, unsigned& hi, unsigned& lo) {
    hi = pack_bf16x2(x0, x1);
    lo = pack_bf16x2(x0 - bf_lo(hi), x1 - bf_hi(hi));
}
#endif
