"""The mHC ops of the CPU backend (hyper-connection mapping, post, head mean) against numpy
references transcribed from transformers 5.17 ``models/glm5_next/modeling_glm5_next.py``
(Glm5NextTextHyperConnection, Glm5NextTextHyperHead, the decoder layer's post/comb application).
numpy only: CI has neither torch nor transformers.
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


# ---------------------------------------------------------------- references (float64)


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
    # hc = 0 is refused as mhc_pre and mhc_post_head_norm refuse it (it was an empty out).
    e = expect_contract(S.CONTRACT_VALUE, _core.mhc_post, y, randn(r, T, 0), randn(r, T, 0, 0),
                        randn(r, T, 0, D))
    assert "hc" in str(e) and "residual" in str(e), str(e)
    expect_contract(S.CONTRACT_SHAPE, _core.hc_head_mean, y)
