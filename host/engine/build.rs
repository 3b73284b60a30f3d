//! Compiles the GPU kernels in `kernels/*.cu` when the `cuda` or `hip` feature is
//! on, writes `OUT_DIR/kernel_images_{cuda,hip}.rs` listing the embedded images,
//! and `OUT_DIR/kernels.rs`: a typed launch function per kernel, made from the
//! kernel's C++ signature (`src/gpu/kernel_sigs.rs`, included below).
//!
//! CUDA: nvcc from `$NVCC`, `PATH`, `/usr/local/cuda/bin` or the PyPI wheel
//! (`pip install nvidia-cuda-nvcc==13.0.88 ...`, see scripts/install-gpu-toolchains.sh)
//! builds one fatbin per source: SASS for sm_90a (H100/H200) plus sm_80 SASS and
//! compute_80 PTX for other GPUs. HIP: one code object per source for
//! `$QWASI_HIP_ARCHS` (comma-separated, default gfx1100,gfx1151: RDNA 3 and
//! 3.5), built by a ROCm hipcc or by clang++-19 with the distribution's device
//! libraries ([`HipCompiler`]; scripts/install-gpu-toolchains.sh hip). An image is
//! rebuilt only when its inputs changed (the kernel sources and headers, the
//! compiler and its arguments: a content hash next to the image), so editing
//! this script does not recompile every kernel.

use std::path::{Path, PathBuf};
use std::process::Command;

include!("src/gpu/kernel_sigs.rs");

fn main() {
    let manifest = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").unwrap());
    let kernels = manifest.join("../../kernels");
    println!("cargo:rerun-if-changed={}", kernels.display());
    println!("cargo:rerun-if-changed=src/gpu/kernel_sigs.rs");
    println!("cargo:rerun-if-env-changed=NVCC");
    println!("cargo:rerun-if-env-changed=HIPCC");
    println!("cargo:rerun-if-env-changed=QWASI_HIP_ARCHS");
    let out = PathBuf::from(std::env::var("OUT_DIR").unwrap());
    let mut files: Vec<PathBuf> = std::fs::read_dir(&kernels)
        .map(|d| d.filter_map(|e| e.ok().map(|e| e.path())).collect())
        .unwrap_or_default();
    files.sort();
    for s in &files {
        println!("cargo:rerun-if-changed={}", s.display());
    }
    let sources: Vec<&PathBuf> = files
        .iter()
        .filter(|p| p.extension().is_some_and(|e| e == "cu"))
        .collect();
    let cuda = std::env::var_os("CARGO_FEATURE_CUDA").is_some();
    let hip = std::env::var_os("CARGO_FEATURE_HIP").is_some();
    if !cuda && !hip {
        return;
    }
    // Every input of a compile but the source itself: the shared headers.
    let mut headers = String::new();
    for f in files
        .iter()
        .filter(|p| p.extension().is_some_and(|e| e == "h"))
    {
        headers.push_str(&std::fs::read_to_string(f).unwrap());
    }
    let modules: Vec<(String, Vec<KernelSig>)> = sources
        .iter()
        .map(|src| {
            let text = std::fs::read_to_string(src).unwrap();
            let sigs = parse_kernels(&text).unwrap_or_else(|e| panic!("{}: {e}", src.display()));
            (stem(src), sigs)
        })
        .collect();
    let launches = rust_launches(&modules).unwrap_or_else(|e| panic!("kernels: {e}"));
    write_if_changed(&out.join("kernels.rs"), &launches);
    if cuda {
        let nvcc = find_nvcc().unwrap_or_else(|| {
            panic!(
                "feature `cuda` needs nvcc: set NVCC, put it on PATH, or run \
                 scripts/install-gpu-toolchains.sh cuda"
            )
        });
        let args = [
            "--fatbin",
            "-O3",
            "-std=c++17",
            "-gencode",
            "arch=compute_90a,code=sm_90a",
            "-gencode",
            "arch=compute_80,code=[sm_80,compute_80]",
        ];
        let images = parallel(&sources, |src| {
            let dst = out.join(format!("{}.fatbin", stem(src)));
            let mut cmd = Command::new(&nvcc);
            cmd.args(args)
                .arg("-I")
                .arg(&kernels)
                .arg("-o")
                .arg(&dst)
                .arg(src);
            compile(cmd, "nvcc", src, &headers, &dst);
            dst
        });
        write_if_changed(&out.join("kernel_images_cuda.rs"), &image_list(&images));
    }
    if hip {
        let archs = std::env::var("QWASI_HIP_ARCHS").unwrap_or_else(|_| DEFAULT_HIP_ARCHS.into());
        let archs: Vec<&str> = archs
            .split(',')
            .map(str::trim)
            .filter(|a| !a.is_empty())
            .collect();
        // hip.rs names the targets in its "rebuild for this GPU" error.
        println!("cargo:rustc-env=QWASI_HIP_ARCHS_BUILT={}", archs.join(","));
        let compiler = HipCompiler::find(&out, &archs);
        let images = parallel(&sources, |src| {
            let dst = out.join(format!("{}.hsaco", stem(src)));
            let mut cmd = compiler.command(&archs);
            cmd.args(["-O3", "-std=c++17"])
                .arg("-I")
                .arg(&kernels)
                .arg("-o")
                .arg(&dst)
                .arg(src);
            compile(cmd, compiler.name(), src, &headers, &dst);
            dst
        });
        write_if_changed(&out.join("kernel_images_hip.rs"), &image_list(&images));
    }
}

/// The HIP targets built when `QWASI_HIP_ARCHS` is unset: RDNA 3 (Radeon RX
/// 7900, gfx1100) and RDNA 3.5 (Ryzen AI Max "Strix Halo", gfx1151).
const DEFAULT_HIP_ARCHS: &str = "gfx1100,gfx1151";

/// What compiles `kernels/*.cu` to AMD code objects.
enum HipCompiler {
    /// A ROCm (or HIP SDK) hipcc: `$HIPCC`, `/opt/rocm/bin/hipcc`,
    /// `$HIP_PATH/bin/hipcc`, else `hipcc` on `PATH`. It knows its own
    /// device libraries; ROCm 5.2's (Debian 12) stops at gfx1036.
    Hipcc(PathBuf),
    /// clang++ 19 or later (`$HIP_CLANG_PATH/clang++`, else `clang++-19` ...
    /// on `PATH`) with the HIP headers under `/usr/include/hip` and a copy of
    /// the distribution's device libraries (Debian 12: ROCm 5.2's
    /// rocm-device-libs, `$HIP_DEVICE_LIB_PATH` elsewhere) to which the
    /// `oclc_isa_version_*.bc` of newer targets are added.
    Clang {
        clang: PathBuf,
        device_libs: PathBuf,
    },
}

impl HipCompiler {
    fn find(out: &Path, archs: &[&str]) -> HipCompiler {
        println!("cargo:rerun-if-env-changed=HIP_CLANG_PATH");
        println!("cargo:rerun-if-env-changed=HIP_DEVICE_LIB_PATH");
        println!("cargo:rerun-if-env-changed=HIP_PATH");
        if let Some(p) = std::env::var_os("HIPCC") {
            return HipCompiler::Hipcc(PathBuf::from(p));
        }
        let rocm = [
            Some(PathBuf::from("/opt/rocm")),
            std::env::var_os("HIP_PATH").map(PathBuf::from),
        ];
        for dir in rocm.into_iter().flatten() {
            for exe in ["bin/hipcc", "bin/hipcc.exe", "bin/hipcc.bat"] {
                if dir.join(exe).is_file() {
                    return HipCompiler::Hipcc(dir.join(exe));
                }
            }
        }
        let clang = std::env::var_os("HIP_CLANG_PATH")
            .map(|d| PathBuf::from(d).join("clang++"))
            .or_else(|| (19..=25).rev().find_map(|v| which(&format!("clang++-{v}"))));
        let libs = std::env::var_os("HIP_DEVICE_LIB_PATH")
            .map(PathBuf::from)
            .or_else(|| {
                [
                    "/usr/lib/x86_64-linux-gnu/amdgcn/bitcode",
                    "/usr/lib/amdgcn/bitcode",
                ]
                .iter()
                .map(PathBuf::from)
                .find(|p| p.join("ocml.bc").is_file())
            });
        if let (Some(clang), Some(libs)) = (clang, libs) {
            let device_libs = out.join("amdgcn-bitcode");
            device_lib_dir(&clang, &libs, &device_libs, archs);
            return HipCompiler::Clang { clang, device_libs };
        }
        if let Some(p) = which("hipcc") {
            return HipCompiler::Hipcc(p);
        }
        panic!(
            "feature `hip` needs clang++-19 with ROCm's device libraries, or hipcc: \
             run scripts/install-gpu-toolchains.sh hip (Debian 12), or set HIPCC"
        )
    }

    fn name(&self) -> &'static str {
        match self {
            HipCompiler::Hipcc(_) => "hipcc",
            HipCompiler::Clang { .. } => "clang++ (HIP)",
        }
    }

    /// The compiler with its device-only code-object flags for `archs`.
    fn command(&self, archs: &[&str]) -> Command {
        let mut cmd = match self {
            HipCompiler::Hipcc(p) => {
                let mut c = Command::new(p);
                c.arg("--genco");
                c
            }
            HipCompiler::Clang { clang, device_libs } => {
                let mut c = Command::new(clang);
                // What hipcc passes its clang: device code only, the headers
                // under /usr, every call inlined (as hipcc does).
                c.args(["-x", "hip", "--cuda-device-only", "--rocm-path=/usr"])
                    .arg(format!("--hip-device-lib-path={}", device_libs.display()))
                    .args(["-mllvm", "-amdgpu-early-inline-all=true"])
                    .args(["-mllvm", "-amdgpu-function-calls=false"]);
                c
            }
        };
        for a in archs {
            cmd.arg(format!("--offload-arch={a}"));
        }
        cmd
    }
}

/// Fills `dir` with the device libraries of `libs` plus, for each target in
/// `archs` they lack, `oclc_isa_version_<n>.bc`: the one constant
/// `__oclc_ISA_version` (major * 1000 + minor * 100 + stepping, as ROCm's
/// own files: gfx1151 -> 11501) compiled for amdgcn by `clang`. clang reads
/// the libraries from one directory, so the originals are copied next to them.
fn device_lib_dir(clang: &Path, libs: &Path, dir: &Path, archs: &[&str]) {
    std::fs::create_dir_all(dir).unwrap();
    let entries = std::fs::read_dir(libs).unwrap_or_else(|e| {
        panic!(
            "cannot read the HIP device libraries {}: {e}",
            libs.display()
        )
    });
    for e in entries.filter_map(|e| e.ok()) {
        let dst = dir.join(e.file_name());
        let same = |a: &Path, b: &Path| {
            let len = |p: &Path| std::fs::metadata(p).map(|m| m.len()).ok();
            len(a).is_some() && len(a) == len(b)
        };
        if e.path().extension().is_some_and(|x| x == "bc") && !same(&e.path(), &dst) {
            std::fs::copy(e.path(), &dst).unwrap();
        }
    }
    for arch in archs {
        // Feature suffixes (gfx90a:xnack+) share the target's file.
        let id = arch.trim_start_matches("gfx").split(':').next().unwrap();
        let file = dir.join(format!("oclc_isa_version_{id}.bc"));
        if file.exists() {
            continue;
        }
        let version = isa_version(arch)
            .unwrap_or_else(|| panic!("QWASI_HIP_ARCHS: {arch:?} is not a gfx target"));
        let cl = dir.join(format!("oclc_isa_version_{id}.cl"));
        std::fs::write(
            &cl,
            format!("const __constant int __oclc_ISA_version = {version};\n"),
        )
        .unwrap();
        let mut cmd = Command::new(clang);
        cmd.args([
            "-x",
            "cl",
            "-cl-std=CL2.0",
            "--target=amdgcn-amd-amdhsa",
            "-nogpulib",
        ])
        .arg(format!("-mcpu=gfx{id}"))
        .args(["-emit-llvm", "-c", "-o"])
        .arg(&file)
        .arg(&cl);
        run(cmd, "clang (oclc_isa_version)");
    }
}

/// `__oclc_ISA_version` of a gfx target: the last two digits are the minor
/// version and stepping (hexadecimal: gfx90a -> 9010), the rest the major.
fn isa_version(arch: &str) -> Option<u32> {
    let id = arch.strip_prefix("gfx")?;
    // Feature suffixes (gfx90a:xnack+) do not change the ISA version.
    let id = id.split(':').next()?;
    if id.len() < 3 || !id.is_ascii() {
        return None;
    }
    let (major, rest) = id.split_at(id.len() - 2);
    let major: u32 = major.parse().ok()?;
    let minor = u32::from_str_radix(&rest[..1], 16).ok()?;
    let stepping = u32::from_str_radix(&rest[1..], 16).ok()?;
    Some(major * 1000 + minor * 100 + stepping)
}

/// `job` of every source, on up to cargo's `NUM_JOBS` threads; the results
/// in the order of `sources`.
fn parallel<T: Send>(sources: &[&PathBuf], job: impl Fn(&Path) -> T + Sync) -> Vec<T> {
    let threads = std::env::var("NUM_JOBS")
        .ok()
        .and_then(|n| n.parse::<usize>().ok())
        .unwrap_or(1)
        .clamp(1, sources.len().max(1));
    let next = std::sync::atomic::AtomicUsize::new(0);
    let done = std::sync::Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| {
                loop {
                    let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let Some(src) = sources.get(i) else { break };
                    let r = job(src);
                    done.lock().unwrap().push((i, r));
                }
            });
        }
    });
    let mut done = done.into_inner().unwrap();
    done.sort_by_key(|(i, _)| *i);
    done.into_iter().map(|(_, r)| r).collect()
}

fn stem(p: &Path) -> String {
    p.file_stem().unwrap().to_string_lossy().into_owned()
}

/// `pub const IMAGES`: (source stem, embedded image) per compiled source.
fn image_list(images: &[PathBuf]) -> String {
    let mut list = String::from("pub const IMAGES: &[(&str, &[u8])] = &[\n");
    for img in images {
        let file = img.file_name().unwrap().to_string_lossy();
        list.push_str(&format!(
            "    ({:?}, include_bytes!(concat!(env!(\"OUT_DIR\"), \"/{file}\"))),\n",
            stem(img)
        ));
    }
    list.push_str("];\n");
    list
}

/// Runs `cmd` (which writes `dst` from `src`) unless `dst` was built from the
/// same inputs: the source, the headers, the compiler and its arguments,
/// hashed into `dst.hash`.
fn compile(cmd: Command, what: &str, src: &Path, headers: &str, dst: &Path) {
    let mut key = format!("{cmd:?}\n{headers}\n");
    key.push_str(&std::fs::read_to_string(src).unwrap());
    if let Ok(m) = std::fs::metadata(cmd.get_program()).and_then(|m| m.modified()) {
        key.push_str(&format!("\n{m:?}"));
    }
    let hash = format!("{:016x}", fnv1a(key.as_bytes()));
    let stamp = dst.with_extension(format!(
        "{}.hash",
        dst.extension().unwrap().to_string_lossy()
    ));
    if dst.exists() && std::fs::read_to_string(&stamp).is_ok_and(|h| h == hash) {
        return;
    }
    run(cmd, what);
    std::fs::write(stamp, hash).unwrap();
}

/// FNV-1a, 64 bits: stable across Rust releases, unlike `DefaultHasher`.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ b as u64).wrapping_mul(0x0100_0000_01b3)
    })
}

/// Writes `text` unless the file already holds it (keeps its mtime, so the
/// crate is not rebuilt for nothing).
fn write_if_changed(path: &Path, text: &str) {
    if std::fs::read_to_string(path).is_ok_and(|t| t == text) {
        return;
    }
    std::fs::write(path, text).unwrap();
}

fn run(mut cmd: Command, what: &str) {
    let status = cmd
        .status()
        .unwrap_or_else(|e| panic!("cannot run {what} ({cmd:?}): {e}"));
    assert!(status.success(), "{what} failed: {cmd:?}");
}

fn which(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|p| p.join(name))
            .find(|p| p.is_file())
    })
}

fn find_nvcc() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("NVCC") {
        return Some(PathBuf::from(p));
    }
    if let Some(p) = which("nvcc") {
        return Some(p);
    }
    for p in ["/usr/local/cuda/bin/nvcc"] {
        if Path::new(p).exists() {
            return Some(PathBuf::from(p));
        }
    }
    for py in ["python3", "python"] {
        let out = Command::new(py)
            .args([
                "-c",
                "import nvidia, os; print(os.path.dirname(nvidia.__path__[0]))",
            ])
            .output();
        if let Ok(out) = out
            && out.status.success()
        {
            let site = String::from_utf8_lossy(&out.stdout).trim().to_string();
            for sub in ["nvidia/cu13/bin/nvcc", "nvidia/cuda_nvcc/bin/nvcc"] {
                let p = Path::new(&site).join(sub);
                if p.exists() {
                    return Some(p);
                }
            }
        }
    }
    None
}
