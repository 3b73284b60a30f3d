//! Structured outputs: the request fields that constrain the output
//! (`response_format`, vLLM's `guided_*` and `structured_outputs`, and an
//! enforced `tool_choice`) turned into the engine constraint of WIT 0.1.4.

use crate::params::{Fields, ToolChoice, Tools, tool_name};
use qwasi_guest_sdk::ApiError;
use qwasi_guest_sdk::inference::{Constraint, Grammar, Tool, ToolCalls};
use serde_json::Value;

/// The constraint a request asked for, and the field it came from (named
/// in the 400 when the host cannot compile it).
#[derive(Debug, Clone, PartialEq)]
pub struct Requested {
    pub grammar: Grammar,
    pub param: String,
}

/// `response_format` (chat only), `guided_json`/`guided_regex`/
/// `guided_choice`/`guided_grammar` and `structured_outputs`: at most one.
pub fn parse(f: &Fields, chat: bool) -> Result<Option<Requested>, ApiError> {
    let mut found: Vec<Requested> = Vec::new();
    if chat && let Some(rf) = f.get("response_format") {
        found.extend(response_format(rf)?);
    }
    for (name, key) in [
        ("guided_json", "json"),
        ("guided_regex", "regex"),
        ("guided_choice", "choice"),
        ("guided_grammar", "grammar"),
    ] {
        if let Some(v) = f.get(name) {
            found.push(guided(name, key, v)?);
        }
    }
    if let Some(so) = f.get("structured_outputs") {
        let o = so
            .as_object()
            .ok_or_else(|| ApiError::invalid_type("structured_outputs", "an object"))?;
        for key in ["json", "regex", "choice", "grammar"] {
            if let Some(v) = o.get(key).filter(|v| !v.is_null()) {
                found.push(guided(&format!("structured_outputs.{key}"), key, v)?);
            }
        }
        if let Some(k) = o.keys().find(|k| {
            !["json", "regex", "choice", "grammar"].contains(&k.as_str())
                && !o[k.as_str()].is_null()
        }) {
            return Err(ApiError::unsupported(
                &format!("structured_outputs.{k}"),
                format!(
                    "structured_outputs.{k} is not supported; use json, regex, choice or grammar"
                ),
            ));
        }
    }
    if found.len() > 1 {
        return Err(ApiError::invalid_value(
            &found[1].param,
            format!(
                "'{}' and '{}' both constrain the output; give one",
                found[0].param, found[1].param
            ),
        ));
    }
    Ok(found.pop())
}

fn response_format(rf: &Value) -> Result<Option<Requested>, ApiError> {
    let p = "response_format";
    let o = rf
        .as_object()
        .ok_or_else(|| ApiError::invalid_type(p, "an object"))?;
    let grammar = match o.get("type").and_then(Value::as_str) {
        Some("text") => return Ok(None),
        Some("json_object") => Grammar::JsonObject,
        Some("json_schema") => {
            let js = o
                .get("json_schema")
                .and_then(Value::as_object)
                .ok_or_else(|| ApiError::missing("response_format.json_schema"))?;
            let schema = js
                .get("schema")
                .filter(|s| !s.is_null())
                .ok_or_else(|| ApiError::missing("response_format.json_schema.schema"))?;
            if !schema.is_object() {
                return Err(ApiError::invalid_type(
                    "response_format.json_schema.schema",
                    "a JSON schema object",
                ));
            }
            let strict = match js.get("strict") {
                None | Some(Value::Null) => false,
                Some(Value::Bool(b)) => *b,
                Some(_) => {
                    return Err(ApiError::invalid_type(
                        "response_format.json_schema.strict",
                        "a boolean",
                    ));
                }
            };
            return Ok(Some(Requested {
                grammar: Grammar::JsonSchema {
                    schema: schema.to_string(),
                    strict,
                },
                param: "response_format.json_schema.schema".into(),
            }));
        }
        Some(other) => {
            return Err(ApiError::invalid_value(
                "response_format.type",
                format!(
                    "unknown response_format type '{other}'; expected 'text', 'json_object' or 'json_schema'"
                ),
            ));
        }
        None => return Err(ApiError::missing("response_format.type")),
    };
    Ok(Some(Requested {
        grammar,
        param: p.into(),
    }))
}

/// One vLLM-style field: `json` a schema (object or JSON text), `regex` and
/// `grammar` strings, `choice` a list of strings.
fn guided(param: &str, key: &str, v: &Value) -> Result<Requested, ApiError> {
    let grammar = match key {
        "json" => {
            let schema = match v {
                Value::Object(_) => v.clone(),
                Value::String(s) => serde_json::from_str::<Value>(s)
                    .ok()
                    .filter(Value::is_object)
                    .ok_or_else(|| {
                        ApiError::invalid_value(
                            param,
                            format!("'{param}' is not a JSON schema object"),
                        )
                    })?,
                _ => return Err(ApiError::invalid_type(param, "a JSON schema object")),
            };
            Grammar::JsonSchema {
                schema: schema.to_string(),
                strict: true,
            }
        }
        "regex" | "grammar" => {
            let s = v
                .as_str()
                .filter(|s| !s.is_empty())
                .ok_or_else(|| ApiError::invalid_type(param, "a non-empty string"))?
                .to_owned();
            if key == "regex" {
                Grammar::Regex(s)
            } else {
                Grammar::Lark(s)
            }
        }
        _ => {
            let list = v
                .as_array()
                .filter(|a| !a.is_empty())
                .and_then(|a| {
                    a.iter()
                        .map(|c| c.as_str().map(str::to_owned))
                        .collect::<Option<Vec<_>>>()
                })
                .ok_or_else(|| ApiError::invalid_type(param, "a non-empty array of strings"))?;
            Grammar::Choice(list)
        }
    };
    Ok(Requested {
        grammar,
        param: param.to_owned(),
    })
}

/// The tool-call constraint: `required` or a named function always; `auto`
/// when a tool is `strict` (then text, or text followed by calls).
pub fn tool_calls(tools: &Tools) -> Option<Requested> {
    let strict = |t: &Value| {
        t.get("function")
            .and_then(|f| f.get("strict"))
            .and_then(Value::as_bool)
            == Some(true)
    };
    let (required, parallel, chosen): (bool, bool, Vec<&Value>) = match &tools.choice {
        ToolChoice::None => return None,
        ToolChoice::Required => (true, tools.parallel, tools.tools.iter().collect()),
        ToolChoice::Named(n) => (
            true,
            false,
            tools
                .tools
                .iter()
                .filter(|t| tool_name(t) == Some(n.as_str()))
                .collect(),
        ),
        ToolChoice::Auto if tools.tools.iter().any(strict) => {
            (false, tools.parallel, tools.tools.iter().collect())
        }
        ToolChoice::Auto => return None,
    };
    if chosen.is_empty() {
        return None;
    }
    let tools = chosen
        .into_iter()
        .map(|t| {
            let mut parameters = t
                .get("function")
                .and_then(|f| f.get("parameters"))
                .filter(|p| !p.is_null())
                .cloned()
                .unwrap_or_else(|| Value::Object(Default::default()));
            // A strict tool: the host refuses what it cannot enforce
            // (llguidance's own switch), instead of ignoring it.
            if strict(t)
                && let Value::Object(o) = &mut parameters
            {
                o.entry("x-guidance")
                    .or_insert_with(|| serde_json::json!({"lenient": false}));
            }
            Tool {
                name: tool_name(t).unwrap_or_default().to_owned(),
                parameters: parameters.to_string(),
            }
        })
        .collect();
    Some(Requested {
        grammar: Grammar::ToolCalls(ToolCalls {
            tools,
            required,
            parallel,
        }),
        param: "tools".into(),
    })
}

/// The engine constraint, started after `</think>` when the model thinks first.
pub fn constraint(r: &Requested, think_end: Option<u32>) -> Constraint {
    Constraint {
        grammar: r.grammar.clone(),
        start_after: think_end,
    }
}

/// The host's `invalid-request` for a constraint it could not compile, as a
/// 400 naming the field it came from.
pub fn rejected(r: &Requested, e: ApiError) -> ApiError {
    if e.status == 400 && e.message.contains("invalid constraint") {
        ApiError::invalid_value(&r.param, e.message)
    } else {
        e
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Map, json};

    fn parse_obj(v: Value, chat: bool) -> Result<Option<Requested>, ApiError> {
        let m: Map<String, Value> = v.as_object().unwrap().clone();
        parse(&Fields(&m), chat)
    }

    #[test]
    fn fields_become_grammars() {
        let g = |v: Value| parse_obj(v, true).unwrap().map(|r| (r.grammar, r.param));
        assert_eq!(g(json!({"response_format": {"type": "text"}})), None);
        assert_eq!(
            g(json!({"response_format": {"type": "json_object"}})),
            Some((Grammar::JsonObject, "response_format".into()))
        );
        let schema = json!({"type": "object"});
        assert_eq!(
            g(
                json!({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schema, "strict": true}}})
            ),
            Some((
                Grammar::JsonSchema {
                    schema: schema.to_string(),
                    strict: true
                },
                "response_format.json_schema.schema".into()
            ))
        );
        // guided_json as JSON text, vLLM's structured_outputs spelling.
        assert_eq!(
            g(json!({"guided_json": "{\"type\": \"object\"}"}))
                .unwrap()
                .0,
            Grammar::JsonSchema {
                schema: schema.to_string(),
                strict: true
            }
        );
        assert_eq!(
            g(json!({"structured_outputs": {"choice": ["a", "b"]}})),
            Some((
                Grammar::Choice(vec!["a".into(), "b".into()]),
                "structured_outputs.choice".into()
            ))
        );
        assert_eq!(
            g(json!({"guided_regex": "[0-9]+"})).unwrap().0,
            Grammar::Regex("[0-9]+".into())
        );
        assert_eq!(
            g(json!({"guided_grammar": "start: \"x\""})).unwrap().0,
            Grammar::Lark("start: \"x\"".into())
        );
        // response_format is a chat field.
        assert_eq!(
            parse_obj(json!({"response_format": {"type": "json_object"}}), false).unwrap(),
            None
        );
    }

    #[test]
    fn bad_fields_are_400s_naming_them() {
        let e = |v: Value| parse_obj(v, true).unwrap_err().param.unwrap();
        assert_eq!(
            e(json!({"response_format": {"type": "yaml"}})),
            "response_format.type"
        );
        assert_eq!(
            e(json!({"response_format": {"type": "json_schema"}})),
            "response_format.json_schema"
        );
        assert_eq!(
            e(json!({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}})),
            "response_format.json_schema.schema"
        );
        assert_eq!(e(json!({"guided_choice": []})), "guided_choice");
        assert_eq!(e(json!({"guided_json": "[1]"})), "guided_json");
        assert_eq!(
            e(json!({"structured_outputs": {"xml": "x"}})),
            "structured_outputs.xml"
        );
        assert_eq!(
            e(json!({"guided_regex": "a", "guided_choice": ["a"]})),
            "guided_choice"
        );
    }

    #[test]
    fn tool_choice_constraints() {
        let weather = json!({"type": "function", "function": {"name": "w", "parameters": {"type": "object"}}});
        let strict = json!({"type": "function", "function": {"name": "s", "strict": true}});
        let tools = |choice: ToolChoice, list: Vec<Value>| Tools {
            tools: list,
            choice,
            ..Tools::default()
        };
        let calls = |t: &Tools| match tool_calls(t).map(|r| r.grammar) {
            Some(Grammar::ToolCalls(c)) => Some(c),
            None => None,
            other => panic!("{other:?}"),
        };
        assert!(calls(&tools(ToolChoice::Auto, vec![weather.clone()])).is_none());
        assert!(calls(&tools(ToolChoice::None, vec![strict.clone()])).is_none());
        let c = calls(&tools(ToolChoice::Required, vec![weather.clone()])).unwrap();
        assert!(c.required && c.parallel && c.tools[0].parameters == r#"{"type":"object"}"#);
        let c = calls(&tools(
            ToolChoice::Named("s".into()),
            vec![weather.clone(), strict.clone()],
        ))
        .unwrap();
        assert!(c.required && !c.parallel);
        assert_eq!(
            c.tools,
            vec![Tool {
                name: "s".into(),
                parameters: r#"{"x-guidance":{"lenient":false}}"#.into()
            }]
        );
        let c = calls(&tools(ToolChoice::Auto, vec![weather, strict])).unwrap();
        assert!(!c.required && c.tools.len() == 2);
    }
}
