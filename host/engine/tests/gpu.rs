//! The GPU backend against the reference fixtures (feature `cuda`). Where there is
//! no CUDA driver or GPU, the test says so and passes (CI has no GPU); on a GPU
//! machine it requires every fixture case to PASS `verify`'s tolerances.

#![cfg(feature = "cuda")]

use qwasi_engine::gpu::Device;
use qwasi_engine::gpu::options::GpuOptions;
use qwasi_engine::gpu::verify::{Tolerances, fixture_dirs, fp8_resident_check, verify_fixture};
use std::path::PathBuf;

#[test]
fn gpu_matches_fixtures() {
    let opts = GpuOptions::from_env().unwrap();
    if let Err(e) = Device::new(&opts.device) {
        eprintln!("SKIPPED gpu_matches_fixtures: {e:#}");
        return;
    }
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/models");
    let dirs = fixture_dirs(&root).unwrap();
    assert!(!dirs.is_empty());
    for dir in dirs {
        for r in verify_fixture(&dir, &Tolerances::default()).unwrap() {
            assert!(r.pass, "{r:?}");
        }
    }
}

/// Block-FP8 weights kept quantized give what the same checkpoint
/// dequantized at upload gives (`verify`'s FP8 check), on every FP8 fixture.
#[test]
fn fp8_resident_matches_dequantized() {
    let opts = GpuOptions::from_env().unwrap();
    if let Err(e) = Device::new(&opts.device) {
        eprintln!("SKIPPED fp8_resident_matches_dequantized: {e:#}");
        return;
    }
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/models");
    let mut checked = 0;
    for dir in fixture_dirs(&root).unwrap() {
        if let Some(r) = fp8_resident_check(&dir).unwrap() {
            assert!(r.pass, "{r:?}");
            assert!(r.resident_bytes < r.dequantized_bytes, "{r:?}");
            checked += 1;
        }
    }
    assert!(checked > 0, "no FP8 fixture");
}
