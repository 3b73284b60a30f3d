//! What the guest needs from its host, as plain Rust: the WIT types mirrored
//! and the imports behind a trait, so the API logic runs (and is tested) on
//! the native target with a fake engine. `wasm.rs` implements [`Host`] over
//! the real `qwasi:inference` imports.

/// Mirrors `qwasi:inference/types.model-info`.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelInfo {
    pub id: String,
    pub context_length: u32,
    pub vocab_size: u32,
    pub eos_token_ids: Vec<u32>,
    pub chat_template: Option<String>,
    pub created: u64,
    /// Operator caps (0 = none).
    pub max_prompt_tokens: u32,
    pub max_completion_tokens: u32,
}

/// Mirrors `sampling-params`; `Default` is the neutral value of every field.
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

/// Mirrors `generate-request`.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct GenerateRequest {
    pub prompt: Vec<u32>,
    pub max_tokens: u32,
    pub stop_token_ids: Vec<u32>,
    pub ignore_eos: bool,
    pub sampling: SamplingParams,
    pub cache_salt: Option<String>,
    pub snapshot_points: Vec<u32>,
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
    pub text: String,
    pub logprob: Option<TokenLogprob>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FinishReason {
    Stop,
    Length,
    Cancelled,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Usage {
    pub prompt_tokens: u32,
    pub completion_tokens: u32,
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

#[derive(Debug, Clone, PartialEq)]
pub enum GenerateError {
    QueueFull(u32),
    QueueTimeout,
    ShuttingDown,
    ContextLengthExceeded(String),
    InvalidRequest(String),
    Internal(String),
}

/// A running generation. Dropping it cancels the request.
pub trait Generation {
    /// Blocks until events are available and drains them (one `next()` host
    /// call after waiting on the pollable). Returns an empty list only once
    /// the generation has ended and every event was returned.
    fn wait_next(&mut self) -> Vec<Event>;
}

/// The imports of world `api`, plus the bits of WASI the guest uses.
pub trait Host {
    type Generation: Generation;
    fn model_info(&self) -> ModelInfo;
    fn encode(&self, text: &str) -> Result<Vec<u32>, String>;
    fn decode(&self, ids: &[u32], skip_special_tokens: bool) -> Result<String, String>;
    fn token_to_id(&self, token: &str) -> Option<u32>;
    fn id_to_token(&self, id: u32) -> Option<String>;
    fn is_special(&self, id: u32) -> bool;
    fn generate(&self, request: GenerateRequest) -> Result<Self::Generation, GenerateError>;
    /// Random lowercase hex for response ids (wasi:random).
    fn random_hex(&self, bytes: usize) -> String;
    /// Unix seconds (wasi:clocks/wall-clock).
    fn now_unix(&self) -> u64;
}

/// The client went away (or the response could not be sent).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Disconnected;

/// Where a response goes. `start` sends the status and headers; each `write`
/// is one host write + flush of a complete buffer. `Err` means the client is
/// gone: stop (dropping the generation cancels it).
pub trait Sink {
    fn start(&mut self, status: u16, headers: &[(&str, String)]) -> Result<(), Disconnected>;
    fn write(&mut self, data: &[u8]) -> Result<(), Disconnected>;
}
