// Block-FP8 weights on the CPU (QW_CPU). fp8_dequant (kernels/fp8.cu) against
// an independent restatement of host/engine/src/fp8.rs (the E4M3 value from
// its fields in double, one f32 product with the scale, bf16 round to nearest
// even, NaN as 0x7fc0), bit for bit: all 256 codes times scales that make
// normals, subnormals, ties and overflow; the block-scale indexing of a
// two-slab matrix with partial column blocks; only the routed slabs written,
// at their own places or packed.
// The native FP8 decode kernels (kernels/decode.cu: dec_gemv_fp8,
// dec_norm_gemv_fp8; kernels/decode_moe.cu: dec_moe_gate_up_fp8,
// dec_moe_down_fp8, dec_moe_down_rows_fp8), the bulk-copy ring GEMVs
// (kernels/gemv_bulk.cu: dec_gemv_bulk1_fp8, dec_gemv_bulk2_fp8, and
// dec_gemv_bulk_conv_fp8 with its bf16 tail rows) and the few-row ring
// projections (kernels/gemm_rows.cu: gemm_rows_bulk_fp8,
// gemm_rows_bulk16_fp8, gemm_rows_bulk32_fp8) against the bf16 kernels on the dequantized
// weights: bit-identical outputs (same values, same f32 order; the tail
// rows within rounding); the synthetic weights' encoder. Exit 1 on a
// mismatch. fp8_quant_rows (the FP8 prompt GEMMs' activations, also gathered
// through a row index) against the nearest code found by search, its scales
// exactly.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>
#include "decode.cu"
#include "decode_moe.cu"
#include "fp8.cu"
#include "gemm_rows.cu"
#include "gemv_bulk.cu"

static int failures = 0;

static void fail(const char* what, size_t i, double got, double want) {
    if (failures++ < 20) std::printf("FAIL %s [%zu]: %.9g vs %.9g\n", what, i, got, want);
}

// fp8.rs restated: value of the byte, times the scale in f32, to bf16 (RNE).
static unsigned short ref_bf16(unsigned char b, float s) {
    const int e = (b >> 3) & 15, m = b & 7;
    if (e == 15 && m == 7) return 0x7fc0;
    double v = e == 0 ? std::ldexp((double)m / 8.0, -6) : std::ldexp(1.0 + m / 8.0, e - 7);
    if (b & 0x80) v = -v;
    const float p = (float)v * s;
    if (std::isnan(p)) return 0x7fc0;
    unsigned u;
    std::memcpy(&u, &p, 4);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (unsigned short)(u >> 16);
}

// Quantized [slabs * rows, cols] weights with scales [slabs * rows / 128, ceil(cols / 128)].
struct Q8 {
    int rows, cols;
    std::vector<unsigned char> q;
    std::vector<float> s;
    int cb() const { return (cols + 127) / 128; }
    std::vector<bf16_t> bf16() const {
        std::vector<bf16_t> out(q.size());
        for (size_t g = 0; g < q.size(); g++)
            out[g] = ref_bf16(q[g], s[(g / cols / 128) * cb() + (g % cols) / 128]);
        return out;
    }
};

static Q8 random_q8(int rows, int cols, std::mt19937& rng) {
    Q8 m{rows, cols, std::vector<unsigned char>((size_t)rows * cols), {}};
    std::uniform_int_distribution<int> byte(0, 255);
    for (auto& b : m.q) {
        do b = (unsigned char)byte(rng);
        while ((b & 0x7f) == 0x7f);  // no NaN weights in the GEMV checks
    }
    std::uniform_real_distribution<float> sc(1e-3f, 4e-3f);
    m.s.resize((size_t)(rows / 128) * m.cb());
    for (auto& v : m.s) v = sc(rng);
    return m;
}


// The value of a non-negative E4M3 code, from its fields in double.
static double ref_value(int c) {
    const int e = (c >> 3) & 15, m = c & 7;
    return e == 0 ? std::ldexp((double)m / 8.0, -6) : std::ldexp(1.0 + m / 8.0, e - 7);
}

// The E4M3 byte nearest to v by search over every finite code's value (ties
// to the even code, past 448 to 448): independent of f32_e4m3_rn's arithmetic.
static unsigned char nearest_e4m3(float v) {
    const double a = std::fabs((double)v);
    int best = 0;
    for (int c = 1; c < 0x7f; c++) {
        const double d = std::fabs(ref_value(c) - a), db = std::fabs(ref_value(best) - a);
        if (d < db || (d == db && (c & 1) == 0)) best = c;
    }
    return (unsigned char)(best | (std::signbit(v) ? 0x80 : 0));
}

// fp8_quant_rows: per row and 128 columns, scale = amax / 448 (a zero group a
// tiny one), bytes the nearest codes of x / scale; scales column-group-major.
static void quant_rows(int t, int t_pad, int cols, std::mt19937& rng, bool gather = false) {
    std::vector<float> x((size_t)t * cols);
    std::normal_distribution<float> nd(0.f, 1.f);
    std::uniform_int_distribution<int> pick(0, 9);
    for (size_t g = 0; g < x.size(); g++) {
        const int p = pick(rng);
        // Mixed magnitudes so groups hold subnormal codes, exact 448s and ties.
        x[g] = p == 0 ? 0.f : p == 1 ? nd(rng) * 1e-4f : p == 2 ? std::ldexp(1.f + 0.0625f * (g % 16), (int)(g % 7) - 3)
                                                                 : nd(rng) * 3.f;
    }
    for (int c = 0; c < 128 && t > 1; c++) x[(size_t)cols + c] = 0.f;  // row 1, group 0: all zeros
    // Row 0, group 0: amax 448 makes the scale exactly 1, so these are ties
    // between two codes (normal and subnormal) and must go to the even one.
    const float ties[] = {448.f, 1.0625f, 1.1875f, -3.375f, 0.0029296875f, 0.0048828125f, 232.f, 0.0146484375f, 0.0166015625f};
    for (int c = 0; c < 9; c++) x[c] = ties[c];
    std::vector<unsigned char> q((size_t)t_pad * cols, 0x55);
    std::vector<float> s((size_t)t_pad * (cols / 128), -1.f);
    const unsigned warps = (unsigned)(t_pad * (cols / 128)), blocks = (warps * 32 + 255) / 256;
    // gather: the rows read through an index from a wider matrix, last first.
    const int stride = gather ? cols + 128 : cols;
    std::vector<float> src(gather ? (size_t)t * stride : 0, NAN);
    std::vector<int> idx(t);
    for (int r = 0; r < t && gather; r++) {
        idx[r] = t - 1 - r;
        std::memcpy(&src[(size_t)idx[r] * stride], &x[(size_t)r * cols], cols * sizeof(float));
    }
    qw_cpu::launch({blocks, 1, 1}, {256, 1, 1}, [&] {
        fp8_quant_rows(gather ? src.data() : x.data(), stride, gather ? idx.data() : nullptr, t, t_pad, cols,
                       q.data(), s.data());
    });
    for (size_t at = (size_t)t * cols; at < q.size(); at++)
        if (q[at] != 0) fail("fp8_quant_rows padding code", at, q[at], 0);
    for (int r = t; r < t_pad; r++)
        for (int g = 0; g < cols / 128; g++)
            if (!(s[(size_t)g * t_pad + r] > 0.f)) fail("fp8_quant_rows padding scale", r, s[(size_t)g * t_pad + r], 1);
    for (int r = 0; r < t; r++)
        for (int g = 0; g < cols / 128; g++) {
            float amax = 0.f;
            for (int c = 0; c < 128; c++) amax = std::fmax(amax, std::fabs(x[(size_t)r * cols + g * 128 + c]));
            const float sc = std::fmax(amax, 1e-30f) / 448.f, got = s[(size_t)g * t_pad + r];
            if (got != sc) fail("fp8_quant_rows scale", (size_t)g * t_pad + r, got, sc);
            for (int c = 0; c < 128; c++) {
                const size_t at = (size_t)r * cols + g * 128 + c;
                const unsigned char want = nearest_e4m3(x[at] / sc);
                if (q[at] != want) fail("fp8_quant_rows code", at, q[at], want);
            }
        }
}

static void dequant_codes() {
    const float scales[] = {1.f, 0.5f, 3.7e-3f, 1234.5f, std::ldexp(1.f, -20), 1e-38f, 3e38f, -2.25f, 0.1f};
    // One 128 x 256 slab per scale; every code in every row (two column blocks).
    for (float sc : scales) {
        Q8 m{128, 256, std::vector<unsigned char>(128 * 256), std::vector<float>(2)};
        for (int r = 0; r < 128; r++)
            for (int c = 0; c < 256; c++) m.q[r * 256 + c] = (unsigned char)((c + r) & 255);
        m.s = {sc, sc * 0.75f};
        std::vector<bf16_t> out(m.q.size(), 0x1234);
        qw_cpu::launch({3, 1, 1}, {256, 1, 1},
                       [&] { fp8_dequant(m.q.data(), m.s.data(), nullptr, 128, 256, 0, out.data()); });
        const auto want = m.bf16();
        for (size_t g = 0; g < out.size(); g++)
            if (out[g] != want[g]) fail("fp8_dequant code", g, out[g], want[g]);
    }
}

static void dequant_slabs(std::mt19937& rng) {
    // 3 slabs of [256, 200] (column blocks 128 + 72), slabs 2 and 0 routed.
    Q8 m = random_q8(3 * 256, 200, rng);
    const int idx[2] = {2, 0};
    std::vector<bf16_t> out(m.q.size(), 0x1234), all(m.q.size()), packed(m.q.size(), 0x1234);
    qw_cpu::launch({4, 2, 1}, {256, 1, 1}, [&] { fp8_dequant(m.q.data(), m.s.data(), idx, 256, 200, 0, out.data()); });
    qw_cpu::launch({5, 3, 1}, {256, 1, 1}, [&] { fp8_dequant(m.q.data(), m.s.data(), nullptr, 256, 200, 0, all.data()); });
    qw_cpu::launch({4, 2, 1}, {256, 1, 1}, [&] { fp8_dequant(m.q.data(), m.s.data(), idx, 256, 200, 1, packed.data()); });
    const auto want = m.bf16();
    const size_t slab = 256 * 200;
    for (size_t g = 0; g < out.size(); g++) {
        const bool routed = g / slab != 1;
        if (out[g] != (routed ? want[g] : 0x1234)) fail("fp8_dequant slabs", g, out[g], want[g]);
        if (all[g] != want[g]) fail("fp8_dequant all", g, all[g], want[g]);
        // Packed: place 0 holds slab 2, place 1 slab 0, place 2 untouched.
        const size_t place = g / slab, from = place < 2 ? (size_t)idx[place] * slab + g % slab : 0;
        if (packed[g] != (place < 2 ? want[from] : 0x1234)) fail("fp8_dequant packed", g, packed[g], want[from]);
    }
}

static std::vector<float> randn(size_t n, std::mt19937& rng, float mean = 0.f, float sd = 1.f) {
    std::normal_distribution<float> nd(mean, sd);
    std::vector<float> v(n);
    for (auto& x : v) x = nd(rng);
    return v;
}

static void same(const char* what, const std::vector<float>& got, const std::vector<float>& want) {
    for (size_t i = 0; i < got.size(); i++)
        if (std::memcmp(&got[i], &want[i], 4) != 0) fail(what, i, got[i], want[i]);
}

static void gemvs(int rows, int cols, std::mt19937& rng) {
    Q8 m = random_q8(rows, cols, rng);
    const auto w = m.bf16();
    const auto x = randn(cols, rng), nw = randn(cols, rng, 1.f, 0.1f), y0 = randn(rows, rng);
    const int blocks = (rows + 7) / 8, nssq = 3;
    std::vector<float> ssq(nssq, 0.f);
    for (int c = 0; c < cols; c++) ssq[c % nssq] += x[c] * x[c];
    // Residual mode, one row per warp.
    std::vector<float> y1 = y0, y2 = y0, s1(blocks), s2(blocks);
    qw_cpu::launch({(unsigned)blocks, 1, 1}, {256, 1, 1},
                   [&] { dec_gemv(w.data(), x.data(), y1.data(), rows, cols, 1, s1.data()); });
    qw_cpu::launch({(unsigned)blocks, 1, 1}, {256, 1, 1},
                   [&] { dec_gemv_fp8(m.q.data(), m.s.data(), x.data(), y2.data(), rows, cols, 1, s2.data()); });
    same("dec_gemv_fp8 y", y2, y1);
    same("dec_gemv_fp8 ssq", s2, s1);
    // Norm mode, warps streaming several rows (a capped grid).
    std::vector<float> n1(rows), n2(rows);
    const unsigned g = (unsigned)std::max(1, blocks / 3);
    qw_cpu::launch({g, 1, 1}, {256, 1, 1}, [&] {
        dec_norm_gemv(w.data(), x.data(), ssq.data(), nssq, nw.data(), 1e-6f, n1.data(), rows, cols);
    });
    qw_cpu::launch({g, 1, 1}, {256, 1, 1}, [&] {
        dec_norm_gemv_fp8(m.q.data(), m.s.data(), x.data(), ssq.data(), nssq, nw.data(), 1e-6f, n2.data(), rows,
                          cols);
    });
    same("dec_norm_gemv_fp8", n2, n1);
}

// The ring GEMVs in both modes, on `grid` blocks of `stages` slots (the FP8
// slots hold half the bytes: the host gives them twice as many).
static void bulk_gemvs(int rows, int cols, unsigned grid, int stages, std::mt19937& rng) {
    Q8 m = random_q8(rows, cols, rng);
    const auto w = m.bf16();
    const auto x = randn(cols, rng), nw = randn(cols, rng, 1.f, 0.1f), y0 = randn(rows, rng);
    const int nssq = 3, nout = (int)grid + 2;
    std::vector<float> ssq(nssq, 0.f);
    for (int c = 0; c < cols; c++) ssq[c % nssq] += x[c] * x[c];
    const bool wide = cols > 2048;
    for (bool norm : {true, false}) {
        std::vector<float> y1 = y0, y2 = y0, s1(nout, -1.f), s2(nout, -1.f);
        const float* in_ssq = norm ? ssq.data() : nullptr;
        const float* nwp = norm ? nw.data() : nullptr;
        const int n_ssq = norm ? nssq : nout;
        qw_cpu::launch({grid, 1, 1}, {256, 1, 1}, [&] {
            (wide ? dec_gemv_bulk2 : dec_gemv_bulk1)(w.data(), x.data(), in_ssq, n_ssq, nwp, 1e-6f, y1.data(), rows,
                                                     cols, 1, norm ? nullptr : s1.data(), stages);
        });
        qw_cpu::launch({grid, 1, 1}, {256, 1, 1}, [&] {
            if (wide)
                dec_gemv_bulk2_fp8(m.q.data(), m.s.data(), x.data(), in_ssq, n_ssq, nwp, 1e-6f, y2.data(), rows, cols,
                                   1, norm ? nullptr : s2.data(), 2 * stages);
            else
                dec_gemv_bulk1_fp8(m.q.data(), m.s.data(), x.data(), in_ssq, n_ssq, nwp, 1e-6f, y2.data(), rows, cols,
                                   1, norm ? nullptr : s2.data(), 2 * stages, nullptr, 0);
        });
        same(norm ? "dec_gemv_bulk_fp8 norm" : "dec_gemv_bulk_fp8 residual", y2, y1);
        same("dec_gemv_bulk_fp8 ssq", s2, s1);
    }
}

// The GDN in projection of an FP8 checkpoint: FP8 rows [0, r8) (qkv | z)
// and `tail` BF16 rows after them (a | b), in one launch, with the conv of
// the first conv_dim rows folded in (dec_gemv_bulk_conv_fp8) or not
// (dec_gemv_bulk1_fp8), against the bf16 kernels on the dequantized stack:
// the FP8 rows, their conv and the conv history bit-identical, the tail
// rows within 1e-5 of their terms' sizes (the same sums, reduced in
// another order).
static void in_proj_tail(int r8, int tail, int cols, unsigned grid, int stages, int conv_dim, int K,
                         std::mt19937& rng) {
    Q8 m = random_q8(r8, cols, rng);
    auto stack = m.bf16();
    std::normal_distribution<float> nd;
    for (int i = 0; i < tail * cols; i++) {
        const float v = nd(rng) * 0.05f;
        unsigned u;
        std::memcpy(&u, &v, 4);
        stack.push_back((bf16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16));
    }
    const bf16_t* tw = stack.data() + (size_t)r8 * cols;
    const int rows = r8 + tail, H = K - 1;
    const auto x = randn(cols, rng), nw = randn(cols, rng, 1.f, 0.1f);
    const auto conv_w = randn((size_t)conv_dim * K, rng, 0.f, 0.5f), hist = randn((size_t)conv_dim * H, rng);
    std::vector<float> ssq(3, 0.f);
    double ss = 0;
    for (int c = 0; c < cols; c++) ssq[c % 3] += x[c] * x[c], ss += (double)x[c] * x[c];
    const double inv = 1.0 / std::sqrt(ss / cols + 1e-6);
    for (bool conv : {true, false}) {
        std::vector<float> y1(rows, NAN), y2(rows, NAN), h1 = hist, h2 = hist;
        qw_cpu::launch({grid, 1, 1}, {256, 1, 1}, [&] {
            if (conv)
                dec_gemv_bulk_conv(stack.data(), x.data(), ssq.data(), 3, nw.data(), 1e-6f, y1.data(), rows, cols, 0,
                                   nullptr, stages, conv_w.data(), h1.data(), K, conv_dim);
            else
                dec_gemv_bulk1(stack.data(), x.data(), ssq.data(), 3, nw.data(), 1e-6f, y1.data(), rows, cols, 0,
                               nullptr, stages);
        });
        qw_cpu::launch({grid, 1, 1}, {256, 1, 1}, [&] {
            if (conv)
                dec_gemv_bulk_conv_fp8(m.q.data(), m.s.data(), x.data(), ssq.data(), 3, nw.data(), 1e-6f, y2.data(),
                                       r8, cols, 0, nullptr, 2 * stages, conv_w.data(), h2.data(), K, conv_dim, tw,
                                       tail);
            else
                dec_gemv_bulk1_fp8(m.q.data(), m.s.data(), x.data(), ssq.data(), 3, nw.data(), 1e-6f, y2.data(), r8,
                                   cols, 0, nullptr, 2 * stages, tw, tail);
        });
        const char* what = conv ? "dec_gemv_bulk_conv_fp8" : "dec_gemv_bulk1_fp8 tail";
        same(what, std::vector<float>(y2.begin(), y2.begin() + r8), std::vector<float>(y1.begin(), y1.begin() + r8));
        same("in_proj conv history", h2, h1);
        for (int r = 0; r < tail; r++) {
            double d = 0, mag = 0;
            for (int c = 0; c < cols; c++) {
                const double p = (double)bf2f(tw[(size_t)r * cols + c]) * x[c] * nw[c];
                d += p, mag += std::fabs(p);
            }
            const double got = y2[r8 + r];
            if (!(std::fabs(got - d * inv) <= 1e-5 * mag * inv)) fail(what, (size_t)(r8 + r), got, d * inv);
        }
    }
}

// The few-row ring projections of B rows (2-8: gemm_rows_bulk, 9-16:
// gemm_rows_bulk16), both with and without accumulation.
static void rows_bulk(int B, int N, int K, unsigned grid, int stages, std::mt19937& rng) {
    Q8 m = random_q8(N, K, rng);
    const auto w = m.bf16();
    const auto x = randn((size_t)B * K, rng), y0 = randn((size_t)B * N, rng);
    const bool wide = B > 8;
    const unsigned threads = (unsigned)(wide ? K / 4 : K / 8);
    for (int acc : {0, 1}) {
        std::vector<float> y1 = y0, y2 = y0;
        qw_cpu::launch({grid, 1, 1}, {threads, 1, 1}, [&] {
            (wide ? gemm_rows_bulk16 : gemm_rows_bulk)(x.data(), w.data(), y1.data(), B, N, K, acc, stages);
        });
        qw_cpu::launch({grid, 1, 1}, {threads, 1, 1}, [&] {
            (wide ? gemm_rows_bulk16_fp8 : gemm_rows_bulk_fp8)(x.data(), m.q.data(), m.s.data(), y2.data(), B, N, K,
                                                               acc, 2 * stages);
        });
        same(wide ? "gemm_rows_bulk16_fp8" : "gemm_rows_bulk_fp8", y2, y1);
    }
}

// gemm_rows_bulk32 (17-32 rows, K in S slices summed by gemm_rows_reduce)
// against its bf16 form.
static void rows_bulk32(int B, int N, int K, int S, unsigned grid, int stages, std::mt19937& rng) {
    Q8 m = random_q8(N, K, rng);
    const auto w = m.bf16();
    const auto x = randn((size_t)B * K, rng), y0 = randn((size_t)B * N, rng);
    const unsigned threads = (unsigned)(K / S / 2);
    const long long n = (long long)B * N;
    for (int acc : {0, 1}) {
        std::vector<float> y1 = y0, y2 = y0, p1((size_t)S * n), p2((size_t)S * n);
        qw_cpu::launch({grid, (unsigned)S, 1}, {threads, 1, 1}, [&] {
            gemm_rows_bulk32(x.data(), w.data(), y1.data(), p1.data(), B, N, K, acc, stages);
        });
        qw_cpu::launch({grid, (unsigned)S, 1}, {threads, 1, 1}, [&] {
            gemm_rows_bulk32_fp8(x.data(), m.q.data(), m.s.data(), y2.data(), p2.data(), B, N, K, acc, 2 * stages);
        });
        if (S > 1)
            for (auto [p, y] : {std::pair{&p1, &y1}, std::pair{&p2, &y2}})
                qw_cpu::launch({(unsigned)((n + 255) / 256), 1, 1}, {256, 1, 1},
                               [&] { gemm_rows_reduce(p->data(), y->data(), n, S, acc); });
        same("gemm_rows_bulk32_fp8", y2, y1);
    }
}

static void moe(int E, int k, int I, int H, int S, std::mt19937& rng) {
    Q8 gu = random_q8(E * 2 * I, H, rng), dn = random_q8(E * H, I, rng), sd = random_q8(H, S, rng);
    const auto wgu = gu.bf16(), wd = dn.bf16(), wsd = sd.bf16();
    const auto x = randn(H, rng), nw = randn(H, rng, 1.f, 0.1f), inp = randn(E + 1 + 2 * S, rng);
    const int nssq = 2;
    std::vector<float> ssq(nssq, 0.f);
    for (int c = 0; c < H; c++) ssq[c % nssq] += x[c] * x[c];
    const int pairs = 2;
    const dim3 grid((unsigned)((I + 8 * pairs - 1) / (8 * pairs)), (unsigned)k, 1);
    std::vector<float> a1(k * I), a2(k * I);
    qw_cpu::launch(grid, {256, 1, 1}, [&] {
        dec_moe_gate_up(wgu.data(), x.data(), ssq.data(), nssq, nw.data(), 1e-6f, inp.data(), E, k, a1.data(), I, H,
                        pairs);
    });
    qw_cpu::launch(grid, {256, 1, 1}, [&] {
        dec_moe_gate_up_fp8(gu.q.data(), gu.s.data(), x.data(), ssq.data(), nssq, nw.data(), 1e-6f, inp.data(), E,
                            k, a2.data(), I, H, pairs);
    });
    same("dec_moe_gate_up_fp8", a2, a1);
    const auto y0 = randn(H, rng);
    const unsigned blocks = (unsigned)((H + 7) / 8);
    std::vector<float> y1 = y0, y2 = y0, s1(blocks), s2(blocks);
    qw_cpu::launch({blocks, 1, 1}, {256, 1, 1}, [&] {
        dec_moe_down(wd.data(), wsd.data(), a1.data(), inp.data(), E, k, I, S, y1.data(), H, s1.data());
    });
    qw_cpu::launch({blocks, 1, 1}, {256, 1, 1}, [&] {
        dec_moe_down_fp8(dn.q.data(), dn.s.data(), sd.q.data(), sd.s.data(), a1.data(), inp.data(), E, k, I, S,
                         y2.data(), H, s2.data());
    });
    same("dec_moe_down_fp8 y", y2, y1);
    same("dec_moe_down_fp8 ssq", s2, s1);
    // The split-row kernels (the host's shape: P warps a row, `span` chunks
    // each): FP8 bit-identical to bf16, and bf16 the streaming kernel's sums
    // in another order.
    const int cols16 = (k * I + S) / 8, warps = (cols16 + 9 * 32 - 1) / (9 * 32);
    const int span = ((cols16 + warps - 1) / warps + 31) / 32 * 32;
    std::vector<float> y3 = y0, y4 = y0, s3(blocks), s4(blocks);
    qw_cpu::launch({blocks, 1, 1}, {256u * warps, 1, 1}, [&] {
        dec_moe_down_rows(wd.data(), wsd.data(), a1.data(), inp.data(), E, k, I, S, y3.data(), H, s3.data(), span);
    });
    qw_cpu::launch({blocks, 1, 1}, {256u * warps, 1, 1}, [&] {
        dec_moe_down_rows_fp8(dn.q.data(), dn.s.data(), sd.q.data(), sd.s.data(), a1.data(), inp.data(), E, k, I, S,
                              y4.data(), H, s4.data(), span);
    });
    same("dec_moe_down_rows_fp8 y", y4, y3);
    same("dec_moe_down_rows_fp8 ssq", s4, s3);
    double big = 0;
    for (float v : y1) big = std::max(big, (double)std::fabs(v));
    for (int r = 0; r < H; r++)
        if (!(std::fabs(y3[r] - y1[r]) <= 1e-5 * big)) fail("dec_moe_down_rows vs dec_moe_down", r, y3[r], y1[r]);
}

// f32_e4m3_trunc (synthetic weights): the code of the largest E4M3 magnitude
// not above |v|, with v's sign, never NaN.
static void encode(std::mt19937& rng) {
    std::uniform_real_distribution<float> u(-447.99f, 447.99f);
    auto mag = [](unsigned b) { return (double)std::fabs(bf2f(ref_bf16((unsigned char)(b & 0x7f), 1.f))); };
    for (int i = 0; i < 200000; i++) {
        const float v = i < 100000 ? u(rng) : u(rng) * 1e-4f;
        const unsigned b = f32_e4m3_trunc(v);
        const double a = std::fabs((double)v);
        const bool sign_ok = (b & 0x80) ? v < 0 : v >= 0 || (b & 0x7f) == 0;
        if ((b & 0x7f) == 0x7f || !sign_ok || mag(b) > a || ((b & 0x7f) < 0x7e && mag(b + 1) <= a))
            fail("f32_e4m3_trunc", i, b, v);
    }
}

int main() {
    std::mt19937 rng(7);
    encode(rng);
    dequant_codes();
    dequant_slabs(rng);
    gemvs(256, 384, rng);   // one chunk, lanes idle
    gemvs(128, 2560, rng);  // two chunks (the second partial)
    gemvs(384, 128, rng);
    bulk_gemvs(256, 384, 3, 2, rng);   // lanes idle, several slots a block
    bulk_gemvs(384, 2048, 7, 3, rng);  // a block's slots across a row block
    bulk_gemvs(128, 4096, 2, 1, rng);  // 4 rows a slot
    bulk_gemvs(256, 2560, 64, 2, rng); // a slot a block, the second chunk partial
    in_proj_tail(512, 20, 256, 7, 2, 300, 4, rng);    // tail rows over blocks, conv inside a slot
    in_proj_tail(256, 64, 2048, 132, 1, 256, 4, rng);  // more blocks than slots: tail-only blocks
    in_proj_tail(384, 5, 128, 2, 3, 384, 3, rng);      // blocks with several tail rows
    rows_bulk32(17, 256, 2048, 2, 5, 2, rng);  // two slices of 1,024 (the 35B model's)
    rows_bulk32(32, 384, 512, 4, 3, 1, rng);   // slices of one FP8 block
    rows_bulk32(24, 128, 1024, 1, 2, 3, rng);  // one slice: Y directly
    rows_bulk(3, 384, 512, 5, 2, rng);
    rows_bulk(8, 256, 4096, 3, 1, rng);
    rows_bulk(12, 256, 1024, 4, 2, rng);
    rows_bulk(16, 384, 2048, 7, 3, rng);
    moe(8, 3, 128, 256, 128, rng);
    moe(6, 2, 256, 128, 256, rng);  // the virtual row over two chunks
    moe(16, 8, 256, 256, 512, rng); // the split-row kernels with 2 warps a row
    quant_rows(5, 16, 384, rng);  // padded to 16 rows
    quant_rows(1, 1, 128, rng);
    quant_rows(33, 48, 2048, rng);
    quant_rows(32, 32, 256, rng);
    quant_rows(21, 32, 384, rng, true);  // rows gathered through an index
    if (failures) {
        std::printf("%d mismatches\n", failures);
        return 1;
    }
    std::printf("fp8: dequantization, activation quantization and FP8 decode kernels match\n");
    return 0;
}
