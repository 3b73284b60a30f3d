// Prompt (prefill) attention on tensor cores on the CPU (QW_CPU): the 4-warp
// kernels of kernels/attention.cu, attn_flash_tc_f32_w4 (f32 cache, its hi / lo
// bf16 planes written by the real attn_kv_split) and attn_flash_tc_bf16_w4
// (bf16 cache, its own hi plane), with mma.sync, ldmatrix (.trans) and
// cp.async emulated (kernels/mma.h), against causal GQA attention with the
// sigmoid output gate in double precision (the bf16-rounded K / V for the bf16
// cache). G 2, 4 and 8 query heads per KV head, head_dim 32, 48, 64 and 256,
// prompts from position 0 and after a 37-token prefix, pair counts T * G that
// are not multiples of the block's 64 rows, cache rows past the prompt and
// unused shared memory filled with NaN; on two shapes also the 8-warp kernels
// (attn_flash_tc_f32 / _bf16, and the model's attn_flash_tc_*_d256 at head_dim
// 256). Then the warpgroup-MMA kernels of kernels/attention_wg.cu
// (attn_flash_wg_{f32,bf16}_d{32,256}, wgmma emulated, their planes written by
// the real attn_kv_split_t / attn_v_transpose_bf16) on shapes whose two
// warpgroups see different key counts or have no rows, and their single-term
// form (attn_flash_wg_single_d{32,256}, `--prefill-precision bf16`: Qh Kh,
// Ph Vh over either cache's hi planes) against the reference on bf16-rounded
// Q, K, V within the bound of P's rounding (below). Exit 1 on a mismatch.
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>
#include "attention.cu"
#include "attention_wg.cu"

struct Shape {
    int nkv, G, hd, T, pos0;
    int w8 = 0;  // also the 8-warp kernels: 1 attn_flash_tc_{f32,bf16}, 2 the _d256 ones
};

// Split-precision operands (~16 mantissa bits) give up to ~2e-5 on outputs of
// magnitude up to ~4; a dropped lo term is off by ~1e-3, a wrong mask or
// fragment by 1e-2 or more.
constexpr double TOL = 1e-4;

using Kernel = void (*)(const float*, const bf16_t*, const bf16_t*, const bf16_t*, const bf16_t*, const float*, int,
                        float*, int, int, int, int, int, float);
using KernelWg = void (*)(const float*, const bf16_t*, const bf16_t*, const bf16_t*, const bf16_t*, int,
                          const float*, int, float*, int, int, int, int, float, const int*, float*);
using MergeWg = void (*)(const int*, const float*, const float*, int, float*, int, int, int);

// One case's inputs: q, the gate projections and the f32 cache (rows past the
// prompt never written: NaN).
struct Case {
    Shape s;
    int nh, L, cap, stride;
    std::vector<float> q, proj, kf, vf;
    Case(const Shape& sh, unsigned seed) : s(sh) {
        nh = s.nkv * s.G;
        L = s.pos0 + s.T;
        cap = L + 9;
        stride = nh * 2 * s.hd + 2 * s.nkv * s.hd + 12;  // [query | gate] per q head, then k, v, padding
        std::mt19937 rng(seed);
        std::normal_distribution<float> nd(0.f, 1.f);
        q.resize((size_t)s.T * nh * s.hd);
        proj.resize((size_t)s.T * stride);
        for (auto& x : q) x = 1.5f * nd(rng);  // scores of sd ~1.5: softmax neither flat nor one-hot
        for (auto& x : proj) x = nd(rng);
        kf.assign((size_t)cap * s.nkv * s.hd, NAN);
        vf.assign(kf.size(), NAN);
        for (size_t i = 0; i < used(); i++) {
            kf[i] = nd(rng);
            vf[i] = nd(rng);
        }
    }
    size_t used() const { return (size_t)L * s.nkv * s.hd; }

    // A bf16 cache: kh, vh get the used rows rounded to bf16, and kf / vf
    // (what `error` compares against) become those rounded values.
    void round_to_bf16(std::vector<bf16_t>& kh, std::vector<bf16_t>& vh) {
        for (size_t i = 0; i < used(); i++) {
            kh[i] = f2bf(kf[i]);
            vh[i] = f2bf(vf[i]);
            kf[i] = bf2f(kh[i]);
            vf[i] = bf2f(vh[i]);
        }
    }

    // Q rounded to bf16 as the single-term kernels take it, and K / V as
    // their hi planes hold them (the reference for `error(out, rel)`).
    void round_all_to_bf16() {
        for (auto& x : q) x = bf2f(f2bf(x));
        for (size_t i = 0; i < used(); i++) {
            kf[i] = bf2f(f2bf(kf[i]));
            vf[i] = bf2f(f2bf(vf[i]));
        }
    }

    // Max |error| of `out` against causal GQA attention with the sigmoid gate
    // in double precision over kf / vf; INFINITY if any output is not finite.
    // With rel > 0: the largest |error| as a fraction of rel sum_j p_j |v_j|
    // (times the gate) + 1e-5, the bound of P rounded to bf16 before P V
    // (each weight off by at most 2^-9 of itself; rel 2^-8 leaves room for the
    // f32 sums), which a wrong mask, fragment or dropped term exceeds.
    double error(const std::vector<float>& out, double rel = 0) const {
        const int nkv = s.nkv, G = s.G, hd = s.hd;
        const double scale = 1.0 / std::sqrt((double)hd);
        double worst = 0;
        std::vector<double> p(L);
        for (int t = 0; t < s.T; t++)
            for (int h = 0; h < nh; h++) {
                const int g = h / G, n = s.pos0 + t + 1;  // keys 0 ..= pos0 + t
                const float* qp = &q[((size_t)t * nh + h) * hd];
                double mx = -1e300, den = 0;
                for (int j = 0; j < n; j++) {
                    double d = 0;
                    for (int i = 0; i < hd; i++) d += (double)qp[i] * kf[((size_t)j * nkv + g) * hd + i];
                    p[j] = d * (float)scale;
                    mx = std::max(mx, p[j]);
                }
                for (int j = 0; j < n; j++) den += (p[j] = std::exp(p[j] - mx));
                for (int i = 0; i < hd; i++) {
                    double o = 0, mass = 0;
                    for (int j = 0; j < n; j++) {
                        const double v = vf[((size_t)j * nkv + g) * hd + i];
                        o += p[j] * v;
                        mass += p[j] * std::fabs(v);
                    }
                    const double gate = 1.0 / (1.0 + std::exp(-proj[(size_t)t * stride + (size_t)h * 2 * hd + hd + i]));
                    const double want = o / den * gate;
                    const double got = out[((size_t)t * nh + h) * hd + i];
                    if (!std::isfinite(got)) return INFINITY;
                    const double err = std::fabs(got - want);
                    worst = std::max(worst, rel > 0 ? err / (rel * mass / den * gate + 1e-5) : err);
                }
            }
        return worst;
    }
};

// Max |error| of one run of `kernel` (NW warps; BF16: bf16 cache).
template <bool BF16>
static double check(Kernel kernel, int NW, const Shape& s, unsigned seed) {
    Case k(s, seed);
    const int ROWS = 16 * NW, nkv = s.nkv, G = s.G, hd = s.hd;
    const size_t plane = k.kf.size();
    const bf16_t bnan = 0x7fc0;
    std::vector<bf16_t> kh(plane, bnan), kl(plane, bnan), vh(plane, bnan), vl(plane, bnan);
    if (BF16) {
        k.round_to_bf16(kh, vh);
    } else {
        // Rows [0, L) as the host splits them: a grid-stride loop of 3 blocks.
        qw_cpu::launch({3, 1, 1}, {256, 1, 1}, [&] {
            attn_kv_split(k.kf.data(), k.vf.data(), kh.data(), kl.data(), vh.data(), vl.data(),
                          (long long)(k.used() / 4));
        });
    }
    std::vector<float> out((size_t)s.T * k.nh * hd, NAN);
    std::memset(qw_cpu::dyn_smem, 0xff, sizeof qw_cpu::dyn_smem);  // bf16 NaN everywhere not staged
    const float scale = 1.f / std::sqrt((float)hd);
    const unsigned blocks = (unsigned)((s.T * G + ROWS - 1) / ROWS);
    qw_cpu::launch({blocks, (unsigned)nkv, 1}, {(unsigned)(NW * WARP), 1, 1}, [&] {
        kernel(k.q.data(), kh.data(), BF16 ? nullptr : kl.data(), vh.data(), BF16 ? nullptr : vl.data(),
               k.proj.data(), k.stride, out.data(), s.T, k.nh, nkv, hd, s.pos0, scale);
    });
    return k.error(out);
}

// The same for a warpgroup-MMA kernel (128 rows per block): for an f32 cache
// the planes from the real attn_kv_split_t, for a bf16 cache (BF16) the cache
// itself as the keys' plane and the values transposed by the real
// attn_v_transpose_bf16; leading dimension `ldp` with room past the 32-key
// tiles, NaN wherever the split writes nothing. With `ctas` > 0, stream-K as the
// host runs it for few row blocks: attn_wg_plan for that many blocks, the kernel
// over them (pieces of split units in a NaN-filled `part`), then attn_wg_merge.
// SINGLE: a single-term kernel (hi planes only; the result as error(out, 2^-8)).
template <bool BF16, bool SINGLE = false>
static double check_wg(KernelWg kernel, MergeWg merge, const Shape& s, unsigned seed, int ctas = 0) {
    Case k(s, seed);
    const int nkv = s.nkv, G = s.G, hd = s.hd;
    const int tiles = (k.L + 31) / 32, ldp = 32 * tiles + 16;
    const bf16_t bnan = 0x7fc0;
    std::vector<bf16_t> kh(k.kf.size(), bnan), kl(k.kf.size(), bnan), vc(k.kf.size(), bnan);
    std::vector<bf16_t> vth((size_t)nkv * hd * ldp, bnan), vtl(vth.size(), bnan);
    if (BF16) {
        k.round_to_bf16(kh, vc);
        qw_cpu::launch({(unsigned)tiles, (unsigned)nkv, 1}, {256, 1, 1},
                       [&] { attn_v_transpose_bf16(vc.data(), vth.data(), k.L, ldp, nkv, hd); });
    } else {
        qw_cpu::launch({(unsigned)tiles, (unsigned)nkv, 1}, {256, 1, 1}, [&] {
            attn_kv_split_t(k.kf.data(), k.vf.data(), kh.data(), kl.data(), vth.data(), vtl.data(), k.L, ldp, nkv,
                            hd);
        });
    }
    std::vector<float> out((size_t)s.T * k.nh * hd, NAN);
    std::memset(qw_cpu::dyn_smem, 0xff, sizeof qw_cpu::dyn_smem);
    const float scale = 1.f / std::sqrt((float)hd);
    const unsigned blocks = (unsigned)((s.T * G + 127) / 128);
    // Lo planes where the kernel reads them (f32 cache, split).
    const bf16_t* klo = BF16 || SINGLE ? nullptr : kl.data();
    const bf16_t* vlo = BF16 || SINGLE ? nullptr : vtl.data();
    auto result = [&] {
        if (!SINGLE) return k.error(out);
        k.round_all_to_bf16();
        return k.error(out, 1.0 / 256);
    };
    if (ctas == 0) {
        qw_cpu::launch({blocks, (unsigned)nkv, 1}, {256, 1, 1}, [&] {
            kernel(k.q.data(), kh.data(), klo, vth.data(), vlo, ldp, k.proj.data(), k.stride, out.data(), s.T, k.nh,
                   nkv, s.pos0, scale, nullptr, nullptr);
        });
        return result();
    }
    const int units = (int)blocks * nkv;
    std::vector<int> plan(WG_PLAN_HEAD + ctas + 1 + 4 * (units + ctas) + 3 * units, -7);
    qw_cpu::launch({1, 1, 1}, {32, 1, 1}, [&] { attn_wg_plan(s.T, G, nkv, s.pos0, ctas, plan.data()); });
    std::vector<float> part((size_t)(units + ctas) * WG_PART_FLOATS(256), NAN);
    qw_cpu::launch({(unsigned)ctas, 1, 1}, {256, 1, 1}, [&] {
        kernel(k.q.data(), kh.data(), klo, vth.data(), vlo, ldp, k.proj.data(), k.stride, out.data(), s.T, k.nh, nkv,
               s.pos0, scale, plan.data(), part.data());
    });
    qw_cpu::launch({(unsigned)units, 1, 1}, {256, 1, 1},
                   [&] { merge(plan.data(), part.data(), k.proj.data(), k.stride, out.data(), s.T, k.nh, nkv); });
    std::printf("  stream-K over %d blocks: %d units, %d segments, %d split into %d pieces\n", ctas, units, plan[2],
                plan[1], plan[3]);
    return result();
}

int main() {
    const Shape shapes[] = {
        {2, 2, 32, 45, 0},   // 90 pairs per kv head: a full block and a ragged one
        {2, 2, 64, 70, 37},  // after a prefix: 140 pairs, 107 keys (4 key tiles, the last partial)
        {1, 4, 64, 23, 0},   // 92 pairs
        {1, 4, 32, 50, 37},  // 200 pairs, the last block 8 rows
        {2, 2, 48, 21, 37},  // hd 48: three k16 steps, three d16 pairs
        {2, 4, 64, 70, 37, 1},  // G 4 over two kv heads: 280 pairs, 5 (w8: 3) blocks per kv head
        {1, 8, 256, 9, 37, 2},  // the model's head_dim and group: 72 pairs
    };
    // Warpgroup-MMA kernels (head_dim compiled in): 128 rows per block, the
    // two warpgroups' rows seeing different key counts.
    const Shape wg_shapes[] = {
        {2, 2, 32, 45, 0},    // 90 pairs: one block, warpgroup 1 partly empty
        {2, 4, 32, 70, 37},   // 280 pairs: 3 blocks per kv head, 107 keys (the last tile partial)
        {1, 8, 32, 100, 5},   // 800 pairs: 7 blocks, 105 keys
        {2, 8, 32, 3, 0},     // 24 pairs: warpgroup 1 empty, 3 keys
        {3, 1, 32, 150, 100}, // no grouping (G 1): 150 queries of one head per kv head, 250 keys
        {1, 8, 256, 9, 37, 0},   // the model's head_dim and group: 72 pairs
        {2, 8, 256, 20, 30, 0},  // 160 pairs: 2 blocks per kv head
    };
    int bad = 0, n = 0;
    auto report = [&](const char* name, const Shape& s, double err) {
        const bool ok = err < TOL;
        bad += !ok;
        n++;
        std::printf("%-23s nh %d nkv %d hd %3d T %2d pos0 %2d  max |err| %.2e  %s\n", name, s.nkv * s.G, s.nkv, s.hd,
                    s.T, s.pos0, err, ok ? "ok" : "FAIL");
    };
    // Single-term kernels: the largest error as a fraction of P's rounding bound.
    auto report_single = [&](const char* name, const Shape& s, double ratio) {
        const bool ok = ratio < 1;
        bad += !ok;
        n++;
        std::printf("%-27s nh %d nkv %d hd %3d T %2d pos0 %3d  max |err| %.2f of the bound  %s\n", name, s.nkv * s.G,
                    s.nkv, s.hd, s.T, s.pos0, ratio, ok ? "ok" : "FAIL");
    };
    auto single_wg = [&](const Shape& s, unsigned sd, int ctas) {
        const bool d256 = s.hd == 256;
        const KernelWg kern = d256 ? attn_flash_wg_single_d256 : attn_flash_wg_single_d32;
        const MergeWg merge = d256 ? attn_wg_merge_d256 : attn_wg_merge_d32;
        const char* name = d256 ? "attn_flash_wg_single_d256" : "attn_flash_wg_single_d32";
        report_single(name, s, check_wg<false, true>(kern, merge, s, sd, ctas));  // f32 cache's hi planes
        report_single(name, s, check_wg<true, true>(kern, merge, s, sd + 1000, ctas));  // a bf16 cache
    };
    unsigned seed = 21;
    for (const Shape& s : shapes) {
        report("attn_flash_tc_f32_w4", s, check<false>(attn_flash_tc_f32_w4, 4, s, seed++));
        report("attn_flash_tc_bf16_w4", s, check<true>(attn_flash_tc_bf16_w4, 4, s, seed++));
        if (s.w8 == 1) {
            report("attn_flash_tc_f32", s, check<false>(attn_flash_tc_f32, 8, s, seed++));
            report("attn_flash_tc_bf16", s, check<true>(attn_flash_tc_bf16, 8, s, seed++));
        }
        if (s.w8 == 2) {  // head_dim 256 compiled in
            report("attn_flash_tc_f32_d256", s, check<false>(attn_flash_tc_f32_d256, 8, s, seed++));
            report("attn_flash_tc_bf16_d256", s, check<true>(attn_flash_tc_bf16_d256, 8, s, seed++));
        }
    }
    for (const Shape& s : wg_shapes) {
        const bool d256 = s.hd == 256;
        const MergeWg merge = d256 ? attn_wg_merge_d256 : attn_wg_merge_d32;
        report(d256 ? "attn_flash_wg_f32_d256" : "attn_flash_wg_f32_d32", s,
               check_wg<false>(d256 ? attn_flash_wg_f32_d256 : attn_flash_wg_f32_d32, merge, s, seed++));
        report(d256 ? "attn_flash_wg_bf16_d256" : "attn_flash_wg_bf16_d32", s,
               check_wg<true>(d256 ? attn_flash_wg_bf16_d256 : attn_flash_wg_bf16_d32, merge, s, seed++));
        single_wg(s, seed++, 0);
    }
    // Stream-K: more blocks than row-block units (units split into pieces, some
    // blocks holding the end of one unit and the start of the next), fewer,
    // a cold prompt (cuts snapped to unit ends where the keys are causal), and
    // the model's head_dim with one unit over three blocks.
    struct Sk {
        Shape s;
        int ctas;
    };
    const Sk sk_shapes[] = {
        {{2, 8, 32, 20, 300}, 7},   // 4 units of 10-11 tiles over 7 blocks
        {{1, 4, 32, 100, 170}, 3},  // 4 units over 3 blocks
        {{1, 4, 32, 100, 0}, 5},    // from position 0: 4 units of 1-4 tiles, causal
        {{3, 1, 32, 150, 100}, 4},  // G 1: 6 units
        {{1, 8, 256, 16, 200}, 3},  // head_dim 256: 1 unit of 7 tiles in 3 pieces
    };
    for (const Sk& k : sk_shapes) {
        const Shape& s = k.s;
        const bool d256 = s.hd == 256;
        const MergeWg merge = d256 ? attn_wg_merge_d256 : attn_wg_merge_d32;
        report(d256 ? "attn_flash_wg_f32_d256 sk" : "attn_flash_wg_f32_d32 sk", s,
               check_wg<false>(d256 ? attn_flash_wg_f32_d256 : attn_flash_wg_f32_d32, merge, s, seed++, k.ctas));
        report(d256 ? "attn_flash_wg_bf16_d256 sk" : "attn_flash_wg_bf16_d32 sk", s,
               check_wg<true>(d256 ? attn_flash_wg_bf16_d256 : attn_flash_wg_bf16_d32, merge, s, seed++, k.ctas));
        single_wg(s, seed++, k.ctas);
    }
    std::printf("%d of %d kernel runs match (tolerance %.0e)\n", n - bad, n, TOL);
    return bad ? 1 : 0;
}
