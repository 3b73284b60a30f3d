//! Compiles the GPU kernels in `kernels/*.cu` when the `cuda` or `hip` feature is
//! on, and writes `OUT_DIR/kernels_{cuda,hip}.rs` listing the embedded images.
//!
//! CUDA: nvcc from `$NVCC`, `PATH`, `/usr/local/cuda/bin` or the PyPI wheel
//! (`pip install nvidia-cuda-nvcc==13.0.88 ...`, see scripts/install-gpu-toolchains.sh)
//! builds one fatbin per source: SASS for sm_90a (H100/H200) plus sm_80 SASS and
//! compute_80 PTX for other GPUs. HIP: hipcc from `$HIPCC` or `PATH` builds a code
//! object for `$QWASI_HIP_ARCHS` (comma-separated, default gfx1030).

use std::path::{Path, PathBuf};
use std::process::Command;

fn main() {
    let manifest = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").unwrap());
    let kernels = manifest.join("../../kernels");
    println!("cargo:rerun-if-changed={}", kernels.display());
    println!("cargo:rerun-if-env-changed=NVCC");
    println!("cargo:rerun-if-env-changed=HIPCC");
    println!("cargo:rerun-if-env-changed=QWASI_HIP_ARCHS");
    let out = PathBuf::from(std::env::var("OUT_DIR").unwrap());
    let mut sources: Vec<PathBuf> = std::fs::read_dir(&kernels)
        .map(|d| d.filter_map(|e| e.ok().map(|e| e.path())).collect())
        .unwrap_or_default();
    sources.retain(|p| p.extension().is_some_and(|e| e == "cu"));
    sources.sort();
    for s in &sources {
        println!("cargo:rerun-if-changed={}", s.display());
    }
    if std::env::var_os("CARGO_FEATURE_CUDA").is_some() {
        let nvcc = find_nvcc().unwrap_or_else(|| {
            panic!(
                "feature `cuda` needs nvcc: set NVCC, put it on PATH, or run \
                 scripts/install-gpu-toolchains.sh cuda"
            )
        });
        let mut list = String::from("pub const MODULES: &[(&str, &[u8], &[&str])] = &[\n");
        for src in &sources {
            let stem = src.file_stem().unwrap().to_string_lossy().into_owned();
            let dst = out.join(format!("{stem}.fatbin"));
            let mut cmd = Command::new(&nvcc);
            cmd.args([
                "--fatbin",
                "-O3",
                "-std=c++17",
                "-gencode",
                "arch=compute_90a,code=sm_90a",
                "-gencode",
                "arch=compute_80,code=[sm_80,compute_80]",
                "-I",
            ])
            .arg(&kernels)
            .arg("-o")
            .arg(&dst)
            .arg(src);
            run(cmd, "nvcc");
            list.push_str(&format!(
                "    ({stem:?}, include_bytes!(concat!(env!(\"OUT_DIR\"), \"/{stem}.fatbin\")), &{:?}),\n",
                kernel_names(src)
            ));
        }
        list.push_str("];\n");
        std::fs::write(out.join("kernels_cuda.rs"), list).unwrap();
    }
    if std::env::var_os("CARGO_FEATURE_HIP").is_some() {
        let hipcc = std::env::var_os("HIPCC")
            .map(PathBuf::from)
            .or_else(|| which("hipcc"))
            .or_else(|| Some(PathBuf::from("/opt/rocm/bin/hipcc")).filter(|p| p.exists()))
            .unwrap_or_else(|| {
                panic!("feature `hip` needs hipcc: set HIPCC or run scripts/install-gpu-toolchains.sh hip")
            });
        let archs = std::env::var("QWASI_HIP_ARCHS").unwrap_or_else(|_| "gfx1030".into());
        let mut list = String::from("pub const MODULES: &[(&str, &[u8], &[&str])] = &[\n");
        for src in &sources {
            let stem = src.file_stem().unwrap().to_string_lossy().into_owned();
            let dst = out.join(format!("{stem}.hsaco"));
            let mut cmd = Command::new(&hipcc);
            cmd.args(["--genco", "-O3", "-std=c++17"]);
            for a in archs.split(',').map(str::trim).filter(|a| !a.is_empty()) {
                cmd.arg(format!("--offload-arch={a}"));
            }
            cmd.arg("-I").arg(&kernels).arg("-o").arg(&dst).arg(src);
            run(cmd, "hipcc");
            list.push_str(&format!(
                "    ({stem:?}, include_bytes!(concat!(env!(\"OUT_DIR\"), \"/{stem}.hsaco\")), &{:?}),\n",
                kernel_names(src)
            ));
        }
        list.push_str("];\n");
        std::fs::write(out.join("kernels_hip.rs"), list).unwrap();
    }
}

/// The `QW_KERNEL void [QW_BOUNDS(n) | QW_BOUNDS_MIN(n, m)] name(` entry points of a kernel source.
fn kernel_names(src: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(src).unwrap();
    let mut names = Vec::new();
    for line in text.lines() {
        if line.trim_end().ends_with('\\') {
            continue; // inside a #define
        }
        // Kernels instantiated by a macro: `ATTN_PREP(attn_prep_bf16, bf16_t)` at the line start.
        if let Some((mac, args)) = line.split_once('(')
            && !mac.is_empty()
            && mac.chars().all(|c| c.is_ascii_uppercase() || c == '_')
            && mac != "QW_KERNEL"
            && line.trim_end().ends_with(')')
            && !line.contains("#define")
            && let Some((name, _)) = args.split_once(',')
        {
            names.push(name.trim().to_string());
            continue;
        }
        let Some(rest) = line.trim_start().strip_prefix("QW_KERNEL void ") else {
            continue;
        };
        let rest = rest.trim_start();
        // `QW_BOUNDS(n)` or `QW_BOUNDS_MIN(n, m)` before the name.
        let rest = match rest
            .strip_prefix("QW_BOUNDS(")
            .or_else(|| rest.strip_prefix("QW_BOUNDS_MIN("))
        {
            Some(r) => r.split_once(')').map(|x| x.1).unwrap_or(r).trim_start(),
            None => rest,
        };
        if let Some((name, _)) = rest.split_once('(')
            && !name.contains(' ')
            && !name.is_empty()
            && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
        {
            names.push(name.trim().to_string());
        }
    }
    names
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
