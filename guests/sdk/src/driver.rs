//! The generation driver shared by the API guests: engine events -> what
//! an API streams or returns. Per event, a [`Piece`]: reasoning (Qwen3.6's
//! `<think>` part, when thinking is on), content, tool-call events (Qwen3.6
//! XML calls parsed while streaming, checked against the request's tool
//! rules) and the token's logprobs; at the end, [`Ended`] with the finish
//! reason and the usage (prompt tokens served from the prefix cache
//! included). Stop strings are cut here ([`StopMatcher`]), so no API sees
//! one. Each API only formats pieces.

use std::collections::HashMap;

use crate::ApiError;
use crate::chat::{THINK_END, ThinkSplitter};
use crate::host::Host;
use crate::inference::{
    Event, FinishReason, Generation, ModelInfo, StopMatcher, TokenEvent, Usage, early_usage,
};
use crate::tokens;
use crate::toolcall::{self, Out, ToolParser};
use crate::tools::{ToolChoice, Tools, tool_name};

/// `finish_reason` of a cancelled generation.
pub const CANCELLED_FINISH_REASON: &str = "abort";

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
    /// Tool-call events, in order.
    pub tool_calls: Vec<ToolEvent>,
    /// Whether the output was in the reasoning part after this piece (the
    /// channel of a piece with nothing but a logprob).
    pub in_reasoning: bool,
}

impl Piece {
    pub fn is_empty(&self) -> bool {
        self.reasoning.is_empty()
            && self.content.is_empty()
            && self.logprob.is_none()
            && self.tool_calls.is_empty()
    }
}

/// A tool call's progress, as the model writes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToolEvent {
    /// Call `index` starts: its id (the driver's prefix + random hex) and
    /// the function's name.
    Start {
        index: usize,
        id: String,
        name: String,
    },
    /// A fragment of call `index`'s arguments, JSON text: the fragments of a
    /// call concatenate to its arguments object.
    Args { index: usize, fragment: String },
}

#[derive(Debug, Clone, PartialEq)]
pub enum Ended {
    Finished {
        reason: &'static str,
        usage: Usage,
    },
    Failed(String),
    /// The output broke the request's tool rules (`tool_choice`, ...).
    Rejected(ApiError),
}

/// The error for output that breaks `tool_choice`/`parallel_tool_calls`/`tools`.
/// A 422, not a 5xx: the request was served as asked, the model's answer
/// broke its rules, and retrying the same request (which clients do on a
/// 5xx) rarely helps.
pub fn tool_violation(message: impl Into<String>) -> ApiError {
    ApiError::new(
        422,
        crate::error::SERVER_ERROR,
        Some("tool_choice_violation"),
        message,
    )
}

/// Tool-call parsing and validation of one generation.
struct ToolState {
    parser: ToolParser,
    cfg: Tools,
    names: Vec<String>,
    violation: Option<ApiError>,
    /// `false` ([`Driver::report_only`]): the calls are reported as made,
    /// where the engine enforced the rules while decoding.
    enforce: bool,
}

impl ToolState {
    fn check_start(&self, index: usize, name: &str) -> Result<(), ApiError> {
        if !self.cfg.tools.iter().any(|t| tool_name(t) == Some(name)) {
            return Err(tool_violation(format!(
                "the model called function '{name}', which is not in 'tools'"
            )));
        }
        if let ToolChoice::Named(n) = &self.cfg.choice
            && n != name
        {
            return Err(tool_violation(format!(
                "tool_choice requires function '{n}', but the model called '{name}'"
            )));
        }
        if index > 0 && !self.cfg.parallel {
            return Err(tool_violation(
                "parallel_tool_calls is false, but the model made more than one tool call",
            ));
        }
        Ok(())
    }

    fn check_end(&self) -> Result<(), ApiError> {
        if self.names.is_empty() {
            match &self.cfg.choice {
                ToolChoice::Required => {
                    return Err(tool_violation(
                        "tool_choice is 'required', but the model made no tool call",
                    ));
                }
                ToolChoice::Named(n) => {
                    return Err(tool_violation(format!(
                        "tool_choice requires function '{n}', but the model made no tool call"
                    )));
                }
                _ => {}
            }
        }
        Ok(())
    }
}

pub struct Driver<'h, H: Host> {
    host: &'h H,
    stop: StopMatcher,
    think: Option<ThinkSplitter>,
    think_end_id: Option<u32>,
    want_logprobs: bool,
    prompt_tokens: u32,
    tokens: u32,
    /// Tokens generated in the reasoning part (thinking on, before `</think>`).
    reasoning_tokens: u32,
    /// Sum of the generated tokens' logprobs (when the engine reports them).
    logprob_sum: f64,
    /// Chars of generated text so far, plus the echoed prompt.
    offset: usize,
    spellings: HashMap<u32, (String, Vec<u8>)>,
    tools: Option<ToolState>,
    /// Special tokens spelled out when tools are parsed (`<tool_call>`, `</tool_call>`).
    markup_ids: Vec<(u32, &'static str)>,
    /// Tool call ids are this plus random hex (`call_`, `toolu_`, ...).
    call_id_prefix: &'static str,
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
            reasoning_tokens: 0,
            logprob_sum: 0.0,
            offset,
            spellings: HashMap::new(),
            tools: None,
            markup_ids: Vec::new(),
            call_id_prefix: "call_",
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

    /// Tokens generated while in the reasoning part (`</think>` included).
    pub fn reasoning_tokens(&self) -> u32 {
        self.reasoning_tokens
    }

    /// The stop string that ended the output, if one did.
    pub fn stop_sequence(&self) -> Option<&str> {
        self.stop.stopped()
    }

    /// Tool call ids start with `prefix` (default `call_`).
    pub fn call_id_prefix(mut self, prefix: &'static str) -> Self {
        self.call_id_prefix = prefix;
        self
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
                cfg: tools.clone(),
                names: Vec::new(),
                violation: None,
                enforce: true,
            });
        }
        self
    }

    /// Reports every call the model made instead of refusing output that
    /// breaks `tool_choice`/`parallel_tool_calls`/`tools` (an API whose
    /// requests carry those rules to the engine as a decoding constraint).
    pub fn report_only(mut self) -> Self {
        if let Some(t) = &mut self.tools {
            t.enforce = false;
        }
        self
    }

    /// Passes content through the tool-call parser.
    fn content(&mut self, text: &str, piece: &mut Piece, fin: bool) {
        let Some(ts) = &mut self.tools else {
            piece.content.push_str(text);
            return;
        };
        if ts.violation.is_some() {
            return;
        }
        let mut outs = ts.parser.push(text);
        if fin {
            outs.extend(ts.parser.finish());
        }
        for o in outs {
            match o {
                Out::Text(t) => piece.content.push_str(&t),
                Out::Start { index, name } => {
                    if ts.enforce
                        && let Err(e) = ts.check_start(index, &name)
                    {
                        ts.violation = Some(e);
                        return;
                    }
                    let id = format!("{}{}", self.call_id_prefix, self.host.random_hex(12));
                    piece.tool_calls.push(ToolEvent::Start {
                        index,
                        id,
                        name: name.clone(),
                    });
                    ts.names.push(name);
                }
                Out::Args { index, fragment } => {
                    piece.tool_calls.push(ToolEvent::Args { index, fragment })
                }
                Out::End { .. } => {}
            }
        }
        if fin
            && ts.enforce
            && let Err(e) = ts.check_end()
        {
            ts.violation = Some(e);
        }
    }

    fn take_violation(&mut self) -> Option<ApiError> {
        self.tools.as_mut().and_then(|t| t.violation.take())
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

    /// Waits for the next batch of engine events and handles them: the
    /// non-empty pieces, in order. Sets `ended` at the end (a generation
    /// that stops without a finish event fails); after a stop string, also
    /// takes the engine's usage ([`Driver::engine_usage`]). `None` is a
    /// generation with nothing to generate (`ended` is already set).
    pub fn next_batch<G: Generation>(&mut self, generation: &mut Option<G>) -> Vec<Piece> {
        let mut out = Vec::new();
        if self.ended.is_none() {
            let events = generation
                .as_mut()
                .map(|g| g.wait_next())
                .unwrap_or_default();
            if events.is_empty() {
                self.ended = Some(Ended::Failed(
                    "the generation ended without a finish event".into(),
                ));
            }
            for ev in events {
                let p = self.on_event(ev);
                if !p.is_empty() {
                    out.push(p);
                }
                if self.ended.is_some() {
                    break;
                }
            }
        }
        self.engine_usage(generation.as_ref());
        out
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
                if self.in_reasoning() {
                    self.reasoning_tokens += 1;
                }
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
        piece.in_reasoning = self.in_reasoning();
        if let Some(e) = self.take_violation() {
            self.ended = Some(Ended::Rejected(e));
        }
        piece
    }
}
