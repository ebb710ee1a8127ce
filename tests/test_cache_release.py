"""Cache.release's refusals name whose token is wrong: the holder's token (no secret: every
CONTRACT_SLOT_HELD message names it) and the one release was given, each as what it is. The
fuzzer found "slot 0 is held by another owner (token 42)" where 42 was the caller's token and 1
the holder's. A refused release changes nothing (CPU only)."""

from __future__ import annotations

import pytest

import memra
from memra import _core


@pytest.fixture(scope="module")
def model():
    return memra.load(memra.default_checkpoint(), max_batch=2, max_len=8, progress=False)


def test_a_wrong_token_is_named_as_the_callers(model):
    cache = model.new_cache(2, 8)
    token = cache.hold(0)
    wrong = token + 41
    with pytest.raises(memra.ContractError) as ei:
        cache.release(0, wrong)
    assert str(ei.value) == (f"Cache.release: slot 0 is held by another owner (token {token}); "
                             f"release got token {wrong}")
    assert ei.value.code == _core.status.CONTRACT_SLOT_HELD
    assert cache.owner(0) == token, "a refused release must leave the slot held"
    cache.release(0, token)
    assert cache.owner(0) == 0


def test_token_zero_on_a_held_slot(model):
    cache = model.new_cache(2, 8)
    token = cache.hold(1)
    with pytest.raises(memra.ContractError) as ei:
        cache.release(1, 0)
    assert str(ei.value) == (f"Cache.release: slot 1 is held by another owner (token {token}); "
                             "release got token 0")
    assert cache.owner(1) == token


@pytest.mark.parametrize("given", [0, 7])
def test_a_slot_nobody_holds(model, given):
    cache = model.new_cache(2, 8)
    with pytest.raises(memra.ContractError) as ei:
        cache.release(0, given)
    assert str(ei.value) == f"Cache.release: slot 0 is not held (release got token {given})"
    assert ei.value.code == _core.status.CONTRACT_SLOT_HELD
    assert cache.owner(0) == 0
