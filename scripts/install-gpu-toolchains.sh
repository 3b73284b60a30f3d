#!/usr/bin/env bash
# Installs the GPU compilers Qwasi's `cuda` and `hip` features build with, idempotently:
#  - CUDA 13.0 nvcc from PyPI (no GPU or driver needed to compile); nvvm pinned,
#    since an unpinned nvvm 13.5 emits PTX the 13.0 ptxas rejects.
#  - HIP: clang-19 + lld-19 (they know RDNA 3 / 3.5, gfx1100 and gfx1151) with clang-tools-19's
#    offload bundler, the HIP headers (libamdhip64-dev) and ROCm 5.2's device libraries
#    (rocm-device-libs), all from Debian 12;
#    host/engine/build.rs adds the oclc_isa_version_*.bc those libraries lack (see docs/AMD.md).
# Usage: scripts/install-gpu-toolchains.sh [cuda] [hip]   (default: both)
set -euo pipefail
want_cuda=0; want_hip=0
if [ $# -eq 0 ]; then want_cuda=1; want_hip=1; fi
for a in "$@"; do case "$a" in cuda) want_cuda=1;; hip) want_hip=1;; *) echo "unknown: $a" >&2; exit 2;; esac; done
PY=${PYTHON:-python3}
if [ $want_cuda = 1 ]; then
  nvcc_path() { $PY -c 'import nvidia, os; print(os.path.join(os.path.dirname(nvidia.__path__[0]), "nvidia", "cu13", "bin", "nvcc"))' 2>/dev/null || true; }
  p=$(nvcc_path)
  if [ -n "$p" ] && [ -x "$p" ] && "$p" --version | grep -q "release 13.0"; then
    echo "nvcc present: $p"
  else
    $PY -m pip install --quiet nvidia-cuda-nvcc==13.0.88 nvidia-nvvm==13.0.88 'nvidia-cuda-cccl==13.0.*' \
      nvidia-cuda-crt==13.0.88 'nvidia-cuda-runtime==13.0.*'
    echo "nvcc installed: $(nvcc_path)"
  fi
fi
if [ $want_hip = 1 ]; then
  libs=/usr/lib/x86_64-linux-gnu/amdgcn/bitcode
  # clang-tools-19: clang-offload-bundler, which clang runs to bundle the code
  # objects of several --offload-arch targets into one file.
  if command -v clang++-19 >/dev/null && command -v ld.lld-19 >/dev/null \
      && [ -x /usr/lib/llvm-19/bin/clang-offload-bundler ] \
      && [ -e /usr/include/hip/hip_runtime.h ] && [ -e "$libs/ocml.bc" ]; then
    echo "HIP toolchain present: $(command -v clang++-19), $libs"
  else
    SUDO=; [ "$(id -u)" = 0 ] || SUDO=sudo
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends \
      clang-19 clang-tools-19 lld-19 libamdhip64-dev rocm-device-libs >/dev/null
    echo "HIP toolchain installed: $(command -v clang++-19), $libs"
  fi
fi
