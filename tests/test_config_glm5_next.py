"""The glm5_next family's config.json parse (memra.models.glm5_next.parse_config) against
transformers' own parse, and its refusals.

CPU only; no torch / transformers (the expected parses are recorded in
tests/fixtures/glm5_next_config_cases.json by tests/fixtures/make_glm5_next_fixtures.py).
"""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path

import pytest

import memra
from memra.config import read_config
from memra.models import glm5_next
from memra.models.glm5_next import Glm5NextConfig
from memra.models.glm5_next import parse_config as parse_glm5_next

FIXTURES = Path(__file__).resolve().parent / "fixtures"
CASES = json.loads((FIXTURES / "glm5_next_config_cases.json").read_text())
TINY = memra.default_checkpoint()
TINY_RAW = json.loads((TINY / "config.json").read_text())


def _same(got, want) -> bool:
    """Exact equality that also keeps None, bool and int/float apart (True != 1 here)."""
    if want is None:
        return got is None
    if isinstance(want, bool):
        return isinstance(got, bool) and got is want
    if isinstance(want, float):
        # transformers keeps the float parsed from JSON as is: compare the doubles exactly.
        return isinstance(got, (int, float)) and not isinstance(got, bool) and float(got) == want
    if isinstance(want, int):
        return isinstance(got, int) and not isinstance(got, bool) and got == want
    if isinstance(want, list):
        return isinstance(got, (list, tuple)) and len(got) == len(want) and all(
            _same(g, w) for g, w in zip(got, want))
    if isinstance(want, dict):
        return isinstance(got, dict) and set(got) == set(want) and all(_same(got[k], want[k]) for k in want)
    return type(got) is type(want) and got == want


def test_cases_file_is_not_empty():
    assert len(CASES) >= 10
    assert all({"name", "config", "parsed"} <= set(c) for c in CASES)


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_parse_matches_transformers(case):
    raw = copy.deepcopy(case["config"])
    cfg = parse_glm5_next(raw)
    assert isinstance(cfg, Glm5NextConfig)
    assert raw == case["config"], "parse_glm5_next must not modify its input"
    fields = cfg.as_dict()
    bad = {}
    for key, want in case["parsed"].items():
        assert key in fields, f"{case['name']}: memra's config has no field {key!r}"
        if not _same(fields[key], want):
            bad[key] = (fields[key], want)
    assert not bad, f"{case['name']}: (memra, transformers) differ: {bad}"


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_read_config_from_folder(tmp_path, case):
    (tmp_path / "config.json").write_text(json.dumps(case["config"]))
    family, cfg = read_config(tmp_path)
    assert family is glm5_next.FAMILY
    assert cfg.num_hidden_layers == case["parsed"]["num_hidden_layers"]
    assert cfg.layer_types == case["parsed"]["layer_types"]


def _tiny_text(**changes) -> dict:
    raw = copy.deepcopy(TINY_RAW)
    raw["text_config"].update(changes)
    return raw


def test_tiny_checkpoint_config_parses():
    cfg = parse_glm5_next(TINY_RAW)
    assert cfg.index_kpool_always_select_tail is True
    assert cfg.num_hidden_layers == 6


def test_select_tail_false_is_unsupported_at_parse():
    with pytest.raises(memra.UnsupportedError, match="index_kpool_always_select_tail") as ei:
        parse_glm5_next(_tiny_text(index_kpool_always_select_tail=False))
    assert ei.value.code >= 50000


def test_select_tail_false_is_unsupported_at_load(tmp_path):
    dst = tmp_path / "ckpt"
    shutil.copytree(TINY, dst)
    (dst / "config.json").write_text(json.dumps(_tiny_text(index_kpool_always_select_tail=False)))
    with pytest.raises(memra.UnsupportedError, match="index_kpool_always_select_tail"):
        memra.load(dst, max_batch=1, max_len=16, progress=False)


def test_select_tail_false_flat_form_is_unsupported():
    flat = next(c for c in CASES if c["name"] == "flat")["config"]
    raw = dict(flat, index_kpool_always_select_tail=False)
    with pytest.raises(memra.UnsupportedError):
        parse_glm5_next(raw)


@pytest.mark.parametrize("topk,kpool", [(10, 4), (8, 3), (6, 4)])
def test_topk_not_multiple_of_kpool(topk, kpool):
    with pytest.raises(memra.ContractError, match="index_topk") as ei:
        parse_glm5_next(_tiny_text(index_topk=topk, index_kpool=kpool))
    assert 40000 <= ei.value.code < 50000


def test_kpool_not_positive():
    with pytest.raises(memra.ContractError, match="index_kpool"):
        parse_glm5_next(_tiny_text(index_kpool=0))


def test_shared_dsa_after_linear_layer():
    # layer 2 is the first DSA layer (layer 1 is linear attention): it cannot be "shared".
    raw = _tiny_text(indexer_types=["full", "full", "shared", "full", "full", "full"])
    with pytest.raises(memra.ContractError, match="layer 2 is a shared DSA layer"):
        parse_glm5_next(raw)


def test_shared_dsa_as_first_layer():
    raw = _tiny_text(
        layer_types=["deepseek_sparse_attention"] + ["linear_attention"] * 5,
        indexer_types=["shared"] + ["full"] * 5,
    )
    with pytest.raises(memra.ContractError, match="layer 0 is a shared DSA layer"):
        parse_glm5_next(raw)


def test_shared_dsa_via_pattern_after_linear_layer():
    flat = next(c for c in CASES if c["name"] == "flat_index_topk_pattern")["config"]
    raw = copy.deepcopy(flat)
    raw["index_topk_pattern"] = "FFSSFS"  # layer 2 is DSA after linear layer 1
    with pytest.raises(memra.ContractError, match="shared DSA"):
        parse_glm5_next(raw)


def test_indexed_attention_is_the_dsa_layer():
    # transformers after 5.17 saves GLM-5.3-Flash's DSA layers as "indexed_attention"
    # (ALLOWED_LAYER_TYPES maps "deepseek_sparse_attention" onto it); memra refused it by name.
    a = parse_glm5_next(TINY_RAW)
    dsa = [i for i, t in enumerate(a.layer_types) if t == "deepseek_sparse_attention"]
    new = ["indexed_attention" if i in dsa else t for i, t in enumerate(a.layer_types)]
    assert dsa and parse_glm5_next(_tiny_text(layer_types=new)) == a


def test_shared_linear_layer_is_fine():
    # "shared" on a linear-attention layer means nothing (transformers ignores it there).
    cfg = parse_glm5_next(_tiny_text(indexer_types=["shared", "shared", "full", "shared", "shared", "full"]))
    assert cfg.indexer_types[3] == "shared"


def test_unknown_layer_type_is_unsupported():
    raw = _tiny_text(layer_types=["linear_attention", "sliding_attention"] + ["linear_attention"] * 4)
    with pytest.raises(memra.UnsupportedError, match="sliding_attention"):
        parse_glm5_next(raw)


def test_too_short_schedule():
    with pytest.raises(memra.ContractError, match="mlp_layer_types"):
        parse_glm5_next(_tiny_text(mlp_layer_types=["dense"] * 3))


def test_unknown_indexer_type_on_a_dsa_layer_is_unsupported():
    raw = _tiny_text(indexer_types=["full", "full", "sparse", "shared", "full", "full"])
    with pytest.raises(memra.UnsupportedError, match="layer 2 has unknown indexer type 'sparse'"):
        parse_glm5_next(raw)


def test_index_topk_pattern_with_another_letter():
    flat = next(c for c in CASES if c["name"] == "flat_index_topk_pattern")["config"]
    with pytest.raises(memra.ContractError, match="index_topk_pattern"):
        parse_glm5_next(dict(flat, index_topk_pattern="FFXSFS"))


@pytest.mark.parametrize("key,value,named", [
    ("hidden_size", 64.0, "text_config.hidden_size"),
    ("num_hidden_layers", True, "text_config.num_hidden_layers"),
    ("eos_token_id", "x", "text_config.eos_token_id"),
    ("eos_token_id", [256, "x"], "text_config.eos_token_id"),
    ("rms_norm_eps", "1e-5", "text_config.rms_norm_eps"),
    ("norm_topk_prob", 1, "text_config.norm_topk_prob"),
    ("layer_types", "linear_attention", "text_config.layer_types"),
    ("indexer_types", ["full", 3, "full", "shared", "full", "full"], "text_config.indexer_types"),
    ("linear_lower_bound", float("nan"), "text_config.linear_lower_bound"),
    ("vocab_size", 2**40, "text_config.vocab_size"),
    ("linear_attn_config", [128], "text_config.linear_attn_config"),
    ("linear_attn_config", {"head_dim": "128"}, "text_config.linear_attn_config.head_dim"),
    ("index_topk_freq", None, "text_config.index_topk_freq"),
])
def test_wrongly_typed_text_value_is_refused_naming_the_key(key, value, named):
    with pytest.raises(memra.ContractError) as ei:
        parse_glm5_next(_tiny_text(**{key: value}))
    assert f"config: {named} must be" in str(ei.value), str(ei.value)
    assert ei.value.code == 40025


@pytest.mark.parametrize("key,value", [("hidden_size", 64.0), ("num_hidden_layers", True), ("eos_token_id", "x"),
                                       ("tie_word_embeddings", "yes")])
def test_wrongly_typed_flat_value_is_refused_naming_the_key(key, value):
    flat = next(c for c in CASES if c["name"] == "flat")["config"]
    with pytest.raises(memra.ContractError, match=f"config: {key} must be"):
        parse_glm5_next(dict(flat, **{key: value}))


def test_wrongly_typed_top_level_tie_is_refused():
    with pytest.raises(memra.ContractError, match="config: tie_word_embeddings must be true or false"):
        parse_glm5_next(dict(TINY_RAW, tie_word_embeddings="false"))


def test_integers_are_accepted_where_transformers_has_floats():
    # JSON 1 for a float field is a number: transformers keeps it, so does memra.
    cfg = parse_glm5_next(_tiny_text(routed_scaling_factor=2, rms_norm_eps=0))
    assert cfg.routed_scaling_factor == 2 and cfg.rms_norm_eps == 0
