#!/usr/bin/env bash
# Kernel logic without a GPU: compiles kernel sources as plain C++ against
# tests/kernels_cpu/mma.h (threads as std::threads, barriers for
# __syncthreads and warp exchanges) and checks their results against a
# double-precision reference. Covers indexing, masking and the math; not the
# CUDA-only paths (cp.async, PDL), which the GPU runs check.
set -euo pipefail
cd "$(dirname "$0")/.."
CXX=${CXX:-g++}
if ! command -v "$CXX" >/dev/null; then
  apt-get install -y -q g++ >/dev/null
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# The kernel's `#include "mma.h"` must find the stand-in: build in one folder.
cp tests/kernels_cpu/mma.h tests/kernels_cpu/dec_attn_keys_check.cpp kernels/decode_attn_keys.cu "$tmp/"
"$CXX" -std=c++20 -O2 -pthread -o "$tmp/dec_attn_keys_check" "$tmp/dec_attn_keys_check.cpp"
"$tmp/dec_attn_keys_check"
