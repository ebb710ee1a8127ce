"""The fused launches of the layers' CUDA paths (marked cuda): ``memra._core.linear_ex`` (a GEMM over
a column block of wider rows, or over rows already in the weight's dtype) against numpy / the CPU
op, and KdaLayer / MlaLayer prefill + decode against the CPU layers.

What these would catch:
- linear_ex: a wrong row stride, column offset or rounding path (the strided round kernel is used
  for f32 rows against a bf16 weight at T > 1);
- KdaLayer: the fused q|k|v GEMM and the one conv launch over 3*qkv channels writing q, k, v as
  three [N, qkv] tensors (group width qkv), the one-launch L2 norm of q and k, the fused f_a|g_a
  GEMM read back as two column blocks, the decode's planes resolved from the device slots, the
  gated norm inside the scan: any layout slip gives O(1) errors in y or in the cache planes, far
  above the tolerances below;
- MlaLayer: x rounded once for q_a, kv_a and the indexer's wk, kpool_gate, weights_proj.

Tolerances (|got - want| <= rel * max|want|): float32 1e-4 (cuBLAS vs the CPU's ascending sums
and CUDA's expf, ~1e-6 expected); bfloat16 3e-2 (the CPU layer holds the same bf16 weights but
keeps every activation in f32, the GPU rounds each GEMM input to bf16: ~2^-9 per rounding).
Idle decode rows and slots outside the batch must leave their planes untouched bit for bit, and
two identical runs must give identical bytes (no atomics in any sum).
"""

from __future__ import annotations

import numpy as np
import pytest

import memra
from memra import _core
from cuda_helpers import bf16_bits, bf16_round, bf16_weight, close_scaled, expect, f32, rng

pytestmark = pytest.mark.cuda

ST = _core.status
TOL = {"float32": 1e-4, "bfloat16": 3e-2}


# ---------------------------------------------------------------- linear_ex


@pytest.mark.parametrize("T", [1, 5, 64])
@pytest.mark.parametrize("wdtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("with_bias", [False, True])
def test_linear_ex_column_block_of_f32_rows(e, T, wdtype, with_bias):
    K, N, L, col0 = 40, 24, 100, 13
    g = rng(T * 7 + len(wdtype))
    x, w, b = f32(g.standard_normal((T, L))), f32(g.standard_normal((N, K))), f32(g.standard_normal(N))
    dw = memra.DeviceWeight(e, _core.Weight(w), dtype=wdtype)
    got = e.to_host(_core.linear_ex(e.to_device(x), dw, e.to_device(b) if with_bias else None,
                                    col0=col0, engine=e))
    xs = f32(x[:, col0:col0 + K])
    bias = b if with_bias else None
    if wdtype == "float32":
        close_scaled(got, _core.linear(xs, _core.Weight(w), bias), 1e-5)
    else:  # f32 rows rounded to bf16 (strided round at T > 1), then the bf16 GEMM
        close_scaled(got, _core.linear(bf16_round(xs), bf16_weight(w), bias), 1e-4)


@pytest.mark.parametrize("T", [1, 7, 65])
def test_linear_ex_bf16_rows_read_in_place(e, T):
    K, N, L, col0 = 128, 33, 256, 128  # the second block of a fused [T, 2 * 128] output
    g = rng(100 + T)
    x, w = f32(g.standard_normal((T, L))), f32(g.standard_normal((N, K)))
    dw = memra.DeviceWeight(e, _core.Weight(w), dtype="bfloat16")
    got = e.to_host(_core.linear_ex(e.to_device(bf16_bits(x)), dw, col0=col0, engine=e))
    close_scaled(got, _core.linear(bf16_round(x[:, col0:col0 + K]), bf16_weight(w)), 1e-4)
    # The first block of the same rows.
    got0 = e.to_host(_core.linear_ex(e.to_device(bf16_bits(x)), dw, engine=e))
    close_scaled(got0, _core.linear(bf16_round(x[:, :K]), bf16_weight(w)), 1e-4)


@pytest.mark.parametrize("wdtype", ["float32", "bfloat16"])
def test_linear_ex_on_packed_f32_rows_equals_linear_bytes(e, wdtype):
    # linear is linear_ex over packed f32 rows: the same rounding and the same GEMM call.
    g = rng(5)
    x, w, b = f32(g.standard_normal((9, 64))), f32(g.standard_normal((48, 64))), f32(g.standard_normal(48))
    dw = memra.DeviceWeight(e, _core.Weight(w), dtype=wdtype)
    a = e.to_host(_core.linear(e.to_device(x), dw, e.to_device(b), engine=e))
    c = e.to_host(_core.linear_ex(e.to_device(x), dw, e.to_device(b), engine=e))
    assert np.array_equal(a, c)


def test_linear_ex_contract(e):
    g = rng(9)
    w = f32(g.standard_normal((8, 16)))
    d32 = memra.DeviceWeight(e, _core.Weight(w), dtype="float32")
    d16 = memra.DeviceWeight(e, _core.Weight(w), dtype="bfloat16")
    x = f32(g.standard_normal((3, 20)))
    # bf16 rows against an f32 weight, f16 rows against a bf16 weight: no such GEMM.
    expect(memra.ContractError, ST.CONTRACT_DTYPE, _core.linear_ex, e.to_device(bf16_bits(x)), d32,
           engine=e)
    expect(memra.ContractError, ST.CONTRACT_DTYPE, _core.linear_ex,
           e.to_device(x.astype(np.float16)), d16, engine=e)
    expect(memra.ContractError, ST.CONTRACT_DTYPE, _core.linear_ex,
           e.to_device(x.astype(np.float64)), d32, engine=e)
    # Columns past the row, negative offset, host rows, no CUDA engine.
    expect(memra.ContractError, ST.CONTRACT_SHAPE, _core.linear_ex, e.to_device(x), d32, col0=5,
           engine=e)
    expect(memra.ContractError, ST.CONTRACT_SHAPE, _core.linear_ex, e.to_device(x), d32, col0=-1,
           engine=e)
    expect(memra.ContractError, ST.CONTRACT_DEVICE, _core.linear_ex, x, d32, engine=e)
    with pytest.raises(memra.UnsupportedError):
        _core.linear_ex(x, _core.Weight(w))
    # Zero rows: an empty result; the engine stays usable.
    got = e.to_host(_core.linear_ex(e.to_device(np.zeros((0, 20), np.float32)), d32, col0=4, engine=e))
    assert got.shape == (0, 8)
    got = e.to_host(_core.linear_ex(e.to_device(x), d32, col0=4, engine=e))
    close_scaled(got, _core.linear(f32(x[:, 4:]), _core.Weight(w)), 1e-5)


# ---------------------------------------------------------------- KdaLayer

D, H, DK, KCONV = 64, 2, 128, 4
QKV = H * DK


def kda_weights(dtype: str, seed: int = 0) -> dict:
    g = rng(seed)

    def w(*shape, s=0.1):
        return f32(g.standard_normal(shape) * s)

    arrays = {
        "q_proj.weight": w(QKV, D), "k_proj.weight": w(QKV, D), "v_proj.weight": w(QKV, D),
        "q_conv1d.weight": w(QKV, 1, KCONV, s=0.5), "k_conv1d.weight": w(QKV, 1, KCONV, s=0.5),
        "v_conv1d.weight": w(QKV, 1, KCONV, s=0.5),
        "f_a_proj.weight": w(DK, D), "f_b_proj.weight": w(QKV, DK, s=0.2), "dt_bias": w(QKV, s=1.0),
        "A_log": w(H, s=1.0), "b_proj.weight": w(H, D, s=0.3), "g_a_proj.weight": w(DK, D),
        "g_b_proj.weight": w(QKV, DK, s=0.2), "o_norm.weight": f32(1.0 + w(DK)),
        "o_proj.weight": w(D, QKV, s=0.05),
    }
    gemm = {"q_proj.weight", "k_proj.weight", "v_proj.weight", "f_a_proj.weight", "f_b_proj.weight",
            "b_proj.weight", "g_a_proj.weight", "g_b_proj.weight", "o_proj.weight"}
    # bf16: the CPU layer gets the same bf16 GEMM weights as the GPU holds (the conv taps, gate
    # parameters and norm weights stay f32 on both).
    return {n: bf16_weight(a) if dtype == "bfloat16" and n in gemm else _core.Weight(a)
            for n, a in arrays.items()}


def kda_layer(engine, dtype: str):
    return memra.KdaLayer(engine, kda_weights(dtype), hidden=D, heads=H, head_dim=DK,
                          conv_kernel=KCONV, dtype=dtype)


PROMPTS = {0: 7, 2: 20, 3: 5}  # slot -> prefill length (20 > the conv's 16-token chunk)


def kda_run(engine, dtype: str, xs: dict, steps: list) -> tuple[list, memra.Cache]:
    """Prefill the PROMPTS slots, then decode `steps` (each a list of slots, idle rows as -1 at
    the end): a CUDA engine runs the decode steps with device slots (memra.DecodeSlots of the
    step's size), the CPU backend over the active slots. Returns every output and the cache."""
    layer = kda_layer(engine, dtype)
    cache = memra.Cache(engine, [layer.state_spec()], max_batch=4, max_len=64)
    on_gpu = engine.is_cuda
    host = engine.to_host if on_gpu else (lambda a: a)
    dev = engine.to_device if on_gpu else (lambda a: a)
    outs = []
    for slot, T in PROMPTS.items():
        outs.append(host(layer.prefill(cache, 0, slot, dev(xs[("p", slot)]))))
        cache.commit(slot, T)
    for i, rows in enumerate(steps):
        active = [s for s in rows if s >= 0]
        x = xs[("d", i)][:len(rows)]
        if on_gpu and len(rows) > 1:
            ds = _core.DecodeSlots(cache, len(rows))
            ds.set(np.array(active, np.int32))
            y = host(layer.decode(cache, 0, ds, dev(x)))
            assert np.isfinite(y).all()
            outs.append(y[:len(active)])
            cache.commit_decode(ds)
            for s in active:
                cache.commit_host(s, 1)
        else:
            slots = np.array(active, np.int32)  # host slots (the GPU uploads them)
            outs.append(host(layer.decode(cache, 0, slots, dev(x[:len(active)]))))
            for s in active:
                cache.commit(s, 1)
    return outs, cache


def kda_inputs(steps: list) -> dict:
    g = rng(42)
    xs = {("p", s): f32(g.standard_normal((T, D))) for s, T in PROMPTS.items()}
    for i, rows in enumerate(steps):
        xs[("d", i)] = f32(g.standard_normal((len(rows), D)))
    return xs


STEPS = [[2], [2, 0, -1], [0, 2, -1], [0]]  # B = 1 host slots, B = 3 with an idle row, ...

# Decode: the conv and the scan resolve each row's planes from the device slots and the scan
# runs the gated norm (kda_conv / kda_scan with the SLOTS planes); at B = 1 the gates' f_b | g_b
# ride in the conv's launch (kda_conv's GEMV pair).


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_kda_layer_prefill_and_decode_match_cpu(e, dtype):
    xs = kda_inputs(STEPS)
    want, cpu_cache = kda_run(memra.Engine("cpu"), dtype, xs, STEPS)
    got, gpu_cache = kda_run(e, dtype, xs, STEPS)
    for i, (a, b) in enumerate(zip(got, want)):
        try:
            close_scaled(a, b, TOL[dtype])
        except AssertionError as err:
            raise AssertionError(f"output {i}: {err}") from None
    for s in range(4):
        assert gpu_cache.length(s) == cpu_cache.length(s) and gpu_cache.cur(s) == cpu_cache.cur(s)
        for name in ("kda_state", "kda_conv"):
            a, b = getattr(gpu_cache, name)(0, s), getattr(cpu_cache, name)(0, s)
            if s == 1:  # never used: still zeros
                assert not a.any(), name
            else:
                close_scaled(a, b, TOL[dtype])


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_kda_layer_idle_rows_and_other_slots_untouched(e, dtype):
    layer = kda_layer(e, dtype)
    cache = memra.Cache(e, [layer.state_spec()], max_batch=4, max_len=64)
    g = rng(3)
    for slot, T in PROMPTS.items():
        layer.prefill(cache, 0, slot, e.to_device(f32(g.standard_normal((T, D)))))
        cache.commit(slot, T)
    before = {s: (cache.kda_state(0, s), cache.kda_conv(0, s)) for s in (1, 3)}
    ds = _core.DecodeSlots(cache, 4)
    ds.set(np.array([2, 0], np.int32))  # rows 2, 0, idle, idle
    for _ in range(3):
        y = e.to_host(layer.decode(cache, 0, ds, e.to_device(f32(g.standard_normal((4, D))))))
        assert np.isfinite(y).all()
        cache.commit_decode(ds)
        cache.commit_host(2, 1)
        cache.commit_host(0, 1)
    for s, (st, cv) in before.items():
        assert np.array_equal(cache.kda_state(0, s), st) and np.array_equal(cache.kda_conv(0, s), cv)
    # A bucket of one idle row (the B = 1 forms: the conv with f_b | g_b in its launch) writes
    # no slot.
    every = {s: (cache.kda_state(0, s), cache.kda_conv(0, s)) for s in range(4)}
    one = _core.DecodeSlots(cache, 1)
    one.set(np.array([], np.int32))
    y = e.to_host(layer.decode(cache, 0, one, e.to_device(f32(g.standard_normal((1, D))))))
    assert np.isfinite(y).all()
    for s, (st, cv) in every.items():
        assert np.array_equal(cache.kda_state(0, s), st) and np.array_equal(cache.kda_conv(0, s), cv)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_kda_layer_run_to_run_bytes(e, dtype):
    xs = kda_inputs(STEPS)
    a, ca = kda_run(e, dtype, xs, STEPS)
    b, cb = kda_run(e, dtype, xs, STEPS)
    for x, y in zip(a, b):
        assert np.array_equal(x, y)
    for s in range(4):
        assert np.array_equal(ca.kda_state(0, s), cb.kda_state(0, s))
        assert np.array_equal(ca.kda_conv(0, s), cb.kda_conv(0, s))


def test_kda_layer_prefill_then_decode_equals_prefill_f32(e):
    # The fused conv's prefill and decode arms through the layer: prefill(T-1) + decode(1) ==
    # prefill(T) up to the GEMMs' shapes (cuBLAS may pick other kernels).
    g = rng(11)
    x = f32(g.standard_normal((9, D)))
    layer = kda_layer(e, "float32")
    whole = memra.Cache(e, [layer.state_spec()], max_batch=1, max_len=16)
    split = memra.Cache(e, [layer.state_spec()], max_batch=1, max_len=16)
    y_whole = e.to_host(layer.prefill(whole, 0, 0, e.to_device(x)))
    whole.commit(0, 9)
    layer.prefill(split, 0, 0, e.to_device(x[:8]))
    split.commit(0, 8)
    y_last = e.to_host(layer.decode(split, 0, np.array([0], np.int32), e.to_device(x[8:])))
    split.commit(0, 1)
    close_scaled(y_last, y_whole[8:], 1e-5)
    close_scaled(split.kda_state(0, 0), whole.kda_state(0, 0), 1e-5)
    close_scaled(split.kda_conv(0, 0), whole.kda_conv(0, 0), 1e-5)


@pytest.mark.parametrize("gate", ["lower_bound", "softplus"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_kda_layer_decode_equals_one_token_prefill_bytes(e, gate, dtype):
    # A decode step (the planes from the device slots; the gates and the gated norm inside the
    # scan's launch, kda_scan's SLOTS form; f_b | g_b in the conv's launch; the q|k|v and
    # f_a|g_a|beta GEMVs in one launch) against a one-token prefill from the same state (the
    # conv, l2norm_heads, kda_gate with beta, kda_scan and the gated norm as launches of their own;
    # the same GEMVs at N = 1): the same bytes.
    g = rng(23)
    x = f32(g.standard_normal((10, D)))
    layer = memra.KdaLayer(e, kda_weights(dtype, seed=3), hidden=D, heads=H, head_dim=DK,
                           conv_kernel=KCONV, gate=gate, dtype=dtype)
    caches = [memra.Cache(e, [layer.state_spec()], max_batch=2, max_len=16) for _ in range(2)]
    for c in caches:
        layer.prefill(c, 0, 1, e.to_device(x[:8]))
        c.commit(1, 8)
    for t in (8, 9):
        y_pre = e.to_host(layer.prefill(caches[0], 0, 1, e.to_device(x[t:t + 1])))
        caches[0].commit(1, 1)
        y_dec = e.to_host(layer.decode(caches[1], 0, np.array([1], np.int32), e.to_device(x[t:t + 1])))
        caches[1].commit(1, 1)
        assert np.isfinite(y_dec).all()
        assert np.array_equal(y_dec, y_pre), f"step {t}"
        assert np.array_equal(caches[1].kda_state(0, 1), caches[0].kda_state(0, 1))
        assert np.array_equal(caches[1].kda_conv(0, 1), caches[0].kda_conv(0, 1))


# ---------------------------------------------------------------- MlaLayer (x rounded once)

MLA = dict(hidden=64, heads=4, q_lora_rank=32, kv_rank=32, d_nope=16, d_rope=0, d_v=16,
           sparse=True, index_heads=16, index_head_dim=32, kpool=4, topk=8, tail_rows=8)


def mla_weights(dtype: str) -> dict:
    g = rng(17)
    Dm, Hm, ql, R, dn, dv = 64, 4, 32, 32, 16, 16
    Hi, di, pool = 16, 32, 4

    def w(*shape, s=0.2):
        return f32(g.standard_normal(shape) * s)

    arrays = {
        "q_a_proj.weight": w(ql, Dm), "q_a_layernorm.weight": f32(1.0 + w(ql)),
        "q_b_proj.weight": w(Hm * dn, ql), "kv_a_proj_with_mqa.weight": w(R, Dm),
        "kv_a_layernorm.weight": f32(1.0 + w(R)), "kv_b_proj.weight": w(Hm * (dn + dv), R),
        "o_proj.weight": w(Dm, Hm * dv), "indexer.wq_b.weight": w(Hi * di, ql),
        "indexer.wk.weight": w(di, Dm), "indexer.k_norm.weight": f32(1.0 + w(di)),
        "indexer.k_norm.bias": w(di), "indexer.weights_proj.weight": w(Hi, Dm),
        "indexer.index_kpool_compress_ape": w(pool, di, s=1.0),
        "indexer.index_kpool_compress_gate": w(di, Dm),
    }
    vectors = {"q_a_layernorm.weight", "kv_a_layernorm.weight", "indexer.k_norm.weight",
               "indexer.k_norm.bias", "indexer.index_kpool_compress_ape"}
    return {n: bf16_weight(a) if dtype == "bfloat16" and n not in vectors else _core.Weight(a)
            for n, a in arrays.items()}


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_mla_layer_prefill_and_decode_match_cpu(e, dtype):
    g = rng(23)
    # bf16: at most 2 complete pools of 4 by the end (7 + 3 tokens), all of which the top-k of 8
    # selects, so a near tie flipped by bf16 cannot change the attended rows; f32 crosses pools
    # the selection must choose between, and its index lists must equal the CPU's.
    lens = (13, 6) if dtype == "float32" else (7, 5)
    xp = {0: f32(g.standard_normal((lens[0], 64))), 1: f32(g.standard_normal((lens[1], 64)))}
    xd = [f32(g.standard_normal((3, 64))) for _ in range(3)]
    res = {}
    for name, engine in (("cpu", memra.Engine("cpu")), ("gpu", e)):
        on_gpu = name == "gpu"
        host = engine.to_host if on_gpu else (lambda a: a)
        dev = engine.to_device if on_gpu else (lambda a: a)
        layer = _core.MlaLayer(engine, mla_weights(dtype), **MLA, dtype=dtype)
        cache = memra.Cache(engine, [layer.state_spec()], max_batch=3, max_len=32)
        outs, idx = [], []
        for slot, x in xp.items():
            y, ix = layer.prefill(cache, 0, slot, dev(x))
            outs.append(host(y))
            idx.append(host(ix))
            cache.commit(slot, len(x))
        for x in xd:  # rows: slot 1, slot 0, and (GPU) an idle row
            if on_gpu:
                ds = _core.DecodeSlots(cache, 3)
                ds.set(np.array([1, 0], np.int32))
                y, ix = layer.decode(cache, 0, ds, dev(x))
                y, ix = host(y), host(ix)
                assert np.isfinite(y).all() and (ix[2] == -1).all()
                cache.commit_decode(ds)
                cache.commit_host(1, 1)
                cache.commit_host(0, 1)
            else:
                y, ix = layer.decode(cache, 0, np.array([1, 0], np.int32), x[:2])
                cache.commit(1, 1)
                cache.commit(0, 1)
            outs.append(y[:2])
            idx.append(ix[:2])
        res[name] = (outs, idx)
    for i, (a, b) in enumerate(zip(res["gpu"][0], res["cpu"][0])):
        try:
            close_scaled(a, b, TOL[dtype])
        except AssertionError as err:
            raise AssertionError(f"output {i}: {err}") from None
    if dtype == "float32":  # the index lists too (bf16 may flip near ties)
        for a, b in zip(res["gpu"][1], res["cpu"][1]):
            for ra, rb in zip(a, b):
                assert set(ra.tolist()) == set(rb.tolist())


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_mla_layer_one_row_decode_prologue(e, dtype):
    # At B = 1 the decode's norms, position tables, latent append and k-pool append are one
    # launch (mla_norm_append_decode, cuda/mla_prologue.cu), and the indexer's selection
    # compacts the attention's index lists (kpool_select_compact_decode): the outputs, latent
    # rows and pool keys (steps 7..12 complete pools 2 and 3 of 4 rows) close to the CPU layer,
    # the index lists equal to its as sets (f32); an idle row then writes nothing.
    g = rng(31)
    xp = f32(g.standard_normal((7, 64)))
    xd = [f32(g.standard_normal((1, 64))) for _ in range(6)]

    def run(engine):
        on_gpu = engine is e
        host = engine.to_host if on_gpu else (lambda a: a)
        dev = engine.to_device if on_gpu else (lambda a: a)
        layer = _core.MlaLayer(engine, mla_weights(dtype), **MLA, dtype=dtype)
        cache = memra.Cache(engine, [layer.state_spec()], max_batch=2, max_len=32)
        y, _ = layer.prefill(cache, 0, 1, dev(xp))
        cache.commit(1, len(xp))
        outs, idx = [], []
        ds = _core.DecodeSlots(cache, 1) if on_gpu else None
        if on_gpu:
            ds.set(np.array([1], np.int32))
        for x in xd:
            if on_gpu:
                y, ix = layer.decode(cache, 0, ds, dev(x))
                cache.commit_decode(ds)
                cache.commit_host(1, 1)
            else:
                y, ix = layer.decode(cache, 0, np.array([1], np.int32), x)
                cache.commit(1, 1)
            outs.append(host(y))
            idx.append(host(ix))
        state = (cache.latent_rows(0, 1), cache.pool_keys(0, 1))
        if on_gpu:  # an idle row: no cache row written, zeros out
            ds.set(np.array([], np.int32))
            y, ix = layer.decode(cache, 0, ds, dev(xd[0]))
            assert not host(y).any() and (host(ix) == -1).all()
            assert cache.length(1) == len(xp) + len(xd)
            after = (cache.latent_rows(0, 1), cache.pool_keys(0, 1))
            assert all(np.array_equal(a, b) for a, b in zip(after, state))
        return outs, idx, state

    fused = run(e)
    again = run(e)  # the same bytes run to run
    for a, b in zip(fused[0] + fused[1] + list(fused[2]), again[0] + again[1] + list(again[2])):
        assert np.array_equal(a, b)
    cpu = run(memra.Engine("cpu"))
    for i, (a, b) in enumerate(zip(fused[0], cpu[0])):
        try:
            close_scaled(a, b, TOL[dtype])
        except AssertionError as err:
            raise AssertionError(f"step {i}: {err}") from None
    close_scaled(fused[2][0], cpu[2][0], TOL[dtype])
    close_scaled(fused[2][1], cpu[2][1], TOL[dtype])
    if dtype == "float32":
        for a, b in zip(fused[1], cpu[1]):
            assert set(a.ravel().tolist()) == set(b.ravel().tolist())
