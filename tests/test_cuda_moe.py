"""The MoE router and routed experts on the CUDA backend (``memra._core.moe_route`` /
``moe_forward`` with ``engine=memra.Engine("cuda")``, kernels in cuda/moe_route.cu,
cuda/moe_experts.cu and cuda/moe_grouped.cu) and the MoeLayer on the device against the same ops
on the CPU backend (cpp/src/cpu/moe.cpp, the numeric oracle), plus the argument contract on the
device.

Tolerances (both sides f32 unless said):
- moe_route: router logits made exact on both sides (gate_w = identity, so every dot is one
  product by 1), values drawn with gaps >= 1e-3, so the choice of experts has clear margins and
  the indices must be identical (np.array_equal). Weights: CUDA's expf is within 2 ulp of glibc's,
  a few more ulps through the renormalisation: ``rtol=1e-6, atol=1e-6``. Ties (equal logits,
  equal biases) must go to the lower group / expert id on both. With a dense random gate_w the
  logits differ by the GEMM's summation order: tokens whose CPU choice has a margin > 1e-4 must
  match exactly.
- moe_forward, CUDA-core kernels (float32 weights; bfloat16 weights at T = 1, and at any T on an
  engine made with KernelOptions(moe_tensor_cores=False)): activations stay f32 on the GPU (bf16
  weights widened, x not rounded), like the CPU; only the dot products' summation order differs:
  ``rtol=1e-5, atol=1e-5 * max|y|`` (the same bf16 values on both sides). From T = 2 on they run
  grouped by expert, every dot product and sum the per-pair kernels' own: the T >= 2 result
  equals, bit for bit, the rows run one at a time (T = 1) and the per-pair kernels forced at the
  same T (an engine made with KernelOptions(moe_grouped_min_t=)).
- moe_forward over bfloat16 weights from T = 2 with D and I multiples of 8 (the default engine):
  the tensor-core arm (cuda/moe_tc.cu), which rounds x and the SwiGLU output to bf16: within the
  bf16-derived bound of tests/moe_reference.py of the CPU on x (tests/test_cuda_moe_tc.py has its
  own cases); elsewhere the CUDA-core kernels above, well inside that bound.

A small shape for ``compute-sanitizer --tool racecheck`` / ``--tool memcheck``:
``python -m pytest tests/test_cuda_moe.py -k sanitizer``.
"""

from __future__ import annotations


import numpy as np
import pytest

import memra
from memra import _core
from cuda_helpers import (bf16_round, bf16_weight, close_scaled, dweight, engine_with, expect, f32,
                          kernel_names, randn, rng, scaled_close, weight)
from moe_reference import assert_within_tc_bound

pytestmark = pytest.mark.cuda

ST = _core.status


# ---------------------------------------------------------------- moe_route


def separated_values(r, n, lo=-2.0, hi=2.0):
    """n distinct values in [lo, hi] in random order: a grid of step (hi - lo) / (n - 1) with a
    jitter of at most a quarter step, so neighbours stay >= half a step apart (sigmoid' >= 0.1
    on [-2, 2]: the scores keep gaps >= 0.05 * step)."""
    step = (hi - lo) / max(n - 1, 1)
    v = np.linspace(lo, hi, n) + r.uniform(-0.25 * step, 0.25 * step, n)
    return f32(r.permutation(v))


def route_margin(logits, bias, top_k, n_group, topk_group):
    """Smallest gap (float64) at the two cuts of the CPU's selection: group scores around the
    topk_group cut and choice scores around the top_k cut."""
    s = 1.0 / (1.0 + np.exp(-logits.astype(np.float64)))
    c = s + (0.0 if bias is None else bias.astype(np.float64))
    T, E = c.shape
    per = E // n_group
    m = np.inf
    for t in range(T):
        grp = c[t].reshape(n_group, per)
        gs = np.sort(grp, axis=1)[:, ::-1][:, : min(2, per)].sum(1)
        order = np.sort(gs)[::-1]
        if topk_group < n_group:
            m = min(m, order[topk_group - 1] - order[topk_group])
        keep = np.argsort(-gs, kind="stable")[:topk_group]
        kept = np.concatenate([c[t, g * per : (g + 1) * per] for g in keep])
        ko = np.sort(kept)[::-1]
        if top_k < len(ko):
            m = min(m, ko[top_k - 1] - ko[top_k])
    return m


ROUTE_CASES = [  # E, top_k, n_group, topk_group
    (16, 4, 4, 2),
    (16, 3, 1, 1),
    (64, 6, 8, 3),
    (288, 8, 8, 4),  # GLM-5.3-Flash's 288 experts (grouping for coverage)
    (288, 8, 1, 1),
]


@pytest.mark.parametrize("E,top_k,n_group,topk_group", ROUTE_CASES)
@pytest.mark.parametrize("T", [1, 2, 5, 64, 65, 200])  # the GEMV, route_rows_kernel, the SGEMM
@pytest.mark.parametrize("with_bias,norm", [(False, True), (True, True), (True, False)])
def test_moe_route_exact_logits_match_cpu(e, T, E, top_k, n_group, topk_group, with_bias, norm):
    r = rng(T * 7 + E + top_k + 31 * with_bias + norm)
    gate = np.eye(E, dtype=np.float32)  # logits == x exactly on both backends
    # A bias of 0 or 1: the biased experts are chosen first whatever their score, and the
    # choice keeps the scores' gaps (s + 1 rounds to ulp(1) ~ 1.2e-7, far below them).
    bias = f32(r.integers(0, 2, E)) if with_bias else None
    rows = []
    while len(rows) < T:  # redraw the rare row whose two group scores nearly tie at the cut
        row = separated_values(r, E)[None]
        if route_margin(row, bias, top_k, n_group, topk_group) > 1e-5:  # clear margins
            rows.append(row[0])
    x = f32(np.stack(rows))
    kw = dict(top_k=top_k, n_group=n_group, topk_group=topk_group, norm_topk_prob=norm,
              scaling=2.5)
    want_i, want_w = _core.moe_route(x, weight(gate), bias, **kw)
    got_i, got_w = _core.moe_route(e.to_device(x), dweight(e, gate),
                                   None if bias is None else e.to_device(bias), engine=e, **kw)
    got_i, got_w = e.to_host(got_i), e.to_host(got_w)
    assert got_i.dtype == np.int32 and got_i.shape == (T, top_k)
    np.testing.assert_array_equal(got_i, want_i)
    np.testing.assert_allclose(got_w, want_w, rtol=1e-6, atol=1e-6)


def test_moe_route_ties_go_to_lower_ids(e):
    E, n_group, topk_group, top_k = 32, 4, 2, 5
    T = 4
    x = np.zeros((T, E), np.float32)  # all logits 0: every score 0.5, every group ties
    x[1, [3, 9, 20, 21]] = 1.0       # equal winners in groups 0, 1, 2
    x[2, :] = np.repeat(f32([0.5, 0.25, 0.5, 0.25]), 8)  # groups 0 and 2 tie
    x[3, ::2] = -1.0
    bias = np.zeros(E, np.float32)
    bias[[5, 6, 30, 31]] = 0.125       # equal bias bumps
    gate = np.eye(E, dtype=np.float32)
    for b in (None, bias):
        kw = dict(top_k=top_k, n_group=n_group, topk_group=topk_group, norm_topk_prob=True,
                  scaling=1.0)
        want_i, want_w = _core.moe_route(x, weight(gate), b, **kw)
        got_i, got_w = _core.moe_route(e.to_device(x), dweight(e, gate),
                                       None if b is None else e.to_device(b), engine=e, **kw)
        np.testing.assert_array_equal(e.to_host(got_i), want_i)
        np.testing.assert_allclose(e.to_host(got_w), want_w, rtol=1e-6, atol=1e-6)
    # Row 0 without bias: groups 0 and 1 kept (lower groups), experts 0..4 in id order.
    i0, _ = _core.moe_route(e.to_device(x), dweight(e, gate), engine=e, top_k=top_k,
                            n_group=n_group, topk_group=topk_group, norm_topk_prob=True,
                            scaling=1.0)
    assert e.to_host(i0)[0].tolist() == [0, 1, 2, 3, 4]


@pytest.mark.parametrize("T", [1, 3, 32, 64, 200])
def test_moe_route_dense_gate_matches_cpu_where_margins_are_clear(e, T):
    r = rng(40 + T)
    E, D, top_k, n_group, topk_group = 64, 48, 6, 8, 3
    x = randn(r, T, D)
    gate = randn(r, E, D, scale=0.5)
    bias = f32(r.uniform(-0.05, 0.05, E))
    kw = dict(top_k=top_k, n_group=n_group, topk_group=topk_group, norm_topk_prob=True,
              scaling=2.5)
    want_i, want_w = _core.moe_route(x, weight(gate), bias, **kw)
    got_i, got_w = _core.moe_route(e.to_device(x), dweight(e, gate), e.to_device(bias), engine=e,
                                   **kw)
    got_i, got_w = e.to_host(got_i), e.to_host(got_w)
    logits = x.astype(np.float64) @ gate.T.astype(np.float64)
    checked = 0
    for t in range(T):
        if route_margin(logits[t : t + 1], bias, top_k, n_group, topk_group) > 1e-4:
            np.testing.assert_array_equal(got_i[t], want_i[t])
            # logits differ by the GEMM's summation order (~1e-6 relative): weights to 1e-5
            np.testing.assert_allclose(got_w[t], want_w[t], rtol=1e-5, atol=1e-6)
            checked += 1
    assert checked >= max(1, (9 * T) // 10)


@pytest.mark.parametrize("D", [200, 1024, 4096])  # the router's rows: P = 1, and 2 chunks of P = 2
@pytest.mark.parametrize("E,top_k,n_group,topk_group", [(32, 8, 1, 1), (288, 8, 8, 4), (64, 6, 8, 3)])
def test_moe_route_one_token_in_one_launch_matches_cpu(e, D, E, top_k, n_group, topk_group):
    # At one token the router GEMV and the routing run in one launch (the last block routes):
    # the same bytes from launch to launch (its arrival counter is back at 0 after each), and
    # the CPU's choice where its margins are clear.
    r = rng(D + E + top_k)
    x = randn(r, 1, D)
    gate = randn(r, E, D, scale=0.5)
    bias = f32(r.uniform(-0.05, 0.05, E))
    kw = dict(top_k=top_k, n_group=n_group, topk_group=topk_group, norm_topk_prob=True,
              scaling=2.5)
    outs = []
    for _ in range(3):
        i, w = _core.moe_route(e.to_device(x), dweight(e, gate), e.to_device(bias), engine=e, **kw)
        outs.append((e.to_host(i), e.to_host(w)))
    for i, w in outs[1:]:
        np.testing.assert_array_equal(i, outs[0][0])
        np.testing.assert_array_equal(w, outs[0][1])
    want_i, want_w = _core.moe_route(x, weight(gate), bias, **kw)
    logits = x.astype(np.float64) @ gate.T.astype(np.float64)
    if route_margin(logits, bias, top_k, n_group, topk_group) > 1e-4:
        np.testing.assert_array_equal(outs[0][0], want_i)
        np.testing.assert_allclose(outs[0][1], want_w, rtol=1e-5, atol=1e-6)


def test_moe_route_one_token_takes_the_one_launch_path(e, tmp_path):
    # Which kernels one token's routing launches (torch.profiler, CUDA activity): the router +
    # routing kernel alone at D = 1024; short rows (D = 64: the GEMV's short-row kernel) take the
    # GEMV and the routing kernel.
    r = rng(5)
    kw = dict(top_k=4, n_group=1, topk_group=1, norm_topk_prob=True, scaling=1.0)

    def kernels(D):
        x, gate = e.to_device(randn(r, 1, D)), dweight(e, randn(r, 32, D, scale=0.1))
        return " ".join(kernel_names(lambda: (_core.moe_route(x, gate, engine=e, **kw), e.synchronize()),
                                     tmp_path / f"trace{D}.json"))

    long_rows, short_rows = kernels(1024), kernels(64)
    assert "route_decode_kernel" in long_rows and "moe_route_kernel" not in long_rows, long_rows
    assert "route_decode_kernel" not in short_rows and "moe_route_kernel" in short_rows, short_rows


ROWS_CASES = [  # D, E, top_k, n_group, topk_group (route_rows_kernel: E <= 64)
    (4096, 32, 8, 1, 1),    # the GLM-5.3-Flash bench model's router: 4 splits of K
    (2304, 64, 8, 1, 1),    # Kimi-Linear's width: 3 splits, the last a quarter full; 8 expert tiles
    (200, 40, 8, 8, 4),     # one partial split, grouped routing
    (1028, 44, 6, 4, 2),    # a split of one float4, a partial expert tile
]


@pytest.mark.parametrize("D,E,top_k,n_group,topk_group", ROWS_CASES)
@pytest.mark.parametrize("T", [2, 7, 32, 64])
def test_moe_route_rows_in_one_launch_match_cpu_and_do_not_depend_on_the_batch(
        e, T, D, E, top_k, n_group, topk_group):
    # 2..64 tokens: router and routing in route_rows_kernel (one launch; a ticket per tile of
    # four tokens). A token's choice and weights do not depend on the other tokens of the call
    # (the same bytes with the rows reversed, and for two of them alone), and stay the same from
    # launch to launch (its counters back at 0 after each: the calls alternate between inputs,
    # so a launch that wrote nothing cannot pass on the freed outputs of the one before); the
    # CPU's choice where its margins are clear.
    r = rng(D + E + T)
    x = randn(r, T, D)
    gate = randn(r, E, D, scale=0.5 / np.sqrt(D / 64))
    bias = f32(r.uniform(-0.05, 0.05, E))
    kw = dict(top_k=top_k, n_group=n_group, topk_group=topk_group, norm_topk_prob=True,
              scaling=2.5)
    dg, db = dweight(e, gate), e.to_device(bias)

    def run(rows):
        i, w = _core.moe_route(e.to_device(f32(rows)), dg, db, engine=e, **kw)
        return e.to_host(i), e.to_host(w)

    first = run(x)
    for _ in range(2):
        rev = run(x[::-1])
        np.testing.assert_array_equal(rev[0], first[0][::-1])
        np.testing.assert_array_equal(rev[1], first[1][::-1])
        pair = run(x[[T - 1, 0]])
        np.testing.assert_array_equal(pair[0], first[0][[T - 1, 0]])
        np.testing.assert_array_equal(pair[1], first[1][[T - 1, 0]])
        again = run(x)
        np.testing.assert_array_equal(again[0], first[0])
        np.testing.assert_array_equal(again[1], first[1])
    want_i, want_w = _core.moe_route(x, weight(gate), bias, **kw)
    logits = x.astype(np.float64) @ gate.T.astype(np.float64)
    checked = 0
    for t in range(T):
        if route_margin(logits[t : t + 1], bias, top_k, n_group, topk_group) > 1e-4:
            np.testing.assert_array_equal(first[0][t], want_i[t])
            np.testing.assert_allclose(first[1][t], want_w[t], rtol=1e-5, atol=1e-6)
            checked += 1
    assert checked >= max(1, (8 * T) // 10)


@pytest.mark.parametrize("scoring", ["sigmoid", "softmax"])
def test_moe_route_rows_take_the_one_launch_path(e, tmp_path, scoring):
    # Which kernels the routing of T tokens launches (torch.profiler, CUDA activity): 2..64 tokens
    # route_rows_kernel alone (no GEMM, no second routing kernel); 65 tokens, or 65 experts, the
    # SGEMM and the routing kernel of the scoring.
    r = rng(6)
    kw = dict(top_k=4, n_group=1, topk_group=1, norm_topk_prob=True, scaling=1.0, scoring=scoring)
    gate = dweight(e, randn(r, 32, 1024, scale=0.05))
    routing = "moe_route_softmax_kernel" if scoring == "softmax" else "moe_route_kernel"

    def kernels(T):
        x = e.to_device(randn(r, T, 1024))
        return kernel_names(lambda: (_core.moe_route(x, gate, engine=e, **kw), e.synchronize()),
                            tmp_path / f"trace{T}.json")

    for T in (2, 8, 64):
        names = kernels(T)
        assert len(names) == 1 and "route_rows_kernel" in names[0], (T, names)
    names = " ".join(kernels(65))
    assert "route_rows_kernel" not in names and routing in names, names
    wide = dweight(e, randn(r, 65, 1024, scale=0.05))
    x = e.to_device(randn(r, 8, 1024))
    names = " ".join(kernel_names(lambda: (_core.moe_route(x, wide, engine=e, **kw), e.synchronize()),
                                  tmp_path / "trace_wide.json"))
    assert "route_rows_kernel" not in names and routing in names, names


def test_moe_route_contract_errors(e):
    r = rng(5)
    E, D = 8, 6
    gate = randn(r, E, D)
    xh = randn(r, 2, D)
    dg = dweight(e, gate)
    f = _core.moe_route
    kw = dict(top_k=2, n_group=2, topk_group=1, norm_topk_prob=True, scaling=1.0)

    def x():  # a fresh one-shot device array per call
        return e.to_device(xh)

    expect(memra.ContractError, ST.CONTRACT_DTYPE, f, x(), dweight(e, gate, "bfloat16"), engine=e, **kw)
    expect(memra.ContractError, ST.CONTRACT_DEVICE, f, x(), weight(gate), engine=e, **kw)
    expect(memra.ContractError, ST.CONTRACT_DEVICE, f, x(), dg, randn(r, E), engine=e, **kw)
    expect(memra.ContractError, ST.CONTRACT_SHAPE, f, x(), dg, e.to_device(randn(r, E + 1)), engine=e, **kw)
    expect(memra.ContractError, ST.CONTRACT_VALUE, f, x(), dg, engine=e, **{**kw, "n_group": 3})
    expect(memra.ContractError, ST.CONTRACT_VALUE, f, x(), dg, engine=e, **{**kw, "topk_group": 3})
    expect(memra.ContractError, ST.CONTRACT_VALUE, f, x(), dg, engine=e, **{**kw, "top_k": 5})
    i, w = f(x(), dg, engine=e, **kw)
    assert e.to_host(i).shape == (2, 2)


# ---------------------------------------------------------------- moe_forward


def experts(r, E, D, I, dtype="float32"):
    g = randn(r, E, I, D, scale=0.3)
    u = randn(r, E, I, D, scale=0.3)
    d = randn(r, E, D, I, scale=0.3)
    if dtype == "bfloat16":
        g, u, d = bf16_round(g), bf16_round(u), bf16_round(d)
    return g, u, d


def moe_cpu(x, idx, w, g, u, d, limit):
    return _core.moe_forward(x, idx, w, [weight(a) for a in g], [weight(a) for a in u],
                             [weight(a) for a in d], limit=limit)


def moe_gpu(e, x, idx, w, g, u, d, limit, dtype=None):
    y = _core.moe_forward(e.to_device(x), e.to_device(idx), e.to_device(w), dweight(e, g, dtype),
                          dweight(e, u, dtype), dweight(e, d, dtype), limit=limit, engine=e)
    return e.to_host(y)


def random_routing(r, T, E, k):
    idx = np.stack([r.permutation(E)[:k] for _ in range(T)]).astype(np.int32)
    w = f32(r.uniform(0.05, 1.0, (T, k)))
    return idx, w


MOE_SHAPES = [  # E, D, I, top_k
    (8, 64, 48, 4),     # vector path (D, I multiples of 8), one 256-column step
    (7, 13, 21, 3),     # scalar path
    (32, 64, 48, 8),    # GLM-5.3-Flash's expert count and top_k, narrow
    (8, 64, 48, 2),
    (32, 520, 264, 8),  # several 256-column steps, the last one partial (vector path)
    (5, 300, 37, 2),    # several steps, scalar path (I odd)
]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("E,D,I,k", MOE_SHAPES)
@pytest.mark.parametrize("T", [1, 2, 5, 32, 63, 64, 200])
def test_moe_forward_matches_cpu(e, T, E, D, I, k, dtype):
    r = rng(T * 13 + D + (dtype == "bfloat16"))
    g, u, d = experts(r, E, D, I, dtype)
    x = randn(r, T, D, scale=2.0)
    idx, w = random_routing(r, T, E, k)
    limit = 1.5
    want = moe_cpu(x, idx, w, g, u, d, limit)
    core = e if dtype == "float32" else engine_with(moe_tensor_cores=False)
    got = moe_gpu(core, x, idx, w, g, u, d, limit, dtype)
    scaled_close(got, want, rtol=1e-5, atol_rel=1e-5)
    if dtype == "bfloat16":  # the default engine: the tensor-core arm where it applies
        got = moe_gpu(e, x, idx, w, g, u, d, limit, dtype)
        assert_within_tc_bound(got, x, idx, w, g, u, d, limit, want)


def test_moe_forward_routed_by_moe_route_and_repeated_ids(e):
    r = rng(77)
    T, E, D, I, k = 9, 6, 32, 24, 3
    g, u, d = experts(r, E, D, I)
    x = randn(r, T, D)
    gate = randn(r, E, D)
    idx, w = _core.moe_route(x, weight(gate), top_k=k, n_group=1, topk_group=1,
                             norm_topk_prob=True, scaling=2.5)
    idx[0] = [4, 4, 1]  # a repeated id: its terms in slot order, after expert 1's
    idx[1] = [5, 0, 0]
    want = moe_cpu(x, idx, w, g, u, d, 2.0)
    got = moe_gpu(e, x, idx, w, g, u, d, 2.0)
    scaled_close(got, want, rtol=1e-5, atol_rel=1e-5)


def skewed_routing(r, T, E, k):
    """Routing that exercises the grouped path's corners: every token's slot 0 is expert 3 (one
    expert with T pairs: several passes of 16 / 8 from T = 17 on), experts 0 and E - 1 get no
    pairs, token 1 repeats one id in all its slots and token 2 repeats one id twice."""
    pool = np.array([i for i in range(E) if i not in (0, 3, E - 1)])
    idx = np.zeros((T, k), np.int32)
    for t in range(T):
        idx[t, 0] = 3
        if k > 1:
            idx[t, 1:] = r.permutation(pool)[: k - 1]
    if T > 1:
        idx[1, :] = pool[0]
    if T > 2 and k > 2:
        idx[2, 2] = idx[2, 1]
    w = f32(r.uniform(0.05, 1.0, (T, k)))
    return idx, w


GROUPED_SHAPES = [(32, 64, 48, 8), (8, 64, 48, 2), (7, 13, 21, 3), (32, 520, 264, 8),
                  (5, 300, 37, 2)]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("E,D,I,k", GROUPED_SHAPES)
@pytest.mark.parametrize("T", [2, 5, 32, 64])
def test_moe_forward_grouped_equals_rows_one_at_a_time(e, T, E, D, I, k, dtype):
    """The CUDA-core grouped kernels (T >= 2) give, bit for bit, what the per-pair kernels give
    for each row alone (T = 1), with repeated ids and experts nobody chose; and the CPU's values.
    bfloat16 weights take them on an engine with moe_tensor_cores=False; the default engine's
    tensor-core arm is held to the bf16 bound against the CPU instead."""
    r = rng(T * 17 + E + D + (dtype == "bfloat16"))
    g, u, d = experts(r, E, D, I, dtype)
    x = randn(r, T, D, scale=2.0)
    idx, w = skewed_routing(r, T, E, k)
    limit = 1.5
    core = e if dtype == "float32" else engine_with(moe_tensor_cores=False)
    dg, du, dd = dweight(core, g, dtype), dweight(core, u, dtype), dweight(core, d, dtype)

    def run(xs, ids, ws):
        return core.to_host(_core.moe_forward(core.to_device(xs), core.to_device(ids),
                                              core.to_device(ws), dg, du, dd, limit=limit,
                                              engine=core))

    got = run(x, idx, w)
    for t in range(T):
        row = run(x[t : t + 1], idx[t : t + 1], w[t : t + 1])
        np.testing.assert_array_equal(got[t : t + 1], row, err_msg=f"row {t}")
    want = moe_cpu(x, idx, w, g, u, d, limit)
    scaled_close(got, want, rtol=1e-5, atol_rel=1e-5)
    if dtype == "bfloat16":
        assert_within_tc_bound(moe_gpu(e, x, idx, w, g, u, d, limit, dtype), x, idx, w, g, u, d,
                               limit, want)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("E,D,I,k,T", [(32, 64, 48, 8, 64), (7, 13, 21, 3, 9),
                                       (8, 64, 48, 4, 600)])  # T = 600: three token chunks
def test_moe_forward_grouped_equals_per_pair_kernels(e, E, D, I, k, T, dtype):
    """At the same T, the CUDA-core grouped path equals the per-pair kernels (forced on an engine
    made with KernelOptions(moe_grouped_min_t=10**9)) bit for bit (bfloat16: on an engine with
    moe_tensor_cores=False; the default engine's tensor-core arm within the bf16 bound)."""
    r = rng(T + E + D + (dtype == "bfloat16"))
    g, u, d = experts(r, E, D, I, dtype)
    x = randn(r, T, D, scale=2.0)
    idx, w = skewed_routing(r, T, E, k)

    core = e if dtype == "float32" else engine_with(moe_tensor_cores=False)
    grouped = moe_gpu(core, x, idx, w, g, u, d, 1.5, dtype)
    per_pair = moe_gpu(engine_with(moe_grouped_min_t=10**9), x, idx, w, g, u, d, 1.5, dtype)
    np.testing.assert_array_equal(grouped, per_pair)
    np.testing.assert_array_equal(moe_gpu(core, x, idx, w, g, u, d, 1.5, dtype), grouped)  # call to call
    want = moe_cpu(x, idx, w, g, u, d, 1.5)
    scaled_close(grouped, want, rtol=1e-5, atol_rel=1e-5)
    if dtype == "bfloat16":
        tc = moe_gpu(e, x, idx, w, g, u, d, 1.5, dtype)
        np.testing.assert_array_equal(moe_gpu(e, x, idx, w, g, u, d, 1.5, dtype), tc)
        assert_within_tc_bound(tc, x, idx, w, g, u, d, 1.5, want)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("E,D,I,k", [(32, 520, 264, 8), (7, 13, 21, 3), (8, 61, 48, 4)])
def test_moe_down_ragged_warp_and_repeated_id_match_cpu(e, E, D, I, k, dtype):
    """The per-pair down kernel at one token (two output rows a warp; D = 61, 13: a ragged last
    warp), with a repeated id: close to the CPU."""
    r = rng(E + D + I + (dtype == "bfloat16"))
    g, u, d = experts(r, E, D, I, dtype)
    x = randn(r, 1, D, scale=2.0)
    idx, w = skewed_routing(r, 1, E, k)
    idx[0, -1] = idx[0, 0]  # a repeated id
    got = moe_gpu(e, x, idx, w, g, u, d, 1.5, dtype)
    scaled_close(got, moe_cpu(x, idx, w, g, u, d, 1.5), rtol=1e-5, atol_rel=1e-5)


def moe_layer_weights(r, E, D, I, I_s, dtype):
    """MoeLayer weights: bf16 Weights when dtype is bfloat16 (the CPU layer then rounds its GEMM
    inputs as the GPU does), else f32."""
    wt = bf16_weight if dtype == "bfloat16" else weight
    w = {"gate.weight": weight(randn(r, E, D, scale=0.5)),
         "gate.e_score_correction_bias": weight(randn(r, E, scale=0.1))}
    for n in range(E):
        w[f"experts.{n}.gate_proj.weight"] = wt(randn(r, I, D, scale=0.3))
        w[f"experts.{n}.up_proj.weight"] = wt(randn(r, I, D, scale=0.3))
        w[f"experts.{n}.down_proj.weight"] = wt(randn(r, D, I, scale=0.3))
    w["shared_experts.gate_proj.weight"] = wt(randn(r, I_s, D, scale=0.3))
    w["shared_experts.up_proj.weight"] = wt(randn(r, I_s, D, scale=0.3))
    w["shared_experts.down_proj.weight"] = wt(randn(r, D, I_s, scale=0.3))
    return w


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("E,D,I,I_s,k", [(8, 64, 48, 48, 4), (32, 520, 264, 264, 8), (7, 13, 21, 21, 3),
                                         (8, 64, 48, 32, 4)])
@pytest.mark.parametrize("T", [1, 3])
def test_moe_layer_with_shared_expert_matches_cpu(e, T, E, D, I, I_s, k, dtype):
    # The shared expert as one more slot of the per-pair expert kernels (moe_forward's shared_*
    # fields at T = 1 with I_s == I: its x and h rounded to the weights' dtype as the separate
    # MLP's GEMMs round them), or the separate MLP after the routed experts (I_s != I, the grouped
    # path at T = 3), against the CPU layer; repeated calls give the same bytes.
    r = rng(T + E + D + I_s + (dtype == "bfloat16"))
    w = moe_layer_weights(r, E, D, I, I_s, dtype)
    kw = dict(hidden=D, n_experts=E, top_k=k, n_group=1, topk_group=1, intermediate=I,
              shared_intermediate=I_s, norm_topk_prob=True, routed_scaling=2.5, swiglu_limit=1.5)
    x = randn(r, T, D, scale=2.0)
    want, want_idx = memra.MoeLayer(memra.Engine("cpu"), w, dtype=dtype, **kw).forward_with_experts(x)
    layer = memra.MoeLayer(e, w, dtype=dtype, **kw)
    got, idx = layer.forward_with_experts(e.to_device(x))
    got = e.to_host(got)
    assert np.array_equal(e.to_host(idx), want_idx)
    close_scaled(got, want, 1e-5 if dtype == "float32" else 2e-2)
    # forward (the decoder loop's call) gives forward_with_experts' y byte for byte.
    assert np.array_equal(e.to_host(layer.forward(e.to_device(x))), got)


def test_moe_layer_shared_expert_rounds_x_once_beside_the_tensor_cores(e, tmp_path):
    # T > 1 over bf16 weights: the routed experts on tensor cores and the shared expert's gate|up
    # GEMM both read x rounded to bf16, so the tensor-core arm's rounding is kept for the shared
    # expert: one f32 -> bf16 rounding launch a call where there were two, and the CPU layer's
    # result as before; repeated calls give the same bytes.
    E, D, I, I_s, k, T = 8, 64, 48, 40, 4, 5
    r = rng(77)
    w = moe_layer_weights(r, E, D, I, I_s, "bfloat16")
    kw = dict(hidden=D, n_experts=E, top_k=k, n_group=1, topk_group=1, intermediate=I,
              shared_intermediate=I_s, norm_topk_prob=True, routed_scaling=2.5, swiglu_limit=1.5)
    x = randn(r, T, D, scale=2.0)
    want = memra.MoeLayer(memra.Engine("cpu"), w, dtype="bfloat16", **kw).forward(x)
    layer = memra.MoeLayer(e, w, dtype="bfloat16", **kw)
    dx = e.to_device(x)
    got = e.to_host(layer.forward(dx))
    close_scaled(got, want, 2e-2)
    names = kernel_names(lambda: (layer.forward(dx), e.synchronize()), tmp_path / "moe.json")
    rounds = [n for n in names if "round_kernel" in n]
    assert len(rounds) == 1 and "moe_tc_round_kernel" in rounds[0], names
    assert sum("moe_tc_kernel" in n for n in names) == 2, names
    assert np.array_equal(e.to_host(layer.forward(dx)), got)


def test_moe_forward_contract_errors(e):
    r = rng(8)
    E, D, I, k = 3, 8, 16, 2
    g, u, d = experts(r, E, D, I)
    dg, du, dd = dweight(e, g), dweight(e, u), dweight(e, d)
    xh = randn(r, 2, D)
    idx = np.array([[0, 2], [1, 0]], np.int32)
    wh = f32(r.uniform(0, 1, (2, k)))
    f = _core.moe_forward

    def x():  # fresh one-shot device arrays per call
        return e.to_device(xh)

    def w():
        return e.to_device(wh)

    def di():
        return e.to_device(idx)

    expect(memra.ContractError, ST.CONTRACT_RANGE, f, x(), e.to_device(np.array([[0, 3], [1, 0]], np.int32)),
                    w(), dg, du, dd, limit=1.0, engine=e)
    expect(memra.ContractError, ST.CONTRACT_RANGE, f, x(), e.to_device(np.array([[0, -1], [1, 0]], np.int32)),
                    w(), dg, du, dd, limit=1.0, engine=e)
    expect(memra.ContractError, ST.CONTRACT_DEVICE, f, x(), idx, w(), dg, du, dd, limit=1.0, engine=e)
    expect(memra.ContractError, ST.CONTRACT_DTYPE, f, x(), e.to_device(idx.astype(np.int64)), w(), dg, du, dd,
                    limit=1.0, engine=e)
    expect(memra.ContractError, ST.CONTRACT_DEVICE, f, x(), di(), w(), [weight(a) for a in g], du, dd,
                    limit=1.0, engine=e)
    expect(memra.ContractError, ST.CONTRACT_SHAPE, f, x(), di(), w(), dg, du, dg, limit=1.0, engine=e)
    expect(memra.ContractError, ST.CONTRACT_SHAPE, f, x(), di(), w(), dweight(e, g[0]), du, dd, limit=1.0,
                    engine=e)
    expect(memra.ContractError, ST.CONTRACT_DTYPE, f, x(), di(), w(), dg, dweight(e, u, "bfloat16"), dd,
                    limit=1.0, engine=e)
    expect(memra.ContractError, ST.CONTRACT_SHAPE, f, x(), di(), e.to_device(f32(np.ones((2, 1)))), dg, du,
                    dd, limit=1.0, engine=e)
    expect(memra.ContractError, ST.CONTRACT_VALUE, f, x(), di(), w(), dg, du, dd, limit=-1.0, engine=e)
    y = e.to_host(f(x(), di(), w(), dg, du, dd, limit=1.0, engine=e))
    assert np.all(np.isfinite(y))


# ---------------------------------------------------------------- sanitizer-sized


def test_sanitizer_small_shapes(e):
    """One small call of moe_route and moe_forward, f32 and bf16 (the tensor-core arm), for
    compute-sanitizer racecheck / memcheck."""
    r = rng(16)
    D, I, E, T, k = 16, 24, 8, 3, 2
    x = randn(r, T, D)
    gate = randn(r, E, D)
    i, w = _core.moe_route(e.to_device(x), dweight(e, gate), engine=e, top_k=k, n_group=2,
                           topk_group=1, norm_topk_prob=True, scaling=1.0)
    eg, eu, ed = experts(r, E, D, I)
    y2 = _core.moe_forward(e.to_device(x), i, w, dweight(e, eg), dweight(e, eu), dweight(e, ed),
                           limit=1.0, engine=e)
    assert np.all(np.isfinite(e.to_host(y2)))
    eg, eu, ed = experts(r, E, D, I, "bfloat16")  # the tensor-core arm (cuda/moe_tc.cu)
    y3 = _core.moe_forward(e.to_device(x), i, w, dweight(e, eg, "bfloat16"),
                           dweight(e, eu, "bfloat16"), dweight(e, ed, "bfloat16"), limit=1.0,
                           engine=e)
    assert np.all(np.isfinite(e.to_host(y3)))
    # Its 128-row tiles (64 pairs an expert on average and more), with a ragged last tile.
    T2, E2 = 130, 2
    x2 = randn(r, T2, D)
    i2 = np.stack([[t % E2] for t in range(T2)]).astype(np.int32)
    w2 = f32(np.ones((T2, 1)))
    eg, eu, ed = experts(r, E2, D, I, "bfloat16")
    y4 = _core.moe_forward(e.to_device(x2), e.to_device(i2), e.to_device(w2),
                           dweight(e, eg, "bfloat16"), dweight(e, eu, "bfloat16"),
                           dweight(e, ed, "bfloat16"), limit=1.0, engine=e)
    assert np.all(np.isfinite(e.to_host(y4)))
