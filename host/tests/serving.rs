//! Serving options over real HTTP: `--served-model-name` aliases,
//! `--chat-template` (a template with the shapes of Qwen3.6's: the tool
//! conversations of issue 24 render, a template error is a 400 naming the
//! line), `--default-chat-template-kwargs`, and bad options failing the start.

mod common;

use common::*;
use serde_json::{Value, json};
use std::process::Command;

fn post(s: &Server, path: &str, body: &Value) -> Resp {
    request(&s.addr, "POST", path, &[], &body.to_string())
}

fn qwen_style_template() -> String {
    repo_root()
        .join("tests/fixtures/templates/qwen3_6_style.jinja")
        .display()
        .to_string()
}

#[test]
fn served_names_template_and_default_kwargs() {
    let template = qwen_style_template();
    // The demo model: the real Qwen3.6 tokenizer (the fixture models have none).
    let s = Server::start_with(
        &[
            "--served-model-name",
            "alpha",
            "--served-model-name",
            "beta",
            "--chat-template",
            &template,
            "--default-chat-template-kwargs",
            r#"{"enable_thinking": false}"#,
        ],
        false,
    );
    let models = s.get("/v1/models").json();
    let ids: Vec<&str> = models["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["alpha", "beta"]);
    assert_eq!(s.get("/v1/models/beta").status, 200);
    assert_eq!(s.get("/v1/models/qwasi-demo").status, 404);

    // Two tool calls, then two tool results: one user turn of two responses.
    let messages = json!([
        {"role": "user", "content": "Weather in Paris and Rome?"},
        {"role": "assistant", "content": null, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}},
            {"id": "c2", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Rome"}}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
        {"role": "tool", "tool_call_id": "c2", "content": "rain"}
    ]);
    let r = post(
        &s,
        "/tokenize",
        &json!({"model": "beta", "messages": messages}),
    );
    assert_eq!(r.status, 200, "{r:?}");
    let text = post(&s, "/detokenize", &json!({"tokens": r.json()["tokens"]})).json()["prompt"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(
        text.ends_with(
            "</tool_call><|im_end|>\n<|im_start|>user\n<tool_response>\nsunny\n</tool_response>\n\
             <tool_response>\nrain\n</tool_response><|im_end|>\n\
             <|im_start|>assistant\n<think>\n\n</think>\n\n"
        ),
        "{text}"
    );
    // A request's own kwargs win over the defaults.
    let r = post(
        &s,
        "/tokenize",
        &json!({"messages": [{"role": "user", "content": "hi"}], "chat_template_kwargs": {"enable_thinking": true}}),
    );
    let text = post(&s, "/detokenize", &json!({"tokens": r.json()["tokens"]})).json()["prompt"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(text.ends_with("<|im_start|>assistant\n<think>\n"), "{text}");

    // Generation under an alias echoes it; an unknown name is a 404.
    let r = post(
        &s,
        "/v1/chat/completions",
        &json!({"model": "alpha", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}),
    );
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(r.json()["model"], "alpha");
    let r = post(
        &s,
        "/v1/chat/completions",
        &json!({"model": "qwasi-demo", "messages": [{"role": "user", "content": "hi"}]}),
    );
    assert_eq!((r.status, r.error_code()), (404, "model_not_found".into()));

    // The template refuses a conversation: a 400 naming its line, never a 500.
    let r = post(
        &s,
        "/v1/chat/completions",
        &json!({"model": "alpha", "messages": [{"role": "user", "content": "hi"}, {"role": "system", "content": "late"}]}),
    );
    assert_eq!(
        (r.status, r.error_code()),
        (400, "chat_template_error".into()),
        "{r:?}"
    );
    let msg = r.json()["error"]["message"].as_str().unwrap().to_owned();
    assert!(msg.contains("The system message must come first."), "{msg}");
    assert!(msg.contains("(in chat_template.jinja:68)"), "{msg}");
}

#[test]
fn bad_serving_options_fail_the_start() {
    for (flag, value, says) in [
        (
            "--default-chat-template-kwargs",
            "[1]",
            "must be a JSON object",
        ),
        ("--default-chat-template-kwargs", "{", "not valid JSON"),
        ("--chat-template", "/nonexistent/t.jinja", "cannot read"),
    ] {
        let out = Command::new(QWASI)
            .args(["serve", "--port", "0", flag, value])
            .output()
            .unwrap();
        assert!(!out.status.success(), "{flag} {value}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(flag) && err.contains(says), "{err}");
    }
}
