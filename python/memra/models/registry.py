"""The model registry: which family runs a checkpoint, and what a family supplies.

A :class:`Family` holds only what is its own (docs/architecture.md, "How to add a family"):
the config parse, the layer plan, the checkpoint name table, the residual kind and a block
builder. Everything else (the decoder loop, generation, decode graphs, the loader) is shared.
``memra.load`` picks the family by :func:`family_for` from config.json's ``model_type``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .. import _core
from ..errors import ContractError, UnsupportedError
from ..loader import NameTable


@dataclass(frozen=True)
class LayerPlan:
    """What decoder layer i is, decided once from the config by the family's ``layer_plan``.

    The same plan gives the cache its state spec (``state``) and the block builder its choices,
    so the two cannot disagree. mixer: the family's mixer kind (glm5_next: ``"kda"`` or
    ``"mla"``); ffn: ``"dense"`` or ``"sparse"`` (MoE); state: the layer's per-slot cache plane;
    options: the family's further per-layer choices (glm5_next: ``{"indexer": "full"}``).
    """

    mixer: str
    ffn: str
    state: _core.LayerStateSpec
    options: Mapping[str, Any] = field(default_factory=dict)


@dataclass
class Block:
    """One decoder layer as the shared loop runs it.

    mixer_site / ffn_site: the residual kind's sites before the mixer and before the FFN (the
    sublayer's input norm; for mHC also the site's HyperConnection); see memra.models.residual.
    mixer: ``prefill(cache, layer, slots, x, ctx)`` and ``decode(cache, layer, slots, x, ctx)``
    -> y (memra.models.layers). ffn: ``forward(x) -> y`` (memra.MlpLayer, memra.MoeLayer).
    """

    mixer_site: Any
    mixer: Any
    ffn_site: Any
    ffn: Any


@dataclass(frozen=True)
class BuildArgs:
    """What a family's ``build_block`` gets for layer ``index``: the engine, the parsed config,
    the compute dtype ('float32' | 'bfloat16'), the layer's plan, its tensors by group (from the
    name table; group -> key -> Weight) and ``where`` (``model.layers.<index>``, the prefix of
    every error message about the layer)."""

    engine: _core.Engine
    config: Any
    dtype: str
    index: int
    plan: LayerPlan
    groups: Mapping[str, Mapping[str, _core.Weight]]
    where: str


@dataclass(frozen=True)
class Family:
    """A model family: what memra needs to run one kind of checkpoint.

    name: the family's name; model_types: the config.json ``model_type`` values it accepts
    (top-level or ``text_config``'s); reference: the transformers module it reproduces.
    parse_config(raw config.json dict) -> config: transformers' parse, typed (ContractError
    naming a bad key), with at least ``vocab_size``, ``hidden_size``, ``num_hidden_layers``,
    ``rms_norm_eps``, ``eos_token_id`` and ``tie_word_embeddings``. layer_plan(config) ->
    [LayerPlan] per layer. names: the checkpoint name table. residual(config) -> the residual
    kind (memra.models.residual). build_block(BuildArgs) -> Block.
    """

    name: str
    model_types: tuple[str, ...]
    reference: str
    parse_config: Callable[[dict[str, Any]], Any]
    layer_plan: Callable[[Any], list[LayerPlan]]
    names: NameTable
    residual: Callable[[Any], Any]
    build_block: Callable[[BuildArgs], Block]


_BY_TYPE: dict[str, Family] = {}


def register(family: Family) -> None:
    """Make `family` answer for its model_types (ValueError when another family has one)."""
    for t in family.model_types:
        other = _BY_TYPE.get(t)
        if other is not None and other is not family:
            raise ValueError(f"model_type {t!r} is claimed by families {other.name!r} and {family.name!r}")
    for t in family.model_types:
        _BY_TYPE[t] = family


def supported_model_types() -> list[str]:
    """Every model_type some registered family accepts, sorted."""
    return sorted(_BY_TYPE)


def _model_type(obj: dict[str, Any], where: str) -> str | None:
    t = obj.get("model_type")
    if t is not None and not isinstance(t, str):
        raise ContractError(f"config: {where}model_type must be a string, got {t!r}", 40025)
    return t


def family_for(raw: dict[str, Any]) -> Family:
    """The family for a config.json dict: the one accepting its top-level ``model_type``, else
    the one accepting its ``text_config``'s (a conditional-generation checkpoint wrapping a
    text model). UnsupportedError (50000) naming the types found and the supported ones;
    ContractError for a model_type or text_config of the wrong JSON type."""
    if not isinstance(raw, dict):
        raise ContractError(f"config: config.json must hold a JSON object, got a {type(raw).__name__}", 40025)
    top = _model_type(raw, "")
    text = raw.get("text_config")
    if text is not None and not isinstance(text, dict):
        raise ContractError(f"config: text_config must be a JSON object or null, got {text!r:.80}", 40025)
    nested = _model_type(text, "text_config.") if text else None
    for t in (top, nested):
        if t is not None and t in _BY_TYPE:
            return _BY_TYPE[t]
    found = [f"{key} {t!r}" for key, t in (("model_type", top), ("text_config.model_type", nested)) if t is not None]
    said = " and ".join(found) if found else "no model_type"
    raise UnsupportedError(
        f"load: config.json has {said}, which memra does not support (supported model_types: "
        f"{', '.join(supported_model_types())})", 50000)
