"""memra.config: reading config.json and refusing wrongly typed values by name (CPU only).

The typed field tables themselves belong to the families (tests/test_config_<family>.py check
each family's parse against transformers); here the generic machinery: the type language of
check_fields, config.json / generation_config.json that are not JSON objects, and the refusals
reaching memra.load before anything is allocated.
"""

from __future__ import annotations

import copy
import json
import shutil
from typing import Any, TypedDict

import numpy as np
import pytest

import memra
from memra.config import check_fields, describe, field_defaults, field_table, read_config
from memra.models.glm5_next import Glm5NextConfig

TINY = memra.default_checkpoint()
TINY_RAW = json.loads((TINY / "config.json").read_text())


class _Sub(TypedDict, total=False):
    n: int
    on: bool


TABLE = {
    "i": int,
    "f": float,
    "b": bool,
    "s": str,
    "oi": int | None,
    "li": list[int],
    "ids": int | list[int] | None,
    "sub": _Sub | None,
    "any": Any,
}


@pytest.mark.parametrize("values", [
    {},
    {"i": 3, "f": 1.5, "b": False, "s": "x", "oi": None, "li": [], "ids": [1, 2], "sub": {"n": 1}, "any": [None]},
    {"f": 2, "oi": -7, "ids": 5, "sub": None, "unlisted": "anything"},
    {"i": 2**31 - 1, "f": -3.4e38, "sub": {"other": "free"}},
])
def test_values_of_the_right_type_pass(values):
    before = copy.deepcopy(values)
    check_fields(values, TABLE)
    assert values == before


@pytest.mark.parametrize("key,value,words", [
    ("i", 64.0, "an integer"),
    ("i", True, "an integer"),
    ("i", "3", "an integer"),
    ("i", 2**31, "an integer (fitting in int32)"),
    ("f", True, "a finite number (a float32: magnitude at most 3.4e38)"),
    ("f", float("nan"), "a finite number (a float32: magnitude at most 3.4e38)"),
    ("f", float("inf"), "a finite number (a float32: magnitude at most 3.4e38)"),
    ("f", "0.5", "a finite number (a float32: magnitude at most 3.4e38)"),
    # memra computes in float32: past its range a value would reach the layers as inf
    ("f", -1e300, "a finite number (a float32: magnitude at most 3.4e38)"),
    ("f", 3.5e38, "a finite number (a float32: magnitude at most 3.4e38)"),
    ("f", 10**400, "a finite number (a float32: magnitude at most 3.4e38)"),  # a JSON integer float() overflows
    ("b", 1, "true or false"),
    ("b", "true", "true or false"),
    ("s", 3, "a string"),
    ("oi", 1.0, "an integer or null"),
    ("li", [1, 2.5], "a list of integers"),
    ("li", (1, 2), "a list of integers"),
    ("ids", "x", "an integer, a list of integers or null"),
    ("ids", [1, None], "an integer, a list of integers or null"),
    ("sub", [1], "a JSON object or null"),
])
def test_a_wrong_type_is_refused_naming_the_key(key, value, words):
    with pytest.raises(memra.ContractError) as ei:
        check_fields({key: value}, TABLE, "text_config.")
    assert str(ei.value).startswith(f"config: text_config.{key} must be {words}, got "), str(ei.value)
    assert ei.value.code == 40025


def test_a_typed_dict_names_its_inner_key():
    with pytest.raises(memra.ContractError, match=r"config: sub\.on must be true or false, got 'yes'"):
        check_fields({"sub": {"n": 1, "on": "yes"}}, TABLE)


def test_long_values_are_shortened_in_the_message():
    with pytest.raises(memra.ContractError) as ei:
        check_fields({"s": list(range(1000))}, TABLE)
    assert len(str(ei.value)) < 200


def test_describe_words():
    assert describe(int | list[int] | None) == "an integer, a list of integers or null"
    assert describe(list[str]) == "a list of strings"
    with pytest.raises(TypeError):
        describe(dict)


def test_field_table_is_the_family_dataclass():
    table, defaults = field_table(Glm5NextConfig), field_defaults(Glm5NextConfig)
    assert "model_type" not in table and "extra" not in table
    assert table["hidden_size"] is int and defaults["hidden_size"] == 4096
    assert set(defaults) == set(table)


# ------------------------------------------------------------------ files
@pytest.mark.parametrize("text,kind", [("[1, 2]", "list"), ('"glm5_next"', "str"), ("3", "int"),
                                       ("null", "NoneType")])
def test_config_json_that_is_not_an_object(tmp_path, text, kind):
    (tmp_path / "config.json").write_text(text)
    with pytest.raises(memra.ContractError, match=f"must hold a JSON object, got a {kind}") as ei:
        read_config(tmp_path)
    assert ei.value.code == 40025


def test_missing_config_json(tmp_path):
    with pytest.raises(memra.ContractError, match="config.json") as ei:
        read_config(tmp_path)
    assert 40000 <= ei.value.code < 50000
    with pytest.raises(memra.ContractError, match="config.json"):
        memra.load(tmp_path, max_batch=1, max_len=16, progress=False)


@pytest.mark.parametrize("text", ["{not json", "\xff\xfe"])
def test_config_json_not_json(tmp_path, text):
    (tmp_path / "config.json").write_bytes(text.encode("latin-1"))
    with pytest.raises(memra.ContractError, match="not valid JSON"):
        read_config(tmp_path)


def _copy(tmp_path, edit=None, gen=None):
    dst = tmp_path / "ckpt"
    shutil.copytree(TINY, dst)
    if edit is not None:
        raw = copy.deepcopy(TINY_RAW)
        edit(raw)
        (dst / "config.json").write_text(json.dumps(raw))
    if gen is not None:
        (dst / "generation_config.json").write_text(gen)
    return dst


@pytest.mark.parametrize("key,value", [("hidden_size", 64.0), ("num_hidden_layers", True), ("eos_token_id", "x")])
def test_load_refuses_a_wrongly_typed_value_by_name(tmp_path, key, value):
    path = _copy(tmp_path, lambda raw: raw["text_config"].__setitem__(key, value))
    with pytest.raises(memra.ContractError, match=f"text_config.{key} must be"):
        memra.load(path, max_batch=1, max_len=16, progress=False)


def test_load_refuses_a_list_config(tmp_path):
    path = _copy(tmp_path)
    (path / "config.json").write_text(json.dumps([TINY_RAW]))
    with pytest.raises(memra.ContractError, match="JSON object"):
        memra.load(path, max_batch=1, max_len=16, progress=False)


@pytest.mark.parametrize("gen,match", [
    ('{"eos_token_id": "x"}', "load: generation_config.json: eos_token_id must be an integer, a list"),
    ('{"eos_token_id": [256, 1.5]}', "eos_token_id must be"),
    ("[256]", "must hold a JSON object"),
    ("{broken", "not valid JSON"),
])
def test_load_refuses_a_bad_generation_config(tmp_path, gen, match):
    with pytest.raises(memra.ContractError, match=match):
        memra.load(_copy(tmp_path, gen=gen), max_batch=1, max_len=16, progress=False)


def test_generation_config_eos_list_is_taken(tmp_path):
    m = memra.load(_copy(tmp_path, gen='{"eos_token_id": [5, 7]}'), max_batch=1, max_len=16, progress=False)
    assert m.eos_token_ids == [5, 7]


@pytest.mark.parametrize("key", ["vocab_size", "hidden_size", "num_hidden_layers"])
def test_a_shared_size_below_one_is_refused(tmp_path, key):
    path = _copy(tmp_path, lambda raw: raw["text_config"].__setitem__(key, 0))
    with pytest.raises(memra.ContractError, match=f"config: {key} must be at least 1, got 0"):
        memra.load(path, max_batch=1, max_len=16, progress=False)


def test_the_largest_float32_passes_and_the_next_double_does_not():
    # "finite as a float32": float32's largest value is one; the double just past it is not.
    fmax = float(np.finfo(np.float32).max)
    check_fields({"f": fmax}, TABLE)
    check_fields({"f": -fmax}, TABLE)
    with pytest.raises(memra.ContractError, match="a finite number"):
        check_fields({"f": float(np.nextafter(fmax, np.inf))}, TABLE)
