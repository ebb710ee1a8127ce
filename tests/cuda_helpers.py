"""Shared helpers of the CUDA op tests (tests/test_cuda_*.py): seeded generators, float32 and
bfloat16 conversions, bf16 Weights. The `e` fixture (a CUDA Engine per module) lives in
conftest.py."""

from __future__ import annotations

import ml_dtypes
import numpy as np

from memra import _core

BF16 = np.dtype(ml_dtypes.bfloat16)


def rng(seed: int) -> np.random.Generator:
    return np.random.default_rng(seed)


def f32(a) -> np.ndarray:
    """A C-contiguous float32 copy (or view) of `a`."""
    return np.ascontiguousarray(a, dtype=np.float32)


def bf16_round(x) -> np.ndarray:
    """x rounded to bfloat16 (round to nearest even) and widened back to float32."""
    return f32(np.asarray(x, np.float32).astype(BF16).astype(np.float32))


def bf16_weight(w) -> _core.Weight:
    """A memra Weight holding `w` rounded to bfloat16."""
    return _core.Weight(np.ascontiguousarray(np.asarray(w, np.float32).astype(BF16)).view(np.uint16),
                        dtype="bfloat16")
