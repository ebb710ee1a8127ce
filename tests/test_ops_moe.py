"""The grouped sigmoid router and the routed experts of the CPU backend (``memra._core.moe_route``
/ ``moe_forward``, cpu/moe.cpp) against numpy references transcribed from transformers 5.17
``models/glm5_next/modeling_glm5_next.py`` (Glm5NextTextTopkRouter, Glm5NextTextExperts). numpy
only: CI has neither torch nor transformers.
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


def weight(a):
    return _core.Weight(np.ascontiguousarray(a))


def expect_contract(code, fn, *args, **kwargs):
    with pytest.raises(memra.ContractError) as ei:
        fn(*args, **kwargs)
    assert ei.value.code == code, str(ei.value)
    return ei.value


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
