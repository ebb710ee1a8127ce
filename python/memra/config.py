"""Model configuration read from a Hugging Face ``config.json``.

:func:`parse_glm5_next` reproduces ``Glm5NextTextConfig.__post_init__`` and
``Glm5NextConfig.__post_init__`` of transformers 5.17 (``models/glm5_next/configuration_glm5_next.py``):
the nested ``text_config`` and the flat form, the default layer and MLP schedules,
``index_topk_pattern`` / ``index_topk_freq`` / ``index_skip_topk_offset``, ``linear_attn_config``,
and ``"full_attention"`` renamed to ``"deepseek_sparse_attention"``. The result is tested against
transformers' own parse (tests/fixtures/glm5_next_config_cases.json).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import ContractError, UnsupportedError

# Defaults of Glm5NextTextConfig (transformers 5.17).
_GLM5_TEXT_DEFAULTS: dict[str, Any] = dict(
    vocab_size=154880,
    hidden_size=4096,
    intermediate_size=12288,
    moe_intermediate_size=2048,
    num_hidden_layers=45,
    num_attention_heads=64,
    num_key_value_heads=64,
    n_shared_experts=1,
    n_routed_experts=288,
    routed_scaling_factor=2.5,
    kv_lora_rank=512,
    q_lora_rank=1536,
    qk_rope_head_dim=0,
    v_head_dim=256,
    qk_nope_head_dim=256,
    n_group=1,
    topk_group=1,
    num_experts_per_tok=8,
    norm_topk_prob=True,
    hidden_act="silu",
    max_position_embeddings=1048576,
    rms_norm_eps=1e-5,
    pad_token_id=154820,
    bos_token_id=None,
    eos_token_id=None,
    tie_word_embeddings=False,
    mlp_layer_types=None,
    attention_bias=False,
    index_topk=2048,
    index_head_dim=128,
    index_n_heads=32,
    layer_types=None,
    indexer_types=None,
    swiglu_limit=10.0,
    linear_head_dim=128,
    linear_num_heads=64,
    linear_conv_kernel_dim=4,
    linear_lower_bound=-5.0,
    hc_mult=4,
    hc_eps=1e-6,
    hc_sinkhorn_iters=20,
    index_kpool=16,
    index_kpool_always_select_tail=True,
)


@dataclass
class Glm5NextConfig:
    """The text model of GLM-5.3-Flash (``glm5_next``), as transformers parses it."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    moe_intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    n_shared_experts: int
    n_routed_experts: int
    routed_scaling_factor: float
    kv_lora_rank: int
    q_lora_rank: int
    qk_rope_head_dim: int
    v_head_dim: int
    qk_nope_head_dim: int
    n_group: int
    topk_group: int
    num_experts_per_tok: int
    norm_topk_prob: bool
    hidden_act: str
    max_position_embeddings: int
    rms_norm_eps: float
    pad_token_id: int | None
    bos_token_id: int | None
    eos_token_id: int | list[int] | None
    tie_word_embeddings: bool
    mlp_layer_types: list[str]
    attention_bias: bool
    index_topk: int
    index_head_dim: int
    index_n_heads: int
    layer_types: list[str]
    indexer_types: list[str]
    swiglu_limit: float
    linear_head_dim: int
    linear_num_heads: int
    linear_conv_kernel_dim: int
    linear_lower_bound: float | None
    hc_mult: int
    hc_eps: float
    hc_sinkhorn_iters: int
    index_kpool: int
    index_kpool_always_select_tail: bool
    model_type: str = "glm5_next"
    extra: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _post_init(text: dict[str, Any]) -> dict[str, Any]:
    """Glm5NextTextConfig.__post_init__ on a dict of text fields (returns the parsed fields)."""
    known = {k: text[k] for k in _GLM5_TEXT_DEFAULTS if k in text}
    kwargs = {k: v for k, v in text.items() if k not in _GLM5_TEXT_DEFAULTS}
    c = dict(_GLM5_TEXT_DEFAULTS)
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
    c["layer_types"] = [
        "deepseek_sparse_attention" if t == "full_attention" else t for t in c["layer_types"]
    ]
    if c["indexer_types"] is None:
        pattern = kwargs.get("index_topk_pattern")
        if pattern is not None:
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
        if t == "deepseek_sparse_attention" and c["indexer_types"][i] == "shared":
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


def parse_glm5_next(raw: dict[str, Any]) -> Glm5NextConfig:
    """Parse a glm5_next ``config.json`` dict (nested ``text_config`` or flat) into the text config.

    Raises ContractError for an inconsistent config and UnsupportedError for one memra refuses
    (``index_kpool_always_select_tail = false``).
    """
    text = raw.get("text_config")
    if isinstance(text, dict):
        fields = dict(text)
        # Glm5NextForConditionalGeneration ties the LM head by the *top-level* tie_word_embeddings
        # (Glm5NextConfig's own field, default False), never by text_config's.
        fields["tie_word_embeddings"] = bool(raw.get("tie_word_embeddings", False))
    else:
        fields = {k: v for k, v in raw.items() if k not in ("vision_config", "architectures")}
    fields.pop("model_type", None)
    for k in ("transformers_version", "dtype", "torch_dtype", "architectures", "head_dim",
              "qk_head_dim", "_name_or_path"):
        fields.pop(k, None)
    c = _post_init(fields)
    _validate(c)
    return Glm5NextConfig(**c)


def read_config(path: str | Path) -> tuple[str, Glm5NextConfig]:
    """Read ``path/config.json``; returns (model_type, parsed config).

    Raises ContractError when the file is missing or not JSON, UnsupportedError for a model_type
    memra cannot run yet.
    """
    p = Path(path) / "config.json"
    try:
        raw = json.loads(p.read_text())
    except FileNotFoundError:
        raise ContractError(f"load: no config.json in {Path(path)}", 40024) from None
    except json.JSONDecodeError as e:
        raise ContractError(f"load: {p} is not valid JSON: {e}", 40025) from None
    model_type = raw.get("model_type")
    if model_type in ("glm5_next", "glm5_next_text"):
        return "glm5_next", parse_glm5_next(raw)
    raise UnsupportedError(
        f"load: model_type {model_type!r} is not supported yet (supported: glm5_next)", 50000
    )
