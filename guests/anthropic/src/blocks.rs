//! Content blocks from the SDK's output segments: the stream's
//! `content_block_start` / `content_block_delta` / `content_block_stop`
//! events ([`event`]), and a response's `content` array ([`Content`]).
//!
//! Reasoning is a `thinking` block, answer text a `text` block, each tool
//! call a `tool_use` block whose `input` streams as `input_json_delta`
//! fragments (one per parameter, as the model completes it).

use serde_json::{Value, json};

use qwasi_guest_sdk::segments::{Kind, Segment};

/// One stream event: its SSE `event:` name and its data.
pub type Event = (&'static str, Value);

/// The empty block a segment starts.
fn block(kind: &Kind) -> Value {
    match kind {
        Kind::Reasoning => json!({"type": "thinking", "thinking": "", "signature": ""}),
        Kind::Text => json!({"type": "text", "text": ""}),
        Kind::ToolCall { id, name } => {
            json!({"type": "tool_use", "id": id, "name": name, "input": {}})
        }
    }
}

/// The stream event of a segment event (`kinds[i]`: segment `i`'s kind).
pub fn event(s: &Segment, kinds: &mut Vec<Kind>) -> Event {
    match s {
        Segment::Open { index, kind } => {
            kinds.push(kind.clone());
            (
                "content_block_start",
                json!({"type": "content_block_start", "index": index, "content_block": block(kind)}),
            )
        }
        Segment::Delta { index, text } => {
            let delta = match kinds.get(*index) {
                Some(Kind::Reasoning) => json!({"type": "thinking_delta", "thinking": text}),
                Some(Kind::ToolCall { .. }) => {
                    json!({"type": "input_json_delta", "partial_json": text})
                }
                _ => json!({"type": "text_delta", "text": text}),
            };
            (
                "content_block_delta",
                json!({"type": "content_block_delta", "index": index, "delta": delta}),
            )
        }
        Segment::Close { index } => (
            "content_block_stop",
            json!({"type": "content_block_stop", "index": index}),
        ),
    }
}

/// A response's `content`, built from the segment events.
#[derive(Debug, Default)]
pub struct Content {
    blocks: Vec<(Kind, String)>,
}

impl Content {
    pub fn apply(&mut self, segments: &[Segment]) {
        for s in segments {
            match s {
                Segment::Open { kind, .. } => self.blocks.push((kind.clone(), String::new())),
                Segment::Delta { index, text } => {
                    if let Some((_, t)) = self.blocks.get_mut(*index) {
                        t.push_str(text);
                    }
                }
                Segment::Close { .. } => {}
            }
        }
    }

    /// The `content` array (tool inputs parsed from their JSON text).
    pub fn finish(self) -> Vec<Value> {
        self.blocks
            .into_iter()
            .map(|(kind, text)| {
                let mut b = block(&kind);
                match kind {
                    Kind::Reasoning => b["thinking"] = Value::String(text),
                    Kind::Text => b["text"] = Value::String(text),
                    Kind::ToolCall { .. } => {
                        b["input"] = serde_json::from_str(&text).unwrap_or_else(|_| json!({}))
                    }
                }
                b
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_and_content_agree() {
        let call = Kind::ToolCall {
            id: "toolu_1".into(),
            name: "f".into(),
        };
        let segs = vec![
            Segment::Open {
                index: 0,
                kind: Kind::Reasoning,
            },
            Segment::Delta {
                index: 0,
                text: "Hmm".into(),
            },
            Segment::Close { index: 0 },
            Segment::Open {
                index: 1,
                kind: Kind::Text,
            },
            Segment::Delta {
                index: 1,
                text: "Sure.".into(),
            },
            Segment::Close { index: 1 },
            Segment::Open {
                index: 2,
                kind: call,
            },
            Segment::Delta {
                index: 2,
                text: "{\"a\": ".into(),
            },
            Segment::Delta {
                index: 2,
                text: "1}".into(),
            },
            Segment::Close { index: 2 },
        ];
        let mut kinds = Vec::new();
        let ev: Vec<Event> = segs.iter().map(|s| event(s, &mut kinds)).collect();
        assert_eq!(ev[0].1["content_block"]["type"], "thinking");
        assert_eq!(
            ev[1].1["delta"],
            json!({"type": "thinking_delta", "thinking": "Hmm"})
        );
        assert_eq!(
            ev[4].1["delta"],
            json!({"type": "text_delta", "text": "Sure."})
        );
        assert_eq!(
            ev[6].1["content_block"],
            json!({"type": "tool_use", "id": "toolu_1", "name": "f", "input": {}})
        );
        assert_eq!(
            ev[7].1["delta"],
            json!({"type": "input_json_delta", "partial_json": "{\"a\": "})
        );
        assert_eq!(
            ev[9],
            (
                "content_block_stop",
                json!({"type": "content_block_stop", "index": 2})
            )
        );
        let mut c = Content::default();
        c.apply(&segs);
        assert_eq!(
            Value::Array(c.finish()),
            json!([
                {"type": "thinking", "thinking": "Hmm", "signature": ""},
                {"type": "text", "text": "Sure."},
                {"type": "tool_use", "id": "toolu_1", "name": "f", "input": {"a": 1}},
            ])
        );
    }
}
