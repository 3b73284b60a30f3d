//! The constraint module on the real Qwen3.6 vocabulary: compile errors,
//! outputs drawn at random among the allowed tokens, and the demo model
//! (random weights, so never valid JSON on its own) held to a dozen schemas.

use super::*;
use crate::cpu::CpuModel;
use crate::generate::{FinishReason, GenerateRequest, GenerateResult, generate_with};
use crate::model::LoadedModel;
use crate::sampling::SamplingParams;
use std::ops::ControlFlow;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// One of `allowed`, drawn by a xorshift step of `rng` (never 0).
pub(super) fn pick(rng: &mut u64, allowed: &[u32]) -> u32 {
    *rng ^= *rng << 13;
    *rng ^= *rng >> 7;
    *rng ^= *rng << 17;
    allowed[(*rng % allowed.len() as u64) as usize]
}

/// The Qwen3.6 vocabulary's compiler for the demo model (shared with the
/// tool-call tests).
pub(super) fn compiler() -> &'static Compiler {
    static C: OnceLock<Compiler> = OnceLock::new();
    C.get_or_init(|| {
        let cfg = crate::demo::config();
        Compiler::new(
            &Tokenizer::qwen36().unwrap(),
            cfg.vocab_size,
            &cfg.eos_token_ids,
        )
        .unwrap()
    })
}

fn spec(grammar: Grammar) -> ConstraintSpec {
    ConstraintSpec {
        grammar,
        start_after: None,
    }
}

fn schema(v: Value) -> ConstraintSpec {
    spec(Grammar::JsonSchema {
        schema: v,
        strict: true,
    })
}

fn err(s: ConstraintSpec) -> String {
    compiler().compile(&s).unwrap_err().0
}

/// A dozen schemas whose shortest valid output is short (a random model
/// writes strings until a quote happens to win, so strings are bounded,
/// and objects take no extra properties, whose keys are unbounded strings).
fn schemas() -> Vec<Value> {
    let name = json!({"type": "string", "maxLength": 6});
    vec![
        json!({"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"], "additionalProperties": false}),
        json!({"type": "object", "properties": {"n": {"type": "integer", "minimum": -5, "maximum": 5}}, "required": ["n"], "additionalProperties": false}),
        json!({"type": "object", "properties": {"x": {"type": "number", "exclusiveMinimum": 0, "maximum": 1, "multipleOf": 0.25}}, "required": ["x"], "additionalProperties": false}),
        json!({"type": "object", "properties": {"color": {"enum": ["red", "green", "blue"]}}, "required": ["color"], "additionalProperties": false}),
        json!({"type": "object", "properties": {"name": name, "age": {"type": "integer", "minimum": 0, "maximum": 150}}, "required": ["name", "age"], "additionalProperties": false}),
        json!({"type": "object", "properties": {"tags": {"type": "array", "items": {"enum": ["a", "b"]}, "minItems": 1, "maxItems": 3}}, "required": ["tags"], "additionalProperties": false}),
        json!({"type": "object", "properties": {"inner": {"type": "object", "properties": {"deep": {"type": "object", "properties": {"v": {"type": "boolean"}}, "required": ["v"], "additionalProperties": false}}, "required": ["deep"], "additionalProperties": false}}, "required": ["inner"], "additionalProperties": false}),
        json!({"type": "object", "properties": {"req": {"type": "boolean"}, "opt": {"type": "integer", "minimum": 1, "maximum": 9}}, "required": ["req"], "additionalProperties": false}),
        json!({"type": "object", "properties": {"v": {"anyOf": [{"type": "integer", "minimum": 0, "maximum": 3}, {"type": "boolean"}, {"type": "null"}]}}, "required": ["v"], "additionalProperties": false}),
        json!({"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 9}, "minItems": 2, "maxItems": 4}),
        json!({"type": "object", "properties": {"points": {"type": "array", "items": {"type": "object", "properties": {"x": {"type": "integer", "minimum": 0, "maximum": 9}, "y": {"type": "integer", "minimum": 0, "maximum": 9}}, "required": ["x", "y"], "additionalProperties": false}, "maxItems": 2}}, "required": ["points"], "additionalProperties": false}),
        json!({"$defs": {"code": {"type": "string", "pattern": "^[A-Z]{2}$"}}, "type": "object", "properties": {"code": {"$ref": "#/$defs/code"}, "kind": {"const": "fixed"}}, "required": ["code", "kind"], "additionalProperties": false}),
    ]
}

fn assert_valid(schema: &Value, text: &str) {
    let v: Value = serde_json::from_str(text)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {text:?} for {schema}"));
    let validator = jsonschema::validator_for(schema).unwrap();
    let errors: Vec<String> = validator.iter_errors(&v).map(|e| e.to_string()).collect();
    assert!(errors.is_empty(), "{text} breaks {schema}: {errors:?}");
}

/// Time spent computing masks in [`random_walk`], and how many.
static MASKS: std::sync::Mutex<(Duration, u32, Duration)> =
    std::sync::Mutex::new((Duration::ZERO, 0, Duration::ZERO));

/// Draws tokens uniformly among the allowed ones until the constraint is
/// done (or `max` tokens); returns the text.
fn random_walk(c: &mut Constraint, seed: u64, max: usize) -> (String, bool) {
    let tok = Tokenizer::qwen36().unwrap();
    let mut rng = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut ids = Vec::new();
    for _ in 0..max {
        let t0 = Instant::now();
        let mask = c.mask().unwrap();
        let dt = t0.elapsed();
        {
            let mut m = MASKS.lock().unwrap();
            m.0 += dt;
            m.1 += 1;
            m.2 = m.2.max(dt);
        }
        let allowed = mask.to_list();
        let t = pick(&mut rng, &allowed);
        ids.push(t);
        if c.advance(t).unwrap() == Step::Done {
            return (tok.decode(&ids, true).unwrap(), true);
        }
    }
    (tok.decode(&ids, true).unwrap(), false)
}

#[test]
fn bad_constraints_say_why() {
    let e = err(schema(
        json!({"type": "object", "properties": {"a": {"type": "strnig"}}}),
    ));
    assert!(e.contains("strnig"), "{e}");
    let e = err(schema(json!([1, 2])));
    assert!(e.contains("must be an object"), "{e}");
    let e = err(spec(Grammar::Regex("(unclosed".into())));
    assert!(!e.is_empty());
    let e = err(spec(Grammar::Lark("start: nothing_defined".into())));
    assert!(e.contains("nothing_defined"), "{e}");
    assert!(err(spec(Grammar::Choice(vec![]))).contains("empty"));
    // An unknown string format: refused under strict, ignored otherwise.
    let odd = json!({"type": "string", "format": "no-such-format"});
    assert!(err(schema(odd.clone())).contains("no-such-format"));
    compiler()
        .compile(&spec(Grammar::JsonSchema {
            schema: odd,
            strict: false,
        }))
        .unwrap();
    let e = err(spec(Grammar::ToolCalls(ToolCalls {
        tools: vec![Tool {
            name: "f".into(),
            parameters: json!({"type": "object", "properties": {}, "required": ["x"]}),
        }],
        required: true,
        parallel: false,
    })));
    assert!(e.contains("'x'"), "{e}");
}

#[test]
fn random_outputs_match_every_schema() {
    for (i, s) in schemas().iter().enumerate() {
        let compiled = compiler().compile(&schema(s.clone())).unwrap();
        for seed in 0..3 {
            let (text, done) = random_walk(&mut compiled.start(), seed + 10 * i as u64, 400);
            assert!(done, "schema {i} not finished in 400 tokens: {text:?}");
            assert_valid(s, &text);
        }
    }
    let (total, n, max) = *MASKS.lock().unwrap();
    // The cost per step on the 248K vocabulary (docs/API.md quotes it).
    eprintln!(
        "mask: {:.3} ms mean, {:.3} ms max over {n} steps (all tests so far)",
        total.as_secs_f64() * 1e3 / n.max(1) as f64,
        max.as_secs_f64() * 1e3
    );
}

#[test]
fn regex_choice_object_and_lark() {
    let c = compiler()
        .compile(&spec(Grammar::Regex(r"[0-9]{3}-[a-z]{2}".into())))
        .unwrap();
    for seed in 0..5 {
        let (text, done) = random_walk(&mut c.start(), seed, 50);
        assert!(done);
        assert!(
            text.len() == 6
                && text[..3].bytes().all(|b| b.is_ascii_digit())
                && &text[3..4] == "-"
                && text[4..].bytes().all(|b| b.is_ascii_lowercase()),
            "{text:?}"
        );
    }
    let choices = vec!["yes".to_string(), "no".into(), "maybe not".into()];
    let c = compiler()
        .compile(&spec(Grammar::Choice(choices.clone())))
        .unwrap();
    for seed in 0..5 {
        let (text, done) = random_walk(&mut c.start(), seed, 50);
        assert!(done && choices.contains(&text), "{text:?}");
    }
    let c = compiler().compile(&spec(Grammar::JsonObject)).unwrap();
    let (text, _) = random_walk(&mut c.start(), 3, 2);
    assert!(text.starts_with('{'), "{text:?}");
    let c = compiler()
        .compile(&spec(Grammar::Lark(
            r#"start: "(" NUM ("+" NUM){0,3} ")"
NUM: /[1-9]/"#
                .into(),
        )))
        .unwrap();
    let (text, done) = random_walk(&mut c.start(), 1, 50);
    assert!(
        done && text.starts_with('(') && text.ends_with(')'),
        "{text:?}"
    );
}

#[test]
fn start_after_lets_the_model_think_but_not_end() {
    let think_end = Tokenizer::qwen36().unwrap().token_id("</think>").unwrap();
    let mut c = compiler()
        .compile(&ConstraintSpec {
            grammar: Grammar::Choice(vec!["ok".into()]),
            start_after: Some(think_end),
        })
        .unwrap()
        .start();
    let eos = crate::demo::config().eos_token_ids;
    let mask = c.mask().unwrap();
    assert!(eos.iter().all(|&e| !mask.is_allowed(e)));
    assert!(mask.is_allowed(think_end) && mask.is_allowed(1000));
    assert_eq!(c.advance(1000).unwrap(), Step::Continue);
    assert_eq!(c.advance(think_end).unwrap(), Step::Continue);
    // The newlines the model writes after `</think>` may come first.
    let nl = Tokenizer::qwen36().unwrap().encode("\n\n").unwrap();
    assert_eq!(nl.len(), 1);
    assert!(c.mask().unwrap().is_allowed(nl[0]));
    assert_eq!(c.advance(nl[0]).unwrap(), Step::Continue);
    let (text, done) = random_walk(&mut c, 0, 10);
    assert!(done && text == "ok", "{text:?}");
}

/// The Qwen3.6 call syntax the OpenAI guest parses, arguments under each
/// tool's schema.
#[test]
fn tool_calls_are_well_formed() {
    let weather = json!({"type": "object", "properties": {
        "city": {"type": "string", "maxLength": 12},
        "unit": {"type": "string", "enum": ["c", "f"]},
        "days": {"type": "integer", "minimum": 1, "maximum": 7}},
        "required": ["city", "days"]});
    let calls = ToolCalls {
        tools: vec![
            Tool {
                name: "get_weather".into(),
                parameters: weather,
            },
            Tool {
                name: "noop".into(),
                parameters: json!({}),
            },
        ],
        required: true,
        parallel: false,
    };
    let c = compiler()
        .compile(&spec(Grammar::ToolCalls(calls)))
        .unwrap();
    let tok = Tokenizer::qwen36().unwrap();
    let open = tok.token_id("<tool_call>").unwrap();
    for seed in 0..6 {
        let mut m = c.start();
        let first = m.mask().unwrap();
        assert_eq!(
            first.to_list(),
            vec![open],
            "a call must start with <tool_call>"
        );
        let (text, done) = random_walk(&mut m, seed, 200);
        assert!(done, "{text:?}");
        let body = text.trim_start_matches('\n');
        assert!(
            body.starts_with("\n<function=get_weather>\n")
                || body.starts_with("\n<function=noop>\n")
                || body.starts_with("<function="),
            "{text:?}"
        );
        if text.contains("get_weather") {
            assert!(
                text.contains("<parameter=city>\n") && text.contains("<parameter=days>\n"),
                "{text:?}"
            );
        }
        assert!(text.ends_with("</function>\n"), "{text:?}");
    }
}

/// The demo model held to each schema: 100 requests, all schema-valid; and
/// the mask's cost on the 248K vocabulary.
#[test]
fn demo_model_outputs_valid_json() {
    let m = LoadedModel::demo().unwrap();
    let tok = m.tokenizer.clone().unwrap();
    let model = CpuModel::new(m.config, m.weights);
    let prompt = tok
        .encode("<|im_start|>user\nJSON please<|im_end|>\n<|im_start|>assistant\n")
        .unwrap();
    let schemas = schemas();
    let compiled: Vec<Compiled> = schemas
        .iter()
        .map(|s| compiler().compile(&schema(s.clone())).unwrap())
        .collect();
    let (mut masks, mut mask_time) = (0u32, Duration::ZERO);
    for i in 0..100 {
        let k = i % schemas.len();
        let req = GenerateRequest {
            prompt: prompt.clone(),
            max_tokens: 256,
            stop_token_ids: vec![],
            ignore_eos: false,
            sampling: SamplingParams {
                temperature: if i % 2 == 0 { 1.0 } else { 0.0 },
                seed: Some(i as u64),
                ..Default::default()
            },
        };
        let mut c = compiled[k].start();
        // Time the masks outside the generation (same states, same work).
        let t0 = Instant::now();
        c.mask().unwrap();
        mask_time += t0.elapsed();
        masks += 1;
        let out = generate_with(&model, &req, Some(c), |_, _| ControlFlow::Continue(())).unwrap();
        let text = tok.decode(&out.tokens, true).unwrap();
        assert_eq!(
            out.finish_reason,
            FinishReason::Stop,
            "request {i} (schema {k}): {text:?}"
        );
        assert_valid(&schemas[k], &text);
    }
    eprintln!(
        "first-step mask: {:.3} ms mean over {masks}",
        mask_time.as_secs_f64() * 1e3 / masks as f64
    );
}

/// The CPU model posing as a backend that keeps the logits where they are
/// (as the GPU does), with the default per-row step: a masked row is read
/// through [`crate::backend::read_masked`], the reference the GPU's masked
/// readout kernels equal.
struct OnDevice<'a>(&'a CpuModel);

impl crate::backend::Backend for OnDevice<'_> {
    type Sequence = crate::cpu::CpuSequence;
    fn name(&self) -> &'static str {
        "on-device"
    }
    fn config(&self) -> &crate::config::ModelConfig {
        self.0.config()
    }
    fn new_sequence(&self) -> Self::Sequence {
        self.0.new_sequence()
    }
    fn position(&self, seq: &Self::Sequence) -> usize {
        self.0.position(seq)
    }
    fn forward(&self, seq: &mut Self::Sequence, tokens: &[u32]) -> anyhow::Result<Vec<f32>> {
        self.0.forward(seq, tokens)
    }
    fn logits_on_device(&self) -> bool {
        true
    }
}

/// `generate_with` on a backend with device readouts keeps them for a
/// constrained request (greedy, head, weighted row; thinking first, then
/// the grammar) and gives the tokens and logprobs of the host mask.
#[test]
fn device_readouts_under_a_mask_give_the_host_mask_tokens() {
    use crate::readout::Readout;
    let m = LoadedModel::demo().unwrap();
    let tok = m.tokenizer.clone().unwrap();
    let model = CpuModel::new(m.config, m.weights);
    let dev = OnDevice(&model);
    let prompt = tok
        .encode("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")
        .unwrap();
    let think_end = tok.token_id("</think>").unwrap();
    let specs = [
        schema(schemas()[1].clone()),
        spec(Grammar::Regex("[a-c]{3}[0-9]".into())),
        ConstraintSpec {
            grammar: Grammar::Choice(vec!["yes".into(), "no".into()]),
            // A random model may not close its thinking: free writing (no
            // EOS) until max_tokens is a mask too.
            start_after: Some(think_end),
        },
    ];
    let samplings = [
        (SamplingParams::default(), Readout::Greedy),
        (
            SamplingParams {
                temperature: 0.9,
                top_k: 30,
                seed: Some(1),
                logprobs: Some(3),
                ..Default::default()
            },
            Readout::Top,
        ),
        (
            SamplingParams {
                temperature: 1.1,
                top_p: 0.95,
                seed: Some(2),
                ..Default::default()
            },
            Readout::Weighted,
        ),
    ];
    for (i, s) in specs.iter().enumerate() {
        let c = compiler().compile(s).unwrap();
        for (sampling, readout) in &samplings {
            assert_eq!(Readout::choose(sampling, &dev), *readout);
            let req = GenerateRequest {
                prompt: prompt.clone(),
                max_tokens: 12,
                stop_token_ids: vec![],
                ignore_eos: false,
                sampling: sampling.clone(),
            };
            let run =
                |b: &dyn Fn(&GenerateRequest, Constraint) -> GenerateResult| b(&req, c.start());
            let host = run(&|r, c| {
                generate_with(&model, r, Some(c), |_, _| ControlFlow::Continue(())).unwrap()
            });
            let on_dev = run(&|r, c| {
                generate_with(&dev, r, Some(c), |_, _| ControlFlow::Continue(())).unwrap()
            });
            assert!(!host.tokens.is_empty());
            assert_eq!(on_dev.tokens, host.tokens, "spec {i}, {readout:?}");
            assert_eq!(on_dev.steps, host.steps, "spec {i}, {readout:?}");
            assert_eq!(on_dev.finish_reason, host.finish_reason);
        }
    }
}
