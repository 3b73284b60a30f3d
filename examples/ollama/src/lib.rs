//! An Ollama-compatible API as a Qwasi guest, on `qwasi-guest-sdk`.
//!
//! | endpoint | |
//! |---|---|
//! | `POST /api/generate` | prompt (+ `system`, `raw`, `context`) → NDJSON stream, or one object with `"stream": false` |
//! | `POST /api/chat` | `messages` → NDJSON stream of `message` deltas, or one object |
//! | `GET /api/tags` | the served model |
//! | `POST /api/show` | the served model's details and chat template |
//! | `GET /api/version` | the Ollama API version this guest follows |
//!
//! Prompts use the Qwen3.6 chat format ([`qwasi_guest_sdk::chat`]); `think`
//! (default false) turns the model's reasoning on and reports it in
//! `thinking`. `format` (`"json"` or a JSON schema) constrains the output
//! while it is decoded ([`format`]). Durations are nanoseconds measured in
//! the guest: `load_duration` is the time until the engine started the request
//! (tokenization and queueing), `prompt_eval_duration` until the first
//! token, `eval_duration` the rest. Errors are `{"error": "..."}` with the
//! HTTP status Ollama uses.

mod format;

use qwasi_guest_sdk::chat::{self, Message, RenderOptions, Role, ThinkSplitter};
use qwasi_guest_sdk::http::{self, Output, Request};
use qwasi_guest_sdk::inference::{
    End, Engine, GenerateError, GenerateRequest, Grammar, ModelInfo, SamplingParams,
};
use qwasi_guest_sdk::stream::{Framing, StreamWriter};
use qwasi_guest_sdk::time::{rfc3339_nanos, rfc3339_secs};
use serde::Deserialize;
use serde_json::{Map, Value, json};

/// The Ollama API version reported by `/api/version`.
pub const OLLAMA_VERSION: &str = "0.12.0";
/// Largest request body read.
pub const BODY_LIMIT: usize = 8 << 20;

/// An error as Ollama reports it: `{"error": "..."}` with a status.
#[derive(Debug, Clone, PartialEq)]
pub struct Error {
    pub status: u16,
    pub message: String,
    pub retry_after: Option<u32>,
}

impl Error {
    pub fn new(status: u16, message: impl Into<String>) -> Self {
        Error {
            status,
            message: message.into(),
            retry_after: None,
        }
    }

    fn bad(message: impl Into<String>) -> Self {
        Self::new(400, message)
    }
}

impl From<qwasi_guest_sdk::ApiError> for Error {
    fn from(e: qwasi_guest_sdk::ApiError) -> Self {
        Error {
            status: e.status,
            message: e.message,
            retry_after: e.retry_after,
        }
    }
}

impl From<GenerateError> for Error {
    fn from(e: GenerateError) -> Self {
        Error {
            status: e.status(),
            message: e.message(),
            retry_after: e.retry_after(),
        }
    }
}

fn send_error<O: Output>(out: &mut O, e: &Error) {
    let headers: Vec<(&str, String)> = e
        .retry_after
        .map(|s| ("retry-after", s.to_string()))
        .into_iter()
        .collect();
    let _ = http::send_json_with(out, e.status, &headers, &json!({ "error": e.message }));
}

/// Serves one request.
pub fn handle<E: Engine, O: Output>(engine: &E, mut req: Request, out: &mut O) {
    if let Err(e) = route(engine, &mut req, out)
        && !out.started()
    {
        send_error(out, &e);
    }
}

fn route<E: Engine, O: Output>(engine: &E, req: &mut Request, out: &mut O) -> Result<(), Error> {
    let t0 = engine.monotonic_ns();
    let method = req.method().to_owned();
    let path = req.path().to_owned();
    let allow = |m: &str| {
        if method == m || (m == "GET" && method == "HEAD") {
            Ok(())
        } else {
            Err(Error::new(
                405,
                format!("method {method} not allowed for {path}"),
            ))
        }
    };
    let body = |req: &mut Request| -> Result<Map<String, Value>, Error> {
        Ok(http::parse_object(req.body(BODY_LIMIT)?)?)
    };
    match path.as_str() {
        "/" => {
            allow("GET")?;
            let _ = http::send(
                out,
                200,
                "text/plain; charset=utf-8",
                &[],
                b"Ollama is running",
            );
        }
        "/api/version" => {
            allow("GET")?;
            let _ = http::send_json(out, 200, &json!({ "version": OLLAMA_VERSION }));
        }
        "/api/tags" => {
            allow("GET")?;
            let info = engine.model_info();
            let _ = http::send_json(out, 200, &json!({ "models": [tag(&info)] }));
        }
        "/api/show" => {
            allow("POST")?;
            let b = body(req)?;
            let name = b.get("model").or_else(|| b.get("name"));
            let info = engine.model_info();
            check_model(&info, name)?;
            let _ = http::send_json(out, 200, &show(&info));
        }
        "/api/generate" => {
            allow("POST")?;
            let b = parse::<GenerateBody>(body(req)?)?;
            generate(engine, b, t0, out)?;
        }
        "/api/chat" => {
            allow("POST")?;
            let b = parse::<ChatBody>(body(req)?)?;
            chat(engine, b, t0, out)?;
        }
        _ => return Err(Error::new(404, format!("404 page not found: {path}"))),
    }
    Ok(())
}

fn parse<T: for<'de> Deserialize<'de>>(body: Map<String, Value>) -> Result<T, Error> {
    serde_json::from_value(Value::Object(body)).map_err(|e| Error::bad(e.to_string()))
}

fn details() -> Value {
    json!({"parent_model": "", "format": "safetensors", "family": "qwen3",
           "families": ["qwen3"], "parameter_size": "", "quantization_level": "BF16"})
}

fn tag(info: &ModelInfo) -> Value {
    json!({
        "name": info.id,
        "model": info.id,
        "modified_at": rfc3339_secs(info.created),
        "size": 0,
        "digest": "",
        "details": details(),
    })
}

fn show(info: &ModelInfo) -> Value {
    json!({
        "modelfile": format!("# served by qwasi\nFROM {}\n", info.id),
        "parameters": "",
        "template": info.chat_template.clone().unwrap_or_default(),
        "details": details(),
        "model_info": {
            "general.architecture": "qwen3",
            "general.name": info.id,
            "qwen3.context_length": info.context_length,
            "qwen3.vocab_size": info.vocab_size,
        },
        "capabilities": ["completion", "thinking"],
        "modified_at": rfc3339_secs(info.created),
    })
}

/// `model` must name the served model (`name` or `name:latest`).
fn check_model(info: &ModelInfo, model: Option<&Value>) -> Result<(), Error> {
    let name = match model {
        None | Some(Value::Null) => return Err(Error::bad("model is required")),
        Some(Value::String(s)) if s.is_empty() => return Err(Error::bad("model is required")),
        Some(Value::String(s)) => s.as_str(),
        Some(_) => return Err(Error::bad("model must be a string")),
    };
    // The id or an alias (`--served-model-name`), with or without `:latest`.
    if info.serves(name.strip_suffix(":latest").unwrap_or(name)) {
        Ok(())
    } else {
        Err(Error::new(404, format!("model '{name}' not found")))
    }
}

/// `options`, as far as this server supports them.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct Options {
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub top_k: Option<u32>,
    pub min_p: Option<f32>,
    pub num_predict: Option<i64>,
    pub seed: Option<i64>,
    pub stop: Option<Vec<String>>,
    pub repeat_penalty: Option<f32>,
    pub presence_penalty: Option<f32>,
    pub frequency_penalty: Option<f32>,
}

impl Options {
    /// Ollama's defaults: temperature 0.8, top_k 40, top_p 0.9. (Ollama's
    /// repeat_penalty works over a window of recent tokens; the engine's
    /// over the whole sequence, so it is off unless asked for.)
    pub fn sampling(&self) -> SamplingParams {
        SamplingParams {
            temperature: self.temperature.unwrap_or(0.8),
            top_p: self.top_p.unwrap_or(0.9),
            top_k: self.top_k.unwrap_or(40),
            min_p: self.min_p.unwrap_or(0.0),
            seed: self.seed.and_then(|s| u64::try_from(s).ok()),
            repetition_penalty: self.repeat_penalty.unwrap_or(1.0),
            presence_penalty: self.presence_penalty.unwrap_or(0.0),
            frequency_penalty: self.frequency_penalty.unwrap_or(0.0),
            ..SamplingParams::default()
        }
    }
}

/// `think`: a bool, or a level string ("low", "medium", "high") = on.
fn think_on(v: &Option<Value>) -> Result<bool, Error> {
    match v {
        None | Some(Value::Null) => Ok(false),
        Some(Value::Bool(b)) => Ok(*b),
        Some(Value::String(_)) => Ok(true),
        Some(_) => Err(Error::bad("think must be a boolean")),
    }
}

fn unsupported(name: &str, v: &Option<Value>) -> Result<(), Error> {
    match v {
        None | Some(Value::Null) => Ok(()),
        Some(Value::String(s)) if s.is_empty() => Ok(()),
        Some(Value::Array(a)) if a.is_empty() => Ok(()),
        Some(_) => Err(Error::bad(format!(
            "'{name}' is not supported by this server"
        ))),
    }
}

#[derive(Debug, Deserialize)]
pub struct GenerateBody {
    pub model: Option<Value>,
    #[serde(default)]
    pub prompt: String,
    pub system: Option<String>,
    #[serde(default)]
    pub raw: bool,
    pub context: Option<Vec<u32>>,
    pub stream: Option<bool>,
    #[serde(default)]
    pub options: Options,
    pub think: Option<Value>,
    pub format: Option<Value>,
    pub images: Option<Value>,
    pub suffix: Option<Value>,
    pub template: Option<Value>,
    pub keep_alive: Option<Value>,
}

#[derive(Debug, Deserialize)]
pub struct ChatMessage {
    pub role: String,
    #[serde(default)]
    pub content: String,
    pub thinking: Option<String>,
    pub images: Option<Value>,
    pub tool_calls: Option<Value>,
}

#[derive(Debug, Deserialize)]
pub struct ChatBody {
    pub model: Option<Value>,
    #[serde(default)]
    pub messages: Vec<ChatMessage>,
    pub stream: Option<bool>,
    #[serde(default)]
    pub options: Options,
    pub think: Option<Value>,
    pub format: Option<Value>,
    pub tools: Option<Value>,
    pub keep_alive: Option<Value>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Generate,
    Chat,
}

/// One generation, whichever endpoint asked for it.
struct Job {
    kind: Kind,
    model: String,
    prompt: Vec<u32>,
    snapshot_points: Vec<u32>,
    options: Options,
    think: bool,
    stream: bool,
    /// What `format` holds the output to.
    format: Option<Grammar>,
}

fn generate<E: Engine, O: Output>(
    engine: &E,
    b: GenerateBody,
    t0: u64,
    out: &mut O,
) -> Result<(), Error> {
    let info = engine.model_info();
    check_model(&info, b.model.as_ref())?;
    let format = format::grammar(b.format.as_ref())?;
    for (name, v) in [
        ("images", &b.images),
        ("suffix", &b.suffix),
        ("template", &b.template),
    ] {
        unsupported(name, v)?;
    }
    let model = b
        .model
        .as_ref()
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned();
    let think = think_on(&b.think)?;
    let stream = b.stream.unwrap_or(true);
    if b.prompt.is_empty() && b.context.is_none() {
        // Ollama answers an empty prompt by loading the model.
        let done = json!({"model": model, "created_at": rfc3339_nanos(engine.now_unix_ns()),
                          "response": "", "done": true, "done_reason": "load"});
        let _ = http::send_json(out, 200, &done);
        return Ok(());
    }
    let think = think && !b.raw;
    let (ids, mut snapshot_points) = if b.raw {
        (tokenize(engine, &b.prompt)?, Vec::new())
    } else {
        let mut messages = Vec::new();
        if let Some(s) = b.system.filter(|s| !s.is_empty()) {
            messages.push(Message::new(Role::System, s));
        }
        messages.push(Message::new(Role::User, b.prompt));
        chat::tokenize_chat(engine, &chat::render(&messages, render_options(think)))?
    };
    // A `context` from an earlier response continues that conversation.
    let mut prompt = b.context.unwrap_or_default();
    let offset = prompt.len() as u32;
    snapshot_points.iter_mut().for_each(|p| *p += offset);
    if offset > 0 {
        snapshot_points.insert(0, offset);
    }
    prompt.extend(ids);
    run(
        engine,
        Job {
            kind: Kind::Generate,
            model,
            prompt,
            snapshot_points,
            options: b.options,
            think,
            stream,
            format,
        },
        t0,
        out,
    )
}

fn render_options(think: bool) -> RenderOptions {
    RenderOptions {
        add_generation_prompt: true,
        enable_thinking: think,
        preserve_thinking: false,
    }
}

fn tokenize<E: Engine>(engine: &E, text: &str) -> Result<Vec<u32>, Error> {
    engine
        .tokenize(text)
        .map_err(|e| Error::bad(format!("could not tokenize the prompt: {e}")))
}

fn chat<E: Engine, O: Output>(engine: &E, b: ChatBody, t0: u64, out: &mut O) -> Result<(), Error> {
    let info = engine.model_info();
    check_model(&info, b.model.as_ref())?;
    let format = format::grammar(b.format.as_ref())?;
    unsupported("tools", &b.tools)?;
    let model = b
        .model
        .as_ref()
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned();
    let think = think_on(&b.think)?;
    let stream = b.stream.unwrap_or(true);
    if b.messages.is_empty() {
        let done = json!({"model": model, "created_at": rfc3339_nanos(engine.now_unix_ns()),
                          "message": {"role": "assistant", "content": ""},
                          "done": true, "done_reason": "load"});
        let _ = http::send_json(out, 200, &done);
        return Ok(());
    }
    let mut messages = Vec::with_capacity(b.messages.len());
    for (i, m) in b.messages.into_iter().enumerate() {
        let role = Role::parse(&m.role)
            .ok_or_else(|| Error::bad(format!("messages[{i}]: unknown role '{}'", m.role)))?;
        unsupported(&format!("messages[{i}].images"), &m.images)?;
        unsupported(&format!("messages[{i}].tool_calls"), &m.tool_calls)?;
        messages.push(Message {
            role,
            content: m.content,
            reasoning: m.thinking.filter(|_| role == Role::Assistant),
        });
    }
    let text = chat::render(&messages, render_options(think));
    let (prompt, snapshot_points) = chat::tokenize_chat(engine, &text)?;
    run(
        engine,
        Job {
            kind: Kind::Chat,
            model,
            prompt,
            snapshot_points,
            options: b.options,
            think,
            stream,
            format,
        },
        t0,
        out,
    )
}

/// `num_predict` against the context and the operator's caps: -1/-2 (or
/// none) = as much as fits.
fn max_tokens(info: &ModelInfo, prompt_len: u32, num_predict: Option<i64>) -> Result<u32, Error> {
    if info.max_prompt_tokens > 0 && prompt_len > info.max_prompt_tokens {
        return Err(Error::bad(format!(
            "the prompt has {prompt_len} tokens, but this server accepts at most {}",
            info.max_prompt_tokens
        )));
    }
    if prompt_len >= info.context_length {
        return Err(Error::bad(format!(
            "the prompt has {prompt_len} tokens, which does not fit the context length {}",
            info.context_length
        )));
    }
    let room = info.context_length - prompt_len;
    let mut n = match num_predict {
        Some(n) if n >= 0 => (n.min(i64::from(u32::MAX)) as u32).min(room),
        _ => room,
    };
    if info.max_completion_tokens > 0 {
        n = n.min(info.max_completion_tokens);
    }
    Ok(n)
}

/// The fields every line carries, and the text of one delta.
fn line(job: &Job, created_at: &str, thinking: &str, content: &str) -> Map<String, Value> {
    let mut m = Map::new();
    m.insert("model".into(), job.model.clone().into());
    m.insert("created_at".into(), created_at.into());
    match job.kind {
        Kind::Generate => {
            m.insert("response".into(), content.into());
            if !thinking.is_empty() {
                m.insert("thinking".into(), thinking.into());
            }
        }
        Kind::Chat => {
            let mut msg = json!({"role": "assistant", "content": content});
            if !thinking.is_empty() {
                msg["thinking"] = thinking.into();
            }
            m.insert("message".into(), msg);
        }
    }
    m.insert("done".into(), false.into());
    m
}

struct Clock {
    start: u64,
    started: u64,
    first: Option<u64>,
}

fn run<E: Engine, O: Output>(engine: &E, job: Job, t0: u64, out: &mut O) -> Result<(), Error> {
    let info = engine.model_info();
    let n = max_tokens(&info, job.prompt.len() as u32, job.options.num_predict)?;
    let prompt_len = job.prompt.len() as u32;
    let created = || rfc3339_nanos(engine.now_unix_ns());
    if n == 0 {
        let mut done = line(&job, &created(), "", "");
        finish_fields(
            &mut done,
            &job,
            "length",
            prompt_len,
            0,
            &Clock {
                start: t0,
                started: t0,
                first: None,
            },
            engine.monotonic_ns(),
            &[],
        );
        let _ = http::send_json(out, 200, &Value::Object(done));
        return Ok(());
    }
    let think_end = job
        .think
        .then(|| engine.token_to_id(chat::THINK_END))
        .flatten();
    let request = GenerateRequest {
        prompt: job.prompt.clone(),
        max_tokens: n,
        sampling: job.options.sampling(),
        snapshot_points: job.snapshot_points.clone(),
        constraint: job.format.clone().map(|g| format::constraint(g, think_end)),
        ..GenerateRequest::default()
    };
    let mut r = engine.start(request).map_err(format::rejected)?;
    r = r.with_stop(job.options.stop.clone().unwrap_or_default());
    let mut splitter = None;
    if job.think {
        if let Some(id) = think_end {
            r = r.spell(id, chat::THINK_END);
        }
        splitter = Some(ThinkSplitter::new());
    }
    let mut clock = Clock {
        start: t0,
        started: engine.monotonic_ns(),
        first: None,
    };
    let mut writer = if job.stream {
        Some(
            StreamWriter::start(out, 200, Framing::Ndjson, &[])
                .map_err(|_| Error::new(499, "client gone"))?,
        )
    } else {
        None
    };
    let (mut all_thinking, mut all_content) = (String::new(), String::new());
    while let Some(batch) = r.next_batch() {
        clock.first.get_or_insert_with(|| engine.monotonic_ns());
        let at = created();
        for d in batch {
            let (thinking, content) = match &mut splitter {
                Some(s) => s.push(&d.text),
                None => (String::new(), d.text),
            };
            if thinking.is_empty() && content.is_empty() {
                continue;
            }
            match &mut writer {
                Some(w) => {
                    if w.json(&line(&job, &at, &thinking, &content)).is_err() {
                        return Ok(()); // client gone: dropping the run cancels it
                    }
                }
                None => {
                    all_thinking.push_str(&thinking);
                    all_content.push_str(&content);
                }
            }
        }
        // Flush before waiting again; the last batch goes with the final line.
        if let Some(w) = &mut writer
            && r.end().is_none()
            && w.flush().is_err()
        {
            return Ok(());
        }
    }
    if let Some(s) = &mut splitter {
        // Thinking that never reached </think>.
        all_thinking.push_str(&s.finish());
    }
    let end = engine.monotonic_ns();
    let (reason, usage) = match r.end() {
        Some(End::Finished { reason, usage, .. }) => (reason.as_str(), *usage),
        Some(End::Failed(m)) => {
            let e = Error::new(500, format!("generation failed: {m}"));
            if let Some(mut w) = writer {
                let _ = w.json(&json!({"error": e.message}));
                let _ = w.finish();
                return Ok(());
            }
            return Err(e);
        }
        None => unreachable!("next_batch returns None only at the end"),
    };
    let mut last = if writer.is_some() {
        line(&job, &created(), &all_thinking, "")
    } else {
        line(&job, &created(), &all_thinking, &all_content)
    };
    let mut context = Vec::new();
    if job.kind == Kind::Generate {
        context = job.prompt.clone();
        context.extend_from_slice(r.tokens());
    }
    finish_fields(
        &mut last,
        &job,
        reason,
        usage.prompt_tokens,
        usage.completion_tokens,
        &clock,
        end,
        &context,
    );
    match writer {
        Some(mut w) => {
            let _ = w.json(&Value::Object(last));
            let _ = w.finish();
        }
        None => {
            let _ = http::send_json(out, 200, &Value::Object(last));
        }
    }
    Ok(())
}

#[allow(clippy::too_many_arguments)]
fn finish_fields(
    m: &mut Map<String, Value>,
    job: &Job,
    reason: &str,
    prompt_tokens: u32,
    eval_count: u32,
    clock: &Clock,
    end: u64,
    context: &[u32],
) {
    let first = clock.first.unwrap_or(end);
    m.insert("done".into(), true.into());
    m.insert("done_reason".into(), reason.into());
    if job.kind == Kind::Generate {
        m.insert("context".into(), json!(context));
    }
    m.insert("total_duration".into(), (end - clock.start).into());
    m.insert("load_duration".into(), (clock.started - clock.start).into());
    m.insert("prompt_eval_count".into(), prompt_tokens.into());
    m.insert(
        "prompt_eval_duration".into(),
        (first - clock.started).into(),
    );
    m.insert("eval_count".into(), eval_count.into());
    m.insert("eval_duration".into(), (end - first).into());
}

#[cfg(target_arch = "wasm32")]
mod component {
    use qwasi_guest_sdk::ApiError;
    use qwasi_guest_sdk::api::{HostEngine, HttpGuest, WasiOutput};
    use qwasi_guest_sdk::http::Request;

    struct Ollama;

    impl HttpGuest for Ollama {
        fn handle(req: Request, out: &mut WasiOutput) -> Result<(), ApiError> {
            super::handle(&HostEngine, req, out);
            Ok(())
        }
    }

    qwasi_guest_sdk::export_http!(Ollama);
}

#[cfg(test)]
mod tests;
