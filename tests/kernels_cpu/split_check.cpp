// f32_to_bf16_split of kernels/common.cu on the CPU (QW_CPU): the activations
// of the cuBLAS prompt projections split into bf16 hi / lo, and with a null lo
// (`--prefill-precision bf16`) rounded to hi alone, launched as ops.rs
// launches them (grid ceil(n / 1024), block 256, four elements per thread),
// against split1 / f2bf of each element bit for bit: lengths that are and are
// not multiples of 4 (the scalar path), a misaligned source (the scalar path
// too), and elements past n left as they were. Exit 1 on a mismatch.
#include <cstdio>
#include <random>
#include <vector>
#include "common.cu"

static bool run(long long n, int offset, bool single) {
    std::mt19937 rng((unsigned)(n * 7 + offset));
    std::normal_distribution<float> nd;
    std::vector<float> buf(n + offset + 8);
    for (auto& v : buf) v = std::exp(3.f * nd(rng)) * nd(rng);  // magnitudes over many binades
    const float* x = buf.data() + offset;
    const bf16_t canary = 0x7fc1;
    std::vector<bf16_t> hi(n + 8, canary), lo(n + 8, canary);
    const unsigned grid = (unsigned)((n + 4 * 256 - 1) / (4 * 256));
    qw_cpu::launch({grid, 1, 1}, {256, 1, 1},
                   [&] { f32_to_bf16_split(x, hi.data(), single ? nullptr : lo.data(), n); });
    long bad = 0;
    for (long long e = 0; e < n + 8; e++) {
        bf16_t h = canary, l = canary;
        if (e < n) split1(x[e], &h, &l);
        bad += hi[e] != h;
        bad += lo[e] != (single ? canary : l);
    }
    std::printf("f32_to_bf16_split %-6s n %6lld offset %d: %ld mismatches  %s\n", single ? "hi" : "hi+lo", n, offset,
                bad, bad ? "FAIL" : "ok");
    return bad == 0;
}

int main() {
    int bad = 0, runs = 0;
    for (long long n : {4096LL, 2052LL, 1027LL, 3LL})
        for (int offset : {0, 1})
            for (bool single : {false, true}) {
                bad += !run(n, offset, single);
                runs++;
            }
    std::printf("split_check: %d of %d runs match: %s\n", runs - bad, runs, bad ? "FAIL" : "PASS");
    return bad ? 1 : 0;
}
