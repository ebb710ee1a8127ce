"""A memra server on loopback for tests and benchmarks: uvicorn in a thread of this process on a
free port (port 0: the kernel picks one), stopped by :meth:`ServerThread.stop`."""

from __future__ import annotations

import re
import threading
import time


class ServerThread:
    """``memra.serve.create_app(model, **kwargs)`` served by uvicorn on 127.0.0.1 in a daemon
    thread; ``url`` is its base (``http://127.0.0.1:PORT``). Usable as a context manager."""

    def __init__(self, model, timeout: float = 30.0, **kwargs) -> None:
        import uvicorn

        from memra.serve import create_app, server

        self.app = create_app(model, **kwargs)
        config = uvicorn.Config(self.app, host="127.0.0.1", port=0, log_level="warning", lifespan="on")
        self.server = server(self.app, config)
        self.thread = threading.Thread(target=self.server.run, name="memra-test-server", daemon=True)
        self.thread.start()
        deadline = time.monotonic() + timeout
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the test server did not start")
            time.sleep(0.01)
        port = self.server.servers[0].sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"

    def stop(self) -> None:
        """Shut the server down (its scheduler thread with it) and wait for the thread."""
        self.server.should_exit = True
        self.thread.join(30)

    def __enter__(self) -> ServerThread:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def metric(text: str, name: str, labels: str = "") -> float:
    """The value of one sample in a Prometheus exposition (`labels` as written, e.g.
    'finish_reason="stop"'); 0.0 when absent."""
    pattern = re.escape(name) + (r"\{" + re.escape(labels) + r"\}" if labels else "") + r" (\S+)"
    m = re.search(r"^" + pattern + r"$", text, re.M)
    return float(m.group(1)) if m else 0.0


def post_json(server: ServerThread, path: str, body, **kw):
    """POST `body` (a JSON-able object, or str / bytes sent as they are) to the server's `path`
    as application/json; the httpx.Response."""
    import json

    import httpx

    content = body if isinstance(body, (str, bytes)) else json.dumps(body)
    return httpx.post(server.url + path, content=content, headers={"Content-Type": "application/json"},
                      timeout=30, **kw)


def wait_idle(server: ServerThread, deadline: float = 10.0) -> str:
    """The server's metrics once no request runs or waits and no slot is in use (AssertionError
    after `deadline` s)."""
    import httpx

    end = time.monotonic() + deadline
    while True:
        text = httpx.get(server.url + "/metrics", timeout=10).text
        if all(metric(text, m) == 0 for m in ("memra_cache_slots_in_use", "memra_requests_running",
                                               "memra_requests_waiting")):
            return text
        assert time.monotonic() < end, "slots still in use:\n" + text
        time.sleep(0.02)
