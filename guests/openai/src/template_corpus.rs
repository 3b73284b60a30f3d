//! The template corpus (tests/fixtures/templates): every template written
//! for it, rendered over every conversation by transformers
//! (scripts/make_template_corpus.py, re-checked live in CI by
//! tests/e2e/test_template_corpus.py) and here by the guest, compared byte
//! for byte. A conversation transformers refuses must be a 400
//! `chat_template_error` here, with the template's message.

use serde_json::{Map, Value};

use crate::chat::parse_messages;
use crate::params::{Fields, parse_tool_side_for_tests};
use crate::template::render;

const DIR: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../tests/fixtures/templates"
);

fn corpus() -> Value {
    let text = std::fs::read_to_string(format!("{DIR}/corpus.json"))
        .expect("corpus.json: run scripts/make_template_corpus.py");
    serde_json::from_str(&text).unwrap()
}

#[test]
fn corpus_matches_transformers() {
    let corpus = corpus();
    let conversations = corpus["conversations"].as_object().unwrap();
    let renders = corpus["renders"].as_object().unwrap();
    let templates: Vec<_> = std::fs::read_dir(DIR)
        .unwrap()
        .filter_map(|e| {
            let p = e.unwrap().path();
            (p.extension()? == "jinja").then_some(p)
        })
        .collect();
    assert!(templates.len() >= 6, "templates missing in {DIR}");
    let mut failures = Vec::new();
    let mut checked = 0;
    for path in &templates {
        let name = path.file_stem().unwrap().to_string_lossy().into_owned();
        let source = std::fs::read_to_string(path).unwrap();
        let expected = renders
            .get(&name)
            .unwrap_or_else(|| panic!("{name} is not in corpus.json: rerun the script"));
        for (conv, case) in conversations {
            let req: &Map<String, Value> = case.as_object().unwrap();
            let messages = parse_messages(req.get("messages")).unwrap();
            let (mut opts, tools) = parse_tool_side_for_tests(&Fields(req)).unwrap();
            opts.add_generation_prompt = req
                .get("add_generation_prompt")
                .and_then(Value::as_bool)
                .unwrap_or(true);
            let got = render(
                Some(&source),
                &messages,
                &tools.rendered(),
                opts,
                &tools.kwargs,
            );
            let want = &expected[conv];
            checked += 1;
            match (got, want.get("text").and_then(Value::as_str)) {
                (Ok(g), Some(w)) if g == w => {}
                (Ok(g), Some(w)) => failures.push(format!(
                    "{name} × {conv}: differs\n--- transformers\n{w}\n--- guest\n{g}\n---"
                )),
                (Err(e), Some(_)) => failures.push(format!("{name} × {conv}: guest failed: {e:?}")),
                (Ok(g), None) => failures.push(format!(
                    "{name} × {conv}: transformers failed ({}), guest rendered\n{g}",
                    want["error"]
                )),
                (Err(e), None) => {
                    let w = want["error"].as_str().unwrap();
                    let ok = e.status == 400
                        && e.code.as_deref() == Some("chat_template_error")
                        && (!w.starts_with("TemplateError: ")
                            || e.message.contains(&w["TemplateError: ".len()..]));
                    if !ok {
                        failures.push(format!("{name} × {conv}: want {w}, got {e:?}"));
                    }
                }
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {checked} renders differ from transformers:\n{}",
        failures.len(),
        failures.join("\n")
    );
    assert!(checked >= 80, "only {checked} pairs");
}
