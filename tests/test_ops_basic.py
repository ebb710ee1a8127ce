"""Basic CPU ops (embedding, linear, RMSNorm variants, LayerNorm, L2 norm, interleaved RoPE)
against numpy float64 references transcribed from transformers' modules. Tolerance: f32
arithmetic against a float64 reference, 1e-5 relative on O(1) data."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import memra
from memra import _core

RNG = np.random.default_rng(7)
S = _core.status


def randn(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


@pytest.mark.parametrize("T", [1, 3, 19])
def test_linear_bf16_and_embedding(T: int) -> None:
    w = randn(5, 7).astype(ml_dtypes.bfloat16)
    x = randn(T, 7)
    b = randn(5)
    got = _core.linear(x, _core.Weight(w.view(np.uint16), dtype="bfloat16"), b)
    want = x.astype(np.float64) @ w.astype(np.float64).T + b
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    table = randn(11, 4)
    ids = np.array([3, 0, 10][:T] * (T // 3 + 1), np.int32)[:T]
    np.testing.assert_array_equal(_core.embedding(_core.Weight(table), ids), table[ids])
    # expand = hc: each row repeated over hc residual streams (hc_expand of the rows).
    got = _core.embedding(_core.Weight(table), ids, expand=3)
    np.testing.assert_array_equal(got, np.repeat(table[ids][:, None, :], 3, axis=1))


def test_norms_match_references() -> None:
    x, g, w, b = randn(6, 9), randn(6, 9), randn(9), randn(9)
    x64 = x.astype(np.float64)
    rms = x64 / np.sqrt((x64**2).mean(-1, keepdims=True) + 1e-5)
    np.testing.assert_allclose(_core.rms_norm(x, w, eps=1e-5), rms * w, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(_core.rms_norm(x, eps=1e-5), rms, rtol=1e-5, atol=1e-6)
    sig = 1 / (1 + np.exp(-g.astype(np.float64)))
    np.testing.assert_allclose(_core.rms_norm_gated(x, g, w, eps=1e-5), w * rms * sig, rtol=1e-5, atol=1e-6)
    ln = (x64 - x64.mean(-1, keepdims=True)) / np.sqrt(x64.var(-1, keepdims=True) + 1e-6) * w + b
    np.testing.assert_allclose(_core.layer_norm(x, w, b, eps=1e-6), ln, rtol=1e-5, atol=1e-5)
    h = randn(2, 3, 8).astype(np.float64)
    np.testing.assert_allclose(_core.l2norm_heads(h.astype(np.float32)),
                               h / np.sqrt((h**2).sum(-1, keepdims=True) + 1e-6), rtol=1e-5, atol=1e-6)


def test_l2norm_heads_eps_is_inside_the_root_on_small_vectors() -> None:
    # transformers' l2norm (glm5_next, kimi_linear): x / sqrt(sum(x * x) + eps), eps = 1e-6 inside
    # the root. On O(1) rows eps is invisible; on rows of norm 1e-4..1e-2 it is most of the
    # denominator, so sqrt(ss) + eps (eps outside the root) is off by up to 10x there.
    scales = np.array([0.0, 1e-5, 1e-4, 3e-4, 1e-3, 1e-2, 1.0])
    h = RNG.standard_normal((len(scales), 2, 16)) * scales[:, None, None]
    h = h.astype(np.float32).astype(np.float64)
    want = h / np.sqrt((h**2).sum(-1, keepdims=True) + 1e-6)
    got = _core.l2norm_heads(h.astype(np.float32))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-9)
    np.testing.assert_array_equal(got[0], 0.0)  # a zero row stays zero (no 0 / 0)


def test_add_rms_norm_is_the_plain_residual_step() -> None:
    # transformers' pre-norm decoder layer: residual = residual + hidden_states, then RMSNorm.
    x, y, w = randn(5, 24), randn(5, 24), randn(24)
    s, h = _core.add_rms_norm(x, y, w, eps=1e-6)
    np.testing.assert_array_equal(s, x + y)  # one f32 addition per element
    np.testing.assert_array_equal(h, _core.rms_norm(x + y, w, eps=1e-6))
    s64 = x.astype(np.float64) + y
    np.testing.assert_allclose(h, s64 / np.sqrt((s64**2).mean(-1, keepdims=True) + 1e-6) * w, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(_core.add_rms_norm(x, y, eps=1e-6)[1], _core.rms_norm(x + y, eps=1e-6))
    with pytest.raises(memra.ContractError) as ei:
        _core.add_rms_norm(x, y[:4], w, eps=1e-6)
    assert ei.value.code == S.CONTRACT_SHAPE
    with pytest.raises(memra.ContractError) as ei:
        _core.add_rms_norm(x, y, w[:3], eps=1e-6)
    assert ei.value.code == S.CONTRACT_SHAPE
    with pytest.raises(memra.ContractError, match="eps"):
        _core.add_rms_norm(x, y, w, eps=float("nan"))


def test_norm_rows_are_the_three_norms() -> None:
    r = np.random.default_rng(11)
    x0, x1, x2 = (r.standard_normal((1, n)).astype(np.float32) for n in (48, 16, 8))
    w0, w2, b2 = (r.standard_normal(n).astype(np.float32) for n in (48, 8, 8))
    y0, y1, y2 = _core.norm_rows(x0, w0, x1, None, x2, w2, b2, eps0=1e-6, eps1=1e-5, eps2=1e-3)
    ref = [_core.rms_norm(x0, w0, eps=1e-6), _core.rms_norm(x1, eps=1e-5), _core.layer_norm(x2, w2, b2, eps=1e-3)]
    for got, want in zip((y0, y1, y2), ref):
        np.testing.assert_array_equal(got, want)
    # the references' formulas, in float64
    np.testing.assert_allclose(y1[0], x1[0] / np.sqrt(np.mean(x1[0].astype(np.float64) ** 2) + 1e-5), rtol=1e-5)
    assert _core.norm_rows(x0, w0, x1, None, eps0=1e-6, eps1=1e-5)[2].shape == (1, 0)
    with pytest.raises(memra.ContractError) as ei:
        _core.norm_rows(x0, w0, x1, None, x2, w2, eps0=1e-6, eps1=1e-5)
    assert ei.value.code == S.CONTRACT_MISSING
    with pytest.raises(memra.ContractError):
        _core.norm_rows(np.zeros((2, 48), np.float32), w0, x1, None, eps0=1e-6, eps1=1e-5)
    with pytest.raises(memra.ContractError, match="eps1"):
        _core.norm_rows(x0, w0, x1, None, eps0=1e-6, eps1=-1.0)


def test_norms_refuse_rows_past_int32(tmp_path) -> None:
    # A row of 2^31 + 16 values (a sparse file: nothing is read) is refused, not normalised over
    # the 16 values a narrowing cast would leave.
    x = np.memmap(tmp_path / "row.f32", np.float32, "w+", shape=(1, 2**31 + 16))
    small = np.ones((1, 4), np.float32)
    for call in (lambda: _core.rms_norm(x, eps=1e-6),
                 lambda: _core.layer_norm(x, np.ones(16, np.float32), np.ones(16, np.float32), eps=1e-6),
                 lambda: _core.norm_rows(x, None, small, None, eps0=1e-6, eps1=1e-6),
                 lambda: _core.norm_rows(small, None, small, None, x, np.ones(16, np.float32),
                                         np.ones(16, np.float32), eps0=1e-6, eps1=1e-6)):
        with pytest.raises(memra.ContractError) as ei:
            call()
        assert ei.value.code == S.CONTRACT_RANGE  # every extent past int32 (check_array)
    del x


@pytest.mark.parametrize("d_rope", [2, 8, 64])
def test_rope_interleaved_rotates_pairs(d_rope: int) -> None:
    T, n = 5, 3
    x = randn(T, n, d_rope)
    pos = np.array([0, 1, 7, 100, 4095], np.int32)
    got = _core.rope_interleaved(x, pos, base=10000.0)
    j = np.arange(d_rope // 2)
    ang = pos[:, None].astype(np.float64) * 10000.0 ** (-2.0 * j / d_rope)  # [T, d/2]
    c, s = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
    a, b = x[..., 0::2].astype(np.float64), x[..., 1::2].astype(np.float64)
    want = np.empty_like(x, dtype=np.float64)
    want[..., 0::2] = a * c - b * s
    want[..., 1::2] = a * s + b * c
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(got[0], x[0])  # position 0 is the identity


def test_rope_refuses_odd_dims_and_is_a_no_op_at_zero() -> None:
    with pytest.raises(memra.ContractError) as e:
        _core.rope_interleaved(randn(2, 1, 3), np.zeros(2, np.int32))
    assert e.value.code == S.CONTRACT_ODD_ROPE
    assert _core.rope_interleaved(randn(2, 1, 0), np.zeros(2, np.int32)).shape == (2, 1, 0)


@pytest.mark.parametrize(
    "call, code",
    [
        (lambda: _core.linear(np.ones((2, 4), np.float64), _core.Weight(randn(3, 4))), S.CONTRACT_DTYPE),
        (lambda: _core.linear(randn(4, 2).T, _core.Weight(randn(3, 4))), S.CONTRACT_STRIDE),
        (lambda: _core.linear(randn(2, 5), _core.Weight(randn(3, 4))), S.CONTRACT_SHAPE),
        (lambda: _core.rms_norm(randn(2, 3, 4), eps=1e-5), S.CONTRACT_SHAPE),
        (lambda: _core.embedding(_core.Weight(randn(4, 2)), np.array([4], np.int32)), S.CONTRACT_RANGE),
        (lambda: _core.embedding(_core.Weight(randn(4, 2)), np.array([1], np.int64)), S.CONTRACT_DTYPE),
        (lambda: _core.Weight(np.ones((2, 2), np.int32)), S.CONTRACT_DTYPE),
    ],
)
def test_bad_input_is_named(call, code: int) -> None:
    with pytest.raises(memra.ContractError) as e:
        call()
    assert e.value.code == code, str(e.value)


@pytest.mark.parametrize("eps", [-1.0, float("nan"), float("inf")])
def test_norm_eps_outside_its_domain_is_refused(eps: float) -> None:
    x = np.ones((2, 8), np.float32)
    w = np.ones(8, np.float32)
    for call in (lambda: _core.rms_norm(x, None, eps=eps),
                 lambda: _core.rms_norm_gated(x, x, w, eps=eps),
                 lambda: _core.layer_norm(x, w, w, eps=eps),
                 lambda: _core.l2norm_heads(x.reshape(2, 1, 8), eps=eps)):
        with pytest.raises(memra.ContractError) as e:
            call()
        assert e.value.code == _core.status.CONTRACT_VALUE
