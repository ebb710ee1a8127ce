"""MlaLayer's `topk` argument (the index list a shared DSA layer takes from the full one before
it), on the CPU: its errors name the method called (decode, not the prefill it runs row by row)
and `topk`; a list given to a layer that takes none (a full DSA layer computes its own, a dense
layer attends to every row) is refused instead of silently dropped; a refused call changes
nothing in the cache.
"""

from __future__ import annotations

import numpy as np
import pytest

import memra
from memra import _core

from fuzz_api_world import World

PLANES = ("latent_rows", "pool_keys")


@pytest.fixture(scope="module")
def w() -> World:
    return World(5)


def planes(cache) -> list:
    """Lengths and every MLA plane of every slot of the world's cache (all its bytes a step
    could write: rows past a slot's length included)."""
    out = []
    for s in range(cache.max_batch):
        out.append(cache.length(s))
        for layer in range(cache.num_layers):
            for plane in PLANES:
                try:
                    out.append(getattr(cache, plane)(layer, s).tobytes())
                except memra.MemraError:
                    pass  # not a plane this layer holds
    return out


def shared_layer(w: World) -> _core.MlaLayer:
    """Layer 3 of the checkpoint: a shared DSA layer (no indexer of its own)."""
    return _core.MlaLayer(w.engine, w.weights(3, "self_attn."), **{**w.mla_kw, "index_heads": 0, "index_head_dim": 0})


def dense_layer(w: World) -> _core.MlaLayer:
    """Layer 3's weights as a dense MLA layer (no index list at all)."""
    return _core.MlaLayer(w.engine, w.weights(3, "self_attn."),
                          **{**w.mla_kw, "index_heads": 0, "index_head_dim": 0, "kpool": 0, "topk": 0,
                             "tail_rows": 0, "sparse": False})


def refused(call, w: World, *, match: str, code: str):
    before = planes(w.cache)
    with pytest.raises(memra.ContractError, match=match) as ei:
        call()
    assert ei.value.code == getattr(_core.status, code)
    assert planes(w.cache) == before, "a refused call must leave the cache as it was"
    return str(ei.value)


def test_decode_names_itself_and_topk_when_the_list_is_missing(w):
    layer = shared_layer(w)
    msg = refused(lambda: layer.decode(w.cache, 3, np.array([0], np.int32), w.f32(1, w.D), None), w,
                  match=r"^MlaLayer\.decode: ", code="CONTRACT_MISSING")
    assert "topk" in msg and "prefill" not in msg, msg


def test_decode_names_the_bad_entry_of_topk(w):
    layer = shared_layer(w)
    pos = w.cache.length(0)
    topk = np.full((1, layer.index_width), -1, np.int32)
    topk[0, 3] = pos + 1  # a row after the query's own
    msg = refused(lambda: layer.decode(w.cache, 3, np.array([0], np.int32), w.f32(1, w.D), topk), w,
                  match=r"^MlaLayer\.decode: topk\[0\]\[3\] = ", code="CONTRACT_RANGE")
    assert f"= {pos + 1} is outside [-1, {pos}]" in msg, msg


def test_decode_checks_every_row_before_running_any(w):
    # Row 0's list is valid and row 1's is not: row 0 must not have run (nothing appended).
    layer = shared_layer(w)
    slots = np.array([0, 1], np.int32)
    topk = np.full((2, layer.index_width), -1, np.int32)
    topk[1, 0] = -2
    refused(lambda: layer.decode(w.cache, 3, slots, w.f32(2, w.D), topk), w,
            match=r"^MlaLayer\.decode: topk\[1\]\[0\] = -2 is outside \[-1, 0\]", code="CONTRACT_RANGE")


def test_prefill_names_the_bad_entry_of_topk(w):
    layer = shared_layer(w)
    pos = w.cache.length(0)
    topk = np.full((2, layer.index_width), -1, np.int32)
    topk[1, 0] = pos + 2  # query 1 sits at pos + 1
    refused(lambda: layer.prefill(w.cache, 3, 0, w.f32(2, w.D), topk), w,
            match=rf"^MlaLayer\.prefill: topk\[1\]\[0\] = {pos + 2} is outside \[-1, {pos + 1}\]",
            code="CONTRACT_RANGE")


@pytest.mark.parametrize("method", ["prefill", "decode"])
def test_a_full_dsa_layer_refuses_a_topk(w, method):
    # It computes its own index list: an all -1 list used to give the same bytes as None.
    full = w.mla
    assert full.has_indexer
    x = w.f32(1, w.D)
    topk = np.full((1, full.index_width), -1, np.int32)
    call = ((lambda: full.prefill(w.cache, 2, 0, x, topk)) if method == "prefill"
            else (lambda: full.decode(w.cache, 2, np.array([0], np.int32), x, topk)))
    msg = refused(call, w, match=rf"^MlaLayer\.{method}: topk was given, but a full DSA layer computes its own",
                  code="CONTRACT_MISSING")
    assert "only a shared DSA layer takes topk" in msg, msg


@pytest.mark.parametrize("method", ["prefill", "decode"])
def test_a_dense_layer_refuses_a_topk(w, method):
    dense = dense_layer(w)
    x = w.f32(1, w.D)
    topk = np.zeros((1, dense.index_width), np.int32)
    call = ((lambda: dense.prefill(w.cache, 3, 0, x, topk)) if method == "prefill"
            else (lambda: dense.decode(w.cache, 3, np.array([0], np.int32), x, topk)))
    refused(call, w, match=rf"^MlaLayer\.{method}: topk was given, but a dense MLA layer attends to every row",
            code="CONTRACT_MISSING")


def test_the_layers_still_run_without_the_refused_list(w):
    # The accepted forms: a full layer without topk hands its list to the shared one.
    cache = w.model.new_cache(1, 32)
    x = w.f32(1, w.D)
    _, idx = w.mla.decode(cache, 2, np.array([0], np.int32), x, None)
    y, idx_shared = shared_layer(w).decode(cache, 3, np.array([0], np.int32), x, idx)
    assert np.isfinite(y).all()
    assert np.array_equal(idx_shared, idx)


def test_the_docstrings_state_the_rule():
    for doc in (_core.MlaLayer.prefill.__doc__, _core.MlaLayer.decode.__doc__):
        assert "refused by" in doc or "same rule" in doc, doc
