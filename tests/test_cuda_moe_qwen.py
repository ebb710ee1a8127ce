"""The Qwen MoE's ops on the CUDA backend against the CPU backend (the numeric oracle): the softmax
router (``memra._core.moe_route(scoring="softmax")``, cuda/moe_route.cu
``moe_route_softmax_kernel``; ``route_rows_kernel`` at 2..64 tokens), the shared expert's gate (``memra._core.moe_shared_gate``,
cuda/moe_shared_gate.cu) and MoeLayer in the Qwen form (both of them, the routed experts and the
shared MLP), plus their argument contract on the device and the sigmoid router unchanged.

Tolerances (both sides f32):
- moe_route softmax: router logits made exact on both sides (gate_w = identity), values drawn
  with gaps, so the experts chosen must be identical; weights: CUDA's expf is within 2 ulp of
  glibc's and the warp sums in another order: ``rtol=2e-6, atol=1e-7``. With a dense gate the
  logits differ by the GEMM's summation order: tokens whose CPU choice has a probability margin
  above 1e-5 must choose alike.
- moe_shared_gate: the dot product summed in another order, expf: ``close_scaled(1e-6)``; the
  element update is one rounded product and one rounded sum on both, so a gate computed as 0 or 1
  exactly gives identical bytes.
- MoeLayer (Qwen form) vs the CPU layer: ``close_scaled(1e-5)`` in f32, 2e-2 with bf16 weights
  (the same bf16 values on both sides; the device rounds the shared MLP's activations as its
  GEMMs do), identical expert choices.

A small shape for ``compute-sanitizer``: ``python -m pytest tests/test_cuda_moe_qwen.py -k sanitizer``.
"""

from __future__ import annotations

import numpy as np
import pytest

import memra
from memra import _core
from cuda_helpers import bf16_weight, close_scaled, dweight, expect, f32, randn, rng, weight

pytestmark = pytest.mark.cuda

ST = _core.status


def softmax64(logits):
    z = logits.astype(np.float64)
    p = np.exp(z - z.max(-1, keepdims=True))
    return p / p.sum(-1, keepdims=True)


# ---------------------------------------------------------------- softmax router
@pytest.mark.parametrize("E,top_k", [(8, 2), (64, 8), (256, 8), (512, 10), (100, 40)])
@pytest.mark.parametrize("T", [1, 5, 64, 200])  # the GEMV, route_rows_kernel, the SGEMM
@pytest.mark.parametrize("norm", [True, False])
def test_softmax_route_exact_logits_match_cpu(e, T, E, top_k, norm):
    r = rng(T * 11 + E + top_k + norm)
    # Distinct logits a grid step apart (jittered), so no two probabilities tie.
    x = f32(np.stack([r.permutation(np.linspace(-4, 4, E) + r.uniform(-0.1, 0.1, E) * 8 / E) for _ in range(T)]))
    gate = np.eye(E, dtype=np.float32)
    kw = dict(top_k=top_k, n_group=1, topk_group=1, norm_topk_prob=norm, scaling=1.0, scoring="softmax")
    want_i, want_w = _core.moe_route(x, weight(gate), **kw)
    got_i, got_w = _core.moe_route(e.to_device(x), dweight(e, gate), engine=e, **kw)
    got_i, got_w = e.to_host(got_i), e.to_host(got_w)
    assert got_i.dtype == np.int32 and got_i.shape == (T, top_k)
    np.testing.assert_array_equal(got_i, want_i)
    np.testing.assert_allclose(got_w, want_w, rtol=2e-6, atol=1e-7)


def test_softmax_route_ties_go_to_lower_ids(e):
    x = np.zeros((3, 16), np.float32)  # every probability 1/16
    x[1, [3, 9, 12]] = 1.0
    gate = np.eye(16, dtype=np.float32)
    kw = dict(top_k=4, n_group=1, topk_group=1, norm_topk_prob=True, scaling=1.0, scoring="softmax")
    want_i, want_w = _core.moe_route(x, weight(gate), **kw)
    got_i, got_w = (e.to_host(a) for a in _core.moe_route(e.to_device(x), dweight(e, gate), engine=e, **kw))
    assert got_i.tolist() == want_i.tolist() == [[0, 1, 2, 3], [3, 9, 12, 0], [0, 1, 2, 3]]
    np.testing.assert_allclose(got_w, want_w, rtol=2e-6)


@pytest.mark.parametrize("T", [1, 7, 64, 300])
def test_softmax_route_dense_gate_matches_cpu_where_margins_are_clear(e, T):
    r = rng(300 + T)
    E, D, k = 64, 96, 8
    x, gate = randn(r, T, D), randn(r, E, D, scale=0.3)
    kw = dict(top_k=k, n_group=1, topk_group=1, norm_topk_prob=True, scaling=1.0, scoring="softmax")
    want_i, want_w = _core.moe_route(x, weight(gate), **kw)
    got_i, got_w = (e.to_host(a) for a in _core.moe_route(e.to_device(x), dweight(e, gate), engine=e, **kw))
    p = np.sort(softmax64(x.astype(np.float64) @ gate.T.astype(np.float64)), axis=1)[:, ::-1]
    clear = (p[:, k - 1] - p[:, k]) > 1e-5
    assert clear.sum() >= 0.9 * T
    np.testing.assert_array_equal(got_i[clear], want_i[clear])
    np.testing.assert_allclose(got_w[clear], want_w[clear], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("T", [2, 32, 64])
def test_softmax_route_rows_do_not_depend_on_the_batch(e, T):
    # The softmax routing in route_rows_kernel (64 experts, its widest; top 10; Qwen3-Next's
    # D = 2048: two splits of K): a token's choice and weights are the same bytes whatever the
    # other rows of the call (reversed, or two of them alone), and the CPU's where its margins
    # are clear.
    r = rng(700 + T)
    E, D, k = 64, 2048, 10
    x, gate = randn(r, T, D), randn(r, E, D, scale=0.02)
    kw = dict(top_k=k, n_group=1, topk_group=1, norm_topk_prob=True, scaling=1.0, scoring="softmax")
    dg = dweight(e, gate)

    def run(rows):
        return tuple(e.to_host(a) for a in _core.moe_route(e.to_device(f32(rows)), dg, engine=e, **kw))

    got_i, got_w = run(x)
    rev_i, rev_w = run(x[::-1])
    np.testing.assert_array_equal(rev_i, got_i[::-1])
    np.testing.assert_array_equal(rev_w, got_w[::-1])
    pair_i, pair_w = run(x[[T - 1, 0]])
    np.testing.assert_array_equal(pair_i, got_i[[T - 1, 0]])
    np.testing.assert_array_equal(pair_w, got_w[[T - 1, 0]])
    want_i, want_w = _core.moe_route(x, weight(gate), **kw)
    p = np.sort(softmax64(x.astype(np.float64) @ gate.T.astype(np.float64)), axis=1)[:, ::-1]
    clear = (p[:, k - 1] - p[:, k]) > 1e-5
    assert clear.sum() >= 0.8 * T
    np.testing.assert_array_equal(got_i[clear], want_i[clear])
    np.testing.assert_allclose(got_w[clear], want_w[clear], rtol=1e-5, atol=1e-6)


def test_sigmoid_route_is_the_default_and_unchanged(e):
    # scoring defaults to 'sigmoid': the same call with and without it gives the same bytes.
    r = rng(9)
    x, gate = randn(r, 4, 8), randn(r, 16, 8)
    kw = dict(top_k=3, n_group=4, topk_group=2, norm_topk_prob=True, scaling=2.5)
    a = [e.to_host(v) for v in _core.moe_route(e.to_device(x), dweight(e, gate), engine=e, **kw)]
    b = [e.to_host(v) for v in _core.moe_route(e.to_device(x), dweight(e, gate), engine=e, scoring="sigmoid", **kw)]
    for u, v in zip(a, b):
        np.testing.assert_array_equal(u, v)


def test_softmax_route_contract_errors(e):
    r = rng(10)
    x, gate = randn(r, 3, 8), randn(r, 8, 8)
    kw = dict(top_k=2, n_group=1, topk_group=1, norm_topk_prob=True, scaling=1.0, scoring="softmax")
    f = _core.moe_route
    expect(memra.ContractError, ST.CONTRACT_VALUE, f, e.to_device(x), dweight(e, gate), engine=e,
           **{**kw, "n_group": 2})
    expect(memra.ContractError, ST.CONTRACT_VALUE, f, e.to_device(x), dweight(e, gate), e.to_device(randn(r, 8)),
           engine=e, **kw)
    expect(memra.ContractError, ST.CONTRACT_VALUE, f, e.to_device(x), dweight(e, gate), engine=e,
           **{**kw, "scoring": "tanh"})
    expect(memra.ContractError, ST.CONTRACT_VALUE, f, e.to_device(x), dweight(e, gate), engine=e,
           **{**kw, "top_k": 9})
    expect(memra.ContractError, ST.CONTRACT_DEVICE, f, x, dweight(e, gate), engine=e, **kw)


# ---------------------------------------------------------------- the shared expert's gate
@pytest.mark.parametrize("T,D", [(1, 8), (1, 2048), (3, 520), (64, 2560), (500, 64)])
def test_shared_gate_matches_cpu(e, T, D):
    r = rng(T + D)
    x, gw, s, y0 = randn(r, T, D), randn(r, D, scale=D**-0.5), randn(r, T, D), randn(r, T, D)
    want = _core.moe_shared_gate(x, gw, s, y0)
    got = e.to_host(_core.moe_shared_gate(*(e.to_device(a) for a in (x, gw, s, y0)), engine=e))
    close_scaled(got, want, 1e-6)


def test_shared_gate_saturated_is_exact(e):
    # g = +-40: sigmoid rounds to exactly 1 and 0 on both backends, so y = routed + shared or
    # routed, rounded once: the same bytes.
    D = 256
    x = np.stack([np.full(D, 1.0, np.float32), np.full(D, -1.0, np.float32)])
    gw = np.full(D, 40.0 / D, np.float32)
    r = rng(11)
    s, y0 = randn(r, 2, D), randn(r, 2, D)
    want = _core.moe_shared_gate(x, gw, s, y0)
    got = e.to_host(_core.moe_shared_gate(*(e.to_device(a) for a in (x, gw, s, y0)), engine=e))
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(got[1], y0[1])


def test_shared_gate_contract_errors(e):
    r = rng(12)
    x, gw, s = randn(r, 3, 4), randn(r, 4), randn(r, 3, 4)
    d = e.to_device
    f = _core.moe_shared_gate
    expect(memra.ContractError, ST.CONTRACT_SHAPE, f, d(x), d(randn(r, 5)), d(s), d(s), engine=e)
    expect(memra.ContractError, ST.CONTRACT_SHAPE, f, d(x), d(gw), d(randn(r, 2, 4)), d(s), engine=e)
    expect(memra.ContractError, ST.CONTRACT_DEVICE, f, x, d(gw), d(s), d(s), engine=e)
    expect(memra.ContractError, ST.CONTRACT_DTYPE, f, d(x.astype(np.float64)), d(gw), d(s), d(s), engine=e)
    assert np.isfinite(e.to_host(f(d(x), d(gw), d(s), d(s), engine=e))).all()


# ---------------------------------------------------------------- MoeLayer in the Qwen form
def qwen_weights(r, E, D, I, I_s, dtype):
    wt = bf16_weight if dtype == "bfloat16" else weight
    w = {"gate.weight": weight(randn(r, E, D, scale=1.5 / D**0.5)),  # router logits O(1.5), as the fixtures
         "shared_expert_gate.weight": wt(randn(r, 1, D, scale=D**-0.5))}
    for n in range(E):
        w[f"experts.{n}.gate_proj.weight"] = wt(randn(r, I, D, scale=0.3))
        w[f"experts.{n}.up_proj.weight"] = wt(randn(r, I, D, scale=0.3))
        w[f"experts.{n}.down_proj.weight"] = wt(randn(r, D, I, scale=0.3))
    for n, s in (("gate_proj", (I_s, D)), ("up_proj", (I_s, D)), ("down_proj", (D, I_s))):
        w[f"shared_experts.{n}.weight"] = wt(randn(r, *s, scale=0.3))
    return w


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("E,D,I,I_s,k,norm", [(8, 64, 16, 32, 2, True), (64, 256, 64, 64, 8, True),
                                              (16, 520, 48, 48, 4, False)])
@pytest.mark.parametrize("T", [1, 3, 17])
def test_qwen_moe_layer_matches_cpu(e, T, E, D, I, I_s, k, norm, dtype):
    r = rng(T + E + D + (dtype == "bfloat16"))
    w = qwen_weights(r, E, D, I, I_s, dtype)
    kw = dict(hidden=D, n_experts=E, top_k=k, n_group=1, topk_group=1, intermediate=I, shared_intermediate=I_s,
              norm_topk_prob=norm, routed_scaling=1.0, swiglu_limit=float("inf"), scoring="softmax",
              shared_gate=True)
    x = randn(r, T, D)
    want, want_idx = memra.MoeLayer(memra.Engine("cpu"), w, dtype=dtype, **kw).forward_with_experts(x)
    layer = memra.MoeLayer(e, w, dtype=dtype, **kw)
    got, idx = layer.forward_with_experts(e.to_device(x))
    assert np.array_equal(e.to_host(idx), want_idx)
    got = e.to_host(got)
    close_scaled(got, want, 1e-5 if dtype == "float32" else 2e-2)
    assert np.array_equal(e.to_host(layer.forward(e.to_device(x))), got)


def test_sanitizer_small_shapes(e):
    """One small call of the softmax router and the shared gate (compute-sanitizer sized)."""
    r = rng(13)
    T, D, E = 3, 16, 8
    x = randn(r, T, D)
    i, w = _core.moe_route(e.to_device(x), dweight(e, randn(r, E, D)), engine=e, top_k=2, n_group=1,
                           topk_group=1, norm_topk_prob=True, scaling=1.0, scoring="softmax")
    y = _core.moe_shared_gate(e.to_device(x), e.to_device(randn(r, D)), e.to_device(randn(r, T, D)),
                              e.to_device(randn(r, T, D)), engine=e)
    assert np.isfinite(e.to_host(y)).all() and np.isfinite(e.to_host(w)).all()
    assert ((e.to_host(i) >= 0) & (e.to_host(i) < E)).all()
