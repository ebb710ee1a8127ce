"""What memra does with a checkpoint's tokenizer.json beyond its vocabulary (CPU), from a
break-it pass of the loader (session 40):

- the file's ``truncation`` and ``padding`` blocks are not applied: transformers' fast tokenizers
  turn them off for a call that asks for neither, so a prompt is never cut or padded (a
  max_length of 2 cut every prompt to 2 tokens; a Fixed padding to 2^40 aborted the process);
- a tokenizer that fails on every text (a post-processor naming a token it lacks: a Rust panic
  at each encode) is refused at load, naming the file;
- a tokenizer that fails on one text (a pre-tokenizer regex past its backtracking limit) fails
  that prompt alone: the server answers 400 naming the field and keeps serving.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

import memra
from memra.tokenizer import encode_text

TINY = memra.default_checkpoint()
TEXT = "The quick brown fox jumps over the lazy dog."


def _with_tokenizer(tmp_path: Path, **changes) -> Path:
    dst = tmp_path / "ckpt"
    shutil.copytree(TINY, dst)
    raw = json.loads((TINY / "tokenizer.json").read_text())
    raw.update(changes)
    (dst / "tokenizer.json").write_text(json.dumps(raw))
    return dst


def _load(path: Path) -> memra.Model:
    return memra.load(path, max_batch=2, max_len=64, progress=False)


def test_the_files_truncation_and_padding_are_not_applied(tmp_path) -> None:
    want = _load(TINY).tokenizer.encode(TEXT).ids
    assert len(want) > 8
    folder = _with_tokenizer(
        tmp_path, truncation={"max_length": 2, "stride": 0, "strategy": "LongestFirst", "direction": "Right"},
        padding={"strategy": {"Fixed": 2**40}, "direction": "Right", "pad_to_multiple_of": None, "pad_id": 0,
                 "pad_type_id": 0, "pad_token": "x"})
    model = _load(folder)
    assert model.tokenizer.encode(TEXT).ids == want
    assert encode_text(model.tokenizer, TEXT, "prompt", add_special_tokens=False) == \
        _load(TINY).tokenizer.encode(TEXT, add_special_tokens=False).ids


def test_a_tokenizer_that_fails_on_every_text_is_refused_at_load(tmp_path) -> None:
    folder = _with_tokenizer(tmp_path, post_processor={
        "type": "TemplateProcessing", "special_tokens": {},
        "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
        "pair": [{"Sequence": {"id": "A", "type_id": 0}}]})
    with pytest.raises(memra.ContractError, match="tokenizer.json: the tokenizer failed on the text") as info:
        _load(folder)
    assert info.value.code == 40025
    assert _load(TINY).logits([1, 2]).shape[0] == 2  # a good load after it


def test_a_closed_vocabulary_without_unk_loads(tmp_path) -> None:
    # A WordLevel vocabulary of the letters it was made for, no [UNK]: it fails on other text,
    # and a load-time test encode of a word refused the checkpoint.
    folder = _with_tokenizer(tmp_path, model={"type": "WordLevel", "vocab": {"A": 0, "C": 1, "G": 2, "T": 3},
                                              "unk_token": "[UNK]"},
                             pre_tokenizer={"type": "WhitespaceSplit"}, post_processor=None, decoder=None,
                             normalizer=None, added_tokens=[])
    model = _load(folder)
    assert encode_text(model.tokenizer, "A C G T", "prompt") == [0, 1, 2, 3]
    with pytest.raises(memra.ContractError, match="prompt: the tokenizer failed"):
        encode_text(model.tokenizer, "hello", "prompt")


def test_a_signal_during_an_encode_passes() -> None:
    class Stop(BaseException):
        pass

    class Tok:
        def encode(self, text, add_special_tokens=True):
            raise Stop()

    with pytest.raises(Stop):
        encode_text(Tok(), "x", "prompt")


CATASTROPHIC = {"type": "Split", "pattern": {"Regex": "(a+)+$"}, "behavior": "Isolated", "invert": False}
BAD_TEXT = "a" * 5000 + "b"  # past the regex engine's retry limit: a PanicException (a BaseException)


def test_a_text_the_tokenizer_fails_on_is_a_named_error(tmp_path) -> None:
    model = _load(_with_tokenizer(tmp_path, pre_tokenizer=CATASTROPHIC))
    assert encode_text(model.tokenizer, "ab", "prompt")  # other texts encode
    with pytest.raises(memra.ContractError, match=r"^prompt: the tokenizer failed on the text \(PanicException"):
        encode_text(model.tokenizer, BAD_TEXT, "prompt")


def test_the_server_answers_400_for_a_prompt_the_tokenizer_fails_on(tmp_path) -> None:
    pytest.importorskip("fastapi")
    pytest.importorskip("uvicorn")
    httpx = pytest.importorskip("httpx")
    from serve_helpers import ServerThread, post_json

    model = _load(_with_tokenizer(tmp_path, pre_tokenizer=CATASTROPHIC))
    with ServerThread(model, served_model_name="tiny") as s:
        r = post_json(s, "/v1/completions", {"prompt": BAD_TEXT, "max_tokens": 2})
        assert r.status_code == 400, r.text
        err = r.json()["error"]
        assert err["param"] == "prompt" and "the tokenizer failed on the text" in err["message"], err
        r = post_json(s, "/v1/completions", {"prompt": "ab", "max_tokens": 2, "temperature": 0})
        assert r.status_code == 200, r.text
        assert httpx.get(s.url + "/health").status_code == 200
