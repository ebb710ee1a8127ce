"""The full attention's entries of the API fuzz table (tests/fuzz_api_cases.py merges them into
CASES): AttentionLayer, its cache planes and spec, and the ops rope_inv_freq, attn_prep,
kv_append, attention. Same vocabulary and rules as fuzz_api_cases.py (imported from it)."""

from __future__ import annotations

import numpy as np

from memra import _core

from fuzz_api_cases import (CACHE_ARG, ENGINE_ARG, ENUM_STR, EPS, I32, LAYER, NON_FINITE, NOT_OBJ, NOT_STR, SLOT,
                            WEIGHTS_DICT, Case, arr, floats, i32, ints, opt, read_only, shape, without)

CASES: dict[str, Case] = {
    "AttentionLayer()": Case(
        lambda w: _core.AttentionLayer, lambda w: dict(engine=w.engine, weights=w.attn_weights(), **w.attn_kw),
        {"engine": NOT_OBJ, "weights": WEIGHTS_DICT + [without("q_proj.weight", "k_norm.weight")],
         "hidden": ints(0, -1, 63), "heads": ints(0, -1, 3), "kv_heads": ints(0, -1, 3),
         "head_dim": ints(0, -1, 15, 300), "rotary_dim": ints(-1, 7, 18), "rope_theta": floats(*NON_FINITE, 0.0, -1.0),
         "rms_eps": EPS, "dtype": NOT_STR + ENUM_STR}),
    "Cache.attn_keys": Case(lambda w: w.attn_cache.attn_keys, lambda w: dict(layer=0, slot=0),
                            {"layer": LAYER + [1], "slot": SLOT}),
    "Cache.attn_values": Case(lambda w: w.attn_cache.attn_values, lambda w: dict(layer=0, slot=0),
                              {"layer": LAYER + [1], "slot": SLOT}),
    "AttentionLayer.state_spec": Case(lambda w: w.attn.state_spec, lambda w: {}),
    "AttentionLayer.prefill": Case(
        lambda w: w.attn.prefill, lambda w: dict(cache=w.attn_cache, layer=0, slot=1, x=w.f32(3, w.D)),
        {"cache": CACHE_ARG + [lambda g, w: [("another geometry", w.other_cache), ("another kind", w.cache)]],
         "layer": LAYER + [1], "slot": SLOT, "x": arr(shape(3, 63), shape(20, 64))}),
    "AttentionLayer.decode": Case(
        lambda w: w.attn.decode, lambda w: dict(cache=w.attn_cache, layer=0, slots=i32(1), x=w.f32(1, w.D)),
        {"cache": CACHE_ARG + [lambda g, w: [("another geometry", w.other_cache), ("another kind", w.cache)]],
         "layer": LAYER + [1],
         "slots": arr(lambda g, w: [("repeated", i32(0, 0)), ("outside", i32(5)), ("negative", i32(-1))],
                      dtypes=("int64", "float32", "uint32")),
         "x": arr(shape(2, 64), shape(1, 63))}),
    "LayerStateSpec.attention": Case(lambda w: _core.LayerStateSpec.attention, lambda w: dict(kv_heads=2, head_dim=8),
                                     {"kv_heads": ints(0, -1), "head_dim": ints(0, -1)}),
    "_core.rope_inv_freq": Case(lambda w: _core.rope_inv_freq, lambda w: dict(theta=10000.0, dim=8),
                                {"theta": floats(*NON_FINITE, 0.0, -1.0), "dim": ints(-1, 7)}),
    "_core.attn_prep": Case(
        lambda w: _core.attn_prep,
        lambda w: dict(qg=w.f32(3, 2, 32), k=w.f32(3, 1, 16), q_norm=w.f32(16), k_norm=w.f32(16), eps=1e-6,
                       rotary_dim=8, inv_freq=_core.rope_inv_freq(1e4, 8), pos0=2, slots=None, lengths=None),
        {"qg": arr(shape(3, 2, 30), shape(2, 2, 32)), "k": arr(shape(3, 1, 15)), "q_norm": arr(shape(15)),
         "k_norm": arr(shape(17)), "eps": EPS, "rotary_dim": ints(-1, 7, 18), "inv_freq": opt(arr(shape(3))),
         "pos0": ints(-1, 2**31 - 1), "slots": opt(I32), "lengths": opt(I32), **ENGINE_ARG}),
    "_core.kv_append": Case(
        lambda w: _core.kv_append,
        lambda w: dict(k=w.f32(2, 1, 8), v=w.f32(2, 1, 8), k_cache=np.zeros((6, 1, 8), np.float32),
                       v_cache=np.zeros((6, 1, 8), np.float32), pos0=1, slots=None, lengths=None),
        {"k": arr(shape(2, 2, 8)), "v": arr(shape(3, 1, 8)), "k_cache": arr(read_only, shape(6, 1, 7)),
         "v_cache": arr(read_only, shape(5, 1, 8)), "pos0": ints(-1, 5, 2**31 - 1), "slots": opt(I32),
         "lengths": opt(I32), **ENGINE_ARG}),
    "_core.attention": Case(
        lambda w: _core.attention,
        lambda w: dict(q=w.f32(2, 2, 8), k_cache=w.f32(5, 1, 8), v_cache=w.f32(5, 1, 8), scale=0.35,
                       gate=w.f32(2, 2, 8), pos0=1, slots=None, lengths=None),
        {"q": arr(shape(2, 2, 7), shape(5, 2, 8)), "k_cache": arr(shape(5, 1, 7), shape(1, 1, 8)),
         "v_cache": arr(shape(5, 2, 8)), "scale": floats(*NON_FINITE), "gate": opt(arr(shape(2, 2, 7))),
         "pos0": ints(-1, 4), "slots": opt(I32), "lengths": opt(I32), **ENGINE_ARG}),
}
