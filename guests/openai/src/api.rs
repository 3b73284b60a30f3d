//! Routing and the endpoints, over the [`Host`] and [`Output`] traits.

use serde_json::{Map, Value, json};

use crate::chat::{Message, RenderOptions};
use crate::choices::{self, Job, Meta};
use crate::host::Host;
use crate::params::{self, ChatRequest, Common, CompletionRequest, Prompt, TokenizeRequest, Tools};
use crate::responses;
use crate::structured;
use crate::template;
use crate::tokens;
use qwasi_guest_sdk::driver::{Driver, Piece, TokenLp, ToolEvent, token_budget};
use qwasi_guest_sdk::http::{self, Output};
use qwasi_guest_sdk::inference::{GenerateRequest, ModelInfo, Usage};
use qwasi_guest_sdk::{ApiError, Request};

/// Largest request body the guest reads.
pub const MAX_BODY_BYTES: usize = 32 << 20;

/// Serves one request.
pub fn handle<H: Host, S: Output>(host: &H, mut req: Request, sink: &mut S) {
    if let Err(e) = route(host, &mut req, sink) {
        send_error(sink, &e);
    }
}

pub fn send_error<S: Output>(sink: &mut S, e: &ApiError) {
    let _ = http::send_error(sink, e);
}

pub fn send_json<S: Output>(sink: &mut S, status: u16, v: &Value) {
    let _ = http::send_json(sink, status, v);
}

fn route<H: Host, S: Output>(host: &H, req: &mut Request, sink: &mut S) -> Result<(), ApiError> {
    let path = req.path().to_owned();
    let path = path.as_str();
    let method = req.method_as_sent().to_owned();
    let method = method.as_str();
    let allow = |m: &str| {
        if method == m {
            Ok(())
        } else {
            Err(ApiError::method_not_allowed(method, path, m))
        }
    };
    // Read (and size-check) the body before routing.
    let body = req.body(MAX_BODY_BYTES)?;
    match path {
        "/v1/models" => {
            allow("GET")?;
            let info = host.model_info();
            let data: Vec<Value> = std::iter::once(&info.id)
                .chain(&info.aliases)
                .map(|name| model_json(&info, name))
                .collect();
            send_json(sink, 200, &json!({"object": "list", "data": data}));
        }
        p if p.starts_with("/v1/models/") => {
            allow("GET")?;
            let id = http::percent_decode_path(&p["/v1/models/".len()..]);
            let info = host.model_info();
            if !info.serves(&id) {
                return Err(ApiError::model_not_found(&id));
            }
            send_json(sink, 200, &model_json(&info, &id));
        }
        "/v1/completions" => {
            allow("POST")?;
            let body = params::parse_body(body)?;
            let info = host.model_info();
            let r = params::parse_completion(&body, &info)?;
            completions(host, &info, r, sink)?;
        }
        "/v1/chat/completions" => {
            allow("POST")?;
            let body = params::parse_body(body)?;
            let info = host.model_info();
            let r = params::parse_chat(&body, &info)?;
            chat_completions(host, &info, r, sink)?;
        }
        "/v1/responses" => {
            allow("POST")?;
            let body = params::parse_body(body)?;
            let info = host.model_info();
            responses(host, &info, &body, sink)?;
        }
        p if p.starts_with("/v1/responses/") => {
            return Err(ApiError::new(
                404,
                qwasi_guest_sdk::error::INVALID_REQUEST,
                Some("not_found"),
                format!(
                    "{method} {p}: this server does not store responses (each POST /v1/responses is answered in full and forgotten)"
                ),
            ));
        }
        "/tokenize" => {
            allow("POST")?;
            let body = params::parse_body(body)?;
            let info = host.model_info();
            let tokens = match params::parse_tokenize(&body, &info)? {
                TokenizeRequest::Prompt(p) => encode(host, &p, "prompt")?,
                TokenizeRequest::Messages(m, opts, tools) => {
                    let text = render_prompt(&info, &m, &tools, opts)?;
                    encode(host, &text, "messages")?
                }
            };
            let count = tokens.len();
            send_json(
                sink,
                200,
                &json!({"tokens": tokens, "count": count, "max_model_len": info.context_length}),
            );
        }
        "/detokenize" => {
            allow("POST")?;
            let body = params::parse_body(body)?;
            let info = host.model_info();
            let ids = params::parse_detokenize(&body, &info)?;
            let text = host
                .detokenize(&ids, false)
                .map_err(|e| ApiError::invalid_value("tokens", e))?;
            send_json(sink, 200, &json!({"prompt": text}));
        }
        _ => return Err(ApiError::not_found(method, path)),
    }
    Ok(())
}

/// A model entry; `name` is the id or an alias (`root` is the id).
fn model_json(info: &ModelInfo, name: &str) -> Value {
    json!({
        "id": name,
        "object": "model",
        "created": info.created,
        "owned_by": "qwasi",
        "root": info.id,
        "parent": null,
        "max_model_len": info.context_length,
    })
}

fn encode<H: Host>(host: &H, text: &str, param: &str) -> Result<Vec<u32>, ApiError> {
    host.tokenize(text)
        .map_err(|e| ApiError::invalid_value(param, format!("could not tokenize '{param}': {e}")))
}

fn generate_request(
    common: &Common,
    prompt: Vec<u32>,
    max_tokens: u32,
    snapshot_points: Vec<u32>,
) -> GenerateRequest {
    GenerateRequest {
        prompt,
        max_tokens,
        stop_token_ids: common.stop_token_ids.clone(),
        ignore_eos: common.ignore_eos,
        sampling: common.sampling.clone(),
        cache_salt: common.cache_salt.clone(),
        snapshot_points,
        constraint: common
            .constraint
            .as_ref()
            .map(|c| structured::constraint(c, None)),
    }
}

pub fn usage_json(u: &Usage) -> Value {
    json!({
        "prompt_tokens": u.prompt_tokens,
        "completion_tokens": u.completion_tokens,
        "total_tokens": u.prompt_tokens + u.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": u.cached_tokens},
    })
}

fn completion_logprobs(lps: &[TokenLp]) -> Value {
    let top: Vec<Value> = lps
        .iter()
        .map(|l| {
            Value::Object(
                l.top
                    .iter()
                    .map(|(s, _, p)| (s.clone(), tokens::logprob_json(*p)))
                    .collect::<Map<_, _>>(),
            )
        })
        .collect();
    json!({
        "tokens": lps.iter().map(|l| l.token.clone()).collect::<Vec<_>>(),
        "token_logprobs": lps.iter().map(|l| tokens::logprob_json(l.logprob)).collect::<Vec<_>>(),
        "top_logprobs": top,
        "text_offset": lps.iter().map(|l| l.offset).collect::<Vec<_>>(),
    })
}

fn chat_logprobs(lps: &[TokenLp]) -> Value {
    let content: Vec<Value> = lps
        .iter()
        .map(|l| {
            json!({
                "token": l.token,
                "logprob": tokens::logprob_json(l.logprob),
                "bytes": l.bytes,
                "top_logprobs": l.top.iter().map(|(s, b, p)| json!({"token": s, "logprob": tokens::logprob_json(*p), "bytes": b})).collect::<Vec<_>>(),
            })
        })
        .collect();
    json!({"content": content, "refusal": null})
}

// ---------------------------------------------------------------------------
// Endpoints.

/// The format-specific half of a generation response (choices are built
/// with index 0; [`crate::choices`] sets each one's index).
pub trait Format {
    const OBJECT: &'static str;
    const CHUNK_OBJECT: &'static str;
    /// Stream chunks for a piece (`in_reasoning` tells an empty piece's channel).
    fn chunks(&self, piece: &Piece, in_reasoning: bool) -> Vec<Value>;
    fn first_chunk(&self) -> Option<Value>;
    fn final_choice(&self, reason: &str) -> Value;
    fn full_choice(&self, text: &Piece, lps: &[TokenLp], reason: &str) -> Value;
}

struct CompletionFormat {
    echo: Option<String>,
    logprobs: bool,
}

impl Format for CompletionFormat {
    const OBJECT: &'static str = "text_completion";
    const CHUNK_OBJECT: &'static str = "text_completion";

    fn chunks(&self, piece: &Piece, _in_reasoning: bool) -> Vec<Value> {
        let text = format!("{}{}", piece.reasoning, piece.content);
        if text.is_empty() && piece.logprob.is_none() {
            return vec![];
        }
        let lp = match (&piece.logprob, self.logprobs) {
            (Some(l), true) => completion_logprobs(std::slice::from_ref(l)),
            _ => Value::Null,
        };
        vec![json!({"index": 0, "text": text, "logprobs": lp, "finish_reason": null})]
    }

    fn first_chunk(&self) -> Option<Value> {
        let echo = self.echo.as_ref().filter(|e| !e.is_empty())?;
        Some(json!({"index": 0, "text": echo, "logprobs": null, "finish_reason": null}))
    }

    fn final_choice(&self, reason: &str) -> Value {
        json!({"index": 0, "text": "", "logprobs": null, "finish_reason": reason})
    }

    fn full_choice(&self, out: &Piece, lps: &[TokenLp], reason: &str) -> Value {
        let mut text = self.echo.clone().unwrap_or_default();
        text.push_str(&out.reasoning);
        text.push_str(&out.content);
        let lp = if self.logprobs {
            // Drop the logprobs of tokens cut off by a stop string.
            let len = text.chars().count();
            let kept: Vec<TokenLp> = lps.iter().filter(|l| l.offset < len).cloned().collect();
            completion_logprobs(&kept)
        } else {
            Value::Null
        };
        json!({"index": 0, "text": text, "logprobs": lp, "finish_reason": reason})
    }
}

struct ChatFormat {
    thinking: bool,
    logprobs: bool,
}

impl Format for ChatFormat {
    const OBJECT: &'static str = "chat.completion";
    const CHUNK_OBJECT: &'static str = "chat.completion.chunk";

    fn chunks(&self, piece: &Piece, in_reasoning: bool) -> Vec<Value> {
        let mut deltas = Vec::new();
        if !piece.reasoning.is_empty() {
            deltas.push(json!({"reasoning_content": piece.reasoning}));
        }
        if !piece.content.is_empty() {
            deltas.push(json!({"content": piece.content}));
        }
        for c in &piece.tool_calls {
            deltas.push(json!({"tool_calls": [tool_call_delta(c)]}));
        }
        if deltas.is_empty() {
            if piece.logprob.is_none() || !self.logprobs {
                return vec![];
            }
            deltas.push(if in_reasoning {
                json!({"reasoning_content": ""})
            } else {
                json!({"content": ""})
            });
        }
        deltas
            .into_iter()
            .enumerate()
            .map(|(i, d)| {
                let lp = match (&piece.logprob, self.logprobs, i) {
                    (Some(l), true, 0) => chat_logprobs(std::slice::from_ref(l)),
                    _ => Value::Null,
                };
                json!({"index": 0, "delta": d, "logprobs": lp, "finish_reason": null})
            })
            .collect()
    }

    fn first_chunk(&self) -> Option<Value> {
        Some(
            json!({"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": null, "finish_reason": null}),
        )
    }

    fn final_choice(&self, reason: &str) -> Value {
        json!({"index": 0, "delta": {}, "logprobs": null, "finish_reason": reason})
    }

    fn full_choice(&self, out: &Piece, lps: &[TokenLp], reason: &str) -> Value {
        let calls = merge_tool_calls(&out.tool_calls);
        let content = if out.content.is_empty() && !calls.is_empty() {
            Value::Null
        } else {
            Value::String(out.content.clone())
        };
        let mut message = json!({"role": "assistant", "content": content, "refusal": null});
        if !calls.is_empty() {
            message["tool_calls"] = Value::Array(calls);
        }
        if self.thinking {
            message["reasoning_content"] = if out.reasoning.is_empty() {
                Value::Null
            } else {
                Value::String(out.reasoning.clone())
            };
        }
        let lp = if self.logprobs {
            chat_logprobs(lps)
        } else {
            Value::Null
        };
        json!({"index": 0, "message": message, "logprobs": lp, "finish_reason": reason})
    }
}

/// A `delta.tool_calls` entry.
fn tool_call_delta(e: &ToolEvent) -> Value {
    match e {
        ToolEvent::Start { index, id, name } => {
            json!({"index": index, "id": id, "type": "function", "function": {"name": name, "arguments": ""}})
        }
        ToolEvent::Args { index, fragment } => {
            json!({"index": index, "function": {"arguments": fragment}})
        }
    }
}

/// Whole tool calls (`message.tool_calls`) from their events.
fn merge_tool_calls(events: &[ToolEvent]) -> Vec<Value> {
    let mut calls: Vec<Value> = Vec::new();
    for e in events {
        match e {
            ToolEvent::Start { id, name, .. } => calls.push(
                json!({"id": id, "type": "function", "function": {"name": name, "arguments": ""}}),
            ),
            ToolEvent::Args { index, fragment } => {
                if let Some(Value::String(a)) = calls
                    .get_mut(*index)
                    .and_then(|c| c.pointer_mut("/function/arguments"))
                {
                    a.push_str(fragment);
                }
            }
        }
    }
    calls
}

fn meta<H: Host>(host: &H, prefix: &str, model: &str) -> Meta {
    Meta {
        id: format!("{prefix}{}", host.random_hex(16)),
        created: host.now_unix(),
        model: model.to_owned(),
    }
}

fn completions<H: Host, S: Output>(
    host: &H,
    info: &ModelInfo,
    r: CompletionRequest,
    sink: &mut S,
) -> Result<(), ApiError> {
    let mut formats = Vec::with_capacity(r.prompts.len());
    let mut jobs = Vec::new();
    for (p, prompt) in r.prompts.iter().enumerate() {
        let (prompt_ids, prompt_text) = match prompt {
            Prompt::Text(t) => (encode(host, t, "prompt")?, Some(t.clone())),
            Prompt::Tokens(ids) => (ids.clone(), None),
        };
        if prompt_ids.is_empty() {
            return Err(ApiError::invalid_value(
                "prompt",
                "'prompt' must not be empty",
            ));
        }
        let echo = if r.echo {
            Some(match prompt_text {
                Some(t) => t,
                None => host
                    .detokenize(&prompt_ids, false)
                    .map_err(|e| ApiError::invalid_value("prompt", e))?,
            })
        } else {
            None
        };
        let prompt_len = prompt_ids.len() as u32;
        let max_tokens = token_budget(
            info,
            prompt_len,
            r.common.max_tokens,
            Some(params::DEFAULT_COMPLETION_MAX_TOKENS),
            "max_tokens",
            "prompt",
        )?;
        let offset = echo.as_ref().map_or(0, |e| e.chars().count());
        let req = generate_request(&r.common, prompt_ids, max_tokens, vec![]);
        for k in 0..r.common.best_of {
            jobs.push(Job {
                prompt: p,
                req: choices::candidate(&r.common, req.clone(), k),
                driver: Driver::new(
                    host,
                    r.common.stop.clone(),
                    false,
                    r.logprobs.is_some(),
                    prompt_len,
                    offset,
                ),
            });
        }
        formats.push(CompletionFormat {
            echo,
            logprobs: r.logprobs.is_some(),
        });
    }
    let m = meta(host, "cmpl-", &r.common.model);
    choices::respond(host, jobs, &formats, &m, &r.common, sink)
}

/// Renders a chat request's prompt (the model's template or the built-in).
pub fn render_prompt(
    info: &ModelInfo,
    messages: &[Message],
    tools: &Tools,
    opts: RenderOptions,
) -> Result<String, ApiError> {
    template::render(
        info.chat_template.as_deref(),
        messages,
        &tools.rendered(),
        opts,
        &tools.kwargs,
    )
}

fn chat_completions<H: Host, S: Output>(
    host: &H,
    info: &ModelInfo,
    r: ChatRequest,
    sink: &mut S,
) -> Result<(), ApiError> {
    let fmt = ChatFormat {
        thinking: r.render.enable_thinking,
        logprobs: r.logprobs,
    };
    let m = meta(host, "chatcmpl-", &r.common.model);
    let req = prepare_chat(host, info, &r, ("max_tokens", "messages"))?;
    let jobs = (0..r.common.best_of)
        .map(|k| Job {
            prompt: 0,
            req: choices::candidate(&r.common, req.clone(), k),
            driver: chat_driver(host, &r, req.prompt.len() as u32),
        })
        .collect();
    choices::respond(host, jobs, &[fmt], &m, &r.common, sink)
}

/// A chat request's generation request: the prompt rendered and tokenized,
/// message boundaries as snapshot points, the token budget checked.
/// `params` name the token limit and the prompt in errors.
fn prepare_chat<H: Host>(
    host: &H,
    info: &ModelInfo,
    r: &ChatRequest,
    (max_param, prompt_param): (&str, &str),
) -> Result<GenerateRequest, ApiError> {
    let text = render_prompt(info, &r.messages, &r.tools, r.render)?;
    let (prompt_ids, points) = qwasi_guest_sdk::chat::tokenize_chat(host, &text)?;
    let prompt_len = prompt_ids.len() as u32;
    let max_tokens = token_budget(
        info,
        prompt_len,
        r.common.max_tokens,
        None,
        max_param,
        prompt_param,
    )?;
    let points: Vec<u32> = points
        .into_iter()
        .filter(|&p| p > 0 && p < prompt_len)
        .collect();
    let mut req = generate_request(&r.common, prompt_ids, max_tokens, points);
    // With thinking on, the model reasons freely and the constraint holds
    // from `</think>` on.
    if let Some(c) = &mut req.constraint {
        c.start_after = r
            .render
            .enable_thinking
            .then(|| host.token_to_id(qwasi_guest_sdk::chat::THINK_END))
            .flatten();
    }
    Ok(req)
}

/// The driver of one generation for a chat request (thinking, logprobs,
/// stop strings and tool rules as asked).
fn chat_driver<'h, H: Host>(host: &'h H, r: &ChatRequest, prompt_len: u32) -> Driver<'h, H> {
    Driver::new(
        host,
        r.common.stop.clone(),
        r.render.enable_thinking,
        r.logprobs,
        prompt_len,
        0,
    )
    .with_tools(&r.tools)
    // The engine enforces tool_choice while decoding (a constraint); what
    // the model wrote is reported, never refused.
    .report_only()
}

/// `POST /v1/responses` (stateless: see [`responses`]).
fn responses<H: Host, S: Output>(
    host: &H,
    info: &ModelInfo,
    body: &Map<String, Value>,
    sink: &mut S,
) -> Result<(), ApiError> {
    let r = responses::parse(body, info)?;
    let req = prepare_chat(host, info, &r, ("max_output_tokens", "input"))?;
    let driver = chat_driver(host, &r, req.prompt.len() as u32);
    let generation = host.generate(req).map_err(ApiError::from)?;
    let resp = responses::Response::new(host, body, &r.common.model);
    responses::run(Some(generation), driver, resp, r.common.stream, sink)
}
