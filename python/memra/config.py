"""Reading a Hugging Face ``config.json``, and the typing of its values.

:func:`read_config` reads ``path/config.json``, picks the model family from its ``model_type``
(:func:`memra.models.family_for`) and returns the family's parse. Each family declares its fields
as a typed table (a dataclass whose annotations and defaults are transformers'; see
``memra/models/glm5_next.py``); :func:`check_fields` refuses a value of the wrong JSON type with a
ContractError naming the key (``hidden_size: 64.0``, ``num_hidden_layers: true``,
``eos_token_id: "x"``), before anything reads it.

The type language of a table is a small part of Python's: ``int`` (a JSON integer that fits in
int32, never a boolean), ``float`` (a JSON number finite as a float32; integers included),
``bool``, ``str``, ``None``, ``list[T]``, unions ``A | B``, ``Any``, and ``TypedDict`` classes (a
JSON object whose listed keys, where present, have their types; other keys are free).

A field may also carry a bound: ``Annotated[int, Range(1, 1000)]`` in the dataclass or TypedDict,
or :data:`Size` (``Annotated[int, Range(high=SIZE_MAX)]``) for every size (hidden, heads, head
dims, ranks, experts, kernel, pool and index widths, hc_mult, layers, vocabulary).
:func:`field_table` leaves the bounds out (the JSON types), :func:`field_ranges` collects them, and
:func:`check_fields` given both refuses an out-of-range value by key, before any parse arithmetic
runs on it (``config: text_config.hc_sinkhorn_iters must be in [1, 1000] (...), got 2147483647``).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import stat
import types
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

from .errors import ContractError, UnsupportedError

_INT32 = (-(2**31), 2**31 - 1)

# The largest size a config may give (2^20 = 1048576; the released checkpoints' largest, the
# vocabularies, are below 2^18). With every size at most this, a sum of two sizes fits in int32
# and a product of three in int64, so no geometry memra derives from a config overflows; the C++
# layers refuse the same bound (memra::kMaxLayerSize).
SIZE_MAX = 2**20

# The largest float32: memra computes with a config's numbers as float32, so a `float` field
# must be finite as one (rms_norm_eps = 1e300 would reach the layers as inf).
FLT_MAX = 3.4028234663852886e38


@dataclass(frozen=True)
class Range:
    """An inclusive bound on a number of a config table (``Annotated[int, Range(...)]``).

    low / high: the bounds (None: open on that side); note: why the bound is what it is, quoted
    in the refusal's message.
    """

    low: int | float | None = None
    high: int | float | None = None
    note: str = ""

    def holds(self, value: int | float) -> bool:
        """Whether `value` lies inside the bound."""
        return (self.low is None or value >= self.low) and (self.high is None or value <= self.high)

    def words(self) -> str:
        """The bound as a message says it: "in [1, 1000]", "at most 1048576", "at least 0"."""
        if self.low is not None and self.high is not None:
            text = f"in [{self.low}, {self.high}]"
        elif self.high is not None:
            text = f"at most {self.high}"
        else:
            text = f"at least {self.low}"
        return f"{text} ({self.note})" if self.note else text


# A size of the model: an integer at most SIZE_MAX (lower bounds, where a family has them, are
# the family's own checks: a size that a config does not use may be 0).
Size = Annotated[int, Range(high=SIZE_MAX, note="memra's bound on a size: 2^20")]

# A count of positions (max_position_embeddings): memra does not bound a prompt by it, but a
# config that gives 0 or a negative count is not a model's.
Positions = Annotated[int, Range(low=1, note="a count of positions")]

# An epsilon added to a variance or a sum (rms_norm_eps, hc_eps): 0 is transformers' own
# arithmetic (every family takes it), a negative one is no model's.
Eps = Annotated[float, Range(low=0, note="an epsilon added to a variance or a sum")]

_PLURAL = {int: "integers", float: "numbers", bool: "booleans", str: "strings"}


def describe(tp: Any) -> str:
    """The words for a type of the table language, as an error message uses them."""
    if tp is Any:
        return "any value"
    if tp is int:
        return "an integer"
    if tp is float:
        return "a finite number (a float32: magnitude at most 3.4e38)"
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
        # abs(), not math.isfinite: a JSON integer of 400 digits is a Python int float() overflows.
        return isinstance(value, (int, float)) and not isinstance(value, bool) and abs(value) <= FLT_MAX
    if tp is bool:
        return isinstance(value, bool)
    if tp is str:
        return isinstance(value, str)
    if tp is type(None):
        return value is None
    if typing.is_typeddict(tp):
        if not isinstance(value, dict):
            return False
        check_fields(value, typing.get_type_hints(tp), where + ".", what, field_ranges(tp))
        return True
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is list:
        return isinstance(value, list) and all(_fits(v, args[0], f"{where}[{i}]", what) for i, v in enumerate(value))
    if origin in (typing.Union, types.UnionType):
        return any(_fits(value, a, where, what) for a in args)
    raise TypeError(f"check_fields: {tp!r} is not a type of the config table language")


def check_fields(values: dict[str, Any], table: dict[str, Any], prefix: str = "", what: str = "config",
                 ranges: dict[str, Range] | None = None) -> None:
    """Refuse a value of `values` whose key is in `table` and whose JSON type is not the table's,
    or whose key is in `ranges` and whose number lies outside its Range.

    values: a parsed JSON object; table: key -> type (see the module docstring); prefix: the
    path of `values` inside config.json (``"text_config."``), so the message names the key as it
    sits in the file; what: the message's first word (the file); ranges: key -> Range
    (:func:`field_ranges`; None or absent keys: unbounded), checked once the type holds (a null
    passes). Keys absent from the table pass (transformers keeps them as extra kwargs). Raises
    ContractError (40025) ``config: <key> must be <type>, got <value>`` or ``config: <key> must be
    in [<low>, <high>] (<note>), got <value>``.
    """
    for key, tp in table.items():
        if key not in values:
            continue
        value = values[key]
        if not _fits(value, tp, prefix + key, what):
            big = isinstance(value, int) and not isinstance(value, bool) and not _INT32[0] <= value <= _INT32[1]
            extra = " (fitting in int32)" if big and _mentions_int(tp) else ""
            raise ContractError(f"{what}: {prefix}{key} must be {describe(tp)}{extra}, got {_shown(value)}", 40025)
        bound = (ranges or {}).get(key)
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        if bound is not None and number and not bound.holds(value):
            raise ContractError(f"{what}: {prefix}{key} must be {bound.words()}, got {_shown(value)}", 40025)


def _shown(value: Any) -> str:
    r = repr(value)
    return r if len(r) <= 80 else r[:77] + "..."


def check_positive(c: dict[str, Any], names: tuple[str, ...], low: int = 1,
                   aliases: dict[str, str] | None = None) -> None:
    """Refuse a parsed field of `names` in `c` that is missing (None) or below `low`, as
    transformers' modules would fail on it later. ContractError (40025) naming the field, and
    the other name config.json may give it (`aliases`: field -> alias, "num_experts / n_group")."""
    for k in names:
        if c[k] is None or c[k] < low:
            shown = f"{aliases[k]} / {k}" if aliases and k in aliases else k
            raise ContractError(f"config: {shown} must be an integer >= {low}, got {c[k]!r}", 40025)


def check_size_product(c: dict[str, Any], keys: tuple[str, ...], what: str) -> None:
    """Refuse a size memra derives as the product of the parsed fields `keys` of `c` (`what`
    says what it is) when it is above SIZE_MAX, like a size given directly. ContractError (40025)
    ``config: a * b (<va> * <vb> = <p>), <what>, must be at most 1048576 (...)``."""
    product = math.prod(c[k] for k in keys)
    if product > SIZE_MAX:
        names, values = " * ".join(keys), " * ".join(str(c[k]) for k in keys)
        raise ContractError(f"config: {names} ({values} = {product}), {what}, must be at most {SIZE_MAX} "
                            "(memra's bound on a size: 2^20)", 40025)


def check_grouped_router(c: dict[str, Any], experts: str, shown: str | None = None) -> None:
    """The geometry of a grouped top-k router (transformers' Glm5NextTextTopkRouter and
    KimiLinearTopkRouter) in the parsed fields `c` (positive counts): c[experts] experts in
    n_group groups of at least 2 (a group scores the sum of its top 2), the topk_group best
    groups kept, num_experts_per_tok experts among those. ContractError (40025) for an uneven
    split or topk_group > n_group; UnsupportedError (50000) for a top_k past the kept groups'
    experts (transformers would then pick experts of dropped groups). `shown`: the experts key
    as the message names it (default `experts`)."""
    E, G, kg, k = c[experts], c["n_group"], c["topk_group"], c["num_experts_per_tok"]
    if E % G or E // G < 2:
        raise ContractError(f"config: {shown or experts} ({E}) must split into n_group ({G}) groups of at least "
                            "2 experts (a group's score is the sum of its top 2)", 40025)
    if kg > G:
        raise ContractError(f"config: topk_group ({kg}) exceeds n_group ({G})", 40025)
    if k > kg * (E // G):
        raise UnsupportedError(
            f"config: num_experts_per_tok ({k}) exceeds the {kg * (E // G)} experts of the topk_group ({kg}) "
            "groups kept: transformers would then pick experts of dropped groups", 50000)


def _mentions_int(tp: Any) -> bool:
    return tp is int or any(_mentions_int(a) for a in typing.get_args(tp))


def field_table(cls: type) -> dict[str, Any]:
    """key -> type of a family's config dataclass (its annotations), without ``model_type`` and
    ``extra`` (which config.json does not set as typed fields)."""
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls) if f.name not in ("model_type", "extra")}


def field_ranges(cls: type) -> dict[str, Range]:
    """key -> Range of the fields of a config dataclass or TypedDict annotated with one
    (``Annotated[int, Range(...)]``, :data:`Size`, also inside ``... | None``)."""
    ranges = {}
    for key, tp in typing.get_type_hints(cls, include_extras=True).items():
        for member in (tp, *typing.get_args(tp)):
            found = [m for m in getattr(member, "__metadata__", ()) if isinstance(m, Range)]
            if found:
                ranges[key] = found[0]
                break
    return ranges


def field_defaults(cls: type) -> dict[str, Any]:
    """key -> default of a family's config dataclass (transformers' defaults), as field_table."""
    return {f.name: f.default for f in dataclasses.fields(cls)
            if f.name not in ("model_type", "extra") and f.default is not dataclasses.MISSING}


# The largest side file (config, index, tokenizer, template) memra reads whole: 32x the largest
# real one (a tokenizer.json of ~30 MiB), and far below what reading it would exhaust.
# transformers' ALLOWED_ATTN_LAYER_TYPES (configuration_utils.py): the entries its validator
# accepts in a config's layer_types. A family refuses by name those it does not run.
ALLOWED_ATTN_LAYER_TYPES = (
    "full_attention", "sliding_attention", "chunked_attention", "window_attention",
    "compressed_sparse_attention", "heavily_compressed_attention", "minimax_m3_sparse", "conv", "moe",
    "hybrid", "hybrid_sliding", "deepseek_sparse_attention", "qwen_sparse_attention", "linear_attention",
    "indexed_attention",
)  # fmt: skip


MAX_SIDE_FILE_BYTES = 1 << 30


def side_file(path: Path, what: str, *, limit: int | None = MAX_SIDE_FILE_BYTES) -> Path | None:
    """`path` when the folder has it, None when it has no such entry. ContractError (40025)
    naming it for a symbolic link to nothing (it is there, but cannot be read: not the same as
    absent), anything but a regular file after links (a directory, a FIFO that would block, a
    device such as /dev/zero that never ends), or a file past `limit` bytes (None: any size)."""
    if not os.path.lexists(path):
        return None
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise ContractError(f"{what}: {path} is a symbolic link to nothing", 40025) from None
    except OSError as e:
        raise ContractError(f"{what}: {path} could not be read: {e.strerror or e}", 40025) from None
    if not stat.S_ISREG(st.st_mode):
        kind = "a directory" if stat.S_ISDIR(st.st_mode) else "not a regular file"
        raise ContractError(f"{what}: {path} could not be read: it is {kind}", 40025)
    if limit is not None and st.st_size > limit:
        raise ContractError(f"{what}: {path} is {st.st_size} bytes, more than the {limit} a side file "
                            f"may have", 40025)
    return path


def read_json_object(path: Path, what: str) -> dict[str, Any]:
    """A JSON file that must hold an object (ContractError naming the file otherwise; see
    :func:`side_file` for what may stand at the path)."""
    if side_file(path, what) is None:
        raise ContractError(f"{what}: no {path.name} in {path.parent}", 40024)
    try:
        raw = json.loads(path.read_text())
    except FileNotFoundError:
        raise ContractError(f"{what}: no {path.name} in {path.parent}", 40024) from None
    # ValueError: json's own (JSONDecodeError) and an integer past Python's digit limit;
    # RecursionError: nesting deeper than the parser's stack.
    except (ValueError, RecursionError, UnicodeDecodeError) as e:
        raise ContractError(f"{what}: {path} is not valid JSON: {type(e).__name__}: {e}", 40025) from None
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
