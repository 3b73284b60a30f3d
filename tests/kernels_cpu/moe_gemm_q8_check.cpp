// moe_gemm_wg_q8 (kernels/moe_gemm.cu: the grouped expert GEMM of
// `--prefill-precision fp8`, FP8 activations times block-FP8 experts on the
// warpgroup's FP8 MMA, emulated by kernels/mma.h) on the CPU (QW_CPU),
// launched as the host launches it (host/engine/src/gpu/model/moe_grouped.rs:
// the table of moe_plan_tiles for 128-row tiles, grid (N / 128, the tiles and
// two block rows past them, which must return), 256 threads, MQ_STAGES 256
// MQ_BK bytes of dynamic shared memory), against Y[r][n] = sum_kb
// as[kb][r] Sc_e[n / 128][kb] sum_{k in kb} aq[r][k] Q_e[n][k] in double.
// Expert row counts give tiles of 1, 37, 64, 65, 128 rows and experts with
// 0 rows; N 128 and 256 (two scale blocks of columns), K 128, 256, 384 (one
// to three scale blocks: an odd number of 64-byte stages per block never
// happens, K is a multiple of 128); every scale differs. Y rows past the
// tiles are canaries that must stay NaN. Exit 1 on a mismatch.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>
#include "moe_gemm.cu"

// f32 sums of 128 exact products per scale block, then one scaled add per
// block: a few f32 roundings of sum |terms|; a wrong scale, row, stage or
// fragment is off by O(1).
constexpr double TOL = 1e-5;
constexpr int PAD_ROWS = 3;

static double code(unsigned char b) {
    const int e = (b >> 3) & 15, m = b & 7;
    const double v = e == 0 ? std::ldexp((double)m / 8.0, -6) : std::ldexp(1.0 + m / 8.0, e - 7);
    return b & 0x80 ? -v : v;
}

static int failures = 0;

static void run(const std::vector<int>& counts, int N, int K, std::mt19937& rng) {
    const int E = (int)counts.size(), KB = K / 128;
    int R = 0;
    for (int c : counts) R += c;
    const int as_stride = (R + 15) / 16 * 16;
    std::uniform_int_distribution<int> byte(0, 255);
    std::uniform_real_distribution<float> sc(0.5f, 2.f);
    auto codes = [&](size_t n) {
        std::vector<unsigned char> v(n);
        for (auto& b : v) {
            do b = (unsigned char)byte(rng);
            while ((b & 0x7f) == 0x7f);  // no NaN
        }
        return v;
    };
    const auto aq = codes((size_t)R * K), Q = codes((size_t)E * N * K);
    std::vector<float> as((size_t)KB * as_stride), S((size_t)E * (N / 128) * KB);
    for (auto& v : as) v = sc(rng) * 1e-2f;
    for (auto& v : S) v = sc(rng) * 1e-3f;
    // moe_plan_tiles' table over 128-row tiles.
    std::vector<int> tiles{0};
    for (int e = 0, start = 0; e < E; start += counts[e++])
        for (int r = 0; r < counts[e]; r += 128) tiles.insert(tiles.end(), {e, start + r, std::min(counts[e] - r, 128)});
    tiles[0] = (int)(tiles.size() - 1) / 3;
    const unsigned nt = (unsigned)tiles[0] + 2;
    std::vector<float> Y((size_t)(R + PAD_ROWS) * N, NAN);
    qw_cpu::launch({(unsigned)(N / 128), nt, 1}, {256, 1, 1}, [&] {
        moe_gemm_wg_q8(aq.data(), as.data(), as_stride, Q.data(), S.data(), tiles.data(), Y.data(), N, K);
    });
    long bad = 0;
    double worst = 0;
    for (int e = 0, start = 0; e < E; start += counts[e++])
        for (int r = start; r < start + counts[e]; r++)
            for (int n = 0; n < N; n++) {
                double want = 0, mag = 0;
                for (int kb = 0; kb < KB; kb++) {
                    double dot = 0, dmag = 0;
                    for (int k = 128 * kb; k < 128 * kb + 128; k++) {
                        const double p = code(aq[(size_t)r * K + k]) * code(Q[((size_t)e * N + n) * K + k]);
                        dot += p;
                        dmag += std::fabs(p);
                    }
                    const double f = (double)as[(size_t)kb * as_stride + r] * S[((size_t)e * (N / 128) + n / 128) * KB + kb];
                    want += dot * f;
                    mag += dmag * f;
                }
                const double got = Y[(size_t)r * N + n], err = std::fabs(got - want) / (mag + 1e-30);
                worst = std::max(worst, std::isnan(got) ? INFINITY : err);
                if (!(err <= TOL) && bad++ < 5)
                    std::printf("FAIL E%d N%d K%d row %d col %d: %.9g vs %.9g\n", E, N, K, r, n, got, want);
            }
    long canary = 0;
    for (size_t i = (size_t)R * N; i < Y.size(); i++) canary += !std::isnan(Y[i]);
    std::printf("moe_gemm_wg_q8 E%d N%d K%d rows %d: worst rel. error %.2e, %ld bad, %ld canaries written\n", E, N, K, R,
                worst, bad, canary);
    failures += bad > 0 || canary > 0;
}

int main() {
    std::mt19937 rng(11);
    run({37, 0, 128, 65}, 128, 256, rng);    // partial tiles (both warpgroups, one alone), an empty expert
    run({1, 64, 130}, 256, 384, rng);        // two column blocks, three scale blocks, tiles of 1, 64, 128 + 2
    run({128}, 128, 128, rng);               // one scale block
    if (failures) {
        std::printf("%d failing cases\n", failures);
        return 1;
    }
    std::printf("moe_gemm_q8: the FP8-activation expert GEMM matches\n");
    return 0;
}
