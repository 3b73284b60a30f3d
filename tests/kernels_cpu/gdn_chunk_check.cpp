// The chunked Gated DeltaNet prefill of kernels/gdn_chunk.cu on the CPU
// (QW_CPU): gdn_chunk_prep, gdn_chunk_state and gdn_chunk_out launched as
// host/engine/src/gpu/model/gdn_prefill.rs launches them (geometry() below),
// against a double-precision token-serial gated delta rule (per token
// S = e^g S; delta = beta (v - S^T k); S += k delta^T; o = S^T q, q taken as
// it is in the qkv rows: L2-normalised and scaled by 1/sqrt(dk) upstream).
// Outputs [T][nv][dv], the final state [nv][dk][dv] and the states captured
// at each chunk boundary inside the pass (gdn_state_capture), max |error| relative
// to the largest reference magnitude, within 1e-4. Inputs as the model's: q
// and k L2-normalised per key head, log-decays g in [-3, 0), beta in (0, 1),
// a random non-zero starting state, qkv rows wider than q | k | v (the
// padding NaN). Head dims 128 (one key head, two value heads), 32 (two key
// heads of two value heads, and one of one), 64 x 48 and 40 x 96 (partial
// 32-column value tiles); T of 2, 63, 64, 65, 130 and 200 (partial, exact
// and several chunks); slow and model-like decays. Scratch and outputs
// start NaN, with NaN guards around each buffer and past each launch's
// dynamic shared memory that must stay untouched. Exit 1 on a mismatch.
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "gdn_chunk.cu"

// The harness's dynamic shared memory (QW_DYN_SMEM), in floats.
constexpr size_t SMEM_FLOATS = sizeof(qw_cpu::dyn_smem) / 4;

// ---------------------------------------------------------------------------
// Launch geometry: mirrors GpuModel::gdn_chunked in
// host/engine/src/gpu/model/gdn_prefill.rs. Change this (and only this) when
// the host's grids, block sizes, dynamic shared memory (PREP_SMEM /
// STATE_SMEM / OUT_SMEM there, in floats) or scratch sizes change.
struct Launch {
    dim3 grid, block;
    size_t smem;  // dynamic shared memory, floats
};
struct Geometry {
    Launch prep, state, out;
    size_t wt, u, gc, sc;  // scratch, floats: gdn_chunk_wt, _u, _g, _s
};
static Geometry geometry(int T, int nv, int dk, int dv) {
    const size_t C = 64, D = 128;        // CHUNK, MAX_DIM
    const size_t LD = D + 4, LDA = C + 4;  // LD, LDA (row strides of the shared tiles)
    const unsigned nch = (unsigned)((T + C - 1) / C);
    Geometry g;
    // gdn_chunk_prep: (chunk, value head).
    g.prep = {{nch, (unsigned)nv, 1}, {256, 1, 1}, 2 * C * LD + C * LDA + 16 * 48 + 3 * C};
    // gdn_chunk_state: (value head, 32-column value tile), serial over chunks.
    g.state = {{(unsigned)nv, (unsigned)(dv + 31) / 32, 1}, {512, 1, 1}, 2 * D * C + C * 32 + 2 * D * 32 + 2 * C};
    // gdn_chunk_out: (chunk, value head).
    g.out = {{nch, (unsigned)nv, 1}, {256, 1, 1}, 2 * C * LD + C * LDA + 32 * LD + C};
    g.wt = (size_t)nv * nch * dk * C;
    g.u = (size_t)nv * T * dv;
    g.gc = (size_t)nv * T;
    g.sc = (size_t)nv * nch * dk * dv;
    return g;
}
// ---------------------------------------------------------------------------

// A NaN with a recognisable payload: guards and never-written scratch.
static float canary() {
    float f;
    const unsigned u = 0x7fc0dead;
    std::memcpy(&f, &u, 4);
    return f;
}
static bool is_canary(float f) {
    unsigned u;
    std::memcpy(&u, &f, 4);
    return u == 0x7fc0deadu;
}

// A device buffer of n floats with GUARD canaries before and after.
constexpr size_t GUARD = 256;
struct Buf {
    std::vector<float> v;
    explicit Buf(size_t n) : v(n + 2 * GUARD, canary()) {}
    float* p() { return v.data() + GUARD; }
    size_t n() const { return v.size() - 2 * GUARD; }
    bool guards_ok() const {
        for (size_t i = 0; i < GUARD; i++)
            if (!is_canary(v[i]) || !is_canary(v[v.size() - 1 - i])) return false;
        return true;
    }
};

static int failures = 0;
static bool smem_ok = true;

// Runs `kernel` with launch `l`, shared memory filled with the canary first;
// afterwards, shared memory past the launch's size must be untouched.
template <typename F>
static void run(const Launch& l, F kernel) {
    if (l.smem > SMEM_FLOATS) {
        std::printf("dynamic shared memory %zu floats > the harness's %zu\n", l.smem, SMEM_FLOATS);
        smem_ok = false;
        return;
    }
    float* b = reinterpret_cast<float*>(qw_cpu::dyn_smem);
    std::fill(b, b + SMEM_FLOATS, canary());
    qw_cpu::launch(l.grid, l.block, kernel);
    for (size_t i = l.smem; i < SMEM_FLOATS; i++)
        if (!is_canary(b[i])) {
            std::printf("shared memory written at float %zu, past the launch's %zu\n", i, l.smem);
            smem_ok = false;
            break;
        }
}

struct Case {
    int nk, nv, dk, dv, T;
    double gmu;  // g = -softplus(N(gmu, 1)) clipped to [-3, 0): -4 slow, 0 model-like
};

static void check(const Case& cs, unsigned seed) {
    smem_ok = true;
    const int nk = cs.nk, nv = cs.nv, dk = cs.dk, dv = cs.dv, T = cs.T;
    const int key_dim = nk * dk, stride = 2 * key_dim + nv * dv + 7;  // 7 columns of (NaN) padding
    std::mt19937 rng(seed);
    std::normal_distribution<double> nd;

    // qkv rows as the conv + l2norm_heads leave them.
    std::vector<float> qkv((size_t)T * stride, NAN);
    for (int t = 0; t < T; t++) {
        float* row = qkv.data() + (size_t)t * stride;
        for (int part = 0; part < 2; part++)  // q, then k
            for (int h = 0; h < nk; h++) {
                std::vector<double> x(dk);
                double ss = 0;
                for (auto& e : x) {
                    e = nd(rng);
                    ss += e * e;
                }
                const double sc = (part == 0 ? 1 / std::sqrt((double)dk) : 1.0) / std::sqrt(ss + 1e-6);
                for (int d = 0; d < dk; d++) row[part * key_dim + h * dk + d] = (float)(x[d] * sc);
            }
        for (int c = 0; c < nv * dv; c++) row[2 * key_dim + c] = (float)nd(rng);
    }
    std::vector<float> g((size_t)T * nv), beta((size_t)T * nv), S0((size_t)nv * dk * dv);
    for (auto& e : g) {
        const double x = cs.gmu + nd(rng);
        e = (float)-std::min(2.999, std::max(1e-4, x > 20 ? x : std::log1p(std::exp(x))));
    }
    for (auto& e : beta) e = (float)(1 / (1 + std::exp(-nd(rng))));
    for (auto& e : S0) e = (float)(0.5 * nd(rng));

    // The kernels, as the host runs them.
    const Geometry geo = geometry(T, nv, dk, dv);
    Buf wt(geo.wt), u(geo.u), gc(geo.gc), sc(geo.sc), S(S0.size()), out((size_t)T * nv * dv);
    std::copy(S0.begin(), S0.end(), S.p());
    run(geo.prep, [&] {
        gdn_chunk_prep(qkv.data(), stride, nk, nv, dk, dv, g.data(), beta.data(), wt.p(), u.p(), gc.p(), T);
    });
    run(geo.state, [&] {
        gdn_chunk_state(qkv.data(), stride, nk, nv, dk, dv, wt.p(), u.p(), gc.p(), S.p(), sc.p(), T);
    });
    run(geo.out, [&] { gdn_chunk_out(qkv.data(), stride, nk, nv, dk, dv, u.p(), gc.p(), sc.p(), out.p(), T); });
    // The state at every chunk boundary inside the pass (gdn_state_capture,
    // as GpuModel::gdn_chunked launches it for an in-pass snapshot).
    const int nch = (T + 63) / 64, n = dk * dv;
    std::vector<Buf> caps;
    for (int ch = 1; ch < nch; ch++) {
        caps.emplace_back((size_t)nv * n);
        const Launch l = {{(unsigned)(n + 255) / 256, (unsigned)nv, 1}, {256, 1, 1}, 0};
        run(l, [&] { gdn_state_capture(sc.p(), nch, ch, n, caps.back().p()); });
    }
    bool guards = wt.guards_ok() && u.guards_ok() && gc.guards_ok() && sc.guards_ok() && S.guards_ok() &&
                  out.guards_ok();
    for (const Buf& b : caps) guards = guards && b.guards_ok();

    // The reference: token-serial, double precision, per value head.
    double err_o = 0, max_o = 0, err_s = 0, max_s = 0, err_c = 0;
    for (int hv = 0; hv < nv; hv++) {
        const int hk = hv / (nv / nk);
        std::vector<double> Sd(S0.begin() + (size_t)hv * dk * dv, S0.begin() + (size_t)(hv + 1) * dk * dv);
        std::vector<double> kv(dv);
        for (int t = 0; t < T; t++) {
            if (t > 0 && t % 64 == 0)  // a captured boundary: the state after t tokens
                for (size_t i = 0; i < Sd.size(); i++) {
                    const float got = caps[t / 64 - 1].p()[(size_t)hv * n + i];
                    err_c = std::max(err_c, std::isfinite(got) ? std::fabs(got - Sd[i]) : INFINITY);
                }
            const float* row = qkv.data() + (size_t)t * stride;
            const float *q = row + hk * dk, *k = row + key_dim + hk * dk, *v = row + 2 * key_dim + hv * dv;
            const double decay = std::exp((double)g[(size_t)t * nv + hv]), b = beta[(size_t)t * nv + hv];
            for (auto& e : Sd) e *= decay;
            for (int c = 0; c < dv; c++) {
                double acc = 0;
                for (int d = 0; d < dk; d++) acc += k[d] * Sd[(size_t)d * dv + c];
                kv[c] = b * (v[c] - acc);  // delta
            }
            for (int d = 0; d < dk; d++)
                for (int c = 0; c < dv; c++) Sd[(size_t)d * dv + c] += k[d] * kv[c];
            for (int c = 0; c < dv; c++) {
                double o = 0;
                for (int d = 0; d < dk; d++) o += q[d] * Sd[(size_t)d * dv + c];
                const float got = out.p()[((size_t)t * nv + hv) * dv + c];
                err_o = std::max(err_o, std::isfinite(got) ? std::fabs(got - o) : INFINITY);
                max_o = std::max(max_o, std::fabs(o));
            }
        }
        for (size_t i = 0; i < Sd.size(); i++) {
            const float got = S.p()[(size_t)hv * dk * dv + i];
            err_s = std::max(err_s, std::isfinite(got) ? std::fabs(got - Sd[i]) : INFINITY);
            max_s = std::max(max_s, std::fabs(Sd[i]));
        }
    }
    const double rel_o = err_o / max_o, rel_s = err_s / max_s, rel_c = err_c / max_s;
    const bool ok = rel_o < 1e-4 && rel_s < 1e-4 && rel_c < 1e-4 && guards && smem_ok;
    std::printf("nk %d nv %d dk %3d dv %3d T %3d g~%-2g: max error out %.2e (of %.2f, rel %.2e), state %.2e (of %.2f, "
                "rel %.2e), captured states rel %.2e%s%s\n",
                nk, nv, dk, dv, T, cs.gmu, err_o, max_o, rel_o, err_s, max_s, rel_s, rel_c,
                guards ? "" : ", buffer guard overwritten", ok ? "" : "  FAIL");
    failures += !ok;
}

int main() {
    const Case cases[] = {
        // The model's head dims (128), two value heads on one key head.
        {1, 2, 128, 128, 2, -4},
        {1, 2, 128, 128, 63, -4},
        {1, 2, 128, 128, 64, 0},
        {1, 2, 128, 128, 65, -4},
        {1, 2, 128, 128, 130, 0},
        {1, 2, 128, 128, 200, -4},
        // Small heads, two key heads of two value heads each (the hk mapping).
        {2, 4, 32, 32, 2, -4},
        {2, 4, 32, 32, 63, -4},
        {2, 4, 32, 32, 64, -4},
        {2, 4, 32, 32, 65, 0},
        {2, 4, 32, 32, 130, -4},
        {2, 4, 32, 32, 200, -4},
        // dk != dv, dv not a multiple of the 32-column tiles.
        {1, 3, 64, 48, 2, -4},
        {1, 3, 64, 48, 64, -4},
        {1, 3, 64, 48, 65, -4},
        {1, 3, 64, 48, 200, 0},
        {1, 2, 40, 96, 130, -4},
        // One value head per key head.
        {2, 2, 32, 32, 130, -4},
    };
    unsigned seed = 1;
    for (const Case& c : cases) check(c, seed++);
    std::printf("gdn_chunk_check: %s\n", failures ? "FAIL" : "PASS");
    return failures ? 1 : 0;
}
