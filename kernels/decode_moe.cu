// The decode step's routed experts (batch 1): the router's top-k recomputed
// in every block of both expert kernels, gate/up with the post-attention norm
// as prologue, down with the gated shared expert and the residual add as
// epilogue; bf16 and block-FP8 weights (kernels/decode.cu describes the fused
// decode step, decode_stream.h the weight streaming).
#include "decode_stream.h"
#include "norm_partials.h"

// Warp-wide max (MAX) or min of an unsigned: one redux.sync on sm_80 and
// later, shuffles elsewhere.
template <bool MAX>
__device__ __forceinline__ unsigned warp_reduce_u32(unsigned v) {
#if defined(QW_CUDA) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    return MAX ? __reduce_max_sync(0xffffffffu, v) : __reduce_min_sync(0xffffffffu, v);
#else
    for (int m = WARP / 2; m > 0; m >>= 1) {
        const unsigned o = SHFL_XOR(v, m);
        v = MAX ? max(v, o) : min(v, o);
    }
    return v;
#endif
}

// A router logit as a key that orders like the float: 0 for what is never
// chosen (NaN, -inf), and -0 as +0 (the floats compare equal).
__device__ __forceinline__ unsigned route_key(float v) {
    if (!(v > -INFINITY)) return 0u;
    const unsigned b = __float_as_uint(v == 0.f ? 0.f : v);
    return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}
__device__ __forceinline__ float route_logit(unsigned key) {
    return __uint_as_float((key & 0x80000000u) ? (key ^ 0x80000000u) : ~key);
}

// The chosen logits sw[0, k) (largest first) become their renormalised
// softmax weights, by lane 0 once the warp has written them.
__device__ __forceinline__ void route_weights(float* sw, int k) {
    QW_SYNCWARP();
    if (threadIdx.x % WARP == 0) {
        float top = sw[0], total = 0.f;
        for (int j = 0; j < k; j++) {
            sw[j] = expf(sw[j] - top);
            total += sw[j];
        }
        for (int j = 0; j < k; j++) sw[j] /= total;
    }
}

// Top-k of the router logits (ties to the lower index) and the renormalised
// softmax weights over the chosen experts (p_e / sum of the chosen p), by one
// warp, into shared memory. Recomputed by every block of both expert kernels
// instead of a separate launch. Lane l holds experts [l P, l P + P) (P = E /
// 32 rounded up) as keys in shared memory and its best one in registers; a
// round takes the warp's largest key (the lowest lane holding it: the lowest
// expert among equal logits) and only the lane it came from rescans its P
// keys. Two warp reductions a round (redux.sync on CUDA) instead of a
// 32-logit scan and five dependent shuffle exchanges (1.1% faster decode at
// 512 and 8K on the H200, benchmarks/history/experiment-h200-router-redux-206148e.json).
// The logits are read
// through L2 only (the down kernel reads them before its grid dependency
// wait; L2 is coherent, an SM's L1 may hold the last layer's).
__device__ void router_topk_warp(const float* __restrict__ logits, int E, int k, int* sidx, float* sw) {
    __shared__ unsigned keys[MOE_MAXE];
    const int lane = threadIdx.x % WARP, P = (E + WARP - 1) / WARP, e0 = lane * P;
    unsigned best = 0u;
    int be = 0;
    for (int m = 0; m < P; m++) {
        const int e = e0 + m;
        const unsigned key = e < E ? route_key(QW_LDCG(logits + e)) : 0u;
        keys[e] = key;  // only this lane reads it back
        if (key > best) {
            best = key;
            be = e;
        }
    }
    for (int j = 0; j < k; j++) {
        const unsigned top = warp_reduce_u32<true>(best);
        const unsigned from = warp_reduce_u32<false>(best == top ? (unsigned)lane : (unsigned)WARP);
        if (lane == (int)from) {
            // Nothing selectable (every remaining logit NaN or -inf: a broken
            // hidden state): expert 0 with weight 0, or NaN when all are, so
            // the expert kernels never index past the experts.
            sidx[j] = top ? be : 0;
            sw[j] = top ? route_logit(top) : -INFINITY;
            if (top) {
                keys[be] = 0u;
                best = 0u;
                for (int m = 0; m < P; m++) {
                    const unsigned key = keys[e0 + m];
                    if (key > best) {
                        best = key;
                        be = e0 + m;
                    }
                }
            }
        }
    }
    route_weights(sw, k);
}

// Routed experts, gate/up half: act[j, i] = silu(Wg[e_j][i] . n) * (Wu[e_j][i] . n),
// n = rmsnorm(x) * nw computed in the prologue from the partial sums of squares,
// for the k chosen experts e_j. grid (ceil(I / (DEC_WARPS * pairs)), k): warp
// w of block b owns columns i = (b * DEC_WARPS + w) * pairs + p, p < pairs, of
// expert slot j = blockIdx.y (gate row i and up row I + i in flight together,
// one pair after another), so that with pairs = 2 the 35B model's 256 blocks
// are resident at once (two blocks per SM at this kernel's registers) instead
// of running in two waves, each repeating the routing and the norm. Router
// logits are the first E entries of `inp`.
QW_KERNEL void QW_BOUNDS(256) dec_moe_gate_up(const bf16_t* __restrict__ Wgu, const float* __restrict__ x,
                                             const float* __restrict__ ssq, int nssq, const float* __restrict__ nw,
                                             float eps, const float* __restrict__ inp, int E, int k,
                                             float* __restrict__ act, int I, int H, int pairs) {
    QW_DYN_SMEM(float, xs);  // [H]
    __shared__ int sidx[MOE_MAXK];
    __shared__ float sw[MOE_MAXK];
    QW_GRID_WAIT();
    QW_GRID_LAUNCH();
    int lane = threadIdx.x % WARP, w = threadIdx.x / WARP;
    if (w == 0) {
        router_topk_warp(inp, E, k, sidx, sw);
    } else {
        // The post-attention norm of the hidden state, into shared memory.
        float inv = inv_rms(ssq, nssq, H, eps);
        for (int i = threadIdx.x - WARP; i < H; i += blockDim.x - WARP) xs[i] = x[i] * inv * nw[i];
    }
    __syncthreads();
    int j = blockIdx.y;
    for (int p = 0; p < pairs; p++) {
        const int i = (blockIdx.x * DEC_WARPS + w) * pairs + p;
        if (i >= I) return;
        const bf16_t* gr = Wgu + ((size_t)sidx[j] * 2 * I + i) * H;
        const bf16_t* ur = gr + (size_t)I * H;
        float gv = 0.f, uv = 0.f;
        if ((H & 7) == 0) {
            int n8 = H >> 3;
            for (int base = 0; base < n8; base += CH * WARP) {
                uint4 a[CH], b[CH];
                load_chunk(gr, 0, 1, H, base, lane, a);
                load_chunk(ur, 0, 1, H, base, lane, b);
#pragma unroll
                for (int u = 0; u < CH; u++) {
                    int c = base + lane + u * WARP;
                    if (c < n8) {
                        gv += dot8(a[u], xs + 8 * c);
                        uv += dot8(b[u], xs + 8 * c);
                    }
                }
            }
            gv = warp_sum(gv);
            uv = warp_sum(uv);
        } else {
            gv = row_dot(gr, xs, H, lane);
            uv = row_dot(ur, xs, H, lane);
        }
        if (lane == 0) act[(size_t)j * I + i] = silu_f(gv) * uv;
    }
}

// Chunk `base` (16-byte units) of down row r's virtual row: the k routed
// experts' rows (I columns each) then the shared expert's (S), zeros past it.
__device__ __forceinline__ void down_chunk(const bf16_t* __restrict__ Wd, const bf16_t* __restrict__ Wsd,
                                           const int* sidx, int k, int I, int S, int H, int r, int base, int lane,
                                           uint4 (&v)[CH]) {
    int n8I = I >> 3, nR = k * n8I, nv = nR + (S >> 3);
#pragma unroll
    for (int u = 0; u < CH; u++) {
        int c = base + lane + u * WARP;
        if (r < H && c < nv) {
            const uint4* p;
            if (c < nR) {
                int j = c / n8I;
                p = (const uint4*)(Wd + ((size_t)sidx[j] * H + r) * I) + (c - j * n8I);
            } else {
                p = (const uint4*)(Wsd + (size_t)r * S) + (c - nR);
            }
            v[u] = ld_stream(p);
        } else {
            v[u] = make_uint4(0u, 0u, 0u, 0u);
        }
    }
}

// Routed experts, down half, plus the gated shared expert and the residual:
// y[r] += sum_j w_j Wd[e_j][r, :] . act[j, :]
//       + sigmoid(inp[E]) * Wsd[r, :] . (silu(inp[E+1 : E+1+S]) * inp[E+1+S : E+1+2S]).
// grid ceil(H / DEC_WARPS); shared memory: act (k * I) then the shared act (S).
// Each warp streams its row's k + 1 segments as one virtual row of
// k * I + S columns (next chunk in flight while the current one is used).
// The router logits come from the kernel before the gate/up kernel, complete
// once this kernel may start (PDL): the routing and the first chunk of
// weights are fetched before the wait for `act`.
QW_KERNEL void QW_BOUNDS(256) dec_moe_down(const bf16_t* __restrict__ Wd, const bf16_t* __restrict__ Wsd,
                                          const float* __restrict__ act, const float* __restrict__ inp,
                                          int E, int k, int I, int S, float* __restrict__ y, int H,
                                          float* __restrict__ ssq_out) {
    QW_DYN_SMEM(float, xs);
    __shared__ int sidx[MOE_MAXK];
    __shared__ float sw[MOE_MAXK];
    float* as = xs + (size_t)k * I;
    if (threadIdx.x < WARP) router_topk_warp(inp, E, k, sidx, sw);
    __syncthreads();
    int lane = threadIdx.x % WARP, w = threadIdx.x / WARP;
    int first = blockIdx.x * DEC_WARPS + w, stride = gridDim.x * DEC_WARPS;
    int n8I = I >> 3, nR = k * n8I, nv = nR + (S >> 3);
    bool vec = !((I & 7) || (S & 7));
    auto load = [&](int r, int base, uint4 (&v)[CH]) { down_chunk(Wd, Wsd, sidx, k, I, S, H, r, base, lane, v); };
    uint4 v[CH];
    if (vec) load(first, 0, v);
    QW_GRID_WAIT();
    QW_GRID_LAUNCH();
#pragma unroll 8
    for (int i = threadIdx.x; i < k * I; i += blockDim.x) xs[i] = act[i];
#pragma unroll 2
    for (int i = threadIdx.x; i < S; i += blockDim.x) as[i] = silu_f(inp[E + 1 + i]) * inp[E + 1 + S + i];
    __syncthreads();
    float sg = sigmoid_f(inp[E]);
    float mine = 0.f;
    if (!vec) {
        for (int r = first; r < H; r += stride) {
            float total = 0.f;
            for (int j = 0; j < k; j++)
                total += sw[j] * row_dot(Wd + ((size_t)sidx[j] * H + r) * I, xs + (size_t)j * I, I, lane);
            if (S > 0) total += sg * row_dot(Wsd + (size_t)r * S, as, S, lane);
            if (lane == 0) {
                float o = y[r] + total;
                y[r] = o;
                mine += o * o;
            }
        }
        write_ssq(mine, ssq_out);
        return;
    }
    for (int r = first; r < H; r += stride) {
        float acc = 0.f;
        for (int base = 0; base < nv; base += CH * WARP) {
            uint4 nx[CH];
            int nb = base + CH * WARP, nr = r;
            if (nb >= nv) {
                nb = 0;
                nr = r + stride;
            }
            load(nr, nb, nx);
#pragma unroll
            for (int u = 0; u < CH; u++) {
                int c = base + lane + u * WARP;
                if (c < nR) {
                    int j = c / n8I;
                    acc += sw[j] * dot8(v[u], xs + (size_t)j * I + 8 * (c - j * n8I));
                } else if (c < nv) {
                    acc += sg * dot8(v[u], as + 8 * (c - nR));
                }
            }
#pragma unroll
            for (int u = 0; u < CH; u++) v[u] = nx[u];
        }
        acc = warp_sum(acc);
        if (lane == 0) {
            float o = y[r] + acc;
            y[r] = o;
            mine += o * o;
        }
    }
    write_ssq(mine, ssq_out);
}

// dec_moe_down with the virtual row (I, S multiples of 8) split between
// P = blockDim.x / 256 warps, `span` 16-byte columns each (a multiple of 32,
// at most DOWN_SPAN), all loaded before the grid wait (the routing too, as
// above), so after the wait only `act` and the dots remain. Block = 8 rows
// (same ssq_out partials); a row's P partial dots meet in shared memory.
#define DOWN_SPAN 9  // 16-byte loads per lane (the 35B model: 2 x 9 x 32 = its 576)
// The body: `load(u, r, c, in, nR, n8I)` loads chunk c of row r (zeros
// where `in` is false; the routed slot c / n8I of a chunk c < nR, else the
// shared expert's chunk c - nR) into this lane's registers u, before the
// grid wait; `w8(u)` gives their 8 weights as bf16 values.
template <typename Load, typename W8>
__device__ __forceinline__ void moe_down_rows(Load load, W8 w8, const float* __restrict__ act,
                                              const float* __restrict__ inp, const int* sidx, const float* sw,
                                              int E, int k, int I, int S, float* __restrict__ y, int H,
                                              float* __restrict__ ssq_out, int span) {
    QW_DYN_SMEM(float, dxs);
    float* xs = dxs;
    float* as = xs + (size_t)k * I;
    const int P = blockDim.x / (DEC_WARPS * WARP);
    const int w = threadIdx.x / WARP, lane = threadIdx.x % WARP;
    const int r = blockIdx.x * DEC_WARPS + w / P, p = w % P;
    const int n8I = I >> 3, nR = k * n8I, nv = nR + (S >> 3);
    const int c0 = p * span, c1 = min(nv, c0 + span);
#pragma unroll
    for (int u = 0; u < DOWN_SPAN; u++) {
        int c = c0 + lane + u * WARP;
        load(u, r, c, r < H && c < c1, nR, n8I);
    }
    QW_GRID_WAIT();
    QW_GRID_LAUNCH();
    for (int i = threadIdx.x; i < k * I; i += blockDim.x) xs[i] = act[i];
    for (int i = threadIdx.x; i < S; i += blockDim.x) as[i] = silu_f(inp[E + 1 + i]) * inp[E + 1 + S + i];
    __syncthreads();
    const float sg = sigmoid_f(inp[E]);
    float acc = 0.f;
#pragma unroll
    for (int u = 0; u < DOWN_SPAN; u++) {
        int c = c0 + lane + u * WARP;
        if (c < min(nR, c1)) {
            int j = c / n8I;
            acc += sw[j] * dot8(w8(u), xs + (size_t)j * I + 8 * (c - j * n8I));
        } else if (c < c1) {
            acc += sg * dot8(w8(u), as + 8 * (c - nR));
        }
    }
    write_ssq(rows_epilogue(acc, r, H, P, true, y), ssq_out);
}

QW_KERNEL void QW_BOUNDS_MIN(512, 2) dec_moe_down_rows(const bf16_t* __restrict__ Wd, const bf16_t* __restrict__ Wsd,
                                               const float* __restrict__ act, const float* __restrict__ inp,
                                               int E, int k, int I, int S, float* __restrict__ y, int H,
                                               float* __restrict__ ssq_out, int span) {
    __shared__ int sidx[MOE_MAXK];
    __shared__ float sw[MOE_MAXK];
    if (threadIdx.x < WARP) router_topk_warp(inp, E, k, sidx, sw);
    __syncthreads();
    uint4 v[DOWN_SPAN];
    auto load = [&](int u, int r, int c, bool in, int nR, int n8I) {
        v[u] = make_uint4(0u, 0u, 0u, 0u);
        if (in) {
            int j = c / n8I;
            v[u] = ld_stream(c < nR ? (const uint4*)(Wd + ((size_t)sidx[j] * H + r) * I) + (c - j * n8I)
                                    : (const uint4*)(Wsd + (size_t)r * S) + (c - nR));
        }
    };
    moe_down_rows(load, [&](int u) { return v[u]; }, act, inp, sidx, sw, E, k, I, S, y, H, ssq_out, span);
}

// dec_moe_down_rows on block-FP8 routed (Qd [E * H, I]) and shared (Qs [H,
// S]) down weights, I and S multiples of 128: each chunk's 8 E4M3 bytes and
// its block's scale loaded before the grid wait (half the bytes in flight),
// widened to the bf16 values of the dequantized matrices, so the outputs
// equal dec_moe_down_rows' on them, bit for bit.
QW_KERNEL void QW_BOUNDS_MIN(512, 2)
    dec_moe_down_rows_fp8(const unsigned char* __restrict__ Qd, const float* __restrict__ Sd,
                          const unsigned char* __restrict__ Qs, const float* __restrict__ Ss,
                          const float* __restrict__ act, const float* __restrict__ inp, int E, int k, int I, int S,
                          float* __restrict__ y, int H, float* __restrict__ ssq_out, int span) {
    __shared__ int sidx[MOE_MAXK];
    __shared__ float sw[MOE_MAXK];
    if (threadIdx.x < WARP) router_topk_warp(inp, E, k, sidx, sw);
    __syncthreads();
    uint2 q[DOWN_SPAN];
    float sc[DOWN_SPAN];
    auto load = [&](int u, int r, int c, bool in, int nR, int n8I) {
        q[u] = make_uint2(0u, 0u);
        sc[u] = 0.f;
        if (in && c < nR) {
            const int j = c / n8I;
            const size_t row = (size_t)sidx[j] * H + r;
            const int g = c - j * n8I;
            q[u] = ld_stream8((const uint2*)(Qd + row * I) + g);
            sc[u] = Sd[(row >> 7) * (size_t)(I >> 7) + (g >> 4)];
        } else if (in) {
            const int g = c - nR;
            q[u] = ld_stream8((const uint2*)(Qs + (size_t)r * S) + g);
            sc[u] = Ss[(size_t)(r >> 7) * (S >> 7) + (g >> 4)];
        }
    };
    moe_down_rows(load, [&](int u) { return fp8x8_bf16(q[u], sc[u]); }, act, inp, sidx, sw, E, k, I, S, y, H,
                  ssq_out, span);
}

// ---- Block-FP8 weights (decode_stream.h): dec_moe_gate_up and dec_moe_down
// (vectorised path) reading E4M3 bytes and block scales. Each weight is
// widened to the exact bf16 value the dequantize-at-upload path would hold
// and then used in the same f32 arithmetic, in the same order, as the bf16
// kernel: the results equal that kernel's on the dequantized matrices.

// dec_moe_gate_up on block-FP8 experts (Q [E * 2I, H], S [E * 2I / 128, H / 128]).
QW_KERNEL void QW_BOUNDS(256) dec_moe_gate_up_fp8(const unsigned char* __restrict__ Q, const float* __restrict__ S,
                                                 const float* __restrict__ x, const float* __restrict__ ssq,
                                                 int nssq, const float* __restrict__ nw, float eps,
                                                 const float* __restrict__ inp, int E, int k,
                                                 float* __restrict__ act, int I, int H, int pairs) {
    QW_DYN_SMEM(float, xs);  // [H]
    __shared__ int sidx[MOE_MAXK];
    __shared__ float sw[MOE_MAXK];
    QW_GRID_WAIT();
    QW_GRID_LAUNCH();
    int lane = threadIdx.x % WARP, w = threadIdx.x / WARP;
    if (w == 0) {
        router_topk_warp(inp, E, k, sidx, sw);
    } else {
        float inv = inv_rms(ssq, nssq, H, eps);
        for (int i = threadIdx.x - WARP; i < H; i += blockDim.x - WARP) xs[i] = x[i] * inv * nw[i];
    }
    __syncthreads();
    int j = blockIdx.y;
    const int rows = E * 2 * I, n8 = H >> 3;
    for (int p = 0; p < pairs; p++) {
        const int i = (blockIdx.x * DEC_WARPS + w) * pairs + p;
        if (i >= I) return;
        const int gr = sidx[j] * 2 * I + i, ur = gr + I;
        float gv = 0.f, uv = 0.f;
        for (int base = 0; base < n8; base += CH * WARP) {
            Fp8Chunk a, b;
            load_chunk_fp8(Q, S, gr, rows, H, base, lane, a);
            load_chunk_fp8(Q, S, ur, rows, H, base, lane, b);
#pragma unroll
            for (int u = 0; u < CH; u++) {
                int c = base + lane + u * WARP;
                if (c < n8) {
                    gv += dot8(fp8x8_bf16(a.q[u], a.s[u]), xs + 8 * c);
                    uv += dot8(fp8x8_bf16(b.q[u], b.s[u]), xs + 8 * c);
                }
            }
        }
        gv = warp_sum(gv);
        uv = warp_sum(uv);
        if (lane == 0) act[(size_t)j * I + i] = silu_f(gv) * uv;
    }
}

// down_chunk for block-FP8 routed (Q [E * H, I]) and shared (Qs [H, S]) down weights.
__device__ __forceinline__ void down_chunk_fp8(const unsigned char* __restrict__ Qd, const float* __restrict__ Sd,
                                               const unsigned char* __restrict__ Qs,
                                               const float* __restrict__ Ss, const int* sidx, int k, int I,
                                               int S, int H, int r, int base, int lane, Fp8Chunk& v) {
    int n8I = I >> 3, nR = k * n8I, nv = nR + (S >> 3);
#pragma unroll
    for (int u = 0; u < CH; u++) {
        int c = base + lane + u * WARP;
        bool in = r < H && c < nv;
        if (in && c < nR) {
            int j = c / n8I;
            fp8_group(Qd, Sd, (size_t)sidx[j] * H + r, I, (I + 127) >> 7, c - j * n8I, true, v, u);
        } else {
            fp8_group(Qs, Ss, in ? r : 0, S, (S + 127) >> 7, c - nR, in, v, u);
        }
    }
}

// dec_moe_down on block-FP8 weights (the vectorised path; I, S multiples of 128).
QW_KERNEL void QW_BOUNDS(256) dec_moe_down_fp8(const unsigned char* __restrict__ Qd, const float* __restrict__ Sd,
                                              const unsigned char* __restrict__ Qs, const float* __restrict__ Ss,
                                              const float* __restrict__ act, const float* __restrict__ inp,
                                              int E, int k, int I, int S, float* __restrict__ y, int H,
                                              float* __restrict__ ssq_out) {
    QW_DYN_SMEM(float, xs);
    __shared__ int sidx[MOE_MAXK];
    __shared__ float sw[MOE_MAXK];
    float* as = xs + (size_t)k * I;
    if (threadIdx.x < WARP) router_topk_warp(inp, E, k, sidx, sw);
    __syncthreads();
    int lane = threadIdx.x % WARP, w = threadIdx.x / WARP;
    int first = blockIdx.x * DEC_WARPS + w, stride = gridDim.x * DEC_WARPS;
    int n8I = I >> 3, nR = k * n8I, nv = nR + (S >> 3);
    Fp8Chunk v;
    down_chunk_fp8(Qd, Sd, Qs, Ss, sidx, k, I, S, H, first, 0, lane, v);
    QW_GRID_WAIT();
    QW_GRID_LAUNCH();
    for (int i = threadIdx.x; i < k * I; i += blockDim.x) xs[i] = act[i];
    for (int i = threadIdx.x; i < S; i += blockDim.x) as[i] = silu_f(inp[E + 1 + i]) * inp[E + 1 + S + i];
    __syncthreads();
    float sg = sigmoid_f(inp[E]);
    float mine = 0.f;
    for (int r = first; r < H; r += stride) {
        float acc = 0.f;
        for (int base = 0; base < nv; base += CH * WARP) {
            Fp8Chunk nx;
            int nb = base + CH * WARP, nr = r;
            if (nb >= nv) {
                nb = 0;
                nr = r + stride;
            }
            down_chunk_fp8(Qd, Sd, Qs, Ss, sidx, k, I, S, H, nr, nb, lane, nx);
#pragma unroll
            for (int u = 0; u < CH; u++) {
                int c = base + lane + u * WARP;
                if (c < nR) {
                    int j = c / n8I;
                    acc += sw[j] * dot8(fp8x8_bf16(v.q[u], v.s[u]), xs + (size_t)j * I + 8 * (c - j * n8I));
                } else if (c < nv) {
                    acc += sg * dot8(fp8x8_bf16(v.q[u], v.s[u]), as + 8 * (c - nR));
                }
            }
            v = nx;
        }
        acc = warp_sum(acc);
        if (lane == 0) {
            float o = y[r] + acc;
            y[r] = o;
            mine += o * o;
        }
    }
    write_ssq(mine, ssq_out);
}
