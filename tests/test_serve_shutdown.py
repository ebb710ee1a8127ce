"""``memra serve`` stops promptly with generations in flight (CPU, loopback), from a break-it
pass of the CLI (session 24 of 2026-12-05): uvicorn's shutdown waits for every connection to
close, and the scheduler was stopped only after that (the app's lifespan), so Ctrl-C or SIGTERM
waited for the longest running generation to finish. memra.serve.server stops the scheduler
first: the requests end at once and their connections close.
"""

from __future__ import annotations

import json
import threading
import time

import numpy as np
import pytest

httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

import memra  # noqa: E402
from memra.batch import RowSampling  # noqa: E402
from memra.serve.scheduler import Request, ShuttingDownError  # noqa: E402
from serve_helpers import ServerThread  # noqa: E402


def test_stopping_ends_the_generations_in_flight_at_once() -> None:
    # 60000 tokens take about a minute on the CPU; the server must stop within seconds.
    model = memra.load(memra.default_checkpoint(), max_batch=2, max_len=65536, progress=False)
    s = ServerThread(model, served_model_name="tiny")
    long = dict(model="tiny", prompt=[1, 2, 3], max_tokens=60000, temperature=0, ignore_eos=True)
    got: dict = {}

    def plain() -> None:
        got["plain"] = httpx.post(s.url + "/v1/completions", json=long, timeout=120)

    def streamed() -> None:
        got["stream"] = httpx.post(s.url + "/v1/completions", json=dict(long, stream=True), timeout=120)

    clients = [threading.Thread(target=plain), threading.Thread(target=streamed)]
    for c in clients:
        c.start()
    deadline = time.monotonic() + 30
    while s.app.state.memra.scheduler.running < 2:  # both generating
        assert time.monotonic() < deadline, "the two requests did not start"
        time.sleep(0.01)
    t0 = time.monotonic()
    s.stop()
    for c in clients:
        c.join(30)
    took = time.monotonic() - t0
    assert not s.thread.is_alive() and took < 10, took
    plain_r, stream_r = got["plain"], got["stream"]
    assert plain_r.status_code == 503 and "shutting down" in plain_r.json()["error"]["message"], plain_r.text
    events = [e for e in stream_r.text.split("\n") if e]
    assert events[-1] == "data: [DONE]" and "shutting down" in events[-2], events[-3:]
    # the error's code says why (it was memra's 0, the status of success)
    assert plain_r.json()["error"]["code"] == "server_shutting_down", plain_r.text
    assert plain_r.json()["error"]["type"] == "server_error", plain_r.text
    streamed = json.loads(events[-2].removeprefix("data: "))["error"]
    assert streamed["code"] == "server_shutting_down" and streamed["type"] == "server_error", streamed
    # a request reaching a stopping scheduler is refused (the handler's 503), not queued for ever
    with pytest.raises(ShuttingDownError) as refused:
        s.app.state.memra.scheduler.submit(Request(np.array([1], np.int32), 1, RowSampling(), frozenset()))
    assert refused.value.code == "server_shutting_down"  # the 503's code, as the requests ended above
    from memra.serve.handlers import APIError, _submit
    with pytest.raises(APIError) as answered:  # what the handler answers such a request
        _submit(s.app.state.memra, Request(np.array([1], np.int32), 1, RowSampling(), frozenset()))
    assert answered.value.status == 503 and answered.value.code == "server_shutting_down"


def _serve_and_signal(signals: list[int]) -> tuple[int, float, bytes, str]:
    """`memra serve` with a client that sent half its body, then `signals` 0.5 s apart: (exit
    status, seconds from the first signal to the exit, the client's answer, stderr)."""
    import queue
    import re
    import socket
    import subprocess
    import sys

    from memra.serve import SHUTDOWN_TIMEOUT_S

    # The server gets SIGINT as a foreground process gets a terminal's Ctrl-C: in a session of its
    # own, with Python's SIGINT handler. A child inherits an ignored SIGINT (pytest run as a
    # background job of a script, `trap '' INT`); uvicorn then stops on it and, re-raising it
    # into SIG_IGN after the stop, lets memra serve exit 0. `python -m memra` after the reset:
    start = ("import runpy, signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
             "sys.argv[0] = 'memra'; runpy.run_module('memra', run_name='__main__', alter_sys=True)")
    proc = subprocess.Popen([sys.executable, "-c", start, "serve", "--port", "0", "--max-len", "64"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True)
    lines: queue.Queue = queue.Queue()
    reader = threading.Thread(target=lambda: [lines.put(x) for x in proc.stderr], daemon=True)
    reader.start()
    try:
        deadline, port = time.monotonic() + 120, None
        while port is None:
            line = lines.get(timeout=max(0.1, deadline - time.monotonic()))
            m = re.search(r"Uvicorn running on http://127\.0\.0\.1:(\d+)", line)
            port = m and int(m.group(1))
        with socket.create_connection(("127.0.0.1", port)) as client:
            client.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                           b"Content-Length: 100\r\n\r\n{\"pro")
            time.sleep(0.3)
            t0 = time.monotonic()
            for i, sig in enumerate(signals):
                if i:
                    time.sleep(0.5)
                proc.send_signal(sig)
            rc = proc.wait(timeout=SHUTDOWN_TIMEOUT_S + 20)
            took = time.monotonic() - t0
            client.settimeout(5)
            answer = client.recv(65536)
        reader.join(10)  # stderr read to its end
        return rc, took, answer, "".join(lines.queue)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_sigterm_cuts_a_half_sent_request_and_memra_serve_exits_0() -> None:
    # A client that had sent half its body kept uvicorn "waiting for connections to close" for as
    # long as it stayed (a second SIGTERM did not help), and a clean stop exited with 143: uvicorn
    # raises SIGTERM again after its shutdown (a break-it pass of the server, session 30).
    import signal

    from memra.serve import SHUTDOWN_TIMEOUT_S

    rc, took, answer, log = _serve_and_signal([signal.SIGTERM])
    assert rc == 0 and took < SHUTDOWN_TIMEOUT_S + 5, (rc, took)
    # memra's 503, not uvicorn's 500 and a logged traceback for the cancelled request
    assert answer.startswith(b"HTTP/1.1 503") and b"shutting down" in answer, answer
    assert b'"code":"server_shutting_down"' in answer, answer
    assert "Traceback" not in log and "Exception in ASGI application" not in log, log


def test_a_second_ctrl_c_forces_the_exit_without_a_traceback() -> None:
    # uvicorn's forced exit (a second Ctrl-C while it waits for a connection) skipped the app's
    # lifespan shutdown; the loop's teardown then cancelled the lifespan task and starlette's
    # traceback of that CancelledError was logged (a break-it pass, session 40).
    import signal

    rc, took, answer, log = _serve_and_signal([signal.SIGINT, signal.SIGINT])
    assert rc == 130 and took < 5, (rc, took, answer, log)
    assert answer.startswith(b"HTTP/1.1 503"), answer
    assert "Traceback" not in log and "CancelledError" not in log, log
    assert log.rstrip().endswith("memra: interrupted"), log
