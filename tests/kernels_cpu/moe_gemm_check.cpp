// The grouped expert GEMM of prompts on the CPU (QW_CPU): moe_gemm_split
// (64-row tiles, 128 threads; moe_gemm_split_k64 the same with k steps of 64)
// and moe_gemm_split128 (128-row tiles, 256
// threads) of kernels/moe_gemm.cu, their mma.sync / ldmatrix / cp.async path
// (kernels/mma.h emulates it), launched as the host launches them
// (host/engine/src/gpu/model.rs: the table of moe_plan_tiles, grid
// (ceil(N / MG_BN), the tiles and two block rows past them, which must return), block 2 BM, MG_STAGES (2 BM + MG_BN) MG_LD bf16 of dynamic
// shared memory), against Y[r][n] = sum_k (hi + lo)[r][k] W_e[n][k] in double
// precision. The activations are split as gather_split_bf16 splits them
// (split1: hi = bf16(x), lo = bf16(x - hi)). Expert row counts give tiles of
// 1, 16, 31, 32, 33, 63, 64 (and for 128-row tiles 65, 97, 128) rows, experts
// with 0, 1, BM, BM + 1 and 2 BM + 33 rows: every boundary of the warps that
// skip the products when their 32 rows lie past the tile's last row. N 192,
// 200 (not a multiple of MG_BN or of 8) and 256, K 64, 96 (an odd number of
// MG_BK steps over the 2-stage ring) and 32 (one step). Y rows past the last
// tile, activation rows past the last row, a weight block past the last expert
// and the unused shared memory are NaN; Y outside the tiles and the shared
// memory past the host's dynamic size must stay untouched. Every case runs
// twice: split, and with alo == nullptr (`--prefill-precision bf16`: the
// single-term path, Y = hi W_e^T; the lo array is NaN then, so a read of it
// shows). The *_fp8 kernels (block-FP8 experts: E4M3 codes, a scale per 128
// x 128 block, different in every block) run the fp8 cases: their Y must be
// bit-identical to the bf16 kernel's on the experts dequantized by an
// independent restatement of host/engine/src/fp8.rs (which the double
// reference then checks), N and K multiples of 128, K over up to three scale
// blocks, a 256-column block half past N, a NaN expert past the last and the
// same canaries. Exit 1 on a mismatch.
#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>
#include "moe_gemm.cu"

// Rows of Y and of the activations past the tiles (canaries).
constexpr int PAD_ROWS = 3;
constexpr int MG_STAGES = 2;  // model.rs MG_STAGES (the kernels' NS)
// f32 accumulation of 2K exact bf16 products: <= ~4e-7 of sum |terms| in
// practice (at most 2K 2^-24 ~1.1e-5 at K 96, far from reached); a dropped lo
// term (|lo| <= 2^-9 |x|) is off by up to ~1e-3 of it (most outputs past
// 1e-5), a wrong fragment, row or operand by ~1, a skipped product or a NaN
// fails outright.
constexpr double TOL = 1e-5;

using Kernel = void (*)(const bf16_t*, const bf16_t*, const bf16_t*, long long, const int*, float*, int, int);
using KernelFp8 = void (*)(const bf16_t*, const bf16_t*, const unsigned char*, const float*, const int*, float*, int,
                           int);

// fp8.rs restated: the E4M3 value of the byte, times the scale in f32, to
// bf16 (round to nearest even).
static bf16_t ref_fp8_bf16(unsigned char b, float s) {
    const int e = (b >> 3) & 15, m = b & 7;
    double v = e == 0 ? std::ldexp((double)m / 8.0, -6) : std::ldexp(1.0 + m / 8.0, e - 7);
    if (b & 0x80) v = -v;
    const float p = (float)v * s;
    unsigned u;
    std::memcpy(&u, &p, 4);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (bf16_t)(u >> 16);
}

struct Case {
    int bm;
    std::vector<int> counts;  // rows per expert
    int N, K;
    int wg = 0;  // 128 / 256: moe_gemm_split128_wg / _wg256 (bm 128), the warpgroup-MMA kernels, emulated
    bool k64 = false;  // moe_gemm_split_k64 (bm 64, k steps of 64)
    bool fp8 = false;  // also the *_fp8 kernel on the experts as block-FP8
};

// moe_plan_tiles' table: the tile count, then (expert, first row, rows <= bm)
// over rows sorted by expert.
static std::vector<int> moe_tiles(const std::vector<int>& counts, int bm) {
    std::vector<int> t{0};
    int start = 0;
    for (int e = 0; e < (int)counts.size(); e++) {
        for (int r = 0; r < counts[e]; r += bm) t.insert(t.end(), {e, start + r, std::min(counts[e] - r, bm)});
        start += counts[e];
    }
    t[0] = (int)(t.size() - 1) / 3;
    return t;
}

static bool run(const Case& c, unsigned seed, bool single) {
    const int bm = c.bm, N = c.N, K = c.K, E = (int)c.counts.size();
    const char* name = c.k64       ? "moe_gemm_split_k64"
                       : c.wg == 256 ? "moe_gemm_split128_wg256"
                       : c.wg        ? "moe_gemm_split128_wg"
                       : bm == 128   ? "moe_gemm_split128"
                                     : "moe_gemm_split";
    Kernel kernel = c.k64       ? moe_gemm_split_k64
                    : c.wg == 256 ? moe_gemm_split128_wg256
                    : c.wg        ? moe_gemm_split128_wg
                    : bm == 128   ? moe_gemm_split128
                                  : moe_gemm_split;
    KernelFp8 kernel8 = c.k64       ? moe_gemm_split_k64_fp8
                        : c.wg == 256 ? moe_gemm_split128_wg256_fp8
                        : c.wg        ? moe_gemm_split128_wg_fp8
                        : bm == 128   ? moe_gemm_split128_fp8
                                      : moe_gemm_split_fp8;
    int nn = 0;
    for (int n : c.counts) nn += n;
    const std::vector<int> tiles = moe_tiles(c.counts, bm);
    // Two block rows past the tiles, as the host's upper-bound grid has: they must return.
    const unsigned nt = (unsigned)tiles[0] + 2;

    std::mt19937 rng(seed);
    std::normal_distribution<float> nd(0.f, 1.f);
    const bf16_t bnan = 0x7fc0;
    const long long w_stride = (long long)N * K;
    std::vector<bf16_t> W((size_t)(E + 1) * w_stride, bnan);  // expert E: NaN, never read
    // fp8: codes (never the NaN ones) and block scales, W their bf16 values;
    // expert E all NaN codes and NaN scales.
    const int nb = N / 128, kb = K / 128;
    std::vector<unsigned char> Q(c.fp8 ? W.size() : 0, 0x7f);
    std::vector<float> S(c.fp8 ? (size_t)(E + 1) * nb * kb : 0, NAN);
    if (c.fp8) {
        std::uniform_int_distribution<int> code(0, 253);
        for (size_t i = 0; i < (size_t)E * nb * kb; i++) S[i] = std::exp(nd(rng)) / 64.f;
        for (size_t i = 0; i < (size_t)E * w_stride; i++) {
            const int b = code(rng);
            Q[i] = (unsigned char)(b >= 0x7f ? b + 1 : b);  // skips 0x7f (0xff is past 253 + 1)
            const size_t e = i / w_stride, n = i % w_stride / K, k = i % K;
            W[i] = ref_fp8_bf16(Q[i], S[(e * nb + n / 128) * kb + k / 128]);
        }
    } else {
        for (size_t i = 0; i < (size_t)E * w_stride; i++) W[i] = f2bf(0.5f * nd(rng));
    }
    std::vector<bf16_t> hi((size_t)(nn + PAD_ROWS) * K, bnan), lo(hi.size(), bnan);
    std::vector<double> x((size_t)nn * K);  // hi + lo, exactly
    std::vector<int> owner(nn);             // each row's expert
    for (int r = 0, e = 0, left = 0; r < nn; r++) {
        while (left == 0) left = c.counts[e++];
        owner[r] = e - 1;
        left--;
        const float scale = std::exp(nd(rng));  // rows of different magnitudes
        for (int k = 0; k < K; k++) {
            const size_t i = (size_t)r * K + k;
            split1(scale * nd(rng), &hi[i], &lo[i]);
            x[i] = (double)bf2f(hi[i]) + (single ? 0.0 : (double)bf2f(lo[i]));
            if (single) lo[i] = bnan;
        }
    }

    std::vector<float> Y((size_t)(nn + PAD_ROWS) * N, NAN);
    const size_t smem = c.wg    ? (single ? (size_t)MG_WG_STAGES1 * (128 + c.wg) : (size_t)MG_WG_STAGES * (256 + c.wg)) *
                                      MG_BK * sizeof(bf16_t)
                        : c.k64 ? (size_t)MG_STAGES * (2 * bm + MG_BN) * (64 + 8) * sizeof(bf16_t)
                                : (size_t)MG_STAGES * (2 * bm + MG_BN) * MG_LD * sizeof(bf16_t);
    if (smem > sizeof qw_cpu::dyn_smem) {
        std::printf("dynamic shared memory %zu > the harness's %zu\n", smem, sizeof qw_cpu::dyn_smem);
        return false;
    }
    std::memset(qw_cpu::dyn_smem, 0xff, sizeof qw_cpu::dyn_smem);  // bf16 NaN everywhere not staged
    const int bn = c.wg == 256 ? 256 : MG_BN;  // columns per block
    const unsigned gy = (unsigned)((N + bn - 1) / bn);
    const auto t0 = std::chrono::steady_clock::now();
    qw_cpu::launch({gy, nt, 1}, {(unsigned)(2 * bm), 1, 1},
                   [&] { kernel(hi.data(), single ? nullptr : lo.data(), W.data(), w_stride, tiles.data(), Y.data(), N, K); });
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

    bool smem_ok = true;
    for (size_t i = smem; i < sizeof qw_cpu::dyn_smem; i++) smem_ok &= qw_cpu::dyn_smem[i] == 0xff;

    double worst_rel = 0, worst_abs = 0;
    long bad = 0, canary = 0;
    for (int r = 0; r < nn + PAD_ROWS; r++)
        for (int n = 0; n < N; n++) {
            const float got = Y[(size_t)r * N + n];
            if (r >= nn) {
                canary += !std::isnan(got);
                continue;
            }
            const bf16_t* w = &W[(size_t)owner[r] * w_stride + (size_t)n * K];
            double want = 0, mag = 0;
            for (int k = 0; k < K; k++) {
                const double t = x[(size_t)r * K + k] * (double)bf2f(w[k]);
                want += t;
                mag += std::fabs(t);
            }
            const double err = std::fabs((double)got - want), rel = err / mag;
            if (!(rel <= TOL)) {  // NaN too
                if (bad < 3)
                    std::printf("  Y[%d][%d] (expert %d) = %.8g, want %.8g (err %.2e of %.2e)\n", r, n, owner[r], got,
                                want, err, mag);
                bad++;
            }
            worst_rel = std::isnan(rel) ? INFINITY : std::max(worst_rel, rel);
            worst_abs = std::isnan(err) ? INFINITY : std::max(worst_abs, err);
        }

    // The FP8 kernel: the same bits as the bf16 kernel's on the dequantized experts.
    long diff8 = 0;
    bool smem8_ok = true;
    if (c.fp8) {
        const int ar = single ? 128 : 256, ns = single ? MG_WG_STAGES1 : MG_WG_STAGES, bk = c.k64 ? 64 : MG_BK;
        const size_t smem8 = c.wg ? (size_t)ns * (ar * MG_BK * 2 + c.wg * MG_BK) + 2 * (size_t)c.wg * MG_BK * 2
                                  : (size_t)MG_STAGES * (2 * bm * (bk + 8) * 2 + MG_BN * bk) + MG_BN * (bk + 8) * 2;
        std::vector<float> Y8(Y.size(), NAN);
        std::memset(qw_cpu::dyn_smem, 0xff, sizeof qw_cpu::dyn_smem);
        qw_cpu::launch({gy, nt, 1}, {(unsigned)(2 * bm), 1, 1}, [&] {
            kernel8(hi.data(), single ? nullptr : lo.data(), Q.data(), S.data(), tiles.data(), Y8.data(), N, K);
        });
        for (size_t i = smem8; i < sizeof qw_cpu::dyn_smem; i++) smem8_ok &= qw_cpu::dyn_smem[i] == 0xff;
        for (size_t i = 0; i < Y.size(); i++) diff8 += std::memcmp(&Y[i], &Y8[i], sizeof(float)) != 0;
    }

    std::string rows;
    for (size_t i = 3; i < tiles.size(); i += 3) rows += std::to_string(tiles[i]) + (i + 3 < tiles.size() ? "," : "");
    const bool ok = bad == 0 && canary == 0 && smem_ok && diff8 == 0 && smem8_ok;
    std::printf("%-23s%s %-6s N %3d K %3d counts", name, c.fp8 ? "+fp8" : "    ", single ? "single" : "split", N, K);
    for (int n : c.counts) std::printf(" %d", n);
    std::printf(" | tiles %s | %ld bad, %ld canaries hit%s, max err %.2e abs, %.2e of sum|terms| (%.1f s)", rows.c_str(),
                bad, canary, smem_ok ? "" : ", smem past the dynamic size written", worst_abs, worst_rel, secs);
    if (c.fp8)
        std::printf(" | fp8: %ld outputs differ from bf16%s", diff8, smem8_ok ? "" : ", smem past the dynamic size written");
    std::printf("  %s\n", ok ? "ok" : "FAIL");
    return ok;
}

int main() {
    const auto t0 = std::chrono::steady_clock::now();
    const Case cases[] = {
        {64, {0, 1, 64, 65, 161}, 200, 96},     // tiles 1 | 64 | 64 1 | 64 64 33
        {64, {31, 32, 63, 80}, 256, 64},        // tiles 31 | 32 | 63 | 64 16
        {64, {16, 97, 33}, 192, 32},            // one k step: tiles 16 | 64 33 | 33
        {128, {0, 1, 128, 129, 289}, 256, 64},  // tiles 1 | 128 | 128 1 | 128 128 33
        {128, {32, 64, 65, 97, 144}, 200, 96},  // tiles 32 | 64 | 65 | 97 | 128 16
        {128, {31, 33, 63}, 192, 64},           // tiles 31 | 33 | 63
        {128, {0, 1, 128, 129, 289}, 256, 64, 128},  // the same tiles through the warpgroup MMA
        {128, {32, 64, 65, 97, 144}, 200, 96, 128},
        {128, {31, 33, 63}, 192, 32, 128},          // one k step
        {128, {0, 1, 128, 129, 289}, 512, 64, 256},  // 256 columns per block
        {128, {32, 64, 65, 97, 144}, 392, 96, 256},  // a partial second column block
        {128, {31, 33, 63}, 200, 32, 256},          // fewer columns than one block
        {128, {97, 128, 5}, 256, 352, 256},         // 11 k steps: both rings wrap (4 stages split, 8 single)
        {128, {97, 128, 5}, 128, 352, 128},
        {64, {0, 1, 64, 65, 161}, 200, 192, 0, true},  // k steps of 64: three
        {64, {31, 32, 63, 80}, 256, 128, 0, true},     // an even number of steps over the 2-stage ring
        {64, {16, 97, 33}, 192, 64, 0, true},          // one k step
        // Block-FP8 experts, every kernel: k over 1-3 scale blocks.
        {64, {0, 1, 64, 65, 161}, 256, 128, 0, false, true},
        {64, {31, 32, 63, 80}, 128, 384, 0, true, true},
        {128, {0, 1, 128, 129, 289}, 256, 256, 0, false, true},
        {128, {32, 64, 65, 97, 144}, 256, 384, 128, false, true},
        {128, {31, 33, 63}, 384, 256, 256, false, true},  // the second 128 columns of a block past N
        {128, {97, 128, 5}, 512, 128, 256, false, true},
    };
    int bad = 0, n = 0;
    unsigned seed = 7;
    for (const Case& c : cases)
        for (bool single : {false, true}) {
            bad += !run(c, seed++, single);
            n++;
        }
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("moe_gemm_check: %d of %d launches match (tolerance %.0e of sum|terms|), %.1f s: %s\n", n - bad, n, TOL,
                secs, bad ? "FAIL" : "PASS");
    return bad ? 1 : 0;
}
