//! `qwasi:inference` as plain Rust: the WIT types mirrored, the imports
//! behind the [`Engine`] trait (implemented over the real imports by
//! `api::HostEngine` on wasm32 and by [`crate::testing::FakeEngine`] in
//! tests), and [`Run`], which turns a generation's events into text deltas,
//! applying stop strings and keeping the generated ids, the finish reason
//! and the usage.

use std::collections::VecDeque;

use crate::error::ApiError;

/// Mirrors `model-info`.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ModelInfo {
    /// The name clients use.
    pub id: String,
    pub context_length: u32,
    pub vocab_size: u32,
    pub eos_token_ids: Vec<u32>,
    /// The model's jinja chat template, if it ships one.
    pub chat_template: Option<String>,
    /// Unix seconds when the model was loaded.
    pub created: u64,
    /// Operator caps (0 = none).
    pub max_prompt_tokens: u32,
    pub max_completion_tokens: u32,
    /// `serving-config` (WIT 0.1.3): more names the model is served under.
    pub aliases: Vec<String>,
    /// `serving-config`: the operator's default chat-template kwargs, under
    /// each request's own.
    pub default_chat_template_kwargs: serde_json::Map<String, serde_json::Value>,
}

impl ModelInfo {
    /// Whether clients may call the model `name` (its id or an alias).
    pub fn serves(&self, name: &str) -> bool {
        self.id == name || self.aliases.iter().any(|a| a == name)
    }
}

/// Mirrors `sampling-params`. `Default` turns every option off and samples
/// at temperature 1; [`SamplingParams::greedy`] is temperature 0.
#[derive(Debug, Clone, PartialEq)]
pub struct SamplingParams {
    pub temperature: f32,
    pub top_p: f32,
    pub top_k: u32,
    pub min_p: f32,
    pub seed: Option<u64>,
    pub repetition_penalty: f32,
    pub presence_penalty: f32,
    pub frequency_penalty: f32,
    pub logit_bias: Vec<(u32, f32)>,
    pub logprobs: Option<u32>,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams {
            temperature: 1.0,
            top_p: 1.0,
            top_k: 0,
            min_p: 0.0,
            seed: None,
            repetition_penalty: 1.0,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            logit_bias: Vec::new(),
            logprobs: None,
        }
    }
}

impl SamplingParams {
    pub fn greedy() -> Self {
        SamplingParams {
            temperature: 0.0,
            ..Self::default()
        }
    }
}

/// Mirrors `generate-request`.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct GenerateRequest {
    pub prompt: Vec<u32>,
    pub max_tokens: u32,
    /// Ids that end generation besides the model's EOS ids.
    pub stop_token_ids: Vec<u32>,
    pub ignore_eos: bool,
    pub sampling: SamplingParams,
    /// Prefix-cache isolation.
    pub cache_salt: Option<String>,
    /// Prompt positions worth snapshotting (message boundaries).
    pub snapshot_points: Vec<u32>,
    /// Hold the output to this (sent through `generate-constrained`, WIT 0.1.4).
    pub constraint: Option<Constraint>,
}

/// Mirrors `grammar`: what a constrained output must match.
#[derive(Debug, Clone, PartialEq)]
pub enum Grammar {
    /// JSON valid under the schema (JSON text); `strict`: refuse keywords
    /// that cannot be enforced instead of ignoring them.
    JsonSchema {
        schema: String,
        strict: bool,
    },
    JsonObject,
    Regex(String),
    Choice(Vec<String>),
    /// llguidance's Lark syntax.
    Lark(String),
    ToolCalls(ToolCalls),
}

/// Mirrors `tool`: a function with its `parameters` schema (JSON text).
#[derive(Debug, Clone, PartialEq)]
pub struct Tool {
    pub name: String,
    pub parameters: String,
}

/// Mirrors `tool-calls`.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolCalls {
    pub tools: Vec<Tool>,
    /// At least one call; otherwise text, or text then calls.
    pub required: bool,
    pub parallel: bool,
}

/// Mirrors `constraint`.
#[derive(Debug, Clone, PartialEq)]
pub struct Constraint {
    pub grammar: Grammar,
    /// Start after this token (`</think>`).
    pub start_after: Option<u32>,
}

impl GenerateRequest {
    pub fn new(prompt: Vec<u32>, max_tokens: u32) -> Self {
        GenerateRequest {
            prompt,
            max_tokens,
            ..Self::default()
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct TokenLogprob {
    pub token: u32,
    pub logprob: f32,
    pub top: Vec<(u32, f32)>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct TokenEvent {
    pub id: u32,
    /// UTF-8-complete text that became available (empty for special tokens).
    pub text: String,
    pub logprob: Option<TokenLogprob>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FinishReason {
    /// EOS, a stop token, or (in [`Run`]) a stop string.
    Stop,
    /// max-tokens or the context length.
    Length,
    Cancelled,
}

impl FinishReason {
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
            FinishReason::Cancelled => "cancelled",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Usage {
    pub prompt_tokens: u32,
    pub completion_tokens: u32,
    /// Prompt tokens served from the prefix cache.
    pub cached_tokens: u32,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Finish {
    pub reason: FinishReason,
    pub usage: Usage,
    pub stop_token: Option<u32>,
    pub trailing_text: String,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    Token(TokenEvent),
    Finished(Finish),
    Failed(String),
}

/// Why a generation could not start.
#[derive(Debug, Clone, PartialEq)]
pub enum GenerateError {
    /// Retry after this many seconds.
    QueueFull(u32),
    QueueTimeout,
    ShuttingDown,
    ContextLengthExceeded(String),
    InvalidRequest(String),
    Internal(String),
}

impl GenerateError {
    /// The HTTP status that fits.
    pub fn status(&self) -> u16 {
        match self {
            GenerateError::QueueFull(_) => 429,
            GenerateError::QueueTimeout | GenerateError::ShuttingDown => 503,
            GenerateError::ContextLengthExceeded(_) | GenerateError::InvalidRequest(_) => 400,
            GenerateError::Internal(_) => 500,
        }
    }

    /// Seconds for `Retry-After`.
    pub fn retry_after(&self) -> Option<u32> {
        match self {
            GenerateError::QueueFull(s) => Some(*s),
            _ => None,
        }
    }

    pub fn message(&self) -> String {
        match self {
            GenerateError::QueueFull(s) => {
                format!("the server is busy: the request queue is full; retry after {s} s")
            }
            GenerateError::QueueTimeout => {
                "the request waited in the queue longer than the server allows".into()
            }
            GenerateError::ShuttingDown => "the server is shutting down".into(),
            GenerateError::ContextLengthExceeded(m)
            | GenerateError::InvalidRequest(m)
            | GenerateError::Internal(m) => m.clone(),
        }
    }
}

impl std::fmt::Display for GenerateError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message())
    }
}

/// OpenAI-style errors (the statuses of [`GenerateError::status`]).
impl From<GenerateError> for ApiError {
    fn from(e: GenerateError) -> Self {
        match e {
            GenerateError::QueueFull(s) => ApiError::queue_full(s),
            GenerateError::QueueTimeout => ApiError::queue_timeout(),
            GenerateError::ShuttingDown => ApiError::shutting_down(),
            GenerateError::ContextLengthExceeded(m) => {
                ApiError::invalid("context_length_exceeded", m)
            }
            GenerateError::InvalidRequest(m) => ApiError::invalid("invalid_value", m),
            GenerateError::Internal(m) => ApiError::internal(m),
        }
    }
}

/// A running generation; dropping it cancels the request.
pub trait Generation {
    /// Blocks until events are available and drains them. Returns an empty
    /// list only once the generation has ended and every event was returned.
    fn wait_next(&mut self) -> Vec<Event>;

    /// The usage so far (WIT `generation.usage`, since 0.1.2): the prompt
    /// length, the prompt tokens served from the prefix cache and the
    /// tokens sampled so far (possibly ahead of the events returned). What
    /// a guest that ends the generation early (a stop string) reports.
    /// `None` where the engine cannot tell (the default).
    fn usage(&self) -> Option<Usage> {
        None
    }
}

/// The usage of a generation the guest ended early, after using
/// `completion_tokens` of its tokens: the prompt and cached counts from the
/// engine ([`Generation::usage`]), the completion count the guest's own
/// (the engine may have sampled a few more by now; those are not part of
/// the output, as with vLLM's stop strings).
pub fn early_usage<G: Generation>(
    generation: Option<&G>,
    prompt_tokens: u32,
    completion_tokens: u32,
) -> Usage {
    let engine = generation.and_then(Generation::usage);
    Usage {
        prompt_tokens: engine.map_or(prompt_tokens, |u| u.prompt_tokens),
        completion_tokens,
        cached_tokens: engine.map_or(0, |u| u.cached_tokens),
    }
}

/// The imports of world `api` (tokenizer + inference) and the clocks.
pub trait Engine {
    type Generation: Generation;
    fn model_info(&self) -> ModelInfo;
    fn tokenize(&self, text: &str) -> Result<Vec<u32>, String>;
    fn detokenize(&self, ids: &[u32], skip_special_tokens: bool) -> Result<String, String>;
    fn token_to_id(&self, token: &str) -> Option<u32>;
    fn id_to_token(&self, id: u32) -> Option<String>;
    fn is_special(&self, id: u32) -> bool;
    /// Queues the request; returns once the engine has started it.
    fn generate(&self, request: GenerateRequest) -> Result<Self::Generation, GenerateError>;
    /// Wall clock, Unix nanoseconds.
    fn now_unix_ns(&self) -> u64;
    /// Monotonic clock, nanoseconds (for durations).
    fn monotonic_ns(&self) -> u64;

    /// Starts a generation wrapped in a [`Run`].
    fn start(&self, request: GenerateRequest) -> Result<Run<Self::Generation>, GenerateError> {
        let prompt_tokens = request.prompt.len() as u32;
        Ok(Run::new(self.generate(request)?, prompt_tokens))
    }
}

/// Holds back text that may be the start of a stop string and cuts the
/// output at the first one completed: the one that ends first (at the same
/// end, the one that starts first), so the result does not depend on how
/// the text is split into pushes. The stop string and everything after it
/// are dropped; a stop string never leaks into the output.
#[derive(Debug, Clone, Default)]
pub struct StopMatcher {
    stops: Vec<String>,
    held: String,
    stopped: Option<String>,
}

impl StopMatcher {
    pub fn new(stops: impl IntoIterator<Item = String>) -> Self {
        StopMatcher {
            stops: stops.into_iter().filter(|s| !s.is_empty()).collect(),
            ..Self::default()
        }
    }

    /// The stop string that matched.
    pub fn stopped(&self) -> Option<&str> {
        self.stopped.as_deref()
    }

    /// Adds generated text; returns the text safe to emit.
    pub fn push(&mut self, text: &str) -> String {
        if self.stopped.is_some() {
            return String::new();
        }
        if self.stops.is_empty() {
            return text.to_owned();
        }
        self.held.push_str(text);
        let first = self
            .stops
            .iter()
            .filter_map(|s| self.held.find(s.as_str()).map(|i| (i + s.len(), i, s)))
            .min_by_key(|&(end, start, _)| (end, start));
        if let Some((_, i, s)) = first {
            self.stopped = Some(s.clone());
            let out = self.held[..i].to_owned();
            self.held.clear();
            return out;
        }
        // Keep the longest suffix that is a proper prefix of a stop string.
        let keep_from = self
            .held
            .char_indices()
            .map(|(i, _)| i)
            .find(|&i| {
                let tail = &self.held[i..];
                self.stops
                    .iter()
                    .any(|s| s.len() > tail.len() && s.starts_with(tail))
            })
            .unwrap_or(self.held.len());
        let rest = self.held.split_off(keep_from);
        std::mem::replace(&mut self.held, rest)
    }

    /// The end of the output: releases the held-back text.
    pub fn finish(&mut self) -> String {
        std::mem::take(&mut self.held)
    }
}

/// Text that became available with one event.
#[derive(Debug, Clone, PartialEq)]
pub struct Delta {
    /// The token; `None` for text released at the end.
    pub token: Option<u32>,
    pub text: String,
}

/// How a generation ended.
#[derive(Debug, Clone, PartialEq)]
pub enum End {
    Finished {
        reason: FinishReason,
        usage: Usage,
        /// The stop/EOS token, if one ended it.
        stop_token: Option<u32>,
        /// The stop string, if one ended it.
        stop_string: Option<String>,
    },
    Failed(String),
}

/// A generation in progress: events in, text deltas out.
///
/// ```ignore
/// let mut run = engine.start(request)?.with_stop(stops);
/// while let Some(batch) = run.next_batch() {
///     for d in batch { writer.json(&json!({"text": d.text}))?; }
///     writer.flush()?; // before blocking on the engine again
/// }
/// match run.end() { Some(End::Finished { reason, usage, .. }) => ..., _ => ... }
/// ```
pub struct Run<G: Generation> {
    generation: Option<G>,
    stop: StopMatcher,
    prompt_tokens: u32,
    tokens: Vec<u32>,
    spelled: Vec<(u32, String)>,
    end: Option<End>,
}

impl<G: Generation> Run<G> {
    pub fn new(generation: G, prompt_tokens: u32) -> Self {
        Run {
            generation: Some(generation),
            stop: StopMatcher::default(),
            prompt_tokens,
            tokens: Vec::new(),
            spelled: Vec::new(),
            end: None,
        }
    }

    /// Ends the output at the first of these strings (left out of the text).
    pub fn with_stop(mut self, stops: impl IntoIterator<Item = String>) -> Self {
        self.stop = StopMatcher::new(stops);
        self
    }

    /// Gives the special token `id` (whose events carry no text) the text
    /// `text`, e.g. `</think>` to split reasoning from the answer.
    pub fn spell(mut self, id: u32, text: &str) -> Self {
        self.spelled.push((id, text.to_owned()));
        self
    }

    /// The generated token ids so far (the stop token not included).
    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    pub fn end(&self) -> Option<&End> {
        self.end.as_ref()
    }

    /// Blocks for the next batch of events and returns their text deltas
    /// (possibly none, e.g. a special token); `None` once the generation has
    /// ended. Dropping the generation cancels it: a stop string does at once.
    pub fn next_batch(&mut self) -> Option<Vec<Delta>> {
        if self.end.is_some() {
            return None;
        }
        let events = match &mut self.generation {
            Some(g) => g.wait_next(),
            None => Vec::new(),
        };
        let mut out = Vec::new();
        if events.is_empty() {
            self.end = Some(End::Failed(
                "the generation ended without a finish event".into(),
            ));
        }
        let mut events: VecDeque<Event> = events.into();
        while let Some(ev) = events.pop_front() {
            match ev {
                Event::Token(t) => {
                    self.tokens.push(t.id);
                    let text = match self.spelled.iter().find(|(id, _)| *id == t.id) {
                        Some((_, s)) if t.text.is_empty() => s.clone(),
                        _ => t.text,
                    };
                    let text = self.stop.push(&text);
                    out.push(Delta {
                        token: Some(t.id),
                        text,
                    });
                    if let Some(s) = self.stop.stopped() {
                        self.end = Some(End::Finished {
                            reason: FinishReason::Stop,
                            // Asked before the drop below cancels the generation.
                            usage: early_usage(
                                self.generation.as_ref(),
                                self.prompt_tokens,
                                self.tokens.len() as u32,
                            ),
                            stop_token: None,
                            stop_string: Some(s.to_owned()),
                        });
                        self.generation = None; // cancel
                        break;
                    }
                }
                Event::Finished(f) => {
                    let mut text = self.stop.push(&f.trailing_text);
                    let stop_string = self.stop.stopped().map(str::to_owned);
                    if stop_string.is_none() {
                        text.push_str(&self.stop.finish());
                    }
                    if !text.is_empty() {
                        out.push(Delta { token: None, text });
                    }
                    self.end = Some(End::Finished {
                        reason: if stop_string.is_some() {
                            FinishReason::Stop
                        } else {
                            f.reason
                        },
                        usage: f.usage,
                        stop_token: f.stop_token,
                        stop_string,
                    });
                    self.generation = None;
                    break;
                }
                Event::Failed(m) => {
                    self.end = Some(End::Failed(m));
                    self.generation = None;
                    break;
                }
            }
        }
        Some(out)
    }

    /// Runs to the end; returns the whole text.
    pub fn collect_text(&mut self) -> String {
        let mut text = String::new();
        while let Some(batch) = self.next_batch() {
            for d in batch {
                text.push_str(&d.text);
            }
        }
        text
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::FakeEngine;

    #[test]
    fn stop_matcher() {
        let mut m = StopMatcher::new(["END".to_string(), "".to_string()]);
        assert_eq!(m.push("abc E"), "abc ");
        assert_eq!(m.push("N"), "");
        assert_eq!(m.push("x"), "ENx");
        assert_eq!(m.push("yE"), "y");
        assert_eq!(m.push("NDzz"), "");
        assert_eq!(m.stopped(), Some("END"));
        assert_eq!(m.push("more"), "");

        let mut m = StopMatcher::new(["ab".to_string(), "b".to_string()]);
        assert_eq!(m.push("xa"), "x");
        assert_eq!(m.push("b"), ""); // "ab" at 0 wins over "b" at 1
        assert_eq!(m.stopped(), Some("ab"));

        let mut m = StopMatcher::new(["éé".to_string()]);
        assert_eq!(m.push("aé"), "a");
        assert_eq!(m.finish(), "é");

        let mut m = StopMatcher::new(Vec::new());
        assert_eq!(m.push("E"), "E");
    }

    /// Feeds `pieces`; returns (emitted text, the stop string, chunks emitted).
    fn feed(stops: &[&str], pieces: &[&str]) -> (String, Option<String>, Vec<String>) {
        let mut m = StopMatcher::new(stops.iter().map(|s| s.to_string()));
        let mut out = String::new();
        let mut chunks = Vec::new();
        for p in pieces {
            let t = m.push(p);
            out.push_str(&t);
            chunks.push(t);
            if let Some(s) = m.stopped() {
                return (out, Some(s.to_owned()), chunks);
            }
        }
        let rest = m.finish();
        out.push_str(&rest);
        chunks.push(rest);
        (out, None, chunks)
    }

    /// Every way to cut `s` into three pieces at char boundaries, plus one
    /// char at a time.
    fn splits(s: &str) -> Vec<Vec<String>> {
        let chars: Vec<char> = s.chars().collect();
        let n = chars.len();
        let mut all = Vec::new();
        for i in 0..=n {
            for j in i..=n {
                all.push(vec![
                    chars[..i].iter().collect(),
                    chars[i..j].iter().collect(),
                    chars[j..].iter().collect(),
                ]);
            }
        }
        all.push(chars.iter().map(|c| c.to_string()).collect());
        all
    }

    fn feed_all(
        stops: &[&str],
        text: &str,
        check: impl Fn(&[String], String, Option<String>, Vec<String>),
    ) {
        for pieces in splits(text) {
            let refs: Vec<&str> = pieces.iter().map(String::as_str).collect();
            let (out, stopped, chunks) = feed(stops, &refs);
            check(&pieces, out, stopped, chunks);
        }
    }

    #[test]
    fn stop_at_every_split_point() {
        feed_all(
            &["STOP"],
            "Hello world. STOP here STOP",
            |p, out, stopped, chunks| {
                assert_eq!(
                    (out.as_str(), stopped.as_deref()),
                    ("Hello world. ", Some("STOP")),
                    "{p:?}"
                );
                assert!(chunks.iter().all(|c| !c.contains('S')), "leaked: {p:?}");
            },
        );
        feed_all(&["STOP"], "a STO b STOP", |p, out, stopped, _| {
            assert_eq!(
                (out.as_str(), stopped.as_deref()),
                ("a STO b ", Some("STOP")),
                "{p:?}"
            );
        });
        let text = "STO STOPPER? no: ST";
        feed_all(&["STOPS"], text, |p, out, stopped, _| {
            assert_eq!((out.as_str(), stopped), (text, None), "{p:?}");
        });
    }

    #[test]
    fn stop_that_completes_first_wins() {
        feed_all(&["three", "two", "o t"], "one two three", |p, out, _, _| {
            assert_eq!(out, "one ", "{p:?}");
        });
        // Overlapping stops: "b" completes before "abc", however the text is split.
        feed_all(&["abc", "b"], "xabcd", |p, out, stopped, _| {
            assert_eq!(
                (out.as_str(), stopped.as_deref()),
                ("xa", Some("b")),
                "{p:?}"
            );
        });
        feed_all(&["bcd", "abc"], "xabcd", |p, out, _, _| {
            assert_eq!(out, "x", "{p:?}")
        });
    }

    #[test]
    fn stop_multibyte_and_newlines() {
        feed_all(&["\n\n"], "日本語\n\nです", |p, out, stopped, _| {
            assert_eq!((out.as_str(), stopped.is_some()), ("日本語", true), "{p:?}");
        });
        feed_all(&["本語"], "xx日本語yy", |p, out, _, chunks| {
            assert_eq!(out, "xx日", "{p:?}");
            assert!(chunks.iter().all(|c| !c.contains('本')), "{p:?}");
        });
        // A stop sharing a multi-byte prefix with the text, not at a char boundary.
        assert_eq!(feed(&["日x"], &["日本"]).0, "日本");
        assert_eq!(feed(&["AB"], &["AB", "C"]).0, "");
        assert_eq!(feed(&[], &["AB", "C"]).0, "ABC");
        assert_eq!(feed(&[""], &["AB", "C"]).0, "ABC");
    }

    #[test]
    fn run_deltas_usage_and_finish() {
        let e = FakeEngine::new().script(&["Hel", "lo", " wor", "ld"], FinishReason::Length);
        let mut run = e.start(GenerateRequest::new(vec![1, 2, 3], 4)).unwrap();
        let mut texts = Vec::new();
        let mut batches = 0;
        while let Some(b) = run.next_batch() {
            batches += 1;
            texts.extend(b.into_iter().map(|d| d.text));
        }
        assert_eq!(texts.concat(), "Hello world");
        assert_eq!(batches, 2, "the fake engine delivers 3 events per batch");
        assert_eq!(run.tokens().len(), 4);
        match run.end().unwrap() {
            End::Finished {
                reason,
                usage,
                stop_string,
                ..
            } => {
                assert_eq!(*reason, FinishReason::Length);
                assert_eq!((usage.prompt_tokens, usage.completion_tokens), (3, 4));
                assert_eq!(stop_string, &None);
            }
            other => panic!("{other:?}"),
        }
        assert!(run.next_batch().is_none());
    }

    #[test]
    fn run_stop_string_cancels() {
        let e = FakeEngine::new()
            .script(
                &["a", "b", "STO", "Pc", "d", "e", "f"],
                FinishReason::Length,
            )
            .cached(1);
        let mut run = e
            .start(GenerateRequest::new(vec![1], 9))
            .unwrap()
            .with_stop(["STOP".to_string()]);
        assert_eq!(run.collect_text(), "ab");
        match run.end().unwrap() {
            End::Finished {
                reason,
                usage,
                stop_string,
                ..
            } => {
                assert_eq!(*reason, FinishReason::Stop);
                assert_eq!(stop_string.as_deref(), Some("STOP"));
                // The prompt and cached counts come from `Generation::usage`
                // (asked before the cancel); the completion count is the
                // tokens the output used, though the engine ran ahead to 7.
                assert_eq!(
                    *usage,
                    Usage {
                        prompt_tokens: 1,
                        completion_tokens: 4,
                        cached_tokens: 1,
                    }
                );
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(
            e.cancelled(),
            1,
            "the generation is dropped at the stop string"
        );
    }

    #[test]
    fn run_spelled_special_and_failure() {
        let e = FakeEngine::new()
            .script(&["think", "</think>", "answer"], FinishReason::Stop)
            .special(2, "</think>");
        let mut run = e
            .start(GenerateRequest::new(vec![1], 9))
            .unwrap()
            .spell(2, "</think>");
        assert_eq!(run.collect_text(), "think</think>answer");

        let e = FakeEngine::new().failing("boom");
        let mut run = e.start(GenerateRequest::new(vec![1], 9)).unwrap();
        assert_eq!(run.collect_text(), "");
        assert_eq!(run.end(), Some(&End::Failed("boom".into())));
    }

    #[test]
    fn generate_error_mapping() {
        let cases: Vec<(GenerateError, u16, &str, &str, Option<u32>)> = vec![
            (
                GenerateError::QueueFull(7),
                429,
                "rate_limit_error",
                "queue_full",
                Some(7),
            ),
            (
                GenerateError::QueueTimeout,
                503,
                "service_unavailable_error",
                "queue_timeout",
                None,
            ),
            (
                GenerateError::ShuttingDown,
                503,
                "service_unavailable_error",
                "service_shutting_down",
                None,
            ),
            (
                GenerateError::InvalidRequest("bad".into()),
                400,
                "invalid_request_error",
                "invalid_value",
                None,
            ),
            (
                GenerateError::ContextLengthExceeded("long".into()),
                400,
                "invalid_request_error",
                "context_length_exceeded",
                None,
            ),
            (
                GenerateError::Internal("boom".into()),
                500,
                "server_error",
                "internal_error",
                None,
            ),
        ];
        for (g, status, kind, code, retry) in cases {
            assert_eq!(g.status(), status);
            let e = ApiError::from(g);
            assert_eq!(
                (e.status, e.kind.as_str(), e.code.as_deref()),
                (status, kind, Some(code))
            );
            assert_eq!(e.retry_after, retry);
            assert_eq!(e.param, None);
        }
        assert_eq!(
            ApiError::from(GenerateError::QueueFull(3)).message,
            "The server is busy: the request queue is full. Retry after 3 s."
        );
        assert_eq!(
            ApiError::from(GenerateError::Internal("x".into())).message,
            "x"
        );
    }

    #[test]
    fn generate_errors() {
        let a = ApiError::from(GenerateError::QueueFull(7));
        assert_eq!((a.status, a.retry_after), (429, Some(7)));
        assert_eq!(a.code.as_deref(), Some("queue_full"));
        assert_eq!(GenerateError::ShuttingDown.status(), 503);
        assert_eq!(
            GenerateError::ContextLengthExceeded("too long".into()).message(),
            "too long"
        );
        let e = FakeEngine::new().refusing(GenerateError::QueueFull(2));
        assert!(matches!(
            e.start(GenerateRequest::new(vec![1], 1)),
            Err(GenerateError::QueueFull(2))
        ));
    }
}
