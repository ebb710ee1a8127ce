"""Qwen3.5 dense (``qwen3_5_text``, ``qwen3_5``): the family's config, plan, names and blocks.

Reference: transformers 5.17 ``models/qwen3_5`` (``Qwen3_5TextConfig``, ``Qwen3_5Config``,
``Qwen3_5ForCausalLM``, ``Qwen3_5ForConditionalGeneration``). Gated DeltaNet and gated attention
layers (Qwen3.5's separate ``in_proj_qkv`` / ``in_proj_z`` / ``in_proj_b`` / ``in_proj_a``), a
dense SwiGLU MLP in every layer, zero-centred norms; what the three Qwen families share is in
:mod:`memra.models.qwen_common`. ``qwen3_5_text`` is the causal LM's layout (``model.*``),
``qwen3_5`` the conditional-generation one users download (text under ``model.language_model.``,
a vision tower and ``mtp.*`` weights skipped with one notice each, the head tied by the top-level
``tie_word_embeddings``, as the small releases are).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..config import Size, check_positive
from . import qwen_common as qc
from .registry import Block, BuildArgs, Family
from .residual import PlainResidual


@dataclass
class Qwen3_5Config(qc.QwenTextConfig):
    """``Qwen3_5TextConfig`` as transformers parses it (the shared fields: qwen_common.QwenTextConfig)."""

    intermediate_size: Size = 12288


def _mlp_layer_types(c: dict[str, Any]) -> list[str]:
    return ["dense"] * c["num_hidden_layers"]  # Qwen3_5DecoderLayer: Qwen3_5MLP in every layer


def _validate(c: dict[str, Any]) -> None:
    check_positive(c, ("intermediate_size",))


SPEC = qc.QwenSpec(Qwen3_5Config, "qwen3_5_text", "qwen3_5", _mlp_layer_types, _validate)


def parse_config(raw: dict[str, Any]) -> Qwen3_5Config:
    """Parse a ``qwen3_5_text`` or ``qwen3_5`` config.json dict (qwen_common.parse_config)."""
    return qc.parse_config(raw, SPEC)


def build_block(a: BuildArgs) -> Block:
    """Layer a.index's norms, mixer and dense MLP (qwen_common.build_block)."""
    return qc.build_block(a, projections=qc.QWEN3_5_PROJECTIONS, moe=None)


FAMILY = Family(
    name="qwen3_5",
    model_types=("qwen3_5_text", "qwen3_5"),
    reference="transformers 5.17 models/qwen3_5",
    parse_config=parse_config,
    layer_plan=qc.layer_plan,
    names=qc.NAMES,
    residual=lambda cfg: PlainResidual(cfg.rms_norm_eps, zero_centred=True),
    build_block=build_block,
)
