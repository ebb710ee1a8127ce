"""The Cache's per-slot bookkeeping and its device mirrors (docs/decode_graphs.md).

A CUDA Cache keeps int32 lengths_d / cur_d [max_batch] in its arena, equal to the host's
length(s) / cur(s) after every host-side mutation (commit, free, copy_slot; async copies in stream
order, no host sync). Cache.device_lengths() / device_cur() read them back (waiting for the
device). A CPU cache has no mirrors (None) and its layout and behaviour are unchanged.

CPU-runnable: the host bookkeeping (cur flips on commit, free resets, copy_slot copies), the
absent mirrors, the plane layout kda_tables relies on, and UnsupportedError of the CUDA-only
bookkeeping ops on the CPU. Marked cuda: the mirrors of a real model's cache through prefill,
decode, generate_batch, commit, free, copy_slot and failed calls, and through enough commits to
wrap the context's pinned staging ring. All comparisons are exact (integers).
"""

from __future__ import annotations

import numpy as np
import pytest

import memra
from memra import _core
from memra.errors import CacheFullError, ContractError, UnsupportedError

KDA = _core.LayerStateSpec.kda(heads=2, head_dim=8, conv_kernel=4)
MLA = _core.LayerStateSpec.mla(row_width=8, index_head_dim=4, kpool=2, tail_rows=4)
SPECS = [KDA, MLA, _core.LayerStateSpec.none(), KDA]


class Shadow:
    """The bookkeeping a Cache must show, tracked independently of it."""

    def __init__(self, n: int) -> None:
        self.lengths = [0] * n
        self.cur = [0] * n

    def commit(self, s: int, n: int) -> None:
        self.lengths[s] += n
        self.cur[s] ^= 1

    def free(self, s: int) -> None:
        self.lengths[s] = 0
        self.cur[s] = 0

    def copy_slot(self, src: int, dst: int) -> None:
        self.lengths[dst] = self.lengths[src]
        self.cur[dst] = self.cur[src]


def assert_host(cache, shadow: Shadow) -> None:
    assert [cache.length(s) for s in range(cache.max_batch)] == shadow.lengths
    assert [cache.cur(s) for s in range(cache.max_batch)] == shadow.cur


def assert_mirrors(cache, shadow: Shadow | None = None) -> None:
    """Device mirrors == host bookkeeping (== the shadow when given)."""
    n = cache.max_batch
    lengths = np.array([cache.length(s) for s in range(n)], np.int32)
    cur = np.array([cache.cur(s) for s in range(n)], np.int32)
    if shadow is not None:
        assert lengths.tolist() == shadow.lengths and cur.tolist() == shadow.cur
    got_l, got_c = cache.device_lengths(), cache.device_cur()
    assert got_l.dtype == np.int32 and got_l.shape == (n,)
    assert got_c.dtype == np.int32 and got_c.shape == (n,)
    np.testing.assert_array_equal(got_l, lengths)
    np.testing.assert_array_equal(got_c, cur)


def mutate(cache, shadow: Shadow) -> None:
    """A fixed sequence of host-side mutations, mirrored in the shadow (max_batch >= 3)."""
    for s, n in [(0, 3), (1, 1), (0, 1), (2, 5), (1, 2)]:
        cache.commit(s, n)
        shadow.commit(s, n)
    cache.copy_slot(0, 2)
    shadow.copy_slot(0, 2)
    cache.copy_slot(1, 1)  # no-op
    cache.free(0)
    shadow.free(0)
    cache.commit(2, 1)
    shadow.commit(2, 1)


# ---------------------------------------------------------------- CPU


@pytest.fixture
def cpu_cache():
    return _core.Cache(memra.Engine("cpu"), SPECS, max_batch=3, max_len=16)


def test_cpu_cache_has_no_mirrors(cpu_cache) -> None:
    assert cpu_cache.device_lengths() is None and cpu_cache.device_cur() is None
    # The host layout is unchanged: no mirror bytes in a CPU arena.
    assert cpu_cache.nbytes == _core.Cache.bytes_needed(3, 16, SPECS)
    shadow = Shadow(3)
    assert_host(cpu_cache, shadow)
    mutate(cpu_cache, shadow)
    assert_host(cpu_cache, shadow)
    assert cpu_cache.device_lengths() is None and cpu_cache.device_cur() is None


def test_cpu_failed_calls_change_nothing(cpu_cache) -> None:
    shadow = Shadow(3)
    mutate(cpu_cache, shadow)
    with pytest.raises(CacheFullError):
        cpu_cache.commit(2, 16)
    with pytest.raises(ContractError):
        cpu_cache.commit(3, 1)
    with pytest.raises(ContractError):
        cpu_cache.commit(1, 0)
    with pytest.raises(ContractError):
        cpu_cache.copy_slot(0, 5)
    with pytest.raises(ContractError):
        cpu_cache.free(-1)
    assert_host(cpu_cache, shadow)


def test_cpu_cur_checks_the_slot(cpu_cache) -> None:
    for bad in (-1, 3):
        with pytest.raises(ContractError):
            cpu_cache.cur(bad)


def test_kda_plane_addresses_follow_the_slot_stride(cpu_cache) -> None:
    """kda_tables computes base + slot * plane_floats; the Cache's planes must be laid out so."""
    conv_floats = 3 * 2 * 8 * 3
    state_floats = 2 * 8 * 8
    base = cpu_cache.kda_plane_addresses(0, 0)
    for s in range(3):
        a = cpu_cache.kda_plane_addresses(0, s)
        assert a[0] == base[0] + 4 * s * conv_floats and a[1] == base[1] + 4 * s * conv_floats
        assert a[2] == base[2] + 4 * s * state_floats and a[3] == base[3] + 4 * s * state_floats
    assert len(set(base)) == 4
    assert cpu_cache.kda_plane_addresses(3, 1) != cpu_cache.kda_plane_addresses(0, 1)
    with pytest.raises(ContractError):
        cpu_cache.kda_plane_addresses(1, 0)  # an MLA layer
    with pytest.raises(ContractError):
        cpu_cache.kda_plane_addresses(0, 3)


def test_graph_bookkeeping_ops_need_cuda(cpu_cache) -> None:
    slots = np.zeros(2, np.int32)
    with pytest.raises(UnsupportedError):
        _core.kda_tables(cpu_cache, 0, slots)
    with pytest.raises(UnsupportedError):
        _core.kda_tables(cpu_cache, 0, slots, np.zeros(3, np.int32), group=1, sink_slot=2)
    lengths, cur = np.zeros(3, np.int32), np.zeros(3, np.int32)
    for engine in (None, memra.Engine("cpu")):
        with pytest.raises(UnsupportedError):
            _core.commit_decode(slots, lengths, cur, engine=engine)
    assert lengths.tolist() == [0, 0, 0] and cur.tolist() == [0, 0, 0]


# ---------------------------------------------------------------- CUDA


@pytest.fixture(scope="module")
def gpu():
    return memra.load(memra.default_checkpoint(), device="cuda", dtype="float32", max_batch=4,
                      max_len=64, progress=False)


@pytest.mark.cuda
def test_cuda_mirrors_start_at_zero(gpu) -> None:
    cache = gpu.new_cache(4, 64)
    assert cache.on_device
    assert_mirrors(cache, Shadow(4))
    # The mirrors are the only extra bytes of a CUDA arena (<= 2 * 256 with alignment).
    host_bytes = _core.Cache.bytes_needed(4, 64, gpu.net.state_specs())
    assert host_bytes < cache.nbytes <= host_bytes + 512


@pytest.mark.cuda
def test_cuda_mirrors_follow_host_mutations(gpu) -> None:
    cache = _core.Cache(gpu.engine, SPECS, max_batch=3, max_len=16)
    shadow = Shadow(3)
    mutate(cache, shadow)
    assert_mirrors(cache, shadow)
    # Failed calls change neither side.
    with pytest.raises(CacheFullError):
        cache.commit(2, 16)
    with pytest.raises(ContractError):
        cache.copy_slot(0, 5)
    assert_mirrors(cache, shadow)


@pytest.mark.cuda
def test_cuda_mirrors_through_model_steps(gpu) -> None:
    """prefill / decode / copy_slot / free / commit on a real model cache, checked after each."""
    cache = gpu.new_cache(4, 64)
    shadow = Shadow(4)
    g = np.random.default_rng(0)

    def ids(n):
        return g.integers(1, 200, size=n).astype(np.int32)

    gpu.prefill(cache, 0, ids(5))
    shadow.commit(0, 5)
    assert_mirrors(cache, shadow)
    gpu.prefill(cache, 2, ids(3))
    shadow.commit(2, 3)
    assert_mirrors(cache, shadow)
    for slots in ([0, 2], [2, 0], [2]):
        gpu.decode(cache, slots, ids(len(slots)))
        for s in slots:
            shadow.commit(s, 1)
        assert_mirrors(cache, shadow)
    cache.copy_slot(0, 3)
    shadow.copy_slot(0, 3)
    assert_mirrors(cache, shadow)
    gpu.decode(cache, [3, 2, 0], ids(3))
    for s in (3, 2, 0):
        shadow.commit(s, 1)
    assert_mirrors(cache, shadow)
    cache.free(0)
    shadow.free(0)
    assert_mirrors(cache, shadow)
    gpu.prefill(cache, 0, ids(2))  # slot reuse
    shadow.commit(0, 2)
    cache.commit(1, 7)  # a raw host commit
    shadow.commit(1, 7)
    assert_mirrors(cache, shadow)
    # Calls that do not fit are refused before anything changes.
    with pytest.raises(CacheFullError):
        cache.commit(1, 64)
    cache.commit(1, 64 - 7)
    shadow.commit(1, 64 - 7)
    with pytest.raises(CacheFullError):
        gpu.decode(cache, [2, 1], ids(2))
    assert_mirrors(cache, shadow)


@pytest.mark.cuda
def test_cuda_mirrors_after_generate_batch(gpu) -> None:
    """The model's own cache after a batched generation (acquire -> free, prefill, decode steps,
    release -> free)."""
    gpu.generate_batch([[1, 2, 3], [4, 5], [6]], max_new_tokens=4)
    assert_mirrors(gpu.cache)
    gpu.generate([7, 8, 9, 10], max_new_tokens=3)
    assert_mirrors(gpu.cache)


@pytest.mark.cuda
def test_cuda_mirrors_survive_staging_ring_wrap(gpu) -> None:
    """Two staged 4-byte copies per commit: 10000 commits wrap the 4 MiB pinned ring (256 bytes a
    copy) at least once; every copy must still land, in order."""
    cache = _core.Cache(gpu.engine, [KDA], max_batch=8, max_len=2048)
    shadow = Shadow(8)
    for i in range(10000):
        s = (i * 5) % 8
        cache.commit(s, 1)
        shadow.commit(s, 1)
        if i % 1777 == 1776:
            cache.free((i // 1777) % 8)
            shadow.free((i // 1777) % 8)
    assert_mirrors(cache, shadow)
