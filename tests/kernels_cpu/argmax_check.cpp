// The greedy readout of kernels/argmax.cu on the CPU (QW_CPU): argmax_partial
// then argmax_final over rows of a batch, each row with or without a
// constrained-decoding mask (token_mask.h), against a plain reference on the
// row with the tokens the mask leaves out at -inf: the token (ties: lower
// id), the max exactly, ln Σ e^(z - max) within 1e-5; a row whose allowed
// tokens are all -inf finds no token. Exit 1 on a mismatch.
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>
#include "argmax.cu"

static int failures = 0;

static void check(const char* what, int n, int rows, int parts, std::mt19937& rng) {
    std::normal_distribution<float> nd(0.f, 3.f);
    std::vector<float> x((size_t)rows * n);
    for (auto& v : x) v = std::round(nd(rng) * 4.f) / 4.f;  // ties
    // Row r: no mask (r % 3 == 0), a sparse mask, or a dense one without the row's max.
    std::vector<std::vector<unsigned>> bits(rows);
    std::vector<unsigned long long> table(rows, 0);
    for (int r = 0; r < rows; r++) {
        if (r % 3 == 0) continue;
        bits[r].assign((n + 31) / 32, 0u);
        const int every = r % 3 == 1 ? 101 : 2;
        for (int i = r % 7; i < n; i += every) bits[r][i / 32] |= 1u << (i % 32);
        table[r] = (unsigned long long)(size_t)bits[r].data();
    }
    if (rows > 2) {  // every allowed token of row 2 at -inf: no token found
        for (int i = 0; i < n; i++)
            if ((bits[2][i / 32] >> (i % 32)) & 1u) x[(size_t)2 * n + i] = -INFINITY;
    }
    std::vector<float> part((size_t)rows * parts * 3), out((size_t)rows * 4, NAN);
    qw_cpu::launch({(unsigned)parts, (unsigned)rows, 1}, {256, 1, 1},
                   [&] { argmax_partial(x.data(), n, table.data(), part.data()); });
    qw_cpu::launch({(unsigned)rows, 1, 1}, {256, 1, 1},
                   [&] { argmax_final(part.data(), parts, out.data(), nullptr); });
    for (int r = 0; r < rows; r++) {
        int best = -1;
        double m = -INFINITY, e = 0;
        auto val = [&](int i) {
            const bool ok = table[r] == 0 || ((bits[r][i / 32] >> (i % 32)) & 1u);
            return ok ? (double)x[(size_t)r * n + i] : -INFINITY;
        };
        for (int i = 0; i < n; i++)
            if (val(i) > m) { m = val(i); best = i; }
        for (int i = 0; i < n; i++)
            if (val(i) > -INFINITY) e += std::exp(val(i) - m);
        const int got = __float_as_int(out[4 * r]);
        if (best < 0) {
            if (got != 0x7fffffff) { std::printf("%s row %d: token %d, want none\n", what, r, got); failures++; }
            continue;
        }
        if (got != best || out[4 * r + 1] != (float)m || std::fabs(out[4 * r + 2] - std::log(e)) > 1e-5) {
            std::printf("%s row %d: %d %g %.7g, want %d %g %.7g\n", what, r, got, out[4 * r + 1], out[4 * r + 2],
                        best, m, std::log(e));
            failures++;
        }
    }
    // No table at all: every row unmasked.
    std::vector<float> out2((size_t)rows * 4);
    qw_cpu::launch({(unsigned)parts, (unsigned)rows, 1}, {256, 1, 1},
                   [&] { argmax_partial(x.data(), n, nullptr, part.data()); });
    qw_cpu::launch({(unsigned)rows, 1, 1}, {256, 1, 1},
                   [&] { argmax_final(part.data(), parts, out2.data(), nullptr); });
    for (int r = 0; r < rows; r++) {
        int best = 0;
        for (int i = 1; i < n; i++)
            if (x[(size_t)r * n + i] > x[(size_t)r * n + best]) best = i;
        if (__float_as_int(out2[4 * r]) != best) {
            std::printf("%s row %d unmasked: %d, want %d\n", what, r, __float_as_int(out2[4 * r]), best);
            failures++;
        }
    }
}

int main() {
    std::mt19937 rng(11);
    check("small", 300, 4, 3, rng);
    check("one part", 5000, 3, 1, rng);
    check("vocab-like", 248320, 3, 8, rng);
    std::printf("argmax: %s\n", failures ? "FAIL" : "ok");
    return failures ? 1 : 0;
}
