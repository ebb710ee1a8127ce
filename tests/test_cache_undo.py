"""A cache update that fails or is interrupted leaves every slot as it was (or, for a decode step,
wholly committed), on the CPU with the embedded glm5_next checkpoint (its layer 2 is a full DSA
layer: kpool 4, a tail ring of 8 rows). Each case was found by a review helper in session 26 and
fails on the tree before it:

- a prefill into a slot holding tokens that fails after a DSA layer ran, before any commit: the
  DSA layer had written its tail ring over the slot's incomplete pool, and nothing undid it (the
  next tokens' logits then differed);
- a failure in the LM head after the commit (prefill) or in the sampler (a DecodeBatch step):
  the slot was left advanced;
- an interrupt between the commit and the undo flag, or between the rows' commits of a step;
- take_free_slots failing at its k-th hold kept the holds before it.

Expected outputs are the same model's own results on an untouched copy of the cache.
"""

from __future__ import annotations

import inspect
import signal
import sys
import threading
from collections import OrderedDict

import numpy as np
import pytest

import memra
from memra import batch as batch_mod
from memra import batch_prefill
from memra import model as model_mod
from memra._core import KernelOptions

DSA_LAYER_AFTER = 3  # a layer after the first full DSA layer (2): failing there, 2 has written


def load(chunk: int | None = None) -> memra.Model:
    opts = None if chunk is None else KernelOptions(prefill_chunk=chunk)
    return memra.load(memra.default_checkpoint(), progress=False, max_batch=4, max_len=64, kernel_options=opts)


def ids(seed: int, n: int, vocab: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, vocab, n).astype(np.int32)


class Boom(Exception):
    pass


@pytest.fixture(autouse=True)
def python_sigint():
    """Python's own SIGINT handler for the test: a process started in the background by a
    non-interactive shell inherits SIGINT ignored, and then no Ctrl-C reaches memra at all."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, before)


def failing_mixer(m: memra.Model):
    """Make the mixer of layer DSA_LAYER_AFTER raise Boom on prefill; returns the undo."""
    mixer = m.net.blocks[DSA_LAYER_AFTER].mixer
    real = mixer.prefill

    def boom(*a, **k):
        raise Boom("injected")

    mixer.prefill = boom
    return lambda: setattr(mixer, "prefill", real)


@pytest.mark.parametrize("form", ["one chunk", "chunks", "batch"])
def test_a_failed_prefill_into_a_slot_with_tokens_leaves_its_dsa_ring(form):
    m, ref = load(7 if form == "chunks" else None), load()
    V = m.config.vocab_size
    first, second, more = ids(1, 30, V), ids(2, 10 if form == "chunks" else 8, V), ids(3, 12, V)
    c, rc = m.new_cache(2, 64), ref.new_cache(2, 64)
    m.prefill(c, 0, first)
    ref.prefill(rc, 0, first)  # 30 rows: pool 7 incomplete, rows 28, 29 in the ring
    undo = failing_mixer(m)
    try:
        with pytest.raises(Boom):
            if form == "batch":
                m.prefill_batch(c, [0, 1], [second, second[:3]])
            else:
                m.prefill(c, 0, second)
    finally:
        undo()
    assert [c.length(0), c.length(1)] == [30, 0]
    np.testing.assert_array_equal(m.prefill(c, 0, more), ref.prefill(rc, 0, more))
    np.testing.assert_array_equal(c.pool_keys(2, 0), rc.pool_keys(2, 0))


def test_a_failure_in_the_head_after_the_commit_undoes_the_prefill():
    m = load()
    c = m.new_cache(2, 64)
    m.prefill(c, 0, [1, 2, 3])
    real = m.net.logits_of
    m.net.logits_of = lambda h: (_ for _ in ()).throw(Boom("head"))
    try:
        with pytest.raises(Boom):
            m.prefill(c, 0, [4, 5, 6, 7])  # a slot holding tokens: restored
        with pytest.raises(Boom):
            m.prefill(c, 1, [4, 5])  # an empty slot: freed
        with pytest.raises(Boom):
            m.decode(c, [0], [9])  # the step: not committed
    finally:
        m.net.logits_of = real
    assert [c.length(0), c.length(1)] == [3, 0]
    ref = load()
    rc = ref.new_cache(2, 64)
    ref.prefill(rc, 0, [1, 2, 3])
    np.testing.assert_array_equal(m.decode(c, [0], [9]), ref.decode(rc, [0], [9]))


def test_a_sampler_failure_in_a_step_commits_nothing():
    m = load()
    batch = batch_mod.DecodeBatch(m)
    leases = m.take_slots(2)
    try:
        rows = batch.start_many([np.array([1, 2, 3], np.int32), np.array([4, 5], np.int32)],
                                [batch_mod.RowSampling()] * 2, leases)
        lengths = [m.cache.length(lease.slot) for lease in leases]
        real = m._pick
        m._pick = lambda *a, **k: (_ for _ in ()).throw(Boom("sampler"))
        try:
            with pytest.raises(Boom):
                batch.launch(rows)
        finally:
            m._pick = real
        assert [m.cache.length(lease.slot) for lease in leases] == lengths
        assert all(r.inflight == 0 for r in rows)
        (r0, t0), (r1, t1) = batch.collect(batch.launch(rows))  # the same step again, once
        assert [m.cache.length(lease.slot) for lease in leases] == [n + 1 for n in lengths]
    finally:
        for lease in leases:
            lease.release()


def at_line(func, text: str, action, nth: int = 1):
    """Run `action` (from a trace function) the nth time `func` reaches its line holding `text`."""
    func = inspect.unwrap(func)  # a function memra._interrupts.uninterrupted wraps: its own lines
    src, start = inspect.getsourcelines(func)
    line = start + next(i for i, s in enumerate(src) if text in s)
    hits = [0]

    def local(frame, event, arg):
        if event == "line" and frame.f_lineno == line:
            hits[0] += 1
            if hits[0] == nth:
                action()
        return local

    def tracer(frame, event, arg):
        return local if frame.f_code is func.__code__ else None

    sys.settrace(tracer)


def interrupt():
    raise KeyboardInterrupt("injected")


@pytest.mark.parametrize("where", ["chunks", "batch"])
def test_an_interrupt_at_the_undo_flag_still_undoes(where):
    # The flag once followed the commit: an interrupt between the two kept the committed chunk.
    m = load(4)
    c = m.new_cache(2, 64)
    func, text = ((model_mod.Model._prefill, "committed = True") if where == "chunks"
                  else (batch_prefill._commit_pieces, "committed.add(j)"))
    at_line(func, text, interrupt)
    try:
        with pytest.raises(KeyboardInterrupt):
            if where == "chunks":
                m.prefill(c, 0, list(range(1, 11)))
            else:
                m.prefill_batch(c, [0, 1], [list(range(1, 11)), [5, 6]])
    finally:
        sys.settrace(None)
    assert [c.length(0), c.length(1)] == [0, 0]


@pytest.mark.skipif(threading.current_thread() is not threading.main_thread(), reason="signals go to the main thread")
def test_ctrl_c_between_the_rows_commits_of_a_step_waits_for_the_last():
    # A real SIGINT during the second row's commit: the step is committed for every row, then
    # KeyboardInterrupt (it once left rows 1 and 2 behind row 0).
    m = load()
    c = m.new_cache(3, 64)
    for s in range(3):
        m.prefill(c, s, [1, 2, 3])
    at_line(batch_mod.commit_rows, "cache.commit(int(s), 1", lambda: signal.raise_signal(signal.SIGINT), nth=2)
    try:
        with pytest.raises(KeyboardInterrupt):
            m.decode(c, [0, 1, 2], [5, 6, 7])
    finally:
        sys.settrace(None)
    assert [c.length(s) for s in range(3)] == [4, 4, 4]
    with pytest.raises(KeyboardInterrupt):  # outside memra's updates a Ctrl-C raises at once
        signal.raise_signal(signal.SIGINT)


def test_take_slots_failing_midway_takes_nothing():
    m = load()
    other = []
    # Another thread holds slot 2 between the scan for free slots and the third hold.
    at_line(batch_mod._hold_free, "token = cache.hold(s)",
            lambda: other.append(m.cache.hold(2)), nth=3)
    try:
        with pytest.raises(memra.ContractError):
            m.take_slots(3)
    finally:
        sys.settrace(None)
    assert [m.cache.owner(s) for s in range(4)] == [0, 0, other[0], 0]
    m.cache.release(2, other[0])
    assert len(m.generate_batch([[1], [2], [3]], 2)) == 3


@pytest.mark.skipif(threading.current_thread() is not threading.main_thread(), reason="signals go to the main thread")
def test_ctrl_c_during_a_runner_steps_host_commits_waits_for_the_last():
    # DecodeRunner.step (a CUDA engine's step) commits every row on the device, then on the host
    # row by row: a Ctrl-C there once left rows 1 and 2 behind the device. Driven on the CPU with
    # the step's device half stubbed out (the host commits are what is under test).
    from types import SimpleNamespace

    from memra.decode_graph import DecodeRunner

    m = load()
    c = m.cache
    for s in range(3):
        m.prefill(c, s, [1, 2, 3])
    r = DecodeRunner(SimpleNamespace(engine=SimpleNamespace(copy_into=lambda d, s: None)), c, graphs=False)
    bucket = SimpleNamespace(slots=SimpleNamespace(set=lambda s: None, size=4), ids=None, chain=None,
                             graphs=OrderedDict(), eager=OrderedDict(),
                             replayed={}, steps=0)
    r._bucket = lambda n: bucket
    r._body = lambda b, sampling: None
    at_line(DecodeRunner._run_and_commit, "self.cache.commit_host(", lambda: signal.raise_signal(signal.SIGINT),
            nth=2)
    try:
        with pytest.raises(KeyboardInterrupt):
            r.step(np.array([0, 1, 2], np.int32), np.array([5, 6, 7], np.int32))
    finally:
        sys.settrace(None)
    assert [c.length(s) for s in range(3)] == [4, 4, 4]


@pytest.mark.skipif(threading.current_thread() is not threading.main_thread(), reason="signals go to the main thread")
@pytest.mark.parametrize("where", ["prefill", "batch"])
def test_a_second_ctrl_c_during_the_undo_waits_for_it(where):
    # The first interrupt lands in the LM head after every chunk was committed; a second one in
    # the undo once stopped it halfway (slot 0 kept the failed prompt's 10 tokens).
    m = load(4)
    c = m.new_cache(2, 64)
    m.prefill(c, 0, [1, 2, 3])
    real = m.net.logits_of
    m.net.logits_of = lambda h: (_ for _ in ()).throw(KeyboardInterrupt("first"))
    at_line(batch_prefill.put_back, "if saved is None:", lambda: signal.raise_signal(signal.SIGINT))
    try:
        with pytest.raises(KeyboardInterrupt):
            if where == "prefill":
                m.prefill(c, 0, list(range(10, 20)))
            else:
                m.prefill_batch(c, [0, 1], [list(range(10, 20)), [5, 6]])
    finally:
        sys.settrace(None)
        m.net.logits_of = real
    assert [c.length(0), c.length(1)] == [3, 0]


@pytest.mark.skipif(threading.current_thread() is not threading.main_thread(), reason="signals go to the main thread")
def test_a_ctrl_c_held_back_is_raised_even_when_the_block_fails():
    from memra._interrupts import uninterrupted

    @uninterrupted
    def failing(error):
        signal.raise_signal(signal.SIGINT)
        raise error

    with pytest.raises(KeyboardInterrupt) as ei:
        failing(Boom("the block's own error"))
    assert isinstance(ei.value.__cause__, Boom)
    with pytest.raises(Boom):  # no Ctrl-C: the block's error as it is
        uninterrupted(lambda: (_ for _ in ()).throw(Boom("alone")))()


class _NoNotes(RuntimeError):
    """An error as Python 3.10 makes them: no add_note (3.11 added it)."""

    def __getattribute__(self, name):
        if name == "add_note":
            raise AttributeError(name)
        return super().__getattribute__(name)


def test_an_undo_that_fails_too_is_noted_or_logged(caplog):
    # put_back called error.add_note, an AttributeError on 3.10 that hid the prefill's own error
    # (the README names Python >= 3.10; a break-it pass, session 30).
    class Cache:
        def free(self, slot, owner):
            raise ValueError("free failed")

    noted = RuntimeError("prefill failed")
    batch_prefill.put_back(Cache(), 1, None, 0, noted, "prefill")
    assert noted.__notes__ == ["prefill: putting slot 1 back failed too: free failed"]
    old = _NoNotes("prefill failed")
    assert not hasattr(old, "add_note")
    with caplog.at_level("ERROR", logger="memra"):
        batch_prefill.put_back(Cache(), 1, None, 0, old, "prefill")
    assert "prefill: putting slot 1 back failed too: free failed" in caplog.text
