//! The `api` world's component glue (wasm32, feature `api`): the bindings,
//! [`crate::export_http!`], the [`WasiOutput`] over `wasi:http`, and
//! [`HostEngine`], the [`Engine`] over the `qwasi:inference` imports.

/// wit-bindgen's bindings of world `qwasi:inference/api` (wasi interfaces
/// mapped to the `wasip2` crate).
pub mod bindings {
    wit_bindgen::generate!({
        path: "../../wit",
        world: "qwasi:inference/api",
        pub_export_macro: true,
        export_macro_name: "export_api_world",
        default_bindings_module: "qwasi_guest_sdk::api::bindings",
        with: {
            "wasi:io/poll@0.2.12": wasip2::io::poll,
            "wasi:io/error@0.2.12": wasip2::io::error,
            "wasi:io/streams@0.2.12": wasip2::io::streams,
            "wasi:clocks/monotonic-clock@0.2.12": wasip2::clocks::monotonic_clock,
            "wasi:http/types@0.2.12": wasip2::http::types,
        },
    });
}

pub use wasip2;

use bindings::qwasi::inference::{inference, tokenizer, types};
use wasip2::http::types::{
    Fields, IncomingBody, IncomingRequest, Method, OutgoingBody, OutgoingResponse, ResponseOutparam,
};
use wasip2::io::poll::Pollable;
use wasip2::io::streams::{InputStream, OutputStream, StreamError};

use crate::error::ApiError;
use crate::http::{BodyRead, Disconnected, Output, Request, send_error};
use crate::inference::{
    Engine, Event, Finish, FinishReason, GenerateError, GenerateRequest, Generation, ModelInfo,
    TokenEvent, TokenLogprob, Usage,
};

/// An API guest: one call per request, with a fresh instance each time.
pub trait HttpGuest {
    /// Serves `req`. A handler that returns without starting a response gets
    /// a 500; one that returns `Err` before starting gets that error (OpenAI
    /// format); after starting, an `Err` just ends the body.
    fn handle(req: Request, out: &mut WasiOutput) -> Result<(), ApiError>;
}

/// Exports `$guest` (an [`HttpGuest`]) as the component's
/// `wasi:http/incoming-handler`. Use once, at the crate root.
#[macro_export]
macro_rules! export_http {
    ($guest:ty) => {
        struct __QwasiHttpComponent;
        impl $crate::api::bindings::exports::wasi::http::incoming_handler::Guest
            for __QwasiHttpComponent
        {
            fn handle(
                request: $crate::api::wasip2::http::types::IncomingRequest,
                out: $crate::api::wasip2::http::types::ResponseOutparam,
            ) {
                $crate::api::serve::<$guest>(request, out)
            }
        }
        $crate::api::bindings::export_api_world!(
            __QwasiHttpComponent with_types_in $crate::api::bindings
        );
    };
}

/// Runs a guest on one incoming request (what [`crate::export_http!`] calls).
pub fn serve<G: HttpGuest>(request: IncomingRequest, out: ResponseOutparam) {
    let mut output = WasiOutput {
        out: Some(out),
        stream: None,
        body: None,
    };
    let result = match into_request(request) {
        Ok(req) => G::handle(req, &mut output),
        Err(e) => Err(e),
    };
    match result {
        Err(e) if !output.started() => {
            let _ = send_error(&mut output, &e);
        }
        Ok(()) if !output.started() => {
            let _ = send_error(&mut output, &ApiError::internal("no response was produced"));
        }
        _ => {}
    }
    output.finish();
}

fn method_name(m: &Method) -> String {
    match m {
        Method::Get => "GET",
        Method::Head => "HEAD",
        Method::Post => "POST",
        Method::Put => "PUT",
        Method::Delete => "DELETE",
        Method::Connect => "CONNECT",
        Method::Options => "OPTIONS",
        Method::Trace => "TRACE",
        Method::Patch => "PATCH",
        Method::Other(s) => return s.clone(),
    }
    .to_string()
}

/// The incoming body as a [`BodyRead`]. Field order: the stream is a child
/// of the body and is dropped first.
struct WasiBody {
    stream: Option<InputStream>,
    _body: IncomingBody,
}

impl BodyRead for WasiBody {
    fn read_chunk(&mut self, max: usize) -> Result<Option<Vec<u8>>, String> {
        let Some(stream) = &self.stream else {
            return Ok(None);
        };
        match stream.blocking_read(max as u64) {
            Ok(chunk) => Ok(Some(chunk)),
            Err(StreamError::Closed) => {
                self.stream = None;
                Ok(None)
            }
            Err(StreamError::LastOperationFailed(e)) => Err(e.to_debug_string()),
        }
    }
}

fn into_request(request: IncomingRequest) -> Result<Request, ApiError> {
    let method = method_name(&request.method());
    let path = request.path_with_query().unwrap_or_else(|| "/".into());
    let headers = request
        .headers()
        .entries()
        .into_iter()
        .map(|(k, v)| (k, String::from_utf8_lossy(&v).into_owned()))
        .collect();
    let body = request
        .consume()
        .map_err(|_| ApiError::internal("request body unavailable"))?;
    let stream = body
        .stream()
        .map_err(|_| ApiError::internal("request body stream unavailable"))?;
    Ok(Request::new(
        method,
        &path,
        headers,
        Box::new(WasiBody {
            stream: Some(stream),
            _body: body,
        }),
    ))
}

/// The response side of `wasi:http`.
pub struct WasiOutput {
    out: Option<ResponseOutparam>,
    // Field order matters: the stream is a child of the body.
    stream: Option<OutputStream>,
    body: Option<OutgoingBody>,
}

impl Output for WasiOutput {
    fn start(&mut self, status: u16, headers: &[(&str, String)]) -> Result<(), Disconnected> {
        let out = self.out.take().ok_or(Disconnected)?;
        let fields = Fields::new();
        for (k, v) in headers {
            let _ = fields.append(k, v.as_bytes());
        }
        let resp = OutgoingResponse::new(fields);
        resp.set_status_code(status).map_err(|_| Disconnected)?;
        let body = resp.body().map_err(|_| Disconnected)?;
        ResponseOutparam::set(out, Ok(resp));
        self.stream = Some(body.write().map_err(|_| Disconnected)?);
        self.body = Some(body);
        Ok(())
    }

    /// One write + flush for up to 4 KiB (the blocking-write-and-flush
    /// limit); larger buffers go through check-write/write and one flush.
    fn write(&mut self, data: &[u8]) -> Result<(), Disconnected> {
        let s = self.stream.as_ref().ok_or(Disconnected)?;
        if data.len() <= 4096 {
            return s.blocking_write_and_flush(data).map_err(|_| Disconnected);
        }
        let mut rest = data;
        while !rest.is_empty() {
            let n = s.check_write().map_err(|_| Disconnected)? as usize;
            if n == 0 {
                s.subscribe().block();
                continue;
            }
            let k = n.min(rest.len());
            s.write(&rest[..k]).map_err(|_| Disconnected)?;
            rest = &rest[k..];
        }
        s.blocking_flush().map_err(|_| Disconnected)
    }

    fn started(&self) -> bool {
        self.out.is_none()
    }
}

impl WasiOutput {
    fn finish(mut self) {
        drop(self.stream.take());
        if let Some(body) = self.body.take() {
            let _ = OutgoingBody::finish(body, None);
        }
    }
}

/// [`Engine`] over the `qwasi:inference` imports and the WASI clocks.
#[derive(Debug, Clone, Copy, Default)]
pub struct HostEngine;

pub struct HostGeneration {
    // Dropped first: the pollable is a child of the generation.
    pollable: Pollable,
    generation: inference::Generation,
}

impl Generation for HostGeneration {
    fn wait_next(&mut self) -> Vec<Event> {
        // A ready pollable with nothing to drain is a spurious wake-up at most
        // a few times; forever means the generation is over.
        for _ in 0..64 {
            self.pollable.block();
            let events = self.generation.next();
            if !events.is_empty() {
                return events.into_iter().map(event).collect();
            }
        }
        Vec::new()
    }

    fn usage(&self) -> Option<Usage> {
        Some(usage(self.generation.usage()))
    }
}

fn usage(u: types::Usage) -> Usage {
    Usage {
        prompt_tokens: u.prompt_tokens,
        completion_tokens: u.completion_tokens,
        cached_tokens: u.cached_tokens,
    }
}

fn event(e: types::Event) -> Event {
    match e {
        types::Event::Token(t) => Event::Token(TokenEvent {
            id: t.id,
            text: t.text,
            logprob: t.logprob.map(|l| TokenLogprob {
                token: l.token,
                logprob: l.logprob,
                top: l.top,
            }),
        }),
        types::Event::Finished(f) => Event::Finished(Finish {
            reason: match f.reason {
                types::FinishReason::Stop => FinishReason::Stop,
                types::FinishReason::Length => FinishReason::Length,
                types::FinishReason::Cancelled => FinishReason::Cancelled,
            },
            usage: usage(f.usage),
            stop_token: f.stop_token,
            trailing_text: f.trailing_text,
        }),
        types::Event::Failed(m) => Event::Failed(m),
    }
}

fn constraint(c: crate::inference::Constraint) -> types::Constraint {
    use crate::inference::Grammar as G;
    let grammar = match c.grammar {
        G::JsonSchema { schema, strict } => {
            types::Grammar::JsonSchema(types::JsonSchema { schema, strict })
        }
        G::JsonObject => types::Grammar::JsonObject,
        G::Regex(r) => types::Grammar::Regex(r),
        G::Choice(c) => types::Grammar::Choice(c),
        G::Lark(g) => types::Grammar::Lark(g),
        G::ToolCalls(t) => types::Grammar::ToolCalls(types::ToolCalls {
            tools: t
                .tools
                .into_iter()
                .map(|t| types::Tool {
                    name: t.name,
                    parameters: t.parameters,
                })
                .collect(),
            required: t.required,
            parallel: t.parallel,
        }),
    };
    types::Constraint {
        grammar,
        start_after: c.start_after,
    }
}

impl crate::host::Host for HostEngine {
    fn random_hex(&self, bytes: usize) -> String {
        wasip2::random::random::get_random_bytes(bytes as u64)
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect()
    }
}

impl Engine for HostEngine {
    type Generation = HostGeneration;

    fn model_info(&self) -> ModelInfo {
        let m = inference::model_info();
        let c = inference::serving_config();
        ModelInfo {
            id: m.id,
            context_length: m.context_length,
            vocab_size: m.vocab_size,
            eos_token_ids: m.eos_token_ids,
            chat_template: m.chat_template,
            created: m.created,
            max_prompt_tokens: m.max_prompt_tokens,
            max_completion_tokens: m.max_completion_tokens,
            aliases: c.aliases,
            default_chat_template_kwargs: serde_json::from_str(&c.default_chat_template_kwargs)
                .unwrap_or_default(),
        }
    }

    fn tokenize(&self, text: &str) -> Result<Vec<u32>, String> {
        tokenizer::encode(text)
    }

    fn detokenize(&self, ids: &[u32], skip_special_tokens: bool) -> Result<String, String> {
        tokenizer::decode(ids, skip_special_tokens)
    }

    fn token_to_id(&self, token: &str) -> Option<u32> {
        tokenizer::token_to_id(token)
    }

    fn id_to_token(&self, id: u32) -> Option<String> {
        tokenizer::id_to_token(id)
    }

    fn is_special(&self, id: u32) -> bool {
        tokenizer::is_special(id)
    }

    fn generate(&self, r: GenerateRequest) -> Result<HostGeneration, GenerateError> {
        let s = r.sampling;
        let request = types::GenerateRequest {
            prompt: r.prompt,
            max_tokens: r.max_tokens,
            stop_token_ids: r.stop_token_ids,
            ignore_eos: r.ignore_eos,
            sampling: types::SamplingParams {
                temperature: s.temperature,
                top_p: s.top_p,
                top_k: s.top_k,
                min_p: s.min_p,
                seed: s.seed,
                repetition_penalty: s.repetition_penalty,
                presence_penalty: s.presence_penalty,
                frequency_penalty: s.frequency_penalty,
                logit_bias: s.logit_bias,
                logprobs: s.logprobs,
            },
            cache_salt: r.cache_salt,
            snapshot_points: r.snapshot_points,
        };
        let started = match r.constraint {
            None => inference::generate(&request),
            Some(c) => inference::generate_constrained(&request, &constraint(c)),
        };
        match started {
            Ok(generation) => Ok(HostGeneration {
                pollable: generation.subscribe(),
                generation,
            }),
            Err(e) => Err(match e {
                types::GenerateError::QueueFull(s) => GenerateError::QueueFull(s),
                types::GenerateError::QueueTimeout => GenerateError::QueueTimeout,
                types::GenerateError::ShuttingDown => GenerateError::ShuttingDown,
                types::GenerateError::ContextLengthExceeded(m) => {
                    GenerateError::ContextLengthExceeded(m)
                }
                types::GenerateError::InvalidRequest(m) => GenerateError::InvalidRequest(m),
                types::GenerateError::Internal(m) => GenerateError::Internal(m),
            }),
        }
    }

    fn now_unix_ns(&self) -> u64 {
        let t = wasip2::clocks::wall_clock::now();
        t.seconds * 1_000_000_000 + u64::from(t.nanoseconds)
    }

    fn monotonic_ns(&self) -> u64 {
        wasip2::clocks::monotonic_clock::now()
    }
}
