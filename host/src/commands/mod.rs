//! One module per subcommand.

pub mod bench;
pub mod daemon;
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
