use super::*;
use proptest::prelude::*;
use serde_json::json;

fn tools() -> Vec<Value> {
    vec![
        json!({"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {
        "city": {"type": "string"}, "days": {"type": "integer"}, "metric": {"type": "boolean"},
        "opts": {"type": "object"}, "temp": {"type": "number"}, "tags": {"type": ["array", "null"]}}}}}),
    ]
}

fn streamed(pieces: &[&str]) -> (String, Vec<Call>) {
    let mut p = ToolParser::new(schemas(&tools()));
    let mut outs = Vec::new();
    for x in pieces {
        outs.extend(p.push(x));
    }
    outs.extend(p.finish());
    collect(outs)
}

const SAMPLE: &str = "Let me check.\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis <b>\n</parameter>\n<parameter=days>\n3\n</parameter>\n<parameter=metric>\ntrue\n</parameter>\n<parameter=opts>\n{\"a\": [1, 2]}\n</parameter>\n<parameter=temp>\n2.5\n</parameter>\n<parameter=tags>\nnull\n</parameter>\n</function>\n</tool_call>\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>";

fn expected() -> (String, Vec<Call>) {
    (
        "Let me check.".into(),
        vec![
            Call {
                name: "get_weather".into(),
                arguments: r#"{"city": "Paris <b>", "days": 3, "metric": true, "opts": {"a":[1,2]}, "temp": 2.5, "tags": null}"#.into(),
            },
            Call {
                name: "get_weather".into(),
                arguments: r#"{"city":"Oslo"}"#.into(),
            },
        ],
    )
}

#[test]
fn whole() {
    assert_eq!(parse_all(schemas(&tools()), SAMPLE), expected());
    let args: Value = serde_json::from_str(&expected().1[0].arguments).unwrap();
    assert_eq!(args["opts"], json!({"a": [1, 2]}));
}

#[test]
fn every_split_point() {
    let idx: Vec<usize> = SAMPLE
        .char_indices()
        .map(|(i, _)| i)
        .chain([SAMPLE.len()])
        .collect();
    for &i in &idx {
        assert_eq!(
            streamed(&[&SAMPLE[..i], &SAMPLE[i..]]),
            expected(),
            "split {i}"
        );
    }
    for (a, &i) in idx.iter().enumerate().step_by(7) {
        for &j in &idx[a..] {
            assert_eq!(
                streamed(&[&SAMPLE[..i], &SAMPLE[i..j], &SAMPLE[j..]]),
                expected(),
                "split {i} {j}"
            );
        }
    }
    let chars: Vec<String> = SAMPLE.chars().map(String::from).collect();
    let refs: Vec<&str> = chars.iter().map(String::as_str).collect();
    assert_eq!(streamed(&refs), expected());
}

#[test]
fn plain_text_streams_at_once() {
    let mut p = ToolParser::new(Schemas::new());
    assert_eq!(p.push("Hello <b>"), vec![Out::Text("Hello <b>".into())]);
    assert_eq!(p.push(" x <tool"), vec![Out::Text(" x".into())]);
    assert_eq!(p.push("box>"), vec![Out::Text(" <toolbox>".into())]);
    assert_eq!(p.push("\n\n"), vec![]);
    assert_eq!(p.finish(), vec![Out::Text("\n\n".into())]);
}

#[test]
fn name_goes_out_before_arguments() {
    let mut p = ToolParser::new(Schemas::new());
    assert_eq!(p.push("<tool_call>\n<function=f"), vec![]);
    assert_eq!(
        p.push(">\n<parameter=a>\nx"),
        vec![Out::Start {
            index: 0,
            name: "f".into()
        }]
    );
    assert_eq!(
        p.push("\n</parameter>\n"),
        vec![Out::Args {
            index: 0,
            fragment: r#"{"a": "x""#.into()
        }]
    );
    assert_eq!(
        p.push("</function>\n</tool_call>"),
        vec![
            Out::Args {
                index: 0,
                fragment: "}".into()
            },
            Out::End { index: 0 }
        ]
    );
}

#[test]
fn malformed_is_text() {
    for t in [
        "a <tool_call> b",
        "<tool_call>\n<func>x</tool_call>",
        "<tool_call>\n{\"name\": 3}\n</tool_call>",
        "<tool_call>\n{not json",
        "x\n\n<tool_call>",
        "<tool_call>\n<function=\nf>",
    ] {
        assert_eq!(
            parse_all(Schemas::new(), t),
            (t.to_owned(), vec![]),
            "{t:?}"
        );
    }
    // Broken after the commit: the call ends, the rest is text.
    let (c, calls) = parse_all(
        Schemas::new(),
        "<tool_call>\n<function=f>\n<parameter=a>\n1\n</parameter>\noops",
    );
    assert_eq!(c, "\noops");
    assert_eq!(calls[0].arguments, r#"{"a": "1"}"#);
    let (c, calls) = parse_all(
        Schemas::new(),
        "<tool_call>\n<function=f>\n<parameter=a>\n1",
    );
    assert_eq!(c, "\n<parameter=a>\n1");
    assert_eq!(calls[0].arguments, "{}");
}

#[test]
fn typing() {
    assert_eq!(typed_value("12", Some("integer")), json!(12));
    assert_eq!(typed_value("1.5", Some("integer")), json!(1.5));
    assert_eq!(typed_value("x", Some("integer")), json!("x"));
    assert_eq!(typed_value("False", Some("boolean")), json!(false));
    assert_eq!(typed_value("[1]", Some("array")), json!([1]));
    assert_eq!(typed_value("null", Some("string")), Value::Null);
    assert_eq!(typed_value(" 7 ", None), json!(" 7 "));
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]

    #[test]
    fn fuzz_no_panic_no_loss(
        parts in prop::collection::vec(prop::sample::select(vec![
            "<tool_call>", "</tool_call>", "<function=f>", "</function>", "<parameter=a>",
            "</parameter>", "\n", " ", "x", "{", "}", "\"name\"", ":", "<", ">", "é", "<tool_", "=",
        ]), 0..40),
        cuts in prop::collection::vec(0usize..400, 0..6),
    ) {
        let text: String = parts.concat();
        let whole = parse_all(Schemas::new(), &text);
        // Chunked the same way as whole.
        let mut bounds: Vec<usize> = cuts.into_iter().map(|c| c.min(text.len())).filter(|&c| text.is_char_boundary(c)).collect();
        bounds.sort();
        let mut pieces = Vec::new();
        let mut last = 0;
        for b in bounds { pieces.push(&text[last..b]); last = b; }
        pieces.push(&text[last..]);
        let mut p = ToolParser::new(Schemas::new());
        let mut outs = Vec::new();
        for x in &pieces { outs.extend(p.push(x)); }
        outs.extend(p.finish());
        prop_assert_eq!(collect(outs), whole.clone());
        // No calls: all the text comes back.
        if whole.1.is_empty() {
            prop_assert_eq!(&whole.0, &text);
        }
        // Every call's arguments are a JSON object.
        for c in &whole.1 {
            prop_assert!(serde_json::from_str::<Map<String, Value>>(&c.arguments).is_ok(), "{:?}", c);
        }
        // No text is lost: the content plus the markup consumed into calls
        // accounts for every non-whitespace char of the input.
        let nonws = |s: &str| s.chars().filter(|c| !c.is_whitespace()).count();
        let mut p = ToolParser::new(Schemas::new());
        let mut outs = p.push(&text);
        outs.extend(p.finish());
        let (content, _) = collect(outs);
        prop_assert_eq!(nonws(&content) + p.markup_chars(), nonws(&text));
    }

    #[test]
    fn fuzz_plain_text_roundtrips(text in "[a-z <>/_\n]{0,60}") {
        let (c, calls) = parse_all(Schemas::new(), &text);
        if !text.contains(CALL_OPEN) {
            prop_assert_eq!(c, text);
            prop_assert!(calls.is_empty());
        }
    }
}
