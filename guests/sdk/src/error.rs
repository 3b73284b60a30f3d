//! OpenAI-style JSON errors: `{"error": {"message", "type", "param", "code"}}`
//! with an HTTP status (and `Retry-After` for 429/503).

use serde_json::{Value, json};

/// The `type` of an error: the request cannot be served as sent.
pub const INVALID_REQUEST: &str = "invalid_request_error";
pub const RATE_LIMIT: &str = "rate_limit_error";
pub const SERVER_ERROR: &str = "server_error";
pub const UNAVAILABLE: &str = "service_unavailable_error";

#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    pub status: u16,
    pub message: String,
    /// `type`: `invalid_request_error`, `server_error`, ...
    pub kind: String,
    pub param: Option<String>,
    pub code: Option<String>,
    /// Seconds, sent as `Retry-After`.
    pub retry_after: Option<u32>,
    /// The allowed method(s) of a 405, sent as `Allow` (boxed: every
    /// `Result<_, ApiError>` carries the size of this struct).
    allow: Option<Box<Allow>>,
}

#[derive(Debug, Clone, PartialEq)]
struct Allow(String);

impl ApiError {
    pub fn new(status: u16, kind: &str, code: Option<&str>, message: impl Into<String>) -> Self {
        ApiError {
            status,
            message: message.into(),
            kind: kind.to_owned(),
            param: None,
            code: code.map(str::to_owned),
            retry_after: None,
            allow: None,
        }
    }

    pub fn with_param(mut self, param: impl Into<String>) -> Self {
        self.param = Some(param.into());
        self
    }

    pub fn with_retry_after(mut self, secs: u32) -> Self {
        self.retry_after = Some(secs);
        self
    }

    /// Sets the `Allow` header (a 405's allowed methods).
    pub fn with_allow(mut self, methods: impl Into<String>) -> Self {
        self.allow = Some(Box::new(Allow(methods.into())));
        self
    }

    /// The `Allow` header, if set.
    pub fn allow(&self) -> Option<&str> {
        self.allow.as_ref().map(|a| a.0.as_str())
    }

    /// 400 `invalid_request_error` with a code.
    pub fn invalid(code: &str, message: impl Into<String>) -> Self {
        Self::new(400, INVALID_REQUEST, Some(code), message)
    }

    /// 400 naming the offending parameter.
    pub fn param(param: &str, code: &str, message: impl Into<String>) -> Self {
        Self::invalid(code, message).with_param(param)
    }

    /// 400 `invalid_type`: "'{param}' must be {expected}".
    pub fn invalid_type(param: &str, expected: &str) -> Self {
        Self::param(
            param,
            "invalid_type",
            format!("'{param}' must be {expected}"),
        )
    }

    /// 400 `invalid_value` for `param`.
    pub fn invalid_value(param: &str, message: impl Into<String>) -> Self {
        Self::param(param, "invalid_value", message)
    }

    /// 400 `missing_required_parameter`: "'{param}' is required".
    pub fn missing(param: &str) -> Self {
        Self::param(
            param,
            "missing_required_parameter",
            format!("'{param}' is required"),
        )
    }

    /// 400 `unsupported_parameter`.
    pub fn unsupported(param: &str, message: impl Into<String>) -> Self {
        Self::param(param, "unsupported_parameter", message)
    }

    /// 400 `context_length_exceeded` naming the parameter that is too long.
    pub fn context_length(message: impl Into<String>, param: &str) -> Self {
        Self::invalid("context_length_exceeded", message).with_param(param)
    }

    /// 400 for a body that is not JSON (or not the expected shape).
    pub fn invalid_json(detail: impl std::fmt::Display) -> Self {
        Self::invalid(
            "invalid_json",
            format!("We could not parse the JSON body of your request ({detail})."),
        )
    }

    /// 404 `model_not_found` (param `model`).
    pub fn model_not_found(model: &str) -> Self {
        Self::new(
            404,
            INVALID_REQUEST,
            Some("model_not_found"),
            format!("The model `{model}` does not exist."),
        )
        .with_param("model")
    }

    pub fn not_found(method: &str, path: &str) -> Self {
        Self::new(
            404,
            INVALID_REQUEST,
            Some("not_found"),
            format!("Invalid URL ({method} {path})"),
        )
    }

    /// 405, with `Allow: {allowed}`.
    pub fn method_not_allowed(method: &str, path: &str, allowed: &str) -> Self {
        Self::new(
            405,
            INVALID_REQUEST,
            Some("method_not_allowed"),
            format!("Method {method} is not allowed for {path}; use {allowed}"),
        )
        .with_allow(allowed)
    }

    /// 429 `queue_full` with `Retry-After`.
    pub fn queue_full(retry_after: u32) -> Self {
        Self::new(
            429,
            RATE_LIMIT,
            Some("queue_full"),
            format!("The server is busy: the request queue is full. Retry after {retry_after} s."),
        )
        .with_retry_after(retry_after)
    }

    pub fn queue_timeout() -> Self {
        Self::new(
            503,
            UNAVAILABLE,
            Some("queue_timeout"),
            "The request waited in the queue longer than the server allows; try again later.",
        )
    }

    pub fn shutting_down() -> Self {
        Self::new(
            503,
            UNAVAILABLE,
            Some("service_shutting_down"),
            "The server is shutting down.",
        )
    }

    pub fn too_large(limit: usize) -> Self {
        Self::new(
            413,
            INVALID_REQUEST,
            Some("request_too_large"),
            format!("The request body exceeds {limit} bytes."),
        )
    }

    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(500, SERVER_ERROR, Some("internal_error"), message)
    }

    /// The `{"error": {...}}` object.
    pub fn to_json(&self) -> Value {
        json!({"error": {
            "message": self.message,
            "type": self.kind,
            "param": self.param,
            "code": self.code,
        }})
    }

    pub fn body(&self) -> Vec<u8> {
        serde_json::to_vec(&self.to_json()).expect("JSON serialises")
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({})", self.message, self.status)
    }
}

impl std::error::Error for ApiError {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn openai_shape() {
        let e = ApiError::invalid("invalid_value", "'x' must be positive").with_param("x");
        let v: Value = serde_json::from_slice(&e.body()).unwrap();
        assert_eq!(
            v,
            json!({"error": {"message": "'x' must be positive", "type": "invalid_request_error",
                             "param": "x", "code": "invalid_value"}})
        );
        let e = ApiError::internal("boom");
        assert_eq!(e.status, 500);
        assert_eq!(e.to_json()["error"]["param"], Value::Null);
        assert_eq!(e.to_json()["error"]["code"], "internal_error");
        let e = ApiError::not_found("GET", "/x").with_retry_after(3);
        assert_eq!((e.status, e.retry_after), (404, Some(3)));
        let e = ApiError::invalid_type("temperature", "a number");
        assert_eq!(
            e.to_json(),
            json!({"error": {"message": "'temperature' must be a number", "type": "invalid_request_error",
                             "param": "temperature", "code": "invalid_type"}})
        );
        let e = ApiError::missing("messages");
        assert_eq!(e.code.as_deref(), Some("missing_required_parameter"));
        assert_eq!(e.message, "'messages' is required");
        let e = ApiError::model_not_found("m");
        assert_eq!((e.status, e.param.as_deref()), (404, Some("model")));
        assert_eq!(ApiError::too_large(10).status, 413);
        let e = ApiError::method_not_allowed("GET", "/a", "POST");
        assert_eq!((e.status, e.allow()), (405, Some("POST")));
        assert_eq!(e.message, "Method GET is not allowed for /a; use POST");
    }
}
