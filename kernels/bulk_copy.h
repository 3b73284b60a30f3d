// Bulk copies from global into shared memory (Hopper: cp.async.bulk, its
// completion counted in bytes by an mbarrier), shared by the kernels that
// stream weights through a shared-memory ring (gemv_bulk.cu, gemm_rows.cu).
// QW_BULK is defined where the copies exist (sm_90 and later); elsewhere
// (HIP, sm_80, the CPU harness) those kernels copy each slot themselves.
#pragma once
#include "mma.h"

#if defined(QW_CUDA) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define QW_BULK 1
#endif

#define BULK_MAX_STAGES 8   // most ring slots

#if defined(QW_BULK)
__device__ __forceinline__ void mbar_init(unsigned long long* bar, unsigned count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_addr(bar)), "r"(count) : "memory");
}

// Makes the initialised barriers visible to the bulk-copy (async) proxy.
__device__ __forceinline__ void mbar_fence_init() { asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory"); }

// The producer's arrival on `bar` for a phase that completes once `bytes`
// of bulk copies have landed (announced before the copies are issued).
__device__ __forceinline__ void mbar_expect(unsigned long long* bar, unsigned bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_addr(bar)), "r"(bytes)
                 : "memory");
}

// `bytes` (a multiple of 16, both addresses 16-byte aligned) from global to
// shared memory, counted on `bar`.
__device__ __forceinline__ void bulk_copy(void* dst, const void* src, unsigned bytes, unsigned long long* bar) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                     smem_addr(dst)),
                 "l"(src), "r"(bytes), "r"(smem_addr(bar))
                 : "memory");
}

// Waits until `bar` completes the phase of this parity.
__device__ __forceinline__ void mbar_wait(unsigned long long* bar, unsigned parity) {
    const unsigned b = smem_addr(bar);
    unsigned done;
    do {
        asm volatile(
            "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}"
            : "=r"(done)
            : "r"(b), "r"(parity)
            : "memory");
    } while (!done);
}
#endif
