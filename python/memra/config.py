"""Reading a Hugging Face ``config.json``, and the typing of its values.

:func:`read_config` reads ``path/config.json``, picks the model family from its ``model_type``
(:func:`memra.models.family_for`) and returns the family's parse. Each family declares its fields
as a typed table (a dataclass whose annotations and defaults are transformers'; see
``memra/models/glm5_next.py``); :func:`check_fields` refuses a value of the wrong JSON type with a
ContractError naming the key (``hidden_size: 64.0``, ``num_hidden_layers: true``,
``eos_token_id: "x"``), before anything reads it.

The type language of a table is a small part of Python's: ``int`` (a JSON integer that fits in
int32, never a boolean), ``float`` (a finite JSON number; integers included), ``bool``, ``str``,
``None``, ``list[T]``, unions ``A | B``, ``Any``, and ``TypedDict`` classes (a JSON object whose
listed keys, where present, have their types; other keys are free).
"""

from __future__ import annotations

import dataclasses
import json
import math
import types
import typing
from pathlib import Path
from typing import Any

from .errors import ContractError

_INT32 = (-(2**31), 2**31 - 1)
_PLURAL = {int: "integers", float: "numbers", bool: "booleans", str: "strings"}


def describe(tp: Any) -> str:
    """The words for a type of the table language, as an error message uses them."""
    if tp is Any:
        return "any value"
    if tp is int:
        return "an integer"
    if tp is float:
        return "a finite number"
    if tp is bool:
        return "true or false"
    if tp is str:
        return "a string"
    if tp is type(None):
        return "null"
    if typing.is_typeddict(tp):
        return "a JSON object"
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is list:
        return f"a list of {_PLURAL.get(args[0], 'values') if args else 'values'}"
    if origin in (typing.Union, types.UnionType):
        words = [describe(a) for a in args]
        return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " or " + words[-1]
    raise TypeError(f"describe: {tp!r} is not a type of the config table language")


def _fits(value: Any, tp: Any, where: str, what: str) -> bool:
    """Whether `value` (parsed JSON) has type `tp`. A TypedDict's own bad key raises directly, so
    the message names the innermost key."""
    if tp is Any:
        return True
    if tp is int:
        return isinstance(value, int) and not isinstance(value, bool) and _INT32[0] <= value <= _INT32[1]
    if tp is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if tp is bool:
        return isinstance(value, bool)
    if tp is str:
        return isinstance(value, str)
    if tp is type(None):
        return value is None
    if typing.is_typeddict(tp):
        if not isinstance(value, dict):
            return False
        check_fields(value, typing.get_type_hints(tp), where + ".", what)
        return True
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is list:
        return isinstance(value, list) and all(_fits(v, args[0], f"{where}[{i}]", what) for i, v in enumerate(value))
    if origin in (typing.Union, types.UnionType):
        return any(_fits(value, a, where, what) for a in args)
    raise TypeError(f"check_fields: {tp!r} is not a type of the config table language")


def check_fields(values: dict[str, Any], table: dict[str, Any], prefix: str = "", what: str = "config") -> None:
    """Refuse a value of `values` whose key is in `table` and whose JSON type is not the table's.

    values: a parsed JSON object; table: key -> type (see the module docstring); prefix: the
    path of `values` inside config.json (``"text_config."``), so the message names the key as it
    sits in the file; what: the message's first word (the file). Keys absent from the table pass
    (transformers keeps them as extra kwargs). Raises ContractError (40025)
    ``config: <key> must be <type>, got <value>``.
    """
    for key, tp in table.items():
        if key not in values:
            continue
        value = values[key]
        if not _fits(value, tp, prefix + key, what):
            shown = repr(value) if len(repr(value)) <= 80 else repr(value)[:77] + "..."
            big = isinstance(value, int) and not isinstance(value, bool) and not _INT32[0] <= value <= _INT32[1]
            extra = " (fitting in int32)" if big and _mentions_int(tp) else ""
            raise ContractError(f"{what}: {prefix}{key} must be {describe(tp)}{extra}, got {shown}", 40025)


def _mentions_int(tp: Any) -> bool:
    return tp is int or any(_mentions_int(a) for a in typing.get_args(tp))


def field_table(cls: type) -> dict[str, Any]:
    """key -> type of a family's config dataclass (its annotations), without ``model_type`` and
    ``extra`` (which config.json does not set as typed fields)."""
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls) if f.name not in ("model_type", "extra")}


def field_defaults(cls: type) -> dict[str, Any]:
    """key -> default of a family's config dataclass (transformers' defaults), as field_table."""
    return {f.name: f.default for f in dataclasses.fields(cls)
            if f.name not in ("model_type", "extra") and f.default is not dataclasses.MISSING}


def read_json_object(path: Path, what: str) -> dict[str, Any]:
    """A JSON file that must hold an object (ContractError naming the file otherwise)."""
    try:
        raw = json.loads(path.read_text())
    except FileNotFoundError:
        raise ContractError(f"{what}: no {path.name} in {path.parent}", 40024) from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ContractError(f"{what}: {path} is not valid JSON: {e}", 40025) from None
    if not isinstance(raw, dict):
        raise ContractError(f"{what}: {path} must hold a JSON object, got a {type(raw).__name__}", 40025)
    return raw


def read_config(path: str | Path):
    """Read ``path/config.json``; returns (family, parsed config).

    family is the :class:`memra.models.Family` whose ``model_types`` hold the config's
    ``model_type`` (or its ``text_config``'s). Raises ContractError when the file is missing,
    not JSON, not an object or holds a wrongly typed value (named), UnsupportedError for a
    model_type no family accepts (naming the supported ones).
    """
    from .models import family_for  # the families import this module

    raw = read_json_object(Path(path) / "config.json", "load")
    family = family_for(raw)
    cfg = family.parse_config(raw)
    # The shared code (cache, loop, head) reads these of every family's config.
    for key in ("vocab_size", "hidden_size", "num_hidden_layers"):
        value = getattr(cfg, key)
        if value < 1:
            raise ContractError(f"config: {key} must be at least 1, got {value}", 40025)
    return family, cfg
