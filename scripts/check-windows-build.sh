#!/usr/bin/env bash
# CI compile check of the host for Windows (x86_64-pc-windows-gnu) with Debian's mingw-w64:
# the qwasi binary with the `hip` feature builds without warnings (-D warnings: the
# Windows-only code, e.g. commands/platform.rs, is compiled nowhere else) and links qwasi.exe
# (the HIP kernels compiled as on Linux by host/engine/build.rs). Nothing runs: CI has no
# Windows. Dependencies are built unoptimised here (the Linux build optimises them), so the
# check costs minutes, not the Linux build's time again.
# Installs the cross compiler, the Rust target and the HIP toolchain when missing.
set -euo pipefail
cd "$(dirname "$0")/.."
target=x86_64-pc-windows-gnu
if ! command -v x86_64-w64-mingw32-gcc >/dev/null; then
  SUDO=; [ "$(id -u)" = 0 ] || SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends gcc-mingw-w64-x86-64 >/dev/null
fi
rustup target list --installed | grep -qx "$target" || rustup target add "$target"
scripts/install-gpu-toolchains.sh hip
cargo build --target "$target" -p qwasi --features hip \
  --config "target.$target.rustflags=['-D', 'warnings']" \
  --config 'profile.dev.package."*".opt-level=0' --config 'profile.dev.package.qwasi-engine.opt-level=0' \
  --config 'profile.dev.debug=0'
exe=target/$target/debug/qwasi.exe
head -c 2 "$exe" | grep -q MZ || { echo "$exe is not a Windows executable" >&2; exit 1; }
echo "Windows build check: OK ($exe, $(du -h "$exe" | cut -f1))"
