//! OpenAI-style JSON errors: `{"error": {"message", "type", "param", "code"}}`
//! with an HTTP status (and `Retry-After` for 429/503).

use serde_json::{Value, json};

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
}

impl ApiError {
    pub fn new(status: u16, kind: &str, code: Option<&str>, message: impl Into<String>) -> Self {
        ApiError {
            status,
            message: message.into(),
            kind: kind.to_owned(),
            param: None,
            code: code.map(str::to_owned),
            retry_after: None,
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

    /// 400 `invalid_request_error` with a code.
    pub fn invalid(code: &str, message: impl Into<String>) -> Self {
        Self::new(400, "invalid_request_error", Some(code), message)
    }

    /// 400 for a body that is not JSON (or not the expected shape).
    pub fn invalid_json(detail: impl std::fmt::Display) -> Self {
        Self::invalid(
            "invalid_json",
            format!("We could not parse the JSON body of your request ({detail})."),
        )
    }

    pub fn not_found(method: &str, path: &str) -> Self {
        Self::new(
            404,
            "invalid_request_error",
            Some("not_found"),
            format!("Invalid URL ({method} {path})"),
        )
    }

    pub fn method_not_allowed(method: &str, path: &str) -> Self {
        Self::new(
            405,
            "invalid_request_error",
            Some("method_not_allowed"),
            format!("Method {method} is not allowed for {path}"),
        )
    }

    pub fn too_large(limit: usize) -> Self {
        Self::new(
            413,
            "invalid_request_error",
            Some("request_too_large"),
            format!("The request body exceeds {limit} bytes."),
        )
    }

    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(500, "server_error", Some("internal_error"), message)
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
        assert_eq!(ApiError::too_large(10).status, 413);
        assert_eq!(ApiError::method_not_allowed("GET", "/a").status, 405);
    }
}
