#!/usr/bin/env bash
# Installs the GPU compilers Qwasi's `cuda` and `hip` features build with, idempotently:
#  - CUDA 13.0 nvcc from PyPI (no GPU or driver needed to compile); nvvm pinned,
#    since an unpinned nvvm 13.5 emits PTX the 13.0 ptxas rejects.
#  - hipcc + HIP headers/runtime from the distribution (ROCm 5.2 on Debian 12).
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
  if command -v hipcc >/dev/null && [ -e /usr/include/hip/hip_runtime.h ]; then
    echo "hipcc present: $(command -v hipcc)"
  else
    SUDO=; [ "$(id -u)" = 0 ] || SUDO=sudo
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq hipcc libamdhip64-dev >/dev/null
    echo "hipcc installed: $(command -v hipcc)"
  fi
fi
