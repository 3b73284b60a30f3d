//! A request body as a JSON object and typed, named access to its fields:
//! every error names the parameter (`invalid_type`, `invalid_value`).

use serde_json::{Map, Value};

use crate::ApiError;

/// 400 `invalid_json` for a body that does not parse.
fn malformed_json(detail: impl std::fmt::Display) -> ApiError {
    ApiError::invalid(
        "invalid_json",
        format!(
            "We could not parse the JSON body of your request ({detail}). The body must be a JSON object."
        ),
    )
}

/// Parses a body as a JSON object.
pub fn parse_body(body: &[u8]) -> Result<Map<String, Value>, ApiError> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Err(malformed_json("the body is empty"));
    }
    match serde_json::from_slice::<Value>(body) {
        Ok(Value::Object(m)) => Ok(m),
        Ok(_) => Err(ApiError::invalid(
            "invalid_json",
            "The request body must be a JSON object.",
        )),
        Err(e) => Err(malformed_json(e)),
    }
}

/// Typed, named access to the fields of a request object. `null` counts as absent.
pub struct Fields<'a>(pub &'a Map<String, Value>);

impl<'a> Fields<'a> {
    pub fn get(&self, name: &str) -> Option<&'a Value> {
        self.0.get(name).filter(|v| !v.is_null())
    }

    pub fn bool(&self, name: &str) -> Result<Option<bool>, ApiError> {
        match self.get(name) {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(_) => Err(ApiError::invalid_type(name, "a boolean")),
        }
    }

    pub fn str(&self, name: &str) -> Result<Option<&'a str>, ApiError> {
        match self.get(name) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s)),
            Some(_) => Err(ApiError::invalid_type(name, "a string")),
        }
    }

    /// A number in `[min, max]` (`min_open` excludes `min`).
    pub fn num(
        &self,
        name: &str,
        min: f64,
        min_open: bool,
        max: f64,
    ) -> Result<Option<f64>, ApiError> {
        let Some(v) = self.get(name) else {
            return Ok(None);
        };
        let x = v
            .as_f64()
            .ok_or_else(|| ApiError::invalid_type(name, "a number"))?;
        let low_ok = if min_open { x > min } else { x >= min };
        if !low_ok || x > max {
            let lo = if min_open { "(" } else { "[" };
            return Err(ApiError::invalid_value(
                name,
                format!("'{name}' must be in {lo}{min}, {max}], got {x}"),
            ));
        }
        Ok(Some(x))
    }

    /// An integer in `[min, max]`.
    pub fn int(&self, name: &str, min: i64, max: i64) -> Result<Option<i64>, ApiError> {
        let Some(v) = self.get(name) else {
            return Ok(None);
        };
        let x = as_int(v).ok_or_else(|| ApiError::invalid_type(name, "an integer"))?;
        if x < min || x > max {
            return Err(ApiError::invalid_value(
                name,
                format!("'{name}' must be in [{min}, {max}], got {x}"),
            ));
        }
        Ok(Some(x))
    }
}

pub fn as_int(v: &Value) -> Option<i64> {
    match v {
        Value::Number(n) => n.as_i64().or_else(|| {
            // Accept 16.0 but not 16.5; u64 beyond i64 saturates (caught by range checks).
            n.as_u64().map(|_| i64::MAX).or_else(|| {
                n.as_f64()
                    .filter(|f| f.fract() == 0.0 && f.abs() < 9e15)
                    .map(|f| f as i64)
            })
        }),
        _ => None,
    }
}
