//! The streaming tool-call parser: model output (text and call markup) cut
//! into chunks at input-chosen points. Checks: no panic; the chunked parse
//! equals the parse of the whole text; without a call the text comes back
//! unchanged; every call's arguments are a JSON object; no text is lost (the
//! content plus the markup consumed accounts for every non-whitespace char).
#![no_main]

use libfuzzer_sys::fuzz_target;
use qwasi_fuzz::Input;
use qwasi_guest_sdk::toolcall::{Schemas, ToolParser, collect, parse_all, schemas};
use serde_json::{Map, Value, json};

fn tool_schemas() -> Schemas {
    schemas(&[
        json!({"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {
            "city": {"type": "string"}, "days": {"type": "integer"},
            "scale": {"type": ["number", "null"]}, "flags": {"type": "array"},
            "opts": {"type": "object"}, "ok": {"type": "boolean"}, "any": {"enum": [1, "a"]}
        }}}}),
    ])
}

fuzz_target!(|data: &[u8]| {
    let mut input = Input(data);
    let ncuts = input.byte() % 8;
    let cuts: Vec<usize> = (0..ncuts).map(|_| input.byte() as usize * 4).collect();
    let typed = input.byte() & 1 != 0;
    let text = String::from_utf8_lossy(input.rest()).into_owned();
    let sch = || {
        if typed {
            tool_schemas()
        } else {
            Schemas::new()
        }
    };

    let whole = parse_all(sch(), &text);
    let mut bounds: Vec<usize> = cuts
        .into_iter()
        .map(|c| c.min(text.len()))
        .filter(|&c| text.is_char_boundary(c))
        .collect();
    bounds.sort();
    let mut p = ToolParser::new(sch());
    let mut outs = Vec::new();
    let mut last = 0;
    for b in bounds {
        outs.extend(p.push(&text[last..b]));
        last = b;
    }
    outs.extend(p.push(&text[last..]));
    outs.extend(p.finish());
    assert_eq!(collect(outs), whole, "chunked parse differs from the whole");
    if whole.1.is_empty() {
        assert_eq!(whole.0, text, "text without calls changed");
    }
    for c in &whole.1 {
        assert!(
            serde_json::from_str::<Map<String, Value>>(&c.arguments).is_ok(),
            "arguments are not a JSON object: {c:?}"
        );
    }
    let nonws = |s: &str| s.chars().filter(|c| !c.is_whitespace()).count();
    let mut p = ToolParser::new(sch());
    let mut outs = p.push(&text);
    outs.extend(p.finish());
    let (content, _) = collect(outs);
    assert_eq!(
        nonws(&content) + p.markup_chars(),
        nonws(&text),
        "text lost"
    );
});
