// Decode attention on the CPU (QW_CPU): every kernel family of
// kernels/decode_attn.cu (dec_attn_*: direct and ring) and
// kernels/decode_attn_keys.cu (dec_attn_*_keys) and kernels/decode_attn_tc.cu
// (dec_attn_*_tc, tensor cores: the mma emulated), each followed by the real
// dec_attn_combine, against gated softmax attention in double precision.
// GQA, f32 and bf16 KV, head_dim 256 and 128, 1 and 3 ring stages, split
// lengths that are not multiples of the tiles, empty splits. Exit 1 on a
// mismatch.
#include <cstdio>
#include <random>
#include <string>
#include <vector>
#include "decode_attn.cu"
#include "decode_attn_keys.cu"
#include "decode_attn_tc.cu"

struct Shape {
    int nkv, G, hd, L, nsplit;
};

// Max |error| of `attn` (partials for every (KV head, split) block of
// `threads` threads) merged by dec_attn_combine.
template <typename KV, typename Attn>
static double check(const Shape& s, unsigned threads, Attn attn, unsigned seed) {
    const int nh = s.nkv * s.G, hd = s.hd, L = s.L;
    std::mt19937 rng(seed);
    std::normal_distribution<float> nd(0.f, 1.f);
    std::vector<float> q(nh * hd), kf((size_t)L * s.nkv * hd), vf(kf.size()), proj((size_t)nh * 2 * hd);
    for (auto& x : q) x = nd(rng);
    for (auto& x : kf) x = nd(rng);
    for (auto& x : vf) x = nd(rng);
    for (auto& x : proj) x = nd(rng);
    std::vector<KV> kc(kf.size()), vc(vf.size());
    for (size_t i = 0; i < kf.size(); i++) {
        if constexpr (sizeof(KV) == 2) {
            kc[i] = f2bf(kf[i]);
            vc[i] = f2bf(vf[i]);
            kf[i] = bf2f(kc[i]);
            vf[i] = bf2f(vc[i]);
        } else {
            kc[i] = kf[i];
            vc[i] = vf[i];
        }
    }
    std::vector<float> po((size_t)nh * s.nsplit * hd, NAN), pml((size_t)nh * s.nsplit * 2, NAN), out(nh * hd, NAN);
    const int pos = L - 1;
    qw_cpu::launch({(unsigned)s.nkv, (unsigned)s.nsplit, 1}, {threads, 1, 1},
                   [&] { attn(q.data(), kc.data(), vc.data(), po.data(), pml.data(), &pos); });
    qw_cpu::launch({(unsigned)nh, (unsigned)((hd + 31) / 32), 1}, {256, 1, 1},
                   [&] { dec_attn_combine(po.data(), pml.data(), proj.data(), out.data(), nh, hd, s.nsplit); });
    const float scale = 1.f / std::sqrt((float)hd);
    double worst = 0;
    for (int h = 0; h < nh; h++) {
        const int g = h / s.G;
        std::vector<double> p(L);
        double mx = -1e300, den = 0;
        for (int t = 0; t < L; t++) {
            double d = 0;
            for (int i = 0; i < hd; i++) d += (double)q[h * hd + i] * kf[((size_t)t * s.nkv + g) * hd + i];
            p[t] = d * scale;
            mx = std::max(mx, p[t]);
        }
        for (auto& x : p) den += (x = std::exp(x - mx));
        for (int i = 0; i < hd; i++) {
            double o = 0;
            for (int t = 0; t < L; t++) o += p[t] * vf[((size_t)t * s.nkv + g) * hd + i];
            const double gate = proj[(size_t)h * 2 * hd + hd + i];
            const double want = o / den / (1.0 + std::exp(-gate));
            const double got = out[h * hd + i];
            if (!std::isfinite(got)) return INFINITY;
            worst = std::max(worst, std::fabs(got - want));
        }
    }
    return worst;
}

int main() {
    const Shape shapes[] = {
        {2, 8, 256, 400, 5},  // the 35B model's GQA and head_dim; ragged splits
        {2, 8, 256, 33, 4},
        {1, 4, 128, 257, 2},
        {2, 8, 256, 5, 8},  // more splits than keys: empty splits
        {2, 2, 32, 70, 3},  // the test fixtures' heads (tensor cores: 2 warps of 16 dims)
    };
    int bad = 0, n = 0;
    auto report = [&](const std::string& name, const Shape& s, double err) {
        const bool ok = err < 2e-5;
        bad += !ok;
        n++;
        std::printf("%-22s nkv %d G %d hd %3d L %4d splits %d  max |err| %.2e  %s\n", name.c_str(), s.nkv, s.G, s.hd,
                    s.L, s.nsplit, err, ok ? "ok" : "FAIL");
    };
    for (const Shape& s : shapes) {
        const int nh = s.nkv * s.G;
        const float scale = 1.f / std::sqrt((float)s.hd);
        // stages 0: direct reads; 1 and 3: the shared-memory ring.
        for (int st : {0, 1, 3}) {
            const std::string tag = st ? "_ring/" + std::to_string(st) : "";
            report("dec_attn_f32" + tag, s,
                   check<float>(s, 32 * s.G, [&](const float* q, const float* k, const float* v, float* po, float* pml,
                                          const int* pos) {
                       (st ? dec_attn_f32_ring : dec_attn_f32)(q, k, v, po, pml, nh, s.nkv, s.hd, pos, s.nsplit,
                                                                scale, st);
                   }, 11));
            report("dec_attn_bf16" + tag, s,
                   check<bf16_t>(s, 32 * s.G, [&](const float* q, const bf16_t* k, const bf16_t* v, float* po, float* pml,
                                           const int* pos) {
                       (st ? dec_attn_bf16_ring : dec_attn_bf16)(q, k, v, po, pml, nh, s.nkv, s.hd, pos, s.nsplit,
                                                                  scale, st);
                   }, 12));
        }
        for (int st : {1, 3}) {
            if (s.hd % 128 != 0) break;  // the key-parallel kernels need hd % (32 lanes x 4 floats) == 0
            const std::string tag = "/" + std::to_string(st);
            report("dec_attn_f32_keys" + tag, s,
                   check<float>(s, 16 * s.G, [&](const float* q, const float* k, const float* v, float* po, float* pml,
                                          const int* pos) {
                       dec_attn_f32_keys(q, k, v, po, pml, nh, s.nkv, s.hd, pos, s.nsplit, scale, st);
                   }, 13));
            report("dec_attn_f32_keys1" + tag, s,
                   check<float>(s, 32 * s.G, [&](const float* q, const float* k, const float* v, float* po, float* pml,
                                          const int* pos) {
                       dec_attn_f32_keys1(q, k, v, po, pml, nh, s.nkv, s.hd, pos, s.nsplit, scale, st);
                   }, 14));
            if (s.hd % 256 == 0)
                report("dec_attn_bf16_keys" + tag, s,
                       check<bf16_t>(s, 16 * s.G, [&](const float* q, const bf16_t* k, const bf16_t* v, float* po,
                                               float* pml, const int* pos) {
                           dec_attn_bf16_keys(q, k, v, po, pml, nh, s.nkv, s.hd, pos, s.nsplit, scale, st);
                       }, 15));
        }
        // Tensor cores: head-dim slices of up to DT_WARPS warps (16 to 64
        // dims each, as the host picks them), G <= 8; fragments from global
        // memory, or through each warp's ring of 1-4 slots.
        int tw = DT_WARPS;
        while (tw > 1 && (s.hd % (16 * tw) != 0 || s.hd / tw > 16 * DT_MAXKK)) tw /= 2;
        for (int st : {1, 2, 4}) {
            const std::string tag = "/" + std::to_string(st);
            report("dec_attn_f32_tc_ring" + tag, s,
                   check<float>(s, 32 * tw, [&](const float* q, const float* k, const float* v, float* po,
                                                     float* pml, const int* pos) {
                       dec_attn_f32_tc_ring(q, k, v, po, pml, nh, s.nkv, s.hd, pos, s.nsplit, scale, st);
                   }, 18));
            report("dec_attn_bf16_tc_ring" + tag, s,
                   check<bf16_t>(s, 32 * tw, [&](const float* q, const bf16_t* k, const bf16_t* v, float* po,
                                                      float* pml, const int* pos) {
                       dec_attn_bf16_tc_ring(q, k, v, po, pml, nh, s.nkv, s.hd, pos, s.nsplit, scale, st);
                   }, 19));
        }
        report("dec_attn_f32_tc", s,
               check<float>(s, 32 * tw, [&](const float* q, const float* k, const float* v, float* po,
                                                 float* pml, const int* pos) {
                   dec_attn_f32_tc(q, k, v, po, pml, nh, s.nkv, s.hd, pos, s.nsplit, scale, 0);
               }, 16));
        report("dec_attn_bf16_tc", s,
               check<bf16_t>(s, 32 * tw, [&](const float* q, const bf16_t* k, const bf16_t* v, float* po,
                                                  float* pml, const int* pos) {
                   dec_attn_bf16_tc(q, k, v, po, pml, nh, s.nkv, s.hd, pos, s.nsplit, scale, 0);
               }, 17));
    }
    std::printf("%d of %d kernel runs match\n", n - bad, n);
    return bad ? 1 : 0;
}
