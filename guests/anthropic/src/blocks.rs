//! Content blocks from the driver's pieces: the stream's
//! `content_block_start` / `content_block_delta` / `content_block_stop`
//! events ([`Blocks`]), and the same events folded into a response's
//! `content` array ([`Content`]), so both modes agree by construction.
//!
//! Reasoning goes to a `thinking` block, answer text to a `text` block, each
//! tool call to a `tool_use` block whose `input` streams as
//! `input_json_delta` fragments (one per parameter, as the model completes
//! it). A block stays open while its kind continues; another kind closes it.

use serde_json::{Value, json};

use qwasi_guest_sdk::driver::{Piece, ToolEvent};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Thinking,
    Text,
    ToolUse,
}

/// One stream event: its SSE `event:` name and its data.
pub type Event = (&'static str, Value);

/// The open block and the next block index.
#[derive(Debug, Default)]
pub struct Blocks {
    open: Option<(usize, Kind)>,
    next: usize,
}

impl Blocks {
    pub fn new() -> Self {
        Self::default()
    }

    /// The events of one piece (reasoning, then text, then tool calls).
    pub fn piece(&mut self, p: &Piece, out: &mut Vec<Event>) {
        if !p.reasoning.is_empty() {
            let i = self.ensure(Kind::Thinking, out);
            out.push(delta(
                i,
                json!({"type": "thinking_delta", "thinking": p.reasoning}),
            ));
        }
        if !p.content.is_empty() {
            let i = self.ensure(Kind::Text, out);
            out.push(delta(i, json!({"type": "text_delta", "text": p.content})));
        }
        for e in &p.tool_calls {
            match e {
                ToolEvent::Start { id, name, .. } => {
                    self.close(out);
                    let block = json!({"type": "tool_use", "id": id, "name": name, "input": {}});
                    self.start(Kind::ToolUse, block, out);
                }
                ToolEvent::Args { fragment, .. } => {
                    let i = self.ensure(Kind::ToolUse, out);
                    out.push(delta(
                        i,
                        json!({"type": "input_json_delta", "partial_json": fragment}),
                    ));
                }
            }
        }
    }

    /// Closes the open block, if any (at the end of the message).
    pub fn close(&mut self, out: &mut Vec<Event>) {
        if let Some((i, _)) = self.open.take() {
            out.push((
                "content_block_stop",
                json!({"type": "content_block_stop", "index": i}),
            ));
        }
    }

    /// The open block's index, opening one of `kind` if needed.
    fn ensure(&mut self, kind: Kind, out: &mut Vec<Event>) -> usize {
        if let Some((i, k)) = self.open
            && k == kind
        {
            return i;
        }
        self.close(out);
        let block = match kind {
            Kind::Thinking => json!({"type": "thinking", "thinking": "", "signature": ""}),
            Kind::Text => json!({"type": "text", "text": ""}),
            // Arguments without a started call do not happen; an empty
            // call keeps the stream well formed if they ever do.
            Kind::ToolUse => json!({"type": "tool_use", "id": "", "name": "", "input": {}}),
        };
        self.start(kind, block, out)
    }

    fn start(&mut self, kind: Kind, block: Value, out: &mut Vec<Event>) -> usize {
        let i = self.next;
        self.next += 1;
        self.open = Some((i, kind));
        out.push((
            "content_block_start",
            json!({"type": "content_block_start", "index": i, "content_block": block}),
        ));
        i
    }
}

fn delta(index: usize, d: Value) -> Event {
    (
        "content_block_delta",
        json!({"type": "content_block_delta", "index": index, "delta": d}),
    )
}

/// A response's `content`, built from the stream's events.
#[derive(Debug, Default)]
pub struct Content {
    blocks: Vec<Value>,
    /// The arguments JSON text of each block so far (tool_use blocks).
    json: Vec<String>,
}

impl Content {
    pub fn apply(&mut self, events: &[Event]) {
        for (name, e) in events {
            match *name {
                "content_block_start" => {
                    self.blocks.push(e["content_block"].clone());
                    self.json.push(String::new());
                }
                "content_block_delta" => {
                    let i = e["index"].as_u64().unwrap_or(0) as usize;
                    let (Some(b), Some(j)) = (self.blocks.get_mut(i), self.json.get_mut(i)) else {
                        continue;
                    };
                    let d = &e["delta"];
                    let field = match d["type"].as_str() {
                        Some("text_delta") => "text",
                        Some("thinking_delta") => "thinking",
                        Some("input_json_delta") => {
                            j.push_str(d["partial_json"].as_str().unwrap_or(""));
                            continue;
                        }
                        _ => continue,
                    };
                    if let Some(Value::String(s)) = b.get_mut(field) {
                        s.push_str(d[field].as_str().unwrap_or(""));
                    }
                }
                _ => {}
            }
        }
    }

    /// The `content` array (tool inputs parsed from their JSON text).
    pub fn finish(mut self) -> Vec<Value> {
        for (b, j) in self.blocks.iter_mut().zip(&self.json) {
            if b["type"] == "tool_use" && !j.is_empty() {
                b["input"] = serde_json::from_str(j).unwrap_or_else(|_| json!({}));
            }
        }
        self.blocks
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn piece(reasoning: &str, content: &str, tools: Vec<ToolEvent>) -> Piece {
        Piece {
            reasoning: reasoning.into(),
            content: content.into(),
            tool_calls: tools,
            ..Piece::default()
        }
    }

    #[test]
    fn blocks_open_and_close_by_kind() {
        let mut b = Blocks::new();
        let mut ev = Vec::new();
        b.piece(&piece("Let me", "", vec![]), &mut ev);
        b.piece(&piece(" think", "", vec![]), &mut ev);
        b.piece(&piece("", "Sure.", vec![]), &mut ev);
        b.piece(
            &piece(
                "",
                "",
                vec![
                    ToolEvent::Start {
                        index: 0,
                        id: "toolu_1".into(),
                        name: "f".into(),
                    },
                    ToolEvent::Args {
                        index: 0,
                        fragment: "{\"a\": 1".into(),
                    },
                ],
            ),
            &mut ev,
        );
        b.piece(
            &piece(
                "",
                "",
                vec![
                    ToolEvent::Args {
                        index: 0,
                        fragment: "}".into(),
                    },
                    ToolEvent::Start {
                        index: 1,
                        id: "toolu_2".into(),
                        name: "g".into(),
                    },
                    ToolEvent::Args {
                        index: 1,
                        fragment: "{}".into(),
                    },
                ],
            ),
            &mut ev,
        );
        b.close(&mut ev);
        let names: Vec<String> = ev
            .iter()
            .map(|(n, e)| {
                let i = e["index"].as_u64().unwrap();
                format!("{n}#{i}")
            })
            .collect();
        assert_eq!(
            names,
            [
                "content_block_start#0",
                "content_block_delta#0",
                "content_block_delta#0",
                "content_block_stop#0",
                "content_block_start#1",
                "content_block_delta#1",
                "content_block_stop#1",
                "content_block_start#2",
                "content_block_delta#2",
                "content_block_delta#2",
                "content_block_stop#2",
                "content_block_start#3",
                "content_block_delta#3",
                "content_block_stop#3",
            ]
        );
        let mut c = Content::default();
        c.apply(&ev);
        assert_eq!(
            Value::Array(c.finish()),
            json!([
                {"type": "thinking", "thinking": "Let me think", "signature": ""},
                {"type": "text", "text": "Sure."},
                {"type": "tool_use", "id": "toolu_1", "name": "f", "input": {"a": 1}},
                {"type": "tool_use", "id": "toolu_2", "name": "g", "input": {}},
            ])
        );
    }

    #[test]
    fn nothing_makes_no_blocks() {
        let mut b = Blocks::new();
        let mut ev = Vec::new();
        b.piece(&Piece::default(), &mut ev);
        b.close(&mut ev);
        assert!(ev.is_empty());
    }
}
