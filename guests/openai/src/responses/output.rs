//! The response: output items from the SDK's segments (`reasoning`,
//! `message`, `function_call`), the response object, and the typed stream
//! events with their sequence numbers.

use serde_json::{Map, Value, json};

use crate::host::Host;
use qwasi_guest_sdk::ApiError;
use qwasi_guest_sdk::driver::{Driver, Ended};
use qwasi_guest_sdk::http::{self, Output};
use qwasi_guest_sdk::inference::{Generation, Usage};
use qwasi_guest_sdk::segments::{Kind, Segment, Segments};
use qwasi_guest_sdk::stream::{Framing, StreamWriter};

/// One output item as it grows.
struct Item {
    kind: Kind,
    id: String,
    text: String,
}

impl Item {
    fn json(&self, done: bool) -> Value {
        let status = if done { "completed" } else { "in_progress" };
        match &self.kind {
            Kind::Reasoning => {
                let content = if done {
                    json!([{"type": "reasoning_text", "text": self.text}])
                } else {
                    json!([])
                };
                json!({"type": "reasoning", "id": self.id, "summary": [], "content": content, "status": status})
            }
            Kind::Text => {
                let content = if done {
                    json!([text_part(&self.text)])
                } else {
                    json!([])
                };
                json!({"type": "message", "id": self.id, "status": status, "role": "assistant", "content": content})
            }
            Kind::ToolCall { id, name } => {
                let args = if done { self.text.as_str() } else { "" };
                json!({"type": "function_call", "id": self.id, "call_id": id, "name": name, "arguments": args, "status": status})
            }
        }
    }
}

fn text_part(text: &str) -> Value {
    json!({"type": "output_text", "text": text, "annotations": [], "logprobs": []})
}

/// The response being built: its fixed fields and the output items.
pub struct Response<'h, H: Host> {
    host: &'h H,
    id: String,
    created_at: u64,
    model: String,
    /// The request's echoable fields (`tools`, `tool_choice`, ...).
    echo: Map<String, Value>,
    items: Vec<Item>,
    /// Server-sent events so far (`sequence_number` order).
    seq: u64,
}

impl<'h, H: Host> Response<'h, H> {
    pub fn new(host: &'h H, body: &Map<String, Value>, model: &str) -> Self {
        let mut echo = Map::new();
        for (k, default) in [
            ("instructions", Value::Null),
            ("max_output_tokens", Value::Null),
            ("temperature", json!(1.0)),
            ("top_p", json!(1.0)),
            ("tools", json!([])),
            ("tool_choice", json!("auto")),
            ("parallel_tool_calls", json!(true)),
            ("metadata", json!({})),
        ] {
            echo.insert(
                k.into(),
                body.get(k)
                    .filter(|v| !v.is_null())
                    .cloned()
                    .unwrap_or(default),
            );
        }
        Response {
            host,
            id: format!("resp_{}", host.random_hex(16)),
            created_at: host.now_unix(),
            model: model.to_owned(),
            echo,
            items: Vec::new(),
            seq: 0,
        }
    }

    /// The response object.
    fn json(&self, status: &str, usage: Option<&Usage>, reasoning_tokens: u32) -> Value {
        let mut v = json!({
            "id": self.id,
            "object": "response",
            "created_at": self.created_at,
            "status": status,
            "model": self.model,
            "output": self.items.iter().map(|i| i.json(true)).collect::<Vec<_>>(),
            "error": null,
            "incomplete_details": if status == "incomplete" { json!({"reason": "max_output_tokens"}) } else { Value::Null },
            "previous_response_id": null,
            "store": false,
            "text": {"format": {"type": "text"}},
            "truncation": "disabled",
            "usage": usage.map(|u| usage_json(u, reasoning_tokens)),
        });
        for (k, x) in &self.echo {
            v[k] = x.clone();
        }
        v
    }

    /// The stream events (name, data) of segment events; items grow.
    fn events(&mut self, segs: &[Segment], out: &mut Vec<(&'static str, Value)>) {
        for s in segs {
            match s {
                Segment::Open { index, kind } => {
                    let prefix = match kind {
                        Kind::Reasoning => "rs_",
                        Kind::Text => "msg_",
                        Kind::ToolCall { .. } => "fc_",
                    };
                    let item = Item {
                        kind: kind.clone(),
                        id: format!("{prefix}{}", self.host.random_hex(16)),
                        text: String::new(),
                    };
                    out.push((
                        "response.output_item.added",
                        json!({"output_index": index, "item": item.json(false)}),
                    ));
                    if item.kind == Kind::Text {
                        out.push((
                            "response.content_part.added",
                            json!({"item_id": item.id, "output_index": index, "content_index": 0, "part": text_part("")}),
                        ));
                    }
                    self.items.push(item);
                }
                Segment::Delta { index, text } => {
                    let Some(item) = self.items.get_mut(*index) else {
                        continue;
                    };
                    item.text.push_str(text);
                    let (name, mut e) = match item.kind {
                        Kind::Reasoning => (
                            "response.reasoning_text.delta",
                            json!({"content_index": 0, "delta": text}),
                        ),
                        Kind::Text => (
                            "response.output_text.delta",
                            json!({"content_index": 0, "delta": text, "logprobs": []}),
                        ),
                        Kind::ToolCall { .. } => (
                            "response.function_call_arguments.delta",
                            json!({"delta": text}),
                        ),
                    };
                    e["item_id"] = json!(item.id);
                    e["output_index"] = json!(index);
                    out.push((name, e));
                }
                Segment::Close { index } => {
                    let Some(item) = self.items.get(*index) else {
                        continue;
                    };
                    let at = json!({"item_id": item.id, "output_index": index});
                    let with = |extra: Value| {
                        let mut e = at.clone();
                        for (k, v) in extra.as_object().expect("object") {
                            e[k] = v.clone();
                        }
                        e
                    };
                    match &item.kind {
                        Kind::Reasoning => out.push((
                            "response.reasoning_text.done",
                            with(json!({"content_index": 0, "text": item.text})),
                        )),
                        Kind::Text => {
                            out.push((
                                "response.output_text.done",
                                with(
                                    json!({"content_index": 0, "text": item.text, "logprobs": []}),
                                ),
                            ));
                            out.push((
                                "response.content_part.done",
                                with(json!({"content_index": 0, "part": text_part(&item.text)})),
                            ));
                        }
                        Kind::ToolCall { name, .. } => out.push((
                            "response.function_call_arguments.done",
                            with(json!({"name": name, "arguments": item.text})),
                        )),
                    }
                    out.push((
                        "response.output_item.done",
                        json!({"output_index": index, "item": item.json(true)}),
                    ));
                }
            }
        }
    }

    /// Writes events with their `type` and `sequence_number`.
    fn push<S: Output>(&mut self, w: &mut StreamWriter<S>, events: &[(&'static str, Value)]) {
        for (name, data) in events {
            let mut d = json!({"type": name, "sequence_number": self.seq});
            for (k, v) in data.as_object().expect("object") {
                d[k] = v.clone();
            }
            self.seq += 1;
            // Buffered only (the threshold is never reached): cannot fail.
            let _ = w.sse(Some(name), &d.to_string());
        }
    }
}

fn usage_json(u: &Usage, reasoning_tokens: u32) -> Value {
    json!({
        "input_tokens": u.prompt_tokens,
        "input_tokens_details": {"cached_tokens": u.cached_tokens},
        "output_tokens": u.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": reasoning_tokens.min(u.completion_tokens)},
        "total_tokens": u.prompt_tokens + u.completion_tokens,
    })
}

/// The response status of a finished generation (`incomplete` at the token limit).
fn status(reason: &str) -> &'static str {
    if reason == "length" {
        "incomplete"
    } else {
        "completed"
    }
}

/// Runs the generation and answers, JSON or streamed.
pub fn run<H: Host, G: Generation, S: Output>(
    mut generation: Option<G>,
    mut driver: Driver<H>,
    mut resp: Response<H>,
    stream: bool,
    sink: &mut S,
) -> Result<(), ApiError> {
    let mut segments = Segments::new();
    let mut segs = Vec::new();
    let mut events = Vec::new();
    let mut writer = None;
    if stream {
        let Ok(w) = StreamWriter::start(sink, 200, Framing::Sse, &[]) else {
            return Ok(());
        };
        let mut w = w.flush_threshold(usize::MAX);
        let created = resp.json("in_progress", None, 0);
        resp.push(
            &mut w,
            &[
                ("response.created", json!({"response": created})),
                ("response.in_progress", json!({"response": created})),
            ],
        );
        writer = Some(w);
    }
    loop {
        for p in driver.next_batch(&mut generation) {
            segments.piece(&p, &mut segs);
        }
        let ended = driver.ended.is_some();
        if ended {
            segments.close(&mut segs);
            generation = None; // cancel at once after a stop string
        }
        resp.events(&segs, &mut events);
        segs.clear();
        let last = if ended {
            Some(match driver.ended.take().expect("ended") {
                Ended::Finished { reason, usage } => {
                    let s = status(reason);
                    Ok((s, resp.json(s, Some(&usage), driver.reasoning_tokens())))
                }
                Ended::Rejected(e) => Err(e),
                Ended::Failed(m) => Err(ApiError::internal(format!("generation failed: {m}"))),
            })
        } else {
            None
        };
        let Some(w) = writer.as_mut() else {
            match last {
                None => {
                    events.clear();
                    continue;
                }
                Some(Ok((_, v))) => {
                    let _ = http::send_json(sink, 200, &v);
                    return Ok(());
                }
                Some(Err(e)) => return Err(e),
            }
        };
        match last {
            None => {}
            Some(Ok((s, v))) => {
                let name = if s == "incomplete" {
                    "response.incomplete"
                } else {
                    "response.completed"
                };
                events.push((name, json!({"response": v})));
            }
            Some(Err(e)) => {
                let mut v = resp.json("failed", None, 0);
                v["error"] = json!({"code": e.code.clone().unwrap_or_else(|| "server_error".into()), "message": e.message});
                events.push(("response.failed", json!({"response": v})));
            }
        }
        resp.push(w, &events);
        events.clear();
        if w.flush().is_err() || ended {
            return Ok(()); // client gone (dropping the generation cancels it), or done
        }
    }
}
