"""Basic ops on the CUDA backend (``memra._core.embedding`` / ``linear`` / ``rms_norm`` /
``add_rms_norm`` / ``rms_norm_gated`` / ``layer_norm`` / ``norm_rows`` / ``l2norm_heads`` /
``rope_interleaved`` / ``sigmoid`` with ``engine=memra.Engine("cuda")``; kernels in cuda/basic.cu
and cuda/linear.cu) against the same ops on the CPU backend (cpp/src/cpu/basic.cpp,
cpp/src/cpu/linear.cpp: the numeric oracle), plus the argument contract. mHC:
tests/test_cuda_mhc.py; the decode GEMV: tests/test_cuda_gemv.py.

Tolerances (both sides f32 unless said):
- embedding: a row copy (bf16 -> f32 is exact): ``np.array_equal``.
- norms: the GPU sums each row as a tree, the CPU as one ascending chain; the CPU's own error
  against float64 is ~2e-6 relative at D = 16384 (sum of squares) and ~3e-6 absolute for the
  LayerNorm mean at D = 4096, the tree's is smaller: ``rtol=1e-5, atol=1e-5`` (O(1) data); CUDA's
  expf in the gate is within 2 ulp.
- linear, f32 weights: cuBLAS SGEMM with TF32 off vs the CPU's ascending dot product; the CPU's
  error against float64 is ~2e-6 of max|y| at K = 4096: ``|d| <= 1e-5 * max|y|``.
- linear, bf16 weights: (a) against the CPU op on the same bf16 weight with x rounded to bf16
  first, the products are exact in f32 in both and only the accumulation differs; the tensor
  cores add with truncation inside each MMA, so a few ulp of the partial sums per K step:
  ``|d| <= 1e-4 * max|y|``. (b) against the CPU on unrounded x: each x is rounded by <= 2^-9
  relative, errors of random sign add as sqrt(K) terms of size 2^-9 |x w| -> ~2e-3 of max|y|:
  ``|d| <= 1e-2 * max|y|``.
- rope: cos/sin in double rounded once, exactly as on the CPU, products without contraction:
  ``atol=1e-6`` (a last-bit difference of CUDA's double sincos can flip a float rounding).
- sigmoid: CUDA expf within 2 ulp: ``rtol=1e-6, atol=1e-7``.
A small shape for ``compute-sanitizer --tool racecheck`` / ``memcheck``:
``python -m pytest tests/test_cuda_basic.py -k sanitizer``.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import memra
from memra import _core
from cuda_helpers import bf16_round, bf16_weight, close, close_scaled, expect, f32, rng

pytestmark = pytest.mark.cuda

ST = _core.status
BF16 = np.dtype(ml_dtypes.bfloat16)
EDGE_T = [1, 2, 63, 65, 200]
WIDTHS = [16, 33, 128, 200, 4096]  # odd, one warp, several warps, hidden, ...

NORM_TOL = dict(rtol=1e-5, atol=1e-5)
ROPE_TOL = dict(rtol=0, atol=1e-6)
SIG_TOL = dict(rtol=1e-6, atol=1e-7)


def dev_weight(e, w, dtype=None):
    return memra.DeviceWeight(e, w, dtype=dtype)


# ---------------------------------------------------------------- embedding


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("T,D", [(1, 16), (65, 33), (200, 4096)])
def test_embedding_matches_cpu(e, dtype, T, D):
    r = rng(T + D)
    vocab = 97
    table = f32(r.standard_normal((vocab, D)))
    w = _core.Weight(table) if dtype == "float32" else bf16_weight(table)
    ids = r.integers(0, vocab, T).astype(np.int32)
    ids[0] = vocab - 1
    want = _core.embedding(w, ids)
    got = e.to_host(_core.embedding(dev_weight(e, w), e.to_device(ids), engine=e))
    assert got.dtype == np.float32 and got.shape == (T, D)
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("T,D,hc", [(1, 4096, 4), (65, 33, 3), (2, 16, 1)])
def test_embedding_expand_is_hc_expand_of_the_rows(e, dtype, T, D, hc):
    # expand = hc: the rows written to the hc residual streams in the gather's launch, the bytes
    # of hc_expand(embedding(...)); an unchecked id outside the vocabulary gives zero streams.
    r = rng(T * 3 + D + hc)
    vocab = 97
    table = f32(r.standard_normal((vocab, D)))
    w = _core.Weight(table) if dtype == "float32" else bf16_weight(table)
    ids = r.integers(0, vocab, T).astype(np.int32)
    dw, di = dev_weight(e, w), e.to_device(ids)
    got = e.to_host(_core.embedding(dw, di, expand=hc, engine=e))
    two = _core.hc_expand(_core.embedding(dw, di, engine=e), hc, engine=e)
    assert got.shape == (T, hc, D)
    np.testing.assert_array_equal(got, e.to_host(two))
    np.testing.assert_array_equal(got, _core.embedding(w, ids, expand=hc))
    ids[0] = vocab
    got = e.to_host(_core.embedding(dw, e.to_device(ids), expand=hc, check_range=False, engine=e))
    assert not got[0].any()
    for bad in (0, -2):
        expect(memra.ContractError, ST.CONTRACT_VALUE, _core.embedding, dw, di, expand=bad, engine=e)


def test_embedding_f32_table_stored_as_bf16_on_device(e):
    # DeviceWeight(dtype="bfloat16") of an f32 table equals the CPU op on the bf16-rounded table.
    r = rng(5)
    table = f32(r.standard_normal((50, 40)))
    ids = np.array([0, 49, 7, 7], np.int32)
    got = e.to_host(_core.embedding(dev_weight(e, _core.Weight(table), "bfloat16"),
                                    e.to_device(ids), engine=e))
    np.testing.assert_array_equal(got, bf16_round(table)[ids])


def test_embedding_out_of_range_ids(e):
    table = f32(rng(6).standard_normal((10, 8)))
    dw = dev_weight(e, _core.Weight(table))
    for bad in (10, -1):
        ids = np.array([1, bad, 2], np.int32)
        err = expect(memra.ContractError, ST.CONTRACT_RANGE, _core.embedding, dw, e.to_device(ids),
                     engine=e)
        assert "position 1" in str(err)
    # Unchecked: an id outside the vocabulary gives a zero row (the ABI's contract).
    ids = np.array([1, 10, -5, 2], np.int32)
    got = e.to_host(_core.embedding(dw, e.to_device(ids), check_range=False, engine=e))
    np.testing.assert_array_equal(got[[0, 3]], table[[1, 2]])
    np.testing.assert_array_equal(got[[1, 2]], np.zeros((2, 8), np.float32))


def test_embedding_zero_tokens(e):
    dw = dev_weight(e, _core.Weight(f32(np.ones((4, 3)))))
    got = e.to_host(_core.embedding(dw, e.to_device(np.zeros(0, np.int32)), engine=e))
    assert got.shape == (0, 3)


# ---------------------------------------------------------------- linear


# Decode-shaped rows (T <= 4) at several K and N besides the prefill shapes.
LINEAR_SHAPES = [(1, 33, 7), (2, 200, 65), (63, 128, 33), (65, 1024, 200), (200, 4096, 96),
                 (1, 4096, 4096), (1, 8, 3), (3, 4104, 70), (4, 2048, 5000), (2, 16384, 40),
                 (4, 16384, 16)]


@pytest.mark.parametrize("T,K,N", LINEAR_SHAPES)
@pytest.mark.parametrize("with_bias", [False, True])
def test_linear_f32_matches_cpu(e, T, K, N, with_bias):
    r = rng(T * 7 + K + N)
    x = f32(r.standard_normal((T, K)))
    w = _core.Weight(f32(r.standard_normal((N, K)) / np.sqrt(K)))
    b = f32(r.standard_normal(N)) if with_bias else None
    want = _core.linear(x, w, b)
    got = e.to_host(_core.linear(e.to_device(x), dev_weight(e, w),
                                 None if b is None else e.to_device(b), engine=e))
    close_scaled(got, want, 1e-5)


@pytest.mark.parametrize("T,K,N", LINEAR_SHAPES)
def test_linear_bf16_matches_cpu_on_rounded_x(e, T, K, N):
    r = rng(T * 11 + K + N)
    x = f32(r.standard_normal((T, K)))
    w = bf16_weight(r.standard_normal((N, K)) / np.sqrt(K))
    b = f32(r.standard_normal(N))
    got = e.to_host(_core.linear(e.to_device(x), dev_weight(e, w), e.to_device(b), engine=e))
    close_scaled(got, _core.linear(bf16_round(x), w, b), 1e-4)  # (a): accumulation order only
    close_scaled(got, _core.linear(x, w, b), 1e-2)  # (b): x's bf16 rounding


def test_linear_f32_weight_uploaded_as_bf16(e):
    r = rng(12)
    x = f32(r.standard_normal((5, 300)))
    w32 = f32(r.standard_normal((40, 300)) / np.sqrt(300))
    dw = dev_weight(e, _core.Weight(w32), "bfloat16")
    assert dw.dtype == "bfloat16"
    got = e.to_host(_core.linear(e.to_device(x), dw, engine=e))
    close_scaled(got, _core.linear(bf16_round(x), bf16_weight(w32)), 1e-4)


def test_linear_zero_tokens(e):
    w = _core.Weight(f32(np.ones((3, 4))))
    got = e.to_host(_core.linear(e.to_device(np.zeros((0, 4), np.float32)), dev_weight(e, w), engine=e))
    assert got.shape == (0, 3)


def test_linear_large_values_are_finite(e):
    # Activations up to 1e30 stay finite in bf16 (same exponent range as f32).
    r = rng(13)
    x = f32(r.standard_normal((3, 64)) * 1e30)
    w = bf16_weight(r.standard_normal((8, 64)) * 1e-30)
    got = e.to_host(_core.linear(e.to_device(x), dev_weight(e, w), engine=e))
    close_scaled(got, _core.linear(bf16_round(x), w), 1e-4)


def test_linear_contract(e):
    r = rng(14)
    w = _core.Weight(f32(r.standard_normal((6, 10))))
    dw = dev_weight(e, w)
    x = f32(r.standard_normal((3, 10)))
    dx = e.to_device(x)
    expect(memra.ContractError, ST.CONTRACT_SHAPE, _core.linear, e.to_device(f32(np.ones((3, 9)))), dw,
           engine=e)
    expect(memra.ContractError, ST.CONTRACT_DTYPE, _core.linear, e.to_device(x.astype(np.float64)), dw,
           engine=e)
    expect(memra.ContractError, ST.CONTRACT_DEVICE, _core.linear, x, dw, engine=e)  # host x
    expect(memra.ContractError, ST.CONTRACT_DEVICE, _core.linear, dx, w, engine=e)  # host weight
    expect(memra.ContractError, ST.CONTRACT_DEVICE, _core.linear, x, dw)  # DeviceWeight on the CPU
    expect(memra.ContractError, ST.CONTRACT_SHAPE, _core.linear, dx, dw,
           e.to_device(f32(np.ones(5))), engine=e)
    # Nothing was written: x on the device is unchanged and the engine still works.
    np.testing.assert_array_equal(e.to_host(dx), x)
    close_scaled(e.to_host(_core.linear(dx, dw, engine=e)), _core.linear(x, w), 1e-5)


# ---------------------------------------------------------------- norms


@pytest.mark.parametrize("T", EDGE_T)
@pytest.mark.parametrize("D", WIDTHS)
def test_rms_norms_match_cpu(e, T, D):
    r = rng(T * 13 + D)
    x = f32(r.standard_normal((T, D)) * 2 + 0.5)
    g = f32(r.standard_normal((T, D)) * 3)
    w = f32(r.standard_normal(D))
    dx, dg, dw = e.to_device(x), e.to_device(g), e.to_device(w)
    close(e.to_host(_core.rms_norm(dx, dw, eps=1e-5, engine=e)), _core.rms_norm(x, w, eps=1e-5), NORM_TOL)
    close(e.to_host(_core.rms_norm(dx, eps=1e-6, engine=e)), _core.rms_norm(x, eps=1e-6), NORM_TOL)
    close(e.to_host(_core.rms_norm_gated(dx, dg, dw, eps=1e-5, engine=e)),
          _core.rms_norm_gated(x, g, w, eps=1e-5), NORM_TOL)


@pytest.mark.parametrize("T", EDGE_T)
@pytest.mark.parametrize("D", WIDTHS)
def test_add_rms_norm_is_add_then_rms_norm(e, T, D):
    # The plain residual's step: the sum exactly x + y (f32), the norm the bytes of the device's
    # own rms_norm of that sum, and both within NORM_TOL of the CPU op.
    r = rng(T * 19 + D)
    x, y = f32(r.standard_normal((T, D)) * 2), f32(r.standard_normal((T, D)))
    w = f32(r.standard_normal(D))
    dx, dy, dw = e.to_device(x), e.to_device(y), e.to_device(w)
    s, h = _core.add_rms_norm(dx, dy, dw, eps=1e-5, engine=e)
    np.testing.assert_array_equal(e.to_host(s), x + y)
    np.testing.assert_array_equal(e.to_host(h), e.to_host(_core.rms_norm(s, dw, eps=1e-5, engine=e)))
    close(e.to_host(h), _core.add_rms_norm(x, y, w, eps=1e-5)[1], NORM_TOL)
    expect(memra.ContractError, ST.CONTRACT_DEVICE, _core.add_rms_norm, dx, y, dw, eps=1e-5, engine=e)
    expect(memra.ContractError, ST.CONTRACT_SHAPE, _core.add_rms_norm, dx, e.to_device(f32(np.ones((T, D + 1)))),
           eps=1e-5, engine=e)


@pytest.mark.parametrize("D", [8192, 16384])  # mHC's RMS runs over hc * D = 16384
def test_rms_norm_wide_rows(e, D):
    x = f32(rng(D).standard_normal((3, D)) * 5)
    close(e.to_host(_core.rms_norm(e.to_device(x), eps=1e-6, engine=e)), _core.rms_norm(x, eps=1e-6),
          NORM_TOL)
    # rms_norm_gated past 4 values per thread (D > 4096): the looped arm of the kernel.
    g, w = f32(rng(D + 1).standard_normal((3, D))), f32(rng(D + 2).standard_normal(D))
    close(e.to_host(_core.rms_norm_gated(e.to_device(x), e.to_device(g), e.to_device(w), eps=1e-6, engine=e)),
          _core.rms_norm_gated(x, g, w, eps=1e-6), NORM_TOL)


@pytest.mark.parametrize("T", EDGE_T)
@pytest.mark.parametrize("D", [16, 33, 128, 512, 1536])
def test_layer_norm_matches_cpu(e, T, D):
    r = rng(T * 17 + D)
    x = f32(r.standard_normal((T, D)) * 2 + 1.5)  # a non-zero mean exercises the two passes
    w, b = f32(r.standard_normal(D)), f32(r.standard_normal(D))
    got = _core.layer_norm(e.to_device(x), e.to_device(w), e.to_device(b), eps=1e-6, engine=e)
    close(e.to_host(got), _core.layer_norm(x, w, b, eps=1e-6), NORM_TOL)


@pytest.mark.parametrize("D0,D1,D2", [(1536, 512, 128), (32, 32, 32), (5000, 33, 7), (4096, 1, 0),
                                      (100, 2048, 1500)])
def test_norm_rows_equal_their_own_launches(e, D0, D1, D2):
    # The MLA projections' norms of a decode row in one launch (block i: row i with its own
    # row group; the GLM widths 1536 / 512 / 128 take groups of 512 / 128 / 32 in a block of
    # 512): each row's bytes are its own rms_norm / layer_norm launch's. D2 == 0: no third row.
    r = rng(D0 + 3 * D1 + 7 * D2)
    x0, x1 = f32(r.standard_normal((1, D0)) * 2), f32(r.standard_normal((1, D1)) + 0.5)
    w0 = f32(r.standard_normal(D0))
    x2 = f32(r.standard_normal((1, D2)) * 2 + 1.5) if D2 else None
    w2, b2 = (f32(r.standard_normal(D2)), f32(r.standard_normal(D2))) if D2 else (None, None)
    dev = lambda a: None if a is None else e.to_device(a)  # noqa: E731
    got = _core.norm_rows(dev(x0), dev(w0), dev(x1), None, dev(x2), dev(w2), dev(b2), eps0=1e-6,
                          eps1=1e-5, eps2=1e-6, engine=e)
    got = [e.to_host(a) for a in got]
    want = [e.to_host(_core.rms_norm(dev(x0), dev(w0), eps=1e-6, engine=e)),
            e.to_host(_core.rms_norm(dev(x1), eps=1e-5, engine=e))]
    if D2:
        want.append(e.to_host(_core.layer_norm(dev(x2), dev(w2), dev(b2), eps=1e-6, engine=e)))
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)
    assert got[2].shape == (1, D2)
    cpu = _core.norm_rows(x0, w0, x1, None, x2, w2, b2, eps0=1e-6, eps1=1e-5, eps2=1e-6)
    for g, c in zip(got, cpu):
        close(g, c, NORM_TOL)


@pytest.mark.parametrize("T", [1, 65])
@pytest.mark.parametrize("H,d", [(4, 16), (3, 33), (64, 128), (2, 200)])
def test_l2norm_heads_matches_cpu(e, T, H, d):
    x = f32(rng(T + H + d).standard_normal((T, H, d)))
    dx = e.to_device(x)
    got = e.to_host(_core.l2norm_heads(dx, eps=1e-6, engine=e))
    close(got, _core.l2norm_heads(x, eps=1e-6), NORM_TOL)
    np.testing.assert_array_equal(e.to_host(dx), x)  # a new array; the input is untouched


def test_norms_of_zero_rows(e):
    # Zero rows: rms of 0 is 0 / sqrt(eps) = 0; l2norm of 0 is 0.
    x = np.zeros((2, 33), np.float32)
    close(e.to_host(_core.rms_norm(e.to_device(x), eps=1e-6, engine=e)), x, NORM_TOL)
    close(e.to_host(_core.l2norm_heads(e.to_device(x[:, None, :]), engine=e)), x[:, None, :], NORM_TOL)


def test_norm_contract(e):
    x = f32(rng(20).standard_normal((3, 8)))
    dx = e.to_device(x)
    expect(memra.ContractError, ST.CONTRACT_SHAPE, _core.rms_norm, dx, e.to_device(f32(np.ones(7))),
           eps=1e-6, engine=e)
    expect(memra.ContractError, ST.CONTRACT_DEVICE, _core.rms_norm, dx, f32(np.ones(8)), eps=1e-6,
           engine=e)
    expect(memra.ContractError, ST.CONTRACT_DEVICE, _core.rms_norm, x, eps=1e-6, engine=e)
    expect(memra.ContractError, ST.CONTRACT_DEVICE, _core.rms_norm, dx, eps=1e-6)  # CPU backend
    expect(memra.ContractError, ST.CONTRACT_SHAPE, _core.rms_norm_gated, dx,
           e.to_device(f32(np.ones((3, 7)))), e.to_device(f32(np.ones(8))), eps=1e-6, engine=e)
    expect(memra.ContractError, ST.CONTRACT_DTYPE, _core.layer_norm, dx,
           e.to_device(np.ones(8)), e.to_device(f32(np.ones(8))), eps=1e-6, engine=e)
    expect(memra.ContractError, ST.CONTRACT_SHAPE, _core.l2norm_heads, dx, engine=e)
    np.testing.assert_array_equal(e.to_host(dx), x)


# ---------------------------------------------------------------- rope


@pytest.mark.parametrize("T", [1, 65])
@pytest.mark.parametrize("n_vec,d_rope", [(1, 2), (3, 8), (16, 64), (2, 130), (1, 1024)])
def test_rope_matches_cpu(e, T, n_vec, d_rope):
    # d_rope = 1024: pairs 256.. take the device's pow (past the host-computed table).
    r = rng(T + n_vec + d_rope)
    x = f32(r.standard_normal((T, n_vec, d_rope)))
    pos = r.integers(0, 200_000, T).astype(np.int32)
    pos[0] = 0
    dx = e.to_device(x)
    got = e.to_host(_core.rope_interleaved(dx, e.to_device(pos), base=10000.0, engine=e))
    close(got, _core.rope_interleaved(x, pos, base=10000.0), ROPE_TOL)
    np.testing.assert_array_equal(e.to_host(dx), x)


def test_rope_zero_width_and_odd_width(e):
    pos = np.array([3, 4], np.int32)
    x0 = np.zeros((2, 3, 0), np.float32)
    got = e.to_host(_core.rope_interleaved(e.to_device(x0), e.to_device(pos), engine=e))
    assert got.shape == (2, 3, 0)
    x = f32(rng(30).standard_normal((2, 3, 5)))
    dx = e.to_device(x)
    err = expect(memra.ContractError, ST.CONTRACT_ODD_ROPE, _core.rope_interleaved, dx,
                 e.to_device(pos), engine=e)
    assert "d_rope=5" in str(err)
    np.testing.assert_array_equal(e.to_host(dx), x)
    # The engine is still usable.
    x2 = f32(rng(31).standard_normal((2, 3, 4)))
    close(e.to_host(_core.rope_interleaved(e.to_device(x2), e.to_device(pos), engine=e)),
          _core.rope_interleaved(x2, pos), ROPE_TOL)


# ---------------------------------------------------------------- sigmoid


@pytest.mark.parametrize("n", [1, 33, 4097, 1 << 20])
def test_sigmoid_matches_cpu(e, n):
    x = f32(rng(n).standard_normal(n) * 8)
    x[0] = -100.0  # exp(100) overflows to inf: 1 / (1 + inf) = 0, finite
    if n > 1:
        x[1] = 100.0
    got = e.to_host(_core.sigmoid(e.to_device(x), engine=e))
    close(got, _core.sigmoid(x), SIG_TOL)


# ---------------------------------------------------------------- sanitizer


def test_sanitizer_small_shapes(e):
    """One call of every entry point on small odd shapes (for compute-sanitizer runs)."""
    r = rng(99)
    T, D = 3, 37
    x = f32(r.standard_normal((T, D)))
    dx = e.to_device(x)
    w = e.to_device(f32(r.standard_normal(D)))
    _core.rms_norm(dx, w, eps=1e-6, engine=e)
    _core.rms_norm_gated(dx, dx, w, eps=1e-6, engine=e)
    _core.layer_norm(dx, w, w, eps=1e-6, engine=e)
    _core.l2norm_heads(e.to_device(x[:, None, :]), engine=e)
    for width in (200, 4096):  # several rows per block (64 threads a row); one 1024-thread row
        xw = e.to_device(f32(r.standard_normal((5, width))))
        ww = e.to_device(f32(r.standard_normal(width)))
        _core.rms_norm(xw, ww, eps=1e-6, engine=e)
        _core.rms_norm_gated(xw, xw, ww, eps=1e-6, engine=e)
        _core.layer_norm(xw, ww, ww, eps=1e-6, engine=e)
    _core.rope_interleaved(e.to_device(f32(r.standard_normal((T, 2, 6)))), e.to_device(np.arange(T, dtype=np.int32)),
                           engine=e)
    _core.sigmoid(e.to_device(x.reshape(-1)), engine=e)
    wt = _core.Weight(f32(r.standard_normal((9, D))))
    _core.linear(dx, dev_weight(e, wt), engine=e)
    _core.linear(dx, dev_weight(e, wt, "bfloat16"), e.to_device(f32(np.ones(9))), engine=e)
    _core.embedding(dev_weight(e, wt), e.to_device(np.array([0, 8, 3], np.int32)), engine=e)
    e.synchronize()
