#!/usr/bin/env python3
"""Registers, scratch and LDS of every HIP kernel per AMD target, as a Markdown table.

Compiles each kernels/*.cu once per target with clang++-19 (the compiler and device
libraries of scripts/install-gpu-toolchains.sh hip, as host/engine/build.rs does) and
`-Rpass-analysis=kernel-resource-usage`, and prints one row per kernel. Fails when a
kernel does not compile or its static LDS alone exceeds --lds-limit (RDNA's 64 KB per
workgroup); the dynamic shared memory the host adds is sized from the device's limit
(docs/AMD.md).

  scripts/hip-resource-usage.py                      # the table, gfx1100 and gfx1151
  scripts/hip-resource-usage.py --archs gfx1030      # other targets
  scripts/hip-resource-usage.py --write docs/AMD.md  # replace the table between its markers
  scripts/hip-resource-usage.py --check docs/AMD.md  # exit 3 if that table is out of date
"""

import argparse
import concurrent.futures
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEVICE_LIBS = Path("/usr/lib/x86_64-linux-gnu/amdgcn/bitcode")
BEGIN = "<!-- hip-resource-usage: begin (scripts/hip-resource-usage.py --write docs/AMD.md) -->"
END = "<!-- hip-resource-usage: end -->"
# --check's exit status when only the table differs (a kernel that fails gives 1).
OUT_OF_DATE = 3
# The fields of a kernel-resource-usage remark, as the table names them.
FIELDS = {
    "VGPRs": "vgpr",
    "SGPRs": "sgpr",
    "ScratchSize [bytes/lane]": "scratch",
    "VGPRs Spill": "vspill",
    "LDS Size [bytes/block]": "lds",
    "Occupancy [waves/SIMD]": "occ",
}
REMARK = re.compile(r"remark:\s+(Function Name|[A-Za-z ]+(?:\[[^\]]*\])?): (\S+) \[-Rpass-analysis")


def isa_version(arch):
    """`__oclc_ISA_version` of a gfx target (build.rs `isa_version`): gfx1151 -> 11501."""
    ident = arch.removeprefix("gfx").split(":")[0]
    return int(ident[:-2]) * 1000 + int(ident[-2], 16) * 100 + int(ident[-1], 16)


def device_lib_dir(clang, archs, into):
    """ROCm's device libraries plus the oclc_isa_version_*.bc they lack (build.rs `device_lib_dir`)."""
    for f in DEVICE_LIBS.glob("*.bc"):
        (into / f.name).symlink_to(f)
    for arch in archs:
        ident = arch.removeprefix("gfx").split(":")[0]
        bc = into / f"oclc_isa_version_{ident}.bc"
        if bc.exists():
            continue
        cl = into / f"oclc_isa_version_{ident}.cl"
        cl.write_text(f"const __constant int __oclc_ISA_version = {isa_version(arch)};\n")
        subprocess.run([clang, "-x", "cl", "-cl-std=CL2.0", "--target=amdgcn-amd-amdhsa", "-nogpulib",
                        f"-mcpu=gfx{ident}", "-emit-llvm", "-c", "-o", bc, cl], check=True)


def usage(clang, libs, src, arch, tmp):
    """{kernel: {field: value}} of `src` compiled for `arch`."""
    out = tmp / f"{src.stem}-{arch}.hsaco"
    cmd = [clang, "-x", "hip", "--cuda-device-only", "--rocm-path=/usr", f"--hip-device-lib-path={libs}",
           "-mllvm", "-amdgpu-early-inline-all=true", "-mllvm", "-amdgpu-function-calls=false",
           f"--offload-arch={arch}", "-O3", "-std=c++17", f"-I{ROOT / 'kernels'}",
           "-Rpass-analysis=kernel-resource-usage", "-o", out, src]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"{src.relative_to(ROOT)} ({arch}) does not compile:\n{r.stderr}")
    kernels, name = {}, None
    for m in REMARK.finditer(r.stderr):
        key, value = m.group(1).strip(), m.group(2)
        if key == "Function Name":
            name = value
            kernels[name] = {}
        elif name and key in FIELDS:
            kernels[name][FIELDS[key]] = int(value)
    return kernels


def table(results, archs):
    """Markdown: one row per kernel, `a / b` where the targets differ."""

    def cell(per_arch, field):
        vals = [per_arch[a].get(field, 0) for a in archs]
        return str(vals[0]) if len(set(vals)) == 1 else " / ".join(map(str, vals))

    head = ("| kernel | source | VGPRs | SGPRs | scratch (B/lane) | VGPR spills | static LDS (B) "
            "| waves/SIMD |")
    lines = [f"Targets: {', '.join(archs)} (a value per target where they differ).", "", head,
             "|" + "---|" * 8]
    # CUDA-only kernels (tensor cores, bulk copies) compile to empty bodies on HIP.
    stubs = []
    for (src, kernel), per_arch in sorted(results.items()):
        if all(per_arch[a].get("vgpr", 0) == 0 for a in archs):
            stubs.append(f"`{kernel}`")
            continue
        cols = [cell(per_arch, f) for f in ("vgpr", "sgpr", "scratch", "vspill", "lds", "occ")]
        lines.append(f"| `{kernel}` | {src} | " + " | ".join(cols) + " |")
    if stubs:
        lines += ["", "Empty on HIP (CUDA-only paths; the host never launches them there): "
                  + ", ".join(stubs) + "."]
    return "\n".join(lines) + "\n"


def splice(doc, text):
    body = doc.read_text()
    if BEGIN not in body or END not in body:
        sys.exit(f"{doc}: no table markers ({BEGIN} ... {END})")
    head, rest = body.split(BEGIN, 1)
    return head + BEGIN + "\n" + text + END + rest.split(END, 1)[1]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--archs", default="gfx1100,gfx1151")
    ap.add_argument("--lds-limit", type=int, default=65536)
    ap.add_argument("--write", type=Path, metavar="DOC")
    ap.add_argument("--check", type=Path, metavar="DOC")
    a = ap.parse_args()
    archs = [x.strip() for x in a.archs.split(",") if x.strip()]
    clang = shutil.which("clang++-19") or sys.exit("clang++-19 missing: run scripts/install-gpu-toolchains.sh hip")
    sources = sorted((ROOT / "kernels").glob("*.cu"))
    results = {}
    with tempfile.TemporaryDirectory() as t:
        tmp = Path(t)
        libs = tmp / "bitcode"
        libs.mkdir()
        device_lib_dir(clang, archs, libs)
        jobs = [(s, arch) for s in sources for arch in archs]
        with concurrent.futures.ThreadPoolExecutor(os.cpu_count() or 2) as pool:
            done = pool.map(lambda j: (j, usage(clang, libs, j[0], j[1], tmp)), jobs)
            for (src, arch), kernels in done:
                for k, v in kernels.items():
                    results.setdefault((src.name, k), {})[arch] = v
    over = [(k, arch, v["lds"]) for k, per in results.items() for arch, v in per.items()
            if v.get("lds", 0) > a.lds_limit]
    for (src, k), arch, lds in over:
        print(f"{src} {k} ({arch}): {lds} bytes of static LDS > {a.lds_limit}", file=sys.stderr)
    if over:
        sys.exit(1)
    text = table(results, archs)
    if a.write:
        a.write.write_text(splice(a.write, text))
        print(f"wrote the table of {len(results)} kernels into {a.write}")
    elif a.check:
        if splice(a.check, text) != a.check.read_text():
            print(text)
            print(f"{a.check}: the kernel resource table is out of date; run "
                  f"scripts/hip-resource-usage.py --write {a.check}", file=sys.stderr)
            sys.exit(OUT_OF_DATE)
        print(f"{a.check}: the kernel resource table is up to date ({len(results)} kernels)")
    else:
        print(text, end="")


if __name__ == "__main__":
    main()
