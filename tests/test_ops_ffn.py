"""FFN (clamped SwiGLU, grouped sigmoid router, routed experts), mHC and sampling ops of the CPU
backend against numpy references transcribed from transformers 5.17
``models/glm5_next/modeling_glm5_next.py`` (Glm5NextTextMLP, Glm5NextTextTopkRouter,
Glm5NextTextExperts, Glm5NextTextHyperConnection, Glm5NextTextHyperHead, the decoder layer's
post/comb application). numpy only: CI has neither torch nor transformers.
"""

from __future__ import annotations

import numpy as np
import pytest

import memra
from memra import _core

S = _core.status


def rng(seed):
    return np.random.default_rng(seed)


def randn(r, *shape, scale=1.0):
    return (r.standard_normal(shape) * scale).astype(np.float32)


def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def silu(x):
    return x * sigmoid(x)


# ---------------------------------------------------------------- references (float64)


def mlp_ref(x, gw, uw, dw, limit):
    """Glm5NextTextMLP.forward: gate clamped above, up clamped both ways."""
    x = x.astype(np.float64)
    gate = np.minimum(x @ gw.T.astype(np.float64), limit)
    up = np.clip(x @ uw.T.astype(np.float64), -limit, limit)
    return (silu(gate) * up) @ dw.T.astype(np.float64)


def route_ref(x, gw, bias, top_k, n_group, topk_group, norm, scaling):
    """Glm5NextTextTopkRouter.forward with the documented tie rules (lower index first)."""
    logits = x.astype(np.float64) @ gw.T.astype(np.float64)
    scores = sigmoid(logits)
    choice = scores + (0.0 if bias is None else bias.astype(np.float64))
    T, E = scores.shape
    per = E // n_group
    idx = np.zeros((T, top_k), np.int32)
    w = np.zeros((T, top_k), np.float64)
    for t in range(T):
        grp = choice[t].reshape(n_group, per)
        gs = np.sort(grp, axis=1)[:, ::-1][:, : min(2, per)].sum(axis=1)
        keep = np.lexsort((np.arange(n_group), -gs))[:topk_group]
        masked = np.full(E, -np.inf)
        for g in keep:
            masked[g * per : (g + 1) * per] = choice[t, g * per : (g + 1) * per]
        chosen = np.lexsort((np.arange(E), -masked))[:top_k]
        wt = scores[t, chosen]
        if norm:
            wt = wt / (wt.sum() + 1e-20)
        idx[t] = chosen
        w[t] = wt * scaling
    return idx, w


def mhc_ref(streams, fn, base, scale, iters, hc_eps, norm_eps):
    """Glm5NextTextHyperConnection.forward."""
    T, hc, D = streams.shape
    s = streams.astype(np.float64)
    flat = s.reshape(T, hc * D)
    flat = flat / np.sqrt((flat**2).mean(-1, keepdims=True) + norm_eps)
    mix = flat @ fn.T.astype(np.float64)
    base = base.astype(np.float64)
    pre = sigmoid(mix[:, :hc] * scale[0] + base[:hc]) + hc_eps
    post = 2 * sigmoid(mix[:, hc : 2 * hc] * scale[1] + base[hc : 2 * hc])
    logits = mix[:, 2 * hc :].reshape(T, hc, hc) * scale[2] + base[2 * hc :].reshape(hc, hc)
    e = np.exp(logits - logits.max(-1, keepdims=True))
    comb = e / e.sum(-1, keepdims=True) + hc_eps
    comb = comb / (comb.sum(-2, keepdims=True) + hc_eps)
    for _ in range(iters - 1):
        comb = comb / (comb.sum(-1, keepdims=True) + hc_eps)
        comb = comb / (comb.sum(-2, keepdims=True) + hc_eps)
    collapsed = (pre[:, :, None] * s).sum(1)
    return post, comb, collapsed


def weight(a):
    return _core.Weight(np.ascontiguousarray(a))


def expect_contract(code, fn, *args, **kwargs):
    with pytest.raises(memra.ContractError) as ei:
        fn(*args, **kwargs)
    assert ei.value.code == code, str(ei.value)
    return ei.value


# ---------------------------------------------------------------- SwiGLU MLP


@pytest.mark.parametrize("T", [1, 3, 19])
def test_swiglu_mlp_matches_reference_with_clamp(T):
    r = rng(T)
    D, I, limit = 13, 21, 1.25
    x = randn(r, T, D)
    gw, uw, dw = randn(r, I, D, scale=0.8), randn(r, I, D, scale=0.8), randn(r, D, I, scale=0.3)
    y = _core.swiglu_mlp(x, weight(gw), weight(uw), weight(dw), limit=limit)
    ref = mlp_ref(x, gw, uw, dw, limit)
    assert y.dtype == np.float32 and y.shape == (T, D)
    np.testing.assert_allclose(y, ref, atol=2e-5, rtol=1e-5)
    if T > 1:  # the clamp must be engaged on both sides
        g = x.astype(np.float64) @ gw.T
        u = x.astype(np.float64) @ uw.T
        assert (g > limit).any() and (u > limit).any() and (u < -limit).any()


def test_swiglu_mlp_contract_errors():
    r = rng(0)
    D, I = 6, 5
    gw, uw, dw = weight(randn(r, I, D)), weight(randn(r, I, D)), weight(randn(r, D, I))
    x = randn(r, 4, D)
    expect_contract(S.CONTRACT_DTYPE, _core.swiglu_mlp, x.astype(np.float64), gw, uw, dw, limit=1.0)
    expect_contract(S.CONTRACT_SHAPE, _core.swiglu_mlp, x[None], gw, uw, dw, limit=1.0)
    expect_contract(S.CONTRACT_SHAPE, _core.swiglu_mlp, randn(r, 4, D + 1), gw, uw, dw, limit=1.0)
    expect_contract(S.CONTRACT_STRIDE, _core.swiglu_mlp, randn(r, 4, 2 * D)[:, ::2], gw, uw, dw,
                    limit=1.0)
    expect_contract(S.CONTRACT_SHAPE, _core.swiglu_mlp, x, gw, uw, gw, limit=1.0)  # down [I, D]
    expect_contract(S.CONTRACT_VALUE, _core.swiglu_mlp, x, gw, uw, dw, limit=0.0)


# ---------------------------------------------------------------- router


@pytest.mark.parametrize(
    "T,E,top_k,n_group,topk_group,norm",
    [(1, 8, 2, 1, 1, True), (7, 12, 3, 4, 2, True), (19, 30, 5, 5, 3, False),
     (5, 9, 4, 3, 2, True)],
)
def test_moe_route_matches_reference(T, E, top_k, n_group, topk_group, norm):
    r = rng(E + T)
    D = 11
    x, gw, bias = randn(r, T, D), randn(r, E, D, scale=0.7), randn(r, E, scale=0.1)
    idx, w = _core.moe_route(x, weight(gw), bias, top_k=top_k, n_group=n_group,
                             topk_group=topk_group, norm_topk_prob=norm, scaling=2.5)
    ridx, rw = route_ref(x, gw, bias, top_k, n_group, topk_group, norm, 2.5)
    assert idx.dtype == np.int32 and w.dtype == np.float32 and idx.shape == (T, top_k)
    np.testing.assert_array_equal(idx, ridx)
    np.testing.assert_allclose(w, rw, atol=2e-6, rtol=1e-6)


def test_moe_route_group_mask_changes_the_choice():
    # Identity gate: x holds the logits. Expert 0 is the single best, but its group (0, 1) has
    # the lowest top-2 sum among the first three groups.
    E = 8
    logits = np.array([[3.0, -5.0, 1.0, 1.0, 0.8, 0.8, -3.0, -3.0]], np.float32)
    eye = weight(np.eye(E, dtype=np.float32))
    idx, w = _core.moe_route(logits, eye, top_k=2, n_group=4, topk_group=2, norm_topk_prob=True,
                             scaling=1.0)
    assert idx.tolist() == [[2, 3]]
    np.testing.assert_allclose(w, [[0.5, 0.5]], atol=1e-6)
    idx, _ = _core.moe_route(logits, eye, top_k=2, n_group=1, topk_group=1, norm_topk_prob=True,
                             scaling=1.0)
    assert idx.tolist() == [[0, 2]]
    # The correction bias chooses; the weights stay the unbiased sigmoid scores.
    bias = np.zeros(E, np.float32)
    bias[7] = 2.0
    idx, w = _core.moe_route(logits, eye, bias, top_k=2, n_group=1, topk_group=1,
                             norm_topk_prob=False, scaling=3.0)
    assert idx.tolist() == [[7, 0]]
    np.testing.assert_allclose(w, 3.0 * sigmoid(np.array([[-3.0, 3.0]])), atol=1e-6)


def test_moe_route_contract_errors():
    r = rng(1)
    E, D = 8, 5
    gw = weight(randn(r, E, D))
    x = randn(r, 3, D)
    kw = dict(top_k=2, n_group=4, topk_group=2, norm_topk_prob=True, scaling=1.0)
    expect_contract(S.CONTRACT_DTYPE, _core.moe_route, x.astype(np.float64), gw, **kw)
    expect_contract(S.CONTRACT_SHAPE, _core.moe_route, x[0], gw, **kw)
    expect_contract(S.CONTRACT_SHAPE, _core.moe_route, x, gw, randn(r, E + 1), **kw)
    expect_contract(S.CONTRACT_STRIDE, _core.moe_route, randn(r, 6, D)[::2], gw, **kw)
    expect_contract(S.CONTRACT_VALUE, _core.moe_route, x, gw, **{**kw, "n_group": 3})
    expect_contract(S.CONTRACT_VALUE, _core.moe_route, x, gw, **{**kw, "topk_group": 5})
    expect_contract(S.CONTRACT_VALUE, _core.moe_route, x, gw, **{**kw, "top_k": 5})


# ---------------------------------------------------------------- routed experts


def make_experts(r, E, D, I):
    g = [randn(r, I, D, scale=0.6) for _ in range(E)]
    u = [randn(r, I, D, scale=0.6) for _ in range(E)]
    d = [randn(r, D, I, scale=0.4) for _ in range(E)]
    return g, u, d


@pytest.mark.parametrize("T", [1, 5, 23])
def test_moe_forward_matches_reference(T):
    r = rng(100 + T)
    E, D, I, k, limit = 7, 10, 9, 3, 2.0
    g, u, d = make_experts(r, E, D, I)
    x = randn(r, T, D, scale=1.5)
    idx, w = _core.moe_route(x, weight(randn(r, E, D)), top_k=k, n_group=1, topk_group=1,
                             norm_topk_prob=True, scaling=2.5)
    y = _core.moe_forward(x, idx, w, [weight(a) for a in g], [weight(a) for a in u],
                          [weight(a) for a in d], limit=limit)
    ref = np.zeros((T, D))
    for t in range(T):
        for j in range(k):
            e = idx[t, j]
            ref[t] += w[t, j] * mlp_ref(x[t : t + 1], g[e], u[e], d[e], limit)[0]
    np.testing.assert_allclose(y, ref, atol=3e-5, rtol=1e-5)


def test_moe_forward_contract_errors():
    r = rng(2)
    E, D, I = 3, 4, 5
    g, u, d = ([weight(a) for a in lst] for lst in make_experts(r, E, D, I))
    x = randn(r, 2, D)
    idx = np.array([[0, 2], [1, 0]], np.int32)
    w = randn(r, 2, 2)
    expect_contract(S.CONTRACT_RANGE, _core.moe_forward, x, np.array([[0, 3], [1, 0]], np.int32),
                    w, g, u, d, limit=1.0)
    expect_contract(S.CONTRACT_RANGE, _core.moe_forward, x, np.array([[0, -1], [1, 0]], np.int32),
                    w, g, u, d, limit=1.0)
    expect_contract(S.CONTRACT_DTYPE, _core.moe_forward, x, idx.astype(np.int64), w, g, u, d,
                    limit=1.0)
    expect_contract(S.CONTRACT_DTYPE, _core.moe_forward, x, idx, w.astype(np.float64), g, u, d,
                    limit=1.0)
    expect_contract(S.CONTRACT_SHAPE, _core.moe_forward, x, idx, w[:, :1].copy(), g, u, d,
                    limit=1.0)
    expect_contract(S.CONTRACT_SHAPE, _core.moe_forward, x, idx, w, g, u, d[:2], limit=1.0)
    expect_contract(S.CONTRACT_SHAPE, _core.moe_forward, x, idx, w, g, u, g, limit=1.0)
    expect_contract(S.CONTRACT_STRIDE, _core.moe_forward, randn(r, 2, 2 * D)[:, ::2], idx, w, g,
                    u, d, limit=1.0)


# ---------------------------------------------------------------- mHC


@pytest.mark.parametrize("T,hc,D,iters",
                         [(1, 4, 7, 20), (5, 4, 33, 20), (3, 3, 5, 1), (2, 2, 9, 3)])
def test_mhc_pre_matches_reference(T, hc, D, iters):
    r = rng(T * 100 + hc * 10 + D)
    mix = (2 + hc) * hc
    streams = randn(r, T, hc, D)
    fn, base = randn(r, mix, hc * D, scale=0.3), randn(r, mix, scale=0.5)
    scale = np.array([0.7, 1.3, 0.5], np.float32)
    post, comb, col = _core.mhc_pre(streams, weight(fn), base, scale, sinkhorn_iters=iters,
                                    hc_eps=1e-6, norm_eps=1e-5)
    rpost, rcomb, rcol = mhc_ref(streams, fn, base, scale, iters, 1e-6, 1e-5)
    assert post.shape == (T, hc) and comb.shape == (T, hc, hc) and col.shape == (T, D)
    np.testing.assert_allclose(post, rpost, atol=2e-6)
    np.testing.assert_allclose(comb, rcomb, atol=2e-6)
    np.testing.assert_allclose(col, rcol, atol=1e-5, rtol=1e-5)
    np.testing.assert_allclose(comb.sum(-2), 1.0, atol=1e-5)  # the last step normalises columns
    if iters >= 20:  # Sinkhorn converges geometrically; 20 rounds leave rows within ~1e-2
        np.testing.assert_allclose(comb.sum(-1), 1.0, atol=3e-2)


def test_mhc_pre_with_input_norm_is_mhc_pre_then_rms_norm():
    # The block's input norm folded into the mHC call (rms_eps / HyperConnection.pre(norm=, eps=)):
    # on the CPU literally the two ops; the reference's RMSNorm in float64 bounds them.
    r = rng(9)
    T, hc, D = 3, 4, 33
    mix = (2 + hc) * hc
    streams = randn(r, T, hc, D)
    fn, base = randn(r, mix, hc * D, scale=0.3), randn(r, mix, scale=0.5)
    scale, w = np.array([0.7, 1.3, 0.5], np.float32), randn(r, D)
    kw = dict(sinkhorn_iters=20, hc_eps=1e-6, norm_eps=1e-5)
    post, comb, col = _core.mhc_pre(streams, weight(fn), base, scale, **kw)
    for wt in (w, None):
        p2, c2, out = _core.mhc_pre(streams, weight(fn), base, scale, rms_weight=wt, rms_eps=1e-6, **kw)
        np.testing.assert_array_equal(p2, post)
        np.testing.assert_array_equal(c2, comb)
        np.testing.assert_array_equal(out, _core.rms_norm(col, wt, eps=1e-6))
        c64 = col.astype(np.float64)
        ref = c64 / np.sqrt((c64 * c64).mean(-1, keepdims=True) + 1e-6) * (1.0 if wt is None else wt)
        np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-6)
    hcl = _core.HyperConnection(_core.Engine("cpu"), {"fn": weight(fn), "base": weight(base), "scale": weight(scale)},
                                hidden=D, hc_mult=hc,
                                sinkhorn_iters=20, hc_eps=1e-6, norm_eps=1e-5, dtype="float32")
    np.testing.assert_array_equal(hcl.pre(streams, norm=w, eps=1e-6)[2], _core.rms_norm(col, w, eps=1e-6))
    np.testing.assert_array_equal(hcl.pre(streams)[2], col)
    for bad in (dict(norm=w), dict(norm=w, eps=-1.0), dict(eps=float("nan")), dict(norm=w[:-1].copy(), eps=1e-6)):
        with pytest.raises(memra.ContractError):
            hcl.pre(streams, **bad)
    # post_pre: the previous site's mhc_post, then pre(norm=, eps=) of the new streams.
    y, pp, cp = randn(r, T, D), randn(r, T, hc), randn(r, T, hc, hc)
    new = _core.mhc_post(y, pp, cp, streams)
    got = hcl.post_pre(y, pp, cp, streams, norm=w, eps=1e-6)
    np.testing.assert_array_equal(got[0], new)
    for g, want in zip(got[1:], hcl.pre(new, norm=w, eps=1e-6)):
        np.testing.assert_array_equal(g, want)
    for bad in (dict(eps=-1.0), dict(eps=float("inf")), dict(norm=w[:-1].copy(), eps=1e-6)):
        with pytest.raises(memra.ContractError):
            hcl.post_pre(y, pp, cp, streams, **bad)
    with pytest.raises(memra.ContractError):
        hcl.post_pre(y[:, :-1].copy(), pp, cp, streams, eps=1e-6)
    # A T mismatch names the argument that disagrees with the streams (and mhc_post's residual).
    with pytest.raises(memra.ContractError, match="y has 3 rows but streams has T = 4"):
        hcl.post_pre(y, pp, cp, np.zeros((4, hc, D), np.float32), eps=1e-6)
    with pytest.raises(memra.ContractError, match="comb has 2 rows but residual has T = 3"):
        _core.mhc_post(y, pp, cp[:2].copy(), streams)


def test_hc_expand_copies_the_row_into_every_stream():
    # Glm5NextTextModel.forward: hidden_states.unsqueeze(2).expand(..., hc_mult, ...).
    x = randn(rng(5), 3, 7)
    for n in (1, 4):
        got = _core.hc_expand(x, n)
        np.testing.assert_array_equal(got, np.broadcast_to(x[:, None, :], (3, n, 7)))
    for bad in (0, -1, 2**31):
        with pytest.raises(memra.ContractError):
            _core.hc_expand(x, bad)


def test_mhc_post_and_head_mean_match_reference():
    r = rng(3)
    T, hc, D = 3, 4, 11
    y, post, comb, res = randn(r, T, D), randn(r, T, hc), randn(r, T, hc, hc), randn(r, T, hc, D)
    out = _core.mhc_post(y, post, comb, res)
    # Decoder layer: post[..., None] * h[..., None, :] + comb^T @ residual
    ref = post[:, :, None].astype(np.float64) * y[:, None, :] + np.matmul(
        comb.transpose(0, 2, 1).astype(np.float64), res.astype(np.float64))
    np.testing.assert_allclose(out, ref, atol=2e-6)
    np.testing.assert_allclose(_core.hc_head_mean(res), res.astype(np.float64).mean(1), atol=1e-6)


def test_mhc_post_head_norm_is_the_three_ops():
    r = rng(5)
    T, hc, D = 3, 4, 11
    y, post, comb, res = randn(r, T, D), randn(r, T, hc), randn(r, T, hc, hc), randn(r, T, hc, D)
    w = randn(r, D)
    got = _core.mhc_post_head_norm(y, post, comb, res, w, eps=1e-6)
    want = _core.rms_norm(_core.hc_head_mean(_core.mhc_post(y, post, comb, res)), w, eps=1e-6)
    np.testing.assert_array_equal(got, want)
    # The reference in float64: the mean of post * y + comb^T @ residual, then the RMS norm.
    s = post[:, :, None].astype(np.float64) * y[:, None, :] + np.matmul(
        comb.transpose(0, 2, 1).astype(np.float64), res.astype(np.float64))
    m = s.mean(1)
    ref = w * m / np.sqrt((m * m).mean(-1, keepdims=True) + 1e-6)
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)
    expect_contract(S.CONTRACT_SHAPE, _core.mhc_post_head_norm, y, post[:, :2].copy(), comb, res, w,
                    eps=1e-6)
    expect_contract(S.CONTRACT_VALUE, _core.mhc_post_head_norm, y, post, comb, res, w, eps=float("nan"))


def test_mhc_contract_errors():
    r = rng(4)
    T, hc, D = 2, 4, 3
    mix = (2 + hc) * hc
    st, fn = randn(r, T, hc, D), weight(randn(r, mix, hc * D))
    base, scale = randn(r, mix), randn(r, 3)
    kw = dict(sinkhorn_iters=20, hc_eps=1e-6, norm_eps=1e-6)
    expect_contract(S.CONTRACT_DTYPE, _core.mhc_pre, st.astype(np.float64), fn, base, scale, **kw)
    expect_contract(S.CONTRACT_SHAPE, _core.mhc_pre, st[0], fn, base, scale, **kw)
    expect_contract(S.CONTRACT_SHAPE, _core.mhc_pre, st, fn, base[:-1].copy(), scale, **kw)
    expect_contract(S.CONTRACT_SHAPE, _core.mhc_pre, randn(r, T, hc, D + 1), fn, base, scale, **kw)
    expect_contract(S.CONTRACT_STRIDE, _core.mhc_pre, randn(r, T, hc, 2 * D)[..., ::2], fn, base,
                    scale, **kw)
    expect_contract(S.CONTRACT_VALUE, _core.mhc_pre, st, fn, base, scale,
                    **{**kw, "sinkhorn_iters": 0})
    y, post, comb = randn(r, T, D), randn(r, T, hc), randn(r, T, hc, hc)
    expect_contract(S.CONTRACT_SHAPE, _core.mhc_post, y, post, comb[:, :3].copy(), st)
    expect_contract(S.CONTRACT_DTYPE, _core.mhc_post, y.astype(np.float64), post, comb, st)
    expect_contract(S.CONTRACT_STRIDE, _core.mhc_post, y, randn(r, T, 2 * hc)[:, ::2], comb, st)
    expect_contract(S.CONTRACT_SHAPE, _core.hc_head_mean, y)


# ---------------------------------------------------------------- sampling

M64 = (1 << 64) - 1
GOLDEN = 0x9E3779B97F4A7C15


def uniform_ref(seed, counter):
    """The formula ops.h documents (splitmix64 step, top 24 bits)."""
    z = seed ^ ((GOLDEN * (counter + 1)) & M64)
    z = (z + GOLDEN) & M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    z ^= z >> 31
    return (z >> 40) / float(1 << 24)


def sample_ref(row, temperature, top_k, top_p, u):
    """ops.h's sample in float32, step by step, for V <= kSampleBlock (one block, where the
    blocked order is plain left to right); returns (token, margin of u*M to a boundary)."""
    f = np.float32
    z = row.astype(f) / f(temperature)
    e = np.exp(z - z.max()).astype(f)
    s = np.cumsum(e, dtype=f)[-1]
    p = (e / s).astype(f)
    order = np.lexsort((np.arange(len(p)), -p))
    k = len(p) if top_k <= 0 or top_k > len(p) else top_k
    kept = order[:k]
    q = (p[kept] / np.cumsum(p[kept], dtype=f)[-1]).astype(f)
    c = np.cumsum(q, dtype=f)
    n = k
    if top_p < 1.0:
        n = int(np.argmax(c >= f(top_p))) + 1 if (c >= f(top_p)).any() else k
    c = c[:n]
    rr = f(f(u) * c[-1])
    i = int(np.argmax(c > rr)) if (c > rr).any() else n - 1
    return int(kept[i]), float(np.min(np.abs(c - rr)))


def test_uniform_from_counter_formula():
    for seed, ctr in [(0, 0), (0, 1), (12345, 7), (M64, M64), (2**40 + 3, 2**33)]:
        assert _core.uniform_from_counter(seed, ctr) == uniform_ref(seed, ctr)


@pytest.mark.parametrize("temperature,top_k,top_p", [(1.0, 0, 1.0), (0.7, 5, 1.0),
                                                     (1.3, 0, 0.9), (0.9, 12, 0.6)])
def test_sample_matches_reference(temperature, top_k, top_p):
    r = rng(5)
    B, V, seed = 64, 101, 77
    logits = randn(r, B, V, scale=2.0)
    ctr = np.arange(1000, 1000 + B, dtype=np.uint64)
    out = _core.sample(logits, ctr, temperature=temperature, top_k=top_k, top_p=top_p, seed=seed)
    assert out.dtype == np.int32 and out.shape == (B,)
    checked = 0
    for b in range(B):
        tok, margin = sample_ref(logits[b], temperature, top_k, top_p, uniform_ref(seed, 1000 + b))
        if margin > 1e-5:  # exp may differ by an ulp between libm and numpy: skip knife edges
            assert out[b] == tok, b
            checked += 1
    assert checked > B // 2


# ops.h's blocked order at V > kSampleBlock, against a step-by-step numpy float32 transcription
# with glibc's expf itself (ctypes), so the reference's every rounding is the spec's and the
# tokens must be equal, with no knife edges to skip.

SAMPLE_BLOCK = 512  # ops.h kSampleBlock


def _glibc_expf():
    import ctypes
    import ctypes.util

    name = ctypes.util.find_library("m")
    try:
        libm = ctypes.CDLL(name)
        fn = libm.expf
        fn.restype, fn.argtypes = ctypes.c_float, [ctypes.c_float]
        ctypes.CDLL(None).gnu_get_libc_version  # glibc only: AttributeError elsewhere
    except (OSError, AttributeError, TypeError):
        pytest.skip("the spec's exp is glibc's expf; no glibc here")
    return lambda x: np.array([fn(float(v)) for v in x], np.float32)


def blocked_running(t, block=SAMPLE_BLOCK):
    """ops.h's blocked order over t (float32): (c [n], the sum). W = left-to-right sums inside
    each block, P = left-to-right sums of the block sums, c_i = P_b + W_i."""
    f = np.float32
    t = np.asarray(t, f)
    c = np.empty(len(t), f)
    P = f(0.0)
    for lo in range(0, len(t), block):
        W = np.cumsum(t[lo:lo + block], dtype=f)  # numpy's cumsum is sequential
        c[lo:lo + block] = P + W
        P = f(P + W[-1])
    return c, P


def sequential_running(t):
    """The old order (one running sum left to right), to show the tests tell them apart."""
    c = np.cumsum(np.asarray(t, np.float32), dtype=np.float32)
    return c, c[-1]


class BlockedRef:
    """ops.h's sample of one row up to the draw; draw(u) gives (token, sorted position)."""

    def __init__(self, row, temperature, top_k, top_p, expf, running=blocked_running):
        f = np.float32
        V = len(row)
        self.token = None
        z = row.astype(f) / f(temperature)
        finite_z = z[~np.isnan(z)]
        m = finite_z.max() if finite_z.size else f(-np.inf)
        with np.errstate(invalid="ignore"):
            e = expf(z - m)
        s = running(e)[1]
        if not (s > 0) or not np.isfinite(s):  # no distribution: the CPU's argmax
            best = 0
            for i in range(1, V):
                if row[i] > row[best]:
                    best = i
            self.token = best
            return
        p = e / s
        order = np.lexsort((np.arange(V), -p))  # p desc, id asc
        k = V if top_k <= 0 or top_k > V else top_k
        self.kept = order[:k]
        mk = running(p[self.kept])[1]
        self.q = p[self.kept] / mk
        self.c, self.mass = running(self.q)
        self.n = k
        if top_p < 1.0:
            hit = np.flatnonzero(self.c >= f(top_p))
            if hit.size:
                self.n, self.mass = int(hit[0]) + 1, self.c[hit[0]]

    def draw(self, u):
        if self.token is not None:
            return self.token, -1
        r = np.float32(u) * self.mass
        hit = np.flatnonzero(self.c[:self.n] > r)
        if hit.size:
            return int(self.kept[hit[0]]), int(hit[0])
        pos = np.flatnonzero(self.q[:self.n] > 0)
        j = int(pos[-1]) if pos.size else 0
        return int(self.kept[j]), j


def uniform_np(seed, counters):
    """uniform_ref over a uint64 array (numpy's uint64 arithmetic wraps modulo 2^64)."""
    g = np.uint64(GOLDEN)
    with np.errstate(over="ignore"):
        z = np.uint64(seed) ^ (g * (counters.astype(np.uint64) + np.uint64(1)))
        z = z + g
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    z ^= z >> np.uint64(31)
    return (z >> np.uint64(40)).astype(np.float64) / float(1 << 24)


@pytest.mark.parametrize("V", [3000, 4096, 5001])
@pytest.mark.parametrize("temperature,top_k,top_p", [(1.0, 0, 1.0), (0.8, 0, 0.9),
                                                     (1.0, 2000, 0.95), (1.2, 700, 1.0),
                                                     (0.6, 1500, 0.8), (1.0, 512, 1.0),
                                                     (1.0, 513, 0.99)])
def test_sample_blocked_order_matches_reference(V, temperature, top_k, top_p):
    # Flat-ish rows over several blocks: the top-p cut and the draws land in later blocks.
    expf = _glibc_expf()
    r = rng(V + top_k)
    B, seed = 10, 31
    logits = randn(r, B, V, scale=0.4)
    ctr = np.arange(B, dtype=np.uint64) * np.uint64(5) + np.uint64(11)
    out = _core.sample(logits, ctr, temperature=temperature, top_k=top_k, top_p=top_p, seed=seed)
    us = uniform_np(seed, ctr)
    late_cut = late_draw = 0
    for b in range(B):
        ref = BlockedRef(logits[b], temperature, top_k, top_p, expf)
        tok, pos = ref.draw(us[b])
        assert out[b] == tok, b
        late_cut += ref.n - 1 >= SAMPLE_BLOCK
        late_draw += pos >= SAMPLE_BLOCK
    if top_k not in (512, 513):  # kept entries past block 0: the cut and some draws land there
        assert late_cut == B and late_draw > 0


def test_sample_blocked_order_tail_row():
    # One large entry then 4095 tiny equal ones, each below half an ulp of a running sum near 1:
    # left to right they would vanish (c stuck at 1.0, the token always id 0), but each later
    # block sums its own tiny terms from 0, so c climbs through blocks 1..7 (by ~1.3e-5 each).
    # The top-p cut and the draws with u near 1 (searched counters) land there.
    expf = _glibc_expf()
    V, seed = 4096, 3
    row = np.full(V, -17.5, np.float32)
    row[0] = 0.0
    ctr_all = np.arange(1 << 20, dtype=np.uint64)
    us_all = uniform_np(seed, ctr_all)
    for top_k, top_p in [(0, 1.0), (0, 0.99996), (3000, 1.0)]:
        ref = BlockedRef(row, 1.0, top_k, top_p, expf)
        seq = BlockedRef(row, 1.0, top_k, top_p, expf, running=sequential_running)
        # counters whose u * M falls past c at the end of block 0
        tail_u = ref.c[SAMPLE_BLOCK - 1] / ref.mass
        pick = np.flatnonzero(us_all > tail_u)[:12]
        assert pick.size >= 4
        ctr = np.concatenate([ctr_all[pick], ctr_all[:4]])
        out = _core.sample(np.repeat(row[None], len(ctr), axis=0), ctr, temperature=1.0,
                           top_k=top_k, top_p=top_p, seed=seed)
        want = [ref.draw(u) for u in uniform_np(seed, ctr)]
        np.testing.assert_array_equal(out, [t for t, _ in want])
        assert all(pos >= SAMPLE_BLOCK for _, pos in want[:pick.size])
        assert any(out[i] != seq.draw(u)[0] for i, u in enumerate(uniform_np(seed, ctr)))
        if top_p < 1.0:
            assert ref.n - 1 >= SAMPLE_BLOCK and seq.n == 1


def test_sample_blocked_order_degenerate_rows():
    # Rows without a distribution take the argmax; one finite entry or all equal entries still
    # go through the blocked sums (p = 1 / V each over 6 blocks).
    expf = _glibc_expf()
    V, seed = 3000, 8
    rows = np.zeros((6, V), np.float32)
    rows[0, :] = 1.5                          # all equal: p = 1/V, ids in order, c blocked
    rows[1, :] = -np.inf
    rows[1, 2900] = 0.25                      # a single finite entry, in a later block: drawn
    rows[2, :] = -np.inf                      # all -inf: no distribution, argmax = 0
    rows[3] = randn(rng(9), V)
    rows[3, 0] = np.nan                       # NaN at id 0: argmax keeps 0
    rows[4] = randn(rng(10), V)
    rows[4, 7] = np.nan                       # NaN elsewhere: argmax of the rest
    rows[5] = randn(rng(11), V)
    rows[5, 2222] = np.inf                    # +inf: argmax = the inf
    ctr = np.array([900, 901, 902, 903, 904, 905], np.uint64)
    us = uniform_np(seed, ctr)
    for kw in (dict(top_k=0, top_p=1.0), dict(top_k=2000, top_p=0.7)):
        out = _core.sample(rows, ctr, temperature=0.9, seed=seed, **kw)
        want = [BlockedRef(rows[b], 0.9, kw["top_k"], kw["top_p"], expf).draw(us[b])[0]
                for b in range(len(rows))]
        np.testing.assert_array_equal(out, want)
        assert out[1] == 2900 and out[2] == 0 and out[3] == 0 and out[5] == 2222
        assert out[4] == np.nanargmax(rows[4])
    # All equal: the token is the draw's position (ids in order), over several blocks.
    ctr = np.arange(64, dtype=np.uint64)
    out = _core.sample(np.repeat(rows[:1], 64, axis=0), ctr, temperature=1.0, seed=seed)
    ref = BlockedRef(rows[0], 1.0, 0, 1.0, expf)
    np.testing.assert_array_equal(out, [ref.draw(u)[0] for u in uniform_np(seed, ctr)])
    assert (out >= SAMPLE_BLOCK).sum() > 32


def test_sample_greedy_and_degenerate_filters():
    r = rng(6)
    B, V = 9, 40
    logits = randn(r, B, V)
    logits[:, 3] = logits[:, 17] = 9.0  # ties at the top go to the lower id
    ctr = np.arange(B, dtype=np.int64)
    greedy = _core.sample(logits, ctr, temperature=0.0)
    assert greedy.tolist() == [3] * B
    assert _core.sample(logits, ctr, temperature=1.0, top_k=1).tolist() == [3] * B
    assert _core.sample(logits, ctr, temperature=1.0, top_p=1e-7).tolist() == [3] * B
    a = _core.sample(logits, ctr, temperature=1.0, seed=5)
    b = _core.sample(logits, ctr, temperature=1.0, seed=5)
    np.testing.assert_array_equal(a, b)


def test_sample_histogram():
    logits = np.array([[1.0, 0.0, 2.0, -1.0, 0.5]], np.float32)
    p = np.exp(logits[0] / 0.8)
    p /= p.sum()
    n = 20000
    toks = np.array([_core.sample(logits, np.array([c], np.uint64), temperature=0.8, seed=9)[0]
                     for c in range(n)])
    freq = np.bincount(toks, minlength=5) / n
    np.testing.assert_allclose(freq, p, atol=5 * np.sqrt(p * (1 - p) / n).max())


def test_sample_contract_errors():
    r = rng(7)
    logits = randn(r, 3, 10)
    ctr = np.arange(3, dtype=np.uint64)
    expect_contract(S.CONTRACT_DTYPE, _core.sample, logits.astype(np.float64), ctr,
                    temperature=1.0)
    expect_contract(S.CONTRACT_DTYPE, _core.sample, logits, ctr.astype(np.int32), temperature=1.0)
    expect_contract(S.CONTRACT_SHAPE, _core.sample, logits, ctr[:2], temperature=1.0)
    expect_contract(S.CONTRACT_SHAPE, _core.sample, logits[0], ctr[:1], temperature=1.0)
    expect_contract(S.CONTRACT_STRIDE, _core.sample, randn(r, 3, 20)[:, ::2], ctr, temperature=1.0)
    expect_contract(S.CONTRACT_STRIDE, _core.sample, logits, np.arange(6, dtype=np.uint64)[::2],
                    temperature=1.0)
    expect_contract(S.CONTRACT_RANGE, _core.sample, logits, np.array([0, -1, 2], np.int64),
                    temperature=1.0)
    expect_contract(S.CONTRACT_VALUE, _core.sample, logits, ctr, temperature=1.0, top_p=0.0)
