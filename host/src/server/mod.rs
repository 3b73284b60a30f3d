//! The HTTP front end: hyper 1 over TCP (TCP_NODELAY). `/health`, `/ready`,
//! `/metrics` and `POST /admin/reload` are answered natively; every other
//! request goes through the policy guest (when one is configured) and then a
//! fresh instance of the API guest mounted at the longest matching path
//! prefix (`wasi:http/incoming-handler`), whose response streams back.
//! The body is read by the host first ([`body`]), and connections are
//! bounded ([`conn`]): see docs/SECURITY.md for the limits.

mod body;
pub mod conn;
mod guest;
pub mod keys;
pub mod metrics;

use crate::runtime::Runtime;
use bytes::Bytes;
use http::{Request, Response, StatusCode, header};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use metrics::HostMetrics;
use serde_json::json;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};
use tokio::net::TcpListener;
use tokio::sync::{Notify, watch};

pub type Body = UnsyncBoxBody<Bytes, wasmtime_wasi_http::Error>;

#[derive(Clone, Debug)]
pub struct ServerConfig {
    /// Wall-clock limit for one request, response body included.
    pub request_timeout: Duration,
    /// The configured API keys (`secret` or `id:secret`): `POST /admin/reload`
    /// needs one as a bearer token.
    pub admin_keys: Vec<String>,
    /// The server listens on a loopback address only: without API keys,
    /// `POST /admin/reload` is allowed (from anyone who can connect).
    pub loopback: bool,
    pub limits: Limits,
}

/// What one client can hold (docs/SECURITY.md).
#[derive(Clone, Debug)]
pub struct Limits {
    /// Largest request body (413 beyond).
    pub max_body: usize,
    /// Time a client has to send a request's head, and then its body.
    pub body_timeout: Duration,
    /// Requests whose body is still arriving, in all (503 beyond).
    pub max_pending_bodies: usize,
    /// ... and per client: API key, or address without keys (429 beyond).
    pub max_pending_per_client: usize,
    /// Connections served at once (503 `too_many_connections` beyond).
    pub max_connections: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_body: 32 << 20,
            body_timeout: Duration::from_secs(30),
            max_pending_bodies: 256,
            max_pending_per_client: 32,
            max_connections: 1024,
        }
    }
}

/// `n` bytes as `32 MiB`, `512 KiB` or `100 bytes`.
pub fn human_size(n: usize) -> String {
    match n {
        n if n >= 1 << 20 && n % (1 << 20) == 0 => format!("{} MiB", n >> 20),
        n if n >= 1 << 10 && n % (1 << 10) == 0 => format!("{} KiB", n >> 10),
        n => format!("{n} bytes"),
    }
}

/// Lifecycle of the server, as `/ready` and `/health` report it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Phase {
    Loading = 0,
    Ready = 1,
    Draining = 2,
    Failed = 3,
}

impl Phase {
    fn name(self) -> &'static str {
        match self {
            Phase::Loading => "loading",
            Phase::Ready => "ready",
            Phase::Draining => "draining",
            Phase::Failed => "failed",
        }
    }
}

pub struct AppState {
    pub cfg: ServerConfig,
    runtime: OnceLock<Arc<Runtime>>,
    phase: AtomicU8,
    /// API requests in flight (until their response body ends).
    active: AtomicUsize,
    idle: Notify,
    pub metrics: HostMetrics,
    started: Instant,
    /// Model id, known before the model has loaded.
    pub model_label: String,
    /// Requests whose body is still arriving.
    pending: body::Pending,
    /// Set when a graceful stop begins: pending body reads give up.
    drain: watch::Sender<bool>,
    connections: conn::Connections,
}

impl AppState {
    pub fn new(cfg: ServerConfig, model_label: String) -> Arc<Self> {
        Arc::new(AppState {
            connections: conn::Connections::new(cfg.limits.max_connections),
            pending: body::Pending::default(),
            drain: watch::Sender::new(false),
            cfg,
            runtime: OnceLock::new(),
            phase: AtomicU8::new(Phase::Loading as u8),
            active: AtomicUsize::new(0),
            idle: Notify::new(),
            metrics: HostMetrics::default(),
            started: Instant::now(),
            model_label,
        })
    }

    pub fn phase(&self) -> Phase {
        match self.phase.load(Ordering::SeqCst) {
            0 => Phase::Loading,
            1 => Phase::Ready,
            2 => Phase::Draining,
            _ => Phase::Failed,
        }
    }

    pub fn set_ready(&self, runtime: Arc<Runtime>) {
        let _ = self.runtime.set(runtime);
        self.phase.store(Phase::Ready as u8, Ordering::SeqCst);
    }

    pub fn set_failed(&self) {
        self.phase.store(Phase::Failed as u8, Ordering::SeqCst);
    }

    pub fn runtime(&self) -> Option<&Arc<Runtime>> {
        self.runtime.get()
    }

    /// Stops admitting requests (503 `service_shutting_down`); running and
    /// queued ones finish.
    pub fn begin_drain(&self) {
        self.phase.store(Phase::Draining as u8, Ordering::SeqCst);
        self.drain.send_replace(true);
        if let Some(rt) = self.runtime() {
            rt.shared.service.begin_drain();
        }
    }

    pub fn in_flight(&self) -> usize {
        self.active.load(Ordering::SeqCst)
    }

    /// Becomes true when a graceful stop begins.
    fn drain_signal(&self) -> watch::Receiver<bool> {
        self.drain.subscribe()
    }

    /// Resolves once no API request is in flight.
    pub async fn requests_done(&self) {
        loop {
            let notified = self.idle.notified();
            let mut notified = std::pin::pin!(notified);
            notified.as_mut().enable();
            if self.in_flight() == 0 {
                break;
            }
            notified.await;
        }
    }

    /// Resolves once no API request is in flight and the engine is idle.
    pub async fn drained(&self) {
        self.requests_done().await;
        if let Some(rt) = self.runtime() {
            rt.shared.service.drained().await;
        }
    }

    fn enter(self: &Arc<Self>) -> ActiveGuard {
        self.active.fetch_add(1, Ordering::SeqCst);
        ActiveGuard(self.clone())
    }
}

/// Counts an API request as in flight while alive.
pub struct ActiveGuard(Arc<AppState>);

impl Drop for ActiveGuard {
    fn drop(&mut self) {
        if self.0.active.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.0.idle.notify_waiters();
        }
    }
}

/// Accepts connections until `shutdown` resolves.
pub async fn serve(
    listener: TcpListener,
    state: Arc<AppState>,
    shutdown: impl Future<Output = ()>,
) {
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let (stream, remote) = tokio::select! {
            r = listener.accept() => match r {
                Ok(x) => x,
                Err(e) => {
                    eprintln!("qwasi: accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = &mut shutdown => return,
        };
        let permit = match state.connections.admit() {
            conn::Admission::Serve(p) => p,
            conn::Admission::Refuse(p) => {
                tokio::spawn(conn::refuse(stream, state.cfg.limits.max_connections, p));
                continue;
            }
            conn::Admission::Drop => continue,
        };
        let _ = stream.set_nodelay(true);
        let state = state.clone();
        tokio::spawn(async move {
            let _permit = permit;
            let io = TokioIo::new(stream);
            let header_timeout = state.cfg.limits.body_timeout;
            let svc = service_fn(move |req| {
                let state = state.clone();
                async move { Ok::<_, Infallible>(route(state, req, remote).await) }
            });
            // Half-closed clients (shutdown(SHUT_WR) after the request)
            // still get their response; a client that is really gone is
            // found by the next write (a streamed response's next chunk).
            let _ = hyper::server::conn::http1::Builder::new()
                .keep_alive(true)
                .half_close(true)
                .timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(header_timeout)
                .serve_connection(io, svc)
                .await;
        });
    }
}

/// The path of the native reload endpoint.
pub const ADMIN_RELOAD: &str = "/admin/reload";

async fn route(state: Arc<AppState>, req: Request<Incoming>, remote: SocketAddr) -> Response<Body> {
    let native = req.method() == http::Method::GET || req.method() == http::Method::HEAD;
    match (native, req.uri().path()) {
        (true, "/health") => health(&state),
        (true, "/ready") => ready(&state),
        (true, "/metrics") => metrics_response(&state),
        (_, ADMIN_RELOAD) => admin_reload(&state, &req).await,
        _ => {
            let resp = api(&state, req, remote).await;
            if let Some(rt) = state.runtime() {
                rt.shared.service.record_http(resp.status().as_u16());
            }
            resp
        }
    }
}

async fn api(state: &Arc<AppState>, req: Request<Incoming>, remote: SocketAddr) -> Response<Body> {
    match state.phase() {
        Phase::Ready => {}
        Phase::Loading => {
            return error_response(
                StatusCode::SERVICE_UNAVAILABLE,
                "the model is still loading; retry shortly",
                "model_loading",
                Some(1),
            );
        }
        Phase::Draining => return shutting_down(),
        Phase::Failed => {
            return error_response(
                StatusCode::SERVICE_UNAVAILABLE,
                "the server failed to start",
                "service_unavailable",
                None,
            );
        }
    }
    let runtime = state.runtime().expect("ready implies a runtime").clone();
    let active = state.enter();
    guest::handle(state, runtime, req, remote, active).await
}

/// `POST /admin/reload`: recompiles and swaps every file-backed guest whose
/// file changed; answers each guest's outcome.
async fn admin_reload(state: &Arc<AppState>, req: &Request<Incoming>) -> Response<Body> {
    if req.method() != http::Method::POST {
        let mut r = error_response(
            StatusCode::METHOD_NOT_ALLOWED,
            &format!("{} {ADMIN_RELOAD} is not allowed; use POST", req.method()),
            "method_not_allowed",
            None,
        );
        r.headers_mut()
            .insert(header::ALLOW, header::HeaderValue::from_static("POST"));
        return r;
    }
    if let Some(r) = admin_denial(&state.cfg, req.headers()) {
        return r;
    }
    let Some(rt) = state.runtime().cloned() else {
        return error_response(
            StatusCode::SERVICE_UNAVAILABLE,
            "the server is still loading; retry shortly",
            "model_loading",
            Some(1),
        );
    };
    let outcomes = match tokio::task::spawn_blocking(move || rt.reload_all(ADMIN_RELOAD)).await {
        Ok(o) => o,
        Err(e) => {
            return error_response(
                StatusCode::INTERNAL_SERVER_ERROR,
                &format!("the reload failed: {e}"),
                "internal_error",
                None,
            );
        }
    };
    let failed: Vec<String> = outcomes
        .iter()
        .filter_map(|o| {
            o.error
                .as_ref()
                .map(|e| format!("reloading {} failed: {e}", o.guest))
        })
        .collect();
    if failed.is_empty() {
        json_response(
            StatusCode::OK,
            json!({"object": "reload", "ok": true, "guests": outcomes}),
        )
    } else {
        json_response(
            StatusCode::UNPROCESSABLE_ENTITY,
            json!({
                "object": "reload",
                "ok": false,
                "guests": outcomes,
                "error": {
                    "message": failed.join("; "),
                    "type": "invalid_request_error",
                    "param": null,
                    "code": "guest_reload_failed",
                },
            }),
        )
    }
}

/// Who may call the admin endpoints: a bearer token equal to a configured API
/// key; without keys, anyone on a loopback-only server. The refusal, if any.
fn admin_denial(cfg: &ServerConfig, headers: &http::HeaderMap) -> Option<Response<Body>> {
    let secrets: Vec<&str> = cfg
        .admin_keys
        .iter()
        .map(|k| keys::key_secret(k))
        .filter(|k| !k.is_empty())
        .collect();
    if secrets.is_empty() {
        if cfg.loopback {
            return None;
        }
        return Some(error_response(
            StatusCode::FORBIDDEN,
            "the admin endpoints are disabled: the server listens on a non-loopback address \
             without an API key (start it with --api-key to use them)",
            "admin_disabled",
            None,
        ));
    }
    let token = headers
        .get_all(header::AUTHORIZATION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .find_map(|v| {
            let (scheme, token) = v.trim().split_once(char::is_whitespace)?;
            scheme
                .eq_ignore_ascii_case("bearer")
                .then(|| token.trim().to_string())
        });
    match token {
        Some(t)
            if secrets
                .iter()
                .any(|k| keys::same_secret(k.as_bytes(), t.as_bytes())) =>
        {
            None
        }
        Some(_) => Some(error_response(
            StatusCode::UNAUTHORIZED,
            "Incorrect API key provided for the admin endpoint.",
            "invalid_api_key",
            None,
        )),
        None => Some(error_response(
            StatusCode::UNAUTHORIZED,
            "The admin endpoint needs an API key: send Authorization: Bearer YOUR_KEY.",
            "invalid_api_key",
            None,
        )),
    }
}

fn shutting_down() -> Response<Body> {
    error_response(
        StatusCode::SERVICE_UNAVAILABLE,
        "the server is shutting down and accepts no new requests",
        "service_shutting_down",
        None,
    )
}

fn json_response(status: StatusCode, v: serde_json::Value) -> Response<Body> {
    let mut r = Response::new(full(format!("{v}\n")));
    *r.status_mut() = status;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("application/json"),
    );
    r
}

pub fn full(s: impl Into<Bytes>) -> Body {
    Full::new(s.into())
        .map_err(|never| match never {})
        .boxed_unsync()
}

/// An error object in the shape both bundled APIs read: OpenAI's
/// `{"error": {"message", "type", "param", "code"}}` plus Anthropic's
/// top-level `"type": "error"` (the host answers denials, queue and loading
/// errors itself, before any API guest runs).
pub fn error_response(
    status: StatusCode,
    message: &str,
    code: &str,
    retry_after: Option<u32>,
) -> Response<Body> {
    let kind = match status.as_u16() {
        401 | 403 => "authentication_error",
        429 => "rate_limit_error",
        s if s >= 500 => "server_error",
        _ => "invalid_request_error",
    };
    let mut r = json_response(
        status,
        json!({"type": "error", "error": {"message": message, "type": kind, "param": null, "code": code}}),
    );
    if let Some(s) = retry_after {
        r.headers_mut()
            .insert(header::RETRY_AFTER, header::HeaderValue::from(s));
    }
    r
}

fn queue_json(state: &AppState) -> serde_json::Value {
    match state.runtime() {
        Some(rt) => {
            let s = rt.shared.service.stats();
            json!({
                "queued": s.queued,
                "running": s.running,
                "capacity": s.capacity,
                "draining": s.draining,
                "completed": s.completed,
                "cancelled": s.cancelled,
                "failed": s.failed,
                "rejected": s.rejected,
            })
        }
        None => serde_json::Value::Null,
    }
}

fn health(state: &AppState) -> Response<Body> {
    json_response(
        StatusCode::OK,
        json!({
            "status": "ok",
            "state": state.phase().name(),
            "model": state.model_label,
            "pid": std::process::id(),
            "version": env!("CARGO_PKG_VERSION"),
            "uptime_s": state.started.elapsed().as_secs_f64(),
            "requests_in_flight": state.in_flight(),
            "connections": state.connections.open(),
            "pending_bodies": state.pending.total(),
            "queue": queue_json(state),
        }),
    )
}

fn ready(state: &AppState) -> Response<Body> {
    let phase = state.phase();
    let status = if phase == Phase::Ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    json_response(
        status,
        json!({"ready": phase == Phase::Ready, "state": phase.name(), "model": state.model_label}),
    )
}

fn metrics_response(state: &AppState) -> Response<Body> {
    let mut text = match state.runtime() {
        Some(rt) => rt.shared.service.metrics_text(),
        None => String::new(),
    };
    state.metrics.render(&mut text, state);
    let mut r = Response::new(full(text));
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
    );
    r
}

#[cfg(test)]
mod tests {
    use super::{ServerConfig, admin_denial};
    use std::time::Duration;

    #[test]
    fn admin_keys() {
        let cfg = |keys: &[&str], loopback| ServerConfig {
            request_timeout: Duration::from_secs(1),
            admin_keys: keys.iter().map(|k| k.to_string()).collect(),
            loopback,
            limits: Default::default(),
        };
        let headers = |auth: &str| {
            let mut h = http::HeaderMap::new();
            h.insert(http::header::AUTHORIZATION, auth.parse().unwrap());
            h
        };
        let status =
            |c: &ServerConfig, h: &http::HeaderMap| admin_denial(c, h).map(|r| r.status().as_u16());
        assert_eq!(status(&cfg(&[], true), &http::HeaderMap::new()), None);
        assert_eq!(status(&cfg(&[], false), &http::HeaderMap::new()), Some(403));
        let keyed = cfg(&["ops:sk-1", "sk-2"], false);
        assert_eq!(status(&keyed, &http::HeaderMap::new()), Some(401));
        assert_eq!(status(&keyed, &headers("Bearer sk-3")), Some(401));
        assert_eq!(status(&keyed, &headers("Bearer ops:sk-1")), Some(401));
        assert_eq!(status(&keyed, &headers("Basic sk-1")), Some(401));
        assert_eq!(status(&keyed, &headers("Bearer sk-1")), None);
        assert_eq!(status(&keyed, &headers("bearer  sk-2 ")), None);
    }
}
