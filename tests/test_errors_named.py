"""The bad inputs issue 17 names, one by one (the fuzz in test_fuzz_api.py covers them all in
bulk): each is a memra error naming the argument and the value, or, for bfloat16 arrays of
ml_dtypes, accepted as bfloat16; and the argument explanation behind memra._core's conversion
errors keeps Python's TypeError for a wrong number of arguments or an unknown keyword.
"""

from __future__ import annotations

import ctypes

import ml_dtypes
import numpy as np
import pytest

import memra
from memra import _core
from memra.errors import ContractError, OutOfMemoryError

S = _core.status


@pytest.fixture(scope="module")
def model():
    return memra.load(memra.default_checkpoint(), max_batch=2, max_len=16, progress=False)


def f32(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def raises(cls, fn, *words):
    """fn() raises `cls` whose message holds every one of `words`; returns the error."""
    with pytest.raises(cls) as info:
        fn()
    for w in words:
        assert w in str(info.value), f"{w!r} not in: {info.value}"
    return info.value


# ---------------------------------------------------------------- the model's methods


def test_model_arguments_are_named(model):
    raises(ContractError, lambda: model.prefill(None, 0, [7]), "prefill", "cache", "None")
    raises(ContractError, lambda: model.logits([[1, 2], [3]]), "logits", "token_ids", "[[1, 2], [3]]")
    raises(ContractError, lambda: model.generate_batch(None, 3), "generate_batch", "prompts", "None")
    raises(ContractError, lambda: model.generate_batch([[1], [2, None]], 3), "prompts[1]")
    # A 0-d array passed the sequence check and failed on iteration (a raw TypeError).
    raises(ContractError, lambda: model.generate_batch(np.array(1), 3), "generate_batch", "prompts", "array(1)")
    # bytes were refused as stop ids and a bytearray was taken as its bytes' values.
    raises(ContractError, lambda: model.generate([1, 2], 2, stop_token_ids=bytearray(b"\x01")), "stop_token_ids")
    raises(ContractError, lambda: model.decode(model.new_cache(1, 4), [[0]], [1]), "decode", "slots")
    raises(ContractError, lambda: memra.load(None), "load", "path", "None")
    raises(ContractError, lambda: memra.load(memra.default_checkpoint(), progress="yes"), "progress")


@pytest.mark.parametrize("stop", [272, [272], [-1], [1, 1000]])
def test_stop_token_ids_outside_the_vocabulary(model, stop):
    e = raises(ContractError, lambda: model.generate([1, 2], 2, stop_token_ids=stop), "stop_token_ids")
    assert e.code == S.CONTRACT_RANGE


def test_a_two_dimensional_stop_token_ids_array_is_shown_as_one_array(model):
    # list() of a 2-D array is a list of rows: the message showed "[array([1, 2])]".
    e = raises(ContractError, lambda: model.generate([1, 2], 2, stop_token_ids=np.array([[1, 2]])),
               "stop_token_ids", "1-D", "[[1, 2]]")
    assert "[array(" not in str(e), str(e)
    # An empty sequence is taken (no stop ids), so the refusal does not ask for a non-empty one;
    # an empty 2-D array is no 1-D sequence either.
    assert "non-empty" not in str(e), str(e)
    raises(ContractError, lambda: model.generate([1, 2], 2, stop_token_ids=np.zeros((0, 2), np.int64)),
           "stop_token_ids", "1-D")
    for empty in ([], (), np.zeros(0, np.int64), set()):
        assert model.generate([1, 2], 2, stop_token_ids=empty) == model.generate([1, 2], 2)


def test_a_timedelta64_is_no_integer_argument(model):
    # numpy counts timedelta64 among its integer types: a slot, a stop id, a count or a sampling
    # number given as one was taken as its integer value, where an array of them is refused.
    td = np.timedelta64(1)
    c = model.new_cache(1, 8)
    raises(ContractError, lambda: model.prefill(c, td, [1, 2]), "prefill", "slot")
    assert c.length(0) == 0
    raises(ContractError, lambda: model.generate([1, 2], 2, stop_token_ids=td), "stop_token_ids")
    raises(ContractError, lambda: model.generate([1, 2], td), "max_new_tokens")
    raises(ContractError, lambda: model.generate([1, 2], 2, top_k=td), "top_k")
    raises(ContractError, lambda: model.generate([1, 2], 2, temperature=td), "temperature")
    raises(ContractError, lambda: model.generate([1, 2], 2, top_p=td), "top_p")


def test_a_masked_array_of_ids_is_refused(model):
    # np.asarray drops the mask: the masked id would have been fed as a token.
    ids = np.ma.array([1, 2, 3], mask=[0, 1, 0])
    e = raises(ContractError, lambda: model.generate(ids, 2), "generate", "prompt_ids", "masked")
    assert e.code == 40000
    raises(ContractError, lambda: model.logits(ids), "logits", "token_ids", "masked")
    # Any masked array, masked entries or not: what a mask means is the caller's to say.
    raises(ContractError, lambda: model.generate(np.ma.array([1, 2, 3]), 2), "generate", "masked")


def test_a_full_slot_is_named_by_the_public_call_and_changes_nothing():
    # The room checks run once the slots are held; the layers' own check would name KdaLayer.
    m = memra.load(memra.default_checkpoint(), max_batch=2, max_len=8, progress=False)
    c = m.new_cache(2, 8)
    m.prefill(c, 0, list(range(1, 9)))
    m.prefill(c, 1, [1, 2, 3])
    e = raises(memra.CacheFullError, lambda: m.decode(c, [1, 0], [5, 5]), "decode: slot 0 holds 8 of 8 tokens")
    assert str(e).startswith("decode:"), str(e)
    e = raises(memra.CacheFullError, lambda: m.prefill(c, 1, list(range(1, 7))), "prefill: slot 1 holds 3 of 8")
    assert str(e).startswith("prefill:"), str(e)
    assert (c.length(0), c.length(1), c.owner(0), c.owner(1)) == (8, 3, 0, 0)


def test_an_owner_token_or_cache_size_given_as_a_bool_is_named(model):
    # owner=True was token 1, the first hold() of the process; max_batch=True a cache of 1.
    c = model.new_cache(1, 4)
    raises(ContractError, lambda: c.free(0, owner=True), "Cache.free", "owner", "bool")
    raises(ContractError, lambda: c.release(0, True), "Cache.release", "token", "bool")
    raises(ContractError, lambda: c.commit(0, 1, owner=True), "Cache.commit", "owner", "bool")
    raises(ContractError, lambda: _core.Cache.bytes_needed(True, 2, []), "bytes_needed", "max_batch", "bool")
    assert c.length(0) == 0 and c.owner(0) == 0


def test_stream_names_itself_and_a_users_hold_is_named_as_one():
    # stream's errors said "generate:"; a slot the user held with cache.hold() was said to be
    # held by a generation.
    m = memra.load(memra.default_checkpoint(), max_batch=1, max_len=16, progress=False)
    raises(ContractError, lambda: m.stream([1, 2], -1), "stream: max_new_tokens")
    raises(ContractError, lambda: m.stream([1, 2], 2, stop_token_ids=[-1]), "stream: stop_token_ids")
    raises(ContractError, lambda: m.stream([1, 2], 2, ignore_eos=1), "stream: ignore_eos")
    token = m.cache.hold(0)
    try:
        raises(ContractError, lambda: next(iter(m.stream([1, 2], 2))), "stream:", "cache.hold() token: [0]")
        raises(ContractError, lambda: m.prefill(m.cache, 0, [1, 2]), "prefill", "[0]", "cache.hold() token")
    finally:
        m.cache.release(0, token)
    assert len(m.generate([1, 2], 2)) == 2


@pytest.mark.parametrize("theta", [1e-300, 1e-46])
def test_rope_inv_freq_refuses_a_theta_with_an_infinite_frequency(theta):
    # 1 / theta ** (2j / dim) past float32's range: the frequencies were returned as inf.
    raises(ContractError, lambda: _core.rope_inv_freq(theta, 8), "rope_inv_freq", "theta", "too small")
    assert np.isfinite(_core.rope_inv_freq(1e-20, 8)).all()


# ---------------------------------------------------------------- allocation, arrays, values


def test_oversized_outputs_are_refused_before_allocating():
    # 64 x 2^28 x 64 float32 = 4 TiB; 1024 x 2^28 int32 = 1 TiB: more than any host has free.
    e = raises(OutOfMemoryError, lambda: _core.hc_expand(f32(64, 64), 2**28), "hc_expand", "268435456")
    assert e.code == S.OUT_OF_MEMORY and "available" in str(e)
    raises(OutOfMemoryError, lambda: _core.kpool_select(f32(1024, 2), pool=4, select_k=2, width=2**28,
                                                        first_pos=6), "kpool_select", "268435456")
    raises(ContractError, lambda: _core.hc_expand(f32(2, 4), 2**31), "hc_expand", "n", "2147483648")


def test_big_endian_and_unconvertible_arrays_are_named():
    x = f32(3, 8)
    e = raises(ContractError, lambda: _core.rms_norm(x.astype(">f4"), eps=1e-5), "rms_norm", "'x'", "big-endian")
    assert e.code == S.CONTRACT_DTYPE
    raises(ContractError, lambda: _core.rms_norm(x.astype(object), eps=1e-5), "'x'", "object")
    raises(ContractError, lambda: _core.rms_norm([[1.0, 2.0], [3.0]], eps=1e-5), "'x'", "[[1.0, 2.0], [3.0]]")
    raises(ContractError, lambda: _core.rms_norm(x, "w", eps=1e-5), "'weight'", "'w' (str)")
    raises(ContractError, lambda: _core.Weight(x.astype(">f2")), "Weight", "'array'", "big-endian")


def test_ml_dtypes_bfloat16_is_bfloat16():
    a = f32(6, 8).astype(ml_dtypes.bfloat16)
    w = _core.Weight(a)
    assert w.dtype == "bfloat16"
    np.testing.assert_array_equal(w.to_numpy(), _core.Weight(a.view(np.uint16), dtype="bfloat16").to_numpy())
    np.testing.assert_array_equal(w.to_numpy(), a.astype(np.float32))
    back = _core.Engine().to_host(a)  # a host copy keeps the dtype
    assert back.dtype == ml_dtypes.bfloat16 and back.tobytes() == a.tobytes()
    # Where float32 is required, the error says what it got.
    raises(ContractError, lambda: _core.rms_norm(a, eps=1e-5), "'x'", "float32", "bfloat16")


def test_sampling_and_routing_values():
    logits, ctr = f32(2, 10), np.arange(2, dtype=np.uint64)
    for bad in (float("inf"), -float("inf"), float("nan")):
        raises(ContractError, lambda: _core.sample(logits, ctr, temperature=bad), "sample", "temperature")
    raises(ContractError, lambda: _core.sample(logits, ctr, temperature=1.0, top_k=-1), "sample", "top_k", "-1")
    kw = dict(top_k=2, n_group=2, topk_group=1, norm_topk_prob=True)
    gate = _core.Weight(f32(8, 8))
    for bad in (float("nan"), float("inf")):
        raises(ContractError, lambda: _core.moe_route(f32(3, 8), gate, scaling=bad, **kw), "moe_route", "scaling")
    _core.sample(logits, ctr, temperature=-1.0)  # <= 0 stays greedy


def test_zero_width_heads_and_hidden_are_named():
    """Zero-size widths that once crashed the CPU reference (found by a fuzzing review): a KDA
    scan with dv = 0, or dk = 0 with an explicit scale, and a router over a hidden width of 0;
    and an MLA decompression over a latent rank of 0."""
    z = lambda *s: np.zeros(s, np.float32)  # noqa: E731
    raises(ContractError, lambda: _core.kda_scan(z(3, 2, 4), z(3, 2, 4), z(3, 2, 0), z(3, 2, 4), z(3, 2)),
           "kda_scan", "dv >= 1")
    raises(ContractError, lambda: _core.kda_scan(z(3, 2, 0), z(3, 2, 0), z(3, 2, 4), z(3, 2, 0), z(3, 2),
                                                 scale=1.0), "kda_scan", "dk")
    raises(ContractError, lambda: _core.kda_scan(z(1, 3, 2, 4), z(1, 3, 2, 4), z(1, 3, 2, 0), z(1, 3, 2, 4),
                                                 z(1, 3, 2), batch=True), "kda_scan", "dv >= 1")
    for scoring in ("sigmoid", "softmax"):
        raises(ContractError, lambda: _core.moe_route(z(1, 0), _core.Weight(z(2, 0)), None, top_k=1, n_group=1,
                                                      topk_group=1, norm_topk_prob=False, scaling=1.0,
                                                      scoring=scoring), "moe_route", "'x'", "D >= 1")
    # An MLA latent rank of 0 names o_lat (it once printed the op layer's whole parameter list).
    raises(ContractError, lambda: _core.mla_decompress_v(z(2, 4, 0), _core.Weight(z(32, 0)), d_nope=4),
           "mla_decompress_v", "'o_lat'", "R >= 1")


def test_zero_stream_width_and_counter_dtype_are_named():
    """mhc_pre over streams of width D = 0 says so (it once said its buffers were missing), and
    sample's counters of another dtype name that dtype (it once gave a DLPack type code)."""
    z = lambda *s: np.zeros(s, np.float32)  # noqa: E731
    raises(ContractError, lambda: _core.mhc_pre(z(2, 4, 0), _core.Weight(z(24, 0)), z(24), z(3), sinkhorn_iters=20,
                                                hc_eps=1e-6, norm_eps=1e-5), "mhc", "D must be >= 1")
    raises(ContractError, lambda: _core.sample(f32(2, 10), np.arange(2, dtype=np.int32), temperature=1.0),
           "sample", "int64 or uint64", "int32")


def test_temperature_past_float32_is_named_up_front(model):
    """The sampler takes the temperature as float32: 1e39 would reach it as inf after the prefill
    ran; generate refuses it first, naming the value, and the model stays usable."""
    before = model.generate([1, 2], 2)
    raises(ContractError, lambda: model.generate([1], 2, temperature=1e39), "generate", "temperature", "1e+39")
    raises(ContractError, lambda: model.generate_batch([[1], [2]], 2, temperature=1e39), "temperature")
    assert model.generate([1, 2], 2) == before


# ---------------------------------------------------------------- the argument explanation


def test_conversion_errors_name_the_argument_and_the_value():
    x = f32(2, 4)
    e = raises(ContractError, lambda: _core.hc_expand(x, 2.0),
               "hc_expand: argument 'n' must be an int, got 2.0 (float)")
    assert e.code == S.CONTRACT_DTYPE
    raises(ContractError, lambda: _core.hc_expand(x, None), "argument 'n'", "None")
    raises(ContractError, lambda: _core.linear(x, None), "linear: argument 'w'", "None")
    raises(ContractError, lambda: _core.sample(f32(1, 3), np.zeros(1, np.uint64), temperature="hot"),
           "sample: argument 'temperature' must be a number, got 'hot' (str)")
    e = raises(ContractError, lambda: _core.uniform_from_counter(-1, 0), "argument 'seed' = -1", "unsigned")
    assert e.code == S.CONTRACT_RANGE
    raises(ContractError, lambda: _core.hc_expand(x, 2**70), "argument 'n'", "64-bit")
    cache = _core.Cache(_core.Engine(), [_core.LayerStateSpec.none()], max_batch=1, max_len=2)
    raises(ContractError, lambda: cache.commit(None, 1), "Cache.commit: argument 'slot'", "None")
    raises(ContractError, lambda: _core.Cache("cpu", [], max_batch=1, max_len=1),
           "Cache.__init__: argument 'engine' must be a memra.Engine, got 'cpu' (str)")
    raises(ContractError, lambda: _core.LayerStateSpec.kda(heads=1.5, head_dim=2, conv_kernel=4), "'heads'", "1.5")


def test_arity_keeps_pythons_type_error():
    x = f32(2, 4)
    with pytest.raises(TypeError) as info:
        _core.hc_expand(x)
    assert not isinstance(info.value, memra.MemraError)
    with pytest.raises(TypeError):
        _core.hc_expand(x, 2, bogus=1)
    with pytest.raises(TypeError):
        _core.hc_expand(x, 2, 3)


def test_overloads_still_dispatch_on_converted_values():
    """KdaLayer.decode has two overloads (slots as an array, or as a DecodeSlots). An argument
    nanobind converts only in its second pass (a numpy int for the layer) still reaches the array
    one, and a slots value neither overload takes is named with both types."""
    from fuzz_api_world import World

    w = World(seed=3)
    x = f32(1, w.D)
    y = w.kda.decode(w.cache, np.int64(0), np.array([1], np.int32), x)
    assert y.shape == (1, w.D)
    raises(ContractError, lambda: w.kda.decode(w.cache, 0, w.cache, x), "KdaLayer.decode: argument 'slots'",
           "an array", "memra._core.DecodeSlots", "(Cache)")


@pytest.mark.parametrize("call", ["prefill", "decode"])
def test_ragged_slots_are_named_and_change_nothing(model, call):
    # A ragged slot argument must reach the named checks, not fail in numpy first (ValueError).
    cache = model.new_cache(2, 16)
    model.prefill(cache, 0, [1, 2])
    ragged = [[0], [1, 2]]
    fn = (lambda: model.prefill(cache, ragged, [3])) if call == "prefill" else (
        lambda: model.decode(cache, ragged, [3, 4]))
    raises(ContractError, fn, call, "slot")
    assert [cache.length(s) for s in range(2)] == [2, 0]
    np.testing.assert_array_equal(model.decode(cache, [0], [3]),
                                  model.decode(_filled(model, [1, 2]), [0], [3]))


def test_generate_batch_names_the_prompt_outside_the_vocabulary(model):
    v = model.config.vocab_size
    raises(ContractError, lambda: model.generate_batch([[1], [2, v]], 2), "generate_batch", "prompts[1]", str(v))
    raises(memra.CacheFullError, lambda: model.generate_batch([[1], [1] * 16], 2), "prompts[1]")
    assert all(model.cache.length(s) == 0 and model.cache.owner(s) == 0 for s in range(2))


def _filled(model, ids):
    cache = model.new_cache(2, 16)
    model.prefill(cache, 0, ids)
    return cache


@pytest.mark.parametrize("bad", [-1, 272])
def test_token_ids_outside_the_vocabulary_name_the_call_and_argument(model, bad):
    # Checked before anything runs, whatever the prompt's length against prefill_chunk, naming
    # the method and its argument (not the embedding op deep inside).
    cache = model.new_cache(2, 16)
    model.prefill(cache, 0, [1, 2])
    for fn, call in ((lambda: model.prefill(cache, 1, [3, bad]), "prefill"),
                     (lambda: model.decode(cache, [0, 1], [3, bad]), "decode"),
                     (lambda: model.logits([bad, 3]), "logits"),
                     (lambda: model.index_lists([3, bad]), "index_lists")):
        e = raises(ContractError, fn, f"{call}: token_ids", str(bad))
        assert e.code == S.CONTRACT_RANGE
    assert [cache.length(s) for s in range(2)] == [2, 0]


@pytest.mark.parametrize("args, arg", [((0, 4), "max_batch"), ((1, -1), "max_len"), ((1.0, 4), "max_batch"),
                                       ((1, None), "max_len")])
def test_new_cache_names_itself_and_the_argument(model, args, arg):
    raises(ContractError, lambda: model.new_cache(*args), f"new_cache: {arg}")


def test_sample_counters_of_another_kind_are_named():
    """A list, an int or a string for sample's counters / seeds is CONTRACT_DTYPE naming the
    value, as for every other array argument (it once claimed a device mismatch)."""
    logits = f32(2, 10)
    for bad in ([0, 1], 3, "ab", (0, 1)):
        e = raises(ContractError, lambda: _core.sample(logits, bad, temperature=0.8), "sample",
                   "'counters'", "int64 or uint64 array")
        assert e.code == S.CONTRACT_DTYPE
    e = raises(ContractError, lambda: _core.sample(logits, np.zeros(2, np.uint64), temperature=0.8,
                                                   seeds=[1, 2]), "sample", "'seeds'", "[1, 2]")
    assert e.code == S.CONTRACT_DTYPE


def test_appends_refuse_rows_that_share_the_cache():
    """kv_append / mla_latent_append / mla_latent_append_decode write a cache in place while they
    read their rows: rows that are a view of the cache are CONTRACT_VALUE naming both, the cache
    unchanged (kv_append once copied forward row by row over rows it had not read yet)."""
    kc = np.arange(8, dtype=np.float32).reshape(8, 1, 1)
    vc = np.zeros((8, 1, 1), np.float32)
    before = kc.copy()
    e = raises(ContractError, lambda: _core.kv_append(kc[0:3], vc[0:3], kc, vc, pos0=1), "kv_append",
               "'k'", "'k_cache'")
    assert e.code == S.CONTRACT_VALUE
    np.testing.assert_array_equal(kc, before)
    raises(ContractError, lambda: _core.kv_append(f32(3, 1, 1), vc[4:7], kc, vc, pos0=1), "'v'",
           "'v_cache'")
    raises(ContractError, lambda: _core.kv_append(f32(3, 1, 1), f32(3, 1, 1), kc, kc, pos0=1),
           "'k_cache'", "'v_cache'")
    c = np.arange(8, dtype=np.float32).reshape(8, 1)
    raises(ContractError, lambda: _core.mla_latent_append(c[0:3], c, start=1), "mla_latent_append",
           "'rows'", "'cache'")
    raises(ContractError, lambda: _core.mla_latent_append_decode(c[2:4], [c, c], [3, 5]),
           "mla_latent_append_decode", "'rows'", "'caches[0]'")
    np.testing.assert_array_equal(c, np.arange(8, dtype=np.float32).reshape(8, 1))
    # Disjoint views of one buffer are fine: rows 0..2 of a scratch, the cache in its rows 4..
    buf = np.zeros((12, 1), np.float32)
    buf[:3, 0] = [5, 6, 7]
    _core.mla_latent_append(buf[0:3], buf[4:12], start=1)
    np.testing.assert_array_equal(buf[5:8, 0], [5, 6, 7])
    _core.kv_append(f32(2, 1, 1), f32(2, 1, 1), kc, vc, pos0=5)  # the caches still usable


def test_batched_latent_append_refuses_caches_that_share_memory():
    """mla_latent_append_decode writes B caches in one call: two that share memory (the same
    array twice, or overlapping views) are CONTRACT_VALUE naming both, nothing written (the CPU's
    last write once won silently; on CUDA the writes would race); disjoint views of one buffer
    are fine."""
    rows = np.arange(8, dtype=np.float32).reshape(2, 4)
    buf = np.zeros((6, 4), np.float32)
    for caches, pos in (([buf, buf], [1, 1]), ([buf[:4], buf[2:]], [2, 0])):
        e = raises(ContractError, lambda: _core.mla_latent_append_decode(rows, caches, pos),
                   "mla_latent_append_decode", "'caches[0]'", "'caches[1]'", "share memory")
        assert e.code == S.CONTRACT_VALUE
    assert not buf.any()
    _core.mla_latent_append_decode(rows, [buf[:3], buf[3:]], [1, 2])
    np.testing.assert_array_equal(buf[1], rows[0])
    np.testing.assert_array_equal(buf[5], rows[1])


def test_uninitialised_objects_are_named_contract_errors():
    """A Weight or KernelOptions made with __new__ and never initialised, passed to an op or an
    Engine, is a ContractError (CONTRACT_DTYPE) saying so, not nanobind's bare RuntimeError
    "std::bad_cast"; nanobind's own RuntimeWarning names the type."""
    w = memra.Weight.__new__(memra.Weight)
    k = memra.KernelOptions.__new__(memra.KernelOptions)
    for call in (lambda: _core.linear(f32(1, 2), w), lambda: memra.Engine("cpu", options=k)):
        with pytest.warns(RuntimeWarning, match="uninitialized instance"):
            e = raises(ContractError, call, "never initialised")
        assert e.code == S.CONTRACT_DTYPE
    assert _core.linear(f32(1, 2), memra.Weight(np.ones((3, 2), np.float32))).shape == (1, 3)


def test_per_sequence_ints_past_int64_are_range_errors():
    """t_kv entries past int64 are CONTRACT_RANGE naming the value (they once read "must hold
    ints, got int"), as entries past int32 already were."""
    q = f32(2, 4, 8)
    caches = [f32(3, 8), f32(3, 8)]
    for big in (2 ** 63, -2 ** 63 - 1, 2 ** 40, np.uint64(2 ** 64 - 1)):
        e = raises(ContractError, lambda: _core.mla_attn_decode(q, caches, [big, 3], scale=0.5),
                   "mla_attn_decode", "'t_kv'", str(big), "outside int32")
        assert e.code == S.CONTRACT_RANGE


def test_prefill_slot_out_of_range_is_one_error(model):
    """A negative slot and one past max_batch are the same CONTRACT_RANGE naming the slot and
    the cache's range (-1 once read "must be in [0, 2147483647]", CONTRACT_VALUE)."""
    c = model.new_cache(2, 16)
    for s in (-1, 2, 2 ** 40, np.int64(-3)):
        e = raises(ContractError, lambda: model.prefill(c, s, [1, 2]), "prefill", f"slot {int(s)}",
                   "outside [0, 2)")
        assert e.code == S.CONTRACT_RANGE
    e = raises(ContractError, lambda: model.prefill(c, True, [1, 2]), "prefill", "slot", "True")
    assert e.code == S.CONTRACT_VALUE
    assert c.length(0) == 0 and c.length(1) == 0
    model.prefill(c, 1, [1, 2])  # the cache still serves
    assert c.length(1) == 2


def test_a_repeated_argument_keeps_pythons_type_error():
    # explain() returns None when the arguments do not bind: an argument given both by position
    # and by keyword does not (Python: "got multiple values"), so nanobind's TypeError stands
    # rather than a ContractError about conversion.
    x = f32(2, 4)
    for call in (lambda: _core.hc_expand(x, 2, n=3), lambda: _core.hc_expand(x, 2.5, n=2)):
        with pytest.raises(TypeError) as info:
            call()
        assert not isinstance(info.value, memra.MemraError)


def test_extents_past_int32_are_range_errors():
    """An extent the op takes as an int past int32 is CONTRACT_RANGE naming the argument (a
    zero-byte [2^31, ..., 0] array reaches it); the cast once wrapped it to a negative count."""
    big = 2 ** 31
    w = _core.Weight(f32(4, 4))
    for call, op, arg in (
            (lambda: _core.rope_interleaved(np.zeros((big, 1, 0), np.float32), np.zeros(1, np.int32)),
             "rope_interleaved", "'x'"),
            (lambda: _core.mla_absorb_q(np.zeros((1, big, 0), np.float32), w, d_v=0), "mla_absorb_q", "'q_nope'"),
            (lambda: _core.mla_decompress_v(np.zeros((big, 1, 0), np.float32), w, d_nope=0), "mla_decompress_v",
             "'o_lat'")):
        e = raises(ContractError, call, op, arg, "past int32")
        assert e.code == S.CONTRACT_RANGE


def test_every_array_extent_past_int32_is_refused():
    """Any array of any op with an extent past int32 is CONTRACT_RANGE naming it, and nothing is
    written: the bindings passed such extents as int(...), so hc_head_mean over 2^32 + 1 streams
    averaged one, and kv_append / mla_latent_append into a cache 2^32 + 1 wide wrote the row into
    the wrong place (a sparse memory map of that shape reached it; zero-byte arrays here)."""
    big = 2 ** 31
    k1 = np.ones((1, 1, 1), np.float32)
    cache = np.zeros((4, 1, 1), np.float32)
    for call, op, arg in (
            (lambda: _core.hc_head_mean(np.zeros((1, big, 0), np.float32)), "hc_head_mean", "'streams'"),
            (lambda: _core.kv_append(k1, k1, np.zeros((0, big, 1), np.float32), cache), "kv_append", "'k_cache'"),
            (lambda: _core.kv_append(k1, k1, cache, np.zeros((4, big, 0), np.float32)), "kv_append", "'v_cache'"),
            (lambda: _core.mla_latent_append(np.zeros((1, 0), np.float32), np.zeros((big, 0), np.float32), start=0),
             "mla_latent_append", "'cache'"),
            (lambda: _core.linear(np.zeros((big, 0), np.float32), _core.Weight(f32(2, 0))), "linear", "'x'"),
            (lambda: _core.take_rows(np.zeros((big, 0), np.float32), 0, 1), "take_rows", "'x'")):
        e = raises(ContractError, call, op, arg, "past int32")
        assert e.code == S.CONTRACT_RANGE
    assert not cache.any()


def test_bools_are_not_ints_in_per_sequence_lists_or_row_ranges():
    """t_kv / pos lists and take_rows' start and count refuse True / False (nanobind's int caster
    read True as 1: t_kv=[True, True] ran as [1, 1]), as every other int argument does."""
    q = f32(2, 2, 6)
    caches = [f32(5, 6), f32(4, 6)]
    raises(ContractError, lambda: _core.mla_attn_decode(q, caches, [True, 1], scale=0.5),
           "mla_attn_decode", "'t_kv'", "bool")
    dst = [np.zeros((8, 6), np.float32), np.zeros((8, 6), np.float32)]
    raises(ContractError, lambda: _core.mla_latent_append_decode(q[:, 0, :].copy(), dst, [True, False]),
           "mla_latent_append_decode", "'pos'", "bool")
    assert not dst[0].any() and not dst[1].any()
    x = np.arange(8, dtype=np.float32).reshape(4, 2)
    raises(ContractError, lambda: _core.take_rows(x, True, 1), "take_rows", "'start'")
    raises(ContractError, lambda: _core.take_rows(x, 1, False), "take_rows", "'count'")
    np.testing.assert_array_equal(_core.take_rows(x, 1, 2), x[1:3])


def test_a_read_only_dlpack_export_is_not_written():
    """An argument written in place, given as a DLPack producer without numpy's flags (a
    read-only memory map behind a thin wrapper, a JAX array): DLPack 1.0 marks the export read-only
    and the op refuses it (it wrote into it, or crashed on a read-only mapping)."""

    class DL:
        def __init__(self, a):
            self.a = a

        def __dlpack__(self, **kw):
            return self.a.__dlpack__(**kw)

        def __dlpack_device__(self):
            return self.a.__dlpack_device__()

    logits = np.array([[0.0, np.nan], [1.0, 2.0]], np.float32)
    flag = np.zeros(2, np.int32)
    flag.flags.writeable = False
    raises(ContractError, lambda: _core.sample(logits, np.zeros(2, np.uint64), temperature=0.0, nonfinite=DL(flag)),
           "sample", "'nonfinite'", "read-only")
    assert not flag.any()
    cache = np.zeros((8, 4), np.float32)
    cache.flags.writeable = False
    raises(ContractError, lambda: _core.mla_latent_append(np.ones((2, 4), np.float32), DL(cache), start=0),
           "mla_latent_append", "'cache'", "read-only")
    assert not cache.any()
    ok = np.zeros(2, np.int32)  # a writable export is written
    _core.sample(logits, np.zeros(2, np.uint64), temperature=0.0, nonfinite=DL(ok))
    np.testing.assert_array_equal(ok, [1, 0])
    # The capsule itself (DLPack 1.x carries the read-only flag; a capsule of a writable array
    # is written), and a buffer exporter that refuses a writable buffer.
    rows = np.ones((2, 4), np.float32)
    raises(ContractError, lambda: _core.mla_latent_append(rows, cache.__dlpack__(max_version=(1, 0)), start=0),
           "mla_latent_append", "'cache'", "read-only DLPack capsule")
    raises(ContractError, lambda: _core.kv_append(rows.reshape(2, 1, 4), rows.reshape(2, 1, 4),
                                                  cache.reshape(8, 1, 4).__dlpack__(max_version=(1, 0)),
                                                  np.zeros((8, 1, 4), np.float32), pos0=0),
           "kv_append", "read-only DLPack capsule")
    assert not cache.any()
    raises(ContractError, lambda: _core.mla_latent_append(rows, bytes(128), start=0),
           "mla_latent_append", "'cache'", "its buffer is read-only")
    writable = cache.copy()
    _core.mla_latent_append(rows, writable.__dlpack__(max_version=(1, 0)), start=0)
    assert writable[:2].all() and not writable[2:].any()


def test_a_ctypes_array_is_an_array():
    """ctypes exports its buffer without strides; the op reads it through a memoryview (it
    crashed in nanobind's buffer import, which reads the strides)."""
    x = (ctypes.c_float * 8)(*range(8))
    np.testing.assert_allclose(_core.sigmoid(x), 1 / (1 + np.exp(-np.arange(8, dtype=np.float32))), rtol=1e-6)
    w = memra.Weight((ctypes.c_float * 4 * 2)(*[(ctypes.c_float * 4)(*range(4))] * 2))
    assert w.shape == [2, 4]
    raises(ContractError, lambda: _core.rms_norm((ctypes.c_int * 8)(), None, eps=1e-6), "rms_norm", "int32")
    cache = (ctypes.c_float * 4 * 8)()  # written in place, zero-copy
    _core.mla_latent_append(np.ones((2, 4), np.float32), cache, start=1)
    assert [list(r) for r in cache][:4] == [[0] * 4, [1] * 4, [1] * 4, [0] * 4]


def test_a_class_is_named_not_an_array():
    # np.ndarray (the class) has numpy's attributes as descriptors; the probes read them as an
    # array's and the call fell through to nanobind's overload message.
    raises(ContractError, lambda: _core.rms_norm(np.ndarray, None, eps=1e-6), "rms_norm", "'x'", "numpy.ndarray")


def test_a_weight_extent_past_int32_is_named():
    raises(ContractError, lambda: memra.Weight(np.empty((0, 2**31 + 3), np.float32), name="table"),
           "tensor 'table'", "'array'", "extent past int32")


def test_every_status_code_of_the_runtime_has_its_name_in_core_status():
    # memra._core.status is how a caller names MemraError.code; a code added to status.h but not
    # bound (50003, UNSUPPORTED_IN_CAPTURE, once) could only be compared as a bare number.
    import re
    from pathlib import Path

    from memra import _core

    header = (Path(__file__).parent.parent / "cpp" / "include" / "memra" / "status.h").read_text()
    codes = {int(v) for v in re.findall(r"constexpr int k\w+ = (\d+);", header)}
    bound = {getattr(_core.status, n) for n in dir(_core.status) if n.isupper()}
    assert codes and codes <= bound, sorted(codes - bound)


def test_kpool_append_names_pos():
    f = np.zeros((3, 5), np.float32)
    kw = dict(ape=np.zeros((4, 5), np.float32), tail_k=np.zeros((8, 5), np.float32),
              tail_gate=np.zeros((8, 5), np.float32), pool_keys=np.zeros((4, 5), np.float32))
    e = raises(ContractError, lambda: _core.kpool_append(f, f, pos=-1, **kw), "kpool_append: pos must be >= 0")
    assert "first_pos" not in str(e)
    raises(ContractError, lambda: _core.kpool_append(f, f, pos=2**31 - 1, **kw), "pos=2147483647 + T=3 overflows")
