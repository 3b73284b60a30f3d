//! The chat-template renderers: a chat completions body through the OpenAI
//! request parser, then the prompt rendered by the model's jinja template
//! (minijinja) and by the SDK's built-in Qwen3.6 renderer. Checks: no panic,
//! and where the template renders, both renderers agree byte for byte (the
//! built-in one stands in for the template when a model has none).
#![no_main]

use libfuzzer_sys::fuzz_target;
use qwasi_fuzz::QWEN_TEMPLATE;
use qwasi_guest_sdk::fields::parse_body;
use qwasi_guest_sdk::inference::ModelInfo;
use qwasi_openai_guest::api::render_prompt;
use qwasi_openai_guest::params::parse_chat;

fuzz_target!(|data: &[u8]| {
    let Ok(body) = parse_body(data) else { return };
    let mut info = ModelInfo {
        id: "qwen3.6".into(),
        context_length: 2048,
        vocab_size: 1 << 20,
        ..Default::default()
    };
    let Ok(r) = parse_chat(&body, &info) else {
        return;
    };
    let builtin = render_prompt(&info, &r.messages, &r.tools, r.render)
        .expect("the built-in renderer renders every parsed request");
    info.chat_template = Some(QWEN_TEMPLATE.into());
    if let Ok(jinja) = render_prompt(&info, &r.messages, &r.tools, r.render) {
        assert_eq!(builtin, jinja, "built-in and jinja renderings differ");
    }
});
