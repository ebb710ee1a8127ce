"""The interpreter's exit with a daemon thread inside memra (python/src/nogil.h): before the exit
hook, CPython ended such a thread with pthread_exit when it asked for the GIL back, whose forced
unwind through the binding's C++ frames aborted the process ("terminate called without an active
exception", exit 134, a core dump). Each case runs a program that exits while a daemon thread
works in memra and asserts a clean exit: status 0, nothing on stderr but the program's own lines
(no abort, no traceback of the thread, no nanobind leak report). CPU, the embedded glm5_next
checkpoint.
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
                          text=True, timeout=300)


def stderr_lines(p: subprocess.CompletedProcess) -> list[str]:
    # load's notes on the checkpoint's skipped weights are the program's own output
    return [ln for ln in p.stderr.splitlines() if ln.strip() and not ln.startswith("memra: skipping")]


@pytest.mark.parametrize("worker", sorted(WORKERS))
def test_exit_with_a_daemon_thread_inside_memra(worker):
    p = run(LOAD + WORKERS[worker] + EXIT)
    assert p.stdout == "main exits\n"
    assert stderr_lines(p) == [], p.stderr
    assert p.returncode == 0, p.stderr


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
