//! How much of the logits each request reads, and the prefix cache behind
//! a device readout.

use super::*;

/// Calls per request of `forward`, `forward_greedy`, `forward_top` and
/// `forward_weighted` when the prefill and `steps` decode steps are read as
/// `path`.
fn expected_calls(path: Readout, steps: usize) -> [usize; 4] {
    // The prompt is read the same way as each decode step.
    let n = steps + 1;
    match path {
        Readout::Logits => [n, 0, 0, 0],
        Readout::Greedy => [0, n, 0, 0],
        Readout::Top => [0, 0, n, 0],
        Readout::Weighted => [0, 0, 0, n],
    }
}

/// A device-reading test backend and its counters in [`expected_calls`]' order.
fn counting_backend() -> (TestBackend, [Arc<AtomicUsize>; 4]) {
    let (forwards, picked) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let b = TestBackend::new(
        model(),
        Duration::ZERO,
        forwards.clone(),
        Some(picked.clone()),
    );
    let counters = [forwards, picked, b.tops.clone(), b.weighted.clone()];
    (b, counters)
}

/// The counts since the last call.
fn take_calls(counters: &[Arc<AtomicUsize>; 4]) -> [usize; 4] {
    [0, 1, 2, 3].map(|i| counters[i].swap(0, Ordering::SeqCst))
}

#[tokio::test]
async fn requests_read_as_little_of_the_logits_as_their_sampling_needs() {
    let (backend, counters) = counting_backend();
    let svc = EngineService::start(backend, None, "tiny".into(), base_cfg());
    let (host, _) = service(0, base_cfg());
    let prompt: Vec<u32> = (1..40).collect();
    let with = |f: fn(&mut SamplingParams)| {
        let mut s = SamplingParams::default();
        f(&mut s);
        s
    };
    let sampled = |f: fn(&mut SamplingParams)| {
        let mut s = SamplingParams {
            temperature: 0.8,
            seed: Some(3),
            ..Default::default()
        };
        f(&mut s);
        s
    };
    let cases = [
        (SamplingParams::default(), Readout::Greedy),
        (with(|s| s.logprobs = Some(0)), Readout::Greedy),
        (with(|s| s.logprobs = Some(3)), Readout::Top),
        (with(|s| s.repetition_penalty = 1.3), Readout::Logits),
        (with(|s| s.presence_penalty = 0.5), Readout::Logits),
        (with(|s| s.logit_bias = vec![(5, 2.0)]), Readout::Logits),
        (sampled(|_| {}), Readout::Weighted),
        (
            sampled(|s| {
                s.min_p = 0.1;
                s.logprobs = Some(4);
            }),
            Readout::Weighted,
        ),
        (sampled(|s| s.top_p = 0.9), Readout::Weighted),
        (
            sampled(|s| {
                s.top_p = 0.5;
                s.repetition_penalty = 1.1;
            }),
            Readout::Logits,
        ),
        (sampled(|s| s.top_k = 20), Readout::Top),
        (
            sampled(|s| {
                s.top_k = 40;
                s.top_p = 0.9;
                s.min_p = 0.05;
                s.logprobs = Some(5);
            }),
            Readout::Top,
        ),
        (sampled(|s| s.top_k = 65), Readout::Logits),
        (
            sampled(|s| {
                s.top_k = 20;
                s.frequency_penalty = 0.3;
            }),
            Readout::Logits,
        ),
    ];
    for (sampling, path) in cases {
        let mut r = req(&prompt, 6);
        r.sampling = sampling.clone();
        take_calls(&counters);
        let mut h = svc
            .submit(r.clone(), SubmitOptions::default())
            .await
            .unwrap();
        let got = collect(&mut h).await;
        let mut h = host.submit(r, SubmitOptions::default()).await.unwrap();
        let want = collect(&mut h).await;
        // Same tokens, logprobs and ending as sampling from the full logits.
        assert_eq!(got, want, "{sampling:?}");
        assert_eq!(tokens(&got).len(), 6);
        assert_eq!(
            take_calls(&counters),
            expected_calls(path, 5),
            "{sampling:?}"
        );
    }
}

#[test]
fn generate_reads_as_little_of_the_logits_as_its_sampling_needs() {
    let (backend, counters) = counting_backend();
    let m = model();
    for (temperature, top_k, logprobs, path) in [
        (0.0, 0, None, Readout::Greedy),
        (0.0, 0, Some(2), Readout::Top),
        (0.7, 10, Some(2), Readout::Top),
        (0.7, 0, None, Readout::Weighted),
    ] {
        let mut r = GenerateRequest {
            ignore_eos: false,
            ..req(&[1, 2, 3, 4, 5], 10)
        };
        r.sampling.temperature = temperature;
        r.sampling.top_k = top_k;
        r.sampling.logprobs = logprobs;
        r.sampling.seed = Some(11);
        take_calls(&counters);
        let got = generate(&backend, &r, |_, _| ControlFlow::Continue(())).unwrap();
        let want = generate(&*m, &r, |_, _| ControlFlow::Continue(())).unwrap();
        assert_eq!(got.tokens, want.tokens);
        assert_eq!(got.steps, want.steps);
        assert_eq!(
            take_calls(&counters),
            expected_calls(path, got.steps.len() - 1),
            "{r:?}"
        );
    }
}

/// `prompt` submitted to `svc` for `max_tokens` tokens, every event collected.
async fn run(svc: &EngineService, prompt: &[u32], max_tokens: usize) -> Vec<Event> {
    collect(
        &mut svc
            .submit(req(prompt, max_tokens), SubmitOptions::default())
            .await
            .unwrap(),
    )
    .await
}

/// The prompt tokens a finished request took from the prefix cache.
fn cached_tokens(events: &[Event]) -> usize {
    match events.last() {
        Some(Event::Finished { usage, .. }) => usage.cached_tokens as usize,
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn a_greedy_turn_decoded_on_the_device_still_caches_its_end() {
    let cfg = ServiceConfig {
        prefix_cache_bytes: 64 << 20,
        ..base_cfg()
    };
    let backend = TestBackend::new(
        model(),
        Duration::ZERO,
        Arc::default(),
        Some(Arc::default()),
    );
    let svc = EngineService::start(backend, None, "tiny".into(), cfg.clone());
    let (host, _) = service(0, cfg);
    let prompt: Vec<u32> = (1..40).collect();
    let first = run(&svc, &prompt, 5).await;
    // The end-of-generation snapshot (no logits: none came back) is there.
    let cache = svc.prefix_cache().unwrap();
    let mut end = prompt.clone();
    end.extend(&tokens(&first)[..4]);
    assert!(cache.contains(None, &end));
    assert!(!cache.contains_with_logits(None, &end));
    // The prompt's end, whose first token was drawn on the device too, has
    // the logits the backend kept: resending the prompt is a full hit with
    // the same tokens.
    assert!(cache.contains_with_logits(None, &prompt));
    let again = run(&svc, &prompt, 5).await;
    assert_eq!(tokens(&again), tokens(&first));
    assert_eq!(cached_tokens(&again), prompt.len());
    assert_eq!(
        sample(&svc.metrics_text(), "qwasi_prefix_cache_full_hits_total"),
        1.0
    );
    // The next turn resumes from it and matches the host path's run.
    let mut turn = end.clone();
    turn.extend([tokens(&first)[4], 7, 8, 9]);
    let got = run(&svc, &turn, 5).await;
    let want = run(&host, &turn, 5).await;
    assert_eq!(tokens(&got), tokens(&want));
    assert_eq!(cached_tokens(&got), end.len());
}
