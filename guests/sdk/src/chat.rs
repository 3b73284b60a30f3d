//! The Qwen3.6 chat format (ChatML), for guests that build prompts from
//! messages without a template engine.
//!
//! `<|im_start|>{role}\n{content}<|im_end|>\n` per message, then the
//! generation prompt `<|im_start|>assistant\n<think>\n` (thinking) or
//! `<|im_start|>assistant\n<think>\n\n</think>\n\n` (thinking off). As in
//! Qwen's template: a first `system` message opens the prompt; assistant
//! turns before the last user message lose their reasoning, later ones keep
//! it in a `<think>` block; consecutive `tool` messages are grouped into one
//! user turn of `<tool_response>` blocks. [`render`] renders no tool
//! definitions or assistant tool calls; [`render_with`] takes them from the
//! caller (the bundled OpenAI guest renders its `tools` and `tool_calls`
//! through it).
//!
//! This is the same text the model's own `chat_template` (model-info)
//! renders for these messages: the tests compare it with
//! `tests/fixtures/chat`, rendered by transformers.

use crate::error::ApiError;
use crate::inference::Engine;

pub const THINK_START: &str = "<think>";
pub const THINK_END: &str = "</think>";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    System,
    User,
    Assistant,
    Tool,
}

impl Role {
    pub fn parse(s: &str) -> Option<Role> {
        Some(match s {
            "system" | "developer" => Role::System,
            "user" => Role::User,
            "assistant" => Role::Assistant,
            "tool" => Role::Tool,
            _ => return None,
        })
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Role::System => "system",
            Role::User => "user",
            Role::Assistant => "assistant",
            Role::Tool => "tool",
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Message {
    pub role: Role,
    pub content: String,
    /// An assistant turn's reasoning, when given apart from the content.
    pub reasoning: Option<String>,
}

impl Message {
    pub fn new(role: Role, content: impl Into<String>) -> Self {
        Message {
            role,
            content: content.into(),
            reasoning: None,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RenderOptions {
    pub add_generation_prompt: bool,
    pub enable_thinking: bool,
    /// Keep the reasoning of every assistant turn.
    pub preserve_thinking: bool,
}

impl Default for RenderOptions {
    fn default() -> Self {
        RenderOptions {
            add_generation_prompt: true,
            enable_thinking: true,
            preserve_thinking: false,
        }
    }
}

/// So that [`render_with`] takes `Message`s, or a guest's own messages with
/// more in them (tool calls) that hold one.
impl AsRef<Message> for Message {
    fn as_ref(&self) -> &Message {
        self
    }
}

/// Reasoning and content of an assistant turn (`reasoning`, or a
/// `<think>…</think>` block at the start of the content).
fn assistant_parts(m: &Message) -> (&str, &str) {
    let content = m.content.as_str();
    if let Some(r) = &m.reasoning {
        return (r, content);
    }
    match (content.find(THINK_END), content.rfind(THINK_END)) {
        (Some(first), Some(last)) => {
            let before = content[..first].trim_end_matches('\n');
            let reasoning = match before.rfind(THINK_START) {
                Some(s) => &before[s + THINK_START.len()..],
                None => before,
            };
            (
                reasoning.trim_start_matches('\n'),
                content[last + THINK_END.len()..].trim_start_matches('\n'),
            )
        }
        _ => ("", content),
    }
}

/// Renders `messages` in the Qwen3.6 format.
pub fn render(messages: &[Message], opts: RenderOptions) -> String {
    render_with(messages, opts, None, |_, _, _| {})
}

/// [`render`] with tools: `tools`, when given, opens the system turn (a
/// first `system` message's content follows it after a blank line), and
/// `tool_calls(out, message, content)` appends an assistant turn's calls
/// after its content (`content`: the turn's answer, its reasoning split off,
/// before its leading newlines are trimmed).
pub fn render_with<M: AsRef<Message>>(
    messages: &[M],
    opts: RenderOptions,
    tools: Option<&str>,
    mut tool_calls: impl FnMut(&mut String, &M, &str),
) -> String {
    let mut out = String::new();
    let n = messages.len();
    let last_query = messages
        .iter()
        .rposition(|m| {
            let m = m.as_ref();
            m.role == Role::User
                && !(m.content.starts_with("<tool_response>")
                    && m.content.ends_with("</tool_response>"))
        })
        .unwrap_or(n.saturating_sub(1));
    let first_system = messages
        .first()
        .map(AsRef::as_ref)
        .filter(|m| m.role == Role::System);
    if let Some(tools) = tools {
        out.push_str("<|im_start|>system\n");
        out.push_str(tools);
        if let Some(m) = first_system {
            out.push_str("\n\n");
            out.push_str(&m.content);
        }
        out.push_str("<|im_end|>\n");
    }
    for (i, turn) in messages.iter().enumerate() {
        let m = turn.as_ref();
        match m.role {
            Role::System if i == 0 && tools.is_some() => {}
            Role::System | Role::User => {
                out.push_str("<|im_start|>");
                out.push_str(m.role.as_str());
                out.push('\n');
                out.push_str(&m.content);
                out.push_str("<|im_end|>\n");
            }
            Role::Assistant => {
                let (reasoning, content) = assistant_parts(m);
                if opts.preserve_thinking || i > last_query {
                    out.push_str("<|im_start|>assistant\n<think>\n");
                    out.push_str(reasoning.trim_matches('\n'));
                    out.push_str("\n</think>\n\n");
                    out.push_str(content.trim_start_matches('\n'));
                } else {
                    out.push_str("<|im_start|>assistant\n");
                    out.push_str(content);
                }
                tool_calls(&mut out, turn, content);
                out.push_str("<|im_end|>\n");
            }
            Role::Tool => {
                if i == 0 || messages[i - 1].as_ref().role != Role::Tool {
                    out.push_str("<|im_start|>user");
                }
                out.push_str("\n<tool_response>\n");
                out.push_str(&m.content);
                out.push_str("\n</tool_response>");
                if i + 1 == n || messages[i + 1].as_ref().role != Role::Tool {
                    out.push_str("<|im_end|>\n");
                }
            }
        }
    }
    if opts.add_generation_prompt {
        out.push_str(if opts.enable_thinking {
            "<|im_start|>assistant\n<think>\n"
        } else {
            "<|im_start|>assistant\n<think>\n\n</think>\n\n"
        });
    }
    out
}

/// Splits a rendered prompt at each `<|im_start|>` (the first piece may
/// not start with it).
pub fn segments(text: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut start = 0;
    for (i, _) in text.match_indices("<|im_start|>") {
        if i > start {
            out.push(&text[start..i]);
            start = i;
        }
    }
    if start < text.len() {
        out.push(&text[start..]);
    }
    out
}

/// Tokenizes a rendered chat piece by piece (each piece starts with the
/// special `<|im_start|>` token, so the pieces concatenate to the whole
/// text's tokens) and returns the ids and the message boundaries inside the
/// prompt, as prefix-cache snapshot points.
pub fn tokenize_chat<E: Engine>(engine: &E, text: &str) -> Result<(Vec<u32>, Vec<u32>), ApiError> {
    let mut ids = Vec::new();
    let mut points = Vec::new();
    for seg in segments(text) {
        let t = engine.tokenize(seg).map_err(|e| {
            ApiError::invalid_value("messages", format!("could not tokenize 'messages': {e}"))
        })?;
        ids.extend(t);
        points.push(ids.len() as u32);
    }
    points.pop();
    points.retain(|&p| p > 0);
    Ok((ids, points))
}

/// Splits generated text into reasoning and answer at `</think>`, across
/// deltas (the text of a thinking generation starts in the reasoning).
#[derive(Debug, Clone, Default)]
pub struct ThinkSplitter {
    in_answer: bool,
    /// The answer's leading newlines (after `</think>`) are not sent yet.
    answer_started: bool,
    held: String,
}

impl ThinkSplitter {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn in_answer(&self) -> bool {
        self.in_answer
    }

    /// Returns (reasoning, answer) text of this delta.
    pub fn push(&mut self, text: &str) -> (String, String) {
        if self.in_answer {
            return (String::new(), self.answer(text));
        }
        self.held.push_str(text);
        if let Some(i) = self.held.find(THINK_END) {
            self.in_answer = true;
            let rest = self.held[i + THINK_END.len()..].to_owned();
            let mut reasoning = std::mem::take(&mut self.held);
            reasoning.truncate(i);
            return (reasoning, self.answer(&rest));
        }
        // Hold back a possible start of `</think>`.
        let keep = (1..THINK_END.len())
            .rev()
            .find(|&k| self.held.ends_with(&THINK_END[..k]))
            .unwrap_or(0);
        let rest = self.held.split_off(self.held.len() - keep);
        (std::mem::replace(&mut self.held, rest), String::new())
    }

    fn answer(&mut self, text: &str) -> String {
        if self.answer_started {
            return text.to_owned();
        }
        let t = text.trim_start_matches('\n');
        self.answer_started = !t.is_empty();
        t.to_owned()
    }

    /// The end: what is still held back is reasoning.
    pub fn finish(&mut self) -> String {
        std::mem::take(&mut self.held)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::FakeEngine;
    use serde_json::Value;

    /// The fixtures without tools, rendered by transformers from the
    /// Qwen3.6-format template (tests/fixtures/chat).
    #[test]
    fn matches_transformers_fixtures() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/fixtures/chat");
        let mut checked = 0;
        for entry in std::fs::read_dir(dir).unwrap() {
            let p = entry.unwrap().path();
            if p.extension().is_none_or(|e| e != "json") {
                continue;
            }
            let fx: Value = serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
            let req = &fx["request"];
            let msgs = req["messages"].as_array().unwrap();
            if req.get("tools").is_some() || msgs.iter().any(|m| m.get("tool_calls").is_some()) {
                continue;
            }
            let messages: Vec<Message> = msgs
                .iter()
                .map(|m| Message {
                    role: Role::parse(m["role"].as_str().unwrap()).unwrap(),
                    content: match &m["content"] {
                        Value::String(s) => s.clone(),
                        Value::Array(parts) => parts
                            .iter()
                            .map(|p| p["text"].as_str().unwrap())
                            .collect::<Vec<_>>()
                            .join("\n"),
                        other => panic!("{other}"),
                    },
                    reasoning: m["reasoning_content"].as_str().map(str::to_owned),
                })
                .collect();
            let kw = &req["chat_template_kwargs"];
            let opts = RenderOptions {
                add_generation_prompt: req["add_generation_prompt"].as_bool().unwrap_or(true),
                enable_thinking: kw["enable_thinking"].as_bool().unwrap_or(true),
                preserve_thinking: kw["preserve_thinking"].as_bool().unwrap_or(false),
            };
            assert_eq!(
                render(&messages, opts),
                fx["expected"].as_str().unwrap(),
                "{}",
                p.display()
            );
            checked += 1;
        }
        assert!(checked >= 5, "only {checked} fixtures checked");
    }

    #[test]
    fn basic_format() {
        let m = [
            Message::new(Role::System, "Be brief."),
            Message::new(Role::User, "Hi"),
            Message::new(Role::Assistant, "Hello"),
            Message::new(Role::User, "Bye"),
        ];
        let opts = RenderOptions {
            enable_thinking: false,
            ..RenderOptions::default()
        };
        assert_eq!(
            render(&m, opts),
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n\
             <|im_start|>assistant\nHello<|im_end|>\n<|im_start|>user\nBye<|im_end|>\n\
             <|im_start|>assistant\n<think>\n\n</think>\n\n"
        );
        let tools = [
            Message::new(Role::User, "q"),
            Message::new(Role::Tool, "r1"),
            Message::new(Role::Tool, "r2"),
        ];
        assert_eq!(
            render(
                &tools,
                RenderOptions {
                    add_generation_prompt: false,
                    ..opts
                }
            ),
            "<|im_start|>user\nq<|im_end|>\n<|im_start|>user\n<tool_response>\nr1\n</tool_response>\n<tool_response>\nr2\n</tool_response><|im_end|>\n"
        );
    }

    #[test]
    fn render_with_tools() {
        struct Call(Message, &'static str);
        impl AsRef<Message> for Call {
            fn as_ref(&self) -> &Message {
                &self.0
            }
        }
        let m = [
            Call(Message::new(Role::System, "Be brief."), ""),
            Call(Message::new(Role::User, "Hi"), ""),
            Call(
                Message::new(Role::Assistant, "<think>r</think>ok"),
                "<call/>",
            ),
        ];
        let opts = RenderOptions {
            add_generation_prompt: false,
            ..RenderOptions::default()
        };
        let calls = |out: &mut String, c: &Call, content: &str| {
            if !c.1.is_empty() {
                out.push_str(&format!("[{content}]{}", c.1));
            }
        };
        assert_eq!(
            render_with(&m, opts, Some("TOOLS"), calls),
            "<|im_start|>system\nTOOLS\n\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n\
             <|im_start|>assistant\n<think>\nr\n</think>\n\nok[ok]<call/><|im_end|>\n"
        );
        let plain: Vec<Message> = m.iter().map(|c| c.0.clone()).collect();
        assert_eq!(
            render_with(&m, opts, None, |_, _, _| {}),
            render(&plain, opts)
        );
    }

    #[test]
    fn segments_and_tokenize() {
        let text = "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n";
        assert_eq!(
            segments(text),
            vec![
                "<|im_start|>user\nhi<|im_end|>\n",
                "<|im_start|>assistant\n"
            ]
        );
        assert_eq!(segments("x<|im_start|>y"), vec!["x", "<|im_start|>y"]);
        let e = FakeEngine::new().special(1, "<|im_start|>");
        let (ids, points) = tokenize_chat(&e, text).unwrap();
        // <|im_start|> is one token, every other char one: 1 + 18, then 1 + 10.
        assert_eq!(ids.len(), 30);
        assert_eq!(points, vec![19]);
    }

    #[test]
    fn think_splitter() {
        let mut s = ThinkSplitter::new();
        assert_eq!(s.push("reason"), ("reason".into(), "".into()));
        assert_eq!(s.push("ing</th"), ("ing".into(), "".into()));
        assert_eq!(s.push("ink>\n"), ("".into(), "".into()));
        assert_eq!(s.push("\nAns"), ("".into(), "Ans".into()));
        assert_eq!(s.push("\n"), ("".into(), "\n".into()));
        assert!(s.in_answer());
        assert_eq!(s.push("wer</think>"), ("".into(), "wer</think>".into()));
        let mut s = ThinkSplitter::new();
        assert_eq!(s.push("a</"), ("a".into(), "".into()));
        assert_eq!(s.finish(), "</");
        let mut s = ThinkSplitter::new();
        assert_eq!(s.push("r</think>\n\nc"), ("r".into(), "c".into()));
        assert_eq!(s.push("\n\nd"), ("".into(), "\n\nd".into()));
    }

    /// Whole text in, (reasoning, answer) out.
    fn split_all(text: &str) -> (String, String) {
        let mut s = ThinkSplitter::new();
        let (mut r, a) = s.push(text);
        r.push_str(&s.finish());
        (r, a)
    }

    #[test]
    fn think_split_whole() {
        let s = |t: &str| split_all(t);
        assert_eq!(
            s("Let me think.\n</think>\n\nThe answer is 4."),
            ("Let me think.\n".into(), "The answer is 4.".into())
        );
        assert_eq!(
            s("still thinking </thi"),
            ("still thinking </thi".into(), "".into())
        );
        assert_eq!(s("\n</think>\n\n"), ("\n".into(), "".into()));
        assert_eq!(s("a</think>b</think>\n").1, "b</think>\n");
    }

    #[test]
    fn think_split_every_chunk_boundary() {
        let text = "Hmm, 2+2 → 4 </ ok\n</think>\n\nIt is 4.\n\nDone";
        let chars: Vec<char> = text.chars().collect();
        let mut cuts: Vec<Vec<String>> = Vec::new();
        for i in 0..=chars.len() {
            for j in i..=chars.len() {
                cuts.push(vec![
                    chars[..i].iter().collect(),
                    chars[i..j].iter().collect(),
                    chars[j..].iter().collect(),
                ]);
            }
        }
        cuts.push(chars.iter().map(|c| c.to_string()).collect());
        for pieces in cuts {
            let mut s = ThinkSplitter::new();
            let (mut r, mut a) = (String::new(), String::new());
            for p in &pieces {
                let (pr, pa) = s.push(p);
                assert!(!pr.contains("</think"), "{pieces:?}");
                assert!(!pa.contains("think"), "{pieces:?}");
                r.push_str(&pr);
                a.push_str(&pa);
            }
            r.push_str(&s.finish());
            assert_eq!(r, "Hmm, 2+2 → 4 </ ok\n", "{pieces:?}");
            assert_eq!(a, "It is 4.\n\nDone", "{pieces:?}");
        }
    }
}
