"""Ctrl-C held back while memra updates a cache in several calls (the commits of a decode step's
rows, a batched prefill's slots, the holds and releases of slots), so that each update happens
whole or not at all and a slot taken is always given back.

Python runs a SIGINT's handler at its next check point (a function's first bytecode, a loop's
jump back, the return of a C call), and Python's default handler raises KeyboardInterrupt there:
a loop of ``Cache.commit`` calls interrupted halfway leaves some rows of a step committed and
others not, and a release interrupted at its first bytecode, in a ``finally`` clause, leaves its
slot held for good. A block that swaps the handler on entry and back on exit has the same gaps at
its two ends.

So protection is decided by the code that runs, not by a flag (the approach of trio's KI
protection): while a public memra call (:func:`guarded`) runs on the main thread, memra's handler
stands in front of the application's Python handler (Python's default one, asyncio's, the
application's own; not SIG_IGN or SIG_DFL, which have no Python handler to pass the signal to).
When a function decorated with :func:`uninterrupted` is on the interrupted stack (from its
wrapper's first bytecode to its last), or a public call is on its way out, the Ctrl-C is
recorded and passed to the application's handler (which raises KeyboardInterrupt, or does what
it does) as the outermost such function returns; anywhere else it is passed on at once. The
handler steps back when the call returns: between calls the application's handler is the one
installed, and no Ctrl-C stays recorded.
"""

from __future__ import annotations

import functools
import signal
import sys
import threading
from collections.abc import Callable
from types import FrameType
from typing import TypeVar

try:  # the C module under `signal`: its getsignal takes ~20 ns, `signal.getsignal` ~2 us (enums)
    import _signal as _sig
except ImportError:  # pragma: no cover - CPython has it
    _sig = signal

F = TypeVar("F", bound=Callable)

_SIGINT = int(signal.SIGINT)
_MAIN = threading.main_thread().ident  # only the main thread receives signals
_pending = [False]  # a Ctrl-C recorded inside a protected function, not passed on yet
_previous: list = [signal.default_int_handler]  # the handler memra's stands in front of


def _protected(frame: FrameType | None) -> bool:
    """Whether a protected function's wrapper, or a public call's on its way out, is on the
    stack from `frame` outwards."""
    while frame is not None:
        code = frame.f_code
        if code is _WRAPPER_CODE or (code is _GUARD_CODE and "_leaving" in frame.f_locals):
            return True
        frame = frame.f_back
    return False


def _on_sigint(signum: int, frame: FrameType | None) -> None:
    """memra's SIGINT handler: record inside a protected function, else pass the signal to the
    application's handler (a Ctrl-C recorded earlier goes with this one, not again later)."""
    if _protected(frame):
        _pending[0] = True
        return
    _pending[0] = False
    _previous[0](signum, frame)


def _stand_in() -> tuple[bool, object]:
    """(whether memra's handler should stand in front of the main thread's Python SIGINT handler
    now, that handler)."""
    if threading.get_ident() != _MAIN:
        return False, None
    handler = _sig.getsignal(_SIGINT)
    # Not over ours (an outer call's), SIG_IGN, SIG_DFL, or a handler set in C (None).
    return handler is not _on_sigint and callable(handler), handler


def uninterrupted(fn: F) -> F:
    """Run `fn` with Ctrl-C held back (see the module): a SIGINT that arrives while it runs is
    passed on (KeyboardInterrupt from Python's handler, chained to fn's own error) once it
    returns or raises, unless a protected caller is still running, whose return passes it on.
    Whatever fn takes must be in its caller's hands before it returns (a list the caller
    releases in a ``finally``): the interrupt replaces its return value."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        # This frame is protected from its first bytecode to its last (_protected): a SIGINT
        # once memra's handler stands in is recorded, and passed on by _leave.
        stand_in, previous = _stand_in()
        if stand_in:
            _previous[0] = previous
            _sig.signal(_SIGINT, _on_sigint)
        try:
            result = fn(*args, **kwargs)
        except BaseException as error:
            _leave(stand_in, previous, error, sys._getframe(1))
            raise
        _leave(stand_in, previous, None, sys._getframe(1))
        return result
    return wrapper  # type: ignore[return-value]


def guarded(fn: F) -> F:
    """A public call: memra's handler stands in front of the application's while it runs, so a
    Ctrl-C at the edges of its protected functions (a release's first bytecode in a ``finally``)
    is held back too."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        stand_in, previous = _stand_in()
        # The stand-in and the call inside the try: a SIGINT right after either (a C call's
        # return is a check point; so is CALL_FUNCTION_EX's) still reaches the finally.
        try:
            if stand_in:
                _previous[0] = previous
                _sig.signal(_SIGINT, _on_sigint)
            result = fn(*args, **kwargs)
        finally:
            _leaving = True  # noqa: F841 - read by _protected: the way out is protected
            _leave(stand_in, previous, None, sys._getframe(1))
        return result
    return wrapper  # type: ignore[return-value]


def _leave(stand_in: bool, previous, error: BaseException | None, frame: FrameType | None) -> None:
    """The way out of a protected function or a public call (from `frame`'s callee): step back
    to `previous` when this one stood in, then pass on a Ctrl-C recorded meanwhile, unless a
    protected caller still runs (its way out passes it on); what the handler raises is chained
    to `error`, the function's own."""
    if stand_in:
        # Taken and cleared before stepping back: after it a new SIGINT goes to `previous`
        # directly, and none can be left recorded for a later call.
        pending, _pending[0] = _pending[0], False
        _sig.signal(_SIGINT, previous)
    elif _pending[0] and threading.get_ident() == _MAIN and not _protected(frame):
        pending, _pending[0] = True, False
    else:
        return
    if not pending:
        return
    try:
        _previous[0](_SIGINT, frame)
    except BaseException as raised:
        if error is not None and raised is not error and raised.__cause__ is None:
            raise raised from error
        raise


_WRAPPER_CODE = uninterrupted(lambda: None).__code__
_GUARD_CODE = guarded(lambda: None).__code__
