"""What the Qwen3.5, Qwen3.5-MoE and Qwen3-Next families share: the config parse, the layer plan,
the checkpoint names and the block builder.

Reference: transformers 5.17 ``models/qwen3_5``, ``models/qwen3_5_moe``, ``models/qwen3_next``
(``configuration_*.py`` and ``modeling_*.py``). The text model of all three: token embedding;
per layer a pre-norm residual (memra.models.residual.PlainResidual) around the mixer (Gated
DeltaNet for ``"linear_attention"`` layers: memra.GdnLayer; gated full attention with partial
rotary for ``"full_attention"`` layers: memra.AttentionLayer) and around the FFN (the dense SwiGLU
MLP without clamp, or the Qwen MoE: softmax router in f32, top-k, renormalised as the family does,
per-expert SwiGLU experts, and a shared expert scaled by ``sigmoid(x . shared_expert_gate)``); the
final norm and the LM head. The input, post-attention and final norms are zero-centred,
``x * (1 + w)`` computed in f32 (``Qwen3_5RMSNorm``): memra stores ``1 + w`` (f32) at load
(:func:`memra.models.residual.zero_centred`) and runs its plain weighted rms_norm, the same
arithmetic. The GDN output norm (``w * rmsnorm(x) * silu(z)``) and the attention's q/k norms
are the layers' own.

:func:`parse_config` reproduces the configs' ``__post_init__`` (``Qwen3_5TextConfig``,
``Qwen3_5MoeTextConfig``, ``Qwen3NextConfig``) and ``PreTrainedConfig``'s rope standardisation
for both layouts: the causal LM's flat config.json and the conditional-generation one, whose text
model sits in ``text_config`` and whose LM head is tied by the *top-level*
``tie_word_embeddings``. Text-only positions put one position on the three mRoPE grids, so the
``mrope_section`` / ``mrope_interleaved`` keys change nothing and memra runs plain partial RoPE.
What memra does not run is refused by name (UnsupportedError): a layer type other than the two,
a ``rope_type`` other than ``"default"`` (YaRN and the other scalings), an activation other than
SiLU, an odd rotated width.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypedDict

from .. import _core
from ..config import ALLOWED_ATTN_LAYER_TYPES, Eps, FLT_MAX, Positions, Size, check_fields, check_positive, field_ranges
from ..errors import ContractError, UnsupportedError
from ..loader import NameTable, Route
from .layers import AttentionMixer, GdnMixer, check_groups, located, norm_vector
from .registry import Block, BuildArgs, LayerPlan
from .residual import NormSite, zero_centred

GDN, ATTN = "linear_attention", "full_attention"

# The Qwen MLPs have no SwiGLU clamp; memra's clamp with an infinite limit returns gate and up
# unchanged (kimi_linear.NO_CLAMP), so inf is "no clamp".
NO_CLAMP = math.inf

# transformers' _LEGACY_LAYER_TYPE_REMAP (configuration_utils.py), applied by the configs'
# __post_init__ to a given layer_types before its validator checks ALLOWED_ATTN_LAYER_TYPES.
_LEGACY_LAYER_TYPES = {"conv": GDN, "mamba": GDN, "attention": ATTN}
_DEFAULT_THETA = 10_000.0  # RotaryEmbeddingConfigMixin.default_theta


class RopeParameters(TypedDict, total=False):
    """The keys of ``rope_parameters`` (and the legacy ``rope_scaling``) memra reads or checks."""

    rope_type: str
    type: str
    rope_theta: float
    partial_rotary_factor: float
    mrope_section: list[int]
    mrope_interleaved: bool
    factor: float
    original_max_position_embeddings: int


class QwenKwargs(TypedDict, total=False):
    """Keys outside the configs' fields that the parse reads (transformers' kwargs)."""

    full_attention_interval: int
    partial_rotary_factor: float
    rope_theta: float
    rope_scaling: RopeParameters | None
    norm_topk_prob: bool


@dataclass
class QwenTextConfig:
    """The text model of a Qwen3.5-family checkpoint, as transformers parses it.

    The fields down to ``eos_token_id`` are those every one of the three text configs has
    (annotations: the typed table of config.json, every size a :data:`memra.config.Size`, at
    most 2^20; defaults: ``Qwen3_5TextConfig``'s; a family subclasses it with its own defaults and
    fields). After :func:`parse_config`:

    - ``layer_types`` has ``num_hidden_layers`` entries (legacy names mapped);
    - ``rope_parameters`` is standardised as transformers does it (``rope_type``,
      ``rope_theta``, ``partial_rotary_factor`` set); ``rotary_dim`` =
      ``int(head_dim * partial_rotary_factor)`` and ``rope_theta`` its base, as
      ``compute_default_rope_parameters`` reads them;
    - ``mlp_layer_types``: ``"dense"`` or ``"sparse"`` (MoE) per layer, as the decoder layers are
      built;
    - ``tie_word_embeddings``: whether the LM head is the embedding (the causal LM: its own
      ``tie_word_embeddings``; the conditional layout: the top-level one), and
      ``declared_tie_word_embeddings`` the text config's own value;
    - ``model_type``: config.json's top-level type, ``layout`` ``"causal"`` or
      ``"conditional"``; ``extra``: the other keys transformers keeps as attributes.
    """

    vocab_size: Size = 248320
    hidden_size: Size = 4096
    num_hidden_layers: Size = 32
    num_attention_heads: Size = 16
    num_key_value_heads: Size = 4
    hidden_act: str = "silu"
    max_position_embeddings: Positions = 32768
    initializer_range: float = 0.02
    rms_norm_eps: Eps = 1e-6
    use_cache: bool = True
    tie_word_embeddings: bool = False
    rope_parameters: RopeParameters | None = None
    attention_bias: bool = False
    attention_dropout: float = 0.0
    head_dim: Size = 256
    linear_conv_kernel_dim: Size = 4
    linear_key_head_dim: Size = 128
    linear_value_head_dim: Size = 128
    linear_num_key_heads: Size = 16
    linear_num_value_heads: Size = 32
    layer_types: list[str] | None = None
    pad_token_id: int | None = None
    bos_token_id: int | None = None
    eos_token_id: int | list[int] | None = None
    # memra's derived fields (not in config.json's table)
    mlp_layer_types: list[str] = dataclasses.field(default_factory=list)
    rotary_dim: int = 0
    rope_theta: float = _DEFAULT_THETA
    declared_tie_word_embeddings: bool = False
    model_type: str = ""
    layout: str = "causal"
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        """Every field as a plain dict (``extra`` included)."""
        return dataclasses.asdict(self)


_DERIVED = ("mlp_layer_types", "rotary_dim", "rope_theta", "declared_tie_word_embeddings", "model_type",
            "layout", "extra")
_DROPPED = ("model_type", "transformers_version", "dtype", "torch_dtype", "architectures", "_name_or_path")


def config_fields(cls: type) -> dict[str, Any]:
    """config.json's typed table of a family's config dataclass (its transformers fields)."""
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls) if f.name not in _DERIVED}


@dataclass(frozen=True)
class QwenSpec:
    """What one family adds to the shared parse: its config class, the causal LM's and the
    conditional layout's model_type (None: no conditional layout), how its layers' FFNs are chosen
    (``mlp_layer_types(c) -> ["dense" | "sparse"]`` on the parsed fields) and its extra checks
    (``validate(c)``, on the parsed fields, after the shared ones)."""

    config_cls: type
    text_type: str
    conditional_type: str | None
    mlp_layer_types: Callable[[dict[str, Any]], list[str]]
    validate: Callable[[dict[str, Any]], None]
    post_init: Callable[[dict[str, Any], dict[str, Any]], None] = lambda c, kwargs: None


def _text_fields(raw: dict[str, Any], spec: QwenSpec) -> tuple[dict[str, Any], bool, str, str]:
    """(the text config's keys, whether the head is tied, the model_type, the layout), with the
    JSON types checked (ContractError naming the key as it sits in the file)."""
    if not isinstance(raw, dict):
        raise ContractError(f"config: config.json must hold a JSON object, got a {type(raw).__name__}", 40025)
    table, kwarg_types = config_fields(spec.config_cls), typing.get_type_hints(QwenKwargs)
    ranges = field_ranges(spec.config_cls)
    top = raw.get("model_type")
    if spec.conditional_type is not None and top == spec.conditional_type:
        text = raw.get("text_config")
        if text is not None and not isinstance(text, dict):
            raise ContractError(f"config: text_config must be a JSON object or null, got {text!r:.80}", 40025)
        text = text or {}
        nested = text.get("model_type")
        if nested is not None and nested != spec.text_type:
            raise ContractError(
                f"config: text_config.model_type is {nested!r}; a {top!r} checkpoint wraps a "
                f"{spec.text_type!r} text model", 40025)
        check_fields(text, table, "text_config.", ranges=ranges)
        check_fields(text, kwarg_types, "text_config.")
        check_fields(raw, {"tie_word_embeddings": bool})
        # Qwen3_5ForConditionalGeneration ties its head by the top-level tie_word_embeddings (the
        # composite config's own field, default False), never by text_config's.
        return dict(text), bool(raw.get("tie_word_embeddings", False)), top, "conditional"
    if top != spec.text_type:
        kinds = [t for t in (spec.text_type, spec.conditional_type) if t]
        raise UnsupportedError(f"config: model_type {top!r} is not one of {kinds}", 50000)
    check_fields(raw, table, ranges=ranges)
    check_fields(raw, kwarg_types)
    fields = {k: v for k, v in raw.items() if k != "text_config"}
    return fields, bool(raw.get("tie_word_embeddings", False)), top, "causal"


def _rope(c: dict[str, Any], kwargs: dict[str, Any]) -> None:
    """PreTrainedConfig.convert_rope_params_to_dict + standardize_rope_params on the parsed
    fields: rope_scaling (legacy) replaces rope_parameters; the dict keeps its own rope_theta and
    partial_rotary_factor, else takes config.json's top-level ones (the factor defaulted to 0.25
    by the configs' __post_init__, the base to 10000); rope_type from ``type`` or "default"."""
    scaling = kwargs.pop("rope_scaling", None)
    rp = copy.deepcopy(scaling or c["rope_parameters"] or {})
    rp.setdefault("rope_theta", kwargs.pop("rope_theta", _DEFAULT_THETA))
    if kwargs.get("partial_rotary_factor") is not None:
        rp.setdefault("partial_rotary_factor", kwargs["partial_rotary_factor"])
    if not set(rp).isdisjoint(c["layer_types"]):
        raise ContractError(
            f"config: rope_parameters is keyed by layer type ({sorted(set(rp) & set(c['layer_types']))}); "
            "the Qwen rotary embedding reads one rope_parameters for every layer", 40025)
    rp.setdefault("rope_type", rp.get("type", "default"))
    if rp["rope_type"] in ("llama3", "yarn", "longrope"):
        rp.setdefault("original_max_position_embeddings", c["max_position_embeddings"])
    c["rope_parameters"] = rp


def _post_init(fields: dict[str, Any], spec: QwenSpec) -> dict[str, Any]:
    """The text config's __post_init__ on config.json's keys; returns the parsed fields."""
    cls = spec.config_cls
    table = config_fields(cls)
    fields = {k: v for k, v in fields.items() if k not in _DROPPED}
    c = {f.name: copy.deepcopy(f.default) for f in dataclasses.fields(cls) if f.name in table}
    c.update({k: copy.deepcopy(fields[k]) for k in table if k in fields})
    kwargs = {k: copy.deepcopy(v) for k, v in fields.items() if k not in table}
    kwargs.setdefault("partial_rotary_factor", 0.25)  # "assign default for BC"
    spec.post_init(c, kwargs)
    if c["layer_types"] is None:
        interval = kwargs.pop("full_attention_interval", 4)
        if interval < 1:
            raise ContractError(f"config: full_attention_interval must be >= 1, got {interval}", 40025)
        c["layer_types"] = [GDN if (i + 1) % interval else ATTN for i in range(c["num_hidden_layers"])]
    else:
        c["layer_types"] = [_LEGACY_LAYER_TYPES.get(t, t) for t in c["layer_types"]]
    _rope(c, kwargs)
    c["extra"] = kwargs
    return c


def _validate(c: dict[str, Any]) -> None:
    """What transformers refuses, and memra's refusals (UnsupportedError, named)."""
    n = c["num_hidden_layers"]
    types = c["layer_types"]
    if len(types) != n:
        raise ContractError(f"config: layer_types has {len(types)} entries for num_hidden_layers = {n}", 40025)
    for i, t in enumerate(types):
        if t not in ALLOWED_ATTN_LAYER_TYPES:
            raise ContractError(f"config: layer_types[{i}] = {t!r} is not one of {list(ALLOWED_ATTN_LAYER_TYPES)}", 40025)
        if t not in (GDN, ATTN):
            # transformers builds neither mixer for such a layer and runs its residual around nothing.
            raise UnsupportedError(f"config: layer {i} has layer type {t!r}; Qwen3.5-family layers are "
                                   f"{GDN!r} (Gated DeltaNet) or {ATTN!r}", 50000)
    if c["hidden_act"] not in ("silu", "swish"):  # transformers' ACT2FN: both are nn.SiLU
        raise UnsupportedError(f"config: hidden_act = {c['hidden_act']!r}: memra runs the Qwen short conv "
                               "and MLPs with SiLU", 50000)
    if GDN in types:
        check_positive(c, ("linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim",
                      "linear_value_head_dim", "linear_conv_kernel_dim"))
        if c["linear_num_value_heads"] % c["linear_num_key_heads"]:
            raise ContractError(
                f"config: linear_num_value_heads ({c['linear_num_value_heads']}) must be a multiple of "
                f"linear_num_key_heads ({c['linear_num_key_heads']}): value head h reads key head "
                "h // (value heads / key heads)", 40025)
    rp = c["rope_parameters"]
    if rp["rope_type"] != "default":
        raise UnsupportedError(f"config: rope_parameters.rope_type = {rp['rope_type']!r}: memra runs the "
                               "Qwen attention with the default RoPE frequencies", 50000)
    c["rope_theta"] = rp["rope_theta"]
    if ATTN in types:
        check_positive(c, ("num_attention_heads", "num_key_value_heads", "head_dim"))
        if c["num_attention_heads"] % c["num_key_value_heads"]:
            raise ContractError(f"config: num_attention_heads ({c['num_attention_heads']}) must be a multiple "
                                f"of num_key_value_heads ({c['num_key_value_heads']})", 40025)
        if not (isinstance(c["rope_theta"], (int, float)) and c["rope_theta"] > 0):
            raise ContractError(f"config: rope_theta must be > 0, got {c['rope_theta']!r}", 40025)
    factor = rp.get("partial_rotary_factor", 1.0)
    # compute_default_rope_parameters: dim = int(head_dim * partial_rotary_factor)
    c["rotary_dim"] = int(c["head_dim"] * factor)
    if ATTN in types and not 0 <= c["rotary_dim"] <= c["head_dim"]:
        raise ContractError(f"config: partial_rotary_factor = {factor} rotates {c['rotary_dim']} of head_dim = "
                            f"{c['head_dim']} dims", 40025)
    if ATTN in types and c["rotary_dim"] % 2:
        raise UnsupportedError(f"config: partial_rotary_factor = {factor} rotates an odd {c['rotary_dim']} "
                               "dims (transformers would rotate one more); memra rotates pairs", 50000)
    if ATTN in types and c["rotary_dim"]:
        _check_rope_angles(c["rope_theta"], c["rotary_dim"])


def _check_rope_angles(theta: float, rotary_dim: int) -> None:
    """ContractError naming rope_theta when a RoPE angle (position x inv_freq, float32 as in
    transformers) can overflow for an int32 position: a base far below 1 (1e-45, say) makes the
    largest frequency huge or infinite, and then every rotated row NaN. AttentionLayer::create
    refuses the same (for direct layer users); here the message names the config key."""
    try:
        top = max(float(f) for f in _core.rope_inv_freq(theta, rotary_dim))
    except ContractError:  # a frequency that is not a finite float32
        top = math.inf
    if not top * 2.0**31 <= FLT_MAX:
        raise ContractError(f"config: rope_theta = {theta!r} is too small: its largest RoPE frequency ({top:.3g}) "
                            "times a position overflows float32 (angle = position x inv_freq)", 40025)


def parse_config(raw: dict[str, Any], spec: QwenSpec):
    """Parse a config.json dict of either layout into ``spec.config_cls`` (see the module
    docstring). Raises ContractError naming a wrongly typed key or a config transformers refuses
    (or fails on), UnsupportedError for one memra does not run (named). Does not modify `raw`."""
    fields, tied, model_type, layout = _text_fields(raw, spec)
    declared = fields.get("tie_word_embeddings", False)
    c = _post_init(fields, spec)
    _validate(c)
    c["mlp_layer_types"] = spec.mlp_layer_types(c)
    spec.validate(c)
    c.update(tie_word_embeddings=tied, declared_tie_word_embeddings=declared, model_type=model_type,
             layout=layout)
    return spec.config_cls(**c)


def check_moe(c: dict[str, Any]) -> None:
    """The MoE geometry where some layer is sparse (Qwen3_5MoeSparseMoeBlock / Qwen3NextSparseMoeBlock)."""
    if "sparse" not in c["mlp_layer_types"]:
        return
    check_positive(c, ("num_experts", "num_experts_per_tok", "moe_intermediate_size"))
    # 0: transformers builds a zero-width shared expert, which adds nothing (MoeLayer: none).
    check_positive(c, ("shared_expert_intermediate_size",), low=0)
    if c["num_experts_per_tok"] > c["num_experts"]:
        raise ContractError(f"config: num_experts_per_tok ({c['num_experts_per_tok']}) exceeds num_experts "
                            f"({c['num_experts']})", 40025)


# ------------------------------------------------------------------------------------------ plan
def layer_plan(cfg: QwenTextConfig) -> list[LayerPlan]:
    """Per layer: ``"gdn"`` (conv ring and recurrent state) or ``"attention"`` (K/V rows), and
    ``"dense"`` or ``"sparse"`` FFN."""
    plan = []
    for i in range(cfg.num_hidden_layers):
        ffn = cfg.mlp_layer_types[i]
        if cfg.layer_types[i] == GDN:
            state = _core.LayerStateSpec.gdn(
                key_heads=cfg.linear_num_key_heads, value_heads=cfg.linear_num_value_heads,
                key_head_dim=cfg.linear_key_head_dim, value_head_dim=cfg.linear_value_head_dim,
                conv_kernel=cfg.linear_conv_kernel_dim)
            plan.append(LayerPlan("gdn", ffn, state))
        else:
            state = _core.LayerStateSpec.attention(kv_heads=cfg.num_key_value_heads, head_dim=cfg.head_dim)
            plan.append(LayerPlan("attention", ffn, state))
    return plan


# ------------------------------------------------------------------------------------------ names
# Names on disk (save_pretrained, the releases): model.* for the causal LM, model.language_model.*
# for the conditional layout (its vision tower model.visual.* and the multi-token-prediction block
# mtp.* are skipped with one notice each). Experts are stored per expert
# (mlp.experts.N.{gate,up,down}_proj.weight); memra.MoeLayer names the shared expert
# shared_experts.* and its gate shared_expert_gate.weight. Under mlp.* only the names below are
# taken: any other is an unexpected tensor, named by the loader.
_MLP = r"^layers\.(?P<layer>\d+)\.mlp\."
_PROJ = r"(?P<w>gate_proj|up_proj|down_proj)\.weight$"
NAMES = NameTable(
    prefixes=("model.language_model.", "model."),
    routes=(
        Route(r"^layers\.(?P<layer>\d+)\.(?P<g>linear_attn|self_attn)\.(?P<key>.+)$", r"\g<g>"),
        Route(_MLP + r"experts\.(?P<e>\d+)\." + _PROJ, "mlp", r"experts.\g<e>.\g<w>.weight"),
        Route(_MLP + r"shared_expert\." + _PROJ, "mlp", r"shared_experts.\g<w>.weight"),
        Route(_MLP + r"(?P<key>gate\.weight|shared_expert_gate\.weight|(gate|up|down)_proj\.weight)$", "mlp"),
        Route(r"^layers\.(?P<layer>\d+)\.(?P<norm>input_layernorm|post_attention_layernorm)\.weight$",
              r"\g<norm>", "weight"),
        Route(r"^(?P<key>embed_tokens|norm|lm_head)\.weight$", "top"),
    ),
    mtp=(r"^mtp\.",),
)

# The GDN input projections of each layout (GdnLayer reads either; a family takes its own only).
QWEN3_5_PROJECTIONS = ("in_proj_qkv.weight", "in_proj_z.weight", "in_proj_b.weight", "in_proj_a.weight")
QWEN3_NEXT_PROJECTIONS = ("in_proj_qkvz.weight", "in_proj_ba.weight")
_ALL_PROJECTIONS = QWEN3_5_PROJECTIONS + QWEN3_NEXT_PROJECTIONS
_ATTN_BIASES = ("q_proj.bias", "k_proj.bias", "v_proj.bias", "o_proj.bias")


def _gdn_weights(where: str, w: dict, projections: tuple[str, ...]) -> dict:
    other = sorted(k for k in w if k in _ALL_PROJECTIONS and k not in projections)
    if other:
        raise ContractError(f"{where}: unexpected tensor(s) {other}: this family's Gated DeltaNet "
                            f"projections are {list(projections)}", 40024)
    return w


def _attention_weights(where: str, w: dict, bias: bool) -> dict:
    """The attention's tensors, with the biases attention_bias asks for (all four, or none)."""
    have = [k for k in _ATTN_BIASES if k in w]
    if bias and len(have) != len(_ATTN_BIASES):
        missing = [k for k in _ATTN_BIASES if k not in w]
        raise ContractError(f"{where}: missing tensor(s) {missing} (attention_bias is true)", 40024)
    if not bias and have:
        raise ContractError(f"{where}: unexpected tensor(s) {have} (attention_bias is false)", 40024)
    return w


def build_block(a: BuildArgs, *, projections: tuple[str, ...], moe: dict[str, Any] | None) -> Block:
    """Layer a.index's norms, mixer and FFN from its tensor groups (ContractError naming a missing,
    extra or mis-shaped tensor under ``model.layers.<i>``). projections: the family's GDN input
    projections; moe: the MoeLayer arguments of its sparse layers (None: no sparse layer)."""
    cfg, e, D, p, dtype, groups = a.config, a.engine, a.config.hidden_size, a.where, a.dtype, a.groups
    gdn = a.plan.mixer == "gdn"
    check_groups(p, groups, {"linear_attn" if gdn else "self_attn", "mlp", "input_layernorm",
                             "post_attention_layernorm"})
    if gdn:
        w = _gdn_weights(f"{p}.linear_attn", dict(groups.get("linear_attn", {})), projections)
        mixer = GdnMixer(located(
            f"{p}.linear_attn", _core.GdnLayer, e, w, hidden=D, key_heads=cfg.linear_num_key_heads,
            value_heads=cfg.linear_num_value_heads, key_head_dim=cfg.linear_key_head_dim,
            value_head_dim=cfg.linear_value_head_dim, conv_kernel=cfg.linear_conv_kernel_dim,
            rms_eps=cfg.rms_norm_eps, dtype=dtype))
    else:
        w = _attention_weights(f"{p}.self_attn", dict(groups.get("self_attn", {})), cfg.attention_bias)
        # q_norm / k_norm as stored (zero-centred: the layer multiplies by 1 + w).
        mixer = AttentionMixer(located(
            f"{p}.self_attn", _core.AttentionLayer, e, w, hidden=D, heads=cfg.num_attention_heads,
            kv_heads=cfg.num_key_value_heads, head_dim=cfg.head_dim, rotary_dim=cfg.rotary_dim,
            rope_theta=float(cfg.rope_theta), rms_eps=cfg.rms_norm_eps, dtype=dtype))
    ffn_w = dict(groups.get("mlp", {}))
    if a.plan.ffn == "sparse":
        assert moe is not None
        ffn = located(f"{p}.mlp", _core.MoeLayer, e, ffn_w, hidden=D, n_experts=cfg.num_experts,
                      top_k=cfg.num_experts_per_tok, n_group=1, topk_group=1,
                      intermediate=cfg.moe_intermediate_size,
                      shared_intermediate=cfg.shared_expert_intermediate_size, routed_scaling=1.0,
                      swiglu_limit=NO_CLAMP, scoring="softmax", shared_gate=True, dtype=dtype, **moe)
    else:
        ffn = located(f"{p}.mlp", _core.MlpLayer, e, ffn_w, hidden=D, intermediate=cfg.intermediate_size,
                      swiglu_limit=NO_CLAMP, dtype=dtype)
    return Block(
        mixer_site=NormSite(zero_centred(norm_vector(f"{p}.input_layernorm", groups.get("input_layernorm", {}), D))),
        mixer=mixer,
        ffn_site=NormSite(zero_centred(norm_vector(f"{p}.post_attention_layernorm",
                                                   groups.get("post_attention_layernorm", {}), D))),
        ffn=ffn)
