"""The request bounds of memra serve at their edges, without HTTP (memra.serve.protocol and
memra.serve.handlers._request on a stand-in model): the HTTP tests refuse values far past each
bound, and mutation testing (docs/testing_mutations.md, Python layer) found the edges unchecked.

References: the bounds as protocol.py documents them (MAX_STOP stop strings of MAX_STOP_CHARS
characters, empty ones ignored as TextStream ignores them), vLLM's ChatCompletionRequest
(``max_completion_tokens or max_tokens``: the newer field wins) and its default completion
length (the context left after the prompt: max_model_len - prompt tokens).
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

pytest.importorskip("pydantic")
pytest.importorskip("fastapi")

from pydantic import ValidationError  # noqa: E402

from memra.serve.handlers import APIError, _request  # noqa: E402
from memra.serve.protocol import (MAX_STOP, MAX_STOP_CHARS, ChatCompletionRequest,  # noqa: E402
                                  CompletionRequest)

CHAT = {"messages": [{"role": "user", "content": "Hi"}]}


def _completion(**fields) -> CompletionRequest:
    return CompletionRequest.model_validate({"prompt": [1, 2], **fields})


def test_the_most_stop_strings_of_the_longest_length_are_taken() -> None:
    assert MAX_STOP == 64 and MAX_STOP_CHARS == 1024
    assert _completion(stop=["a"] * MAX_STOP).stop == ["a"] * MAX_STOP
    assert _completion(stop=["b" * MAX_STOP_CHARS]).stop == ["b" * MAX_STOP_CHARS]
    with pytest.raises(ValidationError, match="at most 64"):
        _completion(stop=["a"] * (MAX_STOP + 1))
    with pytest.raises(ValidationError, match="1024"):
        _completion(stop=["b" * (MAX_STOP_CHARS + 1)])


def test_empty_stop_strings_are_dropped_before_they_are_counted() -> None:
    # An empty stop string can never end a text (TextStream ignores it); it takes no place in
    # the bound either.
    assert _completion(stop=["", "x", ""]).stop == ["x"]
    assert _completion(stop="").stop == []
    assert _completion(stop=[""] * 10 + ["a"] * MAX_STOP).stop == ["a"] * MAX_STOP


def test_max_completion_tokens_wins_over_max_tokens() -> None:
    both = ChatCompletionRequest.model_validate({**CHAT, "max_tokens": 5, "max_completion_tokens": 2})
    assert both.max_tokens == 2
    assert ChatCompletionRequest.model_validate({**CHAT, "max_completion_tokens": 3}).max_tokens == 3
    assert ChatCompletionRequest.model_validate({**CHAT, "max_tokens": 4}).max_tokens == 4
    assert ChatCompletionRequest.model_validate(CHAT).max_tokens is None


def _state(max_len: int) -> SimpleNamespace:
    model = SimpleNamespace(cache=SimpleNamespace(max_len=max_len), tokenizer=None, eos_token_ids=[0],
                            config=SimpleNamespace(vocab_size=100))
    return SimpleNamespace(model=model, default_temperature=1.0, default_top_p=None, default_top_k=None)


@pytest.mark.parametrize("prompt_len", [1, 3, 9])
def test_a_chat_without_max_tokens_may_fill_the_context(prompt_len) -> None:
    # vLLM: max_tokens absent = max_model_len - prompt tokens, so prompt + completion = max_len.
    body = ChatCompletionRequest.model_validate(CHAT)
    req = _request(_state(10), body, list(range(1, prompt_len + 1)), "messages")
    assert req.max_tokens == 10 - prompt_len


def test_a_prompt_filling_the_context_leaves_no_room_without_max_tokens() -> None:
    with pytest.raises(APIError, match="no room") as info:
        _request(_state(10), ChatCompletionRequest.model_validate(CHAT), list(range(1, 11)), "messages")
    assert info.value.status == 400 and info.value.param == "messages"


@pytest.mark.parametrize("prompt_len,max_tokens,ok", [(3, 7, True), (3, 8, False), (9, 1, True), (10, 1, False)])
def test_prompt_plus_max_tokens_must_fit_max_len(prompt_len, max_tokens, ok) -> None:
    # OpenAI / vLLM: prompt tokens + max_tokens <= the context length
    body = _completion(max_tokens=max_tokens)
    if ok:
        assert _request(_state(10), body, list(range(1, prompt_len + 1)), "prompt").max_tokens == max_tokens
    else:
        with pytest.raises(APIError, match="maximum context length is 10") as info:
            _request(_state(10), body, list(range(1, prompt_len + 1)), "prompt")
        assert info.value.status == 400


def test_a_greedy_default_of_generation_config_stays_greedy() -> None:
    # generation_config.json's temperature 0 (greedy, which the sampler takes) is a default like
    # any other: a request without its own temperature is greedy, not OpenAI's 1.
    from memra.loader import GenerationConfig
    from memra.serve.handlers import ServerState

    model = SimpleNamespace(generation_config=GenerationConfig([0], temperature=0.0, top_k=5, top_p=0.5),
                            tokenizer=None, cache=SimpleNamespace(max_len=64), eos_token_ids=[0],
                            config=SimpleNamespace(vocab_size=100))
    state = ServerState(model=model, name="m", scheduler=None, metrics=None, template=None)
    assert (state.default_temperature, state.default_top_k, state.default_top_p) == (0.0, 5, 0.5)
    sampling = _request(state, _completion(), [1, 2], "prompt").sampling
    assert (sampling.temperature, sampling.top_k, sampling.top_p) == (0.0, 5, 0.5)
    unset = SimpleNamespace(**{**vars(model), "generation_config": GenerationConfig([0])})
    assert ServerState(model=unset, name="m", scheduler=None, metrics=None, template=None).default_temperature == 1.0
