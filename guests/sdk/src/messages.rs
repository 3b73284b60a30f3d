//! Chat messages (the OpenAI `messages`, with tool calls) and the built-in
//! Qwen3.6 (ChatML) renderer: the SDK's [`crate::chat`] format
//! (roles, reasoning, tool responses, the generation prompt) plus the tool
//! definitions and the assistant turns' tool calls, rendered here. This is
//! the fallback when the model has no jinja template (model-info's
//! `chat-template`).

use crate::ApiError;
use crate::chat as qwen;
pub use crate::chat::{RenderOptions, Role};
use serde_json::{Map, Value};

/// A tool call of an assistant message; `arguments` normalised to an object
/// (a JSON-string `arguments` is parsed).
#[derive(Debug, Clone, PartialEq)]
pub struct ToolCall {
    pub id: Option<String>,
    pub name: String,
    pub arguments: Map<String, Value>,
}

/// A chat message: the SDK's (role, content, `reasoning_content` of an
/// assistant turn if the client sent it) plus the OpenAI tool fields.
#[derive(Debug, Clone, PartialEq)]
pub struct Message {
    pub turn: qwen::Message,
    pub tool_calls: Vec<ToolCall>,
    pub tool_call_id: Option<String>,
    /// The content as sent when it was a list of parts (a jinja template
    /// gets the list, as with transformers; `turn.content` joins the texts).
    pub parts: Option<Vec<Value>>,
    /// The message's `name`, if any.
    pub name: Option<String>,
}

impl AsRef<qwen::Message> for Message {
    fn as_ref(&self) -> &qwen::Message {
        &self.turn
    }
}

impl Message {
    pub fn new(role: Role, content: &str) -> Self {
        Message {
            turn: qwen::Message::new(role, content),
            tool_calls: Vec::new(),
            tool_call_id: None,
            parts: None,
            name: None,
        }
    }

    /// The message as the template sees it (OpenAI shape, arguments as objects).
    pub fn to_template_value(&self) -> Value {
        let mut m = Map::new();
        let t = &self.turn;
        m.insert("role".into(), Value::String(t.role.as_str().into()));
        m.insert(
            "content".into(),
            match &self.parts {
                Some(p) => Value::Array(p.clone()),
                None => Value::String(t.content.clone()),
            },
        );
        if let Some(n) = &self.name {
            m.insert("name".into(), Value::String(n.clone()));
        }
        if let Some(r) = &t.reasoning {
            m.insert("reasoning_content".into(), Value::String(r.clone()));
        }
        if !self.tool_calls.is_empty() {
            let calls = self
                .tool_calls
                .iter()
                .map(|c| {
                    let mut o = Map::new();
                    if let Some(id) = &c.id {
                        o.insert("id".into(), Value::String(id.clone()));
                    }
                    o.insert("type".into(), Value::String("function".into()));
                    let mut f = Map::new();
                    f.insert("name".into(), Value::String(c.name.clone()));
                    f.insert("arguments".into(), Value::Object(c.arguments.clone()));
                    o.insert("function".into(), Value::Object(f));
                    Value::Object(o)
                })
                .collect();
            m.insert("tool_calls".into(), Value::Array(calls));
        }
        if let Some(id) = &self.tool_call_id {
            m.insert("tool_call_id".into(), Value::String(id.clone()));
        }
        Value::Object(m)
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
        Some(Value::String(r)) => match Role::parse(r) {
            Some(role) => role,
            None => {
                let other = r.as_str();
                return Err(ApiError::invalid_value(
                    &p("role"),
                    format!(
                        "unknown role '{other}'; expected system, developer, user, assistant or tool"
                    ),
                ));
            }
        },
        Some(_) => return Err(ApiError::invalid_type(&p("role"), "a string")),
    };
    let parts = match obj.get("content") {
        Some(Value::Array(a)) => Some(a.clone()),
        _ => None,
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
    let tool_calls = match obj.get("tool_calls") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(a)) if role == Role::Assistant => a
            .iter()
            .enumerate()
            .map(|(j, c)| parse_tool_call(&p(&format!("tool_calls[{j}]")), c))
            .collect::<Result<_, _>>()?,
        Some(Value::Array(a)) if a.is_empty() => Vec::new(),
        Some(Value::Array(_)) => {
            return Err(ApiError::invalid_value(
                &p("tool_calls"),
                "only assistant messages can have 'tool_calls'",
            ));
        }
        Some(_) => return Err(ApiError::invalid_type(&p("tool_calls"), "an array")),
    };
    let tool_call_id = match obj.get("tool_call_id") {
        Some(Value::String(s)) if role == Role::Tool => Some(s.clone()),
        _ => None,
    };
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
        turn: qwen::Message {
            role,
            content,
            reasoning,
        },
        tool_calls,
        tool_call_id,
        parts,
        name: obj.get("name").and_then(Value::as_str).map(str::to_owned),
    })
}

fn parse_tool_call(p: &str, c: &Value) -> Result<ToolCall, ApiError> {
    let obj = c
        .as_object()
        .ok_or_else(|| ApiError::invalid_type(p, "a tool call object"))?;
    let f = match obj.get("function") {
        Some(Value::Object(f)) => f,
        _ => return Err(ApiError::missing(&format!("{p}.function"))),
    };
    let name = match f.get("name") {
        Some(Value::String(n)) if !n.is_empty() => n.clone(),
        _ => return Err(ApiError::missing(&format!("{p}.function.name"))),
    };
    let ap = format!("{p}.function.arguments");
    let arguments = match f.get("arguments") {
        None | Some(Value::Null) => Map::new(),
        Some(Value::Object(m)) => m.clone(),
        Some(Value::String(s)) if s.trim().is_empty() => Map::new(),
        Some(Value::String(s)) => match serde_json::from_str::<Value>(s) {
            Ok(Value::Object(m)) => m,
            _ => {
                return Err(ApiError::invalid_value(
                    &ap,
                    "'arguments' must be a JSON object (or a string holding one)",
                ));
            }
        },
        Some(_) => return Err(ApiError::invalid_type(&ap, "an object or a JSON string")),
    };
    let id = obj.get("id").and_then(Value::as_str).map(str::to_owned);
    Ok(ToolCall {
        id,
        name,
        arguments,
    })
}

fn parse_parts(i: usize, parts: &[Value]) -> Result<String, ApiError> {
    parts_text(&format!("messages[{i}].content"), parts)
}

/// The text of content parts (`text`, `input_text`, `output_text`), joined
/// by newlines; multimodal parts are refused. Errors name `at[j]`.
pub fn parts_text(at: &str, parts: &[Value]) -> Result<String, ApiError> {
    let mut texts = Vec::with_capacity(parts.len());
    for (j, part) in parts.iter().enumerate() {
        let p = format!("{at}[{j}]");
        let obj = part
            .as_object()
            .ok_or_else(|| ApiError::invalid_type(&p, "a content part object"))?;
        match obj.get("type").and_then(Value::as_str) {
            Some("text" | "input_text" | "output_text") => match obj.get("text") {
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

/// Renders a conversation to the prompt text the model sees, with the
/// built-in Qwen3.6-format renderer (byte for byte what
/// `tests/fixtures/chat/qwen3_6_format.jinja` produces): the SDK's, with the
/// tool definitions and the assistant turns' tool calls.
pub fn render(messages: &[Message], tools: &[Value], opts: RenderOptions) -> String {
    let tools_text = (!tools.is_empty()).then(|| {
        let mut t =
            String::from("# Tools\n\nYou have access to the following functions:\n\n<tools>");
        for tool in tools {
            t.push('\n');
            t.push_str(&to_json_py(tool));
        }
        t.push_str(TOOLS_INSTRUCTIONS);
        t
    });
    qwen::render_with(messages, opts, tools_text.as_deref(), |out, m, content| {
        for (j, c) in m.tool_calls.iter().enumerate() {
            if j > 0 {
                out.push('\n');
            } else if !content.trim_start_matches('\n').is_empty() {
                out.push_str("\n\n");
            }
            render_call(out, c);
        }
    })
}

const TOOLS_INSTRUCTIONS: &str = "\n</tools>\n\nTo call a function, reply with exactly this format and nothing after it:\n\n<tool_call>\n<function=example_function_name>\n<parameter=example_parameter_1>\nvalue_1\n</parameter>\n<parameter=example_parameter_2>\nA value\nthat may span\nseveral lines\n</parameter>\n</function>\n</tool_call>\n\n<IMPORTANT>\nReminder:\n- Each call is a <function=...></function> block inside <tool_call></tool_call> tags\n- Give every required parameter\n- Any reasoning about the call goes BEFORE the call, never after it\n- If no function fits, answer normally and do not mention the functions\n</IMPORTANT>";

/// Appends a tool call in the Qwen3.6 XML format.
pub fn render_call(out: &mut String, c: &ToolCall) {
    out.push_str("<tool_call>\n<function=");
    out.push_str(&c.name);
    out.push_str(">\n");
    for (k, v) in &c.arguments {
        out.push_str("<parameter=");
        out.push_str(k);
        out.push_str(">\n");
        match v {
            Value::String(s) => out.push_str(s),
            v => out.push_str(&to_json_py(v)),
        }
        out.push_str("\n</parameter>\n");
    }
    out.push_str("</function>\n</tool_call>");
}

/// JSON the way Python's `json.dumps(ensure_ascii=False)` writes it (what
/// transformers' `tojson` produces): `, ` and `: ` separators.
pub fn to_json_py(v: &Value) -> String {
    crate::pyfmt::dumps(v, &crate::pyfmt::JsonOptions::default())
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
            render(&m, &[], RenderOptions::default()),
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
            ..Default::default()
        };
        assert_eq!(
            render(&m, &[], opts),
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
            render(&m, &[], RenderOptions::default()),
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
            ..Default::default()
        };
        assert_eq!(
            render(&m, &[], opts),
            "<|im_start|>user\nQ<|im_end|>\n<|im_start|>assistant\n<think>\nR\n</think>\n\nA<|im_end|>\n"
        );
        // Last assistant turn without reasoning gets an empty think block.
        let m =
            msgs(json!([{"role": "user", "content": "Q"}, {"role": "assistant", "content": "A"}]));
        assert_eq!(
            render(&m, &[], opts),
            "<|im_start|>user\nQ<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\nA<|im_end|>\n"
        );
        // Null content on an assistant turn is allowed.
        let m = msgs(
            json!([{"role": "user", "content": "Q"}, {"role": "assistant", "content": null}, {"role": "user", "content": "Q2"}]),
        );
        assert_eq!(
            render(&m, &[], opts),
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
        assert_eq!(err(json!("hi")).code.as_deref(), Some("invalid_type"));
        assert_eq!(
            err(json!([{"role": "wizard", "content": "x"}]))
                .param
                .as_deref(),
            Some("messages[0].role")
        );
        assert_eq!(
            err(json!([{"content": "x"}])).code.as_deref(),
            Some("missing_required_parameter")
        );
        assert_eq!(
            err(json!([{"role": "user"}])).param.as_deref(),
            Some("messages[0].content")
        );
        assert_eq!(
            err(json!([{"role": "user", "content": 5}])).code.as_deref(),
            Some("invalid_type")
        );
        assert_eq!(
            err(json!([{"role": "user", "content": "x", "tool_calls": [{}]}]))
                .code
                .as_deref(),
            Some("invalid_value")
        );
        assert_eq!(
            parse_messages(None).unwrap_err().code.as_deref(),
            Some("missing_required_parameter")
        );
    }
}
