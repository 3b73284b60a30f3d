//! Routing and the endpoints, over the [`Host`] and [`Output`] traits.

use std::collections::HashMap;

use serde_json::{Map, Value, json};

use crate::chat::{Message, RenderOptions};
use crate::choices::{self, Job, Meta};
use crate::host::Host;
use crate::params::{self, ChatRequest, Common, CompletionRequest, Prompt, TokenizeRequest, Tools};
use crate::structured;
use crate::template;
use crate::tokens;
use crate::toolcall::{self, Out, ToolParser};
use qwasi_guest_sdk::chat::{THINK_END, ThinkSplitter};
use qwasi_guest_sdk::http::{self, Output};
use qwasi_guest_sdk::inference::{
    Event, FinishReason, GenerateRequest, Generation, ModelInfo, StopMatcher, TokenEvent, Usage,
    early_usage,
};
use qwasi_guest_sdk::{ApiError, Request};

/// Largest request body the guest reads.
pub const MAX_BODY_BYTES: usize = 32 << 20;

/// What the guest serves; `finish_reason` for a cancelled generation.
pub const CANCELLED_FINISH_REASON: &str = "abort";

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

/// The number of tokens to generate: the requested `max_tokens` checked
/// against the context and the operator caps, or the default.
pub fn token_budget(
    info: &ModelInfo,
    prompt_len: u32,
    requested: Option<u32>,
    default: Option<u32>,
    max_param: &str,
    prompt_param: &str,
) -> Result<u32, ApiError> {
    let ctx = info.context_length;
    if info.max_prompt_tokens > 0 && prompt_len > info.max_prompt_tokens {
        return Err(ApiError::context_length(
            format!(
                "The prompt has {prompt_len} tokens, but this server accepts at most {} prompt tokens.",
                info.max_prompt_tokens
            ),
            prompt_param,
        ));
    }
    if prompt_len >= ctx {
        return Err(ApiError::context_length(
            format!(
                "This model's maximum context length is {ctx} tokens. However, your prompt has {prompt_len} tokens, \
                 which leaves no room for the completion. Please reduce the length of the {prompt_param}."
            ),
            prompt_param,
        ));
    }
    let room = ctx - prompt_len;
    let cap = info.max_completion_tokens;
    match requested {
        Some(m) => {
            if cap > 0 && m > cap {
                return Err(ApiError::invalid_value(
                    max_param,
                    format!(
                        "'{max_param}' is {m}, but this server allows at most {cap} completion tokens"
                    ),
                ));
            }
            if m > room {
                return Err(ApiError::context_length(
                    format!(
                        "This model's maximum context length is {ctx} tokens. However, you requested {} tokens \
                         ({prompt_len} in the {prompt_param}, {m} in the completion). Please reduce the length of the {prompt_param} or completion.",
                        prompt_len as u64 + m as u64
                    ),
                    prompt_param,
                ));
            }
            Ok(m)
        }
        None => {
            let m = default.unwrap_or(room).min(room);
            Ok(if cap > 0 { m.min(cap) } else { m })
        }
    }
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

// ---------------------------------------------------------------------------
// The generation driver: engine events -> text pieces, shared by both endpoints
// and both response modes.

/// One generated token's logprob, ready for either format.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenLp {
    pub token: String,
    pub bytes: Vec<u8>,
    pub logprob: f32,
    pub top: Vec<(String, Vec<u8>, f32)>,
    /// Char offset of the token in the choice's text.
    pub offset: usize,
}

/// Text that became safe to emit after one event.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Piece {
    pub reasoning: String,
    pub content: String,
    pub logprob: Option<TokenLp>,
    /// `delta.tool_calls` entries.
    pub tool_calls: Vec<Value>,
}

impl Piece {
    pub fn is_empty(&self) -> bool {
        self.reasoning.is_empty()
            && self.content.is_empty()
            && self.logprob.is_none()
            && self.tool_calls.is_empty()
    }
}

#[derive(Debug, Clone, PartialEq)]
pub enum Ended {
    Finished { reason: &'static str, usage: Usage },
    Failed(String),
}

/// Tool-call parsing of one generation. What the calls may be is enforced
/// while decoding (an engine constraint) where the request asks for it;
/// whatever the model wrote is reported, never refused.
struct ToolState {
    parser: ToolParser,
    names: Vec<String>,
}

pub struct Driver<'h, H: Host> {
    host: &'h H,
    stop: StopMatcher,
    think: Option<ThinkSplitter>,
    think_end_id: Option<u32>,
    want_logprobs: bool,
    prompt_tokens: u32,
    tokens: u32,
    /// Sum of the generated tokens' logprobs (when the engine reports them).
    logprob_sum: f64,
    /// Chars of generated text so far, plus the echoed prompt.
    offset: usize,
    spellings: HashMap<u32, (String, Vec<u8>)>,
    tools: Option<ToolState>,
    /// Special tokens spelled out when tools are parsed (`<tool_call>`, `</tool_call>`).
    markup_ids: Vec<(u32, &'static str)>,
    /// A stop string ended the output: `ended`'s usage still lacks the
    /// engine's counts ([`Driver::engine_usage`]).
    cut_short: bool,
    pub ended: Option<Ended>,
}

impl<'h, H: Host> Driver<'h, H> {
    pub fn new(
        host: &'h H,
        stops: Vec<String>,
        thinking: bool,
        want_logprobs: bool,
        prompt_tokens: u32,
        offset: usize,
    ) -> Self {
        let think_end_id = if thinking {
            host.token_to_id(THINK_END)
        } else {
            None
        };
        Driver {
            host,
            stop: StopMatcher::new(stops),
            think: thinking.then(ThinkSplitter::new),
            think_end_id,
            want_logprobs,
            prompt_tokens,
            tokens: 0,
            logprob_sum: 0.0,
            offset,
            spellings: HashMap::new(),
            tools: None,
            markup_ids: Vec::new(),
            cut_short: false,
            ended: None,
        }
    }

    /// After a stop string ended the output, which pre-empts the engine's
    /// `finished` event: takes the prompt and cached-token counts from
    /// `generation.usage()` (ask before dropping it). The completion count
    /// stays the tokens the output used.
    pub fn engine_usage<G: Generation>(&mut self, generation: Option<&G>) {
        if !std::mem::take(&mut self.cut_short) {
            return;
        }
        if let Some(Ended::Finished { usage, .. }) = &mut self.ended {
            *usage = early_usage(generation, self.prompt_tokens, self.tokens);
        }
    }

    /// Parses the content for tool calls (when the request has tools and
    /// `tool_choice` is not `none`).
    pub fn with_tools(mut self, tools: &Tools) -> Self {
        if tools.parse_calls() {
            self.markup_ids = [toolcall::CALL_OPEN, toolcall::CALL_CLOSE]
                .into_iter()
                .filter_map(|t| Some((self.host.token_to_id(t)?, t)))
                .collect();
            self.tools = Some(ToolState {
                parser: ToolParser::new(toolcall::schemas(&tools.tools)),
                names: Vec::new(),
            });
        }
        self
    }

    /// Passes content through the tool-call parser.
    fn content(&mut self, text: &str, piece: &mut Piece, fin: bool) {
        let Some(ts) = &mut self.tools else {
            piece.content.push_str(text);
            return;
        };
        let mut outs = ts.parser.push(text);
        if fin {
            outs.extend(ts.parser.finish());
        }
        for o in outs {
            match o {
                Out::Text(t) => piece.content.push_str(&t),
                Out::Start { index, name } => {
                    let id = format!("call_{}", self.host.random_hex(12));
                    piece.tool_calls.push(json!({"index": index, "id": id, "type": "function", "function": {"name": name, "arguments": ""}}));
                    ts.names.push(name);
                }
                Out::Args { index, fragment } => piece
                    .tool_calls
                    .push(json!({"index": index, "function": {"arguments": fragment}})),
                Out::End { .. } => {}
            }
        }
    }

    fn made_calls(&self) -> bool {
        self.tools.as_ref().is_some_and(|t| !t.names.is_empty())
    }

    /// The mean logprob of the generated tokens (0 before any).
    pub fn mean_logprob(&self) -> f64 {
        self.logprob_sum / self.tokens.max(1) as f64
    }

    /// Whether output is in the reasoning part (thinking on, `</think>` not seen yet).
    pub fn in_reasoning(&self) -> bool {
        self.think.as_ref().is_some_and(|t| !t.in_answer())
    }

    fn spelling(&mut self, id: u32) -> (String, Vec<u8>) {
        if let Some(s) = self.spellings.get(&id) {
            return s.clone();
        }
        let bytes = match self.host.id_to_token(id) {
            Some(sp) => tokens::spelling_to_bytes(&sp),
            None => self
                .host
                .detokenize(&[id], false)
                .unwrap_or_default()
                .into_bytes(),
        };
        let s = (String::from_utf8_lossy(&bytes).into_owned(), bytes);
        self.spellings.insert(id, s.clone());
        s
    }

    fn push_text(&mut self, text: &str, piece: &mut Piece) -> bool {
        let text = self.stop.push(text);
        self.split(&text, piece);
        self.stop.stopped().is_some()
    }

    fn split(&mut self, text: &str, piece: &mut Piece) {
        match &mut self.think {
            Some(t) => {
                let (reasoning, content) = t.push(text);
                piece.reasoning.push_str(&reasoning);
                self.content(&content, piece, false);
            }
            None => self.content(text, piece, false),
        }
    }

    /// Handles one event; returns what to emit. Sets `ended` at the end.
    pub fn on_event(&mut self, ev: Event) -> Piece {
        let mut piece = Piece::default();
        if self.ended.is_some() {
            return piece;
        }
        match ev {
            Event::Token(TokenEvent { id, text, logprob }) => {
                self.tokens += 1;
                self.logprob_sum += logprob.as_ref().map_or(0.0, |l| l.logprob as f64);
                let text =
                    if text.is_empty() && self.think_end_id == Some(id) && self.in_reasoning() {
                        THINK_END.to_string()
                    } else if text.is_empty()
                        && let Some(&(_, tag)) = self.markup_ids.iter().find(|(i, _)| *i == id)
                    {
                        // The engine leaves special tokens' text out; the
                        // tool-call tags are markup the parser needs.
                        tag.to_string()
                    } else {
                        text
                    };
                if self.want_logprobs
                    && let Some(lp) = logprob
                {
                    let (token, bytes) = self.spelling(lp.token);
                    let top = lp
                        .top
                        .iter()
                        .map(|&(t, l)| {
                            let (s, b) = self.spelling(t);
                            (s, b, l)
                        })
                        .collect();
                    piece.logprob = Some(TokenLp {
                        token,
                        bytes,
                        logprob: lp.logprob,
                        top,
                        offset: self.offset,
                    });
                }
                self.offset += text.chars().count();
                if self.push_text(&text, &mut piece) {
                    self.cut_short = true;
                    self.ended = Some(Ended::Finished {
                        reason: "stop",
                        // The engine's usage comes with `finished`, which a stop
                        // string pre-empts: completed by `engine_usage`.
                        usage: Usage {
                            prompt_tokens: self.prompt_tokens,
                            completion_tokens: self.tokens,
                            cached_tokens: 0,
                        },
                    });
                }
            }
            Event::Finished(f) => {
                let stopped = self.push_text(&f.trailing_text, &mut piece);
                if !stopped {
                    let rest = self.stop.finish();
                    self.split(&rest, &mut piece);
                    if let Some(t) = &mut self.think {
                        piece.reasoning.push_str(&t.finish());
                    }
                }
                let reason = match f.reason {
                    _ if stopped => "stop",
                    FinishReason::Stop => "stop",
                    FinishReason::Length => "length",
                    FinishReason::Cancelled => CANCELLED_FINISH_REASON,
                };
                self.ended = Some(Ended::Finished {
                    reason,
                    usage: f.usage,
                });
            }
            Event::Failed(m) => self.ended = Some(Ended::Failed(m)),
        }
        if let Some(Ended::Finished { reason, .. }) = &mut self.ended {
            let stop = *reason == "stop";
            self.content("", &mut piece, true);
            if stop
                && self.made_calls()
                && let Some(Ended::Finished { reason, .. }) = &mut self.ended
            {
                *reason = "tool_calls";
            }
        }
        piece
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
            deltas.push(json!({"tool_calls": [c]}));
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

/// Whole tool calls from their stream deltas.
fn merge_tool_calls(deltas: &[Value]) -> Vec<Value> {
    let mut calls: Vec<Value> = Vec::new();
    for d in deltas {
        if d.get("id").is_some() {
            let mut c = d.clone();
            if let Some(o) = c.as_object_mut() {
                o.remove("index");
            }
            calls.push(c);
        } else if let (Some(last), Some(frag)) = (
            calls.last_mut(),
            d.pointer("/function/arguments").and_then(Value::as_str),
        ) && let Some(Value::String(a)) = last.pointer_mut("/function/arguments")
        {
            a.push_str(frag);
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
    let text = render_prompt(info, &r.messages, &r.tools, r.render)?;
    let (prompt_ids, points) = qwasi_guest_sdk::chat::tokenize_chat(host, &text)?;
    let prompt_len = prompt_ids.len() as u32;
    let max_tokens = token_budget(
        info,
        prompt_len,
        r.common.max_tokens,
        None,
        "max_tokens",
        "messages",
    )?;
    let thinking = r.render.enable_thinking;
    let fmt = ChatFormat {
        thinking,
        logprobs: r.logprobs,
    };
    let m = meta(host, "chatcmpl-", &r.common.model);
    let points: Vec<u32> = points
        .into_iter()
        .filter(|&p| p > 0 && p < prompt_len)
        .collect();
    let mut req = generate_request(&r.common, prompt_ids, max_tokens, points);
    // With thinking on, the model reasons freely and the constraint holds
    // from `</think>` on.
    if let Some(c) = &mut req.constraint {
        c.start_after = thinking.then(|| host.token_to_id(THINK_END)).flatten();
    }
    let jobs = (0..r.common.best_of)
        .map(|k| Job {
            prompt: 0,
            req: choices::candidate(&r.common, req.clone(), k),
            driver: Driver::new(
                host,
                r.common.stop.clone(),
                thinking,
                r.logprobs,
                prompt_len,
                0,
            )
            .with_tools(&r.tools),
        })
        .collect();
    choices::respond(host, jobs, &[fmt], &m, &r.common, sink)
}
