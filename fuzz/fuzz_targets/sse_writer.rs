//! The SDK's stream writer: a sequence of events (named SSE events with
//! arbitrary text, JSON values, flushes, `[DONE]`) under an input-chosen
//! flush threshold and framing, into a recording sink that may disconnect.
//! Checks: no panic; the bytes written read back, through an independent SSE
//! parser (WHATWG rules) or line by line for NDJSON, as exactly the events
//! written (text line breaks normalised to LF, as SSE carries them) and in
//! order. A disconnect ends the sequence with an error, never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use qwasi_fuzz::{Input, SseEvent, check_sse_parser, parse_sse};
use qwasi_guest_sdk::stream::{Framing, StreamWriter};
use qwasi_guest_sdk::testing::Recorder;
use serde_json::{Value, json};

enum Sent {
    Event(SseEvent),
    Json(Value),
}

fn lf(s: &str) -> String {
    s.replace("\r\n", "\n").replace('\r', "\n")
}

fuzz_target!(|data: &[u8]| {
    static ORACLE: std::sync::Once = std::sync::Once::new();
    ORACLE.call_once(check_sse_parser);
    let mut input = Input(data);
    let flags = input.byte();
    let framing = if flags & 1 != 0 {
        Framing::Ndjson
    } else {
        Framing::Sse
    };
    let threshold = input.byte() as usize * 8;
    let mut rec = Recorder {
        fail_after: (flags & 2 != 0).then_some(input.byte() as usize % 8),
        ..Default::default()
    };
    let mut sent = Vec::new();
    let mut disconnected = false;
    {
        let Ok(w) = StreamWriter::start(&mut rec, 200, framing, &[]) else {
            return;
        };
        let mut w = w
            .flush_threshold(threshold)
            .flush_each_event(flags & 4 != 0);
        while !input.is_empty() {
            let r = match input.byte() % 5 {
                0 if framing == Framing::Sse => {
                    let name = input.text();
                    let data = input.text();
                    sent.push(Sent::Event(SseEvent {
                        event: name.replace(['\r', '\n'], " "),
                        data: lf(&data),
                    }));
                    w.sse((!name.is_empty()).then_some(name.as_str()), &data)
                }
                1 => {
                    let v = json!({"text": input.text(), "n": input.u24()});
                    sent.push(Sent::Json(v.clone()));
                    w.json(&v)
                }
                2 => w.flush(),
                3 => {
                    if framing == Framing::Sse {
                        sent.push(Sent::Event(SseEvent {
                            event: String::new(),
                            data: "[DONE]".into(),
                        }));
                    }
                    w.done()
                }
                _ => {
                    let v = Value::String(input.text());
                    sent.push(Sent::Json(v.clone()));
                    w.json(&v)
                }
            };
            if r.is_err() {
                disconnected = true;
                break;
            }
        }
        if !disconnected {
            disconnected = w.finish().is_err();
        }
    }
    if disconnected {
        return;
    }
    let body = String::from_utf8(rec.body()).expect("UTF-8 stream");
    match framing {
        Framing::Sse => {
            let got = parse_sse(&body);
            assert_eq!(got.len(), sent.len(), "event count: {body:?}");
            for (g, s) in got.iter().zip(&sent) {
                match s {
                    Sent::Event(e) => assert_eq!(g, e),
                    Sent::Json(v) => {
                        assert_eq!(g.event, "");
                        assert_eq!(&serde_json::from_str::<Value>(&g.data).unwrap(), v);
                    }
                }
            }
        }
        Framing::Ndjson => {
            let got: Vec<Value> = body
                .lines()
                .map(|l| serde_json::from_str(l).expect("a JSON value per line"))
                .collect();
            let want: Vec<&Value> = sent
                .iter()
                .map(|s| match s {
                    Sent::Json(v) => v,
                    Sent::Event(_) => unreachable!(),
                })
                .collect();
            assert_eq!(got.iter().collect::<Vec<_>>(), want);
        }
    }
});
