// The few-row projection of kernels/gemm_rows.cu on the CPU (QW_CPU, its
// mma.sync path emulated by kernels/mma.h), launched as ops.rs launches it
// (ceil(ceil(N / 32) S / 4) blocks of 128, then gemm_rows_reduce when S > 1),
// against Y[b][n] = sum_k (hi + lo)(X[b][k]) W[n][k] in double precision with
// hi = bf16(x), lo = bf16(x - hi). Rows 2, 7, 8 (one tile), 9, 16, 17, 33 and
// 64; N 48 (past the last 32-row group), 64 and 200; K 32 (one step), 96 and
// 256 split into 1, 2 and 4 slices; with and without accumulate. Y past the
// B N outputs is a canary that must stay untouched. Exit 1 on a mismatch.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>
#include "gemm_rows.cu"

// f32 accumulation of 2K exact bf16 products (see moe_gemm_check.cpp).
constexpr double TOL = 1e-5;
constexpr int CANARY = 5;

using Kernel = void (*)(const float*, const bf16_t*, float*, float*, int, int, int, int, int);

static float split_sum(float x) {
    const bf16_t h = f2bf(x);
    return bf2f(h) + bf2f(f2bf(x - bf2f(h)));
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
                        std::vector<float> X((size_t)B * K), Y((size_t)B * N + CANARY), part((size_t)S * B * N, NAN);
                        std::vector<bf16_t> W((size_t)N * K);
                        for (auto& v : X) v = nd(rng);
                        for (auto& v : W) v = f2bf(nd(rng));
                        for (auto& v : Y) v = nd(rng);
                        const std::vector<float> Y0 = Y;
                        const int groups = (N + 31) / 32;
                        qw_cpu::launch({(unsigned)((groups * S + 3) / 4), 1, 1}, {128, 1, 1},
                                       [&] { k(X.data(), W.data(), Y.data(), part.data(), B, N, K, S, accumulate); });
                        if (S > 1) {
                            const long long n = (long long)B * N;
                            qw_cpu::launch({(unsigned)((n + 255) / 256), 1, 1}, {256, 1, 1},
                                           [&] { gemm_rows_reduce(part.data(), Y.data(), n, S, accumulate); });
                        }
                        double worst = 0;
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
                                worst = std::max(worst, err);
                                wrong += !(err <= TOL);
                            }
                        for (int i = 0; i < CANARY; i++)
                            wrong += std::memcmp(&Y[(size_t)B * N + i], &Y0[(size_t)B * N + i], 4) != 0;
                        n_cases++;
                        if (wrong) {
                            bad++;
                            std::printf("B %2d N %3d K %3d S %d acc %d: FAIL (%d wrong, worst %.2e)\n", B, N, K, S,
                                        accumulate, wrong, worst);
                        }
                    }
                }
    std::printf("gemm_rows_check: %d of %d cases within %.0e\n", n_cases - bad, n_cases, TOL);
    return bad ? 1 : 0;
}
