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
    # DecodeBatch.launch: "unless chained, no step in flight (ValueError)". On the CPU no step is
    # ever chained, so a second launch before collect must be refused before it decodes: the
    # slot keeps the prompt + the one launched step, and collecting that step still works.
    batch = DecodeBatch(model)
    (lease,) = model.take_slots(1)
    try:
        row = batch.start(np.array([1, 2, 3], np.int32), RowSampling(), lease)
        handle = batch.launch([row])
        assert model.cache.length(lease.slot) == 4  # the prompt and the fed first token
        with pytest.raises(ValueError, match="in flight"):
            batch.launch([row])
        assert model.cache.length(lease.slot) == 4 and row.inflight == 1
        ((got_row, tok),) = batch.collect(handle)
        assert got_row is row and row.inflight == 0 and row.count == 2 and row.last == tok
    finally:
        lease.release()
    assert _free(model)


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
