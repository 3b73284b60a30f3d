//! Python's text forms of JSON-like values, as a chat template rendered by
//! transformers (Jinja2 on Python objects) prints them: `str()`/`repr()`
//! (`{{ value }}`, the `string` filter) and `json.dumps` (transformers'
//! `tojson` filter).

use serde_json::{Map, Value};

/// `repr(float)`: the shortest digits that round-trip, in fixed notation
/// when the decimal exponent is in [-4, 16), else `d.ddde+XX`.
pub fn float_repr(x: f64) -> String {
    if x.is_nan() {
        return "nan".into();
    }
    if x.is_infinite() {
        return if x < 0.0 { "-inf" } else { "inf" }.into();
    }
    // Rust's `{:e}` gives the same shortest round-trip digits: "1.25e-7".
    let sci = format!("{:e}", x.abs());
    let (mant, exp) = sci.split_once('e').expect("{:e} has an exponent");
    let exp: i32 = exp.parse().expect("integer exponent");
    let digits: String = mant.chars().filter(|c| *c != '.').collect();
    let sign = if x.is_sign_negative() { "-" } else { "" };
    if !(-4..16).contains(&exp) {
        let (first, rest) = digits.split_at(1);
        let dot = if rest.is_empty() {
            String::new()
        } else {
            format!(".{rest}")
        };
        let esign = if exp < 0 { '-' } else { '+' };
        return format!("{sign}{first}{dot}e{esign}{:02}", exp.abs());
    }
    let point = exp + 1; // digits before the decimal point
    let body = if point <= 0 {
        format!("0.{}{digits}", "0".repeat((-point) as usize))
    } else if point as usize >= digits.len() {
        format!("{digits}{}.0", "0".repeat(point as usize - digits.len()))
    } else {
        let (a, b) = digits.split_at(point as usize);
        format!("{a}.{b}")
    };
    format!("{sign}{body}")
}

fn number(n: &serde_json::Number) -> String {
    match n.as_f64() {
        Some(f) if n.is_f64() => float_repr(f),
        _ => n.to_string(),
    }
}

/// Whether Python's `str.isprintable` is false for `c` (control, format and
/// separator characters other than the space): `repr` escapes these.
fn unprintable(c: char) -> bool {
    matches!(c,
        '\0'..='\u{1f}' | '\u{7f}'..='\u{a0}' | '\u{ad}' | '\u{1680}' | '\u{2000}'..='\u{200f}'
        | '\u{2028}'..='\u{202f}' | '\u{205f}'..='\u{2064}' | '\u{3000}' | '\u{feff}')
}

/// `repr(str)`: single quotes unless the text has `'` and no `"`.
pub fn str_repr(s: &str, out: &mut String) {
    let q = if s.contains('\'') && !s.contains('"') {
        '"'
    } else {
        '\''
    };
    out.push(q);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c == q => {
                out.push('\\');
                out.push(c);
            }
            c if unprintable(c) && (c as u32) < 0x100 => {
                out.push_str(&format!("\\x{:02x}", c as u32))
            }
            c if unprintable(c) => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push(q);
}

/// `repr(value)` of the Python object JSON `value` loads as.
pub fn repr(v: &Value, out: &mut String) {
    match v {
        Value::Null => out.push_str("None"),
        Value::Bool(b) => out.push_str(if *b { "True" } else { "False" }),
        Value::Number(n) => out.push_str(&number(n)),
        Value::String(s) => str_repr(s, out),
        Value::Array(a) => {
            out.push('[');
            for (i, x) in a.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                repr(x, out);
            }
            out.push(']');
        }
        Value::Object(m) => {
            out.push('{');
            for (i, (k, x)) in m.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                str_repr(k, out);
                out.push_str(": ");
                repr(x, out);
            }
            out.push('}');
        }
    }
}

/// `str(value)`: a string as it is, anything else as `repr`.
pub fn str_of(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        v => {
            let mut out = String::new();
            repr(v, &mut out);
            out
        }
    }
}

/// The options of Python's `json.dumps` that transformers' `tojson` passes on.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct JsonOptions {
    /// `indent`: `None` = one line; a number of spaces is given as that many spaces.
    pub indent: Option<String>,
    /// `separators` (item, key); `None` = `(", ", ": ")`, or `(",", ": ")` with an indent.
    pub separators: Option<(String, String)>,
    pub sort_keys: bool,
    pub ensure_ascii: bool,
}

/// `json.dumps(v, **opts)`.
pub fn dumps(v: &Value, opts: &JsonOptions) -> String {
    let (item, key) = match (&opts.separators, &opts.indent) {
        (Some((i, k)), _) => (i.as_str(), k.as_str()),
        (None, Some(_)) => (",", ": "),
        (None, None) => (", ", ": "),
    };
    let mut out = String::new();
    Dumper {
        opts,
        item,
        key,
        out: &mut out,
    }
    .value(v, 0);
    out
}

struct Dumper<'a> {
    opts: &'a JsonOptions,
    item: &'a str,
    key: &'a str,
    out: &'a mut String,
}

impl Dumper<'_> {
    fn newline(&mut self, level: usize) {
        if let Some(ind) = &self.opts.indent {
            self.out.push('\n');
            for _ in 0..level {
                self.out.push_str(ind);
            }
        }
    }

    fn string(&mut self, s: &str) {
        self.out.push('"');
        for c in s.chars() {
            match c {
                '"' => self.out.push_str("\\\""),
                '\\' => self.out.push_str("\\\\"),
                '\n' => self.out.push_str("\\n"),
                '\r' => self.out.push_str("\\r"),
                '\t' => self.out.push_str("\\t"),
                '\u{8}' => self.out.push_str("\\b"),
                '\u{c}' => self.out.push_str("\\f"),
                c if (c as u32) < 0x20 || (self.opts.ensure_ascii && !c.is_ascii()) => {
                    let mut buf = [0u16; 2];
                    for unit in c.encode_utf16(&mut buf) {
                        self.out.push_str(&format!("\\u{unit:04x}"));
                    }
                }
                c => self.out.push(c),
            }
        }
        self.out.push('"');
    }

    fn value(&mut self, v: &Value, level: usize) {
        match v {
            Value::Null => self.out.push_str("null"),
            Value::Bool(b) => self.out.push_str(if *b { "true" } else { "false" }),
            Value::Number(n) => self.out.push_str(&number(n)),
            Value::String(s) => self.string(s),
            Value::Array(a) if a.is_empty() => self.out.push_str("[]"),
            Value::Array(a) => {
                self.out.push('[');
                for (i, x) in a.iter().enumerate() {
                    if i > 0 {
                        self.out.push_str(self.item);
                    }
                    self.newline(level + 1);
                    self.value(x, level + 1);
                }
                self.newline(level);
                self.out.push(']');
            }
            Value::Object(m) if m.is_empty() => self.out.push_str("{}"),
            Value::Object(m) => self.object(m, level),
        }
    }

    fn object(&mut self, m: &Map<String, Value>, level: usize) {
        let mut entries: Vec<(&String, &Value)> = m.iter().collect();
        if self.opts.sort_keys {
            entries.sort_by(|a, b| a.0.cmp(b.0));
        }
        self.out.push('{');
        for (i, (k, x)) in entries.into_iter().enumerate() {
            if i > 0 {
                self.out.push_str(self.item);
            }
            self.newline(level + 1);
            self.string(k);
            self.out.push_str(self.key);
            self.value(x, level + 1);
        }
        self.newline(level);
        self.out.push('}');
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn floats_as_python_repr() {
        for (x, s) in [
            (1.0, "1.0"),
            (0.5, "0.5"),
            (-2.25, "-2.25"),
            (1e20, "1e+20"),
            (1e16, "1e+16"),
            (1e15, "1000000000000000.0"),
            (0.0001, "0.0001"),
            (0.00001, "1e-05"),
            (1.5e-7, "1.5e-07"),
            (0.1 + 0.2, "0.30000000000000004"),
            (123456.789, "123456.789"),
            (-0.0, "-0.0"),
        ] {
            assert_eq!(float_repr(x), s, "{x}");
        }
    }

    #[test]
    fn repr_and_dumps() {
        let v = json!({"a": [1, 2.5, null, true, "it's", "say \"hi\"", "x\ty\u{0}"], "é": {}});
        let mut r = String::new();
        repr(&v, &mut r);
        assert_eq!(
            r,
            r#"{'a': [1, 2.5, None, True, "it's", 'say "hi"', 'x\ty\x00'], 'é': {}}"#
        );
        assert_eq!(
            dumps(&v, &JsonOptions::default()),
            r#"{"a": [1, 2.5, null, true, "it's", "say \"hi\"", "x\ty\u0000"], "é": {}}"#
        );
        let opts = JsonOptions {
            indent: Some("  ".into()),
            sort_keys: true,
            ensure_ascii: true,
            ..Default::default()
        };
        assert_eq!(
            dumps(&json!({"b": [], "a": ["😀", {}]}), &opts),
            "{\n  \"a\": [\n    \"\\ud83d\\ude00\",\n    {}\n  ],\n  \"b\": []\n}"
        );
        let opts = JsonOptions {
            separators: Some((",".into(), ":".into())),
            ..Default::default()
        };
        assert_eq!(dumps(&json!({"a": [1, 2]}), &opts), r#"{"a":[1,2]}"#);
    }
}
