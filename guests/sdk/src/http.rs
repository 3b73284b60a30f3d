//! The HTTP side of an API guest, as plain Rust: [`Request`] (method, path,
//! query, headers, a body read on demand with a size limit) and [`Output`]
//! (status + headers once, then body writes), with JSON helpers.

use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::error::ApiError;

/// The default body limit of [`Request::json`] (1 MiB).
pub const DEFAULT_BODY_LIMIT: usize = 1 << 20;

/// A source of request-body bytes (the wasi:http incoming body, or a buffer in tests).
pub trait BodyRead {
    /// Reads up to `max` bytes; `Ok(None)` at the end of the body.
    fn read_chunk(&mut self, max: usize) -> Result<Option<Vec<u8>>, String>;
}

impl BodyRead for std::io::Cursor<Vec<u8>> {
    fn read_chunk(&mut self, max: usize) -> Result<Option<Vec<u8>>, String> {
        use std::io::Read;
        let mut buf = vec![0; max.clamp(1, 1 << 16)];
        match self.read(&mut buf) {
            Ok(0) => Ok(None),
            Ok(n) => {
                buf.truncate(n);
                Ok(Some(buf))
            }
            Err(e) => Err(e.to_string()),
        }
    }
}

/// One incoming request.
pub struct Request {
    method: String,
    method_as_sent: String,
    path: String,
    query: Option<String>,
    headers: Vec<(String, String)>,
    body: Option<Box<dyn BodyRead>>,
    read: Option<Vec<u8>>,
}

impl std::fmt::Debug for Request {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Request")
            .field("method", &self.method)
            .field("path", &self.path)
            .field("query", &self.query)
            .field("headers", &self.headers)
            .finish_non_exhaustive()
    }
}

impl Request {
    /// `path_with_query` as received (`/a/b?x=1`); header names are kept as
    /// sent and compared case-insensitively.
    pub fn new(
        method: impl Into<String>,
        path_with_query: &str,
        headers: Vec<(String, String)>,
        body: Box<dyn BodyRead>,
    ) -> Self {
        let method = method.into();
        let pq = path_with_query.split('#').next().unwrap_or("");
        let (path, query) = match pq.split_once('?') {
            Some((p, q)) => (p.to_owned(), Some(q.to_owned())),
            None => (pq.to_owned(), None),
        };
        Request {
            method: method.to_ascii_uppercase(),
            method_as_sent: method,
            path: if path.is_empty() { "/".into() } else { path },
            query,
            headers,
            body: Some(body),
            read: None,
        }
    }

    /// A request with an in-memory body (tests, or guests that build requests).
    pub fn from_bytes(method: &str, path_with_query: &str, body: impl Into<Vec<u8>>) -> Self {
        Self::new(
            method,
            path_with_query,
            Vec::new(),
            Box::new(std::io::Cursor::new(body.into())),
        )
    }

    pub fn with_header(mut self, name: &str, value: &str) -> Self {
        self.headers.push((name.to_owned(), value.to_owned()));
        self
    }

    /// Upper-case method (`GET`, `POST`, ...).
    pub fn method(&self) -> &str {
        &self.method
    }

    /// The method exactly as received (HTTP methods are case-sensitive: a
    /// guest that wants `get` to be a method of its own, not `GET`).
    pub fn method_as_sent(&self) -> &str {
        &self.method_as_sent
    }

    /// The path without query or fragment.
    pub fn path(&self) -> &str {
        &self.path
    }

    /// The raw query string, if any.
    pub fn query_string(&self) -> Option<&str> {
        self.query.as_deref()
    }

    /// Query parameters, percent-decoded (`+` is a space), in order.
    pub fn query(&self) -> Vec<(String, String)> {
        parse_query(self.query.as_deref().unwrap_or(""))
    }

    /// The first query parameter named `name`.
    pub fn query_param(&self, name: &str) -> Option<String> {
        self.query()
            .into_iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v)
    }

    pub fn headers(&self) -> &[(String, String)] {
        &self.headers
    }

    /// The first header named `name` (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        header(&self.headers, name)
    }

    /// The token of `Authorization: Bearer <token>`.
    pub fn bearer_token(&self) -> Option<&str> {
        bearer_token(&self.headers)
    }

    /// `Err(405)` unless the method is `method`.
    pub fn require_method(&self, method: &str) -> Result<(), ApiError> {
        if self.method == method {
            Ok(())
        } else {
            Err(ApiError::method_not_allowed(
                &self.method,
                &self.path,
                method,
            ))
        }
    }

    /// The whole body, at most `limit` bytes (413 beyond). Read once; later
    /// calls return the same bytes.
    pub fn body(&mut self, limit: usize) -> Result<&[u8], ApiError> {
        if self.read.is_none() {
            // One allocation of the announced size: growing by doubling
            // would need up to twice a large body's size at once.
            let announced = self
                .header("content-length")
                .and_then(|v| v.trim().parse::<usize>().ok())
                .unwrap_or(0);
            let mut out = Vec::with_capacity(announced.min(limit.saturating_add(1)));
            if let Some(mut src) = self.body.take() {
                while let Some(chunk) = src.read_chunk(64 << 10).map_err(|e| {
                    ApiError::invalid(
                        "body_read_error",
                        format!("could not read the request body: {e}"),
                    )
                })? {
                    out.extend_from_slice(&chunk);
                    if out.len() > limit {
                        return Err(ApiError::too_large(limit));
                    }
                }
            }
            self.read = Some(out);
        }
        let body = self.read.as_deref().unwrap_or_default();
        if body.len() > limit {
            return Err(ApiError::too_large(limit));
        }
        Ok(body)
    }

    /// The body parsed as JSON into `T` (at most [`DEFAULT_BODY_LIMIT`] bytes);
    /// 400 `invalid_json` (OpenAI format) when it does not parse.
    pub fn json<T: DeserializeOwned>(&mut self) -> Result<T, ApiError> {
        self.json_limited(DEFAULT_BODY_LIMIT)
    }

    pub fn json_limited<T: DeserializeOwned>(&mut self, limit: usize) -> Result<T, ApiError> {
        parse_json(self.body(limit)?)
    }
}

/// Parses JSON into `T`; 400 `invalid_json` on failure (an empty body is
/// reported as such).
pub fn parse_json<T: DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Err(ApiError::invalid_json("the body is empty"));
    }
    serde_json::from_slice(body).map_err(ApiError::invalid_json)
}

/// Parses a JSON object (400 for anything else).
pub fn parse_object(body: &[u8]) -> Result<serde_json::Map<String, Value>, ApiError> {
    match parse_json::<Value>(body)? {
        Value::Object(o) => Ok(o),
        _ => Err(ApiError::invalid_json("the body must be a JSON object")),
    }
}

pub fn header<'a>(headers: &'a [(String, String)], name: &str) -> Option<&'a str> {
    headers
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case(name))
        .map(|(_, v)| v.as_str())
}

/// The token of the first `Authorization: Bearer <token>` header.
pub fn bearer_token(headers: &[(String, String)]) -> Option<&str> {
    headers
        .iter()
        .filter(|(k, _)| k.eq_ignore_ascii_case("authorization"))
        .find_map(|(_, v)| {
            let (scheme, token) = v.trim().split_once(char::is_whitespace)?;
            let token = token.trim();
            (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
        })
}

/// `a=1&b=x%20y` -> [("a","1"), ("b","x y")].
pub fn parse_query(q: &str) -> Vec<(String, String)> {
    q.split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            (percent_decode(k), percent_decode(v))
        })
        .collect()
}

/// Percent-decoding with `+` as a space (query strings); invalid escapes
/// are kept as is.
pub fn percent_decode(s: &str) -> String {
    decode(s, true)
}

/// Percent-decoding of a path segment: as [`percent_decode`], but `+` is
/// a plain `+`.
pub fn percent_decode_path(s: &str) -> String {
    decode(s, false)
}

fn decode(s: &str, plus_is_space: bool) -> String {
    let hex = |c: u8| (c as char).to_digit(16).map(|d| d as u8);
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'%' if i + 2 < b.len() => {
                if let (Some(h), Some(l)) = (hex(b[i + 1]), hex(b[i + 2])) {
                    out.push(h << 4 | l);
                    i += 3;
                    continue;
                }
                out.push(b'%');
            }
            b'+' if plus_is_space => out.push(b' '),
            c => out.push(c),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The client went away (or the response could not be sent).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Disconnected;

impl std::fmt::Display for Disconnected {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the client disconnected")
    }
}

impl std::error::Error for Disconnected {}

/// Where a response goes: `start` sends the status and headers (once), each
/// `write` sends (and flushes) a buffer. `Err` means the client is gone.
pub trait Output {
    fn start(&mut self, status: u16, headers: &[(&str, String)]) -> Result<(), Disconnected>;
    fn write(&mut self, data: &[u8]) -> Result<(), Disconnected>;
    /// Whether `start` has been called.
    fn started(&self) -> bool;
}

/// A complete response: status, headers, body.
pub fn send(
    out: &mut impl Output,
    status: u16,
    content_type: &str,
    extra_headers: &[(&str, String)],
    body: &[u8],
) -> Result<(), Disconnected> {
    let mut headers = vec![
        ("content-type", content_type.to_owned()),
        ("content-length", body.len().to_string()),
    ];
    headers.extend(extra_headers.iter().cloned());
    out.start(status, &headers)?;
    if body.is_empty() {
        return Ok(());
    }
    out.write(body)
}

/// `value` as an `application/json` response.
pub fn send_json(out: &mut impl Output, status: u16, value: &Value) -> Result<(), Disconnected> {
    let body = serde_json::to_vec(value).expect("JSON serialises");
    send(out, status, "application/json", &[], &body)
}

/// `value` as JSON with extra headers (e.g. `retry-after`).
pub fn send_json_with(
    out: &mut impl Output,
    status: u16,
    headers: &[(&str, String)],
    value: &Value,
) -> Result<(), Disconnected> {
    let body = serde_json::to_vec(value).expect("JSON serialises");
    send(out, status, "application/json", headers, &body)
}

/// An OpenAI-format error response (with `Retry-After` and `Allow` when set).
pub fn send_error(out: &mut impl Output, e: &ApiError) -> Result<(), Disconnected> {
    send_error_as(out, e, &e.to_json())
}

/// `e`'s status and headers with `body`, the error in an API's own shape.
pub fn send_error_as(
    out: &mut impl Output,
    e: &ApiError,
    body: &Value,
) -> Result<(), Disconnected> {
    let mut headers = Vec::new();
    if let Some(s) = e.retry_after {
        headers.push(("retry-after", s.to_string()));
    }
    if let Some(a) = e.allow() {
        headers.push(("allow", a.to_owned()));
    }
    let body = serde_json::to_vec(body).expect("JSON serialises");
    send(out, e.status, "application/json", &headers, &body)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::Recorder;
    use serde_json::json;

    #[test]
    fn request_parts() {
        let r = Request::from_bytes("post", "/api/x?a=1&b=x%20y+z&flag#frag", "")
            .with_header("Authorization", "Bearer  sk-1 ")
            .with_header("X-Thing", "v");
        assert_eq!(r.method(), "POST");
        assert_eq!(r.method_as_sent(), "post");
        assert_eq!(r.path(), "/api/x");
        assert_eq!(r.query_string(), Some("a=1&b=x%20y+z&flag"));
        assert_eq!(r.query_param("b").as_deref(), Some("x y z"));
        assert_eq!(r.query_param("flag").as_deref(), Some(""));
        assert_eq!(r.query_param("nope"), None);
        assert_eq!(r.header("x-thing"), Some("v"));
        assert_eq!(r.bearer_token(), Some("sk-1"));
        assert!(r.require_method("POST").is_ok());
        assert_eq!(r.require_method("GET").unwrap_err().status, 405);
        assert_eq!(r.require_method("GET").unwrap_err().allow(), Some("GET"));
        assert_eq!(Request::from_bytes("GET", "", "").path(), "/");
        assert_eq!(percent_decode("%zz%4"), "%zz%4");
        assert_eq!(percent_decode("%C3%A9"), "é");
        assert_eq!(percent_decode("a+b%2B"), "a b+");
        assert_eq!(
            percent_decode_path("Qwen%2FQwen3.6+x%zz"),
            "Qwen/Qwen3.6+x%zz"
        );
    }

    #[test]
    fn bearer() {
        let h = |v: &str| vec![("authorization".to_string(), v.to_string())];
        assert_eq!(bearer_token(&h("bearer abc")), Some("abc"));
        assert_eq!(bearer_token(&h("Basic abc")), None);
        assert_eq!(bearer_token(&h("Bearer ")), None);
        assert_eq!(bearer_token(&[]), None);
    }

    #[test]
    fn body_limit_and_json() {
        let mut r = Request::from_bytes("POST", "/", vec![b'x'; 100]);
        assert_eq!(r.body(99).unwrap_err().status, 413);
        let mut r = Request::from_bytes("POST", "/", vec![b' '; 100]);
        assert_eq!(r.body(100).unwrap().len(), 100);
        // read once, the same bytes again; a smaller limit still applies
        assert_eq!(r.body(1000).unwrap().len(), 100);
        assert_eq!(r.body(10).unwrap_err().status, 413);
        let e = r.json::<Value>().unwrap_err();
        assert_eq!(e.status, 400);
        assert_eq!(e.code.as_deref(), Some("invalid_json"));
        assert!(e.message.contains("empty"), "{}", e.message);

        let mut r = Request::from_bytes("POST", "/", r#"{"a": [1, 2]}"#);
        assert_eq!(r.json::<Value>().unwrap(), json!({"a": [1, 2]}));
        let mut r = Request::from_bytes("POST", "/", "{nope");
        let e = r.json::<Value>().unwrap_err();
        assert_eq!((e.status, e.kind.as_str()), (400, "invalid_request_error"));
        assert!(e.message.contains("key must be a string"), "{}", e.message);
        assert!(parse_object(b"[1]").is_err());
        assert!(parse_object(b"{}").unwrap().is_empty());
        #[derive(Debug, serde::Deserialize)]
        struct T {
            #[allow(dead_code)]
            n: u32,
        }
        assert_eq!(parse_json::<T>(br#"{"n": -1}"#).unwrap_err().status, 400);
    }

    #[test]
    fn responses() {
        let mut out = Recorder::default();
        send_json(&mut out, 201, &json!({"ok": true})).unwrap();
        assert_eq!(out.status, Some(201));
        assert_eq!(out.header("content-type"), Some("application/json"));
        assert_eq!(out.header("content-length"), Some("11"));
        assert_eq!(out.body_string(), r#"{"ok":true}"#);

        let mut out = Recorder::default();
        let e =
            ApiError::new(429, "rate_limit_error", Some("slow_down"), "wait").with_retry_after(5);
        send_error(&mut out, &e).unwrap();
        assert_eq!(out.status, Some(429));
        assert_eq!(out.header("retry-after"), Some("5"));
        let v: Value = serde_json::from_str(&out.body_string()).unwrap();
        assert_eq!(v["error"]["code"], "slow_down");
        assert_eq!(v["error"]["type"], "rate_limit_error");
    }
}
