"""linear's tensor-core arm for a few rows (cuda/linear_tc.cu, KernelOptions.skinny_gemm): the
GEMMs of 2..64 rows over a bfloat16 weight behind ``memra._core.linear`` / ``linear_ex`` (the
batched decode's dense projections), against the CPU backend's linear (cpp/src/cpu/basic.cpp,
the numeric oracle) on x rounded to bfloat16, and against cuBLAS (an Engine made with
KernelOptions(skinny_gemm=False)).

Tolerances: both sides form exact f32 products of bf16 values and differ only in the f32
summation order (mma k16 steps, then the split-K partials in split order), so
``|d| <= 1e-5 * max|y|`` at K <= 16384, as the GEMV and cuBLAS arms are held to.
Bytes: the splits depend on N and K alone, so a row's output does not depend on how many rows
ride with it (np.array_equal across T), nor on the run.
"""

from __future__ import annotations

import numpy as np
import pytest

import memra
from memra import _core
from cuda_helpers import bf16_bits, bf16_round, bf16_weight, close_scaled, engine_with, f32, kernel_names, rng

pytestmark = pytest.mark.cuda

# (K, N): split-K tiles (N = 4096: 32 weight tiles; K = 8192 and 16384 the o projections), a
# ragged k tail with splits, tiny K (one stage, no split), N past a tile by one, a wide N (no
# split, several waves), N below one tile.
SHAPES = [(4096, 4096), (8192, 4096), (16384, 1024), (4104, 70), (8, 1), (200, 129), (1024, 20000),
          (72, 300)]
ROWS = [2, 3, 15, 16, 17, 32, 33, 63, 64]


def call(e, x, dw, b=None):
    return e.to_host(_core.linear(e.to_device(x), dw, None if b is None else e.to_device(b), engine=e))


@pytest.mark.parametrize("T", ROWS)
@pytest.mark.parametrize("K,N", SHAPES)
def test_skinny_matches_cpu(e, T, K, N):
    r = rng(T * 1000 + K + N)
    x = f32(r.standard_normal((T, K)))
    w = bf16_weight(r.standard_normal((N, K)) / np.sqrt(K))
    b = f32(r.standard_normal(N)) if T % 2 else None  # bias on the odd row counts
    close_scaled(call(e, x, memra.DeviceWeight(e, w), b), _core.linear(bf16_round(x), w, b), 1e-5)


@pytest.mark.parametrize("K,N", [(8192, 4096), (4104, 70), (1024, 20000)])
def test_skinny_row_bytes_do_not_depend_on_the_batch(e, K, N):
    r = rng(K + N)
    x = f32(r.standard_normal((64, K)))
    dw = memra.DeviceWeight(e, bf16_weight(r.standard_normal((N, K)) / np.sqrt(K)))
    b = f32(r.standard_normal(N))
    full = call(e, x, dw, b)
    np.testing.assert_array_equal(call(e, x, dw, b), full)  # run to run
    for a, z in [(0, 2), (5, 8), (10, 26), (30, 63)]:
        np.testing.assert_array_equal(call(e, x[a:z].copy(), dw, b), full[a:z], err_msg=f"rows {a}:{z}")


@pytest.mark.parametrize("T", [2, 32])
def test_skinny_strided_and_bf16_rows(e, T):
    # linear_ex: a column block of wider rows, f32 (rounded first) and bf16 (read in place when
    # its rows are 16-byte aligned, else packed first: col0 = 3).
    K, N, L = 4096, 300, 4112
    r = rng(70 + T)
    x = f32(r.standard_normal((T, L)))
    w = r.standard_normal((N, K)) / np.sqrt(K)
    dw = memra.DeviceWeight(e, _core.Weight(f32(w)), dtype="bfloat16")
    for col0 in (0, 8, 3):
        want = _core.linear(bf16_round(x[:, col0:col0 + K]), bf16_weight(w))
        got = e.to_host(_core.linear_ex(e.to_device(x), dw, col0=col0, engine=e))
        close_scaled(got, want, 1e-5)
        got16 = e.to_host(_core.linear_ex(e.to_device(bf16_bits(x)), dw, col0=col0, engine=e))
        close_scaled(got16, want, 1e-5)
        np.testing.assert_array_equal(got16, got)  # the same rounded rows, the same kernel


def test_skinny_is_the_arm_that_ran_and_close_to_cublas(e, tmp_path):
    r = rng(5)
    K, N, T = 8192, 4096, 32
    x = f32(r.standard_normal((T, K)))
    w = bf16_weight(r.standard_normal((N, K)) / np.sqrt(K))
    dw = memra.DeviceWeight(e, w)
    names = " ".join(kernel_names(lambda: (call(e, x, dw), e.synchronize()), tmp_path / "tc.json"))
    assert names.count("skinny_kernel") == 1, names  # 8 splits of K: the GEMM, then their sum
    assert names.count("skinny_reduce_kernel") == 1, names
    assert "splitKreduce" not in names and "nvjet" not in names and "gemm" not in names.lower(), names
    cb = engine_with(skinny_gemm=False)
    dwb = memra.DeviceWeight(cb, w)
    got_b = cb.to_host(_core.linear(cb.to_device(x), dwb, engine=cb))
    names = " ".join(kernel_names(lambda: (cb.to_host(_core.linear(cb.to_device(x), dwb, engine=cb)),
                                           cb.synchronize()), tmp_path / "cublas.json"))
    assert "skinny_kernel" not in names, names
    close_scaled(call(e, x, dw), got_b, 1e-5)
    # One row keeps the decode GEMV; 65 rows and f32 weights cuBLAS.
    for rows, weight in [(1, dw), (65, dw), (2, memra.DeviceWeight(e, _core.Weight(f32(np.ones((N, K)))), dtype="float32"))]:
        xr = f32(r.standard_normal((rows, K)))
        names = " ".join(kernel_names(lambda: (call(e, xr, weight), e.synchronize()), tmp_path / f"r{rows}.json"))
        assert "skinny_kernel" not in names, (rows, names)


def test_skinny_edge_values(e):
    # Zero and huge rows, a zero weight row, a NaN in one row of x: the NaN stays in its row.
    K, N, T = 1024, 256, 8
    r = rng(11)
    x = f32(r.standard_normal((T, K)))
    x[1] = 0.0
    x[2] *= 1e30
    x[3, 5] = np.nan
    wf = r.standard_normal((N, K)) / np.sqrt(K)
    wf[7] = 0.0
    w = bf16_weight(wf)
    got = call(e, x, memra.DeviceWeight(e, w))
    want = _core.linear(bf16_round(x), w)
    assert np.all(got[1] == 0.0)
    assert np.all(np.isnan(got[3])) and np.all(np.isfinite(got[[0, 1, 2, 4, 5, 6, 7]]))
    keep = [0, 1, 4, 5, 6, 7]
    close_scaled(got[keep], want[keep], 1e-5)
    close_scaled(got[2:3], want[2:3], 1e-5)
    assert np.all(got[:, 7][[0, 1, 2, 4, 5, 6, 7]] == 0.0)
