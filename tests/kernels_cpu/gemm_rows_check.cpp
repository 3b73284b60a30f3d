// The few-row projection of kernels/gemm_rows.cu on the CPU (QW_CPU, its
// mma.sync path emulated by kernels/mma.h), launched as ops.rs launches it
// (ceil(ceil(N / 32) S / 4) blocks of 128, then gemm_rows_reduce when S > 1),
// against Y[b][n] = sum_k (hi + lo)(X[b][k]) W[n][k] in double precision with
// hi = bf16(x), lo = bf16(x - hi). Rows 2, 7, 8 (one tile), 9, 16, 17, 33 and
// 64; N 48 (past the last 32-row group), 64 and 200; K 32 (one step), 96 and
// 256 split into 1, 2 and 4 slices; with and without accumulate. Y past the
// B N outputs is a canary that must stay untouched. Then moe_rows8, the
// routed experts' variant over moe_plan_tiles' table, and gemm_rows_bulk(16) (the
// weights through a shared-memory ring, copied by the block here) and
// gemm_rows_bulk32 (17-32 rows, K slices summed by gemm_rows_reduce), then
// the block-FP8 forms. Exit 1 on a mismatch.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>
#include "gemm_rows.cu"
#include "plan_tiles.h"

// f32 accumulation of 2K exact bf16 products (see moe_gemm_check.cpp).
constexpr double TOL = 1e-5;
constexpr int CANARY = 5;

using Kernel = void (*)(const float*, const bf16_t*, float*, float*, int, int, int, int, int);

static float split_sum(float x) {
    const bf16_t h = f2bf(x);
    return bf2f(h) + bf2f(f2bf(x - bf2f(h)));
}

// Outputs of Y [B][N] off Y0 (accumulate) + sum_k (hi + lo)(X[b][k]) W[n][k]
// by more than TOL of the sum of magnitudes, plus canaries past B N that
// moved; the worst relative error into *worst.
static int rows_wrong(const std::vector<float>& X, const std::vector<bf16_t>& W, const std::vector<float>& Y,
                      const std::vector<float>& Y0, int B, int N, int K, int accumulate, double* worst) {
    int wrong = 0;
    for (int b = 0; b < B; b++)
        for (int n = 0; n < N; n++) {
            double want = accumulate ? Y0[(size_t)b * N + n] : 0.0, mag = std::fabs(want);
            for (int kk = 0; kk < K; kk++) {
                const double p = (double)split_sum(X[(size_t)b * K + kk]) * bf2f(W[(size_t)n * K + kk]);
                want += p;
                mag += std::fabs(p);
            }
            const double err = std::fabs(Y[(size_t)b * N + n] - want) / (mag + 1e-30);
            *worst = std::max(*worst, err);
            wrong += !(err <= TOL);
        }
    for (int i = 0; i < CANARY; i++) wrong += std::memcmp(&Y[(size_t)B * N + i], &Y0[(size_t)B * N + i], 4) != 0;
    return wrong;
}

// Expert outputs Y [rows][N] off (hi + lo) W_e^T over the tile table, and
// canaries past rows N (NaN before the launch) that were written.
static int moe_wrong(const std::vector<bf16_t>& hi, const std::vector<bf16_t>& lo, const std::vector<bf16_t>& W,
                     const std::vector<int>& tiles, const std::vector<float>& Y, int rows, int N, int K) {
    int wrong = 0;
    for (int t = 0; t < tiles[0]; t++) {
        const int e = tiles[1 + 3 * t], r0 = tiles[2 + 3 * t], cnt = tiles[3 + 3 * t];
        for (int r = r0; r < r0 + cnt; r++)
            for (int n = 0; n < N; n++) {
                double want = 0, mag = 0;
                for (int kk = 0; kk < K; kk++) {
                    const double p = ((double)bf2f(hi[(size_t)r * K + kk]) + bf2f(lo[(size_t)r * K + kk])) *
                                     bf2f(W[((size_t)e * N + n) * K + kk]);
                    want += p;
                    mag += std::fabs(p);
                }
                wrong += !(std::fabs(Y[(size_t)r * N + n] - want) <= TOL * (mag + 1e-30));
            }
    }
    for (int i = 0; i < CANARY; i++) wrong += !std::isnan(Y[(size_t)rows * N + i]);
    return wrong;
}

// A projection's operands: activations X [B][K], weights W [N][K] and Y
// [B][N] drawn from nd (in that order), Y's first values kept as Y0 (for
// accumulate), CANARY values past Y, NaN partials of S K slices.
struct RowsData {
    std::vector<float> X, Y, Y0, part;
    std::vector<bf16_t> W;
    RowsData(int B, int N, int K, int S, std::mt19937& rng, std::normal_distribution<float>& nd)
        : X((size_t)B * K), Y((size_t)B * N + CANARY), part((size_t)S * B * N, NAN), W((size_t)N * K) {
        for (auto& v : X) v = nd(rng);
        for (auto& v : W) v = f2bf(nd(rng));
        for (auto& v : Y) v = nd(rng);
        Y0 = Y;
    }
};

// gemm_rows_reduce over S > 1 slices of part into Y, as ops.rs launches it.
static void reduce_slices(int B, int N, int S, int accumulate, std::vector<float>& part, std::vector<float>& Y) {
    if (S <= 1) return;
    const long long n = (long long)B * N;
    qw_cpu::launch({(unsigned)((n + 255) / 256), 1, 1}, {256, 1, 1},
                   [&] { gemm_rows_reduce(part.data(), Y.data(), n, S, accumulate); });
}

// launch() as ops.rs launches gemm_rows* (ceil(ceil(N / 32) S / 4) blocks of
// 128), then gemm_rows_reduce when S > 1.
template <typename Launch>
static void run_rows(int B, int N, int S, int accumulate, std::vector<float>& part, std::vector<float>& Y,
                     Launch launch) {
    const int groups = (N + 31) / 32;
    qw_cpu::launch({(unsigned)((groups * S + 3) / 4), 1, 1}, {128, 1, 1}, launch);
    reduce_slices(B, N, S, accumulate, part, Y);
}

int main() {
    std::mt19937 rng(11);
    std::normal_distribution<float> nd;
    int bad = 0, n_cases = 0;
    for (int B : {2, 7, 8, 9, 16, 17, 33, 64})
        for (int N : {48, 64, 200})
            for (int K : {32, 96, 256})
                for (int S : {1, 2, 4}) {
                    if ((K / 32) % S != 0) continue;
                    for (int accumulate : {0, 1}) {
                        Kernel k = B <= 8 ? gemm_rows8 : B <= 16 ? gemm_rows16 : B <= 32 ? gemm_rows32 : gemm_rows64;
                        RowsData r(B, N, K, S, rng, nd);
                        auto& [X, Y, Y0, part, W] = r;
                        run_rows(B, N, S, accumulate, part, Y, [&] {
                            k(X.data(), W.data(), Y.data(), part.data(), B, N, K, S, accumulate);
                        });
                        double worst = 0;
                        const int wrong = rows_wrong(X, W, Y, Y0, B, N, K, accumulate, &worst);
                        n_cases++;
                        if (wrong) {
                            bad++;
                            std::printf("B %2d N %3d K %3d S %d acc %d: FAIL (%d wrong, worst %.2e)\n", B, N, K, S,
                                        accumulate, wrong, worst);
                        }
                    }
                }
    // moe_rows8: experts of 1, 8, 3 and 8 rows (tiles of at most 8, in plan
    // order), a grid row past the table's count, N 48 and 64, K 32 and 256.
    for (int N : {48, 64})
        for (int K : {32, 256}) {
            const std::vector<int> counts = {1, 8, 0, 3, 8};
            int rows;
            const std::vector<int> tiles = plan_tiles(counts, &rows);
            const int E = (int)counts.size();
            std::vector<bf16_t> hi((size_t)rows * K), lo((size_t)rows * K), W((size_t)E * N * K);
            for (size_t i = 0; i < hi.size(); i++) {
                const float x = nd(rng);
                hi[i] = f2bf(x);
                lo[i] = f2bf(x - bf2f(hi[i]));
            }
            for (auto& v : W) v = f2bf(nd(rng));
            std::vector<float> Y((size_t)rows * N + CANARY, NAN);
            const int blocks = ((N + 31) / 32 + 3) / 4;
            qw_cpu::launch({(unsigned)blocks, (unsigned)tiles[0] + 1, 1}, {128, 1, 1}, [&] {
                moe_rows8(hi.data(), lo.data(), W.data(), (long long)N * K, tiles.data(), Y.data(), N, K);
            });
            const int wrong = moe_wrong(hi, lo, W, tiles, Y, rows, N, K);
            n_cases++;
            if (wrong) {
                bad++;
                std::printf("moe_rows8 N %d K %d: FAIL (%d wrong)\n", N, K, wrong);
            }
        }
    // gemm_rows_bulk: 2-8 rows, N past the last 8-row slot (13, 200) and one
    // slot (8), K 256 (one warp) and 512 (two); gemm_rows_bulk16: 9-16 rows
    // (two row tiles), K 128 (one warp of 128 columns) and 256 (two). Rings
    // of 1-3 slots, one block or several (down to one slot each), with and
    // without accumulate, in turn over the cases.
    int turn = 0;
    for (int B : {2, 7, 8, 9, 12, 16})
        for (int N : {8, 13, 200})
            for (int kw : {1, 2}) {
                const bool two = B > 8;  // gemm_rows_bulk16: 128 columns a warp
                const int K = kw * (two ? 128 : 256);
                const int grids[] = {1, 3, 64};
                const int stages = 1 + turn % 3, accumulate = turn % 2;
                const int slots = (N + RB_ROWS - 1) / RB_ROWS, blocks = std::min(grids[turn / 3 % 3], slots);
                turn++;
                RowsData r(B, N, K, 1, rng, nd);
                [[maybe_unused]] auto& [X, Y, Y0, part, W] = r;
                qw_cpu::launch({(unsigned)blocks, 1, 1}, {(unsigned)K / (two ? 4 : 8), 1, 1}, [&] {
                    (two ? gemm_rows_bulk16 : gemm_rows_bulk)(X.data(), W.data(), Y.data(), B, N, K, accumulate,
                                                              stages);
                });
                double worst = 0;
                const int wrong = rows_wrong(X, W, Y, Y0, B, N, K, accumulate, &worst);
                n_cases++;
                if (wrong) {
                    bad++;
                    std::printf("gemm_rows_bulk%s B %d N %3d K %3d stages %d blocks %d acc %d: FAIL (%d wrong)\n",
                                two ? "16" : "", B, N, K, stages, blocks, accumulate, wrong);
                }
            }
    // gemm_rows_bulk32: 17-32 rows (four row tiles), K in 1, 2 or 4 slices of
    // 64-512 columns (64 a warp), the slices summed by gemm_rows_reduce; N
    // past the last slot, rings of 1-3 slots, one block to a block a slot.
    turn = 0;
    for (int B : {17, 24, 32})
        for (int N : {13, 200})
            for (int K : {64, 256, 512})
                for (int S : {1, 2, 4}) {
                    const int KS = K / S;
                    if (KS % 64 != 0) continue;
                    const int grids[] = {1, 3, 64};
                    const int stages = 1 + turn % 3, accumulate = turn % 2;
                    const int slots = (N + RB_ROWS - 1) / RB_ROWS, blocks = std::min(grids[turn / 3 % 3], slots);
                    turn++;
                    RowsData r(B, N, K, S, rng, nd);
                    auto& [X, Y, Y0, part, W] = r;
                    qw_cpu::launch({(unsigned)blocks, (unsigned)S, 1}, {(unsigned)KS / 2, 1, 1}, [&] {
                        gemm_rows_bulk32(X.data(), W.data(), Y.data(), part.data(), B, N, K, accumulate, stages);
                    });
                    reduce_slices(B, N, S, accumulate, part, Y);
                    double worst = 0;
                    const int wrong = rows_wrong(X, W, Y, Y0, B, N, K, accumulate, &worst);
                    n_cases++;
                    if (wrong) {
                        bad++;
                        std::printf("gemm_rows_bulk32 B %d N %3d K %3d S %d stages %d blocks %d acc %d: FAIL (%d "
                                    "wrong)\n",
                                    B, N, K, S, stages, blocks, accumulate, wrong);
                    }
                }
    // Block-FP8 weights (gemm_rows8_fp8, gemm_rows16_fp8, moe_rows8_fp8):
    // random E4M3 codes (never the NaN code) with a scale per 128x128 block,
    // against the same sums over their bf16 values (fp8_bf16, the
    // dequantize-at-upload path's). N 128 and 256, K 128 and 384 (one and
    // three scale blocks), 2-16 rows, K split in 1 or 2 slices.
    std::uniform_int_distribution<int> code(0, 253);
    std::uniform_real_distribution<float> scale(0.5f, 2.f);
    auto fp8_weights = [&](int E, int N, int K, std::vector<unsigned char>& Q, std::vector<float>& Sc,
                           std::vector<bf16_t>& Wb) {
        Q.resize((size_t)E * N * K), Sc.resize((size_t)E * (N / 128) * (K / 128)), Wb.resize(Q.size());
        for (auto& q : Q) {
            const int v = code(rng);  // 0..126 and 128..254: 127 and 255 are NaN
            q = (unsigned char)(v < 127 ? v : v + 1);
        }
        for (auto& v : Sc) v = scale(rng) / 448.f;
        for (int e = 0; e < E; e++)
            for (int n = 0; n < N; n++)
                for (int k = 0; k < K; k++) {
                    const size_t at = ((size_t)e * N + n) * K + k;
                    Wb[at] = fp8_bf16(Q[at], Sc[((size_t)e * (N / 128) + n / 128) * (K / 128) + k / 128]);
                }
    };
    for (int B : {2, 8, 13, 16})
        for (int N : {128, 256})
            for (int K : {128, 384})
                for (int S : {1, 2}) {
                    if ((K / 64) % S != 0) continue;  // slices of whole 64-column steps
                    const int accumulate = (B + N + K + S) % 2;
                    std::vector<unsigned char> Q;
                    std::vector<float> Sc, X((size_t)B * K), Y((size_t)B * N + CANARY), part((size_t)S * B * N);
                    std::vector<bf16_t> Wb;
                    fp8_weights(1, N, K, Q, Sc, Wb);
                    for (auto& v : X) v = nd(rng);
                    for (auto& v : Y) v = nd(rng);
                    const std::vector<float> Y0 = Y;
                    run_rows(B, N, S, accumulate, part, Y, [&] {
                        (B <= 8 ? gemm_rows8_fp8 : gemm_rows16_fp8)(X.data(), Q.data(), Sc.data(), Y.data(),
                                                                    part.data(), B, N, K, S, accumulate);
                    });
                    double worst = 0;
                    const int wrong = rows_wrong(X, Wb, Y, Y0, B, N, K, accumulate, &worst);
                    n_cases++;
                    if (wrong) {
                        bad++;
                        std::printf("gemm_rows_fp8 B %d N %d K %d S %d: FAIL (%d wrong)\n", B, N, K, S, wrong);
                    }
                }
    for (int N : {128, 256})
        for (int K : {128, 384}) {
            const std::vector<int> counts = {3, 0, 8, 1};
            int rows;
            const std::vector<int> tiles = plan_tiles(counts, &rows);
            std::vector<unsigned char> Q;
            std::vector<float> Sc;
            std::vector<bf16_t> Wb, hi((size_t)rows * K), lo((size_t)rows * K);
            fp8_weights((int)counts.size(), N, K, Q, Sc, Wb);
            for (size_t i = 0; i < hi.size(); i++) {
                const float x = nd(rng);
                hi[i] = f2bf(x);
                lo[i] = f2bf(x - bf2f(hi[i]));
            }
            std::vector<float> Y((size_t)rows * N + CANARY, NAN);
            qw_cpu::launch({(unsigned)(((N + 31) / 32 + 3) / 4), (unsigned)tiles[0] + 1, 1}, {128, 1, 1}, [&] {
                moe_rows8_fp8(hi.data(), lo.data(), Q.data(), Sc.data(), tiles.data(), Y.data(), N, K);
            });
            const int wrong = moe_wrong(hi, lo, Wb, tiles, Y, rows, N, K);
            n_cases++;
            if (wrong) {
                bad++;
                std::printf("moe_rows8_fp8 N %d K %d: FAIL (%d wrong)\n", N, K, wrong);
            }
        }
    std::printf("gemm_rows_check: %d of %d cases within %.0e\n", n_cases - bad, n_cases, TOL);
    return bad ? 1 : 0;
}
