// The sampling readout of a logits row on the CPU (QW_CPU), kernels/sampling.cu:
// logits_top_part then logits_top_merge against a sort of (logit, id) pairs
// and a double-precision log-sum-exp (rows shorter and longer than one sort,
// slices of one and several rounds, more parts than one merge round, ties,
// NaN, -0.0 and infinities); then logits_weights' block sums against double
// precision (temperatures, min-p, partial last blocks) and its count of heavy
// tokens (those within ln 2^-12 of the max at the temperature) against a
// count. Each also with a constrained-decoding mask (token_mask.h) against
// the same references on the row with the tokens left out at -inf. Then the
// rows of a batched step read together (a row list, per-row temperature,
// min-p and mask, results packed per launch row) against each row read
// alone, bit for bit, and the blocks their plans ask for gathered
// (common.cu gather_rows) against the rows. Bit equality with the host
// sampler's own sums is checked on the GPU (`qwasi verify --synthetic`).
// Exit 1 on a mismatch.
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>
#include "sampling.cu"
#include "common.cu"

static int failures = 0;

// Expected order: larger logit first (NaN as -inf, -0.0 equal to 0.0), then lower id.
// `mask` (words, or empty): the kernels read x through it, the references
// read the row with the tokens it leaves out at -inf.
static void check(const char* what, const std::vector<float>& raw, int per_part, unsigned threads,
                  const std::vector<unsigned>& mask = {}) {
    const int n = (int)raw.size(), parts = (n + per_part - 1) / per_part;
    std::vector<float> x = raw;
    const unsigned long long table[1] = {(unsigned long long)(size_t)mask.data()};
    const unsigned long long* masks = mask.empty() ? nullptr : table;
    if (!mask.empty())
        for (int i = 0; i < n; i++)
            if (!((mask[i / 32] >> (i % 32)) & 1u)) x[i] = -INFINITY;
    std::vector<top_key_t> keys((size_t)parts * TOP_K), out(TOP_K + 1);
    std::vector<float> ms(2 * parts);
    qw_cpu::launch({(unsigned)parts, 1, 1}, {threads, 1, 1},
                   [&] { logits_top_part(raw.data(), n, per_part, nullptr, masks, keys.data(), ms.data()); });
    qw_cpu::launch({1, 1, 1}, {threads, 1, 1}, [&] { logits_top_merge(keys.data(), ms.data(), parts, out.data()); });

    auto val = [&](int i) { return std::isnan(x[i]) ? -INFINITY : x[i]; };
    std::vector<int> ids(n);
    for (int i = 0; i < n; i++) ids[i] = i;
    std::stable_sort(ids.begin(), ids.end(), [&](int a, int b) { return val(a) > val(b); });
    const int k = std::min(n, TOP_K);
    for (int r = 0; r < TOP_K; r++) {
        const top_key_t got = out[r];
        const unsigned id = ~(unsigned)got;
        if (r >= k) {
            if (got != 0) { std::printf("%s: slot %d should be empty\n", what, r); failures++; }
            continue;
        }
        const float z = val(ids[r]);
        if (id != (unsigned)ids[r] || got != top_key(z, ids[r])) {
            std::printf("%s: rank %d: id %u, want %d (logit %g)\n", what, r, id, ids[r], z);
            failures++;
            return;
        }
    }
    double m = -INFINITY;
    for (int i = 0; i < n; i++) m = std::max(m, (double)val(i));
    double e = 0;
    for (int i = 0; i < n; i++) e += val(i) == m ? 1.0 : std::exp((double)val(i) - m);
    const float* stats = (const float*)(out.data() + TOP_K);
    const bool finite = std::isfinite(m);
    const double lse = finite ? std::log(e) : NAN;
    const bool ok = stats[0] == (float)m && (finite ? std::fabs(stats[1] - lse) < 2e-6 : std::isnan(stats[1]));
    if (!ok) {
        std::printf("%s: max %g lse %.9g, want %g %.9g\n", what, stats[0], stats[1], m, lse);
        failures++;
    }
    if (!finite) return;
    for (float t : {0.3f, 1.0f, 1.7f})
        for (float min_p : {0.0f, 0.05f}) {
            const int nb = (n + WEIGHT_BLOCK - 1) / WEIGHT_BLOCK, grid = (nb + 63) / 64;
            std::vector<double> blocks(nb, -1.0);
            std::vector<unsigned> heavy(grid * 64 / WARP, ~0u);
            qw_cpu::launch({(unsigned)grid, 1, 1}, {64, 1, 1},
                           [&] { logits_weights(raw.data(), n, nullptr, nullptr, t, min_p, out.data(), masks, blocks.data(), heavy.data()); });
            const float heavy_floor = (float)m + t * PREFILTER_LOG_W;
            unsigned want_heavy = 0, got_heavy = 0;
            for (int i = 0; i < n; i++) want_heavy += val(i) >= heavy_floor;
            for (unsigned h : heavy) got_heavy += h;
            if (got_heavy != want_heavy) {
                std::printf("%s: t %g: %u heavy tokens, want %u\n", what, t, got_heavy, want_heavy);
                failures++;
                return;
            }
            for (int b = 0; b < nb; b++) {
                double want = 0;
                for (int i = b * WEIGHT_BLOCK; i < std::min(n, (b + 1) * WEIGHT_BLOCK); i++) {
                    const double w = std::exp(((double)val(i) - m) / t);
                    want += w < min_p ? 0.0 : w;
                }
                if (std::fabs(blocks[b] - want) > 1e-6 * std::max(1.0, want)) {
                    std::printf("%s: t %g min_p %g block %d: %.9g, want %.9g\n", what, t, min_p, b, blocks[b], want);
                    failures++;
                    return;
                }
            }
        }
}

// `rows` logits rows of n (a few constrained) read as a batched step reads
// its weighted rows: the row list `sel` (any order, a subset), each with its
// own temperature and min-p, in one launch of each kernel; every launch
// row's head, block sums and heavy counts must equal its row read alone
// (rows null, the settings as arguments) bit for bit.
static void check_rows(int n, int rows, std::mt19937& rng) {
    std::normal_distribution<float> nd(0.f, 2.f);
    std::vector<float> x((size_t)rows * n);
    for (auto& v : x) v = std::round(nd(rng) * 16.f) / 16.f;
    const int words = (n + 31) / 32;
    std::vector<std::vector<unsigned>> mask_words(rows);
    std::vector<unsigned long long> table(rows, 0);
    for (int r = 1; r < rows; r += 2) {
        mask_words[r].assign(words, 0u);
        for (int i = r; i < n; i += 5) mask_words[r][i / 32] |= 1u << (i % 32);
        table[r] = (unsigned long long)(size_t)mask_words[r].data();
    }
    std::vector<int> sel;
    for (int r = rows - 1; r >= 0; r -= 1)
        if (r != 2) sel.push_back(r);  // reversed, row 2 left out
    const int w = (int)sel.size();
    std::vector<float> params;
    for (int y = 0; y < w; y++) {
        params.push_back(0.25f + 0.4f * y);
        params.push_back(y % 3 == 0 ? 0.0f : 0.01f * y);
    }
    const int step = TOP_SORT - TOP_K, parts = (n + step - 1) / step;
    const int nb = (n + WEIGHT_BLOCK - 1) / WEIGHT_BLOCK, grid = (nb + 255) / 256, warps = grid * 256 / WARP;
    std::vector<top_key_t> keys((size_t)w * parts * TOP_K), heads((size_t)w * (TOP_K + 1));
    std::vector<float> ms((size_t)w * parts * 2);
    std::vector<double> blocks((size_t)w * nb, -1.0);
    std::vector<unsigned> heavy((size_t)w * warps, ~0u);
    qw_cpu::launch({(unsigned)parts, (unsigned)w, 1}, {256, 1, 1},
                   [&] { logits_top_part(x.data(), n, step, sel.data(), table.data(), keys.data(), ms.data()); });
    qw_cpu::launch({(unsigned)w, 1, 1}, {256, 1, 1},
                   [&] { logits_top_merge(keys.data(), ms.data(), parts, heads.data()); });
    qw_cpu::launch({(unsigned)grid, (unsigned)w, 1}, {256, 1, 1}, [&] {
        logits_weights(x.data(), n, sel.data(), params.data(), 0.f, 0.f, heads.data(), table.data(), blocks.data(),
                       heavy.data());
    });
    for (int y = 0; y < w; y++) {
        const int r = sel[y];
        const float* row = x.data() + (size_t)r * n;
        const unsigned long long* masks = table[r] ? &table[r] : nullptr;
        std::vector<top_key_t> k1((size_t)parts * TOP_K), h1(TOP_K + 1);
        std::vector<float> m1(2 * parts);
        std::vector<double> b1(nb, -1.0);
        std::vector<unsigned> v1(warps, ~0u);
        qw_cpu::launch({(unsigned)parts, 1, 1}, {256, 1, 1},
                       [&] { logits_top_part(row, n, step, nullptr, masks, k1.data(), m1.data()); });
        qw_cpu::launch({1, 1, 1}, {256, 1, 1}, [&] { logits_top_merge(k1.data(), m1.data(), parts, h1.data()); });
        qw_cpu::launch({(unsigned)grid, 1, 1}, {256, 1, 1}, [&] {
            logits_weights(row, n, nullptr, nullptr, params[2 * y], params[2 * y + 1], h1.data(), masks, b1.data(),
                           v1.data());
        });
        const bool same = std::equal(h1.begin(), h1.end(), heads.begin() + (size_t)y * (TOP_K + 1)) &&
                          std::memcmp(b1.data(), blocks.data() + (size_t)y * nb, nb * sizeof(double)) == 0 &&
                          std::equal(v1.begin(), v1.end(), heavy.begin() + (size_t)y * warps);
        if (!same) {
            std::printf("rows: n %d, launch row %d (row %d) differs from the row alone\n", n, y, r);
            failures++;
            return;
        }
    }
    // Some rows' blocks gathered as weighted_rows.rs gathers them: sources
    // (floats into x) moved back at the buffer's end, 64 floats each.
    const int total = rows * n, width = std::min(WEIGHT_BLOCK, total);
    std::vector<int> src, want;
    for (int y = 0; y < w; y++) {
        const int b = (y * 37) % nb, base = sel[y] * n + b * WEIGHT_BLOCK;
        src.push_back(std::min(base, total - width));
        want.push_back(base);
    }
    std::vector<float> got((size_t)w * width, NAN);
    qw_cpu::launch({1, (unsigned)w, 1}, {WEIGHT_BLOCK, 1, 1},
                   [&] { gather_rows(x.data(), 1, src.data(), w, width, got.data()); });
    for (int y = 0; y < w; y++) {
        const int shift = want[y] - src[y], len = std::min(WEIGHT_BLOCK, n - (want[y] % n));
        if (std::memcmp(got.data() + (size_t)y * width + shift, x.data() + want[y], len * sizeof(float)) != 0) {
            std::printf("rows: n %d, gathered block %d differs\n", n, y);
            failures++;
            return;
        }
    }
}

int main() {
    std::mt19937 rng(7);
    std::normal_distribution<float> nd(0.f, 3.f);
    int runs = 0;
    const int step = TOP_SORT - TOP_K;
    for (int n : {1, 5, 63, 64, 65, step, step + 1, 10000, 70 * step + 17}) {
        for (int per_part : {step, 3 * step + 5}) {
            if (n > 20000 && per_part != step) continue;
            std::vector<float> x(n);
            for (auto& v : x) v = std::round(nd(rng) * 8.f) / 8.f;  // many ties
            if (n > 70) {
                x[3] = NAN;
                x[11] = -0.0f;
                x[12] = 0.0f;
                x[n - 1] = x[0];
            }
            check("row", x, per_part, 128);
            // Constrained: a sparse mask (few tokens, maybe fewer than the
            // head), a dense one, and one that leaves the row's max out.
            for (int every : {97, 3}) {
                std::vector<unsigned> mask((n + 31) / 32, 0u);
                for (int i = 0; i < n; i += every) mask[i / 32] |= 1u << (i % 32);
                if (every == 3 && n > 1) {
                    int top = 0;
                    for (int i = 0; i < n; i++)
                        if (!std::isnan(x[i]) && x[i] > x[top]) top = i;
                    mask[top / 32] &= ~(1u << (top % 32));
                    mask[(n - 1) / 32] |= 1u << ((n - 1) % 32);
                }
                check(every == 97 ? "sparse mask" : "dense mask", x, per_part, 128, mask);
                runs++;
            }
            runs++;
            if (n == 10000) {
                std::vector<float> y = x;
                y[500] = INFINITY;
                y[900] = INFINITY;
                check("+inf", y, per_part, 128);
                std::vector<float> z(n, -INFINITY);
                z[7] = NAN;
                check("all -inf", z, per_part, 128);
                runs += 2;
            }
        }
    }
    for (int n : {70, 1000, 2 * step + 100}) {
        check_rows(n, 5, rng);
        runs++;
    }
    std::printf("top: %d rows, %s\n", runs, failures ? "FAIL" : "ok");
    return failures ? 1 : 0;
}
