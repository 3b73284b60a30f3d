//! The Responses request as the chat request it means: `instructions` and
//! `input` items as `messages`, function tools as chat tools,
//! `max_output_tokens`, `reasoning` onto the thinking switch; then the chat
//! parser, with errors naming the Responses fields.

use serde_json::{Map, Value, json};

use crate::params::{self, ChatRequest};
use qwasi_guest_sdk::ApiError;
use qwasi_guest_sdk::inference::ModelInfo;

/// Fields passed to the chat parser as they are (Qwasi's sampling extensions included).
const PASSED: &[&str] = &[
    "model",
    "stream",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "seed",
    "ignore_eos",
    "parallel_tool_calls",
];

/// What needs the state this server does not keep.
const STATEFUL: &[&str] = &["previous_response_id", "conversation", "background"];

/// The chat request body a Responses body means.
pub fn to_chat_body(body: &Map<String, Value>) -> Result<Map<String, Value>, ApiError> {
    for f in STATEFUL {
        if body
            .get(*f)
            .is_some_and(|v| !v.is_null() && *v != Value::Bool(false))
        {
            return Err(ApiError::unsupported(
                f,
                format!(
                    "'{f}' is not supported: this server does not store responses; \
                     send the whole conversation as 'input' items instead"
                ),
            ));
        }
    }
    let mut chat = Map::new();
    for f in PASSED {
        if let Some(v) = body.get(*f) {
            chat.insert((*f).into(), v.clone());
        }
    }
    if let Some(v) = body.get("max_output_tokens") {
        chat.insert("max_completion_tokens".into(), v.clone());
    }
    if let Some(t) = body.get("text").and_then(|t| t.get("format"))
        && t.get("type").and_then(Value::as_str) != Some("text")
    {
        return Err(ApiError::unsupported(
            "text.format",
            "only text.format {\"type\": \"text\"} is supported",
        ));
    }
    // Thinking is the model's default; `reasoning.effort` maps onto it as
    // chat's `reasoning_effort` does ("none"/"minimal" turn it off).
    if let Some(effort) = body
        .get("reasoning")
        .and_then(|r| r.get("effort"))
        .filter(|e| !e.is_null())
    {
        chat.insert("reasoning_effort".into(), effort.clone());
    }
    let mut messages = Vec::new();
    match body.get("instructions") {
        None | Some(Value::Null) => {}
        Some(Value::String(s)) => messages.push(json!({"role": "system", "content": s})),
        Some(_) => return Err(ApiError::invalid_type("instructions", "a string")),
    }
    match body.get("input") {
        None | Some(Value::Null) => return Err(ApiError::missing("input")),
        Some(Value::String(s)) => messages.push(json!({"role": "user", "content": s})),
        Some(Value::Array(items)) => input_items(items, &mut messages)?,
        Some(_) => {
            return Err(ApiError::invalid_type(
                "input",
                "a string or an array of input items",
            ));
        }
    }
    chat.insert("messages".into(), Value::Array(messages));
    if let Some(tools) = body.get("tools") {
        chat.insert("tools".into(), chat_tools(tools)?);
    }
    if let Some(c) = body.get("tool_choice") {
        let c = match c {
            Value::Object(o) if o.get("type").and_then(Value::as_str) == Some("function") => {
                json!({"type": "function", "function": {"name": o.get("name").cloned().unwrap_or(Value::Null)}})
            }
            Value::Object(_) => {
                return Err(ApiError::invalid_value(
                    "tool_choice",
                    "only 'auto', 'none', 'required' or a function tool_choice is supported",
                ));
            }
            other => other.clone(),
        };
        chat.insert("tool_choice".into(), c);
    }
    Ok(chat)
}

/// Function tools `{type, name, description, parameters}` as chat tools.
fn chat_tools(tools: &Value) -> Result<Value, ApiError> {
    let arr = tools
        .as_array()
        .ok_or_else(|| ApiError::invalid_type("tools", "an array of tool objects"))?;
    let mut out = Vec::with_capacity(arr.len());
    for (i, t) in arr.iter().enumerate() {
        let p = format!("tools[{i}]");
        match t.get("type").and_then(Value::as_str) {
            Some("function") => {}
            Some(other) => {
                return Err(ApiError::unsupported(
                    &format!("{p}.type"),
                    format!("tool type '{other}' is not supported; only 'function' tools are"),
                ));
            }
            None => return Err(ApiError::missing(&format!("{p}.type"))),
        }
        let name = match t.get("name") {
            Some(Value::String(n)) if !n.is_empty() => n.clone(),
            _ => return Err(ApiError::missing(&format!("{p}.name"))),
        };
        let mut f = json!({"name": name});
        for k in ["description", "parameters"] {
            if let Some(v) = t.get(k).filter(|v| !v.is_null()) {
                f[k] = v.clone();
            }
        }
        out.push(json!({"type": "function", "function": f}));
    }
    Ok(Value::Array(out))
}

/// `input` items as chat messages: messages, `function_call`s (joined to
/// the assistant turn before them), `function_call_output`s (tool
/// messages) and `reasoning` (the next assistant turn's reasoning).
fn input_items(items: &[Value], messages: &mut Vec<Value>) -> Result<(), ApiError> {
    let mut reasoning: Option<String> = None;
    for (i, item) in items.iter().enumerate() {
        let p = format!("input[{i}]");
        let o = item
            .as_object()
            .ok_or_else(|| ApiError::invalid_type(&p, "an input item object"))?;
        let ty = o.get("type").and_then(Value::as_str).unwrap_or("message");
        match ty {
            "message" => {
                let role = o
                    .get("role")
                    .and_then(Value::as_str)
                    .ok_or_else(|| ApiError::missing(&format!("{p}.role")))?;
                let content = message_text(o.get("content"), &format!("{p}.content"))?;
                let mut m = json!({"role": role, "content": content});
                if role == "assistant"
                    && let Some(r) = reasoning.take()
                {
                    m["reasoning_content"] = Value::String(r);
                }
                messages.push(m);
            }
            "function_call" => {
                let s = |k: &str| match o.get(k) {
                    Some(Value::String(v)) => Ok(v.clone()),
                    _ => Err(ApiError::missing(&format!("{p}.{k}"))),
                };
                let call = json!({"id": s("call_id")?, "type": "function",
                    "function": {"name": s("name")?, "arguments": s("arguments")?}});
                match messages.last_mut() {
                    Some(m) if m["role"] == "assistant" => match m.get_mut("tool_calls") {
                        Some(Value::Array(calls)) => calls.push(call),
                        _ => m["tool_calls"] = json!([call]),
                    },
                    _ => {
                        let mut m =
                            json!({"role": "assistant", "content": null, "tool_calls": [call]});
                        if let Some(r) = reasoning.take() {
                            m["reasoning_content"] = Value::String(r);
                        }
                        messages.push(m);
                    }
                }
            }
            "function_call_output" => {
                let id = match o.get("call_id") {
                    Some(Value::String(v)) => v.clone(),
                    _ => return Err(ApiError::missing(&format!("{p}.call_id"))),
                };
                let output = message_text(o.get("output"), &format!("{p}.output"))?;
                messages.push(json!({"role": "tool", "tool_call_id": id, "content": output}));
            }
            "reasoning" => {
                let text: Vec<&str> = o
                    .get("content")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                    .chain(
                        o.get("summary")
                            .and_then(Value::as_array)
                            .into_iter()
                            .flatten(),
                    )
                    .filter_map(|c| c.get("text").and_then(Value::as_str))
                    .collect();
                if !text.is_empty() {
                    reasoning = Some(text.join("\n\n"));
                }
            }
            "item_reference" => {
                return Err(ApiError::unsupported(
                    &format!("{p}.type"),
                    "'item_reference' inputs are not supported: this server does not store items",
                ));
            }
            other => {
                return Err(ApiError::invalid_value(
                    &format!("{p}.type"),
                    format!(
                        "input item type '{other}' is not supported; expected message, \
                         function_call, function_call_output or reasoning"
                    ),
                ));
            }
        }
    }
    Ok(())
}

/// A message's or a tool output's content: a string, or text parts joined
/// (as chat message content parts are).
fn message_text(v: Option<&Value>, p: &str) -> Result<String, ApiError> {
    match v {
        None | Some(Value::Null) => Err(ApiError::missing(p)),
        Some(Value::String(s)) => Ok(s.clone()),
        Some(Value::Array(parts)) => crate::chat::parts_text(p, parts),
        Some(_) => Err(ApiError::invalid_type(
            p,
            "a string or an array of content parts",
        )),
    }
}

/// Parses a Responses body through the chat parser; errors name the
/// Responses fields.
pub fn parse(body: &Map<String, Value>, info: &ModelInfo) -> Result<ChatRequest, ApiError> {
    let chat = to_chat_body(body)?;
    params::parse_chat(&chat, info).map_err(|mut e| {
        if let Some(p) = &e.param {
            let renamed = p
                .replace("max_completion_tokens", "max_output_tokens")
                .replace("reasoning_effort", "reasoning.effort");
            e.message = e
                .message
                .replace("max_completion_tokens", "max_output_tokens")
                .replace("reasoning_effort", "reasoning.effort");
            e.param = Some(renamed);
        }
        e
    })
}
