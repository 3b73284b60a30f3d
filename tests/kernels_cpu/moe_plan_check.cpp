// The device-side prefill MoE plan (kernels/moe.cu: moe_plan_count, grid E + 1,
// then moe_plan_place, grid E) on the CPU (QW_CPU) against a serial reference:
// counts[e] for e < E and the out-of-range entries (-1, E) in counts[E]; every
// entry n with idx[n] == e at place p in [off_e, off_e + counts[e]), increasing
// n, rows[p] = n / k and slot[n] = p; nothing else written (rows past the
// placed entries, slot of out-of-range entries and guard zones around the
// three outputs keep their fill). Cases: N below 256, not a multiple of 4 or of
// a tile, one tile exactly, up to eight tiles, matches in the first tiles only;
// E = 1; E = 256 with every entry on one expert, with most experts empty;
// nothing in range; idx 16-byte aligned (vector loads) and not (scalar
// loads). Then moe_plan_tiles (grid 1) with 64- and 128-row tiles: the tile
// table, the zeroed tail of rows and the out-of-range count. Exit 1 on a
// mismatch.
#include <cstdint>
#include <cstdio>
#include <random>
#include <vector>
#include "moe.cu"

static const int FILL = 0x7eadbeef;
static int failures = 0, cases = 0;

// gen(n) gives idx[n]; aligned: idx at a 16-byte boundary or 4 bytes past one.
template <typename Gen>
static void check(const char* what, int T, int k, int E, bool aligned, Gen gen) {
    const int N = T * k;
    std::vector<int> buf((size_t)N + 8);
    int* idx = buf.data();
    while (((uintptr_t)idx & 15) != 0) idx++;
    if (!aligned) idx++;
    for (int n = 0; n < N; n++) idx[n] = gen(n);
    // Reference.
    std::vector<int> rc(E + 1, 0), rrows(N, FILL), rslot(N, FILL);
    for (int n = 0; n < N; n++) rc[idx[n] >= 0 && idx[n] < E ? idx[n] : E]++;
    for (int e = 0, p = 0; e < E; e++)
        for (int n = 0; n < N; n++)
            if (idx[n] == e) {
                rrows[p] = n / k;
                rslot[n] = p++;
            }
    // Kernels. The outputs sit between guard zones of G entries on either side that must
    // keep their fill (a broken kernel then fails instead of corrupting the heap).
    const int G = N + 256;
    std::vector<int> counts(E + 1 + 2 * G, FILL), rows_buf((size_t)N + 2 * G, FILL), slot_buf(rows_buf);
    int *cnt = counts.data() + G, *rows = rows_buf.data() + G, *slot = slot_buf.data() + G;
    qw_cpu::launch({(unsigned)E + 1, 1, 1}, {256, 1, 1}, [&] { moe_plan_count(idx, N, E, cnt); });
    qw_cpu::launch({(unsigned)E, 1, 1}, {256, 1, 1}, [&] { moe_plan_place(idx, N, k, E, cnt, rows, slot); });
    int bad_c = 0, bad_r = 0, bad_s = 0, bad_g = 0, first = -1;
    for (int e = 0; e <= E; e++) bad_c += cnt[e] != rc[e];
    for (int n = 0; n < N; n++) {
        if (rows[n] != rrows[n]) { bad_r++; if (first < 0) first = n; }
        if (slot[n] != rslot[n]) { bad_s++; if (first < 0) first = n; }
    }
    for (int g = 0; g < G; g++) {
        bad_g += (counts[g] != FILL) + (counts[G + E + 1 + g] != FILL);
        bad_g += (rows_buf[g] != FILL) + (rows_buf[(size_t)G + N + g] != FILL);
        bad_g += (slot_buf[g] != FILL) + (slot_buf[(size_t)G + N + g] != FILL);
    }
    // moe_plan_tiles for both tile heights: the table (and nothing past it), the
    // row tail past the placed entries zeroed (the rest kept), *bad = counts[E].
    int bad_t = 0, placed = 0;
    for (int e = 0; e < E; e++) placed += rc[e];
    for (int bm : {64, 128}) {
        std::vector<int> want{0};
        for (int e = 0, start = 0; e < E; e++) {
            for (int r = 0; r < rc[e]; r += bm) want.insert(want.end(), {e, start + r, std::min(rc[e] - r, bm)});
            start += rc[e];
        }
        want[0] = (int)(want.size() - 1) / 3;
        std::vector<int> tiles_buf(want.size() + 2 * G, FILL);
        int* tl = tiles_buf.data() + G;
        int bad = 5;
        qw_cpu::launch({1, 1, 1}, {256, 1, 1}, [&] { moe_plan_tiles(cnt, E, bm, N, tl, rows, &bad); });
        for (size_t i = 0; i < want.size(); i++) bad_t += tl[i] != want[i];
        for (int g = 0; g < G; g++) bad_t += (tiles_buf[g] != FILL) + (tiles_buf[G + want.size() + g] != FILL);
        bad_t += bad != rc[E];
        for (int n = 0; n < N; n++) bad_t += rows[n] != (n < placed ? rrows[n] : 0);
        for (int g = 0; g < G; g++) bad_t += (rows_buf[g] != FILL) + (rows_buf[(size_t)G + N + g] != FILL);
    }
    int used = 0;
    for (int e = 0; e < E; e++) used += rc[e] > 0;
    const bool ok = bad_c + bad_r + bad_s + bad_g + bad_t == 0;
    std::printf("%-34s T %5d k %d E %3d N %6d %s: %d experts used, %d out of range: %s", what, T, k, E, N,
                aligned ? "aligned  " : "unaligned", used, rc[E], ok ? "ok\n" : "FAIL");
    if (!ok) {
        std::printf(" (%d counts, %d rows, %d slots differ, %d writes outside, %d tile-table errors", bad_c, bad_r,
                    bad_s, bad_g, bad_t);
        if (first >= 0)
            std::printf("; first at %d: rows %d want %d, slot %d want %d", first, rows[first], rrows[first],
                        slot[first], rslot[first]);
        std::printf(")\n");
        failures++;
    }
    cases++;
    std::fflush(stdout);
}

int main() {
    std::mt19937 rng(11);
    // Uniform over the experts with about 1 in 50 entries out of range (-1 or E).
    auto uniform = [&](int E) {
        return [&rng, E](int) {
            const unsigned r = rng();
            if (r % 50 == 0) return (r / 50) % 2 ? -1 : E;
            return (int)((r / 50) % (unsigned)E);
        };
    };
    // (Each E = 256 case costs about a second or more here: 256 std::threads
    // per block, blocks one after another.)
    check("uniform", 37, 1, 1, true, uniform(1));            // E = 1, N < 256, odd N
    check("uniform", 1000, 1, 1, false, uniform(1));         // E = 1, N not a multiple of the tile
    check("uniform", 333, 3, 8, true, uniform(8));           // N % 4 == 3
    check("uniform", 333, 3, 8, false, uniform(8));
    check("uniform", 3, 8, 256, false, uniform(256));        // N < 256, most experts empty
    check("uniform", 511, 8, 256, true, uniform(256));       // N % 4 == 0, one partial tile
    check("uniform", 512, 8, 8, true, uniform(8));           // one tile exactly
    check("uniform", 1111, 7, 32, false, uniform(32));       // N % 4 == 1, two tiles
    check("uniform", 1501, 6, 64, false, uniform(64));       // N % 4 == 2, three tiles
    check("uniform", 3001, 10, 16, true, uniform(16));       // eight tiles (shared buffers reused)
    check("all on expert 200", 613, 8, 256, true, [](int) { return 200; });
    check("all on expert 0", 499, 7, 32, false, [](int) { return 0; });
    check("all out of range", 300, 8, 4, true, [](int n) { return n % 3 ? -1 : 4; });
    check("experts 0, 17, 255, -1 only", 601, 8, 256, true, [&](int) {
        const unsigned r = rng() % 7;
        return r < 4 ? 17 : r < 5 ? 0 : r < 6 ? 255 : -1;
    });
    // Skewed: expert e with weight ~ 1 / (e + 1)^2, so the high experts are mostly empty.
    std::vector<double> wz(256);
    for (int e = 0; e < 256; e++) wz[e] = 1.0 / ((e + 1.0) * (e + 1.0));
    std::discrete_distribution<int> zipf(wz.begin(), wz.end());
    check("skewed 1/(e+1)^2", 641, 8, 256, false, [&](int) { return zipf(rng); });
    // Matches only in the first two of five tiles (the walk stops early), only at
    // the ragged end (the last tile), or at the start of each tile.
    check("entries in the first 2 tiles only", 2000, 10, 8, true,
          [&](int n) { return n < 2 * MOE_PLAN_TILE - 3 ? (int)(rng() % 9) : -1; });
    check("one entry at N - 1", 4105, 1, 32, true, [](int n) { return n == 4104 ? 9 : -1; });
    check("entries at tile starts", 1025, 9, 32, true, [](int n) { return n % MOE_PLAN_TILE == 0 ? 31 : 32; });
    std::printf("moe_plan_check: %d of %d cases match: %s\n", cases - failures, cases, failures ? "FAIL" : "PASS");
    return failures ? 1 : 0;
}
