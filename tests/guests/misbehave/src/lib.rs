//! A deliberately misbehaving API guest for the host's isolation tests.
//!
//! * `/trap` — traps (`unreachable`).
//! * `/loop` — spins forever without calling the host.
//! * `/oom` — allocates until the instance's memory limit is hit (then aborts).
//! * `/ok` — answers 200 `ok`.
//! * `/gen?n=N` — generates N tokens from a fixed prompt and streams their
//!   text, one body write per token; generate errors become a status
//!   (429 queue-full with Retry-After, 503 queue-timeout/shutting-down, 400, 500)
//!   with the error code as the body.

#[cfg(target_arch = "wasm32")]
mod guest {
    wit_bindgen::generate!({
        path: "../../../wit",
        world: "qwasi:inference/api",
        with: {
            "wasi:io/poll@0.2.12": wasip2::io::poll,
            "wasi:io/error@0.2.12": wasip2::io::error,
            "wasi:io/streams@0.2.12": wasip2::io::streams,
            "wasi:clocks/monotonic-clock@0.2.12": wasip2::clocks::monotonic_clock,
            "wasi:http/types@0.2.12": wasip2::http::types,
        },
    });

    use qwasi::inference::inference;
    use qwasi::inference::types::{Event, GenerateError, GenerateRequest, SamplingParams};
    use wasip2::http::types::{
        Fields, IncomingRequest, OutgoingBody, OutgoingResponse, ResponseOutparam,
    };

    struct Guest;

    fn respond(out: ResponseOutparam, status: u16, headers: &[(&str, String)], body: &str) {
        let fields = Fields::new();
        for (k, v) in headers {
            let _ = fields.append(k, v.as_bytes());
        }
        let resp = OutgoingResponse::new(fields);
        let _ = resp.set_status_code(status);
        let b = resp.body().unwrap();
        ResponseOutparam::set(out, Ok(resp));
        let s = b.write().unwrap();
        let _ = s.blocking_write_and_flush(body.as_bytes());
        drop(s);
        let _ = OutgoingBody::finish(b, None);
    }

    fn generate(out: ResponseOutparam, n: u32) {
        let prompt =
            qwasi::inference::tokenizer::encode("Hello, world").unwrap_or_else(|_| vec![1, 2, 3]);
        let req = GenerateRequest {
            prompt,
            max_tokens: n,
            stop_token_ids: vec![],
            ignore_eos: true,
            sampling: SamplingParams {
                temperature: 0.0,
                top_p: 1.0,
                top_k: 0,
                min_p: 0.0,
                seed: None,
                repetition_penalty: 1.0,
                presence_penalty: 0.0,
                frequency_penalty: 0.0,
                logit_bias: vec![],
                logprobs: None,
            },
            cache_salt: None,
            snapshot_points: vec![],
        };
        let g = match inference::generate(&req) {
            Ok(g) => g,
            Err(e) => {
                let (status, code, retry) = match e {
                    GenerateError::QueueFull(s) => (429, "queue_full".to_string(), Some(s)),
                    GenerateError::QueueTimeout => (503, "queue_timeout".into(), None),
                    GenerateError::ShuttingDown => (503, "service_shutting_down".into(), None),
                    GenerateError::ContextLengthExceeded(m) => {
                        (400, format!("context_length_exceeded: {m}"), None)
                    }
                    GenerateError::InvalidRequest(m) => {
                        (400, format!("invalid_request: {m}"), None)
                    }
                    GenerateError::Internal(m) => (500, format!("internal: {m}"), None),
                };
                let headers: Vec<(&str, String)> = retry
                    .map(|s| ("retry-after", s.to_string()))
                    .into_iter()
                    .collect();
                respond(out, status, &headers, &code);
                return;
            }
        };
        let resp = OutgoingResponse::new(Fields::new());
        let b = resp.body().unwrap();
        ResponseOutparam::set(out, Ok(resp));
        let s = b.write().unwrap();
        let pollable = g.subscribe();
        'outer: loop {
            pollable.block();
            for ev in g.next() {
                match ev {
                    Event::Token(t) => {
                        let chunk = format!("{}|", t.id);
                        if s.blocking_write_and_flush(chunk.as_bytes()).is_err() {
                            break 'outer;
                        }
                    }
                    Event::Finished(f) => {
                        let _ = s.blocking_write_and_flush(
                            format!("\nfinished {:?} {}\n", f.reason, f.usage.completion_tokens)
                                .as_bytes(),
                        );
                        break 'outer;
                    }
                    Event::Failed(m) => {
                        let _ = s.blocking_write_and_flush(format!("\nfailed {m}\n").as_bytes());
                        break 'outer;
                    }
                }
            }
        }
        drop(pollable);
        drop(g);
        drop(s);
        let _ = OutgoingBody::finish(b, None);
    }

    impl exports::wasi::http::incoming_handler::Guest for Guest {
        fn handle(req: IncomingRequest, out: ResponseOutparam) {
            let pq = req.path_with_query().unwrap_or_default();
            let (path, query) = pq.split_once('?').unwrap_or((&pq, ""));
            match path {
                "/trap" => core::arch::wasm32::unreachable(),
                "/loop" => {
                    let mut x: u64 = 0;
                    loop {
                        x = core::hint::black_box(x.wrapping_add(1));
                    }
                }
                "/oom" => {
                    let mut hoard: Vec<Vec<u8>> = Vec::new();
                    loop {
                        let mut v = vec![0u8; 1 << 20];
                        v[0] = 1;
                        hoard.push(core::hint::black_box(v));
                    }
                }
                "/gen" => {
                    let n = query
                        .split('&')
                        .find_map(|kv| kv.strip_prefix("n="))
                        .and_then(|v| v.parse().ok())
                        .unwrap_or(4);
                    generate(out, n)
                }
                _ => respond(out, 200, &[], "ok"),
            }
        }
    }

    export!(Guest);
}
