//! OpenAI-style error objects and the HTTP statuses that go with them.

use serde_json::{Value, json};

/// An error as the API reports it:
/// `{"error": {"message", "type", "param", "code"}}` with an HTTP status.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    pub status: u16,
    pub message: String,
    pub kind: &'static str,
    pub param: Option<String>,
    pub code: Option<&'static str>,
    /// Seconds, sent as a `Retry-After` header (429/503).
    pub retry_after: Option<u32>,
}

pub const INVALID_REQUEST: &str = "invalid_request_error";
pub const NOT_FOUND: &str = "not_found_error";
pub const RATE_LIMIT: &str = "rate_limit_error";
pub const SERVER_ERROR: &str = "server_error";
pub const UNAVAILABLE: &str = "service_unavailable_error";

impl ApiError {
    pub fn new(
        status: u16,
        kind: &'static str,
        code: Option<&'static str>,
        message: impl Into<String>,
    ) -> Self {
        ApiError {
            status,
            message: message.into(),
            kind,
            param: None,
            code,
            retry_after: None,
        }
    }

    pub fn with_param(mut self, param: impl Into<String>) -> Self {
        self.param = Some(param.into());
        self
    }

    /// 400 for a request that cannot be served as sent.
    pub fn invalid(code: &'static str, message: impl Into<String>) -> Self {
        Self::new(400, INVALID_REQUEST, Some(code), message)
    }

    /// 400 naming the offending parameter.
    pub fn param(param: &str, code: &'static str, message: impl Into<String>) -> Self {
        Self::invalid(code, message).with_param(param)
    }

    pub fn invalid_type(param: &str, expected: &str) -> Self {
        Self::param(
            param,
            "invalid_type",
            format!("'{param}' must be {expected}"),
        )
    }

    pub fn invalid_value(param: &str, message: impl Into<String>) -> Self {
        Self::param(param, "invalid_value", message)
    }

    pub fn missing(param: &str) -> Self {
        Self::param(
            param,
            "missing_required_parameter",
            format!("'{param}' is required"),
        )
    }

    pub fn unsupported(param: &str, message: impl Into<String>) -> Self {
        Self::param(param, "unsupported_parameter", message)
    }

    pub fn malformed_json(detail: impl std::fmt::Display) -> Self {
        Self::invalid(
            "invalid_json",
            format!(
                "We could not parse the JSON body of your request ({detail}). The body must be a JSON object."
            ),
        )
    }

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

    pub fn method_not_allowed(method: &str, path: &str, allowed: &str) -> Self {
        Self::new(
            405,
            INVALID_REQUEST,
            Some("method_not_allowed"),
            format!("Method {method} is not allowed for {path}; use {allowed}"),
        )
    }

    pub fn context_length(message: impl Into<String>, param: &str) -> Self {
        Self::invalid("context_length_exceeded", message).with_param(param)
    }

    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(500, SERVER_ERROR, Some("internal_error"), message)
    }

    pub fn queue_full(retry_after: u32) -> Self {
        let mut e = Self::new(
            429,
            RATE_LIMIT,
            Some("queue_full"),
            format!("The server is busy: the request queue is full. Retry after {retry_after} s."),
        );
        e.retry_after = Some(retry_after);
        e
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

    /// The `{"error": {...}}` object.
    pub fn to_json(&self) -> Value {
        json!({
            "error": {
                "message": self.message,
                "type": self.kind,
                "param": self.param,
                "code": self.code,
            }
        })
    }

    pub fn body(&self) -> Vec<u8> {
        serde_json::to_vec(&self.to_json()).expect("error serialises")
    }
}

/// The SDK's request-body errors (413 over the limit, or a read failure).
impl From<qwasi_guest_sdk::ApiError> for ApiError {
    fn from(e: qwasi_guest_sdk::ApiError) -> Self {
        match e.code.as_deref() {
            Some("request_too_large") => ApiError::too_large(crate::api::MAX_BODY_BYTES),
            Some("body_read_error") => ApiError::invalid("body_read_error", e.message),
            _ => ApiError::internal(e.message),
        }
    }
}

impl From<qwasi_guest_sdk::inference::GenerateError> for ApiError {
    fn from(e: qwasi_guest_sdk::inference::GenerateError) -> Self {
        use qwasi_guest_sdk::inference::GenerateError as G;
        match e {
            G::QueueFull(s) => ApiError::queue_full(s),
            G::QueueTimeout => ApiError::queue_timeout(),
            G::ShuttingDown => ApiError::shutting_down(),
            G::ContextLengthExceeded(m) => ApiError::invalid("context_length_exceeded", m),
            G::InvalidRequest(m) => ApiError::invalid("invalid_value", m),
            G::Internal(m) => ApiError::internal(m),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use qwasi_guest_sdk::inference::GenerateError;

    #[test]
    fn shape() {
        let e = ApiError::invalid_type("temperature", "a number");
        assert_eq!(e.status, 400);
        let v: Value = serde_json::from_slice(&e.body()).unwrap();
        assert_eq!(
            v,
            json!({"error": {"message": "'temperature' must be a number", "type": "invalid_request_error",
                             "param": "temperature", "code": "invalid_type"}})
        );
        let e = ApiError::not_found("GET", "/nope");
        let v = e.to_json();
        assert_eq!(v["error"]["param"], Value::Null);
        assert_eq!(e.status, 404);
    }

    #[test]
    fn generate_error_mapping() {
        let cases: Vec<(GenerateError, u16, &str, Option<u32>)> = vec![
            (GenerateError::QueueFull(7), 429, "queue_full", Some(7)),
            (GenerateError::QueueTimeout, 503, "queue_timeout", None),
            (
                GenerateError::ShuttingDown,
                503,
                "service_shutting_down",
                None,
            ),
            (
                GenerateError::InvalidRequest("bad".into()),
                400,
                "invalid_value",
                None,
            ),
            (
                GenerateError::ContextLengthExceeded("long".into()),
                400,
                "context_length_exceeded",
                None,
            ),
            (
                GenerateError::Internal("boom".into()),
                500,
                "internal_error",
                None,
            ),
        ];
        for (g, status, code, retry) in cases {
            let e = ApiError::from(g);
            assert_eq!(e.status, status);
            assert_eq!(e.code, Some(code));
            assert_eq!(e.retry_after, retry);
        }
        assert_eq!(
            ApiError::from(GenerateError::QueueFull(3)).kind,
            "rate_limit_error"
        );
        assert_eq!(
            ApiError::from(GenerateError::Internal("x".into())).message,
            "x"
        );
    }
}
