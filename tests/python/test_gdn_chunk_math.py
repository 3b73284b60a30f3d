"""The math of kernels/gdn_chunk.cu (the chunked GDN prefill) on the CPU: a numpy
transcription of its three phases with the kernels' buffer layouts and index
arithmetic (q/k/v read from conv-output rows of stride p; WT [nv][nch][dk][64],
U [nv][T][dv], Gc [nv][T], Sc [nv][nch][dk][dv]; o [T][nv][dv]), in float64,
against the token-serial delta rule (kernels/gdn.cu gdn_recurrent).

Needs numpy only. Run: python3 -m pytest tests/python/test_gdn_chunk_math.py -q
"""

import numpy as np
import pytest

C = 64  # GC_C


def make_inputs(t_len, nk, nv, dk, dv, gscale, seed):
    rng = np.random.default_rng(seed)
    key_dim = nk * dk
    p = 2 * key_dim + nv * dv + 3  # a row stride wider than q|k|v
    rows = rng.standard_normal((t_len, p))
    for h in range(2 * nk):
        x = rows[:, h * dk : (h + 1) * dk]
        x /= np.sqrt((x * x).sum(1, keepdims=True) + 1e-6)
        if h < nk:
            x /= np.sqrt(dk)
    g = -gscale * rng.random((t_len, nv))
    beta = rng.random((t_len, nv))
    s0 = 0.1 * rng.standard_normal((nv, dk, dv))
    return rows.ravel(), p, g, beta, s0


def serial(qkv, p, nk, nv, dk, dv, g, beta, s):
    """gdn_recurrent: per token S *= e^g; delta = beta (v - S^T k); S += k delta^T; o = S^T q."""
    t_len = g.shape[0]
    key_dim = nk * dk
    s = s.copy()
    out = np.zeros((t_len, nv, dv))
    for hv in range(nv):
        hk = hv // (nv // nk)
        for t in range(t_len):
            row = qkv[t * p : (t + 1) * p]
            q = row[hk * dk : hk * dk + dk]
            k = row[key_dim + hk * dk : key_dim + hk * dk + dk]
            v = row[2 * key_dim + hv * dv : 2 * key_dim + hv * dv + dv]
            s[hv] *= np.exp(g[t, hv])
            delta = beta[t, hv] * (v - k @ s[hv])
            s[hv] += np.outer(k, delta)
            out[t, hv] = q @ s[hv]
    return out, s


def chunked(qkv, p, nk, nv, dk, dv, g, beta, s):
    """The three kernels, element for element (flat buffers, kernel index formulas)."""
    t_len = g.shape[0]
    key_dim = nk * dk
    nch = (t_len + C - 1) // C
    WT = np.zeros(nv * nch * dk * C)
    U = np.zeros(nv * t_len * dv)
    Gc = np.zeros(nv * t_len)
    Sc = np.zeros(nv * nch * dk * dv)
    S = s.ravel().copy()
    out = np.zeros(t_len * nv * dv)
    g = g.ravel()
    beta = beta.ravel()

    def k_row(t, hk):
        b = t * p + key_dim + hk * dk
        return qkv[b : b + dk]

    def q_row(t, hk):
        b = t * p + hk * dk
        return qkv[b : b + dk]

    def v_row(t, hv):
        b = t * p + 2 * key_dim + hv * dv
        return qkv[b : b + dv]

    # Phase 1: gdn_chunk_prep, grid (nch, nv).
    for ch in range(nch):
        for hv in range(nv):
            c0 = ch * C
            n = min(C, t_len - c0)
            hk = hv // (nv // nk)
            Ks = np.zeros((C, dk))
            Vs = np.zeros((C, dv))
            Bs = np.zeros(C)
            Gs = np.zeros(C)
            for i in range(n):
                Ks[i] = k_row(c0 + i, hk)
                Vs[i] = v_row(c0 + i, hv)
                Bs[i] = beta[(c0 + i) * nv + hv]
                Gs[i] = g[(c0 + i) * nv + hv]
            Gs = np.cumsum(Gs)
            Gc[hv * t_len + c0 : hv * t_len + c0 + n] = Gs[:n]
            As = np.zeros((C, C))
            for i in range(n):
                for j in range(i):
                    As[i, j] = -Bs[i] * (Ks[i] @ Ks[j]) * np.exp(Gs[i] - Gs[j])
            for i in range(1, n):
                new = [As[i, j] + sum(As[i, m] * As[m, j] for m in range(j + 1, i)) for j in range(i)]
                As[i, :i] = new
            for i in range(n):
                As[i, i] = 1.0
            Ks *= (Bs * np.exp(Gs))[:, None]
            Vs *= Bs[:, None]
            W = As[:, :n] @ Ks[:n]  # [64][dk], rows >= n zero
            base = (hv * nch + ch) * dk * C
            for d in range(dk):
                for i in range(C):
                    WT[base + d * C + i] = W[i, d]
            Uc = As[:n, :n] @ Vs[:n]
            for i in range(n):
                U[(hv * t_len + c0 + i) * dv : (hv * t_len + c0 + i + 1) * dv] = Uc[i]

    # Phase 2: gdn_chunk_state, grid (nv, ceil(dv / 32)): one column tile at a time.
    for hv in range(nv):
        hk = hv // (nv // nk)
        for t0 in range(0, dv, 32):
            cols = range(t0, min(dv, t0 + 32))
            Ss = np.array([[S[hv * dk * dv + d * dv + c] for c in cols] for d in range(dk)])
            for ch in range(nch):
                c0 = ch * C
                n = min(C, t_len - c0)
                base = (hv * nch + ch) * dk * C
                WTs = WT[base : base + dk * C].reshape(dk, C)
                Gs = Gc[hv * t_len + c0 : hv * t_len + c0 + n]
                glast = Gs[n - 1]
                Ef = np.exp(glast - Gs)
                Us = np.array([[U[(hv * t_len + c0 + i) * dv + c] for c in cols] for i in range(n)])
                vn = Us - WTs[:, :n].T @ Ss
                for i in range(n):
                    for cc, c in enumerate(cols):
                        U[(hv * t_len + c0 + i) * dv + c] = vn[i, cc]
                sbase = (hv * nch + ch) * dk * dv
                for d in range(dk):
                    for cc, c in enumerate(cols):
                        Sc[sbase + d * dv + c] = Ss[d, cc]
                Kc = np.array([k_row(c0 + i, hk) for i in range(n)])
                Ss = Ss * np.exp(glast) + Kc.T @ (vn * Ef[:, None])
            for d in range(dk):
                for cc, c in enumerate(cols):
                    S[hv * dk * dv + d * dv + c] = Ss[d, cc]

    # Phase 3: gdn_chunk_out, grid (nch, nv).
    for ch in range(nch):
        for hv in range(nv):
            c0 = ch * C
            n = min(C, t_len - c0)
            hk = hv // (nv // nk)
            Qc = np.array([q_row(c0 + i, hk) for i in range(n)])
            Kc = np.array([k_row(c0 + i, hk) for i in range(n)])
            Gs = Gc[hv * t_len + c0 : hv * t_len + c0 + n]
            P = np.zeros((n, n))
            for i in range(n):
                for j in range(i + 1):
                    P[i, j] = (Qc[i] @ Kc[j]) * np.exp(Gs[i] - Gs[j])
            sbase = (hv * nch + ch) * dk * dv
            Sst = Sc[sbase : sbase + dk * dv].reshape(dk, dv)
            Vn = np.array([U[(hv * t_len + c0 + j) * dv : (hv * t_len + c0 + j + 1) * dv] for j in range(n)])
            O = (Qc @ Sst) * np.exp(Gs)[:, None] + P @ Vn
            for i in range(n):
                b = ((c0 + i) * nv + hv) * dv
                out[b : b + dv] = O[i]
    return out.reshape(t_len, nv, dv), S.reshape(nv, dk, dv)


@pytest.mark.parametrize(
    "t_len,nk,nv,dk,dv,gscale",
    [
        (1, 2, 4, 16, 16, 1.0),
        (2, 2, 4, 16, 16, 1.0),
        (63, 2, 6, 16, 24, 0.05),
        (64, 2, 4, 16, 16, 1.0),
        (65, 2, 4, 8, 40, 3.0),
        (70, 2, 6, 16, 24, 0.5),
        (130, 1, 2, 12, 36, 0.2),
    ],
)
def test_chunked_matches_serial(t_len, nk, nv, dk, dv, gscale):
    qkv, p, g, beta, s0 = make_inputs(t_len, nk, nv, dk, dv, gscale, seed=t_len * 31 + dv)
    o_ref, s_ref = serial(qkv, p, nk, nv, dk, dv, g, beta, s0)
    o, s = chunked(qkv, p, nk, nv, dk, dv, g, beta, s0)
    assert np.abs(o - o_ref).max() < 1e-10
    assert np.abs(s - s_ref).max() < 1e-10
