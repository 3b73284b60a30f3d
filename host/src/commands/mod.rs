//! One module per subcommand.

pub mod bench;
pub mod daemon;
pub mod engine;
pub mod generate;
pub mod limits;
pub mod platform;
pub mod run;
pub mod serve;
pub mod serving;
pub mod state;
pub mod tokenize;
pub mod verify;

use clap::Args as ClapArgs;

/// The GPU backend of this build (cuda wins when both features are on).
pub const GPU_BACKEND: &str = if cfg!(all(feature = "hip", not(feature = "cuda"))) {
    "hip"
} else {
    "cuda"
};
use std::path::PathBuf;

/// Options shared by every command that loads a model.
#[derive(ClapArgs, Clone, Debug)]
pub struct ModelArgs {
    /// Model directory (config.json, *.safetensors, tokenizer.json). Without it,
    /// the embedded demo model is used.
    #[arg(long, value_name = "DIR")]
    pub model: Option<PathBuf>,
}

/// The GPU backends' prompt precision, shared by the commands that load a
/// model (docs/GPU.md "Numerics").
#[derive(ClapArgs, Clone, Debug, Default)]
pub struct PrecisionArgs {
    /// Prompt passes on cuda/hip: `split` (activations as two bf16 terms,
    /// ~f32 accuracy, the default), `bf16` (one bf16 term per product: a
    /// faster prefill at the accuracy of bf16 inference) or `fp8` (as bf16,
    /// and an FP8 checkpoint's projections and routed experts on FP8 tensor
    /// cores with FP8 activations, sm_90); decode keeps f32 activations. Overrides
    /// QWASI_PREFILL_PRECISION. The cpu backend (the f32 reference) refuses
    /// all but `split`.
    #[arg(long, value_name = "MODE", value_parser = ["split", "bf16", "fp8"])]
    pub prefill_precision: Option<String>,
}

impl PrecisionArgs {
    /// Sets the flag for the models this process loads on `backend`, before
    /// they load.
    pub fn apply(&self, backend: &str) -> anyhow::Result<()> {
        let Some(v) = self.prefill_precision.as_deref() else {
            return Ok(());
        };
        if backend == "cpu" {
            if v != "split" {
                anyhow::bail!(
                    "--prefill-precision {v}: the cpu backend computes prompts in f32 (it is the \
                     reference); the option applies to cuda and hip"
                );
            }
            return Ok(());
        }
        #[cfg(any(feature = "cuda", feature = "hip"))]
        {
            use qwasi_engine::gpu::options::{PrefillPrecision, set_prefill_precision};
            set_prefill_precision(PrefillPrecision::parse("--prefill-precision", v)?)?;
        }
        Ok(())
    }
}
