"""The bounds of config.json's numbers (memra.config.Range, Size): a size above 2^20 or an
hc_sinkhorn_iters outside [1, 1000] is refused by key, with the allowed range, before the parse
does any arithmetic with it; the bounds are the C++ layers' own (CPU only).

An unbounded hc_sinkhorn_iters (2^31 - 1) used to load and then run 2^31 uninterruptible
Sinkhorn rounds per mHC site; sizes near 2^31 used to reach the C++ layers, whose geometry
overflowed int (negative expected shapes in the messages).
"""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path
from typing import Annotated, TypedDict

import pytest

import memra
from memra import _core
from memra.config import SIZE_MAX, Range, check_fields, field_ranges, field_table
from memra.models import family_for
from memra.models.glm5_next import Glm5NextConfig
from memra.models.kimi_linear import KimiLinearConfig
from memra.models.qwen3_5 import Qwen3_5Config
from memra.models.qwen3_5_moe import Qwen3_5MoeConfig
from memra.models.qwen3_next import Qwen3NextConfig

FIXTURES = Path(__file__).resolve().parent / "fixtures"
TINY = memra.default_checkpoint()

# family config class -> a tiny checkpoint folder of that family (its config.json is the base)
FOLDERS = {
    Glm5NextConfig: TINY,
    KimiLinearConfig: FIXTURES / "tiny_kimi_linear",
    Qwen3_5Config: FIXTURES / "tiny_qwen3_5",
    Qwen3_5MoeConfig: FIXTURES / "tiny_qwen3_5_moe_text",
    Qwen3NextConfig: FIXTURES / "tiny_qwen3_next",
}

# The geometry every family must bound (the sizes its C++ layers take), by family.
MUST_BOUND = {
    Glm5NextConfig: {"vocab_size", "hidden_size", "intermediate_size", "moe_intermediate_size", "num_hidden_layers",
                     "num_attention_heads", "num_key_value_heads", "n_routed_experts", "n_shared_experts",
                     "kv_lora_rank", "q_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim",
                     "index_topk", "index_head_dim", "index_n_heads", "index_kpool", "linear_head_dim",
                     "linear_num_heads", "linear_conv_kernel_dim", "hc_mult", "hc_sinkhorn_iters"},
    KimiLinearConfig: {"vocab_size", "hidden_size", "intermediate_size", "moe_intermediate_size", "num_hidden_layers",
                       "num_attention_heads", "kv_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim",
                       "num_local_experts", "n_shared_experts", "linear_head_dim", "linear_num_heads",
                       "linear_conv_kernel_dim"},
    Qwen3_5Config: {"vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                    "num_key_value_heads", "head_dim", "linear_key_head_dim", "linear_value_head_dim",
                    "linear_num_key_heads", "linear_num_value_heads", "linear_conv_kernel_dim"},
    Qwen3_5MoeConfig: {"hidden_size", "moe_intermediate_size", "shared_expert_intermediate_size", "num_experts",
                       "num_experts_per_tok", "head_dim"},
    Qwen3NextConfig: {"vocab_size", "intermediate_size", "moe_intermediate_size", "shared_expert_intermediate_size",
                      "num_experts", "num_experts_per_tok", "head_dim"},
}

for _keys in MUST_BOUND.values():  # and from below: a count of positions under 1 is no model's
    _keys.add("max_position_embeddings")


def _raw(cls) -> tuple[dict, dict, str]:
    """(config.json of the family's tiny folder, the dict holding the text fields, their prefix)."""
    raw = json.loads((FOLDERS[cls] / "config.json").read_text())
    if isinstance(raw.get("text_config"), dict):
        return raw, raw["text_config"], "text_config."
    return raw, raw, ""


def _parse(raw: dict):
    return family_for(raw).parse_config(raw)


def _bounded_cases():
    for cls in FOLDERS:
        for key in sorted(field_ranges(cls)):
            yield pytest.param(cls, key, id=f"{cls.__name__}.{key}")


def test_every_geometry_field_is_bounded():
    for cls, keys in MUST_BOUND.items():
        missing = keys - set(field_ranges(cls))
        assert not missing, f"{cls.__name__}: no bound on {sorted(missing)}"


def test_the_field_table_keeps_the_json_types():
    # The bounds ride in the annotations; the type table stays the JSON types.
    assert field_table(Glm5NextConfig)["hc_sinkhorn_iters"] is int
    assert field_table(Glm5NextConfig)["v_head_dim"] is int


@pytest.mark.parametrize("cls,key", list(_bounded_cases()))
def test_a_value_past_the_bound_is_refused_by_key(cls, key):
    raw, text, prefix = _raw(cls)
    bound = field_ranges(cls)[key]
    past = 2**31 - 1 if bound.high is not None else bound.low - 1  # a lower bound alone: below it
    text[key] = past
    before = copy.deepcopy(raw)
    with pytest.raises(memra.ContractError) as ei:
        _parse(raw)
    assert str(ei.value) == f"config: {prefix}{key} must be {bound.words()}, got {past}"
    assert ei.value.code == 40025
    assert raw == before, "a refused parse must not modify its input"


@pytest.mark.parametrize("cls,key", list(_bounded_cases()))
def test_the_bound_itself_passes_the_check(cls, key):
    bound = field_ranges(cls)[key]
    table = field_table(cls)
    for end, past in ((bound.high, 1), (bound.low, -1)):
        if end is None:
            continue
        check_fields({key: end}, table, ranges=field_ranges(cls))
        with pytest.raises(memra.ContractError, match=rf"^config: {key} must be "):
            check_fields({key: end + past}, table, ranges=field_ranges(cls))


@pytest.mark.parametrize("value", [0, -1, 1001, 2**31 - 1])
def test_hc_sinkhorn_iters_outside_1_1000_is_refused(value):
    raw, text, _ = _raw(Glm5NextConfig)
    text["hc_sinkhorn_iters"] = value
    with pytest.raises(memra.ContractError) as ei:
        _parse(raw)
    msg = str(ei.value)
    assert msg.startswith(f"config: text_config.hc_sinkhorn_iters must be in [1, 1000] ("), msg
    assert msg.endswith(f"got {value}"), msg


def test_hc_sinkhorn_iters_1000_parses():
    raw, text, _ = _raw(Glm5NextConfig)
    text["hc_sinkhorn_iters"] = 1000
    assert _parse(raw).hc_sinkhorn_iters == 1000


def test_the_flat_glm_form_is_bounded_too():
    raw, text, _ = _raw(Glm5NextConfig)
    flat = {**text, "model_type": "glm5_next_text", "hc_mult": SIZE_MAX + 1}
    with pytest.raises(memra.ContractError, match=r"^config: hc_mult must be at most 1048576 "):
        _parse(flat)


def test_load_refuses_the_hanging_sinkhorn_count(tmp_path):
    # The fuzzer's repro: memra.load accepted it, then logits([1]) never returned.
    folder = tmp_path / "ckpt"
    shutil.copytree(TINY, folder)
    raw = json.loads((folder / "config.json").read_text())
    raw["text_config"]["hc_sinkhorn_iters"] = 2**31 - 1
    (folder / "config.json").write_text(json.dumps(raw))
    with pytest.raises(memra.ContractError, match=r"text_config\.hc_sinkhorn_iters must be in \[1, 1000\]"):
        memra.load(folder, max_batch=1, max_len=8, progress=False)


@pytest.mark.parametrize("key", ["hc_mult", "v_head_dim", "qk_nope_head_dim"])
def test_load_refuses_sizes_that_overflowed_the_layer_geometry(tmp_path, key):
    # These reached the C++ layers, whose int sums wrapped (expected [-8589934532, 32]).
    folder = tmp_path / "ckpt"
    shutil.copytree(TINY, folder)
    raw = json.loads((folder / "config.json").read_text())
    raw["text_config"][key] = 2**31 - 1
    (folder / "config.json").write_text(json.dumps(raw))
    with pytest.raises(memra.ContractError) as ei:
        memra.load(folder, max_batch=1, max_len=8, progress=False)
    assert str(ei.value).startswith(f"config: text_config.{key} must be at most 1048576 "), str(ei.value)


@pytest.mark.parametrize("cls,where", [(Glm5NextConfig, "text_config.linear_attn_config."),
                                       (KimiLinearConfig, "linear_attn_config.")])
def test_a_nested_size_is_named_where_it_sits(cls, where):
    raw, text, _ = _raw(cls)
    lac = dict(text.get("linear_attn_config") or {})
    lac["head_dim"] = SIZE_MAX + 1
    text["linear_attn_config"] = lac
    with pytest.raises(memra.ContractError, match=rf"^config: {where.replace('.', '[.]')}head_dim must be at most "):
        _parse(raw)


def test_a_kimi_alias_is_bounded():
    raw, _, _ = _raw(KimiLinearConfig)
    raw["num_experts"] = 2**31 - 1  # attribute_map alias of num_local_experts
    with pytest.raises(memra.ContractError, match=r"^config: num_experts must be at most 1048576 "):
        _parse(raw)


@pytest.mark.parametrize("cls", [Glm5NextConfig, KimiLinearConfig])
def test_the_shared_expert_width_is_a_bounded_size(cls):
    # moe_intermediate_size * n_shared_experts becomes the shared MLP's width (one int argument).
    raw, text, _ = _raw(cls)
    assert "sparse" in _parse(copy.deepcopy(raw)).mlp_layer_types
    # Kimi's release form spells n_shared_experts by its attribute_map alias, which wins.
    shared_key = "num_shared_experts" if "num_shared_experts" in text else "n_shared_experts"
    text["moe_intermediate_size"], text[shared_key] = 2**11, 2**10
    with pytest.raises(memra.ContractError) as ei:
        _parse(raw)
    msg = str(ei.value)
    assert "moe_intermediate_size * n_shared_experts (2048 * 1024 = 2097152)" in msg, msg
    assert "must be at most 1048576" in msg, msg


# ------------------------------------------------------------------ the mechanism
TABLE = {"n": int, "on": int | None, "x": float}
RANGES = {"n": Range(1, 10, note="why"), "on": Range(high=5), "x": Range(low=0.0)}


@pytest.mark.parametrize("values", [{}, {"n": 1}, {"n": 10}, {"on": None}, {"on": -7}, {"x": 0.0}, {"unlisted": 99}])
def test_values_in_range_pass(values):
    check_fields(values, TABLE, ranges=RANGES)


@pytest.mark.parametrize("key,value,words", [
    ("n", 0, "in [1, 10] (why)"),
    ("n", 11, "in [1, 10] (why)"),
    ("on", 6, "at most 5"),
    ("x", -0.5, "at least 0.0"),
])
def test_values_out_of_range_are_refused_with_the_range(key, value, words):
    with pytest.raises(memra.ContractError) as ei:
        check_fields({key: value}, TABLE, "text_config.", ranges=RANGES)
    assert str(ei.value) == f"config: text_config.{key} must be {words}, got {value}"
    assert ei.value.code == 40025


def test_a_wrong_type_is_still_named_as_a_type():
    with pytest.raises(memra.ContractError, match=r"^config: n must be an integer, got '3'"):
        check_fields({"n": "3"}, TABLE, ranges=RANGES)


class _Typed(TypedDict, total=False):
    a: Annotated[int, Range(1, 2)] | None
    b: int


def test_field_ranges_reads_annotated_members_of_unions():
    assert field_ranges(_Typed) == {"a": Range(1, 2)}


# ------------------------------------------------------------------ the C++ layers' own bound
def _hc_weights(hc: int, hidden: int) -> dict:
    import numpy as np

    mix = (2 + hc) * hc
    return {"fn": _core.Weight(np.zeros((mix, hc * hidden), np.float32)),
            "base": _core.Weight(np.zeros(mix, np.float32)), "scale": _core.Weight(np.ones(3, np.float32))}


@pytest.mark.parametrize("iters", [1001, 2**31 - 1])
def test_the_layer_refuses_the_same_sinkhorn_bound(iters):
    engine = memra.Engine("cpu")
    with pytest.raises(memra.ContractError) as ei:
        _core.HyperConnection(engine, _hc_weights(2, 4), hidden=4, hc_mult=2, sinkhorn_iters=iters, hc_eps=1e-6,
                              norm_eps=1e-6, dtype="float32")
    assert f"sinkhorn_iters must be in [1, 1000], got {iters}" in str(ei.value)
    _core.HyperConnection(engine, _hc_weights(2, 4), hidden=4, hc_mult=2, sinkhorn_iters=1000, hc_eps=1e-6,
                          norm_eps=1e-6, dtype="float32")


def test_the_mhc_op_refuses_the_same_sinkhorn_bound():
    import numpy as np

    w = _hc_weights(2, 4)
    streams = np.zeros((1, 2, 4), np.float32)
    base, scale = np.zeros(8, np.float32), np.ones(3, np.float32)
    with pytest.raises(memra.ContractError, match=r"mhc_pre: sinkhorn_iters must be in \[1, 1000\], got 1001"):
        _core.mhc_pre(streams, w["fn"], base, scale, sinkhorn_iters=1001, hc_eps=1e-6, norm_eps=1e-6)
    _core.mhc_pre(streams, w["fn"], base, scale, sinkhorn_iters=1000, hc_eps=1e-6, norm_eps=1e-6)


@pytest.mark.parametrize("make,arg", [
    (lambda e, n: _core.MlpLayer(e, {}, hidden=4, intermediate=n, swiglu_limit=10.0, dtype="float32"), "intermediate"),
    (lambda e, n: _core.HyperConnection(e, {}, hidden=n, hc_mult=2, sinkhorn_iters=20, hc_eps=1e-6, norm_eps=1e-6,
                                        dtype="float32"), "hidden"),
    (lambda e, n: _core.MlaLayer(e, {}, hidden=4, heads=1, q_lora_rank=4, kv_rank=4, d_nope=4, d_rope=0, d_v=n,
                                 dtype="float32"), "d_v"),
    (lambda e, n: _core.KdaLayer(e, {}, hidden=4, heads=n, head_dim=4, conv_kernel=4, dtype="float32"), "heads"),
])
def test_a_layer_refuses_a_size_past_the_bound_by_name(make, arg):
    engine = memra.Engine("cpu")
    with pytest.raises(memra.ContractError) as ei:
        make(engine, SIZE_MAX + 1)
    assert f"{arg} must be at most {SIZE_MAX} (2^20), got {SIZE_MAX + 1}" in str(ei.value), str(ei.value)
    with pytest.raises(memra.ContractError, match="missing tensor"):  # at the bound: on to the weights
        make(engine, SIZE_MAX)
    # Below 0 too (MlaLayer's index_head_dim = -1 was named by a tensor's shape [-16, 32]).
    with pytest.raises(memra.ContractError) as ei:
        make(engine, -1)
    msg = str(ei.value)  # the layer's own lower bound ("... must be >= 1 (given arg=-1)") or check_sizes'
    assert "must be >= " in msg and (f"{arg}=-1" in msg or f"{arg} must be >= 0, got -1" in msg), msg


def test_a_negative_indexer_size_is_named_not_shown_as_a_shape():
    # check_sizes bounded sizes from above only: index_head_dim = -1 reached the weights' shape
    # check as "expected [-16, 32]".
    with pytest.raises(memra.ContractError, match=r"MlaLayer: index_head_dim must be >= 0, got -1"):
        _core.MlaLayer(memra.Engine("cpu"), {}, hidden=4, heads=1, q_lora_rank=4, kv_rank=4, d_nope=4, d_rope=0,
                       d_v=4, sparse=True, index_heads=2, index_head_dim=-1, kpool=4, topk=8, dtype="float32")


def test_an_indexer_on_a_dense_mla_layer_is_refused():
    # sparse=False with index sizes built an indexer whose lists nothing read, took its weights
    # and reported has_indexer True.
    with pytest.raises(memra.ContractError, match=r"index_heads=2 builds a DSA indexer, which only a sparse layer"):
        _core.MlaLayer(memra.Engine("cpu"), {}, hidden=4, heads=1, q_lora_rank=4, kv_rank=4, d_nope=4, d_rope=0,
                       d_v=4, sparse=False, index_heads=2, index_head_dim=4, kpool=4, topk=8, dtype="float32")


@pytest.mark.parametrize("size", ["index_head_dim", "kpool", "topk", "tail_rows"])
def test_dsa_sizes_on_a_dense_mla_layer_are_refused(size):
    # A fuzzing pass: MlaLayer(sparse=False, tail_rows=5) was taken and the size ignored (the
    # docstring: tail_rows is 0 for a dense layer); so were kpool, topk and index_head_dim.
    with pytest.raises(memra.ContractError, match=rf"a dense layer \(sparse=False\) takes no DSA sizes.*{size}=4"):
        _core.MlaLayer(memra.Engine("cpu"), {}, hidden=4, heads=1, q_lora_rank=4, kv_rank=4, d_nope=4, d_rope=0,
                       d_v=4, sparse=False, dtype="float32", **{size: 4})

