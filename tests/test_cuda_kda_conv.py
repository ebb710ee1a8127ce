"""The KDA short conv on the CUDA backend (``memra._core.kda_conv`` with
``engine=memra.Engine("cuda")``, cuda/kda_conv.cu) against the same op on the CPU backend
(cpp/src/cpu/kda.cpp, the numeric oracle), and the bit-exactness contracts between its arms:
prefill / decode at T = 1, prefill then decode, token by token, the batched decode rows against
each row alone (with the fused per-head L2 norm), and which kernel a geometry launches.

Tolerances (both sides f32): the tap sums are the CPU's operations in the CPU's order
(bit-identical pre-activation); only CUDA's expf inside SiLU differs (<= 2 ulp vs glibc's ~0.5):
``rtol=1e-6, atol=1e-7``. The new ring is a copy of inputs: compared with ``np.array_equal``.
The gate, the scan and the argument contract on the device are tests/test_cuda_kda.py's.
"""

from __future__ import annotations

import numpy as np
import pytest

import memra
from memra import _core
from cuda_helpers import close, f32, kernel_names, rng

pytestmark = pytest.mark.cuda

ST = _core.status
K = 4  # linear_conv_kernel_dim of glm5_next and Kimi-Linear
EDGE_T = [1, 2, 3, 63, 65, 200]  # T = 1, T < K-1, T around the 64-row chunk, T long

CONV_TOL = dict(rtol=1e-6, atol=1e-7)


def conv_inputs(T, C=37, k=K, seed=0):
    r = rng(seed)
    return (f32(r.standard_normal((T, C))), f32(0.5 * r.standard_normal((C, k))),
            f32(r.standard_normal((C, k - 1))))


def conv_cuda(e, x, w, ring, **kw):
    y, ring_out = _core.kda_conv(e.to_device(x), e.to_device(w), e.to_device(ring), engine=e, **kw)
    return e.to_host(y), e.to_host(ring_out)


@pytest.mark.parametrize("T", EDGE_T)
def test_conv_matches_cpu(e, T):
    x, w, ring = conv_inputs(T, seed=T)
    y, ring_out = conv_cuda(e, x, w, ring)
    cy, cring = _core.kda_conv(x, w, ring)
    close(y, cy, CONV_TOL)
    np.testing.assert_array_equal(ring_out, cring)  # ring roll: copies, exact (incl. T < K-1)


@pytest.mark.parametrize("k", [2, 3, 4, 5, 6, 7, 8])
@pytest.mark.parametrize("T", [1, 3, 65])
def test_conv_every_kernel_width(e, k, T):
    x, w, ring = conv_inputs(T, C=19, k=k, seed=10 * k + T)
    y, ring_out = conv_cuda(e, x, w, ring, arm="prefill")
    cy, cring = _core.kda_conv(x, w, ring, arm="prefill")
    close(y, cy, CONV_TOL)
    np.testing.assert_array_equal(ring_out, cring)


@pytest.mark.parametrize("k", [2, 4, 8])
def test_conv_decode_arm_equals_prefill_arm_at_t1(e, k):
    x, w, ring = conv_inputs(1, C=131, k=k, seed=20 + k)
    yp, rp = conv_cuda(e, x, w, ring, arm="prefill")
    yd, rd = conv_cuda(e, x, w, ring, arm="decode")
    np.testing.assert_array_equal(yd, yp)
    np.testing.assert_array_equal(rd, rp)


@pytest.mark.parametrize("T", EDGE_T)
def test_conv_prefill_then_decode_is_bit_exact(e, T):
    x, w, ring0 = conv_inputs(T, C=29, seed=100 + T)
    y_full, ring_full = conv_cuda(e, x, w, ring0)
    y_head, ring_mid = conv_cuda(e, x[: T - 1], w, ring0)  # T-1 may be 0: the ring passes through
    y_tail, ring_end = conv_cuda(e, x[T - 1 :], w, ring_mid)  # the decode arm
    np.testing.assert_array_equal(np.concatenate([y_head, y_tail]), y_full)
    np.testing.assert_array_equal(ring_end, ring_full)


def test_conv_token_by_token_from_fresh_ring(e):
    T, C = 7, 11
    x, w, _ = conv_inputs(T, C=C, seed=7)
    ring = np.zeros((C, K - 1), np.float32)
    y_full, ring_full = conv_cuda(e, x, w, ring)
    ys = []
    for t in range(T):
        y, ring = conv_cuda(e, x[t : t + 1], w, ring)
        ys.append(y)
    np.testing.assert_array_equal(np.concatenate(ys), y_full)
    np.testing.assert_array_equal(ring, ring_full)


@pytest.mark.parametrize("k", [2, 4, 7])
def test_conv_batched_decode_equals_each_sequence_alone(e, k):
    B, C = 5, 67
    r = rng(30 + k)
    x = f32(r.standard_normal((B, C)))
    w = f32(0.5 * r.standard_normal((C, k)))
    rings = f32(r.standard_normal((B, C, k - 1)))
    y, ring_out = conv_cuda(e, x, w, rings, batch=True)
    assert y.shape == (B, C) and ring_out.shape == (B, C, k - 1)
    for b in range(B):
        yb, rb = conv_cuda(e, x[b : b + 1], w, rings[b])
        np.testing.assert_array_equal(y[b : b + 1], yb)
        np.testing.assert_array_equal(ring_out[b], rb)
    cy, cring = _core.kda_conv(x, w, rings, batch=True)
    close(y, cy, CONV_TOL)
    np.testing.assert_array_equal(ring_out, cring)


# The decode arm's geometries: the bench model's q|k|v width at 2 heads (768, the L2 norm fused
# into the decode launch at dk = 128, or l2norm_heads after it at dk = 64), a width that ends
# inside a block (516) and an odd one (67).
DECODE_GEOMETRIES = [(768, 0), (768, 128), (768, 64), (516, 0), (67, 0)]
# With the L2 norm the CPU sums each head's squares in one ascending chain, the GPU in 32 strided
# chains and a warp tree (plus expf's ulps before it): relative errors of a few 1e-7.
CONV_L2_TOL = dict(rtol=1e-5, atol=1e-6)


def _batched_decode_rows(e, B, C, l2_dk, k, seed):
    """One batched decode launch of B rows, each row against the prefill arm over that row
    alone (T = 1; with l2_dk, the conv then l2norm_heads as launches of their own): the same
    bytes, y and the rolled ring. Returns the inputs and the batched outputs."""
    r = rng(seed)
    x = f32(r.standard_normal((B, C)))
    w = f32(0.5 * r.standard_normal((C, k)))
    rings = f32(r.standard_normal((B, C, k - 1)))
    y, ring_out = conv_cuda(e, x, w, rings, batch=True, l2_dk=l2_dk)
    assert y.shape == (B, C) and ring_out.shape == (B, C, k - 1)
    for b in range(B):
        yb, rb = conv_cuda(e, x[b : b + 1], w, rings[b], arm="prefill", l2_dk=l2_dk)
        np.testing.assert_array_equal(y[b : b + 1], yb, err_msg=f"row {b}")
        np.testing.assert_array_equal(ring_out[b], rb, err_msg=f"row {b}")
    return x, w, rings, y, ring_out


@pytest.mark.parametrize("C, l2_dk", DECODE_GEOMETRIES)
@pytest.mark.parametrize("k", [2, 4, 8])
def test_conv_batched_decode_equals_prefill_rows(e, C, l2_dk, k):
    # Each row's bytes are the prefill arm's over that row alone; and the CPU within tolerance.
    x, w, rings, y, ring_out = _batched_decode_rows(e, 6, C, l2_dk, k, 1000 + 10 * k + C % 97 + l2_dk)
    cy, cring = _core.kda_conv(x, w, rings, batch=True, l2_dk=l2_dk)
    close(y, cy, CONV_L2_TOL if l2_dk else CONV_TOL)
    np.testing.assert_array_equal(ring_out, cring)


@pytest.mark.parametrize("B", [1, 4, 9, 64])
def test_conv_batched_decode_row_counts(e, B):
    # One row, a few, an odd count and the bench model's 64 rows in one decode launch.
    _batched_decode_rows(e, B, 768, 128, 4, 2000 + B)


@pytest.mark.parametrize("C, l2_dk, kernel", [(768, 128, "::conv_decode_kernel<4, true>"),
                                              (516, 0, "::conv_decode_kernel<4, false>"),
                                              (768, 64, "::conv_decode_kernel<4, false>")])
def test_conv_batched_decode_kernel_choice(e, tmp_path, C, l2_dk, kernel):
    # The fused norm (dk = 128: a block's channels are one head) is one launch; another dk is
    # the plain conv, then l2norm_heads.
    r = rng(77)
    x = e.to_device(f32(r.standard_normal((3, C))))
    w = e.to_device(f32(0.5 * r.standard_normal((C, K))))
    rings = e.to_device(f32(r.standard_normal((3, C, K - 1))))
    names = kernel_names(lambda: (_core.kda_conv(x, w, rings, batch=True, l2_dk=l2_dk, engine=e),
                                  e.synchronize()), tmp_path / "trace.json")
    assert kernel in names[0], names
    assert len(names) == (2 if l2_dk == 64 else 1), names


@pytest.mark.parametrize("k", [1, 9])
def test_conv_unbuilt_kernel_width_is_unsupported(e, k):
    x, w, ring = conv_inputs(3, C=8, k=k, seed=50)
    for arm in ("prefill", "decode"):
        xi = x if arm == "prefill" else x[:1]
        with pytest.raises(memra.UnsupportedError) as ei:
            conv_cuda(e, xi, w, ring, arm=arm)
        assert ei.value.code == ST.UNSUPPORTED_GEOMETRY
        assert "kda_conv" in str(ei.value)
    _core.kda_conv(x, w, ring)  # the CPU backend still runs it
