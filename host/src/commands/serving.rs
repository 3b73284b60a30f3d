//! Serving options of `qwasi serve`: the names clients use for the model,
//! the chat template, and default chat-template kwargs. The API guest reads
//! them through `model-info` (id, template) and `serving-config` (aliases,
//! default kwargs; WIT 0.1.3).

use crate::runtime::bindings::api::qwasi::inference::inference::ServingConfiguration;
use anyhow::{Context, Result, bail};
use std::path::PathBuf;

#[derive(clap::Args, Clone, Debug, Default)]
pub struct ServingArgs {
    /// Name clients use for the model (`model` in requests, /v1/models);
    /// repeat for aliases, the first is the id. Default: the model
    /// directory's name (`qwasi-demo` for the demo model).
    #[arg(long, value_name = "NAME")]
    pub served_model_name: Vec<String>,
    /// Jinja chat template to render prompts with, instead of the model's own
    /// (rendered the way transformers' apply_chat_template renders it).
    #[arg(long, value_name = "FILE")]
    pub chat_template: Option<PathBuf>,
    /// JSON object of chat-template kwargs every chat request gets unless it
    /// sets them itself in `chat_template_kwargs`, e.g. '{"enable_thinking": false}'.
    #[arg(long, value_name = "JSON")]
    pub default_chat_template_kwargs: Option<String>,
}

/// What the options make of the loaded model's id and template.
#[derive(Debug, Clone)]
pub struct Serving {
    pub id: String,
    pub chat_template: Option<String>,
    pub config: ServingConfiguration,
}

impl ServingArgs {
    /// Checks the options (a template file that cannot be read or kwargs
    /// that are not a JSON object fail the start) and applies them to the
    /// model's `id` and `chat_template`.
    pub fn apply(&self, id: String, chat_template: Option<String>) -> Result<Serving> {
        let mut names = self.served_model_name.iter();
        let (id, aliases) = match names.next() {
            Some(first) => (first.clone(), names.cloned().collect::<Vec<_>>()),
            None => (id, vec![]),
        };
        if let Some(n) = self.served_model_name.iter().find(|n| n.trim().is_empty()) {
            bail!("--served-model-name: empty name {n:?}");
        }
        let chat_template = match &self.chat_template {
            Some(path) => Some(
                std::fs::read_to_string(path)
                    .with_context(|| format!("--chat-template: cannot read {}", path.display()))?,
            ),
            None => chat_template,
        };
        let kwargs = match &self.default_chat_template_kwargs {
            None => "{}".to_owned(),
            Some(text) => match serde_json::from_str::<serde_json::Value>(text) {
                Ok(v @ serde_json::Value::Object(_)) => v.to_string(),
                Ok(_) => bail!("--default-chat-template-kwargs must be a JSON object, got {text}"),
                Err(e) => bail!("--default-chat-template-kwargs is not valid JSON ({e}): {text}"),
            },
        };
        Ok(Serving {
            id,
            chat_template,
            config: ServingConfiguration {
                aliases,
                default_chat_template_kwargs: kwargs,
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_template_and_kwargs() {
        let s = ServingArgs::default()
            .apply("dir-name".into(), Some("T".into()))
            .unwrap();
        assert_eq!(s.id, "dir-name");
        assert_eq!(s.chat_template.as_deref(), Some("T"));
        assert!(s.config.aliases.is_empty());
        assert_eq!(s.config.default_chat_template_kwargs, "{}");

        let file = std::env::temp_dir().join(format!("qwasi-serving-{}.jinja", std::process::id()));
        std::fs::write(&file, "{{ messages }}").unwrap();
        let a = ServingArgs {
            served_model_name: vec!["a".into(), "b".into(), "c".into()],
            chat_template: Some(file.clone()),
            default_chat_template_kwargs: Some(r#"{"enable_thinking": false}"#.into()),
        };
        let s = a.apply("dir-name".into(), None).unwrap();
        std::fs::remove_file(&file).unwrap();
        assert_eq!(s.id, "a");
        assert_eq!(s.config.aliases, ["b", "c"]);
        assert_eq!(s.chat_template.as_deref(), Some("{{ messages }}"));
        assert_eq!(
            s.config.default_chat_template_kwargs,
            r#"{"enable_thinking":false}"#
        );

        for bad in ["[1]", "{", "true"] {
            let a = ServingArgs {
                default_chat_template_kwargs: Some(bad.into()),
                ..Default::default()
            };
            let e = a.apply("x".into(), None).unwrap_err().to_string();
            assert!(e.contains("--default-chat-template-kwargs"), "{e}");
        }
        let a = ServingArgs {
            chat_template: Some("/nonexistent/t.jinja".into()),
            ..Default::default()
        };
        assert!(
            a.apply("x".into(), None)
                .unwrap_err()
                .to_string()
                .contains("--chat-template")
        );
        let a = ServingArgs {
            served_model_name: vec![" ".into()],
            ..Default::default()
        };
        assert!(a.apply("x".into(), None).is_err());
    }
}
