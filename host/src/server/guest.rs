//! One API request through the guests: policy check (on the head alone),
//! the body read by the host ([`super::body`]), then a fresh instance of
//! the API guest mounted at the longest matching path prefix, running
//! `wasi:http/incoming-handler.handle` in its own task. Each request holds the
//! guest version it started with, so a reload never affects it.
//!
//! The task is aborted (and its store, with any `generation` resource,
//! dropped so the engine cancels at once) when the client goes away: hyper
//! drops the request future before the response, or the response body after.

use super::metrics::HostMetrics;
use super::{ActiveGuard, AppState, Body, error_response};
use crate::runtime::Runtime;
use crate::runtime::limits::CPU_LIMIT_MESSAGE;
use crate::runtime::policy::{Decision, RequestMeta};
use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::BodyExt;
use hyper::body::{Body as _, Frame, Incoming, SizeHint};
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use tokio::task::AbortHandle;
use tokio::time::Instant;
use wasmtime_wasi_http::WasiHttpView;
use wasmtime_wasi_http::p2::bindings::http::types::Scheme;
use wasmtime_wasi_http::p2::body::HyperOutgoingBody;

/// Aborts the guest task when dropped.
struct AbortOnDrop(AbortHandle);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

fn guest_error(message: &str) -> Response<Body> {
    error_response(
        StatusCode::INTERNAL_SERVER_ERROR,
        message,
        "guest_error",
        None,
    )
}

fn timeout_error() -> Response<Body> {
    error_response(
        StatusCode::GATEWAY_TIMEOUT,
        "the request took longer than the server's request timeout",
        "request_timeout",
        None,
    )
}

/// The first line of the innermost cause: "wasm trap: ..." or our own CPU-limit message.
fn describe(e: wasmtime::Error) -> String {
    let e = anyhow::Error::from(e);
    let root = e.root_cause().to_string();
    root.lines().next().unwrap_or("guest failure").to_string()
}

pub async fn handle(
    state: &Arc<AppState>,
    rt: Arc<Runtime>,
    req: Request<Incoming>,
    remote: SocketAddr,
    active: ActiveGuard,
) -> Response<Body> {
    let deadline = Instant::now() + state.cfg.request_timeout;
    let method = req.method().to_string();
    let path = req
        .uri()
        .path_and_query()
        .map(|p| p.to_string())
        .unwrap_or_else(|| "/".into());

    // 1. Admission.
    let caller = match rt.policy().map(|slot| slot.current()) {
        None => None,
        Some(policy_version) => {
            let pre = policy_version.policy();
            let meta = RequestMeta {
                method: method.clone(),
                path: path.clone(),
                headers: req
                    .headers()
                    .iter()
                    .map(|(k, v)| {
                        (
                            k.as_str().to_string(),
                            String::from_utf8_lossy(v.as_bytes()).into_owned(),
                        )
                    })
                    .collect(),
                remote_addr: remote.to_string(),
            };
            let _slot = rt.policy_slots().acquire().await;
            let mut store = rt.policy_store();
            let check = async {
                let policy = pre.instantiate_async(&mut store).await?;
                policy
                    .qwasi_inference_admission()
                    .call_check(&mut store, &meta)
                    .await
            };
            match tokio::time::timeout_at(deadline, check).await {
                Ok(Ok(Decision::Allow(caller))) => caller,
                Ok(Ok(Decision::Deny(d))) => {
                    HostMetrics::inc(&state.metrics.policy_denials);
                    let status = StatusCode::from_u16(d.status).unwrap_or(StatusCode::FORBIDDEN);
                    return error_response(status, &d.message, &d.code, d.retry_after);
                }
                Ok(Err(e)) => {
                    HostMetrics::inc(&state.metrics.policy_errors);
                    let why = describe(e);
                    eprintln!("qwasi: {method} {path}: the policy guest failed: {why}");
                    return guest_error(&format!("the policy guest failed: {why}"));
                }
                Err(_) => {
                    HostMetrics::inc(&state.metrics.request_timeouts);
                    return timeout_error();
                }
            }
        }
    };

    // 2. The API guest mounted at the longest matching prefix.
    let Some(guest_version) = rt.route(req.uri().path()).map(|slot| slot.current()) else {
        return error_response(
            StatusCode::NOT_FOUND,
            &format!(
                "Invalid URL ({method} {}): no API is mounted at this path",
                req.uri().path()
            ),
            "not_found",
            None,
        );
    };
    // 3. The whole body, before any instance exists.
    let client = match &caller {
        Some(id) => format!("key:{id}"),
        None => format!("addr:{}", remote.ip()),
    };
    let req = match super::body::buffer(state, req, &client).await {
        Ok(r) => r,
        Err(resp) => return resp,
    };

    // 4. The API guest, in its own task.
    let slot = match tokio::time::timeout_at(deadline, rt.api_slots().acquire()).await {
        Ok(p) => p,
        Err(_) => {
            HostMetrics::inc(&state.metrics.request_timeouts);
            return timeout_error();
        }
    };
    let body_len = req.body().size_hint().exact().unwrap_or(0);
    let mut store = rt.api_store(caller);
    let (tx, rx) = tokio::sync::oneshot::channel();
    let resources = (|| {
        let mut http = store.data_mut().http();
        let r = http.new_incoming_request(Scheme::Http, req)?;
        let o = http.new_response_outparam(tx)?;
        Ok::<_, wasmtime::Error>((r, o))
    })();
    let (req_res, out) = match resources {
        Ok(x) => x,
        Err(e) => {
            eprintln!("qwasi: {method} {path}: malformed request: {}", describe(e));
            return error_response(
                StatusCode::BAD_REQUEST,
                "malformed request: the request head has no usable authority (Host header)",
                "invalid_request_error",
                None,
            );
        }
    };
    let task_state = state.clone();
    let task = tokio::spawn(async move {
        let run = async {
            let t0 = std::time::Instant::now();
            let proxy = guest_version.api().instantiate_async(&mut store).await?;
            let m = &task_state.metrics;
            HostMetrics::inc(&m.guest_instances);
            m.guest_instantiate_us.fetch_add(
                t0.elapsed().as_micros() as u64,
                std::sync::atomic::Ordering::Relaxed,
            );
            proxy
                .wasi_http_incoming_handler()
                .call_handle(&mut store, req_res, out)
                .await
        };
        let r = tokio::time::timeout_at(deadline, run).await;
        let memory_refused = store.data().memory_refused();
        // Drop the store (and any generation) as soon as the guest is done.
        drop(store);
        drop(slot);
        Outcome {
            r,
            memory_refused,
            body_len,
        }
    });
    let abort = AbortOnDrop(task.abort_handle());
    let mut task = Some(task);

    let response = rx.await;
    match response {
        Ok(Ok(resp)) => {
            // Watch the task in the background so failures after the headers are logged.
            if let Some(task) = task.take() {
                let st = state.clone();
                let (m, p) = (method.clone(), path.clone());
                tokio::spawn(async move {
                    if let Ok(r) = task.await {
                        report(&st, &m, &p, r);
                    }
                });
            }
            let (parts, body) = resp.into_parts();
            // hyper stops polling a body once Content-Length bytes are out.
            let remaining = parts
                .headers
                .get(http::header::CONTENT_LENGTH)
                .and_then(|v| v.to_str().ok()?.trim().parse::<u64>().ok())
                .or(body.size_hint().exact());
            let body = GuestBody {
                remaining,
                inner: body,
                finished: remaining == Some(0),
                _abort: abort,
                _active: active,
                state: state.clone(),
            };
            Response::from_parts(parts, body.boxed_unsync())
        }
        Ok(Err(code)) => {
            eprintln!("qwasi: {method} {path}: the API guest answered with error {code:?}");
            guest_error(&format!("the API guest failed: {code:?}"))
        }
        Err(_) => {
            // The guest returned or failed without setting a response.
            let outcome = task.take().expect("task").await;
            match outcome {
                Ok(r) => match report(state, &method, &path, r) {
                    Some(resp) => resp,
                    None => guest_error("the API guest returned without sending a response"),
                },
                Err(e) => guest_error(&format!("the API guest task failed: {e}")),
            }
        }
    }
}

/// How a guest task ended.
struct Outcome {
    r: Result<wasmtime::Result<()>, tokio::time::error::Elapsed>,
    /// The guest's memory limit, when it asked for more.
    memory_refused: Option<usize>,
    /// Size of the request body.
    body_len: u64,
}

/// Logs and counts a finished guest task; the error response for it, if any.
fn report(state: &AppState, method: &str, path: &str, o: Outcome) -> Option<Response<Body>> {
    match o.r {
        Ok(Ok(())) => None,
        Ok(Err(e)) => {
            let why = describe(e);
            HostMetrics::inc(&state.metrics.guest_traps);
            if why.contains(CPU_LIMIT_MESSAGE) {
                HostMetrics::inc(&state.metrics.guest_cpu_exceeded);
            }
            eprintln!("qwasi: {method} {path}: the API guest failed: {why}");
            match o.memory_refused {
                // A request too big for the guest's memory, not a crash.
                Some(limit) if o.body_len > 0 => {
                    return Some(error_response(
                        StatusCode::PAYLOAD_TOO_LARGE,
                        &format!(
                            "the request needs more memory than an API guest may use ({}, --guest-memory); send a smaller request",
                            super::human_size(limit)
                        ),
                        "request_too_large",
                        None,
                    ));
                }
                Some(limit) => {
                    return Some(guest_error(&format!(
                        "the API guest ran out of memory ({}, --guest-memory): {why}",
                        super::human_size(limit)
                    )));
                }
                None => {}
            }
            Some(guest_error(&format!("the API guest failed: {why}")))
        }
        Err(_) => {
            HostMetrics::inc(&state.metrics.request_timeouts);
            eprintln!("qwasi: {method} {path}: request timeout");
            Some(timeout_error())
        }
    }
}

/// The guest's response body, holding the guest task (aborted on drop: the
/// client went away) and the in-flight count.
struct GuestBody {
    inner: HyperOutgoingBody,
    /// Bytes still to send of a body of known length: hyper stops polling
    /// once it has sent them, without waiting for the end of the stream.
    remaining: Option<u64>,
    finished: bool,
    _abort: AbortOnDrop,
    _active: ActiveGuard,
    state: Arc<AppState>,
}

impl hyper::body::Body for GuestBody {
    type Data = Bytes;
    type Error = wasmtime_wasi_http::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let r = Pin::new(&mut self.inner).poll_frame(cx);
        match &r {
            Poll::Ready(None) => self.finished = true,
            Poll::Ready(Some(Ok(frame))) => {
                if let (Some(rem), Some(data)) = (self.remaining.as_mut(), frame.data_ref()) {
                    *rem = rem.saturating_sub(data.len() as u64);
                    if *rem == 0 {
                        self.finished = true;
                    }
                }
            }
            _ => {}
        }
        r
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

impl Drop for GuestBody {
    fn drop(&mut self) {
        // Only a body dropped before its end is a disconnect.
        if !self.finished && !self.inner.is_end_stream() {
            HostMetrics::inc(&self.state.metrics.client_disconnects);
        }
    }
}
