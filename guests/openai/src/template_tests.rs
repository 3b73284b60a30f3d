//! The chat fixtures (`tests/fixtures/chat`, made by transformers'
//! `apply_chat_template`): an OpenAI chat request's messages, tools and
//! `chat_template_kwargs`, rendered by the SDK's built-in renderer and by its
//! jinja renderer over the fixture template, byte for byte.

use qwasi_guest_sdk::template::render;
use serde_json::Value;

use crate::chat::parse_messages;
use crate::params::{Fields, parse_tool_side_for_tests};

const TEMPLATE: &str = include_str!("../../../tests/fixtures/chat/qwen3_6_format.jinja");

fn fixtures() -> Vec<(String, Value)> {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/fixtures/chat");
    let mut out: Vec<(String, Value)> = std::fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| {
            let p = e.unwrap().path();
            (p.extension()? == "json").then(|| {
                let v = serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
                (p.file_name().unwrap().to_string_lossy().into_owned(), v)
            })
        })
        .collect();
    out.sort_by(|a, b| a.0.cmp(&b.0));
    assert!(
        out.len() >= 8,
        "fixtures missing: run scripts/make_chat_fixtures.py"
    );
    out
}

#[test]
fn fixtures_builtin_and_jinja_match_transformers() {
    for (name, fx) in fixtures() {
        let req = fx["request"].as_object().unwrap();
        let messages = parse_messages(req.get("messages")).unwrap();
        let (opts, tools) = parse_tool_side_for_tests(&Fields(req)).unwrap();
        let expected = fx["expected"].as_str().unwrap();
        let builtin = render(None, &messages, &tools.rendered(), opts, &tools.kwargs).unwrap();
        assert_eq!(builtin, expected, "built-in renderer, fixture {name}");
        let jinja = render(
            Some(TEMPLATE),
            &messages,
            &tools.rendered(),
            opts,
            &tools.kwargs,
        )
        .unwrap();
        assert_eq!(jinja, expected, "minijinja, fixture {name}");
    }
}
