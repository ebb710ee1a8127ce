"""Shapes whose launch grid would pass CUDA's limit of 65535 blocks in y are refused on CUDA with
UnsupportedError (50002, UNSUPPORTED_GEOMETRY), not launched: the launch used to fail with a CUDA
error (10009, invalid configuration), which inside a graph capture also ends the capture. The
engine stays usable after each (a small call of the same op runs). The shapes are the smallest
that cross the limit (found by a review of the entry points): K/V heads x head groups of the
attention, Hq + Hkv of the attention prologue, ceil(Hkv * hd / 128) of the K/V append, and
ceil(d_rope / 64) of the interleaved RoPE.
"""

from __future__ import annotations

import numpy as np
import pytest

import memra
from memra import _core
from cuda_helpers import f32, rng

pytestmark = pytest.mark.cuda

GEOMETRY = _core.status.UNSUPPORTED_GEOMETRY


def refused(call) -> None:
    with pytest.raises(memra.UnsupportedError) as ei:
        call()
    assert ei.value.code == GEOMETRY, ei.value


def test_attention_heads_past_grid_y(e):
    dev = e.to_device
    q, kc = dev(f32(rng(1).standard_normal((1, 65536, 1)))), dev(np.zeros((1, 65536, 1), np.float32))
    refused(lambda: _core.attention(q, kc, dev(np.zeros((1, 65536, 1), np.float32)), scale=1.0, engine=e))
    small = dev(f32(rng(2).standard_normal((1, 2, 8))))
    cache = dev(f32(rng(3).standard_normal((1, 2, 8))))
    assert e.to_host(_core.attention(small, cache, cache, scale=1.0, engine=e)).shape == (1, 2, 8)


def test_attn_prep_heads_past_grid_y(e):
    dev = e.to_device
    ones = dev(np.ones(1, np.float32))
    refused(lambda: _core.attn_prep(dev(np.ones((1, 65535, 2), np.float32)), dev(np.ones((1, 1, 1), np.float32)),
                                    ones, ones, eps=1e-6, rotary_dim=0, engine=e))
    w = dev(np.ones(8, np.float32))
    out = _core.attn_prep(dev(np.ones((1, 2, 16), np.float32)), dev(np.ones((1, 1, 8), np.float32)), w, w,
                          eps=1e-6, rotary_dim=0, engine=e)
    assert e.to_host(out[0]).shape == (1, 2, 8)


def test_kv_append_row_past_grid_y(e):
    # Hkv * hd = 32769 * 256: 65538 blocks of 128 values in y.
    dev = e.to_device
    k = dev(np.ones((1, 32769, 256), np.float32))
    kc, vc = dev(np.zeros((1, 32769, 256), np.float32)), dev(np.zeros((1, 32769, 256), np.float32))
    refused(lambda: _core.kv_append(k, k, kc, vc, engine=e))
    assert not e.to_host(kc).any()  # nothing written
    small = dev(np.ones((1, 2, 8), np.float32))
    kc2, vc2 = dev(np.zeros((1, 2, 8), np.float32)), dev(np.zeros((1, 2, 8), np.float32))
    _core.kv_append(small, small, kc2, vc2, engine=e)
    assert (e.to_host(kc2) == 1).all()


def test_rope_interleaved_width_past_grid_y(e):
    # d_rope / 2 = 2097216 pairs: 65538 blocks of 32 pairs in y.
    dev = e.to_device
    pos = dev(np.zeros(1, np.int32))
    refused(lambda: _core.rope_interleaved(dev(np.ones((1, 1, 4194432), np.float32)), pos, engine=e))
    x = f32(rng(4).standard_normal((1, 1, 8)))
    np.testing.assert_array_equal(e.to_host(_core.rope_interleaved(dev(x), pos, engine=e)), x)  # position 0
