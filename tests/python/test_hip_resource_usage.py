"""scripts/hip-resource-usage.py: the ISA-version constants it (and host/engine/build.rs)
generates agree with ROCm's own oclc_isa_version_*.bc, the generated files work for
gfx1100 / gfx1151, and the remarks are read into the right columns.
Needs clang++-19 and rocm-device-libs (scripts/install-gpu-toolchains.sh hip); skipped
without them. CI runs it from scripts/check-gpu-build.sh.

Run: python3 -m unittest discover -s tests/python -p 'test_hip_resource_usage.py'
"""
import importlib.util
import os
import re
import shutil
import subprocess
import tempfile
import unittest
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent
spec = importlib.util.spec_from_file_location("hru", ROOT / "scripts/hip-resource-usage.py")
hru = importlib.util.module_from_spec(spec)
spec.loader.exec_module(hru)
CLANG = shutil.which("clang++-19")


def isa_constant(clang, bc):
    """The value of __oclc_ISA_version in a bitcode file (clang prints it as LLVM IR)."""
    ir = subprocess.run([clang, "-S", "-emit-llvm", "-x", "ir", bc, "-o", "-"],
                        capture_output=True, text=True, check=True).stdout
    return int(re.search(r"@__oclc_ISA_version = .* i32 (\d+)", ir).group(1))


@unittest.skipUnless(CLANG and hru.DEVICE_LIBS.is_dir(), "needs clang++-19 and rocm-device-libs")
class HipResourceUsageTest(unittest.TestCase):
    def test_isa_version_matches_rocms_files(self):
        shipped = sorted(hru.DEVICE_LIBS.glob("oclc_isa_version_*.bc"))
        self.assertGreater(len(shipped), 20)
        for bc in shipped:
            arch = "gfx" + bc.stem.removeprefix("oclc_isa_version_")
            self.assertEqual(hru.isa_version(arch), isa_constant(CLANG, bc), arch)

    def test_generated_libraries_build_a_kernel_for_rdna3(self):
        src = ("#include <hip/hip_runtime.h>\n"
               "extern \"C\" __global__ void k(float* o) {\n"
               "  __shared__ float s[1000];\n"
               "  s[threadIdx.x] = sqrtf((float)threadIdx.x);\n"
               "  __syncthreads();\n"
               "  o[threadIdx.x] = s[999 - threadIdx.x] + expf(o[threadIdx.x]);\n"
               "}\n")
        with tempfile.TemporaryDirectory() as t:
            tmp = Path(t)
            libs = tmp / "bitcode"
            libs.mkdir()
            hru.device_lib_dir(CLANG, ["gfx1100", "gfx1151"], libs)
            self.assertEqual(isa_constant(CLANG, libs / "oclc_isa_version_1100.bc"), 11000)
            self.assertEqual(isa_constant(CLANG, libs / "oclc_isa_version_1151.bc"), 11501)
            (tmp / "k.cu").write_text(src)
            for arch in ("gfx1100", "gfx1151"):
                usage = hru.usage(CLANG, libs, tmp / "k.cu", arch, tmp)
                self.assertEqual(list(usage), ["k"])
                self.assertEqual(usage["k"]["lds"], 4000)
                self.assertGreater(usage["k"]["vgpr"], 0)
                self.assertEqual(usage["k"]["scratch"], 0)
                self.assertTrue((tmp / f"k-{arch}.hsaco").stat().st_size > 0)

    def test_table_merges_targets_and_lists_empty_kernels(self):
        one = {"vgpr": 10, "sgpr": 8, "scratch": 0, "vspill": 0, "lds": 128, "occ": 16}
        results = {
            ("a.cu", "real"): {"gfx1100": one, "gfx1151": dict(one, vgpr=12)},
            ("a.cu", "stub"): {"gfx1100": dict(one, vgpr=0), "gfx1151": dict(one, vgpr=0)},
        }
        text = hru.table(results, ["gfx1100", "gfx1151"])
        self.assertIn("| `real` | a.cu | 10 / 12 | 8 | 0 | 0 | 128 | 16 |", text)
        self.assertNotIn("| `stub`", text)
        self.assertIn("Empty on HIP", text)
        self.assertIn("`stub`", text)


if __name__ == "__main__":
    unittest.main()
