// The prompt MoE's row kernels of kernels/moe.cu on the CPU (QW_CPU):
// gather_split_bf16 (rows gathered by index, split into bf16 hi / lo) and
// silu_mul_split (silu(gate) * up, split), each also with hi alone (lo null,
// left untouched), one row per block, against the
// element-wise split1 of the same values bit for bit: widths with and without
// float4 access, a source stride wider than the rows, repeated source rows.
// Exit 1 on a mismatch.
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>
#include "moe.cu"

int main() {
    std::mt19937 rng(11);
    std::normal_distribution<float> nd;
    int bad = 0, n = 0;
    for (int dim : {2048, 96, 30})
        for (long long rows : {1LL, 8LL, 13LL, 37LL})
            for (bool alone : {false, true}) {  // alone: lo == nullptr, hi written, lo untouched
                // gather_split_bf16: row i takes source row idx[i] (a shuffled, repeating index).
                const int stride = dim + (dim % 4 == 0 ? 4 : 1), src_rows = 5;
                std::vector<float> src((size_t)src_rows * stride);
                for (auto& v : src) v = nd(rng);
                std::vector<int> idx(rows);
                for (long long i = 0; i < rows; i++) idx[i] = (int)((i * 3 + 1) % src_rows);
                std::vector<bf16_t> hi(rows * dim, 0x7fc0), lo(rows * dim, 0x7fc0);
                const unsigned grid = (unsigned)rows;  // one row per block, as the host launches them
                qw_cpu::launch({grid, 1, 1}, {256, 1, 1},
                               [&] { gather_split_bf16(src.data(), stride, idx.data(), rows, dim, hi.data(), alone ? nullptr : lo.data()); });
                int diff = 0;
                for (long long i = 0; i < rows; i++)
                    for (int c = 0; c < dim; c++) {
                        bf16_t h, l;
                        split1(src[(size_t)idx[i] * stride + c], &h, &l);
                        diff += hi[i * dim + c] != h || lo[i * dim + c] != (alone ? (bf16_t)0x7fc0 : l);
                    }
                // silu_mul_split: rows of gate | up, I = dim.
                std::vector<float> gu(rows * 2 * dim);
                for (auto& v : gu) v = 3 * nd(rng);
                std::vector<bf16_t> sh(rows * dim, 0x7fc0), sl(rows * dim, 0x7fc0);
                qw_cpu::launch({grid, 1, 1}, {256, 1, 1}, [&] { silu_mul_split(gu.data(), rows, dim, sh.data(), alone ? nullptr : sl.data()); });
                int diff2 = 0;
                for (long long r = 0; r < rows; r++)
                    for (int c = 0; c < dim; c++) {
                        bf16_t h, l;
                        split1(__fmul_rn(silu_f(gu[r * 2 * dim + c]), gu[r * 2 * dim + dim + c]), &h, &l);
                        diff2 += sh[r * dim + c] != h || sl[r * dim + c] != (alone ? (bf16_t)0x7fc0 : l);
                    }
                n += 2;
                bad += (diff != 0) + (diff2 != 0);
                std::printf("dim %4d rows %2lld%s: gather_split %s (%d differ), silu_mul_split %s (%d differ)\n", dim, rows,
                            alone ? " hi alone" : "", diff ? "FAIL" : "ok", diff, diff2 ? "FAIL" : "ok", diff2);
            }
    std::printf("moe_split_check: %d of %d launches bit-identical: %s\n", n - bad, n, bad ? "FAIL" : "PASS");
    return bad ? 1 : 0;
}
