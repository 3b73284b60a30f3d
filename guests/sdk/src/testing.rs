//! Test doubles for native unit tests of a guest: [`FakeEngine`] (a scripted
//! [`Engine`]) and [`Recorder`] (an [`Output`] that keeps what was sent).

use std::cell::{Cell, RefCell};
use std::rc::Rc;

use crate::http::{Disconnected, Output};
use crate::inference::{
    Engine, Event, Finish, FinishReason, GenerateError, GenerateRequest, Generation, ModelInfo,
    TokenEvent, Usage,
};

/// An engine that answers every `generate` with the same scripted tokens.
///
/// * `tokenize` gives one id per char (the char's code point), `detokenize`
///   the reverse; special tokens registered with [`FakeEngine::special`]
///   are recognised in both directions.
/// * Events come 3 per `wait_next`, as a real engine batches them.
/// * The last request is kept ([`FakeEngine::last_request`]); generations
///   dropped before their end are counted ([`FakeEngine::cancelled`]).
/// * [`Generation::usage`] reports [`FakeEngine::cached`] cached tokens and,
///   as an engine that ran ahead, every scripted token as sampled.
#[derive(Clone)]
pub struct FakeEngine {
    pub info: ModelInfo,
    script: Vec<String>,
    finish: FinishReason,
    failure: Option<String>,
    refusal: Option<GenerateError>,
    cached: u32,
    specials: Vec<(u32, String)>,
    last: Rc<RefCell<Option<GenerateRequest>>>,
    cancelled: Rc<Cell<usize>>,
    clock: Rc<Cell<u64>>,
    ids: Rc<Cell<u64>>,
}

impl Default for FakeEngine {
    fn default() -> Self {
        Self::new()
    }
}

impl FakeEngine {
    pub fn new() -> Self {
        FakeEngine {
            info: ModelInfo {
                id: "fake-model".into(),
                context_length: 4096,
                vocab_size: 0x11_0000,
                eos_token_ids: vec![0],
                chat_template: None,
                created: 1_700_000_000,
                max_prompt_tokens: 0,
                max_completion_tokens: 0,
                ..Default::default()
            },
            script: Vec::new(),
            finish: FinishReason::Stop,
            failure: None,
            refusal: None,
            cached: 0,
            specials: Vec::new(),
            last: Rc::default(),
            cancelled: Rc::default(),
            clock: Rc::default(),
            ids: Rc::default(),
        }
    }

    /// Every generation emits these token texts (cut at `max_tokens`, which
    /// then finishes with `length`), then finishes with `finish`.
    pub fn script(mut self, tokens: &[&str], finish: FinishReason) -> Self {
        self.script = tokens.iter().map(|t| t.to_string()).collect();
        self.finish = finish;
        self
    }

    /// A special token: scripted as `text`, sent as id `id` with no text.
    pub fn special(mut self, id: u32, text: &str) -> Self {
        self.specials.push((id, text.to_owned()));
        self
    }

    /// Generations fail with `message` after starting.
    pub fn failing(mut self, message: &str) -> Self {
        self.failure = Some(message.into());
        self
    }

    /// `generate` returns this error.
    pub fn refusing(mut self, e: GenerateError) -> Self {
        self.refusal = Some(e);
        self
    }

    /// Prompt tokens the engine reports served from the prefix cache.
    pub fn cached(mut self, tokens: u32) -> Self {
        self.cached = tokens;
        self
    }

    pub fn last_request(&self) -> Option<GenerateRequest> {
        self.last.borrow().clone()
    }

    /// The last request's prompt as text (its ids detokenized, special
    /// tokens spelled out).
    pub fn last_prompt_text(&self) -> String {
        let prompt = self.last_request().map(|r| r.prompt).unwrap_or_default();
        self.detokenize(&prompt, false)
            .expect("fake ids detokenize")
    }

    pub fn cancelled(&self) -> usize {
        self.cancelled.get()
    }
}

pub struct FakeGeneration {
    events: Vec<Event>,
    usage: Usage,
    cancelled: Rc<Cell<usize>>,
}

impl Generation for FakeGeneration {
    fn wait_next(&mut self) -> Vec<Event> {
        let n = self.events.len().min(3);
        self.events.drain(..n).collect()
    }

    fn usage(&self) -> Option<Usage> {
        Some(self.usage)
    }
}

impl Drop for FakeGeneration {
    fn drop(&mut self) {
        if !self.events.is_empty() {
            self.cancelled.set(self.cancelled.get() + 1);
        }
    }
}

/// Ids count up (`000…01`, `000…02`, ...), so tests can predict them.
impl crate::host::Host for FakeEngine {
    fn random_hex(&self, bytes: usize) -> String {
        self.ids.set(self.ids.get() + 1);
        format!("{:0width$x}", self.ids.get(), width = bytes * 2)
    }
}

impl Engine for FakeEngine {
    type Generation = FakeGeneration;

    fn model_info(&self) -> ModelInfo {
        self.info.clone()
    }

    fn tokenize(&self, text: &str) -> Result<Vec<u32>, String> {
        let mut ids = Vec::new();
        let mut rest = text;
        'outer: while let Some(c) = rest.chars().next() {
            for (id, s) in &self.specials {
                if let Some(r) = rest.strip_prefix(s.as_str()) {
                    ids.push(*id);
                    rest = r;
                    continue 'outer;
                }
            }
            ids.push(c as u32);
            rest = &rest[c.len_utf8()..];
        }
        Ok(ids)
    }

    fn detokenize(&self, ids: &[u32], skip_special_tokens: bool) -> Result<String, String> {
        let mut out = String::new();
        for &id in ids {
            match self.specials.iter().find(|(i, _)| *i == id) {
                Some(_) if skip_special_tokens => {}
                Some((_, s)) => out.push_str(s),
                None => out.push(char::from_u32(id).ok_or(format!("invalid id {id}"))?),
            }
        }
        Ok(out)
    }

    fn token_to_id(&self, token: &str) -> Option<u32> {
        self.specials
            .iter()
            .find(|(_, s)| s == token)
            .map(|(i, _)| *i)
    }

    fn id_to_token(&self, id: u32) -> Option<String> {
        self.detokenize(&[id], false).ok()
    }

    fn is_special(&self, id: u32) -> bool {
        self.specials.iter().any(|(i, _)| *i == id)
    }

    fn generate(&self, request: GenerateRequest) -> Result<FakeGeneration, GenerateError> {
        *self.last.borrow_mut() = Some(request.clone());
        if let Some(e) = &self.refusal {
            return Err(e.clone());
        }
        let mut events = Vec::new();
        let mut usage = Usage {
            prompt_tokens: request.prompt.len() as u32,
            completion_tokens: 0,
            cached_tokens: self.cached,
        };
        if let Some(m) = &self.failure {
            events.push(Event::Failed(m.clone()));
        } else {
            let n = self.script.len().min(request.max_tokens as usize);
            for (i, t) in self.script[..n].iter().enumerate() {
                let special = self.specials.iter().find(|(_, s)| s == t);
                events.push(Event::Token(TokenEvent {
                    id: special.map_or(1000 + i as u32, |(id, _)| *id),
                    text: if special.is_some() {
                        String::new()
                    } else {
                        t.clone()
                    },
                    logprob: None,
                }));
            }
            let reason = if n < self.script.len() {
                FinishReason::Length
            } else {
                self.finish
            };
            usage.completion_tokens = n as u32;
            events.push(Event::Finished(Finish {
                reason,
                usage,
                stop_token: (reason == FinishReason::Stop).then_some(0),
                trailing_text: String::new(),
            }));
        }
        Ok(FakeGeneration {
            events,
            usage,
            cancelled: self.cancelled.clone(),
        })
    }

    /// A fake clock: 1 ms later at every call.
    fn now_unix_ns(&self) -> u64 {
        1_700_000_000_000_000_000 + self.monotonic_ns()
    }

    fn monotonic_ns(&self) -> u64 {
        self.clock.set(self.clock.get() + 1_000_000);
        self.clock.get()
    }
}

/// An [`Output`] that records the status, headers and each write.
#[derive(Debug, Default, Clone)]
pub struct Recorder {
    pub status: Option<u16>,
    pub headers: Vec<(String, String)>,
    pub writes: Vec<Vec<u8>>,
    /// Fail every write after this many (a client that goes away).
    pub fail_after: Option<usize>,
}

impl Recorder {
    pub fn header(&self, name: &str) -> Option<&str> {
        crate::http::header(&self.headers, name)
    }

    pub fn body(&self) -> Vec<u8> {
        self.writes.concat()
    }

    pub fn body_string(&self) -> String {
        String::from_utf8(self.body()).expect("UTF-8 body")
    }

    /// The body parsed as one JSON value.
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body()).expect("JSON body")
    }

    /// The body as server-sent events: each event's `event:` name (if any)
    /// and its `data:` parsed as JSON (`[DONE]` as the string).
    pub fn sse(&self) -> Vec<(Option<String>, serde_json::Value)> {
        self.body_string()
            .split("\n\n")
            .filter(|e| !e.trim().is_empty())
            .map(|e| {
                let mut name = None;
                let mut data = Vec::new();
                for line in e.lines() {
                    if let Some(n) = line.strip_prefix("event: ") {
                        name = Some(n.to_owned());
                    } else if let Some(d) = line.strip_prefix("data: ") {
                        data.push(d);
                    }
                }
                let data = data.join("\n");
                let v = serde_json::from_str(&data).unwrap_or(serde_json::Value::String(data));
                (name, v)
            })
            .collect()
    }

    /// The body as NDJSON, one value per line.
    pub fn ndjson(&self) -> Vec<serde_json::Value> {
        self.body_string()
            .lines()
            .map(|l| serde_json::from_str(l).expect("one JSON value per line"))
            .collect()
    }
}

impl Output for Recorder {
    fn start(&mut self, status: u16, headers: &[(&str, String)]) -> Result<(), Disconnected> {
        assert!(self.status.is_none(), "start called twice");
        self.status = Some(status);
        self.headers = headers
            .iter()
            .map(|(k, v)| (k.to_string(), v.clone()))
            .collect();
        Ok(())
    }

    fn write(&mut self, data: &[u8]) -> Result<(), Disconnected> {
        assert!(self.status.is_some(), "write before start");
        if self.fail_after.is_some_and(|n| self.writes.len() >= n) {
            return Err(Disconnected);
        }
        self.writes.push(data.to_vec());
        Ok(())
    }

    fn started(&self) -> bool {
        self.status.is_some()
    }
}
