"""Qwen3.5-MoE (``qwen3_5_moe_text``, ``qwen3_5_moe``): the family's config, plan, names and blocks.

Reference: transformers 5.17 ``models/qwen3_5_moe`` (``Qwen3_5MoeTextConfig``,
``Qwen3_5MoeConfig``, ``Qwen3_5MoeForCausalLM``, ``Qwen3_5MoeForConditionalGeneration``).
Qwen3.5's layers with the Qwen MoE in every layer (``Qwen3_5MoeSparseMoeBlock``): router logits
in f32, softmax in f32, top ``num_experts_per_tok`` experts, their weights ALWAYS renormalised
(``Qwen3_5MoeTopKRouter.forward`` divides by their sum; the config has no ``norm_topk_prob``
field, and a ``norm_topk_prob`` key in config.json changes nothing there, nor here); per-expert
SwiGLU experts of ``moe_intermediate_size``; the shared expert of
``shared_expert_intermediate_size`` scaled by ``sigmoid(x . shared_expert_gate)``. Layouts and
the shared parts as in :mod:`memra.models.qwen3_5` / :mod:`memra.models.qwen_common`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..config import Size
from . import qwen_common as qc
from .registry import Block, BuildArgs, Family
from .residual import PlainResidual


@dataclass
class Qwen3_5MoeConfig(qc.QwenTextConfig):
    """``Qwen3_5MoeTextConfig`` as transformers parses it (the shared fields:
    qwen_common.QwenTextConfig; these defaults are the 35B-A3B's)."""

    hidden_size: Size = 2048
    num_hidden_layers: Size = 40
    num_key_value_heads: Size = 2
    moe_intermediate_size: Size = 512
    shared_expert_intermediate_size: Size = 512
    num_experts_per_tok: Size = 8
    num_experts: Size = 256
    output_router_logits: bool = False
    router_aux_loss_coef: float = 0.001


def _mlp_layer_types(c: dict[str, Any]) -> list[str]:
    return ["sparse"] * c["num_hidden_layers"]  # Qwen3_5MoeDecoderLayer: the MoE block in every layer


SPEC = qc.QwenSpec(Qwen3_5MoeConfig, "qwen3_5_moe_text", "qwen3_5_moe", _mlp_layer_types, qc.check_moe)


def parse_config(raw: dict[str, Any]) -> Qwen3_5MoeConfig:
    """Parse a ``qwen3_5_moe_text`` or ``qwen3_5_moe`` config.json dict (qwen_common.parse_config)."""
    return qc.parse_config(raw, SPEC)


def build_block(a: BuildArgs) -> Block:
    """Layer a.index's norms, mixer and MoE (always renormalised; qwen_common.build_block)."""
    return qc.build_block(a, projections=qc.QWEN3_5_PROJECTIONS, moe={"norm_topk_prob": True})


FAMILY = Family(
    name="qwen3_5_moe",
    model_types=("qwen3_5_moe_text", "qwen3_5_moe"),
    reference="transformers 5.17 models/qwen3_5_moe",
    parse_config=parse_config,
    layer_plan=qc.layer_plan,
    names=qc.NAMES,
    residual=lambda cfg: PlainResidual(cfg.rms_norm_eps, zero_centred=True),
    build_block=build_block,
)
