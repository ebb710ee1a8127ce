"""Decode-graph bookkeeping on the device (``memra._core.kda_tables`` / ``commit_decode``, kernels
in cuda/kda_tables.cu and cuda/graph_tables.cu; plan in docs/decode_graphs.md).

kda_tables must give, read back as uint64, exactly the cache's plane addresses (the arithmetic the
KDA decode ops' slot forms use in their kernels): for row b with s = slots[b] >= 0, ring_in = conv plane cur[s] of slot s + group * qkv*(K-1)
floats, ring_out = conv plane 1 - cur[s] (same offset), state_in / state_out = state planes
cur[s] / 1 - cur[s]; an idle row (s < 0) points at the sink (plane 0 of sink_slot, the ring with
the group offset) for input and output alike, or holds 0 when there is no sink. The reference is
built from Cache.kda_plane_addresses on a real model cache and on a cache of 300 slots (several
blocks of rows), for random slots (idle rows mixed in) and random flags.

commit_decode must equal Cache.commit(s, 1) on the host for the same slots (idle rows untouched;
a repeated slot counts once per occurrence). All comparisons are exact (integers).

A small case for ``compute-sanitizer --tool memcheck``:
``python -m pytest tests/test_cuda_graph_tables.py -k sanitizer``.
"""

from __future__ import annotations

import numpy as np
import pytest

import memra
from memra import _core
from memra.errors import ContractError

pytestmark = pytest.mark.cuda

KDA = _core.LayerStateSpec.kda(heads=2, head_dim=8, conv_kernel=4)
MLA = _core.LayerStateSpec.mla(row_width=8)


@pytest.fixture(scope="module")
def gpu():
    return memra.load(memra.default_checkpoint(), device="cuda", dtype="float32", max_batch=4,
                      max_len=64, progress=False)


@pytest.fixture(scope="module")
def big(gpu):
    """A cache of 300 slots (B up to 300 rows: three blocks of 128) with KDA layers 0 and 2."""
    return _core.Cache(gpu.engine, [KDA, MLA, _core.LayerStateSpec.kda(heads=1, head_dim=4,
                                                                       conv_kernel=2)],
                       max_batch=300, max_len=4)


def kda_layers(cache) -> list[int]:
    out = []
    for layer in range(cache.num_layers):
        try:
            cache.kda_plane_addresses(layer, 0)
        except ContractError:
            continue
        out.append(layer)
    return out


def host_tables(cache, layer, slots, cur, group=0, sink_slot=None):
    """The four tables as KdaLayer::run_cuda builds them (uint64 addresses)."""
    a0 = cache.kda_plane_addresses(layer, 0)
    conv_bytes = cache.kda_plane_addresses(layer, 1)[0] - a0[0]  # slot stride of a conv plane
    ring_off = group * (conv_bytes // 3)  # channel group p starts p * qkv * (K-1) floats on
    ri, ro, si, so = [], [], [], []
    for s in slots:
        if s < 0:
            if sink_slot is None:
                ri.append(0), ro.append(0), si.append(0), so.append(0)
            else:
                k = cache.kda_plane_addresses(layer, sink_slot)
                ri.append(k[0] + ring_off), ro.append(k[0] + ring_off)
                si.append(k[2]), so.append(k[2])
            continue
        a = cache.kda_plane_addresses(layer, int(s))
        c = int(cur[s])
        ri.append(a[c] + ring_off)
        ro.append(a[1 - c] + ring_off)
        si.append(a[2 + c])
        so.append(a[3 - c])
    return [np.array(t, np.uint64) for t in (ri, ro, si, so)]


def random_batch(g, max_batch, B, idle_frac):
    """B rows: distinct slots of [0, max_batch) with about idle_frac of the rows idle (-1)."""
    n_idle = min(B, int(round(B * idle_frac)))
    active = g.choice(max_batch, size=B - n_idle, replace=False)
    rows = np.concatenate([active, -np.ones(n_idle, np.int64)])
    g.shuffle(rows)
    return rows.astype(np.int32)


def device_tables(engine, cache, layer, slots, cur=None, **kw):
    eng = engine
    out = _core.kda_tables(cache, layer, eng.to_device(slots),
                           None if cur is None else eng.to_device(np.asarray(cur, np.int32)), **kw)
    assert len(out) == 4
    host = [eng.to_host(t) for t in out]
    for t in host:
        assert t.dtype == np.uint64 and t.shape == (len(slots),)
    return host


def assert_tables(got, want):
    for name, a, b in zip(("ring_in", "ring_out", "state_in", "state_out"), got, want):
        np.testing.assert_array_equal(a, b, err_msg=name)


# ---------------------------------------------------------------- kda_tables


@pytest.mark.parametrize("sink", [None, 3])
@pytest.mark.parametrize("group", [0, 1, 2])
def test_kda_tables_match_host_on_model_cache(gpu, group, sink) -> None:
    cache = gpu.new_cache(4, 64)
    layers = kda_layers(cache)
    assert layers, "the test model has KDA layers"
    g = np.random.default_rng(10 * group + (sink or 0))
    for layer in layers:
        for B, idle in ((1, 0.0), (4, 0.0), (4, 0.5), (7, 0.45), (3, 1.0)):
            slots = random_batch(g, 4, B, idle)
            cur = g.integers(0, 2, size=4).astype(np.int32)
            got = device_tables(gpu.engine, cache, layer, slots, cur, group=group, sink_slot=sink)
            assert_tables(got, host_tables(cache, layer, slots, cur, group, sink))


@pytest.mark.parametrize("layer", [0, 2])
def test_kda_tables_many_rows(gpu, big, layer) -> None:
    g = np.random.default_rng(layer)
    for B, idle in ((300, 0.0), (300, 0.2), (129, 0.5), (128, 0.1), (255, 0.0)):
        slots = random_batch(g, 300, B, idle)
        cur = g.integers(0, 2, size=300).astype(np.int32)
        for group, sink in ((0, None), (2, 299), (1, 0)):
            got = device_tables(gpu.engine, big, layer, slots, cur, group=group, sink_slot=sink)
            assert_tables(got, host_tables(big, layer, slots, cur, group, sink))


def test_kda_tables_default_cur_is_the_cache_mirror(gpu) -> None:
    """cur=None reads the cache's own device flags, which follow the host's commits."""
    cache = gpu.new_cache(4, 64)
    for s, n in ((1, 1), (2, 3), (2, 1), (3, 2), (1, 4), (1, 1)):
        cache.commit(s, n)
    cache.copy_slot(3, 0)
    host_cur = [cache.cur(s) for s in range(4)]
    assert host_cur != [0, 0, 0, 0]
    slots = np.array([3, -1, 0, 2, 1], np.int32)
    for layer in kda_layers(cache):
        got = device_tables(gpu.engine, cache, layer, slots, group=1)
        assert_tables(got, host_tables(cache, layer, slots, host_cur, 1))


def test_kda_tables_empty_batch(gpu) -> None:
    cache = gpu.new_cache(2, 8)
    layer = kda_layers(cache)[0]
    got = device_tables(gpu.engine, cache, layer, np.zeros(0, np.int32))
    assert all(t.shape == (0,) for t in got)


def test_kda_tables_sanitizer(gpu) -> None:
    """Small enough for compute-sanitizer (memcheck): 5 rows, two idle, on the model cache."""
    cache = gpu.new_cache(4, 8)
    layer = kda_layers(cache)[0]
    slots = np.array([2, -1, 0, -1, 3], np.int32)
    cur = np.array([1, 0, 0, 1], np.int32)
    got = device_tables(gpu.engine, cache, layer, slots, cur, group=2, sink_slot=1)
    assert_tables(got, host_tables(cache, layer, slots, cur, 2, 1))


def test_kda_tables_contract(gpu) -> None:
    cache = gpu.new_cache(4, 8)
    e = gpu.engine
    layer = kda_layers(cache)[0]
    mla_layer = next(i for i in range(cache.num_layers) if i not in kda_layers(cache))
    slots = e.to_device(np.array([0, 1], np.int32))
    with pytest.raises(ContractError):
        _core.kda_tables(cache, layer, np.array([0, 1], np.int32))  # host slots
    with pytest.raises(ContractError):
        _core.kda_tables(cache, layer, e.to_device(np.array([0, 1], np.int64)))
    with pytest.raises(ContractError):
        _core.kda_tables(cache, layer, slots, e.to_device(np.zeros(3, np.int32)))  # cur [3] != [4]
    with pytest.raises(ContractError):
        _core.kda_tables(cache, layer, slots, group=3)
    with pytest.raises(ContractError):
        _core.kda_tables(cache, layer, slots, sink_slot=4)
    with pytest.raises(ContractError):
        _core.kda_tables(cache, mla_layer, slots)
    with pytest.raises(ContractError):
        _core.kda_tables(cache, cache.num_layers, slots)


# ---------------------------------------------------------------- commit_decode


def commit_on_device(e, slots, lengths, cur):
    ld, cd = e.to_device(np.asarray(lengths, np.int32)), e.to_device(np.asarray(cur, np.int32))
    assert _core.commit_decode(e.to_device(np.asarray(slots, np.int32)), ld, cd, engine=e) is None
    return e.to_host(ld), e.to_host(cd)


def test_commit_decode_matches_cache_commit(gpu) -> None:
    e = gpu.engine
    cache = _core.Cache(e, [KDA], max_batch=6, max_len=64)
    g = np.random.default_rng(3)
    for step in range(6):
        slots = random_batch(g, 6, int(g.integers(1, 9)), 0.3)
        lengths = [cache.length(s) for s in range(6)]
        cur = [cache.cur(s) for s in range(6)]
        got_l, got_c = commit_on_device(e, slots, lengths, cur)
        for s in slots:
            if s >= 0:
                cache.commit(int(s), 1)
        np.testing.assert_array_equal(got_l, [cache.length(s) for s in range(6)], err_msg=f"step {step}")
        np.testing.assert_array_equal(got_c, [cache.cur(s) for s in range(6)], err_msg=f"step {step}")
        # and the host commit kept the cache's own mirrors equal to the same values
        np.testing.assert_array_equal(cache.device_lengths(), got_l)
        np.testing.assert_array_equal(cache.device_cur(), got_c)


def test_commit_decode_many_rows_and_repeats(gpu) -> None:
    e = gpu.engine
    g = np.random.default_rng(4)
    lengths = g.integers(0, 1000, size=400).astype(np.int32)
    cur = g.integers(0, 2, size=400).astype(np.int32)
    slots = random_batch(g, 400, 300, 0.25)
    want_l, want_c = lengths.copy(), cur.copy()
    for s in slots:
        if s >= 0:
            want_l[s] += 1
            want_c[s] ^= 1
    got_l, got_c = commit_on_device(e, slots, lengths, cur)
    np.testing.assert_array_equal(got_l, want_l)
    np.testing.assert_array_equal(got_c, want_c)
    # A repeated slot counts once per occurrence (atomics, not a race).
    got_l, got_c = commit_on_device(e, [1, 1, -1, 1, 2], [5, 6, 7], [0, 1, 1])
    assert got_l.tolist() == [5, 9, 8] and got_c.tolist() == [0, 0, 0]
    # Empty batch and all-idle batch: nothing changes.
    for slots in ([], [-1, -1, -1]):
        got_l, got_c = commit_on_device(e, slots, [5, 6, 7], [0, 1, 1])
        assert got_l.tolist() == [5, 6, 7] and got_c.tolist() == [0, 1, 1]


def test_commit_decode_contract(gpu) -> None:
    e = gpu.engine
    slots = e.to_device(np.array([0], np.int32))
    lengths, cur = e.to_device(np.zeros(3, np.int32)), e.to_device(np.zeros(3, np.int32))
    with pytest.raises(ContractError):
        _core.commit_decode(np.array([0], np.int32), lengths, cur, engine=e)  # host slots
    with pytest.raises(ContractError):
        _core.commit_decode(slots, lengths, e.to_device(np.zeros(4, np.int32)), engine=e)
    with pytest.raises(ContractError):
        _core.commit_decode(slots, e.to_device(np.zeros(3, np.float32)), cur, engine=e)
    with pytest.raises(ContractError):
        _core.commit_decode(slots, np.zeros(3, np.int32), np.zeros(3, np.int32), engine=e)
    # lengths and cur one array (both written in place): refused, naming both.
    with pytest.raises(ContractError) as info:
        _core.commit_decode(slots, lengths, lengths, engine=e)
    assert info.value.code == _core.status.CONTRACT_VALUE
    assert "'lengths'" in str(info.value) and "'cur'" in str(info.value)
    assert e.to_host(lengths).tolist() == [0, 0, 0]
