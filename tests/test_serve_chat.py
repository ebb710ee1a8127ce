"""``memra serve``'s chat prompts at their edges (CPU, loopback), from a break-it pass of the
server (session 23 of 2026-12-05): a conversation ending in an assistant message that the model
is to continue (vLLM's ``continue_final_message``, transformers' marker-and-cut rendering).
"""

from __future__ import annotations

import pytest

httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
pytest.importorskip("jinja2")

import memra  # noqa: E402
from memra.serve.chat_template import ChatTemplate, load_chat_template  # noqa: E402
from serve_helpers import ServerThread, post_json, wait_idle  # noqa: E402

H = "/v1/chat/completions"
PREFILL = [{"role": "user", "content": "Name a colour."}, {"role": "assistant", "content": "The colour is"}]


@pytest.fixture(scope="module")
def model() -> memra.Model:
    return memra.load(memra.default_checkpoint(), max_batch=2, max_len=128, progress=False)


@pytest.fixture(scope="module")
def server(model):
    with ServerThread(model, served_model_name="tiny") as s:
        yield s


def _continued(template: ChatTemplate, messages: list[dict]) -> str:
    """The whole rendering without a generation prompt, cut right after the last content."""
    whole = template.render(messages, add_generation_prompt=False)
    final = messages[-1]["content"]
    return whole[: whole.rindex(final) + len(final)]


def test_continue_final_message_ends_the_prompt_inside_the_last_message() -> None:
    template = load_chat_template(memra.default_checkpoint())
    text = template.render(PREFILL, add_generation_prompt=False, continue_final_message=True)
    assert text == _continued(template, PREFILL) and text.endswith("The colour is"), text
    # the same text twice in the conversation: the last one is continued
    twice = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hi"}]
    assert template.render(twice, add_generation_prompt=False, continue_final_message=True) == \
        _continued(template, twice)
    # content as text parts (a template that reads them): the last text part is continued
    reads_parts = ChatTemplate("{% for m in messages %}{% for p in m['content'] %}<{{ p['text'] }}>{% endfor %}"
                               "{% endfor %}")
    parts = [{"role": "assistant", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]
    assert reads_parts.render(parts, add_generation_prompt=False, continue_final_message=True) == "<a><b"
    # a template that trims the content cuts its trailing spacing too (transformers)
    trims = ChatTemplate("{% for m in messages %}[{{ m['content'] | trim }}]{% endfor %}")
    spaced = [{"role": "assistant", "content": "go  "}]
    assert trims.render(spaced, add_generation_prompt=False, continue_final_message=True) == "[go"


def test_continue_final_message_refusals_are_named() -> None:
    template = load_chat_template(memra.default_checkpoint())
    with pytest.raises(memra.ContractError, match="add_generation_prompt"):
        template.render(PREFILL, add_generation_prompt=True, continue_final_message=True)
    with pytest.raises(memra.ContractError, match="no \"content\""):
        template.render([{"role": "assistant"}], add_generation_prompt=False, continue_final_message=True)
    drops = ChatTemplate("{% for m in messages %}{{ m['role'] }}{% if m['content'] %}!{% endif %}{% endfor %}")
    with pytest.raises(memra.ContractError, match="does not appear"):
        drops.render(PREFILL, add_generation_prompt=False, continue_final_message=True)


def test_the_server_continues_the_final_message(server, model) -> None:
    template = load_chat_template(memra.default_checkpoint())
    want = model.tokenizer.encode(_continued(template, PREFILL), add_special_tokens=False).ids

    def prompt_ids(**fields) -> list[int]:
        r = post_json(server, H, dict(messages=PREFILL, max_tokens=2, temperature=0, return_token_ids=True,
                                      **fields))
        assert r.status_code == 200, r.text
        return r.json()["prompt_token_ids"]

    assert prompt_ids(add_generation_prompt=False, continue_final_message=True) == want
    # in the template kwargs, as vLLM takes them there too
    assert prompt_ids(chat_template_kwargs={"add_generation_prompt": False, "continue_final_message": True}) == want
    assert prompt_ids(add_generation_prompt=False) != want  # without it the message is closed
    # with a generation prompt (the default) it is vLLM's 400, naming the field
    r = post_json(server, H, dict(messages=PREFILL, max_tokens=2, continue_final_message=True))
    assert r.status_code == 400 and r.json()["error"]["param"] == "continue_final_message", r.text
    r = post_json(server, H, dict(messages=PREFILL, max_tokens=2, chat_template_kwargs={"continue_final_message": 1}))
    assert r.status_code == 400 and r.json()["error"]["param"] == "chat_template_kwargs", r.text
    wait_idle(server)


# An assistant turn that called a tool, as OpenAI clients send it back: arguments a JSON string.
TOOL_TURN = [{"role": "user", "content": "Weather?"},
             {"role": "assistant", "content": None, "tool_calls": [
                 {"id": "c1", "type": "function",
                  "function": {"name": "weather", "arguments": '{"city": "Oslo", "days": 2}'}},
                 {"id": "c2", "type": "function", "function": {"name": "now", "arguments": ""}}]}]


def test_tool_call_arguments_reach_the_template_as_mappings() -> None:
    from memra.serve.protocol import ChatCompletionRequest

    # GLM's chat templates iterate a call's arguments as a mapping (arguments.items()), as
    # transformers' documentation asks; vLLM parses OpenAI's JSON strings for them.
    glm_like = ChatTemplate(
        "{% for m in messages %}{% for tc in m.get('tool_calls', []) %}<{{ tc.function.name }}>"
        "{% for k, v in tc.function.arguments.items() %}{{ k }}={{ v }};{% endfor %}{% endfor %}{% endfor %}")
    req = ChatCompletionRequest.model_validate({"messages": TOOL_TURN})
    msgs = [m.as_template_dict() for m in req.messages]
    assert glm_like.render(msgs, add_generation_prompt=False) == "<weather>city=Oslo;days=2;<now>"
    # the request itself keeps OpenAI's strings (the parse is the template's copy)
    assert req.messages[1].model_extra["tool_calls"][0]["function"]["arguments"] == '{"city": "Oslo", "days": 2}'
    # a user message's extra keys are not touched; arguments already a mapping pass as they are
    as_dict = [TOOL_TURN[0], dict(TOOL_TURN[1], tool_calls=[{"function": {"name": "f", "arguments": {"a": 1}}}])]
    msgs = [m.as_template_dict() for m in ChatCompletionRequest.model_validate({"messages": as_dict}).messages]
    assert msgs[1]["tool_calls"][0]["function"]["arguments"] == {"a": 1}
    # an empty list of calls is no calls (vLLM drops it): `is defined` tests in templates agree
    empty = [TOOL_TURN[0], dict(TOOL_TURN[1], content="ok", tool_calls=[])]
    msgs = [m.as_template_dict() for m in ChatCompletionRequest.model_validate({"messages": empty}).messages]
    assert "tool_calls" not in msgs[1] and msgs[1]["content"] == "ok"


def test_a_null_or_absent_content_reaches_the_template_as_an_empty_string() -> None:
    # vLLM's server renders a null (or absent) content as "" and drops a null name: with the
    # content as None, "{{ message.content }}" wrote "None" into the prompt (the OpenAI SDK sends
    # "content": null beside an assistant's tool_calls).
    from memra.serve.protocol import ChatCompletionRequest

    probe = ChatTemplate("{% for m in messages %}[{{ m.content }}|{{ m.content is string }}|"
                         "{{ m.name is defined }}]{% endfor %}")
    sent = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": None, "name": None},
            {"role": "assistant", "tool_calls": None}, {"role": "user", "content": "x", "name": "bo"}]
    msgs = [m.as_template_dict() for m in ChatCompletionRequest.model_validate({"messages": sent}).messages]
    assert probe.render(msgs, add_generation_prompt=False) == "[hi|True|False][|True|False][|True|False][x|True|True]"


def test_tool_call_arguments_that_are_no_json_are_a_400(server) -> None:
    bad = [TOOL_TURN[0], dict(TOOL_TURN[1], tool_calls=[{"function": {"name": "f", "arguments": "{city: Oslo"}}])]
    r = post_json(server, H, dict(messages=bad, max_tokens=2))
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == "messages.1" and "tool_calls[0].function.arguments is not JSON" in err["message"], err
    bad[1]["tool_calls"][0]["function"]["arguments"] = 7
    r = post_json(server, H, dict(messages=bad, max_tokens=2))
    assert r.status_code == 400 and "must be a JSON object or a string holding one" in r.json()["error"]["message"], r.text
    # JSON, but not an object: a template iterating .items() could not take it
    for args in ("[1, 2]", "null", "42", [1, 2]):
        bad[1]["tool_calls"][0]["function"]["arguments"] = args
        r = post_json(server, H, dict(messages=bad, max_tokens=2))
        assert r.status_code == 400 and "must be a JSON object" in r.json()["error"]["message"], (args, r.text)
    # the well-formed turn renders (the tiny template prints content only) and generates
    r = post_json(server, H, dict(messages=TOOL_TURN + [{"role": "user", "content": "And?"}], max_tokens=2))
    assert r.status_code == 200, r.text
    wait_idle(server)
