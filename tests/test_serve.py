"""``memra serve`` end to end: the real server (uvicorn, FastAPI, the scheduler thread) on
loopback with the embedded checkpoint on the CPU, driven by the official ``openai`` client as a
user would, and by raw HTTP where the client hides the wire format. Expected tokens come from
``Model.generate`` on a separately loaded copy of the checkpoint (the same seed gives the same
tokens alone or among concurrent requests); expected text from the tokenizer's whole decode.

Bounded: a few hundred generated tokens in all, every wait has a deadline, and each server is
stopped by its fixture.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import threading
import time
from pathlib import Path

import numpy as np
import pytest

openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

import memra  # noqa: E402
from serve_helpers import ServerThread, metric, post_json, wait_idle  # noqa: E402

NAME = "tiny"
MAX_LEN = 256


@pytest.fixture(scope="module")
def ref() -> memra.Model:
    """The reference: the same checkpoint, loaded apart from the server's model."""
    return memra.load(memra.default_checkpoint(), max_batch=1, max_len=MAX_LEN, progress=False)


@pytest.fixture(scope="module")
def server():
    model = memra.load(memra.default_checkpoint(), max_batch=8, max_len=MAX_LEN, progress=False)
    with ServerThread(model, served_model_name=NAME, max_waiting=32) as s:
        yield s


def client(server: ServerThread) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=30)


def _metrics(server: ServerThread) -> str:
    return httpx.get(server.url + "/metrics", timeout=10).text


def test_health_models_and_metrics(server: ServerThread) -> None:
    assert httpx.get(server.url + "/health").status_code == 200
    models = client(server).models.list()
    assert [m.id for m in models.data] == [NAME]
    text = _metrics(server)
    assert metric(text, "memra_cache_slots_total") == 8
    for name in ("memra_time_to_first_token_seconds_count", "memra_inter_token_latency_seconds_count",
                 "memra_requests_waiting", "memra_generation_tokens_total"):
        assert name in text


def test_error_responses_are_counted_by_status(server: ServerThread) -> None:
    # /metrics counted only the requests that reached the scheduler: a storm of 429s or 400s
    # left no trace there (a break-it pass of the server, session 30).
    def errors(status: int) -> float:
        return metric(_metrics(server), "memra_http_errors_total", f'status="{status}"')

    before = {s: errors(s) for s in (400, 404, 405)}
    assert post_json(server, "/v1/completions", {"prompt": "x", "max_tokens": -1}).status_code == 400
    assert post_json(server, "/v1/completions", "{not json").status_code == 400
    assert post_json(server, "/v1/completions", {"model": "other", "prompt": "x"}).status_code == 404
    assert httpx.get(server.url + "/v1/completions").status_code == 405
    assert httpx.get(server.url + "/health").status_code == 200  # not an error
    assert {s: errors(s) - before[s] for s in before} == {400: 2, 404: 1, 405: 1}


def test_completion_equals_generate_with_usage(server: ServerThread, ref: memra.Model) -> None:
    tok = ref.tokenizer
    prompt = "The quick brown fox"
    ids = tok.encode(prompt).ids
    r = client(server).completions.create(
        model=NAME, prompt=prompt, max_tokens=12, temperature=0.7, seed=5,
        extra_body={"top_k": 20, "ignore_eos": True, "return_token_ids": True})
    want = ref.generate(ids, 12, temperature=0.7, top_k=20, seed=5, ignore_eos=True)
    c = r.choices[0]
    assert c.token_ids == want
    assert c.text == tok.decode(want, skip_special_tokens=True)
    assert c.finish_reason == "length"
    assert (r.usage.prompt_tokens, r.usage.completion_tokens, r.usage.total_tokens) == (len(ids), 12, len(ids) + 12)
    # A prompt of token ids, greedy, stopping at the checkpoint's EOS when it comes.
    r = client(server).completions.create(model=NAME, prompt=[5, 6, 7], max_tokens=40, temperature=0,
                                          extra_body={"return_token_ids": True})
    want = ref.generate([5, 6, 7], 40)
    assert r.choices[0].token_ids == want
    assert r.choices[0].finish_reason == ("stop" if want[-1] in ref.eos_token_ids else "length")
    assert r.usage.completion_tokens == len(want)


def test_chat_streamed_and_not(server: ServerThread, ref: memra.Model) -> None:
    from memra.serve.chat_template import load_chat_template

    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"}]
    text = load_chat_template(memra.default_checkpoint()).render(messages)
    ids = ref.tokenizer.encode(text, add_special_tokens=False).ids
    want = ref.generate(ids, 10, temperature=0.9, top_p=0.8, seed=11, ignore_eos=True)
    kw = dict(model=NAME, messages=messages, max_tokens=10, temperature=0.9, top_p=0.8, seed=11,
              extra_body={"ignore_eos": True})
    r = client(server).chat.completions.create(**kw)
    assert r.choices[0].message.role == "assistant"
    assert r.choices[0].message.content == ref.tokenizer.decode(want, skip_special_tokens=True)
    assert (r.usage.prompt_tokens, r.usage.completion_tokens) == (len(ids), 10)
    chunks = list(client(server).chat.completions.create(stream=True, stream_options={"include_usage": True}, **kw))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == r.choices[0].message.content
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 10
    assert all(c.usage is None for c in chunks[:-1])
    # vLLM's continuous_usage_stats: every chunk has the usage so far, counted from the tokens'
    # ids (return_token_ids), the last chunk the whole
    cont = list(client(server).chat.completions.create(
        stream=True, stream_options={"include_usage": True, "continuous_usage_stats": True},
        **dict(kw, extra_body={"ignore_eos": True, "return_token_ids": True})))
    assert len(cont) >= 3 and all(c.usage is not None and c.usage.prompt_tokens == len(ids) for c in cont)
    seen = 0
    for c in cont[:-1]:
        seen += len((c.choices[0].model_extra or {}).get("token_ids") or [])
        assert c.usage.completion_tokens == seen and c.usage.total_tokens == len(ids) + seen
    assert cont[0].usage.completion_tokens == 0 and seen == 10 and cont[-1].usage.completion_tokens == 10
    # the prompt's ids once, at the top of the first chunk (vLLM's chat stream)
    assert [(c.model_extra or {}).get("prompt_token_ids") for c in cont] == [ids] + [None] * (len(cont) - 1)
    assert [c.choices[0].stop_reason for c in cont if c.choices] == [None] * (len(cont) - 1)  # length: none
    assert "".join(c.choices[0].delta.content or "" for c in cont if c.choices) == r.choices[0].message.content
    # continuous_usage_stats alone asks for usage (vLLM's include_usage defaults to true); an
    # explicit include_usage false turns both off
    alone = list(client(server).chat.completions.create(
        stream=True, stream_options={"continuous_usage_stats": True}, **kw))
    assert [c.usage.completion_tokens for c in alone][-1] == 10 and all(c.usage for c in alone)
    off = list(client(server).chat.completions.create(
        stream=True, stream_options={"include_usage": False, "continuous_usage_stats": True}, **kw))
    assert all(c.usage is None for c in off)
    # /v1/completions streams it the same way
    comp = list(client(server).completions.create(
        model=NAME, prompt=ids, max_tokens=5, temperature=0, stream=True, extra_body={"ignore_eos": True},
        stream_options={"include_usage": True, "continuous_usage_stats": True}))
    assert all(c.usage.prompt_tokens == len(ids) for c in comp)
    assert [c.usage.completion_tokens for c in comp][-2:] == [5, 5] and comp[-1].choices == []
    raw = httpx.post(server.url + "/v1/chat/completions", json=dict(kw, stream=True, extra_body=None), timeout=30)
    events = [line for line in raw.text.split("\n") if line]
    assert raw.headers["content-type"].startswith("text/event-stream")
    assert all(e.startswith("data: ") for e in events) and events[-1] == "data: [DONE]"


def _stop_case(ref: memra.Model):
    """A greedy continuation and a two-character stop string of printable text spanning two
    tokens of it (its first character is a token's last, its second the next token's first)."""
    ids = ref.tokenizer.encode("Hello there").ids
    out = ref.generate(ids, 60, ignore_eos=True)
    dec = ref.tokenizer.decode
    for k in range(1, len(out) - 1):
        a, b = dec(out[k:k + 1]), dec(out[k + 1:k + 2])
        if len(a) == 1 and len(b) == 1 and (a + b).isprintable() and "\ufffd" not in a + b:
            return ids, out, a + b, k + 2
    pytest.skip("no printable stop string in this continuation")


def test_a_stop_ids_text_is_left_out(server: ServerThread, ref: memra.Model) -> None:
    # vLLM leaves a stop token's text out of the output (its id stays in token_ids) unless
    # include_stop_str_in_output, which memra refuses; memra emitted it (a break-it pass, session 40).
    ids = ref.tokenizer.encode("Hello there").ids
    out = ref.generate(ids, 30, ignore_eos=True)
    dec = ref.tokenizer.decode
    k = next((k for k in range(2, len(out)) if out[k] not in out[:k] and dec(out[k:k + 1]).isalnum()
              and dec(out[:k + 1]) == dec(out[:k]) + dec(out[k:k + 1])), None)
    if k is None:
        pytest.skip("no token with text of its own in this continuation")
    kw = dict(model=NAME, prompt=ids, max_tokens=30, temperature=0,
              extra_body={"ignore_eos": True, "stop_token_ids": [out[k]], "return_token_ids": True})
    r = client(server).completions.create(**kw)
    c = r.choices[0]
    assert c.finish_reason == "stop" and c.token_ids == out[:k + 1]
    assert c.text == dec(out[:k], skip_special_tokens=True) != dec(out[:k + 1], skip_special_tokens=True)
    assert r.usage.completion_tokens == k + 1
    assert c.stop_reason == out[k]  # vLLM's extra: the stop id
    chunks = list(client(server).completions.create(stream=True, **kw))
    assert "".join(ch.choices[0].text for ch in chunks if ch.choices) == c.text
    assert chunks[-1].choices[0].stop_reason == out[k]
    assert [t for ch in chunks if ch.choices for t in (ch.choices[0].token_ids or [])] == out[:k + 1]
    wait_idle(server)


def test_stop_reason_follows_vllms_order() -> None:
    # vLLM: a stop string that matched; else None for EOS (checked before stop_token_ids, unless
    # ignore_eos), the id for a stop_token_ids id; None for length.
    from types import SimpleNamespace as NS

    from memra.serve.handlers import _stop_reason

    state = NS(model=NS(eos_token_ids=[9]))
    text, matched = NS(matched=None), NS(matched="ab")
    assert _stop_reason(state, NS(ignore_eos=False), text, "stop", 9) is None
    assert _stop_reason(state, NS(ignore_eos=True), text, "stop", 9) == 9  # an EOS listed in stop_token_ids
    assert _stop_reason(state, NS(ignore_eos=False), text, "stop", 4) == 4
    assert _stop_reason(state, NS(ignore_eos=False), matched, "stop", 9) == "ab"
    assert _stop_reason(state, NS(ignore_eos=False), text, "length", 4) is None


def test_stop_strings_are_cut_and_never_emitted(server: ServerThread, ref: memra.Model) -> None:
    ids, out, stop, n_tokens = _stop_case(ref)
    assert len(stop) == 2
    full = ref.tokenizer.decode(out, skip_special_tokens=True)
    want = full[:full.index(stop)]
    kw = dict(model=NAME, prompt=ids, max_tokens=60, temperature=0, stop=[stop, "never-seen-zz"],
              extra_body={"ignore_eos": True})
    r = client(server).completions.create(**kw)
    assert r.choices[0].text == want and r.choices[0].finish_reason == "stop"
    assert r.choices[0].stop_reason == stop  # vLLM's extra: the stop string that matched
    # usage counts the tokens generated up to the one completing the stop string
    need = next(j for j in range(1, len(out) + 1) if stop in ref.tokenizer.decode(out[:j], skip_special_tokens=True))
    assert need <= n_tokens and r.usage.completion_tokens == need
    chunks = list(client(server).completions.create(stream=True, **kw))
    pieces = [c.choices[0].text for c in chunks]
    assert "".join(pieces) == want
    assert all(stop not in p for p in pieces)
    assert [c.choices[0].stop_reason for c in chunks] == [None] * (len(chunks) - 1) + [stop]
    wait_idle(server)  # the stop freed the slot


def test_concurrent_streams_equal_generate(server: ServerThread, ref: memra.Model) -> None:
    # 16 streams on 8 slots: requests wait, join between decode steps, and leave at different
    # lengths; each mixes its own temperature / top_k / top_p / seed. Every stream's tokens must
    # be generate()'s for its prompt alone.
    rng = np.random.default_rng(3)
    jobs = []
    for i in range(16):
        prompt = [int(t) for t in rng.integers(0, 256, int(rng.integers(1, 40)))]
        sampling = [dict(temperature=0.0), dict(temperature=0.8, top_k=20),
                    dict(temperature=1.1, top_p=0.9), dict(temperature=0.6, top_k=5, top_p=0.7)][i % 4]
        jobs.append((prompt, int(rng.integers(4, 24)), dict(sampling, seed=100 + i)))
    aclient = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=60)

    async def one(prompt, n, s):
        extra = {"ignore_eos": True, "return_token_ids": True}
        if "top_k" in s:
            extra["top_k"] = s["top_k"]
        stream = await aclient.completions.create(model=NAME, prompt=prompt, max_tokens=n, stream=True,
                                                  temperature=s["temperature"], top_p=s.get("top_p"),
                                                  seed=s["seed"], extra_body=extra)
        got = []
        async for chunk in stream:
            got += chunk.choices[0].token_ids
        return got

    async def run_all():
        try:
            return await asyncio.gather(*(one(*j) for j in jobs))
        finally:
            await aclient.close()

    before = _metrics(server)
    got = asyncio.run(run_all())
    for (prompt, n, s), g in zip(jobs, got):
        assert g == ref.generate(prompt, n, ignore_eos=True, **s), (prompt, n, s)
    text = wait_idle(server)
    # They were decoded together: some steps carried more than four requests.
    steps = metric(text, "memra_decode_batch_rows_count") - metric(before, "memra_decode_batch_rows_count")
    small = metric(text, "memra_decode_batch_rows_bucket", 'le="4.0"') - \
        metric(before, "memra_decode_batch_rows_bucket", 'le="4.0"')
    assert steps > small


def test_client_disconnect_cancels_and_frees_the_slot(server: ServerThread) -> None:
    before = metric(_metrics(server), "memra_requests_total", 'finish_reason="cancelled"')
    stream = client(server).completions.create(model=NAME, prompt=[1, 2, 3], max_tokens=MAX_LEN - 3, stream=True,
                                               extra_body={"ignore_eos": True})
    for _, _chunk in zip(range(3), stream):
        pass
    stream.close()
    text = wait_idle(server)
    assert metric(text, "memra_requests_total", 'finish_reason="cancelled"') == before + 1


def test_a_client_gone_before_its_body_is_read_logs_no_error(server: ServerThread) -> None:
    # It once logged "unhandled error" with a traceback (memra's and uvicorn's) per disconnect.
    records: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    keep = Keep(logging.WARNING)
    loggers = [logging.getLogger(n) for n in ("memra.serve", "uvicorn.error")]
    for lg in loggers:
        lg.addHandler(keep)
    try:
        host, port = server.url.removeprefix("http://").split(":")
        for _ in range(3):
            with socket.create_connection((host, int(port)), timeout=10) as s:
                s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                          b"Content-Length: 1000\r\n\r\n{\"prompt\":")
        time.sleep(0.3)
        assert httpx.get(server.url + "/health", timeout=10).status_code == 200
        time.sleep(0.2)
    finally:
        for lg in loggers:
            lg.removeHandler(keep)
    assert not records, [r.getMessage() for r in records]


@pytest.mark.parametrize("path,body,param,words", [
    ("/v1/completions", '{"model": "tiny", "prompt": [1, 2', None, "malformed JSON"),
    ("/v1/completions", "[1, 2]", None, "JSON object"),
    ("/v1/completions", {"prompt": "x", "max_tokens": "many"}, "max_tokens", "integer"),
    ("/v1/completions", {"prompt": "x", "n": 2}, "n", "n = 1"),
    ("/v1/completions", {"prompt": []}, "prompt", "prompt"),
    ("/v1/completions", {"prompt": [1, 99999]}, "prompt", "99999"),
    ("/v1/completions", {"prompt": ["a", "b"]}, "prompt", "one prompt"),
    ("/v1/completions", {"prompt": "x", "temperature": -1}, "temperature", ">= 0"),
    ("/v1/completions", {"prompt": "x", "top_p": 1.5}, "top_p", "(0, 1]"),
    ("/v1/completions", {"prompt": "x", "stop": 5}, "stop", "string"),
    ("/v1/completions", {"prompt": "x", "stop_token_ids": [-1]}, "stop_token_ids", "-1"),
    ("/v1/completions", {"prompt": "x", "echo": True}, "echo", "not supported"),
    ("/v1/completions", {"prompt": "x", "seed": 2**70}, "seed", "seed"),
    ("/v1/chat/completions", {"messages": []}, "messages", "messages"),
    ("/v1/chat/completions", {"messages": [{"content": "x"}]}, "messages.0.role", "role"),
    ("/v1/chat/completions", {"messages": [{"role": "tool", "content": "x"}]}, "messages", "unknown role"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
     "messages.0.content", "content"),
    # once 500s: int() of a 4301-digit key, json.loads' RecursionError, a template variable
    # named like render's own `self` (the last renders, as a template variable)
    ("/v1/completions", {"prompt": "x", "logit_bias": {"1" * 4301: 0}}, "logit_bias", "token ids"),
    ("/v1/chat/completions", {"messages": [{"role": "assistant", "content": None, "tool_calls": [
        {"type": "function", "function": {"name": "f", "arguments": "[" * 100000}}]}]},
     "messages.0", "nests deeper"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x", "name": 5}]}, "messages.0", "name"),
    ("/v1/chat/completions", {"messages": [{"role": "assistant", "content": "x", "tool_calls": "x"}]},
     "messages.0", "tool_calls must be a list"),
])
def test_bad_requests_are_400s_naming_the_field(server: ServerThread, path, body, param, words) -> None:
    r = post_json(server, path, body)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error"
    assert err["param"] == param or (param and err["param"] and err["param"].startswith(param)), err
    assert words.lower() in err["message"].lower(), err


def test_a_template_variable_named_self_renders(server: ServerThread) -> None:
    r = post_json(server, "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}],
                                                   "max_tokens": 2, "chat_template_kwargs": {"self": 1}})
    assert r.status_code == 200, r.text


def test_a_500_keeps_the_connection(server: ServerThread) -> None:
    """A bug's 500 is an error object and the keep-alive connection serves the next request:
    Starlette's exception_handler(Exception) answered and re-raised, and uvicorn then closed the
    connection under the client's next request."""
    route = next(r for r in server.app.routes if getattr(r, "path", None) == "/v1/models")
    orig = route.app

    async def broken(scope, receive, send):
        raise RuntimeError("a bug")
    route.app = broken
    try:
        with httpx.Client(base_url=server.url, timeout=10) as c:
            r = c.get("/v1/models")
            assert r.status_code == 500 and r.json()["error"]["type"] == "server_error", r.text
            assert "RuntimeError" in r.json()["error"]["message"]
            assert c.get("/health").status_code == 200  # the same connection
            assert c.get("/health").status_code == 200
    finally:
        route.app = orig


def test_unknown_model_route_and_method(server: ServerThread) -> None:
    with pytest.raises(openai.NotFoundError) as info:
        client(server).completions.create(model="gpt-4", prompt="x", max_tokens=2)
    assert info.value.body["code"] == "model_not_found" and info.value.body["param"] == "model"
    r = httpx.get(server.url + "/v1/nothing")
    assert r.status_code == 404 and "error" in r.json()
    r = httpx.get(server.url + "/v1/completions")
    assert r.status_code == 405 and r.headers.get("allow") == "POST", r.headers
    assert r.json()["error"]["type"] == "invalid_request_error"


def test_prompt_plus_max_tokens_beyond_max_len(server: ServerThread) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        client(server).completions.create(model=NAME, prompt=[7] * 250, max_tokens=10)
    msg = info.value.body["message"]
    assert "256" in msg and "260" in msg and "250" in msg and info.value.body["param"] == "max_tokens"
    with pytest.raises(openai.BadRequestError) as info:
        client(server).completions.create(model=NAME, prompt=[7] * 300, max_tokens=1)
    assert info.value.body["param"] == "prompt"


def test_a_full_queue_is_a_429() -> None:
    model = memra.load(memra.default_checkpoint(), max_batch=2, max_len=MAX_LEN, progress=False)
    with ServerThread(model, served_model_name=NAME, max_waiting=1) as server:
        c = client(server)
        long = dict(model=NAME, prompt=[1, 2], max_tokens=MAX_LEN - 2, stream=True, extra_body={"ignore_eos": True})
        running = [c.completions.create(**long) for _ in range(2)]
        for s in running:
            next(iter(s))  # both hold a slot
        queued = threading.Thread(target=lambda: c.completions.create(model=NAME, prompt=[3], max_tokens=2),
                                  daemon=True)
        queued.start()
        end = time.monotonic() + 10
        while metric(_metrics(server), "memra_requests_waiting") < 1:
            assert time.monotonic() < end
            time.sleep(0.01)
        with pytest.raises(openai.RateLimitError) as info:
            c.completions.create(model=NAME, prompt=[4], max_tokens=2)
        assert info.value.status_code == 429 and "max-waiting" in info.value.body["message"]
        for s in running:
            s.close()
        queued.join(30)
        assert not queued.is_alive()
        wait_idle(server)


def test_non_finite_logits_end_the_request_with_an_error(tmp_path, ref: memra.Model) -> None:
    import shutil

    from nan_checkpoint import nan_embedding_row

    prompt = [5, 6, 7]
    first = ref.generate(prompt, 1, ignore_eos=True)[0]
    folder = nan_embedding_row(tmp_path, first)  # feeding `first` makes the next logits NaN
    assert first not in prompt
    model = memra.load(folder, max_batch=4, max_len=MAX_LEN, progress=False)
    with ServerThread(model, served_model_name=NAME) as server:
        c = client(server)
        with pytest.raises(openai.APIStatusError) as info:
            c.completions.create(model=NAME, prompt=prompt, max_tokens=5, temperature=0,
                                 extra_body={"ignore_eos": True})
        assert info.value.status_code == 422 and info.value.body["code"] == memra.errors.NON_FINITE
        assert "NonFiniteError" in info.value.body["message"] and info.value.body["type"] == "non_finite_error"
        got = []
        with pytest.raises(openai.APIError) as info:
            for chunk in c.completions.create(model=NAME, prompt=prompt, max_tokens=5, stream=True, temperature=0,
                                              extra_body={"ignore_eos": True, "return_token_ids": True}):
                got += chunk.choices[0].token_ids
        assert got == [first]  # the token before the non-finite row, then the error event
        assert "NonFiniteError" in str(info.value)
        assert info.value.body["type"] == "non_finite_error", info.value.body
        other = [9, 10, 11, 12]  # a request that never feeds `first` still completes
        want = ref.generate(other, 3, ignore_eos=True)
        if first not in want[:2]:
            r = c.completions.create(model=NAME, prompt=other, max_tokens=3, temperature=0,
                                     extra_body={"ignore_eos": True, "return_token_ids": True})
            assert r.choices[0].token_ids == want
        text = wait_idle(server)
        assert metric(text, "memra_requests_total", 'finish_reason="error"') == 2
    shutil.rmtree(folder)


def test_a_stopped_server_lets_its_model_go() -> None:
    # The routes were closures over the server's state, and FastAPI keeps the endpoints it has
    # analysed in a module-level cache: a stopped server kept its model (on CUDA, its device
    # memory) alive.
    import gc
    import weakref

    model = memra.load(memra.default_checkpoint(), max_batch=1, max_len=64, progress=False)
    with ServerThread(model, served_model_name=NAME) as s:
        assert httpx.get(s.url + f"/v1/models/{NAME}", timeout=10).status_code == 200
        r = post_json(s, "/v1/completions", {"model": NAME, "prompt": "hi", "max_tokens": 2})
        assert r.status_code == 200, r.text
    ref = weakref.ref(model)
    del model, s
    gc.collect()
    assert ref() is None


def test_exiting_with_a_request_running_does_not_abort(tmp_path) -> None:
    # The engine thread is a daemon: the interpreter ended it inside a memra call at exit, which
    # aborted the process ("terminate called without an active exception", SIGABRT). The
    # scheduler now stops and joins it at exit.
    import subprocess
    import sys

    script = tmp_path / "exit.py"
    script.write_text(
        "import sys, threading, time\n"
        f"sys.path.insert(0, {str(Path(__file__).parent)!r})\n"
        "import httpx, memra\n"
        "from serve_helpers import ServerThread\n"
        "m = memra.load(memra.default_checkpoint(), max_batch=2, max_len=4096, progress=False)\n"
        "s = ServerThread(m)\n"
        "def client():\n"
        "    try:\n"
        "        httpx.post(s.url + '/v1/completions', json={'prompt': [1 + i % 250 for i in range(2000)],\n"
        "                   'max_tokens': 2000, 'ignore_eos': True}, timeout=60)\n"
        "    except Exception:\n"
        "        pass\n"
        "threading.Thread(target=client, daemon=True).start()\n"
        "end = time.monotonic() + 30\n"
        "while m.cache.length(0) == 0 and time.monotonic() < end:\n"
        "    time.sleep(0.01)\n"
        "print('exiting with a request running', flush=True)\n")
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, (r.returncode, r.stderr[-2000:])
    assert "exiting with a request running" in r.stdout
    assert "terminate called" not in r.stderr
