//! Request bodies: parsing and validation, each error naming its parameter.

use crate::chat::{Message, RenderOptions, parse_messages};
use crate::structured::{self, Requested};
use qwasi_guest_sdk::ApiError;
use qwasi_guest_sdk::inference::{ModelInfo, SamplingParams};
use serde_json::{Map, Value};

pub use qwasi_guest_sdk::fields::{Fields, as_int, parse_body};
pub use qwasi_guest_sdk::tools::{ToolChoice, Tools, tool_name};

pub const MAX_STOP_STRINGS: usize = 4;
/// Most generations one request may ask for (prompts × `best_of`): each is a
/// whole generation of its own.
pub const MAX_GENERATIONS: usize = 64;
pub const DEFAULT_COMPLETION_MAX_TOKENS: u32 = 16;

/// Fields shared by `/v1/completions` and `/v1/chat/completions`.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Common {
    pub model: String,
    pub max_tokens: Option<u32>,
    pub stop: Vec<String>,
    pub stream: bool,
    pub include_usage: bool,
    pub sampling: SamplingParams,
    pub ignore_eos: bool,
    pub stop_token_ids: Vec<u32>,
    pub cache_salt: Option<String>,
    /// Structured output or enforced tool calls.
    pub constraint: Option<Requested>,
    /// Choices returned per prompt.
    pub n: u32,
    /// Generations per prompt, the `n` most likely returned (>= n).
    pub best_of: u32,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Prompt {
    Text(String),
    Tokens(Vec<u32>),
}

#[derive(Debug, Clone, PartialEq)]
pub struct CompletionRequest {
    pub common: Common,
    /// One or more prompts (a list of prompts is a batch: `n` choices each).
    pub prompts: Vec<Prompt>,
    pub echo: bool,
    /// 0..=5 alternatives per token.
    pub logprobs: Option<u32>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct ChatRequest {
    pub common: Common,
    pub messages: Vec<Message>,
    pub logprobs: bool,
    pub top_logprobs: u32,
    pub render: RenderOptions,
    pub tools: Tools,
}

#[derive(Debug, Clone, PartialEq)]
pub enum TokenizeRequest {
    Prompt(String),
    Messages(Vec<Message>, RenderOptions, Tools),
}

fn token_id(v: &Value, vocab: u32, param: &str) -> Result<u32, ApiError> {
    let id = as_int(v)
        .ok_or_else(|| ApiError::invalid_type(param, "an array of token ids (integers)"))?;
    if id < 0 || id >= vocab as i64 {
        return Err(ApiError::invalid_value(
            param,
            format!("'{param}' contains token id {id}, outside [0, {vocab})"),
        ));
    }
    Ok(id as u32)
}

fn token_list(v: &Value, vocab: u32, param: &str) -> Result<Vec<u32>, ApiError> {
    match v {
        Value::Array(a) => a.iter().map(|x| token_id(x, vocab, param)).collect(),
        _ => Err(ApiError::invalid_type(param, "an array of token ids")),
    }
}

/// Checks the `model` field: required, and the served id.
pub fn check_model(f: &Fields, info: &ModelInfo, required: bool) -> Result<String, ApiError> {
    match f.str("model")? {
        None if required => Err(ApiError::missing("model")),
        None => Ok(info.id.clone()),
        Some(m) if info.serves(m) => Ok(m.to_owned()),
        Some(m) => Err(ApiError::model_not_found(m)),
    }
}

fn parse_common(f: &Fields, info: &ModelInfo) -> Result<Common, ApiError> {
    let model = check_model(f, info, true)?;
    let mut c = Common {
        model,
        ..Default::default()
    };

    let max = MAX_GENERATIONS as i64;
    c.n = f.int("n", 1, max)?.unwrap_or(1) as u32;
    c.best_of = f.int("best_of", 1, max)?.map_or(c.n, |b| b as u32);
    if c.best_of < c.n {
        return Err(ApiError::invalid_value(
            "best_of",
            format!("'best_of' ({}) must be at least 'n' ({})", c.best_of, c.n),
        ));
    }
    c.stream = f.bool("stream")?.unwrap_or(false);
    if c.stream && c.best_of > c.n {
        return Err(ApiError::invalid_value(
            "best_of",
            "'best_of' greater than 'n' cannot be streamed (the best are known only at the end)",
        ));
    }
    if let Some(opts) = f.get("stream_options") {
        let obj = opts
            .as_object()
            .ok_or_else(|| ApiError::invalid_type("stream_options", "an object"))?;
        if !c.stream {
            return Err(ApiError::invalid_value(
                "stream_options",
                "'stream_options' is only allowed when 'stream' is true",
            ));
        }
        match obj.get("include_usage") {
            None | Some(Value::Null) => {}
            Some(Value::Bool(b)) => c.include_usage = *b,
            Some(_) => {
                return Err(ApiError::invalid_type(
                    "stream_options.include_usage",
                    "a boolean",
                ));
            }
        }
    }
    c.stop = match f.get("stop") {
        None => Vec::new(),
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(a)) => {
            if a.len() > MAX_STOP_STRINGS {
                return Err(ApiError::invalid_value(
                    "stop",
                    format!(
                        "'stop' takes at most {MAX_STOP_STRINGS} strings, got {}",
                        a.len()
                    ),
                ));
            }
            a.iter()
                .map(|s| {
                    s.as_str().map(str::to_owned).ok_or_else(|| {
                        ApiError::invalid_type("stop", "a string or an array of strings")
                    })
                })
                .collect::<Result<_, _>>()?
        }
        Some(_) => {
            return Err(ApiError::invalid_type(
                "stop",
                "a string or an array of strings",
            ));
        }
    };
    if c.stop.iter().any(String::is_empty) {
        return Err(ApiError::invalid_value(
            "stop",
            "stop strings must not be empty",
        ));
    }

    let s = &mut c.sampling;
    if let Some(t) = f.num("temperature", 0.0, false, 2.0)? {
        s.temperature = t as f32;
    }
    if let Some(p) = f.num("top_p", 0.0, true, 1.0)? {
        s.top_p = p as f32;
    }
    if let Some(k) = f.int("top_k", -1, u32::MAX as i64)? {
        s.top_k = k.max(0) as u32; // -1 (vLLM's "off") = 0
    }
    if let Some(p) = f.num("min_p", 0.0, false, 1.0)? {
        s.min_p = p as f32;
    }
    if let Some(seed) = f.get("seed") {
        let x = match seed {
            Value::Number(n) => n.as_u64().or_else(|| n.as_i64().map(|i| i as u64)),
            _ => None,
        };
        s.seed = Some(x.ok_or_else(|| ApiError::invalid_type("seed", "an integer"))?);
    }
    if let Some(p) = f.num("presence_penalty", -2.0, false, 2.0)? {
        s.presence_penalty = p as f32;
    }
    if let Some(p) = f.num("frequency_penalty", -2.0, false, 2.0)? {
        s.frequency_penalty = p as f32;
    }
    if let Some(p) = f.num("repetition_penalty", 0.0, true, 2.0)? {
        s.repetition_penalty = p as f32;
    }
    if let Some(lb) = f.get("logit_bias") {
        let obj = lb.as_object().ok_or_else(|| {
            ApiError::invalid_type("logit_bias", "an object mapping token ids to biases")
        })?;
        let mut out = Vec::with_capacity(obj.len());
        for (k, v) in obj {
            let id: u32 = k
                .trim()
                .parse()
                .ok()
                .filter(|id| *id < info.vocab_size)
                .ok_or_else(|| {
                    ApiError::invalid_value(
                        "logit_bias",
                        format!(
                            "'logit_bias' key '{k}' is not a token id in [0, {})",
                            info.vocab_size
                        ),
                    )
                })?;
            let b = v.as_f64().ok_or_else(|| {
                ApiError::invalid_type("logit_bias", "an object whose values are numbers")
            })?;
            if !(-100.0..=100.0).contains(&b) {
                return Err(ApiError::invalid_value(
                    "logit_bias",
                    format!("'logit_bias' for token {id} must be in [-100, 100], got {b}"),
                ));
            }
            out.push((id, b as f32));
        }
        s.logit_bias = out;
    }
    c.ignore_eos = f.bool("ignore_eos")?.unwrap_or(false);
    if let Some(v) = f.get("stop_token_ids") {
        c.stop_token_ids = token_list(v, info.vocab_size, "stop_token_ids")?;
    }
    c.cache_salt = f.str("cache_salt")?.map(str::to_owned);
    // `user` is accepted and ignored; so is anything unknown.
    f.str("user")?;
    Ok(c)
}

fn max_tokens(f: &Fields, name: &str, min: i64) -> Result<Option<u32>, ApiError> {
    Ok(f.int(name, min, u32::MAX as i64)?.map(|x| x as u32))
}

pub fn parse_completion(
    body: &Map<String, Value>,
    info: &ModelInfo,
) -> Result<CompletionRequest, ApiError> {
    let f = Fields(body);
    let mut common = parse_common(&f, info)?;
    let echo = f.bool("echo")?.unwrap_or(false);
    common.max_tokens = max_tokens(&f, "max_tokens", if echo { 0 } else { 1 })?;
    let prompts = match f.get("prompt") {
        None => return Err(ApiError::missing("prompt")),
        Some(v) => parse_prompts(v, info.vocab_size)?,
    };
    if prompts.len() * common.best_of as usize > MAX_GENERATIONS {
        return Err(ApiError::invalid_value(
            "prompt",
            format!(
                "{} prompts × best_of {} is more than the {MAX_GENERATIONS} generations one request may ask for",
                prompts.len(),
                common.best_of
            ),
        ));
    }
    let logprobs = f.int("logprobs", 0, 5)?.map(|x| x as u32);
    if echo && logprobs.is_some() {
        return Err(ApiError::unsupported(
            "echo",
            "'echo' together with 'logprobs' is not supported (prompt logprobs are not available)",
        ));
    }
    match f.get("suffix") {
        None | Some(Value::Null) => {}
        Some(Value::String(s)) if s.is_empty() => {}
        Some(Value::String(_)) => {
            return Err(ApiError::unsupported("suffix", "'suffix' is not supported"));
        }
        Some(_) => return Err(ApiError::invalid_type("suffix", "a string")),
    }
    common.sampling.logprobs = logprobs;
    common.constraint = structured::parse(&f, false)?;
    Ok(CompletionRequest {
        common,
        prompts,
        echo,
        logprobs,
    })
}

/// `prompt`: a string, token ids, or a list of either (several prompts).
fn parse_prompts(v: &Value, vocab: u32) -> Result<Vec<Prompt>, ApiError> {
    const EXPECTED: &str =
        "a string, an array of token ids, or an array of strings or of token-id arrays";
    let prompts = match v {
        Value::String(s) => vec![Prompt::Text(s.clone())],
        Value::Array(a) if a.is_empty() => {
            return Err(ApiError::invalid_value(
                "prompt",
                "'prompt' must not be empty",
            ));
        }
        Value::Array(a) => match &a[0] {
            Value::Number(_) => vec![Prompt::Tokens(token_list(v, vocab, "prompt")?)],
            Value::String(_) | Value::Array(_) => a
                .iter()
                .enumerate()
                .map(|(i, p)| match p {
                    Value::String(s) => Ok(Prompt::Text(s.clone())),
                    Value::Array(_) => Ok(Prompt::Tokens(token_list(
                        p,
                        vocab,
                        &format!("prompt[{i}]"),
                    )?)),
                    _ => Err(ApiError::invalid_type(&format!("prompt[{i}]"), EXPECTED)),
                })
                .collect::<Result<_, _>>()?,
            _ => return Err(ApiError::invalid_type("prompt", EXPECTED)),
        },
        _ => return Err(ApiError::invalid_type("prompt", EXPECTED)),
    };
    if prompts.iter().any(|p| match p {
        Prompt::Text(s) => s.is_empty(),
        Prompt::Tokens(t) => t.is_empty(),
    }) {
        return Err(ApiError::invalid_value(
            "prompt",
            "'prompt' must not be empty",
        ));
    }
    Ok(prompts)
}

/// `reasoning_effort` as the template kwargs it stands for: the model
/// either thinks or does not, so "none" and "minimal" turn thinking off and
/// "low", "medium" and "high" leave it on; the value itself is passed to the
/// template too (templates that know effort levels read it).
fn reasoning_effort(f: &Fields) -> Result<Map<String, Value>, ApiError> {
    let mut kw = Map::new();
    let Some(effort) = f.str("reasoning_effort")? else {
        return Ok(kw);
    };
    let thinking = match effort {
        "none" | "minimal" => false,
        "low" | "medium" | "high" => true,
        other => {
            return Err(ApiError::invalid_value(
                "reasoning_effort",
                format!(
                    "unknown reasoning_effort '{other}'; expected 'none', 'minimal', 'low', 'medium' or 'high'"
                ),
            ));
        }
    };
    kw.insert("enable_thinking".into(), Value::Bool(thinking));
    kw.insert("reasoning_effort".into(), Value::String(effort.into()));
    Ok(kw)
}

/// The render options and the template kwargs: the operator's defaults
/// (`--default-chat-template-kwargs`), then `reasoning_effort`, then the
/// top-level `enable_thinking`, then the request's `chat_template_kwargs`,
/// each over the one before.
fn render_options(
    f: &Fields,
    info: &ModelInfo,
) -> Result<(RenderOptions, Map<String, Value>), ApiError> {
    let mut r = RenderOptions::default();
    if let Some(b) = f.bool("add_generation_prompt")? {
        r.add_generation_prompt = b;
    }
    let mut kwargs = info.default_chat_template_kwargs.clone();
    kwargs.extend(reasoning_effort(f)?);
    if let Some(b) = f.bool("enable_thinking")? {
        kwargs.insert("enable_thinking".into(), Value::Bool(b));
    }
    if let Some(k) = f.get("chat_template_kwargs") {
        let obj = k
            .as_object()
            .ok_or_else(|| ApiError::invalid_type("chat_template_kwargs", "an object"))?;
        kwargs.extend(obj.iter().map(|(k, v)| (k.clone(), v.clone())));
    }
    for (name, slot) in [
        ("enable_thinking", &mut r.enable_thinking),
        ("preserve_thinking", &mut r.preserve_thinking),
    ] {
        match kwargs.get(name) {
            None | Some(Value::Null) => {}
            Some(Value::Bool(b)) => *slot = *b,
            Some(_) => {
                return Err(ApiError::invalid_type(
                    &format!("chat_template_kwargs.{name}"),
                    "a boolean",
                ));
            }
        }
    }
    Ok((r, kwargs))
}

fn parse_tools(f: &Fields) -> Result<Vec<Value>, ApiError> {
    let Some(v) = f.get("tools") else {
        return Ok(vec![]);
    };
    let arr = v
        .as_array()
        .ok_or_else(|| ApiError::invalid_type("tools", "an array of tool objects"))?;
    for (i, t) in arr.iter().enumerate() {
        let p = format!("tools[{i}]");
        let o = t
            .as_object()
            .ok_or_else(|| ApiError::invalid_type(&p, "a tool object"))?;
        match o.get("type").and_then(Value::as_str) {
            Some("function") => {}
            _ => {
                return Err(ApiError::invalid_value(
                    &format!("{p}.type"),
                    "only tools of type 'function' are supported",
                ));
            }
        }
        let func = o
            .get("function")
            .and_then(Value::as_object)
            .ok_or_else(|| ApiError::missing(&format!("{p}.function")))?;
        match func.get("name") {
            Some(Value::String(n)) if !n.is_empty() => {}
            _ => return Err(ApiError::missing(&format!("{p}.function.name"))),
        }
        // The schema is rendered into the prompt and may drive constrained
        // decoding: it must be a JSON Schema object.
        for (key, ok, expected) in [
            (
                "parameters",
                Value::is_object as fn(&Value) -> bool,
                "a JSON Schema object",
            ),
            ("description", Value::is_string, "a string"),
            ("strict", Value::is_boolean, "a boolean"),
        ] {
            match func.get(key) {
                None | Some(Value::Null) => {}
                Some(v) if ok(v) => {}
                Some(_) => {
                    return Err(ApiError::invalid_type(
                        &format!("{p}.function.{key}"),
                        expected,
                    ));
                }
            }
        }
    }
    Ok(arr.clone())
}

fn parse_tool_choice(f: &Fields, tools: &[Value]) -> Result<ToolChoice, ApiError> {
    let choice = match f.get("tool_choice") {
        None => ToolChoice::Auto,
        Some(Value::String(s)) => match s.as_str() {
            "auto" => ToolChoice::Auto,
            "none" => ToolChoice::None,
            "required" => ToolChoice::Required,
            other => {
                return Err(ApiError::invalid_value(
                    "tool_choice",
                    format!(
                        "unknown tool_choice '{other}'; expected 'auto', 'none', 'required' or a function"
                    ),
                ));
            }
        },
        Some(Value::Object(o)) => match o
            .get("function")
            .and_then(|f| f.get("name"))
            .and_then(Value::as_str)
        {
            Some(n) => ToolChoice::Named(n.to_owned()),
            None => return Err(ApiError::missing("tool_choice.function.name")),
        },
        Some(_) => {
            return Err(ApiError::invalid_type(
                "tool_choice",
                "a string or an object",
            ));
        }
    };
    match &choice {
        ToolChoice::Required | ToolChoice::Named(_) if tools.is_empty() => Err(
            ApiError::invalid_value("tool_choice", "'tool_choice' requires 'tools'"),
        ),
        ToolChoice::Named(n) if !tools.iter().any(|t| tool_name(t) == Some(n.as_str())) => {
            Err(ApiError::invalid_value(
                "tool_choice",
                format!("tool_choice names function '{n}', which is not in 'tools'"),
            ))
        }
        _ => Ok(choice),
    }
}

#[cfg(test)]
pub fn parse_tool_side_for_tests(f: &Fields) -> Result<(RenderOptions, Tools), ApiError> {
    parse_tool_side(f, &ModelInfo::default())
}

fn parse_tool_side(f: &Fields, info: &ModelInfo) -> Result<(RenderOptions, Tools), ApiError> {
    let (render, kwargs) = render_options(f, info)?;
    let tools = parse_tools(f)?;
    let choice = parse_tool_choice(f, &tools)?;
    let parallel = f.bool("parallel_tool_calls")?.unwrap_or(true);
    Ok((
        render,
        Tools {
            tools,
            choice,
            parallel,
            kwargs,
        },
    ))
}

pub fn parse_chat(body: &Map<String, Value>, info: &ModelInfo) -> Result<ChatRequest, ApiError> {
    let f = Fields(body);
    let mut common = parse_common(&f, info)?;
    let messages = parse_messages(f.get("messages"))?;
    common.max_tokens = match max_tokens(&f, "max_completion_tokens", 1)? {
        Some(m) => Some(m),
        None => max_tokens(&f, "max_tokens", 1)?,
    };
    let logprobs = f.bool("logprobs")?.unwrap_or(false);
    let top = f.int("top_logprobs", 0, 20)?;
    if top.is_some_and(|t| t > 0) && !logprobs {
        return Err(ApiError::invalid_value(
            "top_logprobs",
            "'top_logprobs' requires 'logprobs' to be true",
        ));
    }
    let top_logprobs = top.unwrap_or(0) as u32;
    if logprobs {
        common.sampling.logprobs = Some(top_logprobs);
    }
    let (mut render, tools) = parse_tool_side(&f, info)?;
    common.constraint = match (structured::parse(&f, true)?, structured::tool_calls(&tools)) {
        (Some(format), Some(_)) => {
            return Err(ApiError::invalid_value(
                &format.param,
                format!(
                    "'{}' cannot be combined with enforced tool calls (tool_choice 'required', a named function, or strict tools)",
                    format.param
                ),
            ));
        }
        (format, calls) => format.or(calls),
    };
    render.add_generation_prompt = true;
    Ok(ChatRequest {
        common,
        messages,
        logprobs,
        top_logprobs,
        render,
        tools,
    })
}

pub fn parse_tokenize(
    body: &Map<String, Value>,
    info: &ModelInfo,
) -> Result<TokenizeRequest, ApiError> {
    let f = Fields(body);
    check_model(&f, info, false)?;
    match (f.get("prompt"), f.get("messages")) {
        (Some(_), Some(_)) => Err(ApiError::invalid_value(
            "prompt",
            "give either 'prompt' or 'messages', not both",
        )),
        (Some(Value::String(s)), None) => Ok(TokenizeRequest::Prompt(s.clone())),
        (Some(_), None) => Err(ApiError::invalid_type("prompt", "a string")),
        (None, Some(m)) => {
            let messages = parse_messages(Some(m))?;
            let (render, tools) = parse_tool_side(&f, info)?;
            Ok(TokenizeRequest::Messages(messages, render, tools))
        }
        (None, None) => Err(ApiError::missing("prompt")),
    }
}

pub fn parse_detokenize(body: &Map<String, Value>, info: &ModelInfo) -> Result<Vec<u32>, ApiError> {
    let f = Fields(body);
    check_model(&f, info, false)?;
    match f.get("tokens") {
        None => Err(ApiError::missing("tokens")),
        Some(v) => token_list(v, info.vocab_size, "tokens"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    pub fn info() -> ModelInfo {
        ModelInfo {
            id: "qwen3.6".into(),
            context_length: 4096,
            vocab_size: 1000,
            eos_token_ids: vec![2],
            chat_template: None,
            created: 1,
            max_prompt_tokens: 0,
            max_completion_tokens: 0,
            ..Default::default()
        }
    }

    fn completion(v: Value) -> Result<CompletionRequest, ApiError> {
        parse_completion(v.as_object().unwrap(), &info())
    }

    fn chat(v: Value) -> Result<ChatRequest, ApiError> {
        parse_chat(v.as_object().unwrap(), &info())
    }

    fn err_param(
        r: Result<impl std::fmt::Debug, ApiError>,
    ) -> (u16, Option<String>, Option<&'static str>) {
        let e = r.unwrap_err();
        (e.status, e.param, e.code.map(|c| &*c.leak()))
    }

    #[test]
    fn body_json() {
        assert_eq!(
            parse_body(b"{").unwrap_err().code.as_deref(),
            Some("invalid_json")
        );
        assert_eq!(parse_body(b"").unwrap_err().status, 400);
        assert_eq!(
            parse_body(b"[1]").unwrap_err().code.as_deref(),
            Some("invalid_json")
        );
        assert!(parse_body(b" {\"a\":1} ").is_ok());
    }

    #[test]
    fn completion_full() {
        let r = completion(json!({
            "model": "qwen3.6", "prompt": "Hello", "max_tokens": 5, "temperature": 0.5, "top_p": 0.9,
            "top_k": 40, "min_p": 0.05, "seed": 7, "presence_penalty": 0.1, "frequency_penalty": -0.2,
            "repetition_penalty": 1.1, "logit_bias": {"5": 10, "7": -100}, "logprobs": 3, "ignore_eos": true,
            "stop_token_ids": [9], "stop": ["\n", "END"], "n": 1, "stream": true,
            "stream_options": {"include_usage": true}, "user": "u1", "unknown_field": {"x": 1}
        }))
        .unwrap();
        assert_eq!(r.prompts, [Prompt::Text("Hello".into())]);
        assert_eq!(r.common.max_tokens, Some(5));
        let s = &r.common.sampling;
        assert_eq!(
            (s.temperature, s.top_p, s.top_k, s.min_p, s.seed),
            (0.5, 0.9, 40, 0.05, Some(7))
        );
        assert_eq!(
            (
                s.presence_penalty,
                s.frequency_penalty,
                s.repetition_penalty
            ),
            (0.1, -0.2, 1.1)
        );
        assert_eq!(s.logit_bias, vec![(5, 10.0), (7, -100.0)]);
        assert_eq!(s.logprobs, Some(3));
        assert!(r.common.ignore_eos && r.common.stream && r.common.include_usage);
        assert_eq!(r.common.stop, vec!["\n".to_string(), "END".to_string()]);
        assert_eq!(r.common.stop_token_ids, vec![9]);
    }

    #[test]
    fn completion_defaults_are_neutral() {
        let r = completion(json!({"model": "qwen3.6", "prompt": "x"})).unwrap();
        assert_eq!(r.common.sampling, SamplingParams::default());
        assert_eq!(r.common.max_tokens, None);
        assert!(!r.common.stream && !r.echo);
    }

    #[test]
    fn prompt_forms() {
        let p = |v: Value| completion(json!({"model": "qwen3.6", "prompt": v})).map(|r| r.prompts);
        assert_eq!(p(json!(["a"])).unwrap(), [Prompt::Text("a".into())]);
        assert_eq!(
            p(json!([1, 2, 3])).unwrap(),
            [Prompt::Tokens(vec![1, 2, 3])]
        );
        assert_eq!(p(json!([[4, 5]])).unwrap(), [Prompt::Tokens(vec![4, 5])]);
        assert_eq!(
            p(json!(["a", [7], "b"])).unwrap(),
            [
                Prompt::Text("a".into()),
                Prompt::Tokens(vec![7]),
                Prompt::Text("b".into())
            ]
        );
        assert_eq!(
            err_param(p(json!([[1], [2000]]))).1.as_deref(),
            Some("prompt[1]")
        );
        assert_eq!(err_param(p(json!(["a", ""]))).2, Some("invalid_value"));
        assert_eq!(
            err_param(p(json!(["a", 5]))).1.as_deref(),
            Some("prompt[1]")
        );
        let many: Vec<String> = (0..33).map(|i| i.to_string()).collect();
        assert_eq!(
            err_param(completion(
                json!({"model": "qwen3.6", "prompt": many, "best_of": 2})
            ))
            .2,
            Some("invalid_value")
        );
        assert_eq!(err_param(p(json!([1, 1000]))).2, Some("invalid_value"));
        assert_eq!(err_param(p(json!([1, -1]))).2, Some("invalid_value"));
        assert_eq!(err_param(p(json!([1, "a"]))).2, Some("invalid_type"));
        assert_eq!(err_param(p(json!(""))).2, Some("invalid_value"));
        assert_eq!(err_param(p(json!([]))).2, Some("invalid_value"));
        assert_eq!(err_param(p(json!(5))).2, Some("invalid_type"));
        assert_eq!(
            err_param(completion(json!({"model": "qwen3.6"}))).2,
            Some("missing_required_parameter")
        );
    }

    #[test]
    fn model_checks() {
        assert_eq!(
            err_param(completion(json!({"prompt": "x"}))),
            (
                400,
                Some("model".into()),
                Some("missing_required_parameter")
            )
        );
        assert_eq!(
            err_param(completion(json!({"model": "gpt-4", "prompt": "x"}))),
            (404, Some("model".into()), Some("model_not_found"))
        );
        assert_eq!(
            err_param(completion(json!({"model": 3, "prompt": "x"}))).2,
            Some("invalid_type")
        );
    }

    #[test]
    fn ranges_and_types_name_the_param() {
        let cases = [
            ("temperature", json!(2.5), "invalid_value"),
            ("temperature", json!(-0.1), "invalid_value"),
            ("temperature", json!("hot"), "invalid_type"),
            ("top_p", json!(0), "invalid_value"),
            ("top_p", json!(1.5), "invalid_value"),
            ("top_k", json!(-2), "invalid_value"),
            ("top_k", json!(1.5), "invalid_type"),
            ("min_p", json!(1.1), "invalid_value"),
            ("presence_penalty", json!(3), "invalid_value"),
            ("frequency_penalty", json!(-3), "invalid_value"),
            ("repetition_penalty", json!(0), "invalid_value"),
            ("logit_bias", json!({"5": 101}), "invalid_value"),
            ("logit_bias", json!({"abc": 1}), "invalid_value"),
            ("logit_bias", json!({"5000": 1}), "invalid_value"),
            ("logit_bias", json!({"5": "x"}), "invalid_type"),
            ("logit_bias", json!([1]), "invalid_type"),
            ("logprobs", json!(6), "invalid_value"),
            ("logprobs", json!(true), "invalid_type"),
            ("max_tokens", json!(0), "invalid_value"),
            ("max_tokens", json!(-5), "invalid_value"),
            ("max_tokens", json!("10"), "invalid_type"),
            ("n", json!(0), "invalid_value"),
            ("n", json!(65), "invalid_value"),
            ("n", json!("2"), "invalid_type"),
            ("best_of", json!(0), "invalid_value"),
            ("stop", json!(["a", "b", "c", "d", "e"]), "invalid_value"),
            ("stop", json!(5), "invalid_type"),
            ("stop", json!([""]), "invalid_value"),
            ("stream", json!("yes"), "invalid_type"),
            (
                "stream_options",
                json!({"include_usage": true}),
                "invalid_value",
            ),
            ("seed", json!("s"), "invalid_type"),
            ("ignore_eos", json!(1), "invalid_type"),
            ("stop_token_ids", json!([1000]), "invalid_value"),
            ("echo", json!(1), "invalid_type"),
            ("suffix", json!("x"), "unsupported_parameter"),
            ("suffix", json!(5), "invalid_type"),
            ("suffix", json!(["x"]), "invalid_type"),
            ("user", json!(5), "invalid_type"),
        ];
        for (name, value, code) in cases {
            let mut body = json!({"model": "qwen3.6", "prompt": "x"});
            body[name] = value.clone();
            let e = completion(body).unwrap_err();
            assert_eq!(
                (e.status, e.param.as_deref(), e.code.as_deref()),
                (400, Some(name), Some(code)),
                "{name}={value}: {e:?}"
            );
            assert!(e.message.contains(name), "{name}: {}", e.message);
        }
    }

    #[test]
    fn n_and_best_of() {
        let r = completion(json!({"model": "qwen3.6", "prompt": "x", "n": 3})).unwrap();
        assert_eq!((r.common.n, r.common.best_of), (3, 3));
        let r =
            completion(json!({"model": "qwen3.6", "prompt": "x", "n": 2, "best_of": 5})).unwrap();
        assert_eq!((r.common.n, r.common.best_of), (2, 5));
        let r = chat(json!({"model": "qwen3.6", "messages": [{"role": "user", "content": "hi"}]}))
            .unwrap();
        assert_eq!((r.common.n, r.common.best_of), (1, 1));
        assert_eq!(
            err_param(completion(
                json!({"model": "qwen3.6", "prompt": "x", "n": 3, "best_of": 2})
            )),
            (400, Some("best_of".into()), Some("invalid_value"))
        );
        assert_eq!(
            err_param(completion(
                json!({"model": "qwen3.6", "prompt": "x", "best_of": 2, "stream": true})
            )),
            (400, Some("best_of".into()), Some("invalid_value"))
        );
    }

    #[test]
    fn misc_completion() {
        // max_tokens 0 only with echo; echo + logprobs rejected; null = absent.
        assert!(
            completion(json!({"model": "qwen3.6", "prompt": "x", "echo": true, "max_tokens": 0}))
                .is_ok()
        );
        assert_eq!(
            err_param(completion(
                json!({"model": "qwen3.6", "prompt": "x", "echo": true, "logprobs": 1})
            ))
            .1
            .as_deref(),
            Some("echo")
        );
        let r = completion(json!({"model": "qwen3.6", "prompt": "x", "temperature": null, "stop": "s", "top_k": -1, "seed": -1})).unwrap();
        assert_eq!(r.common.sampling.temperature, 1.0);
        assert_eq!(r.common.stop, vec!["s".to_string()]);
        assert_eq!(r.common.sampling.top_k, 0);
        assert_eq!(r.common.sampling.seed, Some(u64::MAX));
        let r = completion(json!({"model": "qwen3.6", "prompt": "x", "max_tokens": 12.0})).unwrap();
        assert_eq!(r.common.max_tokens, Some(12));
    }

    #[test]
    fn chat_fields() {
        let r = chat(json!({
            "model": "qwen3.6", "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 10, "max_completion_tokens": 20, "logprobs": true, "top_logprobs": 4,
            "chat_template_kwargs": {"enable_thinking": false}, "seed": 3
        }))
        .unwrap();
        assert_eq!(r.common.max_tokens, Some(20));
        assert!(r.logprobs);
        assert_eq!(r.top_logprobs, 4);
        assert_eq!(r.common.sampling.logprobs, Some(4));
        assert!(!r.render.enable_thinking);
        let r = chat(json!({"model": "qwen3.6", "messages": [{"role": "user", "content": "hi"}]}))
            .unwrap();
        assert!(r.render.enable_thinking);
        assert_eq!(r.common.sampling.logprobs, None);
        assert_eq!(r.common.max_tokens, None);

        let base = || json!({"model": "qwen3.6", "messages": [{"role": "user", "content": "hi"}]});
        let with = |k: &str, v: Value| {
            let mut b = base();
            b[k] = v;
            chat(b).unwrap_err()
        };
        assert_eq!(
            with("top_logprobs", json!(21)).param.as_deref(),
            Some("top_logprobs")
        );
        assert_eq!(
            with("top_logprobs", json!(2)).code.as_deref(),
            Some("invalid_value")
        );
        assert_eq!(
            with("logprobs", json!(2)).code.as_deref(),
            Some("invalid_type")
        );
        assert_eq!(
            with("tools", json!([{"type": "function"}]))
                .param
                .as_deref(),
            Some("tools[0].function")
        );
        for (key, bad) in [
            ("parameters", json!("oops")),
            ("parameters", json!([1])),
            ("description", json!(5)),
            ("strict", json!("yes")),
        ] {
            let mut f = json!({"name": "w", "parameters": {"type": "object"}});
            f[key] = bad;
            let e = with("tools", json!([{"type": "function", "function": f}]));
            assert_eq!((e.status, e.code.as_deref()), (400, Some("invalid_type")));
            assert_eq!(
                e.param.as_deref(),
                Some(format!("tools[0].function.{key}").as_str())
            );
        }
        assert_eq!(
            with("tool_choice", json!("required")).param.as_deref(),
            Some("tool_choice")
        );
        assert_eq!(
            with("response_format", json!({"type": "xml"}))
                .param
                .as_deref(),
            Some("response_format.type")
        );
        assert_eq!(
            with("chat_template_kwargs", json!({"enable_thinking": "no"}))
                .param
                .as_deref(),
            Some("chat_template_kwargs.enable_thinking")
        );
        assert_eq!(
            with("max_completion_tokens", json!(0)).param.as_deref(),
            Some("max_completion_tokens")
        );
        assert_eq!(
            with("messages", json!([])).param.as_deref(),
            Some("messages")
        );
    }

    #[test]
    fn tokenize_detokenize() {
        let t = |v: Value| parse_tokenize(v.as_object().unwrap(), &info());
        assert_eq!(
            t(json!({"prompt": "hi"})).unwrap(),
            TokenizeRequest::Prompt("hi".into())
        );
        assert!(
            matches!(t(json!({"messages": [{"role": "user", "content": "hi"}], "model": "qwen3.6"})).unwrap(), TokenizeRequest::Messages(m, o, _) if m.len() == 1 && o.add_generation_prompt)
        );
        assert_eq!(t(json!({})).unwrap_err().param.as_deref(), Some("prompt"));
        assert_eq!(
            t(json!({"prompt": 1})).unwrap_err().code.as_deref(),
            Some("invalid_type")
        );
        assert_eq!(
            t(json!({"prompt": "x", "model": "other"}))
                .unwrap_err()
                .status,
            404
        );
        let d = |v: Value| parse_detokenize(v.as_object().unwrap(), &info());
        assert_eq!(d(json!({"tokens": [1, 2]})).unwrap(), vec![1, 2]);
        assert_eq!(
            d(json!({"tokens": [1, 5000]}))
                .unwrap_err()
                .param
                .as_deref(),
            Some("tokens")
        );
        assert_eq!(
            d(json!({})).unwrap_err().code.as_deref(),
            Some("missing_required_parameter")
        );
    }
}
