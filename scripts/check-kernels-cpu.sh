#!/usr/bin/env bash
# Kernel logic without a GPU: compiles kernel sources as plain C++ (QW_CPU:
# kernels/compat.h takes tests/kernels_cpu/cpu_runtime.h, threads as
# std::threads, barriers for __syncthreads and warp shuffles) and checks
# their results against double-precision references
# (tests/kernels_cpu/*_check.cpp). Covers indexing, masking and the math, with
# kernels/mma.h's mma.sync, ldmatrix, cp.async and wgmma emulated (cp.async
# as a synchronous copy, wgmma reading its operands through its descriptors'
# layout); not the timing-dependent paths (PDL, bulk copies with mbarriers,
# the asynchrony of cp.async and wgmma), which the GPU runs check.
set -euo pipefail
cd "$(dirname "$0")/.."
CXX=${CXX:-g++}
if ! command -v "$CXX" >/dev/null; then
  apt-get install -y -q g++ >/dev/null
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for t in tests/kernels_cpu/*_check.cpp; do
  n=$(basename "$t" .cpp)
  echo "== $n"
  "$CXX" -std=c++20 -O2 -pthread -DQW_CPU -Ikernels -Itests/kernels_cpu -o "$tmp/$n" "$t"
  "$tmp/$n"
done
