"""MLA (absorbed / gathered) and DSA k-pool ops against numpy transcriptions of transformers 5.17.

The references below follow models/glm5_next/modeling_glm5_next.py line by line, for one
unpadded sequence (batch 1):

* ``ref_mla``: Glm5NextTextAttention's EXPANDED form (expand_kv: k = [W_uk c | k_pe],
  v = W_uv c per head; eager attention with scaling = qk_head_dim**-0.5), with the mask from
  build_attention_mask_from_topk (the index list as a set) or a causal mask.
* ``ref_indexer``: Glm5NextTextIndexer.forward with get_pooled_states, get_visible_tokens and
  append_visible_tail (index_kpool_always_select_tail = True); topk ties go to the lower pool.

numpy only: CI has neither torch nor transformers.
"""

from __future__ import annotations

import numpy as np
import pytest

import memra
from memra import _core

S = _core.status


def rng(seed):
    return np.random.default_rng(seed)


def f32(a):
    return np.ascontiguousarray(a, dtype=np.float32)


# ---------------------------------------------------------------- references (float64)


def ref_mla(q_nope, q_pe, cache, kv_b, d_nope, d_v, mask):
    """Expanded MLA attention. q_nope [t_q,H,dn], q_pe [t_q,H,dr] or None, cache [t_kv,R+dr],
    kv_b [H*(dn+dv), R], mask [t_q, t_kv] bool -> [t_q, H, d_v]. A query with nothing visible
    gets zeros (memra's contract; transformers' eager path would average every row instead)."""
    t_q, H, _ = q_nope.shape
    R = kv_b.shape[1]
    c = cache[:, :R].astype(np.float64)
    k_pe = cache[:, R:].astype(np.float64)
    d_rope = k_pe.shape[1]
    kv = (c @ kv_b.astype(np.float64).T).reshape(len(c), H, d_nope + d_v)
    k_nope, v = kv[..., :d_nope], kv[..., d_nope:]
    k = np.concatenate([k_nope, np.broadcast_to(k_pe[:, None, :], (len(c), H, d_rope))], -1)
    q = q_nope.astype(np.float64)
    if d_rope:
        q = np.concatenate([q, q_pe.astype(np.float64)], -1)
    scaling = (d_nope + d_rope) ** -0.5
    scores = np.einsum("ihd,jhd->hij", q, k) * scaling
    scores = np.where(mask[None], scores, -np.inf)
    m = scores.max(-1, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)
    p = np.exp(scores - m)
    den = p.sum(-1, keepdims=True)
    p = np.divide(p, den, out=np.zeros_like(p), where=den > 0)
    return np.einsum("hij,jhd->ihd", p, v)


def mask_from_lists(idx, t_kv):
    """build_attention_mask_from_topk: entries in [0, t_kv) mark rows; repeats count once."""
    mask = np.zeros((idx.shape[0], t_kv), dtype=bool)
    for i, row in enumerate(idx):
        ok = row[(row >= 0) & (row < t_kv)]
        mask[i, ok] = True
    return mask


def causal_mask(t_q, t_kv):
    return np.arange(t_kv)[None, :] <= (t_kv - t_q + np.arange(t_q))[:, None]


def ref_pooled_states(keys, gate, ape, valid):
    """get_pooled_states for batch 1: (pool_keys, pool_indices, pool_valid) of kept pools."""
    seq_len, pool = len(keys), ape.shape[0]
    n_pools = (seq_len + pool - 1) // pool
    first_key = int(np.argmax(valid)) if valid.any() else seq_len
    pool_indices = first_key + np.arange(n_pools * pool).reshape(n_pools, pool)
    safe = np.clip(pool_indices, 0, seq_len - 1)
    g_keys, g_gate, g_valid = keys[safe], gate[safe], valid[safe]
    g_valid = g_valid & (pool_indices < seq_len)
    pool_valid = g_valid.all(-1)
    pool_indices = np.where(g_valid, pool_indices, -1)
    logits = g_gate + ape[None]
    logits = np.where(g_valid[..., None], logits, -np.inf)
    with np.errstate(invalid="ignore"):
        mx = logits.max(1, keepdims=True)
        e = np.exp(logits - mx)
        prob = np.nan_to_num(e / e.sum(1, keepdims=True))
    pool_keys = (prob * g_keys).sum(1)
    keep = pool_valid
    return pool_keys[keep], pool_indices[keep], pool_valid[keep]


def ref_indexer(q, w, keys, gate, ape, index_topk):
    """Glm5NextTextIndexer.forward for the last t_q rows of a kv_len-row sequence (no padding).
    q [t_q, Hi, d]; w [t_q, Hi] = weights_proj(x); keys, gate [kv_len, d]; ape [pool, d].
    Returns the int32 lists [t_q, index_topk + pool - 1] (-1 = nothing)."""
    t_q, n_heads, head_dim = q.shape
    kv_len, pool = len(keys), ape.shape[0]
    valid_keys = np.ones(kv_len, dtype=bool)
    q_positions = kv_len - t_q + np.arange(t_q)
    visible = (np.arange(kv_len)[None, :] <= q_positions[:, None]) & valid_keys[None]

    pool_keys, pool_indices, pool_valid = ref_pooled_states(keys, gate, ape, valid_keys)
    scores = np.maximum(np.einsum("shd,pd->shp", q, pool_keys) * head_dim**-0.5, 0.0)
    weights = w * n_heads**-0.5
    index_scores = np.einsum("sh,shp->sp", weights, scores)

    pool_end = np.clip(pool_indices[:, -1], 0, kv_len - 1)
    pool_visible = visible[:, pool_end]
    valid_candidates = pool_visible & pool_valid[None]
    index_scores = np.where(valid_candidates, index_scores, np.finfo(np.float32).min)

    select_k = min(index_topk // pool, index_scores.shape[-1])
    order = np.argsort(-index_scores, axis=-1, kind="stable")  # ties: lower pool first
    selected = order[:, :select_k]
    selected_valid = np.take_along_axis(valid_candidates, selected, -1)
    selected_indices = pool_indices[selected]  # [t_q, k, pool]
    topk = np.where(selected_valid[..., None], selected_indices, -1).reshape(t_q, -1)

    output_width = index_topk
    if pool - 1 > 0:  # append_visible_tail
        first_key = int(np.argmax(valid_keys)) if valid_keys.any() else kv_len
        visible_count = visible.sum(-1)
        tail_count = visible_count % pool
        offs = np.arange(pool - 1)
        tail_indices = (first_key + visible_count - tail_count)[:, None] + offs
        tail_valid = (offs[None] < tail_count[:, None]) & (tail_indices < kv_len)
        kv_idx = np.clip(tail_indices, 0, kv_len - 1)
        tail_visible = np.take_along_axis(visible, kv_idx, -1)
        tail_indices = np.where(tail_valid & tail_visible, tail_indices, -1)
        topk = np.concatenate([topk, tail_indices], -1)
        output_width += pool - 1
    pad = output_width - topk.shape[-1]
    topk = np.pad(topk, ((0, 0), (0, max(pad, 0))), constant_values=-1)[:, :output_width]
    return topk.astype(np.int32)


# ---------------------------------------------------------------- memra pipelines


def memra_indexer(q, w, keys, gate, ape, index_topk, t_kv):
    pool = ape.shape[0]
    t_q = q.shape[0]
    pk = _core.kpool_pool_keys(f32(keys), f32(gate), f32(ape))
    first_pos = t_kv - t_q
    score = _core.kpool_score(f32(q), f32(w), pk, pool=pool, first_pos=first_pos,
                              qk_scale=q.shape[2] ** -0.5, head_scale=q.shape[1] ** -0.5)
    select_k = min(index_topk // pool, pk.shape[0])
    return _core.kpool_select(score, pool=pool, select_k=select_k, width=index_topk + pool - 1,
                              first_pos=first_pos)


def as_sets(idx):
    return [set(int(x) for x in row if x >= 0) for row in idx]


def memra_mla(q_nope, q_pe, cache, kv_b, d_nope, d_v, idx=None):
    wb = _core.Weight(f32(kv_b))
    q_lat = _core.mla_absorb_q(f32(q_nope), wb, d_v=d_v)
    scale = (d_nope + (q_pe.shape[2] if q_pe is not None else 0)) ** -0.5
    qpe = f32(q_pe) if q_pe is not None else None
    if idx is None:
        o_lat = _core.mla_attn_absorbed(q_lat, f32(cache), qpe, scale=scale)
    else:
        o_lat = _core.mla_attn_gathered(q_lat, f32(cache), idx, qpe, scale=scale)
    return _core.mla_decompress_v(o_lat, wb, d_nope=d_nope)


def mla_problem(seed, t_q, t_kv, H, R, d_nope, d_v, d_rope):
    g = rng(seed)
    kv_b = f32(g.standard_normal((H * (d_nope + d_v), R)) * 0.5)
    cache = f32(g.standard_normal((t_kv, R + d_rope)))
    q_nope = f32(g.standard_normal((t_q, H, d_nope)))
    q_pe = f32(g.standard_normal((t_q, H, d_rope))) if d_rope else None
    return q_nope, q_pe, cache, kv_b


# f32 dots of length <= 40 and softmax over <= 41 rows against float64: a few hundred ulp at most.
RTOL, ATOL = 2e-5, 2e-5

SHAPES = [  # t_q, t_kv, H, R, d_nope, d_v, d_rope
    (1, 1, 3, 5, 4, 6, 0),
    (1, 7, 3, 5, 4, 6, 2),
    (7, 7, 3, 5, 3, 7, 0),
    (3, 37, 3, 5, 4, 6, 3),  # odd d_rope: rotation is rope's business, attention takes any width
    (37, 37, 2, 16, 8, 8, 0),
]


@pytest.mark.parametrize("shape", SHAPES)
def test_mla_absorbed_matches_expanded_causal(shape):
    t_q, t_kv, H, R, dn, dv, dr = shape
    q_nope, q_pe, cache, kv_b = mla_problem(sum(shape), *shape)
    got = memra_mla(q_nope, q_pe, cache, kv_b, dn, dv)
    want = ref_mla(q_nope, q_pe, cache, kv_b, dn, dv, causal_mask(t_q, t_kv))
    assert got.shape == (t_q, H, dv) and got.dtype == np.float32
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("shape", SHAPES)
def test_mla_gathered_full_lists_equal_absorbed(shape):
    t_q, t_kv, H, R, dn, dv, dr = shape
    q_nope, q_pe, cache, kv_b = mla_problem(sum(shape) + 1, *shape)
    g = rng(5)
    width = t_kv + 3
    idx = np.full((t_q, width), -1, np.int32)
    for i in range(t_q):
        rows = list(range(t_kv - t_q + i + 1)) + [0]  # a repeated row counts once
        rows += [-1] * (width - len(rows))
        idx[i] = g.permutation(rows)
    gathered = memra_mla(q_nope, q_pe, cache, kv_b, dn, dv, idx)
    absorbed = memra_mla(q_nope, q_pe, cache, kv_b, dn, dv)
    np.testing.assert_array_equal(gathered, absorbed)


def test_mla_gathered_leading_minus_ones_are_finite():
    """REFERENCES.md edge case 5: leading entries all -1, or all but one."""
    t_kv, H, R, dn, dv, dr = 7, 3, 5, 4, 6, 2
    q_nope, q_pe, cache, kv_b = mla_problem(11, 3, t_kv, H, R, dn, dv, dr)
    q_nope *= 40.0  # large logits
    idx = np.array([[-1, -1, -1, -1, -1],
                    [-1, -1, -1, -1, 5],
                    [-1, -1, -1, 2, 6]], np.int32)
    got = memra_mla(q_nope, q_pe, cache, kv_b, dn, dv, idx)
    assert np.isfinite(got).all()
    np.testing.assert_array_equal(got[0], 0.0)
    want = ref_mla(q_nope, q_pe, cache, kv_b, dn, dv, mask_from_lists(idx, t_kv))
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL)


def test_kpool_pool_keys_match_get_pooled_states():
    g = rng(3)
    for pool, n_rows, d in [(1, 5, 7), (3, 11, 7), (4, 16, 5), (5, 4, 3)]:
        k, gate = g.standard_normal((n_rows, d)), g.standard_normal((n_rows, d)) * 3
        ape = g.standard_normal((pool, d))
        got = _core.kpool_pool_keys(f32(k), f32(gate), f32(ape))
        want, idx, _ = ref_pooled_states(k, gate, ape, np.ones(n_rows, bool))
        assert got.shape == (n_rows // pool, d)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
        np.testing.assert_array_equal(idx, np.arange(len(got) * pool).reshape(-1, pool))


INDEXER_CASES = [  # t_q, t_kv, Hi, d, pool, index_topk
    (1, 1, 3, 8, 4, 8),  # nothing complete: the list is the tail
    (11, 11, 3, 8, 4, 8),  # prefill, fewer complete pools than select_k early on
    (37, 37, 3, 8, 4, 8),  # prefill where the indexer drops rows
    (5, 41, 4, 6, 3, 9),  # decode-like suffix, select 3 of 13 pools
    (1, 40, 2, 5, 4, 12),  # decode at a pool boundary: (pos+1) % pool == 0, no tail
    (9, 23, 3, 7, 1, 5),  # pool 1: no tail at all
]


@pytest.mark.parametrize("case", INDEXER_CASES)
def test_kpool_indexer_matches_transformers_as_sets(case):
    t_q, t_kv, Hi, d, pool, topk = case
    g = rng(sum(case))
    q = g.standard_normal((t_q, Hi, d))
    w = g.standard_normal((t_q, Hi)) + 0.5
    keys, gate = g.standard_normal((t_kv, d)), g.standard_normal((t_kv, d))
    ape = g.standard_normal((pool, d))
    got = memra_indexer(q, w, keys, gate, ape, topk, t_kv)
    want = ref_indexer(q, w, keys, gate, ape, topk)
    assert got.dtype == np.int32 and got.shape == want.shape == (t_q, topk + pool - 1)
    assert as_sets(got) == as_sets(want)
    for row in got:  # no repeats, -1 only as trailing padding, rows causal
        live = row[row >= 0]
        assert len(set(live.tolist())) == len(live)
        assert (row[len(live):] == -1).all()
    first_pos = t_kv - t_q
    assert all(max(s, default=-1) <= first_pos + i for i, s in enumerate(as_sets(got)))


def test_kpool_indexer_really_drops_rows_and_attention_follows():
    t_q, t_kv, Hi, d, pool, topk = 6, 37, 3, 8, 4, 8
    H, R, dn, dv = 3, 5, 4, 6
    g = rng(77)
    q = g.standard_normal((t_q, Hi, d))
    w = g.standard_normal((t_q, Hi)) + 0.5
    keys, gate = g.standard_normal((t_kv, d)), g.standard_normal((t_kv, d))
    ape = g.standard_normal((pool, d))
    idx = memra_indexer(q, w, keys, gate, ape, topk, t_kv)
    sets = as_sets(idx)
    assert sets == as_sets(ref_indexer(q, w, keys, gate, ape, topk))
    # Each query sees 2 pools + its tail, far fewer than its pos + 1 causal rows.
    assert all(len(s) < t_kv - t_q + i + 1 for i, s in enumerate(sets))
    q_nope, q_pe, cache, kv_b = mla_problem(78, t_q, t_kv, H, R, dn, dv, 0)
    got = memra_mla(q_nope, q_pe, cache, kv_b, dn, dv, idx)
    want = ref_mla(q_nope, q_pe, cache, kv_b, dn, dv, mask_from_lists(idx, t_kv))
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL)
    dense = ref_mla(q_nope, q_pe, cache, kv_b, dn, dv, causal_mask(t_q, t_kv))
    assert np.abs(got - dense).max() > 1e-3  # the dropped rows matter


def test_mla_gathered_on_transformers_layout_lists():
    """transformers' own layout (selected pools in score order, masked pools as -1 blocks, the tail
    at fixed slots) gives early queries leading -1 entries: gathered attention reads it as a set."""
    t_kv, Hi, d, pool, topk = 11, 3, 8, 4, 8
    g = rng(19)
    q, w = g.standard_normal((t_kv, Hi, d)), g.standard_normal((t_kv, Hi)) + 0.5
    keys, gate, ape = (g.standard_normal((t_kv, d)), g.standard_normal((t_kv, d)),
                       g.standard_normal((pool, d)))
    idx = ref_indexer(q, w, keys, gate, ape, topk)
    assert (idx[0, :topk] == -1).all() and idx[0, topk] == 0  # query 0: only its tail row
    q_nope, q_pe, cache, kv_b = mla_problem(20, t_kv, t_kv, 3, 5, 4, 6, 0)
    got = memra_mla(q_nope, q_pe, cache, kv_b, 4, 6, idx)
    want = ref_mla(q_nope, q_pe, cache, kv_b, 4, 6, mask_from_lists(idx, t_kv))
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL)
    # Short prefill: every visible row is listed, so this is causal attention.
    np.testing.assert_allclose(got, ref_mla(q_nope, q_pe, cache, kv_b, 4, 6,
                                            causal_mask(t_kv, t_kv)), rtol=RTOL, atol=ATOL)


def test_kpool_select_ties_and_layout():
    score = np.array([[1.0, 3.0, 3.0, 3.0]], np.float32)
    idx = _core.kpool_select(score, pool=3, select_k=2, width=10, first_pos=13)
    np.testing.assert_array_equal(idx, [[3, 4, 5, 6, 7, 8, 12, 13, -1, -1]])


def test_kpool_relu_zero_pools_tie_exactly_and_go_to_the_lower_index():
    """The situation behind memra f32's divergence from transformers f32 on the bench model
    (benchmarks/accuracy_bench_model.py, tiny widths, T = 48: layer 3, row 42, pools 1, 2, 3, 5, 7
    all scored exactly 0.0): a pool whose relu(q.k) is 0 on every indexer head scores exactly 0
    (the head sum starts at +0.0; a negative head weight adds -0.0), so more pools tie at 0 than
    the top-k has room for. memra takes the lower pool indices (cpu/dsa.h kpool_select);
    torch.topk may take any of them (it took pool 7 where memra took pool 1), an equally valid
    top-k that changes the row."""
    pool, d, index_topk = 2, 4, 8  # select_k = 4 of 8 complete pools for the last query
    k0 = [-1.0, -0.5, 1.0, 0.0, -2.0, 2.0, -0.25, -3.0]  # pools 2 and 5 positive, the rest <= 0
    keys = np.zeros((16, d))
    keys[:, 0] = np.repeat(k0, pool)  # both rows of a pool equal: the pool key is that row
    keys[:, 1] = -1.0  # head 1 reads channel 1: relu 0 everywhere (times a negative weight)
    gate, ape = np.zeros((16, d)), np.zeros((pool, d))
    q = np.zeros((16, 2, d))
    q[:, 0, 0] = 1.0
    q[:, 1, 1] = 1.0
    w = np.tile([1.0, -0.5], (16, 1))
    pk = _core.kpool_pool_keys(f32(keys), f32(gate), f32(ape))
    np.testing.assert_array_equal(pk[:, 0], k0)
    score = _core.kpool_score(f32(q), f32(w), pk, pool=pool, first_pos=0, qk_scale=d**-0.5,
                              head_scale=2**-0.5)
    zero = [p for p in range(8) if k0[p] <= 0]
    assert (score[15, zero].view(np.uint32) == 0).all()  # +0.0 bit for bit: six pools tied
    assert (score[15, [2, 5]] > 0).all()
    idx = _core.kpool_select(score, pool=pool, select_k=index_topk // pool,
                             width=index_topk + pool - 1, first_pos=0)
    last = as_sets(idx)[15]
    assert last == {0, 1, 2, 3, 4, 5, 10, 11}  # pools 2, 5 and the two lowest zero pools 0, 1
    assert as_sets(idx) == as_sets(ref_indexer(q, w, keys, gate, ape, index_topk))
    # The tie rule is the only thing deciding: any other pair of zero pools is an equally valid
    # top-k by score (what torch.topk may return), and memra would then differ on this row alone.
    other = {2, 5, 6, 7}
    assert sorted(score[15, sorted(other)], reverse=True)[-1] == sorted(score[15], reverse=True)[3]


# ---------------------------------------------------------------- bad inputs


def _code(fn, *a, **k):
    with pytest.raises(memra.ContractError) as e:
        fn(*a, **k)
    return e.value.code


@pytest.mark.parametrize("dr", [0, 3, 8])
def test_mla_attn_decode_with_rope_columns_matches_expanded(dr):
    """The batched decode form on the CPU (B sequences, one query each at its last visible row)
    over rows [latent | k_pe] with q_pe (KimiLinearAttention's unrotated rope columns): the
    expanded reference per sequence, dense and over index lists; an idle row (t_kv 0) gives zeros;
    rows past t_kv hold NaN and are never read."""
    H, R, dn, dv = 3, 5, 4, 6
    g = rng(40 + dr)
    t_kv = [1, 7, 0, 12]
    B = len(t_kv)
    kv_b = f32(g.standard_normal((H * (dn + dv), R)) * 0.5)
    caches = []
    for t in t_kv:
        c = f32(g.standard_normal((t + 2, R + dr)))
        c[t:] = np.nan
        caches.append(c)
    q_nope = f32(g.standard_normal((B, H, dn)))
    q_pe = f32(g.standard_normal((B, H, dr))) if dr else None
    wb = _core.Weight(kv_b)
    q_lat = _core.mla_absorb_q(q_nope, wb, d_v=dv)
    scale = (dn + dr) ** -0.5
    idx = np.array([[0, -1, 5, 0], [6, 2, 2, -1], [3, -1, -1, -1], [11, 0, 7, 40]], np.int32)
    for lists in (None, idx):
        o_lat = _core.mla_attn_decode(q_lat, caches, t_kv, idx=lists, q_pe=q_pe, scale=scale)
        np.testing.assert_array_equal(o_lat[2], 0.0)
        out = _core.mla_decompress_v(o_lat, wb, d_nope=dn)
        for b, t in enumerate(t_kv):
            if t == 0:
                continue
            mask = causal_mask(1, t) if lists is None else mask_from_lists(lists[b:b + 1], t)
            want = ref_mla(q_nope[b:b + 1], None if q_pe is None else q_pe[b:b + 1],
                           caches[b][:t], kv_b, dn, dv, mask)
            np.testing.assert_allclose(out[b:b + 1], want, rtol=RTOL, atol=ATOL)
    if dr:
        assert _code(_core.mla_attn_decode, q_lat, caches, t_kv, scale=scale) == S.CONTRACT_MISSING
        assert _code(_core.mla_attn_decode, q_lat, caches, t_kv, q_pe=q_pe[:, :, :-1],
                     scale=scale) == S.CONTRACT_SHAPE


def test_mla_bad_inputs():
    q_nope, q_pe, cache, kv_b = mla_problem(1, 2, 5, 3, 4, 3, 2, 2)
    wb = _core.Weight(kv_b)
    q_lat = _core.mla_absorb_q(q_nope, wb, d_v=2)
    ok = _core.mla_attn_absorbed(q_lat, cache, q_pe, scale=0.5)
    assert ok.shape == (2, 3, 4)
    absorbed, gathered = _core.mla_attn_absorbed, _core.mla_attn_gathered
    idx = np.zeros((2, 3), np.int32)

    assert _code(_core.mla_absorb_q, q_nope.astype(np.float64), wb, d_v=2) == S.CONTRACT_DTYPE
    assert _code(_core.mla_absorb_q, q_nope, wb, d_v=3) == S.CONTRACT_SHAPE
    assert _code(_core.mla_absorb_q, q_nope[0], wb, d_v=2) == S.CONTRACT_SHAPE
    assert _code(_core.mla_absorb_q, q_nope, wb, d_v=-1) == S.CONTRACT_VALUE
    assert _code(_core.mla_decompress_v, q_lat, wb, d_nope=6) == S.CONTRACT_SHAPE
    assert _code(_core.mla_decompress_v, np.zeros((2, 3, 5), np.float32), wb,
                 d_nope=3) == S.CONTRACT_SHAPE  # R != kv_b cols
    assert _code(_core.mla_decompress_v, np.zeros((2, 2, 4), np.float32), wb,
                 d_nope=3) == S.CONTRACT_SHAPE  # kv_b rows not a multiple of H
    assert _code(_core.mla_decompress_v, q_lat[:, :2], wb, d_nope=3) == S.CONTRACT_STRIDE

    assert _code(absorbed, q_lat.astype(np.float64), cache, q_pe, scale=0.5) == S.CONTRACT_DTYPE
    assert _code(absorbed, q_lat[0], cache, q_pe, scale=0.5) == S.CONTRACT_SHAPE
    assert _code(absorbed, q_lat, cache.reshape(1, -1), q_pe, scale=0.5) == S.CONTRACT_SHAPE
    cache_t = np.ascontiguousarray(cache.T).T  # a transposed view with the right shape
    assert _code(absorbed, q_lat, cache_t, q_pe, scale=0.5) == S.CONTRACT_STRIDE
    assert _code(absorbed, q_lat, f32(cache[:, :3]), q_pe, scale=0.5) == S.CONTRACT_SHAPE  # R > width
    assert _code(absorbed, q_lat, cache, q_pe[:, :2], scale=0.5) == S.CONTRACT_SHAPE
    assert _code(absorbed, q_lat, cache, None, scale=0.5) == S.CONTRACT_MISSING
    assert _code(absorbed, q_lat, cache, q_pe, scale=float("nan")) == S.CONTRACT_VALUE
    assert _code(absorbed, q_lat, cache[:1], q_pe, scale=0.5) == S.CONTRACT_QUERY_SUFFIX

    assert _code(gathered, q_lat, cache, idx.astype(np.int64), q_pe, scale=0.5) == S.CONTRACT_DTYPE
    assert _code(gathered, q_lat, cache, idx.T.copy(), q_pe, scale=0.5) == S.CONTRACT_SHAPE
    assert _code(gathered, q_lat, cache, np.zeros((3, 2), np.int32).T, q_pe,
                 scale=0.5) == S.CONTRACT_STRIDE
    for bad in (5, -2):
        idx_bad = idx.copy()
        idx_bad[1, 2] = bad
        assert _code(gathered, q_lat, cache, idx_bad, q_pe, scale=0.5) == S.CONTRACT_RANGE
    # Query 0 sits at row 3 of 5: its row 4 is in the future (the reference's causal mask), refused
    # as CUDA's check_range refuses it; query 1 may list row 4.
    future = idx.copy()
    future[0, 1] = 4
    assert _code(gathered, q_lat, cache, future, q_pe, scale=0.5) == S.CONTRACT_RANGE
    future[0, 1], future[1, 1] = 3, 4
    assert gathered(q_lat, cache, future, q_pe, scale=0.5).shape == (2, 3, 4)
    assert _code(gathered, q_lat, cache[:1], idx[:, :1] * 0, q_pe, scale=0.5) == S.CONTRACT_QUERY_SUFFIX


def test_kpool_bad_inputs():
    g = rng(2)
    k, gate, ape = f32(g.standard_normal((8, 5))), f32(g.standard_normal((8, 5))), f32(
        g.standard_normal((4, 5)))
    q, w = f32(g.standard_normal((2, 3, 5))), f32(g.standard_normal((2, 3)))
    pk = _core.kpool_pool_keys(k, gate, ape)
    assert pk.shape == (2, 5)
    kw = dict(pool=4, first_pos=6, qk_scale=0.5, head_scale=0.5)
    score = _core.kpool_score(q, w, pk, **kw)
    sel = dict(pool=4, select_k=2, width=11, first_pos=6)
    assert _core.kpool_select(score, **sel).shape == (2, 11)

    assert _code(_core.kpool_pool_keys, k, gate, ape[:0]) == S.CONTRACT_POOL
    assert _code(_core.kpool_pool_keys, k.astype(np.float64), gate, ape) == S.CONTRACT_DTYPE
    assert _code(_core.kpool_pool_keys, k, gate[:7], ape) == S.CONTRACT_SHAPE
    assert _code(_core.kpool_pool_keys, k, gate, f32(ape[:, :4])) == S.CONTRACT_SHAPE
    assert _code(_core.kpool_score, q, w, pk, **{**kw, "pool": 0}) == S.CONTRACT_POOL
    assert _code(_core.kpool_score, q, w, pk, **{**kw, "first_pos": -1}) == S.CONTRACT_VALUE
    assert _code(_core.kpool_score, q, f32(w[:, :2]), pk, **kw) == S.CONTRACT_SHAPE
    assert _code(_core.kpool_score, q[0], w, pk, **kw) == S.CONTRACT_SHAPE
    assert _code(_core.kpool_score, q, w, f32(pk[:, :4]), **kw) == S.CONTRACT_SHAPE
    assert _code(_core.kpool_score, q, w, np.asfortranarray(pk), **kw) == S.CONTRACT_STRIDE
    assert _code(_core.kpool_select, score, **{**sel, "width": 10}) == S.CONTRACT_INDEX_WIDTH
    assert _code(_core.kpool_select, score, **{**sel, "pool": 0}) == S.CONTRACT_POOL
    assert _code(_core.kpool_select, score, **{**sel, "select_k": -1}) == S.CONTRACT_VALUE
    assert _code(_core.kpool_select, score.astype(np.float64), **sel) == S.CONTRACT_DTYPE
    assert _code(_core.kpool_select, score[0], **sel) == S.CONTRACT_SHAPE


def test_mla_decode_forms_take_one_array_of_caches():
    """caches as one array [B, L, W] (slice b: sequence b's cache) gives the bytes of the list of
    its slices, for the attention and the append; a wrong rank or B, another dtype and a
    read-only array for the append are named ContractErrors that change nothing."""
    B, H, R, dr, L = 3, 2, 6, 2, 9
    g = rng(77)
    stack = f32(g.standard_normal((B, L, R + dr)))
    q_lat = f32(g.standard_normal((B, H, R)))
    q_pe = f32(g.standard_normal((B, H, dr)))
    t_kv = [4, 9, 0]
    want = _core.mla_attn_decode(q_lat, [stack[b] for b in range(B)], t_kv, q_pe=q_pe, scale=0.4)
    got = _core.mla_attn_decode(q_lat, stack, t_kv, q_pe=q_pe, scale=0.4)
    np.testing.assert_array_equal(got, want)
    rows = f32(g.standard_normal((B, R + dr)))
    as_list = [stack[b].copy() for b in range(B)]
    one = stack.copy()
    _core.mla_latent_append_decode(rows, as_list, [2, 8, -1])
    _core.mla_latent_append_decode(rows, one, [2, 8, -1])
    np.testing.assert_array_equal(one, np.stack(as_list))
    before = one.copy()
    assert _code(_core.mla_attn_decode, q_lat, stack[0], t_kv, q_pe=q_pe, scale=0.4) == S.CONTRACT_SHAPE
    assert _code(_core.mla_attn_decode, q_lat, stack[:2], t_kv, q_pe=q_pe, scale=0.4) == S.CONTRACT_SHAPE
    assert _code(_core.mla_attn_decode, q_lat, stack.astype(np.float64), t_kv, q_pe=q_pe,
                 scale=0.4) == S.CONTRACT_DTYPE
    assert _code(_core.mla_attn_decode, q_lat, stack[:, :, :R - 1], t_kv, scale=0.4) in (
        S.CONTRACT_SHAPE, S.CONTRACT_STRIDE)
    assert _code(_core.mla_attn_decode, q_lat, stack, [4, 10, 0], q_pe=q_pe, scale=0.4) == S.CONTRACT_RANGE
    ro = one.copy()
    ro.flags.writeable = False
    with pytest.raises(memra.ContractError):
        _core.mla_latent_append_decode(rows, ro, [0, 0, 0])
    assert _code(_core.mla_latent_append_decode, rows, one, [2, 9, 0]) == S.CONTRACT_RANGE
    np.testing.assert_array_equal(one, before)


def test_mla_decode_caches_live_for_the_call_and_are_checked():
    """The op holds every cache it was handed until it returns: a sequence whose items are fresh
    arrays, or an object whose __dlpack__ exports a temporary, gives the list form's bytes (their
    memory was freed mid-call before). An endless sequence stops at B + 1 items with a named
    error; a read-only memoryview is refused for the append, and nothing is written."""
    B, L, H, R = 4, 64, 2, 16
    g = rng(5)
    pool = g.standard_normal((B, L, R))  # float64: every float32 view below is a fresh array
    q = f32(g.standard_normal((B, H, R)))
    t = [L, 3, 0, 40]
    want = _core.mla_attn_decode(q, [f32(pool[b]) for b in range(B)], t, scale=0.25)

    class Fresh:
        def __len__(self):
            return B

        def __getitem__(self, b):
            if b >= B:
                raise IndexError
            return f32(pool[b])

    class Temporary:
        def __dlpack__(self, **kw):
            return f32(pool).__dlpack__(**kw)

        def __dlpack_device__(self):
            return (1, 0)

    np.testing.assert_array_equal(_core.mla_attn_decode(q, Fresh(), t, scale=0.25), want)
    np.testing.assert_array_equal(_core.mla_attn_decode(q, Temporary(), t, scale=0.25), want)

    class Endless:
        def __len__(self):
            return B

        def __getitem__(self, b):
            return f32(pool[0])

    assert _code(_core.mla_attn_decode, q, Endless(), t, scale=0.25) == S.CONTRACT_SHAPE
    frozen = f32(np.zeros((L, R)))
    frozen.flags.writeable = False
    mv = memoryview(frozen)
    rows = f32(np.ones((2, R)))
    assert _code(_core.mla_latent_append_decode, rows, [mv, mv], [0, 1]) == S.CONTRACT_VALUE
    one = f32(np.zeros((2, L, R)))  # a writable memoryview of one array [B, L, W] is taken
    _core.mla_latent_append_decode(rows, memoryview(one), [0, 1])
    np.testing.assert_array_equal(one[0, 0], rows[0])
    np.testing.assert_array_equal(frozen, 0.0)
