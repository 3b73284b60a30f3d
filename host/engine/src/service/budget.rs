//! The running sequences' memory budget: the operator's or the backend's,
//! the longest context it holds, and what the server says of it at startup.

use crate::backend::Backend;

/// The startup lines about the sequences' memory budget `cap` (the
/// operator's `operator` bytes, or the backend's `measured`): one where the
/// operator's is above the measured one, the budget and what it holds, and
/// one where a sequence fits less than `context` tokens (`fits`).
pub(super) fn startup_lines<B: Backend>(
    backend: &B,
    measured: Option<usize>,
    operator: usize,
    cap: Option<usize>,
    fits: usize,
    context: usize,
) -> Vec<String> {
    [
        over_budget_warning(measured, operator),
        budget_line(
            cap,
            operator > 0,
            backend.sequence_bytes(BUDGET_LINE_TOKENS),
        ),
        budget_warning(fits, context, cap),
    ]
    .into_iter()
    .flatten()
    .collect()
}

/// The sequences' memory budget: the operator's where set (0: not set),
/// else the backend's.
pub(super) fn kv_capacity(backend: Option<usize>, operator: usize) -> Option<usize> {
    match operator {
        0 => backend,
        o => Some(o),
    }
}

/// What to say at startup when the operator's budget is above the one the
/// backend measured (which keeps room for the passes' work buffers).
fn over_budget_warning(backend: Option<usize>, operator: usize) -> Option<String> {
    let b = backend?;
    (operator > b).then(|| {
        format!(
            "warning: --kv-cache-mib {} is above the {} MiB this device leaves the sequences \
             after the weights and the passes' work reserve: a long prompt's pass may run out \
             of device memory and fail its request",
            operator >> 20,
            b >> 20
        )
    })
}

/// The longest context (up to `limit`) whose [`Backend::sequence_bytes`]
/// fit the budget `cap`: `usize::MAX` without one.
pub(super) fn memory_limit<B: Backend>(backend: &B, cap: Option<usize>, limit: usize) -> usize {
    let Some(cap) = cap else {
        return usize::MAX;
    };
    // sequence_bytes grows with the tokens: the last n that fits.
    let (mut lo, mut hi) = (0, limit);
    while lo < hi {
        let mid = lo + (hi - lo).div_ceil(2);
        if backend.sequence_bytes(mid) <= cap {
            lo = mid;
        } else {
            hi = mid - 1;
        }
    }
    lo
}

/// The sequence length [`budget_line`] counts the budget in.
const BUDGET_LINE_TOKENS: usize = 4096;

/// The startup line that says the sequences' memory budget (`cap` bytes,
/// set by the operator or measured) and how many sequences of
/// [`BUDGET_LINE_TOKENS`] tokens (`per_seq` bytes each) it holds; none
/// where nothing limits them.
fn budget_line(cap: Option<usize>, operator: bool, per_seq: usize) -> Option<String> {
    let cap = cap?;
    let from = if operator {
        "set by --kv-cache-mib"
    } else {
        "measured; --kv-cache-mib sets it"
    };
    Some(format!(
        "KV memory budget: {} MiB ({from}), {} sequences of {BUDGET_LINE_TOKENS} tokens",
        cap >> 20,
        cap / per_seq.max(1)
    ))
}

/// What to say at startup when the KV memory budget (`cap` bytes) holds one
/// sequence of at most `fits` tokens, fewer than the `context` a request may
/// ask for: such requests are refused (every one where nothing fits: a
/// budget set too small, or a device the weights leave too little of).
fn budget_warning(fits: usize, context: usize, cap: Option<usize>) -> Option<String> {
    let mib = cap? >> 20;
    if fits == 0 {
        Some(format!(
            "warning: the KV memory budget ({mib} MiB) holds no sequence of this model: \
             every request will be refused (set a larger one with --kv-cache-mib, or free device memory)"
        ))
    } else if fits < context {
        Some(format!(
            "one sequence fits at most {fits} of the {context} tokens of context in the \
             KV memory budget ({mib} MiB; --kv-cache-mib sets it): longer requests are refused"
        ))
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_operators_budget_replaces_the_backends() {
        let gib = 1usize << 30;
        assert_eq!(kv_capacity(Some(4 * gib), 0), Some(4 * gib));
        assert_eq!(kv_capacity(None, 0), None);
        assert_eq!(kv_capacity(Some(4 * gib), gib), Some(gib));
        assert_eq!(kv_capacity(Some(0), 6 * gib), Some(6 * gib));
        assert_eq!(kv_capacity(None, gib), Some(gib));
        // Only a budget above the measured one is warned about.
        assert_eq!(over_budget_warning(Some(4 * gib), gib), None);
        assert_eq!(over_budget_warning(None, gib), None);
        assert_eq!(over_budget_warning(Some(4 * gib), 0), None);
        // The startup line: the budget, where it comes from, what it holds.
        assert_eq!(budget_line(None, false, 1), None);
        let l = budget_line(Some(3793 << 20), false, 100 << 20).unwrap();
        assert_eq!(
            l,
            "KV memory budget: 3793 MiB (measured; --kv-cache-mib sets it), 37 sequences of 4096 tokens"
        );
        assert!(
            budget_line(Some(gib), true, 0)
                .unwrap()
                .contains("set by --kv-cache-mib")
        );
        let w = over_budget_warning(Some(0), 6000 << 20).unwrap();
        assert!(w.contains("--kv-cache-mib 6000 is above the 0 MiB"), "{w}");
        assert!(w.contains("sequences after the weights"), "{w}");
    }
}
