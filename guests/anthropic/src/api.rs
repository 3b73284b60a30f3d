//! Routing, the two endpoints and Anthropic-shaped errors, over the SDK's
//! [`Host`] and [`Output`] traits.

use serde_json::{Value, json};

use qwasi_guest_sdk::driver::{Driver, Ended, token_budget};
use qwasi_guest_sdk::fields::parse_body;
use qwasi_guest_sdk::host::Host;
use qwasi_guest_sdk::http::{self, Output};
use qwasi_guest_sdk::inference::{GenerateRequest, Generation, ModelInfo, Usage};
use qwasi_guest_sdk::segments::Segments;
use qwasi_guest_sdk::stream::{Framing, StreamWriter};
use qwasi_guest_sdk::{ApiError, Request, chat, template};

use crate::blocks::{self, Content, Event};
use crate::request::{self, MessagesRequest};

/// Largest request body the guest reads (agents send long histories).
pub const MAX_BODY_BYTES: usize = 32 << 20;

/// Serves one request.
pub fn handle<H: Host, S: Output>(host: &H, mut req: Request, sink: &mut S) {
    if let Err(e) = route(host, &mut req, sink) {
        let _ = http::send_error_as(sink, &e, &error_json(&e));
    }
}

/// The error `type` for an HTTP status, as the Messages API names them.
pub fn error_type(status: u16) -> &'static str {
    match status {
        401 => "authentication_error",
        403 => "permission_error",
        404 => "not_found_error",
        413 => "request_too_large",
        429 => "rate_limit_error",
        503 | 529 => "overloaded_error",
        s if s >= 500 => "api_error",
        _ => "invalid_request_error",
    }
}

/// `{"type": "error", "error": {"type", "message"}}`.
pub fn error_json(e: &ApiError) -> Value {
    json!({"type": "error", "error": {"type": error_type(e.status), "message": e.message}})
}

fn route<H: Host, S: Output>(host: &H, req: &mut Request, sink: &mut S) -> Result<(), ApiError> {
    let path = req.path().to_owned();
    let method = req.method_as_sent().to_owned();
    let count_tokens = match path.as_str() {
        "/v1/messages" => false,
        "/v1/messages/count_tokens" => true,
        _ => return Err(ApiError::not_found(&method, &path)),
    };
    if method != "POST" {
        return Err(ApiError::method_not_allowed(&method, &path, "POST"));
    }
    // `anthropic-version` and `anthropic-beta` are accepted whatever they say:
    // the shapes served are the current API's.
    let body = parse_body(req.body(MAX_BODY_BYTES)?)?;
    let r = request::parse(&body, count_tokens)?;
    let info = host.model_info();
    let text = render(&info, &r)?;
    let (prompt, points) = chat::tokenize_chat(host, &text)?;
    if count_tokens {
        let _ = http::send_json(sink, 200, &json!({"input_tokens": prompt.len()}));
        return Ok(());
    }
    messages(host, &info, r, prompt, points, sink)
}

/// The prompt: the model's own chat template, or the SDK's built-in
/// Qwen3.6 renderer when it has none. The template gets the operator's
/// default kwargs (`--default-chat-template-kwargs`) under the request's
/// thinking switch, always passed: the Messages API's default is off, the
/// template's on.
fn render(info: &ModelInfo, r: &MessagesRequest) -> Result<String, ApiError> {
    let mut kwargs = info.default_chat_template_kwargs.clone();
    kwargs.insert(
        "enable_thinking".into(),
        Value::Bool(r.render.enable_thinking),
    );
    let mut opts = r.render;
    if let Some(Value::Bool(b)) = kwargs.get("preserve_thinking") {
        opts.preserve_thinking = *b;
    }
    template::render(
        info.chat_template.as_deref(),
        &r.messages,
        &r.tools.rendered(),
        opts,
        &kwargs,
    )
}

fn messages<H: Host, S: Output>(
    host: &H,
    info: &ModelInfo,
    r: MessagesRequest,
    prompt: Vec<u32>,
    points: Vec<u32>,
    sink: &mut S,
) -> Result<(), ApiError> {
    let prompt_len = prompt.len() as u32;
    // `max_tokens` is an upper bound (clients such as Claude Code send a
    // fixed large one): clamped to the room the context and the operator's
    // cap leave, not refused.
    let max_tokens = token_budget(
        info,
        prompt_len,
        None,
        r.max_tokens,
        "max_tokens",
        "messages",
    )?;
    let thinking = r.render.enable_thinking;
    let driver = Driver::new(
        host,
        r.stop_sequences.clone(),
        thinking,
        false,
        prompt_len,
        0,
    )
    .call_id_prefix("toolu_")
    .with_tools(&r.tools);
    let snapshot_points = points
        .into_iter()
        .filter(|&p| p > 0 && p < prompt_len)
        .collect();
    let req = GenerateRequest {
        prompt,
        max_tokens,
        stop_token_ids: Vec::new(),
        ignore_eos: r.ignore_eos,
        sampling: r.sampling.clone(),
        cache_salt: None,
        snapshot_points,
        constraint: None,
    };
    let mut generation = Some(host.generate(req).map_err(ApiError::from)?);
    let message = MessageStart {
        id: format!("msg_{}", host.random_hex(12)),
        model: r.model.clone(),
        prompt_tokens: prompt_len,
    };
    if r.stream {
        stream(&mut generation, driver, &message, sink);
        return Ok(());
    }
    let mut segments = Segments::new();
    let mut content = Content::default();
    let mut driver = driver;
    let mut segs = Vec::new();
    while driver.ended.is_none() {
        for p in driver.next_batch(&mut generation) {
            segments.piece(&p, &mut segs);
        }
        content.apply(&segs);
        segs.clear();
    }
    drop(generation); // cancels the engine request when a stop sequence ended it
    let (stop_reason, stop_sequence, usage) = finish(&mut driver)?;
    let mut v = message.json(0);
    v["content"] = Value::Array(content.finish());
    v["stop_reason"] = json!(stop_reason);
    v["stop_sequence"] = json!(stop_sequence);
    v["usage"] = usage_json(&usage);
    let _ = http::send_json(sink, 200, &v);
    Ok(())
}

/// What `message_start` says of the message.
struct MessageStart {
    id: String,
    model: String,
    prompt_tokens: u32,
}

impl MessageStart {
    /// The message object, empty (`message_start`'s, and the response's base).
    fn json(&self, cached: u32) -> Value {
        json!({
            "id": self.id,
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": [],
            "stop_reason": null,
            "stop_sequence": null,
            "usage": usage_json(&Usage {
                prompt_tokens: self.prompt_tokens,
                completion_tokens: 0,
                cached_tokens: cached,
            }),
        })
    }
}

/// `usage`: `input_tokens` are the prompt tokens not read from the prefix
/// cache, `cache_read_input_tokens` those that were (as the API counts them).
fn usage_json(u: &Usage) -> Value {
    let cached = u.cached_tokens.min(u.prompt_tokens);
    json!({
        "input_tokens": u.prompt_tokens - cached,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": cached,
        "output_tokens": u.completion_tokens,
    })
}

/// The finished generation's `stop_reason`, `stop_sequence` and usage, or
/// its error.
fn finish<H: Host>(
    driver: &mut Driver<H>,
) -> Result<(&'static str, Option<String>, Usage), ApiError> {
    let stop_sequence = driver.stop_sequence().map(str::to_owned);
    match driver.ended.take().expect("ended") {
        Ended::Failed(msg) => Err(ApiError::internal(format!("generation failed: {msg}"))),
        Ended::Rejected(e) => Err(e),
        Ended::Finished { reason, usage } => {
            let stop_reason = match reason {
                "tool_calls" => "tool_use",
                "length" => "max_tokens",
                _ if stop_sequence.is_some() => "stop_sequence",
                _ => "end_turn",
            };
            Ok((stop_reason, stop_sequence, usage))
        }
    }
}

fn push(w: &mut StreamWriter<impl Output>, events: &[Event]) {
    for (name, data) in events {
        // Buffered only (the threshold is never reached): cannot fail.
        let _ = w.sse(Some(name), &data.to_string());
    }
}

/// The SSE stream: `message_start`, `ping`, the content blocks, then
/// `message_delta` (stop reason, usage) and `message_stop`; or an `error`
/// event. One host write per batch of engine events.
fn stream<H: Host, G: Generation, S: Output>(
    generation: &mut Option<G>,
    mut driver: Driver<H>,
    message: &MessageStart,
    sink: &mut S,
) {
    let Ok(w) = StreamWriter::start(sink, 200, Framing::Sse, &[]) else {
        return;
    };
    let mut w = w.flush_threshold(usize::MAX);
    let mut segments = Segments::new();
    let mut kinds = Vec::new();
    let mut segs = Vec::new();
    let mut events = Vec::new();
    let mut started = false;
    loop {
        for p in driver.next_batch(generation) {
            segments.piece(&p, &mut segs);
        }
        if !started {
            // After the first events: the prefix-cache hit is known by then.
            started = true;
            let cached = generation
                .as_ref()
                .and_then(Generation::usage)
                .map_or(0, |u| u.cached_tokens);
            let start = json!({"type": "message_start", "message": message.json(cached)});
            events.push(("message_start", start));
            events.push(("ping", json!({"type": "ping"})));
        }
        let ended = driver.ended.is_some();
        if ended {
            segments.close(&mut segs);
        }
        events.extend(segs.drain(..).map(|s| blocks::event(&s, &mut kinds)));
        if ended {
            *generation = None; // cancel at once after a stop sequence, before the last write
            match finish(&mut driver) {
                Ok((stop_reason, stop_sequence, usage)) => {
                    events.push((
                        "message_delta",
                        json!({
                            "type": "message_delta",
                            "delta": {"stop_reason": stop_reason, "stop_sequence": stop_sequence},
                            "usage": usage_json(&usage),
                        }),
                    ));
                    events.push(("message_stop", json!({"type": "message_stop"})));
                }
                Err(e) => events.push(("error", error_json(&e))),
            }
            push(&mut w, &events);
            let _ = w.flush();
            return;
        }
        push(&mut w, &events);
        events.clear();
        if w.flush().is_err() {
            return; // client gone: dropping the generation cancels it
        }
    }
}
