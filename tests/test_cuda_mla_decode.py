"""Batched MLA decode on the CUDA backend (``memra._core.mla_attn_decode`` /
``mla_latent_append_decode`` with ``engine=memra.Engine("cuda")``, kernels in cuda/mla_decode.cu)
against the CPU oracle (the same binding without an engine: cpu::mla_attn_absorbed /
mla_attn_gathered per sequence, cpp/src/cpu/mla.cpp) and the per-sequence CUDA ops.

Tolerances (``close_per_seq``: |got - want| <= rel * max|want| for each sequence separately,
so short and long sequences are each held to their own scale):
- float32 cache (exact f32 CUDA-core kernel): the CPU's dot products and softmax up to FMA
  contraction, expf's last ulp, the order of the online rescaling (tiles of 32 rows) and the
  split merge; the sequential f32 sums over up to 4096 rows differ by ~1e-6 of max|o|:
  rel = 2e-5 against the CPU and against the per-sequence CUDA ops.
- bfloat16 cache with R in {128, 256, 512} (tensor cores): q_lat is rounded to bf16 (2^-9
  relative per element), so a score moves by ~2^-9 * scale * sqrt(sum (q c)^2) ~ 2e-3 at scores
  of std 2 (the inputs below), i.e. each softmax weight by ~0.2 % relative; p is rounded to bf16
  (another 2^-9 relative per weight; the sums use the rounded p, so o stays a convex combination
  of the rows). The output moves by the weight errors times |c - o|: a float64 emulation of
  exactly these roundings on the inputs below gives 2.7e-3..6.2e-3 of max|o| against the CPU on
  the same bf16 cache (worst: 64 short gathered lists of 64 heads x 512) and 0.9e-3..1.3e-3
  against the CPU on the bf16-rounded q (p rounding and accumulation order only). Limits:
  rel = 1e-2 and rel = 5e-3.
- bfloat16 cache with another R: the exact f32 kernel on widened bf16 rows: rel = 2e-5 against
  the CPU on the same cache.
- one visible row (t_kv = 1, or a list naming one row): p = 1, o = that row exactly, both paths.
- idle rows (t_kv = 0) and empty lists: exact zeros; the other rows' bytes are unchanged by
  making rows idle (the launch plan depends on B, H, R, width and max_t_kv only).
- latent append: a copy, bf16 by round-to-nearest-even: ``np.array_equal`` on the bits.

Rows of a cache past t_kv hold NaN: a kernel that reads them produces NaN.

Benchmark call (B = 64, L = 4096 or B = 8, L = 32768; 64 heads, rank 512, bf16 caches):
``_core.mla_attn_decode(q_lat, caches, t_kv_dev, scale=s, max_t_kv=L, engine=e)`` with q_lat a
device float32 [B, 64, 512], caches a list of B device bfloat16 [L, 512] arrays (or one device
array [B, L, 512]: one DLPack import instead of B) and t_kv_dev a device int32 [B] array (a host
list works too, at the cost of one small upload per call).

A small shape for ``compute-sanitizer --tool racecheck`` / ``memcheck``:
``python -m pytest tests/test_cuda_mla_decode.py -k sanitizer``.

The sm_90a wgmma arm (cuda/mla_decode_sm90.cu) has its tests in
tests/test_cuda_mla_decode_sm90.py.
"""

from __future__ import annotations

import numpy as np
import pytest

import memra
from memra import _core
from cuda_helpers import bf16_bits, bf16_round, engine_with, expect, f32, rng
from mla_decode_batch import (BF16_QROUND_REL, BF16_REL, F32_REL, Batch, close_per_seq, pattern,
                              random_lists)

pytestmark = pytest.mark.cuda

ST = _core.status


def filtered(idx, t_kv):
    """The lists as the per-sequence ops take them (entries outside [0, t_kv) set to -1)."""
    out = idx.copy()
    for b, t in enumerate(t_kv):
        out[b][(out[b] < 0) | (out[b] >= t)] = -1
    return out


# ---------------------------------------------------------------- dense


@pytest.mark.parametrize("B", [1, 3, 64])
@pytest.mark.parametrize("H,R", [(8, 512), (5, 200)], ids=["h8_r512", "odd_h5_r200"])
def test_dense_f32_matches_cpu_and_per_sequence(e, B, H, R):
    bt = Batch(pattern(B), H, R, "float32", seed=B + R)
    got = bt.gpu(e)
    close_per_seq(got, bt.cpu(), F32_REL)
    for b in range(B):  # the per-sequence CUDA op on the visible rows
        one = e.to_host(_core.mla_attn_absorbed(e.to_device(bt.q[b:b + 1]), e.to_device(bt.rows[b]),
                                                scale=bt.scale, engine=e))
        close_per_seq(got[b:b + 1], one, F32_REL)
    np.testing.assert_array_equal(got[0], np.broadcast_to(bt.rows[0][0], (H, R)))  # t_kv = 1


@pytest.mark.parametrize("B,H,R", [
    (1, 64, 512), (3, 64, 512), (64, 64, 512),  # GLM-5.3-Flash: 4 m-tiles, one head group
    (1, 16, 128), (3, 16, 128),                 # 2 m-tiles
    (3, 80, 256),                               # two head groups (64 + 16)
    (3, 5, 512),                                # 5 heads padded to 32
])
def test_dense_bf16_tensor_cores_match_cpu(e, B, H, R):
    bt = Batch(pattern(B), H, R, "bfloat16", seed=B * 3 + H)
    got = bt.gpu(e)
    close_per_seq(got, bt.cpu(), BF16_REL)
    close_per_seq(got, bt.cpu(q=bf16_round(bt.q)), BF16_QROUND_REL)
    np.testing.assert_array_equal(got[0], np.broadcast_to(bt.rows[0][0], (H, R)))  # t_kv = 1
    for b in range(min(B, 4)):  # the per-sequence CUDA op (f32 CUDA cores) on the same rows
        one = e.to_host(_core.mla_attn_absorbed(e.to_device(bt.q[b:b + 1]),
                                                e.to_device(bt.host[b][:bt.t_kv[b]]),
                                                scale=bt.scale, engine=e))
        close_per_seq(got[b:b + 1], one, BF16_REL)


def test_dense_bf16_long_sequences(e):
    """B = 2 at 32768 rows (many splits, the combine over them) and one short row."""
    bt = Batch([32768, 9], 64, 512, "bfloat16", seed=5)
    got = bt.gpu(e)
    close_per_seq(got, bt.cpu(), BF16_REL)
    close_per_seq(got, bt.cpu(q=bf16_round(bt.q)), BF16_QROUND_REL)


def test_dense_bf16_other_rank_runs_exact_f32(e):
    """bf16 rows with R outside {128, 256, 512}: the f32 CUDA-core kernel on widened rows."""
    bt = Batch([1, 40, 300], 6, 96, "bfloat16", seed=8)
    close_per_seq(bt.gpu(e), bt.cpu(), F32_REL)


def test_peaked_scores_are_finite(e):
    """Scores ~ +-500: exp underflows for all but the max row; no NaN, one row wins."""
    for dtype, rel in (("float32", F32_REL), ("bfloat16", BF16_REL)):
        bt = Batch([150, 70, 1], 16, 128, dtype, seed=13)
        q = f32(bt.q * 250)
        got = bt.gpu(e, q=q)
        close_per_seq(got, bt.cpu(q=q), rel)


# ---------------------------------------------------------------- idle rows, device t_kv


@pytest.mark.parametrize("cache_dtype,H,R", [("float32", 8, 128), ("bfloat16", 64, 512)])
def test_idle_rows_are_zero_and_change_nothing(e, cache_dtype, H, R):
    t_kv = pattern(12)
    bt = Batch(t_kv, H, R, cache_dtype, seed=21)
    base = bt.gpu(e, max_t_kv=4096)
    idle = [1, 4, 7, 10]
    t_idle = [0 if b in idle else t for b, t in enumerate(t_kv)]
    q = bt.q.copy()
    q[idle] = np.nan  # nothing of an idle row is read, its query included
    got = bt.gpu(e, t_kv=t_idle, q=q, max_t_kv=4096)
    for b in range(len(t_kv)):
        if b in idle:
            np.testing.assert_array_equal(got[b], np.zeros((H, R), np.float32))
        else:
            np.testing.assert_array_equal(got[b], base[b])
    # Every row idle: zeros.
    allidle = bt.gpu(e, t_kv=[0] * len(t_kv), q=q)
    np.testing.assert_array_equal(allidle, np.zeros_like(allidle))


@pytest.mark.parametrize("cache_dtype", ["float32", "bfloat16"])
def test_device_t_kv_equals_host_t_kv(e, cache_dtype):
    """t_kv on the device (a graph-replay step): the same bytes as host t_kv at the same
    max_t_kv; another set of positions under the same bound still matches the CPU."""
    t_kv = [300, 1, 0, 77, 129]
    bt = Batch(t_kv, 16, 256, cache_dtype, seed=31, slack=40)
    host = bt.gpu(e, max_t_kv=340)
    dev = bt.gpu(e, t_kv=e.to_device(np.array(t_kv, np.int32)), max_t_kv=340)
    np.testing.assert_array_equal(dev, host)
    rel = F32_REL if cache_dtype == "float32" else BF16_REL
    close_per_seq(host, bt.cpu(), rel)
    moved = [301, 2, 1, 78, 130]  # one step later: rows t_kv .. t_kv + 1 now visible
    bt2 = Batch(moved, 16, 256, cache_dtype, seed=32, slack=39)
    dev2 = bt2.gpu(e, t_kv=e.to_device(np.array(moved, np.int32)), max_t_kv=340)
    close_per_seq(dev2, bt2.cpu(), rel)


def test_device_t_kv_default_bound_is_cache_length(e):
    t_kv = [5, 60]
    bt = Batch(t_kv, 4, 128, "bfloat16", seed=33)
    got = bt.gpu(e, t_kv=e.to_device(np.array(t_kv, np.int32)))  # max_t_kv = max L_b
    close_per_seq(got, bt.cpu(), BF16_REL)


@pytest.mark.parametrize("cache_dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("gathered", [False, True], ids=["dense", "gathered"])
def test_combine_of_many_splits_matches_cpu(cache_dtype, gathered):
    # The combine loads every partial of a sequence at once up to 8 splits (the batch-1 step's
    # case) and loops over them past that. One 64-row tile a split (an engine made with
    # KernelOptions(mla_split_tiles=1), the mma.sync / f32 kernels): 150 rows make 3 splits, 300
    # make 5, 700 make 11 (the loop), 1 row none.
    t_kv = [150, 300, 700, 1]
    H, R = (64, 512) if cache_dtype == "bfloat16" else (8, 512)
    bt = Batch(t_kv, H, R, cache_dtype, seed=31)
    idx = random_lists(t_kv, 600, seed=4) if gathered else None
    eng = engine_with(mla_decode_variant=0, mla_split_tiles=1)
    got = bt.gpu(eng, idx=idx)
    np.testing.assert_array_equal(bt.gpu(eng, idx=idx), got)
    close_per_seq(got, bt.cpu(idx=idx), BF16_REL if cache_dtype == "bfloat16" else F32_REL)


# ---------------------------------------------------------------- gathered


@pytest.mark.parametrize("B", [1, 3, 40])
def test_tensor_core_heads_per_block_both_match_cpu(B):
    # cuda/mla_decode.cu puts 32 heads in a block below 32 sequences and 64 from there on
    # (KernelOptions.mla_tc_mt forces either). The softmax sums are split over 8 / MT row groups, and the
    # split count's cost model counts blocks, so the two may split the rows differently (p is
    # rounded to bf16 against each split's running max: ~1e-3 apart at B = 1); each must match
    # the CPU, dense and gathered.
    t_kv = [150, 33, 600][:B] if B <= 3 else pattern(B)
    bt = Batch(t_kv, 64, 512, "bfloat16", seed=B + 77)
    idx = random_lists(t_kv, 300, seed=B)
    got = {}
    for mt in (2, 4):
        eng = engine_with(mla_decode_variant=0, mla_tc_mt=mt)
        got[mt] = (bt.gpu(eng), bt.gpu(eng, idx=idx))
        close_per_seq(got[mt][0], bt.cpu(), BF16_REL)
        close_per_seq(got[mt][1], bt.cpu(idx=idx), BF16_REL)
    for a, b in zip(got[2], got[4]):
        close_per_seq(a, b, BF16_REL)


@pytest.mark.parametrize("cache_dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("B", [1, 3, 64])
@pytest.mark.parametrize("width", [40, 300])
def test_gathered_matches_cpu_and_per_sequence(e, cache_dtype, B, width):
    t_kv = pattern(B)
    if B == 3:
        t_kv = [0, 33, 4096]
    H, R = (64, 512) if cache_dtype == "bfloat16" else (8, 512)
    bt = Batch(t_kv, H, R, cache_dtype, seed=B + width)
    idx = random_lists(t_kv, width, seed=B * width)
    if B == 64:
        idx[5] = -1  # an all -1 list on an active row
    got = bt.gpu(e, idx=idx)
    want = bt.cpu(idx=idx)
    rel = F32_REL if cache_dtype == "float32" else BF16_REL
    close_per_seq(got, want, rel)
    if cache_dtype == "bfloat16":
        close_per_seq(got, bt.cpu(idx=idx, q=bf16_round(bt.q)), BF16_QROUND_REL)
    fl = filtered(idx, t_kv)
    for b in range(B):
        if t_kv[b] == 0 or (fl[b] < 0).all():
            np.testing.assert_array_equal(got[b], np.zeros((H, R), np.float32))
            continue
        if b >= 4 and B == 64 and b != 5:
            continue
        one = e.to_host(_core.mla_attn_gathered(e.to_device(bt.q[b:b + 1]),
                                                e.to_device(bt.host[b][:t_kv[b]]),
                                                e.to_device(fl[b:b + 1]), scale=bt.scale, engine=e))
        close_per_seq(got[b:b + 1], one, rel)


@pytest.mark.parametrize("cache_dtype", ["float32", "bfloat16"])
def test_gathered_edge_lists(e, cache_dtype):
    """All -1, one valid entry at the end / listed three times, every row many times, the full
    causal list (equals the dense call)."""
    t_kv = [50, 50, 50, 50, 50, 200]
    H, R = 16, 128
    bt = Batch(t_kv, H, R, cache_dtype, seed=41)
    width = 210
    idx = np.full((6, width), -1, np.int32)
    idx[1, -1] = 3
    idx[2, [40, 45, 209]] = 10
    idx[3, :] = np.arange(width) % 50
    idx[4, :60] = np.arange(60)  # 50..59 are past t_kv: skipped
    idx[5, :200] = rng(3).permutation(200)
    got = bt.gpu(e, idx=idx)
    rel = F32_REL if cache_dtype == "float32" else BF16_REL
    close_per_seq(got, bt.cpu(idx=idx), rel)
    np.testing.assert_array_equal(got[0], np.zeros((H, R), np.float32))
    np.testing.assert_array_equal(got[1], np.broadcast_to(bt.rows[1][3], (H, R)))
    np.testing.assert_array_equal(got[2], np.broadcast_to(bt.rows[2][10], (H, R)))
    # Full lists: the same rows in the same order through the same kernel and launch plan
    # (max rows = min(width, max_t_kv) = 200 both ways): the dense call's bytes.
    dense = bt.gpu(e)
    np.testing.assert_array_equal(got[3:], dense[3:])
    # A zero-width list: zeros.
    empty = bt.gpu(e, idx=np.zeros((6, 0), np.int32))
    np.testing.assert_array_equal(empty, np.zeros_like(empty))


# ---------------------------------------------------------------- latent append


@pytest.mark.parametrize("cache_dtype", ["float32", "bfloat16"])
def test_latent_append_decode(e, cache_dtype):
    B, W = 5, 96
    r = rng(51)
    lens = [4, 9, 1, 30, 6]
    pos = [0, 8, -1, 17, 5]
    rows = f32(r.standard_normal((B, W)) * 3)
    init = [f32(r.standard_normal((n, W))) for n in lens]
    host = [bf16_bits(c) if cache_dtype == "bfloat16" else c for c in init]
    dev = [e.to_device(c) for c in host]
    assert _core.mla_latent_append_decode(e.to_device(rows), dev, pos, engine=e) is None
    want_rows = bf16_bits(rows) if cache_dtype == "bfloat16" else rows
    for b in range(B):
        want = host[b].copy()
        if pos[b] >= 0:
            want[pos[b]] = want_rows[b]
        np.testing.assert_array_equal(e.to_host(dev[b]), want)
    # Device positions (idle rows included) give the same bytes.
    dev2 = [e.to_device(c) for c in host]
    _core.mla_latent_append_decode(e.to_device(rows), dev2, e.to_device(np.array(pos, np.int32)),
                                   engine=e)
    for b in range(B):
        np.testing.assert_array_equal(e.to_host(dev2[b]), e.to_host(dev[b]))
    # The CPU path writes host f32 caches in place.
    if cache_dtype == "float32":
        cpu = [c.copy() for c in init]
        _core.mla_latent_append_decode(rows, cpu, pos)
        for b in range(B):
            want = init[b].copy()
            if pos[b] >= 0:
                want[pos[b]] = rows[b]
            np.testing.assert_array_equal(cpu[b], want)


def test_append_then_decode_chain(e):
    """append_decode at t_kv - 1, then decode over [0, t_kv): the appended row is seen."""
    H, R = 16, 512
    t_kv = [1, 20, 0, 65]
    bt = Batch(t_kv, H, R, "bfloat16", seed=61)
    dev = bt.caches(e)
    new = f32(rng(62).standard_normal((4, R)))
    pos = [t - 1 for t in t_kv]  # -1 for the idle row
    _core.mla_latent_append_decode(e.to_device(new), dev, pos, engine=e)
    got = e.to_host(_core.mla_attn_decode(e.to_device(bt.q), dev, t_kv, scale=bt.scale, engine=e))
    cpu = bt.cpu_caches()
    for b, t in enumerate(t_kv):
        if t > 0:
            cpu[b][t - 1] = bf16_round(new[b:b + 1])[0]
    want = _core.mla_attn_decode(bt.q, cpu, t_kv, scale=bt.scale)
    close_per_seq(got, want, BF16_REL)
    np.testing.assert_array_equal(got[0], np.broadcast_to(cpu[0][0], (H, R)))


def test_one_array_of_caches_equals_the_list(e):
    """caches as one device array [B, L, W] gives the list form's bytes (the wgmma arm at 64 heads x
    512, and the append); a bf16 array whose sequences would start off a 16-byte boundary is
    CONTRACT_STRIDE."""
    B, H, R, L = 6, 64, 512, 200
    bt = Batch([L - 5] * B, H, R, "bfloat16", seed=91)  # rows past t_kv are NaN
    stack = np.ascontiguousarray(np.stack(bt.host))
    t_kv = [1, 7, 0, 150, 195, 64]
    q = e.to_device(bt.q)
    want = e.to_host(_core.mla_attn_decode(q, bt.caches(e), t_kv, scale=bt.scale, engine=e))
    dev = e.to_device(stack)
    got = e.to_host(_core.mla_attn_decode(q, dev, t_kv, scale=bt.scale, engine=e))
    np.testing.assert_array_equal(got, want)
    rows = f32(rng(92).standard_normal((B, R)))
    pos = [0, 3, -1, 199, 10, 64]
    as_list = bt.caches(e)
    _core.mla_latent_append_decode(e.to_device(rows), as_list, pos, engine=e)
    _core.mla_latent_append_decode(e.to_device(rows), dev, pos, engine=e)
    np.testing.assert_array_equal(e.to_host(dev), np.stack([e.to_host(c) for c in as_list]))
    odd = e.to_device(bf16_bits(np.zeros((2, 3, 100), np.float32)))  # 600-byte sequences
    expect(memra.ContractError, ST.CONTRACT_STRIDE, _core.mla_attn_decode,
           e.to_device(f32(np.zeros((2, 4, 100)))), odd, [1, 1], scale=0.5, engine=e)


# ---------------------------------------------------------------- errors


def test_errors(e):
    bt = Batch([3, 5], 4, 128, "float32", seed=71)
    D = e.to_device
    q = D(bt.q)
    caches = bt.caches(e)
    s = bt.scale
    f = _core.mla_attn_decode
    expect(memra.ContractError, ST.CONTRACT_SHAPE, f, q, caches[:1], [3, 5], scale=s, engine=e)
    expect(memra.ContractError, ST.CONTRACT_SHAPE, f, q, caches, [3], scale=s, engine=e)
    expect(memra.ContractError, ST.CONTRACT_RANGE, f, q, bt.caches(e), [3, 11], scale=s, engine=e)
    expect(memra.ContractError, ST.CONTRACT_RANGE, f, q, bt.caches(e), [-1, 5], scale=s, engine=e)
    expect(memra.ContractError, ST.CONTRACT_VALUE, f, q, bt.caches(e), [3, 5], scale=s, max_t_kv=4,
           engine=e)
    expect(memra.ContractError, ST.CONTRACT_VALUE, f, q, bt.caches(e), [3, 5], scale=float("nan"),
           engine=e)
    mixed = [D(bt.host[0]), D(bf16_bits(bt.host[1]))]
    expect(memra.ContractError, ST.CONTRACT_DTYPE, f, q, mixed, [3, 5], scale=s, engine=e)
    wide = [D(f32(np.zeros((4, 130)))), D(f32(np.zeros((6, 130))))]  # rope columns need q_pe
    expect(memra.ContractError, ST.CONTRACT_MISSING, f, q, wide, [3, 5], scale=s, engine=e)
    narrow = [D(f32(np.zeros((4, 100)))), D(f32(np.zeros((6, 100))))]
    expect(memra.ContractError, ST.CONTRACT_SHAPE, f, q, narrow, [3, 5], scale=s, engine=e)
    expect(memra.ContractError, ST.CONTRACT_DEVICE, f, q, [bt.host[0], bt.host[1]], [3, 5], scale=s,
           engine=e)
    expect(memra.ContractError, ST.CONTRACT_DTYPE, f, q, bt.caches(e),
           D(np.array([3, 5], np.int64)), scale=s, engine=e)
    expect(memra.ContractError, ST.CONTRACT_DTYPE, f, q, bt.caches(e), [3, 5],
           idx=D(np.zeros((2, 4), np.int64)), scale=s, engine=e)
    expect(memra.ContractError, ST.CONTRACT_SHAPE, f, q, bt.caches(e), [3, 5],
           idx=D(np.zeros((3, 4), np.int32)), scale=s, engine=e)
    # The CPU backend takes host t_kv only.
    expect(memra.ContractError, ST.CONTRACT_DEVICE, f, bt.q, bt.cpu_caches(),
           D(np.array([3, 5], np.int32)), scale=s)
    rows = D(f32(np.ones((2, 128))))
    expect(memra.ContractError, ST.CONTRACT_RANGE, _core.mla_latent_append_decode, rows,
           bt.caches(e), [0, 10], engine=e)
    expect(memra.ContractError, ST.CONTRACT_SHAPE, _core.mla_latent_append_decode,
           D(f32(np.ones((2, 64)))), bt.caches(e), [0, 1], engine=e)
    # Still usable.
    close_per_seq(bt.gpu(e), bt.cpu(), F32_REL)


# ---------------------------------------------------------------- sanitizer


def test_sanitizer_small_shapes(e):
    """One call of every entry point and kernel on small shapes (compute-sanitizer runs):
    tensor cores (2 and 4 m-tiles, splits + combine, gathered), the f32 kernel, idle rows,
    the batched append."""
    for cache_dtype, H, R in (("bfloat16", 4, 128), ("bfloat16", 40, 128), ("float32", 3, 40)):
        t_kv = [200, 0, 1, 65]
        bt = Batch(t_kv, H, R, cache_dtype, seed=H + R)
        idx = random_lists(t_kv, 70, seed=H)
        bt.gpu(e)
        bt.gpu(e, idx=idx)
        bt.gpu(e, t_kv=e.to_device(np.array(t_kv, np.int32)), max_t_kv=200)
        dev = bt.caches(e)
        _core.mla_latent_append_decode(e.to_device(f32(np.ones((4, R)))), dev, [3, -1, 0, 64],
                                       engine=e)
    e.synchronize()


# ---------------------------------------------------------------- wgmma arm (mla_decode_sm90.cu)
