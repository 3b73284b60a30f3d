//! The per-request store state of an API guest and the host side of
//! `qwasi:inference/{types,tokenizer,inference}`.

use super::Shared;
use super::bindings::api::qwasi::inference::{inference, tokenizer, types};
use super::limits::CpuMeter;
use super::memory::GuestLimits;
use qwasi_engine::constraint::Compiled;
use qwasi_engine::generate::{FinishReason, GenerateRequest};
use qwasi_engine::sampling::{Sampled, SamplingParams};
use qwasi_engine::service::{Event, GenerationHandle, SubmitError, SubmitOptions, Usage};
use std::sync::Arc;
use wasmtime::Result;
use wasmtime::component::{Resource, ResourceTable};
use wasmtime_wasi::p2::{DynPollable, Pollable};
use wasmtime_wasi::{WasiCtx, WasiCtxView, WasiView};
use wasmtime_wasi_http::{WasiHttpCtx, WasiHttpCtxView, WasiHttpHooks, WasiHttpView};

/// Store data of one API-guest instance (one HTTP request).
pub struct HostState {
    pub(super) wasi: WasiCtx,
    pub(super) http: WasiHttpCtx,
    pub(super) hooks: DenyEgress,
    pub(super) table: ResourceTable,
    pub(super) limits: GuestLimits,
    pub(super) cpu: CpuMeter,
    pub(super) shared: Arc<Shared>,
    /// Who the policy admitted (an API-key id): isolates the prefix cache.
    pub(super) caller: Option<String>,
}

impl WasiView for HostState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: &mut self.wasi,
            table: &mut self.table,
        }
    }
}

impl WasiHttpView for HostState {
    fn http(&mut self) -> WasiHttpCtxView<'_> {
        WasiHttpCtxView {
            ctx: &mut self.http,
            table: &mut self.table,
            hooks: &mut self.hooks,
        }
    }
}

/// wasi:http hooks that deny all guest egress (`outgoing-handler.handle`).
#[derive(Default)]
pub struct DenyEgress;

impl WasiHttpHooks for DenyEgress {
    fn send_request(
        &mut self,
        _request: http::Request<wasmtime_wasi_http::WasiBody>,
        _options: Option<wasmtime_wasi_http::RequestOptions>,
        _fut: Box<dyn Future<Output = Result<(), wasmtime_wasi_http::Error>> + Send>,
    ) -> Box<
        dyn Future<
                Output = Result<
                    (
                        http::Response<wasmtime_wasi_http::WasiBody>,
                        Box<dyn Future<Output = Result<(), wasmtime_wasi_http::Error>> + Send>,
                    ),
                    wasmtime_wasi_http::Error,
                >,
            > + Send,
    > {
        Box::new(async { Err(wasmtime_wasi_http::Error::HttpRequestDenied) })
    }
}

/// The host object behind a guest's `generation` resource. Dropping it drops
/// the engine handle, which cancels the request and frees its slot.
pub struct GenerationResource {
    handle: GenerationHandle,
    hard_stop: tokio::sync::watch::Receiver<bool>,
}

#[wasmtime_wasi::async_trait]
impl Pollable for GenerationResource {
    async fn ready(&mut self) {
        tokio::select! {
            _ = self.handle.wait() => {}
            _ = super::stop::fired(&mut self.hard_stop) => {
                // The engine answers with `finished` (cancelled).
                self.handle.cancel();
                self.handle.wait().await;
            }
        }
    }
}

impl types::Host for HostState {}

impl HostState {
    /// The memory limit, when the guest asked for more than it.
    pub fn memory_refused(&self) -> Option<usize> {
        self.limits.refused().then(|| self.limits.limit())
    }
}

impl tokenizer::Host for HostState {
    async fn encode(&mut self, text: String) -> Result<std::result::Result<Vec<u32>, String>> {
        Ok(match self.shared.tokenizer.as_ref() {
            Some(t) => t.encode(&text).map_err(|e| format!("{e:#}")),
            None => Err(no_tokenizer(&self.shared.model_id)),
        })
    }

    async fn decode(
        &mut self,
        ids: Vec<u32>,
        skip_special_tokens: bool,
    ) -> Result<std::result::Result<String, String>> {
        Ok(match self.shared.tokenizer.as_ref() {
            Some(t) => t
                .decode(&ids, skip_special_tokens)
                .map_err(|e| format!("{e:#}")),
            None => Err(no_tokenizer(&self.shared.model_id)),
        })
    }

    async fn token_to_id(&mut self, token: String) -> Result<Option<u32>> {
        Ok(self
            .shared
            .tokenizer
            .as_ref()
            .and_then(|t| t.token_id(&token)))
    }

    async fn id_to_token(&mut self, id: u32) -> Result<Option<String>> {
        Ok(self
            .shared
            .tokenizer
            .as_ref()
            .and_then(|t| t.id_to_token(id)))
    }

    async fn is_special(&mut self, id: u32) -> Result<bool> {
        Ok(self
            .shared
            .tokenizer
            .as_ref()
            .is_some_and(|t| t.is_special(id)))
    }
}

fn no_tokenizer(model: &str) -> String {
    format!("model {model} has no tokenizer; use token ids")
}

impl inference::Host for HostState {
    async fn model_info(&mut self) -> Result<types::ModelInfo> {
        Ok(self.shared.model_info.clone())
    }

    /// `@since(version = 0.1.3)`; older guests do not import it.
    async fn serving_config(&mut self) -> Result<inference::ServingConfiguration> {
        Ok(self.shared.serving.clone())
    }

    async fn generate(
        &mut self,
        request: types::GenerateRequest,
    ) -> Result<std::result::Result<Resource<GenerationResource>, types::GenerateError>> {
        self.submit(request, None).await
    }

    /// `@since(version = 0.1.4)`.
    async fn generate_constrained(
        &mut self,
        request: types::GenerateRequest,
        constraint: types::Constraint,
    ) -> Result<std::result::Result<Resource<GenerationResource>, types::GenerateError>> {
        let shared = &self.shared;
        match shared
            .constraints
            .compile(constraint, shared.tokenizer.as_ref(), &shared.model_info)
        {
            Ok(c) => self.submit(request, Some(c)).await,
            Err(e) => Ok(Err(types::GenerateError::InvalidRequest(format!(
                "invalid constraint: {e}"
            )))),
        }
    }
}

impl HostState {
    async fn submit(
        &mut self,
        request: types::GenerateRequest,
        constraint: Option<Compiled>,
    ) -> Result<std::result::Result<Resource<GenerationResource>, types::GenerateError>> {
        let types::GenerateRequest {
            prompt,
            max_tokens,
            stop_token_ids,
            ignore_eos,
            sampling: s,
            cache_salt,
            snapshot_points,
        } = request;
        let req = GenerateRequest {
            prompt,
            max_tokens: max_tokens as usize,
            stop_token_ids,
            ignore_eos,
            sampling: SamplingParams {
                temperature: s.temperature,
                top_p: s.top_p,
                top_k: s.top_k as usize,
                min_p: s.min_p,
                seed: s.seed,
                repetition_penalty: s.repetition_penalty,
                presence_penalty: s.presence_penalty,
                frequency_penalty: s.frequency_penalty,
                logit_bias: s.logit_bias,
                logprobs: s.logprobs.map(|k| k as usize),
            },
        };
        // Tenants never share cached prefixes: the admitted caller is part of the salt.
        let cache_salt = match (&self.caller, cache_salt) {
            (Some(c), Some(s)) => Some(format!("{c}\u{0}{s}")),
            (Some(c), None) => Some(c.clone()),
            (None, s) => s,
        };
        let opts = SubmitOptions {
            cache_salt,
            snapshot_points: snapshot_points.into_iter().map(|p| p as usize).collect(),
            detokenize: true,
            constraint,
        };
        match self.shared.service.submit(req, opts).await {
            Ok(handle) => {
                let hard_stop = self.shared.hard_stop.subscribe();
                if *hard_stop.borrow() {
                    handle.cancel();
                }
                Ok(Ok(self
                    .table
                    .push(GenerationResource { handle, hard_stop })?))
            }
            Err(e) => Ok(Err(convert_submit_error(e))),
        }
    }
}

fn convert_submit_error(e: SubmitError) -> types::GenerateError {
    use types::GenerateError as G;
    match e {
        SubmitError::QueueFull { retry_after_s } => G::QueueFull(retry_after_s),
        SubmitError::QueueTimeout => G::QueueTimeout,
        SubmitError::ShuttingDown => G::ShuttingDown,
        SubmitError::ContextLengthExceeded(m) => G::ContextLengthExceeded(m),
        SubmitError::InvalidRequest(m) => G::InvalidRequest(m),
        SubmitError::Internal(m) => G::Internal(m),
    }
}

impl inference::HostGeneration for HostState {
    async fn subscribe(
        &mut self,
        this: Resource<GenerationResource>,
    ) -> Result<Resource<DynPollable>> {
        wasmtime_wasi::p2::subscribe(&mut self.table, this)
    }

    async fn next(&mut self, this: Resource<GenerationResource>) -> Result<Vec<types::Event>> {
        let g = self.table.get_mut(&this)?;
        Ok(g.handle.try_next().into_iter().map(convert_event).collect())
    }

    /// `@since(version = 0.1.2)`: the engine's counts so far (a guest built
    /// against 0.1.1 never imports it and still links: wasmtime matches its
    /// `@0.1.1` imports to these `@0.1.2` definitions).
    async fn usage(&mut self, this: Resource<GenerationResource>) -> Result<types::Usage> {
        let g = self.table.get(&this)?;
        Ok(convert_usage(g.handle.usage()))
    }

    async fn drop(&mut self, this: Resource<GenerationResource>) -> Result<()> {
        // Dropping the handle cancels the request.
        self.table.delete(this)?;
        Ok(())
    }
}

fn convert_logprob(s: Sampled) -> types::TokenLogprob {
    types::TokenLogprob {
        token: s.token,
        logprob: s.logprob,
        top: s.top,
    }
}

fn convert_usage(u: Usage) -> types::Usage {
    types::Usage {
        prompt_tokens: u.prompt_tokens,
        completion_tokens: u.completion_tokens,
        cached_tokens: u.cached_tokens,
    }
}

fn convert_event(e: Event) -> types::Event {
    match e {
        Event::Token { id, text, logprob } => types::Event::Token(types::TokenEvent {
            id,
            text,
            logprob: logprob.map(convert_logprob),
        }),
        Event::Finished {
            reason,
            usage,
            stop_token,
            trailing_text,
        } => types::Event::Finished(types::Finish {
            reason: match reason {
                FinishReason::Stop => types::FinishReason::Stop,
                FinishReason::Length => types::FinishReason::Length,
                FinishReason::Cancelled => types::FinishReason::Cancelled,
            },
            usage: convert_usage(usage),
            stop_token,
            trailing_text,
        }),
        Event::Failed(m) => types::Event::Failed(m),
    }
}
