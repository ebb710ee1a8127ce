"""memra.serve.chat_template against renderings transformers' apply_chat_template made
(tests/fixtures/chat_template_cases.json, by tests/fixtures/make_chat_template_fixtures.py):
text, token ids (the byte-level tokenizer, no special tokens added) and the templates' own
refusals, for a ChatML/Qwen-style template, a Mistral-style one with bos_token and
raise_exception, a Zephyr-style one in chat_template.jinja (trim_blocks / lstrip_blocks), named
templates, a {% generation %} block, and the embedded checkpoint's."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

pytest.importorskip("jinja2")

import memra  # noqa: E402
from memra.serve.chat_template import ChatTemplate, load_chat_template  # noqa: E402

FIXTURE = json.loads((Path(__file__).parent / "fixtures" / "chat_template_cases.json").read_text())
TINY = memra.default_checkpoint()


def _folder(tmp_path: Path, name: str) -> Path:
    spec = FIXTURE["templates"][name]
    folder = tmp_path / name
    folder.mkdir()
    shutil.copy(TINY / "tokenizer.json", folder / "tokenizer.json")
    (folder / "tokenizer_config.json").write_text(json.dumps(spec["tokenizer_config"]))
    if spec["chat_template_jinja"] is not None:
        (folder / "chat_template.jinja").write_text(spec["chat_template_jinja"])
    if spec["special_tokens_map"] is not None:
        (folder / "special_tokens_map.json").write_text(json.dumps(spec["special_tokens_map"]))
    for extra_name, text in (spec["additional_chat_templates"] or {}).items():
        (folder / "additional_chat_templates").mkdir(exist_ok=True)
        (folder / "additional_chat_templates" / f"{extra_name}.jinja").write_text(text)
    return folder


@pytest.mark.parametrize("name", sorted(FIXTURE["templates"]))
def test_renderings_equal_transformers(tmp_path: Path, name: str) -> None:
    from tokenizers import AddedToken, Tokenizer

    template = load_chat_template(_folder(tmp_path, name))
    tok = Tokenizer.from_file(str(TINY / "tokenizer.json"))
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False)
                            for t in FIXTURE["templates"][name]["added_special_tokens"]])
    cases = [c for c in FIXTURE["cases"] if c["template"] == name]
    assert cases
    for case in cases:
        messages = FIXTURE["conversations"][case["conversation"]]
        where = f"{name}/{case['conversation']}/add_generation_prompt={case['add_generation_prompt']}"
        kw = {"tools": FIXTURE["tools"]} if case.get("tools") else {}
        where += " with tools" if kw else ""
        if "error" in case:
            with pytest.raises(memra.ContractError) as info:
                template.render(messages, add_generation_prompt=case["add_generation_prompt"], **kw)
            assert case["error"] in str(info.value), where
            continue
        text = template.render(messages, add_generation_prompt=case["add_generation_prompt"], **kw)
        assert text == case["text"], where
        assert tok.encode(text, add_special_tokens=False).ids == case["ids"], where


def test_embedded_checkpoint_has_the_fixture_template() -> None:
    template = load_chat_template(TINY)
    assert template is not None
    assert template.source == FIXTURE["templates"]["tiny"]["tokenizer_config"]["chat_template"]
    assert template.tokens["eos_token"] == "<|endoftext|>"


def test_bad_templates_are_named_errors(tmp_path: Path) -> None:
    with pytest.raises(memra.ContractError):
        ChatTemplate("{% for x in %}")
    t = ChatTemplate("{{ messages[0]['content'].nope() }}")
    with pytest.raises(memra.ContractError):
        t.render([{"role": "user", "content": "x"}])
    with pytest.raises(memra.ContractError):
        t.render([])
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": 5}))
    with pytest.raises(memra.ContractError):
        load_chat_template(tmp_path)
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": [{"name": "x", "template": "y"}]}))
    with pytest.raises(memra.ContractError):
        load_chat_template(tmp_path)
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({}))
    assert load_chat_template(tmp_path) is None


def test_the_sandbox_refuses_unsafe_attribute_access() -> None:
    t = ChatTemplate("{{ messages.__class__.__mro__ }}")
    with pytest.raises(memra.ContractError):
        t.render([{"role": "user", "content": "x"}])


@pytest.mark.parametrize("name", ["tokenizer_config.json", "chat_template.jinja"])
def test_a_template_file_that_cannot_be_read_is_named(tmp_path: Path, name: str) -> None:
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({}))
    (tmp_path / name).unlink(missing_ok=True)
    (tmp_path / name).mkdir()  # a directory where the file goes: IsADirectoryError when read
    with pytest.raises(memra.ContractError, match="chat template: .*" + name + " could not be read"):
        load_chat_template(tmp_path)


def test_a_template_file_that_is_not_utf8_is_named(tmp_path: Path) -> None:
    (tmp_path / "chat_template.jinja").write_bytes(b"\xff\xfe{{ x }}")
    with pytest.raises(memra.ContractError, match="chat_template.jinja is not UTF-8"):
        load_chat_template(tmp_path)


def test_keyword_arguments_win_over_the_special_tokens() -> None:
    # transformers renders with {**special_tokens_map, **kwargs}: a chat_template_kwargs entry
    # named like a special token replaces it.
    t = ChatTemplate("{{ bos_token }}|{{ messages[0]['content'] }}", {"bos_token": "<s>"})
    msgs = [{"role": "user", "content": "hi"}]
    assert t.render(msgs) == "<s>|hi"
    assert t.render(msgs, bos_token="X") == "X|hi"


def test_continue_final_message_cuts_at_the_last_marker() -> None:
    # A template that writes the final message twice: transformers cuts at the marker's last
    # occurrence (rindex), leaving the first one in the text. Checked once against
    # transformers 5.17's render_jinja_template, which gave exactly this string.
    t = ChatTemplate("{% for m in messages %}[{{ m['content'] }}]{% endfor %}<{{ messages[-1]['content'] }}>")
    msgs = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "The answer"}]
    assert t.render(msgs, add_generation_prompt=False, continue_final_message=True) == \
        "[hi][The answerCONTINUE_FINAL_MESSAGE_TAG ]<The answer"
