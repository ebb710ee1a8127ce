"""The full attention on CUDA (marked cuda): the ops of cuda/attention_prep.cu and cuda/attention.cu
against the CPU backend (memra/cpu/attention.h, itself checked against float64 transcriptions of
transformers in tests/test_ops_attention.py), and AttentionLayer's CUDA chain, eager and replayed
from a CUDA graph.

What these would catch:
- attn_prep: a slip in the joint [q | gate] split, the norm's sum, the rotate-half pairing or the
  position source (direct pos0 + t vs the slot's device length): O(1) errors;
- kv_append: a row at the wrong position or slot, a bad bf16 rounding (compared byte for byte);
- attention: a wrong GQA head (h // group), a tile boundary (T and positions 1, 63, 65, 200 cross
  the 32-row tiles, hd 256 the shared-memory opt-in, hd 18 / 20 the scalar loads), the causal
  limit, the split merge (a max_len of several splits), an idle row or a dead split written;
- the layer: the fused q | k | v GEMM's column blocks, the device-form positions;
- the graph test: a kernel missing from the graph or a value baked in at capture shows at the
  next step as a difference from the eager run (same kernels, same buffers: byte-exact).

Tolerances (|got - want| <= rel * max|want|): float32 1e-5 (the device's tree sums, cosf / sinf
and cuBLAS against the CPU's sequential sums); bf16 weights 3e-2 (the GPU rounds each GEMM input
to bf16, the CPU layer keeps activations in f32).
"""

from __future__ import annotations

import numpy as np
import pytest

import memra
from memra import _core
from cuda_helpers import bf16_bits, close_scaled, engine_with, f32, rng
from test_attention_layer import TINY_KW, tiny_weights

pytestmark = pytest.mark.cuda

TOL = {"float32": 1e-5, "bfloat16": 3e-2}


def split_rows(max_len: int, Hq: int, Hkv: int) -> int:
    """memra_attention_split_rows (cuda_abi/attention.h) for a launch of these heads."""
    G = Hq // Hkv
    kv_blocks = Hkv * -(-G // min(G, 16))
    want = -(-256 // kv_blocks)
    return max(32, -(-(-(-max_len // want)) // 32) * 32)


def cache_array(g, shape, dtype):
    """A random K/V cache as the ops take it: float32, or bfloat16 as raw uint16 bits (both
    backends read the same rounded values)."""
    v = f32(g.standard_normal(shape))
    return bf16_bits(v) if dtype == "bfloat16" else v


# ---------------------------------------------------------------- attn_prep / kv_append


@pytest.mark.parametrize("T", [1, 63, 65, 200])
@pytest.mark.parametrize("Hq,Hkv,hd,rot", [(4, 2, 256, 64), (3, 1, 18, 8)])
def test_attn_prep_matches_cpu(e, T, Hq, Hkv, hd, rot):
    g = rng(T + hd)
    qg, k = f32(g.standard_normal((T, Hq, 2 * hd))), f32(g.standard_normal((T, Hkv, hd)))
    qw, kw = f32(1 + 0.3 * g.standard_normal(hd)), f32(1 + 0.3 * g.standard_normal(hd))
    inv = _core.rope_inv_freq(1e7, rot)
    want = _core.attn_prep(qg, k, qw, kw, eps=1e-6, rotary_dim=rot, inv_freq=inv, pos0=11)
    d = e.to_device
    got = [e.to_host(a) for a in _core.attn_prep(d(qg), d(k), d(qw), d(kw), eps=1e-6, rotary_dim=rot,
                                                 inv_freq=d(inv), pos0=11, engine=e)]
    close_scaled(got[0], want[0], 1e-5)
    close_scaled(got[2], want[2], 1e-5)
    assert np.array_equal(got[1], want[1])
    # The device form (positions read on the device: slot t at length 11 + t) runs the direct
    # form's kernel at the same positions: the same bytes.
    slots, lengths = np.arange(T, dtype=np.int32), np.arange(11, 11 + T, dtype=np.int32)
    dev = _core.attn_prep(d(qg), d(k), d(qw), d(kw), eps=1e-6, rotary_dim=rot, inv_freq=d(inv),
                          slots=d(slots), lengths=d(lengths), engine=e)
    for a, b in zip(dev, got):
        assert np.array_equal(e.to_host(a), b)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_kv_append_matches_cpu_bytes(e, dtype):
    g = rng(3)
    Hkv, hd, L = 2, 24, 40
    k, v = f32(g.standard_normal((6, Hkv, hd))), f32(g.standard_normal((6, Hkv, hd)))
    zero = (lambda s: np.zeros(s, np.uint16)) if dtype == "bfloat16" else (lambda s: np.zeros(s, np.float32))
    cpu = [zero((L, Hkv, hd)), zero((L, Hkv, hd))]
    _core.kv_append(k, v, *cpu, pos0=30)
    gpu = [e.to_device(zero((L, Hkv, hd))), e.to_device(zero((L, Hkv, hd)))]
    _core.kv_append(e.to_device(k), e.to_device(v), *gpu, pos0=30, engine=e)
    for a, b in zip(gpu, cpu):
        assert np.array_equal(e.to_host(a), b)
    slots, lengths = np.array([3, -1, 0], np.int32), np.array([5, 7, 0, 39], np.int32)
    cpu = [zero((4, L, Hkv, hd)), zero((4, L, Hkv, hd))]
    _core.kv_append(k[:3], v[:3], *cpu, slots=slots, lengths=lengths)
    gpu = [e.to_device(zero((4, L, Hkv, hd))), e.to_device(zero((4, L, Hkv, hd)))]
    _core.kv_append(e.to_device(k[:3]), e.to_device(v[:3]), *gpu, slots=e.to_device(slots),
                    lengths=e.to_device(lengths), engine=e)
    for a, b in zip(gpu, cpu):
        assert np.array_equal(e.to_host(a), b)


# ---------------------------------------------------------------- attention


GEOMETRIES = [(4, 2, 256), (8, 1, 64), (3, 3, 18), (32, 2, 128), (40, 2, 20)]  # G 2, 8, 1, 16, 20


@pytest.mark.parametrize("T", [1, 63, 65, 200])
@pytest.mark.parametrize("Hq,Hkv,hd", GEOMETRIES)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_attention_direct_form_matches_cpu(T, Hq, Hkv, hd, dtype):
    g = rng(T * 3 + Hq + hd)
    pos0 = 7 if T < 100 else 0
    L = pos0 + T + 5
    kc, vc = cache_array(g, (L, Hkv, hd), dtype), cache_array(g, (L, Hkv, hd), dtype)
    q, gate = f32(g.standard_normal((T, Hq, hd))), f32(g.standard_normal((T, Hq, hd)))
    scale = hd ** -0.5
    # The f32 CUDA-core kernel over either cache (a bf16 cache at T > 1 takes the tensor-core
    # kernel by default: tests/test_cuda_attention_tc.py holds that one to a bf16 bound).
    e = engine_with(attn_prefill_tensor_cores=False)
    d = e.to_device
    for gt in (gate, None):
        want = _core.attention(q, kc, vc, scale=scale, gate=gt, pos0=pos0)
        got = e.to_host(_core.attention(d(q), d(kc), d(vc), scale=scale, gate=d(gt) if gt is not None else None,
                                        pos0=pos0, engine=e))
        close_scaled(got, want, 1e-5)
    again = e.to_host(_core.attention(d(q), d(kc), d(vc), scale=scale, pos0=pos0, engine=e))
    assert np.array_equal(got, again)  # no atomics: the same bytes run to run


@pytest.mark.parametrize("Hq,Hkv,hd", [(4, 2, 256), (16, 2, 64), (3, 3, 18)])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_attention_device_form_split_and_unsplit(e, Hq, Hkv, hd, dtype):
    g = rng(Hq * hd)
    MB, L = 5, 300
    rows = split_rows(L, Hq, Hkv)
    assert L > 4 * rows  # several splits
    kc, vc = cache_array(g, (MB, L, Hkv, hd), dtype), cache_array(g, (MB, L, Hkv, hd), dtype)
    # Rows inside the first split, at a split's edge, across several, the last row; one idle row.
    lengths = np.array([rows - 2, rows - 1, 3 * rows + 5, L - 1, 0], np.int32)
    slots = np.array([0, 1, -1, 2, 3, 4], np.int32)
    B = len(slots)
    q, gate = f32(g.standard_normal((B, Hq, hd))), f32(g.standard_normal((B, Hq, hd)))
    want = _core.attention(q, kc, vc, scale=0.1, gate=gate, slots=slots, lengths=lengths)
    unsplit_e = engine_with(attn_decode_unsplit=True)
    out = {}
    for name, eng in (("split", e), ("unsplit", unsplit_e)):
        d = eng.to_device
        out[name] = eng.to_host(_core.attention(d(q), d(kc), d(vc), scale=0.1, gate=d(gate), slots=d(slots),
                                                lengths=d(lengths), engine=eng))
        close_scaled(out[name], want, 1e-5)
        assert not out[name][2].any()  # the idle row
    # Rows that fit in the first split: the merge of one split is the unsplit division, bit for bit.
    for b, s in enumerate(slots):
        if s >= 0 and lengths[s] + 1 <= rows:
            assert np.array_equal(out["split"][b], out["unsplit"][b]), b


def test_attention_device_form_row_bytes_do_not_depend_on_the_batch(e):
    # The split is sized from max_len and the heads, never from B or a length.
    g = rng(21)
    MB, L, Hq, Hkv, hd = 4, 200, 4, 2, 256
    kc, vc = f32(g.standard_normal((MB, L, Hkv, hd))), f32(g.standard_normal((MB, L, Hkv, hd)))
    lengths = np.array([150, 3, 77, 199], np.int32)
    q = f32(g.standard_normal((4, Hq, hd)))
    d = e.to_device
    kd, vd, ld = d(kc), d(vc), d(lengths)
    batch = e.to_host(_core.attention(d(q), kd, vd, scale=0.0625, slots=d(np.array([2, 0, 3, 1], np.int32)),
                                      lengths=ld, engine=e))
    for b, s in enumerate([2, 0, 3, 1]):
        alone = e.to_host(_core.attention(d(q[b:b + 1]), kd, vd, scale=0.0625, slots=d(np.array([s], np.int32)),
                                          lengths=ld, engine=e))
        assert np.array_equal(alone[0], batch[b])


# ---------------------------------------------------------------- the layer


def layer_on(engine, dtype):
    return memra.AttentionLayer(engine, tiny_weights(), **TINY_KW, dtype=dtype)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_layer_prefill_and_decode_match_cpu(e, dtype):
    g = rng(31)
    prompts = {0: 7, 1: 40, 2: 3}
    xs = {s: f32(g.standard_normal((n, 64))) for s, n in prompts.items()}
    steps = [[1, 0, 2], [2, 0], [0, 1, 2], [1]]
    xd = [f32(g.standard_normal((4, 64))) for _ in steps]
    res = {}
    for name, eng in (("cpu", memra.Engine("cpu")), ("gpu", e)):
        gpu = name == "gpu"
        host = eng.to_host if gpu else (lambda a: a)
        dev = eng.to_device if gpu else (lambda a: a)
        layer = layer_on(eng, dtype)
        cache = memra.Cache(eng, [layer.state_spec()], max_batch=4, max_len=96,
                            latent_dtype=dtype if gpu else "float32")
        outs = []
        for s, x in xs.items():
            outs.append(host(layer.prefill(cache, 0, s, dev(x))))
            cache.commit(s, len(x))
        for rows, x in zip(steps, xd):
            if gpu:  # a bucket of 4 with idle rows
                ds = _core.DecodeSlots(cache, 4)
                ds.set(np.array(rows, np.int32))
                y = host(layer.decode(cache, 0, ds, dev(x)))
                assert np.isfinite(y).all()
                cache.commit_decode(ds)
                for s in rows:
                    cache.commit_host(s, 1)
            else:
                y = layer.decode(cache, 0, np.array(rows, np.int32), x[:len(rows)])
                for s in rows:
                    cache.commit(s, 1)
            outs.append(y[:len(rows)])
        res[name] = (outs, [(cache.attn_keys(0, s), cache.attn_values(0, s)) for s in range(4)])
    for i, (a, b) in enumerate(zip(res["gpu"][0], res["cpu"][0])):
        try:
            close_scaled(a, b, TOL[dtype])
        except AssertionError as err:
            raise AssertionError(f"output {i}: {err}") from None
    for (ka, va), (kb, vb) in zip(res["gpu"][1][:3], res["cpu"][1][:3]):
        close_scaled(ka, kb, TOL[dtype])
        close_scaled(va, vb, TOL[dtype])
    assert res["gpu"][1][3][0].shape == (0, 2, 256)  # never used


def test_layer_prefill_then_decode_equals_prefill_f32(e):
    g = rng(33)
    x = f32(g.standard_normal((65, 64)))
    layer = layer_on(e, "float32")
    whole = memra.Cache(e, [layer.state_spec()], max_batch=1, max_len=80)
    y = e.to_host(layer.prefill(whole, 0, 0, e.to_device(x)))
    steps = memra.Cache(e, [layer.state_spec()], max_batch=1, max_len=80)
    layer.prefill(steps, 0, 0, e.to_device(x[:64]))
    steps.commit(0, 64)
    yd = e.to_host(layer.decode(steps, 0, np.array([0], np.int32), e.to_device(x[64:])))
    close_scaled(yd, y[64:], 1e-5)


@pytest.mark.parametrize("unsplit", [False, True])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_decode_graph_replay_equals_eager_bit_for_bit(dtype, unsplit):
    # A bucket of 4 (slots 2, 0, 1 and an idle row) over 70 steps: the positions cross the splits'
    # edges (max_len 112: 32-row splits) and the 32-row tiles; slot 3 holds its own prompt and must
    # come out untouched. The graph is captured at the second step and replayed from then on.
    eng = engine_with(attn_decode_unsplit=unsplit)
    g = rng(41)
    prompts = {0: 5, 1: 30, 2: 1, 3: 9}
    xs = {s: f32(g.standard_normal((n, 64))) for s, n in prompts.items()}
    steps = [f32(g.standard_normal((4, 64))) for _ in range(70)]
    runs = {}
    for mode in ("eager", "graph"):
        layer = layer_on(eng, dtype)
        cache = memra.Cache(eng, [layer.state_spec()], max_batch=4, max_len=112, latent_dtype=dtype)
        for s, x in xs.items():
            layer.prefill(cache, 0, s, eng.to_device(x))
            cache.commit(s, len(x))
        idle_before = (cache.attn_keys(0, 3), cache.attn_values(0, 3))
        ds = _core.DecodeSlots(cache, 4)
        ds.set(np.array([2, 0, 1], np.int32))
        x_buf = eng.to_device(np.zeros((4, 64), np.float32))
        y_buf = eng.to_device(np.zeros((4, 64), np.float32))

        def body():
            y = layer.decode(cache, 0, ds, x_buf)
            eng.copy_into(y_buf, y)
            del y
            cache.commit_decode(ds)

        graph, ys = None, []
        for i, x in enumerate(steps):
            eng.copy_into(x_buf, x)
            if mode == "graph" and i == 1:
                eng.begin_capture()
                try:
                    body()
                except BaseException:
                    eng.abort_capture()
                    raise
                graph = eng.end_capture()
            if graph is not None:
                graph.replay()
            else:
                body()
            for s in (2, 0, 1):
                cache.commit_host(s, 1)
            ys.append(eng.to_host(y_buf))
        assert (graph is not None) == (mode == "graph")
        assert np.array_equal(cache.attn_keys(0, 3), idle_before[0])
        assert np.array_equal(cache.attn_values(0, 3), idle_before[1])
        assert np.array_equal(cache.device_lengths(), np.array([cache.length(s) for s in range(4)]))
        runs[mode] = (ys, [(cache.attn_keys(0, s), cache.attn_values(0, s)) for s in range(4)])
    for i, (a, b) in enumerate(zip(runs["graph"][0], runs["eager"][0])):
        assert np.isfinite(a).all()
        assert np.array_equal(a, b), f"step {i}: replayed output differs from eager"
    for s, ((ka, va), (kb, vb)) in enumerate(zip(runs["graph"][1], runs["eager"][1])):
        assert np.array_equal(ka, kb) and np.array_equal(va, vb), f"slot {s}"


def test_cuda_refusals_are_named(e):
    layer = layer_on(e, "float32")
    cache = memra.Cache(e, [layer.state_spec()], max_batch=2, max_len=8)
    host_x = np.zeros((2, 64), np.float32)
    with pytest.raises(memra.ContractError) as ei:  # a host array for a CUDA layer
        layer.prefill(cache, 0, 0, host_x)
    assert ei.value.code == _core.status.CONTRACT_DEVICE
    cpu_cache = memra.Cache(memra.Engine("cpu"), [layer.state_spec()], max_batch=2, max_len=8)
    with pytest.raises(memra.ContractError) as ei:
        layer.prefill(cpu_cache, 0, 0, e.to_device(host_x))
    assert ei.value.code == _core.status.CONTRACT_DEVICE
    q = e.to_device(np.zeros((1, 2, 16), np.float32))
    k = e.to_device(np.zeros((4, 1, 16), np.float32))
    k_slots = e.to_device(np.zeros((1, 4, 1, 16), np.float32))  # the slot form's [max_batch, ...]
    with pytest.raises(memra.ContractError, match="lengths"):
        _core.attention(q, k_slots, k_slots, scale=1.0, slots=e.to_device(np.zeros(1, np.int32)),
                        engine=e)
    with pytest.raises(memra.ContractError, match="k_cache"):
        _core.attention(q, np.zeros((4, 1, 16), np.float32), k, scale=1.0, engine=e)
