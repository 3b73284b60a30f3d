//! A model ready to serve: configuration, weights, tokenizer and chat
//! template, from a model directory or the embedded demo.

use crate::checkpoint::Checkpoint;
use crate::config::ModelConfig;
use crate::demo;
use crate::tokenizer::Tokenizer;
use crate::weights::Weights;
use anyhow::{Context, Result};
use std::path::Path;

pub struct LoadedModel {
    /// The name clients use (the directory name, or `qwasi-demo`).
    pub id: String,
    pub config: ModelConfig,
    pub weights: Weights,
    /// `None` when the directory ships no `tokenizer.json` (token-id use only).
    pub tokenizer: Option<Tokenizer>,
    /// The model's own jinja chat template, when it ships one.
    pub chat_template: Option<String>,
    pub is_demo: bool,
}

impl LoadedModel {
    /// Loads a model directory as users download it (see the README).
    pub fn from_dir(dir: &Path) -> Result<Self> {
        let config = ModelConfig::from_dir(dir)?;
        let checkpoint = Checkpoint::open(dir)?.with_quantization(config.quantization.clone());
        let weights = Weights::load(&config, &checkpoint)?;
        let tok_path = dir.join("tokenizer.json");
        let tokenizer = if tok_path.exists() {
            Some(Tokenizer::from_file(&tok_path)?)
        } else {
            None
        };
        let id = dir
            .canonicalize()
            .ok()
            .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
            .unwrap_or_else(|| dir.display().to_string());
        Ok(LoadedModel {
            id,
            config,
            weights,
            tokenizer,
            chat_template: read_chat_template(dir)?,
            is_demo: false,
        })
    }

    /// The embedded demo model (seeded random weights, real Qwen3.6 tokenizer).
    pub fn demo() -> Result<Self> {
        let config = demo::config();
        let weights = Weights::load(&config, &demo::RandomWeights::default())?;
        Ok(LoadedModel {
            id: demo::DEMO_MODEL_ID.into(),
            config,
            weights,
            tokenizer: Some(Tokenizer::qwen36()?),
            chat_template: None,
            is_demo: true,
        })
    }

    /// `--model DIR` or the demo.
    pub fn load(dir: Option<&Path>) -> Result<Self> {
        match dir {
            Some(d) => Self::from_dir(d),
            None => Self::demo(),
        }
    }

    pub fn tokenizer(&self) -> Result<&Tokenizer> {
        self.tokenizer
            .as_ref()
            .with_context(|| format!("model {} has no tokenizer.json; pass token ids", self.id))
    }
}

/// `chat_template.jinja`, else `chat_template` in `tokenizer_config.json`.
fn read_chat_template(dir: &Path) -> Result<Option<String>> {
    let jinja = dir.join("chat_template.jinja");
    if jinja.exists() {
        return std::fs::read_to_string(&jinja)
            .map(Some)
            .with_context(|| format!("cannot read {}", jinja.display()));
    }
    let tc = dir.join("tokenizer_config.json");
    if tc.exists() {
        let text = std::fs::read_to_string(&tc)
            .with_context(|| format!("cannot read {}", tc.display()))?;
        let v: serde_json::Value = serde_json::from_str(&text)
            .with_context(|| format!("{} is not valid JSON", tc.display()))?;
        return Ok(v
            .get("chat_template")
            .and_then(|t| t.as_str())
            .map(str::to_owned));
    }
    Ok(None)
}
