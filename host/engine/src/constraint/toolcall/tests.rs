//! Raw-text tool parameters on the real Qwen3.6 vocabulary: `pattern` and
//! `format` enforced (outputs drawn at random among the allowed tokens,
//! checked by the `jsonschema` crate's own format and pattern validators),
//! the closing tag never inside a value, and what cannot be enforced
//! refused under strict, ignored otherwise.

use super::super::tests::{compiler, pick};
use super::super::{ConstraintSpec, Grammar, Step};
use super::{Tool, ToolCalls};
use crate::tokenizer::Tokenizer;
use serde_json::{Map, Value, json};
use std::sync::OnceLock;

fn tokenizer() -> &'static Tokenizer {
    static T: OnceLock<Tokenizer> = OnceLock::new();
    T.get_or_init(|| Tokenizer::qwen36().unwrap())
}

/// A required call of the one tool `f` with these parameters.
fn call_of(parameters: Value) -> ConstraintSpec {
    ConstraintSpec {
        grammar: Grammar::ToolCalls(ToolCalls {
            tools: vec![Tool {
                name: "f".into(),
                parameters,
            }],
            required: true,
            parallel: false,
        }),
        start_after: None,
    }
}

fn strict(mut parameters: Value) -> Value {
    parameters["x-guidance"] = json!({"lenient": false});
    parameters
}

/// Draws tokens uniformly among the allowed ones until the constraint is
/// done; the text (special tokens left out), or `None` past `max` tokens.
fn random_call(spec: &ConstraintSpec, seed: u64, max: usize) -> Option<String> {
    let mut c = compiler().compile(spec).unwrap().start();
    let mut rng = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut ids = Vec::new();
    for _ in 0..max {
        let allowed = c.mask().unwrap().to_list();
        let t = pick(&mut rng, &allowed);
        ids.push(t);
        if c.advance(t).unwrap() == Step::Done {
            return Some(tokenizer().decode(&ids, true).unwrap());
        }
    }
    None
}

/// The arguments as the guest's parser reads them: each value runs from
/// `<parameter=KEY>\n` to the first `</parameter>`, less one trailing
/// newline. Panics unless each closing tag is followed by the next
/// parameter or the end of the function.
fn arguments(text: &str) -> Map<String, Value> {
    let mut args = Map::new();
    let mut rest = text
        .split_once("<function=f>\n")
        .unwrap_or_else(|| panic!("no function: {text:?}"))
        .1;
    while let Some(after) = rest.strip_prefix("<parameter=") {
        let (key, after) = after.split_once(">\n").expect("a parameter name");
        let (value, after) = after.split_once("</parameter>").expect("a closing tag");
        let value = value
            .strip_suffix('\n')
            .unwrap_or_else(|| panic!("{key}: no newline before </parameter> in {text:?}"));
        rest = after
            .strip_prefix('\n')
            .unwrap_or_else(|| panic!("{key}: the closing tag is cut in {text:?}"));
        assert!(
            rest.starts_with("<parameter=") || rest.starts_with("</function>"),
            "{key}: '</parameter>' inside the value of {text:?}"
        );
        args.insert(key.into(), Value::String(value.into()));
    }
    assert!(rest.starts_with("</function>"), "{text:?}");
    args
}

fn assert_valid(schema: &Value, args: &Map<String, Value>) {
    let validator = jsonschema::options()
        .should_validate_formats(true)
        .build(schema)
        .unwrap();
    let v = Value::Object(args.clone());
    let errors: Vec<String> = validator.iter_errors(&v).map(|e| e.to_string()).collect();
    assert!(errors.is_empty(), "{v} breaks {schema}: {errors:?}");
}

#[test]
fn raw_text_values_match_pattern_and_format() {
    let s = |extra: Value| {
        let mut p = json!({"type": "string"});
        p.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        p
    };
    let mut props = Map::new();
    for (key, extra) in [
        // Unanchored: a match somewhere in the value.
        (
            "code",
            json!({"pattern": "[A-Z]{2}-[0-9]+", "maxLength": 10}),
        ),
        ("word", json!({"pattern": "^[a-z]+$", "maxLength": 5})),
        ("ratio", json!({"pattern": r"^\d+/\d+$", "maxLength": 7})),
        ("tag", json!({"pattern": "^(v|r)[0-9]$"})),
        ("when", json!({"format": "date-time"})),
        ("day", json!({"format": "date"})),
        ("at", json!({"format": "time"})),
        ("span", json!({"format": "duration", "maxLength": 12})),
        ("mail", json!({"format": "email", "maxLength": 24})),
        ("host", json!({"format": "hostname", "maxLength": 20})),
        ("ip", json!({"format": "ipv4"})),
        ("ip6", json!({"format": "ipv6"})),
        ("id", json!({"format": "uuid"})),
        // The closing tag's own letters are allowed; the tag is not.
        ("note", json!({"pattern": "parameter", "maxLength": 20})),
    ] {
        props.insert(key.into(), s(extra));
    }
    let keys: Vec<String> = props.keys().cloned().collect();
    let schema = json!({"type": "object", "properties": props, "required": keys});
    for parameters in [schema.clone(), strict(schema.clone())] {
        for seed in 0..8 {
            let text = random_call(&call_of(parameters.clone()), seed, 1500)
                .unwrap_or_else(|| panic!("seed {seed}: not finished"));
            let args = arguments(&text);
            assert_eq!(args.len(), keys.len(), "{text:?}");
            assert_valid(&schema, &args);
        }
    }
}

#[test]
fn a_value_never_holds_the_closing_tag() {
    // A pattern that would like the tag inside: it can only end the value.
    let schema = json!({"type": "object", "properties": {
        "x": {"type": "string", "pattern": "^a(</parameter>)?b", "maxLength": 30}},
        "required": ["x"]});
    let mut c = compiler().compile(&call_of(schema)).unwrap().start();
    let tok = tokenizer();
    for id in tok
        .encode("<tool_call>\n<function=f>\n<parameter=x>\na")
        .unwrap()
    {
        c.advance(id).unwrap();
    }
    let close = tok.encode("</parameter>").unwrap();
    // "a" then the tag: not a value matching "^a…b", so the tag cannot come.
    let mut allowed_tag = true;
    for &id in &close {
        if !c.mask().unwrap().is_allowed(id) {
            allowed_tag = false;
            break;
        }
        c.advance(id).unwrap();
    }
    assert!(!allowed_tag, "'</parameter>' accepted inside a value");
    for seed in 0..6 {
        let text = random_call(
            &call_of(json!({"type": "object", "properties": {
                "x": {"type": "string", "pattern": "^a(</parameter>)?b", "maxLength": 30}},
                "required": ["x"]})),
            seed,
            200,
        )
        .unwrap();
        let args = arguments(&text);
        let x = args["x"].as_str().unwrap();
        assert!(x.starts_with("ab") && !x.contains("</parameter>"), "{x:?}");
    }
}

#[test]
fn unenforceable_keywords_refused_under_strict_ignored_otherwise() {
    for (extra, keyword) in [
        (json!({"format": "uri"}), "format"),
        (json!({"format": "no-such-format"}), "format"),
        (json!({"pattern": r"\bword"}), "pattern"),
        (json!({"pattern": "(?=a)b"}), "pattern"),
        (json!({"pattern": "(unclosed"}), "pattern"),
        (json!({"pattern": "^a|b$"}), "pattern"),
        (json!({"pattern": 7}), "pattern"),
    ] {
        let mut p = json!({"type": "string", "maxLength": 4});
        p.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        let schema = json!({"type": "object", "properties": {"v": p}, "required": ["v"]});
        let e = compiler()
            .compile(&call_of(strict(schema.clone())))
            .unwrap_err()
            .0;
        assert!(
            e.contains("tool 'f'") && e.contains("'v'") && e.contains(&format!("'{keyword}'")),
            "{extra}: {e}"
        );
        // Not strict: the keyword is ignored, the length still holds.
        let text = random_call(&call_of(schema), 1, 300).unwrap();
        assert!(arguments(&text)["v"].as_str().unwrap().chars().count() <= 4);
    }
    // Strictness reaches JSON parameters too.
    let schema = json!({"type": "object", "properties": {
        "o": {"type": "object", "properties": {"s": {"type": "string", "format": "no-such"}}}}});
    assert!(
        compiler()
            .compile(&call_of(strict(schema.clone())))
            .unwrap_err()
            .0
            .contains("no-such")
    );
    compiler().compile(&call_of(schema)).unwrap();
}

#[test]
fn patterns_keep_search_semantics() {
    use super::rawtext::search;
    let any = "(?s:.*)";
    // (left anchored, right anchored) as JSON Schema reads them.
    for (p, start, end) in [
        ("^ab$", true, true),
        ("ab", false, false),
        ("^ab", true, false),
        ("ab$", false, true),
        ("(^ab$)", true, true),
    ] {
        let r = search(p).unwrap();
        assert!(r.contains("ab"), "{p}: {r}");
        assert_eq!(r.starts_with(any), !start, "{p}: {r}");
        assert_eq!(r.ends_with(any), !end, "{p}: {r}");
    }
    assert!(search("^a/b$").unwrap().contains(r"a\/b"));
    assert!(search(r"^\d$").unwrap().contains("[0-9]"));
}
