// The routed experts' few-row kernels with their activation kernels folded
// in (kernels/gemm_rows.cu) on the CPU (QW_CPU), against the launches they
// replace, bit for bit:
//  - moe_rows8_gather(src, rows) against gather_split_bf16 then moe_rows8;
//  - moe_rows8_silu(gu) against silu_mul_split then moe_rows8;
//  - the block-FP8 forms against moe_rows8_fp8 the same way.
// Experts of 1, 8, 3 and 8 rows (an empty one between), plan rows drawn from
// 7 tokens with repeats, a grid row past the table's count, gates from -30
// to 30 (SiLU's tails); canaries past the outputs must stay NaN. Exit 1 on
// a mismatch.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>
#include "gemm_rows.cu"
#include "plan_tiles.h"
#include "moe.cu"

constexpr int CANARY = 5;

// One expert launch as moe_grouped.rs makes it: grid (blocks of four warps
// over N, the table's tiles + 1), into a fresh Y of NaN with canaries.
template <typename F>
static std::vector<float> experts(const std::vector<int>& tiles, int rows, int N, F kernel) {
    std::vector<float> Y((size_t)rows * N + CANARY, NAN);
    qw_cpu::launch({(unsigned)(((N + 2 * 16 - 1) / (2 * 16) + 3) / 4), (unsigned)tiles[0] + 1, 1}, {128, 1, 1},
                   [&] { kernel(Y.data()); });
    return Y;
}

static bool same(const std::vector<float>& a, const std::vector<float>& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

int main() {
    std::mt19937 rng(23);
    std::normal_distribution<float> nd;
    std::uniform_real_distribution<float> wide(-30.f, 30.f);
    int bad = 0, n = 0;
    auto check = [&](bool ok, const char* what, int N, int K) {
        n++;
        if (!ok) {
            bad++;
            std::printf("%s N %d K %d: FAIL (not the unfused launches' bits)\n", what, N, K);
        }
    };
    const std::vector<int> counts = {1, 8, 0, 3, 8};
    const int E = (int)counts.size(), T = 7;
    int rows;
    const std::vector<int> tiles = plan_tiles(counts, &rows);
    std::vector<int> plan_rows(rows);
    for (auto& r : plan_rows) r = (int)(rng() % T);
    for (bool fp8 : {false, true})
        for (int N : {128, 256})
            for (int K : {128, 384}) {
                // Weights: bf16 normals, or E4M3 bytes (no NaN codes) with one
                // scale per 128 x 128 block.
                std::vector<bf16_t> W((size_t)E * N * K);
                std::vector<unsigned char> Q((size_t)E * N * K);
                std::vector<float> Sc((size_t)E * (N / 128) * (K / 128));
                for (auto& w : W) w = f2bf(nd(rng));
                for (auto& q : Q) q = (unsigned char)(rng() % 0x7f) | (rng() & 0x80);
                for (auto& s : Sc) s = std::ldexp(1.f, (int)(rng() % 9) - 12);
                auto split_experts = [&](const std::vector<bf16_t>& hi, const std::vector<bf16_t>& lo) {
                    return experts(tiles, rows, N, [&](float* Y) {
                        if (fp8)
                            moe_rows8_fp8(hi.data(), lo.data(), Q.data(), Sc.data(), tiles.data(), Y, N, K);
                        else
                            moe_rows8(hi.data(), lo.data(), W.data(), (long long)N * K, tiles.data(), Y, N, K);
                    });
                };
                // The gate/up projection: token rows gathered by plan row.
                std::vector<float> src((size_t)T * K);
                for (auto& v : src) v = nd(rng);
                std::vector<bf16_t> hi((size_t)rows * K), lo((size_t)rows * K);
                qw_cpu::launch({(unsigned)rows, 1, 1}, {256, 1, 1}, [&] {
                    gather_split_bf16(src.data(), K, plan_rows.data(), rows, K, hi.data(), lo.data());
                });
                const std::vector<float> want_g = split_experts(hi, lo);
                const std::vector<float> got_g = experts(tiles, rows, N, [&](float* Y) {
                    if (fp8)
                        moe_rows8_gather_fp8(src.data(), plan_rows.data(), Q.data(), Sc.data(), tiles.data(), Y, N,
                                             K);
                    else
                        moe_rows8_gather(src.data(), plan_rows.data(), W.data(), (long long)N * K, tiles.data(), Y,
                                         N, K);
                });
                check(same(want_g, got_g), fp8 ? "moe_rows8_gather_fp8" : "moe_rows8_gather", N, K);
                // The down projection: gate then up, K each, per plan row.
                std::vector<float> gu((size_t)rows * 2 * K);
                for (size_t i = 0; i < gu.size(); i++) gu[i] = (i / K) % 2 == 0 ? wide(rng) : nd(rng);
                qw_cpu::launch({(unsigned)rows, 1, 1}, {256, 1, 1},
                               [&] { silu_mul_split(gu.data(), rows, K, hi.data(), lo.data()); });
                const std::vector<float> want_s = split_experts(hi, lo);
                const std::vector<float> got_s = experts(tiles, rows, N, [&](float* Y) {
                    if (fp8)
                        moe_rows8_silu_fp8(gu.data(), Q.data(), Sc.data(), tiles.data(), Y, N, K);
                    else
                        moe_rows8_silu(gu.data(), W.data(), (long long)N * K, tiles.data(), Y, N, K);
                });
                check(same(want_s, got_s), fp8 ? "moe_rows8_silu_fp8" : "moe_rows8_silu", N, K);
                // Live: every output written, none NaN.
                int written = 0;
                for (int i = 0; i < rows * N; i++) written += !std::isnan(got_s[i]) && !std::isnan(got_g[i]);
                check(written == rows * N, "outputs written", N, K);
            }
    std::printf("moe_rows_fused_check: %d of %d cases bit for bit\n", n - bad, n);
    return bad ? 1 : 0;
}
