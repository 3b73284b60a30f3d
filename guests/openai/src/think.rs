//! Splits a thinking model's output at `</think>` into reasoning and content.
//! The Qwen3.6 generation prompt ends in `<think>\n`, so output starts as
//! reasoning; after `</think>` it is content, with the newlines that follow
//! the tag dropped. A partial `</think>` at the end of a piece is held back.

pub const THINK_END: &str = "</think>";

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Split {
    pub reasoning: String,
    pub content: String,
}

#[derive(Debug, Clone, Default)]
pub struct ThinkSplitter {
    in_content: bool,
    /// Content has started (leading newlines after the tag are skipped until then).
    content_started: bool,
    held: String,
}

impl ThinkSplitter {
    pub fn new() -> Self {
        Self::default()
    }

    /// `</think>` has been seen.
    pub fn in_content(&self) -> bool {
        self.in_content
    }

    pub fn push(&mut self, text: &str) -> Split {
        let mut out = Split::default();
        if self.in_content {
            self.push_content(text, &mut out);
            return out;
        }
        self.held.push_str(text);
        if let Some(at) = self.held.find(THINK_END) {
            out.reasoning = self.held[..at].to_owned();
            let rest = self.held[at + THINK_END.len()..].to_owned();
            self.held.clear();
            self.in_content = true;
            self.push_content(&rest, &mut out);
            return out;
        }
        // Hold back a suffix that could begin `</think>`.
        let mut keep = 0;
        for len in (1..THINK_END.len().min(self.held.len() + 1)).rev() {
            let start = self.held.len() - len;
            if self.held.is_char_boundary(start)
                && THINK_END
                    .as_bytes()
                    .starts_with(&self.held.as_bytes()[start..])
            {
                keep = len;
                break;
            }
        }
        let split = self.held.len() - keep;
        out.reasoning = self.held[..split].to_owned();
        self.held.drain(..split);
        out
    }

    fn push_content(&mut self, text: &str, out: &mut Split) {
        let text = if self.content_started {
            text
        } else {
            text.trim_start_matches('\n')
        };
        if !text.is_empty() {
            self.content_started = true;
            out.content.push_str(text);
        }
    }

    /// End of output: whatever was held is reasoning (no `</think>` came).
    pub fn finish(&mut self) -> Split {
        Split {
            reasoning: std::mem::take(&mut self.held),
            content: String::new(),
        }
    }

    /// Splits a complete output at once.
    pub fn split_all(text: &str) -> Split {
        let mut s = ThinkSplitter::new();
        let mut a = s.push(text);
        let b = s.finish();
        a.reasoning.push_str(&b.reasoning);
        a
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn streamed(pieces: &[String]) -> (String, String, Vec<Split>) {
        let mut s = ThinkSplitter::new();
        let mut r = String::new();
        let mut c = String::new();
        let mut all = Vec::new();
        for p in pieces {
            let x = s.push(p);
            r.push_str(&x.reasoning);
            c.push_str(&x.content);
            all.push(x);
        }
        let x = s.finish();
        r.push_str(&x.reasoning);
        c.push_str(&x.content);
        all.push(x);
        (r, c, all)
    }

    #[test]
    fn split_whole() {
        let s = ThinkSplitter::split_all("Let me think.\n</think>\n\nThe answer is 4.");
        assert_eq!(s.reasoning, "Let me think.\n");
        assert_eq!(s.content, "The answer is 4.");
        let s = ThinkSplitter::split_all("still thinking </thi");
        assert_eq!(s.reasoning, "still thinking </thi");
        assert_eq!(s.content, "");
        let s = ThinkSplitter::split_all("\n</think>\n\n");
        assert_eq!(s.reasoning, "\n");
        assert_eq!(s.content, "");
        let s = ThinkSplitter::split_all("a</think>b</think>\n");
        assert_eq!(s.content, "b</think>\n");
    }

    #[test]
    fn every_chunk_boundary() {
        let text = "Hmm, 2+2 → 4 </ ok\n</think>\n\nIt is 4.\n\nDone";
        let chars: Vec<char> = text.chars().collect();
        for i in 0..=chars.len() {
            for j in i..=chars.len() {
                let pieces: Vec<String> = vec![
                    chars[..i].iter().collect(),
                    chars[i..j].iter().collect(),
                    chars[j..].iter().collect(),
                ];
                let (r, c, all) = streamed(&pieces);
                assert_eq!(r, "Hmm, 2+2 → 4 </ ok\n", "{pieces:?}");
                assert_eq!(c, "It is 4.\n\nDone", "{pieces:?}");
                for x in &all {
                    assert!(!x.reasoning.contains("</think"), "{pieces:?}");
                    assert!(!x.content.contains("think"), "{pieces:?}");
                }
            }
        }
        let one: Vec<String> = chars.iter().map(|c| c.to_string()).collect();
        let (r, c, _) = streamed(&one);
        assert_eq!(
            (r.as_str(), c.as_str()),
            ("Hmm, 2+2 → 4 </ ok\n", "It is 4.\n\nDone")
        );
    }

    #[test]
    fn content_order_reasoning_first() {
        let mut s = ThinkSplitter::new();
        let x = s.push("r</think>\n\nc");
        assert_eq!(
            x,
            Split {
                reasoning: "r".into(),
                content: "c".into()
            }
        );
        assert_eq!(s.push("\n\nd").content, "\n\nd");
    }
}
