"""Batched prefill (Model.prefill_batch, memra.batch_prefill, docs/prefill.md) on the CPU backend.

P prompts of different lengths go into P slots in one call: their rows packed ([sum T_i] ids,
cu_seqlens offsets), the row-wise layers run once over them, each mixer continues each slot from
that sequence's rows alone, the LM head runs on each prompt's last row. On the CPU every row-wise
op computes a row with the same arithmetic whatever the other rows of its call, and every mixer
continues a slot as a separate prefill would (docs/prefill.md "Exactness"), so batched and
sequential prefills give the same bytes: asserted bit for bit here for every family memra loads,
with and without prefill_chunk bounding the calls, then through decode steps and generate_batch.
Also: every check before anything runs (named errors), and a call failing midway leaves every
slot as it was.
"""

from __future__ import annotations

import collections.abc

from pathlib import Path

import numpy as np
import pytest

import memra
from memra import _core
from memra.batch_prefill import plan_calls

from test_prefill_chunks import FIXTURES, Boom, assert_same_planes, failing_hidden, load, planes, prompt

ROOT = Path(__file__).resolve().parents[1]
GLM = FIXTURES[0]
KIMI = ROOT / "tests" / "fixtures" / "tiny_kimi_linear"
SLOTS = [2, 0, 4, 1]  # not in order; slot 1 already holds HELD tokens
LENGTHS = [1, 6, 23, 11]
HELD = 9


@pytest.fixture(scope="module", params=FIXTURES, ids=[p.name for p in FIXTURES])
def fixture(request) -> Path:
    return request.param


def prompts(model: memra.Model, lengths=LENGTHS, seed: int = 20) -> list[np.ndarray]:
    return [prompt(model, n, seed=seed + i) for i, n in enumerate(lengths)]


def spy_hidden(model: memra.Model) -> list[tuple[int, list[int] | None]]:
    """Record (rows, offsets) of every net.hidden call of `model` from now on."""
    real, calls = model.net.hidden, []

    def hidden(cache, slots, ids, **kw):
        off = kw.get("offsets")
        calls.append((len(ids), None if off is None else [int(o) for o in off]))
        return real(cache, slots, ids, **kw)

    model.net.hidden = hidden
    return calls


# ---------------------------------------------------------------- the plan of calls


def test_plan_calls() -> None:
    assert plan_calls([1, 6, 23, 11], 0) == [[(0, 0, 1), (1, 0, 6), (2, 0, 23), (3, 0, 11)]]
    # Whole prompts while they fit; a long prompt in prefill_chunk pieces (as Model.prefill cuts
    # it), its tail shares the next call; never two pieces of one prompt in a call.
    assert plan_calls([1, 6, 23, 11], 8) == [[(0, 0, 1), (1, 0, 6)], [(2, 0, 8)], [(2, 8, 16)], [(2, 16, 23)],
                                             [(3, 0, 8)], [(3, 8, 11)]]
    assert plan_calls([3, 3, 3], 6) == [[(0, 0, 3), (1, 0, 3)], [(2, 0, 3)]]
    assert plan_calls([20, 2], 8) == [[(0, 0, 8)], [(0, 8, 16)], [(0, 16, 20), (1, 0, 2)]]
    assert plan_calls([5], 1) == [[(0, a, a + 1)] for a in range(5)]
    for lengths, c in (([7, 1, 30, 2, 2, 9], 5), ([4, 4, 4, 4], 4), ([1] * 10, 3)):
        calls = plan_calls(lengths, c)
        assert all(sum(b - a for _, a, b in call) <= c for call in calls)
        assert all(len({j for j, _, _ in call}) == len(call) for call in calls)
        for j, n in enumerate(lengths):  # each prompt's pieces in order, covering it once
            pieces = [(a, b) for call in calls for i, a, b in call if i == j]
            assert pieces == [(a, min(a + c, n)) for a in range(0, n, c)]


# ---------------------------------------------------------------- batched == sequential


@pytest.mark.parametrize("chunk", [0, 8])
def test_batched_equals_sequential(fixture: Path, chunk: int) -> None:
    m = load(fixture, chunk)
    ps = prompts(m)
    first = prompt(m, HELD, seed=3)
    seq, bat = m.new_cache(5, 64), m.new_cache(5, 64)
    for c in (seq, bat):
        m.prefill(c, 1, first)
    want = np.stack([m.prefill(seq, s, p) for s, p in zip(SLOTS, ps)])
    calls = spy_hidden(m)
    got = m.prefill_batch(bat, SLOTS, ps)
    assert got.shape == (4, m.config.vocab_size) and got.dtype == np.float32
    np.testing.assert_array_equal(got, want)
    # The row-wise layers ran once per call over the packed rows.
    assert calls == ([(41, [0, 1, 7, 30, 41])] if chunk == 0 else
                     [(7, [0, 1, 7]), (8, [0, 8]), (8, [0, 8]), (7, [0, 7]), (8, [0, 8]), (3, [0, 3])])
    for s in range(5):
        assert bat.length(s) == seq.length(s)
        assert_same_planes(planes(bat, s), planes(seq, s))
    toks = np.array([5, 7, 11, 13], np.int32)
    for _ in range(3):  # the slots continue as the sequential ones
        a, b = m.decode(seq, SLOTS, toks), m.decode(bat, SLOTS, toks)
        np.testing.assert_array_equal(b, a)
        toks = a.argmax(axis=1).astype(np.int32)


def test_batched_equals_one_shot_whatever_the_chunk() -> None:
    one = load(KIMI, 0)
    ps = prompts(one, [3, 17, 1, 9])
    want = np.stack([one.prefill(one.new_cache(1, 32), 0, p) for p in ps])
    for chunk in (1, 5, 17, 30):
        m = load(KIMI, chunk)
        np.testing.assert_array_equal(m.prefill_batch(m.new_cache(4, 32), [0, 1, 2, 3], ps), want, err_msg=str(chunk))


def test_one_prompt_and_none() -> None:
    m = load(GLM, 0)
    p = prompt(m, 12)
    a, b = m.new_cache(2, 32), m.new_cache(2, 32)
    got = m.prefill_batch(a, [1], [p])
    assert got.shape == (1, m.config.vocab_size)
    np.testing.assert_array_equal(got[0], m.prefill(b, 1, p))
    empty = m.prefill_batch(a, [], [])
    assert empty.shape == (0, m.config.vocab_size) and empty.dtype == np.float32
    assert a.length(1) == 12 and a.length(0) == 0


def test_index_lists_per_sequence() -> None:
    """A packed prefill's full DSA layers choose each sequence's index list from its own pools."""
    m = load(GLM, 0)
    ps = prompts(m, [13, 1, 22])
    want = [m.index_lists(p) for p in ps]
    record: dict[int, np.ndarray] = {}
    ids = np.concatenate(ps)
    m.net.hidden(m.new_cache(3, 32), np.array([0, 1, 2], np.int32), ids, decode=False,
                 offsets=np.array([0, 13, 14, 36]), record=record)
    assert record and sorted(record) == sorted(want[0])
    for layer, got in record.items():
        np.testing.assert_array_equal(got, np.concatenate([w[layer] for w in want]))


def test_generate_batch_uses_it_and_keeps_its_tokens(fixture: Path) -> None:
    m = load(fixture, 0, max_batch=4)
    ps = prompts(m, [5, 1, 14])
    calls = spy_hidden(m)
    for kw in (dict(), dict(temperature=0.9, top_k=20, top_p=0.9, seed=5)):
        got = m.generate_batch(ps, 4, ignore_eos=True, **kw)
        seed = kw.pop("seed", 0)
        assert got == [m.generate(p, 4, ignore_eos=True, seed=seed + i, **kw) for i, p in enumerate(ps)]
    assert (20, [0, 5, 6, 20]) in calls  # the prompts prefilled in one packed call
    assert all(m.cache.length(s) == 0 and m.cache.owner(s) == 0 for s in range(4))


# ---------------------------------------------------------------- checks before anything runs


def test_bad_arguments_are_named_and_change_nothing() -> None:
    m = load(GLM, 0, max_len=32)
    cache = m.new_cache(3, 32)
    m.prefill(cache, 0, prompt(m, 10))
    before = [planes(cache, s) for s in range(3)]
    p = prompt(m, 4)
    V = m.config.vocab_size

    def refused(exc, match, slots, ps, code=None, c=cache):
        with pytest.raises(exc, match=match) as e:
            m.prefill_batch(c, slots, ps)
        if code is not None:
            assert e.value.code == code

    refused(memra.ContractError, "cache must be", [0], [p], c=None)
    refused(memra.ContractError, "prompts must be", [0], "abc")
    refused(memra.ContractError, r"prompts\[1\]", [0, 1], [p, []], 40000)
    refused(memra.ContractError, r"prompts\[1\]", [0, 1], [p, [1.5, 2.0]])
    refused(memra.ContractError, r"prompts\[0\]", [0], [[[1, 2]]])
    refused(memra.ContractError, r"prompts\[2\]: token id", [0, 1, 2], [p, p, [1, V]], 40023)
    refused(memra.ContractError, r"prompts\[1\]: token id -1", [0, 1], [p, [-1]], 40023)
    refused(memra.ContractError, "2 slots for 3 prompts", [0, 1], [p, p, p])
    refused(memra.ContractError, "slots", 1, [p])
    refused(memra.ContractError, r"distinct.*\[1\]", [1, 2, 1], [p, p, p], 40025)
    refused(memra.ContractError, "outside", [0, 3], [p, p], 40023)
    refused(memra.ContractError, "slots", [0, 1.0], [p, p])
    refused(memra.ContractError, "slots must be", np.int32(0), [p])
    refused(memra.ContractError, "slots must be", np.array(0), [p])
    refused(memra.ContractError, "prompts must be", [0], np.array(3))
    refused(memra.ContractError, r"prompts\[0\]", [0], np.zeros((1, 0), np.int32))
    refused(memra.CacheFullError, r"prompts\[1\]: slot 0 holds 10", [2, 0], [p, prompt(m, 23)], 30002)
    token = cache.hold(2)
    refused(memra.ContractError, "held", [1, 2], [p, p], _core.status.CONTRACT_SLOT_HELD)
    cache.release(2, token)
    for s in range(3):
        assert cache.length(s) == (10 if s == 0 else 0)
        assert_same_planes(planes(cache, s), before[s])
    # Usable: the same call now runs and equals the sequential prefills.
    ref = m.new_cache(3, 32)
    m.prefill(ref, 0, prompt(m, 10))
    want = np.stack([m.prefill(ref, s, q) for s, q in zip([2, 0], [p, prompt(m, 7)])])
    np.testing.assert_array_equal(m.prefill_batch(cache, [2, 0], [p, prompt(m, 7)]), want)


def test_slots_of_a_generation_in_flight_are_refused() -> None:
    m = load(GLM, 0, max_batch=2)
    lease = m.take_slots(1)[0]
    with pytest.raises(memra.ContractError) as e:
        m.prefill_batch(m.cache, [1 - lease.slot, lease.slot], [[1], [2]])
    assert e.value.code == _core.status.CONTRACT_SLOT_HELD
    assert m.cache.length(1 - lease.slot) == 0
    lease.release()


def test_concat_rows() -> None:
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    b = np.arange(3, dtype=np.float32).reshape(1, 3) + 10
    np.testing.assert_array_equal(_core.concat_rows([a, b, a[:0]]), np.concatenate([a, b]))
    for bad, match in (([], "non-empty"), (a, "list"), ([a, np.zeros((1, 4), np.float32)], r"parts\[1\]"),
                       ([a, a.astype(np.float64)], r"parts\[1\]"), ([a, "x"], r"parts\[1\]")):
        with pytest.raises(memra.ContractError, match=match):
            _core.concat_rows(bad)


def test_concat_rows_keeps_parts_a_sequence_makes_alive() -> None:
    # A sequence that builds a fresh array per item: each died with the loop's reference before
    # the copies ran, which then read freed (and reused) memory: garbage rows.
    class Parts(collections.abc.Sequence):
        def __len__(self):
            return 4

        def __getitem__(self, i):
            if i >= 4:
                raise IndexError(i)
            return np.full((64, 64), float(i + 1), np.float32)

    want = np.concatenate([np.full((64, 64), float(i + 1), np.float32) for i in range(4)])
    np.testing.assert_array_equal(_core.concat_rows(Parts()), want)


def test_bad_offsets_are_refused() -> None:
    m = load(GLM, 0)
    cache = m.new_cache(2, 16)
    ids = prompt(m, 5)
    for off in ([0, 5], [0, 0, 5], [0, 2, 4], [1, 2, 5]):
        with pytest.raises(memra.ContractError, match="offsets"):
            m.net.hidden(cache, np.array([0, 1], np.int32), ids, decode=False, offsets=np.array(off))


# ---------------------------------------------------------------- a failure midway undoes every slot


@pytest.mark.parametrize("path", [GLM, KIMI], ids=["glm5_next", "kimi_linear"])
@pytest.mark.parametrize("fail_at", [1, 3, 6])
@pytest.mark.parametrize("exc", [Boom, KeyboardInterrupt])
def test_failed_call_leaves_every_slot_as_it_was(path: Path, fail_at: int, exc) -> None:
    # prefill_chunk 8: calls [p0, p1], [p2 0:8], [p2 8:16], [p2 16:23], [p3 0:8], [p3 8:11];
    # a failure at call 3 comes after p0, p1 and p2's first piece were committed, at 6 after all
    # but p3's last piece.
    m, ref = load(path, 8), load(path, 8)
    cache, ref_cache = m.new_cache(5, 64), ref.new_cache(5, 64)
    first = prompt(m, HELD, seed=3)
    m.prefill(cache, 1, first)
    ref.prefill(ref_cache, 1, first)
    before = [planes(cache, s) for s in range(5)]
    undo = failing_hidden(m, fail_at, exc)
    with pytest.raises(exc):
        m.prefill_batch(cache, SLOTS, prompts(m))
    undo()
    for s in range(5):
        assert cache.length(s) == (HELD if s == 1 else 0)
        assert_same_planes(planes(cache, s), before[s])
    # Usable, and every slot continues exactly as one never touched.
    want = np.stack([ref.prefill(ref_cache, s, p) for s, p in zip(SLOTS, prompts(m))])
    np.testing.assert_array_equal(m.prefill_batch(cache, SLOTS, prompts(m)), want)
    for s in range(5):
        assert_same_planes(planes(cache, s), planes(ref_cache, s))


def test_failed_prefill_in_generate_batch_gives_the_slots_back() -> None:
    m = load(GLM, 4, max_batch=3)
    ps = prompts(m, [3, 9, 2])
    undo = failing_hidden(m, 2)  # calls [p0], [p1 0:4], [p1 4:8], [p1 8:9, p2]: p0 committed
    with pytest.raises(Boom):
        m.generate_batch(ps, 3)
    undo()
    assert all(m.cache.length(s) == 0 and m.cache.owner(s) == 0 for s in range(3))
    assert m.generate_batch(ps, 3, ignore_eos=True) == load(GLM, 0, max_batch=3).generate_batch(
        ps, 3, ignore_eos=True)


def test_failed_call_restores_a_slot_that_held_one_token() -> None:
    # A slot that held tokens before the call is restored from its snapshot; one that held
    # exactly one token held tokens too (length > 0): freeing it instead would lose that token.
    # Call 6 fails after p3's first piece went into slot 1 (see the test above).
    m = load(GLM, 8)
    cache = m.new_cache(5, 64)
    m.prefill(cache, 1, prompt(m, 1, seed=3))
    before = [planes(cache, s) for s in range(5)]
    undo = failing_hidden(m, 6, Boom)
    with pytest.raises(Boom):
        m.prefill_batch(cache, SLOTS, prompts(m))
    undo()
    for s in range(5):
        assert cache.length(s) == (1 if s == 1 else 0)
        assert_same_planes(planes(cache, s), before[s])
