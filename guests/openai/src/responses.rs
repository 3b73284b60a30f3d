//! `POST /v1/responses`: the Responses API, stateless.
//!
//! A request is translated into the chat request it means (`instructions`
//! and `input` items into `messages`, function tools into chat tools,
//! `max_output_tokens`, `reasoning` onto Qwen3.6's thinking switch) and
//! parsed by the chat parser, so both APIs validate and render alike. The
//! output comes from the SDK's segments: a `reasoning` item for thinking, a
//! `message` item for text and a `function_call` item per tool call, in the
//! order the model writes them, streamed as the typed event sequence.
//!
//! Nothing is stored (a guest instance lives for one request): the response
//! says `"store": false`, and `previous_response_id`, `conversation` and
//! `item_reference` inputs are refused with a 400 saying so; clients send
//! the whole conversation as `input` items instead.

use serde_json::{Map, Value, json};

use crate::host::Host;
use crate::params::{self, ChatRequest};
use qwasi_guest_sdk::ApiError;
use qwasi_guest_sdk::driver::{Driver, Ended};
use qwasi_guest_sdk::http::{self, Output};
use qwasi_guest_sdk::inference::{Generation, ModelInfo, Usage};
use qwasi_guest_sdk::segments::{Kind, Segment, Segments};
use qwasi_guest_sdk::stream::{Framing, StreamWriter};

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
    // Thinking is the model's default; `reasoning.effort: "none"` turns it off.
    if let Some(r) = body.get("reasoning").filter(|r| !r.is_null()) {
        let effort = r.get("effort").and_then(Value::as_str);
        chat.insert(
            "chat_template_kwargs".into(),
            json!({"enable_thinking": effort != Some("none")}),
        );
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

/// A message's or a tool output's content: a string, or text parts joined.
fn message_text(v: Option<&Value>, p: &str) -> Result<String, ApiError> {
    match v {
        None | Some(Value::Null) => Err(ApiError::missing(p)),
        Some(Value::String(s)) => Ok(s.clone()),
        Some(Value::Array(parts)) => {
            let mut texts = Vec::with_capacity(parts.len());
            for (j, part) in parts.iter().enumerate() {
                let pp = format!("{p}[{j}]");
                match part.get("type").and_then(Value::as_str) {
                    Some("input_text" | "output_text" | "text") => match part.get("text") {
                        Some(Value::String(t)) => texts.push(t.as_str()),
                        _ => return Err(ApiError::invalid_type(&format!("{pp}.text"), "a string")),
                    },
                    Some(t @ ("input_image" | "input_file" | "input_audio")) => {
                        return Err(ApiError::param(
                            &format!("{pp}.type"),
                            "unsupported_content",
                            format!(
                                "'{t}' content is not supported (this server serves a text-only model)"
                            ),
                        ));
                    }
                    Some(t) => {
                        return Err(ApiError::invalid_value(
                            &format!("{pp}.type"),
                            format!("content part type '{t}' is not supported"),
                        ));
                    }
                    None => return Err(ApiError::missing(&format!("{pp}.type"))),
                }
            }
            Ok(texts.join("\n"))
        }
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
            let renamed = p.replace("max_completion_tokens", "max_output_tokens");
            e.message = e
                .message
                .replace("max_completion_tokens", "max_output_tokens");
            e.param = Some(renamed);
        }
        e
    })
}

/// One output item as it grows.
struct Item {
    kind: Kind,
    id: String,
    text: String,
}

impl Item {
    fn json(&self, done: bool) -> Value {
        let status = if done { "completed" } else { "in_progress" };
        match &self.kind {
            Kind::Reasoning => {
                let content = if done {
                    json!([{"type": "reasoning_text", "text": self.text}])
                } else {
                    json!([])
                };
                json!({"type": "reasoning", "id": self.id, "summary": [], "content": content, "status": status})
            }
            Kind::Text => {
                let content = if done {
                    json!([text_part(&self.text)])
                } else {
                    json!([])
                };
                json!({"type": "message", "id": self.id, "status": status, "role": "assistant", "content": content})
            }
            Kind::ToolCall { id, name } => {
                let args = if done { self.text.as_str() } else { "" };
                json!({"type": "function_call", "id": self.id, "call_id": id, "name": name, "arguments": args, "status": status})
            }
        }
    }
}

fn text_part(text: &str) -> Value {
    json!({"type": "output_text", "text": text, "annotations": [], "logprobs": []})
}

/// The response being built: its fixed fields and the output items.
pub struct Response<'h, H: Host> {
    host: &'h H,
    id: String,
    created_at: u64,
    model: String,
    /// The request's echoable fields (`tools`, `tool_choice`, ...).
    echo: Map<String, Value>,
    items: Vec<Item>,
    /// Server-sent events so far (`sequence_number` order).
    seq: u64,
}

impl<'h, H: Host> Response<'h, H> {
    pub fn new(host: &'h H, body: &Map<String, Value>, model: &str) -> Self {
        let mut echo = Map::new();
        for (k, default) in [
            ("instructions", Value::Null),
            ("max_output_tokens", Value::Null),
            ("temperature", json!(1.0)),
            ("top_p", json!(1.0)),
            ("tools", json!([])),
            ("tool_choice", json!("auto")),
            ("parallel_tool_calls", json!(true)),
            ("metadata", json!({})),
        ] {
            echo.insert(
                k.into(),
                body.get(k)
                    .filter(|v| !v.is_null())
                    .cloned()
                    .unwrap_or(default),
            );
        }
        Response {
            host,
            id: format!("resp_{}", host.random_hex(16)),
            created_at: host.now_unix(),
            model: model.to_owned(),
            echo,
            items: Vec::new(),
            seq: 0,
        }
    }

    /// The response object.
    fn json(&self, status: &str, usage: Option<&Usage>, reasoning_tokens: u32) -> Value {
        let mut v = json!({
            "id": self.id,
            "object": "response",
            "created_at": self.created_at,
            "status": status,
            "model": self.model,
            "output": self.items.iter().map(|i| i.json(true)).collect::<Vec<_>>(),
            "error": null,
            "incomplete_details": if status == "incomplete" { json!({"reason": "max_output_tokens"}) } else { Value::Null },
            "previous_response_id": null,
            "store": false,
            "text": {"format": {"type": "text"}},
            "truncation": "disabled",
            "usage": usage.map(|u| usage_json(u, reasoning_tokens)),
        });
        for (k, x) in &self.echo {
            v[k] = x.clone();
        }
        v
    }

    /// The stream events (name, data) of segment events; items grow.
    fn events(&mut self, segs: &[Segment], out: &mut Vec<(&'static str, Value)>) {
        for s in segs {
            match s {
                Segment::Open { index, kind } => {
                    let prefix = match kind {
                        Kind::Reasoning => "rs_",
                        Kind::Text => "msg_",
                        Kind::ToolCall { .. } => "fc_",
                    };
                    let item = Item {
                        kind: kind.clone(),
                        id: format!("{prefix}{}", self.host.random_hex(16)),
                        text: String::new(),
                    };
                    out.push((
                        "response.output_item.added",
                        json!({"output_index": index, "item": item.json(false)}),
                    ));
                    if item.kind == Kind::Text {
                        out.push((
                            "response.content_part.added",
                            json!({"item_id": item.id, "output_index": index, "content_index": 0, "part": text_part("")}),
                        ));
                    }
                    self.items.push(item);
                }
                Segment::Delta { index, text } => {
                    let Some(item) = self.items.get_mut(*index) else {
                        continue;
                    };
                    item.text.push_str(text);
                    let (name, mut e) = match item.kind {
                        Kind::Reasoning => (
                            "response.reasoning_text.delta",
                            json!({"content_index": 0, "delta": text}),
                        ),
                        Kind::Text => (
                            "response.output_text.delta",
                            json!({"content_index": 0, "delta": text, "logprobs": []}),
                        ),
                        Kind::ToolCall { .. } => (
                            "response.function_call_arguments.delta",
                            json!({"delta": text}),
                        ),
                    };
                    e["item_id"] = json!(item.id);
                    e["output_index"] = json!(index);
                    out.push((name, e));
                }
                Segment::Close { index } => {
                    let Some(item) = self.items.get(*index) else {
                        continue;
                    };
                    let at = json!({"item_id": item.id, "output_index": index});
                    let with = |extra: Value| {
                        let mut e = at.clone();
                        for (k, v) in extra.as_object().expect("object") {
                            e[k] = v.clone();
                        }
                        e
                    };
                    match &item.kind {
                        Kind::Reasoning => out.push((
                            "response.reasoning_text.done",
                            with(json!({"content_index": 0, "text": item.text})),
                        )),
                        Kind::Text => {
                            out.push((
                                "response.output_text.done",
                                with(
                                    json!({"content_index": 0, "text": item.text, "logprobs": []}),
                                ),
                            ));
                            out.push((
                                "response.content_part.done",
                                with(json!({"content_index": 0, "part": text_part(&item.text)})),
                            ));
                        }
                        Kind::ToolCall { name, .. } => out.push((
                            "response.function_call_arguments.done",
                            with(json!({"name": name, "arguments": item.text})),
                        )),
                    }
                    out.push((
                        "response.output_item.done",
                        json!({"output_index": index, "item": item.json(true)}),
                    ));
                }
            }
        }
    }

    /// Writes events with their `type` and `sequence_number`.
    fn push<S: Output>(&mut self, w: &mut StreamWriter<S>, events: &[(&'static str, Value)]) {
        for (name, data) in events {
            let mut d = json!({"type": name, "sequence_number": self.seq});
            for (k, v) in data.as_object().expect("object") {
                d[k] = v.clone();
            }
            self.seq += 1;
            // Buffered only (the threshold is never reached): cannot fail.
            let _ = w.sse(Some(name), &d.to_string());
        }
    }
}

fn usage_json(u: &Usage, reasoning_tokens: u32) -> Value {
    json!({
        "input_tokens": u.prompt_tokens,
        "input_tokens_details": {"cached_tokens": u.cached_tokens},
        "output_tokens": u.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": reasoning_tokens.min(u.completion_tokens)},
        "total_tokens": u.prompt_tokens + u.completion_tokens,
    })
}

/// The response status of a finished generation (`incomplete` at the token limit).
fn status(reason: &str) -> &'static str {
    if reason == "length" {
        "incomplete"
    } else {
        "completed"
    }
}

/// Runs the generation and answers, JSON or streamed.
pub fn run<H: Host, G: Generation, S: Output>(
    mut generation: Option<G>,
    mut driver: Driver<H>,
    mut resp: Response<H>,
    stream: bool,
    sink: &mut S,
) -> Result<(), ApiError> {
    let mut segments = Segments::new();
    let mut segs = Vec::new();
    let mut events = Vec::new();
    let mut writer = None;
    if stream {
        let Ok(w) = StreamWriter::start(sink, 200, Framing::Sse, &[]) else {
            return Ok(());
        };
        let mut w = w.flush_threshold(usize::MAX);
        let created = resp.json("in_progress", None, 0);
        resp.push(
            &mut w,
            &[
                ("response.created", json!({"response": created})),
                ("response.in_progress", json!({"response": created})),
            ],
        );
        writer = Some(w);
    }
    loop {
        for p in driver.next_batch(&mut generation) {
            segments.piece(&p, &mut segs);
        }
        let ended = driver.ended.is_some();
        if ended {
            segments.close(&mut segs);
            generation = None; // cancel at once after a stop string
        }
        resp.events(&segs, &mut events);
        segs.clear();
        let last = if ended {
            Some(match driver.ended.take().expect("ended") {
                Ended::Finished { reason, usage } => {
                    let s = status(reason);
                    Ok((s, resp.json(s, Some(&usage), driver.reasoning_tokens())))
                }
                Ended::Rejected(e) => Err(e),
                Ended::Failed(m) => Err(ApiError::internal(format!("generation failed: {m}"))),
            })
        } else {
            None
        };
        let Some(w) = writer.as_mut() else {
            match last {
                None => {
                    events.clear();
                    continue;
                }
                Some(Ok((_, v))) => {
                    let _ = http::send_json(sink, 200, &v);
                    return Ok(());
                }
                Some(Err(e)) => return Err(e),
            }
        };
        match last {
            None => {}
            Some(Ok((s, v))) => {
                let name = if s == "incomplete" {
                    "response.incomplete"
                } else {
                    "response.completed"
                };
                events.push((name, json!({"response": v})));
            }
            Some(Err(e)) => {
                let mut v = resp.json("failed", None, 0);
                v["error"] = json!({"code": e.code.clone().unwrap_or_else(|| "server_error".into()), "message": e.message});
                events.push(("response.failed", json!({"response": v})));
            }
        }
        resp.push(w, &events);
        events.clear();
        if w.flush().is_err() || ended {
            return Ok(()); // client gone (dropping the generation cancels it), or done
        }
    }
}
