"""The table of tests/test_fuzz_api.py: for every public callable, a valid call and the bad values
of each of its arguments.

One entry per callable in CASES: ``"name": Case(target, good, bad)``, where
- target(world) returns the callable (a function, a bound method, a class);
- good(world) returns the keyword arguments of a call that is valid (fresh arrays each time);
- bad maps an argument name to its bad values: a list whose items are values, or functions
  ``(good_value, world) -> [(label, value), ...]`` that derive bad values from the good one (a
  wrong dtype of the good array, a non-contiguous copy, ...). Every listed value must be refused
  with a memra error, whatever the other arguments are.
cuda_only marks callables that need a CUDA engine: on the CPU even their good call raises
UnsupportedError (the bad calls still must raise memra errors, not Python's).

Adding a callable (for example memra.KernelOptions) is one entry here; the driver fails for a
public callable without one.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import ml_dtypes
import numpy as np

import memra
from memra import _core

from fuzz_api_world import World

# ---------------------------------------------------------------- vocabulary of bad values

_OBJ = object()
NOT_INT = [None, 1.5, "3", b"3", [1], (1,), {"n": 1}, _OBJ, 1j, float("nan"), np.float32(2.0),
           np.array([1, 2]), 2**64, 10**30]
NOT_FLOAT = [None, "1.0", b"1", [1.0], (1.0,), {"x": 1.0}, _OBJ, 1j, 10**400, np.array([1.0, 2.0])]
NOT_BOOL = [None, "yes", b"1", 2, 1.5, [True], {"b": True}, _OBJ, np.array([True, False])]
# A bool argument of memra._core: nanobind takes only True and False, so numpy.bool_ is refused there
# too, and the refusal must name the argument (python/memra/_arguments.py).
NOT_CORE_BOOL = NOT_BOOL + [np.True_]
NOT_STR = [None, 1, 1.5, b"float32", ["float32"], {"s": 1}, _OBJ, True]
NOT_OBJ = [None, "x", 1, 2.5, True, [], {}, _OBJ, np.zeros(3, np.float32)]  # for class arguments
NOT_ENGINE = ["cpu", 1, 2.5, True, [], {}, _OBJ, np.zeros(2)]  # engine= (None is the CPU)
NON_FINITE = [float("nan"), float("inf"), -float("inf")]


def _contiguous_axis(a: np.ndarray) -> int | None:
    for ax in range(a.ndim - 1, -1, -1):
        if a.shape[ax] > 1:
            return ax
    return None


def _strided(a: np.ndarray) -> np.ndarray | None:
    """The values of `a` in a non-contiguous view of the same shape (None if `a` cannot be)."""
    ax = _contiguous_axis(a)
    if ax is None:
        return None
    wide = np.repeat(a, 2, axis=ax)
    view = wide[(slice(None),) * ax + (slice(None, None, 2),)]
    assert view.shape == a.shape and not view.flags.c_contiguous
    return view


def arr(*extra, dtypes=("float64", "int64", "float16", "bfloat16", "int32", "bool"), rank=True,
        strided=True, byteorder=True):
    """Bad values of an array argument, derived from its good value: not arrays at all, other
    dtypes (numpy, ml_dtypes bfloat16), big-endian bytes, a non-contiguous view, another rank;
    plus `extra` (values, or functions of (good, world) giving labelled values)."""

    def make(g, w):
        out = [("None", None), ("float", 1.5), ("str", "x"), ("bool", True), ("dict", {"a": 1}),
               ("object", _OBJ), ("ragged list", [[1, 2], [3]]), ("a memra object", w.engine)]
        if dtypes:  # bytes are a uint8 buffer: an array where any dtype goes
            out.append(("bytes", b"\x00" * 8))
        if isinstance(g, np.ndarray):
            out.append(("list of the values", g.tolist()))
            for dt in dtypes:
                if np.dtype(g.dtype) != np.dtype(dt if dt != "bfloat16" else ml_dtypes.bfloat16):
                    out.append((f"{dt} array", g.astype(ml_dtypes.bfloat16 if dt == "bfloat16" else dt)))
            out.append(("object array", g.astype(object)))
            if byteorder and g.dtype.itemsize > 1:
                out.append(("big-endian", g.astype(g.dtype.newbyteorder(">"))))
            if strided and (s := _strided(g)) is not None:
                out.append(("non-contiguous", s))
            if rank:
                out.append(("rank + 1", g[None]))
                out.append(("rank 0", g.reshape(-1)[:1].reshape(())))
        for e in extra:
            out.extend(e(g, w) if callable(e) else [(repr(e), e)])
        return out

    return make


F32 = arr()
I32 = arr(dtypes=("int64", "float32", "uint32", "int16", "float64"))


def opt(make):
    """The bad values of `make` without None (for an argument that takes None)."""
    return lambda g, w: [(k, v) for k, v in make(g, w) if v is not None]


def some(values):
    """A list of bad values without None (for an argument that takes None)."""
    return [v for v in values if v is not None]


def ints(*extra, unsigned=False):
    """Bad values of an int argument (int32 or int64 in C++; unsigned: uint64) and `extra`."""
    return list(NOT_INT) + ([-1] if unsigned else [2**63, -(2**63) - 1]) + list(extra)


def floats(*extra):
    return list(NOT_FLOAT) + list(extra)


def shape(*dims, dtype=np.float32):
    """A bad value: a zero array of another shape."""
    return lambda g, w: [(f"shape {dims}", np.zeros(dims, dtype))]


def read_only(g, w):
    a = g.copy()
    a.flags.writeable = False
    return [("read-only array", a)]


def without(*names):
    """Bad values of a weights dict: each named tensor left out."""
    return lambda g, w: [(f"missing {n}", {k: v for k, v in g.items() if k != n}) for n in names]


KERNEL_OPTIONS = ["x", 1, True, {"pdl": True}, _OBJ, [], lambda g, w: [("a Cache", w.cache)]]
WEIGHTS_DICT = [None, "w", 1, [], _OBJ, {"fn": 1}, {1: 2}, {"x": np.zeros(3, np.float32)}]
ENUM_STR = ["nonsense", "", "FLOAT32"]
BAD_IDS = [None, "abc", 1.5, 3, [], [[1, 2], [3]], [[1, 2], [3, 4]], [1.5, 2.0], {"a": 1},
           [-1], [272], [2**40], [True, False], [True, 5], [1, np.True_], _OBJ, b"\x01",
           np.array([1, 2], np.float32),
           np.array([[1, 2]]), (x for x in [1, 2])]


i32 = lambda *v: np.array(v, np.int32)  # noqa: E731
u64 = lambda *v: np.array(v, np.uint64)  # noqa: E731


@dataclass
class Case:
    target: Callable[[World], Any]
    good: Callable[[World], dict[str, Any]]
    bad: dict[str, list] = field(default_factory=dict)
    cuda_only: bool = False


# ---------------------------------------------------------------- shared argument tables

SLOT = ints(-1, 2, 2**31 - 1, 2**31, True)  # True: not slot 1 (memra._core.Index)
LAYER = ints(-1, 6, 2**31, True)
ENGINE_ARG = {"engine": NOT_ENGINE}
CACHE_ARG = NOT_OBJ
WEIGHT = NOT_OBJ + [np.zeros((2, 2), np.float32)]  # a host Weight argument (memra.Weight)
EPS = floats(*NON_FINITE, -1.0)


def model(method: str):
    return lambda w: getattr(w.model, method)


def _take_and_give_back(m):
    """Model.take_slots, its leases released at once (a good call must not keep the slots)."""
    def take_slots(n, what="take_slots"):
        for lease in m.take_slots(n, what):
            lease.release()
    return take_slots


def sampling_bad():
    return {"max_new_tokens": ints(-1, 2**31, 2**28), "temperature": floats(*NON_FINITE, -1.0, True, 1e39),
            "top_k": [1.5, "3", [1], -1, 2**31, True, float("nan")],
            "top_p": [1.5, 0.0, -0.5, "0.9", float("nan"), float("inf"), [0.9], True],
            "seed": [1.5, "1", -1, 2**64, [1], True],
            "stop_token_ids": [272, -1, [272], [-1], [[1, 2]], 1.5, "x", {"a": 1}, [2**40], True,
                               [1.5], _OBJ],
            "ignore_eos": NOT_BOOL}


def hc_arrays(w, T=2):
    hc, D = w.hc_mult, w.D
    return dict(y=w.f32(T, D), post=w.f32(T, hc), comb=w.f32(T, hc, hc), residual=w.f32(T, hc, D))


# ---------------------------------------------------------------- the table

CASES: dict[str, Case] = {
    # -------------------------------------------------------------- memra.*
    "memra.load": Case(
        lambda w: memra.load,
        lambda w: dict(path=w.path, device="cpu", max_batch=1, max_len=8, progress=False),
        {"path": [None, 1, 1.5, [], {}, _OBJ, True, "/nonexistent/memra", lambda g, w: [("a file", g / "config.json")]],
         "device": [None, 1, "gpu", "", "cuda:x", "cuda:-1", b"cpu", ["cpu"], True],
         "max_batch": ints(0, -1, 2**31, True), "max_len": ints(0, -1, 2**31, True),
         "dtype": [1, "float16", "bf16", b"float32", ["float32"], "bfloat16"],
         "progress": ["yes", 2, 1.5, [], _OBJ], "cuda_graphs": ["yes", 2, None, 1.5],
         "kernel_options": KERNEL_OPTIONS}),
    "memra.default_checkpoint": Case(lambda w: memra.default_checkpoint, lambda w: {}),
    "memra.cuda_available": Case(lambda w: memra.cuda_available, lambda w: {}),
    "memra.cuda_unavailable_reason": Case(lambda w: memra.cuda_unavailable_reason, lambda w: {}),
    # -------------------------------------------------------------- Model
    "Model.new_cache": Case(model("new_cache"), lambda w: dict(max_batch=1, max_len=4),
                            {"max_batch": ints(0, -1, 2**31, True), "max_len": ints(0, -1, 2**31, True)}),
    "Model.logits": Case(model("logits"), lambda w: dict(token_ids=[1, 2, 3]), {"token_ids": BAD_IDS}),
    "Model.index_lists": Case(model("index_lists"), lambda w: dict(token_ids=[1, 2, 3]), {"token_ids": BAD_IDS}),
    "Model.prefill": Case(
        model("prefill"), lambda w: dict(cache=w.cache, slot=1, token_ids=[1, 2]),
        {"cache": CACHE_ARG + [lambda g, w: [("another geometry", w.other_cache)]], "slot": SLOT,
         "token_ids": BAD_IDS + [list(range(40))]}),
    "Model.decode": Case(
        model("decode"), lambda w: dict(cache=w.cache, slots=[0], token_ids=[7]),
        {"cache": CACHE_ARG + [lambda g, w: [("another geometry", w.other_cache)]],
         "slots": [None, "0", 1.5, 0, [], [0, 0], [5], [-1], [[0]], [0.5], {"s": 0}, [True], [True, 2], _OBJ],
         "token_ids": BAD_IDS}),
    "Model.generate": Case(
        model("generate"), lambda w: dict(prompt_ids=[1, 2], max_new_tokens=2, temperature=0.5, top_k=3,
                                          top_p=0.9, seed=1, stop_token_ids=[5], ignore_eos=False),
        {"prompt_ids": BAD_IDS, **sampling_bad()}),
    "Model.stream": Case(
        model("stream"), lambda w: dict(prompt_ids=[1, 2], max_new_tokens=2, temperature=0.5, top_k=3,
                                        top_p=0.9, seed=1, stop_token_ids=[5], ignore_eos=False),
        {"prompt_ids": BAD_IDS, **sampling_bad()}),
    "Model.generate_batch": Case(
        model("generate_batch"), lambda w: dict(prompts=[[1, 2], [3]], max_new_tokens=2, temperature=0.5,
                                                top_k=3, top_p=0.9, seed=1, stop_token_ids=[5], ignore_eos=False),
        {"prompts": [None, 3, 1.5, "abc", [[1, 2], None], [[1], [2], [3]], [[1, 2], []], [[272]], {"a": [1]},
                     [[[1, 2]]], [1, 2], _OBJ],
         **sampling_bad()}),
    "Model.prefill_batch": Case(
        model("prefill_batch"), lambda w: dict(cache=w.cache, slots=[1, 0], prompts=[[1, 2], [3]]),
        {"cache": CACHE_ARG + [lambda g, w: [("another geometry", w.other_cache)]],
         "slots": [None, "0", 1.5, 0, [0], [0, 0], [2, 0], [-1, 0], [[0], [1]], [0.5, 1.0], {"s": 0},
                   [True, False], [False, 1], [2**31, 0], _OBJ],
         "prompts": [None, 3, 1.5, "abc", [[1, 2], None], [[1], [2], [3]], [[1, 2], []], [[272], [1]],
                     {"a": [1]}, [[[1, 2]], [1]], [1, 2], _OBJ, [list(range(40)), [1]], [[1.5], [1]]]}),
    "Model.take_slots": Case(lambda w: _take_and_give_back(w.model), lambda w: dict(n=1, what="fuzz"),
                             {"n": ints(0, -1, 3, True)}),
    # -------------------------------------------------------------- classes
    "Cache()": Case(
        lambda w: _core.Cache, lambda w: dict(engine=w.engine, specs=w.specs(), max_batch=1, max_len=4),
        {"engine": NOT_OBJ,
         "specs": [None, 1, "x", [1, 2], [None], {}, _OBJ, lambda g, w: [("a bad item", g[:1] + ["x"])]],
         "max_batch": ints(0, -1, 2**31, 2**28), "max_len": ints(0, -1, 2**31, 2**28),
         "latent_dtype": NOT_STR + ENUM_STR + ["bfloat16"]}),
    "Cache.bytes_needed": Case(
        lambda w: _core.Cache.bytes_needed, lambda w: dict(max_batch=1, max_len=4, specs=w.specs()),
        {"max_batch": ints(0, -1, 2**31), "max_len": ints(0, -1, 2**31), "specs": [None, 1, "x", [1], [None], _OBJ]}),
    "DeviceWeight()": Case(
        lambda w: _core.DeviceWeight, lambda w: dict(engine=w.engine, weight=w.W(4, 4), dtype=None),
        {"engine": NOT_OBJ, "weight": NOT_OBJ, "dtype": [1, "float16", b"x", ["float32"]]}, cuda_only=True),
    "Engine()": Case(
        lambda w: _core.Engine, lambda w: dict(device="cpu", device_index=0),
        {"device": [None, 1, "gpu", "", b"cpu", ["cpu"], True, "cpu:0x"], "device_index": ints(-1, 2**31),
         "options": KERNEL_OPTIONS}),
    "KernelOptions()": Case(
        lambda w: memra.KernelOptions, lambda w: dict(pdl=True, gemv_rows=2, mla_decode_variant=1),
        {"pdl": NOT_BOOL, "gemv_rows": ints(3, -1, 16, True), "mla_decode_variant": ints(2, 5, -1, True),
         "prefill_chunk": ints(-1, True), "moe_tensor_cores": NOT_BOOL, "attn_prefill_tensor_cores": NOT_BOOL}),
    "KernelOptions.replace": Case(
        lambda w: memra.KernelOptions().replace, lambda w: dict(gemv=False, mla_split_tiles=2),
        {"gemv": NOT_BOOL, "mla_split_tiles": ints(-1, True), "moe_grouped_min_t": ints(0, -1),
         "prefill_chunk": ints(-1, True), "moe_tensor_cores": NOT_BOOL}),
    "KernelOptions.to_dict": Case(lambda w: memra.KernelOptions().to_dict, lambda w: {}),
    "HyperConnection()": Case(
        lambda w: _core.HyperConnection, lambda w: dict(engine=w.engine, weights=w.hc_weights(0), **w.hc_kw),
        {"engine": NOT_OBJ, "weights": WEIGHTS_DICT + [without("fn", "base", "scale")],
         "hidden": ints(0, -1, 63, 2**31), "hc_mult": ints(0, -1, 3, 2**31), "sinkhorn_iters": ints(0, -1),
         "hc_eps": EPS, "norm_eps": EPS, "dtype": NOT_STR + ENUM_STR}),
    "KdaLayer()": Case(
        lambda w: _core.KdaLayer, lambda w: dict(engine=w.engine, weights=w.weights(0, "self_attn."), **w.kda_kw),
        {"engine": NOT_OBJ, "weights": WEIGHTS_DICT + [without("q_proj.weight", "A_log")],
         "hidden": ints(0, -1, 63), "heads": ints(0, -1, 3), "head_dim": ints(0, -1, 64),
         "conv_kernel": ints(0, -1, 3), "gate": NOT_STR + ENUM_STR, "lower_bound": floats(*NON_FINITE, 0.5),
         "rms_eps": EPS, "dtype": NOT_STR + ENUM_STR}),
    "MlaLayer()": Case(
        lambda w: _core.MlaLayer, lambda w: dict(engine=w.engine, weights=w.weights(2, "self_attn."), **w.mla_kw),
        {"engine": NOT_OBJ, "weights": WEIGHTS_DICT + [without("q_a_proj.weight")],
         "hidden": ints(0, -1, 63), "heads": ints(0, -1, 3), "q_lora_rank": ints(0, -1, 31),
         "kv_rank": ints(0, -1, 31), "d_nope": ints(-1, 15), "d_rope": ints(-1, 3), "d_v": ints(0, -1, 15),
         "rms_eps": EPS, "sparse": NOT_BOOL, "index_heads": ints(-1, 15), "index_head_dim": ints(-1, 31),
         "kpool": ints(-1, 0, 3), "topk": ints(-1), "tail_rows": ints(-1, 3), "rotate": NOT_BOOL,
         "rope_base": floats(*NON_FINITE, 0.0, -1.0), "dtype": NOT_STR + ENUM_STR}),
    "MlpLayer()": Case(
        lambda w: _core.MlpLayer, lambda w: dict(engine=w.engine, weights=w.weights(0, "mlp."), **w.mlp_kw),
        {"engine": NOT_OBJ, "weights": WEIGHTS_DICT + [without("up_proj.weight")],
         "hidden": ints(0, -1, 63), "intermediate": ints(0, -1, 95),
         "swiglu_limit": floats(float("nan"), 0.0, -1.0), "dtype": NOT_STR + ENUM_STR}),
    "Weight()": Case(
        lambda w: _core.Weight, lambda w: dict(array=w.f32(3, 4), dtype="", name="w"),
        {"array": arr(lambda g, w: [("rank 5", np.zeros((1,) * 5, np.float32)),
                                    ("rank 0", np.zeros((), np.float32))],
                      dtypes=("float64", "int64", "int32", "bool", "uint8"), rank=False),
         "dtype": [None, 1, b"x", "float64", "bfloat16", ["float32"]], "name": [None, 1, b"x", ["w"], _OBJ]}),
    # -------------------------------------------------------------- Cache methods
    "Cache.length": Case(lambda w: w.cache.length, lambda w: dict(slot=0), {"slot": SLOT}),
    "Cache.cur": Case(lambda w: w.cache.cur, lambda w: dict(slot=0), {"slot": SLOT}),
    "Cache.device_lengths": Case(lambda w: w.cache.device_lengths, lambda w: {}),
    "Cache.device_cur": Case(lambda w: w.cache.device_cur, lambda w: {}),
    "Cache.kda_plane_addresses": Case(lambda w: w.cache.kda_plane_addresses, lambda w: dict(layer=0, slot=0),
                                      {"layer": LAYER + [2], "slot": SLOT}),
    "Cache.commit": Case(lambda w: w.cache.commit, lambda w: dict(slot=1, n=1),
                         {"slot": SLOT, "n": ints(-1, 33, 2**31 - 1, 2**31, True)}),
    "Cache.commit_host": Case(lambda w: w.cache.commit_host, lambda w: dict(slot=1, n=1),
                              {"slot": SLOT, "n": ints(-1, 33, 2**31 - 1, 2**31, True)}),
    "Cache.commit_decode": Case(lambda w: w.cache.commit_decode, lambda w: dict(slots=w.decode_slots()),
                                {"slots": [1, "x", np.array([0], np.int32), _OBJ, lambda g, w: [("a cache", w.cache)]]},
                                cuda_only=True),
    "Cache.free": Case(lambda w: w.cache.free, lambda w: dict(slot=1), {"slot": SLOT}),
    "Cache.owner": Case(lambda w: w.cache.owner, lambda w: dict(slot=0), {"slot": SLOT}),
    "Cache.hold": Case(lambda w: w.held_cache.hold, lambda w: dict(slot=0), {"slot": SLOT + [1]}),
    "Cache.release": Case(lambda w: w.held_cache.release, lambda w: dict(slot=1, token=w.held_token),
                          {"slot": SLOT + [0], "token": ints(0, 2**40, unsigned=True)}),
    "Cache.copy_slot": Case(lambda w: w.cache.copy_slot, lambda w: dict(src=0, dst=1), {"src": SLOT, "dst": SLOT}),
    "Cache.snapshot": Case(lambda w: w.cache.snapshot, lambda w: dict(slot=1), {"slot": SLOT}),
    "Cache.restore": Case(lambda w: w.cache.restore, lambda w: dict(snapshot=w.cache.snapshot(1), owner=0),
                          {"snapshot": NOT_OBJ + [lambda g, w: [("a cache", w.cache),
                                                                ("another cache's", w.other_cache.snapshot(0))]],
                           "owner": ints(unsigned=True)}),
    "Cache.kda_state": Case(lambda w: w.cache.kda_state, lambda w: dict(layer=0, slot=0),
                            {"layer": LAYER + [2], "slot": SLOT}),
    "Cache.kda_conv": Case(lambda w: w.cache.kda_conv, lambda w: dict(layer=0, slot=0),
                           {"layer": LAYER + [2], "slot": SLOT}),
    "Cache.latent_rows": Case(lambda w: w.cache.latent_rows, lambda w: dict(layer=2, slot=0),
                              {"layer": LAYER + [0], "slot": SLOT}),
    "Cache.pool_keys": Case(lambda w: w.cache.pool_keys, lambda w: dict(layer=2, slot=0),
                            {"layer": LAYER + [0, 3], "slot": SLOT}),
    # -------------------------------------------------------------- Engine methods
    "Engine.memory": Case(lambda w: w.engine.memory, lambda w: dict(reset_peak=False), {"reset_peak": NOT_CORE_BOOL}),
    "Engine.to_device": Case(lambda w: w.engine.to_device, lambda w: dict(array=w.f32(2, 3)),
                             {"array": arr(dtypes=(), rank=False)}, cuda_only=True),
    "Engine.to_host": Case(lambda w: w.engine.to_host, lambda w: dict(array=w.f32(2, 3)),
                           {"array": arr(dtypes=(), rank=False)}),
    "Engine.to_host_async": Case(lambda w: w.engine.to_host_async, lambda w: dict(array=w.f32(2, 3)),
                                 {"array": arr(lambda g, w: [("over 64 KiB", np.zeros(20000, np.float32))],
                                               dtypes=(), rank=False)}),
    "Engine.copy_into": Case(lambda w: w.engine.copy_into, lambda w: dict(dst=w.f32(2, 3), src=w.f32(2, 3)),
                             {"dst": arr(dtypes=(), rank=False), "src": arr(dtypes=(), rank=False)}, cuda_only=True),
    "Engine.synchronize": Case(lambda w: w.engine.synchronize, lambda w: {}),
    "Engine.begin_capture": Case(lambda w: w.engine.begin_capture, lambda w: {}, cuda_only=True),
    "Engine.end_capture": Case(lambda w: w.engine.end_capture, lambda w: {}, cuda_only=True),
    "Engine.abort_capture": Case(lambda w: w.engine.abort_capture, lambda w: {}),
    # -------------------------------------------------------------- layer methods
    "KdaLayer.state_spec": Case(lambda w: w.kda.state_spec, lambda w: {}),
    "KdaLayer.forward": Case(lambda w: w.kda.forward, lambda w: dict(x=w.f32(3, w.D)), {"x": arr(shape(3, 63))}),
    "KdaLayer.prefill": Case(
        lambda w: w.kda.prefill, lambda w: dict(cache=w.cache, layer=0, slot=1, x=w.f32(3, w.D)),
        {"cache": CACHE_ARG + [lambda g, w: [("another geometry", w.other_cache)]], "layer": LAYER + [2],
         "slot": SLOT, "x": arr(shape(3, 63), shape(40, 64))}),
    "KdaLayer.decode": Case(
        lambda w: w.kda.decode, lambda w: dict(cache=w.cache, layer=0, slots=i32(1), x=w.f32(1, w.D)),
        {"cache": CACHE_ARG + [lambda g, w: [("another geometry", w.other_cache)]], "layer": LAYER + [2],
         "slots": arr(lambda g, w: [("repeated", i32(0, 0)), ("outside", i32(5)), ("negative", i32(-1))],
                      dtypes=("int64", "float32", "uint32")),
         "x": arr(shape(2, 64), shape(1, 63))}),
    "MlaLayer.state_spec": Case(lambda w: w.mla.state_spec, lambda w: {}),
    "MlaLayer.prefill": Case(
        lambda w: w.mla.prefill, lambda w: dict(cache=w.cache, layer=2, slot=1, x=w.f32(3, w.D), topk=None),
        {"cache": CACHE_ARG + [lambda g, w: [("another geometry", w.other_cache)]], "layer": LAYER + [0],
         "slot": SLOT, "x": arr(shape(3, 63), shape(40, 64)),
         "topk": [1.5, "x", np.zeros((3, 11), np.int64), np.zeros((2, 11), np.int32), np.zeros((3, 11), np.float32)]}),
    "MlaLayer.decode": Case(
        lambda w: w.mla.decode, lambda w: dict(cache=w.cache, layer=2, slots=i32(0), x=w.f32(1, w.D), topk=None),
        {"cache": CACHE_ARG + [lambda g, w: [("another geometry", w.other_cache)]], "layer": LAYER + [0],
         "slots": arr(lambda g, w: [("repeated", i32(0, 0)), ("outside", i32(5)), ("negative", i32(-1))],
                      dtypes=("int64", "float32", "uint32")),
         "x": arr(shape(2, 64), shape(1, 63)),
         "topk": [1.5, "x", np.zeros((1, 11), np.int64), np.zeros((2, 11), np.int32)]}),
    "MlpLayer.forward": Case(lambda w: w.mlp.forward, lambda w: dict(x=w.f32(3, w.D)), {"x": arr(shape(3, 63))}),
    "HyperConnection.pre": Case(
        lambda w: w.hc.pre, lambda w: dict(streams=w.f32(2, w.hc_mult, w.D), norm=w.f32(w.D), eps=1e-5),
        {"streams": arr(shape(2, 3, 64)), "norm": opt(arr(shape(63))), "eps": some(EPS)}),
    "HyperConnection.post_pre": Case(
        lambda w: w.hc.post_pre,
        lambda w: dict(y=w.f32(2, w.D), post=w.f32(2, w.hc_mult), comb=w.f32(2, w.hc_mult, w.hc_mult),
                       streams=w.f32(2, w.hc_mult, w.D), norm=w.f32(w.D), eps=1e-5),
        {"y": arr(shape(3, 64)), "post": arr(shape(2, 3)), "comb": arr(shape(2, 4, 3)),
         "streams": arr(shape(2, 3, 64)), "norm": opt(arr(shape(63))), "eps": EPS}),
    "LayerStateSpec.none": Case(lambda w: _core.LayerStateSpec.none, lambda w: {}),
    "LayerStateSpec.kda": Case(lambda w: _core.LayerStateSpec.kda, lambda w: dict(heads=2, head_dim=8, conv_kernel=4),
                               {"heads": ints(0, -1), "head_dim": ints(0, -1), "conv_kernel": ints(0, -1)}),
    "LayerStateSpec.mla": Case(lambda w: _core.LayerStateSpec.mla,
                               lambda w: dict(row_width=32, index_head_dim=8, kpool=4, tail_rows=8),
                               {"row_width": ints(0, -1), "index_head_dim": ints(-1), "kpool": ints(-1),
                                "tail_rows": ints(-1)}),
    "Weight.to_numpy": Case(lambda w: w.W(2, 3).to_numpy, lambda w: {}),
    # -------------------------------------------------------------- functional ops (memra._core)
    "_core.embedding": Case(
        lambda w: _core.embedding,
        lambda w: dict(table=w.W(16, 8), ids=i32(*range(64)) % 16, check_range=True, expand=2),
        {"table": WEIGHT, "ids": arr(lambda g, w: [("outside", i32(16)), ("negative", i32(-1))],
                                     dtypes=("int64", "float32", "uint32")),
         "check_range": NOT_BOOL, "expand": some(ints(0, -1, 2**31, 2**28)),
         **ENGINE_ARG}),
    "_core.linear": Case(
        lambda w: _core.linear, lambda w: dict(x=w.f32(4, 8), w=w.W(6, 8), bias=w.f32(6)),
        {"x": arr(shape(4, 7)), "w": WEIGHT, "bias": opt(arr(shape(5))), **ENGINE_ARG}),
    "_core.linear_ex": Case(
        lambda w: _core.linear_ex, lambda w: dict(x=w.f32(2, 8), w=w.W(6, 8), bias=None, col0=0),
        {"x": F32, "w": WEIGHT, "bias": opt(F32), "col0": ints(-1), **ENGINE_ARG}, cuda_only=True),
    "_core.linear_ex_pair": Case(
        lambda w: _core.linear_ex_pair, lambda w: dict(x=w.f32(2, 8), w0=w.W(6, 8), w1=w.W(6, 8), col0=0, col1=0),
        {"x": F32, "w0": WEIGHT, "w1": WEIGHT, "col0": ints(-1), "col1": ints(-1), **ENGINE_ARG}, cuda_only=True),
    "_core.rms_norm": Case(
        lambda w: _core.rms_norm, lambda w: dict(x=w.f32(3, 8), weight=w.f32(8), eps=1e-5),
        {"x": arr(shape(3, 7)), "weight": opt(arr(shape(7))), "eps": EPS, **ENGINE_ARG}),
    "_core.add_rms_norm": Case(
        lambda w: _core.add_rms_norm, lambda w: dict(x=w.f32(3, 8), y=w.f32(3, 8), weight=w.f32(8), eps=1e-5),
        {"x": arr(shape(3, 7)), "y": arr(shape(2, 8), shape(3, 7)), "weight": opt(arr(shape(7))), "eps": EPS,
         **ENGINE_ARG}),
    "_core.rms_norm_gated": Case(
        lambda w: _core.rms_norm_gated, lambda w: dict(x=w.f32(3, 8), gate=w.f32(3, 8), weight=w.f32(8), eps=1e-5),
        {"x": arr(shape(3, 7)), "gate": arr(shape(2, 8)), "weight": arr(shape(7)), "eps": EPS, **ENGINE_ARG}),
    "_core.layer_norm": Case(
        lambda w: _core.layer_norm, lambda w: dict(x=w.f32(3, 8), weight=w.f32(8), bias=w.f32(8), eps=1e-5),
        {"x": arr(shape(3, 7)), "weight": arr(shape(7)), "bias": arr(shape(7)), "eps": EPS, **ENGINE_ARG}),
    "_core.norm_rows": Case(
        lambda w: _core.norm_rows,
        lambda w: dict(x0=w.f32(1, 8), w0=w.f32(8), x1=w.f32(1, 6), w1=None, x2=w.f32(1, 4), w2=w.f32(4),
                       b2=w.f32(4), eps0=1e-6, eps1=1e-5, eps2=1e-3),
        {"x0": arr(shape(2, 8)), "w0": opt(arr(shape(7))), "x1": arr(shape(2, 6)), "x2": opt(arr(shape(2, 4))),
         "w2": opt(arr(shape(3))), "b2": opt(arr(shape(3))), "eps0": EPS, "eps1": EPS, "eps2": EPS, **ENGINE_ARG}),
    "_core.l2norm_heads": Case(lambda w: _core.l2norm_heads, lambda w: dict(x=w.f32(3, 2, 4), eps=1e-6),
                               {"x": F32, "eps": EPS, **ENGINE_ARG}),
    "_core.rope_interleaved": Case(
        lambda w: _core.rope_interleaved, lambda w: dict(x=w.f32(3, 2, 4), positions=i32(0, 1, 2), base=10000.0),
        {"x": arr(shape(3, 2, 3)), "positions": arr(shape(2, dtype=np.int32), dtypes=("int64", "float32")),
         "base": floats(*NON_FINITE, 0.0, -1.0), **ENGINE_ARG}),
    "_core.sigmoid": Case(lambda w: _core.sigmoid, lambda w: dict(x=w.f32(5)), {"x": F32, **ENGINE_ARG}),
    "_core.kda_conv": Case(
        lambda w: _core.kda_conv,
        lambda w: dict(x=w.f32(3, 6), w=w.f32(6, 4), ring=w.f32(6, 3), arm="auto", batch=False),
        {"x": arr(shape(3, 5)), "w": arr(shape(5, 4)), "ring": arr(shape(6, 2)), "arm": NOT_STR + ENUM_STR,
         "batch": NOT_BOOL, "l2_dk": ints(-1, 5, 2**31), **ENGINE_ARG}),
    "_core.kda_gate": Case(
        lambda w: _core.kda_gate, lambda w: dict(f=w.f32(3, 8), dt_bias=w.f32(8), A_log=w.f32(2), form="lower_bound",
                                                 lower_bound=-5.0),
        {"f": arr(shape(3, 7)), "dt_bias": arr(shape(7)), "A_log": arr(shape(3)), "form": NOT_STR + ENUM_STR,
         "lower_bound": floats(*NON_FINITE, 0.5), **ENGINE_ARG}),
    "_core.kda_scan": Case(
        lambda w: _core.kda_scan,
        lambda w: dict(q=w.f32(3, 2, 4), k=w.f32(3, 2, 4), v=w.f32(3, 2, 5), g=-abs(w.f32(3, 2, 4)), beta=w.f32(3, 2),
                       state=w.f32(2, 4, 5), scale=None, batch=False),
        {"q": arr(shape(3, 2, 3)), "k": arr(shape(2, 2, 4)), "v": arr(shape(3, 3, 5), shape(3, 2, 0)),
         "g": arr(shape(3, 2, 3)),
         "beta": arr(shape(3, 3)), "state": opt(arr(shape(2, 4, 4))), "scale": some(floats(*NON_FINITE)),
         "batch": NOT_CORE_BOOL, "chunked": NOT_CORE_BOOL, **ENGINE_ARG}),
    "_core.mla_absorb_q": Case(
        lambda w: _core.mla_absorb_q, lambda w: dict(q_nope=w.f32(3, 2, 4), kv_b=w.W(18, 6), d_v=5, arm=0),
        {"q_nope": arr(shape(3, 2, 5)), "kv_b": WEIGHT, "d_v": ints(-1, 4, 2**31), "arm": ints(-1, 4), **ENGINE_ARG}),
    "_core.mla_decompress_v": Case(
        lambda w: _core.mla_decompress_v, lambda w: dict(o_lat=w.f32(3, 2, 6), kv_b=w.W(18, 6), d_nope=4, arm=0),
        {"o_lat": arr(shape(3, 2, 5), shape(3, 2, 0)), "kv_b": WEIGHT, "d_nope": ints(-1, 10, 2**31),
         "arm": ints(-1, 4),
         **ENGINE_ARG}),
    "_core.mla_latent_append": Case(
        lambda w: _core.mla_latent_append,
        lambda w: dict(rows=w.f32(2, 6), cache=np.zeros((8, 6), np.float32), start=3),
        {"rows": arr(shape(2, 5)), "cache": arr(read_only, shape(8, 5)), "start": ints(-1, 7, 2**31 - 1),
         **ENGINE_ARG}),
    "_core.mla_attn_absorbed": Case(
        lambda w: _core.mla_attn_absorbed,
        lambda w: dict(q_lat=w.f32(2, 2, 6), cache=w.f32(5, 6), q_pe=None, scale=0.5),
        {"q_lat": arr(shape(2, 2, 5)), "cache": arr(shape(1, 6), shape(5, 5)), "q_pe": opt(F32),
         "scale": floats(*NON_FINITE), **ENGINE_ARG}),
    "_core.mla_attn_gathered": Case(
        lambda w: _core.mla_attn_gathered,
        lambda w: dict(q_lat=w.f32(2, 2, 6), cache=w.f32(5, 6), idx=i32([0, 1, -1], [2, 3, 4]), q_pe=None, scale=0.5,
                       check_range=True),
        {"q_lat": arr(shape(2, 2, 5)), "cache": arr(shape(5, 5)),
         "idx": arr(lambda g, w: [("outside", i32([0, 9, -1], [0, 1, 2])), ("below -1", i32([0, -2, -1], [0, 1, 2]))],
                    dtypes=("int64", "float32")),
         "q_pe": opt(F32), "scale": floats(*NON_FINITE), "check_range": NOT_BOOL, **ENGINE_ARG}),
    "_core.mla_attn_decode": Case(
        lambda w: _core.mla_attn_decode,
        lambda w: dict(q_lat=w.f32(2, 2, 6), caches=[w.f32(5, 6), w.f32(4, 6)], t_kv=[5, 3], idx=None, q_pe=None,
                       scale=0.5, max_t_kv=None),
        {"q_lat": arr(shape(2, 2, 5)),
         "caches": [None, 1, "x", _OBJ, [1, 2], np.zeros((5, 6), np.float32), [np.zeros((5, 6), np.float32)],
                    [np.zeros((5, 6), np.float64), np.zeros((4, 6), np.float64)],
                    [np.zeros((5, 5), np.float32), np.zeros((4, 5), np.float32)],
                    np.zeros((3, 5, 6), np.float32), np.zeros((2, 5, 6), np.float64),
                    np.zeros((2, 5, 5), np.float32), np.zeros((2, 5, 6, 1), np.float32)],
         "t_kv": [None, "x", 5, 1.5, [1.5, 2], [6, 3], [-1, 2], [5], [5, 3, 1], {"a": 1}, [2**40, 1],
                  np.array([5, 3], np.float32)],
         "idx": opt(I32), "q_pe": opt(F32), "scale": floats(*NON_FINITE), "max_t_kv": some(ints(-1, 1)),
         **ENGINE_ARG}),
    "_core.mla_latent_append_decode": Case(
        lambda w: _core.mla_latent_append_decode,
        lambda w: dict(rows=w.f32(2, 6), caches=[np.zeros((8, 6), np.float32), np.zeros((8, 6), np.float32)],
                       pos=[3, 5]),
        {"rows": arr(shape(2, 5), shape(3, 6)),
         "caches": [None, 1, "x", _OBJ, [1, 2], np.zeros((8, 6), np.float32), [np.zeros((8, 6), np.float32)],
                    [np.zeros((8, 6), np.float64), np.zeros((8, 6), np.float64)],
                    np.zeros((3, 8, 6), np.float32), np.zeros((2, 8, 5), np.float32)],
         "pos": [None, "x", 3, [8, 1], [3, 2**31], [1.5, 2], [3], {"a": 1}, np.array([3, 5], np.float32)],
         **ENGINE_ARG}),
    "_core.swiglu_mlp": Case(
        lambda w: _core.swiglu_mlp,
        lambda w: dict(x=w.f32(3, 8), gate_w=w.W(5, 8), up_w=w.W(5, 8), down_w=w.W(8, 5), limit=2.0),
        {"x": arr(shape(3, 7)), "gate_w": WEIGHT, "up_w": WEIGHT, "down_w": WEIGHT,
         "limit": floats(float("nan"), 0.0, -1.0), **ENGINE_ARG}),
    "_core.sample": Case(
        lambda w: _core.sample,
        lambda w: dict(logits=w.f32(2, 10), counters=u64(0, 1), temperature=0.8, top_k=0, top_p=1.0, seed=0,
                       seeds=None, nonfinite=np.zeros(2, np.int32)),
        {"logits": arr(shape(3, 10)), "counters": arr(shape(3, dtype=np.uint64), dtypes=("int32", "float64", "uint32"),
                                                       ),
         "temperature": floats(*NON_FINITE), "top_k": ints(-1, 2**31), "top_p": floats(float("nan"), 0.0, -0.5),
         "seed": ints(unsigned=True), "seeds": opt(arr(shape(3, dtype=np.uint64), dtypes=("int32", "float64"))),
         "nonfinite": opt(arr(shape(3, dtype=np.int32), read_only, dtypes=("int64", "uint32", "float32"))),
         **ENGINE_ARG}),
    "_core.uniform_from_counter": Case(lambda w: _core.uniform_from_counter, lambda w: dict(seed=1, counter=2),
                                       {"seed": ints(unsigned=True), "counter": ints(unsigned=True)}),
    "_core.mhc_pre": Case(
        lambda w: _core.mhc_pre,
        lambda w: dict(streams=w.f32(2, 4, 8), fn=w.W(24, 32), base=w.f32(24), scale=w.f32(3), sinkhorn_iters=20,
                       hc_eps=1e-6, norm_eps=1e-5, rms_weight=w.f32(8), rms_eps=1e-5),
        {"streams": arr(shape(2, 4, 7)), "fn": WEIGHT, "base": arr(shape(23)), "scale": arr(shape(2)),
         "sinkhorn_iters": ints(0, -1), "hc_eps": EPS, "norm_eps": EPS, "rms_weight": opt(arr(shape(7))),
         "rms_eps": some(EPS), **ENGINE_ARG}),
    "_core.mhc_post": Case(lambda w: _core.mhc_post, lambda w: hc_arrays(w),
                           {"y": arr(shape(3, 64)), "post": arr(shape(2, 3)), "comb": arr(shape(2, 4, 3)),
                            "residual": arr(shape(2, 4, 63)), **ENGINE_ARG}),
    "_core.mhc_post_head_norm": Case(
        lambda w: _core.mhc_post_head_norm, lambda w: dict(**hc_arrays(w), weight=w.f32(w.D), eps=1e-5),
        {"y": arr(shape(3, 64)), "post": arr(shape(2, 3)), "comb": arr(shape(2, 4, 3)),
         "residual": arr(shape(2, 4, 63)),
         "weight": opt(arr(shape(63))), "eps": EPS, **ENGINE_ARG}),
    "_core.hc_head_mean": Case(lambda w: _core.hc_head_mean, lambda w: dict(streams=w.f32(2, 4, 8)),
                               {"streams": F32, **ENGINE_ARG}),
    "_core.kpool_pool_keys": Case(
        lambda w: _core.kpool_pool_keys, lambda w: dict(k=w.f32(8, 5), gate=w.f32(8, 5), ape=w.f32(4, 5)),
        {"k": arr(shape(8, 4)), "gate": arr(shape(7, 5)), "ape": arr(shape(0, 5), shape(4, 4)), **ENGINE_ARG}),
    "_core.kpool_append": Case(
        lambda w: _core.kpool_append,
        lambda w: dict(k=w.f32(3, 5), gate=w.f32(3, 5), ape=w.f32(4, 5), tail_k=w.f32(8, 5), tail_gate=w.f32(8, 5),
                       pool_keys=w.f32(4, 5), pos=6),
        {"k": arr(shape(3, 4)), "gate": arr(shape(2, 5)), "ape": arr(shape(0, 5), shape(3, 5)),
         "tail_k": arr(shape(6, 5)), "tail_gate": arr(shape(8, 4)), "pool_keys": arr(shape(1, 5)),
         "pos": ints(-1, 2**31 - 1, 100), **ENGINE_ARG}),
    "_core.kpool_score": Case(
        lambda w: _core.kpool_score,
        lambda w: dict(q=w.f32(2, 3, 5), w=w.f32(2, 3), pool_keys=w.f32(2, 5), pool=4, first_pos=6, qk_scale=0.5,
                       head_scale=0.5, reference=False),
        {"q": arr(shape(2, 3, 4)), "w": arr(shape(2, 2)), "pool_keys": arr(shape(2, 4)), "pool": ints(0, -1),
         "first_pos": ints(-1, 2**31 - 1), "qk_scale": floats(*NON_FINITE), "head_scale": floats(*NON_FINITE),
         "reference": NOT_BOOL, **ENGINE_ARG}),
    "_core.kpool_select": Case(
        # 1024 queries: a width of 2^28 asks for 1 TiB, which no machine has free.
        lambda w: _core.kpool_select,
        lambda w: dict(score=w.f32(1024, 2), pool=4, select_k=2, width=11, first_pos=6, reference=False),
        {"score": F32, "pool": ints(0, -1), "select_k": ints(-1), "width": ints(10, -1, 2**28, 2**31),
         "first_pos": ints(-1, 2**31 - 1), "reference": NOT_BOOL, **ENGINE_ARG}),
    "_core.kpool_append_decode": Case(
        lambda w: _core.kpool_append_decode,
        lambda w: dict(k=w.f32(2, 5), gate=w.f32(2, 5), ape=w.f32(4, 5), tail_k=[w.f32(8, 5), w.f32(8, 5)],
                       tail_gate=[w.f32(8, 5), w.f32(8, 5)], pool_keys=[w.f32(4, 5), w.f32(4, 5)], pos=[3, 5]),
        {"k": F32, "gate": F32, "ape": F32, "tail_k": [None, 1, "x"], "tail_gate": [None, [1, 2]],
         "pool_keys": [None, "x"], "pos": [None, "x", [1.5, 2]], **ENGINE_ARG}, cuda_only=True),
    "_core.kpool_score_decode": Case(
        lambda w: _core.kpool_score_decode,
        lambda w: dict(q=w.f32(2, 3, 5), w=w.f32(2, 3), pool_keys=[w.f32(4, 5), w.f32(4, 5)], pos=[3, 5], pool=4,
                       qk_scale=0.5, head_scale=0.5, max_pools=None),
        {"q": F32, "w": F32, "pool_keys": [None, "x", 1], "pos": [None, "x"], "pool": ints(0),
         "qk_scale": floats(*NON_FINITE), "head_scale": floats(*NON_FINITE),
         "max_pools": some(ints(-1)), **ENGINE_ARG}, cuda_only=True),
    "_core.kpool_select_decode": Case(
        lambda w: _core.kpool_select_decode,
        lambda w: dict(score=w.f32(2, 4), pos=[3, 5], pool=4, select_k=2, width=11),
        {"score": F32, "pos": [None, "x", [1.5]], "pool": ints(0), "select_k": ints(-1), "width": ints(-1, 2**28),
         **ENGINE_ARG}, cuda_only=True),
    "_core.hc_expand": Case(
        # 64 x 64 rows: n = 2^28 asks for 4 TiB.
        lambda w: _core.hc_expand, lambda w: dict(x=w.f32(64, 64), n=4),
        {"x": F32, "n": ints(0, -1, 2**28, 2**31), **ENGINE_ARG}),
    "_core.take_rows": Case(
        lambda w: _core.take_rows, lambda w: dict(x=w.f32(5, 8), start=1, count=2),
        {"x": F32, "start": ints(-1, 6, 2**31), "count": ints(-1, 5, 2**31), **ENGINE_ARG}),
    "_core.concat_rows": Case(
        lambda w: _core.concat_rows, lambda w: dict(parts=[w.f32(2, 8), w.f32(3, 8)]),
        {"parts": [None, 1, "x", [], [None], ["x"], [np.zeros((2, 8))], [np.zeros(8, np.float32)],
                   [np.zeros((2, 8), np.int32)], lambda g, w: [("another width", [g[0], w.f32(1, 4)])],
                   lambda g, w: [("an array, not a list", g[0])], lambda g, w: [("strided", [g[0][:, ::2]])]],
         **ENGINE_ARG}),
    "_core.kda_tables": Case(
        lambda w: _core.kda_tables,
        lambda w: dict(cache=w.cache, layer=0, slots=i32(0), cur=None, group=0, sink_slot=None),
        {"cache": NOT_OBJ, "layer": LAYER, "slots": I32, "cur": opt(I32), "group": ints(-1, 3),
         "sink_slot": some(SLOT)}, cuda_only=True),
    "_core.commit_decode": Case(
        lambda w: _core.commit_decode, lambda w: dict(slots=i32(0), lengths=i32(0, 0), cur=i32(0, 0)),
        {"slots": I32, "lengths": [None, 1, "x"], "cur": [None, 1.5], **ENGINE_ARG}, cuda_only=True),
}

# Per-area tables, merged here so CASES names every callable (each imports this module's
# vocabulary above, hence the import at the end).
from fuzz_api_cases_attention import CASES as _ATTENTION_CASES  # noqa: E402
from fuzz_api_cases_moe import CASES as _MOE_CASES  # noqa: E402

CASES.update(_ATTENTION_CASES)
CASES.update(_MOE_CASES)

# Public callables deliberately left out, with the reason.
EXEMPT = {
    "Model()": "made by memra.load from a checkpoint; its parameters are internal (the loader's)",
}
