"""KDA ops (``memra._core.kda_conv`` / ``kda_gate`` / ``kda_scan``) on the CPU backend against
numpy float64 transcriptions of transformers 5.17 ``models/glm5_next/modeling_glm5_next.py``
(``causal_conv1d_update``, ``Glm5NextTextForgetGate.forward``,
``recurrent_kimi_delta_attention``), plus the argument-checking contract.

Tolerances (f32 kernel vs f64 reference): ``RTOL = 1e-5`` relative with ``ATOL = 1e-6``
absolute. Conv and gate are a few roundings per output (~1e-7 relative observed); the scan's
error grows with dk-long dot products and T state steps but stays ~1e-7 absolute for T <= 500
with unit-norm q/k and v ~ N(0, 1). Split/chained calls are compared bit for bit.
"""

from __future__ import annotations

import numpy as np
import pytest

import memra
from memra import _core
from op_contracts import contract_tests, expect_contract

RTOL, ATOL = 1e-5, 1e-6
K = 4  # linear_conv_kernel_dim of glm5_next and Kimi-Linear
EDGE_T = [1, 2, 3, 63, 65, 200]  # T = 1, T < K, T around the 64-row chunk, T long
ST = _core.status


# ---------------------------------------------------------------- float64 references


def ref_conv(x, w, ring):
    """causal_conv1d_update: cat([conv_state, x]) per channel, depthwise cross-correlation,
    SiLU; the new state is the last K-1 columns of the concatenation. x [T, C], w [C, K],
    ring [C, K-1] -> (y [T, C], ring_out [C, K-1])."""
    x, w, ring = (a.astype(np.float64) for a in (x, w, ring))
    k = w.shape[1]
    cat = np.concatenate([ring.T, x], axis=0)  # [K-1+T, C]
    T = x.shape[0]
    acc = sum(w[:, j] * cat[j : j + T] for j in range(k))
    y = acc / (1.0 + np.exp(-acc))
    return y, cat[cat.shape[0] - (k - 1) :].T.copy()


def ref_gate(f, dt_bias, A_log, form, lower_bound=-5.0):
    """Glm5NextTextForgetGate.forward. f [T, H*dk], dt_bias [H*dk], A_log [H]."""
    H = A_log.shape[0]
    T, D = f.shape
    g = (f.astype(np.float64) + dt_bias).reshape(T, H, D // H)
    rate = np.exp(A_log.astype(np.float64))[None, :, None]
    with np.errstate(over="ignore"):  # exp(+-1e4) -> inf saturates as intended
        if form == "lower_bound":
            return (lower_bound / (1.0 + np.exp(-rate * g))).reshape(T, D)
        sp = np.where(g > 20.0, g, np.log(1.0 + np.exp(g)))
        out = -rate * sp
    return out.reshape(T, D)


def ref_scan(q, k, v, g, beta, state=None, scale=None):
    """recurrent_kimi_delta_attention, one sequence: q, k, g [T, H, dk]; v [T, H, dv];
    beta [T, H]; state [H, dk, dv] -> (o [T, H, dv], state)."""
    q, k, v, g, beta = (a.astype(np.float64) for a in (q, k, v, g, beta))
    T, H, dk = k.shape
    dv = v.shape[-1]
    scale = 1 / (dk**0.5) if scale is None else scale
    q = q * scale
    S = np.zeros((H, dk, dv)) if state is None else state.astype(np.float64).copy()
    o = np.zeros((T, H, dv))
    for t in range(T):
        S = S * np.exp(g[t])[..., None]
        kv_mem = (S * k[t][..., None]).sum(-2)
        delta = (v[t] - kv_mem) * beta[t][..., None]
        S = S + k[t][..., None] * delta[:, None, :]
        o[t] = (S * q[t][..., None]).sum(-2)
    return o, S


# ---------------------------------------------------------------- inputs


def rng(seed):
    return np.random.default_rng(seed)


def f32(a):
    return np.ascontiguousarray(a, dtype=np.float32)


def l2norm(x, eps=1e-6):
    return x / np.sqrt((x * x).sum(-1, keepdims=True) + eps)


def scan_inputs(T, H=2, dk=16, dv=16, seed=0, with_state=True, g_value=None, beta_value=None):
    r = rng(seed)
    q = f32(l2norm(r.standard_normal((T, H, dk))))
    k = f32(l2norm(r.standard_normal((T, H, dk))))
    v = f32(r.standard_normal((T, H, dv)))
    if g_value is None:
        g = f32(-5.0 / (1.0 + np.exp(-2.0 * r.standard_normal((T, H, dk)))))
    else:
        g = np.full((T, H, dk), g_value, np.float32)
    if beta_value is None:
        beta = f32(1.0 / (1.0 + np.exp(-r.standard_normal((T, H)))))
    else:
        beta = np.full((T, H), beta_value, np.float32)
    state = f32(0.3 * r.standard_normal((H, dk, dv))) if with_state else None
    return q, k, v, g, beta, state


def assert_close(got, want):
    assert np.all(np.isfinite(got))
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL)


# ---------------------------------------------------------------- conv


@pytest.mark.parametrize("T", EDGE_T)
def test_conv_matches_reference(T):
    r = rng(T)
    C = 37
    x, w = f32(r.standard_normal((T, C))), f32(0.5 * r.standard_normal((C, K)))
    ring = f32(r.standard_normal((C, K - 1)))
    ring_before = ring.copy()
    y, ring_out = _core.kda_conv(x, w, ring)
    ry, rring = ref_conv(x, w, ring)
    assert y.dtype == np.float32 and y.shape == (T, C) and ring_out.shape == (C, K - 1)
    assert_close(y, ry)
    np.testing.assert_array_equal(ring_out, rring)  # a copy of inputs: exact
    np.testing.assert_array_equal(ring, ring_before)  # the input ring is not modified


@pytest.mark.parametrize("T", EDGE_T)
def test_conv_prefill_then_decode_is_bit_exact(T):
    r = rng(100 + T)
    C = 29
    x, w = f32(r.standard_normal((T, C))), f32(r.standard_normal((C, K)))
    ring0 = f32(r.standard_normal((C, K - 1)))
    y_full, ring_full = _core.kda_conv(x, w, ring0)
    y_head, ring_mid = _core.kda_conv(x[: T - 1], w, ring0)  # T-1 may be 0
    y_tail, ring_end = _core.kda_conv(x[T - 1 :], w, ring_mid)  # the decode arm
    np.testing.assert_array_equal(np.concatenate([y_head, y_tail]), y_full)
    np.testing.assert_array_equal(ring_end, ring_full)


def test_conv_token_by_token_from_fresh_ring():
    r = rng(7)
    T, C = 7, 11
    x, w = f32(r.standard_normal((T, C))), f32(r.standard_normal((C, K)))
    ring = np.zeros((C, K - 1), np.float32)
    y_full, ring_full = _core.kda_conv(x, w, ring)
    ys = []
    for t in range(T):
        y, ring = _core.kda_conv(x[t : t + 1], w, ring)
        ys.append(y)
    np.testing.assert_array_equal(np.concatenate(ys), y_full)
    np.testing.assert_array_equal(ring, ring_full)


@pytest.mark.parametrize("batch", [False, True])
def test_conv_l2_dk_is_the_conv_then_l2norm_heads(batch):
    # l2_dk: the op's fused norm (KdaLayer's q and k), the bytes of the two ops.
    r = rng(55)
    B, C, dk = 3, 12, 4
    x, w = f32(r.standard_normal((B, C))), f32(r.standard_normal((C, K)))
    ring = f32(r.standard_normal((B, C, K - 1) if batch else (C, K - 1)))
    y, ring_out = _core.kda_conv(x[:1] if not batch else x, w, ring, batch=batch, l2_dk=dk)
    y0, ring0 = _core.kda_conv(x[:1] if not batch else x, w, ring, batch=batch)
    want = _core.l2norm_heads(y0.reshape(len(y0), C // dk, dk), eps=1e-6).reshape(y0.shape)
    np.testing.assert_array_equal(y, want)
    np.testing.assert_array_equal(ring_out, ring0)
    for bad in (-4, 5):  # not a head size of C
        expect_contract(lambda: _core.kda_conv(x[:1], w, ring[0] if batch else ring, l2_dk=bad),
                        ST.CONTRACT_SHAPE, "kda_conv")


# ---------------------------------------------------------------- gate


@pytest.mark.parametrize("form", ["lower_bound", "softplus"])
def test_gate_matches_reference(form):
    r = rng(3)
    T, H, dk = 13, 3, 5
    f = f32(4.0 * r.standard_normal((T, H * dk)))
    dt_bias = f32(r.standard_normal(H * dk))
    A_log = f32(r.standard_normal(H))
    # The softplus threshold (20) and saturation of both forms: |f + dt_bias| up to 1e4.
    probes = np.array([19.9, 20.0, 20.1, 25.0, -20.0, -30.0, 1e4, -1e4, 0.0], np.float32)
    f[0, : probes.size] = probes - dt_bias[: probes.size]
    g = _core.kda_gate(f, dt_bias, A_log, form=form, lower_bound=-5.0)
    assert g.shape == (T, H * dk) and g.dtype == np.float32
    assert_close(g, ref_gate(f, dt_bias, A_log, form))
    assert np.all(g <= 0)
    if form == "lower_bound":
        assert np.all(g >= -5.0)


def test_gate_defaults_are_glm5_next():
    r = rng(4)
    f, dt_bias = f32(r.standard_normal((3, 8))), f32(r.standard_normal(8))
    A_log = f32(r.standard_normal(2))
    np.testing.assert_array_equal(
        _core.kda_gate(f, dt_bias, A_log),
        _core.kda_gate(f, dt_bias, A_log, form="lower_bound", lower_bound=-5.0),
    )


# ---------------------------------------------------------------- scan


@pytest.mark.parametrize("T", EDGE_T)
@pytest.mark.parametrize("with_state", [False, True])
def test_scan_matches_reference(T, with_state):
    q, k, v, g, beta, state = scan_inputs(T, seed=T, with_state=with_state)
    o, s = _core.kda_scan(q, k, v, g, beta, state)
    ro, rs = ref_scan(q, k, v, g, beta, state)
    assert o.shape == v.shape and s.shape == (2, 16, 16)
    assert_close(o, ro)
    assert_close(s, rs)


def test_scan_wide_and_rectangular_heads():
    for dk, dv, H in [(128, 128, 1), (16, 24, 3)]:
        q, k, v, g, beta, state = scan_inputs(65, H=H, dk=dk, dv=dv, seed=dk + dv)
        o, s = _core.kda_scan(q, k, v, g, beta, state)
        ro, rs = ref_scan(q, k, v, g, beta, state)
        assert_close(o, ro)
        assert_close(s, rs)


def test_scan_scale_default_is_dk_rsqrt():
    q, k, v, g, beta, state = scan_inputs(5, dk=16, seed=9)
    o1, s1 = _core.kda_scan(q, k, v, g, beta, state)
    o2, s2 = _core.kda_scan(q, k, v, g, beta, state, scale=0.25)
    np.testing.assert_array_equal(o1, o2)
    np.testing.assert_array_equal(s1, s2)
    o3, _ = _core.kda_scan(q, k, v, g, beta, state, scale=0.5)
    assert_close(o3, ref_scan(q, k, v, g, beta, state, scale=0.5)[0])


def test_scan_does_not_modify_state():
    q, k, v, g, beta, state = scan_inputs(4, seed=10)
    before = state.copy()
    _core.kda_scan(q, k, v, g, beta, state)
    np.testing.assert_array_equal(state, before)


@pytest.mark.parametrize("T", [1, 2, 63, 65, 200])
def test_scan_prefill_then_decode_is_bit_exact(T):
    q, k, v, g, beta, state = scan_inputs(T, seed=200 + T)
    o_full, s_full = _core.kda_scan(q, k, v, g, beta, state)
    head = slice(0, T - 1)
    tail = slice(T - 1, T)
    o_head, s_mid = _core.kda_scan(q[head], k[head], v[head], g[head], beta[head], state)
    o_tail, s_end = _core.kda_scan(q[tail], k[tail], v[tail], g[tail], beta[tail], s_mid)
    np.testing.assert_array_equal(np.concatenate([o_head, o_tail]), o_full)
    np.testing.assert_array_equal(s_end, s_full)


def test_scan_chained_one_step_calls_equal_one_call():
    T = 63
    q, k, v, g, beta, _ = scan_inputs(T, seed=300, with_state=False)
    o_full, s_full = _core.kda_scan(q, k, v, g, beta)
    s = None
    for t in range(T):
        sl = slice(t, t + 1)
        o, s = _core.kda_scan(q[sl], k[sl], v[sl], g[sl], beta[sl], s)
        np.testing.assert_array_equal(o[0], o_full[t])
    np.testing.assert_array_equal(s, s_full)


@pytest.mark.parametrize(
    "T,g_value,beta_value",
    [
        (200, 0.0, None),  # g == 0: no decay, the state keeps everything
        (500, -5.0, None),  # at the lower bound for 500 steps
        (65, None, 1e-7),  # beta ~ 0: the state barely moves
        (65, None, 1.0 - 1e-7),  # beta ~ 1 (f32 rounds it to 1 - 2^-24 or so)
        (200, 0.0, 1.0),  # pure delta rule, no decay
    ],
)
def test_scan_gate_and_beta_extremes(T, g_value, beta_value):
    q, k, v, g, beta, state = scan_inputs(T, seed=400 + T, g_value=g_value, beta_value=beta_value)
    o, s = _core.kda_scan(q, k, v, g, beta, state)
    ro, rs = ref_scan(q, k, v, g, beta, state)
    assert_close(o, ro)
    assert_close(s, rs)


def test_saturated_softplus_gate_forgets_the_state():
    # |f + dt_bias| = 1e4 through the softplus gate: exp(g) == 0, each step starts from zero.
    T, H, dk = 8, 2, 16
    q, k, v, _, beta, state = scan_inputs(T, H=H, dk=dk, seed=500)
    g = _core.kda_gate(
        np.full((T, H * dk), 1e4, np.float32), np.zeros(H * dk, np.float32),
        np.zeros(H, np.float32), form="softplus",
    ).reshape(T, H, dk)
    o, s = _core.kda_scan(q, k, v, g, beta, state)
    assert np.all(np.isfinite(o)) and np.all(np.isfinite(s))
    sl = slice(T - 1, T)
    o1, s1 = _core.kda_scan(q[sl], k[sl], v[sl], g[sl], beta[sl])
    np.testing.assert_array_equal(o[-1:], o1)
    np.testing.assert_array_equal(s, s1)


# ---------------------------------------------------------------- argument contract


def conv_args():
    r = rng(1)
    return dict(x=f32(r.standard_normal((5, 6))), w=f32(r.standard_normal((6, K))),
                ring=f32(r.standard_normal((6, K - 1))))


def gate_args():
    r = rng(2)
    return dict(f=f32(r.standard_normal((5, 8))), dt_bias=f32(r.standard_normal(8)),
                A_log=f32(r.standard_normal(2)))


def scan_args():
    q, k, v, g, beta, state = scan_inputs(5, H=2, dk=4, dv=3, seed=3)
    return dict(q=q, k=k, v=v, g=g, beta=beta, state=state)


OPS = {
    "kda_conv": (conv_args, lambda a: _core.kda_conv(a["x"], a["w"], a["ring"])),
    "kda_gate": (gate_args, lambda a: _core.kda_gate(a["f"], a["dt_bias"], a["A_log"])),
    "kda_scan": (scan_args, lambda a: _core.kda_scan(
        a["q"], a["k"], a["v"], a["g"], a["beta"], a["state"])),
}
(test_float64_argument_is_refused, test_wrong_rank_is_refused,
 test_non_contiguous_argument_is_refused) = contract_tests(OPS, contiguous_only_nd=("dt_bias", "A_log"))


def test_strided_1d_argument_is_refused():
    a = gate_args()
    a["dt_bias"] = np.repeat(a["dt_bias"], 2)[::2]
    expect_contract(lambda: OPS["kda_gate"][1](a), ST.CONTRACT_STRIDE, "kda_gate")


@pytest.mark.parametrize(
    "op,name,shape",
    [
        ("kda_conv", "w", (7, K)),  # C mismatch
        ("kda_conv", "ring", (6, K)),  # ring must be K-1 wide
        ("kda_conv", "w", (6, 0)),  # empty kernel
        ("kda_gate", "dt_bias", (9,)),
        ("kda_gate", "A_log", (3,)),  # 8 channels are not a multiple of 3 heads
        ("kda_scan", "k", (5, 2, 5)),
        ("kda_scan", "v", (4, 2, 3)),
        ("kda_scan", "g", (5, 2, 3)),
        ("kda_scan", "beta", (5, 3)),
        ("kda_scan", "state", (2, 4, 4)),  # dv mismatch
    ],
)
def test_wrong_shape_is_refused(op, name, shape):
    make, call = OPS[op]
    a = make()
    a[name] = np.zeros(shape, np.float32)
    expect_contract(lambda: call(a), ST.CONTRACT_SHAPE, op)


def test_bad_gate_form_is_refused():
    a = gate_args()
    expect_contract(
        lambda: _core.kda_gate(a["f"], a["dt_bias"], a["A_log"], form="sigmoid"),
        ST.CONTRACT_VALUE, "kda_gate",
    )


def test_scan_refuses_a_non_finite_scale() -> None:
    q = np.ones((1, 1, 128), np.float32)
    with pytest.raises(memra.ContractError):
        _core.kda_scan(q, q, q, q * 0, np.ones((1, 1), np.float32), scale=float("nan"))
