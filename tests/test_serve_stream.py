"""``memra serve``'s event streams read the ways clients read them (CPU, loopback), from a
break-it pass of the server (session 23 of 2026-12-05): each event is one line for a reader
that splits lines as str.splitlines() does (httpx's iter_lines), whatever text the model made.
"""

from __future__ import annotations

import json

import pytest

httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

import memra  # noqa: E402
from memra.serve import handlers  # noqa: E402
from serve_helpers import ServerThread, wait_idle  # noqa: E402

# U+0085 (NEL, the bytes C2 85 a byte-level model draws like any other), U+2028 and U+2029: left
# raw by JSON without ensure_ascii, line breaks to str.splitlines()
BREAKS = "\x85\u2028\u2029"


@pytest.fixture(scope="module")
def server():
    model = memra.load(memra.default_checkpoint(), max_batch=2, max_len=64, progress=False)
    with ServerThread(model, served_model_name="tiny") as s:
        yield s


class _Breaking(handlers.TextStream):
    """The text of every token followed by the three characters (a model that draws them)."""

    def add(self, token_id: int) -> str:
        return super().add(token_id) + BREAKS


@pytest.mark.parametrize("path,body", [
    ("/v1/completions", {"prompt": "Hi"}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}]}),
])
def test_an_event_is_one_line_to_splitlines_readers(server, monkeypatch, path, body) -> None:
    monkeypatch.setattr(handlers, "TextStream", _Breaking)
    body = dict(body, max_tokens=3, temperature=0, ignore_eos=True, stream=True)
    events = []
    with httpx.stream("POST", server.url + path, json=body, timeout=30) as r:
        assert r.status_code == 200
        for line in r.iter_lines():  # str.splitlines() semantics
            if line:
                assert line.startswith("data: "), repr(line)
                events.append(line[len("data: "):])
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    text = "".join(c["choices"][0].get("text") or c["choices"][0].get("delta", {}).get("content") or ""
                   for c in chunks)
    assert text.count(BREAKS) == 3, repr(text)  # the characters arrive as they were made
    wait_idle(server)
