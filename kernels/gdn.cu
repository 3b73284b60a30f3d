// Gated DeltaNet: causal depthwise conv + SiLU, q/k L2 norm, gates, the
// delta-rule recurrence (f32 state) and the gated output RMSNorm.
#include "compat.h"

// x[t, ch] (row stride x_stride, first C channels) <- silu(sum_j w[ch][j] * seq[t + j]),
// seq = state[ch] (K-1 previous raw inputs, oldest first) ++ x[:, ch]. Updates the state.
QW_KERNEL void conv_silu(float* __restrict__ x, int x_stride, float* __restrict__ state,
                         const float* __restrict__ w, int T, int C, int K) {
    int ch = blockIdx.x * blockDim.x + threadIdx.x;
    if (ch >= C) return;
    float hist[8];
    float wk[8];
    int H = K - 1;
    for (int j = 0; j < K && j < 8; j++) wk[j] = w[ch * K + j];
    for (int j = 0; j < H && j < 8; j++) hist[j] = state[ch * H + j];
    for (int t = 0; t < T; t++) {
        float* p = x + (size_t)t * x_stride + ch;
        float cur = *p;
        float acc = wk[H] * cur;
        for (int j = 0; j < H; j++) acc += wk[j] * hist[j];
        for (int j = 0; j + 1 < H; j++) hist[j] = hist[j + 1];
        if (H > 0) hist[H - 1] = cur;
        *p = silu_f(acc);
    }
    for (int j = 0; j < H; j++) state[ch * H + j] = hist[j];
}

// Prefill form of conv_silu, parallel over (token, channel): out[t, ch] (row stride C)
// = silu(w[ch][K-1] x[t] + sum_{j<K-1} w[ch][j] seq[t + j]) with seq = state[ch] ++ x[:, ch],
// the same arithmetic in the same order as conv_silu. Each thread takes CONV_TPT
// consecutive tokens of one channel with its weights and the window of the last
// K-1 inputs in registers, so every input is read once per thread, not K times.
// Reads x and the old state only; conv_state_update must run after it.
// grid (ceil(C / 256), ceil(T / CONV_TPT)), block 256; 1 <= K <= CONV_MAXK.
#define CONV_TPT 16
#define CONV_MAXK 8  // conv_silu's limit too (the host checks)
QW_KERNEL void QW_BOUNDS(256) conv_silu_tokens(const float* __restrict__ x, int x_stride,
                                               const float* __restrict__ state, const float* __restrict__ w,
                                               float* __restrict__ out, int T, int C, int K) {
    const int ch = blockIdx.x * blockDim.x + threadIdx.x;
    const int t0 = blockIdx.y * CONV_TPT;
    if (ch >= C || t0 >= T) return;
    const int H = K - 1;
    float wk[CONV_MAXK], win[CONV_MAXK - 1];
#pragma unroll
    for (int j = 0; j < CONV_MAXK; j++) wk[j] = j < K ? w[(size_t)ch * K + j] : 0.f;
    // win[j] = seq[t0 + j]: seq[s] = state[s] for s < H, else x[s - H].
#pragma unroll
    for (int j = 0; j < CONV_MAXK - 1; j++) {
        const int s = t0 + j;
        win[j] = j >= H ? 0.f : s < H ? state[(size_t)ch * H + s] : x[(size_t)(s - H) * x_stride + ch];
    }
    float xs[CONV_TPT];  // the thread's inputs, all requested before the first is used
#pragma unroll
    for (int u = 0; u < CONV_TPT; u++) xs[u] = t0 + u < T ? x[(size_t)(t0 + u) * x_stride + ch] : 0.f;
#pragma unroll
    for (int u = 0; u < CONV_TPT; u++) {
        const int t = t0 + u;
        if (t >= T) break;
        const float cur = xs[u];
        float acc = 0.f;
#pragma unroll
        for (int j = 0; j < CONV_MAXK; j++)
            if (j == H) acc = wk[j] * cur;  // wk[H] * x[t] first, then the window in order
#pragma unroll
        for (int j = 0; j < CONV_MAXK - 1; j++)
            if (j < H) acc += wk[j] * win[j];
        out[(size_t)t * C + ch] = silu_f(acc);
        // Slide: seq[t + 1 .. t + H] = win[1..H-1] ++ x[t].
#pragma unroll
        for (int j = 0; j < CONV_MAXK - 1; j++)
            if (j < H) win[j] = j + 1 < H ? win[j + 1] : cur;
    }
}

// After conv_silu_tokens: state[ch] <- the last K-1 entries of state[ch] ++ x[:T, ch]
// (raw inputs). Ascending j reads state[T + j] before any write to it. grid ceil(C / 256).
QW_KERNEL void QW_BOUNDS(256) conv_state_update(const float* __restrict__ x, int x_stride,
                                                float* __restrict__ state, int T, int C, int K) {
    int ch = blockIdx.x * blockDim.x + threadIdx.x;
    if (ch >= C) return;
    int H = K - 1;
    float* st = state + (size_t)ch * H;
    for (int j = 0; j < H; j++) {
        int s = T + j;  // seq index of the new state's entry j
        st[j] = s < H ? st[s] : x[(size_t)(s - H) * x_stride + ch];
    }
}

// In place: each `dim`-wide head at base + t*stride + head*dim (T*nh rows) becomes
// x * rsqrt(sum(x^2) + eps) * scale. One warp per row.
QW_KERNEL void l2norm_heads(float* __restrict__ base, int T, int nh, int dim, int stride, float scale, float eps) {
    int row = blockIdx.x * (blockDim.x / WARP) + threadIdx.x / WARP;
    if (row >= T * nh) return;
    int t = row / nh, h = row % nh;
    float* p = base + (size_t)t * stride + (size_t)h * dim;
    int lane = threadIdx.x % WARP;
    float ss = 0.f;
    for (int i = lane; i < dim; i += WARP) ss += p[i] * p[i];
    ss = warp_sum(ss);
    float inv = rsqrtf(ss + eps) * scale;
    for (int i = lane; i < dim; i += WARP) p[i] *= inv;
}

// beta = sigmoid(b), g = -exp(A_log) * softplus(a + dt_bias), per (t, value head).
QW_KERNEL void gdn_gates(const float* __restrict__ proj, int stride, int a_off, int b_off,
                         const float* __restrict__ a_log, const float* __restrict__ dt_bias,
                         float* __restrict__ g, float* __restrict__ beta, int T, int nv) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= T * nv) return;
    int t = i / nv, h = i % nv;
    const float* row = proj + (size_t)t * stride;
    beta[i] = sigmoid_f(row[b_off + h]);
    g[i] = -expf(a_log[h]) * softplus_f(row[a_off + h] + dt_bias[h]);
}

// The token-serial delta rule for T tokens. Block (32, 8) owns 32 value columns
// of one value head's state S [dk][dv] (kept in shared memory for the whole pass);
// grid (nv, ceil(dv / 32)). Per token: S *= e^g; delta = beta (v - S^T k);
// S += k delta^T; o = S^T q.  q/k/v are read from the conv output rows (q, k per
// key head; key head = value head / (nv / nk)).
QW_KERNEL void QW_BOUNDS(256) gdn_recurrent(const float* __restrict__ qkv, int stride, int nk, int nv,
                                            int dk, int dv, const float* __restrict__ g,
                                            const float* __restrict__ beta, float* __restrict__ S,
                                            float* __restrict__ out, int T) {
    QW_DYN_SMEM(float, smem);
    float* Ss = smem;               // [dk][32]
    float* qs = Ss + dk * 32;       // [dk]
    float* ks = qs + dk;            // [dk]
    float* red = ks + dk;           // [8][32]
    int hv = blockIdx.x;
    int tx = threadIdx.x, ty = threadIdx.y;
    int tid = ty * 32 + tx;
    int c = blockIdx.y * 32 + tx;
    bool valid = c < dv;
    int hk = hv / (nv / nk);
    int key_dim = nk * dk;
    float* Sh = S + (size_t)hv * dk * dv;
    for (int i = ty; i < dk; i += 8) Ss[i * 32 + tx] = valid ? Sh[(size_t)i * dv + c] : 0.f;
    for (int t = 0; t < T; t++) {
        const float* row = qkv + (size_t)t * stride;
        for (int i = tid; i < dk; i += 256) {
            qs[i] = row[hk * dk + i];
            ks[i] = row[key_dim + hk * dk + i];
        }
        __syncthreads();
        float decay = expf(g[t * nv + hv]);
        float b = beta[t * nv + hv];
        float p = 0.f;
        for (int i = ty; i < dk; i += 8) p += ks[i] * Ss[i * 32 + tx];
        red[ty * 32 + tx] = p;
        __syncthreads();
        float kv = 0.f;
        for (int j = 0; j < 8; j++) kv += red[j * 32 + tx];
        kv *= decay;
        float v = valid ? row[2 * key_dim + hv * dv + c] : 0.f;
        float delta = b * (v - kv);
        __syncthreads();
        float o = 0.f;
        for (int i = ty; i < dk; i += 8) {
            float s = Ss[i * 32 + tx] * decay + ks[i] * delta;
            Ss[i * 32 + tx] = s;
            o += qs[i] * s;
        }
        red[ty * 32 + tx] = o;
        __syncthreads();
        if (ty == 0 && valid) {
            float acc = 0.f;
            for (int j = 0; j < 8; j++) acc += red[j * 32 + tx];
            out[((size_t)t * nv + hv) * dv + c] = acc;
        }
        __syncthreads();
    }
    if (valid)
        for (int i = ty; i < dk; i += 8) Sh[(size_t)i * dv + c] = Ss[i * 32 + tx];
}

// out[t, h, :] = rmsnorm(o[t, h, :]) * w * silu(z[t, h, :]); one warp per (t, h).
QW_KERNEL void gated_rmsnorm(const float* __restrict__ o, const float* __restrict__ z, int z_stride,
                             const float* __restrict__ w, float* __restrict__ out, int T, int nv, int dv, float eps) {
    int row = blockIdx.x * (blockDim.x / WARP) + threadIdx.x / WARP;
    if (row >= T * nv) return;
    int t = row / nv, h = row % nv;
    const float* p = o + (size_t)row * dv;
    const float* zp = z + (size_t)t * z_stride + (size_t)h * dv;
    int lane = threadIdx.x % WARP;
    float ss = 0.f;
    for (int i = lane; i < dv; i += WARP) ss += p[i] * p[i];
    ss = warp_sum(ss);
    float inv = rsqrtf(ss / dv + eps);
    for (int i = lane; i < dv; i += WARP) out[(size_t)row * dv + i] = p[i] * inv * w[i] * silu_f(zp[i]);
}
