//! The engine service over the real CPU model (a tiny seeded one): streaming,
//! queueing, cancellation, drain, failure isolation and validation here; the
//! metrics text and the logits' readout in `service_cases/` (one test binary:
//! modules, not files of their own under tests/), the test backend in
//! `service_support/`.

mod common;
#[path = "service_cases/metrics.rs"]
mod metrics;
#[path = "service_cases/readout.rs"]
mod readout;
mod service_support;

use anyhow::{Result, bail};
use qwasi_engine::backend::{Backend, SeqSnapshot};
use qwasi_engine::config::ModelConfig;
use qwasi_engine::cpu::{CpuModel, CpuSequence};
use qwasi_engine::demo::RandomWeights;
use qwasi_engine::generate::{FinishReason, GenerateRequest, generate};
use qwasi_engine::readout::Readout;
use qwasi_engine::sampling::{
    RowPlanner, Sampled, SamplingParams, TopLogits, WeightedRow, Weighting, greedy, read_weighted,
    top_logits,
};
use qwasi_engine::service::{
    EngineService, Event, GenerationHandle, ServiceConfig, SubmitError, SubmitOptions,
};
use qwasi_engine::tokenizer::Tokenizer;
use qwasi_engine::weights::Weights;
use std::ops::ControlFlow;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use service_support::*;

#[tokio::test]
async fn tokens_match_a_direct_generate_call() {
    let (svc, m) = service(0, base_cfg());
    let cases = [
        // Greedy, stopping on EOS or the limit.
        GenerateRequest {
            ignore_eos: false,
            ..req(&[1, 2, 3, 4, 5], 24)
        },
        // Seeded sampling with logprobs and penalties.
        GenerateRequest {
            sampling: SamplingParams {
                temperature: 0.9,
                top_p: 0.95,
                seed: Some(1234),
                logprobs: Some(3),
                presence_penalty: 0.5,
                ..Default::default()
            },
            ..req(&[10, 20, 30], 16)
        },
        // A stop token that greedy decoding hits.
        GenerateRequest {
            stop_token_ids: vec![],
            ..req(&[7, 8, 9], 12)
        },
    ];
    for (i, mut r) in cases.into_iter().enumerate() {
        if i == 2 {
            // Stop on the 4th greedy token.
            let direct = generate(&*m, &r, |_, _| ControlFlow::Continue(())).unwrap();
            r.stop_token_ids = vec![direct.tokens[3]];
            r.max_tokens = 12;
        }
        let direct = generate(&*m, &r, |_, _| ControlFlow::Continue(())).unwrap();
        let mut h = svc
            .submit(r.clone(), SubmitOptions::default())
            .await
            .unwrap();
        let events = collect(&mut h).await;
        assert!(h.is_done());
        assert!(h.try_next().is_empty());
        assert_eq!(tokens(&events), direct.tokens, "case {i}");
        let logprobs: Vec<_> = events
            .iter()
            .filter_map(|e| match e {
                Event::Token { logprob, .. } => Some(logprob.clone()),
                _ => None,
            })
            .collect();
        for (lp, step) in logprobs.iter().zip(&direct.steps) {
            if r.sampling.logprobs.is_some() {
                assert_eq!(lp.as_ref(), Some(step));
            } else {
                assert!(lp.is_none());
            }
        }
        match events.last().unwrap() {
            Event::Finished {
                reason,
                usage,
                stop_token,
                trailing_text,
            } => {
                assert_eq!(*reason, direct.finish_reason, "case {i}");
                assert_eq!(*stop_token, direct.stop_token);
                assert_eq!(usage.prompt_tokens as usize, r.prompt.len());
                assert_eq!(usage.completion_tokens as usize, direct.steps.len());
                assert_eq!(usage.cached_tokens, 0);
                assert!(trailing_text.is_empty());
            }
            e => panic!("expected Finished, got {e:?}"),
        }
        if i == 2 {
            assert_eq!(direct.finish_reason, FinishReason::Stop);
        }
    }
}

#[tokio::test]
async fn events_stream_before_the_request_finishes() {
    let (svc, _) = service(20, base_cfg());
    let mut h = svc
        .submit(req(&[1, 2, 3], 10), SubmitOptions::default())
        .await
        .unwrap();
    h.wait().await;
    let first = h.try_next();
    assert!(matches!(first[0], Event::Token { .. }), "{first:?}");
    assert!(
        !first.iter().any(Event::is_terminal),
        "the whole request arrived at once"
    );
    assert!(!h.is_done());
    let mut batches = 1;
    let mut all = first;
    while !h.is_done() {
        h.wait().await;
        all.extend(h.try_next());
        batches += 1;
    }
    assert!(batches > 3, "events came in only {batches} batches");
    assert_eq!(all.len(), 11);
    assert!(all[..10].iter().all(|e| matches!(e, Event::Token { .. })));
    assert!(matches!(
        all[10],
        Event::Finished {
            reason: FinishReason::Length,
            ..
        }
    ));
    // After the terminal event: wait resolves at once, nothing more comes.
    tokio::time::timeout(Duration::from_secs(1), h.wait())
        .await
        .unwrap();
    assert!(h.try_next().is_empty());
}

#[tokio::test]
async fn full_queue_answers_429_with_retry_after() {
    let (svc, _) = service(
        20,
        ServiceConfig {
            max_queue: 1,
            ..base_cfg()
        },
    );
    let a = svc
        .submit(req(&[1, 2, 3], 1000), SubmitOptions::default())
        .await
        .unwrap();
    let s2 = svc.clone();
    let b = tokio::spawn(async move { s2.submit(req(&[4, 5], 2), SubmitOptions::default()).await });
    until(|| svc.stats().queued == 1).await;
    let stats = svc.stats();
    assert_eq!((stats.running, stats.capacity), (1, 1));
    let err = svc
        .submit(req(&[6], 2), SubmitOptions::default())
        .await
        .unwrap_err();
    assert!(
        matches!(err, SubmitError::QueueFull { retry_after_s } if retry_after_s >= 1),
        "{err:?}"
    );
    assert_eq!((err.code(), err.http_status()), ("queue_full", 429));
    assert!(err.retry_after_s().unwrap() >= 1);
    assert!(!err.to_string().is_empty());
    drop(a);
    let mut b = b.await.unwrap().unwrap();
    collect(&mut b).await;
    assert_eq!(svc.stats().rejected, 1);
    assert!(
        svc.metrics_text()
            .contains("qwasi_requests_rejected_total{reason=\"queue_full\"} 1")
    );
}

#[tokio::test]
async fn waiting_past_the_timeout_answers_503() {
    let cfg = ServiceConfig {
        queue_timeout: Duration::from_millis(150),
        ..base_cfg()
    };
    let (svc, _) = service(20, cfg);
    let a = svc
        .submit(req(&[1, 2, 3], 1000), SubmitOptions::default())
        .await
        .unwrap();
    let t = Instant::now();
    let err = svc
        .submit(req(&[4], 2), SubmitOptions::default())
        .await
        .unwrap_err();
    let waited = t.elapsed();
    assert_eq!(err, SubmitError::QueueTimeout);
    assert_eq!((err.code(), err.http_status()), ("queue_timeout", 503));
    assert!(
        waited >= Duration::from_millis(150) && waited < Duration::from_secs(2),
        "{waited:?}"
    );
    assert_eq!(
        svc.stats().queued,
        0,
        "the timed-out request is still queued"
    );
    drop(a);
    // The worker skips the abandoned request and serves the next one.
    let mut c = svc
        .submit(req(&[5], 2), SubmitOptions::default())
        .await
        .unwrap();
    assert_eq!(tokens(&collect(&mut c).await).len(), 2);
    let stats = svc.stats();
    assert_eq!(
        (stats.completed, stats.cancelled, stats.rejected),
        (1, 1, 1)
    );
    assert!(
        svc.metrics_text()
            .contains("qwasi_requests_rejected_total{reason=\"queue_timeout\"} 1")
    );
}

#[tokio::test]
async fn dropping_the_handle_cancels_within_a_step() {
    const STEP: u64 = 100;
    let forwards = Arc::new(AtomicUsize::new(0));
    let backend = TestBackend::new(model(), Duration::from_millis(STEP), forwards.clone(), None);
    let svc = EngineService::start(backend, None, "tiny".into(), base_cfg());
    let a = svc
        .submit(req(&[1, 2, 3], 1000), SubmitOptions::default())
        .await
        .unwrap();
    a.wait().await; // decoding has begun
    let s2 = svc.clone();
    let b = tokio::spawn(async move {
        let h = s2.submit(req(&[4, 5], 3), SubmitOptions::default()).await;
        (h, Instant::now())
    });
    until(|| svc.stats().queued == 1).await;
    let t = Instant::now();
    let at_cancel = forwards.load(Ordering::SeqCst);
    drop(a);
    let (h, started_at) = b.await.unwrap();
    let mut h = h.unwrap();
    let latency = started_at - t;
    // A ran at most the decode step in flight after the cancel (B's prefill
    // may have begun too) ...
    let after = forwards.load(Ordering::SeqCst) - at_cancel;
    assert!(
        after <= 1,
        "{after} forward passes between the cancel and B's start"
    );
    // ... so B started within about one step (plus scheduling slack on a
    // busy machine), not after A's 1000 tokens.
    assert!(
        latency < Duration::from_millis(STEP * 3),
        "the next request started {latency:?} after the cancel"
    );
    assert_eq!(tokens(&collect(&mut h).await).len(), 3);
    let stats = svc.stats();
    assert_eq!((stats.cancelled, stats.completed), (1, 1));
}

#[tokio::test]
async fn cancel_reports_cancelled_after_at_most_one_more_token() {
    let (svc, _) = service(30, base_cfg());
    let mut h = svc
        .submit(req(&[1, 2, 3], 1000), SubmitOptions::default())
        .await
        .unwrap();
    h.wait().await;
    let before = tokens(&h.try_next()).len();
    h.cancel();
    let rest = collect(&mut h).await;
    assert!(
        tokens(&rest).len() <= 1,
        "{} tokens after cancel",
        tokens(&rest).len()
    );
    match rest.last().unwrap() {
        Event::Finished { reason, usage, .. } => {
            assert_eq!(*reason, FinishReason::Cancelled);
            assert_eq!(
                usage.completion_tokens as usize,
                before + tokens(&rest).len()
            );
        }
        e => panic!("{e:?}"),
    }
}

#[tokio::test]
async fn dropping_submit_before_start_leaves_the_queue() {
    let (svc, _) = service(20, base_cfg());
    let a = svc
        .submit(req(&[1, 2, 3], 1000), SubmitOptions::default())
        .await
        .unwrap();
    let gone = tokio::time::timeout(
        Duration::from_millis(60),
        svc.submit(req(&[4], 5), SubmitOptions::default()),
    )
    .await;
    assert!(gone.is_err());
    assert_eq!(svc.stats().queued, 0);
    drop(a);
    let mut c = svc
        .submit(req(&[5], 2), SubmitOptions::default())
        .await
        .unwrap();
    collect(&mut c).await;
    let stats = svc.stats();
    // Only A (cancelled) and C ran; the dropped request never started.
    assert_eq!(
        (stats.cancelled, stats.completed, stats.rejected),
        (1, 1, 0)
    );
}

#[tokio::test]
async fn drain_refuses_new_requests_and_finishes_queued_ones() {
    let (svc, _) = service(20, base_cfg());
    let mut a = svc
        .submit(req(&[1, 2, 3], 8), SubmitOptions::default())
        .await
        .unwrap();
    let s2 = svc.clone();
    let b = tokio::spawn(async move {
        let mut h = s2
            .submit(req(&[4, 5], 4), SubmitOptions::default())
            .await
            .unwrap();
        collect(&mut h).await
    });
    until(|| svc.stats().queued == 1).await;
    svc.begin_drain();
    assert!(svc.stats().draining);
    let err = svc
        .submit(req(&[6], 2), SubmitOptions::default())
        .await
        .unwrap_err();
    assert_eq!(err, SubmitError::ShuttingDown);
    assert_eq!(
        (err.code(), err.http_status()),
        ("service_shutting_down", 503)
    );
    // Not drained while work remains.
    assert!(
        tokio::time::timeout(Duration::from_millis(30), svc.drained())
            .await
            .is_err()
    );
    let a_events = collect(&mut a).await;
    assert_eq!(tokens(&a_events).len(), 8);
    tokio::time::timeout(Duration::from_secs(10), svc.drained())
        .await
        .expect("drained() did not resolve");
    let b_events = b.await.unwrap();
    assert_eq!(tokens(&b_events).len(), 4);
    let stats = svc.stats();
    assert_eq!((stats.queued, stats.running, stats.completed), (0, 0, 2));
    assert!(
        svc.metrics_text()
            .contains("qwasi_requests_rejected_total{reason=\"shutting_down\"} 1")
    );
}

#[tokio::test]
async fn a_backend_panic_fails_one_request_and_the_worker_keeps_serving() {
    let (svc, _) = service(0, base_cfg());
    let mut h = svc
        .submit(req(&[1, PANIC_TOKEN, 3], 4), SubmitOptions::default())
        .await
        .unwrap();
    let events = collect(&mut h).await;
    match &events[..] {
        [Event::Failed(msg)] => assert!(msg.contains("panicked") && msg.contains("magic"), "{msg}"),
        e => panic!("{e:?}"),
    }
    let mut h = svc
        .submit(req(&[1, ERROR_TOKEN, 3], 4), SubmitOptions::default())
        .await
        .unwrap();
    match &collect(&mut h).await[..] {
        [Event::Failed(msg)] => assert!(msg.contains("magic token 43"), "{msg}"),
        e => panic!("{e:?}"),
    }
    let mut h = svc
        .submit(req(&[1, 2, 3], 4), SubmitOptions::default())
        .await
        .unwrap();
    assert_eq!(tokens(&collect(&mut h).await).len(), 4);
    let stats = svc.stats();
    assert_eq!((stats.failed, stats.completed, stats.running), (2, 1, 0));
    assert!(
        svc.metrics_text()
            .contains("qwasi_requests_finished_total{reason=\"failed\"} 2")
    );
}

#[tokio::test]
async fn invalid_requests_are_refused_with_the_right_error() {
    let cfg = ServiceConfig {
        max_model_len: 64,
        ..base_cfg()
    };
    let (svc, _) = service(0, cfg);
    assert_eq!(svc.max_model_len(), 64);
    assert_eq!(svc.model_id(), "tiny");
    assert_eq!(svc.model_config().vocab_size, 300);
    let check = |r: GenerateRequest, code: &str, needle: &str| {
        let e = svc.validate(&r).unwrap_err();
        assert_eq!(e.code(), code, "{e}");
        assert_eq!(e.http_status(), 400);
        assert!(e.to_string().contains(needle), "{e}");
    };
    check(req(&[1, 300], 4), "invalid_request_error", "300");
    check(req(&[], 4), "invalid_request_error", "at least one token");
    check(
        GenerateRequest {
            stop_token_ids: vec![1000],
            ..req(&[1], 4)
        },
        "invalid_request_error",
        "1000",
    );
    check(
        GenerateRequest {
            sampling: SamplingParams {
                top_p: 2.0,
                ..Default::default()
            },
            ..req(&[1], 4)
        },
        "invalid_request_error",
        "top_p",
    );
    check(req(&[1; 60], 10), "context_length_exceeded", "64");
    check(req(&[1; 64], 0), "context_length_exceeded", "64");
    // Through submit too, and nothing is queued or counted as rejected.
    let e = svc
        .submit(req(&[1; 70], 1), SubmitOptions::default())
        .await
        .unwrap_err();
    assert!(matches!(e, SubmitError::ContextLengthExceeded(_)), "{e:?}");
    assert_eq!(
        svc.stats(),
        qwasi_engine::service::QueueStats {
            capacity: 8,
            ..Default::default()
        }
    );
    // Exactly at the limit is fine.
    let mut h = svc
        .submit(req(&[1; 60], 4), SubmitOptions::default())
        .await
        .unwrap();
    assert_eq!(tokens(&collect(&mut h).await).len(), 4);

    // Operator caps.
    let (svc, _) = service(
        0,
        ServiceConfig {
            max_prompt_tokens: 8,
            max_completion_tokens: 16,
            ..base_cfg()
        },
    );
    let e = svc.validate(&req(&[1; 9], 4)).unwrap_err();
    assert_eq!(e.code(), "context_length_exceeded", "{e}");
    let e = svc.validate(&req(&[1; 8], 17)).unwrap_err();
    assert_eq!(e.code(), "invalid_request_error", "{e}");
    svc.validate(&req(&[1; 8], 16)).unwrap();
}

#[tokio::test]
async fn max_tokens_zero_finishes_at_once() {
    let (svc, _) = service(0, base_cfg());
    let mut h = svc
        .submit(req(&[1, 2], 0), SubmitOptions::default())
        .await
        .unwrap();
    match &collect(&mut h).await[..] {
        [Event::Finished { reason, usage, .. }] => {
            assert_eq!(*reason, FinishReason::Length);
            assert_eq!((usage.prompt_tokens, usage.completion_tokens), (2, 0));
        }
        e => panic!("{e:?}"),
    }
}

#[tokio::test]
async fn detokenized_text_matches_the_tokenizer() {
    let tok = Tokenizer::qwen36().unwrap();
    let backend = TestBackend::new(model(), Duration::ZERO, Arc::default(), None);
    let svc = EngineService::start(backend, Some(tok.clone()), "tiny".into(), base_cfg());
    let r = GenerateRequest {
        sampling: SamplingParams {
            temperature: 1.0,
            seed: Some(5),
            ..Default::default()
        },
        ..req(&[200, 201, 202], 40)
    };
    let opts = SubmitOptions {
        detokenize: true,
        ..Default::default()
    };
    let mut h = svc.submit(r, opts).await.unwrap();
    let events = collect(&mut h).await;
    let mut text = String::new();
    for e in &events {
        match e {
            Event::Token { text: t, .. } => text.push_str(t),
            Event::Finished { trailing_text, .. } => text.push_str(trailing_text),
            Event::Failed(m) => panic!("{m}"),
        }
    }
    assert_eq!(text, tok.decode(&tokens(&events), true).unwrap());
    assert!(!text.is_empty());

    // Without detokenize the text stays empty.
    let mut h = svc
        .submit(req(&[1], 3), SubmitOptions::default())
        .await
        .unwrap();
    for e in collect(&mut h).await {
        if let Event::Token { text, .. } = e {
            assert!(text.is_empty());
        }
    }
}

#[tokio::test]
async fn a_request_outlives_the_service_handle() {
    let (svc, _) = service(5, base_cfg());
    let mut h = svc
        .submit(req(&[1, 2, 3], 6), SubmitOptions::default())
        .await
        .unwrap();
    drop(svc);
    assert_eq!(tokens(&collect(&mut h).await).len(), 6);
}

#[test]
fn the_api_is_send() {
    fn send<T: Send>(_: &T) {}
    fn sync<T: Send + Sync>() {}
    let (svc, _) = service(0, base_cfg());
    send(&svc.submit(req(&[1], 1), SubmitOptions::default()));
    send(&svc.drained());
    sync::<GenerationHandle>();
    sync::<EngineService>();
}
