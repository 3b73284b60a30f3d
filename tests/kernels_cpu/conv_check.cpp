// The GDN causal conv of the prompt path (kernels/gdn.cu: conv_silu_tokens,
// tokens in parallel, several per thread, then conv_state_update) on the CPU
// (QW_CPU) against the token-serial conv_silu of the same file: outputs and
// new state bit for bit (the same arithmetic in the same order), for conv
// kernels of 1 to 8 taps, token counts that are not multiples of a thread's
// tokens, fewer tokens than taps, a non-zero starting state and a row
// stride wider than the channels. Exit 1 on a mismatch.
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>
#include "gdn.cu"

int main() {
    std::mt19937 rng(5);
    std::normal_distribution<float> nd;
    int bad = 0, n = 0;
    for (int K : {1, 2, 4, 8})
        for (int T : {1, 3, 8, 37}) {
            const int C = 300, stride = 310, H = K - 1;
            std::vector<float> x((size_t)T * stride), w((size_t)C * K), st((size_t)C * (H > 0 ? H : 1));
            for (auto& v : x) v = nd(rng);
            for (auto& v : w) v = nd(rng);
            for (auto& v : st) v = nd(rng);
            // Reference: in place, serial over tokens.
            std::vector<float> xr = x, sr = st;
            qw_cpu::launch({(unsigned)(C + 255) / 256, 1, 1}, {256, 1, 1},
                           [&] { conv_silu(xr.data(), stride, sr.data(), w.data(), T, C, K); });
            std::vector<float> out((size_t)T * C, NAN), sp = st;
            qw_cpu::launch({(unsigned)(C + 255) / 256, (unsigned)((T + CONV_TPT - 1) / CONV_TPT), 1}, {256, 1, 1},
                           [&] { conv_silu_tokens(x.data(), stride, sp.data(), w.data(), out.data(), T, C, K); });
            qw_cpu::launch({(unsigned)(C + 255) / 256, 1, 1}, {256, 1, 1},
                           [&] { conv_state_update(x.data(), stride, sp.data(), T, C, K); });
            int diff = 0;
            for (int t = 0; t < T; t++)
                for (int c = 0; c < C; c++)
                    diff += std::memcmp(&out[(size_t)t * C + c], &xr[(size_t)t * stride + c], 4) != 0;
            for (int i = 0; i < C * H; i++) diff += std::memcmp(&sp[i], &sr[i], 4) != 0;
            n++;
            bad += diff != 0;
            std::printf("K %d T %2d: %s (%d values differ)\n", K, T, diff ? "FAIL" : "ok", diff);
        }
    std::printf("conv_check: %d of %d cases bit-identical\n", n - bad, n);
    return bad ? 1 : 0;
}
