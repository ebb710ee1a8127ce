"""Batched decode forms of the DSA k-pool indexer on CUDA (``memra._core.kpool_append_decode`` /
``kpool_score_decode`` / ``kpool_select_decode``, kernels in cuda/dsa_decode.cu): B sequences of
one token each, per-sequence state in lists of device arrays, positions on the host or the device
(pos[b] < 0: an idle row).

Each op must give, per sequence, the bytes of the per-sequence CUDA op (cuda/dsa.cu) with
T = t_q = 1, first_pos = pos[b] and n_pools = (pos[b] + 1) // pool: ``np.array_equal`` for the
ring, the pool keys, the scores and the index lists. Against the CPU ops (cpp/src/cpu/dsa.cpp):
- ring rows are copies: ``np.array_equal``;
- a pool key the step completes differs only through expf (CUDA's <= 2 ulp vs glibc's):
  ``rtol=1e-5, atol=5e-6`` (as tests/test_cuda_dsa.py); the other keys are untouched: exact;
- scores: the CPU's sequential sums without FMA, ``np.array_equal`` on x86-64 (the CPU build does
  not contract into FMAs there), else ``rtol=1e-5, atol=1e-5``;
- index lists: exact.
Idle rows: their arrays are not touched (bytes as before), their score row is all -inf and their
idx row all -1. Pools past a row's n_pools score -inf; finite garbage there is never selected.

A small shape for ``compute-sanitizer --tool racecheck`` / ``--tool memcheck``:
``python -m pytest tests/test_cuda_dsa_decode.py -k sanitizer``.
"""

from __future__ import annotations

import collections.abc

import platform

import numpy as np
import pytest

import memra
from memra import _core
from cuda_helpers import f32, rng

pytestmark = pytest.mark.cuda

ST = _core.status
KEY_TOL = dict(rtol=1e-5, atol=5e-6)
CPU_EXACT = platform.machine() in ("x86_64", "AMD64")
SENTINEL = 7.0

# (Hi, d, pool, topk): tiny test geometry and the GLM-5.3-Flash indexer.
TINY = (16, 32, 4, 8)
REAL = (32, 128, 4, 2048)

# Positions per batch (pool = 4: 3, 7, 1023 complete a pool; -1 is an idle row).
BATCHES = {
    "b1": [7],
    "b1_first": [0],
    "b3": [0, 129, 4],
    "b8": [0, 3, 4, 7, 129, 1000, 1023, 8],
    "b8_idle": [3, -1, 1000, 0, -1, 7, 129, 4],
}


def n_pools_of(pos, pool):
    return 0 if pos < 0 else (pos + 1) // pool


def assert_scores(got, want):
    assert got.shape == want.shape and got.dtype == np.float32
    if CPU_EXACT:
        np.testing.assert_array_equal(got, want)
    else:
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def pos_forms(e, positions):
    """pos as a host list and as a device int32 array."""
    return [list(positions), e.to_device(np.array(positions, np.int32))]


# ---------------------------------------------------------------- append


class AppendBatch:
    """Per sequence b: the state a sequence of pos[b] rows leaves (one-shot GPU kpool_append from
    0), the new row, and host copies of the state before the step."""

    def __init__(self, e, positions, d, pool, tail_rows, seed):
        g = rng(seed)
        self.e, self.pos, self.d, self.pool, self.tail_rows = e, positions, d, pool, tail_rows
        self.B = len(positions)
        self.ape = f32(g.standard_normal((pool, d)))
        self.k = f32(g.standard_normal((self.B, d)))
        self.gate = f32(2 * g.standard_normal((self.B, d)))
        self.state = []  # host (tail_k, tail_gate, pool_keys) before the step
        for b, p in enumerate(positions):
            max_pools = max(p, 0) // pool + 1 + (b % 2)  # exact fit for the step or one spare
            if p <= 0:
                st = (f32(g.standard_normal((tail_rows, d))),
                      f32(g.standard_normal((tail_rows, d))),
                      f32(np.full((max_pools, d), SENTINEL)))
                if p == 0:  # an empty sequence: the ring's contents are never read
                    st = (np.zeros_like(st[0]), np.zeros_like(st[1]), st[2])
            else:
                hist_k = f32(g.standard_normal((p, d)))
                hist_g = f32(2 * g.standard_normal((p, d)))
                dev = e.to_device
                out = _core.kpool_append(dev(hist_k), dev(hist_g), dev(self.ape),
                                         dev(np.zeros((tail_rows, d), np.float32)),
                                         dev(np.zeros((tail_rows, d), np.float32)),
                                         dev(f32(np.full((max_pools, d), SENTINEL))), pos=0,
                                         engine=e)
                st = tuple(e.to_host(a) for a in out)
            self.state.append(st)

    def device_lists(self):
        dev = self.e.to_device
        return ([dev(s[0]) for s in self.state], [dev(s[1]) for s in self.state],
                [dev(s[2]) for s in self.state])

    def decode(self, pos_arg):
        tk, tg, pk = self.device_lists()
        dev = self.e.to_device
        assert _core.kpool_append_decode(dev(self.k), dev(self.gate), dev(self.ape), tk, tg, pk,
                                         pos_arg, engine=self.e) is None
        h = self.e.to_host
        return [(h(tk[b]), h(tg[b]), h(pk[b])) for b in range(self.B)]

    def per_sequence_gpu(self, b):
        dev = self.e.to_device
        out = _core.kpool_append(dev(self.k[b:b + 1]), dev(self.gate[b:b + 1]), dev(self.ape),
                                 *(dev(a) for a in self.state[b]), pos=self.pos[b], engine=self.e)
        return tuple(self.e.to_host(a) for a in out)

    def per_sequence_cpu(self, b):
        return _core.kpool_append(self.k[b:b + 1], self.gate[b:b + 1], self.ape,
                                  *(a.copy() for a in self.state[b]), pos=self.pos[b])


@pytest.mark.parametrize("batch", list(BATCHES))
@pytest.mark.parametrize("geom", [(4, 32, 8), (4, 128, 8), (4, 32, 16), (3, 7, 6), (1, 5, 2),
                                  (16, 200, 16)])
def test_append_decode_equals_per_sequence(e, batch, geom):
    pool, d, tail_rows = geom
    positions = BATCHES[batch]
    ab = AppendBatch(e, positions, d, pool, tail_rows, seed=len(positions) * 100 + d + pool)
    results = [ab.decode(form) for form in pos_forms(e, positions)]
    for b, p in enumerate(positions):
        got = results[0][b]
        for a, c in zip(got, results[1][b]):  # host pos == device pos, bytes for bytes
            np.testing.assert_array_equal(a, c)
        if p < 0:  # idle: untouched
            for a, s in zip(got, ab.state[b]):
                np.testing.assert_array_equal(a, s)
            continue
        want = ab.per_sequence_gpu(b)
        for a, w in zip(got, want):
            np.testing.assert_array_equal(a, w)
        # The CPU bookkeeping from the same state: ring exact, keys within expf's ulps; only the
        # pool this row completes changes.
        ctk, ctg, cpk = ab.per_sequence_cpu(b)
        np.testing.assert_array_equal(got[0], ctk)
        np.testing.assert_array_equal(got[1], ctg)
        np.testing.assert_allclose(got[2], cpk, **KEY_TOL)
        changed = np.flatnonzero((got[2] != ab.state[b][2]).any(1))
        completes = (p + 1) % pool == 0
        assert set(changed.tolist()) <= ({p // pool} if completes else set())
        np.testing.assert_array_equal(got[0][p % tail_rows], ab.k[b])
        np.testing.assert_array_equal(got[1][p % tail_rows], ab.gate[b])


def test_append_decode_many_steps_equal_one_shot(e):
    """Steps of one row per sequence at device positions (the replay pattern: one launch shape)
    leave the state a one-shot kpool_append of all rows leaves."""
    pool, d, tail_rows, steps = 4, 32, 8, 23
    starts = [0, 5, -1, 12]
    B = len(starts)
    g = rng(77)
    ape = f32(g.standard_normal((pool, d)))
    rows_k = f32(g.standard_normal((steps, B, d)))
    rows_g = f32(g.standard_normal((steps, B, d)))
    hist = [(f32(g.standard_normal((max(s, 0), d))), f32(g.standard_normal((max(s, 0), d))))
            for s in starts]
    max_pools = (max(starts) + steps) // pool + 1
    dev = e.to_device
    tk, tg, pk = [], [], []
    for b, s in enumerate(starts):
        st = (np.zeros((tail_rows, d), np.float32), np.zeros((tail_rows, d), np.float32),
              f32(np.full((max_pools, d), SENTINEL)))
        if s > 0:
            st = tuple(e.to_host(a) for a in _core.kpool_append(
                dev(hist[b][0]), dev(hist[b][1]), dev(ape), *(dev(a) for a in st), pos=0, engine=e))
        tk.append(dev(st[0]))
        tg.append(dev(st[1]))
        pk.append(dev(st[2]))
    idle_before = [e.to_host(a[2]) for a in (tk, tg, pk)]
    for t in range(steps):
        pos = np.array([s + t if s >= 0 else -1 for s in starts], np.int32)
        _core.kpool_append_decode(dev(rows_k[t]), dev(rows_g[t]), dev(ape), tk, tg, pk, dev(pos),
                                  engine=e)
    for b, s in enumerate(starts):
        if s < 0:
            for a, w in zip((tk, tg, pk), idle_before):
                np.testing.assert_array_equal(e.to_host(a[b]), w)
            continue
        all_k = f32(np.concatenate([hist[b][0], rows_k[:, b]]))
        all_g = f32(np.concatenate([hist[b][1], rows_g[:, b]]))
        want = _core.kpool_append(dev(all_k), dev(all_g), dev(ape),
                                  dev(np.zeros((tail_rows, d), np.float32)),
                                  dev(np.zeros((tail_rows, d), np.float32)),
                                  dev(f32(np.full((max_pools, d), SENTINEL))), pos=0, engine=e)
        for a, w in zip((tk[b], tg[b], pk[b]), want):
            np.testing.assert_array_equal(e.to_host(a), e.to_host(w))


# ---------------------------------------------------------------- scores


class ScoreBatch:
    def __init__(self, positions, Hi, d, pool, seed):
        g = rng(seed)
        self.pos, self.Hi, self.d, self.pool = positions, Hi, d, pool
        self.B = len(positions)
        self.q = f32(g.standard_normal((self.B, Hi, d)))
        self.w = f32(g.standard_normal((self.B, Hi)) + 0.5)
        # Per sequence: exactly n_b keys (at least one row) or a few spare rows of NaN (never read).
        self.keys = []
        for b, p in enumerate(positions):
            n = n_pools_of(p, pool)
            k = f32(g.standard_normal((max(n, 1) + 3 * (b % 2), d)))
            k[n:] = np.nan
            self.keys.append(k)
        self.kw = dict(pool=pool, qk_scale=d ** -0.5, head_scale=Hi ** -0.5)

    def gpu(self, e, pos_arg, **kw):
        dev = e.to_device
        return e.to_host(_core.kpool_score_decode(dev(self.q), dev(self.w),
                                                  [dev(k) for k in self.keys], pos_arg, engine=e,
                                                  **self.kw, **kw))

    def per_sequence(self, e, b):
        n = n_pools_of(self.pos[b], self.pool)
        args = (self.q[b:b + 1], self.w[b:b + 1], f32(self.keys[b][:n]))
        kw = dict(first_pos=self.pos[b], **self.kw)
        gpu = e.to_host(_core.kpool_score(*(e.to_device(a) for a in args), engine=e, **kw))
        return gpu[0], _core.kpool_score(*args, **kw)[0]


SCORE_GEOMS = [(16, 32), (32, 128), (5, 36), (3, 33), (2, 160), (1, 7), (40, 64)]  # Hi > 32: other kernel


@pytest.mark.parametrize("batch", list(BATCHES))
@pytest.mark.parametrize("geom", SCORE_GEOMS)
def test_score_decode_equals_per_sequence(e, batch, geom):
    Hi, d = geom
    pool = 4
    positions = BATCHES[batch]
    sb = ScoreBatch(positions, Hi, d, pool, seed=Hi * 1000 + d + len(positions))
    longest = max(k.shape[0] for k in sb.keys)
    for max_pools in (None, longest + 70):  # default width, and whole blocks past every row
        outs = [sb.gpu(e, form, max_pools=max_pools) for form in pos_forms(e, positions)]
        np.testing.assert_array_equal(outs[0], outs[1])
        got = outs[0]
        assert got.shape == (len(positions), max_pools or longest) and got.dtype == np.float32
        for b, p in enumerate(positions):
            n = n_pools_of(p, pool)
            assert np.isneginf(got[b, n:]).all()
            if p < 0:
                continue
            gpu, cpu = sb.per_sequence(e, b)
            np.testing.assert_array_equal(got[b, :n], gpu)
            assert_scores(got[b, :n], cpu)
            assert np.isfinite(got[b, :n]).all()


def test_score_decode_rows_independent_of_batch(e):
    """A sequence's scores do not depend on the other rows (idle or not) nor on max_pools."""
    Hi, d, pool, _ = REAL
    sb = ScoreBatch([1000, 7, -1, 4099], Hi, d, pool, seed=5)
    full = sb.gpu(e, sb.pos)
    alone = ScoreBatch([1000], Hi, d, pool, seed=5)
    alone.q, alone.w, alone.keys = sb.q[:1], sb.w[:1], sb.keys[:1]
    got = alone.gpu(e, [1000], max_pools=full.shape[1])
    np.testing.assert_array_equal(got[0], full[0])
    idled = sb.gpu(e, [1000, -1, -1, -1])
    np.testing.assert_array_equal(idled[0], full[0])
    assert np.isneginf(idled[1:]).all()


def test_score_decode_keys_the_call_alone_holds(e):
    """pool_keys as arrays only the call holds (DLPack capsules it imports, a sequence that makes
    a fresh array per item): each key array stays alive until the launch has read it (they were
    freed as the argument walk moved on, and the output could take their memory)."""
    Hi, d, pool = 16, 32, 4
    sb = ScoreBatch([1000, 7, 4099, 63], Hi, d, pool, seed=11)
    want = sb.gpu(e, sb.pos)
    dev = e.to_device

    class Fresh(collections.abc.Sequence):
        def __len__(self):
            return len(sb.keys)

        def __getitem__(self, i):
            return dev(sb.keys[i])

    for keys in ([dev(k).__dlpack__() for k in sb.keys], Fresh()):
        got = e.to_host(_core.kpool_score_decode(dev(sb.q), dev(sb.w), keys, sb.pos, engine=e,
                                                 **sb.kw))
        np.testing.assert_array_equal(got, want)


# ---------------------------------------------------------------- selection


def select_scores(positions, pool, max_pools, seed):
    """Scores with ties, -0.0 / +0.0, non-finite entries and finite garbage past each row's
    n_pools (never a candidate: the pools are not visible)."""
    g = rng(seed)
    B = len(positions)
    s = f32(np.where(g.random((B, max_pools)) < 0.5, g.integers(-4, 5, size=(B, max_pools)) * 0.5,
                     g.standard_normal((B, max_pools))))
    s[g.random((B, max_pools)) < 0.1] = -0.0
    s[g.random((B, max_pools)) < 0.05] = -np.inf
    s[g.random((B, max_pools)) < 0.02] = np.nan
    s[g.random((B, max_pools)) < 0.02] = np.inf
    return s


SELECT_BATCHES = dict(BATCHES, b4_long=[8191, 4099, -1, 2050], b3_ties=[1023, 1023, 63])


@pytest.mark.parametrize("batch", list(SELECT_BATCHES))
@pytest.mark.parametrize("geom", ["tiny", "real", "pool1", "pool3"])
def test_select_decode_equals_per_sequence(e, batch, geom):
    _, _, pool, topk = {"tiny": TINY, "real": REAL, "pool1": (0, 0, 1, 5),
                        "pool3": (0, 0, 3, 21)}[geom]
    positions = SELECT_BATCHES[batch]
    select_k = topk // pool
    max_pools = max(n_pools_of(p, pool) for p in positions) + 9
    score = select_scores(positions, pool, max_pools, seed=len(positions) * 13 + pool + topk)
    if batch == "b3_ties":
        score[0] = 1.0  # every score tied: the lowest pools win
    for width in (topk + pool - 1, topk + pool + 4):
        kw = dict(pool=pool, select_k=select_k, width=width)
        outs = [e.to_host(_core.kpool_select_decode(e.to_device(score), form, engine=e, **kw))
                for form in pos_forms(e, positions)]
        np.testing.assert_array_equal(outs[0], outs[1])
        got = outs[0]
        assert got.shape == (len(positions), width) and got.dtype == np.int32
        for b, p in enumerate(positions):
            if p < 0:
                assert (got[b] == -1).all()
                continue
            n = n_pools_of(p, pool)
            row = f32(score[b:b + 1, :n])
            gpu = e.to_host(_core.kpool_select(e.to_device(row), first_pos=p, engine=e, **kw))
            np.testing.assert_array_equal(got[b], gpu[0])
            np.testing.assert_array_equal(got[b], _core.kpool_select(row, first_pos=p, **kw)[0])
            assert ((got[b] >= 0) & (got[b] <= p)).sum() == (got[b] >= 0).sum()


# ---------------------------------------------------------------- the whole indexer step


@pytest.mark.parametrize("geom", ["tiny", "real"])
def test_indexer_decode_steps_equal_per_sequence(e, geom):
    """append -> score -> select, several steps at device positions with one launch shape (B and
    max_pools fixed), against the per-sequence CUDA ops step by step: bytes for bytes."""
    Hi, d, pool, topk = TINY if geom == "tiny" else REAL
    tail_rows, steps = 2 * pool, 6
    starts = [0, 2, -1, 1021, 126, 3]
    B = len(starts)
    g = rng(len(geom) + d)
    ape = f32(g.standard_normal((pool, d)))
    max_pools = (max(starts) + steps) // pool + 1
    dev = e.to_device
    lists = ([], [], [])
    seq = []
    for s in starts:
        st = (np.zeros((tail_rows, d), np.float32), np.zeros((tail_rows, d), np.float32),
              f32(np.full((max_pools, d), SENTINEL)))
        if s > 0:
            hk, hg = f32(g.standard_normal((s, d))), f32(g.standard_normal((s, d)))
            st = tuple(e.to_host(a) for a in _core.kpool_append(dev(hk), dev(hg), dev(ape),
                                                                   *(dev(a) for a in st), pos=0,
                                                                   engine=e))
        for lst, a in zip(lists, st):
            lst.append(dev(a))
        seq.append(tuple(dev(a) for a in st))
    sel = dict(pool=pool, select_k=topk // pool, width=topk + pool - 1)
    scale = dict(qk_scale=d ** -0.5, head_scale=Hi ** -0.5)
    for t in range(steps):
        pos = [s + t if s >= 0 else -1 for s in starts]
        pos_d = dev(np.array(pos, np.int32))
        k, gt = f32(g.standard_normal((B, d))), f32(g.standard_normal((B, d)))
        q, w = f32(g.standard_normal((B, Hi, d))), f32(g.standard_normal((B, Hi)) + 0.5)
        _core.kpool_append_decode(dev(k), dev(gt), dev(ape), *lists, pos_d, engine=e)
        score = _core.kpool_score_decode(dev(q), dev(w), lists[2], pos_d, max_pools=max_pools,
                                         engine=e, pool=pool, **scale)
        idx = e.to_host(_core.kpool_select_decode(score, pos_d, engine=e, **sel))
        score = e.to_host(score)
        for b, p in enumerate(pos):
            if p < 0:
                assert (idx[b] == -1).all() and np.isneginf(score[b]).all()
                continue
            seq[b] = _core.kpool_append(dev(k[b:b + 1]), dev(gt[b:b + 1]), dev(ape), *seq[b],
                                        pos=p, engine=e)
            n = (p + 1) // pool
            keys = f32(e.to_host(seq[b][2])[:n])
            s1 = e.to_host(_core.kpool_score(dev(q[b:b + 1]), dev(w[b:b + 1]), dev(keys),
                                             pool=pool, first_pos=p, engine=e, **scale))
            np.testing.assert_array_equal(score[b, :n], s1[0])
            i1 = e.to_host(_core.kpool_select(dev(s1), first_pos=p, engine=e, **sel))
            np.testing.assert_array_equal(idx[b], i1[0])
            for a, w_ in zip((lists[0][b], lists[1][b], lists[2][b]), seq[b]):
                np.testing.assert_array_equal(e.to_host(a), e.to_host(w_))


# ---------------------------------------------------------------- errors


def test_decode_bad_arguments_raise(e):
    pool, d, ring = 4, 32, 8
    g = rng(2)
    dev = e.to_device
    k, gate, ape = (f32(g.standard_normal((2, d))), f32(g.standard_normal((2, d))),
                    f32(g.standard_normal((pool, d))))

    def lists(ring_rows=ring, pk_rows=3, n=2):
        return ([dev(np.zeros((ring_rows, d), np.float32)) for _ in range(n)],
                [dev(np.zeros((ring_rows, d), np.float32)) for _ in range(n)],
                [dev(np.zeros((pk_rows, d), np.float32)) for _ in range(n)])

    def append(pos=(3, 5), engine=e, **kw):
        return _core.kpool_append_decode(dev(k), dev(gate), dev(ape), *lists(**kw), list(pos),
                                         engine=engine)

    append(pos=(11, 0))  # 12 // 4 = 3 pools: fits 3 rows of keys
    for kwargs, code in [(dict(ring_rows=6), ST.CONTRACT_POOL), (dict(n=3), ST.CONTRACT_SHAPE),
                         (dict(pos=(15, 0)), ST.CONTRACT_SHAPE),  # pool 3 needs 4 rows
                         (dict(pos=(0,)), ST.CONTRACT_SHAPE),
                         (dict(pos=(2**31 - 1, 0)), ST.CONTRACT_RANGE)]:
        with pytest.raises(memra.ContractError) as err:
            append(**kwargs)
        assert err.value.code == code, kwargs
    # Arrays the launch writes sharing memory (one ring twice), or a new row that is a written
    # array: CONTRACT_VALUE naming both, nothing written.
    tk, tg, pk = lists(pk_rows=2)
    with pytest.raises(memra.ContractError) as err:
        _core.kpool_append_decode(dev(k), dev(gate), dev(ape), [tk[0], tk[0]], tg, pk, [3, 5],
                                  engine=e)
    assert err.value.code == ST.CONTRACT_VALUE and "'tail_k[0]'" in str(err.value)
    with pytest.raises(memra.ContractError) as err:
        _core.kpool_append_decode(pk[0], dev(gate), dev(ape), tk, tg, pk, [3, 5], engine=e)
    assert err.value.code == ST.CONTRACT_VALUE and "'pool_keys[0]'" in str(err.value)
    assert not np.any(e.to_host(pk[0])) and not np.any(e.to_host(tk[0]))
    with pytest.raises(memra.UnsupportedError):
        _core.kpool_append_decode(k, gate, ape, *[[np.zeros((ring, d), np.float32)] * 2] * 3,
                                  [0, 1])
    q, w = f32(g.standard_normal((2, 3, d))), f32(g.standard_normal((2, 3)))
    keys = [dev(np.zeros((2, d), np.float32)) for _ in range(2)]
    with pytest.raises(memra.ContractError) as err:  # pos 11 sees 3 pools, 2 rows of keys
        _core.kpool_score_decode(dev(q), dev(w), keys, [11, 0], pool=pool, qk_scale=1.0,
                                 head_scale=1.0, engine=e)
    assert err.value.code == ST.CONTRACT_RANGE
    with pytest.raises(memra.ContractError) as err:
        _core.kpool_score_decode(dev(q), dev(w), keys, [7, 0], pool=pool, qk_scale=1.0,
                                 head_scale=1.0, max_pools=1, engine=e)
    assert err.value.code == ST.CONTRACT_VALUE
    score = dev(f32(g.standard_normal((2, 5))))
    with pytest.raises(memra.ContractError) as err:
        _core.kpool_select_decode(score, [3, 4], pool=pool, select_k=2, width=2 * pool + pool - 2,
                                  engine=e)
    assert err.value.code == ST.CONTRACT_INDEX_WIDTH
    with pytest.raises(memra.ContractError) as err:  # pos 23 sees 6 pools, score has 5
        _core.kpool_select_decode(score, [23, 4], pool=pool, select_k=2, width=20, engine=e)
    assert err.value.code == ST.CONTRACT_RANGE
    # The engine is still usable.
    idx = e.to_host(_core.kpool_select_decode(score, [19, -1], pool=pool, select_k=2, width=11,
                                              engine=e))
    assert idx.shape == (2, 11) and (idx[1] == -1).all()


# ---------------------------------------------------------------- sanitizer


def test_sanitizer_small(e):
    """Every decode kernel once on small shapes, idle rows included (compute-sanitizer racecheck /
    memcheck): append, the resident scorer (float4 and scalar q loads), the any-d scorer, the
    radix select (several sequences per launch)."""
    pool, tail_rows = 4, 8
    positions = [3, -1, 9]
    for Hi, d in [(5, 32), (3, 33), (2, 160)]:
        ab = AppendBatch(e, positions, d, pool, tail_rows, seed=d)
        ab.decode(positions)
        sb = ScoreBatch(positions, Hi, d, pool, seed=d + 1)
        sb.gpu(e, positions, max_pools=70)
    score = np.round(f32(rng(3).standard_normal((3, 700))), 1)  # many ties
    _core.kpool_select_decode(e.to_device(score), [2799, -1, 1000], pool=pool, select_k=16,
                              width=16 * pool + pool - 1, engine=e)
    e.synchronize()
