//! What the fuzz targets share: a reader that turns libFuzzer's bytes into
//! choices, the scripted engine the guest APIs run over, the response
//! checks, and an SSE parser written from the WHATWG spec (independent of the
//! SDK's writer it checks).

use qwasi_guest_sdk::inference::FinishReason;
use qwasi_guest_sdk::testing::{FakeEngine, Recorder};
use serde_json::Value;

/// The Qwen3.6 chat template the fixtures were rendered with.
pub const QWEN_TEMPLATE: &str = include_str!("../../tests/fixtures/chat/qwen3_6_format.jinja");

/// Consumes fuzz input front to back.
pub struct Input<'a>(pub &'a [u8]);

impl<'a> Input<'a> {
    pub fn byte(&mut self) -> u8 {
        let Some((&b, rest)) = self.0.split_first() else {
            return 0;
        };
        self.0 = rest;
        b
    }

    pub fn u24(&mut self) -> u32 {
        u32::from_le_bytes([self.byte(), self.byte(), self.byte(), 0])
    }

    /// A length-prefixed piece (length byte, then up to that many bytes).
    pub fn piece(&mut self) -> &'a [u8] {
        let n = (self.byte() as usize).min(self.0.len());
        let (p, rest) = self.0.split_at(n);
        self.0 = rest;
        p
    }

    pub fn text(&mut self) -> String {
        String::from_utf8_lossy(self.piece()).into_owned()
    }

    pub fn rest(&mut self) -> &'a [u8] {
        std::mem::take(&mut self.0)
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// Special tokens of the scripted engine (ids past every code point, which
/// are the ids of plain characters).
pub const SPECIALS: [&str; 8] = [
    "<|im_start|>",
    "<|im_end|>",
    "<|endoftext|>",
    "<think>",
    "</think>",
    "<tool_call>",
    "</tool_call>",
    "<|vision_start|>",
];

/// A scripted engine whose output has thinking, text and a tool call, so
/// every streaming path of a guest (reasoning, content, tool-call deltas,
/// stop strings, logprobs) runs after its request parser accepted a request.
/// `template`: the model's own jinja template instead of the built-in renderer.
pub fn engine(template: bool, script: u8) -> FakeEngine {
    let mut e = FakeEngine::new();
    for (i, s) in SPECIALS.iter().enumerate() {
        e = e.special(0x11_0000 + i as u32, s);
    }
    e.info.id = "qwen3.6".into();
    e.info.aliases = vec!["qwen".into()];
    e.info.vocab_size = 0x11_0000 + SPECIALS.len() as u32;
    e.info.eos_token_ids = vec![0x11_0001, 0x11_0002];
    e.info.context_length = 2048;
    if template {
        e.info.chat_template = Some(QWEN_TEMPLATE.into());
    }
    let scripts: [&[&str]; 4] = [
        &[
            "<think>", "Let", " me", " see", "</think>", "\n\nHi", " there", "!",
        ],
        &[
            "<think>",
            "weather",
            "</think>",
            "\n\n",
            "<tool_call>",
            "\n<function=get_weather>\n<parameter=city>\nPar",
            "is\n</parameter>\n<parameter=days>\n3\n</parameter>\n</function>\n",
            "</tool_call>",
        ],
        &["{\"a\"", ": 1", ", \"b\": [true, null]}", " STOP", " after"],
        &["é", "\u{1F600}", "\n", "<", "tool_", "call", ">", " x"],
    ];
    e.script(scripts[script as usize % scripts.len()], FinishReason::Stop)
}

/// What every response must be: started, never a 5xx (the engine here never
/// fails, so a 5xx is the guest's own fault), with a body in the shape its
/// content type says.
pub fn check_response(rec: &Recorder, what: &str) {
    let status = rec
        .status
        .unwrap_or_else(|| panic!("{what}: no response started"));
    let body = rec.body();
    assert!(
        (200..500).contains(&status),
        "{what}: status {status}: {}",
        String::from_utf8_lossy(&body)
    );
    let ct = rec.header("content-type").unwrap_or("");
    if ct.starts_with("application/json") {
        serde_json::from_slice::<Value>(&body)
            .unwrap_or_else(|e| panic!("{what}: JSON body does not parse: {e}"));
    } else if ct.starts_with("text/event-stream") {
        let text = std::str::from_utf8(&body).expect("SSE body is UTF-8");
        for ev in parse_sse(text) {
            if ev.data != "[DONE]" {
                serde_json::from_str::<Value>(&ev.data)
                    .unwrap_or_else(|e| panic!("{what}: SSE data is not JSON ({e}): {}", ev.data));
            }
        }
    } else if ct.starts_with("application/x-ndjson") {
        for line in std::str::from_utf8(&body).expect("UTF-8").lines() {
            serde_json::from_str::<Value>(line).expect("one JSON value per line");
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SseEvent {
    /// The `event:` field; empty for the default (`message`).
    pub event: String,
    pub data: String,
}

/// Server-sent events as a browser's EventSource reads them (WHATWG HTML,
/// "Interpreting an event stream"): lines end at CRLF, CR or LF; a blank line
/// dispatches; `:` starts a comment; one space after the colon is dropped.
pub fn parse_sse(stream: &str) -> Vec<SseEvent> {
    let mut out = Vec::new();
    let (mut event, mut data) = (String::new(), String::new());
    let mut rest = stream;
    // A last line without its terminator is not a line yet: ignore it.
    while let Some(end) = rest.find(['\r', '\n']) {
        let line = &rest[..end];
        let skip = if rest[end..].starts_with("\r\n") {
            2
        } else {
            1
        };
        rest = &rest[end + skip..];
        if line.is_empty() {
            if !data.is_empty() {
                data.pop();
                out.push(SseEvent {
                    event: std::mem::take(&mut event),
                    data: std::mem::take(&mut data),
                });
            }
            event.clear();
            data.clear();
            continue;
        }
        if line.starts_with(':') {
            continue;
        }
        let (field, value) = match line.split_once(':') {
            Some((f, v)) => (f, v.strip_prefix(' ').unwrap_or(v)),
            None => (line, ""),
        };
        match field {
            "event" => event = value.to_owned(),
            "data" => {
                data.push_str(value);
                data.push('\n');
            }
            _ => {}
        }
    }
    out
}

/// Checks [`parse_sse`] on a stream with every rule it implements; the
/// `sse_writer` target runs it once before fuzzing, so a wrong oracle fails
/// the run (the fuzz crate's own tests cannot link outside libFuzzer).
pub fn check_sse_parser() {
    let s = "event: a\ndata: x\ndata:y\r\n\r\n: c\ndata\n\nretry: 1\r\rdata: z\n";
    let ev = |event: &str, data: &str| SseEvent {
        event: event.into(),
        data: data.into(),
    };
    assert_eq!(parse_sse(s), vec![ev("a", "x\ny"), ev("", "")]);
}
