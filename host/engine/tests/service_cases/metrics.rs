//! The Prometheus text the service exposes.

use super::*;

#[tokio::test]
async fn metrics_text_has_every_family_with_sane_values() {
    let (svc, _) = service(2, base_cfg());
    for (p, n) in [(&[1u32, 2, 3][..], 5usize), (&[4, 5][..], 3)] {
        let mut h = svc
            .submit(req(p, n), SubmitOptions::default())
            .await
            .unwrap();
        collect(&mut h).await;
        svc.record_http(200);
    }
    svc.record_http(429);
    let text = svc.metrics_text();
    for (family, kind) in [
        ("qwasi_queue_depth", "gauge"),
        ("qwasi_requests_running", "gauge"),
        ("qwasi_requests_total", "counter"),
        ("qwasi_requests_rejected_total", "counter"),
        ("qwasi_prompt_tokens_total", "counter"),
        ("qwasi_completion_tokens_total", "counter"),
        ("qwasi_prefix_cache_hits_total", "counter"),
        ("qwasi_prefix_cache_misses_total", "counter"),
        ("qwasi_time_to_first_token_seconds", "histogram"),
        ("qwasi_inter_token_latency_seconds", "histogram"),
        ("qwasi_request_duration_seconds", "histogram"),
        ("qwasi_first_token_phase_seconds_total", "counter"),
    ] {
        assert!(
            text.contains(&format!("# HELP {family} ")),
            "no HELP for {family}"
        );
        assert!(
            text.contains(&format!("# TYPE {family} {kind}\n")),
            "no TYPE for {family}"
        );
    }
    assert_eq!(sample(&text, "qwasi_queue_depth"), 0.0);
    assert_eq!(sample(&text, "qwasi_requests_running"), 0.0);
    assert_eq!(sample(&text, "qwasi_requests_total{status=\"200\"}"), 2.0);
    assert_eq!(sample(&text, "qwasi_requests_total{status=\"429\"}"), 1.0);
    assert_eq!(sample(&text, "qwasi_prompt_tokens_total"), 5.0);
    assert_eq!(sample(&text, "qwasi_completion_tokens_total"), 8.0);
    assert_eq!(sample(&text, "qwasi_prefix_cache_hits_total"), 0.0);
    assert_eq!(sample(&text, "qwasi_prefix_cache_misses_total"), 0.0);
    assert_eq!(
        sample(
            &text,
            "qwasi_requests_rejected_total{reason=\"queue_full\"}"
        ),
        0.0
    );
    // Before the first tokens: two prefills of a forward that sleeps 2 ms
    // each, within the TTFTs; no prefix cache, so no lookup, restore or snapshot.
    let phase = |p: &str| {
        sample(
            &text,
            &format!("qwasi_first_token_phase_seconds_total{{phase=\"{p}\"}}"),
        )
    };
    let prefill = phase("prefill");
    assert!(prefill >= 0.004, "{prefill}");
    assert!(prefill + phase("sample") <= sample(&text, "qwasi_time_to_first_token_seconds_sum"));
    for p in ["lookup", "restore", "snapshot"] {
        assert_eq!(phase(p), 0.0, "{p}");
    }
    // Histograms: cumulative buckets ending in +Inf == _count, sane sums.
    for (h, count) in [
        ("qwasi_time_to_first_token_seconds", 2.0),
        ("qwasi_inter_token_latency_seconds", 6.0),
        ("qwasi_request_duration_seconds", 2.0),
    ] {
        let buckets: Vec<f64> = text
            .lines()
            .filter(|l| l.starts_with(&format!("{h}_bucket{{")))
            .map(|l| l.rsplit(' ').next().unwrap().parse().unwrap())
            .collect();
        assert!(buckets.len() > 5);
        assert!(
            buckets.windows(2).all(|w| w[0] <= w[1]),
            "{h} buckets not cumulative"
        );
        assert_eq!(
            sample(&text, &format!("{h}_bucket{{le=\"+Inf\"}}")),
            count,
            "{h}"
        );
        assert_eq!(sample(&text, &format!("{h}_count")), count, "{h}");
        let sum = sample(&text, &format!("{h}_sum"));
        assert!(sum > 0.0 && sum < 60.0, "{h}_sum = {sum}");
    }
    // Engine steps by phase: each request's prompt in one step, then one
    // decode step per further token (the 6 inter-token gaps), each forward
    // sleeping 2 ms; the two series are rendered as one family.
    assert!(text.contains("# TYPE qwasi_step_duration_seconds histogram\n"));
    let step = |phase: &str, what: &str| {
        sample(
            &text,
            &format!("qwasi_step_duration_seconds_{what}{{phase=\"{phase}\"}}"),
        )
    };
    for (phase, steps) in [("prompt", 2.0), ("decode", 6.0)] {
        assert_eq!(step(phase, "count"), steps, "{phase}");
        let sum = step(phase, "sum");
        assert!(sum >= 0.002 * steps && sum < 60.0, "{phase}: {sum}");
        assert_eq!(
            sample(
                &text,
                &format!("qwasi_step_duration_seconds_bucket{{phase=\"{phase}\",le=\"+Inf\"}}")
            ),
            steps
        );
    }
    // Each forward sleeps 2 ms, so no inter-token latency is below 1 ms.
    assert_eq!(
        sample(
            &text,
            "qwasi_inter_token_latency_seconds_bucket{le=\"0.001\"}"
        ),
        0.0
    );
    let ttft_le_1ms = sample(
        &text,
        "qwasi_time_to_first_token_seconds_bucket{le=\"0.001\"}",
    );
    assert_eq!(ttft_le_1ms, 0.0);
}
