"""linear's weight-streaming arm (KernelOptions(linear_skinny=True), cuda/linear_skinny.cu) against
the CPU op (cpp/src/cpu/linear.cpp, the oracle) on the same bf16 weight with x rounded to bf16.

Tolerance: the products of two bf16 values are exact in f32 on both sides; the kernel sums each
K slice of 64 columns inside the tensor cores (truncating adds), the slices in order and the
cluster's partials in rank order, the CPU one ascending chain: a few ulp of the partial sums per
K step, ``|d| <= 1e-4 * max|y|`` as tests/test_cuda_basic.py allows cuBLAS. Against an
independent float64 product of the same bf16 operands: the same bound.

Shapes cover every token tile (T = 2..64 rounded to 8, 16, 32, 64), the cluster sizes the split
chooser picks (1, 2, 4, 8: few row tiles and many K boxes split more), row tails (N % 128), K
tails (K % 64), bias or none, and strided / offset 16-bit inputs through linear_ex. Shapes the
arm does not take (T = 1, T > 64, K % 8 != 0, a misaligned input, f32 weights) fall back to
cuBLAS / the GEMV, still correct. The census test checks which kernel ran.
"""

from __future__ import annotations

import numpy as np
import pytest

from memra import _core
from cuda_helpers import bf16_bits, bf16_round, bf16_weight, close_scaled, engine_with, f32, kernel_names, rng

pytestmark = pytest.mark.cuda

SKINNY = "skinny_gemm_kernel"


@pytest.fixture(scope="module")
def es():
    return engine_with(linear_skinny=True)


def run(e, x, w, b=None):
    d = e.to_device
    return e.to_host(_core.linear(d(x), _core.DeviceWeight(e, w), None if b is None else d(b), engine=e))


def ref64(x, w_f32, b=None):
    """float64 product of the bf16-rounded x and the bf16 weight values."""
    y = bf16_round(x).astype(np.float64) @ w_f32.astype(np.float64).T
    return y if b is None else y + b.astype(np.float64)


# (T, K, N): T over the token tiles, K over one box .. 128 boxes and tails, N over tails and the
# row-tile counts that give each cluster size.
SHAPES = [(2, 64, 128), (3, 72, 129), (8, 200, 65), (9, 1000, 300), (16, 8, 1), (17, 4096, 256),
          (31, 8192, 128), (32, 4096, 4096), (33, 1536, 1000), (63, 2048, 24), (64, 16384, 96),
          (5, 512, 20000)]


@pytest.mark.parametrize("T,K,N", SHAPES)
@pytest.mark.parametrize("with_bias", [False, True])
def test_skinny_matches_cpu_on_rounded_x(es, T, K, N, with_bias):
    r = rng(T * 31 + K + N)
    x = f32(r.standard_normal((T, K)))
    w32 = f32(r.standard_normal((N, K)) / np.sqrt(K))
    w = bf16_weight(w32)
    b = f32(r.standard_normal(N)) if with_bias else None
    got = run(es, x, w, b)
    close_scaled(got, _core.linear(bf16_round(x), w, b), 1e-4)
    close_scaled(got, f32(ref64(x, bf16_round(w32), b)), 1e-4)


def test_skinny_is_deterministic(es):
    r = rng(5)
    x = f32(r.standard_normal((32, 8192)))
    w = bf16_weight(r.standard_normal((512, 8192)) / 90)
    assert np.array_equal(run(es, x, w), run(es, x, w))


@pytest.mark.parametrize("col0,ldx", [(0, 4096), (8, 4104), (136, 4608)])
def test_skinny_reads_strided_bf16_rows(es, col0, ldx):
    # linear_ex over a column block of wider bf16 rows, read in place (no rounding).
    T, K, N = 12, 4096, 384
    r = rng(col0 + ldx)
    xw = f32(r.standard_normal((T, ldx)))
    w32 = f32(r.standard_normal((N, K)) / 64)
    w = bf16_weight(w32)
    dw = _core.DeviceWeight(es, w)
    got = es.to_host(_core.linear_ex(es.to_device(bf16_bits(xw)), dw, col0=col0, engine=es))
    xs = f32(bf16_round(xw)[:, col0:col0 + K])
    close_scaled(got, _core.linear(xs, w), 1e-4)


def test_skinny_takes_large_values(es):
    # Activations up to 1e30 against weights of 1e-30 stay finite (bf16 has f32's range).
    r = rng(13)
    x = f32(r.standard_normal((6, 256)) * 1e30)
    w = bf16_weight(r.standard_normal((40, 256)) * 1e-30)
    close_scaled(run(es, x, w), _core.linear(bf16_round(x), w), 1e-4)


@pytest.mark.parametrize("case", ["T=1", "T=65", "K=100", "offset x", "f32 weight"])
def test_shapes_the_arm_does_not_take_stay_correct(es, case, tmp_path):
    T, K, N, col0, dtype = 8, 256, 96, 0, "bfloat16"
    if case == "T=1":
        T = 1
    elif case == "T=65":
        T = 65
    elif case == "K=100":
        K = 100
    elif case == "offset x":
        col0 = 3  # 6 bytes in: not 16-byte aligned
    else:
        dtype = "float32"
    r = rng(len(case))
    x = f32(r.standard_normal((T, K + col0)))
    w32 = f32(r.standard_normal((N, K)) / 16)
    w = bf16_weight(w32) if dtype == "bfloat16" else _core.Weight(w32)
    dw = _core.DeviceWeight(es, w)
    d = es.to_device(bf16_bits(x) if col0 else x)

    def call():
        if col0:
            return es.to_host(_core.linear_ex(d, dw, col0=col0, engine=es))
        return es.to_host(_core.linear(d, dw, engine=es))

    got = call()
    xs = f32(bf16_round(x)[:, col0:]) if dtype == "bfloat16" else x
    close_scaled(got, _core.linear(xs, w), 1e-4 if dtype == "bfloat16" else 1e-5)
    names = " ".join(kernel_names(call, tmp_path / "trace.json"))
    assert SKINNY not in names, (case, names)


def test_the_skinny_kernel_is_the_one_that_ran(es, tmp_path):
    r = rng(3)
    x = f32(r.standard_normal((32, 1024)))
    w = bf16_weight(r.standard_normal((4096, 1024)) / 32)
    for name, eng, want in (("on", es, True), ("off", engine_with(linear_skinny=False), False)):
        dx, dw = eng.to_device(x), _core.DeviceWeight(eng, w)

        def call():
            _core.linear(dx, dw, engine=eng)
            eng.synchronize()

        names = " ".join(kernel_names(call, tmp_path / f"{name}.json"))
        assert (SKINNY in names) == want, (name, names)
