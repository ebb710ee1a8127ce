"""Gated DeltaNet on CUDA (marked cuda): the ops of cuda/gdn.cu (``gdn_gate``, ``gdn_l2norm``,
``gdn_scan``, ``rms_norm_gated_silu``) and KDA's conv at GDN's channel counts against the CPU
ops, and GdnLayer against the CPU layer, including a decode step captured in a CUDA graph.

What these would catch: a wrong softplus branch or log1p form (gates); a wrong row stride or
head offset of the in-place L2 norm (q and k sit in the conv's [N, 2*Hk*dk + Hv*dv] rows); a
wrong key head for a value head, a stale decay broadcast or a v row stride slip in the scan's
expansion (O(1) errors); the SiLU gate's form; in the layer, the b | a column blocks, the device
plane tables (kda_tables) of a decode step, an idle row writing a slot, a kernel missing from a
captured graph (replay != eager).

Tolerances (|got - want| <= rel * max|want|): ops in float32 1e-5 (CUDA's expf / log1pf within
2 ulp, tree-ordered row sums; ~1e-6 expected); layers in float32 1e-4 (cuBLAS against the CPU's
ascending sums, as the KDA layer tests), bfloat16 3e-2 (the CPU layer holds the same bf16
weights but keeps every activation in f32; the GPU rounds each GEMM input to bf16).
"""

from __future__ import annotations

import numpy as np
import pytest

import memra
from memra import _core

import gdn_reference as R
from cuda_helpers import bf16_weight, close_scaled, expect, f32, rng

pytestmark = pytest.mark.cuda

ST = _core.status
OP_TOL = 1e-5
TOL = {"float32": 1e-4, "bfloat16": 3e-2}
# The real head size (Qwen3.5 / Qwen3-Next: 128 x 128), small everything else.
GEO = R.Geometry(hidden=64, key_heads=2, value_heads=4, key_head_dim=128, value_head_dim=128,
                 conv_kernel=4, rms_eps=1e-6)


def on(e, *arrays):
    return [e.to_device(a) if a is not None else None for a in arrays]


# ---------------------------------------------------------------- ops


@pytest.mark.parametrize("T", [1, 5, 200])
def test_gate_matches_cpu(e, T):
    g = rng(T)
    H = 32
    a, b = f32(6.0 * g.standard_normal((T, H))), f32(6.0 * g.standard_normal((T, H)))
    dt, al = f32(g.standard_normal(H)), f32(g.standard_normal(H))
    a[0, :6] = np.array([19.9, 20.0, 20.5, -30.0, 1e4, -1e4], np.float32) - dt[:6]
    want_g, want_b = _core.gdn_gate(a, b, dt, al)
    got_g, got_b = (e.to_host(v) for v in _core.gdn_gate(*on(e, a, b, dt, al), engine=e))
    np.testing.assert_allclose(got_g, want_g, rtol=OP_TOL, atol=0)
    np.testing.assert_allclose(got_b, want_b, rtol=OP_TOL, atol=1e-7)


@pytest.mark.parametrize("shape", [(1, 8, 128), (65, 4, 128), (3, 2, 7), (2, 1, 1000)])
def test_l2norm_matches_cpu(e, shape):
    x = f32(3.0 * rng(sum(shape)).standard_normal(shape))
    got = e.to_host(_core.gdn_l2norm(e.to_device(x), engine=e))
    np.testing.assert_allclose(got, _core.gdn_l2norm(x), rtol=OP_TOL, atol=1e-7)


def scan_inputs(T, Hk=2, Hv=4, seed=0, B=None, with_state=True):
    g = rng(seed)
    lead = (T,) if B is None else (B, T)
    q = f32(R.l2norm(g.standard_normal(lead + (Hk, 128))))
    k = f32(R.l2norm(g.standard_normal(lead + (Hk, 128))))
    v = f32(g.standard_normal(lead + (Hv, 128)))
    gg = f32(-np.exp(g.uniform(-4, 0.5, lead + (Hv,))))
    beta = f32(g.uniform(0.05, 0.95, lead + (Hv,)))
    st = (f32(0.3 * g.standard_normal(((B,) if B else ()) + (Hv, 128, 128))) if with_state else None)
    return q, k, v, gg, beta, st


@pytest.mark.parametrize("T", [1, 2, 3, 63, 65, 200])
@pytest.mark.parametrize("Hk,Hv", [(2, 4), (1, 1), (1, 4)])
def test_scan_matches_cpu(e, T, Hk, Hv):
    args = scan_inputs(T, Hk, Hv, seed=T + 10 * Hv)
    want_o, want_s = _core.gdn_scan(*args)
    got_o, got_s = (e.to_host(v) for v in _core.gdn_scan(*on(e, *args), engine=e))
    close_scaled(got_o, want_o, OP_TOL)
    close_scaled(got_s, want_s, OP_TOL)


def test_scan_from_zeros_and_batched_rows_match_cpu(e):
    args = scan_inputs(7, B=3, seed=4, with_state=False)
    want_o, want_s = _core.gdn_scan(*args, batch=True)
    got_o, got_s = (e.to_host(v) for v in _core.gdn_scan(*on(e, *args), batch=True, engine=e))
    close_scaled(got_o, want_o, OP_TOL)
    close_scaled(got_s, want_s, OP_TOL)
    # Each sequence of the batch equals its own call bit for bit; one-step calls chain bit for bit.
    for b in range(3):
        one = [a[b] if a is not None else None for a in args]
        ob, sb = (e.to_host(v) for v in _core.gdn_scan(*on(e, *one), engine=e))
        assert np.array_equal(ob, e.to_host(_core.gdn_scan(*on(e, *args), batch=True, engine=e)[0])[b])
        s = None
        for t in range(7):
            step = [a[t:t + 1] for a in one[:5]]
            o1, s = _core.gdn_scan(*on(e, *step), s, engine=e)
            assert np.array_equal(e.to_host(o1)[0], ob[t]), (b, t)
        assert np.array_equal(e.to_host(s), sb)


def test_scan_geometry_outside_the_kernels_is_unsupported(e):
    g = rng(1)
    q = f32(g.standard_normal((3, 2, 64)))
    v = f32(g.standard_normal((3, 4, 64)))
    gg, beta = f32(-np.ones((3, 4))), f32(np.full((3, 4), 0.5))
    expect(memra.UnsupportedError, ST.UNSUPPORTED_GEOMETRY, _core.gdn_scan,
           *on(e, q, q, v, gg, beta), engine=e)


@pytest.mark.parametrize("T,D", [(1, 128), (7, 24), (300, 128), (2, 1000), (3, 5000)])
def test_gated_norm_matches_cpu(e, T, D):
    g = rng(T * D)
    x, z = f32(2.0 * g.standard_normal((T, D))), f32(3.0 * g.standard_normal((T, D)))
    w = f32(1.0 + 0.3 * g.standard_normal(D))
    got = e.to_host(_core.rms_norm_gated_silu(*on(e, x, z, w), eps=1e-6, engine=e))
    close_scaled(got, _core.rms_norm_gated_silu(x, z, w, eps=1e-6), OP_TOL)


@pytest.mark.parametrize("C", [R.Geometry().C, GEO.C])  # 160 (not a multiple of 128), 1024
def test_conv_over_gdn_channels_matches_cpu(e, C):
    g = rng(C)
    x, w = f32(g.standard_normal((9, C))), f32(0.5 * g.standard_normal((C, 4)))
    ring = f32(g.standard_normal((C, 3)))
    for xs, rs, kw in ((x, ring, {}), (x[:1], ring, {}), (x[:3], f32(np.stack([ring] * 3)), {"batch": True})):
        want_y, want_r = _core.kda_conv(xs, w, rs, **kw)
        got_y, got_r = (e.to_host(v) for v in _core.kda_conv(*on(e, xs, w, rs), engine=e, **kw))
        close_scaled(got_y, want_y, OP_TOL)
        assert np.array_equal(got_r, want_r)


# ---------------------------------------------------------------- GdnLayer

PROMPTS = {0: 5, 2: 70, 3: 2}  # slot -> prompt length (slot 1 stays empty)
STEPS = [[2], [2, 0, -1], [0, 3, 2], [3]]  # decode rows (-1 idle); B = 1 uses host slots


def weights(dtype, next_layout=False, seed=5):
    w = R.weights(GEO, seed)
    if next_layout:
        w = R.interleave(GEO, w)
    vectors = {"conv1d.weight", "A_log", "dt_bias", "norm.weight"}
    return {n: bf16_weight(a) if dtype == "bfloat16" and n not in vectors else _core.Weight(a)
            for n, a in w.items()}


def layer_on(engine, dtype, next_layout=False):
    return memra.GdnLayer(engine, weights(dtype, next_layout), **GEO.layer_kw(), dtype=dtype)


def inputs(steps):
    g = rng(42)
    xs = {("p", s): f32(g.standard_normal((T, GEO.hidden))) for s, T in PROMPTS.items()}
    for i, rows in enumerate(steps):
        xs[("d", i)] = f32(g.standard_normal((len(rows), GEO.hidden)))
    return xs


def run(engine, dtype, xs, steps, next_layout=False):
    """Prefill every prompt, then the decode steps (CUDA at B > 1: a DecodeSlots of the step's
    size with idle rows), on either backend. Returns every output and the cache."""
    layer = layer_on(engine, dtype, next_layout)
    cache = memra.Cache(engine, [layer.state_spec()], max_batch=4, max_len=128)
    gpu = engine.is_cuda
    host = engine.to_host if gpu else (lambda a: a)
    dev = engine.to_device if gpu else (lambda a: a)
    outs = []
    for slot, T in PROMPTS.items():
        outs.append(host(layer.prefill(cache, 0, slot, dev(xs[("p", slot)]))))
        cache.commit(slot, T)
    for i, rows in enumerate(steps):
        active = [s for s in rows if s >= 0]
        x = xs[("d", i)]
        if gpu and len(rows) > 1:
            ds = _core.DecodeSlots(cache, len(rows))
            ds.set(np.array(active, np.int32))
            y = host(layer.decode(cache, 0, ds, dev(x)))
            assert np.isfinite(y).all()
            outs.append(y[:len(active)])
            cache.commit_decode(ds)
            for s in active:
                cache.commit_host(s, 1)
        else:
            outs.append(host(layer.decode(cache, 0, np.array(active, np.int32), dev(x[:len(active)]))))
            for s in active:
                cache.commit(s, 1)
    return outs, cache


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_layer_prefill_and_decode_match_cpu(e, dtype):
    xs = inputs(STEPS)
    want, cpu_cache = run(memra.Engine("cpu"), dtype, xs, STEPS)
    got, gpu_cache = run(e, dtype, xs, STEPS)
    for i, (a, b) in enumerate(zip(got, want)):
        try:
            close_scaled(a, b, TOL[dtype])
        except AssertionError as err:
            raise AssertionError(f"output {i}: {err}") from None
    for s in range(4):
        assert gpu_cache.length(s) == cpu_cache.length(s) and gpu_cache.cur(s) == cpu_cache.cur(s)
        for name in ("gdn_state", "gdn_conv"):
            a, b = getattr(gpu_cache, name)(0, s), getattr(cpu_cache, name)(0, s)
            if s == 1:
                assert not a.any(), name  # never used: still zeros
            else:
                close_scaled(a, b, TOL[dtype])


def test_layer_qwen3_next_layout_same_bytes(e):
    xs = inputs(STEPS)
    a, ca = run(e, "bfloat16", xs, STEPS)
    b, cb = run(e, "bfloat16", xs, STEPS, next_layout=True)
    for x, y in zip(a, b):
        assert np.array_equal(x, y)
    for s in range(4):
        assert np.array_equal(ca.gdn_state(0, s), cb.gdn_state(0, s))


def test_layer_prefill_then_decode_equals_prefill_f32(e):
    x = f32(rng(11).standard_normal((9, GEO.hidden)))
    layer = layer_on(e, "float32")
    whole = memra.Cache(e, [layer.state_spec()], max_batch=1, max_len=16)
    split = memra.Cache(e, [layer.state_spec()], max_batch=1, max_len=16)
    y_whole = e.to_host(layer.prefill(whole, 0, 0, e.to_device(x)))
    whole.commit(0, 9)
    layer.prefill(split, 0, 0, e.to_device(x[:8]))
    split.commit(0, 8)
    y_last = e.to_host(layer.decode(split, 0, np.array([0], np.int32), e.to_device(x[8:])))
    split.commit(0, 1)
    close_scaled(y_last, y_whole[8:], 1e-5)
    close_scaled(split.gdn_state(0, 0), whole.gdn_state(0, 0), 1e-5)
    close_scaled(split.gdn_conv(0, 0), whole.gdn_conv(0, 0), 1e-5)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_layer_idle_rows_and_other_slots_untouched(e, dtype):
    layer = layer_on(e, dtype)
    cache = memra.Cache(e, [layer.state_spec()], max_batch=4, max_len=128)
    g = rng(3)
    for slot, T in PROMPTS.items():
        layer.prefill(cache, 0, slot, e.to_device(f32(g.standard_normal((T, GEO.hidden)))))
        cache.commit(slot, T)
    every = lambda: {s: (cache.gdn_state(0, s), cache.gdn_conv(0, s)) for s in range(4)}  # noqa: E731
    before = every()
    ds = _core.DecodeSlots(cache, 4)
    ds.set(np.array([2, 0], np.int32))  # rows 2, 0, idle, idle
    y = e.to_host(layer.decode(cache, 0, ds, e.to_device(f32(g.standard_normal((4, GEO.hidden))))))
    assert np.isfinite(y).all()
    cache.commit_decode(ds)
    cache.commit_host(2, 1)
    cache.commit_host(0, 1)
    after = every()
    for s in (1, 3):
        assert all(np.array_equal(a, b) for a, b in zip(after[s], before[s])), s
    one = _core.DecodeSlots(cache, 1)
    one.set(np.array([], np.int32))  # a bucket of one idle row writes no slot
    assert np.isfinite(e.to_host(layer.decode(cache, 0, one, e.to_device(f32(g.standard_normal((1, GEO.hidden))))))).all()
    for s, planes in every().items():
        assert all(np.array_equal(a, b) for a, b in zip(planes, after[s])), s


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_layer_decode_graph_replay_equals_eager_bytes(e, dtype):
    """One captured decode step (3 rows, one idle) replayed at 4 positions against eager steps
    on an identical cache: outputs and every plane bit for bit (a kernel left out of the graph,
    or a plane found on the host at capture time, would differ from the second step on)."""
    layer = layer_on(e, dtype)
    caches = [memra.Cache(e, [layer.state_spec()], max_batch=4, max_len=128) for _ in range(2)]
    g = rng(9)
    for slot, T in PROMPTS.items():
        x = e.to_device(f32(g.standard_normal((T, GEO.hidden))))
        for c in caches:
            layer.prefill(c, 0, slot, x)
            c.commit(slot, T)
    slots = [_core.DecodeSlots(c, 3) for c in caches]
    for ds in slots:
        ds.set(np.array([3, 0], np.int32))
    x_dev = e.to_device(np.zeros((3, GEO.hidden), np.float32))
    out = e.to_device(np.zeros((3, GEO.hidden), np.float32))
    e.begin_capture()
    try:
        y = layer.decode(caches[0], 0, slots[0], x_dev)
        e.copy_into(out, y)
        del y
    except BaseException:
        e.abort_capture()
        raise
    graph = e.end_capture()
    for step in range(4):
        x = f32(g.standard_normal((3, GEO.hidden)))
        e.copy_into(x_dev, x)
        graph.replay()
        got = e.to_host(out)
        want = e.to_host(layer.decode(caches[1], 0, slots[1], e.to_device(x)))
        assert np.array_equal(got[:2], want[:2]), f"step {step}"
        for c, ds in zip(caches, slots):
            c.commit_decode(ds)
            c.commit_host(3, 1)
            c.commit_host(0, 1)
        for s in range(4):
            assert np.array_equal(caches[0].gdn_state(0, s), caches[1].gdn_state(0, s)), (step, s)
            assert np.array_equal(caches[0].gdn_conv(0, s), caches[1].gdn_conv(0, s)), (step, s)


def test_layer_refuses_geometry_outside_the_kernels(e):
    small = R.Geometry()  # dk 16, dv 24: the CPU runs it, the CUDA scan is built for 128
    w = {n: _core.Weight(a) for n, a in R.weights(small, 1).items()}
    expect(memra.UnsupportedError, ST.UNSUPPORTED_GEOMETRY, memra.GdnLayer, e, w, **small.layer_kw(),
           dtype="float32")
