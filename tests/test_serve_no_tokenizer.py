"""memra serve over a model without a tokenizer: its completions carry the token ids whether or
not the request asks for them (return_token_ids), since the text is empty (nothing decodes it).
The expected ids are memra's own greedy generate on the same checkpoint, loaded apart."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
httpx = pytest.importorskip("httpx")

import memra  # noqa: E402
from serve_helpers import ServerThread, post_json  # noqa: E402

PROMPT = [5, 17, 42, 9]
N = 6


@pytest.fixture(scope="module")
def want() -> list[int]:
    ref = memra.load(memra.default_checkpoint(), max_batch=1, max_len=64, progress=False)
    return ref.generate(PROMPT, N, ignore_eos=True)


@pytest.fixture(scope="module")
def server():
    model = memra.load(memra.default_checkpoint(), max_batch=2, max_len=64, progress=False)
    model.tokenizer = None
    with ServerThread(model, served_model_name="tiny") as s:
        yield s


def test_a_completion_without_a_tokenizer_returns_its_token_ids(server, want) -> None:
    r = post_json(server, "/v1/completions", {"prompt": PROMPT, "max_tokens": N, "temperature": 0,
                                              "ignore_eos": True})
    assert r.status_code == 200, r.text
    body = r.json()
    choice = body["choices"][0]
    assert choice["text"] == "" and choice["token_ids"] == want
    assert choice["prompt_token_ids"] == PROMPT and "prompt_token_ids" not in body  # in the choice, as vLLM


def test_a_streamed_completion_without_a_tokenizer_returns_its_token_ids(server, want) -> None:
    r = post_json(server, "/v1/completions", {"prompt": PROMPT, "max_tokens": N, "temperature": 0,
                                              "ignore_eos": True, "stream": True})
    assert r.status_code == 200, r.text
    events = [json.loads(line[len("data: "):]) for line in r.text.splitlines()
              if line.startswith("data: ") and line != "data: [DONE]"]
    got = [t for e in events for c in e["choices"] for t in (c.get("token_ids") or [])]
    assert got == want
    # the prompt's ids in the first chunk's choice, as vLLM's completion stream gives them
    assert events[0]["choices"][0]["prompt_token_ids"] == PROMPT
    assert all("prompt_token_ids" not in c for e in events[1:] for c in e["choices"])
