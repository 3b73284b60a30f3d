// The GDN decode step of kernels/decode_gdn.cu on the CPU (QW_CPU): dec_gdn_conv
// (causal conv + SiLU) then dec_gdn_step (q/k L2 norms, gates, delta rule,
// gated RMSNorm; 2-D blocks) against a double-precision reference: the out
// projection's input (RMS-normalised, ~1) within 1e-5 and the recurrent
// state (~0.1) within 1e-6, absolute; the conv history exactly (it only
// moves values). Shapes: the 35B model's (16 key heads, 32
// value heads of 128, conv of 4) and the fixtures' small ones (head dims 16
// and 24, one and three value heads per key head, conv of 2). Then the
// batched step (bat_gdn_step, a | b in the row or apart), each row equal to
// dec_gdn_step's alone (check_batched).
// Exit 1 on a mismatch.
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>
#include "decode_gdn.cu"

static int failures = 0;

static void check(int nk, int nv, int dk, int dv, int K, std::mt19937& rng) {
    std::normal_distribution<float> nd;
    const int key_dim = nk * dk, vdim = nv * dv, conv_dim = 2 * key_dim + vdim, H = K - 1;
    const int a_off = conv_dim + vdim, rows = a_off + 2 * nv;
    std::vector<float> proj(rows), conv_w((size_t)conv_dim * K), hist((size_t)conv_dim * H);
    std::vector<float> a_log(nv), dt_bias(nv), S((size_t)nv * dk * dv), nw(dv);
    for (auto& v : proj) v = nd(rng);
    for (auto& v : conv_w) v = 0.5f * nd(rng);
    for (auto& v : hist) v = nd(rng);
    for (auto& v : a_log) v = 0.3f * nd(rng);
    for (auto& v : dt_bias) v = 0.3f * nd(rng);
    for (auto& v : S) v = 0.1f * nd(rng);
    for (auto& v : nw) v = 1.f + 0.1f * nd(rng);
    const float eps = 1e-6f, q_scale = 1.f / std::sqrt((float)dk);

    std::vector<float> p = proj, st = hist, S1 = S, out(vdim, NAN);
    const unsigned bx = 32 * ((dv + 31) / 32);
    qw_cpu::launch({(unsigned)(conv_dim + 127) / 128, 1, 1}, {128, 1, 1},
                   [&] { dec_gdn_conv(p.data(), st.data(), conv_w.data(), K, conv_dim); });
    qw_cpu::launch({(unsigned)nv, 1, 1}, {bx, 4, 1}, [&] {
        dec_gdn_step(p.data(), nk, nv, dk, dv, a_log.data(), dt_bias.data(), a_off, q_scale, S1.data(),
                     p.data() + conv_dim, nw.data(), eps, out.data());
    });

    // The reference.
    auto silu = [](double x) { return x / (1 + std::exp(-x)); };
    std::vector<double> a(conv_dim);
    std::vector<float> want_hist = hist;
    for (int ch = 0; ch < conv_dim; ch++) {
        double acc = (double)conv_w[(size_t)ch * K + H] * proj[ch];
        for (int q = 0; q < H; q++) acc += (double)conv_w[(size_t)ch * K + q] * hist[(size_t)ch * H + q];
        a[ch] = silu(acc);
        for (int q = 0; q + 1 < H; q++) want_hist[(size_t)ch * H + q] = hist[(size_t)ch * H + q + 1];
        if (H > 0) want_hist[(size_t)ch * H + H - 1] = proj[ch];
    }
    double worst_o = 0, worst_s = 0;
    for (int hv = 0; hv < nv; hv++) {
        const int hk = hv / (nv / nk);
        std::vector<double> q(dk), k(dk);
        double qs = 0, ks = 0;
        for (int i = 0; i < dk; i++) {
            q[i] = a[hk * dk + i];
            k[i] = a[key_dim + hk * dk + i];
            qs += q[i] * q[i];
            ks += k[i] * k[i];
        }
        for (int i = 0; i < dk; i++) {
            q[i] *= q_scale / std::sqrt(qs + 1e-6);
            k[i] /= std::sqrt(ks + 1e-6);
        }
        const double b = 1 / (1 + std::exp(-(double)proj[a_off + nv + hv]));
        const double x = (double)proj[a_off + hv] + dt_bias[hv];
        const double decay = std::exp(-std::exp((double)a_log[hv]) * (x > 20 ? x : std::log1p(std::exp(x))));
        std::vector<double> o(dv);
        double oo = 0;
        for (int c = 0; c < dv; c++) {
            const float* Sh = S.data() + (size_t)hv * dk * dv;
            double kv = 0;
            for (int i = 0; i < dk; i++) kv += k[i] * Sh[(size_t)i * dv + c];
            const double delta = b * (a[2 * key_dim + hv * dv + c] - decay * kv);
            for (int i = 0; i < dk; i++) {
                const double sv = Sh[(size_t)i * dv + c] * decay + k[i] * delta;
                o[c] += q[i] * sv;
                const float got = S1[(size_t)hv * dk * dv + (size_t)i * dv + c];
                worst_s = std::max(worst_s, std::fabs(got - sv));
            }
            oo += o[c] * o[c];
        }
        for (int c = 0; c < dv; c++) {
            const double want = o[c] / std::sqrt(oo / dv + eps) * nw[c] * silu(proj[conv_dim + hv * dv + c]);
            const float got = out[hv * dv + c];
            worst_o = std::max(worst_o, std::isnan(got) ? INFINITY : std::fabs(got - want));
        }
    }
    const bool hist_ok = std::memcmp(st.data(), want_hist.data(), st.size() * 4) == 0;
    std::printf("nk %d nv %d dk %d dv %d: max error out %.2e state %.2e\n", nk, nv, dk, dv, worst_o, worst_s);
    if (!(worst_o < 1e-5) || !(worst_s < 1e-6) || !hist_ok) {
        std::printf("nk %d nv %d dk %d dv %d K %d: out %.3g, state %.3g, conv history exact %d\n", nk, nv, dk, dv, K,
                    worst_o, worst_s, hist_ok);
        failures++;
    }
}

// The batched step (bat_gdn_step: one block per row and head) over B rows
// with their own projections, z, states and outputs, each row exactly as
// dec_gdn_step steps it alone (the same arithmetic per head). Rows sit
// `stride` floats apart, outputs `out_stride`; a | b in the rows, or in rows
// of their own.
static void check_batched(int nk, int nv, int dk, int dv, int B, std::mt19937& rng) {
    std::normal_distribution<float> nd;
    const int key_dim = nk * dk, vdim = nv * dv, conv_dim = 2 * key_dim + vdim;
    const int a_off = conv_dim + vdim, rows = a_off + 2 * nv, stride = rows + 5, out_stride = vdim + 3;
    const size_t head = (size_t)dk * dv;
    std::vector<float> proj((size_t)B * stride), a_log(nv), dt_bias(nv), nw(dv);
    std::vector<std::vector<float>> S0(B);
    for (auto& v : proj) v = nd(rng);
    for (auto& v : a_log) v = 0.3f * nd(rng);
    for (auto& v : dt_bias) v = 0.3f * nd(rng);
    for (auto& v : nw) v = 1.f + 0.1f * nd(rng);
    for (auto& s : S0) {
        s.resize(nv * head);
        for (auto& v : s) v = 0.1f * nd(rng);
    }
    const float eps = 1e-6f, q_scale = 1.f / std::sqrt((float)dk);
    const unsigned bx = 32 * ((dv + 31) / 32);
    // Alone: each row through dec_gdn_step.
    std::vector<std::vector<float>> want_s = S0, want_o(B, std::vector<float>(vdim, NAN));
    for (int b = 0; b < B; b++) {
        float* row = proj.data() + (size_t)b * stride;
        qw_cpu::launch({(unsigned)nv, 1, 1}, {bx, 4, 1}, [&] {
            dec_gdn_step(row, nk, nv, dk, dv, a_log.data(), dt_bias.data(), a_off, q_scale, want_s[b].data(),
                         row + conv_dim, nw.data(), eps, want_o[b].data());
        });
    }
    auto run = [&](const char* what, auto launch) {
        std::vector<std::vector<float>> S = S0;
        std::vector<unsigned long long> tab(2 * B);
        for (int b = 0; b < B; b++) tab[2 * b + 1] = (unsigned long long)S[b].data();
        std::vector<float> out((size_t)B * out_stride, NAN);
        launch(tab.data(), out.data());
        int bad = 0;
        for (int b = 0; b < B; b++) {
            bad += std::memcmp(S[b].data(), want_s[b].data(), S[b].size() * 4) != 0;
            bad += std::memcmp(out.data() + (size_t)b * out_stride, want_o[b].data(), vdim * 4) != 0;
        }
        std::printf("  %-30s B %d nv %d dk %d dv %d: %s\n", what, B, nv, dk, dv, bad ? "FAIL" : "equal to alone");
        failures += bad != 0;
    };
    run("bat_gdn_step", [&](const unsigned long long* tab, float* out) {
        qw_cpu::launch({(unsigned)nv, (unsigned)B, 1}, {bx, 4, 1}, [&] {
            bat_gdn_step(proj.data(), stride, nk, nv, dk, dv, a_log.data(), dt_bias.data(), proj.data() + a_off, stride,
                         q_scale, tab, conv_dim, nw.data(), eps, out, out_stride);
        });
    });
    // a | b in rows of their own (an FP8 in projection's bf16 tail GEMM):
    // the rows' a | b columns copied out, the projection's poisoned.
    const int ab_stride = 2 * nv + 1;
    std::vector<float> ab((size_t)B * ab_stride, NAN), cut = proj;
    for (int b = 0; b < B; b++)
        for (int j = 0; j < 2 * nv; j++) {
            ab[(size_t)b * ab_stride + j] = proj[(size_t)b * stride + a_off + j];
            cut[(size_t)b * stride + a_off + j] = NAN;
        }
    run("bat_gdn_step, a | b apart", [&](const unsigned long long* tab, float* out) {
        qw_cpu::launch({(unsigned)nv, (unsigned)B, 1}, {bx, 4, 1}, [&] {
            bat_gdn_step(cut.data(), stride, nk, nv, dk, dv, a_log.data(), dt_bias.data(), ab.data(), ab_stride, q_scale,
                         tab, conv_dim, nw.data(), eps, out, out_stride);
        });
    });
}

int main() {
    std::mt19937 rng(11);
    check(16, 32, 128, 128, 4, rng);
    check(2, 6, 16, 24, 4, rng);
    check(4, 4, 16, 16, 4, rng);
    check(1, 3, 32, 64, 2, rng);
    check_batched(2, 6, 16, 24, 3, rng);
    check_batched(16, 32, 128, 128, 2, rng);
    std::printf("gdn_decode_check: %s\n", failures ? "FAIL" : "PASS");
    return failures ? 1 : 0;
}
