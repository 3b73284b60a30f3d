// The fused GDN decode step (kernels/decode.cu: dec_gdn_fused) on the CPU
// (QW_CPU) against the two kernels it replaces (dec_gdn_prep, then
// dec_gdn_step), which the GPU runs check against transformers: the gated
// output and the recurrent state within 1e-5, the conv history bit for bit
// (the last value head of each key head updates the shared q/k channels after
// the others have read them), and the hand-off counters back at zero. Shapes:
// the 35B model's (16 key heads, 32 value heads of 128), and the fixtures'
// small ones (head dims 16 and 24, one and three value heads per key head).
// Exit 1 on a mismatch.
#include <cstdio>
#include <random>
#include <vector>
#include "decode.cu"

static int failures = 0;

static void check(int nk, int nv, int dk, int dv, int K, std::mt19937& rng) {
    std::normal_distribution<float> nd;
    const int key_dim = nk * dk, vdim = nv * dv, conv_dim = 2 * key_dim + vdim;
    const int a_off = conv_dim + vdim, rows = a_off + 2 * nv;
    std::vector<float> proj(rows), conv_w((size_t)conv_dim * K), state((size_t)conv_dim * (K - 1));
    std::vector<float> a_log(nv), dt_bias(nv), S((size_t)nv * dk * dv), nw(dv);
    for (auto& v : proj) v = nd(rng);
    for (auto& v : conv_w) v = 0.5f * nd(rng);
    for (auto& v : state) v = nd(rng);
    for (auto& v : a_log) v = 0.3f * nd(rng);
    for (auto& v : dt_bias) v = 0.3f * nd(rng);
    for (auto& v : S) v = 0.1f * nd(rng);
    for (auto& v : nw) v = 1.f + 0.1f * nd(rng);
    const float eps = 1e-6f, q_scale = 1.f / std::sqrt((float)dk);
    const unsigned bx = 32 * ((dv + 31) / 32);

    // The two-kernel path, on copies.
    std::vector<float> p2 = proj, st2 = state, S2 = S, g(nv), beta(nv), out2(vdim, NAN);
    const unsigned prep_blocks = 2 * nk + (vdim + 127) / 128;
    qw_cpu::launch({prep_blocks, 1, 1}, {128, 1, 1}, [&] {
        dec_gdn_prep(p2.data(), st2.data(), conv_w.data(), K, a_log.data(), dt_bias.data(), g.data(), beta.data(),
                     nk, nv, dk, dv, a_off, q_scale);
    });
    qw_cpu::launch({(unsigned)nv, 1, 1}, {bx, 4, 1}, [&] {
        dec_gdn_step(p2.data(), nk, nv, dk, dv, g.data(), beta.data(), S2.data(), p2.data() + conv_dim, nw.data(),
                     eps, out2.data());
    });

    // The fused kernel.
    std::vector<float> st1 = state, S1 = S, out1(vdim, NAN);
    std::vector<unsigned> done(nk, 0u);
    qw_cpu::launch({(unsigned)nv, 1, 1}, {bx, 4, 1}, [&] {
        dec_gdn_fused(proj.data(), st1.data(), conv_w.data(), K, a_log.data(), dt_bias.data(), a_off, nk, nv, dk, dv,
                      q_scale, S1.data(), proj.data() + conv_dim, nw.data(), eps, out1.data(), done.data());
    });

    auto worst = [](const std::vector<float>& a, const std::vector<float>& b) {
        double w = 0;
        for (size_t i = 0; i < a.size(); i++) {
            const double d = std::fabs((double)a[i] - b[i]) / (std::fabs((double)b[i]) + 1e-3);
            w = std::max(w, std::isnan(a[i]) != std::isnan(b[i]) ? INFINITY : d);
        }
        return w;
    };
    const double wo = worst(out1, out2), ws = worst(S1, S2);
    const bool hist = std::memcmp(st1.data(), st2.data(), st1.size() * 4) == 0;
    bool zero = true;
    for (unsigned d : done) zero &= d == 0;
    if (!(wo < 1e-5) || !(ws < 1e-5) || !hist || !zero) {
        std::printf("nk %d nv %d dk %d dv %d: out %.3g, state %.3g, conv history equal %d, counters zero %d\n", nk, nv,
                    dk, dv, wo, ws, hist, zero);
        failures++;
    }
}

int main() {
    std::mt19937 rng(11);
    check(16, 32, 128, 128, 4, rng);
    check(2, 6, 16, 24, 4, rng);
    check(4, 4, 16, 16, 4, rng);
    check(1, 3, 32, 64, 2, rng);
    std::printf("gdn_fused_check: %s\n", failures ? "FAIL" : "PASS");
    return failures ? 1 : 0;
}
