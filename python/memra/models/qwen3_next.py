"""Qwen3-Next (``qwen3_next``): the family's config, plan, names and blocks.

Reference: transformers 5.17 ``models/qwen3_next`` (``Qwen3NextConfig``, ``Qwen3NextForCausalLM``).
Gated DeltaNet layers with the interleaved ``in_proj_qkvz`` / ``in_proj_ba`` projections
(memra.GdnLayer de-interleaves them at load, as ``fix_query_key_value_ordering`` splits them),
gated attention, zero-centred norms (:mod:`memra.models.qwen_common`), and per layer
(``Qwen3NextDecoderLayer``) the Qwen MoE where ``layer not in mlp_only_layers and num_experts > 0
and (layer + 1) % decoder_sparse_step == 0``, else the dense MLP of ``intermediate_size``. The
router (``Qwen3NextTopKRouter``): softmax in f32 over the router logits, top
``num_experts_per_tok``, renormalised only when ``norm_topk_prob``; the shared expert scaled by
``sigmoid(x . shared_expert_gate)``. The causal-LM layout only (``model.*``); ``mtp.*`` weights
are skipped with one notice.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..config import Size, check_positive
from ..errors import ContractError
from . import qwen_common as qc
from .registry import Block, BuildArgs, Family
from .residual import PlainResidual


@dataclass
class Qwen3NextConfig(qc.QwenTextConfig):
    """``Qwen3NextConfig`` as transformers parses it (the shared fields: qwen_common.QwenTextConfig;
    these defaults are the 80B-A3B's). After the parse ``mlp_only_layers`` is a list (None -> [])."""

    vocab_size: Size = 151936
    hidden_size: Size = 2048
    num_hidden_layers: Size = 48
    num_key_value_heads: Size = 2
    intermediate_size: Size = 5632
    decoder_sparse_step: int = 1
    moe_intermediate_size: Size = 512
    shared_expert_intermediate_size: Size = 512
    num_experts_per_tok: Size = 10
    num_experts: Size = 512
    norm_topk_prob: bool = True
    output_router_logits: bool = False
    router_aux_loss_coef: float = 0.001
    mlp_only_layers: list[int] | None = field(default=None)


def _post_init(c: dict[str, Any], kwargs: dict[str, Any]) -> None:
    if c["mlp_only_layers"] is None:
        c["mlp_only_layers"] = []


def _mlp_layer_types(c: dict[str, Any]) -> list[str]:
    """Qwen3NextDecoderLayer's choice (an mlp_only_layers entry outside the layers is ignored)."""
    if c["num_experts"] > 0 and c["decoder_sparse_step"] < 1:
        raise ContractError(f"config: decoder_sparse_step must be >= 1, got {c['decoder_sparse_step']}", 40025)
    return ["sparse" if (i not in c["mlp_only_layers"] and c["num_experts"] > 0
                         and (i + 1) % c["decoder_sparse_step"] == 0) else "dense"
            for i in range(c["num_hidden_layers"])]


def _validate(c: dict[str, Any]) -> None:
    if "dense" in c["mlp_layer_types"]:
        check_positive(c, ("intermediate_size",))
    qc.check_moe(c)


SPEC = qc.QwenSpec(Qwen3NextConfig, "qwen3_next", None, _mlp_layer_types, _validate, _post_init)


def parse_config(raw: dict[str, Any]) -> Qwen3NextConfig:
    """Parse a ``qwen3_next`` config.json dict (qwen_common.parse_config)."""
    return qc.parse_config(raw, SPEC)


def build_block(a: BuildArgs) -> Block:
    """Layer a.index's norms, mixer and FFN (qwen_common.build_block; norm_topk_prob as configured)."""
    return qc.build_block(a, projections=qc.QWEN3_NEXT_PROJECTIONS,
                          moe={"norm_topk_prob": bool(a.config.norm_topk_prob)})


FAMILY = Family(
    name="qwen3_next",
    model_types=("qwen3_next",),
    reference="transformers 5.17 models/qwen3_next",
    parse_config=parse_config,
    layer_plan=qc.layer_plan,
    names=qc.NAMES,
    residual=lambda cfg: PlainResidual(cfg.rms_norm_eps, zero_centred=True),
    build_block=build_block,
)
