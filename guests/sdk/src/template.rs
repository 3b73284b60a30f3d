//! Prompt rendering: the model's own jinja chat template (model-info's
//! `chat-template`) through minijinja, or the built-in Qwen3.6-format
//! renderer ([`crate::messages::render`]) when the model has none.

use serde_json::{Map, Value};

use crate::ApiError;
use crate::messages::{self as chat, Message, RenderOptions};

/// Renders the prompt. `kwargs` are the request's `chat_template_kwargs`.
pub fn render(
    template: Option<&str>,
    messages: &[Message],
    tools: &[Value],
    opts: RenderOptions,
    kwargs: &Map<String, Value>,
) -> Result<String, ApiError> {
    match template {
        Some(t) if !t.trim().is_empty() => jinja::render(t, messages, tools, opts, kwargs),
        _ => Ok(chat::render(messages, tools, opts)),
    }
}

mod jinja {
    use super::*;
    use crate::pyfmt::{self, JsonOptions};
    use minijinja::value::{Kwargs, ValueKind};
    use minijinja::{Environment, Error, ErrorKind, State};

    /// The template's name in error messages ("... (in chat_template.jinja:12)").
    const NAME: &str = "chat_template.jinja";

    fn to_json(v: &minijinja::Value) -> Result<Value, Error> {
        serde_json::to_value(v).map_err(|e| Error::new(ErrorKind::InvalidOperation, e.to_string()))
    }

    /// Python's `str(value)`, for what Jinja2 prints and its `string` filter.
    fn py_str(v: &minijinja::Value) -> Result<String, Error> {
        Ok(match v.kind() {
            ValueKind::Undefined => String::new(),
            ValueKind::String => v.as_str().unwrap_or_default().to_owned(),
            ValueKind::None
            | ValueKind::Bool
            | ValueKind::Number
            | ValueKind::Seq
            | ValueKind::Map => pyfmt::str_of(&to_json(v)?),
            _ => v.to_string(),
        })
    }

    /// transformers' `tojson`: `json.dumps(x, ensure_ascii=False, indent=None,
    /// separators=None, sort_keys=False)`.
    fn tojson(v: minijinja::Value, kwargs: Kwargs) -> Result<minijinja::Value, Error> {
        let json = to_json(&v)?;
        let indent: Option<minijinja::Value> = kwargs.get("indent")?;
        let separators: Option<minijinja::Value> = kwargs.get("separators")?;
        let opts = JsonOptions {
            indent: match indent {
                None => None,
                Some(i) if i.is_none() => None,
                Some(i) => Some(match i.as_str() {
                    Some(s) => s.to_owned(),
                    None => " ".repeat(i.as_usize().ok_or_else(|| {
                        Error::new(
                            ErrorKind::InvalidOperation,
                            "tojson: indent must be a number or a string",
                        )
                    })?),
                }),
            },
            separators: match separators {
                None => None,
                Some(s) if s.is_none() => None,
                Some(s) => {
                    let parts: Vec<String> = s
                        .try_iter()?
                        .map(|p| p.as_str().map(str::to_owned))
                        .collect::<Option<_>>()
                        .filter(|p: &Vec<String>| p.len() == 2)
                        .ok_or_else(|| {
                            Error::new(
                                ErrorKind::InvalidOperation,
                                "tojson: separators must be two strings",
                            )
                        })?;
                    Some((parts[0].clone(), parts[1].clone()))
                }
            },
            sort_keys: kwargs.get::<Option<bool>>("sort_keys")?.unwrap_or(false),
            ensure_ascii: kwargs.get::<Option<bool>>("ensure_ascii")?.unwrap_or(false),
        };
        kwargs.assert_all_used()?;
        Ok(minijinja::Value::from_safe_string(pyfmt::dumps(
            &json, &opts,
        )))
    }

    fn raise_exception(msg: String) -> Result<minijinja::Value, Error> {
        Err(Error::new(ErrorKind::InvalidOperation, msg))
    }

    /// Jinja2's `sequence` test: anything with a length and indexing
    /// (strings and mappings too).
    fn is_sequence(v: minijinja::Value) -> bool {
        matches!(
            v.kind(),
            ValueKind::Undefined | ValueKind::String | ValueKind::Seq | ValueKind::Map
        )
    }

    /// Jinja2's `iterable` test: strings, sequences, mappings and undefined
    /// (not `none`, which minijinja iterates as empty).
    fn is_iterable(v: minijinja::Value) -> bool {
        match v.kind() {
            ValueKind::None | ValueKind::Bool | ValueKind::Number => false,
            ValueKind::Undefined => true,
            _ => v.try_iter().is_ok(),
        }
    }

    /// Python's `str.rsplit(sep=None, maxsplit=-1)`.
    fn rsplit(s: &str, sep: Option<&str>, max: Option<i64>) -> Vec<String> {
        let max = max.filter(|m| *m >= 0).map(|m| m as usize);
        match sep {
            Some(sep) => {
                let mut parts: Vec<String> = match max {
                    Some(m) => s.rsplitn(m + 1, sep).map(str::to_owned).collect(),
                    None => s.rsplit(sep).map(str::to_owned).collect(),
                };
                parts.reverse();
                parts
            }
            None => {
                let mut rest = s.trim_end();
                let mut parts = Vec::new();
                while !rest.is_empty() {
                    if max.is_some_and(|m| parts.len() == m) {
                        parts.push(rest.to_owned());
                        break;
                    }
                    let start = rest
                        .char_indices()
                        .rev()
                        .find(|(_, c)| c.is_whitespace())
                        .map_or(0, |(i, c)| i + c.len_utf8());
                    parts.push(rest[start..].to_owned());
                    rest = rest[..start].trim_end();
                }
                parts.reverse();
                parts
            }
        }
    }

    /// Python's methods: minijinja-contrib's pycompat, plus the string
    /// methods it lacks that templates use.
    fn methods(
        state: &mut State,
        v: &minijinja::Value,
        method: &str,
        args: &[minijinja::Value],
    ) -> Result<minijinja::Value, Error> {
        if let Some(s) = v.as_str() {
            match method {
                "rsplit" => {
                    let (sep, max): (Option<Option<&str>>, Option<i64>) =
                        minijinja::value::from_args(args)?;
                    return Ok(minijinja::Value::from(rsplit(s, sep.flatten(), max)));
                }
                "removeprefix" | "removesuffix" => {
                    let (affix,): (&str,) = minijinja::value::from_args(args)?;
                    let out = if method == "removeprefix" {
                        s.strip_prefix(affix)
                    } else {
                        s.strip_suffix(affix)
                    };
                    return Ok(minijinja::Value::from(out.unwrap_or(s)));
                }
                _ => {}
            }
        }
        minijinja_contrib::pycompat::unknown_method_callback(state, v, method, args)
    }

    /// The environment transformers renders in: jinja2's sandbox with
    /// `trim_blocks`, `lstrip_blocks` and loop controls, its `tojson` and
    /// `raise_exception`, and Python's methods and value printing.
    fn environment() -> Environment<'static> {
        let mut env = Environment::new();
        env.set_syntax(
            minijinja::syntax::SyntaxConfig::builder()
                .trim_blocks(true)
                .lstrip_blocks(true)
                .build()
                .expect("default delimiters"),
        );
        env.set_unknown_method_callback(methods);
        env.set_formatter(
            |out: &mut minijinja::Output, _state: &mut State, v: &minijinja::Value| {
                out.write_str(&py_str(v)?)
                    .map_err(|e| Error::new(ErrorKind::WriteFailure, e.to_string()))
            },
        );
        env.add_filter("tojson", tojson);
        env.add_filter("string", |v: minijinja::Value| py_str(&v));
        env.add_test("sequence", is_sequence);
        env.add_test("iterable", is_iterable);
        env.add_function("raise_exception", raise_exception);
        env
    }

    /// A template error as the client sees it: 400 `chat_template_error`,
    /// naming the line.
    fn template_error(e: Error) -> ApiError {
        let mut msg = e.to_string();
        if let Some(d) = e.detail()
            && !msg.contains(d)
        {
            msg = format!("{msg}: {d}");
        }
        if let Some(line) = e.line()
            && !msg.contains(&format!("{NAME}:{line}"))
        {
            msg = format!("{msg} (line {line})");
        }
        ApiError::invalid(
            "chat_template_error",
            format!("the chat template could not render this conversation: {msg}"),
        )
    }

    pub fn render(
        template: &str,
        messages: &[Message],
        tools: &[Value],
        opts: RenderOptions,
        kwargs: &Map<String, Value>,
    ) -> Result<String, ApiError> {
        let env = environment();
        let tmpl = env
            .template_from_named_str(NAME, template)
            .map_err(template_error)?;
        // What transformers' render_jinja_template passes: the kwargs, then
        // messages, tools (None when there are none), documents and
        // add_generation_prompt.
        let mut ctx = kwargs.clone();
        ctx.insert(
            "messages".into(),
            Value::Array(messages.iter().map(Message::to_template_value).collect()),
        );
        ctx.insert(
            "tools".into(),
            if tools.is_empty() {
                Value::Null
            } else {
                Value::Array(tools.to_vec())
            },
        );
        ctx.insert("documents".into(), Value::Null);
        ctx.insert(
            "add_generation_prompt".into(),
            Value::Bool(opts.add_generation_prompt),
        );
        tmpl.render(minijinja::value::Serde(&ctx))
            .map_err(template_error)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn template_errors_are_clear() {
        let m = vec![Message::new(crate::chat::Role::User, "hi")];
        let e = render(
            Some("{{ raise_exception('nope') }}"),
            &m,
            &[],
            RenderOptions::default(),
            &Map::new(),
        )
        .unwrap_err();
        assert_eq!(e.status, 400);
        assert!(e.message.contains("nope"), "{}", e.message);
        let e = render(
            Some("{% if %}"),
            &m,
            &[],
            RenderOptions::default(),
            &Map::new(),
        )
        .unwrap_err();
        assert_eq!(e.status, 400);
        assert!(e.message.contains("chat_template.jinja:1"), "{}", e.message);
        // Python string methods and tojson the transformers way.
        let out = render(
            Some("{{ '  a,b '.strip().split(',') | tojson }}{{ messages[0].content.startswith('h') }}{{ {'k': 'é<'} | tojson }}{{ x | length }}"),
            &m,
            &[],
            RenderOptions::default(),
            &serde_json::from_str(r#"{"x": [1, 2]}"#).unwrap(),
        )
        .unwrap();
        // Booleans print the Python way, as in jinja2.
        assert_eq!(out, r#"["a", "b"]True{"k": "é<"}2"#);
        // Macros and loop controls (jinja2.ext.loopcontrols, which transformers enables).
        let out = render(
            Some("{% macro c(x) %}[{{ x }}]{% endmacro %}{% for m in messages %}{% if loop.first %}{% continue %}{% endif %}{{ c(m.role) }}{% break %}{% endfor %}{{ tools is none }}"),
            &[Message::new(crate::chat::Role::System, "s"), m[0].clone(), m[0].clone()],
            &[],
            RenderOptions::default(),
            &Map::new(),
        )
        .unwrap();
        assert_eq!(out, "[user]True");
    }
}
