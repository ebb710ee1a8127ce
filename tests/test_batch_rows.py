"""memra.batch's contracts that the generation tests do not reach (found by mutation testing,
docs/testing_mutations.md, Python layer): a SlotLease says whether it still holds its slot, a
DecodeBatch refuses a launch for a row whose step is still in flight (CPU: nothing is chained)
before anything runs, and stop_token_ids add to the checkpoint's EOS ids rather than replace them.

Expected values come from the documented rules: the stop rule is checked as a truncation of an
ignore_eos run of the same prompt (a token ends the sequence, included, when it is an EOS id or
one of stop_token_ids), not from numbers recorded off memra.
"""

from __future__ import annotations

import logging

import numpy as np
import pytest

import memra
from memra.batch import DecodeBatch, RowSampling
from memra.errors import ContractError


@pytest.fixture(scope="module")
def model() -> memra.Model:
    logging.getLogger("memra").setLevel(logging.ERROR)
    return memra.load(memra.default_checkpoint(), max_batch=2, max_len=64, progress=False)


def _free(m: memra.Model) -> bool:
    c = m.cache
    return all(c.length(s) == 0 and c.owner(s) == 0 for s in range(c.max_batch))


def test_a_lease_is_held_until_released_and_release_is_idempotent(model) -> None:
    # SlotLease.held is the public way to ask whether a lease still owns its slot (the server and
    # user code that drives DecodeBatch rely on it); it must follow the cache's owner.
    (lease,) = model.take_slots(1)
    try:
        assert lease.held and model.cache.owner(lease.slot) == lease.token != 0
    finally:
        lease.release()
    assert not lease.held and model.cache.owner(lease.slot) == 0
    lease.release()  # a second release does nothing
    assert not lease.held and _free(model)


def test_launch_refuses_a_row_with_a_step_in_flight_and_runs_nothing(model) -> None:
    # DecodeBatch.launch: "unless chained, no step in flight (ContractError)". On the CPU no step is
    # ever chained, so a second launch before collect must be refused before it decodes: the
    # slot keeps the prompt + the one launched step, and collecting that step still works.
    batch = DecodeBatch(model)
    (lease,) = model.take_slots(1)
    try:
        row = batch.start(np.array([1, 2, 3], np.int32), RowSampling(), lease)
        handle = batch.launch([row])
        assert model.cache.length(lease.slot) == 4  # the prompt and the fed first token
        with pytest.raises(ContractError, match="in flight"):
            batch.launch([row])
        assert model.cache.length(lease.slot) == 4 and row.inflight == 1
        ((got_row, tok),) = batch.collect(handle)
        assert got_row is row and row.inflight == 0 and row.count == 2 and row.last == tok
    finally:
        lease.release()
    assert _free(model)


def test_a_released_row_a_second_collect_and_no_rows_are_refused(model) -> None:
    # A released lease's row once decoded into the freed slot unowned (an ownerless token that
    # generation then never took back, or one appended to the user's own sequence there); a
    # second collect of one step advanced the row's RNG counter again and left it at -1 in flight.
    batch = DecodeBatch(model)
    (lease,) = model.take_slots(1)
    row = batch.start(np.array([1, 2, 3], np.int32), RowSampling(), lease)
    handle = batch.launch([row])
    batch.collect(handle)
    with pytest.raises(ContractError, match="collected already"):
        batch.collect(handle)
    assert row.count == 2 and row.inflight == 0
    with pytest.raises(ContractError, match="at least one row"):
        batch.launch([])
    lease.release()
    model.cache.free(lease.slot)
    model.prefill(model.cache, lease.slot, [5, 6, 7, 8])  # the user's sequence in the freed slot
    with pytest.raises(ContractError, match="was released"):
        batch.launch([row])
    assert model.cache.length(lease.slot) == 4 and model.cache.owner(lease.slot) == 0
    model.cache.free(lease.slot)
    assert _free(model)


def test_a_lease_of_another_model_is_refused_before_anything_runs(model) -> None:
    # DecodeBatch(B) took A's lease: it prefilled and decoded into B's slot of the same index,
    # which held the user's own tokens and no hold (the owner check let any token through a
    # free slot), and A's held slot stayed untouched.
    other = memra.load(memra.default_checkpoint(), max_batch=2, max_len=64, progress=False)
    model.prefill(model.cache, 0, [9, 9, 9])
    (lease,) = other.take_slots(1)
    (own,) = model.take_slots(1)
    try:
        assert lease.slot == 0
        batch = DecodeBatch(model)
        with pytest.raises(ContractError, match="another model"):
            batch.start(np.array([1, 2, 3], np.int32), RowSampling(), lease)
        with pytest.raises(ContractError, match="another model"):
            batch.start_many([np.array([1, 2], np.int32)] * 2, [RowSampling()] * 2,
                             [lease, own])
        row = DecodeBatch(other).start(np.array([1, 2, 3], np.int32), RowSampling(), lease)
        with pytest.raises(ContractError, match="another model"):
            batch.launch([row])
        assert model.cache.length(0) == 3 and other.cache.length(0) == 3
        # The cache itself refuses a token that holds no slot there (released, or another cache's).
        for call in (lambda: model.cache.commit(0, 1, owner=lease.token),
                     lambda: model.cache.free(0, owner=lease.token),
                     lambda: model.cache.copy_slot(1, 0, owner=lease.token),
                     lambda: model._prefill(model.cache, 0, [4], owner=lease.token)):
            with pytest.raises(ContractError, match="not held by"):
                call()
        assert model.cache.length(0) == 3
    finally:
        lease.release()
        own.release()
        model.cache.free(0)
    assert _free(model) and other.cache.length(0) == 0


@pytest.mark.parametrize("sampling,words", [
    (RowSampling(temperature=-1.0), "temperature"),
    (RowSampling(temperature=0.5, top_k=-5), "top_k"),
    (RowSampling(temperature=0.5, top_p=0.0), "top_p"),
    (RowSampling(seed=-1), "seed"),
])
def test_start_checks_the_rows_sampling_before_the_prefill(model, sampling, words) -> None:
    # A negative temperature ran as greedy; a bad top_k was refused by the sampler only after
    # the prompt was committed, leaving the slot holding it.
    batch = DecodeBatch(model)
    (lease,) = model.take_slots(1)
    try:
        with pytest.raises(ContractError, match=words):
            batch.start(np.array([1, 2, 3], np.int32), sampling, lease)
        assert model.cache.length(lease.slot) == 0
    finally:
        lease.release()
    assert _free(model)


@pytest.mark.parametrize("prompt", [np.array([1, 2], "m8[D]"), bytearray(b"\x01\x02"), np.array([1, 2], "M8[D]")])
def test_a_prompt_of_timedeltas_or_bytes_is_no_token_ids(model, prompt) -> None:
    # numpy counts timedelta64 among its integers, and a bytearray becomes its bytes
    with pytest.raises(ContractError, match="prompt_ids"):
        model.generate(prompt, max_new_tokens=1)


def test_stop_token_ids_add_to_the_eos_ids(model) -> None:
    # generate: stops "after an EOS id of the checkpoint ... or after any of stop_token_ids".
    # The run without EOS gives the sequence; making one of its tokens the EOS id and passing an
    # unrelated stop id must still stop at that EOS (a stop list that replaced the EOS ids would
    # run on to max_new_tokens).
    prompt, n = [1, 2, 3], 12
    run = model.generate(prompt, n, ignore_eos=True)
    eos = run[4]
    cut = run[:run.index(eos) + 1]
    unrelated = next(t for t in range(model.config.vocab_size) if t not in run)
    saved = model.eos_token_ids
    model.eos_token_ids = [eos]
    try:
        assert model.generate(prompt, n) == cut
        assert model.generate(prompt, n, stop_token_ids=[unrelated]) == cut
        assert model.generate(prompt, n, stop_token_ids=unrelated) == cut
        assert model.generate_batch([prompt], n, stop_token_ids=[unrelated]) == [cut]
        # ignore_eos drops only the EOS ids: a stop id still ends the sequence
        assert model.generate(prompt, n, ignore_eos=True, stop_token_ids=[eos]) == cut
        assert model.generate(prompt, n, ignore_eos=True, stop_token_ids=[unrelated]) == run
    finally:
        model.eos_token_ids = saved
    assert _free(model)
