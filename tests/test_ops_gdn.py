"""Gated DeltaNet ops on the CPU backend (``memra._core.gdn_gate`` / ``gdn_l2norm`` / ``gdn_scan`` /
``rms_norm_gated_silu``, and ``kda_conv`` at GDN's channel counts) against the numpy float64
transcriptions of transformers 5.17 ``models/qwen3_5`` in tests/gdn_reference.py, plus the
argument-checking contract.

Tolerances (f32 op vs f64 reference): ``RTOL = 1e-5`` with ``ATOL = 1e-6``, as the KDA op tests
(a few roundings per gate / norm output; the scan's dk-long dot products over T state steps stay
~1e-7 absolute with unit-norm q/k and v ~ N(0, 1)). Split / chained calls are compared bit for bit.
"""

from __future__ import annotations

import numpy as np
import pytest

import memra
from memra import _core
from op_contracts import contract_tests, expect_contract

import gdn_reference as R

RTOL, ATOL = 1e-5, 1e-6
K = 4  # linear_conv_kernel_dim of every Qwen3.5 / Qwen3-Next checkpoint
EDGE_T = [1, 2, 3, 63, 65, 200]  # T = 1, T < K, around the 64-row chunk, long
ST = _core.status
f32 = R.f32


def rng(seed):
    return np.random.default_rng(seed)


def assert_close(got, want):
    assert np.all(np.isfinite(got))
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL)


def scan_inputs(T, Hk=2, Hv=4, dk=16, dv=24, seed=0, with_state=True, g_value=None, beta_value=None):
    r = rng(seed)
    q = f32(R.l2norm(r.standard_normal((T, Hk, dk))))
    k = f32(R.l2norm(r.standard_normal((T, Hk, dk))))
    v = f32(r.standard_normal((T, Hv, dv)))
    g = f32(-np.exp(r.uniform(-3, 0, (T, Hv)))) if g_value is None else np.full((T, Hv), g_value, np.float32)
    beta = f32(r.uniform(0.05, 0.95, (T, Hv))) if beta_value is None else np.full((T, Hv), beta_value, np.float32)
    state = f32(0.3 * r.standard_normal((Hv, dk, dv))) if with_state else None
    return q, k, v, g, beta, state


# ---------------------------------------------------------------- conv (KDA's op, GDN's channels)


@pytest.mark.parametrize("T", EDGE_T)
def test_conv_over_gdn_channels_matches_reference(T):
    # 2*Hk*dk + Hv*dv with Hk = 2, Hv = 4, dk = 16, dv = 24: 160 channels (not a multiple of 128).
    r = rng(T)
    C = R.Geometry().C
    x, w = f32(r.standard_normal((T, C))), f32(0.5 * r.standard_normal((C, K)))
    ring = f32(r.standard_normal((C, K - 1)))
    y, ring_out = _core.kda_conv(x, w, ring)
    ry, rring = R.conv(x, w, ring)
    assert_close(y, ry)
    np.testing.assert_array_equal(ring_out, rring)  # a copy of inputs: exact


@pytest.mark.parametrize("T", [1, 2, 3, 9])
def test_ring_of_k_minus_1_equals_transformers_k_wide_conv_state(T):
    """transformers' conv cache keeps the last K inputs (causal_conv1d_update writes
    cat(state, x)[-K:]) and convolves cat(state, x) without padding, so the oldest of the K is
    never read again: memra's K-1 ring holds the rest. Token by token from a fresh cache, with
    transformers' own functions."""
    torch = pytest.importorskip("torch")
    mq = pytest.importorskip("transformers.models.qwen3_5.modeling_qwen3_5")
    r = rng(50 + T)
    C = 40
    x, w = f32(r.standard_normal((T, C))), f32(r.standard_normal((C, K)))
    state = torch.zeros(1, C, K)
    ring = np.zeros((C, K - 1), np.float32)
    for t in range(T):
        want = mq.causal_conv1d_update(torch.from_numpy(x[t:t + 1].T.copy())[None], state,
                                       torch.from_numpy(w), None, "silu")[0, :, 0].numpy()
        got, ring = _core.kda_conv(x[t:t + 1], w, ring)
        np.testing.assert_allclose(got[0], want, rtol=1e-6, atol=1e-7)
        np.testing.assert_array_equal(ring, state[0, :, 1:].numpy())
    full, ring_full = _core.kda_conv(x, w, np.zeros((C, K - 1), np.float32))
    prefill = mq.causal_conv1d_fn(torch.from_numpy(x.T.copy())[None], torch.from_numpy(w), None,
                                  activation="silu")[0].numpy().T
    np.testing.assert_allclose(full, prefill, rtol=1e-6, atol=1e-7)
    np.testing.assert_array_equal(ring_full, ring)


# ---------------------------------------------------------------- gates


def test_gate_matches_reference_across_the_softplus_threshold():
    r = rng(3)
    T, H = 7, 5
    a, b = f32(4.0 * r.standard_normal((T, H))), f32(4.0 * r.standard_normal((T, H)))
    dt_bias, A_log = f32(r.standard_normal(H)), f32(r.standard_normal(H))
    # a + dt_bias at the threshold (20), below it where log1p matters (-30: log(1 + exp(x))
    # would be 0 in f32), and saturated (+-1e4); b saturating the sigmoid.
    probes = np.array([19.9, 20.0, 20.1, 25.0, -20.0, -30.0, 1e4, -1e4, 0.0, 3.0], np.float32)
    a.reshape(-1)[: probes.size] = probes - np.resize(dt_bias, probes.size)
    b[0, :3] = [1e4, -1e4, 0.0]
    g, beta = _core.gdn_gate(a, b, dt_bias, A_log)
    rg, rb = R.gates(a, b, dt_bias, A_log)
    assert g.shape == beta.shape == (T, H) and g.dtype == beta.dtype == np.float32
    np.testing.assert_allclose(g, rg, rtol=RTOL, atol=0)  # relative even where g ~ -1e-13
    assert_close(beta, rb)
    assert np.all(g <= 0) and np.all(np.isfinite(g))
    assert g.reshape(-1)[5] < 0  # a + dt_bias = -30: a tiny decay, not none
    assert beta[0, 0] == 1.0 and beta[0, 1] == 0.0 and beta[0, 2] == 0.5


# ---------------------------------------------------------------- L2 norm


@pytest.mark.parametrize("shape", [(1, 1, 128), (3, 4, 16), (65, 2, 7)])
def test_l2norm_matches_reference(shape):
    x = f32(3.0 * rng(sum(shape)).standard_normal(shape))
    y = _core.gdn_l2norm(x)
    assert_close(y, R.l2norm(x))
    np.testing.assert_allclose(np.linalg.norm(y.astype(np.float64), axis=-1), 1.0, rtol=1e-6)


def test_l2norm_is_qwens_rsqrt_form():
    """x * (1 / sqrt(s)) (torch.rsqrt, then a product) rounds differently from KDA's x / sqrt(s):
    gdn_l2norm equals the former in f32 where the two differ."""
    x = f32(rng(8).standard_normal((64, 1, 4)))
    s = (x.astype(np.float32) ** 2).sum(-1, keepdims=True, dtype=np.float32) + np.float32(1e-6)
    root = np.sqrt(s, dtype=np.float32)
    rsqrt_form = x * (np.float32(1.0) / root)
    div_form = x / root
    assert not np.array_equal(rsqrt_form, div_form)  # the test can tell the two apart
    np.testing.assert_array_equal(_core.gdn_l2norm(x), rsqrt_form)  # d = 4: one order of the sum


# ---------------------------------------------------------------- scan


@pytest.mark.parametrize("T", EDGE_T)
@pytest.mark.parametrize("with_state", [False, True])
def test_scan_matches_reference(T, with_state):
    q, k, v, g, beta, state = scan_inputs(T, seed=T, with_state=with_state)
    o, s = _core.gdn_scan(q, k, v, g, beta, state)
    ro, rs = R.scan(q, k, v, g, beta, state)
    assert o.shape == v.shape and s.shape == (4, 16, 24)
    assert_close(o, ro)
    assert_close(s, rs)


@pytest.mark.parametrize("Hk,Hv", [(1, 1), (2, 2), (2, 4), (1, 4), (3, 6)])
def test_scan_head_groupings(Hk, Hv):
    q, k, v, g, beta, state = scan_inputs(33, Hk=Hk, Hv=Hv, dk=8, dv=8, seed=Hk * 10 + Hv)
    o, s = _core.gdn_scan(q, k, v, g, beta, state)
    ro, rs = R.scan(q, k, v, g, beta, state)
    assert_close(o, ro)
    assert_close(s, rs)


def test_scan_value_head_h_reads_key_head_h_div_group():
    """Hv = 2 Hk: value heads 0, 1 read key head 0 and 2, 3 key head 1 (repeat_interleave), not the
    GGUF order h % Hk; checked against an explicit per-head loop."""
    q, k, v, g, beta, state = scan_inputs(20, Hk=2, Hv=4, seed=77)
    o, s = _core.gdn_scan(q, k, v, g, beta, state)
    for h in range(4):
        for kh, close in ((h // 2, True), (h % 2, h // 2 == h % 2)):
            ro, rs = R.scan(q[:, kh:kh + 1], k[:, kh:kh + 1], v[:, h:h + 1], g[:, h:h + 1],
                            beta[:, h:h + 1], state[h:h + 1])
            same = np.allclose(o[:, h], ro[:, 0], rtol=RTOL, atol=ATOL) and np.allclose(s[h], rs[0], rtol=RTOL, atol=ATOL)
            assert same == close, (h, kh)


def test_scan_equals_kda_scan_of_the_expanded_heads_bit_for_bit():
    """GDN's step is KDA's with the key heads repeated over their value heads and the decay
    broadcast over dk (what the CUDA scan runs): the same bits on the CPU."""
    q, k, v, g, beta, state = scan_inputs(40, Hk=2, Hv=4, dk=16, dv=16, seed=5)
    o, s = _core.gdn_scan(q, k, v, g, beta, state)
    qe, ke = np.repeat(q, 2, axis=1), np.repeat(k, 2, axis=1)
    ge = f32(np.repeat(g[..., None], 16, axis=-1))
    o2, s2 = _core.kda_scan(qe, ke, v, ge, beta, state)
    np.testing.assert_array_equal(o, o2)
    np.testing.assert_array_equal(s, s2)


@pytest.mark.parametrize("T", [1, 2, 63, 65, 200])
def test_scan_prefill_then_decode_is_bit_exact(T):
    q, k, v, g, beta, state = scan_inputs(T, seed=200 + T)
    o_full, s_full = _core.gdn_scan(q, k, v, g, beta, state)
    h, t = slice(0, T - 1), slice(T - 1, T)
    o_head, s_mid = _core.gdn_scan(q[h], k[h], v[h], g[h], beta[h], state)
    o_tail, s_end = _core.gdn_scan(q[t], k[t], v[t], g[t], beta[t], s_mid)
    np.testing.assert_array_equal(np.concatenate([o_head, o_tail]), o_full)
    np.testing.assert_array_equal(s_end, s_full)


def test_scan_batch_equals_each_sequence_and_leaves_inputs():
    seqs = [scan_inputs(9, seed=s) for s in (1, 2, 3)]
    stack = [np.stack([sq[i] for sq in seqs]) for i in range(6)]
    before = [a.copy() for a in stack]
    o, s = _core.gdn_scan(*stack, batch=True)
    for b, sq in enumerate(seqs):
        ob, sb = _core.gdn_scan(*sq)
        np.testing.assert_array_equal(o[b], ob)
        np.testing.assert_array_equal(s[b], sb)
    for a, a0 in zip(stack, before):
        np.testing.assert_array_equal(a, a0)


@pytest.mark.parametrize(
    "T,g_value,beta_value",
    [
        (200, 0.0, None),  # no decay
        (300, -1e4, None),  # exp(g) == 0 every step: the state restarts each token
        (65, None, 1e-7),  # beta ~ 0: the state barely moves
        (65, None, 1.0 - 1e-7),  # beta ~ 1
        (500, -0.01, 1.0),  # slow decay, full delta steps, hundreds of them
    ],
)
def test_scan_gate_and_beta_extremes(T, g_value, beta_value):
    q, k, v, g, beta, state = scan_inputs(T, seed=400 + T, g_value=g_value, beta_value=beta_value)
    o, s = _core.gdn_scan(q, k, v, g, beta, state)
    ro, rs = R.scan(q, k, v, g, beta, state)
    assert_close(o, ro)
    assert_close(s, rs)


def test_scan_zero_steps_passes_the_state_through():
    q, k, v, g, beta, state = scan_inputs(0, seed=3)
    o, s = _core.gdn_scan(q, k, v, g, beta, state)
    assert o.shape == (0, 4, 24)
    np.testing.assert_array_equal(s, state)
    _, s0 = _core.gdn_scan(q, k, v, g, beta)
    np.testing.assert_array_equal(s0, np.zeros_like(state))


# ---------------------------------------------------------------- output norm


@pytest.mark.parametrize("D", [1, 24, 128, 1000])
def test_gated_norm_matches_reference(D):
    r = rng(D)
    x, z = f32(2.0 * r.standard_normal((9, D))), f32(3.0 * r.standard_normal((9, D)))
    w = f32(1.0 + 0.3 * r.standard_normal(D))
    z[0, :1] = 100.0  # silu saturating: z itself
    z[1, :1] = -100.0  # silu -> -0
    y = _core.rms_norm_gated_silu(x, z, w, eps=1e-6)
    assert_close(y, R.gated_norm(x, z, w, 1e-6))
    # Not the sigmoid-gated form of KDA / glm5_next.
    assert not np.allclose(y, _core.rms_norm_gated(x, z, w, eps=1e-6), rtol=1e-3)


# ---------------------------------------------------------------- argument contract


def gate_args():
    r = rng(1)
    return dict(a=f32(r.standard_normal((5, 4))), b=f32(r.standard_normal((5, 4))),
                dt_bias=f32(r.standard_normal(4)), A_log=f32(r.standard_normal(4)))


def scan_args():
    q, k, v, g, beta, state = scan_inputs(5, Hk=2, Hv=4, dk=4, dv=3, seed=3)
    return dict(q=q, k=k, v=v, g=g, beta=beta, state=state)


def norm_args():
    r = rng(2)
    return dict(x=f32(r.standard_normal((3, 8))), gate=f32(r.standard_normal((3, 8))),
                weight=f32(r.standard_normal(8)))


OPS = {
    "gdn_gate": (gate_args, lambda a: _core.gdn_gate(a["a"], a["b"], a["dt_bias"], a["A_log"])),
    "gdn_l2norm": (lambda: dict(x=f32(rng(4).standard_normal((3, 2, 5)))), lambda a: _core.gdn_l2norm(a["x"])),
    "gdn_scan": (scan_args, lambda a: _core.gdn_scan(a["q"], a["k"], a["v"], a["g"], a["beta"], a["state"])),
    "rms_norm_gated_silu": (norm_args, lambda a: _core.rms_norm_gated_silu(a["x"], a["gate"], a["weight"], eps=1e-6)),
}
(test_float64_argument_is_refused, test_wrong_rank_is_refused,
 test_non_contiguous_argument_is_refused) = contract_tests(OPS, contiguous_only_nd=("dt_bias", "A_log", "weight"))


@pytest.mark.parametrize(
    "op,name,shape",
    [
        ("gdn_gate", "b", (5, 3)),
        ("gdn_gate", "dt_bias", (5,)),
        ("gdn_gate", "A_log", (3,)),
        ("gdn_scan", "k", (5, 2, 5)),
        ("gdn_scan", "k", (5, 4, 4)),  # k must have q's key heads
        ("gdn_scan", "v", (4, 4, 3)),
        ("gdn_scan", "v", (5, 3, 3)),  # 3 value heads over 2 key heads
        ("gdn_scan", "g", (5, 2)),
        ("gdn_scan", "beta", (5, 3)),
        ("gdn_scan", "state", (4, 4, 4)),
        ("gdn_scan", "state", (2, 4, 3)),
        ("rms_norm_gated_silu", "gate", (3, 7)),
        ("rms_norm_gated_silu", "weight", (7,)),
    ],
)
def test_wrong_shape_is_refused(op, name, shape):
    make, call = OPS[op]
    a = make()
    a[name] = np.zeros(shape, np.float32)
    expect_contract(lambda: call(a), ST.CONTRACT_SHAPE, op)


@pytest.mark.parametrize("eps", [float("nan"), -1.0, float("inf")])
def test_bad_eps_is_refused(eps):
    a = norm_args()
    expect_contract(lambda: _core.rms_norm_gated_silu(a["x"], a["gate"], a["weight"], eps=eps),
                    ST.CONTRACT_VALUE, "rms_norm_gated_silu")
    expect_contract(lambda: _core.gdn_l2norm(a["x"][None], eps=eps), ST.CONTRACT_VALUE, "gdn_l2norm")


def test_scan_refuses_a_non_finite_scale():
    a = scan_args()
    expect_contract(lambda: _core.gdn_scan(a["q"], a["k"], a["v"], a["g"], a["beta"], scale=float("nan")),
                    ST.CONTRACT_VALUE, "gdn_scan")


def test_cuda_only_layouts_have_no_cpu_surprises():
    """The ops take a CPU Engine as well as None, with the same bytes."""
    e = memra.Engine("cpu")
    a = scan_args()
    o1, s1 = _core.gdn_scan(a["q"], a["k"], a["v"], a["g"], a["beta"], a["state"])
    o2, s2 = _core.gdn_scan(a["q"], a["k"], a["v"], a["g"], a["beta"], a["state"], engine=e)
    np.testing.assert_array_equal(o1, o2)
    np.testing.assert_array_equal(s1, s2)
