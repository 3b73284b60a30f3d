//! Streaming responses: server-sent events or NDJSON over an [`Output`],
//! with write batching.
//!
//! Every host write crosses the component boundary and flushes the HTTP
//! body, so writing each token separately is wasteful. [`StreamWriter`]
//! appends framed events to a buffer and writes it when
//!
//! * the buffer reaches the flush threshold ([`StreamWriter::flush_threshold`],
//!   default [`DEFAULT_FLUSH_THRESHOLD`]),
//! * [`StreamWriter::flush`] is called — do it before blocking on the engine,
//!   so every event that is ready reaches the client without delay, or
//! * after every event, with [`StreamWriter::flush_each_event`].
//!
//! [`StreamWriter::finish`] writes what is left.

use serde::Serialize;

use crate::http::{Disconnected, Output};

/// Default batch size in bytes.
pub const DEFAULT_FLUSH_THRESHOLD: usize = 16 << 10;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Framing {
    /// `text/event-stream`: `data: <json>\n\n` per event.
    Sse,
    /// `application/x-ndjson`: one JSON value per line.
    Ndjson,
}

impl Framing {
    pub fn content_type(self) -> &'static str {
        match self {
            Framing::Sse => "text/event-stream",
            Framing::Ndjson => "application/x-ndjson",
        }
    }
}

/// Appends one framed JSON event to `buf`.
pub fn push_json<T: Serialize + ?Sized>(buf: &mut Vec<u8>, framing: Framing, value: &T) {
    match framing {
        Framing::Sse => {
            buf.extend_from_slice(b"data: ");
            serde_json::to_writer(&mut *buf, value).expect("JSON serialises");
            buf.extend_from_slice(b"\n\n");
        }
        Framing::Ndjson => {
            serde_json::to_writer(&mut *buf, value).expect("JSON serialises");
            buf.push(b'\n');
        }
    }
}

/// Appends an SSE event with an optional `event:` name; multi-line data
/// becomes one `data:` line per line, as the SSE format requires. A line
/// ends at CRLF, LF or a lone CR, as an SSE reader splits them: a CR left
/// inside a `data:` line would end it there and lose the rest.
pub fn push_sse(buf: &mut Vec<u8>, event: Option<&str>, data: &str) {
    if let Some(name) = event {
        buf.extend_from_slice(b"event: ");
        buf.extend_from_slice(name.replace(['\r', '\n'], " ").as_bytes());
        buf.push(b'\n');
    }
    let mut rest = data;
    loop {
        let (line, next) = match rest.find(['\r', '\n']) {
            Some(i) => {
                let eol = if rest[i..].starts_with("\r\n") { 2 } else { 1 };
                (&rest[..i], Some(&rest[i + eol..]))
            }
            None => (rest, None),
        };
        buf.extend_from_slice(b"data: ");
        buf.extend_from_slice(line.as_bytes());
        buf.push(b'\n');
        match next {
            Some(n) => rest = n,
            None => break,
        }
    }
    buf.push(b'\n');
}

pub struct StreamWriter<'o, O: Output> {
    out: &'o mut O,
    framing: Framing,
    buf: Vec<u8>,
    threshold: usize,
    each_event: bool,
    writes: usize,
}

impl<'o, O: Output> StreamWriter<'o, O> {
    /// Sends the status and headers (content type for `framing`,
    /// `cache-control: no-cache`, `x-accel-buffering: no`, then `extra`).
    pub fn start(
        out: &'o mut O,
        status: u16,
        framing: Framing,
        extra: &[(&str, String)],
    ) -> Result<Self, Disconnected> {
        let mut headers = vec![
            ("content-type", framing.content_type().to_owned()),
            ("cache-control", "no-cache".to_owned()),
            ("x-accel-buffering", "no".to_owned()),
        ];
        headers.extend(extra.iter().cloned());
        out.start(status, &headers)?;
        Ok(StreamWriter {
            out,
            framing,
            buf: Vec::new(),
            threshold: DEFAULT_FLUSH_THRESHOLD,
            each_event: false,
            writes: 0,
        })
    }

    /// Writes once the buffer holds at least `bytes` (0 writes every event).
    pub fn flush_threshold(mut self, bytes: usize) -> Self {
        self.threshold = bytes;
        self
    }

    /// Writes every event as soon as it is added.
    pub fn flush_each_event(mut self, on: bool) -> Self {
        self.each_event = on;
        self
    }

    pub fn framing(&self) -> Framing {
        self.framing
    }

    /// Bytes waiting in the buffer.
    pub fn buffered(&self) -> usize {
        self.buf.len()
    }

    /// Host writes made so far.
    pub fn writes(&self) -> usize {
        self.writes
    }

    /// Adds one JSON event (`data: ...\n\n` or one line).
    pub fn json<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), Disconnected> {
        push_json(&mut self.buf, self.framing, value);
        self.maybe_flush()
    }

    /// Adds a raw SSE event (`event:` name optional). NDJSON streams get
    /// `data` as one line.
    pub fn sse(&mut self, event: Option<&str>, data: &str) -> Result<(), Disconnected> {
        match self.framing {
            Framing::Sse => push_sse(&mut self.buf, event, data),
            Framing::Ndjson => {
                self.buf
                    .extend_from_slice(data.replace('\n', " ").as_bytes());
                self.buf.push(b'\n');
            }
        }
        self.maybe_flush()
    }

    /// OpenAI's end-of-stream marker, `data: [DONE]` (SSE only).
    pub fn done(&mut self) -> Result<(), Disconnected> {
        if self.framing == Framing::Sse {
            self.buf.extend_from_slice(b"data: [DONE]\n\n");
        }
        self.maybe_flush()
    }

    fn maybe_flush(&mut self) -> Result<(), Disconnected> {
        if self.each_event || self.buf.len() >= self.threshold {
            self.flush()
        } else {
            Ok(())
        }
    }

    /// Writes the buffered events (one host write), if any.
    pub fn flush(&mut self) -> Result<(), Disconnected> {
        if self.buf.is_empty() {
            return Ok(());
        }
        self.writes += 1;
        let r = self.out.write(&self.buf);
        self.buf.clear();
        r
    }

    /// Flushes what is left and gives the output back.
    pub fn finish(mut self) -> Result<&'o mut O, Disconnected> {
        self.flush()?;
        Ok(self.out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::Recorder;
    use serde_json::json;

    #[test]
    fn sse_framing() {
        let mut buf = Vec::new();
        push_json(&mut buf, Framing::Sse, &json!({"a": "x\ny"}));
        push_sse(&mut buf, Some("ping"), "l1\nl2");
        push_sse(&mut buf, None, "");
        assert_eq!(
            String::from_utf8(buf).unwrap(),
            "data: {\"a\":\"x\\ny\"}\n\nevent: ping\ndata: l1\ndata: l2\n\ndata: \n\n"
        );
    }

    /// Found by fuzz/fuzz_targets/sse_writer.rs: a lone CR ended the data
    /// line for an SSE reader, and the text after it was lost.
    #[test]
    fn sse_data_splits_at_every_line_ending() {
        let mut buf = Vec::new();
        push_sse(&mut buf, None, "a\rb\r\nc\nd\r");
        assert_eq!(
            String::from_utf8(buf).unwrap(),
            "data: a\ndata: b\ndata: c\ndata: d\ndata: \n\n"
        );
    }

    #[test]
    fn ndjson_framing() {
        let mut out = Recorder::default();
        let mut w = StreamWriter::start(&mut out, 200, Framing::Ndjson, &[]).unwrap();
        w.json(&json!({"response": "a\nb", "done": false})).unwrap();
        w.json(&json!({"done": true})).unwrap();
        w.done().unwrap(); // nothing in NDJSON
        w.finish().unwrap();
        assert_eq!(out.header("content-type"), Some("application/x-ndjson"));
        assert_eq!(out.header("cache-control"), Some("no-cache"));
        let body = out.body_string();
        assert_eq!(
            body,
            "{\"response\":\"a\\nb\",\"done\":false}\n{\"done\":true}\n"
        );
        for line in body.lines() {
            serde_json::from_str::<serde_json::Value>(line).unwrap();
        }
    }

    #[test]
    fn batching() {
        let mut out = Recorder::default();
        let mut w = StreamWriter::start(&mut out, 200, Framing::Sse, &[("x-a", "1".into())])
            .unwrap()
            .flush_threshold(64);
        for i in 0..10 {
            w.json(&json!({ "i": i })).unwrap(); // 15 bytes each
        }
        // 64-byte threshold: a write after the 5th event (75 bytes), then the 10th.
        assert_eq!(w.writes(), 2);
        assert_eq!(w.buffered(), 0);
        w.json(&json!({"i": 10})).unwrap();
        assert_eq!((w.writes(), w.buffered()), (2, 16));
        w.flush().unwrap();
        w.flush().unwrap(); // empty: no write
        assert_eq!(w.writes(), 3);
        w.done().unwrap();
        let out = w.finish().unwrap();
        assert_eq!(out.writes.len(), 4);
        assert_eq!(out.writes[0].len(), 75);
        assert_eq!(out.header("x-a"), Some("1"));
        let body = out.body_string();
        assert!(
            body.ends_with("data: {\"i\":10}\n\ndata: [DONE]\n\n"),
            "{body}"
        );
        assert_eq!(body.matches("data: ").count(), 12);
    }

    #[test]
    fn each_event_and_disconnect() {
        let mut out = Recorder::default();
        let mut w = StreamWriter::start(&mut out, 200, Framing::Ndjson, &[])
            .unwrap()
            .flush_each_event(true);
        w.json(&1).unwrap();
        w.json(&2).unwrap();
        assert_eq!(w.writes(), 2);
        w.finish().unwrap();
        assert_eq!(out.writes, vec![b"1\n".to_vec(), b"2\n".to_vec()]);

        let mut out = Recorder {
            fail_after: Some(1),
            ..Recorder::default()
        };
        let mut w = StreamWriter::start(&mut out, 200, Framing::Ndjson, &[])
            .unwrap()
            .flush_each_event(true);
        w.json(&1).unwrap();
        assert_eq!(w.json(&2), Err(Disconnected));
    }
}
