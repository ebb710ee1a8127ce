"""MLA ops on the CUDA backend (``memra._core.mla_absorb_q`` / ``mla_decompress_v`` /
``mla_latent_append`` / ``mla_attn_absorbed`` / ``mla_attn_gathered`` with
``engine=memra.Engine("cuda")``, kernels in cuda/mla.cu) against the same ops on the CPU backend
(cpp/src/cpu/mla.cpp, the numeric oracle), plus the argument contract.

Tolerances and byte-identity claims (both sides f32 unless said):
- absorb / decompress, arms 1 and 2: the CPU's sequential sums in the CPU's order, products and
  sums rounded separately (no FMA), bf16 weights widened exactly: ``np.array_equal`` with the CPU
  where the CPU build does not contract into FMAs (x86-64 without -march; CPU_EXACT), else
  ``|d| <= 1e-5 * max|y|`` (K <= 512 ascending terms, each side within ~K * 2^-24 of the sum of
  |terms|). Arm 2 (the streaming kernel, or its fallback) == arm 1 always (every output one
  chain summed by one thread in the same order): ``np.array_equal``. Arm 0 is arm 2 at T = 1,
  and for f32 weights below T = 64: ``np.array_equal``; for bf16 weights from T = 2 it is arm 3.
- arm 3 (cuBLASLt, bf16 weights): the activations are rounded to bf16; (a) against arm 1 on the
  bf16-rounded activations the products are exact in f32 on both sides and only the
  accumulation differs (tensor-core partial sums): ``|d| <= 1e-4 * max|y|``; (b) against the CPU
  on the unrounded activations, K terms each off by <= 2^-9 relative with random signs:
  ``|d| <= 1e-2 * max|y|``.
- attention: the scores are the CPU's sequential dot (latent then rope) without FMA, exp is a
  port of glibc's expf, l and o are sequential; only the online rescaling by
  alpha = exp(m_old - m_new) across tiles of 32 rows and the split-KV merge add roundings (a few
  ulp of each weight): ``rtol=1e-5, atol=1e-5`` on outputs of magnitude <= ~3. A query whose rows
  fit one tile without a split (t_kv <= 32) does exactly the CPU's operations:
  ``np.array_equal`` where CPU_EXACT. The bf16 cache is compared with the CPU on the same cache
  rounded to bf16 (widening is exact): the same claims.
- gathered: the list is compacted to the CPU's row list (ascending, unique, visible rows), so the
  same claims hold; a full causal list equals the absorbed kernel's bytes (``np.array_equal``).
- latent append: a copy, bf16 by round-to-nearest-even (ml_dtypes' astype is RNE):
  ``np.array_equal`` on the bits.

Device arrays from ``engine.to_device`` and the ops are single-use DLPack capsules: every call
gets a fresh one (``mla_latent_append`` returns a new capsule of the written cache).

A small shape for ``compute-sanitizer --tool racecheck`` / ``memcheck``:
``python -m pytest tests/test_cuda_mla.py -k sanitizer``.
"""

from __future__ import annotations

import platform

import ml_dtypes
import numpy as np
import pytest

import memra
from memra import _core
from cuda_helpers import bf16_bits, bf16_round, close_scaled, expect, f32, rng

pytestmark = pytest.mark.cuda

ST = _core.status
BF16 = np.dtype(ml_dtypes.bfloat16)
# The CPU oracle sums without FMA on x86-64 (no -march in the build), so the bytes must agree.
CPU_EXACT = platform.machine() in ("x86_64", "AMD64")
ATTN_TOL = dict(rtol=1e-5, atol=1e-5)
EDGE_T = [1, 7, 65, 200]
# Decode batch sizes for the projections (the streaming arm's position tiles are 4P / 8P
# positions: 1 and 2 fit one, 8 one or two, 33 several with a partial last tile).
DECODE_T = [1, 2, 8, 33]
PROJ_T = sorted(set(EDGE_T + DECODE_T))

# (H, R, d_nope, d_v): the tiny test geometry, an odd one (R not a multiple of 8: scalar loads,
# several split chunks with a tail), and GLM-5.3-Flash's head (64 heads would make the CPU slow).
TINY = (4, 32, 16, 16)
ODD = (3, 200, 24, 40)
# R = 37: kv_b rows not a multiple of 16 bytes (the streaming arm copies its tiles element by
# element, a bf16 lane's word straddles the last column, decompress rows end in a scalar tail);
# d_nope = 13 (q not staged 16 bytes at a time, absorb ends in a scalar row); d_v = 11 (a
# partial tile of rows); 40 heads so that at T = 200 a block loops over several position tiles.
ODD_UNALIGNED = (40, 37, 13, 11)
REAL_HEAD = (8, 512, 256, 256)
# GLM-5.3-Flash's MLA head: 64 heads, kv_rank 512, qk_nope_head_dim = v_head_dim = 128.
GLM = (64, 512, 128, 128)


def host_weight(w, dtype):
    if dtype == "bfloat16":
        return _core.Weight(bf16_bits(w), dtype="bfloat16")
    return _core.Weight(f32(w))


def kv_b_of(H, R, dn, dv, seed):
    return f32(rng(seed).standard_normal((H * (dn + dv), R)) / np.sqrt(max(dn, 1)))


def same_as_cpu(got, want):
    """The CPU's operations in the CPU's order: bytes where the CPU does not contract to FMA."""
    assert got.shape == want.shape and got.dtype == np.float32
    if CPU_EXACT:
        np.testing.assert_array_equal(got, want)
    else:
        close_scaled(got, want, 1e-5)


def attn_close(got, want, exact=False):
    assert got.shape == want.shape and got.dtype == np.float32
    assert np.all(np.isfinite(got))
    if exact and CPU_EXACT:
        np.testing.assert_array_equal(got, want)
    else:
        np.testing.assert_allclose(got, want, **ATTN_TOL)


def proj(e, which, x, kv, geom, wdtype, arm):
    """Run absorb or decompress on the GPU (arm) and on the CPU; returns (gpu, cpu)."""
    H, R, dn, dv = geom
    hw = host_weight(kv, wdtype)
    dw = memra.DeviceWeight(e, hw)
    if which == "absorb":
        want = _core.mla_absorb_q(x, hw, d_v=dv)
        got = e.to_host(_core.mla_absorb_q(e.to_device(x), dw, d_v=dv, arm=arm, engine=e))
    else:
        want = _core.mla_decompress_v(x, hw, d_nope=dn)
        got = e.to_host(_core.mla_decompress_v(e.to_device(x), dw, d_nope=dn, arm=arm, engine=e))
    return got, want


def proj_input(which, T, geom, seed):
    H, R, dn, dv = geom
    return f32(rng(seed).standard_normal((T, H, dn if which == "absorb" else R)))


# ---------------------------------------------------------------- absorb / decompress


@pytest.mark.parametrize("which", ["absorb", "decompress"])
@pytest.mark.parametrize("wdtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("arm", [1, 2])
@pytest.mark.parametrize("T", PROJ_T)
@pytest.mark.parametrize("geom", [TINY, ODD, ODD_UNALIGNED], ids=["tiny", "odd", "odd_unaligned"])
def test_proj_kernels_match_cpu(e, which, wdtype, arm, T, geom):
    x = proj_input(which, T, geom, seed=T * 7 + arm)
    kv = kv_b_of(*geom, seed=T + 1)
    got, want = proj(e, which, x, kv, geom, wdtype, arm)
    same_as_cpu(got, want)


@pytest.mark.parametrize("which", ["absorb", "decompress"])
@pytest.mark.parametrize("wdtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("T", [1, 3, 8, 33])
@pytest.mark.parametrize("geom", [TINY, ODD, ODD_UNALIGNED, REAL_HEAD],
                         ids=["tiny", "odd", "odd_unaligned", "real_head"])
def test_split_arm_equals_per_position_bytes(e, which, wdtype, T, geom):
    x = proj_input(which, T, geom, seed=11 + T)
    dw = memra.DeviceWeight(e, host_weight(kv_b_of(*geom, seed=12), wdtype))
    H, R, dn, dv = geom
    if which == "absorb":
        a1 = e.to_host(_core.mla_absorb_q(e.to_device(x), dw, d_v=dv, arm=1, engine=e))
        a2 = e.to_host(_core.mla_absorb_q(e.to_device(x), dw, d_v=dv, arm=2, engine=e))
    else:
        a1 = e.to_host(_core.mla_decompress_v(e.to_device(x), dw, d_nope=dn, arm=1, engine=e))
        a2 = e.to_host(_core.mla_decompress_v(e.to_device(x), dw, d_nope=dn, arm=2, engine=e))
    assert np.all(np.isfinite(a1))
    np.testing.assert_array_equal(a2, a1)


@pytest.mark.parametrize("which", ["absorb", "decompress"])
@pytest.mark.parametrize("T", [1, 64, 200])
@pytest.mark.parametrize("geom", [TINY, ODD, REAL_HEAD], ids=["tiny", "odd", "real_head"])
def test_lt_arm_vs_per_position(e, which, T, geom):
    H, R, dn, dv = geom
    x = proj_input(which, T, geom, seed=21 + T)
    dw = memra.DeviceWeight(e, host_weight(kv_b_of(*geom, seed=22), "bfloat16"))
    kw = dict(d_v=dv) if which == "absorb" else dict(d_nope=dn)
    fn = _core.mla_absorb_q if which == "absorb" else _core.mla_decompress_v
    lt = e.to_host(fn(e.to_device(x), dw, arm=3, engine=e, **kw))
    ref_rounded = e.to_host(fn(e.to_device(bf16_round(x)), dw, arm=1, engine=e, **kw))
    ref = e.to_host(fn(e.to_device(x), dw, arm=1, engine=e, **kw))
    close_scaled(lt, ref_rounded, 1e-4)  # (a) same bf16 operands, accumulation order only
    close_scaled(lt, ref, 1e-2)          # (b) activations rounded to bf16


@pytest.mark.parametrize("which", ["absorb", "decompress"])
@pytest.mark.parametrize("wdtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("T", [1, 7, 65, 200])
def test_auto_arm(e, which, wdtype, T):
    """Arm 0: for f32 weights the streaming or per-position arm (CPU bytes); for bf16 weights
    the streaming arm at T = 1 (CPU bytes) and cuBLASLt from T = 2 (or the per-position kernel
    when cuBLASLt declines), which equals arm 3's bytes."""
    x = proj_input(which, T, TINY, seed=31 + T)
    kv = kv_b_of(*TINY, seed=32)
    got, want = proj(e, which, x, kv, TINY, wdtype, 0)
    if wdtype == "bfloat16" and T >= 2:
        close_scaled(got, want, 1e-2)
        lt, _ = proj(e, which, x, kv, TINY, wdtype, 3)
        np.testing.assert_array_equal(got, lt)
    else:
        same_as_cpu(got, want)


@pytest.mark.parametrize("which", ["absorb", "decompress"])
def test_odd_dims_lt_declines_or_agrees(e, which):
    """d_nope / R odd: bf16 rows 2-byte aligned. cuBLASLt either finds an algorithm (then it
    agrees within the bf16 bound) or declines: arm 3 raises LibraryError 20000 + 15
    (CUBLAS_STATUS_NOT_SUPPORTED) and arm 0 falls back to the per-position kernel (CPU bytes)."""
    geom = (3, 33, 15, 17)
    H, R, dn, dv = geom
    T = 70
    x = proj_input(which, T, geom, seed=41)
    kv = kv_b_of(*geom, seed=42)
    auto, want = proj(e, which, x, kv, geom, "bfloat16", 0)
    close_scaled(auto, want, 1e-2)
    try:
        lt, _ = proj(e, which, x, kv, geom, "bfloat16", 3)
    except memra.LibraryError as err:
        assert err.code == ST.LIBRARY_BASE + 15, str(err)
        same_as_cpu(auto, want)  # the decline fell back to arm 1
    else:
        close_scaled(lt, want, 1e-2)


def test_lt_arm_refuses_f32_weights(e):
    H, R, dn, dv = TINY
    dw = memra.DeviceWeight(e, host_weight(kv_b_of(*TINY, seed=5), "float32"))
    x = e.to_device(proj_input("absorb", 70, TINY, seed=6))
    expect(memra.UnsupportedError, ST.UNSUPPORTED, _core.mla_absorb_q, x, dw, d_v=dv, arm=3, engine=e)


def test_proj_real_geometry_decode(e):
    """64 heads with 256-wide heads at decode (T = 1): auto takes the streaming arm; CPU bytes."""
    geom = (64, 512, 256, 256)
    kv = kv_b_of(*geom, seed=51)
    for which in ("absorb", "decompress"):
        x = proj_input(which, 1, geom, seed=52)
        got, want = proj(e, which, x, kv, geom, "bfloat16", 0)
        same_as_cpu(got, want)


@pytest.mark.parametrize("which", ["absorb", "decompress"])
@pytest.mark.parametrize("wdtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("T", DECODE_T)
def test_proj_glm_decode_shapes(e, which, wdtype, T):
    """GLM-5.3-Flash's head (H = 64, R = 512, d_nope = d_v = 128) at decode batch sizes: the
    streaming arm (2) gives the CPU's bytes, the per-position kernel (1) agrees byte for byte,
    and auto (0) takes arm 2 (the same bytes) except for bf16 weights from T = 2 (cuBLASLt:
    arm 3's bytes, within its bound of the CPU)."""
    geom = GLM
    H, R, dn, dv = geom
    kv = kv_b_of(*geom, seed=71)
    x = proj_input(which, T, geom, seed=72 + T)
    got, want = proj(e, which, x, kv, geom, wdtype, 2)
    same_as_cpu(got, want)
    dw = memra.DeviceWeight(e, host_weight(kv, wdtype))
    kw = dict(d_v=dv) if which == "absorb" else dict(d_nope=dn)
    fn = _core.mla_absorb_q if which == "absorb" else _core.mla_decompress_v
    other = e.to_host(fn(e.to_device(x), dw, arm=1, engine=e, **kw))
    np.testing.assert_array_equal(other, got)
    auto = e.to_host(fn(e.to_device(x), dw, arm=0, engine=e, **kw))
    if wdtype == "bfloat16" and T >= 2:
        np.testing.assert_array_equal(auto, e.to_host(fn(e.to_device(x), dw, arm=3, engine=e, **kw)))
        close_scaled(auto, want, 1e-2)
    else:
        np.testing.assert_array_equal(auto, got)
    # Deterministic: a second call of arm 2 gives the same bytes.
    again = e.to_host(fn(e.to_device(x), dw, arm=2, engine=e, **kw))
    np.testing.assert_array_equal(again, got)


def test_proj_zero_tokens(e):
    H, R, dn, dv = TINY
    dw = memra.DeviceWeight(e, host_weight(kv_b_of(*TINY, seed=7), "float32"))
    out = e.to_host(_core.mla_absorb_q(e.to_device(f32(np.zeros((0, H, dn)))), dw, d_v=dv, engine=e))
    assert out.shape == (0, H, R)
    out = e.to_host(_core.mla_decompress_v(e.to_device(f32(np.zeros((0, H, R)))), dw, d_nope=dn, engine=e))
    assert out.shape == (0, H, dv)


def test_proj_errors(e):
    H, R, dn, dv = TINY
    hw = host_weight(kv_b_of(*TINY, seed=8), "float32")
    dw = memra.DeviceWeight(e, hw)
    q = f32(np.zeros((2, H, dn)))
    expect(memra.ContractError, ST.CONTRACT_DEVICE, _core.mla_absorb_q, q, dw, d_v=dv, engine=e)
    expect(memra.ContractError, ST.CONTRACT_DEVICE, _core.mla_absorb_q, e.to_device(q), hw, d_v=dv, engine=e)
    expect(memra.ContractError, ST.CONTRACT_DEVICE, _core.mla_absorb_q, q, dw, d_v=dv)  # CPU + device weight
    expect(memra.ContractError, ST.CONTRACT_VALUE, _core.mla_absorb_q, e.to_device(q), dw, d_v=dv, arm=4,
           engine=e)
    expect(memra.ContractError, ST.CONTRACT_SHAPE, _core.mla_absorb_q, e.to_device(q), dw, d_v=dv + 1,
           engine=e)
    expect(memra.ContractError, ST.CONTRACT_DTYPE, _core.mla_absorb_q,
           e.to_device(np.zeros((2, H, dn), np.float64)), dw, d_v=dv, engine=e)
    expect(memra.ContractError, ST.CONTRACT_SHAPE, _core.mla_decompress_v,
           e.to_device(f32(np.zeros((2, H, R + 1)))), dw, d_nope=dn, engine=e)
    # The engine is still usable.
    assert e.to_host(_core.mla_absorb_q(e.to_device(q), dw, d_v=dv, engine=e)).shape == (2, H, R)


# ---------------------------------------------------------------- latent append


@pytest.mark.parametrize("cache_dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("T,start", [(1, 0), (7, 5), (65, 100), (200, 0)])
def test_latent_append(e, cache_dtype, T, start):
    W, max_len = 96, 260
    r = rng(T + start)
    rows = f32(r.standard_normal((T, W)) * 3)
    init = f32(r.standard_normal((max_len, W)))
    host = bf16_bits(init) if cache_dtype == "bfloat16" else init
    cache = _core.mla_latent_append(e.to_device(rows), e.to_device(host), start=start, engine=e)
    got = e.to_host(cache)
    want = host.copy()
    want[start:start + T] = bf16_bits(rows) if cache_dtype == "bfloat16" else rows
    np.testing.assert_array_equal(got, want)
    # The CPU op: a copy into a writable host f32 cache.
    cpu = init.copy()
    assert _core.mla_latent_append(rows, cpu, start=start) is cpu
    np.testing.assert_array_equal(cpu[start:start + T], rows)
    np.testing.assert_array_equal(cpu[:start], init[:start])
    np.testing.assert_array_equal(cpu[start + T:], init[start + T:])


def test_latent_append_bf16_rounding_ties(e):
    """Round to nearest even on exact ties (1 + 2^-8 -> 1, 1 + 3 * 2^-8 -> 1 + 2^-6)."""
    rows = f32([[1 + 2**-8, 1 + 3 * 2**-8, -(1 + 2**-8), 3.0e38, 1e-40, 0.0]])
    cache = _core.mla_latent_append(e.to_device(rows), e.to_device(np.zeros((2, 6), np.uint16)), start=1,
                                    engine=e)
    got = e.to_host(cache)
    np.testing.assert_array_equal(got[1], bf16_bits(rows)[0])
    np.testing.assert_array_equal(got[0], np.zeros(6, np.uint16))


def test_latent_append_errors(e):
    W = 8
    init = f32(np.arange(4 * W).reshape(4, W))
    rows = f32(np.ones((3, W)))
    for start in (2, -1):
        expect(memra.ContractError, ST.CONTRACT_RANGE, _core.mla_latent_append, e.to_device(rows),
               e.to_device(init), start=start, engine=e)
    expect(memra.ContractError, ST.CONTRACT_SHAPE, _core.mla_latent_append,
           e.to_device(f32(np.ones((1, W + 1)))), e.to_device(init), start=0, engine=e)
    expect(memra.ContractError, ST.CONTRACT_DTYPE, _core.mla_latent_append, e.to_device(rows),
           e.to_device(np.zeros((4, W), np.float64)), start=0, engine=e)
    expect(memra.ContractError, ST.CONTRACT_DEVICE, _core.mla_latent_append, rows, e.to_device(init),
           start=0, engine=e)
    cpu = init.copy()
    expect(memra.ContractError, ST.CONTRACT_RANGE, _core.mla_latent_append, rows, cpu, start=2)
    np.testing.assert_array_equal(cpu, init)  # nothing written


def test_latent_append_refused_call_changes_nothing(e):
    """A reusable device buffer (CuPy) read back after refused calls: nothing was written."""
    cp = pytest.importorskip("cupy")
    W = 8
    init = f32(np.arange(4 * W).reshape(4, W))
    with cp.cuda.Device(0):  # the engine's device (Engine('cuda') = device_index 0)
        cache = cp.asarray(init)
        rows = cp.ones((3, W), cp.float32)
        cp.cuda.Device().synchronize()  # memra's stream does not wait for CuPy's
        for start in (2, -1):
            with pytest.raises(memra.ContractError):
                _core.mla_latent_append(rows, cache, start=start, engine=e)
        with pytest.raises(memra.ContractError):
            _core.mla_latent_append(cp.ones((3, W + 1), cp.float32), cache, start=0, engine=e)
        _core.mla_latent_append(rows[:1], cache, start=3, engine=e)  # one accepted call
        e.synchronize()
        want = init.copy()
        want[3] = 1.0
        np.testing.assert_array_equal(cp.asnumpy(cache), want)


# ---------------------------------------------------------------- attention


def attn_inputs(t_q, t_kv, H, R, d_rope, seed):
    r = rng(seed)
    q_lat = f32(r.standard_normal((t_q, H, R)) * 0.5)
    cache = f32(r.standard_normal((t_kv, R + d_rope)))
    q_pe = f32(r.standard_normal((t_q, H, d_rope))) if d_rope else None
    scale = float((16 + d_rope) ** -0.5)
    return q_lat, q_pe, cache, scale


def dev(e, a):
    return None if a is None else e.to_device(a)


def run_absorbed(e, q_lat, q_pe, cache, scale, cache_dtype="float32"):
    want_cache = bf16_round(cache) if cache_dtype == "bfloat16" else cache
    want = _core.mla_attn_absorbed(q_lat, want_cache, q_pe, scale=scale)
    dcache = e.to_device(bf16_bits(cache) if cache_dtype == "bfloat16" else cache)
    got = e.to_host(_core.mla_attn_absorbed(dev(e, q_lat), dcache, dev(e, q_pe), scale=scale, engine=e))
    return got, want


@pytest.mark.parametrize("cache_dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("d_rope", [0, 64])
@pytest.mark.parametrize("T", EDGE_T)
def test_absorbed_prefill_matches_cpu(e, cache_dtype, d_rope, T):
    H, R = TINY[:2]
    q_lat, q_pe, cache, scale = attn_inputs(T, T, H, R, d_rope, seed=T + d_rope)
    got, want = run_absorbed(e, q_lat, q_pe, cache, scale, cache_dtype)
    attn_close(got, want, exact=T <= 32)


@pytest.mark.parametrize("cache_dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("d_rope", [0, 64])
@pytest.mark.parametrize("t_q,t_kv", [(1, 1), (1, 7), (1, 32), (1, 33), (1, 200), (7, 200),
                                      (65, 200), (3, 1000)])
def test_absorbed_suffix_matches_cpu(e, cache_dtype, d_rope, t_q, t_kv):
    H, R = TINY[:2]
    q_lat, q_pe, cache, scale = attn_inputs(t_q, t_kv, H, R, d_rope, seed=t_q * 31 + t_kv)
    got, want = run_absorbed(e, q_lat, q_pe, cache, scale, cache_dtype)
    attn_close(got, want, exact=t_kv <= 32)


@pytest.mark.parametrize("H,R,d_rope,t_q,t_kv", [
    (64, 512, 0, 1, 300),    # GLM-5.3-Flash decode: 4 head groups of 16, split over the rows
    (64, 512, 0, 70, 70),    # prefill: several groups, no split
    (32, 512, 64, 2, 129),   # Kimi-Linear: rope columns, a row past a tile boundary
    (5, 200, 8, 9, 40),      # odd: R not a multiple of 32, 5 heads in one block, 2 tiles
])
def test_absorbed_real_geometry(e, H, R, d_rope, t_q, t_kv):
    q_lat, q_pe, cache, scale = attn_inputs(t_q, t_kv, H, R, d_rope, seed=H + R + t_kv)
    q_lat *= 16 / np.sqrt(R)  # scores O(1..10) as with real absorbed queries
    got, want = run_absorbed(e, q_lat, q_pe, cache, scale)
    attn_close(got, want)


def test_absorbed_extreme_scores(e):
    """Peaked softmax (scores ~ +-500): one row dominates, exp underflows for the rest; finite."""
    H, R = TINY[:2]
    q_lat, q_pe, cache, scale = attn_inputs(5, 150, H, R, 0, seed=3)
    q_lat *= 400
    got, want = run_absorbed(e, q_lat, q_pe, cache, scale)
    attn_close(got, want)


def test_absorbed_errors(e):
    H, R = TINY[:2]
    D = e.to_device
    q_lat, _, cache, scale = attn_inputs(5, 4, H, R, 0, seed=1)
    expect(memra.ContractError, ST.CONTRACT_QUERY_SUFFIX, _core.mla_attn_absorbed, D(q_lat), D(cache),
           scale=scale, engine=e)
    q_lat, _, cache, _ = attn_inputs(2, 4, H, R, 8, seed=2)
    pe = f32(np.zeros((2, H, 8)))
    expect(memra.ContractError, ST.CONTRACT_MISSING, _core.mla_attn_absorbed, D(q_lat), D(cache),
           scale=scale, engine=e)
    expect(memra.ContractError, ST.CONTRACT_DEVICE, _core.mla_attn_absorbed, q_lat, D(cache), D(pe),
           scale=scale, engine=e)
    expect(memra.ContractError, ST.CONTRACT_DEVICE, _core.mla_attn_absorbed, D(q_lat), D(cache), D(pe),
           scale=scale)  # device arrays on the CPU backend
    expect(memra.ContractError, ST.CONTRACT_SHAPE, _core.mla_attn_absorbed, D(q_lat), D(cache),
           D(f32(np.zeros((2, H, 7)))), scale=scale, engine=e)
    expect(memra.ContractError, ST.CONTRACT_DTYPE, _core.mla_attn_absorbed, D(q_lat),
           D(np.zeros((4, R + 8), np.float64)), D(pe), scale=scale, engine=e)
    expect(memra.ContractError, ST.CONTRACT_VALUE, _core.mla_attn_absorbed, D(q_lat), D(cache), D(pe),
           scale=float("nan"), engine=e)
    # The engine is still usable.
    got, want = run_absorbed(e, q_lat, pe, cache, scale)
    attn_close(got, want, exact=True)


# ---------------------------------------------------------------- gathered


def random_lists(t_q, t_kv, width, seed, dup=False):
    """Per query i (row t_kv - t_q + i): distinct visible rows, -1 padded, shuffled."""
    r = rng(seed)
    idx = np.full((t_q, width), -1, np.int32)
    for i in range(t_q):
        vis = t_kv - t_q + i + 1
        n = int(r.integers(0, min(width, vis) + 1))
        rows = r.choice(vis, size=n, replace=False)
        if dup and n:
            rows = np.concatenate([rows, r.choice(rows, size=min(width - n, n))])
        row = np.full(width, -1, np.int32)
        row[:len(rows)] = rows
        idx[i] = r.permutation(row)
    return idx


def run_gathered(e, q_lat, q_pe, cache, idx, scale, cache_dtype="float32", **kw):
    want_cache = bf16_round(cache) if cache_dtype == "bfloat16" else cache
    want = _core.mla_attn_gathered(q_lat, want_cache, idx, q_pe, scale=scale)
    dcache = e.to_device(bf16_bits(cache) if cache_dtype == "bfloat16" else cache)
    got = e.to_host(_core.mla_attn_gathered(dev(e, q_lat), dcache, e.to_device(idx), dev(e, q_pe),
                                            scale=scale, engine=e, **kw))
    return got, want


@pytest.mark.parametrize("cache_dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("d_rope", [0, 64])
@pytest.mark.parametrize("T", EDGE_T)
@pytest.mark.parametrize("width", [5, 32, 67])
def test_gathered_matches_cpu(e, cache_dtype, d_rope, T, width):
    H, R = TINY[:2]
    q_lat, q_pe, cache, scale = attn_inputs(T, T, H, R, d_rope, seed=T * 3 + width + d_rope)
    idx = random_lists(T, T, width, seed=T + width)
    got, want = run_gathered(e, q_lat, q_pe, cache, idx, scale, cache_dtype)
    attn_close(got, want, exact=width <= 32)


@pytest.mark.parametrize("t_q,t_kv,width", [(1, 200, 40), (7, 300, 100), (3, 1000, 300)])
def test_gathered_suffix_with_duplicates(e, t_q, t_kv, width):
    H, R = TINY[:2]
    q_lat, q_pe, cache, scale = attn_inputs(t_q, t_kv, H, R, 0, seed=t_kv)
    idx = random_lists(t_q, t_kv, width, seed=t_kv + 1, dup=True)
    got, want = run_gathered(e, q_lat, q_pe, cache, idx, scale)
    attn_close(got, want)


def test_gathered_all_and_leading_minus_one(e):
    """Rows of all -1 give zeros; all but one -1 (the valid entry last) gives that row's latent;
    nothing is NaN (the online softmax starts at max = -inf)."""
    H, R = TINY[:2]
    t_q, t_kv, width = 4, 50, 70
    q_lat, q_pe, cache, scale = attn_inputs(t_q, t_kv, H, R, 0, seed=9)
    idx = np.full((t_q, width), -1, np.int32)
    idx[1, -1] = 3          # all but one -1, the valid entry at the end (past two tiles of -1)
    idx[2, 40] = 10         # one valid entry in the middle, listed three times
    idx[2, 45] = 10
    idx[2, 69] = 10
    idx[3, :] = np.arange(width) % (t_kv - t_q + 4)  # many duplicates of every visible row
    got, want = run_gathered(e, q_lat, q_pe, cache, idx, scale)
    attn_close(got, want)
    np.testing.assert_array_equal(got[0], np.zeros((H, R), np.float32))
    # One row: p = exp(0) = 1, l = 1, o = 1 * c exactly.
    np.testing.assert_array_equal(got[1], np.broadcast_to(cache[3, :R], (H, R)))
    np.testing.assert_array_equal(got[2], np.broadcast_to(cache[10, :R], (H, R)))
    # A zero-width list: zeros.
    empty = np.zeros((t_q, 0), np.int32)
    got0 = e.to_host(_core.mla_attn_gathered(e.to_device(q_lat), e.to_device(cache), e.to_device(empty),
                                             scale=scale, engine=e))
    np.testing.assert_array_equal(got0, np.zeros((t_q, H, R), np.float32))


def test_gathered_full_list_equals_absorbed_bytes(e):
    H, R = TINY[:2]
    for t_q, t_kv in [(1, 200), (65, 65), (7, 40)]:
        q_lat, q_pe, cache, scale = attn_inputs(t_q, t_kv, H, R, 0, seed=t_q + t_kv)
        idx = np.full((t_q, t_kv), -1, np.int32)
        for i in range(t_q):
            vis = t_kv - t_q + i + 1
            idx[i, :vis] = rng(i).permutation(vis)  # order does not matter
        D = e.to_device
        gathered = e.to_host(_core.mla_attn_gathered(D(q_lat), D(cache), D(idx), scale=scale, engine=e))
        absorbed = e.to_host(_core.mla_attn_absorbed(D(q_lat), D(cache), scale=scale, engine=e))
        np.testing.assert_array_equal(gathered, absorbed)


def test_gathered_real_geometry(e):
    """GLM-5.3-Flash decode shape: 64 heads, rank 512, a top-k list of 2051 entries."""
    H, R, t_q, t_kv, width = 64, 512, 1, 3000, 2051
    q_lat, q_pe, cache, scale = attn_inputs(t_q, t_kv, H, R, 0, seed=77)
    q_lat *= 16 / np.sqrt(R)
    idx = random_lists(t_q, t_kv, width, seed=78)
    idx[0, :1500] = rng(79).choice(t_kv, 1500, replace=False)
    got, want = run_gathered(e, q_lat, q_pe, cache, idx, scale)
    attn_close(got, want)


def test_gathered_range_checks(e):
    H, R = TINY[:2]
    D = e.to_device
    t_q, t_kv, width = 3, 20, 6
    q_lat, q_pe, cache, scale = attn_inputs(t_q, t_kv, H, R, 0, seed=4)
    good = random_lists(t_q, t_kv, width, seed=5)
    for bad_value in (t_kv, -2, t_kv - 1):  # beyond the cache, below -1, after query 0's row
        bad = good.copy()
        bad[0, 2] = bad_value
        expect(memra.ContractError, ST.CONTRACT_RANGE, _core.mla_attn_gathered, D(q_lat), D(cache), D(bad),
               scale=scale, engine=e)
        # Unchecked, the device skips the entry: the CPU on the list without it.
        got = e.to_host(_core.mla_attn_gathered(D(q_lat), D(cache), D(bad), scale=scale, check_range=False,
                                                engine=e))
        fixed = bad.copy()
        fixed[0, 2] = -1
        want = _core.mla_attn_gathered(q_lat, cache, fixed, scale=scale)
        attn_close(got, want, exact=True)
    expect(memra.ContractError, ST.CONTRACT_DTYPE, _core.mla_attn_gathered, D(q_lat), D(cache),
           D(good.astype(np.int64)), scale=scale, engine=e)
    expect(memra.ContractError, ST.CONTRACT_SHAPE, _core.mla_attn_gathered, D(q_lat), D(cache),
           D(good[:2]), scale=scale, engine=e)
    expect(memra.ContractError, ST.CONTRACT_QUERY_SUFFIX, _core.mla_attn_gathered,
           D(f32(np.zeros((25, H, R)))), D(cache), D(np.full((25, width), -1, np.int32)), scale=scale,
           engine=e)


# ---------------------------------------------------------------- chain and sanitizer


def test_chain_absorb_attend_decompress(e):
    """append -> absorb -> absorbed attention -> decompress on the device vs the CPU chain."""
    H, R, dn, dv = TINY
    T, max_len = 9, 16
    r = rng(61)
    kv = kv_b_of(*TINY, seed=62)
    hw = host_weight(kv, "float32")
    dw = memra.DeviceWeight(e, hw)
    q_nope = f32(r.standard_normal((T, H, dn)))
    rows = f32(r.standard_normal((T, R)))
    scale = dn**-0.5
    cache = _core.mla_latent_append(e.to_device(rows), e.to_device(f32(np.zeros((max_len, R)))), start=0,
                                    engine=e)
    q_lat = _core.mla_absorb_q(e.to_device(q_nope), dw, d_v=dv, engine=e)
    # The first T rows of the cache (a view of the device cache is not available: copy back).
    used = e.to_device(e.to_host(cache)[:T])
    o_lat = _core.mla_attn_absorbed(q_lat, used, scale=scale, engine=e)
    got = e.to_host(_core.mla_decompress_v(o_lat, dw, d_nope=dn, engine=e))
    want = _core.mla_decompress_v(
        _core.mla_attn_absorbed(_core.mla_absorb_q(q_nope, hw, d_v=dv), rows, scale=scale), hw, d_nope=dn)
    same_as_cpu(got, want)  # T <= 32: every step is the CPU's arithmetic


def test_sanitizer_small_shapes(e):
    """One call of every entry point and arm on small odd shapes (for compute-sanitizer runs)."""
    r = rng(99)
    D = e.to_device
    # R = 64: the streaming arm's 16-byte cp.async tiles; R = 37: its element-wise copies.
    for H, R, dn, dv in ((3, 64, 8, 24), (3, 37, 5, 7)):
        dw = memra.DeviceWeight(e, host_weight(kv_b_of(H, R, dn, dv, seed=98), "bfloat16"))
        for T in (1, 3, 17, 66):
            q = f32(r.standard_normal((T, H, dn)))
            o = f32(r.standard_normal((T, H, R)))
            for arm in (0, 1, 2):
                _core.mla_absorb_q(D(q), dw, d_v=dv, arm=arm, engine=e)
                _core.mla_decompress_v(D(o), dw, d_nope=dn, arm=arm, engine=e)
    H, R, dn, dv = 3, 37, 5, 7
    t_q, t_kv, d_rope = 3, 70, 4
    q_lat, q_pe, cache, scale = attn_inputs(t_q, t_kv, H, R, d_rope, seed=97)
    bits = e.to_host(_core.mla_latent_append(D(cache), D(np.zeros((t_kv, R + d_rope), np.uint16)), start=0,
                                             engine=e))
    idx = random_lists(t_q, t_kv, 40, seed=96, dup=True)
    for c in (cache, bits):
        _core.mla_attn_absorbed(D(q_lat), D(c), D(q_pe), scale=scale, engine=e)
        _core.mla_attn_gathered(D(q_lat), D(c), D(idx), D(q_pe), scale=scale, engine=e)
    e.synchronize()
