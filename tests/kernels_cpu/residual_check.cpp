// The residual adds that carry the next block's input norm (prompt and
// batched passes) on the CPU (QW_CPU) against double-precision references:
// add_rmsnorm (kernels/common.cu: x += y, out = rmsnorm(x) * w) and
// moe_combine (kernels/moe.cu: x += sigmoid(g) * shared, then each token's
// routed outputs in ascending expert order, then out = rmsnorm(x) * w), with
// and without the shared expert and the norm, entries out of range (-1, E)
// skipped, k = 1, 8 and 32, rows held in registers (H up to 8 x 256) and
// longer ones. Each fused norm must also equal the separate kernels bit for
// bit (add_inplace / the combine without its norm, then rmsnorm), and the
// combine each element's f32 sum in the kernel's order. Exit 1 on a mismatch.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>
#include "common.cu"
#include "moe.cu"

static int failures = 0, cases = 0;

static void report(const char* what, double ex, double en, bool ok) {
    std::printf("%-52s max |dx| %.2e, max |dn| %.2e: %s\n", what, ex, en, ok ? "ok" : "FAIL");
    failures += !ok;
    cases++;
}

static void rms_ref(const std::vector<double>& x, const float* w, int H, float eps, double* out) {
    double ss = 0;
    for (int d = 0; d < H; d++) ss += x[d] * x[d];
    const double inv = 1.0 / std::sqrt(ss / H + eps);
    for (int d = 0; d < H; d++) out[d] = x[d] * inv * w[d];
}

static void check_add_rmsnorm(int T, int H, std::mt19937& rng) {
    std::normal_distribution<float> nd;
    std::vector<float> x(T * H), y(T * H), w(H), out(T * H, NAN);
    for (auto& v : x) v = nd(rng);
    for (auto& v : y) v = nd(rng);
    for (auto& v : w) v = 1.f + 0.1f * nd(rng);
    std::vector<float> x0 = x;
    const float eps = 1e-6f;
    qw_cpu::launch({(unsigned)T, 1, 1}, {256, 1, 1}, [&] { add_rmsnorm(x.data(), y.data(), w.data(), out.data(), T, H, eps); });
    double ex = 0, en = 0;
    std::vector<double> r(H), rn(H);
    for (int t = 0; t < T; t++) {
        for (int d = 0; d < H; d++) {
            // The add is one f32 addition: exact against the f32 sum.
            ex = std::max(ex, (double)std::fabs(x[t * H + d] - (x0[t * H + d] + y[t * H + d])));
            r[d] = (double)x0[t * H + d] + y[t * H + d];
        }
        rms_ref(r, w.data(), H, eps, rn.data());
        for (int d = 0; d < H; d++) en = std::max(en, std::fabs(out[t * H + d] - rn[d]) / (1 + std::fabs(rn[d])));
    }
    // The same rows through add_inplace then rmsnorm: bit for bit.
    std::vector<float> xs = x0, outs(T * H, NAN);
    qw_cpu::launch({(unsigned)(T * H + 255) / 256, 1, 1}, {256, 1, 1},
                   [&] { add_inplace(xs.data(), y.data(), (long long)T * H); });
    qw_cpu::launch({(unsigned)T, 1, 1}, {256, 1, 1},
                   [&] { rmsnorm(xs.data(), H, w.data(), outs.data(), H, T, H, eps); });
    const bool same = std::equal(x.begin(), x.end(), xs.begin()) && std::equal(out.begin(), out.end(), outs.begin());
    char what[96];
    std::snprintf(what, sizeof what, "add_rmsnorm T %d H %d (= add_inplace, rmsnorm: %s)", T, H, same ? "yes" : "NO");
    report(what, ex, en, ex == 0 && en < 1e-5 && same);
}

static void check_combine(int T, int k, int E, int H, bool shared, bool norm, std::mt19937& rng) {
    std::normal_distribution<float> nd;
    const int N = T * k;
    // Each token's k distinct experts in random order, about 1 in 20 out of range.
    std::vector<int> idx(N), slot(N, -1);
    for (int t = 0; t < T; t++) {
        std::vector<int> all(E);
        for (int e = 0; e < E; e++) all[e] = e;
        std::shuffle(all.begin(), all.end(), rng);
        for (int j = 0; j < k; j++) idx[t * k + j] = rng() % 20 == 0 ? (rng() % 2 ? -1 : E) : all[j];
    }
    // Slots: the rows of ye, in a shuffled order.
    std::vector<int> order(N);
    for (int n = 0; n < N; n++) order[n] = n;
    std::shuffle(order.begin(), order.end(), rng);
    for (int n = 0; n < N; n++) slot[order[n]] = n;
    std::vector<float> ye((size_t)N * H), wts(N), x(T * H), sy(T * H), sg(T * 3), w(H), out(T * H, NAN);
    for (auto& v : ye) v = nd(rng);
    for (auto& v : wts) v = std::fabs(nd(rng)) / k;
    for (auto& v : x) v = nd(rng);
    for (auto& v : sy) v = nd(rng);
    for (auto& v : sg) v = nd(rng);
    for (auto& v : w) v = 1.f + 0.1f * nd(rng);
    std::vector<float> x0 = x;
    const float eps = 1e-6f;
    qw_cpu::launch({(unsigned)T, 1, 1}, {256, 1, 1}, [&] {
        moe_combine(ye.data(), idx.data(), wts.data(), slot.data(), T, k, E, H, x.data(), shared ? sy.data() : nullptr,
                    sg.data(), 3, norm ? w.data() : nullptr, out.data(), eps);
    });
    // Each element in the kernel's order in f32, and the norm through rmsnorm:
    // bit for bit.
    bool same = true;
    std::vector<float> xf = x0;
    for (int t = 0; t < T; t++) {
        std::vector<std::pair<int, int>> live;  // (expert, entry) in ascending order
        for (int j = 0; j < k; j++)
            if (idx[t * k + j] >= 0 && idx[t * k + j] < E) live.push_back({idx[t * k + j], j});
        std::sort(live.begin(), live.end());
        const float gs = 1.f / (1.f + expf(-sg[t * 3]));
        for (int d = 0; d < H; d++) {
            float a = xf[t * H + d];
            if (shared) a += gs * sy[t * H + d];
            for (auto [e, j] : live) a += wts[t * k + j] * ye[(size_t)slot[t * k + j] * H + d];
            xf[t * H + d] = a;
        }
    }
    same = std::equal(x.begin(), x.end(), xf.begin());
    if (norm) {
        std::vector<float> outs(T * H, NAN);
        qw_cpu::launch({(unsigned)T, 1, 1}, {256, 1, 1},
                       [&] { rmsnorm(xf.data(), H, w.data(), outs.data(), H, T, H, eps); });
        same = same && std::equal(out.begin(), out.end(), outs.begin());
    }
    double ex = 0, en = 0;
    std::vector<double> r(H), rn(H);
    for (int t = 0; t < T; t++) {
        const double g = 1.0 / (1.0 + std::exp(-(double)sg[t * 3]));
        for (int d = 0; d < H; d++) {
            double v = x0[t * H + d] + (shared ? g * sy[t * H + d] : 0.0);
            for (int j = 0; j < k; j++) {
                const int n = t * k + j, e = idx[n];
                if (e >= 0 && e < E) v += (double)wts[n] * ye[(size_t)slot[n] * H + d];
            }
            r[d] = v;
            ex = std::max(ex, std::fabs(x[t * H + d] - v) / (1 + std::fabs(v)));
        }
        if (norm) {
            rms_ref(r, w.data(), H, eps, rn.data());
            for (int d = 0; d < H; d++) en = std::max(en, std::fabs(out[t * H + d] - rn[d]) / (1 + std::fabs(rn[d])));
        } else {
            for (int d = 0; d < H; d++) en += std::isnan(out[t * H + d]) ? 0 : 1;  // nothing written
        }
    }
    char what[96];
    std::snprintf(what, sizeof what, "moe_combine T %d k %d E %d H %d%s%s (bit for bit: %s)", T, k, E, H,
                  shared ? " +shared" : "", norm ? " +norm" : "", same ? "yes" : "NO");
    report(what, ex, en, ex < 1e-5 && en < 1e-5 && same);
}

int main() {
    std::mt19937 rng(23);
    check_add_rmsnorm(3, 2048, rng);
    check_add_rmsnorm(2, 300, rng);   // rows shorter than two passes of the block
    check_add_rmsnorm(2, 2100, rng);  // longer than the registers hold
    check_combine(4, 8, 256, 2048, true, true, rng);
    check_combine(3, 8, 256, 2048, false, false, rng);
    check_combine(2, 8, 64, 2048, true, false, rng);
    check_combine(2, 8, 64, 2048, false, true, rng);
    check_combine(3, 1, 4, 130, true, true, rng);    // k = 1, H not a multiple of 4
    check_combine(2, 32, 40, 516, true, true, rng);  // k = MOE_MAXK
    check_combine(2, 11, 64, 2052, true, true, rng); // longer than the registers hold
    check_combine(2, 13, 64, 1000, true, true, rng); // a partial batch of expert loads
    std::printf("residual_check: %d of %d cases match: %s\n", cases - failures, cases, failures ? "FAIL" : "PASS");
    return failures ? 1 : 0;
}
