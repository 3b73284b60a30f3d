//! End-to-end tests of the API logic over a fake host and a recording sink.

use std::cell::{Cell, RefCell};
use std::rc::Rc;

use serde_json::{Value, json};

use qwasi_guest_sdk::Request;
use qwasi_guest_sdk::inference::*;
use qwasi_guest_sdk::testing::Recorder;

use crate::api::handle;
use crate::host::Host;
use crate::tokens::byte_to_char;

const SPECIALS: [&str; 6] = [
    "<|im_start|>",
    "<|im_end|>",
    "<think>",
    "</think>",
    "<tool_call>",
    "</tool_call>",
];
const THINK_END_ID: u32 = 4;

/// A byte tokenizer (id = 100 + byte) with six special tokens (ids 1..=6),
/// and a scripted engine.
struct FakeHost {
    info: ModelInfo,
    script: RefCell<Vec<Vec<Event>>>,
    fail_with: RefCell<Option<GenerateError>>,
    requests: RefCell<Vec<GenerateRequest>>,
    encoded: RefCell<Vec<String>>,
    dropped: Rc<Cell<bool>>,
    /// `next` calls made.
    polls: Rc<Cell<usize>>,
    /// What `generation.usage()` answers (`None`: an engine without it).
    usage: Option<Usage>,
    /// The scripts of the generations after the next one, in order.
    more: RefCell<std::collections::VecDeque<Vec<Vec<Event>>>>,
}

impl FakeHost {
    fn new() -> Self {
        FakeHost {
            info: ModelInfo {
                id: "qwen3.6".into(),
                context_length: 100,
                vocab_size: 400,
                eos_token_ids: vec![2],
                chat_template: None,
                created: 1_700_000_000,
                max_prompt_tokens: 0,
                max_completion_tokens: 0,
                ..Default::default()
            },
            script: RefCell::new(vec![]),
            fail_with: RefCell::new(None),
            requests: RefCell::new(vec![]),
            encoded: RefCell::new(vec![]),
            dropped: Rc::new(Cell::new(false)),
            polls: Rc::new(Cell::new(0)),
            usage: None,
            more: RefCell::default(),
        }
    }

    /// One script per generation, in order.
    fn with_scripts(self, mut scripts: Vec<Vec<Vec<Event>>>) -> Self {
        let first = scripts.remove(0);
        *self.more.borrow_mut() = scripts.into();
        self.with_script(first)
    }

    fn with_usage(mut self, usage: Usage) -> Self {
        self.usage = Some(usage);
        self
    }

    fn with_script(self, batches: Vec<Vec<Event>>) -> Self {
        *self.script.borrow_mut() = batches;
        self
    }

    fn request(&self) -> GenerateRequest {
        self.requests
            .borrow()
            .last()
            .cloned()
            .expect("a generate call")
    }
}

fn enc(text: &str) -> Vec<u32> {
    let mut ids = Vec::new();
    let mut rest = text;
    'outer: while !rest.is_empty() {
        for (i, s) in SPECIALS.iter().enumerate() {
            if let Some(r) = rest.strip_prefix(s) {
                ids.push(i as u32 + 1);
                rest = r;
                continue 'outer;
            }
        }
        let c = rest.chars().next().unwrap();
        let mut b = [0; 4];
        ids.extend(c.encode_utf8(&mut b).bytes().map(|x| x as u32 + 100));
        rest = &rest[c.len_utf8()..];
    }
    ids
}

fn dec(ids: &[u32]) -> String {
    let mut bytes = Vec::new();
    for &id in ids {
        match id {
            1..=6 => bytes.extend_from_slice(SPECIALS[id as usize - 1].as_bytes()),
            100..=355 => bytes.push((id - 100) as u8),
            _ => {}
        }
    }
    String::from_utf8_lossy(&bytes).into_owned()
}

struct FakeGeneration {
    batches: Vec<Vec<Event>>,
    usage: Option<Usage>,
    dropped: Rc<Cell<bool>>,
    polls: Rc<Cell<usize>>,
}

impl Generation for FakeGeneration {
    fn wait_next(&mut self) -> Vec<Event> {
        self.polls.set(self.polls.get() + 1);
        if self.batches.is_empty() {
            vec![]
        } else {
            self.batches.remove(0)
        }
    }

    fn usage(&self) -> Option<Usage> {
        self.usage
    }
}

impl Drop for FakeGeneration {
    fn drop(&mut self) {
        self.dropped.set(true);
    }
}

impl Engine for FakeHost {
    type Generation = FakeGeneration;
    fn model_info(&self) -> ModelInfo {
        self.info.clone()
    }
    fn tokenize(&self, text: &str) -> Result<Vec<u32>, String> {
        self.encoded.borrow_mut().push(text.to_owned());
        Ok(enc(text))
    }
    fn detokenize(&self, ids: &[u32], _skip: bool) -> Result<String, String> {
        Ok(dec(ids))
    }
    fn token_to_id(&self, token: &str) -> Option<u32> {
        SPECIALS
            .iter()
            .position(|s| *s == token)
            .map(|i| i as u32 + 1)
    }
    fn id_to_token(&self, id: u32) -> Option<String> {
        match id {
            1..=6 => Some(SPECIALS[id as usize - 1].to_string()),
            100..=355 => Some(byte_to_char((id - 100) as u8).to_string()),
            _ => None,
        }
    }
    fn is_special(&self, id: u32) -> bool {
        (1..=6).contains(&id)
    }
    fn generate(&self, request: GenerateRequest) -> Result<FakeGeneration, GenerateError> {
        self.requests.borrow_mut().push(request);
        if let Some(e) = self.fail_with.borrow_mut().take() {
            return Err(e);
        }
        let next = self.more.borrow_mut().pop_front().unwrap_or_default();
        Ok(FakeGeneration {
            batches: std::mem::replace(&mut *self.script.borrow_mut(), next),
            usage: self.usage,
            dropped: self.dropped.clone(),
            polls: self.polls.clone(),
        })
    }
    fn now_unix_ns(&self) -> u64 {
        1_700_000_123_000_000_000
    }
    fn monotonic_ns(&self) -> u64 {
        0
    }
}

impl Host for FakeHost {
    fn random_hex(&self, bytes: usize) -> String {
        "ab".repeat(bytes)
    }
}

/// The recorded response; `events()` gives its SSE events.
type RecSink = Recorder;

/// Splits an SSE body into its `data:` payloads.
fn parse_events(body: &str) -> Vec<&str> {
    body.split("\n\n")
        .filter(|e| !e.is_empty())
        .map(|e| e.strip_prefix("data: ").unwrap_or(e))
        .collect()
}

trait SseEvents {
    /// The SSE events' JSON (the final `[DONE]` checked and left out).
    fn events(&self) -> Vec<Value>;
}

impl SseEvents for Recorder {
    fn events(&self) -> Vec<Value> {
        let body = self.body_string();
        assert!(body.ends_with("data: [DONE]\n\n"), "{body}");
        let ev = parse_events(&body);
        assert_eq!(ev.iter().filter(|e| **e == "[DONE]").count(), 1);
        ev[..ev.len() - 1]
            .iter()
            .map(|e| serde_json::from_str(e).unwrap())
            .collect()
    }
}

fn call(host: &FakeHost, method: &str, path: &str, body: Value) -> RecSink {
    let body = if body.is_null() {
        vec![]
    } else {
        serde_json::to_vec(&body).unwrap()
    };
    call_raw(host, method, path, body)
}

fn call_raw(host: &FakeHost, method: &str, path: &str, body: Vec<u8>) -> RecSink {
    let mut sink = RecSink::default();
    handle(host, Request::from_bytes(method, path, body), &mut sink);
    assert!(sink.status.is_some());
    sink
}

fn tok(text: &str) -> Event {
    let id = enc(text).first().copied().unwrap_or(100);
    Event::Token(TokenEvent {
        id,
        text: text.into(),
        logprob: None,
    })
}

fn tok_lp(id: u32, text: &str, lp: f32, top: Vec<(u32, f32)>) -> Event {
    Event::Token(TokenEvent {
        id,
        text: text.into(),
        logprob: Some(TokenLogprob {
            token: id,
            logprob: lp,
            top,
        }),
    })
}

fn finished(reason: FinishReason, prompt: u32, completion: u32, cached: u32) -> Event {
    Event::Finished(Finish {
        reason,
        usage: Usage {
            prompt_tokens: prompt,
            completion_tokens: completion,
            cached_tokens: cached,
        },
        stop_token: None,
        trailing_text: String::new(),
    })
}

fn assert_error(s: &RecSink, status: u16, code: &str) -> Value {
    assert_eq!(s.status, Some(status), "{}", s.body_string());
    let v = s.json();
    assert_eq!(v["error"]["code"], code, "{v}");
    assert!(v["error"]["message"].is_string());
    assert!(v["error"]["type"].is_string());
    assert!(v["error"].as_object().unwrap().contains_key("param"));
    assert_eq!(s.header("content-type"), Some("application/json"));
    v
}

#[test]
fn models() {
    let h = FakeHost::new();
    let s = call(&h, "GET", "/v1/models", Value::Null);
    assert_eq!(s.status, Some(200));
    let v = s.json();
    assert_eq!(v["object"], "list");
    assert_eq!(v["data"][0]["id"], "qwen3.6");
    assert_eq!(v["data"][0]["object"], "model");
    assert_eq!(v["data"][0]["created"], 1_700_000_000);
    assert_eq!(v["data"][0]["max_model_len"], 100);
    assert_eq!(
        s.header("content-length").unwrap(),
        s.body_string().len().to_string()
    );

    let s = call(&h, "GET", "/v1/models/qwen3.6", Value::Null);
    assert_eq!(s.json()["id"], "qwen3.6");
    let v = assert_error(
        &call(&h, "GET", "/v1/models/gpt-4o", Value::Null),
        404,
        "model_not_found",
    );
    assert!(v["error"]["message"].as_str().unwrap().contains("gpt-4o"));

    let mut h = FakeHost::new();
    h.info.id = "Qwen/Qwen3.6-35B-A3B".into();
    assert_eq!(
        call(&h, "GET", "/v1/models/Qwen/Qwen3.6-35B-A3B", Value::Null).status,
        Some(200)
    );
    assert_eq!(
        call(
            &h,
            "GET",
            "/v1/models/Qwen%2FQwen3.6-35B-A3B?x=1",
            Value::Null
        )
        .status,
        Some(200)
    );
}

#[test]
fn routes_and_methods() {
    let h = FakeHost::new();
    assert_error(
        &call(&h, "GET", "/v2/whatever", Value::Null),
        404,
        "not_found",
    );
    let s = call(&h, "GET", "/v1/chat/completions", Value::Null);
    assert_error(&s, 405, "method_not_allowed");
    assert_eq!(s.header("allow"), Some("POST"));
    assert_error(
        &call(&h, "POST", "/v1/models", json!({})),
        405,
        "method_not_allowed",
    );
    assert_error(
        &call_raw(&h, "POST", "/v1/completions", b"{not json".to_vec()),
        400,
        "invalid_json",
    );
    assert_error(
        &call_raw(&h, "POST", "/v1/chat/completions", b"[]".to_vec()),
        400,
        "invalid_json",
    );
    let v = assert_error(
        &call(
            &h,
            "POST",
            "/v1/completions",
            json!({"model": "qwen3.6", "prompt": "x", "temperature": "hot"}),
        ),
        400,
        "invalid_type",
    );
    assert_eq!(v["error"]["param"], "temperature");
    assert_eq!(v["error"]["type"], "invalid_request_error");
    assert!(h.requests.borrow().is_empty());
}

#[test]
fn completion_basic() {
    let h = FakeHost::new().with_script(vec![
        vec![tok(" wor"), tok("ld")],
        vec![finished(FinishReason::Length, 2, 2, 1)],
    ]);
    let s = call(
        &h,
        "POST",
        "/v1/completions",
        json!({"model": "qwen3.6", "prompt": "Hi", "temperature": 0, "seed": 5, "logit_bias": {"101": 3}, "ignore_eos": true, "stop_token_ids": [7]}),
    );
    assert_eq!(s.status, Some(200));
    let v = s.json();
    assert_eq!(v["id"], format!("cmpl-{}", "ab".repeat(16)));
    assert_eq!(v["object"], "text_completion");
    assert_eq!(v["created"], 1_700_000_123);
    assert_eq!(v["model"], "qwen3.6");
    assert_eq!(v["choices"][0]["text"], " world");
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    assert_eq!(v["choices"][0]["logprobs"], Value::Null);
    assert_eq!(
        v["usage"],
        json!({"prompt_tokens": 2, "completion_tokens": 2, "total_tokens": 4, "prompt_tokens_details": {"cached_tokens": 1}})
    );
    let r = h.request();
    assert_eq!(r.prompt, enc("Hi"));
    assert_eq!(r.max_tokens, 16);
    assert_eq!(r.sampling.temperature, 0.0);
    assert_eq!(r.sampling.seed, Some(5));
    assert_eq!(r.sampling.logit_bias, vec![(101, 3.0)]);
    assert!(r.ignore_eos);
    assert_eq!(r.stop_token_ids, vec![7]);
    assert_eq!(r.sampling.logprobs, None);
}

#[test]
fn completion_token_prompt_and_echo() {
    let h =
        FakeHost::new().with_script(vec![vec![tok("!"), finished(FinishReason::Stop, 2, 1, 0)]]);
    let s = call(
        &h,
        "POST",
        "/v1/completions",
        json!({"model": "qwen3.6", "prompt": [[172, 205]], "echo": true, "max_tokens": 3}),
    );
    assert_eq!(s.json()["choices"][0]["text"], "Hi!");
    assert_eq!(h.request().prompt, vec![172, 205]);
    assert_eq!(h.request().max_tokens, 3);

    // echo with max_tokens 0 generates nothing.
    let h = FakeHost::new();
    let s = call(
        &h,
        "POST",
        "/v1/completions",
        json!({"model": "qwen3.6", "prompt": "Yo", "echo": true, "max_tokens": 0}),
    );
    let v = s.json();
    assert_eq!(v["choices"][0]["text"], "Yo");
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    assert_eq!(v["usage"]["prompt_tokens"], 2);
    assert!(h.requests.borrow().is_empty());

    // Streaming echo: the prompt comes first.
    let h =
        FakeHost::new().with_script(vec![vec![tok("!"), finished(FinishReason::Stop, 2, 1, 0)]]);
    let s = call(
        &h,
        "POST",
        "/v1/completions",
        json!({"model": "qwen3.6", "prompt": "Yo", "echo": true, "stream": true}),
    );
    let ev = s.events();
    assert_eq!(ev[0]["choices"][0]["text"], "Yo");
    assert_eq!(ev[1]["choices"][0]["text"], "!");
}

#[test]
fn completion_stop_string_cuts_and_cancels() {
    let h = FakeHost::new().with_script(vec![
        vec![tok("one"), tok(" tw")],
        vec![tok("o thr"), tok("ee")],
        vec![finished(FinishReason::Length, 1, 4, 0)],
    ]);
    let s = call(
        &h,
        "POST",
        "/v1/completions",
        json!({"model": "qwen3.6", "prompt": "x", "stop": ["two"], "max_tokens": 10}),
    );
    let v = s.json();
    assert_eq!(v["choices"][0]["text"], "one ");
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    assert_eq!(v["usage"]["completion_tokens"], 3);
    assert_eq!(v["usage"]["prompt_tokens"], 1);
    assert!(h.dropped.get());
    assert_eq!(h.polls.get(), 2, "no polling after the stop string");
}

/// A stop string pre-empts `finished`: the prompt and cached counts come
/// from `generation.usage()`, the completion count is the tokens the output
/// used (the engine ran ahead to 5), streamed or not.
#[test]
fn stop_string_usage_from_the_engine() {
    let script = || {
        vec![
            vec![tok("one"), tok(" tw")],
            vec![tok("o thr"), tok("ee")],
            vec![finished(FinishReason::Length, 1, 4, 0)],
        ]
    };
    let engine = Usage {
        prompt_tokens: 1,
        completion_tokens: 5,
        cached_tokens: 1,
    };
    let want = json!({"prompt_tokens": 1, "completion_tokens": 3, "total_tokens": 4, "prompt_tokens_details": {"cached_tokens": 1}});
    let h = FakeHost::new().with_script(script()).with_usage(engine);
    let s = call(
        &h,
        "POST",
        "/v1/completions",
        json!({"model": "qwen3.6", "prompt": "x", "stop": ["two"], "max_tokens": 10}),
    );
    let v = s.json();
    assert_eq!(v["choices"][0]["text"], "one ");
    assert_eq!(v["usage"], want);
    assert!(h.dropped.get());

    let h = FakeHost::new().with_script(script()).with_usage(engine);
    let s = call(
        &h,
        "POST",
        "/v1/chat/completions",
        json!({"model": "qwen3.6", "messages": [{"role": "user", "content": "q"}], "stop": "two",
               "stream": true, "stream_options": {"include_usage": true}}),
    );
    let ev = s.events();
    assert_eq!(ev[ev.len() - 2]["choices"][0]["finish_reason"], "stop");
    assert_eq!(ev.last().unwrap()["usage"], want);
    assert!(h.dropped.get());

    // An engine without `usage` (the default method): cached stays 0.
    let h = FakeHost::new().with_script(script());
    let s = call(
        &h,
        "POST",
        "/v1/completions",
        json!({"model": "qwen3.6", "prompt": "x", "stop": ["two"], "max_tokens": 10}),
    );
    assert_eq!(
        s.json()["usage"]["prompt_tokens_details"]["cached_tokens"],
        0
    );
}

#[test]
fn completion_stream_stop_never_leaks_any_split() {
    let text = "ab<END>cd";
    let chars: Vec<char> = text.chars().collect();
    for i in 1..chars.len() {
        for j in i..chars.len() {
            let pieces: Vec<String> = [&chars[..i], &chars[i..j], &chars[j..]]
                .iter()
                .map(|p| p.iter().collect())
                .filter(|p: &String| !p.is_empty())
                .collect();
            // One batch per token, so every piece is its own host write.
            let mut batches: Vec<Vec<Event>> = pieces.iter().map(|p| vec![tok(p)]).collect();
            batches.push(vec![finished(FinishReason::Length, 1, 3, 0)]);
            let h = FakeHost::new().with_script(batches);
            let s = call(
                &h,
                "POST",
                "/v1/completions",
                json!({"model": "qwen3.6", "prompt": "x", "stop": "<END>", "stream": true}),
            );
            assert_eq!(s.header("content-type"), Some("text/event-stream"));
            let ev = s.events();
            let text: String = ev
                .iter()
                .map(|e| e["choices"][0]["text"].as_str().unwrap())
                .collect();
            assert_eq!(text, "ab", "{pieces:?}");
            assert!(
                ev.iter()
                    .all(|e| !e["choices"][0]["text"].as_str().unwrap().contains('<')),
                "{pieces:?}"
            );
            assert_eq!(ev.last().unwrap()["choices"][0]["finish_reason"], "stop");
            assert!(h.dropped.get());
        }
    }
}

#[test]
fn sse_one_write_per_batch_and_usage_chunk() {
    let h = FakeHost::new().with_script(vec![
        vec![tok("a"), tok("b")],
        vec![tok("c")],
        vec![Event::Finished(Finish {
            reason: FinishReason::Stop,
            usage: Usage {
                prompt_tokens: 1,
                completion_tokens: 4,
                cached_tokens: 1,
            },
            stop_token: Some(2),
            trailing_text: "d".into(),
        })],
    ]);
    let s = call(
        &h,
        "POST",
        "/v1/completions",
        json!({"model": "qwen3.6", "prompt": "x", "stream": true, "stream_options": {"include_usage": true}}),
    );
    assert_eq!(s.writes.len(), 3, "one write per drained batch");
    let first = String::from_utf8(s.writes[0].clone()).unwrap();
    assert_eq!(
        first,
        format!(
            "data: {{\"id\":\"cmpl-{id}\",\"object\":\"text_completion\",\"created\":1700000123,\"model\":\"qwen3.6\",\"choices\":[{{\"index\":0,\"text\":\"a\",\"logprobs\":null,\"finish_reason\":null}}],\"usage\":null}}\n\n\
             data: {{\"id\":\"cmpl-{id}\",\"object\":\"text_completion\",\"created\":1700000123,\"model\":\"qwen3.6\",\"choices\":[{{\"index\":0,\"text\":\"b\",\"logprobs\":null,\"finish_reason\":null}}],\"usage\":null}}\n\n",
            id = "ab".repeat(16)
        )
    );
    let ev = s.events();
    assert_eq!(ev.len(), 6);
    assert_eq!(ev[3]["choices"][0]["text"], "d");
    assert_eq!(ev[4]["choices"][0]["finish_reason"], "stop");
    assert_eq!(ev[4]["choices"][0]["text"], "");
    assert_eq!(ev[5]["choices"], json!([]));
    assert_eq!(ev[5]["usage"]["completion_tokens"], 4);
    assert_eq!(ev[5]["usage"]["prompt_tokens_details"]["cached_tokens"], 1);
    // Without include_usage there is no usage key and no usage chunk.
    let h = FakeHost::new().with_script(vec![vec![
        tok("a"),
        finished(FinishReason::Length, 1, 1, 0),
    ]]);
    let ev = call(
        &h,
        "POST",
        "/v1/completions",
        json!({"model": "qwen3.6", "prompt": "x", "stream": true}),
    )
    .events();
    assert_eq!(ev.len(), 2);
    assert!(ev.iter().all(|e| e.get("usage").is_none()));
}

#[test]
fn chat_rendering_reaches_engine_with_snapshot_points() {
    let h =
        FakeHost::new().with_script(vec![vec![tok("ok"), finished(FinishReason::Stop, 0, 1, 0)]]);
    let s = call(
        &h,
        "POST",
        "/v1/chat/completions",
        json!({
            "model": "qwen3.6",
            "messages": [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}],
            "chat_template_kwargs": {"enable_thinking": false},
        }),
    );
    let v = s.json();
    assert_eq!(v["object"], "chat.completion");
    assert!(v["id"].as_str().unwrap().starts_with("chatcmpl-"));
    assert_eq!(
        v["choices"][0]["message"],
        json!({"role": "assistant", "content": "ok", "refusal": null})
    );
    let prompt = "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n";
    let r = h.request();
    assert_eq!(dec(&r.prompt), prompt);
    assert_eq!(r.prompt, enc(prompt));
    let sys_len = enc("<|im_start|>system\nS<|im_end|>\n").len() as u32;
    let user_len = enc("<|im_start|>user\nU<|im_end|>\n").len() as u32;
    assert_eq!(r.snapshot_points, vec![sys_len, sys_len + user_len]);
    // Chat's default max_tokens: the rest of the context.
    assert_eq!(r.max_tokens, 100 - r.prompt.len() as u32);
}

#[test]
fn chat_thinking_non_stream() {
    let h = FakeHost::new().with_script(vec![vec![
        tok("Hmm"),
        tok(".\n"),
        Event::Token(TokenEvent {
            id: THINK_END_ID,
            text: String::new(),
            logprob: None,
        }),
        tok("\n\n"),
        tok("Four."),
        finished(FinishReason::Stop, 5, 5, 3),
    ]]);
    let s = call(
        &h,
        "POST",
        "/v1/chat/completions",
        json!({"model": "qwen3.6", "messages": [{"role": "user", "content": "2+2"}]}),
    );
    let v = s.json();
    assert_eq!(v["choices"][0]["message"]["reasoning_content"], "Hmm.\n");
    assert_eq!(v["choices"][0]["message"]["content"], "Four.");
    assert_eq!(v["usage"]["prompt_tokens_details"]["cached_tokens"], 3);
    assert!(dec(&h.request().prompt).ends_with("<|im_start|>assistant\n<think>\n"));
}

#[test]
fn chat_stream_thinking_deltas() {
    // `</think>` arrives as text split across tokens here.
    let h = FakeHost::new().with_script(vec![
        vec![tok("Let me"), tok(" think.\n</th")],
        vec![tok("ink>\n\nThe"), tok(" answer")],
        vec![finished(FinishReason::Length, 5, 4, 0)],
    ]);
    let s = call(
        &h,
        "POST",
        "/v1/chat/completions",
        json!({"model": "qwen3.6", "messages": [{"role": "user", "content": "q"}], "stream": true, "stream_options": {"include_usage": true}}),
    );
    let ev = s.events();
    assert_eq!(
        ev[0]["choices"][0]["delta"],
        json!({"role": "assistant", "content": ""})
    );
    assert_eq!(ev[0]["object"], "chat.completion.chunk");
    let deltas: Vec<Value> = ev[1..ev.len() - 2]
        .iter()
        .map(|e| e["choices"][0]["delta"].clone())
        .collect();
    assert_eq!(
        deltas,
        vec![
            json!({"reasoning_content": "Let me"}),
            json!({"reasoning_content": " think.\n"}),
            json!({"content": "The"}),
            json!({"content": " answer"}),
        ]
    );
    let fin = &ev[ev.len() - 2];
    assert_eq!(
        fin["choices"][0],
        json!({"index": 0, "delta": {}, "logprobs": null, "finish_reason": "length"})
    );
    assert_eq!(fin["usage"], Value::Null);
    assert_eq!(ev[ev.len() - 1]["choices"], json!([]));
    assert_eq!(ev[ev.len() - 1]["usage"]["total_tokens"], 9);
}

#[test]
fn chat_stream_stop_in_content() {
    let h = FakeHost::new().with_script(vec![
        vec![tok("a</think>x"), tok("y STO")],
        vec![tok("P z")],
        vec![finished(FinishReason::Length, 1, 9, 0)],
    ]);
    let s = call(
        &h,
        "POST",
        "/v1/chat/completions",
        json!({"model": "qwen3.6", "messages": [{"role": "user", "content": "q"}], "stream": true, "stop": "STOP"}),
    );
    let ev = s.events();
    let content: String = ev
        .iter()
        .filter_map(|e| e["choices"][0]["delta"]["content"].as_str())
        .collect();
    let reasoning: String = ev
        .iter()
        .filter_map(|e| e["choices"][0]["delta"]["reasoning_content"].as_str())
        .collect();
    assert_eq!((reasoning.as_str(), content.as_str()), ("a", "xy "));
    assert_eq!(ev.last().unwrap()["choices"][0]["finish_reason"], "stop");
    assert!(h.dropped.get());
}

#[test]
fn queue_and_engine_errors() {
    let cases = [
        (GenerateError::QueueFull(3), 429, "queue_full"),
        (GenerateError::QueueTimeout, 503, "queue_timeout"),
        (GenerateError::ShuttingDown, 503, "service_shutting_down"),
        (
            GenerateError::InvalidRequest("bad token".into()),
            400,
            "invalid_value",
        ),
        (
            GenerateError::ContextLengthExceeded("too long".into()),
            400,
            "context_length_exceeded",
        ),
        (
            GenerateError::Internal("boom".into()),
            500,
            "internal_error",
        ),
    ];
    for stream in [false, true] {
        for (e, status, code) in cases.clone() {
            let h = FakeHost::new();
            *h.fail_with.borrow_mut() = Some(e.clone());
            let s = call(
                &h,
                "POST",
                "/v1/chat/completions",
                json!({"model": "qwen3.6", "messages": [{"role": "user", "content": "q"}], "stream": stream}),
            );
            assert_error(&s, status, code);
            assert_eq!(
                s.header("retry-after"),
                if status == 429 { Some("3") } else { None }
            );
        }
    }
}

#[test]
fn failure_after_headers() {
    let h = FakeHost::new().with_script(vec![
        vec![tok("a")],
        vec![Event::Failed("device lost".into())],
    ]);
    let s = call(
        &h,
        "POST",
        "/v1/completions",
        json!({"model": "qwen3.6", "prompt": "x", "stream": true}),
    );
    assert_eq!(s.status, Some(200));
    let ev = s.events();
    assert_eq!(ev[0]["choices"][0]["text"], "a");
    assert_eq!(ev[1]["error"]["code"], "internal_error");
    assert!(
        ev[1]["error"]["message"]
            .as_str()
            .unwrap()
            .contains("device lost")
    );
    // Non-streaming: a 500.
    let h = FakeHost::new().with_script(vec![
        vec![tok("a")],
        vec![Event::Failed("device lost".into())],
    ]);
    assert_error(
        &call(
            &h,
            "POST",
            "/v1/completions",
            json!({"model": "qwen3.6", "prompt": "x"}),
        ),
        500,
        "internal_error",
    );
    // The engine stops sending events without a finish: reported, not hung.
    let h = FakeHost::new().with_script(vec![vec![tok("a")]]);
    let ev = call(
        &h,
        "POST",
        "/v1/completions",
        json!({"model": "qwen3.6", "prompt": "x", "stream": true}),
    )
    .events();
    assert_eq!(ev.last().unwrap()["error"]["type"], "server_error");
}

#[test]
fn client_gone_cancels() {
    let h = FakeHost::new().with_script(vec![
        vec![tok("a")],
        vec![tok("b")],
        vec![tok("c")],
        vec![finished(FinishReason::Length, 1, 3, 0)],
    ]);
    let mut sink = RecSink {
        fail_after: Some(1),
        ..Default::default()
    };
    let body =
        serde_json::to_vec(&json!({"model": "qwen3.6", "prompt": "x", "stream": true})).unwrap();
    handle(
        &h,
        Request::from_bytes("POST", "/v1/completions", body),
        &mut sink,
    );
    assert!(h.dropped.get());
    assert_eq!(h.polls.get(), 2, "stopped at the first failed write");
}

#[test]
fn context_length() {
    let h = FakeHost::new();
    let v = assert_error(
        &call(
            &h,
            "POST",
            "/v1/completions",
            json!({"model": "qwen3.6", "prompt": "0123456789", "max_tokens": 95}),
        ),
        400,
        "context_length_exceeded",
    );
    let msg = v["error"]["message"].as_str().unwrap();
    assert!(
        msg.contains("100 tokens")
            && msg.contains("105")
            && msg.contains("10 in the prompt")
            && msg.contains("95 in the completion"),
        "{msg}"
    );
    assert_eq!(v["error"]["param"], "prompt");
    // Exactly fitting is fine.
    let h = FakeHost::new().with_script(vec![vec![finished(FinishReason::Length, 10, 0, 0)]]);
    assert_eq!(
        call(
            &h,
            "POST",
            "/v1/completions",
            json!({"model": "qwen3.6", "prompt": "0123456789", "max_tokens": 90})
        )
        .status,
        Some(200)
    );
    // The default 16 is clamped to the room left.
    let h = FakeHost::new().with_script(vec![vec![finished(FinishReason::Length, 95, 0, 0)]]);
    call(
        &h,
        "POST",
        "/v1/completions",
        json!({"model": "qwen3.6", "prompt": "x".repeat(95)}),
    );
    assert_eq!(h.request().max_tokens, 5);
    // A chat prompt that fills the context.
    let h = FakeHost::new();
    let v = assert_error(
        &call(
            &h,
            "POST",
            "/v1/chat/completions",
            json!({"model": "qwen3.6", "messages": [{"role": "user", "content": "y".repeat(100)}]}),
        ),
        400,
        "context_length_exceeded",
    );
    assert_eq!(v["error"]["param"], "messages");
    // Operator caps.
    let mut h = FakeHost::new();
    h.info.max_completion_tokens = 8;
    h.info.max_prompt_tokens = 30;
    assert_error(
        &call(
            &h,
            "POST",
            "/v1/completions",
            json!({"model": "qwen3.6", "prompt": "x", "max_tokens": 9}),
        ),
        400,
        "invalid_value",
    );
    assert_error(
        &call(
            &h,
            "POST",
            "/v1/completions",
            json!({"model": "qwen3.6", "prompt": "x".repeat(31)}),
        ),
        400,
        "context_length_exceeded",
    );
    *h.script.borrow_mut() = vec![vec![finished(FinishReason::Length, 1, 0, 0)]];
    call(
        &h,
        "POST",
        "/v1/chat/completions",
        json!({"model": "qwen3.6", "messages": [{"role": "user", "content": "q"}]}),
    );
    assert_eq!(h.request().max_tokens, 8);
}

#[test]
fn completion_logprobs() {
    // " é" as two tokens: the second completes the char.
    let h = FakeHost::new().with_script(vec![vec![
        tok_lp(132, " ", -0.5, vec![(132, -0.5), (101, -1.25)]),
        tok_lp(295, "", -0.25, vec![(295, -0.25)]),
        tok_lp(269, "é", f32::NEG_INFINITY, vec![]),
        finished(FinishReason::Length, 1, 3, 0),
    ]]);
    let s = call(
        &h,
        "POST",
        "/v1/completions",
        json!({"model": "qwen3.6", "prompt": "x", "logprobs": 2, "max_tokens": 3}),
    );
    let v = s.json();
    assert_eq!(h.request().sampling.logprobs, Some(2));
    let lp = &v["choices"][0]["logprobs"];
    assert_eq!(lp["tokens"], json!([" ", "\u{FFFD}", "\u{FFFD}"]));
    assert_eq!(lp["token_logprobs"], json!([-0.5, -0.25, -9999.0]));
    assert_eq!(
        lp["top_logprobs"],
        json!([{" ": -0.5, "\u{1}": -1.25}, {"\u{FFFD}": -0.25}, {}])
    );
    assert_eq!(lp["text_offset"], json!([0, 1, 1]));
    // Streaming: each chunk carries its token's logprobs.
    let h = FakeHost::new().with_script(vec![vec![
        tok_lp(165, "A", -0.1, vec![(165, -0.1)]),
        finished(FinishReason::Length, 1, 1, 0),
    ]]);
    let ev = call(
        &h,
        "POST",
        "/v1/completions",
        json!({"model": "qwen3.6", "prompt": "x", "logprobs": 1, "stream": true}),
    )
    .events();
    assert_eq!(
        ev[0]["choices"][0]["logprobs"],
        json!({"tokens": ["A"], "token_logprobs": [-0.1], "top_logprobs": [{"A": -0.1}], "text_offset": [0]})
    );
}

#[test]
fn chat_logprobs() {
    let h = FakeHost::new().with_script(vec![vec![
        tok_lp(165, "A", -0.1, vec![(165, -0.1), (166, -2.5)]),
        finished(FinishReason::Stop, 1, 1, 0),
    ]]);
    let s = call(
        &h,
        "POST",
        "/v1/chat/completions",
        json!({"model": "qwen3.6", "messages": [{"role": "user", "content": "q"}], "logprobs": true, "top_logprobs": 2, "chat_template_kwargs": {"enable_thinking": false}}),
    );
    let v = s.json();
    assert_eq!(h.request().sampling.logprobs, Some(2));
    assert_eq!(
        v["choices"][0]["logprobs"],
        json!({"content": [{"token": "A", "logprob": -0.1, "bytes": [65], "top_logprobs": [
            {"token": "A", "logprob": -0.1, "bytes": [65]}, {"token": "B", "logprob": -2.5, "bytes": [66]}]}], "refusal": null})
    );
    let h = FakeHost::new().with_script(vec![vec![
        tok_lp(165, "A", -0.1, vec![]),
        finished(FinishReason::Stop, 1, 1, 0),
    ]]);
    let ev = call(&h, "POST", "/v1/chat/completions", json!({"model": "qwen3.6", "messages": [{"role": "user", "content": "q"}], "logprobs": true, "stream": true})).events();
    assert_eq!(ev[1]["choices"][0]["logprobs"]["content"][0]["token"], "A");
    assert_eq!(
        ev[1]["choices"][0]["delta"],
        json!({"reasoning_content": "A"})
    );
}

#[test]
fn cancelled_maps_to_abort() {
    let h = FakeHost::new().with_script(vec![vec![
        tok("a"),
        finished(FinishReason::Cancelled, 1, 1, 0),
    ]]);
    let v = call(
        &h,
        "POST",
        "/v1/completions",
        json!({"model": "qwen3.6", "prompt": "x"}),
    )
    .json();
    assert_eq!(v["choices"][0]["finish_reason"], "abort");
}

#[test]
fn multimodal_rejected() {
    let h = FakeHost::new();
    let s = call(
        &h,
        "POST",
        "/v1/chat/completions",
        json!({"model": "qwen3.6", "messages": [{"role": "user", "content": [{"type": "text", "text": "what is this"}, {"type": "image_url", "image_url": {"url": "data:..."}}]}]}),
    );
    let v = assert_error(&s, 400, "unsupported_content");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("multimodal content is not supported")
    );
    assert_error(
        &call(
            &h,
            "POST",
            "/v1/chat/completions",
            json!({"model": "nope", "messages": [{"role": "user", "content": "q"}]}),
        ),
        404,
        "model_not_found",
    );
    assert_error(
        &call(
            &h,
            "POST",
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": "q"}]}),
        ),
        400,
        "missing_required_parameter",
    );
    assert_error(
        &call(
            &h,
            "POST",
            "/v1/chat/completions",
            json!({"model": "qwen3.6", "messages": [{"role": "user", "content": "q"}], "n": 2, "best_of": 1}),
        ),
        400,
        "invalid_value",
    );
}

#[test]
fn tokenize_and_detokenize() {
    let h = FakeHost::new();
    let v = call(&h, "POST", "/tokenize", json!({"prompt": "Hi"})).json();
    assert_eq!(
        v,
        json!({"tokens": [172, 205], "count": 2, "max_model_len": 100})
    );
    let v = call(&h, "POST", "/tokenize", json!({"messages": [{"role": "user", "content": "Hi"}], "chat_template_kwargs": {"enable_thinking": false}})).json();
    let expect =
        enc("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n");
    assert_eq!(v["tokens"], json!(expect));
    assert_eq!(v["count"], expect.len());
    let v = call(
        &h,
        "POST",
        "/tokenize",
        json!({"messages": [{"role": "user", "content": "Hi"}], "add_generation_prompt": false}),
    )
    .json();
    assert_eq!(v["tokens"], json!(enc("<|im_start|>user\nHi<|im_end|>\n")));
    let v = call(&h, "POST", "/detokenize", json!({"tokens": [1, 172, 205]})).json();
    assert_eq!(v, json!({"prompt": "<|im_start|>Hi"}));
    assert_error(
        &call(&h, "POST", "/detokenize", json!({"tokens": ["a"]})),
        400,
        "invalid_type",
    );
    assert_error(
        &call(&h, "GET", "/tokenize", Value::Null),
        405,
        "method_not_allowed",
    );
}

// ---------------------------------------------------------------------------
// Tool calling.

fn weather_tools() -> Value {
    json!([{"type": "function", "function": {"name": "get_weather", "description": "Weather of a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
        "required": ["city"]}}}])
}

const CALL_TEXT: &str = "I will check.\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=days>\n2\n</parameter>\n</function>\n</tool_call>";

fn big_host(script_text: &str) -> FakeHost {
    let mut h = FakeHost::new();
    h.info.context_length = 100_000;
    // One token per char (the tool-call tags one special token each, with
    // empty text, as the engine sends special tokens), thinking off.
    let mut evs = Vec::new();
    let mut rest = script_text;
    while let Some(c) = rest.chars().next() {
        if let Some(i) = [4usize, 5]
            .into_iter()
            .find(|&i| rest.starts_with(SPECIALS[i]))
        {
            evs.push(Event::Token(TokenEvent {
                id: i as u32 + 1,
                text: String::new(),
                logprob: None,
            }));
            rest = &rest[SPECIALS[i].len()..];
            continue;
        }
        evs.push(tok(&c.to_string()));
        rest = &rest[c.len_utf8()..];
    }
    evs.push(finished(FinishReason::Stop, 5, 5, 0));
    h.with_script(vec![evs])
}

fn tool_req(extra: Value) -> Value {
    let mut r = json!({"model": "qwen3.6", "messages": [{"role": "user", "content": "Weather in Paris?"}],
        "tools": weather_tools(), "enable_thinking": false});
    for (k, v) in extra.as_object().unwrap() {
        r[k] = v.clone();
    }
    r
}

#[test]
fn tool_call_non_stream() {
    let h = big_host(CALL_TEXT);
    let s = call(&h, "POST", "/v1/chat/completions", tool_req(json!({})));
    let v = s.json();
    let c = &v["choices"][0];
    assert_eq!(c["finish_reason"], "tool_calls", "{v}");
    assert_eq!(c["message"]["content"], "I will check.");
    let calls = c["message"]["tool_calls"].as_array().unwrap();
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0]["id"], "call_abababababababababababab");
    assert_eq!(calls[0]["type"], "function");
    assert_eq!(calls[0]["function"]["name"], "get_weather");
    let args: Value =
        serde_json::from_str(calls[0]["function"]["arguments"].as_str().unwrap()).unwrap();
    assert_eq!(args, json!({"city": "Paris", "days": 2}));
    let prompt = dec(&h.request().prompt);
    assert!(prompt.starts_with("<|im_start|>system\n# Tools\n\nYou have access to the following functions:\n\n<tools>\n{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", "), "{prompt}");
    assert!(prompt.ends_with("<|im_start|>assistant\n<think>\n\n</think>\n\n"));
}

#[test]
fn tool_call_stream_deltas() {
    let h = big_host(CALL_TEXT);
    let s = call(
        &h,
        "POST",
        "/v1/chat/completions",
        tool_req(json!({"stream": true})),
    );
    let ev = s.events();
    let mut content = String::new();
    let mut args = String::new();
    let mut names = vec![];
    for e in &ev {
        let d = &e["choices"][0]["delta"];
        if let Some(t) = d["content"].as_str() {
            content.push_str(t);
        }
        if let Some(tc) = d["tool_calls"].as_array() {
            assert_eq!(tc[0]["index"], 0);
            if let Some(n) = tc[0]["function"]["name"].as_str() {
                assert!(args.is_empty());
                assert_eq!(tc[0]["type"], "function");
                assert!(tc[0]["id"].as_str().unwrap().starts_with("call_"));
                names.push(n.to_owned());
            }
            args.push_str(tc[0]["function"]["arguments"].as_str().unwrap());
        }
    }
    assert_eq!(content, "I will check.");
    assert_eq!(names, ["get_weather"]);
    assert_eq!(args, r#"{"city": "Paris", "days": 2}"#);
    assert_eq!(
        ev.last().unwrap()["choices"][0]["finish_reason"],
        "tool_calls"
    );
    // The name went out before the parameters were complete.
    let name_at = ev
        .iter()
        .position(|e| e["choices"][0]["delta"]["tool_calls"][0]["function"]["name"].is_string())
        .unwrap();
    let args_at = ev
        .iter()
        .position(|e| {
            e["choices"][0]["delta"]["tool_calls"][0]["function"]["arguments"]
                .as_str()
                .is_some_and(|a| !a.is_empty())
        })
        .unwrap();
    assert!(name_at < args_at);
}

#[test]
fn model_output_is_reported_never_refused() {
    // required, but no call (the constraint is the engine's): the text, 200.
    let h = big_host("Just text.");
    let s = call(
        &h,
        "POST",
        "/v1/chat/completions",
        tool_req(json!({"tool_choice": "required"})),
    );
    assert_eq!(s.status, Some(200));
    assert_eq!(s.json()["choices"][0]["message"]["content"], "Just text.");
    // The request carried the tool-call constraint.
    match h.request().constraint.map(|c| c.grammar) {
        Some(Grammar::ToolCalls(t)) => assert!(t.required && t.tools.len() == 1),
        other => panic!("{other:?}"),
    }
    // An unknown function is reported as called.
    let h = big_host("<tool_call>\n<function=nope>\n</function>\n</tool_call>");
    let s = call(&h, "POST", "/v1/chat/completions", tool_req(json!({})));
    assert_eq!(s.status, Some(200));
    assert_eq!(
        s.json()["choices"][0]["message"]["tool_calls"][0]["function"]["name"],
        "nope"
    );
    assert_eq!(
        h.request().constraint,
        None,
        "auto without strict tools is free"
    );
    // Two calls with parallel_tool_calls false: both reported.
    let two = format!("{CALL_TEXT}\n{}", &CALL_TEXT[15..]);
    let h = big_host(&two);
    let s = call(
        &h,
        "POST",
        "/v1/chat/completions",
        tool_req(json!({"parallel_tool_calls": false, "stream": true})),
    );
    let ev = s.events();
    assert!(ev.iter().all(|e| e.get("error").is_none()), "{ev:?}");
    // tool_choice none: tools not rendered, markup is content.
    let h = big_host(CALL_TEXT);
    let s = call(
        &h,
        "POST",
        "/v1/chat/completions",
        tool_req(json!({"tool_choice": "none"})),
    );
    let v = s.json();
    // (Special tokens' text is left out, as without tools.)
    assert_eq!(
        v["choices"][0]["message"]["content"],
        CALL_TEXT
            .replace("<tool_call>", "")
            .replace("</tool_call>", "")
    );
    assert!(!dec(&h.request().prompt).contains("<tools>"));
    // Bad tool_choice requests are 400s.
    let h = big_host("");
    let s = call(
        &h,
        "POST",
        "/v1/chat/completions",
        tool_req(json!({"tool_choice": {"type": "function", "function": {"name": "x"}}})),
    );
    assert_error(&s, 400, "invalid_value");
}

#[test]
fn tool_loop_prompt_is_byte_stable() {
    // Turn N.
    let h = big_host(CALL_TEXT);
    let s = call(&h, "POST", "/v1/chat/completions", tool_req(json!({})));
    let msg = s.json()["choices"][0]["message"].clone();
    let prompt_n = dec(&h.request().prompt);
    // Turn N+1: the assistant message as returned, then the tool result.
    let h2 = big_host("Sunny.");
    let mut req = tool_req(json!({}));
    let mut m = msg.clone();
    m.as_object_mut().unwrap().remove("reasoning_content");
    req["messages"].as_array_mut().unwrap().push(m);
    req["messages"].as_array_mut().unwrap().push(json!({"role": "tool", "tool_call_id": msg["tool_calls"][0]["id"], "content": "{\"sky\": \"sunny\"}"}));
    let s = call(&h2, "POST", "/v1/chat/completions", req);
    assert_eq!(s.json()["choices"][0]["message"]["content"], "Sunny.");
    let prompt_n1 = dec(&h2.request().prompt);
    let expect = format!(
        "{prompt_n}{CALL_TEXT}<|im_end|>\n<|im_start|>user\n<tool_response>\n{{\"sky\": \"sunny\"}}\n</tool_response><|im_end|>\n"
    );
    assert!(prompt_n1.starts_with(&expect), "{prompt_n1:?}\n{expect:?}");
}

#[test]
fn tokenize_chat_with_tools() {
    let h = FakeHost::new();
    let s = call(
        &h,
        "POST",
        "/tokenize",
        json!({"messages": [{"role": "user", "content": "hi"}], "tools": weather_tools(),
            "chat_template_kwargs": {"enable_thinking": false}}),
    );
    let v = s.json();
    let text = dec(&serde_json::from_value::<Vec<u32>>(v["tokens"].clone()).unwrap());
    assert!(text.contains("<tools>\n{\"type\": \"function\""));
    assert!(text.ends_with("<|im_start|>assistant\n<think>\n\n</think>\n\n"));
    assert_eq!(v["count"], v["tokens"].as_array().unwrap().len());
    assert_eq!(v["max_model_len"], 100);
}

#[test]
fn model_template_renders_through_minijinja() {
    let req = tool_req(json!({}));
    let h = big_host(CALL_TEXT);
    call(&h, "POST", "/v1/chat/completions", req.clone());
    let builtin = dec(&h.request().prompt);
    let mut h = big_host(CALL_TEXT);
    h.info.chat_template = Some(
        include_str!("../../../tests/fixtures/chat/qwen3_6_format.jinja").to_owned()
            + "{# the model's own #}",
    );
    call(&h, "POST", "/v1/chat/completions", req);
    assert_eq!(dec(&h.request().prompt), builtin);
    // A template that raises: a clear 400.
    h.info.chat_template = Some("{{ raise_exception('System message must come first') }}".into());
    let s = call(&h, "POST", "/v1/chat/completions", tool_req(json!({})));
    let v = assert_error(&s, 400, "chat_template_error");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("System message must come first")
    );
    // A template that does not compile: a 400 naming the line, not a 500.
    h.info.chat_template = Some("{% if messages %}\n{% for %}".into());
    let s = call(&h, "POST", "/v1/chat/completions", tool_req(json!({})));
    let v = assert_error(&s, 400, "chat_template_error");
    let msg = v["error"]["message"].as_str().unwrap();
    assert!(msg.contains("chat_template.jinja:2"), "{msg}");
}

/// The two conversations of issue 24 with a template of the official
/// Qwen3.6 shapes (loop.previtem/nextitem around tool results): one tool
/// result, and two calls followed by two results.
#[test]
fn qwen_style_template_tool_results() {
    let mut h = big_host("ok");
    h.info.chat_template =
        Some(include_str!("../../../tests/fixtures/templates/qwen3_6_style.jinja").to_owned());
    let calls = json!([
        {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}},
        {"id": "c2", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Rome"}}}
    ]);
    let messages = json!([
        {"role": "user", "content": "Weather in Paris and Rome?"},
        {"role": "assistant", "content": null, "tool_calls": calls},
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
        {"role": "tool", "tool_call_id": "c2", "content": "rain"}
    ]);
    let s = call(
        &h,
        "POST",
        "/v1/chat/completions",
        tool_req(json!({"messages": messages})),
    );
    assert_eq!(s.status, Some(200), "{}", s.body_string());
    let prompt = dec(&h.request().prompt);
    assert!(
        prompt.ends_with(
            "</tool_call><|im_end|>\n<|im_start|>user\n<tool_response>\nsunny\n</tool_response>\n\
             <tool_response>\nrain\n</tool_response><|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
        ),
        "{prompt}"
    );
}

/// `--served-model-name` aliases: listed, accepted, echoed; others 404.
#[test]
fn served_model_aliases() {
    let mut h =
        FakeHost::new().with_script(vec![vec![tok("ok"), finished(FinishReason::Stop, 0, 1, 0)]]);
    h.info.aliases = vec!["gpt-4o-mini".into(), "local".into()];
    let v = call(&h, "GET", "/v1/models", Value::Null).json();
    let ids: Vec<&str> = v["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["qwen3.6", "gpt-4o-mini", "local"]);
    assert_eq!(v["data"][2]["root"], "qwen3.6");
    let m = call(&h, "GET", "/v1/models/local", Value::Null).json();
    assert_eq!(m["id"], "local");
    let s = call(
        &h,
        "POST",
        "/v1/chat/completions",
        json!({"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "U"}]}),
    );
    assert_eq!(s.json()["model"], "gpt-4o-mini");
    assert_error(
        &call(
            &h,
            "POST",
            "/v1/chat/completions",
            json!({"model": "other", "messages": [{"role": "user", "content": "U"}]}),
        ),
        404,
        "model_not_found",
    );
}

/// The operator's default chat-template kwargs sit under the request's;
/// `reasoning_effort` none/minimal turns thinking off, low/medium/high leaves
/// it on, anything else is a 400.
#[test]
fn default_template_kwargs_and_reasoning_effort() {
    let script = || vec![vec![tok("ok"), finished(FinishReason::Stop, 0, 1, 0)]];
    let prompt = |h: &FakeHost, extra: Value| {
        let mut body = json!({"model": "qwen3.6", "messages": [{"role": "user", "content": "U"}]});
        for (k, v) in extra.as_object().unwrap() {
            body[k] = v.clone();
        }
        let s = call(h, "POST", "/v1/chat/completions", body);
        assert_eq!(s.status, Some(200), "{}", s.body_string());
        dec(&h.request().prompt)
    };
    const OFF: &str = "<|im_start|>assistant\n<think>\n\n</think>\n\n";
    let mut h = FakeHost::new().with_script(script());
    h.info.default_chat_template_kwargs =
        serde_json::from_str(r#"{"enable_thinking": false}"#).unwrap();
    assert!(prompt(&h, json!({})).ends_with(OFF));
    let h2 = FakeHost {
        info: h.info.clone(),
        ..FakeHost::new().with_script(script())
    };
    let on = prompt(
        &h2,
        json!({"chat_template_kwargs": {"enable_thinking": true}}),
    );
    assert!(on.ends_with("<|im_start|>assistant\n<think>\n"), "{on}");
    for (effort, off) in [
        ("none", true),
        ("minimal", true),
        ("low", false),
        ("high", false),
    ] {
        let h = FakeHost::new().with_script(script());
        let p = prompt(&h, json!({"reasoning_effort": effort}));
        assert_eq!(p.ends_with(OFF), off, "{effort}: {p}");
    }
    // The request's kwargs win over reasoning_effort.
    let h = FakeHost::new().with_script(script());
    let p = prompt(
        &h,
        json!({"reasoning_effort": "none", "chat_template_kwargs": {"enable_thinking": true}}),
    );
    assert!(!p.ends_with(OFF));
    let h = FakeHost::new();
    let v = assert_error(
        &call(
            &h,
            "POST",
            "/v1/chat/completions",
            json!({"model": "qwen3.6", "messages": [{"role": "user", "content": "U"}], "reasoning_effort": "max"}),
        ),
        400,
        "invalid_value",
    );
    assert_eq!(v["error"]["param"], "reasoning_effort");
}

/// `n` choices: one generation each, seeds `seed + k`, indices in order,
/// usage counting the prompt once and every completion token.
#[test]
fn chat_n_choices() {
    let script = |t: &str| vec![vec![tok(t), finished(FinishReason::Stop, 9, 1, 4)]];
    let h = FakeHost::new().with_scripts(vec![script("a"), script("b"), script("c")]);
    let v = call(
        &h,
        "POST",
        "/v1/chat/completions",
        json!({"model": "qwen3.6", "messages": [{"role": "user", "content": "q"}], "n": 3, "seed": 7,
               "chat_template_kwargs": {"enable_thinking": false}}),
    )
    .json();
    let choices = v["choices"].as_array().unwrap();
    assert_eq!(choices.len(), 3);
    for (k, (c, t)) in choices.iter().zip(["a", "b", "c"]).enumerate() {
        assert_eq!(c["index"], k);
        assert_eq!(c["message"]["content"], t);
        assert_eq!(c["finish_reason"], "stop");
    }
    let seeds: Vec<Option<u64>> = h
        .requests
        .borrow()
        .iter()
        .map(|r| r.sampling.seed)
        .collect();
    assert_eq!(seeds, [Some(7), Some(8), Some(9)]);
    assert_eq!(v["usage"]["prompt_tokens"], 9);
    assert_eq!(v["usage"]["completion_tokens"], 3);
    assert_eq!(v["usage"]["prompt_tokens_details"]["cached_tokens"], 4);
}

/// A stream of `n` choices: each choice's chunks in turn (role chunk first,
/// finish_reason chunk last), then one usage chunk with the sums.
#[test]
fn chat_n_choices_stream() {
    let script = |t: &str| vec![vec![tok(t), finished(FinishReason::Length, 9, 1, 0)]];
    let h = FakeHost::new().with_scripts(vec![script("a"), script("b")]);
    let ev = call(
        &h,
        "POST",
        "/v1/chat/completions",
        json!({"model": "qwen3.6", "messages": [{"role": "user", "content": "q"}], "n": 2, "stream": true,
               "stream_options": {"include_usage": true}, "chat_template_kwargs": {"enable_thinking": false}}),
    )
    .events();
    let seen: Vec<(u64, String)> = ev
        .iter()
        .filter_map(|e| {
            let c = e["choices"].get(0)?;
            let what = match (&c["delta"]["content"], &c["finish_reason"]) {
                (_, Value::String(r)) => format!("end:{r}"),
                (Value::String(t), _) => t.clone(),
                _ => "?".into(),
            };
            Some((c["index"].as_u64().unwrap(), what))
        })
        .collect();
    let want = [
        (0, ""),
        (0, "a"),
        (0, "end:length"),
        (1, ""),
        (1, "b"),
        (1, "end:length"),
    ];
    assert_eq!(
        seen,
        want.iter()
            .map(|(i, s)| (*i, s.to_string()))
            .collect::<Vec<_>>()
    );
    let usage = &ev.last().unwrap()["usage"];
    assert_eq!(
        (
            usage["prompt_tokens"].as_u64(),
            usage["completion_tokens"].as_u64()
        ),
        (Some(9), Some(2))
    );
}

/// `best_of`: every candidate generated (with the chosen tokens' logprobs),
/// the `n` with the highest mean logprob returned, all tokens counted.
#[test]
fn completion_best_of_and_prompt_list() {
    let cand = |t: &str, lp: f32| {
        vec![vec![
            tok_lp(100 + t.as_bytes()[0] as u32, t, lp, vec![]),
            finished(FinishReason::Length, 1, 1, 0),
        ]]
    };
    let h = FakeHost::new().with_scripts(vec![cand("a", -3.0), cand("b", -0.5), cand("c", -1.0)]);
    let v = call(
        &h,
        "POST",
        "/v1/completions",
        json!({"model": "qwen3.6", "prompt": "x", "max_tokens": 1, "n": 2, "best_of": 3}),
    )
    .json();
    let texts: Vec<&str> = v["choices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["text"].as_str().unwrap())
        .collect();
    assert_eq!(texts, ["b", "c"]);
    assert_eq!(v["choices"][1]["index"], 1);
    assert!(
        v["choices"][0]["logprobs"].is_null(),
        "logprobs were not asked for"
    );
    assert!(
        h.requests
            .borrow()
            .iter()
            .all(|r| r.sampling.logprobs == Some(0))
    );
    assert_eq!(v["usage"]["completion_tokens"], 3);

    // Two prompts (a string and token ids), two choices each: index = prompt × n + k.
    let one = |t: &str| vec![vec![tok(t), finished(FinishReason::Length, 1, 1, 0)]];
    let h = FakeHost::new().with_scripts(vec![one("a"), one("b"), one("c"), one("d")]);
    let v = call(
        &h,
        "POST",
        "/v1/completions",
        json!({"model": "qwen3.6", "prompt": ["x", [220, 221]], "max_tokens": 1, "n": 2, "echo": true}),
    )
    .json();
    let got: Vec<(u64, &str)> = v["choices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| (c["index"].as_u64().unwrap(), c["text"].as_str().unwrap()))
        .collect();
    assert_eq!(got, [(0, "xa"), (1, "xb"), (2, "xyc"), (3, "xyd")]);
    let prompts: Vec<Vec<u32>> = h
        .requests
        .borrow()
        .iter()
        .map(|r| r.prompt.clone())
        .collect();
    assert_eq!(prompts, [enc("x"), enc("x"), enc("xy"), enc("xy")]);
    assert_eq!(v["usage"]["prompt_tokens"], 2);
    assert_eq!(v["usage"]["completion_tokens"], 4);
}

#[test]
fn structured_output_constraint_reaches_the_engine() {
    // Thinking on (the default): the constraint starts after `</think>`.
    let h = big_host("{}");
    let body = json!({"model": "qwen3.6", "messages": [{"role": "user", "content": "JSON"}],
        "response_format": {"type": "json_object"}});
    let s = call(&h, "POST", "/v1/chat/completions", body.clone());
    assert_eq!(s.status, Some(200));
    let c = h.request().constraint.unwrap();
    assert_eq!(c.grammar, Grammar::JsonObject);
    assert_eq!(c.start_after, h.token_to_id("</think>"));
    assert!(c.start_after.is_some());
    // Thinking off: from the first token.
    let h = big_host("{}");
    let mut off = body.clone();
    off["enable_thinking"] = json!(false);
    call(&h, "POST", "/v1/chat/completions", off);
    assert_eq!(h.request().constraint.unwrap().start_after, None);
    // The host's refusal is a 400 naming the field.
    let h = big_host("{}");
    *h.fail_with.borrow_mut() = Some(GenerateError::InvalidRequest(
        "invalid constraint: the schema is bad".into(),
    ));
    let s = call(&h, "POST", "/v1/chat/completions", body);
    let v = assert_error(&s, 400, "invalid_value");
    assert_eq!(v["error"]["param"], "response_format", "{v}");
    // With enforced tool calls: one or the other.
    let s = call(
        &big_host("{}"),
        "POST",
        "/v1/chat/completions",
        tool_req(json!({"tool_choice": "required", "guided_regex": "x"})),
    );
    let v = assert_error(&s, 400, "invalid_value");
    assert_eq!(v["error"]["param"], "guided_regex", "{v}");
}
