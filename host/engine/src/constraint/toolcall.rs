//! The Qwen3.6 tool-call syntax as a Lark grammar for llguidance: what the
//! chat template renders and the OpenAI guest's parser reads back.
//!
//! ```text
//! <tool_call>
//! <function=NAME>
//! <parameter=KEY>
//! VALUE
//! </parameter>
//! </function>
//! </tool_call>
//! ```
//!
//! `<tool_call>`/`</tool_call>` are special tokens. A parameter whose schema
//! type is `string` is raw text (never containing `</parameter>`, where the
//! parser ends it; within `minLength`/`maxLength` and matching `pattern` and
//! `format`, see [`rawtext`]), or one of its `enum`/`const` values; any
//! other parameter is JSON valid under its schema (`%json`). Parameters come
//! in the schema's `properties` order, the `required` ones always.
//!
//! A tool is strict when its `parameters` carry llguidance's
//! `"x-guidance": {"lenient": false}` (the OpenAI guest adds it for
//! `strict: true` tools): then a keyword that cannot be enforced (an unknown
//! `format`, a lookaround in a `pattern`) is an error naming it; otherwise
//! it is ignored.

mod rawtext;
#[cfg(test)]
mod tests;

use super::{ConstraintError, json_options};
use serde_json::{Map, Value};
use std::fmt::Write;

/// One function the model may call.
#[derive(Clone, Debug, PartialEq)]
pub struct Tool {
    pub name: String,
    /// The `parameters` JSON schema (an object schema; `{}` = no parameters).
    pub parameters: Value,
}

/// Which calls the output must or may make.
#[derive(Clone, Debug, PartialEq)]
pub struct ToolCalls {
    pub tools: Vec<Tool>,
    /// At least one call (`tool_choice` `required` or a named function);
    /// otherwise text, or text followed by calls.
    pub required: bool,
    /// More than one call allowed.
    pub parallel: bool,
}

/// The Lark grammar for `calls`.
pub fn grammar(calls: &ToolCalls) -> Result<String, ConstraintError> {
    if calls.tools.is_empty() {
        return Err(ConstraintError::new(
            "a tool-call constraint needs at least one tool",
        ));
    }
    let mut g = String::new();
    let repeat = if calls.parallel {
        r#" ("\n" call)*"#
    } else {
        ""
    };
    if calls.required {
        writeln!(g, "start: call{repeat}").unwrap();
    } else {
        // Text that never spells the call tag, then optionally calls.
        writeln!(g, "start: TEXT | TEXT? call{repeat}").unwrap();
        writeln!(g, r"TEXT: /(?s:.+)/ & ~/(?s:.*)<tool_call>(?s:.*)/").unwrap();
    }
    let fns: Vec<String> = (0..calls.tools.len()).map(|i| format!("f{i}")).collect();
    writeln!(
        g,
        r#"call: <tool_call> "\n" ({}) "\n" </tool_call>"#,
        fns.join(" | ")
    )
    .unwrap();
    for (i, tool) in calls.tools.iter().enumerate() {
        function(&mut g, i, tool)?;
    }
    Ok(g)
}

fn lit(s: &str) -> String {
    serde_json::to_string(s).expect("a string serialises")
}

fn function(g: &mut String, i: usize, tool: &Tool) -> Result<(), ConstraintError> {
    let what = || format!("tool '{}'", tool.name);
    let empty = Map::new();
    let schema = match &tool.parameters {
        Value::Object(o) => o,
        Value::Null | Value::Bool(true) => &empty,
        _ => {
            return Err(ConstraintError::new(format!(
                "{}: 'parameters' must be a JSON schema object",
                what()
            )));
        }
    };
    if let Some(t) = schema.get("type")
        && t != "object"
    {
        return Err(ConstraintError::new(format!(
            "{}: 'parameters' must be an object schema (type 'object')",
            what()
        )));
    }
    let props = match schema.get("properties") {
        None | Some(Value::Null) => &empty,
        Some(Value::Object(p)) => p,
        Some(_) => {
            return Err(ConstraintError::new(format!(
                "{}: 'properties' must be an object",
                what()
            )));
        }
    };
    // Lenient unless the tool asks for strict enforcement.
    let lenient = schema
        .get("x-guidance")
        .and_then(|g| g.get("lenient"))
        .and_then(Value::as_bool)
        .unwrap_or(true);
    let required: Vec<&str> = schema
        .get("required")
        .and_then(Value::as_array)
        .map(|r| r.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    if let Some(missing) = required.iter().find(|r| !props.contains_key(**r)) {
        return Err(ConstraintError::new(format!(
            "{}: required parameter '{missing}' is not in 'properties'",
            what()
        )));
    }
    let mut params = String::new();
    for (j, (key, sub)) in props.iter().enumerate() {
        let rule = format!("p{i}_{j}");
        let optional = if required.contains(&key.as_str()) {
            ""
        } else {
            "?"
        };
        write!(params, " {rule}{optional}").unwrap();
        let open = lit(&format!("<parameter={key}>\n"));
        match string_values(sub) {
            Some(Some(values)) => {
                let alts: Vec<String> = values.iter().map(|v| lit(v)).collect();
                writeln!(
                    g,
                    r#"{rule}: {open} ({}) "\n</parameter>\n""#,
                    alts.join(" | ")
                )
                .unwrap();
            }
            Some(None) => {
                let term = rule.to_uppercase();
                writeln!(g, "{rule}: {open} {term}").unwrap();
                let sub = sub.as_object().expect("a string schema is an object");
                writeln!(g, "{term}: {}", raw_text(sub, lenient, &what, key)?).unwrap();
            }
            None => {
                let mut sub = sub.clone();
                if let Value::Object(o) = &mut sub {
                    o.insert("x-guidance".into(), json_options(lenient));
                }
                writeln!(g, r#"{rule}: {open} {rule}_j "\n</parameter>\n""#).unwrap();
                writeln!(g, "{rule}_j: %json {sub}").unwrap();
            }
        }
    }
    writeln!(
        g,
        r#"f{i}: {}{params} "</function>""#,
        lit(&format!("<function={}>\n", tool.name))
    )
    .unwrap();
    Ok(())
}

/// The terminal of a raw-text value and the `\n</parameter>\n` after it:
/// the value matches every regex of its schema and never contains
/// `</parameter>` (the parser ends the value at the first one, which must
/// be the closing tag: nothing but its newline may follow a `</parameter>`).
fn raw_text(
    sub: &Map<String, Value>,
    lenient: bool,
    what: &dyn Fn() -> String,
    key: &str,
) -> Result<String, ConstraintError> {
    let (mut regexes, unenforceable) = rawtext::value_regexes(sub);
    if let Some(u) = unenforceable.into_iter().find(|_| !lenient) {
        return Err(ConstraintError::new(format!(
            "{}: parameter '{key}': {} (keyword '{}'; a tool that is not strict ignores it)",
            what(),
            u.why,
            u.keyword
        )));
    }
    if regexes.is_empty() {
        regexes.push("(?s:.*)".into());
    }
    let mut term: Vec<String> = regexes
        .iter()
        .map(|r| format!(r"/(?:{r})\n<\/parameter>\n/"))
        .collect();
    term.push(r"~/(?s:.*)<\/parameter>(?s:..+)/".into());
    Ok(term.join(" & "))
}

/// How the guest's parser reads a parameter: as raw text when its schema's
/// `type` is `string` (or a list whose first non-null type is). `Some(Some)`:
/// a string with a fixed set of values; `Some(None)`: any string; `None`: JSON.
fn string_values(schema: &Value) -> Option<Option<Vec<String>>> {
    let ty = match schema.get("type") {
        Some(Value::String(t)) => t.as_str(),
        Some(Value::Array(a)) => a.iter().filter_map(Value::as_str).find(|t| *t != "null")?,
        _ => return None,
    };
    if ty != "string" {
        return None;
    }
    if let Some(Value::String(c)) = schema.get("const") {
        return Some(Some(vec![c.clone()]));
    }
    if let Some(Value::Array(e)) = schema.get("enum") {
        let values: Vec<String> = e
            .iter()
            .filter_map(Value::as_str)
            .map(str::to_owned)
            .collect();
        if !values.is_empty() {
            return Some(Some(values));
        }
    }
    Some(None)
}
