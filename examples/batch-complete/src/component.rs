//! The component glue (wasm32 only): exports `wasi:cli/run`, implements
//! [`Engine`] over the host's `qwasi:inference` imports.

wit_bindgen::generate!({
    path: "../../wit",
    world: "qwasi:inference/command",
    with: {
        "wasi:io/poll@0.2.12": wasip2::io::poll,
        "wasi:io/error@0.2.12": wasip2::io::error,
        "wasi:io/streams@0.2.12": wasip2::io::streams,
        "wasi:clocks/monotonic-clock@0.2.12": wasip2::clocks::monotonic_clock,
    },
    generate_all,
});

use crate::{Completion, Engine, Job};
use qwasi::inference::types::{
    Event, FinishReason, GenerateError, GenerateRequest, SamplingParams,
};
use qwasi::inference::{inference, tokenizer};

struct Host;

fn describe(e: GenerateError) -> String {
    match e {
        GenerateError::QueueFull(s) => format!("the engine queue is full (retry after {s} s)"),
        GenerateError::QueueTimeout => "the request waited too long in the queue".into(),
        GenerateError::ShuttingDown => "the engine is shutting down".into(),
        GenerateError::ContextLengthExceeded(m) => format!("context length exceeded: {m}"),
        GenerateError::InvalidRequest(m) => format!("invalid request: {m}"),
        GenerateError::Internal(m) => format!("engine error: {m}"),
    }
}

impl Engine for Host {
    fn complete(&self, job: &Job) -> Result<Completion, String> {
        let prompt = tokenizer::encode(&job.prompt).map_err(|e| format!("tokenizer: {e}"))?;
        if prompt.is_empty() {
            return Err("the prompt encodes to no tokens".into());
        }
        let req = GenerateRequest {
            prompt,
            max_tokens: job.max_tokens,
            stop_token_ids: vec![],
            ignore_eos: false,
            sampling: SamplingParams {
                temperature: job.temperature,
                top_p: job.top_p,
                top_k: 0,
                min_p: 0.0,
                seed: job.seed,
                repetition_penalty: 1.0,
                presence_penalty: 0.0,
                frequency_penalty: 0.0,
                logit_bias: vec![],
                logprobs: None,
            },
            cache_salt: None,
            snapshot_points: vec![],
        };
        let generation = inference::generate(&req).map_err(describe)?;
        let ready = generation.subscribe();
        let mut text = String::new();
        loop {
            ready.block();
            for event in generation.next() {
                match event {
                    Event::Token(t) => text.push_str(&t.text),
                    Event::Finished(f) => {
                        text.push_str(&f.trailing_text);
                        return Ok(Completion {
                            text,
                            tokens: f.usage.completion_tokens,
                            finish_reason: match f.reason {
                                FinishReason::Stop => "stop",
                                FinishReason::Length => "length",
                                FinishReason::Cancelled => "cancelled",
                            },
                        });
                    }
                    Event::Failed(m) => return Err(format!("generation failed: {m}")),
                }
            }
        }
    }
}

struct Component;

impl exports::wasi::cli::run::Guest for Component {
    fn run() -> Result<(), ()> {
        let args: Vec<String> = wasip2::cli::environment::get_arguments()
            .into_iter()
            .skip(1)
            .collect();
        let stdin = std::io::stdin().lock();
        let stdout = std::io::stdout().lock();
        let code = crate::run_batch(&args, stdin, stdout, std::io::stderr(), &Host);
        if code != 0 {
            wasip2::cli::exit::exit_with_code(code);
        }
        Ok(())
    }
}

export!(Component);
