//! `generate-constrained`'s constraint (WIT 0.1.4) compiled for the engine.

use super::bindings::api::qwasi::inference::types;
use qwasi_engine::constraint::{Compiled, Compiler, ConstraintSpec, Grammar, Tool, ToolCalls};
use qwasi_engine::tokenizer::Tokenizer;
use std::sync::OnceLock;

/// The model's constraint compiler, built on the first constrained request
/// (its token tables take a moment for a 248K vocabulary).
#[derive(Default)]
pub struct Constraints {
    compiler: OnceLock<Result<Compiler, String>>,
}

impl Constraints {
    /// Compiles `c` for the model; the error says what is wrong with it.
    pub fn compile(
        &self,
        c: types::Constraint,
        tokenizer: Option<&Tokenizer>,
        info: &types::ModelInfo,
    ) -> Result<Compiled, String> {
        let compiler = self
            .compiler
            .get_or_init(|| {
                let tok = tokenizer.ok_or("constrained decoding needs the model's tokenizer")?;
                Compiler::new(tok, info.vocab_size as usize, &info.eos_token_ids)
                    .map_err(|e| format!("{e:#}"))
            })
            .as_ref()
            .map_err(Clone::clone)?;
        compiler.compile(&spec(c)?).map_err(|e| e.0)
    }
}

fn json(text: &str, what: &str) -> Result<serde_json::Value, String> {
    serde_json::from_str(text).map_err(|e| format!("{what} is not valid JSON: {e}"))
}

fn spec(c: types::Constraint) -> Result<ConstraintSpec, String> {
    use types::Grammar as G;
    let grammar = match c.grammar {
        G::JsonSchema(s) => Grammar::JsonSchema {
            schema: json(&s.schema, "the JSON schema")?,
            strict: s.strict,
        },
        G::JsonObject => Grammar::JsonObject,
        G::Regex(r) => Grammar::Regex(r),
        G::Choice(c) => Grammar::Choice(c),
        G::Lark(g) => Grammar::Lark(g),
        G::ToolCalls(t) => Grammar::ToolCalls(ToolCalls {
            tools: t
                .tools
                .into_iter()
                .map(|t| {
                    let parameters = json(&t.parameters, &format!("tool '{}' parameters", t.name))?;
                    Ok(Tool {
                        name: t.name,
                        parameters,
                    })
                })
                .collect::<Result<_, String>>()?,
            required: t.required,
            parallel: t.parallel,
        }),
    };
    Ok(ConstraintSpec {
        grammar,
        start_after: c.start_after,
    })
}
