//! The prefix cache over the real CPU model (a tiny seeded one): exactness of
//! resumed requests against cold runs at many split points, transactions
//! (failure, panic, cancellation leave the cache unchanged), eviction, salt
//! isolation, concurrency, metrics, and page accounting (no leaks).

use qwasi_engine::backend::Backend;
use qwasi_engine::cpu::attention::PAGE_TOKENS;
use qwasi_engine::cpu::gdn::CHUNK;
use qwasi_engine::generate::{FinishReason, GenerateRequest};
use qwasi_engine::sampling::log_softmax;
use qwasi_engine::service::{Event, ServiceConfig, SubmitOptions};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

mod prefix_cache_support;
use prefix_cache_support::*;

#[tokio::test]
async fn resumed_requests_match_cold_runs_at_many_split_points() {
    let h = Harness::new(64 * MIB, 0, 0);
    let full = prompt(300, 1);
    let r = req(&full, 8);
    let (cold_tokens, cold_steps) = cold(&h.model, &r);
    // Inside a GDN chunk, at chunk/page boundaries (64, 128, 256) and ±1.
    assert_eq!(CHUNK, 64);
    assert_eq!(PAGE_TOKENS, 64);
    for split in [
        1, 2, 37, 63, 64, 65, 100, 127, 128, 129, 200, 255, 256, 257, 299,
    ] {
        h.cache().clear();
        // Warm: a request whose prompt is the first `split` tokens.
        let warm = h
            .run(&req(&full[..split], 1), SubmitOptions::default())
            .await;
        assert_eq!(warm.usage().cached_tokens, 0);
        assert_eq!(h.cache().stats().snapshots, 1, "split {split}");
        let got = h.run(&r, SubmitOptions::default()).await;
        assert_eq!(got.usage().cached_tokens as usize, split, "split {split}");
        assert_same(&format!("split {split}"), &got, &cold_tokens, &cold_steps);
    }
}

#[tokio::test]
async fn snapshots_directly_on_the_model_are_copy_on_write() {
    let m = model();
    let toks = prompt(200, 2);
    let mut seq = m.new_sequence();
    m.forward(&mut seq, &toks[..100]).unwrap();
    let snap = m.snapshot(&seq).unwrap();
    assert_eq!(snap.position(), 100);
    let pages_before = snap.pages();
    // The running sequence continues past the snapshot (into its shared
    // partial page): the snapshot must not change.
    let a = m.forward(&mut seq, &toks[100..150]).unwrap();
    assert_eq!(snap.pages(), pages_before);
    let mut resumed = m.restore(&*snap).unwrap();
    assert_eq!(resumed.position(), 100);
    let b = m.forward(&mut resumed, &toks[100..150]).unwrap();
    assert_eq!(a, b, "resumed sequence diverges");
    // And again from the same snapshot.
    let mut again = m.restore(&*snap).unwrap();
    let c = m.forward(&mut again, &toks[100..150]).unwrap();
    assert_eq!(a, c);
    // A cold run agrees exactly (the recurrence runs token by token, so the
    // split point changes no sum).
    let mut coldseq = m.new_sequence();
    let d = m.forward(&mut coldseq, &toks[..150]).unwrap();
    let (la, ld) = (log_softmax(&a), log_softmax(&d));
    let err = la
        .iter()
        .zip(&ld)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max);
    assert!(
        err <= LOGPROB_TOL,
        "cold vs resumed logprobs differ by {err}"
    );
    drop((seq, resumed, again, coldseq, snap));
    assert_eq!(m.page_stats().live_pages(), 0);
    assert_eq!(m.page_stats().live_bytes(), 0);
}

#[tokio::test]
async fn conversation_turns_hit_the_previous_turn_and_intervals_split_prefill() {
    let h = Harness::new(64 * MIB, 64, 0);
    let turn1 = prompt(150, 3);
    let a = h.run(&req(&turn1, 6), SubmitOptions::default()).await;
    assert_eq!(a.reason(), Some(FinishReason::Length));
    // Snapshots at 64, 128 (interval), 150 (prompt end), 155 (generation end:
    // the last sampled token is not run).
    let positions: Vec<usize> = h.dump().iter().map(|e| e.2).collect();
    assert_eq!(positions, vec![64, 128, 150, 155]);
    // Next turn: prompt + answer + new tokens.
    let mut turn2 = turn1.clone();
    turn2.extend(&a.tokens);
    turn2.extend(prompt(40, 4));
    let r2 = req(&turn2, 6);
    let b = h.run(&r2, SubmitOptions::default()).await;
    assert_eq!(b.usage().cached_tokens, 155);
    let (ct, cs) = cold(&h.model, &r2);
    assert_same("turn 2", &b, &ct, &cs);
    // Guest-marked points become snapshots too.
    h.cache().clear();
    let r3 = req(&prompt(90, 5), 1);
    let opts = SubmitOptions {
        snapshot_points: vec![10, 33, 500],
        ..Default::default()
    };
    h.run(&r3, opts).await;
    let positions: Vec<usize> = h.dump().iter().map(|e| e.2).collect();
    assert_eq!(positions, vec![10, 33, 64, 90]);
    let metrics = h.svc.metrics_text();
    assert!(
        metrics.contains("qwasi_prefix_cache_hits_total 1\n"),
        "{metrics}"
    );
    assert!(
        metrics.contains("qwasi_prefix_cache_misses_total 2\n"),
        "{metrics}"
    );
    assert!(
        metrics.contains("qwasi_prefix_cache_tokens_saved_total 155\n"),
        "{metrics}"
    );
    // Every step before a first token ran (a hit, fresh prefills, snapshots).
    for p in ["lookup", "restore", "prefill", "snapshot", "sample"] {
        let series = format!("qwasi_first_token_phase_seconds_total{{phase=\"{p}\"}} ");
        let v: f64 = metrics
            .lines()
            .find_map(|l| l.strip_prefix(&series))
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no {series}in {metrics}"));
        assert!(v > 0.0, "{p}: {v}");
    }
    // The CPU backend resumes in shared copy-on-write pages, never in place.
    assert!(
        metrics.contains("qwasi_prefix_cache_resumed_in_place_total 0\n"),
        "{metrics}"
    );
    assert!(
        metrics.contains("qwasi_prefix_cache_snapshots 4\n"),
        "{metrics}"
    );
    assert!(
        metrics.contains("qwasi_prefix_cache_evictions_total 0\n"),
        "{metrics}"
    );
    let bytes = h.cache().stats().bytes;
    assert!(metrics.contains(&format!("qwasi_prefix_cache_bytes {bytes}\n")));
}

#[tokio::test]
async fn a_b_a_sequences_do_not_cross_talk() {
    let h = Harness::new(64 * MIB, 32, 0);
    let shared = prompt(70, 6);
    let mut pa = shared.clone();
    pa.extend(prompt(50, 7));
    let mut pb = shared.clone();
    pb.extend(prompt(60, 8));
    let (ra, rb) = (req(&pa, 10), req(&pb, 10));
    let (cat, cas) = cold(&h.model, &ra);
    let (cbt, cbs) = cold(&h.model, &rb);
    let a1 = h.run(&ra, SubmitOptions::default()).await;
    assert_same("A1", &a1, &cat, &cas);
    let b = h.run(&rb, SubmitOptions::default()).await;
    assert_eq!(
        b.usage().cached_tokens,
        64,
        "B resumes from the shared interval snapshot"
    );
    assert_same("B", &b, &cbt, &cbs);
    let a2 = h.run(&ra, SubmitOptions::default()).await;
    assert!(a2.usage().cached_tokens >= 96, "{:?}", a2.usage());
    assert_same("A2", &a2, &cat, &cas);
    let b2 = h.run(&rb, SubmitOptions::default()).await;
    assert_same("B2", &b2, &cbt, &cbs);
}

#[tokio::test]
async fn failures_leave_the_cache_unchanged() {
    let h = Harness::new(64 * MIB, 32, 0);
    let base = prompt(100, 9);
    h.run(&req(&base, 4), SubmitOptions::default()).await;
    let before = h.dump();
    let stats = h.cache().stats();
    let nodes = h.cache().node_count();
    let live = h.model.page_stats().live_pages();
    assert!(!before.is_empty());
    let mut longer = base.clone();
    longer.extend(prompt(100, 10));
    for panic in [false, true] {
        h.panic.store(panic, Ordering::SeqCst);
        // Mid-prefill: after the resumed prefix and two interval snapshots.
        for fail_pos in [170, 200 + 3] {
            h.fail_pos.store(fail_pos, Ordering::SeqCst);
            let out = h.run(&req(&longer, 8), SubmitOptions::default()).await;
            assert!(matches!(out.end, Event::Failed(_)), "{:?}", out.end);
            assert_eq!(h.dump(), before, "panic={panic} fail_pos={fail_pos}");
            assert_eq!(h.cache().stats(), stats);
            assert_eq!(h.cache().node_count(), nodes);
            assert_eq!(h.model.page_stats().live_pages(), live, "pages leaked");
        }
    }
    h.fail_pos.store(usize::MAX, Ordering::SeqCst);
    // The same request now succeeds and matches a cold run.
    let r = req(&longer, 8);
    let out = h.run(&r, SubmitOptions::default()).await;
    assert!(out.usage().cached_tokens >= 96);
    let (ct, cs) = cold(&h.model, &r);
    assert_same("after failures", &out, &ct, &cs);
    assert!(h.dump().len() > before.len());
}

#[tokio::test]
async fn cancellation_leaves_the_cache_unchanged() {
    let h = Harness::new(64 * MIB, 16, 5);
    let base = prompt(40, 12);
    h.run(&req(&base, 2), SubmitOptions::default()).await;
    let before = h.dump();
    let live = h.model.page_stats().live_pages();
    let mut longer = base.clone();
    longer.extend(prompt(200, 13));
    // Cancelled during decode.
    let mut hd = h
        .svc
        .submit(req(&longer, 1000), SubmitOptions::default())
        .await
        .unwrap();
    hd.wait().await;
    hd.cancel();
    let out = collect(&mut hd).await;
    assert_eq!(out.reason(), Some(FinishReason::Cancelled));
    assert_eq!(h.dump(), before);
    // Cancelled during a split prefill (dropping the handle cancels).
    let f0 = h.forwards.load(Ordering::SeqCst);
    let hp = h
        .svc
        .submit(req(&longer, 1000), SubmitOptions::default())
        .await
        .unwrap();
    while h.forwards.load(Ordering::SeqCst) < f0 + 2 {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    drop(hp);
    // The next request runs after it; the cache is as before (the same
    // prompt as the first request: a full hit on its end snapshot).
    let r = req(&base, 2);
    let out = h.run(&r, SubmitOptions::default()).await;
    assert_eq!(out.usage().cached_tokens, 40);
    assert_eq!(h.dump(), before);
    assert_eq!(h.model.page_stats().live_pages(), live);
}

#[tokio::test]
async fn eviction_keeps_the_budget_and_frees_pages() {
    // Measure one snapshot of a 64-token prompt, then allow about three.
    let probe = Harness::new(64 * MIB, 0, 0);
    probe
        .run(&req(&prompt(64, 20), 1), SubmitOptions::default())
        .await;
    let one = probe.cache().stats().bytes;
    drop(probe);
    let h = Harness::new(3 * one + one / 2, 0, 0);
    let prompts: Vec<Vec<u32>> = (0..6).map(|i| prompt(64, 30 + i)).collect();
    for p in &prompts {
        h.run(&req(p, 1), SubmitOptions::default()).await;
        let s = h.cache().stats();
        assert!(s.bytes <= s.budget, "{s:?}");
    }
    let s = h.cache().stats();
    assert_eq!(s.snapshots, 3);
    assert_eq!(s.evictions, 3);
    // LRU: the last three are cached, the first three are not.
    let keys: Vec<Vec<u32>> = h.dump().into_iter().map(|e| e.1).collect();
    for (i, p) in prompts.iter().enumerate() {
        assert_eq!(keys.contains(p), i >= 3, "prompt {i}");
    }
    // Using an old snapshot refreshes it: hit prompt 3, add one more; 4 goes.
    let mut p3 = prompts[3].clone();
    p3.push(5);
    let out = h.run(&req(&p3, 1), SubmitOptions::default()).await;
    assert_eq!(out.usage().cached_tokens, 64);
    let keys: Vec<Vec<u32>> = h.dump().into_iter().map(|e| e.1).collect();
    assert!(keys.contains(&prompts[3]));
    assert!(!keys.contains(&prompts[4]));
    // Clearing frees every page (nothing else holds any).
    h.cache().clear();
    assert_eq!(h.cache().stats().bytes, 0);
    assert_eq!(h.cache().node_count(), 0);
    assert_eq!(h.model.page_stats().live_pages(), 0);
}

#[tokio::test]
async fn shared_pages_are_counted_once() {
    let h = Harness::new(64 * MIB, 64, 0);
    h.run(&req(&prompt(256, 40), 1), SubmitOptions::default())
        .await;
    // Snapshots at 64, 128, 192, 256 share their leading pages.
    let s = h.cache().stats();
    assert_eq!(s.snapshots, 4);
    assert_eq!(s.pages, 4, "one attention layer, four distinct pages");
    assert_eq!(h.model.page_stats().live_pages(), 4);
    let page_bytes = h.model.page_stats().live_bytes();
    let private: usize = h.dump().iter().map(|e| e.3).sum();
    assert_eq!(s.bytes, page_bytes + private);
}

/// `qwasi_prefix_cache_resumed_in_place_total` counts the hits (partial and
/// full) whose restored sequence the backend says resumed in place, and
/// nothing on a miss.
#[tokio::test]
async fn in_place_resumes_are_counted_per_hit() {
    let h = Harness::new(64 * MIB, 0, 0);
    h.in_place.store(true, Ordering::SeqCst);
    let base = prompt(60, 60);
    let mut longer = base.clone();
    longer.extend(prompt(10, 61));
    let count = || {
        let m = h.svc.metrics_text();
        let line = m
            .lines()
            .find(|l| l.starts_with("qwasi_prefix_cache_resumed_in_place_total "))
            .unwrap_or_else(|| panic!("no in-place counter in {m}"))
            .to_string();
        line.rsplit(' ').next().unwrap().parse::<u64>().unwrap()
    };
    h.run(&req(&base, 1), SubmitOptions::default()).await;
    assert_eq!(count(), 0, "a miss");
    let out = h.run(&req(&longer, 1), SubmitOptions::default()).await;
    assert_eq!(out.usage().cached_tokens, 60);
    assert_eq!(count(), 1, "a partial hit");
    let out = h.run(&req(&longer, 1), SubmitOptions::default()).await;
    assert_eq!(out.usage().cached_tokens, 70);
    assert_eq!(count(), 2, "a full hit");
    h.run(&req(&prompt(30, 62), 1), SubmitOptions::default())
        .await;
    assert_eq!(count(), 2, "another miss");
}

#[tokio::test]
async fn salts_isolate_tenants() {
    let h = Harness::new(64 * MIB, 0, 0);
    let base = prompt(80, 50);
    let mut longer = base.clone();
    longer.extend(prompt(20, 51));
    h.run(&req(&base, 1), salted("a")).await;
    let out = h.run(&req(&longer, 1), salted("b")).await;
    assert_eq!(out.usage().cached_tokens, 0);
    let out = h.run(&req(&longer, 1), SubmitOptions::default()).await;
    assert_eq!(out.usage().cached_tokens, 0);
    let out = h.run(&req(&longer, 1), salted("a")).await;
    assert_eq!(out.usage().cached_tokens, 80);
}

#[tokio::test]
async fn concurrent_requests_match_cold_runs() {
    let h = Arc::new(Harness::new(64 * MIB, 32, 0));
    let shared = prompt(50, 60);
    let reqs: Vec<GenerateRequest> = (0..6)
        .map(|i| {
            let mut p = shared.clone();
            p.extend(prompt(10 + 7 * i, 61 + (i as u64 % 3)));
            req(&p, 6)
        })
        .collect();
    let colds: Vec<_> = reqs.iter().map(|r| cold(&h.model, r)).collect();
    for _round in 0..2 {
        let mut tasks = Vec::new();
        for r in &reqs {
            let h = h.clone();
            let r = r.clone();
            tasks.push(tokio::spawn(async move {
                h.run(&r, SubmitOptions::default()).await
            }));
        }
        for (i, t) in tasks.into_iter().enumerate() {
            let out = t.await.unwrap();
            assert_same(&format!("request {i}"), &out, &colds[i].0, &colds[i].1);
        }
    }
    let m = h.svc.metrics_text();
    assert!(!m.contains("qwasi_prefix_cache_hits_total 0\n"), "{m}");
    h.cache().clear();
    assert_eq!(h.model.page_stats().live_pages(), 0);
}

#[tokio::test]
async fn cache_off_and_backends_without_snapshots() {
    let h = Harness::new(0, 64, 0);
    assert!(h.svc.prefix_cache().is_none());
    let r = req(&prompt(100, 70), 4);
    let out = h.run(&r, SubmitOptions::default()).await;
    assert_eq!(out.usage().cached_tokens, 0);
    let (ct, cs) = cold(&h.model, &r);
    assert_same("off", &out, &ct, &cs);
    assert!(
        h.svc
            .metrics_text()
            .contains("qwasi_prefix_cache_misses_total 0\n")
    );
}

#[tokio::test]
async fn an_identical_prompt_is_a_full_hit_with_no_prefill() {
    let h = Harness::new(64 * MIB, 64, 0);
    let p = prompt(150, 80);
    let r = req(&p, 8);
    let (ct, cs) = cold(&h.model, &r);
    let first = h.run(&r, SubmitOptions::default()).await;
    assert_eq!(first.usage().cached_tokens, 0);
    assert_same("first", &first, &ct, &cs);
    // The prompt-end and generation-end snapshots carry logits (VOCAB f32),
    // the interval ones do not.
    let with_logits: Vec<(usize, usize)> = h
        .dump()
        .iter()
        .filter(|e| e.4)
        .map(|e| (e.2, e.3))
        .collect();
    let state_bytes = h.dump()[0].3;
    let logit_bytes = VOCAB as usize * 4;
    assert_eq!(
        with_logits,
        vec![
            (150, state_bytes + logit_bytes),
            (157, state_bytes + logit_bytes)
        ],
        "{:?}",
        h.dump()
    );
    let s = h.cache().stats();
    let own: usize = h.dump().iter().map(|e| e.3).sum();
    assert_eq!(s.bytes, h.model.page_stats().live_bytes() + own);
    let before = h.dump();

    // The same prompt again: no prefill, only the 7 one-token decodes.
    let (f0, t0) = h.work();
    let second = h.run(&r, SubmitOptions::default()).await;
    let (f1, t1) = h.work();
    assert_eq!(second.usage().cached_tokens as usize, p.len());
    assert_eq!((f1 - f0, t1 - t0), (7, 7), "forward calls, tokens run");
    // Exactly the first run's tokens and logprobs, and the cold run's.
    assert_eq!(second.tokens, first.tokens);
    assert_eq!(second.steps, first.steps);
    assert_same("full hit", &second, &ct, &cs);
    assert_eq!(h.dump(), before, "a full hit adds nothing");
    let m = h.svc.metrics_text();
    assert!(m.contains("qwasi_prefix_cache_full_hits_total 1\n"), "{m}");
    assert!(m.contains("qwasi_prefix_cache_hits_total 1\n"), "{m}");
    assert!(
        m.contains("qwasi_prefix_cache_tokens_saved_total 150\n"),
        "{m}"
    );

    // One token: max_tokens 1 runs no forward at all.
    let (f0, _) = h.work();
    let one = h.run(&req(&p, 1), SubmitOptions::default()).await;
    assert_eq!(h.work().0, f0);
    assert_eq!(one.tokens, first.tokens[..1]);
    assert_eq!(one.usage().cached_tokens, 150);

    // Another salt does not see it.
    let other = h.run(&req(&p, 1), salted("x")).await;
    assert_eq!(other.usage().cached_tokens, 0);

    // A full hit that fails in its first decode step commits nothing.
    let live = h.model.page_stats().live_pages();
    let stats = h.cache().stats();
    let before = h.dump();
    h.fail_pos.store(p.len(), Ordering::SeqCst);
    let out = h.run(&r, SubmitOptions::default()).await;
    assert!(matches!(out.end, Event::Failed(_)), "{:?}", out.end);
    assert_eq!(out.tokens, first.tokens[..1]);
    assert_eq!(h.dump(), before);
    assert_eq!(h.cache().stats(), stats);
    assert_eq!(h.model.page_stats().live_pages(), live, "pages leaked");
    h.fail_pos.store(usize::MAX, Ordering::SeqCst);

    // Prompt + the 7 completion tokens the sequence ran (a resend without a
    // new message): a full hit on the generation-end snapshot, as cold.
    let mut resend = p.clone();
    resend.extend(&first.tokens[..7]);
    let r2 = req(&resend, 3);
    let (ct2, cs2) = cold(&h.model, &r2);
    let (f0, t0) = h.work();
    let again = h.run(&r2, SubmitOptions::default()).await;
    assert_eq!(again.usage().cached_tokens as usize, resend.len());
    assert_eq!(h.work(), (f0 + 2, t0 + 2), "only the decodes run");
    assert_same("resend", &again, &ct2, &cs2);

    h.cache().clear();
    assert_eq!(h.cache().stats().bytes, 0);
    assert_eq!(h.model.page_stats().live_pages(), 0);
}

#[tokio::test]
async fn a_snapshot_without_logits_at_the_prompt_end_is_upgraded() {
    let h = Harness::new(64 * MIB, 64, 0);
    let long = prompt(100, 81);
    h.run(&req(&long, 1), SubmitOptions::default()).await;
    // An interval snapshot at 64 (no logits) and the prompt end at 100.
    let flags: Vec<(usize, bool)> = h.dump().iter().map(|e| (e.2, e.4)).collect();
    assert_eq!(flags, vec![(64, false), (100, true)]);
    // Exactly the 64 interval tokens: that snapshot cannot serve them (no
    // logits), nothing shorter is cached, so it runs cold ...
    let short = &long[..64];
    let r = req(short, 4);
    let (ct, cs) = cold(&h.model, &r);
    let t0 = h.work().1;
    let a = h.run(&r, SubmitOptions::default()).await;
    assert_eq!(a.usage().cached_tokens, 0);
    assert_eq!(h.work().1 - t0, 64 + 3);
    assert_same("upgrade", &a, &ct, &cs);
    // ... and replaces it with one that has logits (same node, no growth
    // beyond the logits and the generation-end snapshot at 67, with its own).
    let mut flags: Vec<(usize, bool)> = h.dump().iter().map(|e| (e.2, e.4)).collect();
    flags.sort();
    assert_eq!(flags, vec![(64, true), (67, true), (100, true)]);
    let own: usize = h.dump().iter().map(|e| e.3).sum();
    assert_eq!(
        h.cache().stats().bytes,
        h.model.page_stats().live_bytes() + own
    );
    // Now it is a full hit.
    let t0 = h.work().1;
    let b = h.run(&r, SubmitOptions::default()).await;
    assert_eq!(b.usage().cached_tokens, 64);
    assert_eq!(h.work().1 - t0, 3);
    assert_eq!(b.tokens, a.tokens);
    assert_eq!(b.steps, a.steps);
    h.cache().clear();
    assert_eq!(h.model.page_stats().live_pages(), 0);
}

#[tokio::test]
async fn logits_count_against_the_budget() {
    // A budget that fits the state and pages of a 64-token snapshot but not
    // its logits as well: the end-of-prompt snapshot is never inserted.
    let probe = Harness::new(64 * MIB, 0, 0);
    probe
        .run(&req(&prompt(64, 90), 1), SubmitOptions::default())
        .await;
    let one = probe.cache().stats().bytes;
    let logits = VOCAB as usize * 4;
    assert!(one > logits);
    drop(probe);
    let h = Harness::new(one - 1, 0, 0);
    h.run(&req(&prompt(64, 90), 1), SubmitOptions::default())
        .await;
    assert_eq!(h.cache().stats().snapshots, 0);
    let h = Harness::new(one, 0, 0);
    h.run(&req(&prompt(64, 90), 1), SubmitOptions::default())
        .await;
    assert_eq!(h.cache().stats().bytes, one);
    assert!(h.dump()[0].4);
}

#[tokio::test]
async fn pending_full_copy_snapshots_stay_within_the_budget() {
    // A 300-token prompt snapshotted every 16 tokens: 18 interval copies, the
    // prompt's end and the generation's end, ~10.5 end-sized copies in all,
    // under a budget of 3 (room for both ends; the intervals go first).
    let full = prompt(300, 40);
    let end = end_snapshot_bytes(&full);
    let budget = 3 * end;
    let (h, stats) = Harness::with_full_copies(budget, 16);
    let r = req(&full, 4);
    let out = h.run(&r, SubmitOptions::default()).await;
    // Pending copies never held more than the budget plus the newest one.
    let peak = stats.peak.load(Ordering::SeqCst);
    assert!(
        peak <= budget + end,
        "peak {peak} > budget {budget} + {end}"
    );
    // The deepest snapshots were kept: the prompt's end is a full hit now,
    // and the output is the cold run's.
    let (cold_tokens, cold_steps) = cold(&h.model, &r);
    assert_same("first", &out, &cold_tokens, &cold_steps);
    let again = h.run(&r, SubmitOptions::default()).await;
    assert_eq!(again.usage().cached_tokens as usize, full.len());
    assert_same("again", &again, &cold_tokens, &cold_steps);
    let cache = h.cache();
    let s = cache.stats();
    assert!(s.bytes <= budget, "{s:?}");
    // Only the cached copies are alive (their bytes plus stored logits).
    assert!(stats.live.load(Ordering::SeqCst) <= s.bytes);
    cache.clear();
    assert_eq!(
        stats.live.load(Ordering::SeqCst),
        0,
        "snapshot bytes leaked"
    );
}

#[tokio::test]
async fn a_snapshot_pushed_to_the_host_tier_still_serves_the_next_turn() {
    // Room on the "device" for one end-of-prompt snapshot of the longer
    // prompts only: every commit pushes the older snapshots out. With a host
    // tier they are copied there and resumed from there; without, dropped.
    let first = prompt(120, 51);
    let other = prompt(140, 52);
    let end = end_snapshot_bytes(&other);
    let budget = end + end / 2;
    let (h, host) = Harness::with_host_tier(budget, 64 * MIB);
    let a = h.run(&req(&first, 3), SubmitOptions::default()).await;
    h.run(&req(&other, 3), SubmitOptions::default()).await;
    let s = h.cache().stats();
    assert!(s.demotions >= 2 && s.host_bytes > 0, "{s:?}");
    assert!(s.bytes <= budget, "{s:?}");
    assert_eq!(s.evictions, 0, "{s:?}");
    // The next turn of the first conversation resumes from its host copy
    // (generation end: the prompt and the generated tokens but the last, which
    // was never fed back) and matches a cold run exactly.
    let mut turn = first.clone();
    turn.extend(&a.tokens);
    turn.extend(prompt(30, 53));
    let r = req(&turn, 4);
    let (work0, _) = h.work();
    let out = h.run(&r, SubmitOptions::default()).await;
    assert_eq!(
        out.usage().cached_tokens as usize,
        first.len() + a.tokens.len() - 1
    );
    let (cold_tokens, cold_steps) = cold(&h.model, &r);
    assert_same("from the host tier", &out, &cold_tokens, &cold_steps);
    assert!(h.work().0 > work0);
    let metrics = h.svc.metrics_text();
    for line in [
        format!(
            "qwasi_prefix_cache_demotions_total {}",
            h.cache().stats().demotions
        ),
        format!(
            "qwasi_prefix_cache_host_bytes {}",
            h.cache().stats().host_bytes
        ),
    ] {
        assert!(metrics.contains(&line), "{line} missing from\n{metrics}");
    }
    // Host copies alive = the host tier's bytes minus stored logits; none after clear.
    assert!(host.live.load(Ordering::SeqCst) <= h.cache().stats().host_bytes);
    assert!(host.live.load(Ordering::SeqCst) > 0);
    h.cache().clear();
    assert_eq!(host.live.load(Ordering::SeqCst), 0, "host copies leaked");

    // A device budget smaller than one snapshot: staged all the same, and
    // moved to the host tier when the request commits.
    let (h, host) = Harness::with_host_tier(end / 2, 64 * MIB);
    let a = h.run(&req(&first, 3), SubmitOptions::default()).await;
    let s = h.cache().stats();
    assert!(
        s.snapshots >= 2 && s.bytes <= end / 2 && s.demotions >= 2,
        "{s:?}"
    );
    let mut turn = first.clone();
    turn.extend(&a.tokens);
    turn.extend(prompt(30, 53));
    let r = req(&turn, 4);
    let out = h.run(&r, SubmitOptions::default()).await;
    assert_eq!(
        out.usage().cached_tokens as usize,
        first.len() + a.tokens.len() - 1
    );
    assert_same("over the device budget", &out, &cold_tokens, &cold_steps);

    // A request that fails or panics resuming from the host tier, mid-prefill
    // or mid-decode, leaves both tiers exactly as they were.
    let before = (
        h.dump(),
        h.cache().stats(),
        host.live.load(Ordering::SeqCst),
    );
    let mut longer = turn.clone();
    longer.extend(prompt(40, 54));
    for panic in [false, true] {
        h.panic.store(panic, Ordering::SeqCst);
        for fail_pos in [turn.len() + 10, longer.len() + 2] {
            h.fail_pos.store(fail_pos, Ordering::SeqCst);
            let out = h.run(&req(&longer, 6), SubmitOptions::default()).await;
            assert!(matches!(out.end, Event::Failed(_)), "{:?}", out.end);
            let after = (
                h.dump(),
                h.cache().stats(),
                host.live.load(Ordering::SeqCst),
            );
            assert_eq!(after, before, "panic={panic} fail_pos={fail_pos}");
        }
    }
    h.fail_pos.store(usize::MAX, Ordering::SeqCst);

    // The same without a host tier: the first conversation's snapshots are gone.
    let h = Harness::new(budget, 0, 0);
    let a = h.run(&req(&first, 3), SubmitOptions::default()).await;
    h.run(&req(&other, 3), SubmitOptions::default()).await;
    let mut turn = first.clone();
    turn.extend(&a.tokens);
    turn.extend(prompt(30, 53));
    let out = h.run(&req(&turn, 4), SubmitOptions::default()).await;
    assert_eq!(out.usage().cached_tokens, 0);
    assert!(h.cache().stats().evictions >= 2);
}

#[tokio::test]
async fn a_hit_on_a_host_copy_moves_it_back_to_the_device() {
    // As above: the second conversation pushes the first's snapshots to the
    // host tier. The first prompt again is a full hit on its host copy; the
    // request's commit promotes the snapshots it used back to the device
    // and demotes the second conversation's, now least recently used.
    let first = prompt(120, 61);
    let other = prompt(140, 62);
    let end = end_snapshot_bytes(&other);
    let budget = end + end / 2;
    let (h, host) = Harness::with_host_tier(budget, 64 * MIB);
    let r = req(&first, 3);
    h.run(&r, SubmitOptions::default()).await;
    h.run(&req(&other, 3), SubmitOptions::default()).await;
    let tiers = |tokens: &[u32]| -> Vec<bool> {
        h.dump()
            .iter()
            .filter(|e| e.1.starts_with(tokens))
            .map(|e| e.5)
            .collect()
    };
    assert_eq!(tiers(&first), [true, true]);
    let demoted = h.cache().stats().demotions;
    let work0 = h.work();
    let out = h.run(&r, SubmitOptions::default()).await;
    assert_eq!(out.usage().cached_tokens as usize, first.len());
    // No prefill: only the generated tokens but the last were fed back.
    assert_eq!(h.work().1 - work0.1, out.tokens.len() - 1);
    let (cold_tokens, cold_steps) = cold(&h.model, &r);
    assert_same("promoted", &out, &cold_tokens, &cold_steps);
    let s = h.cache().stats();
    assert_eq!(s.promotions, 2, "{s:?}");
    assert!(s.demotions > demoted && s.bytes <= budget, "{s:?}");
    assert_eq!(tiers(&first), [false, false]);
    assert_eq!(tiers(&other), [true, true]);
    assert!(
        h.svc
            .metrics_text()
            .contains("qwasi_prefix_cache_promotions_total 2")
    );
    // Served from the device copy now, still exactly the cold run.
    let again = h.run(&r, SubmitOptions::default()).await;
    assert_same("from the device again", &again, &cold_tokens, &cold_steps);
    assert_eq!(h.cache().stats().promotions, 2);
    h.cache().clear();
    assert_eq!(host.live.load(Ordering::SeqCst), 0, "host copies leaked");
}

/// A backend that stages snapshots inside its passes: a cold prompt runs as
/// one pass whatever its snapshot points, the points move down onto the
/// stride (counted from the first uncomputed token), and requests resumed
/// from those snapshots match cold runs.
#[tokio::test]
async fn in_pass_snapshots_keep_a_prompt_in_one_pass() {
    let h = Harness::with_stride(64, 16, ServiceConfig::default());
    let full = prompt(300, 21);
    let marks = SubmitOptions {
        snapshot_points: vec![37, 150],
        ..Default::default()
    };
    h.run(&req(&full, 4), marks).await;
    // One row for the whole prompt, then one per decode step.
    assert_eq!(h.take_rows(), vec![300, 1, 1, 1]);
    // Marks 37 and 150 on the stride (32, 144); intervals; prompt and
    // generation ends.
    let positions: Vec<usize> = h.dump().iter().map(|e| e.2).collect();
    assert_eq!(positions, vec![32, 64, 128, 144, 192, 256, 300, 303]);

    // Diverging after 150 tokens: resumes from the in-pass snapshot at 144.
    let mut diverged = full[..150].to_vec();
    diverged.extend(prompt(60, 22));
    let r = req(&diverged, 6);
    let got = h.run(&r, SubmitOptions::default()).await;
    assert_eq!(got.usage().cached_tokens, 144);
    let (ct, cs) = cold(&h.model, &r);
    assert_same("from 144", &got, &ct, &cs);

    // From the prompt end at 300 (off the stride): the interval points 320
    // and 384 move onto 300 + 16k.
    h.take_rows();
    let mut longer = full.clone();
    longer.extend(prompt(100, 23));
    let r = req(&longer, 2);
    let got = h.run(&r, SubmitOptions::default()).await;
    assert_eq!(got.usage().cached_tokens, 300);
    assert_eq!(h.take_rows(), vec![100, 1]);
    let positions: Vec<usize> = h.dump().iter().map(|e| e.2).collect();
    for q in [316, 380] {
        assert!(positions.contains(&q), "{q} not in {positions:?}");
    }
    let (ct, cs) = cold(&h.model, &r);
    assert_same("from 300", &got, &ct, &cs);
}

/// Prompt chunks cut by the step's token budget stay on the stride, so the
/// snapshot points after them are still staged inside the passes.
#[tokio::test]
async fn budget_chunks_stay_on_the_snapshot_stride() {
    let config = ServiceConfig {
        max_num_seqs: 2,
        max_num_batched_tokens: 40,
        ..ServiceConfig::default()
    };
    let h = Harness::with_stride(64, 16, config);
    let (pa, pb) = (prompt(208, 24), prompt(208, 25));
    let (ra, rb) = (req(&pa, 40), req(&pb, 4));
    let mut a = h.svc.submit(ra.clone(), salted("a")).await.unwrap();
    // B arrives once A decodes: its prompt is read beside A's tokens.
    let mut first = Vec::new();
    while first.is_empty() {
        a.wait().await;
        first = a.try_next();
    }
    let b = h.run(&rb, salted("b")).await;
    let mut a = collect(&mut a).await;
    for e in first.into_iter().rev() {
        let Event::Token { id, logprob, .. } = e else {
            panic!("A ended at its first token: {e:?}")
        };
        a.tokens.insert(0, id);
        a.steps.splice(0..0, logprob);
    }
    // A's prompt alone; B's in chunks of the budget (40, less A's token)
    // cut down onto the stride while a snapshot point lies beyond the
    // chunk: never a pass ended at a point (39 + 25 + ...).
    let chunks: Vec<usize> = h.take_rows().into_iter().filter(|&n| n > 1).collect();
    assert_eq!(chunks, vec![208, 32, 32, 32, 32, 32, 39, 9]);
    for (label, got, r) in [("a", &a, &ra), ("b", &b, &rb)] {
        let (ct, cs) = cold(&h.model, r);
        assert_same(label, got, &ct, &cs);
    }
    let dump = h.dump();
    for salt in ["a", "b"] {
        for q in [64, 128, 192] {
            assert!(
                dump.iter()
                    .any(|e| e.2 == q && e.0.as_deref() == Some(salt)),
                "no snapshot at {q} for {salt}: {dump:?}"
            );
        }
    }
}
