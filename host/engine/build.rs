//! Compiles the GPU kernels in `kernels/*.cu` when the `cuda` or `hip` feature is
//! on, writes `OUT_DIR/kernel_images_{cuda,hip}.rs` listing the embedded images,
//! and `OUT_DIR/kernels.rs`: a typed launch function per kernel, made from the
//! kernel's C++ signature (`src/gpu/kernel_sigs.rs`, included below).
//!
//! CUDA: nvcc from `$NVCC`, `PATH`, `/usr/local/cuda/bin` or the PyPI wheel
//! (`pip install nvidia-cuda-nvcc==13.0.88 ...`, see scripts/install-gpu-toolchains.sh)
//! builds one fatbin per source: SASS for sm_90a (H100/H200) plus sm_80 SASS and
//! compute_80 PTX for other GPUs. HIP: hipcc from `$HIPCC` or `PATH` builds a code
//! object for `$QWASI_HIP_ARCHS` (comma-separated, default gfx1030). An image is
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
        let images = sources
            .iter()
            .map(|src| {
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
            })
            .collect::<Vec<_>>();
        write_if_changed(&out.join("kernel_images_cuda.rs"), &image_list(&images));
    }
    if hip {
        let hipcc = std::env::var_os("HIPCC")
            .map(PathBuf::from)
            .or_else(|| which("hipcc"))
            .or_else(|| Some(PathBuf::from("/opt/rocm/bin/hipcc")).filter(|p| p.exists()))
            .unwrap_or_else(|| {
                panic!("feature `hip` needs hipcc: set HIPCC or run scripts/install-gpu-toolchains.sh hip")
            });
        let archs = std::env::var("QWASI_HIP_ARCHS").unwrap_or_else(|_| "gfx1030".into());
        let images = sources
            .iter()
            .map(|src| {
                let dst = out.join(format!("{}.hsaco", stem(src)));
                let mut cmd = Command::new(&hipcc);
                cmd.args(["--genco", "-O3", "-std=c++17"]);
                for a in archs.split(',').map(str::trim).filter(|a| !a.is_empty()) {
                    cmd.arg(format!("--offload-arch={a}"));
                }
                cmd.arg("-I").arg(&kernels).arg("-o").arg(&dst).arg(src);
                compile(cmd, "hipcc", src, &headers, &dst);
                dst
            })
            .collect::<Vec<_>>();
        write_if_changed(&out.join("kernel_images_hip.rs"), &image_list(&images));
    }
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
