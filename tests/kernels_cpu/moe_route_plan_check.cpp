// The batched decode step's fused router and MoE plan (kernels/moe.cu:
// moe_route_plan, one block) on the CPU (QW_CPU) against the four kernels it
// replaces (router_topk_warp, moe_plan_count, moe_plan_place, moe_plan_tiles)
// on the same logits: every output (idx, wts, counts with counts[E], rows with
// its zeroed tail, slot, the tile table, *bad) must be bit-identical, and the
// guard zones around them (and what neither writes: slot of unplaced entries,
// the tile buffer past the table) keep their fill. Logits rows have a stride
// past E whose padding must not be read. Tokens mix patterns as in
// router_check: random, many ties, signed zeros, mostly NaN, one finite among
// -inf, all NaN, all -inf (the last two leave entries outside [0, E): -1).
// T = 1, 2, 8, 16, 64 (MOE_ROUTE_MAXT) with E = 256, k = 8; small E and k;
// E not a multiple of 32; 64-row tiles; E = MOE_ROUTE_MAXE with k = MOE_MAXK.
// Exit 1 on a mismatch.
#include <array>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>
#include "moe.cu"

static const int FILL = 0x7eadbeef;
static const int G = 64;  // guard entries on either side of every output
static int failures = 0, cases = 0;

// A buffer of n 4-byte entries between guard zones, all FILL.
struct Guarded {
    std::vector<int> buf;
    explicit Guarded(size_t n) : buf(n + 2 * G, FILL) {}
    int* p() { return buf.data() + G; }
    float* f() { return reinterpret_cast<float*>(p()); }
    bool guards_kept() const {
        for (int g = 0; g < G; g++)
            if (buf[g] != FILL || buf[buf.size() - 1 - g] != FILL) return false;
        return true;
    }
};

struct Outputs {
    Guarded idx, wts, counts, rows, slot, tiles, bad;
    Outputs(int N, int E, int most) : idx(N), wts(N), counts(E + 1), rows(N), slot(N), tiles(1 + 3 * most), bad(1) {}
    std::array<Guarded*, 7> all() { return {&idx, &wts, &counts, &rows, &slot, &tiles, &bad}; }
};
static const char* NAMES[] = {"idx", "wts", "counts", "rows", "slot", "tiles", "bad"};

// Token t's logits pattern.
static void fill_token(float* l, int E, int pattern, std::mt19937& rng) {
    std::normal_distribution<float> nd;
    for (int e = 0; e < E; e++) {
        switch (pattern) {
            case 0: l[e] = nd(rng); break;
            case 1: l[e] = (float)(int)(nd(rng) * 2); break;  // many ties
            case 2: l[e] = e % 3 ? 0.f : -0.f; break;          // -0 and +0 tie
            case 3: l[e] = e % 7 == 3 ? nd(rng) : NAN; break;
            case 4: l[e] = e == E / 2 ? 1.f : -INFINITY; break;
            case 5: l[e] = NAN; break;
            default: l[e] = -INFINITY; break;
        }
    }
    if (pattern == 2) l[E - 1] = 1.f;
}

static void check(const char* what, int T, int k, int E, int bm, const std::vector<int>& patterns) {
    const int N = T * k, stride = E + 5;
    std::mt19937 rng(T * 131 + E * 7 + k);
    std::vector<float> logits((size_t)T * stride);
    for (int t = 0; t < T; t++) {
        float* l = logits.data() + (size_t)t * stride;
        fill_token(l, E, patterns[t % patterns.size()], rng);
        for (int e = E; e < stride; e++) l[e] = 1e30f;  // would win if read
    }
    const int most = N / bm + std::min(E, N);  // the host's moe_max_tiles
    Outputs ref(N, E, most), got(N, E, most);
    qw_cpu::launch({(unsigned)(T + 7) / 8, 1, 1}, {256, 1, 1},
                   [&] { router_topk_warp(logits.data(), stride, E, k, T, ref.idx.p(), ref.wts.f()); });
    qw_cpu::launch({(unsigned)E + 1, 1, 1}, {256, 1, 1}, [&] { moe_plan_count(ref.idx.p(), N, E, ref.counts.p()); });
    qw_cpu::launch({(unsigned)E, 1, 1}, {256, 1, 1},
                   [&] { moe_plan_place(ref.idx.p(), N, k, E, ref.counts.p(), ref.rows.p(), ref.slot.p()); });
    qw_cpu::launch({1, 1, 1}, {256, 1, 1},
                   [&] { moe_plan_tiles(ref.counts.p(), E, bm, N, ref.tiles.p(), ref.rows.p(), ref.bad.p()); });
    qw_cpu::launch({1, 1, 1}, {MOE_ROUTE_THREADS, 1, 1}, [&] {
        moe_route_plan(logits.data(), stride, E, k, T, bm, got.idx.p(), got.wts.f(), got.counts.p(), got.rows.p(),
                       got.slot.p(), got.tiles.p(), got.bad.p());
    });
    bool ok = true;
    for (int b = 0; b < 7; b++) {
        const Guarded &r = *ref.all()[b], &g = *got.all()[b];
        const bool same = std::memcmp(r.buf.data(), g.buf.data(), r.buf.size() * 4) == 0;
        if (!same || !g.guards_kept()) {
            size_t i = 0;
            while (i < r.buf.size() && r.buf[i] == g.buf[i]) i++;
            std::printf("  %s: %s; first difference at %lld: %#x want %#x\n", NAMES[b],
                        g.guards_kept() ? "differs" : "guard zone written", (long long)i - G,
                        i < g.buf.size() ? g.buf[i] : 0, i < r.buf.size() ? r.buf[i] : 0);
            ok = false;
        }
    }
    // The reference run must have placed entries and, where a token has
    // nothing selectable, counted entries outside [0, E) (else the case tests
    // less than it says).
    const int outside = ref.counts.p()[E];
    bool unselectable = false;
    for (int t = 0; t < T; t++) unselectable |= patterns[t % patterns.size()] >= 5;
    if (outside == N || (unselectable && outside == 0)) {
        std::printf("  reference: %d of %d entries outside the experts\n", outside, N);
        ok = false;
    }
    std::printf("%-36s T %2d k %d E %3d bm %2d: %d tiles, %d outside: %s\n", what, T, k, E, bm, ref.tiles.p()[0],
                outside, ok ? "ok" : "FAIL");
    failures += !ok;
    cases++;
    std::fflush(stdout);
}

int main() {
    const std::vector<int> random{0}, mixed{0, 1, 2, 3, 4, 5, 6}, ties{1, 2, 1, 4};
    // (An E = 256 case costs a second or more: the four kernels' grids run
    // block after block of 256 std::threads.)
    for (int T : {1, 2, 8, 16, MOE_ROUTE_MAXT}) check("random", T, 8, 256, 8, random);
    for (int T : {8, MOE_ROUTE_MAXT}) check("mixed (ties, NaN, -inf)", T, 8, 256, 8, mixed);
    check("ties, small E and k", 16, 2, 8, 8, ties);
    check("mixed, small E and k", MOE_ROUTE_MAXT, 2, 8, 8, mixed);
    check("mixed, E not a multiple of 32", 29, 4, 60, 8, mixed);
    check("random, 64-row tiles", MOE_ROUTE_MAXT, 4, 60, 64, random);
    check("mixed, E = MOE_ROUTE_MAXE, top-32", 16, MOE_MAXK, MOE_ROUTE_MAXE, 8, mixed);
    std::printf("moe_route_plan_check: %d of %d cases match: %s\n", cases - failures, cases,
                failures ? "FAIL" : "PASS");
    return failures ? 1 : 0;
}
