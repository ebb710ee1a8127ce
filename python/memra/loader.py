"""Reading a Hugging Face checkpoint folder into memra Weights.

Tensors are read with the ``safetensors`` library (numpy framework; bfloat16 through
``ml_dtypes``) from ``model.safetensors`` or from the shards listed in
``model.safetensors.index.json``, one shard at a time: each tensor is copied once into a
:class:`memra._core.Weight` and the shard's arrays are dropped before the next shard opens, so a
sharded checkpoint never sits in memory twice.

Names on disk are routed to memra's layer groups by the family's :class:`NameTable` (its text
prefixes and routes). Vision-tower weights, the multi-token-prediction layer (glm5_next's
``layers.<num_hidden_layers>.*``, Qwen's ``mtp.*``) and ``*.shared_head.*`` are skipped with one
notice each (transformers ignores them too); anything else that no route claims is a
ContractError naming it, as is a layer past the config's, or a tensor found in two shards.

:func:`read_generation_config` reads generation_config.json: the EOS ids and the sampling
defaults, held at load to the rules Model.generate holds its arguments to. A side file that
cannot be read (a directory in its place, no permission) is a ContractError naming it.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from safetensors import safe_open
from tqdm import tqdm

from . import _core
from .batch import sampling_problem
from .config import check_fields, read_json_object, side_file
from .errors import ContractError, OutOfMemoryError, check_token_ids, is_library_failure

log = logging.getLogger("memra")

_NOTICES = {
    "vision": "skipping vision-tower weights (e.g. {name}): memra runs the text model",
    "mtp": "skipping the multi-token-prediction layer (e.g. {name}), as transformers does",
    "shared_head": "skipping shared_head weights (e.g. {name}), as transformers does",
}
_LAYER = re.compile(r"^layers\.([0-9]+)\.")


@dataclass(frozen=True)
class Route:
    """One rule of a :class:`NameTable`: a name on disk (text prefix stripped) matching
    ``pattern`` goes to ``group`` under ``key``.

    group ``"top"`` is a model-level tensor (key ``embed_tokens``, ``norm`` or ``lm_head``);
    any other group is a layer group (``mixer``, ``mlp``, ``input_layernorm``, ...), and the
    pattern then has a named group ``layer`` holding the layer index. ``group`` and ``key`` are
    ``re.Match.expand`` templates (the default key is the pattern's group ``key``).
    """

    pattern: str
    group: str
    key: str = r"\g<key>"


@dataclass(frozen=True)
class NameTable:
    """A family's checkpoint names: Hugging Face names -> memra layer groups.

    prefixes: the text model's prefixes in the layouts transformers writes, tried in order, the
    first that matches is stripped (``model.language_model.`` for conditional generation,
    ``model.`` for a causal LM). routes: :class:`Route` rules, first match wins. vision: a
    pattern on the full name for the vision tower's tensors (skipped). mtp: patterns on the
    stripped name for multi-token-prediction weights stored outside ``layers.N`` (skipped).
    mtp_layers: how many ``layers.N`` from ``N = num_hidden_layers`` on are the
    multi-token-prediction layers (skipped; glm5_next's one, as transformers ignores it); a
    layer past those is a ContractError (a config.json that says fewer layers than the
    checkpoint holds would otherwise run a truncated model). Layer numbers are ASCII digits
    without leading zeros, as PyTorch names its modules.
    """

    prefixes: tuple[str, ...]
    routes: tuple[Route, ...]
    vision: str = r"^(model\.)?(visual|vision_tower|vision_model|multi_modal_projector)\."
    mtp: tuple[str, ...] = ()
    mtp_layers: int = 0

    def route(self, name: str, num_hidden_layers: int) -> tuple:
        """Where the tensor `name` goes: ``("skip", kind)`` with kind in vision | mtp |
        shared_head, ``("top", key)``, or ``("layer", i, group, key)``. ContractError (40024)
        naming a tensor no route takes."""
        if re.match(self.vision, name):
            return ("skip", "vision")
        short = name
        for p in self.prefixes:
            if name.startswith(p):
                short = name[len(p):]
                break
        if ".shared_head." in short:
            return ("skip", "shared_head")
        m = _LAYER.match(short)
        n = int(m.group(1)) if m else -1
        if m and m.group(1) != str(n):  # "layers.00.": no module of the model has that name
            raise ContractError(f"load: unexpected tensor {name!r} (a layer number with leading zeros)", 40024)
        if num_hidden_layers <= n < num_hidden_layers + self.mtp_layers or any(re.match(p, short) for p in self.mtp):
            return ("skip", "mtp")
        if n >= num_hidden_layers:
            extra = f" and {self.mtp_layers} multi-token-prediction layer(s)" if self.mtp_layers else ""
            raise ContractError(f"load: tensor {name!r} belongs to layer {n}, past config.json's "
                                f"num_hidden_layers={num_hidden_layers}{extra}", 40024)
        for r in self.routes:
            m = re.fullmatch(r.pattern, short, re.ASCII)  # re.match's $ also takes a final "\n"
            if m is None:
                continue
            group, key = m.expand(r.group), m.expand(r.key)
            if r.group == "top":
                return ("top", key)
            return ("layer", int(m.group("layer")), group, key)
        raise ContractError(f"load: unexpected tensor {name!r} (no layer of the model takes it)", 40024)


@dataclass
class CheckpointTensors:
    """Weights of a checkpoint grouped by destination."""

    layers: dict[int, dict[str, dict[str, _core.Weight]]] = field(
        default_factory=lambda: defaultdict(lambda: defaultdict(dict))
    )
    top: dict[str, _core.Weight] = field(default_factory=dict)
    skipped: dict[str, int] = field(default_factory=dict)


@contextlib.contextmanager
def naming_unreadable(path: Path, what: str = "load") -> Iterator[None]:
    """Inside it, an OSError reading `path` (a directory where a file should be, no permission,
    an I/O error) is a ContractError (40025) naming the file: ``load: <path> could not be read:
    Is a directory``. A missing file is left to the reader, which names it as missing."""
    try:
        yield
    except FileNotFoundError:
        raise
    except OSError as e:
        raise ContractError(f"{what}: {e.filename or path} could not be read: {e.strerror or e}", 40025) from None


def read_json_file(path: Path, what: str = "load") -> dict:
    """memra.config.read_json_object (a JSON object, ContractError naming the file otherwise),
    with a file that cannot be read named too (:func:`naming_unreadable`)."""
    with naming_unreadable(path, what):
        return read_json_object(path, what)


def shard_files(path: Path) -> tuple[list[Path], dict[str, str] | None]:
    """The safetensors files of a checkpoint folder, in index order, and the index's
    weight_map (tensor name -> shard file name; None without an index). ContractError if there
    are none, when the index cannot be read or is not one, or maps a tensor to anything but a
    file name in the folder (a path elsewhere, "", ".", ".."), or when a shard is missing or not
    a regular file (each named)."""
    index = path / "model.safetensors.index.json"
    if side_file(index, "load") is not None:
        try:
            with naming_unreadable(index):
                raw = json.loads(index.read_text())
            if not isinstance(raw, dict) or "weight_map" not in raw:
                got = f"a JSON object without it (keys {sorted(raw)[:8]})" if isinstance(raw, dict) else \
                    f"a JSON {type(raw).__name__}"
                raise TypeError(f"it must be a JSON object with a \"weight_map\", got {got}")
            weight_map = raw["weight_map"]
            if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
                raise TypeError("weight_map must map tensor names to file names")
            if not weight_map:  # else every tensor would be named missing, the index not
                raise TypeError("its weight_map lists no tensor")
        # ValueError: json's own (JSONDecodeError) and an integer past Python's digit limit;
        # RecursionError: nesting deeper than the parser's stack.
        except (ValueError, RecursionError, TypeError, UnicodeDecodeError) as e:
            raise ContractError(f"load: {index} is not a safetensors index: {e}", 40025) from None
        for name, f in weight_map.items():
            if f in ("", ".", "..") or os.path.basename(f) != f or "\0" in f:
                raise ContractError(f"load: {index.name} maps tensor {name!r} to {f!r}, which is not the name of "
                                    f"a file in {path}", 40025)
        files = list(dict.fromkeys(weight_map.values()))
        missing = [f for f in files if side_file(path / f, "load", limit=None) is None]
        if missing:
            raise ContractError(f"load: shard(s) listed in {index.name} are missing: {missing}", 40024)
        return [path / f for f in files], weight_map
    single = path / "model.safetensors"
    if side_file(single, "load", limit=None) is not None:
        return [single], None
    raise ContractError(
        f"load: {path} has neither model.safetensors nor model.safetensors.index.json", 40024
    )


_DTYPES = {"BF16": "bfloat16", "F16": "float16", "F32": "float32"}  # safetensors' names memra reads
_OTHER_DTYPES = {"F64": "float64", "I8": "int8", "I16": "int16", "I32": "int32", "I64": "int64", "U8": "uint8",
                 "U16": "uint16", "U32": "uint32", "U64": "uint64", "BOOL": "bool", "C64": "complex64",
                 "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2", "F8_E8M0": "float8_e8m0fnu",
                 "F4": "float4_e2m1fn"}


def _read_tensor(f, file: Path, name: str, dtype: str) -> np.ndarray:
    """Tensor `name` of the open shard `f`. OutOfMemoryError (30001) naming it when the host
    cannot hold it (MemoryError, or the PanicException safetensors' Rust code raises when its
    buffer's allocation fails: a BaseException, which no `except Exception` would see);
    ContractError (40025) for another failure (a rank numpy cannot hold). Other BaseExceptions
    (a Ctrl-C, memra serve's SIGTERM during the load) pass."""
    try:
        return f.get_tensor(name)
    except BaseException as e:
        if not is_library_failure(e):
            raise
        panic = not isinstance(e, Exception)
        what = (f"load: reading tensor {name!r} {f.get_slice(name).get_shape()} {dtype} from {file.name} failed "
                f"({type(e).__name__}: {e})")
        if isinstance(e, MemoryError) or panic:
            raise OutOfMemoryError(f"{what}: the host memory could not hold it", 30001) from None
        raise ContractError(what, 40025) from None


def _to_weight(name: str, arr: np.ndarray) -> _core.Weight:
    import ml_dtypes  # read_tensors imported it first

    # np.require, not np.ascontiguousarray: that makes a 0-d tensor 1-d, so Weight's rank check
    # would name shape [1], not the file's [].
    if arr.dtype == ml_dtypes.bfloat16:
        return _core.Weight(np.require(arr, requirements="C").view(np.uint16), dtype="bfloat16", name=name)
    if arr.dtype in (np.float32, np.float16):
        return _core.Weight(np.require(arr, requirements="C"), name=name)
    raise ContractError(
        f"load: tensor {name!r} has dtype {arr.dtype}; memra reads float32, float16 and bfloat16",
        40020,
    )


def read_tensors(path: Path, num_hidden_layers: int, *, names: NameTable,
                 progress: bool = True) -> CheckpointTensors:
    """Read every tensor of the checkpoint at `path` and route it by the family's `names` (see
    the module docstring). ContractError for an unreadable file, a tensor no route takes, a
    tensor in two shards or two names that route to one weight (``model.layers.0.x`` beside
    ``model.language_model.layers.0.x``: which copy is meant cannot be told), a layer number
    with leading zeros, or a dtype memra does not read (each named; the dtype is read from
    the header, so an FP8 / FP4 tensor is named before anything tries to convert it)."""
    # Registers bfloat16 with numpy for safetensors' numpy framework. Imported here, not with
    # memra: it takes about half a second, which `import memra` for the ops alone need not pay.
    import ml_dtypes  # noqa: F401

    out = CheckpointTensors()
    files, weight_map = shard_files(path)
    notices: dict[str, str] = {}
    shard_of: dict[str, Path] = {}  # tensor name -> the shard it was read from
    name_of: dict[tuple, str] = {}  # destination (route) -> the tensor name read into it
    bar = tqdm(files, desc="memra: loading shards", unit="shard", disable=not progress or len(files) < 2)
    for file in bar:
        try:
            handle = safe_open(str(file), framework="numpy")
        except Exception as e:  # SafetensorError: truncated or not a safetensors file
            raise ContractError(f"load: {file} is not a readable safetensors file: {e}", 40025) from None
        with handle as f:
            for name in f.keys():
                if name in shard_of:
                    raise ContractError(f"load: tensor {name!r} is in two shards, {shard_of[name].name} and "
                                        f"{file.name}: a checkpoint holds each tensor once", 40025)
                shard_of[name] = file
                if weight_map is not None and weight_map.get(name) != file.name:
                    listed = (f"lists it in {weight_map[name]}" if name in weight_map else "does not list it")
                    raise ContractError(f"load: tensor {name!r} is in {file.name}, but "
                                        f"model.safetensors.index.json {listed}", 40025)
                where = names.route(name, num_hidden_layers)
                if where[0] == "skip":
                    notices.setdefault(where[1], _NOTICES[where[1]].format(name=name))
                    out.skipped[where[1]] = out.skipped.get(where[1], 0) + 1
                    continue
                if where in name_of:
                    raise ContractError(f"load: tensors {name_of[where]!r} and {name!r} are the same weight "
                                        "under two names: a checkpoint holds each weight once", 40025)
                name_of[where] = name
                dtype = f.get_slice(name).get_dtype()
                if dtype not in _DTYPES:
                    raise ContractError(f"load: tensor {name!r} has dtype {_OTHER_DTYPES.get(dtype, dtype)} "
                                        f"({dtype}); memra reads float32, float16 and bfloat16", 40020)
                if where[0] == "top":
                    out.top[where[1]] = _to_weight(name, _read_tensor(f, file, name, dtype))
                else:
                    _, i, group, key = where
                    out.layers[i][group][key] = _to_weight(name, _read_tensor(f, file, name, dtype))
    ghosts = [n for n in weight_map or () if n not in shard_of]
    if ghosts:
        raise ContractError(f"load: model.safetensors.index.json lists tensor {ghosts[0]!r} in "
                            f"{weight_map[ghosts[0]]}, which does not hold it ({len(ghosts)} such)", 40025)
    for msg in notices.values():
        log.warning("memra: %s", msg)
    return out


@dataclass(frozen=True)
class GenerationConfig:
    """What memra takes from a checkpoint's generation_config.json, checked at load.

    eos_token_ids: the ids that end a generation (the file's ``eos_token_id``, else
    config.json's; [] for none). temperature, top_k, top_p: the file's sampling defaults (None
    where it sets none), which ``memra serve`` uses for a request that does not set its own.
    """

    eos_token_ids: list[int] = field(default_factory=list)
    temperature: float | None = None
    top_k: int | None = None
    top_p: float | None = None


_GENERATION_FIELDS = {"eos_token_id": int | list[int] | None, "temperature": float | None,
                      "top_k": int | None, "top_p": float | None}
# Sampling defaults transformers and vLLM apply that memra's sampler has no form of, with the value
# that changes nothing: a file setting another is said at load (vLLM would apply it).
_UNAPPLIED_SAMPLING = {"repetition_penalty": 1.0, "presence_penalty": 0.0, "frequency_penalty": 0.0,
                       "min_p": 0.0, "typical_p": 1.0, "no_repeat_ngram_size": 0, "epsilon_cutoff": 0.0,
                       "eta_cutoff": 0.0}


def read_generation_config(path: Path, config) -> GenerationConfig:
    """The :class:`GenerationConfig` of the checkpoint folder `path` (parsed config `config`).

    ContractError naming generation_config.json and the key for a file that cannot be read or
    is not a JSON object, a value of the wrong type, an ``eos_token_id`` outside the
    vocabulary, or a sampling default memra's sampler refuses (memra.batch.sampling_problem:
    the rule Model.generate holds its arguments to), so that a default which would fail every
    request that relies on it is refused once, here. A default memra has no form of
    (``repetition_penalty``, ``min_p``, ...; see ``_UNAPPLIED_SAMPLING``) is logged as a warning.
    """
    gen = path / "generation_config.json"
    data = read_json_file(gen) if side_file(gen, "load") is not None else {}
    what = f"load: {gen.name}"
    check_fields(data, _GENERATION_FIELDS, what=what)
    eos, source = data.get("eos_token_id"), what
    if eos is None:  # config.json's, held to the same rule
        eos, source = config.eos_token_id, "load: config.json"
    if eos is not None:
        check_token_ids(np.atleast_1d(np.asarray(eos, np.int64)), config.vocab_size, f"{source}: eos_token_id")
    sampling = {}
    for name in ("temperature", "top_k", "top_p"):
        value = data.get(name)
        if value is not None and (problem := sampling_problem(name, value)):
            raise ContractError(f"{what}: {name} {problem}", 40025)
        sampling[name] = value if value is None or name == "top_k" else float(value)
    unapplied = [f"{k}={data[k]!r}" for k, neutral in _UNAPPLIED_SAMPLING.items()
                 if k in data and data[k] is not None and data[k] != neutral]
    if unapplied:
        log.warning("memra: %s sets %s, which memra's sampler does not apply (a request asking for them "
                    "is refused)", gen.name, ", ".join(unapplied))
    eos_ids = [] if eos is None else [int(eos)] if isinstance(eos, int) else [int(e) for e in eos]
    return GenerationConfig(eos_ids, **sampling)
