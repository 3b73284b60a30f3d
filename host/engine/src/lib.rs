//! The Qwasi engine: Qwen3.5/3.6 hybrid models (Gated DeltaNet + gated attention,
//! MoE or dense MLP) loaded from safetensors and run on a backend.
//!
//! This crate knows nothing about WebAssembly or HTTP so it can be tested,
//! benchmarked and embedded on its own.

pub mod backend;
pub mod checkpoint;
pub mod config;
pub mod constraint;
pub mod cpu;
pub mod demo;
pub mod fp8;
pub mod generate;
// Under `test` without a GPU feature: the device layer over a stand-in driver
// and the kernel-signature parser over the real sources.
#[cfg(any(feature = "cuda", feature = "hip", test))]
pub mod gpu;
pub mod model;
pub mod prefix_cache;
pub mod presets;
pub mod readout;
pub mod sampling;
pub mod scripted;
pub mod service;
pub mod tensor;
pub mod tokenizer;
pub mod weights;
