//! The handlers against the SDK's scripted engine.

use super::*;
use qwasi_guest_sdk::inference::FinishReason;
use qwasi_guest_sdk::testing::{FakeEngine, Recorder};

fn engine() -> FakeEngine {
    FakeEngine::new()
        .script(&["Hel", "lo", " there", "!"], FinishReason::Stop)
        .special(1, "<|im_start|>")
        .special(2, "</think>")
}

fn call(e: &FakeEngine, method: &str, path: &str, body: &str) -> Recorder {
    let mut out = Recorder::default();
    handle(e, Request::from_bytes(method, path, body), &mut out);
    out
}

fn prompt_text(e: &FakeEngine) -> String {
    e.detokenize(&e.last_request().unwrap().prompt, false)
        .unwrap()
}

#[test]
fn generate_streams_ndjson() {
    let e = engine();
    let out = call(
        &e,
        "POST",
        "/api/generate",
        r#"{"model": "fake-model", "prompt": "Hi", "system": "Be brief.",
            "options": {"temperature": 0, "top_k": 5, "seed": 7, "num_predict": 10}}"#,
    );
    assert_eq!(out.status, Some(200));
    assert_eq!(out.header("content-type"), Some("application/x-ndjson"));
    let lines = out.ndjson();
    assert_eq!(lines.len(), 5, "4 deltas and the final line: {lines:?}");
    let text: String = lines
        .iter()
        .map(|l| l["response"].as_str().unwrap())
        .collect();
    assert_eq!(text, "Hello there!");
    for l in &lines[..4] {
        assert_eq!(l["done"], false);
        assert_eq!(l["model"], "fake-model");
        assert!(l["created_at"].as_str().unwrap().ends_with('Z'));
    }
    let last = &lines[4];
    assert_eq!(last["done"], true);
    assert_eq!(last["done_reason"], "stop");
    assert_eq!(last["eval_count"], 4);
    let req = e.last_request().unwrap();
    assert_eq!(last["prompt_eval_count"], req.prompt.len());
    for k in [
        "total_duration",
        "load_duration",
        "prompt_eval_duration",
        "eval_duration",
    ] {
        assert!(last[k].as_u64().unwrap() > 0, "{k}: {last}");
    }
    assert_eq!(
        last["context"].as_array().unwrap().len(),
        req.prompt.len() + 4
    );
    // The chat format with thinking off, and the options.
    assert_eq!(
        prompt_text(&e),
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n\
         <|im_start|>assistant\n<think>\n\n</think>\n\n"
    );
    assert_eq!(req.sampling.temperature, 0.0);
    assert_eq!(req.sampling.top_k, 5);
    assert_eq!(req.sampling.top_p, 0.9);
    assert_eq!(req.sampling.seed, Some(7));
    assert_eq!(req.max_tokens, 10);
    assert_eq!(req.snapshot_points, vec![28, 47]); // message boundaries
    // Lines are batched: the fake engine delivers 3 events per wait.
    assert_eq!(out.writes.len(), 2);
}

#[test]
fn generate_non_stream_and_stop() {
    let e = engine();
    let out = call(
        &e,
        "POST",
        "/api/generate",
        r#"{"model": "fake-model:latest", "prompt": "Hi", "stream": false, "raw": true,
            "options": {"stop": ["there"]}}"#,
    );
    assert_eq!(out.status, Some(200));
    assert_eq!(out.header("content-type"), Some("application/json"));
    let v = out.json();
    assert_eq!(v["response"], "Hello ");
    assert_eq!(v["done"], true);
    assert_eq!(v["done_reason"], "stop");
    assert_eq!(v["eval_count"], 3);
    assert_eq!(prompt_text(&e), "Hi"); // raw: no template
    let req = e.last_request().unwrap();
    assert_eq!(req.sampling.temperature, 0.8); // Ollama's default
    assert_eq!(req.max_tokens, 4096 - 2);

    // `context` continues a conversation: its ids come first.
    let out = call(
        &e,
        "POST",
        "/api/generate",
        r#"{"model": "fake-model", "prompt": "x", "raw": true, "stream": false, "context": [65, 66]}"#,
    );
    assert_eq!(out.status, Some(200));
    assert_eq!(e.last_request().unwrap().prompt, vec![65, 66, 120]);
}

#[test]
fn generate_length_and_empty_prompt() {
    let e = engine();
    let out = call(
        &e,
        "POST",
        "/api/generate",
        r#"{"model": "fake-model", "prompt": "Hi", "stream": false, "options": {"num_predict": 2}}"#,
    );
    let v = out.json();
    assert_eq!(
        (v["response"].as_str(), v["done_reason"].as_str()),
        (Some("Hello"), Some("length"))
    );
    assert_eq!(v["eval_count"], 2);

    let out = call(&e, "POST", "/api/generate", r#"{"model": "fake-model"}"#);
    let v = out.json();
    assert_eq!(
        (v["done"].as_bool(), v["done_reason"].as_str()),
        (Some(true), Some("load"))
    );
}

#[test]
fn chat_stream_and_thinking() {
    let e = FakeEngine::new()
        .script(&["plan", "</think>", "\n\nAns", "wer"], FinishReason::Stop)
        .special(1, "<|im_start|>")
        .special(2, "</think>");
    let out = call(
        &e,
        "POST",
        "/api/chat",
        r#"{"model": "fake-model", "think": true, "messages": [
            {"role": "system", "content": "S"},
            {"role": "user", "content": "Q1"},
            {"role": "assistant", "content": "A1", "thinking": "old"},
            {"role": "user", "content": "Q2"}]}"#,
    );
    assert_eq!(out.status, Some(200));
    let lines = out.ndjson();
    let thinking: String = lines
        .iter()
        .filter_map(|l| l["message"]["thinking"].as_str())
        .collect();
    let content: String = lines
        .iter()
        .map(|l| l["message"]["content"].as_str().unwrap())
        .collect();
    assert_eq!(thinking, "plan");
    assert_eq!(content, "Answer");
    let last = lines.last().unwrap();
    assert_eq!(last["done"], true);
    assert_eq!(last["message"]["role"], "assistant");
    assert!(last.get("context").is_none());
    assert_eq!(
        prompt_text(&e),
        "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nQ1<|im_end|>\n\
         <|im_start|>assistant\nA1<|im_end|>\n<|im_start|>user\nQ2<|im_end|>\n\
         <|im_start|>assistant\n<think>\n"
    );

    let out = call(
        &e,
        "POST",
        "/api/chat",
        r#"{"model": "fake-model", "stream": false, "messages": [{"role": "user", "content": "Q"}]}"#,
    );
    let v = out.json();
    assert_eq!(v["message"]["content"], "plan\n\nAnswer");
    assert_eq!(v["done_reason"], "stop");
}

#[test]
fn errors_in_ollama_format() {
    let e = engine();
    let cases: &[(&str, &str, &str, u16, &str)] = &[
        (
            "POST",
            "/api/generate",
            "{nope",
            400,
            "key must be a string",
        ),
        ("POST", "/api/generate", "", 400, "empty"),
        (
            "POST",
            "/api/generate",
            r#"{"prompt": "x"}"#,
            400,
            "model is required",
        ),
        (
            "POST",
            "/api/generate",
            r#"{"model": "other", "prompt": "x"}"#,
            404,
            "model 'other' not found",
        ),
        (
            "POST",
            "/api/generate",
            r#"{"model": "fake-model", "prompt": "x", "options": {"top_k": -1}}"#,
            400,
            "invalid value",
        ),
        (
            "POST",
            "/api/generate",
            r#"{"model": "fake-model", "prompt": "x", "format": "yaml"}"#,
            400,
            r#"invalid format: "yaml"; expected "json" or a valid JSON Schema object"#,
        ),
        (
            "POST",
            "/api/chat",
            r#"{"model": "fake-model", "messages": [], "format": ["json"]}"#,
            400,
            "invalid format: [\"json\"]",
        ),
        (
            "POST",
            "/api/chat",
            r#"{"model": "fake-model", "messages": [{"role": "robot", "content": "x"}]}"#,
            400,
            "unknown role 'robot'",
        ),
        (
            "POST",
            "/api/chat",
            r#"{"model": "fake-model", "messages": "x"}"#,
            400,
            "invalid type",
        ),
        ("GET", "/api/chat", "", 405, "not allowed"),
        ("GET", "/api/nothing", "", 404, "not found"),
        (
            "POST",
            "/api/show",
            r#"{"model": "nope"}"#,
            404,
            "model 'nope' not found",
        ),
    ];
    for (method, path, body, status, msg) in cases {
        let out = call(&e, method, path, body);
        assert_eq!(
            out.status,
            Some(*status),
            "{method} {path} {body}: {}",
            out.body_string()
        );
        let v = out.json();
        let err = v["error"].as_str().unwrap_or_else(|| panic!("{v}"));
        assert!(err.contains(msg), "{method} {path} {body}: {err}");
        assert_eq!(v.as_object().unwrap().len(), 1);
    }
    let e = engine().refusing(GenerateError::QueueFull(3));
    let out = call(
        &e,
        "POST",
        "/api/chat",
        r#"{"model": "fake-model", "messages": [{"role": "user", "content": "x"}]}"#,
    );
    assert_eq!(out.status, Some(429));
    assert_eq!(out.header("retry-after"), Some("3"));

    // A failure after the stream started is an error line.
    let e = engine().failing("boom");
    let out = call(
        &e,
        "POST",
        "/api/generate",
        r#"{"model": "fake-model", "prompt": "x"}"#,
    );
    assert_eq!(out.status, Some(200));
    assert_eq!(
        out.ndjson().last().unwrap()["error"],
        "generation failed: boom"
    );
}

#[test]
fn format_becomes_the_constraint() {
    let e = engine();
    let grammar = |e: &FakeEngine| e.last_request().unwrap().constraint.map(|c| c.grammar);
    // "json": any JSON object, on both endpoints; null and "" are no format.
    call(
        &e,
        "POST",
        "/api/generate",
        r#"{"model": "fake-model", "prompt": "x", "format": "json"}"#,
    );
    assert_eq!(grammar(&e), Some(Grammar::JsonObject));
    for none in ["null", r#""""#] {
        let body = format!(
            r#"{{"model": "fake-model", "messages": [{{"role": "user", "content": "x"}}], "format": {none}}}"#
        );
        assert_eq!(call(&e, "POST", "/api/chat", &body).status, Some(200));
        assert_eq!(grammar(&e), None, "{none}");
    }
    // A schema, as the Python client sends `format=Model.model_json_schema()`:
    // not strict (Ollama skips what its grammar cannot express).
    let schema = r#"{"properties": {"name": {"title": "Name", "type": "string"}}, "required": ["name"], "title": "P", "type": "object"}"#;
    let out = call(
        &e,
        "POST",
        "/api/chat",
        &format!(
            r#"{{"model": "fake-model", "stream": false, "format": {schema},
                "messages": [{{"role": "user", "content": "x"}}]}}"#
        ),
    );
    assert_eq!(out.status, Some(200));
    let c = e.last_request().unwrap().constraint.unwrap();
    match c.grammar {
        Grammar::JsonSchema { schema: s, strict } => {
            assert!(!strict);
            let mut want = serde_json::from_str::<Value>(schema).unwrap();
            want["additionalProperties"] = false.into();
            assert_eq!(serde_json::from_str::<Value>(&s).unwrap(), want);
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(c.start_after, None, "thinking off: the whole output");
    // With thinking on, the constraint starts after `</think>` (id 2).
    call(
        &e,
        "POST",
        "/api/chat",
        r#"{"model": "fake-model", "think": true, "format": "json",
            "messages": [{"role": "user", "content": "x"}]}"#,
    );
    assert_eq!(
        e.last_request().unwrap().constraint.unwrap().start_after,
        Some(2)
    );

    // A schema the host cannot compile: Ollama's 400 with the host's reason.
    let e = engine().refusing(GenerateError::InvalidRequest(
        "invalid constraint: unknown type 'strin'".into(),
    ));
    let out = call(
        &e,
        "POST",
        "/api/generate",
        r#"{"model": "fake-model", "prompt": "x", "format": {"type": "strin"}}"#,
    );
    assert_eq!(out.status, Some(400));
    assert_eq!(
        out.json(),
        json!({"error": "invalid JSON schema in format: unknown type 'strin'"})
    );
}

#[test]
fn schemas_are_closed_as_llama_cpp_reads_them() {
    // Nested objects (through $defs, items, anyOf) take no unlisted
    // properties; an explicit additionalProperties, an allOf branch and an
    // object without properties stay as they are.
    let schema = json!({
        "$defs": {"Pet": {"type": "object", "properties": {"kind": {"type": "string"}}}},
        "type": "object",
        "properties": {
            "pets": {"type": "array", "items": {"$ref": "#/$defs/Pet"}},
            "properties": {"type": "object", "properties": {"x": {"type": "integer"}}},
            "any": {"type": "object"},
            "open": {"type": "object", "properties": {"a": {}}, "additionalProperties": true},
            "either": {"anyOf": [{"type": "object", "properties": {"b": {}}}, {"type": "null"}]},
            "both": {"allOf": [{"properties": {"c": {}}}, {"properties": {"d": {}}}]},
        },
    });
    let c = format::closed(schema);
    assert_eq!(c["additionalProperties"], false);
    assert_eq!(c["$defs"]["Pet"]["additionalProperties"], false);
    assert_eq!(c["properties"]["properties"]["additionalProperties"], false);
    assert_eq!(c["properties"]["any"], json!({"type": "object"}));
    assert_eq!(c["properties"]["open"]["additionalProperties"], true);
    assert_eq!(
        c["properties"]["either"]["anyOf"][0]["additionalProperties"],
        false
    );
    assert_eq!(
        c["properties"]["both"],
        json!({"allOf": [{"properties": {"c": {}}}, {"properties": {"d": {}}}]})
    );
}

#[test]
fn model_endpoints() {
    let e = engine();
    let out = call(&e, "GET", "/api/tags", "");
    let v = out.json();
    assert_eq!(v["models"][0]["name"], "fake-model");
    assert_eq!(v["models"][0]["modified_at"], "2023-11-14T22:13:20Z");
    let out = call(&e, "POST", "/api/show", r#"{"model": "fake-model"}"#);
    assert_eq!(out.json()["model_info"]["qwen3.context_length"], 4096);
    let out = call(&e, "POST", "/api/show", r#"{"name": "fake-model"}"#);
    assert_eq!(out.status, Some(200));
    assert_eq!(
        call(&e, "GET", "/api/version", "").json()["version"],
        OLLAMA_VERSION
    );
    assert_eq!(call(&e, "GET", "/", "").body_string(), "Ollama is running");
}
