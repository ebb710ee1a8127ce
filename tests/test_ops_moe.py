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
from cuda_helpers import randn, rng
from moe_reference import mlp64

S = _core.status


def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


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


def test_moe_route_norm_denominator_keeps_its_eps_on_saturated_scores():
    # Glm5NextTextTopkRouter: topk_weights / (topk_weights.sum() + 1e-20). Scores of logits near
    # -70 are ~1e-30, so the 1e-20 dominates and the weights stay ~1e-10 (not renormalised to a
    # sum of 1); logits of -120 give f32 sigmoid scores of exactly 0, so without the eps 0 / 0.
    E = 8
    logits = np.array([[-70.0, -72.0, -75.0, -80.0, -85.0, -86.0, -88.0, -69.0],
                       [-120.0] * E], np.float32)
    eye = np.eye(E, dtype=np.float32)
    idx, w = _core.moe_route(logits, weight(eye), top_k=2, n_group=1, topk_group=1,
                             norm_topk_prob=True, scaling=2.5)
    ridx, rw = route_ref(logits, eye, None, 2, 1, 1, True, 2.5)
    assert ridx.tolist() == [[7, 0], [0, 1]]
    np.testing.assert_array_equal(idx, ridx)
    assert np.all(np.isfinite(w))
    assert rw[0].sum() < 1e-9  # the eps is what the reference divides by
    np.testing.assert_allclose(w, rw, rtol=1e-5, atol=1e-30)


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
    one = {**kw, "top_k": 1, "n_group": 1, "topk_group": 1}
    e = expect_contract(S.CONTRACT_VALUE, _core.moe_route, x, weight(np.zeros((0, D), np.float32)), **one)
    assert "at least one expert" in str(e), str(e)


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
            ref[t] += w[t, j] * mlp64(x[t : t + 1], g[e], u[e], d[e], limit)[0]
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


# ---------------------------------------------------------------- the Qwen MoE: softmax router, gated shared expert


def softmax_route_ref(x, gw, top_k, norm, scaling):
    """Qwen3_5MoeTopKRouter / Qwen3NextTopKRouter.forward (float64): softmax over the logits, top_k
    by p (ties: lower id), p of those, / their sum when norm_topk_prob."""
    logits = x.astype(np.float64) @ gw.T.astype(np.float64)
    p = np.exp(logits - logits.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    T, E = p.shape
    idx = np.stack([np.lexsort((np.arange(E), -p[t]))[:top_k] for t in range(T)]).astype(np.int32)
    w = np.take_along_axis(p, idx, 1)
    if norm:
        w = w / w.sum(-1, keepdims=True)
    return idx, w * scaling


@pytest.mark.parametrize("T,E,top_k,norm", [(1, 8, 2, True), (7, 12, 3, False), (19, 64, 8, True),
                                            (3, 512, 10, True), (4, 256, 40, False)])
def test_moe_route_softmax_matches_reference(T, E, top_k, norm):
    r = rng(E + 3 * T)
    D = 16
    x, gw = randn(r, T, D), randn(r, E, D, scale=0.7)
    idx, w = _core.moe_route(x, weight(gw), top_k=top_k, n_group=1, topk_group=1, norm_topk_prob=norm,
                             scaling=1.5, scoring="softmax")
    ridx, rw = softmax_route_ref(x, gw, top_k, norm, 1.5)
    np.testing.assert_array_equal(idx, ridx)
    np.testing.assert_allclose(w, rw, atol=1e-7, rtol=2e-6)


def test_moe_route_softmax_ties_and_saturation():
    # Identity gate: x holds the logits. Equal logits go to the lower id; a logit far above the
    # others takes all the mass (no overflow: the max is subtracted), the rest underflow to p = 0
    # and tie there (the choice compares p, as transformers' topk over the probabilities does).
    eye = weight(np.eye(6, dtype=np.float32))
    logits = np.array([[1.0, 2.0, 2.0, 0.5, 2.0, -1.0], [200.0, -200.0, 0.0, 0.0, 0.0, 0.0]], np.float32)
    idx, w = _core.moe_route(logits, eye, top_k=3, n_group=1, topk_group=1, norm_topk_prob=False, scaling=1.0,
                             scoring="softmax")
    assert idx.tolist() == [[1, 2, 4], [0, 1, 2]]
    np.testing.assert_allclose(w[0], np.exp(2.0) / np.exp(logits[0].astype(np.float64)).sum(), rtol=1e-6)
    assert w[1].tolist() == [1.0, 0.0, 0.0] and np.isfinite(w).all()
    _, wn = _core.moe_route(logits, eye, top_k=3, n_group=1, topk_group=1, norm_topk_prob=True, scaling=1.0,
                            scoring="softmax")
    np.testing.assert_allclose(wn[0], [1 / 3] * 3, rtol=1e-6)


def test_moe_route_softmax_contract_errors():
    r = rng(4)
    E, D = 8, 5
    gw, x = weight(randn(r, E, D)), randn(r, 3, D)
    kw = dict(top_k=2, n_group=1, topk_group=1, norm_topk_prob=True, scaling=1.0, scoring="softmax")
    expect_contract(S.CONTRACT_VALUE, _core.moe_route, x, gw, **{**kw, "scoring": "tanh"})
    expect_contract(S.CONTRACT_VALUE, _core.moe_route, x, gw, **{**kw, "n_group": 2})
    expect_contract(S.CONTRACT_VALUE, _core.moe_route, x, gw, randn(r, E), **kw)
    expect_contract(S.CONTRACT_VALUE, _core.moe_route, x, gw, **{**kw, "top_k": 9})


def shared_gate_ref(x, gate_w, shared, routed):
    g = x.astype(np.float64) @ gate_w.astype(np.float64)
    return routed + sigmoid(g)[:, None] * shared


@pytest.mark.parametrize("T,D", [(1, 8), (5, 64), (3, 1000)])
def test_moe_shared_gate_matches_reference(T, D):
    r = rng(T * D)
    x, gw, shared, routed = randn(r, T, D), randn(r, D, scale=D**-0.5), randn(r, T, D), randn(r, T, D)
    y = _core.moe_shared_gate(x, gw, shared, routed)
    assert y.dtype == np.float32 and y.shape == (T, D)
    np.testing.assert_allclose(y, shared_gate_ref(x, gw, shared, routed), atol=2e-6, rtol=1e-6)
    # Gate extremes: sigmoid saturates to 0 and 1 with no NaN.
    big = np.full(D, 50.0 / D, np.float32)
    ones = np.ones((2, D), np.float32)
    y = _core.moe_shared_gate(np.stack([ones[0], -ones[0]]) * 10, big, ones, np.zeros((2, D), np.float32))
    np.testing.assert_array_equal(y, np.stack([ones[0], np.zeros(D, np.float32)]))


def test_moe_shared_gate_contract_errors():
    r = rng(5)
    x, gw, s = randn(r, 3, 4), randn(r, 4), randn(r, 3, 4)
    expect_contract(S.CONTRACT_SHAPE, _core.moe_shared_gate, x, randn(r, 5), s, s)
    expect_contract(S.CONTRACT_SHAPE, _core.moe_shared_gate, x, gw, randn(r, 2, 4), s)
    expect_contract(S.CONTRACT_SHAPE, _core.moe_shared_gate, x, gw, s, randn(r, 3, 5))
    expect_contract(S.CONTRACT_DTYPE, _core.moe_shared_gate, x.astype(np.float64), gw, s, s)
    expect_contract(S.CONTRACT_STRIDE, _core.moe_shared_gate, x, gw, randn(r, 3, 8)[:, ::2], s)


def qwen_moe_layer(r, E, D, I, I_s, top_k, norm, dtype="float32", engine=None):
    """A MoeLayer in the Qwen form with random weights; returns (layer, numpy weights)."""
    w = {"gate.weight": randn(r, E, D, scale=0.8), "shared_expert_gate.weight": randn(r, 1, D, scale=0.5)}
    for e in range(E):
        w[f"experts.{e}.gate_proj.weight"] = randn(r, I, D, scale=0.5)
        w[f"experts.{e}.up_proj.weight"] = randn(r, I, D, scale=0.5)
        w[f"experts.{e}.down_proj.weight"] = randn(r, D, I, scale=0.5)
    for n, s in (("gate_proj", (I_s, D)), ("up_proj", (I_s, D)), ("down_proj", (D, I_s))):
        w[f"shared_experts.{n}.weight"] = randn(r, *s, scale=0.5)
    layer = _core.MoeLayer(engine or memra.Engine("cpu"), {k: weight(v) for k, v in w.items()}, hidden=D,
                           n_experts=E, top_k=top_k, n_group=1, topk_group=1, intermediate=I,
                           shared_intermediate=I_s, norm_topk_prob=norm, routed_scaling=1.0,
                           swiglu_limit=float("inf"), scoring="softmax", shared_gate=True, dtype=dtype)
    return layer, w


def qwen_moe_ref(x, w, E, top_k, norm):
    """Qwen3_5MoeSparseMoeBlock.forward (float64; Qwen3NextSparseMoeBlock with norm_topk_prob)."""
    idx, wt = softmax_route_ref(x, w["gate.weight"], top_k, norm, 1.0)
    inf = float("inf")
    y = np.zeros(x.shape, np.float64)
    for t in range(len(x)):
        for j in range(top_k):
            e = idx[t, j]
            y[t] += wt[t, j] * mlp64(x[t:t + 1], w[f"experts.{e}.gate_proj.weight"], w[f"experts.{e}.up_proj.weight"],
                                       w[f"experts.{e}.down_proj.weight"], inf)[0]
    shared = mlp64(x, *(w[f"shared_experts.{n}.weight"] for n in ("gate_proj", "up_proj", "down_proj")), inf)
    gate = sigmoid(x.astype(np.float64) @ w["shared_expert_gate.weight"][0].astype(np.float64))
    return y + gate[:, None] * shared, idx


@pytest.mark.parametrize("T,norm", [(1, True), (9, True), (6, False)])
def test_qwen_moe_layer_matches_reference(T, norm):
    r = rng(40 + T)
    E, D, I, I_s, k = 8, 16, 12, 20, 2
    layer, w = qwen_moe_layer(r, E, D, I, I_s, k, norm)
    x = randn(r, T, D)
    y, idx = layer.forward_with_experts(x)
    want, ridx = qwen_moe_ref(x, w, E, k, norm)
    np.testing.assert_array_equal(idx, ridx)
    np.testing.assert_allclose(y, want, atol=2e-5 * np.abs(want).max(), rtol=1e-5)


def test_qwen_moe_layer_refusals():
    r = rng(6)
    E, D, I = 4, 8, 6
    _, w = qwen_moe_layer(r, E, D, I, I, 2, True)
    kw = dict(hidden=D, n_experts=E, top_k=2, n_group=1, topk_group=1, intermediate=I, shared_intermediate=I,
              norm_topk_prob=True, routed_scaling=1.0, swiglu_limit=float("inf"), scoring="softmax",
              shared_gate=True, dtype="float32")
    eng = memra.Engine("cpu")
    W = {k: weight(v) for k, v in w.items()}
    with pytest.raises(memra.ContractError, match="scoring must be 'sigmoid' or 'softmax'"):
        _core.MoeLayer(eng, dict(W), **{**kw, "scoring": "relu"})
    with pytest.raises(memra.ContractError, match="no expert groups"):
        _core.MoeLayer(eng, dict(W), **{**kw, "n_group": 2})
    # shared_intermediate 0 is a layer without a shared expert: full-width shared tensors are named
    with pytest.raises(memra.ContractError, match=r"'shared_experts.gate_proj.weight' has shape \[6, 8\], expected \[0, 8\]"):
        _core.MoeLayer(eng, dict(W), **{**kw, "shared_intermediate": 0})
    with pytest.raises(memra.ContractError, match="shared_expert_gate.weight"):
        _core.MoeLayer(eng, {k: v for k, v in W.items() if k != "shared_expert_gate.weight"}, **kw)
    with pytest.raises(memra.ContractError, match="shared_expert_gate.weight"):  # without shared_gate: unexpected
        _core.MoeLayer(eng, dict(W), **{**kw, "shared_gate": False})
    with pytest.raises(memra.ContractError, match="e_score_correction_bias"):  # the softmax router has none
        _core.MoeLayer(eng, {**W, "gate.e_score_correction_bias": weight(randn(r, E))}, **kw)
