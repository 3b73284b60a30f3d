use super::*;
use crate::sampling::test_util::{logits, params};
use crate::sampling::{TOP_CANDIDATES, argmax, greedy, log_softmax, top_logits, top_logprobs};

#[test]
fn greedy_is_what_an_argmax_only_sampler_picks() {
    let mut cases = vec![logits(5000, 1, 3.0), vec![1.0, 3.0, 3.0, -2.0]];
    let mut nan = logits(300, 2, 2.0);
    nan[7] = f32::NAN;
    nan[9] = 50.0;
    nan[11] = 50.0;
    cases.push(nan);
    cases.push(vec![f32::NEG_INFINITY, 0.5, f32::NEG_INFINITY]);
    for z in &cases {
        for logprobs in [None, Some(0)] {
            let p = SamplingParams {
                logprobs,
                ..Default::default()
            };
            assert!(p.argmax_only());
            let want = Sampler::new(p).sample(z, &[3, 4], 1);
            let got = greedy(z);
            assert_eq!(got.token, want.token);
            assert_eq!(got.logprob.to_bits(), want.logprob.to_bits());
            assert!(got.top.is_empty() && want.top.is_empty());
        }
    }
    assert_eq!(
        greedy(&[1.0, 3.0, 3.0]).token,
        1,
        "ties go to the lowest id"
    );
}

#[test]
fn sampling_from_the_top_logits_is_sampling_from_all() {
    // Ties, -0.0 and NaN in the row; temperature, top-k, top-p, min-p and
    // alternatives in every combination the top path accepts.
    let vocab = 3000;
    let k = TOP_CANDIDATES;
    let mut cases = 0;
    for (row, scale) in [(1u64, 1.0f32), (2, 4.0), (3, 0.05)] {
        let mut z = logits(vocab, row, scale);
        z[17] = z[5];
        z[40] = f32::NAN;
        z[41] = -0.0;
        z[42] = 0.0;
        for (temperature, top_k, top_p, min_p, lp) in [
            (0.0, 0, 1.0, 0.0, Some(5)),
            (0.0, 3, 0.5, 0.1, Some(20)),
            (0.7, 20, 0.95, 0.0, None),
            (1.0, 64, 1.0, 0.0, Some(0)),
            (1.3, 1, 1.0, 0.0, None),
            (0.6, 20, 0.8, 0.05, Some(3)),
            (2.0, 50, 0.3, 0.0, Some(20)),
        ] {
            let p = SamplingParams {
                temperature,
                top_k,
                top_p,
                min_p,
                logprobs: lp,
                seed: Some(row * 31 + top_k as u64),
                ..Default::default()
            };
            assert!(p.samples_from_top(k, vocab), "{p:?}");
            let (mut full, mut top) = (Sampler::new(p.clone()), Sampler::new(p.clone()));
            let head = top_logits(&z, k);
            for _ in 0..50 {
                assert_eq!(full.sample(&z, &[], 0), top.sample_top(&head), "{p:?}");
                cases += 1;
            }
        }
    }
    assert_eq!(cases, 3 * 7 * 50);
}

fn softmax64(z: &[f32], t: f64) -> Vec<f64> {
    let m = z.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let e: Vec<f64> = z.iter().map(|&x| ((x as f64 - m) / t).exp()).collect();
    let s: f64 = e.iter().sum();
    e.into_iter().map(|x| x / s).collect()
}

fn log_softmax64(z: &[f32]) -> Vec<f64> {
    let m = z.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let s: f64 = z.iter().map(|&x| (x as f64 - m).exp()).sum();
    z.iter().map(|&x| (x as f64 - m) - s.ln()).collect()
}

fn histogram(p: SamplingParams, z: &[f32], n: usize) -> Vec<usize> {
    let mut s = Sampler::new(p);
    let mut h = vec![0; z.len()];
    for _ in 0..n {
        h[s.sample(z, &[], 0).token as usize] += 1;
    }
    h
}

/// Pearson's chi-square of counts against expected probabilities.
fn chi_square(h: &[usize], p: &[f64]) -> f64 {
    let n: usize = h.iter().sum();
    h.iter()
        .zip(p)
        .filter(|&(_, &p)| p > 0.0)
        .map(|(&o, &p)| {
            let e = p * n as f64;
            (o as f64 - e).powi(2) / e
        })
        .sum()
}

#[test]
fn greedy_is_argmax() {
    for seed in 0..5 {
        let z = logits(1000, seed, 3.0);
        let mut s = Sampler::new(SamplingParams::default());
        let out = s.sample(&z, &[1, 2, 3], 3);
        let want = z
            .iter()
            .enumerate()
            .max_by(|a, b| a.1.total_cmp(b.1).then(b.0.cmp(&a.0)))
            .unwrap()
            .0;
        assert_eq!(out.token as usize, want);
        assert_eq!(out.token, argmax(&z));
        assert!(out.top.is_empty());
    }
    // Ties go to the lowest id; NaN never wins.
    assert_eq!(argmax(&[1.0, 3.0, f32::NAN, 3.0]), 1);
    assert_eq!(argmax(&[f32::NAN, -1.0, -1.0]), 1);
    assert_eq!(argmax(&[]), 0);
    let mut s = Sampler::new(SamplingParams::default());
    assert_eq!(s.sample(&[0.5, 2.0, 2.0, f32::NAN], &[], 0).token, 1);
}

#[test]
fn seeds_are_reproducible() {
    let z = logits(5000, 7, 2.0);
    let run = |seed| {
        let mut s = Sampler::new(SamplingParams {
            temperature: 0.9,
            top_p: 0.95,
            top_k: 100,
            seed: Some(seed),
            ..Default::default()
        });
        (0..64)
            .map(|_| s.sample(&z, &[], 0).token)
            .collect::<Vec<_>>()
    };
    assert_eq!(run(42), run(42));
    assert_ne!(run(42), run(43));
    // Unseeded samplers get different streams.
    let a = Sampler::new(params(1.0, 0));
    let mut p = params(1.0, 0);
    p.seed = None;
    let (b, c) = (Sampler::new(p.clone()), Sampler::new(p));
    assert_ne!(b.seed(), c.seed());
    assert_eq!(a.seed(), 0);
}

#[test]
fn seeded_stream_is_pinned() {
    // Guards cross-version stability of seeded sampling: changing the
    // RNG, the exp or the draw changes these tokens.
    let z = logits(2000, 1, 2.0);
    let mut s = Sampler::new(SamplingParams {
        temperature: 1.0,
        seed: Some(1234),
        ..Default::default()
    });
    let plain: Vec<u32> = (0..8).map(|_| s.sample(&z, &[], 0).token).collect();
    let mut s = Sampler::new(SamplingParams {
        temperature: 0.7,
        top_p: 0.9,
        top_k: 50,
        min_p: 0.05,
        seed: Some(1234),
        ..Default::default()
    });
    let truncated: Vec<u32> = (0..8).map(|_| s.sample(&z, &[], 0).token).collect();
    assert_eq!(plain, PINNED_PLAIN, "plain {plain:?}");
    assert_eq!(truncated, PINNED_TRUNCATED, "truncated {truncated:?}");
}

const PINNED_PLAIN: [u32; 8] = [100, 1635, 1352, 1710, 208, 1731, 846, 359];
const PINNED_TRUNCATED: [u32; 8] = [109, 1573, 1352, 1713, 109, 1713, 804, 277];

#[test]
fn temperature_one_matches_softmax() {
    let z = [1.0f32, 0.5, 0.0, -0.5, 2.0, -3.0, 1.5, 0.25];
    let n = 20_000;
    let h = histogram(params(1.0, 99), &z, n);
    let chi = chi_square(&h, &softmax64(&z, 1.0));
    // 7 degrees of freedom: P(chi2 > 24.3) = 0.001.
    assert!(chi < 24.3, "chi-square {chi}, counts {h:?}");
    // And at temperature 0.5.
    let h = histogram(params(0.5, 5), &z, n);
    let chi = chi_square(&h, &softmax64(&z, 0.5));
    assert!(chi < 24.3, "chi-square {chi}, counts {h:?}");
}

#[test]
fn truncated_distribution_is_renormalised() {
    let z = [1.0f32, 0.5, 0.0, -0.5, 2.0, -3.0, 1.5, 0.25];
    let n = 20_000;
    // top_k = 3 keeps tokens 4, 6, 0.
    let mut p = params(1.0, 3);
    p.top_k = 3;
    let h = histogram(p, &z, n);
    let mut keep = z.to_vec();
    for (i, x) in keep.iter_mut().enumerate() {
        if ![4, 6, 0].contains(&i) {
            *x = f32::NEG_INFINITY;
        }
    }
    let want = softmax64(&keep, 1.0);
    assert_eq!(h.iter().filter(|&&c| c > 0).count(), 3, "{h:?}");
    assert!(chi_square(&h, &want) < 13.8, "{h:?}"); // 2 dof, p = 0.001
}

#[test]
fn top_k_one_and_tiny_top_p_are_greedy() {
    for seed in 0..20 {
        let z = logits(10_000, seed, 1.0);
        let greedy = argmax(&z);
        let mut s = Sampler::new(SamplingParams {
            temperature: 1.5,
            top_k: 1,
            seed: Some(seed),
            ..Default::default()
        });
        assert_eq!(s.sample(&z, &[], 0).token, greedy);
        let mut s = Sampler::new(SamplingParams {
            temperature: 1.5,
            top_p: 1e-6,
            seed: Some(seed),
            ..Default::default()
        });
        assert_eq!(s.sample(&z, &[], 0).token, greedy);
    }
}

/// Brute-force survivor set: sort all tokens, cut by k, p, min-p.
fn reference_survivors(z: &[f32], t: f32, k: usize, top_p: f32, min_p: f32) -> Vec<u32> {
    let p = softmax64(z, t as f64);
    let mut order: Vec<usize> = (0..z.len()).collect();
    order.sort_by(|&a, &b| z[b].partial_cmp(&z[a]).unwrap().then(a.cmp(&b)));
    if k > 0 {
        order.truncate(k);
    }
    let mass: f64 = order.iter().map(|&i| p[i]).sum();
    let mut cum = 0.0;
    let mut n = 0;
    for &i in &order {
        cum += p[i];
        n += 1;
        if cum >= top_p as f64 * mass {
            break;
        }
    }
    order.truncate(n);
    let pmax = p[order[0]];
    let mut out: Vec<u32> = order
        .into_iter()
        .filter(|&i| p[i] >= min_p as f64 * pmax)
        .map(|i| i as u32)
        .collect();
    out.sort();
    out
}

#[test]
fn truncation_matches_brute_force() {
    // (vocab, temperature, top_k, top_p, min_p); covers the heap and
    // histogram top-k, the listed and histogram nucleus, and min-p alone.
    let cases = [
        (20_000, 1.0, 0, 0.9, 0.0),
        (20_000, 0.7, 0, 0.5, 0.0),
        (20_000, 1.0, 40, 1.0, 0.0),
        (20_000, 1.0, 40, 0.8, 0.0),
        (20_000, 1.3, 1000, 0.95, 0.0),
        (20_000, 1.0, 0, 1.0, 0.1),
        (20_000, 1.0, 0, 0.9, 0.02),
        (20_000, 2.0, 500, 0.99, 0.01),
        (20_000, 1.0, 0, 0.999, 0.0),
        (20_000, 1.0, 6000, 1.0, 0.0),
        (20_000, 1.0, 6000, 0.9, 0.0),
        (20_000, 0.8, 10_000, 0.5, 0.05),
        (100_000, 1.0, 70_000, 0.9, 0.0),
        (100_000, 1.0, 70_000, 1.0, 0.0),
    ];
    for (case, &(vocab, t, k, top_p, min_p)) in cases.iter().enumerate() {
        for scale in [0.3f32, 1.0, 4.0] {
            for ties in [false, true] {
                let mut z = logits(vocab, case as u64, scale);
                if ties {
                    z.iter_mut().for_each(|x| *x = (*x * 4.0).round() / 4.0);
                }
                let mut s = Sampler::new(SamplingParams {
                    temperature: t,
                    top_k: k,
                    top_p,
                    min_p,
                    seed: Some(1),
                    ..Default::default()
                });
                let prep = s.prepare(&z, &[], 0);
                s.draw(prep.work_max, None);
                let got = s.survivors();
                let want = reference_survivors(&z, t, k, top_p, min_p);
                let exact = top_p == 1.0 && min_p == 0.0;
                // Rounding may move a p cut by a token at an exact boundary.
                let slack = if exact { 0 } else { 1 };
                let diff = want.len().abs_diff(got.len());
                let common = want.iter().filter(|i| got.binary_search(i).is_ok()).count();
                assert!(
                    diff <= slack && common + slack >= want.len(),
                    "case {case} scale {scale} ties {ties}: got {} survivors, want {}",
                    got.len(),
                    want.len()
                );
            }
        }
    }
}

#[test]
fn min_p_excludes_low_tokens() {
    // p relative to max: 1, e^-1 = .37, e^-2 = .14, e^-3 = .05, e^-5.
    let z = [3.0f32, 2.0, 1.0, 0.0, -2.0];
    let mut p = params(1.0, 11);
    p.min_p = 0.1;
    let h = histogram(p, &z, 20_000);
    assert!(h[0] > 0 && h[1] > 0 && h[2] > 0, "{h:?}");
    assert_eq!((h[3], h[4]), (0, 0), "{h:?}");
    let mut p = params(1.0, 11);
    p.min_p = 0.3;
    let h = histogram(p, &z, 5_000);
    assert_eq!(&h[2..], &[0, 0, 0], "{h:?}");
}

#[test]
fn repetition_penalty() {
    let z = [2.0f32, -1.0, 1.5, -0.5, 0.0];
    let mut s = Sampler::new(SamplingParams {
        repetition_penalty: 2.0,
        ..Default::default()
    });
    // Token 0 in the prompt, token 1 generated: both penalised.
    let out = s.process_logits(&z, &[0, 1], 1).to_vec();
    assert_eq!(out, [1.0, -2.0, 1.5, -0.5, 0.0]);
    assert_eq!(s.sample(&z, &[0, 1], 1).token, 2);
    // Repeated occurrences are penalised once; the state resets between calls.
    assert_eq!(
        s.process_logits(&z, &[0, 0, 0], 3),
        &[1.0, -1.0, 1.5, -0.5, 0.0]
    );
    assert_eq!(s.process_logits(&z, &[], 0), &z);
    // Out-of-vocab context ids are ignored.
    assert_eq!(s.process_logits(&z, &[99], 0), &z);
}

#[test]
fn presence_and_frequency_penalties() {
    let z = [2.0f32, 1.0, 0.5, 0.0];
    let mut s = Sampler::new(SamplingParams {
        presence_penalty: 1.5,
        ..Default::default()
    });
    // Prompt tokens don't count for presence; generated 0 (twice) and 2 do.
    let out = s.process_logits(&z, &[1, 1, 0, 2, 0], 2).to_vec();
    assert_eq!(out, [0.5, 1.0, -1.0, 0.0]);
    assert_eq!(s.sample(&z, &[1, 1, 0, 2, 0], 2).token, 1);

    let mut s = Sampler::new(SamplingParams {
        frequency_penalty: 0.5,
        ..Default::default()
    });
    let out = s.process_logits(&z, &[1, 1, 0, 2, 0, 0], 2).to_vec();
    assert_eq!(out, [0.5, 1.0, 0.0, 0.0]);
    assert_eq!(s.sample(&z, &[1, 1, 0, 2, 0, 0], 2).token, 1);

    // Both together, negative values encourage repetition.
    let mut s = Sampler::new(SamplingParams {
        presence_penalty: -1.0,
        frequency_penalty: -0.25,
        ..Default::default()
    });
    let out = s.process_logits(&z, &[3, 3], 0).to_vec();
    assert_eq!(out, [2.0, 1.0, 0.5, 1.5]);
}

#[test]
fn processing_order() {
    // bias, then repetition (divides the biased positive logit), then presence.
    let z = [1.0f32, 0.0];
    let mut s = Sampler::new(SamplingParams {
        logit_bias: vec![(0, 3.0)],
        repetition_penalty: 2.0,
        presence_penalty: 0.5,
        ..Default::default()
    });
    assert_eq!(s.process_logits(&z, &[0], 0), &[1.5, 0.0]);
}

#[test]
fn logit_bias_bans_and_forces() {
    let z = logits(1000, 3, 1.0);
    let best = argmax(&z);
    let mut p = params(1.0, 8);
    p.logit_bias = vec![(best, -100.0)];
    let h = histogram(p, &z, 5_000);
    assert_eq!(h[best as usize], 0);
    let mut p = params(1.0, 8);
    p.logit_bias = vec![(17, 100.0)];
    let h = histogram(p, &z, 2_000);
    assert_eq!(h[17], 2_000);
    // Greedy too; the reported logprob is still the raw one.
    let mut s = Sampler::new(SamplingParams {
        logit_bias: vec![(17, 100.0)],
        ..Default::default()
    });
    let out = s.sample(&z, &[], 0);
    assert_eq!(out.token, 17);
    assert!((out.logprob as f64 - log_softmax64(&z)[17]).abs() < 1e-5);
}

#[test]
fn logprobs_match_f64_reference() {
    for (seed, scale) in [(0u64, 1.0f32), (1, 5.0), (2, 20.0)] {
        let z = logits(248_320, seed, scale);
        let want = log_softmax64(&z);
        let mut s = Sampler::new(SamplingParams {
            temperature: 0.8,
            top_p: 0.9,
            repetition_penalty: 1.3,
            logit_bias: vec![(5, 7.0)],
            logprobs: Some(20),
            seed: Some(seed),
            ..Default::default()
        });
        for _ in 0..3 {
            let out = s.sample(&z, &[5, 6, 7], 1);
            assert!(
                (out.logprob as f64 - want[out.token as usize]).abs() < 1e-5,
                "{} vs {}",
                out.logprob,
                want[out.token as usize]
            );
            assert_eq!(out.top.len(), 20);
            let mut order: Vec<usize> = (0..z.len()).collect();
            order.sort_by(|&a, &b| want[b].total_cmp(&want[a]).then(a.cmp(&b)));
            for (&(id, lp), &i) in out.top.iter().zip(&order) {
                assert_eq!(id as usize, i);
                assert!((lp as f64 - want[i]).abs() < 1e-5);
            }
        }
        let helper = log_softmax(&z);
        for (a, b) in helper.iter().zip(&want) {
            assert!((*a as f64 - b).abs() < 1e-5);
        }
    }
}

#[test]
fn top_logprobs_order_and_ties() {
    let lp = [-1.0f32, -0.5, -1.0, f32::NAN, -0.5, -3.0];
    assert_eq!(
        top_logprobs(&lp, 4),
        vec![(1, -0.5), (4, -0.5), (0, -1.0), (2, -1.0)]
    );
    assert_eq!(top_logprobs(&lp, 0), vec![]);
    assert_eq!(top_logprobs(&lp, 100).len(), 5);
    // Large k takes the sorting path; same order.
    let z = logits(5000, 4, 1.0);
    let big = top_logprobs(&z, 300);
    let mut order: Vec<u32> = (0..5000).collect();
    order.sort_by(|&a, &b| z[b as usize].total_cmp(&z[a as usize]).then(a.cmp(&b)));
    assert_eq!(big.iter().map(|t| t.0).collect::<Vec<_>>(), &order[..300]);
    assert_eq!(top_logprobs(&z, 64), big[..64]);
    let mut s = Sampler::new(SamplingParams {
        logprobs: Some(2),
        ..Default::default()
    });
    let out = s.sample(&[0.0, 1.0, 1.0], &[], 0);
    assert_eq!(out.token, 1);
    assert_eq!(out.top.iter().map(|t| t.0).collect::<Vec<_>>(), [1, 2]);
    let mut s = Sampler::new(SamplingParams {
        logprobs: Some(0),
        ..Default::default()
    });
    assert!(s.sample(&[0.0, 1.0], &[], 0).top.is_empty());
}

#[test]
fn degenerate_inputs_do_not_panic() {
    let mut s = Sampler::new(SamplingParams {
        temperature: 1.0,
        top_p: 0.5,
        min_p: 0.5,
        top_k: 3,
        seed: Some(0),
        ..Default::default()
    });
    assert_eq!(s.sample(&[], &[], 0).token, 0);
    assert_eq!(s.sample(&[f32::NEG_INFINITY; 4], &[], 0).token, 0);
    assert_eq!(s.sample(&[f32::NAN, 1.0, f32::NAN], &[], 0).token, 1);
    assert_eq!(s.sample(&[0.0, 1.0, f32::INFINITY], &[], 0).token, 2);
    let t = s.sample(&[f32::NEG_INFINITY, 0.0, 0.0], &[], 0).token;
    assert!(t == 1 || t == 2);
    // Unvalidated nonsense is tolerated.
    let mut s = Sampler::new(SamplingParams {
        temperature: f32::NAN,
        logit_bias: vec![(1000, 5.0)],
        repetition_penalty: -1.0,
        ..Default::default()
    });
    assert_eq!(s.sample(&[0.0, 1.0], &[7, 1], 9).token, 1);
}

#[test]
#[ignore = "timing; run with --release -- --ignored --nocapture"]
fn timing() {
    let vocab = 248_320;
    for scale in [1.0f32, 3.0, 10.0] {
        let z = logits(vocab, 5, scale);
        let context: Vec<u32> = (0..2000).map(|i| (i * 97) % vocab as u32).collect();
        let configs: [(&str, SamplingParams); 7] = [
            ("greedy", SamplingParams::default()),
            ("t=1", params(1.0, 1)),
            (
                "t=0.7 top_p=0.9",
                SamplingParams {
                    top_p: 0.9,
                    ..params(0.7, 1)
                },
            ),
            (
                "t=1 top_k=50",
                SamplingParams {
                    top_k: 50,
                    ..params(1.0, 1)
                },
            ),
            (
                "t=1 top_k=5000 top_p=.95",
                SamplingParams {
                    top_k: 5000,
                    top_p: 0.95,
                    ..params(1.0, 1)
                },
            ),
            (
                "t=1 min_p=0.05",
                SamplingParams {
                    min_p: 0.05,
                    ..params(1.0, 1)
                },
            ),
            (
                "t=0.8 all + penalties + logprobs",
                SamplingParams {
                    top_k: 40,
                    top_p: 0.95,
                    min_p: 0.01,
                    repetition_penalty: 1.1,
                    presence_penalty: 0.5,
                    frequency_penalty: 0.2,
                    logprobs: Some(20),
                    ..params(0.8, 1)
                },
            ),
        ];
        for (name, p) in configs {
            let mut s = Sampler::new(p);
            s.sample(&z, &context, 1000);
            let mut times: Vec<f64> = (0..100)
                .map(|_| {
                    let t0 = std::time::Instant::now();
                    std::hint::black_box(s.sample(&z, &context, 1000));
                    t0.elapsed().as_secs_f64() * 1e3
                })
                .collect();
            times.sort_by(f64::total_cmp);
            println!(
                "scale {scale:>4}: {name:<34} min {:.3} ms, median {:.3} ms",
                times[0], times[50]
            );
        }
    }
}
