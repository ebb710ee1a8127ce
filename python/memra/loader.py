"""Reading a Hugging Face checkpoint folder into memra Weights.

Tensors are read with the ``safetensors`` library (numpy framework; bfloat16 through
``ml_dtypes``) from ``model.safetensors`` or from the shards listed in
``model.safetensors.index.json``, one shard at a time: each tensor is copied once into a
:class:`memra._core.Weight` and the shard's arrays are dropped before the next shard opens, so a
sharded checkpoint never sits in memory twice.

Names on disk are routed to memra's layer groups by the family's :class:`NameTable` (its text
prefixes and routes). Vision-tower weights, the multi-token-prediction layer
``layers.<num_hidden_layers>.*`` (and any other name the table marks as MTP) and
``*.shared_head.*`` are skipped with one notice each (transformers ignores them too); anything
else that no route claims is a ContractError naming it.
"""

from __future__ import annotations

import json
import logging
import re
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import ml_dtypes  # noqa: F401  (registers bfloat16 with numpy for safetensors' numpy framework)
import numpy as np
from safetensors import safe_open
from tqdm import tqdm

from . import _core
from .config import check_fields, read_json_object
from .errors import ContractError

log = logging.getLogger("memra")

_NOTICES = {
    "vision": "skipping vision-tower weights (e.g. {name}): memra runs the text model",
    "mtp": "skipping the multi-token-prediction layer (e.g. {name}), as transformers does",
    "shared_head": "skipping shared_head weights (e.g. {name}), as transformers does",
}
_LAYER = re.compile(r"^layers\.(\d+)\.")


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
    stripped name for multi-token-prediction weights stored outside ``layers.N`` (skipped; the
    layers ``N >= num_hidden_layers`` are always skipped).
    """

    prefixes: tuple[str, ...]
    routes: tuple[Route, ...]
    vision: str = r"^(model\.)?(visual|vision_tower|vision_model|multi_modal_projector)\."
    mtp: tuple[str, ...] = ()

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
        if (m and int(m.group(1)) >= num_hidden_layers) or any(re.match(p, short) for p in self.mtp):
            return ("skip", "mtp")
        for r in self.routes:
            m = re.match(r.pattern, short)
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


def shard_files(path: Path) -> list[Path]:
    """The safetensors files of a checkpoint folder, in index order. ContractError if none."""
    index = path / "model.safetensors.index.json"
    if index.exists():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
            if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
                raise TypeError("weight_map must map tensor names to file names")
        except (json.JSONDecodeError, KeyError, TypeError, UnicodeDecodeError) as e:
            raise ContractError(f"load: {index} is not a safetensors index: {e}", 40025) from None
        files = list(dict.fromkeys(weight_map.values()))
        missing = [f for f in files if not (path / f).exists()]
        if missing:
            raise ContractError(f"load: shard(s) listed in {index.name} are missing: {missing}", 40024)
        return [path / f for f in files]
    single = path / "model.safetensors"
    if single.exists():
        return [single]
    raise ContractError(
        f"load: {path} has neither model.safetensors nor model.safetensors.index.json", 40024
    )


def _to_weight(name: str, arr: np.ndarray) -> _core.Weight:
    if arr.dtype == ml_dtypes.bfloat16:
        return _core.Weight(np.ascontiguousarray(arr).view(np.uint16), dtype="bfloat16", name=name)
    if arr.dtype in (np.float32, np.float16):
        return _core.Weight(np.ascontiguousarray(arr), name=name)
    raise ContractError(
        f"load: tensor {name!r} has dtype {arr.dtype}; memra reads float32, float16 and bfloat16",
        40020,
    )


def read_tensors(path: Path, num_hidden_layers: int, *, names: NameTable,
                 progress: bool = True) -> CheckpointTensors:
    """Read every tensor of the checkpoint at `path` and route it by the family's `names` (see
    the module docstring). ContractError for an unreadable file, a tensor no route takes or a
    dtype memra does not read (each named)."""
    out = CheckpointTensors()
    files = shard_files(path)
    notices: dict[str, str] = {}
    bar = tqdm(files, desc="memra: loading shards", unit="shard", disable=not progress or len(files) < 2)
    for file in bar:
        try:
            handle = safe_open(str(file), framework="numpy")
        except Exception as e:  # SafetensorError: truncated or not a safetensors file
            raise ContractError(f"load: {file} is not a readable safetensors file: {e}", 40025) from None
        with handle as f:
            for name in f.keys():
                where = names.route(name, num_hidden_layers)
                if where[0] == "skip":
                    notices.setdefault(where[1], _NOTICES[where[1]].format(name=name))
                    out.skipped[where[1]] = out.skipped.get(where[1], 0) + 1
                elif where[0] == "top":
                    out.top[where[1]] = _to_weight(name, f.get_tensor(name))
                else:
                    _, i, group, key = where
                    out.layers[i][group][key] = _to_weight(name, f.get_tensor(name))
    for msg in notices.values():
        log.warning("memra: %s", msg)
    return out


def eos_ids(path: Path, config) -> list[int]:
    """The checkpoint's EOS ids: generation_config.json's eos_token_id, else the config's
    (ContractError naming a wrongly typed one)."""
    eos = None
    gen = path / "generation_config.json"
    if gen.exists():
        data = read_json_object(gen, "load")
        check_fields(data, {"eos_token_id": int | list[int] | None}, what=f"load: {gen.name}")
        eos = data.get("eos_token_id")
    if eos is None:
        eos = config.eos_token_id
    if eos is None:
        return []
    return [int(eos)] if isinstance(eos, int) else [int(e) for e in eos]
