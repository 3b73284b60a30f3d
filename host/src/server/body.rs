//! Reading a request's body in the host before any API-guest instance
//! exists, so a client that sends its body slowly (or never) holds a socket
//! and a pending-body slot, never a guest instance.
//!
//! Bounds: `--max-body-size` (413 from Content-Length at once, or as soon as
//! the bytes go over), `--body-timeout` (408), `--max-pending-bodies` in all
//! (503) and per client (429: one API key, or one address without keys),
//! and none once a graceful stop has begun (503, so a half-sent body never
//! holds the drain). Over HTTP/1.1 a connection carries one request at a
//! time, so each connection holds at most one pending body.

use super::{AppState, Body, error_response};
use bytes::Bytes;
use http::{Request, Response, StatusCode, header};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::{Arc, Mutex};

/// A request whose whole body is in memory, as the API guest reads it.
pub type BufferedBody =
    http_body_util::combinators::UnsyncBoxBody<Bytes, wasmtime_wasi_http::Error>;

/// Pending-body counts: in all and per client.
#[derive(Default)]
pub struct Pending {
    clients: Mutex<HashMap<String, usize>>,
    total: Mutex<usize>,
}

/// Holds one pending-body slot until dropped.
pub struct PendingGuard {
    state: Arc<AppState>,
    client: String,
}

impl Drop for PendingGuard {
    fn drop(&mut self) {
        let p = &self.state.pending;
        *lock(&p.total) -= 1;
        let mut clients = lock(&p.clients);
        if let Some(n) = clients.get_mut(&self.client) {
            *n -= 1;
            if *n == 0 {
                clients.remove(&self.client);
            }
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Pending {
    /// Requests whose body is still arriving.
    pub fn total(&self) -> usize {
        *lock(&self.total)
    }
}

/// Takes a pending-body slot for `client`, or the refusal.
fn enter(state: &Arc<AppState>, client: &str) -> Result<PendingGuard, Box<Response<Body>>> {
    let cfg = &state.cfg.limits;
    let p = &state.pending;
    let mut total = lock(&p.total);
    let mut clients = lock(&p.clients);
    let mine = clients.get(client).copied().unwrap_or(0);
    if mine >= cfg.max_pending_per_client {
        return Err(Box::new(error_response(
            StatusCode::TOO_MANY_REQUESTS,
            &format!(
                "too many requests from this client are still sending their body (at most {}, --max-pending-bodies-per-client)",
                cfg.max_pending_per_client
            ),
            "too_many_pending_requests",
            Some(1),
        )));
    }
    if *total >= cfg.max_pending_bodies {
        return Err(Box::new(error_response(
            StatusCode::SERVICE_UNAVAILABLE,
            &format!(
                "the server is receiving too many request bodies at once (at most {}, --max-pending-bodies); retry shortly",
                cfg.max_pending_bodies
            ),
            "server_busy",
            Some(1),
        )));
    }
    *total += 1;
    clients.insert(client.to_string(), mine + 1);
    Ok(PendingGuard {
        state: state.clone(),
        client: client.to_string(),
    })
}

fn too_large(limit: usize) -> Response<Body> {
    error_response(
        StatusCode::PAYLOAD_TOO_LARGE,
        &format!(
            "the request body is larger than the server's limit of {} (--max-body-size)",
            super::human_size(limit)
        ),
        "request_too_large",
        None,
    )
}

/// Reads the whole body of `req` within the limits; the request with its
/// body in memory, or the error response (already logged where useful).
pub async fn buffer(
    state: &Arc<AppState>,
    req: Request<Incoming>,
    client: &str,
) -> Result<Request<BufferedBody>, Response<Body>> {
    let limits = &state.cfg.limits;
    let declared = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    if declared.is_some_and(|n| n > limits.max_body as u64) {
        return Err(too_large(limits.max_body));
    }
    let (parts, incoming) = req.into_parts();
    let bytes = if declared == Some(0) || hyper::body::Body::is_end_stream(&incoming) {
        Bytes::new()
    } else {
        let _pending = enter(state, client).map_err(|r| *r)?;
        let mut drain = state.drain_signal();
        let read = Limited::new(incoming, limits.max_body).collect();
        tokio::select! {
            r = tokio::time::timeout(limits.body_timeout, read) => match r {
                Ok(Ok(collected)) => collected.to_bytes(),
                Ok(Err(e)) if e.downcast_ref::<http_body_util::LengthLimitError>().is_some() => {
                    return Err(too_large(limits.max_body));
                }
                Ok(Err(e)) => {
                    // Details (hyper's own words) go to the log only.
                    eprintln!("qwasi: {} {}: unreadable request body: {e}", parts.method, parts.uri.path());
                    return Err(error_response(
                        StatusCode::BAD_REQUEST,
                        "the request body could not be read: it is malformed or the client stopped sending it",
                        "invalid_body",
                        None,
                    ));
                }
                Err(_) => {
                    return Err(error_response(
                        StatusCode::REQUEST_TIMEOUT,
                        &format!(
                            "the request body did not arrive within {} s (--body-timeout)",
                            limits.body_timeout.as_secs_f64()
                        ),
                        "body_timeout",
                        None,
                    ));
                }
            },
            _ = drain.wait_for(|d| *d) => {
                return Err(super::shutting_down());
            }
        }
    };
    let body = Full::new(bytes)
        .map_err(|never: Infallible| match never {})
        .boxed_unsync();
    Ok(Request::from_parts(parts, body))
}
