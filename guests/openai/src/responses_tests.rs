//! `/v1/responses` against the SDK's scripted engine.

use serde_json::{Value, json};

use qwasi_guest_sdk::Request;
use qwasi_guest_sdk::inference::FinishReason;
use qwasi_guest_sdk::testing::{FakeEngine, Recorder};

use crate::api::handle;

fn post(engine: &FakeEngine, body: Value) -> Recorder {
    let mut out = Recorder::default();
    handle(
        engine,
        Request::from_bytes("POST", "/v1/responses", body.to_string()),
        &mut out,
    );
    out
}

fn body(extra: Value) -> Value {
    let mut v = json!({"model": "fake-model", "input": "Hi"});
    for (k, x) in extra.as_object().unwrap() {
        v[k] = x.clone();
    }
    v
}

const TOOLS: &str = r#"[{"type": "function", "name": "get_weather", "description": "Weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}]"#;

fn tool_script() -> Vec<&'static str> {
    vec![
        "Checking",
        "</think>",
        "\n\n<tool_call>\n<function=get_weather>\n",
        "<parameter=city>\nParis\n</parameter>\n",
        "</function>\n</tool_call>",
    ]
}

#[test]
fn plain_response() {
    let e = FakeEngine::new()
        .script(&["Hmm", "</think>", "\n\nHello", "!"], FinishReason::Stop)
        .cached(3);
    let out = post(
        &e,
        body(json!({"instructions": "Be brief.", "max_output_tokens": 50})),
    );
    assert_eq!(out.status, Some(200), "{}", out.body_string());
    let v = out.json();
    assert_eq!(v["object"], "response");
    assert_eq!(v["status"], "completed");
    assert_eq!(v["store"], false);
    assert!(v["id"].as_str().unwrap().starts_with("resp_"));
    assert_eq!(v["output"][0]["type"], "reasoning");
    assert_eq!(
        v["output"][0]["content"],
        json!([{"type": "reasoning_text", "text": "Hmm"}])
    );
    assert_eq!(v["output"][1]["type"], "message");
    assert_eq!(v["output"][1]["content"][0]["text"], "Hello!");
    assert_eq!(v["usage"]["input_tokens_details"]["cached_tokens"], 3);
    assert_eq!(v["usage"]["output_tokens"], 4);
    assert_eq!(v["usage"]["output_tokens_details"]["reasoning_tokens"], 2);
    assert_eq!(v["max_output_tokens"], 50);
    let text = e.last_prompt_text();
    assert!(
        text.starts_with("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>"),
        "{text:?}"
    );
    assert_eq!(e.last_request().unwrap().max_tokens, 50);
    assert!(!e.last_request().unwrap().ignore_eos);
    post(&e, body(json!({"ignore_eos": true})));
    assert!(e.last_request().unwrap().ignore_eos, "Qwasi's extension");
}

#[test]
fn token_limit_is_incomplete_and_effort_none_turns_thinking_off() {
    let e = FakeEngine::new().script(&["a", "b", "c"], FinishReason::Stop);
    let v = post(
        &e,
        body(json!({"max_output_tokens": 2, "reasoning": {"effort": "none"}})),
    )
    .json();
    assert_eq!(v["status"], "incomplete");
    assert_eq!(v["incomplete_details"]["reason"], "max_output_tokens");
    assert_eq!(v["output"][0]["content"][0]["text"], "ab");
    assert!(e.last_prompt_text().ends_with("<think>\n\n</think>\n\n"));
}

#[test]
fn effort_maps_as_chat_reasoning_effort() {
    let e = FakeEngine::new().script(&["a"], FinishReason::Stop);
    post(&e, body(json!({"reasoning": {"effort": "minimal"}})));
    assert!(e.last_prompt_text().ends_with("<think>\n\n</think>\n\n"));
    post(&e, body(json!({"reasoning": {"effort": "high"}})));
    assert!(e.last_prompt_text().ends_with("<think>\n"));
    let out = post(&e, body(json!({"reasoning": {"effort": "extreme"}})));
    assert_eq!(out.status, Some(400));
    assert_eq!(out.json()["error"]["param"], "reasoning.effort");
    assert!(
        out.json()["error"]["message"]
            .as_str()
            .unwrap()
            .contains("reasoning.effort"),
        "{}",
        out.json()
    );
}

#[test]
fn streamed_event_sequence() {
    let e = FakeEngine::new().script(&["Hmm", "</think>", "\n\nHi", " there"], FinishReason::Stop);
    let out = post(&e, body(json!({"stream": true})));
    let ev = out.sse();
    let names: Vec<&str> = ev.iter().map(|(n, _)| n.as_deref().unwrap()).collect();
    assert_eq!(
        names,
        [
            "response.created",
            "response.in_progress",
            "response.output_item.added",
            "response.reasoning_text.delta",
            "response.reasoning_text.done",
            "response.output_item.done",
            "response.output_item.added",
            "response.content_part.added",
            "response.output_text.delta",
            "response.output_text.delta",
            "response.output_text.done",
            "response.content_part.done",
            "response.output_item.done",
            "response.completed",
        ]
    );
    for (i, (n, d)) in ev.iter().enumerate() {
        assert_eq!(d["type"], n.as_deref().unwrap());
        assert_eq!(d["sequence_number"], i as u64);
    }
    assert_eq!(ev[0].1["response"]["status"], "in_progress");
    assert_eq!(ev[8].1["delta"], "Hi");
    assert_eq!(ev[8].1["output_index"], 1);
    assert_eq!(ev[8].1["item_id"], ev[6].1["item"]["id"]);
    assert_eq!(ev[10].1["text"], "Hi there");
    let done = &ev[13].1["response"];
    assert_eq!(done["status"], "completed");
    assert_eq!(done["output"][1]["content"][0]["text"], "Hi there");
    // One host write per batch of engine events (3 per batch here) plus the head.
    assert!(out.writes.len() <= 3, "{} writes", out.writes.len());
}

#[test]
fn function_call_round_trip() {
    let e = FakeEngine::new().script(&tool_script(), FinishReason::Stop);
    let tools: Value = serde_json::from_str(TOOLS).unwrap();
    let v = post(&e, body(json!({"tools": tools}))).json();
    let call = v["output"]
        .as_array()
        .unwrap()
        .iter()
        .find(|i| i["type"] == "function_call")
        .unwrap()
        .clone();
    assert_eq!(call["name"], "get_weather");
    assert!(call["call_id"].as_str().unwrap().starts_with("call_"));
    assert!(call["id"].as_str().unwrap().starts_with("fc_"));
    let args: Value = serde_json::from_str(call["arguments"].as_str().unwrap()).unwrap();
    assert_eq!(args, json!({"city": "Paris"}));
    // The client sends the call and its output back as input items.
    let e2 = FakeEngine::new().script(&["</think>", "It is 18C."], FinishReason::Stop);
    let mut input = vec![json!({"role": "user", "content": "Weather in Paris?"})];
    input.extend(v["output"].as_array().unwrap().iter().cloned());
    input
        .push(json!({"type": "function_call_output", "call_id": call["call_id"], "output": "18C"}));
    let v2 = post(
        &e2,
        json!({"model": "fake-model", "tools": tools, "input": input}),
    )
    .json();
    assert_eq!(v2["output"][0]["content"][0]["text"], "It is 18C.");
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
fn function_call_streams_arguments() {
    let e = FakeEngine::new().script(&tool_script(), FinishReason::Stop);
    let tools: Value = serde_json::from_str(TOOLS).unwrap();
    let ev = post(&e, body(json!({"tools": tools, "stream": true}))).sse();
    let added = ev
        .iter()
        .find(|(_, d)| d["item"]["type"] == "function_call")
        .unwrap();
    assert_eq!(added.1["item"]["arguments"], "");
    let deltas: String = ev
        .iter()
        .filter(|(n, _)| n.as_deref() == Some("response.function_call_arguments.delta"))
        .map(|(_, d)| d["delta"].as_str().unwrap().to_owned())
        .collect();
    let done = ev
        .iter()
        .find(|(n, _)| n.as_deref() == Some("response.function_call_arguments.done"))
        .unwrap();
    assert_eq!(done.1["arguments"], deltas);
    assert_eq!(
        serde_json::from_str::<Value>(&deltas).unwrap(),
        json!({"city": "Paris"})
    );
}

#[test]
fn stateless_and_bad_input_are_clear_400s() {
    let e = FakeEngine::new().script(&["x"], FinishReason::Stop);
    let err = |v: Value| {
        let out = post(&e, v);
        assert_eq!(out.status, Some(400), "{}", out.body_string());
        out.json()["error"].clone()
    };
    let x = err(body(json!({"previous_response_id": "resp_1"})));
    assert_eq!(x["param"], "previous_response_id");
    assert!(x["message"].as_str().unwrap().contains("does not store"));
    assert_eq!(err(json!({"model": "fake-model"}))["param"], "input");
    assert_eq!(
        err(body(
            json!({"input": [{"type": "item_reference", "id": "x"}]})
        ))["param"],
        "input[0].type"
    );
    assert_eq!(
        err(body(
            json!({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]})
        ))["param"],
        "input[0].content[0].type"
    );
    assert_eq!(
        err(body(json!({"tools": [{"type": "web_search"}]})))["param"],
        "tools[0].type"
    );
    assert_eq!(
        err(body(json!({"max_output_tokens": 0})))["param"],
        "max_output_tokens"
    );
    assert_eq!(
        err(body(json!({"text": {"format": {"type": "json_schema"}}})))["param"],
        "text.format"
    );
    let mut out = Recorder::default();
    handle(
        &e,
        Request::from_bytes("GET", "/v1/responses/resp_1", ""),
        &mut out,
    );
    assert_eq!(out.status, Some(404));
    assert!(out.body_string().contains("does not store"));
}

#[test]
fn failures_stream_response_failed() {
    let e = FakeEngine::new().failing("device lost");
    let ev = post(&e, body(json!({"stream": true}))).sse();
    let (n, d) = ev.last().unwrap();
    assert_eq!(n.as_deref(), Some("response.failed"));
    assert_eq!(d["response"]["status"], "failed");
    assert!(
        d["response"]["error"]["message"]
            .as_str()
            .unwrap()
            .contains("device lost")
    );
}
