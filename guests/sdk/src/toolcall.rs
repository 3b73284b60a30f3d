//! Incremental parser of Qwen3.6 tool calls in the content stream.
//!
//! `<tool_call>\n<function=NAME>\n<parameter=KEY>\nVALUE\n</parameter>\n…</function>\n</tool_call>`
//! (or a JSON body `{"name": …, "arguments": {…}}` inside `<tool_call>`).
//! Ordinary text goes out at once; a suffix that could begin `<tool_call>`
//! (and the whitespace before it, the separator of a call) is held back only
//! while it could. A call is *committed* once `<function=NAME>` is read: its
//! start goes out with the name, then one arguments fragment per completed
//! parameter (the JSON text of the arguments object, built incrementally),
//! then its end. Markup that breaks before the commit is returned as text;
//! markup that breaks after it ends the call (with the parameters completed
//! so far) and the unparsed rest is parsed as text again. Nothing is lost.

use std::collections::HashMap;

use serde_json::{Map, Value};

pub const CALL_OPEN: &str = "<tool_call>";
pub const CALL_CLOSE: &str = "</tool_call>";
const FN_OPEN: &str = "<function=";
const FN_CLOSE: &str = "</function>";
const PARAM_OPEN: &str = "<parameter=";
const PARAM_CLOSE: &str = "</parameter>";
/// Longest function or parameter name accepted.
const MAX_NAME: usize = 256;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Out {
    Text(String),
    /// A call starts: its index and function name.
    Start {
        index: usize,
        name: String,
    },
    /// A fragment of the call's arguments JSON text.
    Args {
        index: usize,
        fragment: String,
    },
    End {
        index: usize,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Text,
    /// After `<tool_call>` (at `buf[0]`), not committed.
    Open,
    /// Inside `<function=…>`, committed.
    Function,
    /// After `</function>`, waiting for `</tool_call>`.
    AfterFunction,
}

/// Parameter types by function, from the request's `tools` JSON schemas.
pub type Schemas = HashMap<String, HashMap<String, String>>;

pub fn schemas(tools: &[Value]) -> Schemas {
    let mut out = Schemas::new();
    for t in tools {
        let f = t.get("function").unwrap_or(t);
        let Some(name) = f.get("name").and_then(Value::as_str) else {
            continue;
        };
        let mut params = HashMap::new();
        if let Some(props) = f
            .get("parameters")
            .and_then(|p| p.get("properties"))
            .and_then(Value::as_object)
        {
            for (k, s) in props {
                let ty = match s.get("type") {
                    Some(Value::String(t)) => t.clone(),
                    Some(Value::Array(a)) => a
                        .iter()
                        .filter_map(Value::as_str)
                        .find(|t| *t != "null")
                        .unwrap_or("string")
                        .to_owned(),
                    // No `type` (`anyOf`, `$ref`, `enum`...): the value is
                    // JSON when it parses (what a constrained call writes).
                    _ => "any".to_owned(),
                };
                params.insert(k.clone(), ty);
            }
        }
        out.insert(name.to_owned(), params);
    }
    out
}

/// A parameter's text typed by its schema type; falls back to a string.
pub fn typed_value(text: &str, ty: Option<&str>) -> Value {
    let t = text.trim();
    if t == "null" {
        return Value::Null;
    }
    match ty.unwrap_or("string") {
        "integer" => {
            if let Ok(i) = t.parse::<i64>() {
                return Value::from(i);
            }
            if let Ok(Value::Number(n)) = serde_json::from_str::<Value>(t) {
                return Value::Number(n);
            }
        }
        "number" => {
            if let Ok(Value::Number(n)) = serde_json::from_str::<Value>(t) {
                return Value::Number(n);
            }
        }
        "boolean" => match t.to_ascii_lowercase().as_str() {
            "true" => return Value::Bool(true),
            "false" => return Value::Bool(false),
            _ => {}
        },
        "any" => {
            if let Ok(v) = serde_json::from_str::<Value>(t) {
                return v;
            }
        }
        "object" | "array" => {
            if let Ok(v @ (Value::Object(_) | Value::Array(_))) = serde_json::from_str::<Value>(t) {
                return v;
            }
        }
        _ => {}
    }
    Value::String(text.to_owned())
}

#[derive(Debug, Clone)]
pub struct ToolParser {
    schemas: Schemas,
    state: State,
    buf: String,
    /// Whitespace held before a possible `<tool_call>`.
    ws: String,
    calls: usize,
    name: String,
    params: usize,
    markup_chars: usize,
}

impl ToolParser {
    pub fn new(schemas: Schemas) -> Self {
        ToolParser {
            schemas,
            state: State::Text,
            buf: String::new(),
            ws: String::new(),
            calls: 0,
            name: String::new(),
            params: 0,
            markup_chars: 0,
        }
    }

    /// Drops `n` bytes of call markup from the buffer.
    fn consume(&mut self, n: usize) {
        self.markup_chars += self.buf[..n].chars().filter(|c| !c.is_whitespace()).count();
        self.buf.drain(..n);
    }

    /// Non-whitespace chars consumed as call markup (for the no-loss check).
    pub fn markup_chars(&self) -> usize {
        self.markup_chars
    }

    /// Calls started so far.
    pub fn calls(&self) -> usize {
        self.calls
    }

    pub fn push(&mut self, text: &str) -> Vec<Out> {
        self.buf.push_str(text);
        let mut out = Vec::new();
        while self.step(&mut out, false) {}
        merge_text(out)
    }

    /// End of output: whatever is pending is resolved.
    pub fn finish(&mut self) -> Vec<Out> {
        let mut out = Vec::new();
        while self.step(&mut out, true) {}
        if !self.ws.is_empty() && self.calls == 0 {
            out.push(Out::Text(std::mem::take(&mut self.ws)));
        }
        self.ws.clear();
        merge_text(out)
    }

    fn text(&mut self, out: &mut Vec<Out>, s: &str) {
        if s.is_empty() {
            return;
        }
        let ws = std::mem::take(&mut self.ws);
        out.push(Out::Text(ws + s));
    }

    /// One step; false when more input is needed (or all is done).
    fn step(&mut self, out: &mut Vec<Out>, fin: bool) -> bool {
        match self.state {
            State::Text => {
                if self.buf.is_empty() {
                    return false;
                }
                if let Some(k) = self.buf.find(CALL_OPEN) {
                    let before = self.buf[..k].to_owned();
                    self.hold_ws(out, &before);
                    self.buf.drain(..k);
                    self.state = State::Open;
                    return true;
                }
                if fin {
                    let all = std::mem::take(&mut self.buf);
                    self.hold_ws(out, &all);
                    return false;
                }
                let keep = partial_suffix(&self.buf, CALL_OPEN);
                let cut = self.buf.len() - keep;
                let emit = self.buf[..cut].to_owned();
                self.hold_ws(out, &emit);
                self.buf.drain(..cut);
                false
            }
            State::Open => {
                let body = &self.buf[CALL_OPEN.len()..];
                let rest = body.trim_start();
                if rest.is_empty() {
                    return if fin { self.malformed(out) } else { false };
                }
                if rest.starts_with('{') {
                    return self.json_call(out, fin);
                }
                if let Some(after) = rest.strip_prefix(FN_OPEN) {
                    match name_end(after) {
                        Err(()) => self.malformed(out),
                        Ok(None) if fin => self.malformed(out),
                        Ok(None) => false,
                        Ok(Some(n)) => {
                            let name = after[..n].trim().to_owned();
                            let consumed = self.buf.len() - after.len() + n + 1;
                            self.consume(consumed);
                            self.ws.clear();
                            self.name = name.clone();
                            self.params = 0;
                            out.push(Out::Start {
                                index: self.calls,
                                name,
                            });
                            self.calls += 1;
                            self.state = State::Function;
                            true
                        }
                    }
                } else if !fin && FN_OPEN.starts_with(rest) {
                    false
                } else {
                    self.malformed(out)
                }
            }
            State::Function => {
                let trimmed = self.buf.trim_start();
                let skip = self.buf.len() - trimmed.len();
                if trimmed.is_empty() {
                    return if fin { self.broken(out) } else { false };
                }
                if let Some(after) = trimmed.strip_prefix(PARAM_OPEN) {
                    let n = match name_end(after) {
                        Err(()) => return self.broken(out),
                        Ok(None) if fin => return self.broken(out),
                        Ok(None) => return false,
                        Ok(Some(n)) => n,
                    };
                    let key = after[..n].trim().to_owned();
                    let value_all = &after[n + 1..];
                    let Some(end) = value_all.find(PARAM_CLOSE) else {
                        return if fin { self.broken(out) } else { false };
                    };
                    let mut v = &value_all[..end];
                    v = v.strip_prefix('\n').unwrap_or(v);
                    v = v.strip_suffix('\n').unwrap_or(v);
                    let ty = self
                        .schemas
                        .get(&self.name)
                        .and_then(|p| p.get(&key))
                        .map(String::as_str);
                    let value = typed_value(v, ty);
                    let consumed = skip + PARAM_OPEN.len() + n + 1 + end + PARAM_CLOSE.len();
                    self.consume(consumed);
                    let mut frag = String::from(if self.params == 0 { "{" } else { ", " });
                    frag.push_str(&serde_json::to_string(&key).expect("JSON"));
                    frag.push_str(": ");
                    frag.push_str(&serde_json::to_string(&value).expect("JSON"));
                    self.params += 1;
                    out.push(Out::Args {
                        index: self.calls - 1,
                        fragment: frag,
                    });
                    true
                } else if let Some(after) = trimmed.strip_prefix(FN_CLOSE) {
                    let consumed = self.buf.len() - after.len();
                    self.consume(consumed);
                    self.close_args(out);
                    self.state = State::AfterFunction;
                    true
                } else if !fin && (PARAM_OPEN.starts_with(trimmed) || FN_CLOSE.starts_with(trimmed))
                {
                    false
                } else {
                    self.broken(out)
                }
            }
            State::AfterFunction => {
                let trimmed = self.buf.trim_start();
                if let Some(after) = trimmed.strip_prefix(CALL_CLOSE) {
                    let consumed = self.buf.len() - after.len();
                    self.consume(consumed);
                    out.push(Out::End {
                        index: self.calls - 1,
                    });
                    self.state = State::Text;
                    return true;
                }
                if trimmed.is_empty() && fin {
                    // `</tool_call>` missing at the very end: the call is complete anyway.
                    self.buf.clear();
                    out.push(Out::End {
                        index: self.calls - 1,
                    });
                    self.state = State::Text;
                    return false;
                }
                if !fin && CALL_CLOSE.starts_with(trimmed) {
                    return false;
                }
                out.push(Out::End {
                    index: self.calls - 1,
                });
                self.state = State::Text;
                true
            }
        }
    }

    /// Emits `text` but holds its trailing whitespace (a call separator, maybe).
    fn hold_ws(&mut self, out: &mut Vec<Out>, text: &str) {
        let body = text.trim_end();
        if body.is_empty() {
            self.ws.push_str(text);
            return;
        }
        self.text(out, body);
        self.ws.push_str(&text[body.len()..]);
    }

    fn close_args(&mut self, out: &mut Vec<Out>) {
        out.push(Out::Args {
            index: self.calls - 1,
            fragment: if self.params == 0 { "{}" } else { "}" }.into(),
        });
    }

    /// Markup broken before the commit: `<tool_call>` is text; go on after it.
    fn malformed(&mut self, out: &mut Vec<Out>) -> bool {
        self.text(out, CALL_OPEN);
        self.buf.drain(..CALL_OPEN.len());
        self.state = State::Text;
        true
    }

    /// Markup broken after the commit: end the call, the rest is text.
    fn broken(&mut self, out: &mut Vec<Out>) -> bool {
        self.close_args(out);
        out.push(Out::End {
            index: self.calls - 1,
        });
        self.state = State::Text;
        self.ws.clear();
        true
    }

    fn json_call(&mut self, out: &mut Vec<Out>, fin: bool) -> bool {
        let Some(end) = self.buf.find(CALL_CLOSE) else {
            return if fin { self.malformed(out) } else { false };
        };
        let body = self.buf[CALL_OPEN.len()..end].trim();
        let parsed = serde_json::from_str::<Value>(body).ok().and_then(|v| {
            let o = v.as_object()?;
            let name = o.get("name")?.as_str()?.to_owned();
            let args = match o.get("arguments").or_else(|| o.get("parameters")) {
                None | Some(Value::Null) => Map::new(),
                Some(Value::Object(m)) => m.clone(),
                Some(Value::String(s)) => match serde_json::from_str(s).ok()? {
                    Value::Object(m) => m,
                    _ => return None,
                },
                Some(_) => return None,
            };
            Some((name, args))
        });
        let Some((name, args)) = parsed else {
            return self.malformed(out);
        };
        self.consume(end + CALL_CLOSE.len());
        self.ws.clear();
        let index = self.calls;
        self.calls += 1;
        out.push(Out::Start { index, name });
        out.push(Out::Args {
            index,
            fragment: serde_json::to_string(&Value::Object(args)).expect("JSON"),
        });
        out.push(Out::End { index });
        self.state = State::Text;
        true
    }
}

/// Where a `NAME>` ends (index of `>`); `Err` if it cannot be a name.
fn name_end(s: &str) -> Result<Option<usize>, ()> {
    for (i, c) in s.char_indices() {
        if c == '>' {
            return if s[..i].trim().is_empty() {
                Err(())
            } else {
                Ok(Some(i))
            };
        }
        if c == '<' || c == '\n' || i >= MAX_NAME {
            return Err(());
        }
    }
    Ok(None)
}

/// Length of the longest suffix of `s` that is a proper prefix of `tag`.
fn partial_suffix(s: &str, tag: &str) -> usize {
    for len in (1..tag.len().min(s.len() + 1)).rev() {
        let start = s.len() - len;
        if s.is_char_boundary(start) && tag.as_bytes().starts_with(&s.as_bytes()[start..]) {
            return len;
        }
    }
    0
}

fn merge_text(v: Vec<Out>) -> Vec<Out> {
    let mut out: Vec<Out> = Vec::with_capacity(v.len());
    for o in v {
        if let (Out::Text(t), Some(Out::Text(prev))) = (&o, out.last_mut()) {
            prev.push_str(t);
            continue;
        }
        if matches!(&o, Out::Text(t) if t.is_empty()) {
            continue;
        }
        out.push(o);
    }
    out
}

/// A complete call, reassembled from the parser's output.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Call {
    pub name: String,
    pub arguments: String,
}

/// Parses a complete text at once: (content, calls).
pub fn parse_all(schemas: Schemas, text: &str) -> (String, Vec<Call>) {
    let mut p = ToolParser::new(schemas);
    let mut outs = p.push(text);
    outs.extend(p.finish());
    collect(outs)
}

pub fn collect(outs: Vec<Out>) -> (String, Vec<Call>) {
    let mut content = String::new();
    let mut calls: Vec<Call> = Vec::new();
    for o in outs {
        match o {
            Out::Text(t) => content.push_str(&t),
            Out::Start { name, .. } => calls.push(Call {
                name,
                arguments: String::new(),
            }),
            Out::Args { index, fragment } => calls[index].arguments.push_str(&fragment),
            Out::End { .. } => {}
        }
    }
    (content, calls)
}

#[cfg(test)]
#[path = "toolcall_tests.rs"]
mod tests;
