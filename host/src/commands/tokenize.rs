//! `qwasi tokenize TEXT`

use super::ModelArgs;
use anyhow::{Context, Result};
use qwasi_engine::tokenizer::Tokenizer;

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    model: ModelArgs,
    /// The text to encode (special tokens such as <|im_start|> are recognised).
    text: String,
}

pub fn run(a: Args) -> Result<()> {
    // Only the tokenizer is needed: don't load weights.
    let tokenizer = match &a.model.model {
        Some(dir) => {
            if !dir.is_dir() {
                anyhow::bail!("model directory {} does not exist", dir.display());
            }
            Tokenizer::from_file(&dir.join("tokenizer.json"))
                .with_context(|| format!("model {} has no usable tokenizer", dir.display()))?
        }
        None => Tokenizer::qwen36()?,
    };
    let ids = tokenizer.encode(&a.text)?;
    println!("{}", serde_json::to_string(&ids)?);
    Ok(())
}
