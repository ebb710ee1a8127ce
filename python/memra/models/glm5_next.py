"""GLM-5.3-Flash (``glm5_next``): the family's config, layer plan, checkpoint names and blocks.

Reference: transformers 5.17 ``models/glm5_next`` (``configuration_glm5_next.py``,
``modeling_glm5_next.py``). The text model: token embedding copied into ``hc_mult`` residual
streams (mHC, memra.models.residual.MhcResidual); per layer an mHC site around the mixer (KDA,
or MLA with the DSA k-pool indexer, where a "shared" DSA layer reuses the index list of the full
DSA layer before it) and an mHC site around the FFN (dense SwiGLU MLP or MoE); then the plain
mean over the streams, the final RMSNorm and the LM head.

:func:`parse_config` reproduces ``Glm5NextTextConfig.__post_init__`` and
``Glm5NextConfig.__post_init__``: the nested ``text_config`` and the flat form, the default
layer and MLP schedules, ``index_topk_pattern`` / ``index_topk_freq`` /
``index_skip_topk_offset``, ``linear_attn_config``, and ``"full_attention"`` (and
``"indexed_attention"``, later transformers' name for it) renamed to
``"deepseek_sparse_attention"``. It is tested against transformers' own parse
(tests/fixtures/glm5_next_config_cases.json).
"""

from __future__ import annotations

import dataclasses
import math
import typing
from dataclasses import dataclass, field
from typing import Annotated, Any, TypedDict

from .. import _core
from ..config import (Eps, Positions, Range, Size, check_fields, check_positive, check_grouped_router, check_size_product, field_defaults,
                      field_ranges, field_table)
from ..errors import ContractError, UnsupportedError
from ..loader import NameTable, Route
from .layers import KdaMixer, MlaMixer, check_groups, located, norm_vector
from .registry import Block, BuildArgs, Family, LayerPlan
from .residual import MhcResidual, MhcSite

# Sinkhorn rounds per mHC site (memra::op::kMaxSinkhornIters, the same bound): the checkpoints use
# 20, and the rounds run to the end with no way to interrupt them, so an unbounded count from
# config.json would stall every forward pass.
SinkhornIters = Annotated[int, Range(1, 1000, note="Sinkhorn rounds per mHC site; the checkpoints use 20")]


@dataclass
class Glm5NextConfig:
    """The text model of GLM-5.3-Flash (``glm5_next``), as transformers parses it.

    The annotations are the typed field table of config.json (memra.config.check_fields) and
    the defaults are ``Glm5NextTextConfig``'s. Every size is a :data:`memra.config.Size` (at most
    2^20), and ``hc_sinkhorn_iters`` is in [1, 1000] (:data:`SinkhornIters`); a value outside is
    refused by key before the parse runs. After :func:`parse_config` the schedules
    (``layer_types``, ``mlp_layer_types``, ``indexer_types``) are lists of num_hidden_layers or
    more entries and ``num_key_value_heads`` is set. ``extra`` keeps the keys transformers takes
    as kwargs.
    """

    vocab_size: Size = 154880
    hidden_size: Size = 4096
    intermediate_size: Size = 12288
    moe_intermediate_size: Size = 2048
    num_hidden_layers: Size = 45
    num_attention_heads: Size = 64
    num_key_value_heads: Size | None = 64
    n_shared_experts: Size = 1
    n_routed_experts: Size = 288
    routed_scaling_factor: float = 2.5
    kv_lora_rank: Size = 512
    q_lora_rank: Size | None = 1536
    qk_rope_head_dim: Size = 0
    v_head_dim: Size = 256
    qk_nope_head_dim: Size = 256
    n_group: Size = 1
    topk_group: Size = 1
    num_experts_per_tok: Size = 8
    norm_topk_prob: bool = True
    hidden_act: str = "silu"
    max_position_embeddings: Positions = 1048576
    rms_norm_eps: Eps = 1e-5
    pad_token_id: int | None = 154820
    bos_token_id: int | None = None
    eos_token_id: int | list[int] | None = None
    tie_word_embeddings: bool = False
    mlp_layer_types: list[str] | None = None
    attention_bias: bool = False
    index_topk: Size = 2048
    index_head_dim: Size = 128
    index_n_heads: Size = 32
    layer_types: list[str] | None = None
    indexer_types: list[str] | None = None
    swiglu_limit: float = 10.0
    linear_head_dim: Size = 128
    linear_num_heads: Size = 64
    linear_conv_kernel_dim: Size = 4
    linear_lower_bound: float | None = -5.0
    hc_mult: Size = 4
    hc_eps: Eps = 1e-6
    hc_sinkhorn_iters: SinkhornIters = 20
    index_kpool: Size = 16
    index_kpool_always_select_tail: bool = True
    model_type: str = "glm5_next"
    extra: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        """Every field as a plain dict (``extra`` included)."""
        return dataclasses.asdict(self)


class _LinearAttnConfig(TypedDict, total=False):
    head_dim: Size
    num_heads: Size
    short_conv_kernel_size: Size
    gate_lower_bound: float | None
    safe_gate: bool


class _Kwargs(TypedDict, total=False):
    """Keys outside the dataclass that the parse reads (transformers' kwargs)."""

    index_topk_pattern: str | list[str] | None
    index_topk_freq: int
    index_skip_topk_offset: int
    linear_attn_config: _LinearAttnConfig | None


_FIELDS = field_table(Glm5NextConfig)
_RANGES = field_ranges(Glm5NextConfig)
_DEFAULTS = field_defaults(Glm5NextConfig)
_KWARG_TYPES = typing.get_type_hints(_Kwargs)
_KWARG_RANGES = field_ranges(_Kwargs)


def _post_init(text: dict[str, Any]) -> dict[str, Any]:
    """Glm5NextTextConfig.__post_init__ on a dict of text fields (returns the parsed fields)."""
    known = {k: text[k] for k in _DEFAULTS if k in text}
    kwargs = {k: v for k, v in text.items() if k not in _DEFAULTS}
    c = dict(_DEFAULTS)
    c.update(known)
    n = c["num_hidden_layers"]
    if c["num_key_value_heads"] is None:
        c["num_key_value_heads"] = c["num_attention_heads"]
    if c["mlp_layer_types"] is None:
        c["mlp_layer_types"] = ["dense"] * min(3, n) + ["sparse"] * (n - 3)
    if c["layer_types"] is None:
        c["layer_types"] = [
            "linear_attention" if i % 4 != 3 else "deepseek_sparse_attention" for i in range(n)
        ]
    # transformers after 5.17 writes the DSA layers as "indexed_attention" (its
    # ALLOWED_LAYER_TYPES maps "deepseek_sparse_attention" onto it): the same layer.
    c["layer_types"] = [
        "deepseek_sparse_attention" if t in ("full_attention", "indexed_attention") else t
        for t in c["layer_types"]
    ]
    if c["indexer_types"] is None:
        pattern = kwargs.get("index_topk_pattern")
        if pattern is not None:
            if isinstance(pattern, str) and not set(pattern) <= {"F", "S"}:
                raise ContractError(f"config: index_topk_pattern may hold only 'F' and 'S', got {pattern!r}",
                                    40025)
            c["indexer_types"] = (
                [{"F": "full", "S": "shared"}[ch] for ch in pattern]
                if isinstance(pattern, str)
                else list(pattern)
            )
        else:
            freq = max(kwargs.get("index_topk_freq", 1), 1)
            offset = kwargs.get("index_skip_topk_offset", 2)
            c["indexer_types"] = [
                "full" if (max(i - offset + 1, 0) % freq) == 0 else "shared" for i in range(n)
            ]
    lac = kwargs.get("linear_attn_config")
    if lac is not None:
        c["linear_head_dim"] = lac.get("head_dim", c["linear_head_dim"])
        c["linear_num_heads"] = lac.get("num_heads", c["linear_num_heads"])
        c["linear_conv_kernel_dim"] = lac.get("short_conv_kernel_size", c["linear_conv_kernel_dim"])
        c["linear_lower_bound"] = lac.get("gate_lower_bound", c["linear_lower_bound"])
        if lac.get("safe_gate", True) and c["linear_lower_bound"] is None:
            c["linear_lower_bound"] = -5.0
    c["extra"] = {k: v for k, v in kwargs.items()}
    return c


def _validate(c: dict[str, Any]) -> None:
    """Glm5NextTextConfig.validate_architecture, plus memra's own refusals."""
    if c["num_attention_heads"] != c["num_key_value_heads"]:
        raise ContractError(
            f"config: num_attention_heads ({c['num_attention_heads']}) must equal "
            f"num_key_value_heads ({c['num_key_value_heads']})",
            40025,
        )
    if c["index_kpool"] < 1:
        raise ContractError(f"config: index_kpool must be positive, got {c['index_kpool']}", 40010)
    if c["index_topk"] % c["index_kpool"] != 0:
        raise ContractError(
            f"config: index_topk ({c['index_topk']}) must be divisible by index_kpool "
            f"({c['index_kpool']})",
            40010,
        )
    if c["q_lora_rank"] is None:
        raise ContractError("config: q_lora_rank is required for the DSA attention layers", 40025)
    if c["qk_rope_head_dim"] > 0:
        raise ContractError(
            f"config: glm5_next expects NoPE attention, got qk_rope_head_dim={c['qk_rope_head_dim']}",
            40025,
        )
    if not c["index_kpool_always_select_tail"]:
        raise UnsupportedError(
            "config: index_kpool_always_select_tail = false is not supported (queries before the "
            "first complete pool would have an empty candidate set)",
            50000,
        )
    n = c["num_hidden_layers"]
    for name in ("layer_types", "mlp_layer_types", "indexer_types"):
        if len(c[name]) < n:
            raise ContractError(f"config: {name} has {len(c[name])} entries for {n} layers", 40025)
    for i, t in enumerate(c["layer_types"][:n]):
        if t not in ("linear_attention", "deepseek_sparse_attention"):
            raise UnsupportedError(f"config: layer {i} has unknown layer type {t!r}", 50000)
        if t != "deepseek_sparse_attention":
            continue
        if c["indexer_types"][i] not in ("full", "shared"):
            raise UnsupportedError(f"config: layer {i} has unknown indexer type {c['indexer_types'][i]!r}", 50000)
        if c["indexer_types"][i] == "shared":
            prev = i - 1
            if prev < 0 or c["layer_types"][prev] != "deepseek_sparse_attention" or (
                c["indexer_types"][prev] != "full"
            ):
                raise ContractError(
                    f"config: layer {i} is a shared DSA layer, but layer {prev} before it is not a "
                    "full DSA layer",
                    40025,
                )
    for i, t in enumerate(c["mlp_layer_types"][:n]):
        if t not in ("dense", "sparse"):
            raise UnsupportedError(f"config: layer {i} has unknown mlp type {t!r}", 50000)
    # The sizes the layers present use, named here rather than by the C++ layer a 0 reaches.
    used = set(c["layer_types"][:n]) | set(c["mlp_layer_types"][:n])
    check_positive(c, ("hc_mult",) + (
        ("num_attention_heads", "kv_lora_rank", "q_lora_rank", "qk_nope_head_dim", "v_head_dim", "index_topk",
         "index_head_dim", "index_n_heads") if "deepseek_sparse_attention" in used else ()) + (
        ("linear_num_heads", "linear_head_dim", "linear_conv_kernel_dim") if "linear_attention" in used else ()) + (
        ("intermediate_size",) if "dense" in used else ()) + (("moe_intermediate_size",) if "sparse" in used else ()))
    if "sparse" in c["mlp_layer_types"][:n]:
        check_positive(c, ("n_shared_experts",), low=0)
        # The shared experts run as one MLP of this width.
        check_size_product(c, ("moe_intermediate_size", "n_shared_experts"), "the shared expert's width")
        _validate_routing(c)
    if c["hidden_act"] not in ("silu", "swish"):  # transformers' ACT2FN: both are nn.SiLU
        raise UnsupportedError(f"config: hidden_act = {c['hidden_act']!r}: memra runs glm5_next's short conv "
                               "and MLPs with SiLU", 50000)
    lb = c["linear_lower_bound"]
    if lb is not None and not -math.inf < lb <= 0:
        raise ContractError(f"config: linear_lower_bound must be a finite number <= 0, got {lb} (the gate "
                            "lower_bound * sigmoid(...) is a log decay; above 0 the state grows)", 40025)
    if c["attention_bias"]:
        raise UnsupportedError("config: attention_bias = true: memra runs glm5_next's attention projections "
                               "without biases (as released)", 50000)


def _validate_routing(c: dict[str, Any]) -> None:
    """Glm5NextTextTopkRouter's counts positive, then its geometry (check_grouped_router)."""
    for key in ("n_routed_experts", "n_group", "topk_group", "num_experts_per_tok"):
        if c[key] < 1:
            raise ContractError(f"config: {key} must be a positive integer, got {c[key]}", 40025)
    check_grouped_router(c, "n_routed_experts")


def parse_config(raw: dict[str, Any]) -> Glm5NextConfig:
    """Parse a glm5_next ``config.json`` dict (nested ``text_config`` or flat) into the text config.

    Raises ContractError naming a wrongly typed key or an inconsistent config, and
    UnsupportedError for one memra refuses (``index_kpool_always_select_tail = false``, an
    unknown layer, indexer or MLP type). Does not modify `raw`.
    """
    if not isinstance(raw, dict):
        raise ContractError(f"config: config.json must hold a JSON object, got a {type(raw).__name__}", 40025)
    text = raw.get("text_config")
    if text is not None and not isinstance(text, dict):
        raise ContractError(f"config: text_config must be a JSON object or null, got {text!r:.80}", 40025)
    if text is not None:
        check_fields(text, _FIELDS, "text_config.", ranges=_RANGES)
        check_fields(text, _KWARG_TYPES, "text_config.", ranges=_KWARG_RANGES)
        check_fields(raw, {"tie_word_embeddings": bool})
        fields = dict(text)
        # Glm5NextForConditionalGeneration ties the LM head by the *top-level* tie_word_embeddings
        # (Glm5NextConfig's own field, default False), never by text_config's.
        fields["tie_word_embeddings"] = bool(raw.get("tie_word_embeddings", False))
    else:
        check_fields(raw, _FIELDS, ranges=_RANGES)
        check_fields(raw, _KWARG_TYPES, ranges=_KWARG_RANGES)
        fields = {k: v for k, v in raw.items() if k not in ("vision_config", "architectures")}
    fields.pop("model_type", None)
    for k in ("transformers_version", "dtype", "torch_dtype", "architectures", "head_dim",
              "qk_head_dim", "_name_or_path"):
        fields.pop(k, None)
    c = _post_init(fields)
    _validate(c)
    return Glm5NextConfig(**c)


def layer_plan(cfg: Glm5NextConfig) -> list[LayerPlan]:
    """Per layer: KDA or MLA (with its indexer role), dense or sparse FFN, and its cache plane."""
    plan = []
    for i in range(cfg.num_hidden_layers):
        ffn = "sparse" if cfg.mlp_layer_types[i] == "sparse" else "dense"
        if cfg.layer_types[i] == "linear_attention":
            state = _core.LayerStateSpec.kda(heads=cfg.linear_num_heads, head_dim=cfg.linear_head_dim,
                                             conv_kernel=cfg.linear_conv_kernel_dim)
            plan.append(LayerPlan("kda", ffn, state))
            continue
        indexer = cfg.indexer_types[i]
        row_width = cfg.kv_lora_rank + cfg.qk_rope_head_dim
        if indexer == "full":
            state = _core.LayerStateSpec.mla(row_width=row_width, index_head_dim=cfg.index_head_dim,
                                             kpool=cfg.index_kpool, tail_rows=2 * cfg.index_kpool)
        else:
            state = _core.LayerStateSpec.mla(row_width=row_width)
        plan.append(LayerPlan("mla", ffn, state, {"indexer": indexer}))
    return plan


# Names on disk: Glm5NextForConditionalGeneration (model.language_model.*), the older VLM layout
# (language_model.model.*, language_model.lm_head.weight) and flat text-only checkpoints (model.*).
NAMES = NameTable(
    prefixes=("model.language_model.", "language_model.model.", "language_model.", "model."),
    routes=(
        Route(r"^layers\.(?P<layer>\d+)\.self_attn\.(?P<key>.+)$", "mixer"),
        Route(r"^layers\.(?P<layer>\d+)\.mlp\.(?P<key>.+)$", "mlp"),
        Route(r"^layers\.(?P<layer>\d+)\.(?P<norm>input_layernorm|post_attention_layernorm)\.weight$",
              r"\g<norm>", "weight"),
        Route(r"^layers\.(?P<layer>\d+)\.hc_(?P<site>attn|ffn)_(?P<key>fn|base|scale)$", r"\g<site>_hc"),
        Route(r"^(?P<key>embed_tokens|norm|lm_head)\.weight$", "top"),
    ),
    mtp_layers=1,  # layers.<num_hidden_layers>: the multi-token-prediction layer
)

_GROUPS = {"mixer", "mlp", "input_layernorm", "post_attention_layernorm", "attn_hc", "ffn_hc"}


def build_block(a: BuildArgs) -> Block:
    """Layer a.index's mHC sites, mixer and FFN from its tensor groups (ContractError naming a
    missing, extra or mis-shaped tensor under ``model.layers.<i>``)."""
    cfg, e, D, p, dtype, groups = a.config, a.engine, a.config.hidden_size, a.where, a.dtype, a.groups
    check_groups(p, groups, _GROUPS)
    hc = {}
    for site in ("attn_hc", "ffn_hc"):
        hc[site] = located(
            f"{p}.hc_{site[:-3]}_*", _core.HyperConnection, e, dict(groups.get(site, {})),
            hidden=D, hc_mult=cfg.hc_mult, sinkhorn_iters=cfg.hc_sinkhorn_iters,
            hc_eps=cfg.hc_eps, norm_eps=cfg.rms_norm_eps, dtype=dtype)
    mixer_w = dict(groups.get("mixer", {}))
    if a.plan.mixer == "kda":
        mixer = KdaMixer(located(
            f"{p}.self_attn", _core.KdaLayer, e, mixer_w, hidden=D, heads=cfg.linear_num_heads,
            head_dim=cfg.linear_head_dim, conv_kernel=cfg.linear_conv_kernel_dim,
            gate="lower_bound" if cfg.linear_lower_bound is not None else "softplus",
            lower_bound=float(cfg.linear_lower_bound or 0.0), rms_eps=cfg.rms_norm_eps, dtype=dtype))
    else:
        indexer = a.plan.options["indexer"]
        full = indexer == "full"
        mixer = MlaMixer(located(
            f"{p}.self_attn", _core.MlaLayer, e, mixer_w, hidden=D, heads=cfg.num_attention_heads,
            q_lora_rank=cfg.q_lora_rank, kv_rank=cfg.kv_lora_rank, d_nope=cfg.qk_nope_head_dim,
            d_rope=cfg.qk_rope_head_dim, d_v=cfg.v_head_dim, rms_eps=cfg.rms_norm_eps, sparse=True,
            index_heads=cfg.index_n_heads if full else 0,
            index_head_dim=cfg.index_head_dim if full else 0, kpool=cfg.index_kpool,
            topk=cfg.index_topk, tail_rows=2 * cfg.index_kpool, rotate=False, dtype=dtype), indexer)
    mlp_w = dict(groups.get("mlp", {}))
    if a.plan.ffn == "sparse":
        ffn = located(
            f"{p}.mlp", _core.MoeLayer, e, mlp_w, hidden=D, n_experts=cfg.n_routed_experts,
            top_k=cfg.num_experts_per_tok, n_group=cfg.n_group, topk_group=cfg.topk_group,
            intermediate=cfg.moe_intermediate_size,
            shared_intermediate=cfg.moe_intermediate_size * cfg.n_shared_experts,
            norm_topk_prob=cfg.norm_topk_prob, routed_scaling=cfg.routed_scaling_factor,
            swiglu_limit=cfg.swiglu_limit, dtype=dtype)
    else:
        ffn = located(f"{p}.mlp", _core.MlpLayer, e, mlp_w, hidden=D, intermediate=cfg.intermediate_size,
                      swiglu_limit=cfg.swiglu_limit, dtype=dtype)
    return Block(
        mixer_site=MhcSite(hc["attn_hc"], norm_vector(f"{p}.input_layernorm",
                                                      groups.get("input_layernorm", {}), D)),
        mixer=mixer,
        ffn_site=MhcSite(hc["ffn_hc"], norm_vector(f"{p}.post_attention_layernorm",
                                                   groups.get("post_attention_layernorm", {}), D)),
        ffn=ffn)


FAMILY = Family(
    name="glm5_next",
    model_types=("glm5_next", "glm5_next_text"),
    reference="transformers 5.17 models/glm5_next",
    parse_config=parse_config,
    layer_plan=layer_plan,
    names=NAMES,
    residual=lambda cfg: MhcResidual(cfg.hc_mult, cfg.rms_norm_eps),
    build_block=build_block,
)
