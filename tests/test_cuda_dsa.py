"""DSA k-pool indexer on the CUDA backend (``memra._core.kpool_pool_keys`` / ``kpool_append`` /
``kpool_score`` / ``kpool_select`` with ``engine=memra.Engine("cuda")``, kernels in cuda/dsa.cu)
against the same ops on the CPU backend (cpp/src/cpu/dsa.cpp, the oracle) and against the CPU
MlaLayer's own indexer bookkeeping (the pool keys it leaves in a Cache).

Tolerances and byte-identity claims (both sides f32):
- Pool keys: the CPU's operations in the CPU's order without FMA; only CUDA's expf (<= 2 ulp) vs
  glibc's differs, so each softmax weight is within ~6e-7 relative and a key within
  ~6e-7 * max|k| absolute: ``rtol=1e-5, atol=5e-6`` (k ~ N(0, 1)). Chunked appends, one-shot
  appends and kpool_pool_keys on the GPU run one device routine on the same bytes:
  ``np.array_equal``. The tail ring holds copies: ``np.array_equal`` against the CPU too.
- Scores: both CUDA scorers do the CPU's sequential sums (heads ascending, channels ascending)
  with explicitly rounded multiplies and adds: tiled == reference with ``np.array_equal``, and ==
  the CPU with ``np.array_equal`` where the CPU build does not contract into FMAs (x86-64 without
  -march; elsewhere ``rtol=1e-5, atol=1e-5`` on scores of magnitude ~10).
- Selection is exact on a given score array: radix == reference == CPU with ``np.array_equal``.

A small shape for ``compute-sanitizer --tool racecheck`` / ``--tool memcheck``:
``python -m pytest tests/test_cuda_dsa.py -k sanitizer``.
"""

from __future__ import annotations

import platform

import numpy as np
import pytest

import memra
from memra import _core
from cuda_helpers import f32, rng

pytestmark = pytest.mark.cuda

ST = _core.status
KEY_TOL = dict(rtol=1e-5, atol=5e-6)
# The CPU oracle sums without FMA on x86-64 (no -march in the build), so the bytes must agree.
CPU_EXACT = platform.machine() in ("x86_64", "AMD64")

# (Hi, d, pool, topk): tiny test geometry and the GLM-5.3-Flash indexer.
TINY = (16, 32, 4, 8)
REAL = (32, 128, 4, 2048)


def causal_first_pos(n_pools, pool, t_q):
    """The last of t_q queries sees every pool and 2 tail rows (or the queries start at 0)."""
    return max(0, n_pools * pool + 1 - t_q)


def assert_vs_cpu_scores(got, want):
    assert got.shape == want.shape and got.dtype == np.float32
    if CPU_EXACT:
        np.testing.assert_array_equal(got, want)
    else:
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------- pool keys


@pytest.mark.parametrize("pool,n_rows,d", [(4, 203, 32), (4, 64, 128), (1, 5, 7), (3, 11, 7),
                                           (16, 40, 9), (4, 3, 32), (4, 0, 32)])
def test_pool_keys_match_cpu(e, pool, n_rows, d):
    g = rng(pool * 1000 + n_rows + d)
    k, gate = f32(g.standard_normal((n_rows, d))), f32(3 * g.standard_normal((n_rows, d)))
    ape = f32(g.standard_normal((pool, d)))
    want = _core.kpool_pool_keys(k, gate, ape)
    got = e.to_host(_core.kpool_pool_keys(e.to_device(k), e.to_device(gate), e.to_device(ape),
                                          engine=e))
    assert got.shape == want.shape == (n_rows // pool, d) and got.dtype == np.float32
    np.testing.assert_allclose(got, want, **KEY_TOL)


def test_pool_keys_extreme_gates_stay_finite(e):
    """Gates of +-80 (exp overflows without the max shift) give finite, CPU-close keys."""
    g = rng(5)
    pool, d, n = 4, 32, 64
    k = f32(g.standard_normal((n, d)))
    gate = f32(80 * np.sign(g.standard_normal((n, d))))
    ape = f32(g.standard_normal((pool, d)))
    got = e.to_host(_core.kpool_pool_keys(e.to_device(k), e.to_device(gate), e.to_device(ape),
                                          engine=e))
    assert np.all(np.isfinite(got))
    np.testing.assert_allclose(got, _core.kpool_pool_keys(k, gate, ape), **KEY_TOL)


# ---------------------------------------------------------------- kpool_append

SCHEDULES = {
    "one_shot": None,
    "steps_of_1": [1],
    "chunks_of_3": [3],
    "chunks_of_5": [5],
    "chunks_of_64": [64],
    "mixed": [1, 2, 7, 64, 3, 1, 65, 5],
}
SENTINEL = 7.0  # pool_keys rows no call should touch keep it


def chunks(n, schedule):
    if schedule is None:
        return [(0, n)]
    out, pos, j = [], 0, 0
    while pos < n:
        t = min(schedule[j % len(schedule)], n - pos)
        out.append((pos, t))
        pos, j = pos + t, j + 1
    return out


def append_run(k, gate, ape, tail_rows, max_pools, schedule, engine=None):
    """Feed rows [0, n) through kpool_append in the schedule's chunks; host results."""
    d = k.shape[1]
    host = engine is None
    dev = (lambda a: a) if host else engine.to_device
    back = (lambda a: a) if host else engine.to_host
    tk = dev(np.zeros((tail_rows, d), np.float32))
    tg = dev(np.zeros((tail_rows, d), np.float32))
    pk = dev(np.full((max_pools, d), SENTINEL, np.float32))
    for pos, t in chunks(k.shape[0], schedule):
        tk, tg, pk = _core.kpool_append(dev(k[pos:pos + t]), dev(gate[pos:pos + t]), dev(ape), tk,
                                        tg, pk, pos=pos, engine=engine)
    return back(tk), back(tg), back(pk)


@pytest.mark.parametrize("pool,d,tail_rows,n", [(4, 32, 8, 203), (4, 128, 8, 130), (3, 7, 6, 50),
                                                (4, 32, 16, 70), (1, 5, 2, 9), (4, 32, 8, 6)])
@pytest.mark.parametrize("schedule", list(SCHEDULES))
def test_kpool_append_chunks_equal_one_shot_and_cpu(e, pool, d, tail_rows, n, schedule):
    g = rng(pool + d + tail_rows + n)
    k, gate = f32(g.standard_normal((n, d))), f32(2 * g.standard_normal((n, d)))
    ape = f32(g.standard_normal((pool, d)))
    max_pools = n // pool + 2
    sched = SCHEDULES[schedule]
    tk, tg, pk = append_run(k, gate, ape, tail_rows, max_pools, sched, engine=e)
    tk1, tg1, pk1 = append_run(k, gate, ape, tail_rows, max_pools, None, engine=e)
    # Chunked == one shot, bytes for bytes (one device routine, the same row bytes).
    np.testing.assert_array_equal(pk, pk1)
    np.testing.assert_array_equal(tk, tk1)
    np.testing.assert_array_equal(tg, tg1)
    # == the GPU rebuild from all rows; pools not complete yet are untouched.
    n_pools = n // pool
    rebuilt = e.to_host(_core.kpool_pool_keys(e.to_device(k), e.to_device(gate), e.to_device(ape),
                                              engine=e))
    np.testing.assert_array_equal(pk[:n_pools], rebuilt)
    assert (pk[n_pools:] == SENTINEL).all()
    # == the CPU bookkeeping (MlaLayer::indexer's) on the same schedule: keys within expf's
    # ulps, the ring exactly (copies), the newest rows at r % tail_rows.
    ctk, ctg, cpk = append_run(k, gate, ape, tail_rows, max_pools, sched)
    np.testing.assert_allclose(pk, cpk, **KEY_TOL)
    np.testing.assert_array_equal(tk, ctk)
    np.testing.assert_array_equal(tg, ctg)
    for r in range(max(0, n - tail_rows), n):
        np.testing.assert_array_equal(tk[r % tail_rows], k[r])
        np.testing.assert_array_equal(tg[r % tail_rows], gate[r])


def test_kpool_append_leaves_resident_pools_alone(e):
    """Pools before pos // pool are final: a call never rewrites them (a marker survives), and
    the pool straddling pos is completed from the ring rows it needs."""
    pool, d, tail_rows = 4, 32, 8
    g = rng(11)
    k, gate = f32(g.standard_normal((27, d))), f32(g.standard_normal((27, d)))
    ape = f32(g.standard_normal((pool, d)))
    tk, tg, pk = append_run(k[:20], gate[:20], ape, tail_rows, 8, None, engine=e)
    pk[:5] = -3.0  # pools 0..4 (rows < 20) are resident from here on
    state = (e.to_device(tk), e.to_device(tg), e.to_device(pk))
    # Rows 20, 21, then 22..26: pool 5 (rows 20..23) straddles the second call.
    state = _core.kpool_append(e.to_device(k[20:22]), e.to_device(gate[20:22]), e.to_device(ape), *state,
                               pos=20, engine=e)
    state = _core.kpool_append(e.to_device(k[22:]), e.to_device(gate[22:]), e.to_device(ape), *state,
                               pos=22, engine=e)
    got = e.to_host(state[2])
    assert (got[:5] == -3.0).all()
    want = e.to_host(_core.kpool_pool_keys(e.to_device(k), e.to_device(gate), e.to_device(ape),
                                          engine=e))
    np.testing.assert_array_equal(got[5], want[5])
    assert (got[6:] == SENTINEL).all()  # rows 24..26: no complete pool yet


def mla_layer_arrays(g, D, H, ql, R, dn, dv, Hi, di, pool):
    def w(*shape, s=0.3):
        return f32(g.standard_normal(shape) * s)

    return {
        "q_a_proj.weight": w(ql, D), "q_a_layernorm.weight": w(ql, s=1.0),
        "q_b_proj.weight": w(H * dn, ql), "kv_a_proj_with_mqa.weight": w(R, D),
        "kv_a_layernorm.weight": w(R, s=1.0), "kv_b_proj.weight": w(H * (dn + dv), R),
        "o_proj.weight": w(D, H * dv), "indexer.wq_b.weight": w(Hi * di, ql),
        "indexer.wk.weight": w(di, D), "indexer.k_norm.weight": w(di, s=1.0),
        "indexer.k_norm.bias": w(di, s=1.0), "indexer.weights_proj.weight": w(Hi, D),
        "indexer.index_kpool_compress_ape": w(pool, di, s=1.0),
        "indexer.index_kpool_compress_gate": w(di, D),
    }


@pytest.mark.parametrize("schedule", [[1], [3], [5], [64], [2, 7, 1, 64, 3]])
def test_kpool_append_matches_mla_layer_bookkeeping(e, schedule):
    """The CPU MlaLayer fed in chunks leaves pool keys in its Cache; kpool_append on the CPU
    reproduces them bytes for bytes from the same k / gate rows (the layer's CPU ops on the same
    chunks), and on the GPU within expf's ulps (KEY_TOL)."""
    D, H, ql, R, dn, dv = 24, 2, 16, 8, 8, 8
    Hi, di, pool, topk = TINY
    tail_rows = 2 * pool
    n = 75
    g = rng(len(schedule) * 31 + schedule[0])
    arrays = mla_layer_arrays(g, D, H, ql, R, dn, dv, Hi, di, pool)
    cpu = memra.Engine("cpu")
    layer = _core.MlaLayer(cpu, {name: _core.Weight(a) for name, a in arrays.items()}, hidden=D,
                           heads=H, q_lora_rank=ql, kv_rank=R, d_nope=dn, d_rope=0, d_v=dv,
                           sparse=True, index_heads=Hi, index_head_dim=di, kpool=pool, topk=topk,
                           tail_rows=tail_rows)
    cache = memra.Cache(cpu, [layer.state_spec()], max_batch=1, max_len=n)
    x = f32(g.standard_normal((n, D)))
    wk = _core.Weight(arrays["indexer.wk.weight"])
    wg = _core.Weight(arrays["indexer.index_kpool_compress_gate"])
    ape = arrays["indexer.index_kpool_compress_ape"]
    max_pools = n // pool
    cpu_state = (np.zeros((tail_rows, di), np.float32), np.zeros((tail_rows, di), np.float32),
                 np.zeros((max_pools, di), np.float32))
    gpu_state = tuple(e.to_device(a) for a in cpu_state)
    for pos, t in chunks(n, schedule):
        layer.prefill(cache, 0, 0, x[pos:pos + t])
        cache.commit(0, t)
        k = _core.layer_norm(_core.linear(x[pos:pos + t], wk), arrays["indexer.k_norm.weight"],
                             arrays["indexer.k_norm.bias"], eps=1e-6)
        gate = _core.linear(x[pos:pos + t], wg)
        cpu_state = _core.kpool_append(k, gate, ape, *cpu_state, pos=pos)
        gpu_state = _core.kpool_append(e.to_device(k), e.to_device(gate), e.to_device(ape),
                                       *gpu_state, pos=pos, engine=e)
    want = cache.pool_keys(0, 0)
    assert want.shape == (max_pools, di)
    np.testing.assert_array_equal(cpu_state[2], want)
    np.testing.assert_allclose(e.to_host(gpu_state[2]), want, **KEY_TOL)
    np.testing.assert_array_equal(e.to_host(gpu_state[0]), cpu_state[0])
    np.testing.assert_array_equal(e.to_host(gpu_state[1]), cpu_state[1])


def test_kpool_append_bad_arguments_raise(e):
    """Each refusal names its code; the engine stays usable. (Device arrays are DLPack capsules,
    consumed by the call, and kpool_append returns new arrays: inputs are never written.)"""
    pool, d = 4, 32
    g = rng(3)
    k, gate = f32(g.standard_normal((5, d))), f32(g.standard_normal((5, d)))
    ape = f32(g.standard_normal((pool, d)))
    ring = np.ones((8, d), np.float32)
    pk = np.full((4, d), SENTINEL, np.float32)

    def call(k=k, ring_k=ring, ring_g=ring, pk=pk, pos=0, host_k=False):
        return _core.kpool_append(k if host_k else e.to_device(k), e.to_device(gate),
                                  e.to_device(ape), e.to_device(ring_k), e.to_device(ring_g),
                                  e.to_device(pk), pos=pos, engine=e)

    bad_ring = np.ones((6, d), np.float32)  # not a multiple of pool
    for kwargs, code in [(dict(ring_k=bad_ring, ring_g=bad_ring), ST.CONTRACT_POOL),
                         (dict(pk=pk[:3], pos=14), ST.CONTRACT_SHAPE),  # pools up to 19 // 4 = 4
                         (dict(pos=-1), ST.CONTRACT_VALUE),
                         (dict(ring_g=ring[:4]), ST.CONTRACT_SHAPE),
                         (dict(k=f32(k[:, :5])), ST.CONTRACT_SHAPE),
                         (dict(k=k.astype(np.float64)), ST.CONTRACT_DTYPE),
                         (dict(host_k=True), ST.CONTRACT_DEVICE)]:
        with pytest.raises(memra.ContractError) as err:
            call(**kwargs)
        assert err.value.code == code, kwargs
    tk, tg, keys = (e.to_host(a) for a in call(pos=2))
    np.testing.assert_array_equal(tk[2:7], k)  # rows 2..6 at r % 8
    assert (keys[0] != SENTINEL).all() and (keys[2:] == SENTINEL).all()


# ---------------------------------------------------------------- scores


def score_inputs(seed, t_q, Hi, d, n_pools):
    g = rng(seed)
    q = f32(g.standard_normal((t_q, Hi, d)))
    w = f32(g.standard_normal((t_q, Hi)) + 0.5)
    keys = f32(g.standard_normal((n_pools, d)))
    return q, w, keys


def scores_all(e, q, w, keys, pool, first_pos):
    Hi, d = q.shape[1], q.shape[2]
    kw = dict(pool=pool, first_pos=first_pos, qk_scale=d ** -0.5, head_scale=Hi ** -0.5)
    want = _core.kpool_score(q, w, keys, **kw)
    dev = e.to_device  # device arrays are DLPack capsules: one per call
    fast = e.to_host(_core.kpool_score(dev(q), dev(w), dev(keys), engine=e, **kw))
    ref = e.to_host(_core.kpool_score(dev(q), dev(w), dev(keys), reference=True, engine=e, **kw))
    return fast, ref, want


@pytest.mark.parametrize("t_q", [1, 7, 65])
@pytest.mark.parametrize("n_pools", [1, 3, 300, 5000])
@pytest.mark.parametrize("geom", ["tiny", "real"])
def test_score_tiled_equals_reference_and_cpu(e, t_q, n_pools, geom):
    Hi, d, pool, _ = TINY if geom == "tiny" else REAL
    if geom == "real" and t_q == 65 and n_pools > 300:
        n_pools = 300  # keep the CPU oracle (65 x 5000 x 4096 multiply-adds) under a second
    q, w, keys = score_inputs(t_q * 10007 + n_pools, t_q, Hi, d, n_pools)
    # The last query sees every pool plus 2 tail rows; earlier queries see fewer (from 0 when
    # there are more queries than rows).
    first_pos = causal_first_pos(n_pools, pool, t_q)
    fast, ref, want = scores_all(e, q, w, keys, pool, first_pos)
    np.testing.assert_array_equal(fast, ref)
    assert_vs_cpu_scores(fast, want)
    assert np.isneginf(fast).any() == np.isneginf(want).any()


@pytest.mark.parametrize("t_q,n_pools,first_pos", [(65, 20, 0), (200, 50, 0), (130, 33, 3),
                                                   (1, 0, 9), (17, 5, 100)])
def test_score_causal_prefill_and_edges(e, t_q, n_pools, first_pos):
    """Prefill from position 0 (whole tiles masked, skipped), no pools, all pools visible."""
    Hi, d, pool, _ = TINY
    q, w, keys = score_inputs(t_q + n_pools, t_q, Hi, d, n_pools)
    fast, ref, want = scores_all(e, q, w, keys, pool, first_pos)
    assert fast.shape == (t_q, n_pools)
    np.testing.assert_array_equal(fast, ref)
    assert_vs_cpu_scores(fast, want)


@pytest.mark.parametrize("t_q", [1, 7, 19])
def test_score_odd_dims(e, t_q):
    """d not a multiple of the 32-channel slice, d above the resident tile's 128 (the sliced
    kernel for few queries), Hi = 1, pool 1 / 3 / 16; each scorer kind (t_q < 16 or not)."""
    for Hi, d, pool in [(1, 33, 3), (3, 70, 1), (5, 7, 16), (2, 160, 4), (3, 129, 2)]:
        q, w, keys = score_inputs(Hi * d + t_q, t_q, Hi, d, 41)
        fast, ref, want = scores_all(e, q, w, keys, pool, first_pos=41 * pool - 10)
        np.testing.assert_array_equal(fast, ref)
        assert_vs_cpu_scores(fast, want)


# ---------------------------------------------------------------- selection


def select_all(e, score, pool, select_k, width, first_pos):
    kw = dict(pool=pool, select_k=select_k, width=width, first_pos=first_pos)
    want = _core.kpool_select(score, **kw)
    radix = e.to_host(_core.kpool_select(e.to_device(score), engine=e, **kw))
    ref = e.to_host(_core.kpool_select(e.to_device(score), reference=True, engine=e, **kw))
    return radix, ref, want


def check_select(e, score, pool, select_k, width, first_pos):
    radix, ref, want = select_all(e, score, pool, select_k, width, first_pos)
    assert radix.dtype == np.int32 and radix.shape == want.shape == (score.shape[0], width)
    np.testing.assert_array_equal(ref, want)
    np.testing.assert_array_equal(radix, want)
    return want


@pytest.mark.parametrize("t_q", [1, 7, 65])
@pytest.mark.parametrize("n_pools", [1, 3, 300, 5000])
@pytest.mark.parametrize("geom", ["tiny", "real"])
def test_select_radix_equals_reference_and_cpu(e, t_q, n_pools, geom):
    _, _, pool, topk = TINY if geom == "tiny" else REAL
    select_k = topk // pool
    g = rng(t_q * 7 + n_pools)
    score = f32(g.standard_normal((t_q, n_pools)) * 10)
    first_pos = causal_first_pos(n_pools, pool, t_q)
    invisible = np.arange(n_pools)[None, :] * pool + pool - 1 > first_pos + np.arange(t_q)[:, None]
    score[invisible] = -np.inf  # as kpool_score leaves them
    for width in (topk + pool - 1, topk + pool + 4):
        check_select(e, score, pool, select_k, width, first_pos)


@pytest.mark.parametrize("geom", ["tiny", "real"])
@pytest.mark.parametrize("n_pools", [3, 300, 5000])
def test_select_ties_zeros_and_nonfinite(e, geom, n_pools):
    """Repeated scores (ties go to the lower pool), -0.0 next to +0.0 (equal on the CPU), and
    -inf / +inf / NaN pools (never selected: not finite)."""
    _, _, pool, topk = TINY if geom == "tiny" else REAL
    select_k = topk // pool
    g = rng(n_pools + pool)
    t_q = 9
    score = f32(g.integers(-3, 4, size=(t_q, n_pools)))  # 7 distinct values: ties everywhere
    score[g.random((t_q, n_pools)) < 0.2] = -0.0
    score[g.random((t_q, n_pools)) < 0.1] = -np.inf
    score[g.random((t_q, n_pools)) < 0.03] = np.inf
    score[g.random((t_q, n_pools)) < 0.03] = np.nan
    score[0] = 1.0  # one query with every score tied
    score[1] = -np.inf  # one with nothing selectable: the list is its tail
    score[2, ::2] = 0.0
    score[2, 1::2] = -0.0
    first_pos = causal_first_pos(n_pools, pool, t_q)
    want = check_select(e, score, pool, select_k, topk + pool - 1, first_pos)
    tail = (first_pos + 2) % pool  # query 1's visible tail rows
    assert (want[1, tail:] == -1).all() and (want[1, :tail] >= 0).all()


@pytest.mark.parametrize("select_k,n_pools", [(512, 100), (2, 1), (2, 0), (512, 0), (0, 10),
                                              (5, 5), (5, 6)])
def test_select_few_pools(e, select_k, n_pools):
    """Fewer finite pools than select_k take them all; no pools, or select_k = 0, leave the tail."""
    pool = 4
    t_q = 7
    g = rng(select_k + n_pools)
    score = f32(g.standard_normal((t_q, n_pools)))
    first_pos = n_pools * pool + 2
    width = select_k * pool + pool - 1
    want = check_select(e, score, pool, select_k, width, first_pos)
    live = (want >= 0).sum(1)
    assert (live == min(select_k, n_pools) * pool + (first_pos + np.arange(t_q) + 1) % pool).all()


def test_select_finite_scores_of_invisible_pools_are_ignored(e):
    """Hand-made finite scores on pools after the query are not candidates (as on the CPU)."""
    pool, select_k, n_pools, t_q = 4, 3, 40, 12
    score = f32(np.arange(n_pools)[None, :].repeat(t_q, 0))  # later pools score higher
    check_select(e, score, pool, select_k, select_k * pool + pool - 1, first_pos=5)


def test_select_pool_one_and_odd_pool(e):
    g = rng(9)
    for pool, select_k in [(1, 5), (3, 7), (16, 2)]:
        n_pools, t_q = 57, 23
        score = f32(g.standard_normal((t_q, n_pools)))
        check_select(e, score, pool, select_k, select_k * pool + pool - 1 + 3,
                     causal_first_pos(n_pools, pool, t_q))


@pytest.mark.parametrize("reference", [False, True])
def test_select_width_too_small_raises(e, reference):
    pool, select_k = 4, 2
    score = f32(rng(1).standard_normal((3, 10)))
    with pytest.raises(memra.ContractError) as err:
        _core.kpool_select(e.to_device(score), pool=pool, select_k=select_k, width=select_k * pool + pool - 2,
                           first_pos=40, reference=reference, engine=e)
    assert err.value.code == ST.CONTRACT_INDEX_WIDTH == 40014
    with pytest.raises(memra.ContractError) as err:
        _core.kpool_select(e.to_device(score), pool=0, select_k=select_k, width=20, first_pos=40, engine=e)
    assert err.value.code == ST.CONTRACT_POOL
    # The engine is still usable.
    out = e.to_host(_core.kpool_select(e.to_device(score), pool=pool, select_k=select_k,
                                       width=select_k * pool + pool - 1, first_pos=40,
                                       reference=reference, engine=e))
    assert out.shape == (3, select_k * pool + pool - 1)


def test_score_bad_arguments_raise(e):
    q, w, keys = score_inputs(0, 3, 2, 8, 5)
    dev = e.to_device
    kw = dict(first_pos=20, qk_scale=0.3, head_scale=0.7)
    with pytest.raises(memra.ContractError) as err:
        _core.kpool_score(dev(q), dev(w), dev(keys), pool=0, engine=e, **kw)
    assert err.value.code == ST.CONTRACT_POOL
    with pytest.raises(memra.ContractError) as err:
        _core.kpool_score(q, dev(w), dev(keys), pool=4, engine=e, **kw)
    assert err.value.code == ST.CONTRACT_DEVICE
    with pytest.raises(memra.ContractError) as err:
        _core.kpool_score(dev(q), dev(f32(w[:, :1])), dev(keys), pool=4, engine=e, **kw)
    assert err.value.code == ST.CONTRACT_SHAPE
    with pytest.raises(memra.ContractError) as err:
        _core.kpool_score(dev(q), dev(w), dev(keys), pool=4, engine=e, first_pos=20,
                          qk_scale=float("nan"), head_scale=0.7)
    assert err.value.code == ST.CONTRACT_VALUE


# ---------------------------------------------------------------- the whole indexer


@pytest.mark.parametrize("geom,t_kv,t_q", [("tiny", 203, 203), ("tiny", 203, 1), ("tiny", 64, 65 - 1),
                                           ("real", 4099, 1), ("real", 2600, 9)])
def test_indexer_pipeline_matches_cpu(e, geom, t_kv, t_q):
    """keys -> scores -> lists on the GPU against the CPU ops, stage by stage: keys within expf's
    ulps (which may reorder near-tied pools, so later stages take the GPU's previous output as
    their CPU input), scores as assert_vs_cpu_scores, lists exactly."""
    Hi, d, pool, topk = TINY if geom == "tiny" else REAL
    g = rng(t_kv + t_q)
    k, gate = f32(g.standard_normal((t_kv, d))), f32(g.standard_normal((t_kv, d)))
    ape = f32(g.standard_normal((pool, d)))
    q, w = f32(g.standard_normal((t_q, Hi, d))), f32(g.standard_normal((t_q, Hi)) + 0.5)
    first_pos = t_kv - t_q
    kw = dict(pool=pool, first_pos=first_pos, qk_scale=d ** -0.5, head_scale=Hi ** -0.5)
    keys_h = e.to_host(_core.kpool_pool_keys(e.to_device(k), e.to_device(gate), e.to_device(ape),
                                             engine=e))
    score_h = e.to_host(_core.kpool_score(e.to_device(q), e.to_device(w), e.to_device(keys_h),
                                          engine=e, **kw))
    n_pools = t_kv // pool
    sel = dict(pool=pool, select_k=min(topk // pool, n_pools), width=topk + pool - 1,
               first_pos=first_pos)
    idx = e.to_host(_core.kpool_select(e.to_device(score_h), engine=e, **sel))
    np.testing.assert_allclose(keys_h, _core.kpool_pool_keys(k, gate, ape), **KEY_TOL)
    assert_vs_cpu_scores(score_h, _core.kpool_score(q, w, keys_h, **kw))
    np.testing.assert_array_equal(idx, _core.kpool_select(score_h, **sel))
    assert ((idx >= 0).sum(1) <= topk + pool - 1).all()


def test_sanitizer_small(e):
    """Every kernel once on small shapes (for compute-sanitizer racecheck / memcheck)."""
    Hi, d, pool, topk = TINY
    g = rng(0)
    n = 23
    k, gate = f32(g.standard_normal((n, d))), f32(g.standard_normal((n, d)))
    ape = f32(g.standard_normal((pool, d)))
    append_run(k, gate, ape, 2 * pool, n // pool, [3], engine=e)
    for t_q in (1, 17):
        q, w, keys = score_inputs(t_q, t_q, Hi, d, n // pool)
        fast, ref, _ = scores_all(e, q, w, keys, pool, n - t_q)
        np.testing.assert_array_equal(fast, ref)
        for reference in (False, True):
            _core.kpool_select(e.to_device(fast), pool=pool, select_k=topk // pool,
                               width=topk + pool - 1, first_pos=n - t_q, reference=reference,
                               engine=e)
    e.synchronize()
