//! The driver's pieces as a sequence of typed output segments: reasoning,
//! answer text, and one segment per tool call (its deltas are the arguments
//! JSON text). A segment stays open while its kind continues; another kind
//! closes it. APIs whose output is a list of typed parts (Anthropic's
//! content blocks, the Responses API's output items) format these events,
//! streamed or collected, so both modes agree by construction.

use crate::driver::{Piece, ToolEvent};

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Kind {
    Reasoning,
    Text,
    ToolCall { id: String, name: String },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Segment {
    Open {
        index: usize,
        kind: Kind,
    },
    /// Text of segment `index` (a tool call's: an arguments fragment).
    Delta {
        index: usize,
        text: String,
    },
    Close {
        index: usize,
    },
}

/// The open segment and the next index.
#[derive(Debug, Default)]
pub struct Segments {
    open: Option<(usize, Kind)>,
    next: usize,
}

impl Segments {
    pub fn new() -> Self {
        Self::default()
    }

    /// The segment events of one piece (reasoning, then text, then tool calls).
    pub fn piece(&mut self, p: &Piece, out: &mut Vec<Segment>) {
        if !p.reasoning.is_empty() {
            let index = self.ensure(Kind::Reasoning, out);
            out.push(Segment::Delta {
                index,
                text: p.reasoning.clone(),
            });
        }
        if !p.content.is_empty() {
            let index = self.ensure(Kind::Text, out);
            out.push(Segment::Delta {
                index,
                text: p.content.clone(),
            });
        }
        for e in &p.tool_calls {
            match e {
                ToolEvent::Start { id, name, .. } => {
                    self.close(out);
                    self.open(
                        Kind::ToolCall {
                            id: id.clone(),
                            name: name.clone(),
                        },
                        out,
                    );
                }
                ToolEvent::Args { fragment, .. } => {
                    let index = match &self.open {
                        Some((i, Kind::ToolCall { .. })) => *i,
                        // Arguments without a started call do not happen; a
                        // nameless call keeps the output well formed if they do.
                        _ => {
                            self.close(out);
                            self.open(
                                Kind::ToolCall {
                                    id: String::new(),
                                    name: String::new(),
                                },
                                out,
                            )
                        }
                    };
                    out.push(Segment::Delta {
                        index,
                        text: fragment.clone(),
                    });
                }
            }
        }
    }

    /// Closes the open segment, if any (at the end of the output).
    pub fn close(&mut self, out: &mut Vec<Segment>) {
        if let Some((index, _)) = self.open.take() {
            out.push(Segment::Close { index });
        }
    }

    /// The open segment's index, opening one of `kind` if needed.
    fn ensure(&mut self, kind: Kind, out: &mut Vec<Segment>) -> usize {
        if let Some((i, k)) = &self.open
            && *k == kind
        {
            return *i;
        }
        self.close(out);
        self.open(kind, out)
    }

    fn open(&mut self, kind: Kind, out: &mut Vec<Segment>) -> usize {
        let index = self.next;
        self.next += 1;
        self.open = Some((index, kind.clone()));
        out.push(Segment::Open { index, kind });
        index
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

    fn start(index: usize, name: &str) -> ToolEvent {
        ToolEvent::Start {
            index,
            id: format!("id{index}"),
            name: name.into(),
        }
    }

    fn args(index: usize, fragment: &str) -> ToolEvent {
        ToolEvent::Args {
            index,
            fragment: fragment.into(),
        }
    }

    #[test]
    fn segments_open_and_close_by_kind() {
        let mut s = Segments::new();
        let mut ev = Vec::new();
        s.piece(&piece("Let me", "", vec![]), &mut ev);
        s.piece(&piece(" think", "", vec![]), &mut ev);
        s.piece(&piece("", "Sure.", vec![]), &mut ev);
        s.piece(
            &piece("", "", vec![start(0, "f"), args(0, "{\"a\": 1")]),
            &mut ev,
        );
        s.piece(
            &piece("", "", vec![args(0, "}"), start(1, "g"), args(1, "{}")]),
            &mut ev,
        );
        s.close(&mut ev);
        s.close(&mut ev);
        let d = |index: usize, t: &str| Segment::Delta {
            index,
            text: t.into(),
        };
        let call = |i: usize, n: &str| Kind::ToolCall {
            id: format!("id{i}"),
            name: n.into(),
        };
        assert_eq!(
            ev,
            vec![
                Segment::Open {
                    index: 0,
                    kind: Kind::Reasoning
                },
                d(0, "Let me"),
                d(0, " think"),
                Segment::Close { index: 0 },
                Segment::Open {
                    index: 1,
                    kind: Kind::Text
                },
                d(1, "Sure."),
                Segment::Close { index: 1 },
                Segment::Open {
                    index: 2,
                    kind: call(0, "f")
                },
                d(2, "{\"a\": 1"),
                d(2, "}"),
                Segment::Close { index: 2 },
                Segment::Open {
                    index: 3,
                    kind: call(1, "g")
                },
                d(3, "{}"),
                Segment::Close { index: 3 },
            ]
        );
    }

    #[test]
    fn text_after_a_call_is_a_new_segment_and_nothing_is_none() {
        let mut s = Segments::new();
        let mut ev = Vec::new();
        s.piece(&Piece::default(), &mut ev);
        s.close(&mut ev);
        assert!(ev.is_empty());
        s.piece(&piece("", "", vec![start(0, "f")]), &mut ev);
        s.piece(&piece("", "after", vec![]), &mut ev);
        assert_eq!(
            ev[1..],
            [
                Segment::Close { index: 0 },
                Segment::Open {
                    index: 1,
                    kind: Kind::Text
                },
                Segment::Delta {
                    index: 1,
                    text: "after".into()
                }
            ]
        );
    }
}
