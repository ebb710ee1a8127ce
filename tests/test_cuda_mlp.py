"""The dense SwiGLU MLP on the CUDA backend (``memra._core.swiglu_mlp`` with
``engine=memra.Engine("cuda")``, kernels in cuda/mlp.cu) and the MlpLayer on the device against the
same op on the CPU backend (cpp/src/cpu/mlp.cpp, the numeric oracle), plus the argument contract on
the device.

Tolerances (both sides f32 unless said):
- swiglu_mlp, float32 weights: cuBLAS SGEMM (TF32 off) against the CPU's sequential dots; only the
  summation order differs (K <= 200 terms, |error| ~ K * eps * sum |terms|), and CUDA's expf in
  SiLU is within 2 ulp: ``rtol=1e-5, atol=1e-5 * max|y|``.
- swiglu_mlp, bfloat16 weights: the GPU rounds x to bf16 before gate/up and the hidden h before
  down (memra_cuda_linear's bf16 GEMM). Against a CPU emulation of exactly that (CPU linear on the
  same bf16 weights, x and h rounded to bf16 with RNE): only the summation order differs, except
  that an f32 ulp of difference in h can flip its bf16 rounding (one bf16 ulp = 2^-8 relative on a
  single term of a sum of I terms): ``rtol=1e-4, atol=2e-3 * max|y|``. Against the plain CPU op
  on the same weights with x rounded (h not rounded) the bf16 rounding of h is a relative error of
  ~2^-9 per term: ``atol=1e-2 * max|y|``.
- MlpLayer on CUDA uploads gate and up as one [2I, D] weight and runs them as one GEMM
  (N = 2I): against swiglu_mlp over separate gate / up weights (two GEMMs) only cuBLAS's
  summation order may differ (the same tolerances as against the CPU).

A small shape for ``compute-sanitizer --tool racecheck`` / ``--tool memcheck``:
``python -m pytest tests/test_cuda_mlp.py -k sanitizer``.
"""

from __future__ import annotations

import numpy as np
import pytest

import memra
from memra import _core
from cuda_helpers import bf16_round, dweight, expect, f32, randn, rng, scaled_close, weight

pytestmark = pytest.mark.cuda

ST = _core.status


EDGE_T = [1, 5, 63, 65, 200]

# ---------------------------------------------------------------- swiglu_mlp


def mlp_weights(r, D, I, dtype="float32"):
    g, u, d = randn(r, I, D, scale=0.3), randn(r, I, D, scale=0.3), randn(r, D, I, scale=0.3)
    if dtype == "bfloat16":
        g, u, d = bf16_round(g), bf16_round(u), bf16_round(d)
    return g, u, d


@pytest.mark.parametrize("D,I", [(64, 96), (13, 21), (200, 40)])
@pytest.mark.parametrize("T", EDGE_T)
def test_swiglu_mlp_f32_matches_cpu(e, T, D, I):
    r = rng(T * 1000 + D)
    g, u, d = mlp_weights(r, D, I)
    x = randn(r, T, D, scale=2.0)
    limit = 1.25  # the pre-activations spread to ~+-6: both clamps bind on many elements
    want = _core.swiglu_mlp(x, weight(g), weight(u), weight(d), limit=limit)
    got = _core.swiglu_mlp(e.to_device(x), dweight(e, g), dweight(e, u), dweight(e, d),
                           limit=limit, engine=e)
    scaled_close(e.to_host(got), want, rtol=1e-5, atol_rel=1e-5)


@pytest.mark.parametrize("T", [1, 65, 200])
def test_swiglu_mlp_bf16_matches_cpu_emulation(e, T):
    r = rng(T + 7)
    D, I, limit = 64, 96, 1.25
    g, u, d = mlp_weights(r, D, I, "bfloat16")
    x = randn(r, T, D, scale=2.0)
    got = e.to_host(_core.swiglu_mlp(e.to_device(x), dweight(e, g, "bfloat16"),
                                     dweight(e, u, "bfloat16"), dweight(e, d, "bfloat16"),
                                     limit=limit, engine=e))
    # Emulation of the GPU's roundings with the CPU ops (same bf16 values as f32 weights).
    xb = bf16_round(x)
    gl = _core.linear(xb, weight(g))
    ul = _core.linear(xb, weight(u))
    gate = np.minimum(gl, np.float32(limit))
    up = np.clip(ul, -np.float32(limit), np.float32(limit))
    h = f32(gate / (1.0 + np.exp(-gate)) * up)
    want = _core.linear(bf16_round(h), weight(d))
    scaled_close(got, want, rtol=1e-4, atol_rel=2e-3)
    # The plain CPU op on the same weights and the bf16-rounded x (h kept f32 there).
    plain = _core.swiglu_mlp(xb, weight(g), weight(u), weight(d), limit=limit)
    scaled_close(got, plain, rtol=0.0, atol_rel=1e-2)


def test_swiglu_mlp_no_clamp_and_zero_rows(e):
    r = rng(3)
    D, I = 32, 40
    g, u, d = mlp_weights(r, D, I)
    x = randn(r, 6, D)
    x[2] = 0.0  # a zero row gives exactly zero
    want = _core.swiglu_mlp(x, weight(g), weight(u), weight(d), limit=float("inf"))
    got = e.to_host(_core.swiglu_mlp(e.to_device(x), dweight(e, g), dweight(e, u), dweight(e, d),
                                     limit=float("inf"), engine=e))
    scaled_close(got, want, rtol=1e-5, atol_rel=1e-5)
    assert np.all(got[2] == 0.0)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("D,I", [(64, 96), (13, 21)])
@pytest.mark.parametrize("T", [1, 5, 65])
def test_mlp_layer_fused_gate_up_matches_separate(e, T, D, I, dtype):
    """MlpLayer's contiguous gate|up ([2, I, D] on the device, one GEMM with N = 2I) against
    swiglu_mlp over separate gate and up DeviceWeights (two GEMMs) and against the CPU."""
    r = rng(T * 31 + D + (dtype == "bfloat16"))
    limit = 1.25
    g, u, d = mlp_weights(r, D, I, dtype)
    x = randn(r, T, D, scale=2.0)
    layer = memra.MlpLayer(e, {"gate_proj.weight": weight(g), "up_proj.weight": weight(u),
                               "down_proj.weight": weight(d)},
                           hidden=D, intermediate=I, swiglu_limit=limit, dtype=dtype)
    got = e.to_host(layer.forward(e.to_device(x)))
    sep = e.to_host(_core.swiglu_mlp(e.to_device(x), dweight(e, g, dtype), dweight(e, u, dtype),
                                     dweight(e, d, dtype), limit=limit, engine=e))
    if dtype == "float32":
        scaled_close(got, sep, rtol=1e-5, atol_rel=1e-5)
        want = _core.swiglu_mlp(x, weight(g), weight(u), weight(d), limit=limit)
        scaled_close(got, want, rtol=1e-5, atol_rel=1e-5)
    else:
        # Both round x and h to bf16; an f32 ulp of difference in g or u may flip one h's bf16
        # rounding (see the module docstring): the emulation's tolerance.
        scaled_close(got, sep, rtol=1e-4, atol_rel=2e-3)
        xb = bf16_round(x)
        gate = np.minimum(_core.linear(xb, weight(g)), np.float32(limit))
        up = np.clip(_core.linear(xb, weight(u)), -np.float32(limit), np.float32(limit))
        h = f32(gate / (1.0 + np.exp(-gate)) * up)
        want = _core.linear(bf16_round(h), weight(d))
        scaled_close(got, want, rtol=1e-4, atol_rel=2e-3)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("D,I", [(512, 96), (512, 1101), (4104, 8195)])
def test_mlp_layer_one_row_swiglu_in_the_gemv_matches_cpu(e, D, I, dtype):
    """At one row the gate|up GEMV stores h = swiglu(gate, up) from its epilogue (block b: gate
    rows b R/2 .., and their up rows; mlp.cu gemv_swiglu_kernel), for ragged I at R = 2, 4, 8 and
    a K of two chunks with a ragged tail (4104): close to the CPU, and the same bytes run to
    run."""
    r = rng(D + I + (dtype == "bfloat16"))
    limit = 1.25
    g, u, d = mlp_weights(r, D, I, dtype)
    x = randn(r, 1, D, scale=2.0 / np.sqrt(D / 64))
    ws = {"gate_proj.weight": weight(g), "up_proj.weight": weight(u), "down_proj.weight": weight(d)}
    layer = memra.MlpLayer(e, ws, hidden=D, intermediate=I, swiglu_limit=limit, dtype=dtype)
    outs = [e.to_host(layer.forward(e.to_device(x))) for _ in range(2)]
    np.testing.assert_array_equal(outs[0], outs[1])
    if dtype == "float32":
        want = _core.swiglu_mlp(x, weight(g), weight(u), weight(d), limit=limit)
        scaled_close(outs[0], want, rtol=1e-4, atol_rel=1e-4)
    else:
        xb = bf16_round(x)
        gate = np.minimum(_core.linear(xb, weight(g)), np.float32(limit))
        up = np.clip(_core.linear(xb, weight(u)), -np.float32(limit), np.float32(limit))
        h = f32(gate / (1.0 + np.exp(-gate)) * up)
        want = _core.linear(bf16_round(h), weight(d))
        scaled_close(outs[0], want, rtol=1e-4, atol_rel=2e-3)


def test_swiglu_mlp_contract_errors(e):
    r = rng(4)
    D, I = 8, 12
    g, u, d = mlp_weights(r, D, I)
    dg, du, dd = dweight(e, g), dweight(e, u), dweight(e, d)
    xh = randn(r, 3, D)
    f = _core.swiglu_mlp
    # A device array is a one-shot DLPack capsule: every call gets a fresh one.
    expect(memra.ContractError, ST.CONTRACT_DEVICE, f, xh, dg, du, dd, limit=1.0, engine=e)
    expect(memra.ContractError, ST.CONTRACT_DEVICE, f, e.to_device(xh), weight(g), du, dd, limit=1.0,
                    engine=e)
    expect(memra.ContractError, ST.CONTRACT_SHAPE, f, e.to_device(xh), dg, du, dg, limit=1.0, engine=e)
    expect(memra.ContractError, ST.CONTRACT_SHAPE, f, e.to_device(randn(r, 3, D + 1)), dg, du, dd, limit=1.0,
                    engine=e)
    expect(memra.ContractError, ST.CONTRACT_DTYPE, f, e.to_device(xh), dg, dweight(e, u, "bfloat16"), dd,
                    limit=1.0, engine=e)
    expect(memra.ContractError, ST.CONTRACT_DTYPE, f, e.to_device(xh.astype(np.float64)), dg, du, dd,
                    limit=1.0, engine=e)
    expect(memra.ContractError, ST.CONTRACT_VALUE, f, e.to_device(xh), dg, du, dd, limit=0.0, engine=e)
    # The engine and the weights are still usable afterwards.
    y = e.to_host(f(e.to_device(xh), dg, du, dd, limit=1.0, engine=e))
    assert np.all(np.isfinite(y))


# ---------------------------------------------------------------- sanitizer-sized


def test_sanitizer_small_shapes(e):
    """One small call of swiglu_mlp (for compute-sanitizer racecheck / memcheck)."""
    r = rng(16)
    D, I, T = 16, 24, 3
    g, u, d = mlp_weights(r, D, I)
    x = randn(r, T, D)
    y = _core.swiglu_mlp(e.to_device(x), dweight(e, g), dweight(e, u), dweight(e, d), limit=1.0,
                         engine=e)
    assert np.all(np.isfinite(e.to_host(y)))
