//! Running a request's generations: one per choice. `n` choices per prompt,
//! `best_of` candidates of which the `n` most likely (highest mean token
//! logprob) are returned, and several prompts in `/v1/completions`.
//!
//! The engine runs one sequence at a time, so the generations run one after
//! another (each after the first finds its prompt in the prefix cache); a
//! stream sends each choice's chunks in turn, its `finish_reason` chunk
//! ending it, then the summed usage. Choice `k` of a prompt samples with
//! `seed + k` when the request has a seed. Usage counts each prompt once
//! and every generated token, discarded `best_of` candidates included.

use serde_json::{Value, json};

use crate::api::{Format, send_json, usage_json};
use crate::host::Host;
use crate::params::Common;
use crate::structured;
use qwasi_guest_sdk::ApiError;
use qwasi_guest_sdk::driver::{Driver, Ended, Piece, TokenLp};
use qwasi_guest_sdk::http::Output;
use qwasi_guest_sdk::inference::{GenerateRequest, Generation, Usage};
use qwasi_guest_sdk::stream::{Framing, StreamWriter};

/// One generation: which prompt (and format) it continues, its engine
/// request and its driver.
pub struct Job<'h, H: Host> {
    pub prompt: usize,
    pub req: GenerateRequest,
    pub driver: Driver<'h, H>,
}

/// The response's id, creation time and model name.
pub struct Meta {
    pub id: String,
    pub created: u64,
    pub model: String,
}

pub fn envelope(m: &Meta, object: &str, choices: Vec<Value>) -> Value {
    json!({"id": m.id, "object": object, "created": m.created, "model": m.model, "choices": choices})
}

/// The engine request of candidate `k` of a prompt: the seed derived, and
/// the chosen tokens' logprobs asked for when candidates are ranked.
pub fn candidate(common: &Common, mut req: GenerateRequest, k: u32) -> GenerateRequest {
    req.sampling.seed = common.sampling.seed.map(|s| s.wrapping_add(k as u64));
    if common.best_of > common.n && req.sampling.logprobs.is_none() {
        req.sampling.logprobs = Some(0);
    }
    req
}

/// A finished generation.
struct Outcome {
    prompt: usize,
    piece: Piece,
    lps: Vec<TokenLp>,
    reason: &'static str,
    usage: Usage,
    /// Mean logprob of the generated tokens (the `best_of` ranking).
    mean_logprob: f64,
}

fn start<H: Host>(
    host: &H,
    job: &mut Job<H>,
) -> Result<Option<<H as qwasi_guest_sdk::inference::Engine>::Generation>, ApiError> {
    // echo with max_tokens = 0: nothing to generate.
    if job.req.max_tokens == 0 {
        job.driver.ended = Some(Ended::Finished {
            reason: "length",
            usage: Usage {
                prompt_tokens: job.req.prompt.len() as u32,
                ..Usage::default()
            },
        });
        return Ok(None);
    }
    Ok(Some(
        host.generate(job.req.clone()).map_err(ApiError::from)?,
    ))
}

/// Runs one generation to its end.
fn drive<H: Host>(host: &H, mut job: Job<H>) -> Result<Outcome, ApiError> {
    let mut generation = start(host, &mut job)?;
    let driver = &mut job.driver;
    let mut all = Piece::default();
    let mut lps = Vec::new();
    while driver.ended.is_none() {
        for p in driver.next_batch(&mut generation) {
            all.reasoning.push_str(&p.reasoning);
            all.content.push_str(&p.content);
            all.tool_calls.extend(p.tool_calls);
            lps.extend(p.logprob);
        }
    }
    drop(generation); // Cancels the engine request when a stop string ended it.
    let mean_logprob = driver.mean_logprob();
    match driver.ended.take().expect("ended") {
        Ended::Failed(msg) => Err(ApiError::internal(format!("generation failed: {msg}"))),
        Ended::Rejected(e) => Err(e),
        Ended::Finished { reason, usage } => Ok(Outcome {
            prompt: job.prompt,
            piece: all,
            lps,
            reason,
            usage,
            mean_logprob,
        }),
    }
}

/// Adds a generation's usage: the prompt (and its cached part) once per
/// prompt, the completion tokens of every generation.
fn add_usage(total: &mut Usage, u: &Usage, first_of_prompt: bool) {
    if first_of_prompt {
        total.prompt_tokens += u.prompt_tokens;
        total.cached_tokens += u.cached_tokens;
    }
    total.completion_tokens += u.completion_tokens;
}

/// Runs every job and answers: one JSON response, or a stream. A
/// constraint the host refused is a 400 naming the request field it came from.
pub fn respond<H: Host, F: Format, S: Output>(
    host: &H,
    jobs: Vec<Job<H>>,
    formats: &[F],
    m: &Meta,
    common: &Common,
    sink: &mut S,
) -> Result<(), ApiError> {
    respond_all(host, jobs, formats, m, common, sink).map_err(|e| match &common.constraint {
        Some(c) => structured::rejected(c, e),
        None => e,
    })
}

fn respond_all<H: Host, F: Format, S: Output>(
    host: &H,
    jobs: Vec<Job<H>>,
    formats: &[F],
    m: &Meta,
    common: &Common,
    sink: &mut S,
) -> Result<(), ApiError> {
    if common.stream {
        return stream(host, jobs, formats, m, common.include_usage, sink);
    }
    let mut outcomes = Vec::with_capacity(jobs.len());
    for job in jobs {
        outcomes.push(drive(host, job)?);
    }
    let mut usage = Usage::default();
    let mut choices = Vec::new();
    for (p, candidates) in outcomes.chunk_by(|a, b| a.prompt == b.prompt).enumerate() {
        for (k, o) in candidates.iter().enumerate() {
            add_usage(&mut usage, &o.usage, k == 0);
        }
        let mut ranked: Vec<&Outcome> = candidates.iter().collect();
        if common.best_of > common.n {
            ranked.sort_by(|a, b| b.mean_logprob.total_cmp(&a.mean_logprob));
        }
        for (k, o) in ranked.into_iter().take(common.n as usize).enumerate() {
            let mut c = formats[o.prompt].full_choice(&o.piece, &o.lps, o.reason);
            c["index"] = json!(p * common.n as usize + k);
            choices.push(c);
        }
    }
    let mut v = envelope(m, F::OBJECT, choices);
    v["usage"] = usage_json(&usage);
    send_json(sink, 200, &v);
    Ok(())
}

fn stream<H: Host, F: Format, S: Output>(
    host: &H,
    jobs: Vec<Job<H>>,
    formats: &[F],
    m: &Meta,
    include_usage: bool,
    sink: &mut S,
) -> Result<(), ApiError> {
    let mut jobs = jobs.into_iter().enumerate();
    let Some((_, mut first)) = jobs.next() else {
        return Ok(());
    };
    // The first generation starts before the headers: its admission errors
    // (queue full, ...) are still plain HTTP errors.
    let first_generation = start(host, &mut first)?;
    // One host write per batch of engine events (flushed below), whatever its size.
    let Ok(w) = StreamWriter::start(sink, 200, Framing::Sse, &[]) else {
        return Ok(());
    };
    let mut w = w.flush_threshold(usize::MAX);
    // Every chunk is the same envelope around one choice: serialise the
    // envelope once and only the choice per token.
    let envelope_json =
        serde_json::to_string(&envelope(m, F::CHUNK_OBJECT, vec![])).expect("JSON serialises");
    let head = envelope_json.strip_suffix("]}").expect("choices come last");
    let tail = if include_usage {
        "],\"usage\":null}"
    } else {
        "]}"
    };
    let mut total = Usage::default();
    let mut last_prompt = None;
    let mut next = Some((0, first, first_generation));
    while let Some((index, mut job, generation)) = next.take() {
        let fmt = &formats[job.prompt];
        // Buffered only (the threshold is never reached): these cannot fail.
        let push_chunk = |w: &mut StreamWriter<S>, mut choice: Value| {
            choice["index"] = json!(index);
            let mut chunk = String::from(head);
            chunk.push_str(&serde_json::to_string(&choice).expect("JSON serialises"));
            chunk.push_str(tail);
            let _ = w.sse(None, &chunk);
        };
        let usage = match stream_one(&mut w, push_chunk, &mut job, fmt, generation) {
            Some(u) => u,
            None => return Ok(()), // failed (error sent) or the client is gone
        };
        add_usage(&mut total, &usage, last_prompt != Some(job.prompt));
        last_prompt = Some(job.prompt);
        if let Some((i, mut job)) = jobs.next() {
            if w.flush().is_err() {
                return Ok(()); // client gone
            }
            match start(host, &mut job) {
                Ok(g) => next = Some((i, job, g)),
                Err(e) => {
                    let _ = w.json(&e.to_json());
                    let _ = w.done();
                    let _ = w.flush();
                    return Ok(());
                }
            }
        }
    }
    if include_usage {
        let mut v = envelope(m, F::CHUNK_OBJECT, vec![]);
        v["usage"] = usage_json(&total);
        let _ = w.json(&v);
    }
    let _ = w.done();
    let _ = w.flush();
    Ok(())
}

/// Streams one generation's chunks; its usage once it finished, `None`
/// when it failed (the error and `[DONE]` sent) or the client went away.
fn stream_one<H: Host, F: Format, S: Output, G: Generation>(
    w: &mut StreamWriter<S>,
    push_chunk: impl Fn(&mut StreamWriter<S>, Value),
    job: &mut Job<H>,
    fmt: &F,
    mut generation: Option<G>,
) -> Option<Usage> {
    let driver = &mut job.driver;
    if let Some(first) = fmt.first_chunk() {
        push_chunk(w, first);
    }
    loop {
        for p in driver.next_batch(&mut generation) {
            for c in fmt.chunks(&p, p.in_reasoning) {
                push_chunk(w, c);
            }
        }
        let mut result = None;
        match &driver.ended {
            None => {}
            Some(Ended::Finished { reason, usage }) => {
                generation = None; // cancel at once after a stop string, before the last write
                push_chunk(w, fmt.final_choice(reason));
                result = Some(*usage);
            }
            Some(Ended::Failed(msg)) => {
                generation = None;
                let e = ApiError::internal(format!("generation failed: {msg}"));
                let _ = w.json(&e.to_json());
                let _ = w.done();
            }
            Some(Ended::Rejected(e)) => {
                generation = None;
                let _ = w.json(&e.to_json());
                let _ = w.done();
            }
        }
        // A finished choice's last chunk goes out with what follows it (the
        // next choice, or the usage and [DONE]): one write.
        if result.is_some() {
            return result;
        }
        if w.flush().is_err() {
            return None; // client gone: dropping the generation cancels it
        }
        if driver.ended.is_some() {
            return None;
        }
    }
}
