//! Chat messages and the built-in Qwen3.6 (ChatML) renderer.
//!
//! `<|im_start|>{role}\n{content}<|im_end|>\n` per message, then the
//! generation prompt `<|im_start|>assistant\n<think>\n` (thinking, the
//! default) or `<|im_start|>assistant\n<think>\n\n</think>\n\n` (thinking
//! off). Assistant turns follow the Qwen3 template: reasoning from turns
//! before the last user message is dropped; turns after it keep a
//! `<think>\n…\n</think>\n\n` block. This module is the fallback the model's
//! own jinja template (model-info.chat-template) will replace.

use crate::error::ApiError;
use serde_json::Value;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    System,
    User,
    Assistant,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::System => "system",
            Role::User => "user",
            Role::Assistant => "assistant",
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Message {
    pub role: Role,
    pub content: String,
    /// `reasoning_content` of an assistant turn, if the client sent it.
    pub reasoning: Option<String>,
}

impl Message {
    pub fn new(role: Role, content: &str) -> Self {
        Message {
            role,
            content: content.to_owned(),
            reasoning: None,
        }
    }
}

/// Options of the rendering (`chat_template_kwargs` and friends).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RenderOptions {
    pub add_generation_prompt: bool,
    pub enable_thinking: bool,
}

impl Default for RenderOptions {
    fn default() -> Self {
        RenderOptions {
            add_generation_prompt: true,
            enable_thinking: true,
        }
    }
}

/// Parses the `messages` array of a chat request.
pub fn parse_messages(v: Option<&Value>) -> Result<Vec<Message>, ApiError> {
    let arr = match v {
        None | Some(Value::Null) => return Err(ApiError::missing("messages")),
        Some(Value::Array(a)) => a,
        Some(_) => {
            return Err(ApiError::invalid_type(
                "messages",
                "an array of message objects",
            ));
        }
    };
    if arr.is_empty() {
        return Err(ApiError::invalid_value(
            "messages",
            "'messages' must contain at least one message",
        ));
    }
    arr.iter()
        .enumerate()
        .map(|(i, m)| parse_message(i, m))
        .collect()
}

fn parse_message(i: usize, m: &Value) -> Result<Message, ApiError> {
    let p = |f: &str| format!("messages[{i}].{f}");
    let obj = m
        .as_object()
        .ok_or_else(|| ApiError::invalid_type(&format!("messages[{i}]"), "an object"))?;
    let role = match obj.get("role") {
        None | Some(Value::Null) => return Err(ApiError::missing(&p("role"))),
        Some(Value::String(r)) => match r.as_str() {
            "system" | "developer" => Role::System,
            "user" => Role::User,
            "assistant" => Role::Assistant,
            "tool" | "function" => {
                return Err(ApiError::unsupported(
                    &p("role"),
                    format!(
                        "'{r}' messages are not supported yet (tool calling is not implemented)"
                    ),
                ));
            }
            other => {
                return Err(ApiError::invalid_value(
                    &p("role"),
                    format!(
                        "unknown role '{other}'; expected system, developer, user or assistant"
                    ),
                ));
            }
        },
        Some(_) => return Err(ApiError::invalid_type(&p("role"), "a string")),
    };
    let content = match obj.get("content") {
        None | Some(Value::Null) if role == Role::Assistant => String::new(),
        None | Some(Value::Null) => return Err(ApiError::missing(&p("content"))),
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(parts)) => parse_parts(i, parts)?,
        Some(_) => {
            return Err(ApiError::invalid_type(
                &p("content"),
                "a string or an array of content parts",
            ));
        }
    };
    if role == Role::Assistant
        && let Some(calls) = obj.get("tool_calls")
        && !calls.is_null()
        && calls.as_array().is_none_or(|a| !a.is_empty())
    {
        return Err(ApiError::unsupported(
            &p("tool_calls"),
            "tool calls are not supported yet",
        ));
    }
    let reasoning = match obj
        .get("reasoning_content")
        .or_else(|| obj.get("reasoning"))
    {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) if role == Role::Assistant => Some(s.clone()),
        Some(Value::String(_)) => None,
        Some(_) => return Err(ApiError::invalid_type(&p("reasoning_content"), "a string")),
    };
    Ok(Message {
        role,
        content,
        reasoning,
    })
}

fn parse_parts(i: usize, parts: &[Value]) -> Result<String, ApiError> {
    let mut texts = Vec::with_capacity(parts.len());
    for (j, part) in parts.iter().enumerate() {
        let p = format!("messages[{i}].content[{j}]");
        let obj = part
            .as_object()
            .ok_or_else(|| ApiError::invalid_type(&p, "a content part object"))?;
        match obj.get("type").and_then(Value::as_str) {
            Some("text") | Some("input_text") => match obj.get("text") {
                Some(Value::String(t)) => texts.push(t.as_str()),
                _ => return Err(ApiError::invalid_type(&format!("{p}.text"), "a string")),
            },
            Some(
                t @ ("image_url" | "image" | "input_image" | "input_audio" | "audio_url" | "video"
                | "video_url" | "file"),
            ) => {
                return Err(ApiError::param(
                    &format!("{p}.type"),
                    "unsupported_content",
                    format!(
                        "multimodal content is not supported: content part type '{t}' (this server serves a text-only model)"
                    ),
                ));
            }
            Some(other) => {
                return Err(ApiError::invalid_value(
                    &format!("{p}.type"),
                    format!("unknown content part type '{other}'; only 'text' is supported"),
                ));
            }
            None => return Err(ApiError::missing(&format!("{p}.type"))),
        }
    }
    Ok(texts.join("\n"))
}

/// Renders a conversation to the prompt text the model sees.
pub fn render(messages: &[Message], opts: RenderOptions) -> String {
    render_segments(messages, opts).concat()
}

/// The rendered text in segments: one per message, then the generation
/// prompt (if asked for). Every segment starts with `<|im_start|>`.
pub fn render_segments(messages: &[Message], opts: RenderOptions) -> Vec<String> {
    let mut segments = Vec::with_capacity(messages.len() + 1);
    // Index of the last user message: assistant turns after it keep their reasoning.
    let last_query = messages.iter().rposition(|m| m.role == Role::User);
    for (i, m) in messages.iter().enumerate() {
        let mut out = String::with_capacity(m.content.len() + 32);
        match m.role {
            Role::System | Role::User => {
                out.push_str("<|im_start|>");
                out.push_str(m.role.as_str());
                out.push('\n');
                out.push_str(&m.content);
                out.push_str("<|im_end|>\n");
            }
            Role::Assistant => {
                let (reasoning, content) = assistant_parts(m);
                out.push_str("<|im_start|>assistant\n");
                let after_query = last_query.is_none_or(|q| i > q);
                let is_last = i + 1 == messages.len();
                if after_query && (is_last || !reasoning.is_empty()) {
                    out.push_str("<think>\n");
                    out.push_str(reasoning.trim_matches('\n'));
                    out.push_str("\n</think>\n\n");
                    out.push_str(content.trim_start_matches('\n'));
                } else {
                    out.push_str(content);
                }
                out.push_str("<|im_end|>\n");
            }
        }
        segments.push(out);
    }
    if opts.add_generation_prompt {
        segments.push(if opts.enable_thinking {
            "<|im_start|>assistant\n<think>\n".to_string()
        } else {
            "<|im_start|>assistant\n<think>\n\n</think>\n\n".to_string()
        });
    }
    segments
}

/// (reasoning, content) of an assistant turn: `reasoning_content` if given,
/// else split out of a `<think>…</think>` in the content.
fn assistant_parts(m: &Message) -> (&str, &str) {
    if let Some(r) = &m.reasoning {
        return (r.as_str(), m.content.as_str());
    }
    match m.content.rfind("</think>") {
        Some(end) => {
            let before = &m.content[..m.content.find("</think>").unwrap_or(end)];
            let before = before.trim_end_matches('\n');
            let reasoning = match before.rfind("<think>") {
                Some(s) => &before[s + "<think>".len()..],
                None => before,
            };
            (
                reasoning.trim_start_matches('\n'),
                m.content[end + "</think>".len()..].trim_start_matches('\n'),
            )
        }
        None => ("", m.content.as_str()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn msgs(v: Value) -> Vec<Message> {
        parse_messages(Some(&v)).unwrap()
    }

    #[test]
    fn single_user_thinking_default() {
        let m = msgs(json!([{"role": "user", "content": "Hi"}]));
        assert_eq!(
            render(&m, RenderOptions::default()),
            "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n"
        );
    }

    #[test]
    fn system_user_thinking_off() {
        let m = msgs(json!([
            {"role": "system", "content": "You are terse."},
            {"role": "user", "content": "2+2?"}
        ]));
        let opts = RenderOptions {
            add_generation_prompt: true,
            enable_thinking: false,
        };
        assert_eq!(
            render(&m, opts),
            "<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\n2+2?<|im_end|>\n\
             <|im_start|>assistant\n<think>\n\n</think>\n\n"
        );
    }

    #[test]
    fn multi_turn_drops_old_reasoning() {
        let m = msgs(json!([
            {"role": "developer", "content": "Be nice."},
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "<think>\nhmm\n</think>\n\nHello!"},
            {"role": "user", "content": [{"type": "text", "text": "Part one"}, {"type": "text", "text": "part two"}]}
        ]));
        assert_eq!(
            render(&m, RenderOptions::default()),
            "<|im_start|>system\nBe nice.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n\
             <|im_start|>assistant\nHello!<|im_end|>\n<|im_start|>user\nPart one\npart two<|im_end|>\n\
             <|im_start|>assistant\n<think>\n"
        );
    }

    #[test]
    fn trailing_assistant_keeps_reasoning() {
        let m = msgs(json!([
            {"role": "user", "content": "Q"},
            {"role": "assistant", "content": "A", "reasoning_content": "\nR\n"}
        ]));
        let opts = RenderOptions {
            add_generation_prompt: false,
            enable_thinking: true,
        };
        assert_eq!(
            render(&m, opts),
            "<|im_start|>user\nQ<|im_end|>\n<|im_start|>assistant\n<think>\nR\n</think>\n\nA<|im_end|>\n"
        );
        // Last assistant turn without reasoning gets an empty think block.
        let m =
            msgs(json!([{"role": "user", "content": "Q"}, {"role": "assistant", "content": "A"}]));
        assert_eq!(
            render(&m, opts),
            "<|im_start|>user\nQ<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\nA<|im_end|>\n"
        );
        // Null content on an assistant turn is allowed.
        let m = msgs(
            json!([{"role": "user", "content": "Q"}, {"role": "assistant", "content": null}, {"role": "user", "content": "Q2"}]),
        );
        assert_eq!(
            render(&m, opts),
            "<|im_start|>user\nQ<|im_end|>\n<|im_start|>assistant\n<|im_end|>\n<|im_start|>user\nQ2<|im_end|>\n"
        );
    }

    #[test]
    fn rejects() {
        let err = |v: Value| parse_messages(Some(&v)).unwrap_err();
        let e = err(
            json!([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]),
        );
        assert_eq!(e.status, 400);
        assert!(
            e.message.contains("multimodal content is not supported"),
            "{}",
            e.message
        );
        assert_eq!(e.param.as_deref(), Some("messages[0].content[0].type"));
        assert_eq!(err(json!([])).param.as_deref(), Some("messages"));
        assert_eq!(err(json!("hi")).code, Some("invalid_type"));
        assert_eq!(
            err(json!([{"role": "wizard", "content": "x"}]))
                .param
                .as_deref(),
            Some("messages[0].role")
        );
        assert_eq!(
            err(json!([{"content": "x"}])).code,
            Some("missing_required_parameter")
        );
        assert_eq!(
            err(json!([{"role": "user"}])).param.as_deref(),
            Some("messages[0].content")
        );
        assert_eq!(
            err(json!([{"role": "user", "content": 5}])).code,
            Some("invalid_type")
        );
        assert_eq!(
            err(json!([{"role": "tool", "content": "x"}])).code,
            Some("unsupported_parameter")
        );
        assert_eq!(
            parse_messages(None).unwrap_err().code,
            Some("missing_required_parameter")
        );
    }
}
