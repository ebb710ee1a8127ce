"""``memra serve``'s request checks at their edges (CPU, loopback), from a fuzz pass of the
server: strict JSON types, ``null`` for a defaulted field, the bounds on stop strings and on the
body, prompts that cannot fit a slot refused before they are tokenized, chat template variables
that would collide with the request's own fields, and the model routes OpenAI's client uses.
Every refusal is a 400 (413 for the body, 415 for a body not declared JSON) naming the field, and nothing is scheduled.
"""

from __future__ import annotations

import json
import types

import pytest

httpx = pytest.importorskip("httpx")
openai = pytest.importorskip("openai")
pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

import memra  # noqa: E402
import memra.serve  # noqa: E402
from serve_helpers import ServerThread, post_json, wait_idle  # noqa: E402

NAME = "tiny"
MAX_LEN = 256
CHAT = {"messages": [{"role": "user", "content": "Hi"}]}


@pytest.fixture(scope="module")
def model() -> memra.Model:
    return memra.load(memra.default_checkpoint(), max_batch=2, max_len=MAX_LEN, progress=False)


@pytest.fixture(scope="module")
def server(model):
    with ServerThread(model, served_model_name=NAME) as s:
        yield s


C, H = "/v1/completions", "/v1/chat/completions"


@pytest.mark.parametrize("path,body,param,words", [
    # JSON's own types, not coerced
    (C, {"prompt": "x", "stream": "yes"}, "stream", "boolean"),
    (C, {"prompt": "x", "max_tokens": True}, "max_tokens", "integer"),
    (C, {"prompt": "x", "max_tokens": "3"}, "max_tokens", "integer"),
    (C, {"prompt": "x", "temperature": True}, "temperature", "number"),
    (C, {"prompt": "x", "ignore_eos": "yes"}, "ignore_eos", "boolean"),
    (C, {"prompt": "x", "stop_token_ids": [True]}, "stop_token_ids.0", "integer"),
    (C, {"prompt": "x", "stream": True, "stream_options": {"include_usage": 1}}, "stream_options.include_usage",
     "boolean"),
    (H, dict(CHAT, logprobs=0), "logprobs", "boolean"),
    # a bound past 2**63 stated exactly (not rounded through a float), the value as an int or
    # as a float with a zero fraction alike
    (C, {"prompt": "x", "seed": 2**64}, "seed", "less than 18446744073709551616"),
    (C, {"prompt": "x", "seed": 1e300}, "seed", "less than 18446744073709551616"),
    # fields memra would otherwise ignore in silence
    (C, {"prompt": "x", "logprobs": 0}, "logprobs", "not supported"),
    (C, {"prompt": "x", "stream_options": {"include_usage": True}}, "stream_options", "only with stream = true"),
    (H, dict(CHAT, stream=False, stream_options={"include_usage": True}), "stream_options",
     "only with stream = true"),
    # stop strings: a bounded list of bounded strings
    (C, {"prompt": "x", "stop": ["a"] * 65}, "stop", "at most 64"),
    (C, {"prompt": "x", "stop": ["a" * 1025]}, "stop", "1024"),
    # prompts and message content, the part at fault named
    (C, {"prompt": [["a"]]}, "prompt", "a list holding one of those"),
    (C, {"prompt": [[1, 2], [3]]}, "prompt", "one prompt per request, got 2"),
    (C, {"prompt": None}, "prompt", "prompt must be"),
    (H, {"messages": [{"role": "user", "content": [{"type": "text"}]}]}, "messages.0.content",
     'got a text part without "text"'),
    (H, {"messages": [{"role": "user", "content": [{"type": "text", "text": 5}]}]}, "messages.0.content",
     'got "text" of type int'),
    (H, {"messages": [{"role": "user", "content": ["hi"]}]}, "messages.0.content", "got a str"),
    (H, {"messages": [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "image_url"}]}]},
     "messages.0.content", "part 1 must be"),
    (H, {"messages": [{"role": "user", "content": 5}]}, "messages.0.content", "content must be"),
    # chat template variables that are the request's own fields
    (H, dict(CHAT, chat_template_kwargs={"messages": []}), "chat_template_kwargs", "messages field"),
    (H, dict(CHAT, chat_template_kwargs={"add_generation_prompt": "no"}), "chat_template_kwargs",
     "true, false or null"),
    # a sampler value that rounds to nothing as a float32
    (C, {"prompt": "x", "top_p": 1e-46}, "top_p", "rounds to 0"),
    # a field whose only value is null says so once (it read "only null, or null")
    (C, {"prompt": "x", "guided_json": {}}, "guided_json", "(only null)"),
    (C, {"prompt": "x", "bad_words": ["a"]}, "bad_words", "(only [], or null)"),
])
def test_bad_fields_are_400s_naming_them(server, path, body, param, words) -> None:
    r = post_json(server, path, body)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" and err["param"] == param, err
    assert words in err["message"], err
    wait_idle(server)


def test_a_lone_surrogate_is_named_in_the_json_error(server) -> None:
    r = post_json(server, C, '{"prompt": "\\ud800"}')
    assert r.status_code == 400 and "lone surrogate" in r.json()["error"]["message"], r.text


def test_null_means_the_default(server, model) -> None:
    nulls = dict(n=None, stream=None, presence_penalty=None, frequency_penalty=None, echo=None, stop=None,
                 stop_token_ids=None, ignore_eos=None, return_token_ids=None, best_of=None, seed=None)
    r = post_json(server, C, dict(prompt=[1, 2, 3], max_tokens=3, temperature=0, **nulls))
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] <= 3
    r = post_json(server, H, dict(CHAT, max_tokens=2, temperature=0, add_generation_prompt=None, **nulls))
    assert r.status_code == 200, r.text
    r = post_json(server, C, dict(prompt=[1, 2], max_tokens=2, stream=True, stream_options={"include_usage": None}))
    assert r.status_code == 200 and '"usage"' not in r.text, r.text
    # max_tokens null on /v1/completions is OpenAI's default of 16
    r = post_json(server, C, dict(prompt=[1, 2, 3], temperature=0, max_tokens=None, ignore_eos=True))
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 16, r.text


def test_a_number_with_a_zero_fraction_is_that_integer(server) -> None:
    # JSON has one number type: 4.0 is 4 (a client computing a count in floating point sends it
    # so), the same request and the same tokens as with integers; 4.5 stays a 400.
    ints = dict(prompt=[1, 2, 3], max_tokens=4, temperature=0, ignore_eos=True, seed=7, top_k=5,
                stop_token_ids=[260], return_token_ids=True)
    floats = dict(ints, prompt=[1.0, 2.0, 3.0], max_tokens=4.0, seed=7.0, top_k=5.0, stop_token_ids=[260.0])
    a, b = post_json(server, C, ints), post_json(server, C, floats)
    assert a.status_code == b.status_code == 200, (a.text, b.text)
    assert a.json()["choices"][0]["token_ids"] == b.json()["choices"][0]["token_ids"]
    assert b.json()["usage"]["completion_tokens"] == 4
    r = post_json(server, H, dict(CHAT, max_completion_tokens=2.0, temperature=0))
    assert r.status_code == 200, r.text
    for body, param in ((dict(ints, max_tokens=4.5), "max_tokens"), (dict(ints, prompt=[1.5]), "prompt")):
        r = post_json(server, C, body)
        assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text


def test_add_generation_prompt_in_the_template_kwargs_wins(server) -> None:
    def prompt_ids(**fields) -> list[int]:
        r = post_json(server, H, dict(CHAT, max_tokens=1, temperature=0, return_token_ids=True, **fields))
        assert r.status_code == 200, r.text
        return r.json()["prompt_token_ids"]

    with_prompt, without = prompt_ids(), prompt_ids(add_generation_prompt=False)
    assert with_prompt != without, "the tiny checkpoint's template must add a generation prompt"
    assert prompt_ids(chat_template_kwargs={"add_generation_prompt": False}) == without
    assert prompt_ids(add_generation_prompt=False, chat_template_kwargs={"add_generation_prompt": True}) \
        == with_prompt
    assert prompt_ids(add_generation_prompt=False, chat_template_kwargs={"add_generation_prompt": None}) == without


def test_the_token_bound_holds_only_where_it_is_one(model) -> None:
    # max_token_chars is a bound only for a byte-level BPE whose every byte becomes a token
    # character: another pre-tokenizer (Whitespace drops the spaces) or an added token that
    # strips the whitespace beside it can make a long text a few tokens.
    from tokenizers import AddedToken, Tokenizer, pre_tokenizers

    from memra.serve.handlers import max_token_chars

    base = model.tokenizer.to_str()
    assert max_token_chars(Tokenizer.from_str(base)) is not None
    ws = Tokenizer.from_str(base)
    ws.pre_tokenizer = pre_tokenizers.Whitespace()
    assert len(ws.encode("a" + " " * 5000 + "b").ids) < 5001 // 13  # what a bound of 13 would refuse
    assert max_token_chars(ws) is None
    strip = Tokenizer.from_str(base)
    strip.add_special_tokens([AddedToken("<mask>", lstrip=True, rstrip=True)])
    assert len(strip.encode("a" + " " * 5000 + "<mask>" + " " * 5000 + "b").ids) < 10007 // 13
    assert max_token_chars(strip) is None


def test_a_prompt_with_no_room_left_says_so(server, model) -> None:
    ids = [7] * MAX_LEN
    r = post_json(server, C, {"prompt": ids, "max_tokens": None})  # null: 16, beyond the slot
    assert r.status_code == 400 and r.json()["error"]["param"] == "prompt", r.text
    text = "hello " * 200
    n = len(model.tokenizer.encode(text).ids)
    assert n >= MAX_LEN, "the chat prompt must fill the slot"
    r = post_json(server, H, {"messages": [{"role": "user", "content": text}]})  # max_tokens absent
    err = r.json()["error"]
    assert r.status_code == 400 and err["param"] == "messages", r.text
    assert "leaves no room" in err["message"] and "-" not in err["message"].split("However")[1], err


def test_a_prompt_too_long_for_any_tokens_is_refused_before_tokenizing(server, model) -> None:
    from memra.serve.handlers import max_token_chars

    per = max_token_chars(model.tokenizer)
    assert per is not None, "the tiny checkpoint's tokenizer is byte-level BPE: its tokens are bounded"
    text = "x" * (per * MAX_LEN + 1)
    r = post_json(server, C, {"prompt": text, "max_tokens": 1})
    err = r.json()["error"]
    assert r.status_code == 400 and err["param"] == "prompt" and "characters are at least" in err["message"], r.text
    r = post_json(server, H, {"messages": [{"role": "user", "content": text}], "max_tokens": 1})
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages", r.text
    # Just under the bound the prompt is tokenized, and refused by its real count.
    r = post_json(server, C, {"prompt": "x" * (per * MAX_LEN), "max_tokens": 1})
    err = r.json()["error"]
    assert r.status_code == 400 and "in the prompt" in err["message"], r.text


@pytest.mark.parametrize("ctype,status", [
    ("text/plain;charset=UTF-8", 415), ("application/x-www-form-urlencoded", 415), ("multipart/form-data", 415),
    ("text/json", 415), ("text/foo+json", 415), ("application/json-seq", 415), ("application/xjson", 415),
    ("application/json", 200), ("application/json; charset=utf-8", 200), ("application/json ; charset=utf-8", 200),
    ("Application/JSON", 200), ("application/vnd.api+json", 200), (None, 200)])
@pytest.mark.parametrize("path", [C, H])
def test_a_body_not_declared_json_is_a_415(server, path, ctype, status) -> None:
    # A fuzz pass: a text/plain or form POST (what a browser page may send to any host without a
    # CORS preflight) was parsed as JSON and generated; FastAPI and so vLLM refuse it too. No
    # Content-Type at all is read as JSON, as FastAPI reads it.
    body = json.dumps({"prompt": "Hi", "max_tokens": 1} if path == C else {**CHAT, "max_tokens": 1})
    headers = {} if ctype is None else {"Content-Type": ctype}
    r = httpx.post(server.url + path, content=body.encode(), headers=headers, timeout=30)
    assert r.status_code == status, r.text
    if status == 415:
        err = r.json()["error"]
        assert err["code"] == "unsupported_media_type" and "application/json" in err["message"], r.text
        assert ctype.split(";")[0] in err["message"]
    wait_idle(server)


def test_the_content_type_is_refused_before_the_body_is_read(model) -> None:
    # FastAPI's rule (fastapi/routing.py: main type application, subtype json or *+json), and
    # a body that is not JSON is refused before any of it is read: 415, not the size's 413.
    with ServerThread(model, served_model_name=NAME, max_request_bytes=4096) as s:
        r = httpx.post(s.url + C, content=b"y" * 5000, headers={"Content-Type": "text/plain"}, timeout=30)
        assert r.status_code == 415, r.text


def test_a_body_over_the_limit_is_a_413_read_no_further(model) -> None:
    with ServerThread(model, served_model_name=NAME, max_request_bytes=4096) as s:
        body = json.dumps({"prompt": "y" * 5000, "max_tokens": 1}).encode()
        r = post_json(s, C, body)
        assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large", r.text
        assert "4096" in r.json()["error"]["message"]

        def chunks():  # no Content-Length: counted as it arrives
            for i in range(0, len(body), 1000):
                yield body[i:i + 1000]

        r = httpx.post(s.url + C, content=chunks(), headers={"Content-Type": "application/json"}, timeout=30)
        assert r.status_code == 413, r.text
        r = post_json(s, C, {"prompt": "y", "max_tokens": 1})
        assert r.status_code == 200, r.text
    with pytest.raises(memra.ContractError, match="max_request_bytes"):
        ServerThread(model, max_request_bytes=0)


@pytest.mark.parametrize("kwargs,name", [
    (dict(max_waiting="3"), "max_waiting"), (dict(max_waiting=1.5), "max_waiting"),
    (dict(max_waiting=-1), "max_waiting"), (dict(prefill_budget="x"), "prefill_budget"),
    (dict(prefill_budget=0), "prefill_budget"), (dict(prefill_budget=True), "prefill_budget"),
])
def test_create_app_names_a_bad_queue_or_budget(model, kwargs, name) -> None:
    # Taken as they were, "3" failed every request with a 500, "x" left a request waiting
    # forever on the scheduler thread, and a budget of 0 admitted nobody while others ran.
    from memra.serve import create_app

    with pytest.raises(memra.ContractError, match=name) as info:
        create_app(model, NAME, **kwargs)
    assert info.value.code == 40025


@pytest.mark.parametrize("args,name", [
    ((None,), "model"), (("x",), "model"), ((memra.default_checkpoint(),), "model"),
    (("MODEL", 5), "served_model_name"), (("MODEL", ""), "served_model_name"),
    (("MODEL", b"x"), "served_model_name"),
])
def test_create_app_names_a_bad_model_or_name(model, args, name) -> None:
    # Each was an AttributeError (not a model) or a model id that is not a string in every
    # response (a name of another type).
    from memra.serve import create_app

    args = tuple(model if a == "MODEL" else a for a in args)
    with pytest.raises(memra.ContractError, match=name) as info:
        create_app(*args)
    assert info.value.code == 40025


@pytest.mark.parametrize("given", [".", "./", "data/../data/tiny_glm5_next/.", "link"])
def test_the_default_name_is_the_folders_as_resolved(tmp_path, monkeypatch, given) -> None:
    # `memra serve .` served the model id "" (Path(".").name): clients naming the folder got 404.
    # A link keeps the name the user gave.
    folder = memra.default_checkpoint()
    if given == "link":
        (tmp_path / "my-model").symlink_to(folder)
        monkeypatch.chdir(tmp_path)
        given, want = "my-model", "my-model"
    else:
        monkeypatch.chdir(folder if given.startswith(".") else folder.parent.parent)
        want = folder.name
    model = memra.load(given, max_batch=1, max_len=32, progress=False)
    with ServerThread(model) as s:
        assert [m["id"] for m in httpx.get(s.url + "/v1/models").json()["data"]] == [want]


@pytest.mark.parametrize("kwargs,name", [
    (dict(host=1), "host"), (dict(host=""), "host"), (dict(port="x"), "port"),
    (dict(port=-1), "port"), (dict(port=70000), "port"), (dict(log_level="nope"), "log_level"),
    (dict(max_waiting="3"), "max_waiting"),
])
def test_run_names_a_bad_host_port_or_level(model, kwargs, name, monkeypatch) -> None:
    # uvicorn took each as it came (a port of "x" or -1, an unknown level) and failed later,
    # or served on a port nobody asked for; now nothing is served.
    from memra.serve import run

    served = []
    monkeypatch.setattr(memra.serve, "server", lambda app, config: types.SimpleNamespace(
        run=lambda: served.append(config)))
    with pytest.raises(memra.ContractError, match=name) as info:
        run(model, **kwargs)
    assert info.value.code == 40025 and not served


def test_run_takes_a_logging_level_number(model, monkeypatch) -> None:
    # uvicorn takes logging's numbers as well as its names.
    import logging

    from memra.serve import run

    served = []
    monkeypatch.setattr(memra.serve, "server", lambda app, config: types.SimpleNamespace(
        run=lambda: served.append(config)))
    run(model, log_level=logging.DEBUG)
    assert served and served[0].log_level == logging.DEBUG
    with pytest.raises(memra.ContractError, match="log_level"):
        run(model, log_level=True)


def test_health_head_and_the_model_card(server) -> None:
    assert httpx.head(server.url + "/health").status_code == 200
    c = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=30)
    card = c.models.retrieve(NAME)
    assert card.id == NAME and card.object == "model"
    with pytest.raises(openai.NotFoundError) as info:
        c.models.retrieve("gpt-4")
    assert info.value.body["code"] == "model_not_found"
