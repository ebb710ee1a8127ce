"""Model families and the machinery they share (docs/architecture.md).

- :mod:`.registry`: :class:`Family`, :class:`LayerPlan`, :class:`Block` and the registry keyed by
  config.json's ``model_type`` (:func:`family_for`).
- :mod:`.decoder`: :class:`DecoderModel`, the one decoder loop.
- :mod:`.residual`: the residual kinds (plain pre-norm; mHC hyper-connections).
- :mod:`.layers`: the mixer interface, :class:`StepContext` and helpers for block builders.
- one module per family (:mod:`.glm5_next`, :mod:`.kimi_linear`, :mod:`.qwen3_5`,
  :mod:`.qwen3_5_moe`, :mod:`.qwen3_next`; the Qwen ones share :mod:`.qwen_common`), registered
  here.
"""

from __future__ import annotations

from . import glm5_next, kimi_linear, qwen3_5, qwen3_5_moe, qwen3_next
from .decoder import DecoderModel
from .layers import AttentionMixer, GdnMixer, KdaMixer, MlaMixer, StepContext
from .registry import Block, BuildArgs, Family, LayerPlan, family_for, register, supported_model_types
from .residual import MhcResidual, MhcSite, NormSite, PlainResidual

FAMILIES: tuple[Family, ...] = (glm5_next.FAMILY, kimi_linear.FAMILY, qwen3_5.FAMILY, qwen3_5_moe.FAMILY,
                                qwen3_next.FAMILY)
for _family in FAMILIES:
    register(_family)

__all__ = [
    "FAMILIES",
    "AttentionMixer",
    "Block",
    "BuildArgs",
    "DecoderModel",
    "Family",
    "GdnMixer",
    "KdaMixer",
    "LayerPlan",
    "MhcResidual",
    "MhcSite",
    "MlaMixer",
    "NormSite",
    "PlainResidual",
    "StepContext",
    "family_for",
    "register",
    "supported_model_types",
]
