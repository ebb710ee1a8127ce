"""MLA with rope columns on the CUDA backend (Kimi-Linear: rows [latent R | k_pe d_rope], scores
(q_lat . c + q_pe . k_pe) * scale, the k_pe columns never rotated): the batched decode forms of
``memra._core.mla_attn_decode`` with ``q_pe`` (cuda/mla_decode.cu's f32 rope kernel,
cuda/mla_decode_tc.cu's tensor-core rope kernel at d_rope = 64) against the CPU oracle (the same
binding without an engine: cpu::mla_attn_absorbed / mla_attn_gathered per sequence), and the
whole MlaLayer at Kimi-Linear-48B's attention widths (H 32, R 512, d_nope 128, d_rope 64) against
the CPU layer, with and without query LoRA.

Tolerances (``close_per_seq``: |got - want| <= rel * max|want| per sequence), as
tests/test_cuda_mla_decode.py argues them for latent-only rows (the rope columns are 64 more
terms of the same dot product, the inputs scaled so scores keep a std of ~2):
- float32 caches and bfloat16 caches outside the tensor-core shapes (the exact f32 kernel):
  2e-5 against the CPU and against the per-sequence CUDA op.
- bfloat16 caches at R in {128, 256, 512}, d_rope 64 (tensor cores: q_lat, q_pe and p rounded
  to bf16): 1e-2 against the CPU on the same cache, 5e-3 against the CPU on the bf16-rounded
  q_lat and q_pe.
- one visible row: o = its latent columns exactly; idle rows (t_kv 0): exact zeros, the other
  rows' bytes unchanged.
- q_pe = 0: the rope columns add exact zeros: the latent-only kernel's output on the latent
  columns (1e-6: the same operations, the same split plan).
- q_lat = 0, q_pe = 8 k_pe[r_h]: row r_h wins by > 200 (log2 units), every other weight is 0:
  o_h = the latent columns of row r_h bit for bit (the k_pe columns' offsets and q_pe's).
- the layer: float32 2e-5 of max|y| against the CPU layer (the model's 1e-5 bound holds on the
  tiny fixture, tests/test_cuda_model_kimi_linear.py); bfloat16 3e-2 (bf16 activations into the
  GEMMs, a bf16 cache, tensor-core rounding), as tests/test_cuda_kda_layer.py's MLA layer.

Rows of a cache past t_kv hold NaN: a kernel that reads them produces NaN.
"""

from __future__ import annotations

import numpy as np
import pytest

import memra
from memra import _core
from cuda_helpers import bf16_round, bf16_weight, close_scaled, engine_with, expect, f32, rng
from mla_decode_batch import (BF16_QROUND_REL, BF16_REL, F32_REL, Batch, close_per_seq, pattern,
                              random_lists)

pytestmark = pytest.mark.cuda

ST = _core.status


# ---------------------------------------------------------------- dense

# (H, R, d_rope): the tiny fixture's MLA, Kimi-Linear-48B's, an odd one.
F32_SHAPES = [(4, 32, 8), (32, 512, 64), (5, 200, 24)]


@pytest.mark.parametrize("B", [1, 3, 33])
@pytest.mark.parametrize("H,R,dr", F32_SHAPES, ids=["tiny", "kimi", "odd"])
def test_rope_f32_matches_cpu_and_per_sequence(e, B, H, R, dr):
    bt = Batch(pattern(B), H, R, "float32", seed=B + R + dr, dr=dr)
    got = bt.gpu(e)
    close_per_seq(got, bt.cpu(), F32_REL)
    bt.exact_rows(got)
    for b in range(min(B, 4)):  # the one-sequence CUDA op (cuda/mla_attn.cu) on the visible rows
        one = e.to_host(_core.mla_attn_absorbed(e.to_device(bt.q[b:b + 1]), e.to_device(bt.rows[b]),
                                                e.to_device(bt.q_pe[b:b + 1]), scale=bt.scale,
                                                engine=e))
        close_per_seq(got[b:b + 1], one, F32_REL)


@pytest.mark.parametrize("B,H,R", [
    (1, 32, 512), (3, 32, 512), (40, 32, 512),  # Kimi-Linear-48B: 32 heads, one head group
    (3, 5, 128),                                # 5 heads padded to 32
    (3, 40, 256),                               # two head groups (32 + 8)
])
def test_rope_bf16_tensor_cores_match_cpu(e, B, H, R):
    bt = Batch(pattern(B), H, R, "bfloat16", seed=B * 3 + H, dr=64)
    got = bt.gpu(e)
    close_per_seq(got, bt.cpu(), BF16_REL)
    close_per_seq(got, bt.cpu(q=bf16_round(bt.q), q_pe=bf16_round(bt.q_pe)), BF16_QROUND_REL)
    bt.exact_rows(got)


@pytest.mark.parametrize("R,dr", [(32, 8), (96, 64), (512, 32)])
def test_rope_bf16_outside_tensor_core_shapes_runs_exact_f32(e, R, dr):
    """bf16 rows the tensor-core kernel is not instantiated for: the f32 kernel, widened rows."""
    bt = Batch([1, 40, 300, 0], 6, R, "bfloat16", seed=R + dr, dr=dr)
    got = bt.gpu(e)
    close_per_seq(got, bt.cpu(), F32_REL)
    bt.exact_rows(got)


def test_rope_bf16_long_sequence(e):
    """32768 rows (many splits and the combine over them) beside a short and an idle row."""
    bt = Batch([32768, 9, 0], 32, 512, "bfloat16", seed=5, dr=64)
    got = bt.gpu(e)
    close_per_seq(got, bt.cpu(), BF16_REL)
    close_per_seq(got, bt.cpu(q=bf16_round(bt.q), q_pe=bf16_round(bt.q_pe)), BF16_QROUND_REL)
    bt.exact_rows(got)


# ---------------------------------------------------------------- the rope columns isolated


@pytest.mark.parametrize("cache_dtype,H,R,dr", [("float32", 8, 128, 8), ("float32", 32, 512, 64),
                                                 ("bfloat16", 32, 512, 64),
                                                 ("bfloat16", 16, 128, 64)])
def test_rope_zero_q_pe_equals_latent_only_kernel(e, cache_dtype, H, R, dr):
    """q_pe = 0 adds exact zeros to every score: the latent-only kernel's output over the same
    rows' latent columns (the same operations and split plan; 32 heads keep both on the mma.sync
    kernel with 2 m-tiles)."""
    t_kv = [1, 70, 300, 0, 65]
    bt = Batch(t_kv, H, R, cache_dtype, seed=H + R, dr=dr)
    got = bt.gpu(e, q_pe=np.zeros_like(bt.q_pe))
    latent = [e.to_device(np.ascontiguousarray(c[:, :R])) for c in bt.host]
    want = e.to_host(_core.mla_attn_decode(e.to_device(bt.q), latent, t_kv, scale=bt.scale,
                                           engine=e))
    close_per_seq(got, want, 1e-6)
    bt.exact_rows(got)


@pytest.mark.parametrize("cache_dtype,H,R", [("float32", 8, 128), ("bfloat16", 32, 512),
                                             ("bfloat16", 5, 256)])
def test_rope_peaked_q_pe_selects_row(e, cache_dtype, H, R):
    """q_lat = 0 and q_pe_h = 8 k_pe[r_h] (bf16 values, exact after rounding), scale 1: row r_h
    beats every other row by > 200 (log2 units), every other weight is exactly 0 and o_h is the
    latent columns of row r_h bit for bit; a wrong k_pe column or q_pe offset selects another
    row."""
    dr = 64
    t_kv = [300, 65, 150, 48]
    bt = Batch(t_kv, H, R, cache_dtype, seed=83 + R, dr=dr)
    q = np.zeros_like(bt.q)
    q_pe = np.zeros_like(bt.q_pe)
    pick = np.zeros((len(t_kv), H), np.int64)
    for b, t in enumerate(t_kv):
        pick[b] = (np.arange(H) * 37 + 5 * b + 3) % t
        k_pe = bf16_round(bt.rows[b][:, R:])
        q_pe[b] = 8 * k_pe[pick[b]]
        s = (q_pe[b].astype(np.float64) @ bt.rows[b][:, R:].astype(np.float64).T) * np.log2(np.e)
        top = s[np.arange(H), pick[b]]
        s[np.arange(H), pick[b]] = -np.inf
        assert (top - s.max(1)).min() > 200, "inputs do not separate the rows enough"
    for kw in ({}, {"max_t_kv": 9000}):
        out = _core.mla_attn_decode(e.to_device(q), bt.caches(e), t_kv, q_pe=e.to_device(q_pe),
                                    scale=1.0, engine=e, **kw)
        got = e.to_host(out)
        for b in range(len(t_kv)):
            np.testing.assert_array_equal(got[b], bt.rows[b][pick[b], :R], err_msg=f"sequence {b}")


# ---------------------------------------------------------------- idle rows, device t_kv, splits


@pytest.mark.parametrize("cache_dtype,H,R,dr", [("float32", 4, 32, 8), ("bfloat16", 32, 512, 64)])
def test_rope_idle_rows_are_zero_and_change_nothing(e, cache_dtype, H, R, dr):
    t_kv = pattern(12)
    bt = Batch(t_kv, H, R, cache_dtype, seed=21, dr=dr)
    base = bt.gpu(e, max_t_kv=4096)
    idle = [1, 4, 7, 10]
    t_idle = [0 if b in idle else t for b, t in enumerate(t_kv)]
    q, q_pe = bt.q.copy(), bt.q_pe.copy()
    q[idle] = np.nan  # nothing of an idle row is read, its queries included
    q_pe[idle] = np.nan
    got = bt.gpu(e, t_kv=t_idle, q=q, q_pe=q_pe, max_t_kv=4096)
    for b in range(len(t_kv)):
        want = np.zeros((H, R), np.float32) if b in idle else base[b]
        np.testing.assert_array_equal(got[b], want)


@pytest.mark.parametrize("cache_dtype,H,R,dr", [("float32", 4, 32, 8), ("bfloat16", 32, 512, 64)])
def test_rope_device_t_kv_equals_host_t_kv(e, cache_dtype, H, R, dr):
    """The decode-graph call (device t_kv, max_t_kv the cache length): the host call's bytes."""
    t_kv = [300, 1, 0, 77, 129]
    bt = Batch(t_kv, H, R, cache_dtype, seed=31, slack=40, dr=dr)
    host = bt.gpu(e, max_t_kv=340)
    dev = bt.gpu(e, t_kv=e.to_device(np.array(t_kv, np.int32)), max_t_kv=340)
    np.testing.assert_array_equal(dev, host)
    close_per_seq(host, bt.cpu(), F32_REL if cache_dtype == "float32" else BF16_REL)


@pytest.mark.parametrize("cache_dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("gathered", [False, True], ids=["dense", "gathered"])
def test_rope_combine_of_many_splits_matches_cpu(cache_dtype, gathered):
    # One 64-row tile a split (KernelOptions(mla_split_tiles=1)): 150 rows make 3 splits, 700
    # make 11 (the combine's loop past 8), 1 row none.
    t_kv = [150, 300, 700, 1]
    H, R, dr = (32, 512, 64) if cache_dtype == "bfloat16" else (8, 128, 16)
    bt = Batch(t_kv, H, R, cache_dtype, seed=31, dr=dr)
    idx = random_lists(t_kv, 600, seed=4) if gathered else None
    eng = engine_with(mla_split_tiles=1)
    got = bt.gpu(eng, idx=idx)
    np.testing.assert_array_equal(bt.gpu(eng, idx=idx), got)
    close_per_seq(got, bt.cpu(idx=idx), BF16_REL if cache_dtype == "bfloat16" else F32_REL)


# ---------------------------------------------------------------- gathered


@pytest.mark.parametrize("cache_dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("B", [1, 3, 40])
@pytest.mark.parametrize("width", [40, 300])
def test_rope_gathered_matches_cpu(e, cache_dtype, B, width):
    t_kv = [0, 33, 4096] if B == 3 else pattern(B)
    H, R, dr = (32, 512, 64) if cache_dtype == "bfloat16" else (8, 200, 24)
    bt = Batch(t_kv, H, R, cache_dtype, seed=B + width, dr=dr)
    idx = random_lists(t_kv, width, seed=B * width)
    if B == 40:
        idx[5] = -1  # an all -1 list on an active row: zeros
    got = bt.gpu(e, idx=idx)
    close_per_seq(got, bt.cpu(idx=idx), F32_REL if cache_dtype == "float32" else BF16_REL)
    if cache_dtype == "bfloat16":
        close_per_seq(got, bt.cpu(idx=idx, q=bf16_round(bt.q), q_pe=bf16_round(bt.q_pe)),
                      BF16_QROUND_REL)
    if B == 40:
        np.testing.assert_array_equal(got[5], np.zeros((H, R), np.float32))


# ---------------------------------------------------------------- errors, sanitizer


def test_rope_errors(e):
    bt = Batch([3, 5], 4, 128, "float32", seed=71, dr=16)
    D = e.to_device
    q, caches, s = D(bt.q), bt.caches(e), bt.scale
    f = _core.mla_attn_decode
    expect(memra.ContractError, ST.CONTRACT_MISSING, f, q, caches, [3, 5], scale=s, engine=e)
    expect(memra.ContractError, ST.CONTRACT_SHAPE, f, q, caches, [3, 5], q_pe=D(np.ascontiguousarray(bt.q_pe[:, :, :8])),
           scale=s, engine=e)
    expect(memra.ContractError, ST.CONTRACT_SHAPE, f, q, caches, [3, 5], q_pe=D(bt.q_pe[:1]),
           scale=s, engine=e)
    expect(memra.ContractError, ST.CONTRACT_DEVICE, f, q, caches, [3, 5], q_pe=bt.q_pe, scale=s,
           engine=e)
    # Still usable.
    close_per_seq(bt.gpu(e), bt.cpu(), F32_REL)


def test_sanitizer_rope_small_shapes(e):
    """One call of each rope kernel on small shapes (compute-sanitizer runs): tensor cores (one
    split and several + combine, gathered), the f32 kernel on both cache dtypes, idle rows."""
    for cache_dtype, H, R, dr in (("bfloat16", 4, 128, 64), ("float32", 3, 40, 8),
                                  ("bfloat16", 3, 40, 8)):
        t_kv = [200, 0, 1, 65]
        bt = Batch(t_kv, H, R, cache_dtype, seed=H + R, dr=dr)
        bt.gpu(e)
        bt.gpu(e, idx=random_lists(t_kv, 70, seed=H))
        bt.gpu(e, t_kv=e.to_device(np.array(t_kv, np.int32)), max_t_kv=200)
        bt.gpu(engine_with(mla_split_tiles=1))
    e.synchronize()


# ---------------------------------------------------------------- the layer at Kimi's widths

KIMI = dict(hidden=256, heads=32, kv_rank=512, d_nope=128, d_rope=64, d_v=128, rms_eps=1e-6)
LAYER_TOL = {"float32": 2e-5, "bfloat16": 3e-2}


def kimi_weights(dtype: str, q_lora_rank: int) -> dict:
    g = rng(97 + q_lora_rank)
    Dm, H, R, dn, dr, dv = 256, 32, 512, 128, 64, 128

    def w(*shape, s=None):
        return f32(g.standard_normal(shape) * (s if s is not None else shape[-1] ** -0.5))

    arrays = {
        "kv_a_proj_with_mqa.weight": w(R + dr, Dm), "kv_a_layernorm.weight": f32(1.0 + w(R, s=0.2)),
        "kv_b_proj.weight": w(H * (dn + dv), R), "o_proj.weight": w(Dm, H * dv),
    }
    if q_lora_rank:
        arrays.update({"q_a_proj.weight": w(q_lora_rank, Dm),
                       "q_a_layernorm.weight": f32(1.0 + w(q_lora_rank, s=0.2)),
                       "q_b_proj.weight": w(H * (dn + dr), q_lora_rank)})
    else:
        arrays["q_proj.weight"] = w(H * (dn + dr), Dm)
    vectors = {"kv_a_layernorm.weight", "q_a_layernorm.weight"}
    return {n: bf16_weight(a) if dtype == "bfloat16" and n not in vectors else _core.Weight(a)
            for n, a in arrays.items()}


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("q_lora_rank", [0, 96], ids=["q_proj", "q_lora"])
def test_layer_at_kimi_widths_matches_cpu(e, dtype, q_lora_rank):
    """MlaLayer(rotate=False) on CUDA against the CPU layer: prefills of 70 and 3 rows (the
    strided latent norm, the one-sequence attention with q_pe), batched decode steps over device
    slots with an idle row (the rope decode kernels: f32, and with a bf16 cache the tensor-core
    one), then one-row steps (B = 1: the unfused prologue, the fused q | kv_a GEMV); outputs and
    cache rows [latent | k_pe]."""
    g = rng(41)
    xp = {0: f32(g.standard_normal((70, 256))), 2: f32(g.standard_normal((3, 256)))}
    xd = [f32(g.standard_normal((3, 256))) for _ in range(3)]
    x1 = [f32(g.standard_normal((1, 256))) for _ in range(2)]
    res = {}
    for name, engine in (("cpu", memra.Engine("cpu")), ("gpu", e)):
        on_gpu = name == "gpu"
        host = engine.to_host if on_gpu else (lambda a: a)
        dev = engine.to_device if on_gpu else (lambda a: a)
        layer = _core.MlaLayer(engine, kimi_weights(dtype, q_lora_rank), **KIMI,
                               q_lora_rank=q_lora_rank, dtype=dtype)
        # bf16 on the GPU: a bf16 latent cache (the tensor-core rope kernel); the CPU's is f32.
        cdt = "bfloat16" if on_gpu and dtype == "bfloat16" else "float32"
        cache = memra.Cache(engine, [layer.state_spec()], max_batch=3, max_len=80, latent_dtype=cdt)
        outs = []
        for slot, x in xp.items():
            outs.append(host(layer.prefill(cache, 0, slot, dev(x))[0]))
            cache.commit(slot, len(x))
        steps = [(x, [2, 0]) for x in xd] + [(x, [2]) for x in x1]
        for x, slots in steps:
            if on_gpu:
                ds = _core.DecodeSlots(cache, len(x))
                ds.set(np.array(slots, np.int32))
                y = host(layer.decode(cache, 0, ds, dev(x))[0])
                assert np.isfinite(y).all()
                if len(x) > len(slots):
                    assert not y[len(slots):].any(), "an idle row's output is not zero"
                cache.commit_decode(ds)
                for s in slots:
                    cache.commit_host(s, 1)
            else:
                y = layer.decode(cache, 0, np.array(slots, np.int32), x[:len(slots)])[0]
                for s in slots:
                    cache.commit(s, 1)
            outs.append(y[:len(slots)])
        rows = [np.asarray(cache.latent_rows(0, s), np.float32) for s in (0, 2)]
        res[name] = (outs, rows)
    for i, (a, b) in enumerate(zip(res["gpu"][0], res["cpu"][0])):
        try:
            close_scaled(a, b, LAYER_TOL[dtype])
        except AssertionError as err:
            raise AssertionError(f"output {i}: {err}") from None
    for a, b in zip(res["gpu"][1], res["cpu"][1]):
        close_scaled(a, b, 1e-5 if dtype == "float32" else LAYER_TOL[dtype])
