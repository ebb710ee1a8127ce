"""The MoE's entries of the API fuzz table (tests/fuzz_api_cases.py merges them into CASES):
MoeLayer (both router forms and the shared expert's gate), the ops moe_route, moe_forward and
moe_shared_gate. Same vocabulary and rules as fuzz_api_cases.py (imported from it)."""

from __future__ import annotations

from memra import _core

from fuzz_api_cases import (_OBJ, ENGINE_ARG, ENUM_STR, NON_FINITE, NOT_BOOL, NOT_OBJ, NOT_STR, WEIGHT,
                            WEIGHTS_DICT, Case, arr, floats, i32, ints, opt, shape, without)

CASES: dict[str, Case] = {
    "MoeLayer()": Case(
        lambda w: _core.MoeLayer, lambda w: dict(engine=w.engine, weights=w.weights(1, "mlp."), **w.moe_kw),
        {"engine": NOT_OBJ, "weights": WEIGHTS_DICT + [without("gate.weight", "experts.3.up_proj.weight")],
         "hidden": ints(0, -1, 63), "n_experts": ints(0, -1, 7), "top_k": ints(0, -1, 9, 5), "n_group": ints(0, -1, 3),
         "topk_group": ints(0, -1, 3), "intermediate": ints(0, -1, 31), "shared_intermediate": ints(0, -1, 31),
         "norm_topk_prob": NOT_BOOL, "routed_scaling": floats(*NON_FINITE),
         "swiglu_limit": floats(float("nan"), 0.0, -1.0), "scoring": NOT_STR + ENUM_STR + ["Softmax"],
         "shared_gate": NOT_BOOL, "dtype": NOT_STR + ENUM_STR}),
    "MoeLayer.forward": Case(lambda w: w.moe.forward, lambda w: dict(x=w.f32(3, w.D)), {"x": arr(shape(3, 63))}),
    "MoeLayer.forward_with_experts": Case(lambda w: w.moe.forward_with_experts, lambda w: dict(x=w.f32(3, w.D)),
                                          {"x": arr(shape(3, 63))}),
    "_core.moe_route": Case(
        lambda w: _core.moe_route,
        lambda w: dict(x=w.f32(3, 8), gate_w=w.W(8, 8), corr_bias=w.f32(8), top_k=2, n_group=2, topk_group=1,
                       norm_topk_prob=True, scaling=2.5, scoring="sigmoid"),
        {"x": arr(shape(3, 7), shape(3, 0)), "gate_w": WEIGHT, "corr_bias": opt(arr(shape(7))), "top_k": ints(0, -1, 5),
         "n_group": ints(0, -1, 3), "topk_group": ints(0, -1, 3), "norm_topk_prob": NOT_BOOL,
         "scaling": floats(*NON_FINITE), "scoring": NOT_STR + ENUM_STR + ["Softmax"], **ENGINE_ARG}),
    "_core.moe_forward": Case(
        lambda w: _core.moe_forward,
        lambda w: dict(x=w.f32(2, 8), idx=i32([0, 1], [1, 0]), w=w.f32(2, 2), gate_ws=[w.W(5, 8), w.W(5, 8)],
                       up_ws=[w.W(5, 8), w.W(5, 8)], down_ws=[w.W(8, 5), w.W(8, 5)], limit=2.0),
        {"x": arr(shape(2, 7)),
         "idx": arr(lambda g, w: [("outside", i32([0, 2], [1, 0]))], dtypes=("int64", "float32")),
         "w": arr(shape(2, 1)), "gate_ws": [None, 1, "x", _OBJ, [1, 2], [], lambda g, w: [("one short", g[:1])]],
         "up_ws": [None, "x", [None, None]], "down_ws": [None, 1, [1.5, 2.5]],
         "limit": floats(float("nan"), 0.0, -1.0), **ENGINE_ARG}),
    "_core.moe_shared_gate": Case(
        lambda w: _core.moe_shared_gate,
        lambda w: dict(x=w.f32(3, 8), gate_w=w.f32(8), shared=w.f32(3, 8), routed=w.f32(3, 8)),
        {"x": arr(shape(3, 7), shape(3, 0)), "gate_w": arr(shape(7), shape(1, 8)), "shared": arr(shape(2, 8)),
         "routed": arr(shape(3, 9)), **ENGINE_ARG}),
}
