"""The decode GEMV (cuda/gemv.cu) behind ``memra._core.linear`` / ``linear_ex`` at T = 1 row,
against the CPU backend's linear (cpp/src/cpu/basic.cpp, the numeric oracle) and against cuBLAS
(an Engine made with KernelOptions(gemv=False) runs the same calls through cuBLAS), plus the
kernel options that change only speed (programmatic dependent launch, the deferred Sinkhorn,
the GEMV's row tiling, the grouped experts' threshold): a whole decode with each of them off
gives the bytes of the default engine.

Tolerances:
- bf16 weights: against the CPU op on the same bf16 weight with x rounded to bf16 first, the
  products are exact in f32 on both sides and only the f32 accumulation order differs (the GEMV
  sums 8-element fma chains per thread, then a butterfly and the 8 warps):
  ``|d| <= 1e-5 * max|y|`` at K <= 16384 (random-sign rounding errors of ~2^-24 per add).
- f32 weights: the same bound (both sides f32 products, different order).
- Bytes: the per-output summation order does not depend on how many weight rows a block owns
  (KernelOptions.gemv_rows / gemv_tall_rows), nor on the run, nor on programmatic dependent
  launch, so those comparisons are ``np.array_equal``.
"""

from __future__ import annotations

import numpy as np
import pytest

import memra
from memra import _core
from cuda_helpers import bf16_bits, bf16_round, bf16_weight, close_scaled, engine_with, f32, rng

pytestmark = pytest.mark.cuda

# (K, N): a chunk's worth of K (2 x 256 threads x 8 bf16 = 4096), a ragged chunk tail, tall K,
# a single row, N not a multiple of any row tile, tiny K, a wide N (R = 8 blocks).
SHAPES = [(4096, 4096), (4104, 70), (12288, 300), (8, 1), (200, 33), (16, 5000), (1024, 20000)]


@pytest.mark.parametrize("T", [1, 2])  # T = 2: past MEMRA_GEMV_MAX_ROWS, cuBLAS (the boundary)
@pytest.mark.parametrize("K,N", SHAPES)
@pytest.mark.parametrize("with_bias", [False, True])
def test_gemv_bf16_matches_cpu(e, T, K, N, with_bias):
    r = rng(T * 1000 + K + N)
    x = f32(r.standard_normal((T, K)))
    w = bf16_weight(r.standard_normal((N, K)) / np.sqrt(K))
    b = f32(r.standard_normal(N)) if with_bias else None
    got = e.to_host(_core.linear(e.to_device(x), memra.DeviceWeight(e, w),
                                 None if b is None else e.to_device(b), engine=e))
    close_scaled(got, _core.linear(bf16_round(x), w, b), 1e-5)


@pytest.mark.parametrize("T", [1, 2])
@pytest.mark.parametrize("K,N", [(4096, 4096), (4100, 70), (12, 3)])
def test_gemv_f32_matches_cpu(e, T, K, N):
    r = rng(T + K + N)
    x = f32(r.standard_normal((T, K)))
    w = _core.Weight(f32(r.standard_normal((N, K)) / np.sqrt(K)))
    got = e.to_host(_core.linear(e.to_device(x), memra.DeviceWeight(e, w, dtype="float32"), engine=e))
    close_scaled(got, _core.linear(x, w), 1e-5)


@pytest.mark.parametrize("T", [1, 2])
def test_gemv_strided_and_bf16_rows(e, T):
    # linear_ex: a column block of wider rows, f32 (rounded in the kernel) and bf16 (read as is),
    # and a misaligned column offset (col0 = 3: not 16-byte aligned) that falls back to cuBLAS.
    K, N, L = 256, 96, 520
    r = rng(40 + T)
    x = f32(r.standard_normal((T, L)))
    w = r.standard_normal((N, K)) / np.sqrt(K)
    dw = memra.DeviceWeight(e, _core.Weight(f32(w)), dtype="bfloat16")
    for col0 in (0, 256, 3):
        want = _core.linear(bf16_round(x[:, col0:col0 + K]), bf16_weight(w))
        got = e.to_host(_core.linear_ex(e.to_device(x), dw, col0=col0, engine=e))
        close_scaled(got, want, 1e-5 if col0 != 3 else 1e-4)
        c = col0 - col0 % 8  # bf16 rows at an aligned offset
        got16 = e.to_host(_core.linear_ex(e.to_device(bf16_bits(x)), dw, col0=c, engine=e))
        close_scaled(got16, _core.linear(bf16_round(x[:, c:c + K]), bf16_weight(w)), 1e-5)


# Rows of at most 32 vectors take gemv_short_kernel (K = 128 bf16: KDA's f_b / g_b): every lane
# count L = 1..32, a ragged N, bias, f32 weights (4 per vector).
@pytest.mark.parametrize("K", [8, 16, 24, 64, 128, 200, 256])
@pytest.mark.parametrize("N", [1, 15, 8192])
@pytest.mark.parametrize("with_bias", [False, True])
def test_gemv_short_rows_match_cpu(e, K, N, with_bias):
    r = rng(K * 7 + N)
    x = f32(r.standard_normal((1, K)))
    w = bf16_weight(r.standard_normal((N, K)) / np.sqrt(K))
    b = f32(r.standard_normal(N)) if with_bias else None
    got = e.to_host(_core.linear(e.to_device(x), memra.DeviceWeight(e, w),
                                 None if b is None else e.to_device(b), engine=e))
    close_scaled(got, _core.linear(bf16_round(x), w, b), 1e-5)
    wf = _core.Weight(f32(r.standard_normal((N, K // 2)) / np.sqrt(K)))
    got = e.to_host(_core.linear(e.to_device(x[:, :K // 2].copy()), memra.DeviceWeight(e, wf, dtype="float32"),
                                 engine=e))
    close_scaled(got, _core.linear(x[:, :K // 2].copy(), wf), 1e-5)


def test_gemv_short_rows_bytes_do_not_depend_on_row_tiles(e):
    r = rng(78)
    x = f32(r.standard_normal((1, 128)))
    w = bf16_weight(r.standard_normal((8192, 128)) / np.sqrt(128))

    def run(eng):
        return eng.to_host(_core.linear(eng.to_device(x), memra.DeviceWeight(eng, w), engine=eng))

    ours = run(e)
    assert np.array_equal(ours, run(e))
    for rows in (1, 8):
        assert np.array_equal(run(engine_with(gemv_rows=rows)), ours)
    close_scaled(ours, run(engine_with(gemv=False)), 1e-5)


def test_gemv_equals_cublas_closely_and_bytes_do_not_depend_on_row_tiles(e):
    K, N = 4104, 1000
    r = rng(77)
    x = f32(r.standard_normal((1, K)))
    w = bf16_weight(r.standard_normal((N, K)) / np.sqrt(K))
    b = f32(r.standard_normal(N))

    def run(eng):
        return eng.to_host(_core.linear(eng.to_device(x), memra.DeviceWeight(eng, w), eng.to_device(b),
                                        engine=eng))

    ours = run(e)
    assert np.array_equal(ours, run(e)), "the GEMV is not deterministic run to run"
    cublas = run(engine_with(gemv=False))
    close_scaled(ours, cublas, 1e-5)
    assert not np.array_equal(ours, cublas), "gemv=False did not reach cuBLAS (same bytes)"
    for rows in (1, 2, 4, 8):
        got = run(engine_with(gemv_rows=rows))
        assert np.array_equal(got, ours), f"gemv_rows={rows} changed the bytes"


@pytest.mark.parametrize("K", [8192, 12296])  # tall rows: two and three chunks (and a ragged one)
def test_gemv_tall_rows_match_cpu_and_bytes_do_not_depend_on_row_tiles(e, K):
    N = 300
    r = rng(K)
    x = f32(r.standard_normal((1, K)))
    w = bf16_weight(r.standard_normal((N, K)) / np.sqrt(K))

    def run(eng):
        return eng.to_host(_core.linear(eng.to_device(x), memra.DeviceWeight(eng, w), engine=eng))

    ours = run(e)
    close_scaled(ours, _core.linear(bf16_round(x), w), 1e-5)
    for opts in (dict(gemv_rows=1), dict(gemv_rows=8), dict(gemv_tall_rows=1), dict(gemv_tall_rows=2),
                 dict(gemv_tall_rows=8)):
        assert np.array_equal(run(engine_with(**opts)), ours), f"{opts} changed the bytes"


# bf16: 1536 (MLA q_b), 2048 and 1024 are one chunk of P = 1, 2056 past it; f32: 1024 is one
# chunk of P = 1 (256 vectors), 1032 and the others past it.
@pytest.mark.parametrize("K", [1024, 1032, 1536, 2048, 2056])
@pytest.mark.parametrize("wdt", ["bfloat16", "float32"])
def test_gemv_medium_rows_match_cpu_and_bytes_do_not_depend_on_the_tiling(e, K, wdt):
    # Rows around one chunk of 256 16-byte vectors (one vector a thread, 4 blocks an SM): the
    # bytes do not depend on the rows a block.
    N = 2100
    r = rng(K + (wdt == "float32"))
    x = f32(r.standard_normal((1, K)))
    wf = r.standard_normal((N, K)) / np.sqrt(K)
    w = bf16_weight(wf) if wdt == "bfloat16" else _core.Weight(f32(wf))

    def run(eng):
        return eng.to_host(_core.linear(eng.to_device(x), memra.DeviceWeight(eng, w, dtype=wdt), engine=eng))

    ours = run(e)
    close_scaled(ours, _core.linear(bf16_round(x) if wdt == "bfloat16" else x, w), 1e-5)
    for opts in (dict(gemv_rows=1), dict(gemv_rows=2), dict(gemv_rows=4), dict(gemv_rows=8)):
        assert np.array_equal(run(engine_with(**opts)), ours), f"{opts} changed the bytes"


@pytest.mark.parametrize("K,N0,N1", [(128, 8192, 8192), (64, 15, 1000), (256, 1, 2), (8, 300, 7),
                                     (4096, 3000, 320), (1032, 7, 2049), (8192, 1, 1)])
@pytest.mark.parametrize("x_kind", ["float32", "bfloat16"])
def test_linear_ex_pair_equals_two_calls(e, K, N0, N1, x_kind):
    # Two GEMVs in one launch, short rows (KDA's f_b and g_b over the column blocks of one row)
    # and long ones (its q|k|v and f_a|g_a|beta of one x; ragged row blocks at both ends): each
    # output the bytes of its own linear_ex call; at T = 3 the pair is two cuBLAS calls.
    r = rng(K + N0)
    w0 = memra.DeviceWeight(e, bf16_weight(r.standard_normal((N0, K)) / np.sqrt(K)))
    w1 = memra.DeviceWeight(e, bf16_weight(r.standard_normal((N1, K)) / np.sqrt(K)))
    for T in (1, 3):
        x = f32(r.standard_normal((T, 2 * K + 8)))
        dx = e.to_device(x if x_kind == "float32" else bf16_bits(x))
        y0, y1 = _core.linear_ex_pair(dx, w0, w1, col0=0, col1=K + 8, engine=e)
        np.testing.assert_array_equal(e.to_host(y0), e.to_host(_core.linear_ex(dx, w0, col0=0, engine=e)))
        np.testing.assert_array_equal(e.to_host(y1), e.to_host(_core.linear_ex(dx, w1, col0=K + 8, engine=e)))
    with pytest.raises(memra.ContractError):
        _core.linear_ex_pair(dx, w0, memra.DeviceWeight(e, bf16_weight(np.ones((3, K + 8)))), engine=e)
    with pytest.raises(memra.ContractError):
        _core.linear_ex_pair(dx, w0, w1, col1=K + 9, engine=e)


def test_gemv_edge_values(e):
    # Large magnitudes stay finite (bf16 has f32's exponent range); zero rows give zeros.
    r = rng(5)
    x = f32(r.standard_normal((2, 64)) * 1e30)
    w = bf16_weight(r.standard_normal((8, 64)) * 1e-30)
    got = e.to_host(_core.linear(e.to_device(x), memra.DeviceWeight(e, w), engine=e))
    close_scaled(got, _core.linear(bf16_round(x), w), 1e-5)
    z = e.to_host(_core.linear(e.to_device(np.zeros((1, 64), np.float32)), memra.DeviceWeight(e, w), engine=e))
    assert np.array_equal(z, np.zeros((1, 8), np.float32))


# The kernel options documented as speed only (memra.KernelOptions' docstrings), each away from
# its default for a whole tiny-model decode: the same logits and tokens, bit for bit.
# (gemv_tall_rows: the tiny model has no rows that long; the GEMV tests above cover it.)
SPEED_ONLY = [dict(pdl=False), dict(mhc_defer=False), dict(gemv_rows=1)]


@pytest.mark.parametrize("opts", SPEED_ONLY, ids=[next(iter(o)) for o in SPEED_ONLY])
def test_decode_bytes_do_not_depend_on_speed_only_options(opts):
    # Programmatic dependent launch changes when kernels start, never what they compute: a kernel
    # reading its predecessor's output before it lands (a missing pdl_wait) shows up here. The
    # deferred Sinkhorn (run by the next decode GEMV's extra block, or alone before any other
    # entry point) is the same function on the same rows as the site kernel's own. The GEMV's
    # rows a block do not change a row's order.
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "tiny_glm5_next_bf16"
    prompts = [[3, 17, 5, 9, 200, 41, 7, 7, 12], [11, 2, 98, 31]]

    def run(options):
        m = memra.load(path, device="cuda", dtype="bfloat16", max_batch=4, max_len=64, progress=False,
                       kernel_options=options)
        assert m.engine.options == (options or memra.KernelOptions())
        out = []
        for p in prompts:  # bucket 1 (T = 1 GEMVs)
            out.append(m.generate(p, max_new_tokens=6, ignore_eos=True))
        out.append(m.generate_batch(prompts + [[9, 9, 9]], max_new_tokens=6, ignore_eos=True))  # bucket 4
        c = m.cache
        c.free(0)
        first = m.prefill(c, 0, prompts[0])
        lg = m.decode(c, [0], [int(np.argmax(first))])
        return out, lg

    toks_default, lg_default = run(None)
    toks_off, lg_off = run(memra.KernelOptions(**opts))
    assert toks_default == toks_off
    assert np.array_equal(lg_default, lg_off)


def test_sanitizer_gemv_small(e):
    # A small shape for ``compute-sanitizer --tool memcheck`` (-k sanitizer): a ragged chunk
    # tail, N not a multiple of the row tile, a bias, and bf16 rows read in place.
    r = rng(3)
    K, N = 4104, 37
    x = f32(r.standard_normal((1, K)))
    w = bf16_weight(r.standard_normal((N, K)) / np.sqrt(K))
    b = f32(r.standard_normal(N))
    got = e.to_host(_core.linear(e.to_device(x), memra.DeviceWeight(e, w), e.to_device(b), engine=e))
    close_scaled(got, _core.linear(bf16_round(x), w, b), 1e-5)
    got16 = e.to_host(_core.linear_ex(e.to_device(bf16_bits(x)), memra.DeviceWeight(e, w), engine=e))
    close_scaled(got16, _core.linear(bf16_round(x), w), 1e-5)
    # Short rows (gemv_short_kernel): 16 lanes a row, a ragged N.
    ws = bf16_weight(r.standard_normal((37, 128)) / np.sqrt(128))
    got = e.to_host(_core.linear(e.to_device(x[:, :128].copy()), memra.DeviceWeight(e, ws), engine=e))
    close_scaled(got, _core.linear(bf16_round(x[:, :128].copy()), ws), 1e-5)


def test_deferred_sinkhorn_rides_on_the_next_gemv(e):
    # A one-row mHC site leaves comb's Sinkhorn pending (common.cuh SinkTask); the next decode
    # GEMV runs it in its block 0, and any other entry point (here mhc_post, which reads comb)
    # runs it first on its own. comb, and what reads it, equal an engine that never defers.
    from test_cuda_mhc import hc_layer, mhc_inputs

    D = 256
    streams, fw, base, scale = mhc_inputs(1, 4, D, seed=7)
    r = rng(8)
    wn = f32(r.standard_normal(D))
    wg = r.standard_normal((300, 16)) / 4
    x = f32(r.standard_normal((1, 16)))
    y = f32(r.standard_normal((1, D)))

    xr = f32(r.standard_normal((1, 512)))
    wr = f32(r.standard_normal((32, 512)) / 8)

    def run(eng, first):
        gpu, _ = hc_layer(eng, fw, base, scale, 4, D)
        post, comb, out = gpu.pre(eng.to_device(streams), norm=eng.to_device(wn), eps=1e-6)
        outs = []
        if first == "gemv":  # takes the pending Sinkhorn into its launch
            outs.append(_core.linear(eng.to_device(x), memra.DeviceWeight(eng, bf16_weight(wg)), engine=eng))
        elif first == "route":  # the one-token router + routing launch takes it too
            outs.extend(_core.moe_route(eng.to_device(xr), memra.DeviceWeight(eng, _core.Weight(wr)),
                                        engine=eng, top_k=4, n_group=1, topk_group=1,
                                        norm_topk_prob=True, scaling=1.0))
        outs.append(_core.mhc_post(eng.to_device(y), post, comb, eng.to_device(streams), engine=eng))
        return [eng.to_host(a) for a in [post, comb, out] + outs]

    plain = engine_with(mhc_defer=False)
    for first in ("gemv", "route", None):
        got, want = run(e, first), run(plain, first)
        assert len(got) == len(want)
        for g, wt in zip(got, want):
            np.testing.assert_array_equal(g, wt)
