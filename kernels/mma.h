// Tensor-core primitives of sm_80 and later (CUDA; emulated under QW_CPU for
// the CPU harness): bf16 mma.sync m16n8k16 with f32 accumulation, ldmatrix and
// cp.async. Fragment layouts (lane l, g = l >> 2, c = l & 3): A (16x16, row)
// a0 = A[g][2c..], a1 = A[g+8][2c..], a2 = A[g][2c+8..], a3 = A[g+8][2c+8..];
// B (16x8, col) b0 = B[2c..][g], b1 = B[2c+8..][g]; C (16x8) c0,c1 = C[g][2c..],
// c2,c3 = C[g+8][2c..].
#pragma once
#include "compat.h"

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

#if defined(QW_CUDA) || defined(QW_CPU)
// hi = bf16(x), lo = bf16(x - hi), for a pair: split-precision operands.
__device__ __forceinline__ void split_bf16x2(float x0, float x1, unsigned& hi, unsigned& lo) {
    hi = pack_bf16x2(x0, x1);
    lo = pack_bf16x2(x0 - bf_lo(hi), x1 - bf_hi(hi));
}
#endif
