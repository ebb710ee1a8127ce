"""The small-GEMM arm of linear on the CUDA backend (cuda/linear_small.cu): 2..32 rows against a
small bfloat16 weight (T * N * K <= 2^26, K % 8 == 0, aligned rows) on CUDA cores, K split over
blocks by N and K alone. Against the CPU op (cpp/src/cpu/linear.cpp, the oracle):

- (a) on x rounded to bfloat16 first: products of two bf16 values are exact in f32 on both sides,
  only the accumulation order differs (f32 FMA chains per split, splits summed in order, against
  the CPU's ascending chain): ``|d| <= 1e-4 * max|y|``;
- (b) on the unrounded x: bf16 rounding of x, ``|d| <= 1e-2 * max|y|`` (tests/test_cuda_basic.py).

A row's bytes do not depend on the other rows (a batch of 32 and one of 3 give its row the same
bytes), f32 x and x already in bfloat16 give the same bytes (the kernel rounds f32 x to bf16 as it
loads it), and the profiler shows the arm's kernel, not cuBLAS's.
"""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import memra
from memra import _core
from cuda_helpers import bf16_round, bf16_weight, close_scaled, engine_with, f32, kernel_names, rng

pytestmark = pytest.mark.cuda

SMALL = "small_gemm_kernel"

# (K, N): KDA's gate / beta shapes (4096 -> 128, 128 -> 8192, 4096 -> 64) and odd ones: N not a
# multiple of the 64-column tile, K not a multiple of the 64-wide stage, one output, a long K.
SHAPES = [(4096, 128), (128, 8192), (4096, 64), (200, 65), (8, 1), (2048, 96), (16384, 40)]


def dev(e, w):
    return memra.DeviceWeight(e, w)


@pytest.mark.parametrize("T", [2, 5, 32])
@pytest.mark.parametrize("K,N", SHAPES)
@pytest.mark.parametrize("with_bias", [False, True])
def test_small_gemm_matches_cpu(e, T, K, N, with_bias):
    r = rng(T * 13 + K + N)
    x = f32(r.standard_normal((T, K)))
    w = bf16_weight(r.standard_normal((N, K)) / np.sqrt(K))
    b = f32(r.standard_normal(N)) if with_bias else None
    got = e.to_host(_core.linear(e.to_device(x), dev(e, w), None if b is None else e.to_device(b),
                                 engine=e))
    close_scaled(got, _core.linear(bf16_round(x), w, b), 1e-4)
    close_scaled(got, _core.linear(x, w, b), 1e-2)


@pytest.mark.parametrize("K,N", [(4096, 128), (128, 8192), (200, 65)])
def test_small_gemm_row_bytes_do_not_depend_on_the_batch(e, K, N):
    r = rng(K + N)
    x = f32(r.standard_normal((32, K)))
    dw = dev(e, bf16_weight(r.standard_normal((N, K)) / np.sqrt(K)))
    b = e.to_device(f32(r.standard_normal(N)))
    full = e.to_host(_core.linear(e.to_device(x), dw, b, engine=e))
    for rows in (slice(0, 3), slice(29, 32), slice(10, 12)):
        part = e.to_host(_core.linear(e.to_device(np.ascontiguousarray(x[rows])), dw, b, engine=e))
        np.testing.assert_array_equal(part, full[rows])


def test_small_gemm_strided_and_bf16_inputs(e):
    """linear_ex over a column block of wider rows (ldx > K), and over x already in bfloat16:
    the bytes of linear on the packed f32 rows."""
    T, K, N, L, col0 = 7, 256, 96, 400, 72
    r = rng(5)
    wide = f32(r.standard_normal((T, L)))
    dw = dev(e, bf16_weight(r.standard_normal((N, K)) / np.sqrt(K)))
    want = e.to_host(_core.linear(e.to_device(np.ascontiguousarray(wide[:, col0:col0 + K])), dw,
                                  engine=e))
    got = e.to_host(_core.linear_ex(e.to_device(wide), dw, col0=col0, engine=e))
    np.testing.assert_array_equal(got, want)
    x16 = wide[:, col0:col0 + K].astype(ml_dtypes.bfloat16).view(np.uint16)
    got16 = e.to_host(_core.linear_ex(e.to_device(np.ascontiguousarray(x16)), dw, engine=e))
    np.testing.assert_array_equal(got16, want)


def test_small_gemm_is_the_arm_that_ran(e, tmp_path):
    r = rng(9)
    dw = dev(e, bf16_weight(r.standard_normal((128, 4096)) / 64.0))
    for T, small in ((1, False), (32, True)):
        dx = e.to_device(f32(r.standard_normal((T, 4096))))

        def call():
            _core.linear(dx, dw, engine=e)
            e.synchronize()

        names = kernel_names(call, tmp_path / f"t{T}.json")
        assert any(SMALL in n for n in names) == small, (T, names)
        if small:  # the arm's kernel and its split reduction, nothing of cuBLAS's
            assert names and all("small_gemm" in n for n in names), names
    # Past the size bound (T * N * K > 2^26) the tensor-core GEMM runs.
    big = dev(e, bf16_weight(r.standard_normal((2048, 2048)) / 45.0))
    dx = e.to_device(f32(r.standard_normal((32, 2048))))

    def call_big():
        _core.linear(dx, big, engine=e)
        e.synchronize()

    assert SMALL not in " ".join(kernel_names(call_big, tmp_path / "big.json"))


def test_small_gemm_option_off_is_cublas(tmp_path):
    """KernelOptions(small_gemm=False): the same call goes to cuBLAS (the A/B arm), within the
    bf16 tolerance of the small arm and not its bytes."""
    r = rng(10)
    x = f32(r.standard_normal((32, 4096)))
    w = bf16_weight(r.standard_normal((128, 4096)) / 64.0)
    out = {}
    for name, eng in (("on", engine_with()), ("off", engine_with(small_gemm=False))):
        dw, dx = memra.DeviceWeight(eng, w), eng.to_device(x)

        def call():
            out[name] = eng.to_host(_core.linear(dx, dw, engine=eng))
            eng.synchronize()

        names = " ".join(kernel_names(call, tmp_path / f"{name}.json"))
        assert (SMALL in names) == (name == "on"), (name, names)
    close_scaled(out["on"], out["off"], 1e-4)
    assert not np.array_equal(out["on"], out["off"]), "small_gemm=False did not reach cuBLAS"


def test_small_gemm_large_values_are_finite(e):
    r = rng(13)
    x = f32(r.standard_normal((3, 64)) * 1e30)
    w = bf16_weight(r.standard_normal((8, 64)) * 1e-30)
    got = e.to_host(_core.linear(e.to_device(x), dev(e, w), engine=e))
    assert np.isfinite(got).all()
    close_scaled(got, _core.linear(bf16_round(x), w), 1e-4)
