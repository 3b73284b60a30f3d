//! The endpoints against the SDK's scripted engine.

use serde_json::{Value, json};

use qwasi_guest_sdk::Request;
use qwasi_guest_sdk::inference::FinishReason;
use qwasi_guest_sdk::testing::{FakeEngine, Recorder};

use crate::api::handle;

fn post(engine: &FakeEngine, path: &str, body: Value) -> Recorder {
    let mut out = Recorder::default();
    let req = Request::from_bytes("POST", path, body.to_string())
        .with_header("anthropic-version", "2023-06-01")
        .with_header("x-api-key", "sk-test");
    handle(engine, req, &mut out);
    out
}

fn body(extra: Value) -> Value {
    let mut v = json!({"model": "claude-x", "max_tokens": 100, "messages": [{"role": "user", "content": "Hi"}]});
    for (k, x) in extra.as_object().unwrap() {
        v[k] = x.clone();
    }
    v
}

const WEATHER: &str = r#"[{"name": "get_weather", "description": "Weather of a city", "input_schema": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}, "required": ["city"]}}]"#;

fn tool_script() -> Vec<&'static str> {
    vec![
        "Let me check.",
        "\n\n<tool_call>\n<function=get_weather>\n",
        "<parameter=city>\nParis\n</parameter>\n",
        "<parameter=days>\n3\n</parameter>\n",
        "</function>\n</tool_call>",
    ]
}

#[test]
fn create_plain() {
    let e = FakeEngine::new()
        .script(&["Hello", " there", "!"], FinishReason::Stop)
        .cached(2);
    let out = post(&e, "/v1/messages", body(json!({})));
    assert_eq!(out.status, Some(200));
    let v = out.json();
    assert_eq!(v["type"], "message");
    assert_eq!(v["role"], "assistant");
    assert_eq!(v["model"], "claude-x");
    assert!(v["id"].as_str().unwrap().starts_with("msg_"));
    assert_eq!(
        v["content"],
        json!([{"type": "text", "text": "Hello there!"}])
    );
    assert_eq!(v["stop_reason"], "end_turn");
    assert_eq!(v["stop_sequence"], Value::Null);
    let prompt = e.last_request().unwrap().prompt.len() as u64;
    assert_eq!(v["usage"]["input_tokens"], prompt - 2);
    assert_eq!(v["usage"]["cache_read_input_tokens"], 2);
    assert_eq!(v["usage"]["output_tokens"], 3);
    // Thinking is off unless asked for: the prompt closes the think block.
    let text = e.last_prompt_text();
    assert!(text.ends_with("<think>\n\n</think>\n\n"), "{text:?}");
}

#[test]
fn max_tokens_and_stop_sequences() {
    let e = FakeEngine::new().script(&["a", "b", "c", "d"], FinishReason::Stop);
    let v = post(&e, "/v1/messages", body(json!({"max_tokens": 2}))).json();
    assert_eq!(v["stop_reason"], "max_tokens");
    assert_eq!(v["content"][0]["text"], "ab");
    let v = post(&e, "/v1/messages", body(json!({"stop_sequences": ["c"]}))).json();
    assert_eq!(v["stop_reason"], "stop_sequence");
    assert_eq!(v["stop_sequence"], "c");
    assert_eq!(v["content"][0]["text"], "ab");
    // A huge max_tokens (Claude Code sends 32000) is clamped to the context;
    // Claude Code's `?beta=true` query is fine.
    let out = post(
        &e,
        "/v1/messages?beta=true",
        body(json!({"max_tokens": 64000})),
    );
    assert_eq!(out.status, Some(200));
    let room = 4096 - e.last_request().unwrap().prompt.len() as u32;
    assert_eq!(e.last_request().unwrap().max_tokens, room);
    assert!(!e.last_request().unwrap().ignore_eos);
    post(&e, "/v1/messages", body(json!({"ignore_eos": true})));
    assert!(e.last_request().unwrap().ignore_eos, "Qwasi's extension");
}

#[test]
fn thinking_blocks() {
    let e = FakeEngine::new().script(&["Hmm", " ok", "</think>", "\n\nDone."], FinishReason::Stop);
    let v = post(
        &e,
        "/v1/messages",
        body(json!({"max_tokens": 2000, "thinking": {"type": "enabled", "budget_tokens": 1024}})),
    )
    .json();
    assert_eq!(
        v["content"],
        json!([{"type": "thinking", "thinking": "Hmm ok", "signature": ""}, {"type": "text", "text": "Done."}])
    );
}

#[test]
fn stream_event_sequence() {
    let e = FakeEngine::new()
        .script(&["Hmm", "</think>", "\n\nHi", " you"], FinishReason::Stop)
        .cached(1);
    let out = post(
        &e,
        "/v1/messages",
        body(
            json!({"stream": true, "max_tokens": 2000, "thinking": {"type": "enabled", "budget_tokens": 1024}}),
        ),
    );
    assert_eq!(out.header("content-type"), Some("text/event-stream"));
    let ev = out.sse();
    let names: Vec<&str> = ev.iter().map(|(n, _)| n.as_deref().unwrap()).collect();
    assert_eq!(
        names,
        [
            "message_start",
            "ping",
            "content_block_start",
            "content_block_delta",
            "content_block_stop",
            "content_block_start",
            "content_block_delta",
            "content_block_delta",
            "content_block_stop",
            "message_delta",
            "message_stop"
        ]
    );
    for (n, d) in &ev {
        assert_eq!(
            d["type"],
            n.as_deref().unwrap(),
            "data.type is the event name"
        );
    }
    assert_eq!(ev[0].1["message"]["usage"]["cache_read_input_tokens"], 1);
    assert_eq!(
        ev[3].1["delta"],
        json!({"type": "thinking_delta", "thinking": "Hmm"})
    );
    assert_eq!(
        ev[5].1["content_block"],
        json!({"type": "text", "text": ""})
    );
    assert_eq!(ev[5].1["index"], 1);
    assert_eq!(
        ev[6].1["delta"],
        json!({"type": "text_delta", "text": "Hi"})
    );
    assert_eq!(ev[9].1["delta"]["stop_reason"], "end_turn");
    assert_eq!(ev[9].1["usage"]["output_tokens"], 4);
    // One host write per batch of engine events (3 per batch here), never per event.
    assert!(out.writes.len() <= 3, "{} writes", out.writes.len());
}

#[test]
fn tools_round_trip() {
    let e = FakeEngine::new().script(&tool_script(), FinishReason::Stop);
    let tools: Value = serde_json::from_str(WEATHER).unwrap();
    let v = post(&e, "/v1/messages", body(json!({"tools": tools}))).json();
    assert_eq!(v["stop_reason"], "tool_use");
    assert_eq!(
        v["content"][0],
        json!({"type": "text", "text": "Let me check."})
    );
    let call = &v["content"][1];
    assert_eq!(call["type"], "tool_use");
    assert!(call["id"].as_str().unwrap().starts_with("toolu_"));
    assert_eq!(call["input"], json!({"city": "Paris", "days": 3}));
    // The result goes back; the prompt holds the call and the result.
    let e2 = FakeEngine::new().script(&["18C in Paris."], FinishReason::Stop);
    let v2 = post(
        &e2,
        "/v1/messages",
        json!({"model": "m", "max_tokens": 50, "tools": tools, "messages": [
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": v["content"]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call["id"], "content": "18C"}]}
        ]}),
    )
    .json();
    assert_eq!(v2["content"][0]["text"], "18C in Paris.");
    let text = e2.last_prompt_text();
    assert!(
        text.contains("<function=get_weather>\n<parameter=city>\nParis\n</parameter>"),
        "{text}"
    );
    assert!(
        text.contains("<tool_response>\n18C\n</tool_response>"),
        "{text}"
    );
}

#[test]
fn tools_stream_arguments_as_generated() {
    let e = FakeEngine::new().script(&tool_script(), FinishReason::Stop);
    let tools: Value = serde_json::from_str(WEATHER).unwrap();
    let ev = post(
        &e,
        "/v1/messages",
        body(json!({"tools": tools, "stream": true})),
    )
    .sse();
    let start = ev
        .iter()
        .find(|(_, d)| d["content_block"]["type"] == "tool_use")
        .unwrap();
    assert_eq!(start.1["content_block"]["name"], "get_weather");
    assert_eq!(start.1["content_block"]["input"], json!({}));
    let parts: Vec<&str> = ev
        .iter()
        .filter(|(_, d)| d["delta"]["type"] == "input_json_delta")
        .map(|(_, d)| d["delta"]["partial_json"].as_str().unwrap())
        .collect();
    assert!(parts.len() >= 3, "one fragment per parameter: {parts:?}");
    let args: Value = serde_json::from_str(&parts.concat()).unwrap();
    assert_eq!(args, json!({"city": "Paris", "days": 3}));
    let delta = ev
        .iter()
        .find(|(n, _)| n.as_deref() == Some("message_delta"))
        .unwrap();
    assert_eq!(delta.1["delta"]["stop_reason"], "tool_use");
}

#[test]
fn tool_choice_is_enforced() {
    let e = FakeEngine::new().script(&["No tools today."], FinishReason::Stop);
    let tools: Value = serde_json::from_str(WEATHER).unwrap();
    let out = post(
        &e,
        "/v1/messages",
        body(json!({"tools": tools, "tool_choice": {"type": "any"}})),
    );
    // A 422 (the model broke the request's rules; a retry rarely helps),
    // not a 5xx that clients retry.
    assert_eq!(out.status, Some(422));
    assert_eq!(out.json()["type"], "error");
    assert_eq!(out.json()["error"]["type"], "invalid_request_error");
}

#[test]
fn model_template_gets_thinking_switch_and_operator_kwargs() {
    let mut e = FakeEngine::new().script(&["Hi"], FinishReason::Stop);
    e.info.chat_template =
        Some(include_str!("../../../tests/fixtures/chat/qwen3_6_format.jinja").to_owned());
    // The Messages API's default is no thinking, whatever the template's is.
    let out = post(&e, "/v1/messages", body(json!({})));
    assert_eq!(out.status, Some(200), "{}", out.body_string());
    assert!(e.last_prompt_text().ends_with("<think>\n\n</think>\n\n"));
    let thinking =
        json!({"max_tokens": 4000, "thinking": {"type": "enabled", "budget_tokens": 1024}});
    let out = post(&e, "/v1/messages", body(thinking));
    assert_eq!(out.status, Some(200), "{}", out.body_string());
    let prompt = e.last_prompt_text();
    assert!(prompt.ends_with("assistant\n<think>\n"), "{prompt:?}");
    // The operator's defaults reach the template; the request's switch wins.
    e.info.default_chat_template_kwargs =
        serde_json::from_value(json!({"enable_thinking": true, "greeting": "Ahoy"})).unwrap();
    e.info.chat_template = Some("{{ greeting }} {{ enable_thinking }}".into());
    post(&e, "/v1/messages", body(json!({})));
    assert_eq!(e.last_prompt_text(), "Ahoy False");
}

#[test]
fn count_tokens() {
    let e = FakeEngine::new();
    let out = post(
        &e,
        "/v1/messages/count_tokens",
        json!({"model": "m", "messages": [{"role": "user", "content": "Hi"}]}),
    );
    assert_eq!(out.status, Some(200));
    // One token per char in the fake engine: the rendered prompt's length.
    let expect = "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
        .chars()
        .count();
    assert_eq!(out.json(), json!({"input_tokens": expect}));
}

#[test]
fn errors_in_anthropic_shape() {
    let e = FakeEngine::new();
    let out = post(&e, "/v1/messages", json!({"model": "m", "messages": []}));
    assert_eq!(out.status, Some(400));
    let v = out.json();
    assert_eq!(v["type"], "error");
    assert_eq!(v["error"]["type"], "invalid_request_error");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("max_tokens")
    );
    let out = post(&e, "/v1/messages/nope", json!({}));
    assert_eq!(out.status, Some(404));
    assert_eq!(out.json()["error"]["type"], "not_found_error");
    let mut out = Recorder::default();
    handle(&e, Request::from_bytes("GET", "/v1/messages", ""), &mut out);
    assert_eq!(out.status, Some(405));
    assert_eq!(out.header("allow"), Some("POST"));
    let mut out = Recorder::default();
    handle(
        &e,
        Request::from_bytes("POST", "/v1/messages", "{not json"),
        &mut out,
    );
    assert_eq!(out.status, Some(400));
    assert_eq!(out.json()["error"]["type"], "invalid_request_error");
    let img = post(
        &e,
        "/v1/messages",
        body(
            json!({"messages": [{"role": "user", "content": [{"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": ""}}]}]}),
        ),
    );
    assert_eq!(img.status, Some(400));
    // A generation that fails mid-stream ends with an error event.
    let e = FakeEngine::new().failing("device lost");
    let ev = post(&e, "/v1/messages", body(json!({"stream": true}))).sse();
    let last = ev.last().unwrap();
    assert_eq!(last.0.as_deref(), Some("error"));
    assert_eq!(last.1["error"]["type"], "api_error");
}

/// A request shaped like Claude Code's (`tests/fixtures/anthropic`).
#[test]
fn claude_code_shaped_request_streams() {
    let fixture: Value = serde_json::from_str(include_str!(
        "../../../tests/fixtures/anthropic/claude_code_request.json"
    ))
    .unwrap();
    let mut e = FakeEngine::new().script(
        &[
            "The user wants the file",
            "</think>",
            "\n\nReading it.",
            "\n\n<tool_call>\n<function=Read>\n",
            "<parameter=file_path>\n/repo/README.md\n</parameter>\n",
            "</function>\n</tool_call>",
        ],
        FinishReason::Stop,
    );
    e.info.context_length = 100_000; // the fake engine spends a token per char
    let ev = post(&e, "/v1/messages", fixture).sse();
    let kinds: Vec<String> = ev
        .iter()
        .filter(|(n, _)| n.as_deref() == Some("content_block_start"))
        .map(|(_, d)| d["content_block"]["type"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(kinds, ["thinking", "text", "tool_use"]);
    let delta = ev
        .iter()
        .find(|(n, _)| n.as_deref() == Some("message_delta"))
        .unwrap();
    assert_eq!(delta.1["delta"]["stop_reason"], "tool_use");
    assert_eq!(ev.last().unwrap().0.as_deref(), Some("message_stop"));
}
