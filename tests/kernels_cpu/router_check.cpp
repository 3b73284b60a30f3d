// The decode MoE routing (kernels/decode_moe.cu: router_topk_warp, which both
// expert kernels run) on the CPU (QW_CPU; its warp reductions as shuffles,
// redux.sync on the GPU): the k largest router logits with ties to the lower
// index (-0 and +0 are equal) and their renormalised softmax weights against a
// sort in double precision; and with NaN or -inf logits (a broken hidden
// state) every chosen index stays inside the experts: slots with nothing left
// to choose take expert 0 at weight 0 (NaN weights when nothing at all is
// selectable), so the expert kernels never read past their weights. Exit 1 on
// a mismatch.
#include <cstdio>
#include <random>
#include <vector>
#include "decode_moe.cu"

static int failures = 0;

static void check(const char* what, const std::vector<float>& logits, int k) {
    const int E = (int)logits.size();
    std::vector<int> sidx(MOE_MAXK, -1);
    std::vector<float> sw(MOE_MAXK, -1.f);
    qw_cpu::launch({1, 1, 1}, {32, 1, 1}, [&] {
        __shared__ int si[MOE_MAXK];
        __shared__ float sv[MOE_MAXK];
        router_topk_warp(logits.data(), E, k, si, sv);
        QW_SYNCWARP();
        if (threadIdx.x < (unsigned)k) {
            sidx[threadIdx.x] = si[threadIdx.x];
            sw[threadIdx.x] = sv[threadIdx.x];
        }
    });
    // Selectable: finite or +inf logits, larger first, then the lower index.
    std::vector<int> ids;
    for (int e = 0; e < E; e++)
        if (!std::isnan(logits[e]) && logits[e] != -INFINITY) ids.push_back(e);
    std::stable_sort(ids.begin(), ids.end(), [&](int a, int b) { return logits[a] > logits[b]; });
    const int n = std::min<int>(k, (int)ids.size());
    double total = 0;
    for (int j = 0; j < n; j++) total += std::exp((double)logits[ids[j]] - logits[ids[0]]);
    for (int j = 0; j < k; j++) {
        if (sidx[j] < 0 || sidx[j] >= E) {
            std::printf("%s: slot %d: expert %d outside 0..%d\n", what, j, sidx[j], E);
            failures++;
            return;
        }
        if (j < n) {
            const double want = std::exp((double)logits[ids[j]] - logits[ids[0]]) / total;
            if (sidx[j] != ids[j] || std::fabs(sw[j] - want) > 1e-6) {
                std::printf("%s: slot %d: expert %d weight %.7g, want %d %.7g\n", what, j, sidx[j], sw[j], ids[j], want);
                failures++;
                return;
            }
        } else if (n > 0 ? (sidx[j] != 0 || sw[j] != 0.f) : !std::isnan(sw[j])) {
            std::printf("%s: empty slot %d: expert %d weight %g\n", what, j, sidx[j], sw[j]);
            failures++;
            return;
        }
    }
}

int main() {
    std::mt19937 rng(3);
    std::normal_distribution<float> nd;
    std::vector<float> x(256);
    for (auto& v : x) v = nd(rng);
    check("random", x, 8);
    for (auto& v : x) v = (float)(int)(nd(rng) * 2);  // many ties
    check("ties", x, 8);
    std::vector<float> small(60);
    for (auto& v : small) v = nd(rng);
    check("60 experts, top-4", small, 4);
    std::vector<float> big(1000);  // 32 logits per lane, MOE_MAXK chosen
    for (auto& v : big) v = (float)(int)(nd(rng) * 4);
    check("1000 experts, top-32, ties", big, MOE_MAXK);
    for (int e = 0; e < 256; e++) x[e] = e % 3 ? 0.f : -0.f;  // -0 and +0 tie: the lower index wins
    x[200] = 1.f;
    check("signed zeros", x, 8);
    std::vector<float> few(20);  // fewer experts than lanes
    for (auto& v : few) v = (float)(int)(nd(rng) * 2);
    check("20 experts, top-8, ties", few, 8);
    for (int e = 0; e < 256; e++) x[e] = e % 50 == 7 ? nd(rng) : NAN;  // 5 finite
    check("mostly NaN", x, 8);
    for (int e = 0; e < 256; e++) x[e] = e == 3 ? 1.f : -INFINITY;
    check("one finite, the rest -inf", x, 8);
    for (auto& v : x) v = NAN;
    check("all NaN", x, 8);
    std::printf("router_check: %s\n", failures ? "FAIL" : "PASS");
    return failures ? 1 : 0;
}
