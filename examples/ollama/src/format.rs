//! Ollama's `format` field as the engine's output constraint (WIT 0.1.4
//! `generate-constrained`): the output is held to the format while it is
//! decoded, so it is valid whatever the model.
//!
//! | `format` | output |
//! |---|---|
//! | absent, `null`, `""` | free text |
//! | `"json"` | a JSON object (Ollama's JSON grammar has an object at its root) |
//! | a JSON-schema object | JSON valid under the schema |
//!
//! Anything else is Ollama's 400 `invalid format: …`. A schema means what it
//! means to Ollama, whose grammar comes from llama.cpp's schema converter:
//! an object schema with `properties` and no `additionalProperties` takes
//! no other properties ([`closed`]), and keywords the converter cannot
//! express are skipped, so the schema is not strict here either (an
//! unsupported keyword is ignored). A schema the host cannot compile at all
//! is a 400 `invalid JSON schema in format: …`.

use crate::Error;
use qwasi_guest_sdk::inference::{Constraint, GenerateError, Grammar};
use serde_json::Value;

/// The grammar `format` asks for, if any.
pub fn grammar(format: Option<&Value>) -> Result<Option<Grammar>, Error> {
    match format {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) if s.is_empty() => Ok(None),
        Some(Value::String(s)) if s == "json" => Ok(Some(Grammar::JsonObject)),
        Some(schema @ Value::Object(_)) => Ok(Some(Grammar::JsonSchema {
            schema: closed(schema.clone()).to_string(),
            strict: false,
        })),
        Some(other) => Err(Error::new(
            400,
            format!("invalid format: {other}; expected \"json\" or a valid JSON Schema object"),
        )),
    }
}

/// `schema` with `"additionalProperties": false` on every object schema
/// that lists `properties` and says nothing about others, as llama.cpp's
/// converter reads it (the Python client's `Model.model_json_schema()`
/// leaves it out). `allOf` branches are left as they are: closing each
/// would forbid the properties of the others.
pub fn closed(mut schema: Value) -> Value {
    close(&mut schema);
    schema
}

fn close(schema: &mut Value) {
    let Value::Object(o) = schema else { return };
    if o.get("properties").is_some_and(Value::is_object) && !o.contains_key("additionalProperties")
    {
        o.insert("additionalProperties".into(), Value::Bool(false));
    }
    for (key, sub) in o.iter_mut() {
        match key.as_str() {
            // Maps of names to schemas.
            "properties" | "patternProperties" | "$defs" | "definitions" => {
                if let Value::Object(m) = sub {
                    m.values_mut().for_each(close);
                }
            }
            // A schema, or a list of them.
            "items"
            | "prefixItems"
            | "anyOf"
            | "oneOf"
            | "additionalProperties"
            | "not"
            | "contains"
            | "if"
            | "then"
            | "else" => match sub {
                Value::Array(a) => a.iter_mut().for_each(close),
                other => close(other),
            },
            _ => {}
        }
    }
}

/// The constraint for `grammar`, from `</think>` on when the model thinks
/// first (`think_end`): the reasoning stays free.
pub fn constraint(grammar: Grammar, think_end: Option<u32>) -> Constraint {
    Constraint {
        grammar,
        start_after: think_end,
    }
}

/// The host's refusal of a schema as Ollama words it; other errors as they are.
pub fn rejected(e: GenerateError) -> Error {
    match &e {
        GenerateError::InvalidRequest(m) if m.starts_with("invalid constraint") => {
            let why = m.strip_prefix("invalid constraint: ").unwrap_or(m.as_str());
            Error::new(400, format!("invalid JSON schema in format: {why}"))
        }
        _ => e.into(),
    }
}
