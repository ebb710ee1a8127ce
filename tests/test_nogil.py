"""The interpreter's exit with a daemon thread inside memra (python/src/nogil.h): before the exit
hook, CPython ended such a thread with pthread_exit when it asked for the GIL back, whose forced
unwind through the binding's C++ frames aborted the process ("terminate called without an active
exception", exit 134, a core dump). Each case runs a program that exits while a daemon thread
works in memra and asserts a clean exit: status 0, nothing on stderr but the program's own lines
(no abort, no hang, no traceback of the thread, no nanobind leak report). Then the cases a
break-it pass found against the first hook (each failed on it): a thread's Python code running
inside a memra call (a sequence's __getitem__, a __dlpack__: aborted), the model's lock held by a
parked daemon thread (a late atexit callback, a stream's finalizer, a thread joined from a late
callback: hung), a fork's child (hung), a Ctrl-C during the wait (aborted); and those a second
pass found against the second: Python code memra called blocked for good (the exit hung), a
stream finalized on a daemon thread after the hook (a traceback), a fork from a daemon thread
while later atexit callbacks ran (tracebacks; the child's memra closed), a real leak of a memra
object no longer reported (load's tqdm monitor thread silenced nanobind's leak report); and from a
third, a daemon thread holding memra objects without calling memra (a leak report). CPU, the
embedded glm5_next checkpoint.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

LOAD = """
import threading, time
import memra
m = memra.load(memra.default_checkpoint(), max_batch=2, max_len=4096, progress=False)
busy = threading.Event()
"""

WORKERS = {
    # decode steps back to back: most of the time inside a native call
    "generate": """
def work():
    while True:
        for _ in m.stream([1, 2, 3], 4000, ignore_eos=True):
            busy.set()
""",
    # one long native call per layer (a 3000-token prompt): the exit waits for it
    "prefill": """
def work():
    cache = m.new_cache(1, 4096)
    while True:
        cache.free(0)
        busy.set()
        m.prefill(cache, 0, [i % 250 + 1 for i in range(3000)])
""",
    # two rows a step through the batch API
    "generate_batch": """
def work():
    while True:
        busy.set()
        m.generate_batch([[1, 2, 3], [4, 5]], 4000, ignore_eos=True)
""",
}

EXIT = """
threading.Thread(target=work, daemon=True).start()
busy.wait()
time.sleep(0.3)
print("main exits", flush=True)
"""


def run(source: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(source)], capture_output=True,
                          text=True, timeout=120)


def stderr_lines(p: subprocess.CompletedProcess) -> list[str]:
    # load's notes on the checkpoint's skipped weights are the program's own output; Python 3.12
    # warns of a fork in a process with threads (the fork cases make one on purpose)
    return [ln for ln in p.stderr.splitlines() if ln.strip() and not ln.startswith("memra: skipping")
            and "is multi-threaded, use of fork()" not in ln]


def assert_clean_exit(p: subprocess.CompletedProcess, stdout: str = "main exits\n") -> None:
    """The program printed `stdout`, nothing on stderr but its own lines, and exited 0."""
    assert p.stdout == stdout, p.stderr
    assert stderr_lines(p) == [], p.stderr
    assert p.returncode == 0, p.stderr


@pytest.mark.parametrize("worker", sorted(WORKERS))
def test_exit_with_a_daemon_thread_inside_memra(worker):
    p = run(LOAD + WORKERS[worker] + EXIT)
    assert_clean_exit(p)


def test_a_native_call_on_the_exiting_thread_after_the_hook_is_refused():
    """An atexit callback registered before memra's import (so run after memra's hook) that calls
    memra gets UnsupportedError UNSUPPORTED_AT_EXIT, not a hang and not an abort."""
    p = run("""
        import atexit

        def late():
            try:
                m.generate([1, 2, 3], 4)
            except memra.UnsupportedError as e:
                print("refused", e.code, e.code == memra._core.status.UNSUPPORTED_AT_EXIT, flush=True)

        atexit.register(late)
        import memra
        m = memra.load(memra.default_checkpoint(), max_batch=1, max_len=64, progress=False)
        print(m.generate([1, 2, 3], 4) == m.generate([1, 2, 3], 4), flush=True)
        """)
    assert p.stdout == "True\nrefused 50004 True\n", p.stderr
    assert p.returncode == 0, p.stderr


@pytest.mark.parametrize("arg", ["sequence", "dlpack"])
def test_exit_with_a_daemon_thread_in_python_code_memra_called(arg):
    """A slow __getitem__ of concat_rows' sequence / __dlpack__ of rms_norm's x: the thread is in
    memra's C++ frames while it runs Python code (the GIL taken and dropped)."""
    p = run("""
        import threading, time
        import numpy as np
        from memra import _core

        part = np.ones((4, 8), np.float32)

        class Parts:
            def __len__(self):
                return 3

            def __getitem__(self, i):
                if i >= 3:
                    raise IndexError(i)
                time.sleep(0.05)
                return part

        class Slow:
            def __dlpack__(self, **kw):
                time.sleep(0.05)
                return part.__dlpack__(**kw)

            def __dlpack_device__(self):
                return part.__dlpack_device__()

        def work():
            while True:
                _core.concat_rows(Parts()) if ARG == "sequence" else _core.rms_norm(Slow(), None, eps=1e-6)

        threading.Thread(target=work, daemon=True).start()
        time.sleep(0.3)
        print("main exits", flush=True)
        """.replace("ARG", repr(arg)))
    assert_clean_exit(p)


DAEMON_GENERATES = """
def work():
    while True:
        busy.set()
        m.generate([4, 5, 6], 100, ignore_eos=True)

threading.Thread(target=work, daemon=True).start()
busy.wait()
time.sleep(0.2)
"""


def test_a_late_atexit_callback_gets_the_model_from_a_daemon_thread():
    """The daemon thread holds the model's lock across its calls: at its next memra call after the
    hook it ends (SystemExit) and lets the lock go, so the late callback's generate is refused
    (50004) instead of waiting for the lock for good."""
    p = run("""
import atexit

def late():
    try:
        m.generate([1, 2, 3], 3)
    except memra.UnsupportedError as e:
        print("late:", e.code, flush=True)

atexit.register(late)
""" + LOAD + DAEMON_GENERATES + 'print("main exits", flush=True)\n')
    assert_clean_exit(p, "main exits\nlate: 50004\n")


def test_a_stream_finalized_at_teardown_while_a_daemon_thread_generates():
    """An unfinished stream in another module, closed by the teardown's garbage collection, gives
    nothing back then (the lock may be a daemon thread's the interpreter ended)."""
    p = run(LOAD + """
import sys, types
other = sys.modules["other"] = types.ModuleType("other")
other.s = m.stream([1, 2, 3], 50, ignore_eos=True)
next(other.s)
""" + DAEMON_GENERATES + 'print("main exits", flush=True)\n')
    assert_clean_exit(p)


def test_a_thread_joined_by_a_late_atexit_callback_is_refused_not_parked():
    p = run("""
        import atexit, threading

        def late():
            def call():
                try:
                    m.generate([1, 2, 3], 3)
                except memra.UnsupportedError as e:
                    print("thread:", e.code, flush=True)

            t = threading.Thread(target=call)
            t.start()
            t.join()

        atexit.register(late)
        import memra
        m = memra.load(memra.default_checkpoint(), max_batch=1, max_len=64, progress=False)
        """)
    assert p.stdout == "thread: 50004\n", p.stderr
    assert p.returncode == 0


def test_a_fork_child_exits_while_the_parent_has_a_daemon_thread_in_memra():
    """The child inherits no thread: its count of calls in progress starts over."""
    p = run(LOAD + DAEMON_GENERATES + """
import os, sys
import numpy as np
pid = os.fork()
if pid == 0:  # (not the model: its lock may be the daemon thread's, held at the fork)
    print("child", memra._core.rms_norm(np.ones((2, 4), np.float32), None, eps=0.0).sum(), flush=True)
    sys.exit(0)
print("child status", os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]), flush=True)
""")
    assert_clean_exit(p, "child 8.0\nchild status 0\n")


def test_ctrl_c_while_the_exit_waits_ends_the_process_with_130():
    """A SIGINT (here from a timer, with Python's handler) while the hook waits for a daemon
    thread's long op: finalizing then would abort, so the process ends at once with 130."""
    p = run("""
        import signal, threading
        import numpy as np
        from memra import _core

        x = np.ones((24000, 4096), np.float32)
        inside = threading.Event()

        def work():
            while True:
                inside.set()
                _core.rms_norm(x, None, eps=1e-6)

        threading.Thread(target=work, daemon=True).start()
        inside.wait()
        signal.signal(signal.SIGALRM, signal.default_int_handler)
        signal.setitimer(signal.ITIMER_REAL, 0.05)
        print("main exits", flush=True)
        """)
    assert p.stdout == "main exits\n"
    assert stderr_lines(p) == ["memra: exit interrupted while a thread was inside memra; exiting now"], p.stderr
    assert p.returncode == 130


def test_exit_with_a_daemon_thread_blocked_in_python_code_memra_called():
    """A __getitem__ waiting on a queue nobody feeds: the exit waits a second for native work,
    not for that thread."""
    p = run("""
        import queue, threading, time
        import numpy as np
        from memra import _core

        q = queue.Queue()

        class Rows:
            def __len__(self):
                return 2

            def __getitem__(self, i):
                if i >= 2:
                    raise IndexError(i)
                return q.get()

        def work():
            while True:
                _core.concat_rows(Rows())

        threading.Thread(target=work, daemon=True).start()
        for _ in range(3):
            q.put(np.ones((2, 4), np.float32))  # the second call waits for its second row
        time.sleep(0.3)
        print("main exits", flush=True)
        """)
    assert_clean_exit(p)


def test_streams_dropped_on_a_daemon_thread_after_the_hook():
    """The daemon thread's next call raises SystemExit; the unwinding drops its other stream,
    whose finalizer gives nothing back (no 'Exception ignored' traceback)."""
    p = run(LOAD + """
def work():
    while True:
        a = m.stream([1, 2, 3], 500, ignore_eos=True)
        b = m.stream([4, 5, 6], 500, ignore_eos=True)
        for _ in zip(a, b):
            busy.set()

threading.Thread(target=work, daemon=True).start()
busy.wait()
time.sleep(0.3)
print("main exits", flush=True)
""")
    assert_clean_exit(p)


def test_a_fork_from_a_daemon_thread_while_later_atexit_callbacks_run():
    p = run("""
import atexit, os, sys, threading, time
atexit.register(time.sleep, 0.3)  # runs after memra's hook
import numpy as np
from memra import _core

def work():
    while True:
        pid = os.fork()
        if pid == 0:
            try:
                _core.rms_norm(np.ones((2, 4), np.float32), None, eps=0.0)
                os._exit(0)
            except BaseException as e:
                print("child:", type(e).__name__, e, file=sys.stderr, flush=True)
                os._exit(4)
        code = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
        if code:
            print("child status", code, file=sys.stderr, flush=True)
        time.sleep(0.02)

threading.Thread(target=work, daemon=True).start()
time.sleep(0.3)
print("main exits", flush=True)
""")
    assert_clean_exit(p)


def test_a_real_leak_of_a_memra_object_is_still_reported():
    """Only threads that called memra silence nanobind's leak report at exit (load leaves tqdm's
    monitor thread alive, which never did)."""
    p = run("""
        import ctypes
        import memra
        m = memra.load(memra.default_checkpoint(), max_batch=1, max_len=64, progress=False)
        ctypes.pythonapi.Py_IncRef(ctypes.py_object(m.cache))  # a reference nobody drops
        """)
    assert "nanobind: leaked 1 instances!" in p.stderr and 'of type "memra._core.Cache"' in p.stderr, p.stderr


def test_a_daemon_thread_holding_memra_objects_gets_no_leak_report():
    """An idle worker thread with a memra object in its frame (it never called memra): the object
    outlives the teardown with the thread, which is no leak of memra's bindings."""
    p = run("""
        import threading, time
        import numpy as np
        from memra import _core

        w = _core.Weight(np.ones((4, 4), np.float32))
        threading.Thread(target=lambda w=w: time.sleep(30), daemon=True).start()
        del w
        print("main exits", flush=True)
        """)
    assert_clean_exit(p)
