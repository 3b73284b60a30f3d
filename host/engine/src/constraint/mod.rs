//! Constrained decoding: the output must match a grammar (a JSON schema, any
//! JSON object, a regex, one of a list of strings, a Lark grammar, or the
//! Qwen3.6 tool-call syntax with schema-valid arguments).
//!
//! [llguidance](https://github.com/guidance-ai/llguidance) (the engine vLLM,
//! SGLang and llama.cpp use) compiles the grammar and, each step, computes
//! the set of tokens that keep the output a prefix of a valid one. A
//! constrained request keeps the readout it would have without the
//! constraint ([`crate::readout::Readout`]): with a device readout (greedy,
//! head, weighted row) its step carries the mask ([`Constraint::token_mask`],
//! asked for once the step's forward pass is launched, so it is computed
//! while the GPU runs) and the backend's readout counts only the allowed
//! tokens (on a GPU, kernels that read the others as `-inf`); with the
//! logits readout (the CPU, penalties) [`Constraint::masked`] copies the row
//! with the disallowed tokens at `-inf` on the host and the sampler draws as
//! usual. Both give the same tokens and logprobs (those of the constrained
//! row: its log-sum-exp runs over the allowed tokens).
//! [`Constraint::advance`] feeds the token back. The logits themselves stay
//! untouched (the prefix cache stores them).
//!
//! A constraint may start after a token (`</think>`): until then the model
//! writes freely, except that it cannot end (no EOS) before the answer;
//! right after that token, one newline token may precede the answer.
//! Once the grammar is complete only EOS is allowed, so the output ends
//! there; `max_tokens` can still cut it first (finish reason `length`).

mod toolcall;
mod vocab;

pub use toolcall::{Tool, ToolCalls};

use anyhow::{Context, Result, anyhow};
use llguidance::api::TopLevelGrammar;
use llguidance::toktrie::{SimpleVob, TokEnv};
use llguidance::{Matcher, ParserFactory, TokenParser};
use serde_json::{Value, json};
use std::fmt;
use std::sync::Arc;

use crate::readout::mask::TokenMask;
use crate::tokenizer::Tokenizer;

/// What the output must match.
#[derive(Clone, Debug, PartialEq)]
pub enum Grammar {
    /// Valid JSON under `schema`. `strict`: every keyword must be enforced
    /// (an unsupported one is an error); otherwise unsupported keywords are
    /// ignored.
    JsonSchema { schema: Value, strict: bool },
    /// Any JSON object.
    JsonObject,
    /// The whole output matches the regex (Rust `regex` syntax).
    Regex(String),
    /// Exactly one of these strings.
    Choice(Vec<String>),
    /// A grammar in llguidance's Lark syntax (an EBNF; special tokens as `<name>`).
    Lark(String),
    /// The Qwen3.6 tool-call syntax.
    ToolCalls(ToolCalls),
}

/// A request's constraint.
#[derive(Clone, Debug, PartialEq)]
pub struct ConstraintSpec {
    pub grammar: Grammar,
    /// Start once this token is generated (`</think>` with thinking on).
    pub start_after: Option<u32>,
}

/// Why a constraint cannot be used: the message says what to change.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConstraintError(pub String);

impl ConstraintError {
    pub fn new(m: impl Into<String>) -> Self {
        ConstraintError(m.into())
    }
}

impl fmt::Display for ConstraintError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ConstraintError {}

/// JSON layout options for llguidance (`x-guidance`): whitespace allowed
/// where JSON allows it, at most 16 characters at a time (so an output
/// cannot spend its budget on blanks); with `lenient`, unsupported
/// keywords are ignored instead of refused.
fn json_options(lenient: bool) -> Value {
    json!({
        "whitespace_pattern": "[\\x20\\x0A\\x0D\\x09]{1,16}",
        "lenient": lenient,
    })
}

/// Compiles constraints for one model: its vocabulary's token trie and
/// llguidance's per-tokenizer tables, built once (a few hundred ms for
/// Qwen3.6's 248K tokens) and shared by every request.
pub struct Compiler {
    factory: ParserFactory,
}

impl fmt::Debug for Compiler {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Compiler").finish_non_exhaustive()
    }
}

impl Compiler {
    /// For a model with `vocab_size` logits (the tokenizer may have fewer
    /// tokens) whose output ends with any of `eos`.
    pub fn new(tokenizer: &Tokenizer, vocab_size: usize, eos: &[u32]) -> Result<Self> {
        let env: TokEnv = vocab::token_env(tokenizer, vocab_size, eos)?;
        let mut factory =
            ParserFactory::new_simple(&env).context("cannot set up the grammar engine")?;
        factory.quiet();
        Ok(Compiler { factory })
    }

    /// Checks and compiles `spec`; the error says what is wrong with it.
    pub fn compile(&self, spec: &ConstraintSpec) -> Result<Compiled, ConstraintError> {
        let grammar = match &spec.grammar {
            Grammar::JsonSchema { schema, strict } => {
                let mut schema = schema.clone();
                match &mut schema {
                    Value::Object(o) => {
                        o.entry("x-guidance")
                            .or_insert_with(|| json_options(!strict));
                    }
                    Value::Bool(true) => schema = json!({"x-guidance": json_options(!strict)}),
                    _ => {
                        return Err(ConstraintError::new("the JSON schema must be an object"));
                    }
                }
                TopLevelGrammar::from_json_schema(schema)
            }
            Grammar::JsonObject => TopLevelGrammar::from_json_schema(
                json!({"type": "object", "x-guidance": json_options(false)}),
            ),
            Grammar::Regex(rx) => TopLevelGrammar::from_regex(rx),
            Grammar::Choice(choices) => {
                if choices.is_empty() {
                    return Err(ConstraintError::new("the choice list is empty"));
                }
                let alts: Vec<String> = choices
                    .iter()
                    .map(|c| serde_json::to_string(c).expect("a string serialises"))
                    .collect();
                TopLevelGrammar::from_lark(format!("start: {}", alts.join(" | ")))
            }
            Grammar::Lark(g) => TopLevelGrammar::from_lark(g.clone()),
            Grammar::ToolCalls(calls) => TopLevelGrammar::from_lark(toolcall::grammar(calls)?),
        };
        let parser = self
            .factory
            .create_parser(grammar)
            .map_err(|e| ConstraintError::new(format!("{e}")))?;
        Ok(Compiled(Arc::new(Inner {
            parser,
            start_after: spec.start_after,
        })))
    }
}

struct Inner {
    parser: TokenParser,
    start_after: Option<u32>,
}

/// A compiled constraint, ready to start for a request (cheap to clone).
#[derive(Clone)]
pub struct Compiled(Arc<Inner>);

impl fmt::Debug for Compiled {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Compiled")
            .field("start_after", &self.0.start_after)
            .finish_non_exhaustive()
    }
}

impl Compiled {
    /// A fresh matcher for one generation.
    pub fn start(&self) -> Constraint {
        Constraint {
            matcher: Matcher::new(Ok(self.0.parser.deep_clone())),
            waiting_for: self.0.start_after,
            masked: Vec::new(),
            leading: None,
        }
    }
}

/// What [`Constraint::advance`] found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// The output goes on.
    Continue,
    /// The token completed the output (it is part of it, unless it is an
    /// EOS token): generation ends after it.
    Done,
}

/// One generation's constraint state.
pub struct Constraint {
    matcher: Matcher,
    /// The constraint starts after this token.
    waiting_for: Option<u32>,
    masked: Vec<f32>,
    /// Right after the start token: newlines may come before the grammar
    /// (the model writes `</think>\n\n` before its answer).
    /// The newline tokens, while one may still come before the grammar.
    leading: Option<SimpleVob>,
}

impl Constraint {
    /// The tokens allowed next (before the start token: all but EOS).
    pub fn mask(&mut self) -> Result<SimpleVob> {
        if self.waiting_for.is_some() {
            let trie = self.matcher.tok_env()?;
            let trie = trie.tok_trie();
            let mut all = trie.alloc_token_set();
            all.set_all(true);
            all.sub(&trie.eos_token_set());
            return Ok(all);
        }
        let mut mask = self
            .matcher
            .compute_mask()
            .map_err(|e| anyhow!("the output constraint failed: {e}"))?;
        if let Some(nl) = &self.leading {
            mask.or(nl);
        }
        if mask.is_zero() {
            return Err(anyhow!("the output constraint allows no token"));
        }
        Ok(mask)
    }

    /// [`Constraint::mask`] as the readouts take it.
    pub fn token_mask(&mut self) -> Result<TokenMask> {
        let vocab = self.matcher.tok_env()?.tok_trie().vocab_size();
        Ok(TokenMask::from_words(self.mask()?.into(), vocab))
    }

    /// Tokens made of newlines only.
    fn newlines(&self) -> Result<SimpleVob> {
        let env = self.matcher.tok_env()?;
        let trie = env.tok_trie();
        let mut set = trie.alloc_token_set();
        for t in 0..trie.vocab_size() as u32 {
            let b = trie.token(t);
            if !b.is_empty() && b.iter().all(|&c| c == b'\n') {
                set.allow_token(t);
            }
        }
        Ok(set)
    }

    /// `logits` with every token the constraint does not allow at `-inf`.
    pub fn masked(&mut self, logits: &[f32]) -> Result<&[f32]> {
        let mask = self.mask()?;
        self.masked.clear();
        self.masked.resize(logits.len(), f32::NEG_INFINITY);
        mask.iter_set_entries(|i| {
            if let Some(&z) = logits.get(i) {
                self.masked[i] = z;
            }
        });
        Ok(&self.masked)
    }

    /// Feeds the sampled token.
    pub fn advance(&mut self, token: u32) -> Result<Step> {
        if let Some(t) = self.waiting_for {
            if token == t {
                self.waiting_for = None;
                self.leading = Some(self.newlines()?);
            }
            return Ok(Step::Continue);
        }
        if let Some(nl) = self.leading.take()
            && nl.is_allowed(token)
            && !self.matcher.compute_mask()?.is_allowed(token)
        {
            // One newline token (`\n\n` is one): the model's separator.
            return Ok(Step::Continue);
        }
        self.matcher
            .consume_token(token)
            .map_err(|e| anyhow!("the output constraint rejected token {token}: {e}"))?;
        Ok(if self.matcher.is_stopped() {
            Step::Done
        } else {
            Step::Continue
        })
    }
}

#[cfg(test)]
mod tests;
