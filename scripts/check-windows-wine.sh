#!/usr/bin/env bash
# Runs the Windows binary that scripts/check-windows-build.sh links under Wine (Debian 12's
# Wine 8): `qwasi start` in the background (demo model, bundled guests), `status`, a
# completion over HTTP, `stop` through the stop file (Windows has no SIGTERM), a second
# start and `stop --force` (TerminateProcess), and `verify --backend hip` naming the
# Windows DLLs it looked for. The Windows-only code of
# host/src/commands/platform.rs and gpu/hip.rs runs nowhere else in CI.
# Wine 8 lacks ProcessPrng (bcryptprimitives.dll, Wine >= 9 has it), which Rust's standard
# library calls for random numbers: a stand-in DLL built here with mingw-w64 forwards it to
# RtlGenRandom. Installs wine64 when missing.
set -euo pipefail
cd "$(dirname "$0")/.."
exe=target/x86_64-pc-windows-gnu/debug/qwasi.exe
[ -f "$exe" ] || { echo "$exe missing: run scripts/check-windows-build.sh first" >&2; exit 1; }
wine=/usr/lib/wine/wine64
if [ ! -x "$wine" ]; then
  SUDO=; [ "$(id -u)" = 0 ] || SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends wine64 >/dev/null
fi
dir=$(mktemp -d)
export WINEPREFIX=$dir/prefix WINEDEBUG=-all
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
cleanup() {
  "$wine" "$dir/qwasi.exe" stop --state-dir 'Z:'"${dir//\//\\}"'\state' --timeout 5s --force >/dev/null 2>&1 || true
  /usr/lib/wine/wineserver -k 2>/dev/null || true
  rm -rf "$dir"
}
trap cleanup EXIT
cat >"$dir/prng.c" <<'EOF'
#include <windows.h>
#include <ntsecapi.h>
__declspec(dllexport) BOOL WINAPI ProcessPrng(PBYTE data, SIZE_T len) {
    while (len) {
        ULONG n = len > 0x10000000 ? 0x10000000 : (ULONG)len;
        if (!RtlGenRandom(data, n)) return FALSE;
        data += n;
        len -= n;
    }
    return TRUE;
}
EOF
x86_64-w64-mingw32-gcc -shared -O2 -o "$dir/bcryptprimitives.dll" "$dir/prng.c" -ladvapi32
cp "$exe" "$dir/qwasi.exe"
"$wine" wineboot --init >/dev/null 2>&1 || true
state='Z:'"${dir//\//\\}"'\state'
q() { "$wine" "$dir/qwasi.exe" "$@"; }

echo "wine: qwasi start --port $port"
q start --port "$port" --state-dir "$state" --compile-cache "$state\\cache" --wait-timeout 600s >"$dir/start.json"
cat "$dir/start.json"
grep -q '"started":true' "$dir/start.json"
q status --state-dir "$state" >"$dir/status.json"
grep -q '"state": "ready"' "$dir/status.json" || { cat "$dir/status.json"; exit 1; }
body=$(curl -sf -m 120 "http://127.0.0.1:$port/v1/completions" -H 'content-type: application/json' \
  -d '{"model":"qwasi-demo","prompt":"hi","max_tokens":4}')
grep -q '"finish_reason":"length"' <<<"$body" || { echo "completion: $body" >&2; exit 1; }
echo "wine: qwasi stop"
q stop --state-dir "$state" --timeout 60s | tee "$dir/stop.json"
grep -q '"stopped":true' "$dir/stop.json"
grep -q '"forced"' "$dir/stop.json" && { echo "the server had to be killed" >&2; exit 1; }
if curl -s -m 3 "http://127.0.0.1:$port/health" >/dev/null; then
  echo "the server still answers after stop" >&2
  exit 1
fi
grep -q "drained; exiting" "$dir"/state/*.log || { cat "$dir"/state/*.log; exit 1; }
[ ! -e "$dir/state/server-127.0.0.1-$port.json" ] || { echo "state file left behind" >&2; exit 1; }
# Again (the guests now come from the compile cache), then `stop --force` at once:
# TerminateProcess.
echo "wine: qwasi start again, qwasi stop --force --timeout 0s"
q start --port "$port" --state-dir "$state" --compile-cache "$state\\cache" --wait-timeout 600s >/dev/null
q stop --state-dir "$state" --timeout 0s --force | tee "$dir/stop.json"
grep -q '"stopped":true' "$dir/stop.json"
if curl -s -m 3 "http://127.0.0.1:$port/health" >/dev/null; then
  echo "the server still answers after stop --force" >&2
  exit 1
fi
out=$(q verify --backend hip --no-fixtures --synthetic qwen3.6-35b-a3b --layers 1 2>&1 || true)
grep -q "amdhip64_7.dll / amdhip64_6.dll could not be loaded" <<<"$out" \
  || { echo "verify --backend hip under Wine: $out" >&2; exit 1; }
echo "Windows run under Wine: OK (start, status, completion, stop via the stop file, stop --force, the HIP DLL message)"
