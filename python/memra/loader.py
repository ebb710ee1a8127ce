"""Reading a Hugging Face checkpoint folder into memra Weights.

Tensors are read with the ``safetensors`` library (numpy framework; bfloat16 through
``ml_dtypes``) from ``model.safetensors`` or from the shards listed in
``model.safetensors.index.json``, one shard at a time: each tensor is copied once into a
:class:`memra._core.Weight` and the shard's arrays are dropped before the next shard opens, so a
sharded checkpoint never sits in memory twice.

Names on disk are routed to memra's layers by :data:`ROUTES` (one table). Vision-tower weights,
the multi-token-prediction layer ``layers.<num_hidden_layers>.*`` and ``*.shared_head.*`` are
skipped with one notice each (transformers ignores them too); anything else that no route claims
is a ContractError naming it.
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
from .errors import ContractError

log = logging.getLogger("memra")

# Prefixes of the text model's tensors in the layouts transformers writes: the multimodal
# Glm5NextForConditionalGeneration (model.language_model.*) and flat text-only checkpoints.
_TEXT_PREFIXES = ("model.language_model.", "language_model.model.", "language_model.", "model.")
_VISION = re.compile(r"^(model\.)?(visual|vision_tower|vision_model|multi_modal_projector)\.")

# Routes from a name on disk (text prefix stripped) to (group, key). Groups:
#   ("layer", i, part) with part in mixer | mlp | input_layernorm | post_attention_layernorm |
#   attn_hc | ffn_hc;  ("top", name) for embed_tokens / norm / lm_head.
ROUTES: list[tuple[re.Pattern[str], str]] = [
    (re.compile(r"^layers\.(\d+)\.self_attn\.(.+)$"), "mixer"),
    (re.compile(r"^layers\.(\d+)\.mlp\.(.+)$"), "mlp"),
    (re.compile(r"^layers\.(\d+)\.(input_layernorm|post_attention_layernorm)\.weight$"), "norm"),
    (re.compile(r"^layers\.(\d+)\.hc_(attn|ffn)_(fn|base|scale)$"), "hc"),
    (re.compile(r"^(embed_tokens|norm)\.weight$"), "top"),
]


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
        except (json.JSONDecodeError, KeyError) as e:
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


def read_tensors(path: Path, num_hidden_layers: int, *, progress: bool = True) -> CheckpointTensors:
    """Read every tensor of the checkpoint at `path` and route it (see module docstring)."""
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
                if _VISION.match(name):
                    notices.setdefault("vision", f"skipping vision-tower weights (e.g. {name}): memra runs the text model")
                    out.skipped["vision"] = out.skipped.get("vision", 0) + 1
                    continue
                short = name
                for p in _TEXT_PREFIXES:
                    if name.startswith(p):
                        short = name[len(p):]
                        break
                if short == "lm_head.weight":  # lm_head.weight, or language_model.lm_head.weight
                    out.top["lm_head"] = _to_weight(name, f.get_tensor(name))
                    continue
                if ".shared_head." in short:
                    notices.setdefault("shared_head", f"skipping shared_head weights (e.g. {name}), as transformers does")
                    out.skipped["shared_head"] = out.skipped.get("shared_head", 0) + 1
                    continue
                m = re.match(r"^layers\.(\d+)\.", short)
                if m and int(m.group(1)) >= num_hidden_layers:
                    notices.setdefault("mtp", f"skipping the multi-token-prediction layer (e.g. {name}), as transformers does")
                    out.skipped["mtp"] = out.skipped.get("mtp", 0) + 1
                    continue
                _route(out, name, short, f)
    for msg in notices.values():
        log.warning("memra: %s", msg)
    return out


def _route(out: CheckpointTensors, name: str, short: str, f) -> None:
    for pattern, kind in ROUTES:
        m = pattern.match(short)
        if not m:
            continue
        if kind == "top":
            out.top[m.group(1)] = _to_weight(name, f.get_tensor(name))
        elif kind == "hc":
            i, site, key = int(m.group(1)), m.group(2), m.group(3)
            out.layers[i][f"{site}_hc"][key] = _to_weight(name, f.get_tensor(name))
        elif kind == "norm":
            out.layers[int(m.group(1))][m.group(2)]["weight"] = _to_weight(name, f.get_tensor(name))
        else:
            out.layers[int(m.group(1))][kind][m.group(2)] = _to_weight(name, f.get_tensor(name))
        return
    raise ContractError(f"load: unexpected tensor {name!r} (no layer of the model takes it)", 40024)
