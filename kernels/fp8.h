// Block-FP8 weights (Qwen's -FP8 checkpoints, docs/FP8.md): E4M3 bytes with
// one f32 scale per 128x128 block. A weight's bf16 value is exactly the CPU
// reference's (host/engine/src/fp8.rs, transformers' dequantization): the
// E4M3 value and the scale widened to f32, multiplied once, rounded to bf16
// (nearest even), so every kernel that reads FP8 sees the bf16 weights the
// dequantize-at-upload path would hold.
#pragma once
#include "compat.h"

// The value of an E4M3 (float8_e4m3fn: bias 7, no infinities, S.1111.111 NaN)
// byte, exactly.
__device__ __forceinline__ float e4m3_f32(unsigned b) {
    const unsigned e = (b >> 3) & 15u, m = b & 7u;
    if (e == 15u && m == 7u) return __uint_as_float(0x7fc00000u);
    // Subnormal m/8 * 2^-6; normal (1 + m/8) * 2^(e-7) as f32 bits.
    const float v = e == 0u ? (float)m * 0.001953125f : __uint_as_float(((e + 120u) << 23) | (m << 20));
    return (b & 0x80u) ? -v : v;
}

// One weight: bf16(f32(e4m3) * scale).
__device__ __forceinline__ bf16_t fp8_bf16(unsigned b, float s) { return f2bf(e4m3_f32(b) * s); }

// Ada and Hopper convert E4M3 in hardware. The decode kernels are
// instruction-bound on the conversion otherwise (the bit-by-bit e4m3_f32 +
// f2bf cost twice the bf16 kernels' time on the H200 for half the bytes).
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890 && !defined(__HIP_PLATFORM_AMD__)
#define QW_FP8_CVT 1
#endif

// Two bf16 weights (low half first) from the E4M3 bytes at bit `sh` and `sh + 8` of w.
__device__ __forceinline__ unsigned fp8x2_bf16(unsigned w, int sh, float s) {
#ifdef QW_FP8_CVT
    // E4M3 -> f16 is exact (every E4M3 value, subnormals included, is an f16
    // normal), f16 -> f32 exact, one f32 multiply, one round to nearest even:
    // the same bf16 as fp8_bf16 (NaN codes give a NaN either way).
    unsigned h2;
    const unsigned short pair = (unsigned short)(w >> sh);
    asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(h2) : "h"(pair));
    float f0, f1;
    asm("{.reg .f16 a, b;\n\tmov.b32 {a, b}, %2;\n\tcvt.f32.f16 %0, a;\n\tcvt.f32.f16 %1, b;}"
        : "=f"(f0), "=f"(f1)
        : "r"(h2));
    unsigned r;
    // cvt.rn.bf16x2.f32 d, a, b puts a in the upper half.
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(f1 * s), "f"(f0 * s));
    return r;
#else
    return (unsigned)fp8_bf16((w >> sh) & 255u, s) | ((unsigned)fp8_bf16((w >> (sh + 8)) & 255u, s) << 16);
#endif
}

// Eight E4M3 weights of one block (8 bytes, element 0 the lowest) as the
// 16 bytes of their bf16 values, laid out as a bf16 load of them would be.
__device__ __forceinline__ uint4 fp8x8_bf16(uint2 q, float s) {
    return make_uint4(fp8x2_bf16(q.x, 0, s), fp8x2_bf16(q.x, 16, s), fp8x2_bf16(q.y, 0, s),
                      fp8x2_bf16(q.y, 16, s));
}

// The E4M3 byte of |v| < 448 with the mantissa truncated (synthetic weights:
// kernels/common.cu fill_uniform_fp8); never the NaN code.
__device__ __forceinline__ unsigned char f32_e4m3_trunc(float v) {
    const unsigned s = v < 0.f ? 0x80u : 0u;
    const float a = fabsf(v);
    if (a < 0.015625f) return (unsigned char)(s | (unsigned)(a * 512.f));  // subnormal m * 2^-9
    int e;
    const float f = frexpf(a, &e);  // a = f 2^e, f in [0.5, 1): (1 + m/8) 2^(e-1)
    return (unsigned char)(s | ((unsigned)(e + 6) << 3) | (unsigned)((f * 2.f - 1.f) * 8.f));
}

// The E4M3 byte nearest to v (ties to the even code), finite values past 448
// as +-448 and NaN as NaN: PTX `cvt.rn.satfinite.e4m3x2.f32`, restated for
// the GPUs without it and the CPU harness.
__device__ __forceinline__ unsigned char f32_e4m3_rn(float v) {
    const unsigned s = (__float_as_uint(v) >> 24) & 0x80u;
    const float a = fabsf(v);
    if (a != a) return (unsigned char)(s | 0x7fu);
    if (a >= 448.f) return (unsigned char)(s | 0x7eu);
    // Subnormals step by 2^-9; 8 of them is the first normal's code (0x08).
    if (a < 0.015625f) return (unsigned char)(s | (unsigned)rintf(a * 512.f));
    int e;
    frexpf(a, &e);                                    // a in [2^(e-1), 2^e): 3 mantissa bits step by 2^(e-4)
    const float r = ldexpf(rintf(ldexpf(a, 4 - e)), e - 4);  // may carry into the next binade
    const float f = frexpf(r, &e);
    return (unsigned char)(s | ((unsigned)(e + 6) << 3) | (unsigned)((f * 2.f - 1.f) * 8.f));
}
