//! The Messages request body: parsing and validation onto the SDK's chat
//! messages (OpenAI shape: the chat templates render that), tools and
//! sampling. Each error names its field; unknown fields (`cache_control`,
//! `metadata`, `service_tier`, ...) are ignored, as the API allows.

use serde_json::{Map, Value, json};

use qwasi_guest_sdk::ApiError;
use qwasi_guest_sdk::chat::{RenderOptions, Role};
use qwasi_guest_sdk::fields::Fields;
use qwasi_guest_sdk::inference::SamplingParams;
use qwasi_guest_sdk::messages::{Message, ToolCall};
use qwasi_guest_sdk::tools::{ToolChoice, Tools};

/// Most `stop_sequences` accepted.
pub const MAX_STOP_SEQUENCES: usize = 64;

/// A parsed `POST /v1/messages` (or `count_tokens`) body.
#[derive(Debug, Clone, PartialEq)]
pub struct MessagesRequest {
    /// `model` as sent: any name is served by the loaded model and echoed.
    pub model: String,
    pub messages: Vec<Message>,
    pub tools: Tools,
    /// `thinking` mapped onto Qwen3.6's thinking switch.
    pub render: RenderOptions,
    /// `None` for `count_tokens` (which takes no `max_tokens`).
    pub max_tokens: Option<u32>,
    pub stop_sequences: Vec<String>,
    pub sampling: SamplingParams,
    pub stream: bool,
    /// Qwasi's extension (as in the OpenAI guest): generate through EOS, for
    /// benchmarks that need a fixed output length.
    pub ignore_eos: bool,
}

/// Parses a body; `count_tokens` bodies need no `max_tokens`.
pub fn parse(body: &Map<String, Value>, count_tokens: bool) -> Result<MessagesRequest, ApiError> {
    let f = Fields(body);
    let model = match f.get("model") {
        None => return Err(ApiError::missing("model")),
        Some(Value::String(m)) if !m.is_empty() => m.clone(),
        Some(_) => return Err(ApiError::invalid_type("model", "a non-empty string")),
    };
    let max_tokens = match f.int("max_tokens", 1, u32::MAX as i64)? {
        Some(m) => Some(m as u32),
        None if count_tokens => None,
        None => return Err(ApiError::missing("max_tokens")),
    };
    let mut messages = Vec::new();
    if let Some(system) = f.get("system") {
        let text = text_of(system, "system")?;
        messages.push(Message::new(Role::System, &text));
    }
    messages.extend(parse_messages(f.get("messages"))?);
    let tools = parse_tools(&f)?;
    let render = RenderOptions {
        add_generation_prompt: true,
        enable_thinking: parse_thinking(&f, max_tokens)?,
        preserve_thinking: false,
    };
    let stop_sequences = match f.get("stop_sequences") {
        None => Vec::new(),
        Some(Value::Array(a)) if a.len() <= MAX_STOP_SEQUENCES => a
            .iter()
            .map(|s| {
                s.as_str()
                    .map(str::to_owned)
                    .ok_or_else(|| ApiError::invalid_type("stop_sequences", "an array of strings"))
            })
            .collect::<Result<_, _>>()?,
        Some(Value::Array(a)) => {
            return Err(ApiError::invalid_value(
                "stop_sequences",
                format!(
                    "'stop_sequences' takes at most {MAX_STOP_SEQUENCES} strings, got {}",
                    a.len()
                ),
            ));
        }
        Some(_) => {
            return Err(ApiError::invalid_type(
                "stop_sequences",
                "an array of strings",
            ));
        }
    };
    let mut sampling = SamplingParams::default();
    if let Some(t) = f.num("temperature", 0.0, false, 1.0)? {
        sampling.temperature = t as f32;
    }
    if let Some(p) = f.num("top_p", 0.0, true, 1.0)? {
        sampling.top_p = p as f32;
    }
    if let Some(k) = f.int("top_k", 0, i32::MAX as i64)? {
        sampling.top_k = k as u32;
    }
    Ok(MessagesRequest {
        model,
        messages,
        tools,
        render,
        max_tokens,
        stop_sequences,
        sampling,
        stream: f.bool("stream")?.unwrap_or(false),
        ignore_eos: f.bool("ignore_eos")?.unwrap_or(false),
    })
}

/// `thinking`: `{"type": "enabled", "budget_tokens": N}` (or `adaptive`)
/// turns Qwen3.6's thinking on; `disabled` or absent, off (the API's default).
fn parse_thinking(f: &Fields, max_tokens: Option<u32>) -> Result<bool, ApiError> {
    let Some(t) = f.get("thinking") else {
        return Ok(false);
    };
    let o = t
        .as_object()
        .ok_or_else(|| ApiError::invalid_type("thinking", "an object"))?;
    match o.get("type").and_then(Value::as_str) {
        Some("disabled") => Ok(false),
        Some("adaptive") => Ok(true),
        Some("enabled") => {
            let budget = Fields(o)
                .int("budget_tokens", 1024, u32::MAX as i64)
                .map_err(|e| {
                    ApiError::invalid_value(
                        "thinking.budget_tokens",
                        e.message
                            .replace("'budget_tokens'", "'thinking.budget_tokens'"),
                    )
                })?;
            let Some(budget) = budget else {
                return Err(ApiError::missing("thinking.budget_tokens"));
            };
            if let Some(m) = max_tokens
                && budget >= m as i64
            {
                return Err(ApiError::invalid_value(
                    "thinking.budget_tokens",
                    format!(
                        "'thinking.budget_tokens' ({budget}) must be less than 'max_tokens' ({m})"
                    ),
                ));
            }
            Ok(true)
        }
        Some(other) => Err(ApiError::invalid_value(
            "thinking.type",
            format!(
                "unknown thinking type '{other}'; expected 'enabled', 'adaptive' or 'disabled'"
            ),
        )),
        None => Err(ApiError::missing("thinking.type")),
    }
}

/// A string, or an array of `text` blocks (joined by blank lines), as
/// `system` and `tool_result.content` take them.
fn text_of(v: &Value, p: &str) -> Result<String, ApiError> {
    match v {
        Value::String(s) => Ok(s.clone()),
        Value::Array(blocks) => {
            let mut texts = Vec::with_capacity(blocks.len());
            for (i, b) in blocks.iter().enumerate() {
                let bp = format!("{p}[{i}]");
                match block_type(b, &bp)? {
                    "text" => texts.push(block_text(b, &bp)?),
                    t => return Err(unsupported_block(&bp, t)),
                }
            }
            Ok(texts.join("\n\n"))
        }
        _ => Err(ApiError::invalid_type(
            p,
            "a string or an array of text blocks",
        )),
    }
}

fn block_type<'a>(b: &'a Value, p: &str) -> Result<&'a str, ApiError> {
    let o = b
        .as_object()
        .ok_or_else(|| ApiError::invalid_type(p, "a content block object"))?;
    match o.get("type") {
        Some(Value::String(t)) => Ok(t),
        None => Err(ApiError::missing(&format!("{p}.type"))),
        Some(_) => Err(ApiError::invalid_type(&format!("{p}.type"), "a string")),
    }
}

fn block_text(b: &Value, p: &str) -> Result<String, ApiError> {
    str_field(b, p, "text")
}

fn str_field(b: &Value, p: &str, name: &str) -> Result<String, ApiError> {
    match b.get(name) {
        Some(Value::String(t)) => Ok(t.clone()),
        None | Some(Value::Null) => Err(ApiError::missing(&format!("{p}.{name}"))),
        Some(_) => Err(ApiError::invalid_type(&format!("{p}.{name}"), "a string")),
    }
}

fn unsupported_block(p: &str, t: &str) -> ApiError {
    match t {
        "image" | "document" | "search_result" => ApiError::param(
            &format!("{p}.type"),
            "unsupported_content",
            format!("'{t}' content blocks are not supported: this server serves a text-only model"),
        ),
        _ => ApiError::invalid_value(
            &format!("{p}.type"),
            format!("content block type '{t}' is not supported here"),
        ),
    }
}

/// `messages`: alternating `user` / `assistant` turns of a string or blocks.
/// A user turn's `tool_result` blocks become `tool` messages (in order,
/// before the turn's text); an assistant turn's `thinking` becomes its
/// reasoning and its `tool_use` blocks its tool calls.
fn parse_messages(v: Option<&Value>) -> Result<Vec<Message>, ApiError> {
    let arr = match v {
        None | Some(Value::Null) => return Err(ApiError::missing("messages")),
        Some(Value::Array(a)) => a,
        Some(_) => return Err(ApiError::invalid_type("messages", "an array of messages")),
    };
    if arr.is_empty() {
        return Err(ApiError::invalid_value(
            "messages",
            "'messages' must contain at least one message",
        ));
    }
    let mut out = Vec::new();
    for (i, m) in arr.iter().enumerate() {
        let p = format!("messages[{i}]");
        let obj = m
            .as_object()
            .ok_or_else(|| ApiError::invalid_type(&p, "an object"))?;
        let role = match obj.get("role").and_then(Value::as_str) {
            Some("user") => Role::User,
            Some("assistant") => Role::Assistant,
            Some(other) => {
                return Err(ApiError::invalid_value(
                    &format!("{p}.role"),
                    format!("unknown role '{other}'; expected 'user' or 'assistant'"),
                ));
            }
            None => return Err(ApiError::missing(&format!("{p}.role"))),
        };
        let content = obj
            .get("content")
            .ok_or_else(|| ApiError::missing(&format!("{p}.content")))?;
        match (role, content) {
            (_, Value::String(s)) => out.push(Message::new(role, s)),
            (Role::User, Value::Array(blocks)) => user_turn(&p, blocks, &mut out)?,
            (_, Value::Array(blocks)) => out.push(assistant_turn(&p, blocks)?),
            _ => {
                return Err(ApiError::invalid_type(
                    &format!("{p}.content"),
                    "a string or an array of content blocks",
                ));
            }
        }
    }
    Ok(out)
}

fn user_turn(p: &str, blocks: &[Value], out: &mut Vec<Message>) -> Result<(), ApiError> {
    let mut texts = Vec::new();
    for (j, b) in blocks.iter().enumerate() {
        let bp = format!("{p}.content[{j}]");
        match block_type(b, &bp)? {
            "text" => texts.push(block_text(b, &bp)?),
            "tool_result" => {
                let id = str_field(b, &bp, "tool_use_id")?;
                let mut text = match b.get("content") {
                    None | Some(Value::Null) => String::new(),
                    Some(c) => text_of(c, &format!("{bp}.content"))?,
                };
                if b.get("is_error") == Some(&Value::Bool(true)) {
                    text = format!("Error: {text}");
                }
                let mut m = Message::new(Role::Tool, &text);
                m.tool_call_id = Some(id);
                out.push(m);
            }
            t => return Err(unsupported_block(&bp, t)),
        }
    }
    if !texts.is_empty() || blocks.is_empty() {
        out.push(Message::new(Role::User, &texts.join("\n\n")));
    }
    Ok(())
}

fn assistant_turn(p: &str, blocks: &[Value]) -> Result<Message, ApiError> {
    let mut texts = Vec::new();
    let mut reasoning: Option<String> = None;
    let mut calls = Vec::new();
    for (j, b) in blocks.iter().enumerate() {
        let bp = format!("{p}.content[{j}]");
        match block_type(b, &bp)? {
            "text" => texts.push(block_text(b, &bp)?),
            "thinking" => {
                let t = str_field(b, &bp, "thinking")?;
                reasoning = Some(match reasoning {
                    Some(r) => r + "\n\n" + &t,
                    None => t,
                });
            }
            // Encrypted by another server: nothing this model can read.
            "redacted_thinking" => {}
            "tool_use" => {
                let name = str_field(b, &bp, "name")?;
                let arguments = match b.get("input") {
                    None | Some(Value::Null) => Map::new(),
                    Some(Value::Object(o)) => o.clone(),
                    Some(_) => {
                        return Err(ApiError::invalid_type(&format!("{bp}.input"), "an object"));
                    }
                };
                let id = b.get("id").and_then(Value::as_str).map(str::to_owned);
                calls.push(ToolCall {
                    id,
                    name,
                    arguments,
                });
            }
            t => return Err(unsupported_block(&bp, t)),
        }
    }
    let mut m = Message::new(Role::Assistant, &texts.join("\n\n"));
    m.turn.reasoning = reasoning;
    m.tool_calls = calls;
    Ok(m)
}

/// `tools` (custom tools with an `input_schema`) in the OpenAI function
/// shape the templates render, `tool_choice` and `disable_parallel_tool_use`.
fn parse_tools(f: &Fields) -> Result<Tools, ApiError> {
    let mut tools = Vec::new();
    match f.get("tools") {
        None => {}
        Some(Value::Array(a)) => {
            for (i, t) in a.iter().enumerate() {
                let p = format!("tools[{i}]");
                let o = t
                    .as_object()
                    .ok_or_else(|| ApiError::invalid_type(&p, "a tool object"))?;
                if let Some(ty) = o.get("type").and_then(Value::as_str)
                    && ty != "custom"
                {
                    return Err(ApiError::invalid_value(
                        &format!("{p}.type"),
                        format!(
                            "tool type '{ty}' is not supported; only custom tools (with an 'input_schema') are"
                        ),
                    ));
                }
                let name = str_field(t, &p, "name")?;
                let schema = match o.get("input_schema") {
                    Some(s @ Value::Object(_)) => s.clone(),
                    None | Some(Value::Null) => {
                        return Err(ApiError::missing(&format!("{p}.input_schema")));
                    }
                    Some(_) => {
                        return Err(ApiError::invalid_type(
                            &format!("{p}.input_schema"),
                            "an object",
                        ));
                    }
                };
                let mut func = json!({"name": name});
                if let Some(Value::String(d)) = o.get("description") {
                    func["description"] = Value::String(d.clone());
                }
                func["parameters"] = schema;
                tools.push(json!({"type": "function", "function": func}));
            }
        }
        Some(_) => return Err(ApiError::invalid_type("tools", "an array of tool objects")),
    }
    let mut parallel = true;
    let choice = match f.get("tool_choice") {
        None => ToolChoice::Auto,
        Some(Value::Object(o)) => {
            if let Some(Value::Bool(b)) = o.get("disable_parallel_tool_use") {
                parallel = !b;
            }
            match o.get("type").and_then(Value::as_str) {
                Some("auto") => ToolChoice::Auto,
                Some("any") => ToolChoice::Required,
                Some("none") => ToolChoice::None,
                Some("tool") => match o.get("name") {
                    Some(Value::String(n)) => ToolChoice::Named(n.clone()),
                    _ => return Err(ApiError::missing("tool_choice.name")),
                },
                Some(other) => {
                    return Err(ApiError::invalid_value(
                        "tool_choice.type",
                        format!(
                            "unknown tool_choice type '{other}'; expected auto, any, tool or none"
                        ),
                    ));
                }
                None => return Err(ApiError::missing("tool_choice.type")),
            }
        }
        Some(_) => return Err(ApiError::invalid_type("tool_choice", "an object")),
    };
    let tools = Tools {
        tools,
        choice,
        parallel,
        kwargs: Map::new(),
    };
    match &tools.choice {
        ToolChoice::Required | ToolChoice::Named(_) if tools.tools.is_empty() => Err(
            ApiError::invalid_value("tool_choice", "this 'tool_choice' requires 'tools'"),
        ),
        ToolChoice::Named(n) if tools.rendered().is_empty() => Err(ApiError::invalid_value(
            "tool_choice.name",
            format!("tool_choice names tool '{n}', which is not in 'tools'"),
        )),
        _ => Ok(tools),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use qwasi_guest_sdk::fields::parse_body;

    fn req(v: Value) -> Result<MessagesRequest, ApiError> {
        parse(&parse_body(v.to_string().as_bytes()).unwrap(), false)
    }

    #[test]
    fn full_request_maps_onto_chat() {
        let r = req(json!({
            "model": "claude-sonnet-4-5", "max_tokens": 2048,
            "system": [{"type": "text", "text": "You are terse.", "cache_control": {"type": "ephemeral"}}],
            "messages": [
                {"role": "user", "content": "Weather in Paris?"},
                {"role": "assistant", "content": [
                    {"type": "thinking", "thinking": "Use the tool.", "signature": "x"},
                    {"type": "redacted_thinking", "data": "opaque"},
                    {"type": "text", "text": "Checking."},
                    {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "18C"}]},
                    {"type": "tool_result", "tool_use_id": "toolu_2", "content": "boom", "is_error": true},
                    {"type": "text", "text": "Thanks"}]}
            ],
            "tools": [{"name": "get_weather", "description": "Weather", "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}, "cache_control": {"type": "ephemeral"}}],
            "tool_choice": {"type": "any", "disable_parallel_tool_use": true},
            "thinking": {"type": "enabled", "budget_tokens": 1024},
            "stop_sequences": ["END"], "temperature": 0.5, "top_k": 20, "top_p": 0.9,
            "metadata": {"user_id": "u"}, "stream": true, "service_tier": "auto"
        }))
        .unwrap();
        assert_eq!(r.model, "claude-sonnet-4-5");
        assert_eq!(r.max_tokens, Some(2048));
        assert!(r.render.enable_thinking && r.stream);
        assert_eq!(r.stop_sequences, vec!["END"]);
        assert_eq!((r.sampling.temperature, r.sampling.top_k), (0.5, 20));
        assert_eq!(r.tools.choice, ToolChoice::Required);
        assert!(!r.tools.parallel);
        assert_eq!(
            r.tools.tools[0],
            json!({"type": "function", "function": {"name": "get_weather", "description": "Weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}})
        );
        let roles: Vec<&str> = r.messages.iter().map(|m| m.turn.role.as_str()).collect();
        assert_eq!(
            roles,
            ["system", "user", "assistant", "tool", "tool", "user"]
        );
        assert_eq!(r.messages[0].turn.content, "You are terse.");
        let a = &r.messages[2];
        assert_eq!(a.turn.content, "Checking.");
        assert_eq!(a.turn.reasoning.as_deref(), Some("Use the tool."));
        assert_eq!(a.tool_calls[0].name, "get_weather");
        assert_eq!(a.tool_calls[0].arguments["city"], "Paris");
        assert_eq!(r.messages[3].turn.content, "18C");
        assert_eq!(r.messages[3].tool_call_id.as_deref(), Some("toolu_1"));
        assert_eq!(r.messages[4].turn.content, "Error: boom");
        assert_eq!(r.messages[5].turn.content, "Thanks");
    }

    #[test]
    fn defaults_and_count_tokens() {
        let r = req(
            json!({"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}),
        )
        .unwrap();
        assert!(
            !r.render.enable_thinking,
            "thinking is off unless asked for"
        );
        assert_eq!(r.tools.choice, ToolChoice::Auto);
        assert!(!r.stream);
        let body =
            parse_body(br#"{"model": "m", "messages": [{"role": "user", "content": "hi"}]}"#)
                .unwrap();
        assert_eq!(parse(&body, true).unwrap().max_tokens, None);
    }

    #[test]
    fn errors_name_the_field() {
        let e = |v: Value| req(v).unwrap_err();
        let base = |extra: Value| {
            let mut v = json!({"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]});
            for (k, x) in extra.as_object().unwrap() {
                v[k] = x.clone();
            }
            v
        };
        assert_eq!(
            e(json!({"model": "m", "messages": []})).param.as_deref(),
            Some("max_tokens")
        );
        assert_eq!(
            e(base(json!({"messages": []}))).param.as_deref(),
            Some("messages")
        );
        let img = e(base(
            json!({"messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]}),
        ));
        assert_eq!(img.status, 400);
        assert_eq!(img.param.as_deref(), Some("messages[0].content[0].type"));
        assert!(img.message.contains("text-only"), "{}", img.message);
        assert_eq!(
            e(base(
                json!({"messages": [{"role": "system", "content": "x"}]})
            ))
            .param
            .as_deref(),
            Some("messages[0].role")
        );
        assert_eq!(
            e(base(json!({"temperature": 1.5}))).param.as_deref(),
            Some("temperature")
        );
        assert_eq!(
            e(base(
                json!({"thinking": {"type": "enabled", "budget_tokens": 10}})
            ))
            .param
            .as_deref(),
            Some("thinking.budget_tokens")
        );
        assert_eq!(
            e(base(
                json!({"thinking": {"type": "enabled", "budget_tokens": 2000}})
            ))
            .param
            .as_deref(),
            Some("thinking.budget_tokens")
        );
        assert_eq!(
            e(base(json!({"tool_choice": {"type": "any"}})))
                .param
                .as_deref(),
            Some("tool_choice")
        );
        assert_eq!(
            e(base(json!({"tools": [{"name": "x"}]}))).param.as_deref(),
            Some("tools[0].input_schema")
        );
        assert_eq!(
            e(base(
                json!({"tools": [{"type": "web_search_20250305", "name": "web_search"}]})
            ))
            .param
            .as_deref(),
            Some("tools[0].type")
        );
        assert_eq!(
            e(base(json!({"tools": [{"name": "a", "input_schema": {}}], "tool_choice": {"type": "tool", "name": "b"}}))).param.as_deref(),
            Some("tool_choice.name")
        );
    }
}
