"""How memra serve tokenizes a prompt's text, with a tokenizer whose post-processor adds a BOS
token (the fixtures' tokenizers add none, so mutation testing, docs/testing_mutations.md, found
the difference unchecked): a chat prompt is the template's text tokenized without special tokens
(transformers' apply_chat_template: the template writes them), a completion prompt is tokenized
with them (vLLM's /v1/completions). The reference is the tokenizers library itself.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

pytest.importorskip("fastapi")
tokenizers = pytest.importorskip("tokenizers")

import memra  # noqa: E402
from memra.serve.chat_template import ChatTemplate  # noqa: E402
from memra.serve.handlers import _prompt_of_chat, _prompt_of_completion  # noqa: E402
from memra.serve.protocol import ChatCompletionRequest, CompletionRequest  # noqa: E402

TEMPLATE = "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}"


def _with_bos() -> tuple[tokenizers.Tokenizer, int]:
    tok = tokenizers.Tokenizer.from_file(str(memra.default_checkpoint() / "tokenizer.json"))
    bos = tok.token_to_id("<|endoftext|>")
    tok.post_processor = tokenizers.processors.TemplateProcessing(
        single="<|endoftext|> $A", special_tokens=[("<|endoftext|>", bos)])
    return tok, bos


def _state(tok) -> SimpleNamespace:
    model = SimpleNamespace(tokenizer=tok, cache=SimpleNamespace(max_len=4096))
    return SimpleNamespace(model=model, template=ChatTemplate(TEMPLATE), max_token_chars=None)


def test_a_chat_prompt_gets_no_special_tokens_the_template_did_not_write() -> None:
    tok, bos = _with_bos()
    body = ChatCompletionRequest.model_validate({"messages": [{"role": "user", "content": "hi there"}]})
    ids = _prompt_of_chat(_state(tok), body)
    assert ids == tok.encode("<user>hi there", add_special_tokens=False).ids
    assert bos not in ids


def test_a_completion_prompt_gets_the_tokenizers_special_tokens() -> None:
    tok, bos = _with_bos()
    ids = _prompt_of_completion(_state(tok), CompletionRequest.model_validate({"prompt": "hi there"}))
    assert ids == tok.encode("hi there").ids and ids[0] == bos
