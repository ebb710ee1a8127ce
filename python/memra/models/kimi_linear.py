"""Kimi-Linear (``kimi_linear``): the family's config, layer plan, checkpoint names and blocks.

Reference: transformers 5.17 ``models/kimi_linear`` (``configuration_kimi_linear.py``,
``modeling_kimi_linear.py``). The text model: token embedding; per layer a plain pre-norm
residual (memra.models.residual.PlainResidual) around the mixer (KDA with the softplus gate, or
MLA without query LoRA whose ``qk_rope_head_dim`` key columns are never rotated, dense causal,
no indexer) and around the FFN (dense SwiGLU MLP, or the MoE: sigmoid router on f32 logits,
``e_score_correction_bias`` for choosing only, grouped selection, renormalised top-k weights
times ``routed_scaling_factor``, shared experts added unweighted; no SwiGLU clamp); then the
final RMSNorm and an LM head that is never tied (``KimiLinearForCausalLM._tied_weights_keys``
is empty, whatever ``tie_word_embeddings`` says).

:func:`parse_config` reproduces ``KimiLinearConfig.__post_init__`` for both forms of config.json:
the release's (``linear_attn_config`` with 1-based ``kda_layers`` / ``full_attn_layers``, the
MoE fields under their ``attribute_map`` aliases ``num_experts``, ``num_expert_group``, ...,
``first_k_dense_replace``) and the one ``save_pretrained`` writes (``layer_types``,
``mlp_layer_types``, ``linear_*``). It is tested against transformers' own parse
(tests/fixtures/kimi_linear_config_cases.json). Where transformers silently runs something other
than what the config says, memra refuses by name instead (see :func:`_validate`).
"""

from __future__ import annotations

import dataclasses
import math
import typing
from dataclasses import dataclass, field
from typing import Any, TypedDict

from .. import _core
from ..config import ALLOWED_ATTN_LAYER_TYPES, Eps, Positions, Size, check_fields, check_grouped_router, check_positive, check_size_product, field_ranges
from ..errors import ContractError, UnsupportedError
from ..loader import NameTable, Route
from .layers import KdaMixer, MlaMixer, check_groups, located, norm_vector
from .registry import Block, BuildArgs, Family, LayerPlan
from .residual import NormSite, PlainResidual

KDA, MLA = "linear_attention", "full_attention"

# KimiLinearAttention builds kv_a_layernorm (and q_a_layernorm) as KimiLinearRMSNorm(dim), whose
# default eps is 1e-6: these norms do not take rms_norm_eps.
LATENT_NORM_EPS = 1e-6

# Kimi's MLPs have no SwiGLU clamp; memra's clamp min(g, inf), clamp(u, -inf, inf) returns g and u
# unchanged (NaN included) on the CPU and in every CUDA kernel, so inf is "no clamp".
NO_CLAMP = math.inf



@dataclass
class KimiLinearConfig:
    """The text model of Kimi-Linear (``kimi_linear``), as transformers parses it.

    The fields down to ``linear_conv_kernel_dim`` are ``KimiLinearConfig``'s (annotations: the
    typed table of config.json, memra.config.check_fields, every size a
    :data:`memra.config.Size`, at most 2^20; defaults: transformers'). After
    :func:`parse_config`: ``layer_types`` / ``mlp_layer_types`` hold num_hidden_layers entries,
    ``num_key_value_heads`` is set, and the ``attribute_map`` aliases of config.json
    (``num_experts``, ``num_experts_per_token``, ``num_shared_experts``, ``num_expert_group``,
    ``moe_renormalize``, ``model_max_length``) have been written to the fields they name.

    ``qk_head_dim`` / ``head_dim``: transformers' derived attributes (config.json's values when it
    has them; memra reads neither: the score scale is (nope + rope)^-0.5 as the modeling file
    computes it). ``declared_tie_word_embeddings``: config.json's ``tie_word_embeddings``;
    ``tie_word_embeddings``: whether the LM head is the embedding, which for this family is never
    (``_tied_weights_keys = {}``), so the shared decoder always wants ``lm_head.weight``.
    ``extra`` keeps the other keys transformers takes as kwargs.
    """

    vocab_size: Size = 163840
    hidden_size: Size = 2304
    intermediate_size: Size = 9216
    moe_intermediate_size: Size = 1024
    num_hidden_layers: Size = 27
    num_attention_heads: Size = 32
    num_key_value_heads: Size | None = 32
    n_shared_experts: Size = 1
    routed_scaling_factor: float = 2.446
    kv_lora_rank: Size = 512
    q_lora_rank: Size | None = None
    qk_rope_head_dim: Size = 64
    v_head_dim: Size | None = 128
    qk_nope_head_dim: Size = 128
    n_group: Size = 1
    topk_group: Size | None = 1
    num_experts_per_tok: Size | None = 8
    norm_topk_prob: bool = True
    hidden_act: str = "silu"
    max_position_embeddings: Positions = 1048576
    initializer_range: float = 0.02
    rms_norm_eps: Eps = 1e-5
    use_cache: bool = True
    pad_token_id: int | None = 163839
    bos_token_id: int | None = 163584
    eos_token_id: int | list[int] | None = 163586
    pretraining_tp: int | None = 1
    declared_tie_word_embeddings: bool = False
    attention_bias: bool = False
    attention_dropout: float | None = 0.0
    num_local_experts: Size = 256
    mlp_layer_types: list[str] | None = None
    layer_types: list[str] | None = None
    linear_head_dim: Size = 128
    linear_num_heads: Size = 32
    linear_conv_kernel_dim: Size = 4
    qk_head_dim: int | None = None
    head_dim: int | None = None
    tie_word_embeddings: bool = False
    model_type: str = "kimi_linear"
    extra: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        """Every field as a plain dict (``extra`` included)."""
        return dataclasses.asdict(self)


class _LinearAttnConfig(TypedDict, total=False):
    head_dim: Size
    num_heads: Size
    short_conv_kernel_size: Size
    kda_layers: list[int]
    full_attn_layers: list[int]


class _Kwargs(TypedDict, total=False):
    """Keys outside KimiLinearConfig's fields that the parse reads (transformers' kwargs), with
    the release's remote-code fields memra checks against what transformers runs."""

    tie_word_embeddings: bool
    num_experts: Size
    num_experts_per_token: Size | None
    num_shared_experts: Size
    num_expert_group: Size
    moe_renormalize: bool
    model_max_length: int
    head_dim: int | None
    qk_head_dim: int | None
    first_k_dense_replace: int
    linear_attn_config: _LinearAttnConfig
    mla_use_nope: bool
    moe_router_activation_func: str
    moe_layer_freq: int
    use_grouped_topk: bool


# KimiLinearConfig.attribute_map: config.json alias -> field. transformers sets the aliases as
# kwargs after the fields, so an alias wins over its field when config.json has both.
_ALIASES = {
    "model_max_length": "max_position_embeddings",
    "moe_renormalize": "norm_topk_prob",
    "num_expert_group": "n_group",
    "num_experts": "num_local_experts",
    "num_experts_per_token": "num_experts_per_tok",
    "num_shared_experts": "n_shared_experts",
}
_DERIVED = ("qk_head_dim", "head_dim", "tie_word_embeddings", "declared_tie_word_embeddings")
_HINTS = typing.get_type_hints(KimiLinearConfig)
_TF_FIELDS = [f.name for f in dataclasses.fields(KimiLinearConfig)
              if f.name not in _DERIVED + ("model_type", "extra")]
_FIELDS = {k: _HINTS[k] for k in _TF_FIELDS}
_RANGES = {k: r for k, r in field_ranges(KimiLinearConfig).items() if k in _TF_FIELDS}
_DEFAULTS = {f.name: f.default for f in dataclasses.fields(KimiLinearConfig) if f.name in _TF_FIELDS}
_KWARG_TYPES = typing.get_type_hints(_Kwargs)
_KWARG_RANGES = field_ranges(_Kwargs)
_DROPPED = ("model_type", "transformers_version", "dtype", "torch_dtype", "architectures", "_name_or_path")


def _layers_from_lists(lac: dict[str, Any], n: int) -> list[str]:
    """layer_types from linear_attn_config's 1-based kda_layers / full_attn_layers, as
    KimiLinearConfig.__post_init__ places them; ContractError where transformers would fail
    (an entry past the last layer, a layer in neither list) or silently run another layer than
    the list names (entry 0 or below wraps to a layer from the end; a layer in both lists)."""
    types: list[str | None] = [None] * n
    for key, kind in (("full_attn_layers", MLA), ("kda_layers", KDA)):
        for j, layer in enumerate(lac[key]):
            if not 1 <= layer <= n:
                raise ContractError(
                    f"config: linear_attn_config.{key}[{j}] = {layer} is outside [1, {n}] (the lists "
                    f"are 1-based: layer 1 is the first of num_hidden_layers = {n})", 40025)
            if types[layer - 1] is not None:
                raise ContractError(
                    f"config: layer {layer} (1-based) is in both linear_attn_config.kda_layers and "
                    "full_attn_layers (transformers would build KDA there)", 40025)
            types[layer - 1] = kind
    missing = [i + 1 for i, t in enumerate(types) if t is None]
    if missing:
        raise ContractError(f"config: layers {missing} (1-based) are in neither linear_attn_config.kda_layers "
                            "nor full_attn_layers", 40025)
    return typing.cast(list[str], types)


def _post_init(raw: dict[str, Any]) -> dict[str, Any]:
    """KimiLinearConfig.__post_init__ on a config.json dict (returns the parsed fields)."""
    fields = {k: v for k, v in raw.items() if k not in _DROPPED}
    c = dict(_DEFAULTS)
    c.update({k: fields[k] for k in _TF_FIELDS if k in fields})
    kwargs = {k: v for k, v in fields.items() if k not in _TF_FIELDS}
    if c["num_key_value_heads"] is None:
        c["num_key_value_heads"] = c["num_attention_heads"]
    c["qk_head_dim"] = c["qk_nope_head_dim"] + c["qk_rope_head_dim"]
    c["head_dim"] = c["qk_rope_head_dim"]
    # PreTrainedConfig.__post_init__ sets the kwargs as attributes: an alias writes its field,
    # and config.json's head_dim / qk_head_dim replace the derived ones.
    for k, v in kwargs.items():
        if k in _ALIASES:
            c[_ALIASES[k]] = v
        elif k in ("head_dim", "qk_head_dim"):
            c[k] = v
    c["declared_tie_word_embeddings"] = bool(kwargs.get("tie_word_embeddings", False))
    c["tie_word_embeddings"] = False
    lac = kwargs.get("linear_attn_config", {})
    c["linear_head_dim"] = lac.get("head_dim", c["linear_head_dim"])
    c["linear_num_heads"] = lac.get("num_heads", c["linear_num_heads"])
    c["linear_conv_kernel_dim"] = lac.get("short_conv_kernel_size", c["linear_conv_kernel_dim"])
    n = c["num_hidden_layers"]
    if c["layer_types"] is None:  # layer_types in config.json wins over linear_attn_config's lists
        if "full_attn_layers" in lac and "kda_layers" in lac:
            c["layer_types"] = _layers_from_lists(lac, n)
        elif "full_attn_layers" in lac or "kda_layers" in lac:
            have, lack = ("kda_layers", "full_attn_layers") if "kda_layers" in lac else (
                "full_attn_layers", "kda_layers")
            raise ContractError(
                f"config: linear_attn_config has {have} but no {lack} (transformers would ignore it and "
                "place the layers by its default schedule)", 40025)
        else:
            c["layer_types"] = [MLA if i and i % 4 == 0 else KDA for i in range(n)]
    if c["mlp_layer_types"] is None:
        first_dense = kwargs.get("first_k_dense_replace", 1)
        c["mlp_layer_types"] = ["dense" if i < first_dense else "sparse" for i in range(n)]
    c["extra"] = {k: v for k, v in kwargs.items() if k not in _ALIASES}
    return c


def _validate(c: dict[str, Any]) -> None:
    """What transformers refuses (at parse or when it builds the model), and memra's refusals:
    UnsupportedError for a config memra does not run, also where transformers would silently run
    something else than the config says (the release's remote-code fields it ignores)."""
    n = c["num_hidden_layers"]
    for name, allowed in (("layer_types", ALLOWED_ATTN_LAYER_TYPES), ("mlp_layer_types", ("dense", "sparse"))):
        types = c[name]
        if len(types) != n:
            raise ContractError(f"config: {name} has {len(types)} entries for num_hidden_layers = {n}", 40025)
        for i, t in enumerate(types):
            if t not in allowed:
                raise ContractError(f"config: {name}[{i}] = {t!r} is not one of {list(allowed)}", 40025)
    for i, t in enumerate(c["layer_types"]):
        if t not in (KDA, MLA):
            # transformers builds a KDA layer for any type but full_attention, then calls it as
            # attention: refused rather than guessed.
            raise UnsupportedError(f"config: layer {i} has layer type {t!r}; Kimi-Linear layers are "
                                   f"{KDA!r} (KDA) or {MLA!r} (MLA)", 50000)
    mla = MLA in c["layer_types"]
    sparse = "sparse" in c["mlp_layer_types"]
    check_positive(c, ("linear_num_heads", "linear_head_dim", "linear_conv_kernel_dim", "intermediate_size"))
    if mla:
        check_positive(c, ("num_attention_heads", "kv_lora_rank", "qk_nope_head_dim", "v_head_dim"))
        check_positive(c, ("qk_rope_head_dim",), low=0)
        if c["num_key_value_heads"] != c["num_attention_heads"]:
            raise ContractError(
                f"config: num_key_value_heads ({c['num_key_value_heads']}) must equal num_attention_heads "
                f"({c['num_attention_heads']}): kv_b_proj expands the latent into every head", 40025)
        if c["q_lora_rank"] is not None:
            raise UnsupportedError(
                f"config: q_lora_rank = {c['q_lora_rank']}: memra runs Kimi-Linear's MLA without query "
                "LoRA (q_proj; q_lora_rank null, as released)", 50000)
        if c["attention_bias"]:
            raise UnsupportedError("config: attention_bias = true: memra runs Kimi-Linear's MLA without "
                                   "projection biases (as released)", 50000)
        if c["extra"].get("mla_use_nope") is False and c["qk_rope_head_dim"] > 0:
            raise UnsupportedError(
                "config: mla_use_nope = false asks for rotated rope columns (the release's modeling "
                "code); transformers' KimiLinearAttention never rotates them", 50000)
    if c["hidden_act"] not in ("silu", "swish"):  # transformers' ACT2FN: both are nn.SiLU
        raise UnsupportedError(f"config: hidden_act = {c['hidden_act']!r}: memra runs Kimi-Linear's short "
                               "conv and MLPs with SiLU", 50000)
    if sparse:
        _validate_moe(c)


def _validate_moe(c: dict[str, Any]) -> None:
    """The router's geometry (KimiLinearTopkRouter) and the remote-code MoE fields."""
    named = {field: alias for alias, field in _ALIASES.items()}  # the release's config.json uses the aliases
    check_positive(c, ("num_local_experts", "num_experts_per_tok", "n_group", "topk_group",
                  "moe_intermediate_size"), aliases=named)
    check_positive(c, ("n_shared_experts",), low=0, aliases=named)
    # The shared experts run as one MLP of this width.
    check_size_product(c, ("moe_intermediate_size", "n_shared_experts"), "the shared expert's width")
    check_grouped_router(c, "num_local_experts", "num_experts")
    G, kg = c["n_group"], c["topk_group"]
    extra = c["extra"]
    act = extra.get("moe_router_activation_func", "sigmoid")
    if act != "sigmoid":
        raise UnsupportedError(f"config: moe_router_activation_func = {act!r}: transformers' "
                               "KimiLinearTopkRouter (and memra) route by sigmoid", 50000)
    if extra.get("use_grouped_topk") is False and kg < G:
        raise UnsupportedError(
            "config: use_grouped_topk = false with topk_group < n_group: transformers' router always "
            "keeps only the topk_group best groups", 50000)
    freq = extra.get("moe_layer_freq", 1)
    if freq < 1:
        raise ContractError(f"config: moe_layer_freq must be >= 1, got {freq}", 40025)
    off = [i for i, t in enumerate(c["mlp_layer_types"]) if t == "sparse" and i % freq]
    if off:
        raise UnsupportedError(
            f"config: moe_layer_freq = {freq} makes layers {off} dense in the release's modeling code; "
            "transformers ignores it and runs them as MoE", 50000)


def parse_config(raw: dict[str, Any]) -> KimiLinearConfig:
    """Parse a kimi_linear ``config.json`` dict (either form, see the module docstring).

    Raises ContractError naming a wrongly typed key or a config transformers refuses or would
    misplace (1-based layer lists out of range or overlapping, geometry its modules cannot
    build), and UnsupportedError for one memra does not run (named). Does not modify `raw`.
    """
    if not isinstance(raw, dict):
        raise ContractError(f"config: config.json must hold a JSON object, got a {type(raw).__name__}", 40025)
    if raw.get("model_type") != "kimi_linear":
        raise UnsupportedError(
            f"config: model_type {raw.get('model_type')!r} wraps a kimi_linear text_config; memra reads "
            "Kimi-Linear's causal-LM config.json (model_type 'kimi_linear' at the top level)", 50000)
    check_fields(raw, _FIELDS, ranges=_RANGES)
    check_fields(raw, _KWARG_TYPES, ranges=_KWARG_RANGES)
    c = _post_init(raw)
    _validate(c)
    return KimiLinearConfig(**c)


def layer_plan(cfg: KimiLinearConfig) -> list[LayerPlan]:
    """Per layer: KDA or MLA, dense or sparse FFN, and its cache plane (KDA: conv ring and
    recurrent state; MLA: latent rows [kv_lora_rank + qk_rope_head_dim])."""
    plan = []
    for i in range(cfg.num_hidden_layers):
        ffn = "sparse" if cfg.mlp_layer_types[i] == "sparse" else "dense"
        if cfg.layer_types[i] == KDA:
            state = _core.LayerStateSpec.kda(heads=cfg.linear_num_heads, head_dim=cfg.linear_head_dim,
                                             conv_kernel=cfg.linear_conv_kernel_dim)
            plan.append(LayerPlan("kda", ffn, state))
        else:
            state = _core.LayerStateSpec.mla(row_width=cfg.kv_lora_rank + cfg.qk_rope_head_dim)
            plan.append(LayerPlan("mla", ffn, state))
    return plan


# Names on disk (what save_pretrained and the release write, model.* for KimiLinearForCausalLM).
# transformers 5.17's conversion renames .block_sparse_moe. <-> .mlp. for every layer, so a
# layer's FFN may sit under either prefix (the release: dense layers under mlp.*); each prefix is
# its own group and a layer holding both is refused. Experts are stored per expert as w1 (gate),
# w3 (up), w2 (down); MoeLayer names them gate_proj / up_proj / down_proj. Expert tensors of
# any other name match no route (transformers would not load them either).
_FFN = r"^layers\.(?P<layer>\d+)\.(?P<ffn>mlp|block_sparse_moe)\."
_EXPERT_NAMES = {"w1": "gate_proj", "w3": "up_proj", "w2": "down_proj"}
NAMES = NameTable(
    prefixes=("model.",),
    routes=(
        Route(r"^layers\.(?P<layer>\d+)\.self_attn\.(?P<key>.+)$", "mixer"),
        *(Route(_FFN + rf"experts\.(?P<e>\d+)\.{w}\.weight$", r"\g<ffn>", rf"experts.\g<e>.{name}.weight")
          for w, name in _EXPERT_NAMES.items()),
        Route(_FFN + r"(?P<key>(?!experts\.).+)$", r"\g<ffn>"),
        Route(r"^layers\.(?P<layer>\d+)\.(?P<norm>input_layernorm|post_attention_layernorm)\.weight$",
              r"\g<norm>", "weight"),
        Route(r"^(?P<key>embed_tokens|norm|lm_head)\.weight$", "top"),
    ),
)

_GROUPS = {"mixer", "mlp", "block_sparse_moe", "input_layernorm", "post_attention_layernorm"}


def _ffn_tensors(where: str, groups) -> tuple[str, dict]:
    """The layer's FFN tensors and the prefix they sit under (ContractError when under both)."""
    both = [g for g in ("mlp", "block_sparse_moe") if groups.get(g)]
    if len(both) == 2:
        raise ContractError(
            f"{where}: FFN tensors under both mlp.* ({sorted(groups['mlp'])[:3]}...) and block_sparse_moe.* "
            f"({sorted(groups['block_sparse_moe'])[:3]}...): one layer's FFN is stored under one of them", 40024)
    prefix = both[0] if both else "block_sparse_moe"
    return prefix, dict(groups.get(prefix, {}))


def build_block(a: BuildArgs) -> Block:
    """Layer a.index's norms, mixer and FFN from its tensor groups (ContractError naming a missing,
    extra or mis-shaped tensor under ``model.layers.<i>``)."""
    cfg, e, D, p, dtype, groups = a.config, a.engine, a.config.hidden_size, a.where, a.dtype, a.groups
    check_groups(p, groups, _GROUPS)
    mixer_w = dict(groups.get("mixer", {}))
    if a.plan.mixer == "kda":
        # KimiLinearDeltaAttention: softplus gate with no lower bound; o_norm eps = rms_norm_eps.
        mixer = KdaMixer(located(
            f"{p}.self_attn", _core.KdaLayer, e, mixer_w, hidden=D, heads=cfg.linear_num_heads,
            head_dim=cfg.linear_head_dim, conv_kernel=cfg.linear_conv_kernel_dim, gate="softplus",
            rms_eps=cfg.rms_norm_eps, dtype=dtype))
    else:
        # KimiLinearAttention: q_proj (no query LoRA), dense causal attention over the latent rows,
        # the rope columns kept raw (rotate=False: the family's decision).
        mixer = MlaMixer(located(
            f"{p}.self_attn", _core.MlaLayer, e, mixer_w, hidden=D, heads=cfg.num_attention_heads,
            q_lora_rank=0, kv_rank=cfg.kv_lora_rank, d_nope=cfg.qk_nope_head_dim,
            d_rope=cfg.qk_rope_head_dim, d_v=cfg.v_head_dim, rms_eps=LATENT_NORM_EPS, sparse=False,
            rotate=False, dtype=dtype), "")
    prefix, ffn_w = _ffn_tensors(p, groups)
    if a.plan.ffn == "sparse":
        ffn = located(
            f"{p}.{prefix}", _core.MoeLayer, e, ffn_w, hidden=D, n_experts=cfg.num_local_experts,
            top_k=cfg.num_experts_per_tok, n_group=cfg.n_group, topk_group=cfg.topk_group,
            intermediate=cfg.moe_intermediate_size,
            shared_intermediate=cfg.moe_intermediate_size * cfg.n_shared_experts,
            norm_topk_prob=cfg.norm_topk_prob, routed_scaling=cfg.routed_scaling_factor,
            swiglu_limit=NO_CLAMP, dtype=dtype)
    else:
        ffn = located(f"{p}.{prefix}", _core.MlpLayer, e, ffn_w, hidden=D, intermediate=cfg.intermediate_size,
                      swiglu_limit=NO_CLAMP, dtype=dtype)
    return Block(
        mixer_site=NormSite(norm_vector(f"{p}.input_layernorm", groups.get("input_layernorm", {}), D)),
        mixer=mixer,
        ffn_site=NormSite(norm_vector(f"{p}.post_attention_layernorm",
                                      groups.get("post_attention_layernorm", {}), D)),
        ffn=ffn)


FAMILY = Family(
    name="kimi_linear",
    model_types=("kimi_linear",),
    reference="transformers 5.17 models/kimi_linear",
    parse_config=parse_config,
    layer_plan=layer_plan,
    names=NAMES,
    residual=lambda cfg: PlainResidual(cfg.rms_norm_eps),
    build_block=build_block,
)
