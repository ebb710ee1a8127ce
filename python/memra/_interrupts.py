"""Ctrl-C held back across a cache update of several calls (the commits of a decode step's rows,
a batched prefill's slots), so that the update happens whole or not at all.

Python delivers SIGINT as KeyboardInterrupt between any two bytecodes; a loop of
``Cache.commit`` calls interrupted halfway leaves some rows of a step committed and others not.
Inside :func:`deferred_interrupts` a SIGINT is recorded instead and raised as KeyboardInterrupt
when the block ends. Only the main thread receives signals, and only Python's own handler is
replaced: elsewhere (another thread, a handler the application installed) the block runs as it is.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator


@contextlib.contextmanager
def deferred_interrupts(active: bool = True) -> Iterator[None]:
    """Run the block with SIGINT recorded rather than raised; KeyboardInterrupt after it when one
    arrived meanwhile, chained to the block's own exception when it raised one (the Ctrl-C is
    never lost). active=False runs the block as it is (one call needs no protection)."""
    if not active or threading.current_thread() is not threading.main_thread() or \
            signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        yield
        return
    got: list[int] = []
    signal.signal(signal.SIGINT, lambda signum, frame: got.append(signum))
    try:
        yield
    except BaseException as e:
        signal.signal(signal.SIGINT, signal.default_int_handler)
        if got and not isinstance(e, KeyboardInterrupt):
            raise KeyboardInterrupt from e
        raise
    signal.signal(signal.SIGINT, signal.default_int_handler)
    if got:
        raise KeyboardInterrupt
