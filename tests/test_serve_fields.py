"""``memra serve`` and the vLLM / OpenAI request fields it cannot honour (CPU, loopback), from a
break-it pass of the server (session 23 of 2026-12-05): ``repetition_penalty``, ``min_p``,
``response_format``, guided decoding, ``tool_choice`` and the others of protocol.UNHONOURED and
CHAT_UNHONOURED were ignored in silence (the output was not what they ask for, and nothing said
so). Each is a 400 naming it, unless its value asks for nothing.
"""

from __future__ import annotations

import logging

import pytest

httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

import memra  # noqa: E402
from memra.serve.protocol import CHAT_UNHONOURED, UNHONOURED  # noqa: E402
from serve_helpers import ServerThread, post_json, wait_idle  # noqa: E402

C, H = "/v1/completions", "/v1/chat/completions"
PROMPT = {"prompt": [1, 2, 3], "max_tokens": 1}
CHAT = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1}

# a value of each field that asks for something memra would not do
ASKS = {
    "repetition_penalty": 1.2, "min_p": 0.1, "min_tokens": 4, "use_beam_search": True,
    "include_stop_str_in_output": True, "skip_special_tokens": False, "truncate_prompt_tokens": 2,
    "prompt_logprobs": 0, "allowed_token_ids": [1, 2], "bad_words": ["x"],
    "response_format": {"type": "json_object"}, "guided_json": {"type": "object"}, "guided_regex": "a+",
    "guided_choice": ["a", "b"], "guided_grammar": "root ::= 'a'", "structural_tag": "{}",
    "structured_outputs": {"json": {}},
    "tool_choice": "required", "functions": [{"name": "f", "parameters": {}}], "function_call": {"name": "f"},
    "echo": True, "chat_template": "{{ messages }}",
}
# values that ask for nothing: served as if absent
NOTHING = dict(repetition_penalty=1, min_p=0.0, min_tokens=0, use_beam_search=False,
               include_stop_str_in_output=False, skip_special_tokens=True, bad_words=[],
               response_format={"type": "text"}, guided_json=None, structural_tag=None)
CHAT_NOTHING = dict(NOTHING, tool_choice="none", functions=[], function_call="auto", echo=False, chat_template=None)


@pytest.fixture(scope="module")
def server():
    model = memra.load(memra.default_checkpoint(), max_batch=2, max_len=64, progress=False)
    with ServerThread(model, served_model_name="tiny") as s:
        yield s


def test_every_field_has_a_value_asking_for_something() -> None:
    assert set(ASKS) == set(UNHONOURED) | set(CHAT_UNHONOURED)


@pytest.mark.parametrize("path,name", [(C, n) for n in UNHONOURED] + [(H, n) for n in [*UNHONOURED, *CHAT_UNHONOURED]])
def test_a_field_memra_cannot_honour_is_a_400_naming_it(server, path, name) -> None:
    body = dict(PROMPT if path == C else CHAT, **{name: ASKS[name]})
    r = post_json(server, path, body)
    assert r.status_code == 400, (name, r.text)
    err = r.json()["error"]
    assert err["param"] == name and "not supported by memra" in err["message"], err


def test_values_asking_for_nothing_are_served(server) -> None:
    for path, body in ((C, dict(PROMPT, **NOTHING)), (H, dict(CHAT, **CHAT_NOTHING))):
        r = post_json(server, path, body)
        assert r.status_code == 200, r.text
    # a chat-only field on /v1/completions is unknown there, ignored as vLLM does
    assert post_json(server, C, dict(PROMPT, tool_choice="required")).status_code == 200
    # logit_bias of zeros changes no logit (OpenAI's clients send {} or zeros); any other is refused
    for path, body in ((C, PROMPT), (H, CHAT)):
        assert post_json(server, path, dict(body, logit_bias={"5": 0, "7": 0.0})).status_code == 200
        r = post_json(server, path, dict(body, logit_bias={"5": 0, "7": -100}))
        assert r.status_code == 400 and r.json()["error"]["param"] == "logit_bias", r.text
        # the keys are token ids of this vocabulary (as vLLM checks them), zeros or not
        for key, words in (("abc", "token ids"), ("-1", "token ids"), ("99999999", "outside the vocabulary")):
            r = post_json(server, path, dict(body, logit_bias={key: 0}))
            assert r.status_code == 400 and r.json()["error"]["param"] == "logit_bias", r.text
            assert words in r.json()["error"]["message"], r.text
    # a boolean is not the number 1
    r = post_json(server, C, dict(PROMPT, repetition_penalty=True))
    assert r.status_code == 400 and r.json()["error"]["param"] == "repetition_penalty", r.text
    wait_idle(server)


def test_unknown_fields_are_served_and_named_in_a_warning(server, caplog) -> None:
    """A field memra does not know is ignored, as vLLM ignores it, and named in a warning (as
    vLLM logs "fields were present in the request but ignored"); at most 8 names a line."""
    many = {f"x{i:02d}": i for i in range(12)}
    with caplog.at_level(logging.WARNING, logger="memra.serve"):
        assert post_json(server, C, dict(PROMPT, frobnicate=1, user_tag="a")).status_code == 200
        assert post_json(server, H, dict(CHAT, **many)).status_code == 200
        assert post_json(server, C, PROMPT).status_code == 200
    lines = [r.getMessage() for r in caplog.records if "does not know" in r.getMessage()]
    assert lines == [
        "/v1/completions: request fields memra does not know were ignored: 'frobnicate', 'user_tag'",
        "/v1/chat/completions: request fields memra does not know were ignored: "
        + ", ".join(repr(f"x{i:02d}") for i in range(8)) + " and 4 more",
    ], lines
    wait_idle(server)
