"""The clamped SwiGLU MLP of the CPU backend (``memra._core.swiglu_mlp``, cpu/mlp.cpp) against a
numpy reference transcribed from transformers 5.17 ``models/glm5_next/modeling_glm5_next.py``
(Glm5NextTextMLP). numpy only: CI has neither torch nor transformers.
"""

from __future__ import annotations

import numpy as np
import pytest

import memra
from memra import _core
from cuda_helpers import randn, rng
from moe_reference import mlp64

S = _core.status


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
    ref = mlp64(x, gw, uw, dw, limit)
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
