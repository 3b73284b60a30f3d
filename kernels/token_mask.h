// Constrained decoding's allowed tokens on the device (host/engine/src/readout/mask.rs):
// the readout kernels' row r reads the bitset at masks[r] (token i allowed
// when bit i % 32 of word i / 32 is set); a null table, or a 0 entry, allows
// every token. A token left out reads as -inf, as the host masks a row.
#pragma once
#include "compat.h"

__device__ __forceinline__ const unsigned* row_mask(const unsigned long long* masks, int row) {
    return masks ? (const unsigned*)masks[row] : nullptr;
}

// Logit i of a row with `mask` (null: all allowed).
__device__ __forceinline__ float mask_logit(const unsigned* mask, int i, float z) {
    return mask && !((mask[i >> 5] >> (i & 31)) & 1u) ? -INFINITY : z;
}
