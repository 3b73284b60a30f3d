//! The component glue: `wasi:http/incoming-handler` in, `qwasi:inference` out.

use crate::api::{self, HttpRequest, MAX_BODY_BYTES};
use crate::bindings::qwasi::inference::{inference, tokenizer, types};
use crate::error::ApiError;
use crate::host::{self, Disconnected, Event, GenerateError, Generation, Host, ModelInfo, Sink};
use wasip2::http::types::{
    Fields, IncomingRequest, Method, OutgoingBody, OutgoingResponse, ResponseOutparam,
};
use wasip2::io::poll::Pollable;
use wasip2::io::streams::{OutputStream, StreamError};

struct Component;

impl crate::bindings::exports::wasi::http::incoming_handler::Guest for Component {
    fn handle(request: IncomingRequest, out: ResponseOutparam) {
        let method = method_name(&request.method());
        let path = request.path_with_query().unwrap_or_else(|| "/".into());
        let mut sink = WasiSink {
            out: Some(out),
            body: None,
            stream: None,
        };
        match read_body(request) {
            Ok(body) => api::handle(&WasmHost, &HttpRequest { method, path, body }, &mut sink),
            Err(e) => api::send_error(&mut sink, &e),
        }
        sink.finish();
    }
}

crate::bindings::export!(Component with_types_in crate::bindings);

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

fn read_body(request: IncomingRequest) -> Result<Vec<u8>, ApiError> {
    let body = request
        .consume()
        .map_err(|_| ApiError::internal("request body unavailable"))?;
    let mut out = Vec::new();
    {
        let stream = body
            .stream()
            .map_err(|_| ApiError::internal("request body stream unavailable"))?;
        loop {
            match stream.blocking_read(1 << 16) {
                Ok(chunk) => {
                    out.extend_from_slice(&chunk);
                    if out.len() > MAX_BODY_BYTES {
                        return Err(ApiError::too_large(MAX_BODY_BYTES));
                    }
                }
                Err(StreamError::Closed) => break,
                Err(StreamError::LastOperationFailed(e)) => {
                    return Err(ApiError::invalid(
                        "body_read_error",
                        format!("could not read the request body: {}", e.to_debug_string()),
                    ));
                }
            }
        }
    }
    drop(body);
    Ok(out)
}

struct WasiSink {
    out: Option<ResponseOutparam>,
    // Field order matters: the stream is a child of the body.
    stream: Option<OutputStream>,
    body: Option<OutgoingBody>,
}

impl Sink for WasiSink {
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

    /// One write + flush for buffers up to 4 KiB (the blocking-write-and-flush
    /// limit); larger ones go through check-write/write and one flush.
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
}

impl WasiSink {
    fn finish(mut self) {
        if self.out.is_some() {
            api::send_error(&mut self, &ApiError::internal("no response was produced"));
        }
        drop(self.stream.take());
        if let Some(body) = self.body.take() {
            let _ = OutgoingBody::finish(body, None);
        }
    }
}

struct WasmHost;

pub struct WasmGeneration {
    // Dropped first: the pollable is a child of the generation.
    pollable: Pollable,
    generation: inference::Generation,
}

impl Generation for WasmGeneration {
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
}

fn event(e: types::Event) -> Event {
    match e {
        types::Event::Token(t) => Event::Token(host::TokenEvent {
            id: t.id,
            text: t.text,
            logprob: t.logprob.map(|l| host::TokenLogprob {
                token: l.token,
                logprob: l.logprob,
                top: l.top,
            }),
        }),
        types::Event::Finished(f) => Event::Finished(host::Finish {
            reason: match f.reason {
                types::FinishReason::Stop => host::FinishReason::Stop,
                types::FinishReason::Length => host::FinishReason::Length,
                types::FinishReason::Cancelled => host::FinishReason::Cancelled,
            },
            usage: host::Usage {
                prompt_tokens: f.usage.prompt_tokens,
                completion_tokens: f.usage.completion_tokens,
                cached_tokens: f.usage.cached_tokens,
            },
            stop_token: f.stop_token,
            trailing_text: f.trailing_text,
        }),
        types::Event::Failed(m) => Event::Failed(m),
    }
}

impl Host for WasmHost {
    type Generation = WasmGeneration;

    fn model_info(&self) -> ModelInfo {
        let m = inference::model_info();
        ModelInfo {
            id: m.id,
            context_length: m.context_length,
            vocab_size: m.vocab_size,
            eos_token_ids: m.eos_token_ids,
            chat_template: m.chat_template,
            created: m.created,
            max_prompt_tokens: m.max_prompt_tokens,
            max_completion_tokens: m.max_completion_tokens,
        }
    }

    fn encode(&self, text: &str) -> Result<Vec<u32>, String> {
        tokenizer::encode(text)
    }

    fn decode(&self, ids: &[u32], skip_special_tokens: bool) -> Result<String, String> {
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

    fn generate(&self, r: host::GenerateRequest) -> Result<WasmGeneration, GenerateError> {
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
        match inference::generate(&request) {
            Ok(generation) => Ok(WasmGeneration {
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

    fn random_hex(&self, bytes: usize) -> String {
        wasip2::random::random::get_random_bytes(bytes as u64)
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect()
    }

    fn now_unix(&self) -> u64 {
        wasip2::clocks::wall_clock::now().seconds
    }
}
