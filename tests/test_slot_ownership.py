"""Slot ownership (memra.batch): slots a generation holds cannot be changed from outside, the
library never takes a slot holding the user's tokens, a closed stream gives its slot back at
once, and non-finite logits end a generation with memra.NonFiniteError instead of a token.
Expected tokens come from generate() runs with nothing else in the cache."""

from __future__ import annotations

import gc

import numpy as np
import pytest

import memra
from memra import _core

HELD = _core.status.CONTRACT_SLOT_HELD


def _load(max_batch: int = 2, path=None) -> memra.Model:
    return memra.load(path or memra.default_checkpoint(), max_batch=max_batch, max_len=64, progress=False)


def test_status_codes_are_exported() -> None:
    assert HELD == memra.errors.SLOT_HELD == 40026
    assert _core.status.NON_FINITE == memra.errors.NON_FINITE == 60001
    assert issubclass(memra.NonFiniteError, memra.MemraError)


def test_cache_hold_release_and_owner_checks() -> None:
    m = _load()
    c = m.new_cache(3, 16)
    m.prefill(c, 0, [1, 2, 3])
    token = c.hold(0)
    assert token and c.owner(0) == token and c.owner(1) == 0
    for call in (lambda: c.free(0), lambda: c.copy_slot(1, 0), lambda: c.commit(0, 1), lambda: c.commit_host(0, 1),
                 lambda: c.hold(0), lambda: c.release(0, token + 1), lambda: c.release(1, token),
                 lambda: m.prefill(c, 0, [4]), lambda: m.decode(c, [1, 0], [4, 5])):
        with pytest.raises(memra.ContractError) as info:
            call()
        assert info.value.code == HELD
    assert c.length(0) == 3 and c.length(1) == 0  # nothing changed on a refusal
    c.copy_slot(0, 2)  # reading a held slot is allowed
    assert c.length(2) == 3
    c.commit(0, 1, owner=token)  # its owner may
    c.free(0, owner=token)
    c.release(0, token)
    assert c.owner(0) == 0
    c.free(0)
    assert c.hold(0) != token  # tokens are not reused


def test_a_token_of_another_cache_never_holds_a_slot() -> None:
    # Tokens were counted per cache from 1: the first hold of two caches gave both token 1, and
    # one cache took the other's token for its own (a review of session 30's owner checks).
    m = _load()
    a, b = m.new_cache(2, 16), m.new_cache(2, 16)
    m.prefill(a, 0, [1, 2, 3])
    ta, tb = a.hold(0), b.hold(0)
    assert ta != tb
    with pytest.raises(memra.ContractError) as info:
        a.free(0, owner=tb)
    assert info.value.code == HELD and a.length(0) == 3
    a.release(0, ta)
    b.release(0, tb)


def test_a_held_slot_survives_outside_calls_and_the_stream_keeps_its_tokens() -> None:
    m = _load()
    want = m.generate([1, 2, 3, 4], 8, temperature=0.7, seed=3, ignore_eos=True)
    with m.stream([1, 2, 3, 4], 8, temperature=0.7, seed=3, ignore_eos=True) as s:
        got = [next(s), next(s)]
        slot = next(i for i in range(2) if m.cache.owner(i))
        length = m.cache.length(slot)
        other = 1 - slot
        m.prefill(m.cache, other, [9, 9])
        for call in (lambda: m.cache.free(slot), lambda: m.cache.copy_slot(other, slot),
                     lambda: m.cache.commit(slot, 1), lambda: m.prefill(m.cache, slot, [5]),
                     lambda: m.decode(m.cache, [slot], [5])):
            with pytest.raises(memra.ContractError) as info:
                call()
            assert info.value.code == HELD
        assert m.cache.length(slot) == length
        got += list(s)
    assert got == want
    assert m.cache.owner(slot) == 0 and m.cache.length(slot) == 0


def test_generation_never_takes_or_clears_a_slot_holding_user_tokens() -> None:
    m = _load(max_batch=2)
    ref = _load(max_batch=1)
    user = [7, 8, 9, 10]
    m.prefill(m.cache, 0, user)  # slot 0 is the user's now
    state = m.cache.kda_state(0, 0).copy()
    want = ref.generate([1, 2], 6, ignore_eos=True)
    assert m.generate([1, 2], 6, ignore_eos=True) == want  # runs in slot 1
    assert m.cache.length(0) == len(user) and np.array_equal(m.cache.kda_state(0, 0), state)
    # The user's slot continues as if nothing had run: its next logits equal a fresh prefill's.
    cont = m.prefill(m.cache, 0, [11])
    np.testing.assert_array_equal(cont, ref.logits(user + [11])[-1])
    m.prefill(m.cache, 1, [1])  # now both slots hold user tokens: nothing is free
    with pytest.raises(memra.ContractError) as info:
        m.generate([1, 2], 2)
    assert "[0, 1]" in str(info.value)
    m.cache.free(1)
    assert m.generate([1, 2], 6, ignore_eos=True) == want
    # An empty slot the user holds is never taken either.
    token = m.cache.hold(1)
    with pytest.raises(memra.ContractError) as info:
        m.generate([1, 2], 2)
    # free() refuses a held slot (40026): the hint names release for those, free for the user's.
    assert "cache.free(slot) empties one of yours" in str(info.value) and "cache.release" in str(info.value)
    with pytest.raises(memra.ContractError) as held:
        m.cache.free(1)
    assert held.value.code == memra._core.status.CONTRACT_SLOT_HELD
    m.cache.release(1, token)


def test_closing_a_stream_frees_its_slot_at_once() -> None:
    m = _load(max_batch=1)
    s = m.stream([1, 2, 3], 20, ignore_eos=True)
    next(s)
    assert m.cache.owner(0) != 0
    s.close()
    assert m.cache.owner(0) == 0 and m.cache.length(0) == 0
    with pytest.raises(StopIteration):
        next(s)
    with m.stream([1, 2, 3], 20, ignore_eos=True) as s2:
        next(s2)
        held = s2  # a reference survives the block: the slot must not wait for the collector
    assert m.cache.owner(0) == 0
    gc.disable()
    try:
        s3 = m.stream([1, 2, 3], 20, ignore_eos=True)
        next(s3)
        cycle = [s3]
        cycle.append(cycle)  # only the cycle collector could drop it
        del s3, cycle
        with pytest.raises(memra.ContractError):  # not closed: still held
            m.generate([4], 2)
    finally:
        gc.enable()
        gc.collect()
    assert m.cache.owner(0) == 0
    assert held is not None


def test_non_finite_logits_raise_instead_of_a_token(tmp_path) -> None:
    from nan_checkpoint import nan_embedding_row, nan_final_norm

    ref = _load(max_batch=1)
    prompt = [5, 6, 7]
    first = ref.generate(prompt, 1, ignore_eos=True)[0]
    m = _load(path=nan_embedding_row(tmp_path, first))
    got = []
    with pytest.raises(memra.NonFiniteError) as info:
        for t in m.stream(prompt, 5, ignore_eos=True):
            got.append(t)
    assert got == [first] and info.value.code == 60001
    assert m.cache.owner(0) == 0 and m.cache.owner(1) == 0  # the slot went back
    with pytest.raises(memra.NonFiniteError) as info:
        m.generate_batch([[1, 2], prompt], 5, ignore_eos=True)
    msg = str(info.value)
    assert msg.startswith("generate_batch: sequence 1: ") and msg.count("generate_batch") == 1, msg
    other = ref.generate([1, 2], 3, ignore_eos=True)
    if first not in other[:2]:  # a sequence that never feeds the NaN row is untouched
        assert m.generate([1, 2], 3, ignore_eos=True) == other
    dead = _load(path=nan_final_norm(tmp_path))
    with pytest.raises(memra.NonFiniteError):  # the prompt's own logits: no first token
        dead.generate([1, 2], 3)
    assert dead.cache.owner(0) == 0


def test_non_finite_flags_through_the_cuda_branch(tmp_path) -> None:
    # The CUDA branch of memra.batch (CpuRunner: sampling steps return the sampler's per-row
    # nonfinite flags, as the captured step's bucket does on a GPU; rows of several sampling keys
    # draw after the step, one sampling call with its own flags per key): a flagged row ends with
    # NonFiniteError, the other rows keep their tokens, and the model stays usable.
    from cpu_runner import CpuRunner
    from nan_checkpoint import nan_embedding_row

    from memra.batch import DecodeBatch, RowSampling

    ref = _load(max_batch=1)
    prompt = [5, 6, 7]
    first = ref.generate(prompt, 1, ignore_eos=True)[0]
    m = _load(max_batch=3, path=nan_embedding_row(tmp_path, first))
    m._runner = CpuRunner(m)
    got = []
    with pytest.raises(memra.NonFiniteError) as info:
        for t in m.stream(prompt, 5, ignore_eos=True):
            got.append(t)
    assert got == [first] and info.value.code == 60001
    others = [[1, 2], [30, 31]]
    want = [ref.generate(p, 4, ignore_eos=True) for p in others]
    if not any(first in p + w[:3] for p, w in zip(others, want)):  # rows never fed `first`
        with pytest.raises(memra.NonFiniteError) as info:
            m.generate_batch([others[0], prompt, others[1]], 4, ignore_eos=True)
        assert "sequence 1" in str(info.value)
        assert m.generate_batch(others, 4, ignore_eos=True) == want
    assert all(m.cache.owner(s) == 0 for s in range(3))
    # Two sampling keys in one step: the greedy row feeding `first` is flagged, the sampled one
    # draws its token.
    other, kw = [1, 2], dict(temperature=0.8, top_k=20, top_p=0.9, seed=5)
    want = ref.generate(other, 2, ignore_eos=True, **kw)
    if first not in other + want[:1]:
        batch = DecodeBatch(m)
        leases = m.take_slots(2)
        try:
            a = batch.start(np.array(prompt, np.int32), RowSampling(0.0, None, None, 0), leases[0])
            b = batch.start(np.array(other, np.int32), RowSampling(0.8, 20, 0.9, 5), leases[1])
            handle = batch.launch([a, b])
            assert handle.flags is not None and len(handle.flags) == 2  # one flag read per key
            res = {id(r): x for r, x in batch.collect(handle)}
            assert isinstance(res[id(a)], memra.NonFiniteError) and res[id(b)] == want[1]
            # The failed row's step was committed without a token: another would feed its last
            # token twice. Refused, nothing run; the other row goes on.
            n = m.cache.length(a.slot)
            with pytest.raises(memra.ContractError, match="ended with NonFiniteError"):
                batch.launch([b, a])
            assert a.failed is res[id(a)] and m.cache.length(a.slot) == n and b.inflight == 0
            batch.collect(batch.launch([b]))
        finally:
            for lease in leases:
                lease.release()
        assert m.generate(other, 2, ignore_eos=True, **kw) == want  # still usable
