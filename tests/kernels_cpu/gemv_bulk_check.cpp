// The decode GEMVs of kernels/gemv_bulk.cu on the CPU (QW_CPU: each slot is
// copied by the block instead of by cp.async.bulk) against double precision:
// the norm mode (y = W . (x * nw) / rms(x) from partial sums of squares) and
// the residual mode (y += W . x, per-block sums of squares of the new y,
// zeros past the grid), both slot sizes (8 rows for cols <= 2048, 4 rows up
// to 4096), columns that leave lanes or whole warps idle, row counts that end
// in a partial slot, one to many blocks and 1 to 3 ring slots; and the GDN
// in projection with the conv folded in (dec_gemv_bulk_conv) against the
// plain norm-mode kernel followed by the conv: the same projected values,
// the conv + SiLU within 1e-6 of the sum of its terms' sizes, the shifted history exactly, rows past the
// conv channels untouched by it. Exit 1 on a mismatch.
#include <cstdio>
#include <random>
#include <vector>
#include "gemv_bulk.cu"

static int failures = 0;

static unsigned short to_bf16(float f) {
    unsigned u;
    std::memcpy(&u, &f, 4);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (unsigned short)(u >> 16);
}

static void check(int rows, int cols, unsigned grid, int stages, bool norm, std::mt19937& rng) {
    std::normal_distribution<float> nd;
    std::vector<bf16_t> W((size_t)rows * cols);
    for (auto& w : W) w = to_bf16(nd(rng) * 0.05f);
    std::vector<float> x(cols), nw(cols), y(rows), y0(rows);
    for (auto& v : x) v = nd(rng);
    for (auto& v : nw) v = 1.f + 0.1f * nd(rng);
    for (auto& v : y0) v = nd(rng);
    y = y0;
    // The residual kernels' partial sums of squares of x: split over 5 entries.
    const int nssq = 5;
    std::vector<float> ssq(nssq, 0.f);
    double ss = 0;
    for (int i = 0; i < cols; i++) {
        ssq[i % nssq] += x[i] * x[i];
        ss += (double)x[i] * x[i];
    }
    const float eps = 1e-6f;
    const int nout = (int)grid + 3;
    std::vector<float> ssq_out(nout, -1.f);
    const bool wide = cols > 2048;
    auto kernel = [&] {
        if (wide)
            dec_gemv_bulk2(W.data(), x.data(), norm ? ssq.data() : nullptr, norm ? nssq : nout,
                           norm ? nw.data() : nullptr, eps, y.data(), rows, cols, 1, norm ? nullptr : ssq_out.data(),
                           stages);
        else
            dec_gemv_bulk1(W.data(), x.data(), norm ? ssq.data() : nullptr, norm ? nssq : nout,
                           norm ? nw.data() : nullptr, eps, y.data(), rows, cols, 1, norm ? nullptr : ssq_out.data(),
                           stages);
    };
    qw_cpu::launch({grid, 1, 1}, {256, 1, 1}, kernel);
    const double inv = 1.0 / std::sqrt(ss / cols + eps);
    double worst = 0, sq = 0;
    for (int r = 0; r < rows; r++) {
        double d = 0, mag = 0;
        for (int c = 0; c < cols; c++) {
            const double a = norm ? (double)x[c] * nw[c] : x[c];
            const double p = (double)bf2f(W[(size_t)r * cols + c]) * a;
            d += p;
            mag += std::fabs(p);
        }
        const double want = norm ? d * inv : y0[r] + d;
        const double scale = norm ? mag * inv : mag + std::fabs(y0[r]);
        worst = std::max(worst, std::fabs(y[r] - want) / (scale + 1e-30));
        sq += (double)y[r] * y[r];
    }
    const char* mode = norm ? "norm" : "residual";
    if (worst > 1e-5) {
        std::printf("%s rows %d cols %d grid %u stages %d: relative error %.3g\n", mode, rows, cols, grid, stages, worst);
        failures++;
    }
    if (!norm) {
        double got = 0;
        for (unsigned b = 0; b < grid; b++) got += ssq_out[b];
        bool zeros = true;
        for (int b = (int)grid; b < nout; b++) zeros &= ssq_out[b] == 0.f;
        if (std::fabs(got - sq) > 1e-5 * sq || !zeros) {
            std::printf("%s rows %d cols %d grid %u: sum of squares %.9g, want %.9g, zeros past the grid %d\n", mode,
                        rows, cols, grid, got, sq, zeros);
            failures++;
        }
    }
}

// dec_gemv_bulk_conv against dec_gemv_bulk1 (norm mode) + the conv on the host.
static void check_conv(int rows, int cols, unsigned grid, int stages, int conv_dim, int K, std::mt19937& rng) {
    std::normal_distribution<float> nd;
    std::vector<bf16_t> W((size_t)rows * cols);
    for (auto& w : W) w = to_bf16(nd(rng) * 0.05f);
    std::vector<float> x(cols), nw(cols), conv_w((size_t)conv_dim * K), hist((size_t)conv_dim * (K - 1));
    for (auto& v : x) v = nd(rng);
    for (auto& v : nw) v = 1.f + 0.1f * nd(rng);
    for (auto& v : conv_w) v = 0.5f * nd(rng);
    for (auto& v : hist) v = nd(rng);
    std::vector<float> ssq(3, 0.f);
    for (int i = 0; i < cols; i++) ssq[i % 3] += x[i] * x[i];
    const float eps = 1e-6f;
    std::vector<float> plain(rows, NAN), y(rows, NAN), h = hist;
    qw_cpu::launch({grid, 1, 1}, {256, 1, 1}, [&] {
        dec_gemv_bulk1(W.data(), x.data(), ssq.data(), 3, nw.data(), eps, plain.data(), rows, cols, 0, nullptr,
                       stages);
    });
    qw_cpu::launch({grid, 1, 1}, {256, 1, 1}, [&] {
        dec_gemv_bulk_conv(W.data(), x.data(), ssq.data(), 3, nw.data(), eps, y.data(), rows, cols, 0, nullptr,
                           stages, conv_w.data(), h.data(), K, conv_dim);
    });
    const int H = K - 1;
    double worst = 0;
    bool hist_ok = true, rest_ok = true;
    for (int r = 0; r < rows; r++) {
        if (r >= conv_dim) {
            rest_ok &= y[r] == plain[r];
            continue;
        }
        double acc = (double)conv_w[(size_t)r * K + H] * plain[r];
        double mag = std::fabs(acc);
        for (int q = 0; q < H; q++) {
            const double t = (double)conv_w[(size_t)r * K + q] * hist[(size_t)r * H + q];
            acc += t;
            mag += std::fabs(t);
        }
        const double want = acc / (1 + std::exp(-acc));  // |silu'| < 1.1: errors scale with mag
        worst = std::max(worst, std::isnan(y[r]) ? INFINITY : std::fabs(y[r] - want) / (mag + 1e-30));
        for (int q = 0; q + 1 < H; q++) hist_ok &= h[(size_t)r * H + q] == hist[(size_t)r * H + q + 1];
        if (H > 0) hist_ok &= h[(size_t)r * H + H - 1] == plain[r];
    }
    if (!(worst < 1e-6) || !hist_ok || !rest_ok) {
        std::printf("conv rows %d cols %d grid %u stages %d conv_dim %d K %d: conv error %.3g, history exact %d, "
                    "other rows equal %d\n",
                    rows, cols, grid, stages, conv_dim, K, worst, hist_ok, rest_ok);
        failures++;
    }
}

int main() {
    std::mt19937 rng(7);
    struct Case {
        int rows, cols;
        unsigned grid;
        int stages;
    };
    const Case cases[] = {
        {1, 8, 1, 1},      {37, 64, 3, 2},    {64, 144, 8, 3},    {100, 128, 1, 3}, {29, 256, 4, 1},
        {45, 2048, 5, 2},  {9, 2000, 2, 3},   {23, 4096, 3, 2},   {17, 2056, 2, 1}, {40, 3000, 7, 3},
        {1281, 64, 11, 3}, {250, 1024, 31, 2},
    };
    for (const auto& c : cases)
        for (bool norm : {true, false}) {
            // at most one block per slot of rows, as the host launches
            const int slots = (c.rows + (c.cols > 2048 ? 4 : 8) - 1) / (c.cols > 2048 ? 4 : 8);
            check(c.rows, c.cols, std::min<unsigned>(c.grid, (unsigned)slots), c.stages, norm, rng);
        }
    // The conv fold: the 35B in projection's shape (12,352 rows, 8,192 conv
    // channels, K 4) on 132 blocks, and small ones with partial slots, the
    // conv channels ending inside a slot and inside a block, and K 2.
    const int conv_cases[][6] = {
        {12352, 2048, 132, 4, 8192, 4}, {100, 64, 3, 2, 45, 4}, {37, 256, 5, 1, 37, 2},
        {64, 2048, 2, 3, 60, 4},        {29, 128, 4, 2, 8, 3},
    };
    for (const auto& c : conv_cases) check_conv(c[0], c[1], (unsigned)c[2], c[3], c[4], c[5], rng);
    std::printf("gemv_bulk_check: %s\n", failures ? "FAIL" : "PASS");
    return failures ? 1 : 0;
}
