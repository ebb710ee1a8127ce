"""Ctrl-C held back while memra updates a cache in several calls (the commits of a decode step's
rows, a batched prefill's slots, the holds and releases of slots), so that each update happens
whole or not at all and a slot taken is always given back.

Python delivers SIGINT as KeyboardInterrupt between any two bytecodes, also at the first line of
a ``finally`` clause's cleanup call: a loop of ``Cache.commit`` calls interrupted halfway leaves
some rows of a step committed and others not, and a release interrupted before it starts leaves
its slot held for good. A block that swaps the SIGINT handler on entry and back on exit has the
same gaps at its two ends.

So protection is decided by the code that runs, not by a flag: memra's SIGINT handler looks at
the stack the signal interrupted, and when a function decorated with :func:`uninterrupted` is on
it (from its first bytecode until its result is settled), the Ctrl-C is recorded and raised as
KeyboardInterrupt when the outermost such function returns; anywhere else it raises at once,
exactly as Python's ``signal.default_int_handler`` does (the approach of trio's KI protection).

The handler is put in place of Python's default one the first time a protected function runs on
the main thread (only signals' thread) while the default one is installed; a handler the
application installed (or SIG_IGN) is never replaced, and then the functions run unprotected.
"""

from __future__ import annotations

import functools
import signal
import sys
import threading
from collections.abc import Callable
from types import FrameType
from typing import TypeVar

F = TypeVar("F", bound=Callable)

_pending = [False]  # a Ctrl-C recorded inside a protected function, not raised yet


def _protected(frame: FrameType | None) -> bool:
    """Whether a protected function's wrapper, its result not yet settled, is on the stack
    from `frame` outwards."""
    while frame is not None:
        if frame.f_code is _WRAPPER_CODE and "_settled" not in frame.f_locals:
            return True
        frame = frame.f_back
    return False


def _on_sigint(signum: int, frame: FrameType | None) -> None:
    """memra's SIGINT handler: record inside a protected function, else raise as Python's
    default handler does (a Ctrl-C recorded earlier is raised with this one, not again later)."""
    if _protected(frame):
        _pending[0] = True
        return
    _pending[0] = False
    signal.default_int_handler(signum, frame)


def _install() -> None:
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler and \
            threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, _on_sigint)


def uninterrupted(fn: F) -> F:
    """Run `fn` with Ctrl-C held back (see the module): a SIGINT that arrives while it runs is
    raised as KeyboardInterrupt once it returns or raises (chained to its own error), unless a
    protected caller is still running, whose return raises it instead."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        _install()
        try:
            return fn(*args, **kwargs)
        finally:
            _settled = True  # noqa: F841 - read by _protected through the frame's locals
            if _pending[0] and not _protected(sys._getframe(1)):
                _pending[0] = False
                error = sys.exc_info()[1]
                if not isinstance(error, KeyboardInterrupt):
                    raise KeyboardInterrupt from error
    return wrapper  # type: ignore[return-value]


_WRAPPER_CODE = uninterrupted(lambda: None).__code__
