// Tensor-core primitives of sm_80 and later (CUDA only): bf16 mma.sync
// m16n8k16 with f32 accumulation, ldmatrix and cp.async. Fragment layouts
// (lane l, g = l >> 2, c = l & 3): A (16x16, row) a0 = A[g][2c..], a1 = A[g+8][2c..],
// a2 = A[g][2c+8..], a3 = A[g+8][2c+8..]; B (16x8, col) b0 = B[2c..][g],
// b1 = B[2c+8..][g]; C (16x8) c0,c1 = C[g][2c..], c2,c3 = C[g+8][2c..].
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

// Four 8x8 b16 matrices from shared memory; lane l addresses row l % 8 of matrix l / 8.
__device__ __forceinline__ void ldmatrix_x4(unsigned* r, const void* smem_row) {
    unsigned s = (unsigned)__cvta_generic_to_shared(smem_row);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(s));
}

// 16 bytes global -> shared, asynchronously; zero-filled when !valid (gmem is not read).
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem, bool valid) {
    unsigned s = (unsigned)__cvta_generic_to_shared(smem);
    int n = valid ? 16 : 0;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem), "r"(n));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

#endif
