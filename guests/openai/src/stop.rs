//! Stop strings over streamed text. Text that could be the start of a stop
//! string is held back until it either completes one (generation ends, the
//! stop string and everything after it is dropped) or cannot any more (it is
//! released). So a stop string never leaks into output, streamed or not.

#[derive(Debug, Clone, Default)]
pub struct StopMatcher {
    stops: Vec<String>,
    held: String,
    stopped: bool,
}

/// What one [`StopMatcher::push`] gives back.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Released {
    /// Text that is now safe to emit.
    pub text: String,
    /// A stop string was completed: nothing more follows.
    pub stopped: bool,
}

impl StopMatcher {
    pub fn new(stops: Vec<String>) -> Self {
        StopMatcher {
            stops: stops.into_iter().filter(|s| !s.is_empty()).collect(),
            held: String::new(),
            stopped: false,
        }
    }

    pub fn is_stopped(&self) -> bool {
        self.stopped
    }

    /// Feeds more generated text.
    pub fn push(&mut self, text: &str) -> Released {
        if self.stopped {
            return Released {
                text: String::new(),
                stopped: true,
            };
        }
        if self.stops.is_empty() {
            return Released {
                text: text.to_owned(),
                stopped: false,
            };
        }
        self.held.push_str(text);
        // The stop string completed first (earliest end; at the same end the
        // earlier start), so the result does not depend on how text is chunked.
        let hit = self
            .stops
            .iter()
            .filter_map(|s| self.held.find(s.as_str()).map(|i| (i + s.len(), i)))
            .min();
        if let Some((_, at)) = hit {
            let text = self.held[..at].to_owned();
            self.held.clear();
            self.stopped = true;
            return Released {
                text,
                stopped: true,
            };
        }
        let keep = self.holdback_len();
        let split = self.held.len() - keep;
        let text = self.held[..split].to_owned();
        self.held.drain(..split);
        Released {
            text,
            stopped: false,
        }
    }

    /// The generation ended without a stop string: release what was held.
    pub fn finish(&mut self) -> String {
        std::mem::take(&mut self.held)
    }

    /// Length of the longest suffix of `held` that is a proper prefix of a stop string.
    fn holdback_len(&self) -> usize {
        let mut best = 0;
        for stop in &self.stops {
            let max = (stop.len() - 1).min(self.held.len());
            for len in (best + 1..=max).rev() {
                let start = self.held.len() - len;
                if self.held.is_char_boundary(start)
                    && stop.as_bytes().starts_with(&self.held.as_bytes()[start..])
                {
                    best = len;
                    break;
                }
            }
        }
        best
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feeds `pieces`, returns (emitted text, stopped, chunks emitted).
    fn run(stops: &[&str], pieces: &[&str]) -> (String, bool, Vec<String>) {
        let mut m = StopMatcher::new(stops.iter().map(|s| s.to_string()).collect());
        let mut out = String::new();
        let mut chunks = Vec::new();
        for p in pieces {
            let r = m.push(p);
            out.push_str(&r.text);
            chunks.push(r.text);
            if r.stopped {
                return (out, true, chunks);
            }
        }
        let rest = m.finish();
        out.push_str(&rest);
        chunks.push(rest);
        (out, false, chunks)
    }

    /// Splits `s` at char boundaries into pieces of the given sizes (in chars).
    fn split_at_all(s: &str) -> Vec<Vec<String>> {
        let chars: Vec<char> = s.chars().collect();
        let n = chars.len();
        let mut all = Vec::new();
        // Every way to cut into at most 3 pieces, plus one char at a time.
        for i in 0..=n {
            for j in i..=n {
                all.push(vec![
                    chars[..i].iter().collect(),
                    chars[i..j].iter().collect(),
                    chars[j..].iter().collect(),
                ]);
            }
        }
        all.push(chars.iter().map(|c| c.to_string()).collect());
        all
    }

    #[test]
    fn stop_at_every_split_point() {
        let text = "Hello world. STOP here STOP";
        for pieces in split_at_all(text) {
            let refs: Vec<&str> = pieces.iter().map(|s| s.as_str()).collect();
            let (out, stopped, chunks) = run(&["STOP"], &refs);
            assert!(stopped, "{pieces:?}");
            assert_eq!(out, "Hello world. ", "{pieces:?}");
            for c in &chunks {
                assert!(!c.contains('S'), "leaked {c:?} for {pieces:?}");
            }
        }
    }

    #[test]
    fn no_leak_of_stop_prefix_then_release() {
        let text = "a STO b STOP";
        for pieces in split_at_all(text) {
            let refs: Vec<&str> = pieces.iter().map(|s| s.as_str()).collect();
            let (out, stopped, _) = run(&["STOP"], &refs);
            assert!(stopped);
            assert_eq!(out, "a STO b ");
        }
    }

    #[test]
    fn released_when_not_a_stop() {
        let text = "STO STOPPER? no: ST";
        for pieces in split_at_all(text) {
            let refs: Vec<&str> = pieces.iter().map(|s| s.as_str()).collect();
            let (out, stopped, _) = run(&["STOPS"], &refs);
            assert!(!stopped);
            assert_eq!(out, text);
        }
    }

    #[test]
    fn holds_only_possible_prefix() {
        let mut m = StopMatcher::new(vec!["</end>".into()]);
        assert_eq!(m.push("abc</").text, "abc");
        assert_eq!(m.push("en").text, "");
        assert_eq!(m.push("x").text, "</enx");
        assert_eq!(
            m.push("</end> tail"),
            Released {
                text: String::new(),
                stopped: true
            }
        );
        assert_eq!(
            m.push("more"),
            Released {
                text: String::new(),
                stopped: true
            }
        );
    }

    #[test]
    fn several_stops_earliest_wins() {
        for pieces in split_at_all("one two three") {
            let refs: Vec<&str> = pieces.iter().map(|s| s.as_str()).collect();
            let (out, stopped, _) = run(&["three", "two", "o t"], &refs);
            assert!(stopped);
            assert_eq!(out, "one ");
        }
        // Overlapping stops: "b" completes before "abc" does, however the text is chunked.
        for pieces in split_at_all("xabcd") {
            let refs: Vec<&str> = pieces.iter().map(|s| s.as_str()).collect();
            assert_eq!(run(&["abc", "b"], &refs).0, "xa", "{pieces:?}");
            assert_eq!(run(&["bcd", "abc"], &refs).0, "x", "{pieces:?}");
        }
    }

    #[test]
    fn multibyte_and_newline_stops() {
        for pieces in split_at_all("日本語\n\nです") {
            let refs: Vec<&str> = pieces.iter().map(|s| s.as_str()).collect();
            let (out, stopped, _) = run(&["\n\n"], &refs);
            assert!(stopped);
            assert_eq!(out, "日本語");
        }
        for pieces in split_at_all("xx日本語yy") {
            let refs: Vec<&str> = pieces.iter().map(|s| s.as_str()).collect();
            let (out, stopped, chunks) = run(&["本語"], &refs);
            assert!(stopped);
            assert_eq!(out, "xx日");
            assert!(chunks.iter().all(|c| !c.contains('本')));
        }
        // A stop sharing a multi-byte prefix with the text but not at a char boundary.
        let (out, stopped, _) = run(&["日x"], &["日本"]);
        assert!(!stopped);
        assert_eq!(out, "日本");
    }

    #[test]
    fn stop_at_start_and_none() {
        assert_eq!(run(&["AB"], &["AB", "C"]).0, "");
        assert_eq!(run(&[], &["AB", "C"]).0, "ABC");
        assert_eq!(run(&[""], &["AB", "C"]).0, "ABC");
    }
}
