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
    use minijinja::value::Kwargs;
    use minijinja::{Environment, Error, ErrorKind};

    fn tojson(v: minijinja::Value, kwargs: Kwargs) -> Result<minijinja::Value, Error> {
        let json = serde_json::to_value(&v)
            .map_err(|e| Error::new(ErrorKind::InvalidOperation, e.to_string()))?;
        let indent: Option<usize> = kwargs.get("indent")?;
        let _: Option<bool> = kwargs.get("ensure_ascii")?;
        let _: Option<bool> = kwargs.get("sort_keys")?;
        kwargs.assert_all_used()?;
        let text = match indent {
            None => chat::to_json_py(&json),
            Some(n) => {
                let pad = " ".repeat(n);
                let mut out = Vec::new();
                let fmt = serde_json::ser::PrettyFormatter::with_indent(pad.as_bytes());
                let mut ser = serde_json::Serializer::with_formatter(&mut out, fmt);
                serde::Serialize::serialize(&json, &mut ser)
                    .map_err(|e| Error::new(ErrorKind::InvalidOperation, e.to_string()))?;
                String::from_utf8(out).expect("UTF-8")
            }
        };
        Ok(minijinja::Value::from_safe_string(text))
    }

    fn raise_exception(msg: String) -> Result<minijinja::Value, Error> {
        Err(Error::new(ErrorKind::InvalidOperation, msg))
    }

    pub fn render(
        template: &str,
        messages: &[Message],
        tools: &[Value],
        opts: RenderOptions,
        kwargs: &Map<String, Value>,
    ) -> Result<String, ApiError> {
        let mut env = Environment::new();
        env.set_syntax(
            minijinja::syntax::SyntaxConfig::builder()
                .trim_blocks(true)
                .lstrip_blocks(true)
                .build()
                .expect("default delimiters"),
        );
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_filter("tojson", tojson);
        env.add_function("raise_exception", raise_exception);
        let tmpl = env.template_from_str(template).map_err(|e| {
            ApiError::internal(format!("the model's chat template does not compile: {e}"))
        })?;
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
        ctx.insert("enable_thinking".into(), Value::Bool(opts.enable_thinking));
        ctx.insert(
            "preserve_thinking".into(),
            Value::Bool(opts.preserve_thinking),
        );
        tmpl.render(minijinja::value::Serde(&ctx)).map_err(|e| {
            let mut msg = e.to_string();
            if let Some(d) = e.detail()
                && !msg.contains(d)
            {
                msg = format!("{msg}: {d}");
            }
            ApiError::invalid(
                "chat_template_error",
                format!("the chat template could not render this conversation: {msg}"),
            )
        })
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
        assert_eq!(e.status, 500);
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
