// Runs kernels/decode_attn_keys.cu on the CPU (tests/kernels_cpu/mma.h) and
// checks its partials, merged as dec_attn_combine merges them (without the
// output gate), against plain softmax attention in double precision:
// GQA with 8 query heads per KV head, head_dim 256 and 128, f32 and bf16 KV,
// 1 and 2 heads per warp, 1-3 ring stages, split lengths that are not
// multiples of the tile, empty splits. Exit 1 on a mismatch.
#include <algorithm>
#include <cstdio>
#include <random>
#include <thread>
#include <vector>
#include "mma.h"
// The kernel's `extern __shared__ float4 dk_smem[]` (blocks run one at a time).
alignas(16) float4 dk_smem_storage[1 << 16];
#define dk_smem dk_smem_storage
#include "decode_attn_keys.cu"
#undef dk_smem

static bf16_t to_bf16(float f) {
    unsigned u;
    std::memcpy(&u, &f, 4);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (bf16_t)(u >> 16);
}
static float from_bf16(bf16_t b) { return __uint_as_float((unsigned)b << 16); }

template <typename KV, int HPW>
static double run_case(int nkv, int G, int hd, int L, int nsplit, int stages, unsigned seed) {
    const int nh = nkv * G;
    std::mt19937 rng(seed);
    std::normal_distribution<float> nd(0.f, 1.f);
    std::vector<float> q(nh * hd), kf((size_t)L * nkv * hd), vf((size_t)L * nkv * hd);
    for (auto& x : q) x = nd(rng);
    for (auto& x : kf) x = nd(rng);
    for (auto& x : vf) x = nd(rng);
    std::vector<KV> kc(kf.size()), vc(vf.size());
    for (size_t i = 0; i < kf.size(); i++) {
        if constexpr (sizeof(KV) == 2) {
            kc[i] = to_bf16(kf[i]);
            vc[i] = to_bf16(vf[i]);
            kf[i] = from_bf16(kc[i]);
            vf[i] = from_bf16(vc[i]);
        } else {
            kc[i] = kf[i];
            vc[i] = vf[i];
        }
    }
    std::vector<float> po((size_t)nh * nsplit * hd, NAN), pml((size_t)nh * nsplit * 2, NAN);
    const int pos = L - 1;
    const float scale = 1.f / std::sqrt((float)hd);
    const int threads = 32 * G / HPW;
    blockDim = {(unsigned)threads, 1, 1};
    gridDim = {(unsigned)nkv, (unsigned)nsplit, 1};
    for (int g = 0; g < nkv; g++)
        for (int s = 0; s < nsplit; s++) {
            std::barrier<> bb(threads);
            std::vector<std::barrier<>*> wb;
            for (int w = 0; w < threads / 32; w++) wb.push_back(new std::barrier<>(32));
            block_barrier = &bb;
            for (int w = 0; w < threads / 32; w++) warp_barriers[w] = wb[w];
            std::vector<std::thread> ts;
            for (int t = 0; t < threads; t++)
                ts.emplace_back([&, t] {
                    threadIdx = {(unsigned)t, 0, 0};
                    blockIdx = {(unsigned)g, (unsigned)s, 0};
                    dec_attn_keys_impl<KV, HPW>(q.data(), kc.data(), vc.data(), po.data(), pml.data(), nh, nkv,
                                                hd, &pos, nsplit, scale, stages);
                });
            for (auto& t : ts) t.join();
            for (auto* b : wb) delete b;
        }
    double worst = 0;
    for (int h = 0; h < nh; h++) {
        const int g = h / G;
        // Reference: softmax(q k^T * scale) v over all L keys, double precision.
        std::vector<double> sc(L);
        double mx = -1e300;
        for (int t = 0; t < L; t++) {
            double d = 0;
            for (int i = 0; i < hd; i++) d += (double)q[h * hd + i] * kf[((size_t)t * nkv + g) * hd + i];
            sc[t] = d * scale;
            mx = std::max(mx, sc[t]);
        }
        double den = 0;
        for (auto& x : sc) den += (x = std::exp(x - mx));
        // The kernel's partials, merged as dec_attn_combine does.
        double M = -1e300;
        for (int s = 0; s < nsplit; s++) M = std::max(M, (double)pml[(h * nsplit + s) * 2]);
        double Ls = 0;
        for (int s = 0; s < nsplit; s++) {
            double m = pml[(h * nsplit + s) * 2];
            if (std::isfinite(m)) Ls += pml[(h * nsplit + s) * 2 + 1] * std::exp(m - M);
        }
        for (int i = 0; i < hd; i++) {
            double want = 0;
            for (int t = 0; t < L; t++) want += sc[t] * vf[((size_t)t * nkv + g) * hd + i];
            want /= den;
            double got = 0;
            for (int s = 0; s < nsplit; s++) {
                double m = pml[(h * nsplit + s) * 2];
                if (std::isfinite(m)) got += po[((size_t)h * nsplit + s) * hd + i] * std::exp(m - M);
            }
            got /= Ls;
            if (!std::isfinite(got)) return INFINITY;
            worst = std::max(worst, std::fabs(got - want));
        }
    }
    return worst;
}

int main() {
    struct Case {
        const char* name;
        double (*fn)(int, int, int, int, int, int, unsigned);
        int nkv, G, hd, L, nsplit, stages;
    };
    const Case cases[] = {
        {"f32 hpw2 hd256 L=1000 split 7 stages 3", run_case<float, 2>, 2, 8, 256, 1000, 7, 3},
        {"f32 hpw2 hd256 L=33 split 4 stages 2", run_case<float, 2>, 2, 8, 256, 33, 4, 2},
        {"f32 hpw1 hd256 L=300 split 3 stages 1", run_case<float, 1>, 2, 8, 256, 300, 3, 1},
        {"f32 hpw2 hd128 L=257 split 2 stages 3", run_case<float, 2>, 1, 4, 128, 257, 2, 3},
        {"f32 hpw2 L=5 split 8 (empty splits)", run_case<float, 2>, 2, 8, 256, 5, 8, 3},
        {"bf16 hpw2 hd256 L=700 split 5 stages 3", run_case<bf16_t, 2>, 2, 8, 256, 700, 5, 3},
    };
    int bad = 0;
    for (const auto& c : cases) {
        double err = c.fn(c.nkv, c.G, c.hd, c.L, c.nsplit, c.stages, 17);
        const bool ok = err < 2e-5;
        bad += !ok;
        std::printf("%-45s max |err| %.2e  %s\n", c.name, err, ok ? "ok" : "FAIL");
    }
    return bad ? 1 : 0;
}
