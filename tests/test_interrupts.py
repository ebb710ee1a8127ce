"""Ctrl-C at the edges of memra's cache updates (memra._interrupts): a real SIGINT raised at the
exact bytecode where a break-it pass (session 38) found slots of a cache left held for good, or a
KeyboardInterrupt turned into another error. Each case fails on the tree before the fix:

- generate_batch's ``finally`` releasing its leases one at a time, interrupted as the first began;
- take_free_slots interrupted as it returned, before the stream held its lease in a ``try``
  (take_slots too);
- SlotLease.release interrupted after its cache.release, before it forgot its token (the second
  release then raised ContractError in place of the KeyboardInterrupt);
- the holds of a public prefill / decode on the user's slots, interrupted as their give-back
  began (in the handler swap of the old block, before it held anything back);
- then, of the first fix (a handler installed for good): a worker thread's protected call
  raising the main thread's Ctrl-C, one raised inside ``except KeyboardInterrupt:`` dropped, the
  wait for the model's lock deaf to Ctrl-C, an application's own handler turning it all off, a
  closed stream's generator of steps closed by the garbage collector (the Ctrl-C lost there).

After each: the KeyboardInterrupt reaches the caller, every slot is free (or as the call left
it), and the model generates what a fresh one does. CPU, the embedded glm5_next checkpoint.
"""

from __future__ import annotations

import signal
import sys
import threading

import numpy as np
import pytest

import memra
from memra import _interrupts
from memra import batch as batch_mod

pytestmark = pytest.mark.skipif(threading.current_thread() is not threading.main_thread(),
                                reason="signals go to the main thread")


@pytest.fixture(autouse=True)
def python_sigint():
    """Python's own SIGINT handler for the test (a process started in the background by a
    non-interactive shell inherits SIGINT ignored); memra's takes its place at the first
    protected call."""
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        sys.settrace(None)
        signal.signal(signal.SIGINT, before)


@pytest.fixture(scope="module")
def model() -> memra.Model:
    return memra.load(memra.default_checkpoint(), max_batch=4, max_len=64, progress=False)


def sigint_at(code, event: str, line_text: str | None = None, when=lambda frame: True) -> list[int]:
    """Raise a real SIGINT once, from a trace function, at `event` ('call', 'line' or 'return')
    of the frame running `code` (for 'line': the line holding `line_text`) where `when(frame)`.
    Returns the list that counts the SIGINTs sent."""
    import inspect

    line = None
    if line_text is not None:
        fn = next(f for f in _functions(code))
        src, start = inspect.getsourcelines(fn)
        line = start + next(i for i, s in enumerate(src) if line_text in s)
    sent: list[int] = []

    def fire(frame) -> None:
        if not sent and when(frame):
            sent.append(1)
            signal.raise_signal(signal.SIGINT)

    def local(frame, ev, arg):
        if ev == event and (line is None or frame.f_lineno == line):
            fire(frame)
        return local

    def tracer(frame, ev, arg):
        if frame.f_code is not code:
            return None
        if event == "call":
            fire(frame)
        return local

    sys.settrace(tracer)
    return sent


def _functions(code):
    import gc

    return [f for f in gc.get_referrers(code) if getattr(f, "__code__", None) is code]


def inner(fn):
    """The code of a function memra._interrupts.uninterrupted wraps."""
    return fn.__wrapped__.__code__


def free_state(m: memra.Model) -> list[tuple[int, int]]:
    return [(m.cache.length(s), m.cache.owner(s)) for s in range(m.cache.max_batch)]


def check_usable(m: memra.Model) -> None:
    ref = memra.load(memra.default_checkpoint(), max_batch=4, max_len=64, progress=False)
    assert free_state(m) == [(0, 0)] * 4
    assert m.generate_batch([[1, 2], [3], [4, 5, 6], [7]], 3) == ref.generate_batch([[1, 2], [3], [4, 5, 6], [7]], 3)


def test_a_ctrl_c_as_generate_batch_gives_its_slots_back_frees_them_all(model):
    sent = sigint_at(inner(batch_mod.SlotLease.release), "call")
    with pytest.raises(KeyboardInterrupt):
        model.generate_batch([[1, 2], [3, 4]], 3)
    sys.settrace(None)
    assert sent
    check_usable(model)


def test_a_ctrl_c_as_the_slots_are_taken_leaves_none_held(model):
    for op in ("generate", "generate_batch", "stream", "take_slots"):
        sent = sigint_at(inner(batch_mod._hold_free), "return")
        with pytest.raises(KeyboardInterrupt):
            if op == "generate":
                model.generate([1, 2, 3], 3)
            elif op == "generate_batch":
                model.generate_batch([[1, 2], [3]], 3)
            elif op == "stream":
                next(model.stream([1, 2, 3], 3))
            else:  # the public call gives its leases back before the interrupt goes on
                model.take_slots(2)
        sys.settrace(None)
        assert sent, op
        assert free_state(model) == [(0, 0)] * 4, op
    check_usable(model)


def test_a_ctrl_c_ends_the_wait_for_the_models_lock(model):
    # The wait sat inside the protected holds: Ctrl-C waited for another thread's whole call.
    held, done = threading.Event(), threading.Event()

    def busy():
        with model._lock:
            held.set()
            done.wait(10)

    t = threading.Thread(target=busy)
    t.start()
    held.wait(5)
    before = signal.signal(signal.SIGALRM, lambda *a: signal.raise_signal(signal.SIGINT))
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.2)
        with pytest.raises(KeyboardInterrupt):
            model.generate([1, 2], 2)
        assert t.is_alive()  # raised while the other thread still held the lock
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, before)
        done.set()
        t.join()
    check_usable(model)


def test_a_ctrl_c_inside_a_release_is_a_keyboard_interrupt(model):
    # After cache.release, before the token was forgotten: the stream's finally released again,
    # and Cache.free refused the stale token (ContractError, the Ctrl-C only its cause).
    sent = sigint_at(inner(batch_mod.SlotLease.release), "line", "cache.release(self.slot")
    with pytest.raises(KeyboardInterrupt):
        model.generate([1, 2, 3], 3)
    sys.settrace(None)
    assert sent
    check_usable(model)


@pytest.mark.parametrize("op", ["prefill", "decode", "prefill_batch"])
@pytest.mark.parametrize("where", ["wrapper entry", "body"])
def test_a_ctrl_c_as_the_holds_of_a_call_go_back_releases_them(model, op, where):
    c = model.new_cache(2, 16)
    model.prefill(c, 0, [1, 2])
    model.prefill(c, 1, [3])
    code = inner(batch_mod.release_holds)
    if where == "body":
        sent = sigint_at(code, "call")
    else:  # the wrapper's first bytecode: before the function it wraps is even called
        sent = sigint_at(_interrupts._WRAPPER_CODE, "call",
                         when=lambda f: getattr(f.f_locals.get("fn"), "__code__", None) is code)
    with pytest.raises(KeyboardInterrupt):
        if op == "prefill":
            model.prefill(c, 0, [4, 5])
        elif op == "decode":
            model.decode(c, [0, 1], [5, 6])
        else:
            model.prefill_batch(c, [0, 1], [[4], [5, 6]])
    sys.settrace(None)
    assert sent
    assert [c.owner(0), c.owner(1)] == [0, 0]
    # The call ran to its end before its holds went back: its tokens are in the slots.
    grown = {"prefill": [4, 1], "decode": [3, 2], "prefill_batch": [3, 3]}[op]
    assert [c.length(0), c.length(1)] == grown
    ref = memra.load(memra.default_checkpoint(), max_batch=4, max_len=64, progress=False)
    rc = ref.new_cache(2, 16)
    ref.prefill(rc, 0, [1, 2])
    ref.prefill(rc, 1, [3])
    {"prefill": lambda: ref.prefill(rc, 0, [4, 5]), "decode": lambda: ref.decode(rc, [0, 1], [5, 6]),
     "prefill_batch": lambda: ref.prefill_batch(rc, [0, 1], [[4], [5, 6]])}[op]()
    np.testing.assert_array_equal(model.decode(c, [0, 1], [7, 8]), ref.decode(rc, [0, 1], [7, 8]))


def test_a_ctrl_c_as_a_closed_streams_steps_are_closed_reaches_the_caller(model):
    # The stream's generator of steps was left to the garbage collector, whose close ran its
    # first bytecode where Python reports a KeyboardInterrupt as ignored: the Ctrl-C was lost.
    from memra.model import Model

    s = model.stream([1, 2, 3], 5, ignore_eos=True)
    next(s)
    sent = sigint_at(Model._decode_rows.__code__, "call")
    try:
        s.close()
        raised = False
    except KeyboardInterrupt:
        raised = True
    sys.settrace(None)
    # Python 3.12 closes a generator suspended outside any try without running its frame: no
    # bytecode of it runs, no SIGINT is sent, none is due.
    assert raised == bool(sent), (raised, sent)
    check_usable(model)


def test_between_calls_the_applications_handler_is_in_place(model):
    model.generate([1, 2], 2)
    model.decode(model.new_cache(1, 8), [0], [1])
    list(model.stream([1, 2], 2))
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    with pytest.raises(KeyboardInterrupt):
        signal.raise_signal(signal.SIGINT)


def test_the_applications_own_handler_gets_the_ctrl_c_after_the_step(model):
    # memra's handler stands in front of the application's during a call and passes the Ctrl-C
    # to it once the rows are committed; before, a handler of the application's own turned the
    # protection off (asyncio.run installs one).
    got: list[int] = []

    def handler(signum, frame):
        got.append(signum)
        raise KeyboardInterrupt("the application's")

    signal.signal(signal.SIGINT, handler)
    c = model.new_cache(2, 8)
    model.prefill(c, 0, [1, 2])
    model.prefill(c, 1, [3])
    sent = sigint_at(inner(batch_mod.commit_rows), "line", "cache.commit(int(s), 1")
    with pytest.raises(KeyboardInterrupt, match="the application's"):
        model.decode(c, [0, 1], [5, 6])
    sys.settrace(None)
    assert sent and got == [signal.SIGINT]
    assert [c.length(0), c.length(1)] == [3, 2]  # the whole step, not row 0 alone
    assert signal.getsignal(signal.SIGINT) is handler


def test_a_ctrl_c_held_back_in_the_main_thread_never_reaches_another():
    # The record was one for the process: a worker's protected call returning raised the main
    # thread's Ctrl-C in the worker, and the main thread's went missing.
    got: list[str] = []

    def worker():
        try:
            _interrupts.uninterrupted(lambda: None)()
        except KeyboardInterrupt:
            got.append("worker")

    @_interrupts.uninterrupted
    def section():
        signal.raise_signal(signal.SIGINT)
        t = threading.Thread(target=worker)
        t.start()
        t.join()

    with pytest.raises(KeyboardInterrupt):
        _interrupts.guarded(section)()
    assert got == []


def test_a_ctrl_c_inside_an_except_keyboardinterrupt_clause_is_raised():
    # The wrapper read sys.exc_info(), the caller's handled KeyboardInterrupt, as its own error
    # and dropped the new Ctrl-C.
    @_interrupts.uninterrupted
    def section():
        signal.raise_signal(signal.SIGINT)

    try:
        raise KeyboardInterrupt("the first")
    except KeyboardInterrupt:
        with pytest.raises(KeyboardInterrupt) as ei:
            _interrupts.guarded(section)()
        assert str(ei.value) != "the first"


def test_a_ctrl_c_held_back_is_raised_once():
    # Two SIGINTs inside one protected call: one KeyboardInterrupt, none left for later.
    @_interrupts.uninterrupted
    def twice():
        signal.raise_signal(signal.SIGINT)
        signal.raise_signal(signal.SIGINT)
        return 1

    with pytest.raises(KeyboardInterrupt):
        _interrupts.guarded(twice)()
    assert _interrupts.uninterrupted(lambda: 2)() == 2


def test_a_stream_that_failed_says_so_at_every_later_next(model):
    # Its first next() found no free slot; once slots were free it ended silently empty.
    leases = model.take_slots(4)
    s = model.stream([1, 2, 3], 5)
    try:
        with pytest.raises(memra.ContractError, match="free slot"):
            next(s)
    finally:
        batch_mod.release_all(leases)
    for _ in range(2):
        with pytest.raises(memra.ContractError, match="stream: this stream ended with ContractError") as ei:
            next(s)
        assert ei.value.code == 40025
    assert len(model.generate([1, 2, 3], 5, ignore_eos=True)) == 5
    done = model.stream([1, 2], 2, ignore_eos=True)  # one that ended well ends as iterators do
    assert len(list(done)) == 2 and list(done) == []
