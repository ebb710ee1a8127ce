"""The API fuzz's table for the Gated DeltaNet surface (GdnLayer, LayerStateSpec.gdn, the Cache's
GDN planes, the gdn_* ops and rms_norm_gated_silu), in the vocabulary of tests/fuzz_api_cases.py;
tests/test_fuzz_api.py runs CASES | GDN_CASES. The objects are the World's GDN layer and cache
(tests/fuzz_api_world.py: one GDN layer of random weights, slot 0 holding tokens)."""

from __future__ import annotations

from memra import _core

from fuzz_api_cases import (CACHE_ARG, ENGINE_ARG, ENUM_STR, EPS, F32, LAYER, NON_FINITE, NOT_BOOL,
                            NOT_CORE_BOOL, NOT_OBJ, NOT_STR, SLOT, WEIGHTS_DICT, Case, arr, floats, i32, ints, opt,
                            shape, some, without)

_OTHER_CACHE = [lambda g, w: [("another geometry", w.other_cache), ("a glm5_next cache", w.cache)]]

GDN_CASES: dict[str, Case] = {
    "GdnLayer()": Case(
        lambda w: _core.GdnLayer, lambda w: dict(engine=w.engine, weights=w.gdn_weights(), **w.gdn_kw),
        {"engine": NOT_OBJ,
         "weights": WEIGHTS_DICT + [without("in_proj_qkv.weight", "A_log", "norm.weight", "conv1d.weight")],
         "hidden": ints(0, -1, 63), "key_heads": ints(0, -1, 3), "value_heads": ints(0, -1, 3),
         "key_head_dim": ints(0, -1, 7), "value_head_dim": ints(0, -1, 7), "conv_kernel": ints(0, -1, 3),
         "rms_eps": EPS, "dtype": NOT_STR + ENUM_STR}),
    "GdnLayer.state_spec": Case(lambda w: w.gdn.state_spec, lambda w: {}),
    "GdnLayer.forward": Case(lambda w: w.gdn.forward, lambda w: dict(x=w.f32(3, w.D)), {"x": arr(shape(3, 63))}),
    "GdnLayer.prefill": Case(
        lambda w: w.gdn.prefill, lambda w: dict(cache=w.gdn_cache, layer=0, slot=1, x=w.f32(3, w.D)),
        {"cache": CACHE_ARG + _OTHER_CACHE, "layer": LAYER + [1], "slot": SLOT,
         "x": arr(shape(3, 63), shape(40, 64))}),
    "GdnLayer.decode": Case(
        lambda w: w.gdn.decode, lambda w: dict(cache=w.gdn_cache, layer=0, slots=i32(1), x=w.f32(1, w.D)),
        {"cache": CACHE_ARG + _OTHER_CACHE, "layer": LAYER + [1],
         "slots": arr(lambda g, w: [("repeated", i32(0, 0)), ("outside", i32(5)), ("negative", i32(-1))],
                      dtypes=("int64", "float32", "uint32")),
         "x": arr(shape(2, 64), shape(1, 63))}),
    "LayerStateSpec.gdn": Case(
        lambda w: _core.LayerStateSpec.gdn,
        lambda w: dict(key_heads=1, value_heads=2, key_head_dim=8, value_head_dim=8, conv_kernel=4),
        {"key_heads": ints(0, -1, 3), "value_heads": ints(0, -1), "key_head_dim": ints(0, -1),
         "value_head_dim": ints(0, -1), "conv_kernel": ints(0, -1)}),
    "Cache.gdn_state": Case(lambda w: w.gdn_cache.gdn_state, lambda w: dict(layer=0, slot=0),
                            {"layer": LAYER + [1], "slot": SLOT}),
    "Cache.gdn_conv": Case(lambda w: w.gdn_cache.gdn_conv, lambda w: dict(layer=0, slot=0),
                           {"layer": LAYER + [1], "slot": SLOT}),
    "_core.gdn_gate": Case(
        lambda w: _core.gdn_gate, lambda w: dict(a=w.f32(3, 4), b=w.f32(3, 4), dt_bias=w.f32(4), A_log=w.f32(4)),
        {"a": F32, "b": arr(shape(3, 3), shape(2, 4)), "dt_bias": arr(shape(3)), "A_log": arr(shape(5)),
         **ENGINE_ARG}),
    "_core.gdn_l2norm": Case(lambda w: _core.gdn_l2norm, lambda w: dict(x=w.f32(3, 2, 4), eps=1e-6),
                             {"x": F32, "eps": EPS, **ENGINE_ARG}),
    "_core.gdn_scan": Case(
        lambda w: _core.gdn_scan,
        lambda w: dict(q=w.f32(3, 1, 4), k=w.f32(3, 1, 4), v=w.f32(3, 2, 5), g=-abs(w.f32(3, 2)), beta=w.f32(3, 2),
                       state=w.f32(2, 4, 5), scale=None, batch=False),
        {"q": arr(shape(3, 1, 3)), "k": arr(shape(2, 1, 4)), "v": arr(shape(3, 3, 5), shape(3, 0, 5)),
         "g": arr(shape(3, 3)), "beta": arr(shape(3, 1)), "state": opt(arr(shape(2, 4, 4))),
         "scale": some(floats(*NON_FINITE)), "batch": NOT_CORE_BOOL, "chunked": NOT_CORE_BOOL, **ENGINE_ARG}),
    "_core.rms_norm_gated_silu": Case(
        lambda w: _core.rms_norm_gated_silu,
        lambda w: dict(x=w.f32(3, 8), gate=w.f32(3, 8), weight=w.f32(8), eps=1e-5),
        {"x": arr(shape(3, 7)), "gate": arr(shape(2, 8)), "weight": arr(shape(7)), "eps": EPS, **ENGINE_ARG}),
}
