"""The Qwen families' config.json parses (memra.models.qwen3_5 / qwen3_5_moe / qwen3_next, sharing
memra.models.qwen_common) against transformers' own parses, and their refusals.

CPU only; no torch / transformers (the expected parses are recorded in
tests/fixtures/{qwen3_5,qwen3_5_moe,qwen3_next}_config_cases.json by
tests/fixtures/make_qwen_fixtures.py). A case transformers parses is either parsed to the same
fields by memra, or refused by memra for the named reason listed in REFUSED (what memra does not
run, or what transformers would run into an error later); a case transformers refuses memra
refuses too.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

import memra
from memra.config import read_config
from memra.models import qwen3_5, qwen3_5_moe, qwen3_next, qwen_common

FIXTURES = Path(__file__).resolve().parent / "fixtures"
MODULES = {"qwen3_5": qwen3_5, "qwen3_5_moe": qwen3_5_moe, "qwen3_next": qwen3_next}
CASES = [(fam, c) for fam in MODULES for c in json.loads((FIXTURES / f"{fam}_config_cases.json").read_text())]

_SHARED_REFUSALS = {
    # transformers refuses (its layer_types validator)
    "layer_types_length_mismatch": (memra.ContractError, "layer_types has 3 entries for num_hidden_layers = 4"),
    # transformers builds no mixer for the layer and adds the normed input to the residual
    "layer_types_unknown": (memra.UnsupportedError, "has layer type 'sliding_attention'"),
    # arithmetic memra does not run
    "rope_type_yarn": (memra.UnsupportedError, "rope_type = 'yarn'"),
    "hidden_act_gelu": (memra.UnsupportedError, "hidden_act = 'gelu'"),
    # transformers' repeat_interleave of the key heads fails at the first forward
    "value_heads_not_multiple_of_key_heads": (memra.ContractError, "linear_num_value_heads (3)"),
}
REFUSED = {
    "qwen3_5": _SHARED_REFUSALS,
    "qwen3_5_moe": _SHARED_REFUSALS,
    "qwen3_next": {k: _SHARED_REFUSALS[k] for k in ("layer_types_length_mismatch", "layer_types_unknown")},
}


def _same(got, want) -> bool:
    """Exact equality that also keeps None, bool and int/float apart (True != 1 here)."""
    if want is None:
        return got is None
    if isinstance(want, bool):
        return isinstance(got, bool) and got is want
    if isinstance(want, float):
        return isinstance(got, (int, float)) and not isinstance(got, bool) and float(got) == want
    if isinstance(want, int):
        return isinstance(got, int) and not isinstance(got, bool) and got == want
    if isinstance(want, list):
        return isinstance(got, (list, tuple)) and len(got) == len(want) and all(
            _same(g, w) for g, w in zip(got, want))
    if isinstance(want, dict):
        return isinstance(got, dict) and got.keys() == want.keys() and all(_same(got[k], want[k]) for k in want)
    return type(got) is type(want) and got == want


def _fields(cfg) -> dict:
    """memra's config in the fixture's terms: transformers' attributes (fields, then the kwargs it
    keeps), ``tie_word_embeddings`` the text config's own value, ``lm_head_tied`` whether the head
    is the embedding, ``mlp_kinds`` per layer."""
    d = cfg.as_dict()
    out = {**d.pop("extra"), **d}
    out["lm_head_tied"] = out.pop("tie_word_embeddings")
    out["tie_word_embeddings"] = out.pop("declared_tie_word_embeddings")
    out["mlp_kinds"] = ["moe" if k == "sparse" else "dense" for k in out["mlp_layer_types"]]
    return out


def test_cases_cover_both_layouts_and_every_refusal():
    names = {fam: {c["name"] for f, c in CASES if f == fam} for fam in MODULES}
    for fam, refused in REFUSED.items():
        assert set(refused) <= names[fam], fam
    assert "save_pretrained_conditional_fixture" in names["qwen3_5_moe"]


@pytest.mark.parametrize("fam,case", CASES, ids=[f"{f}-{c['name']}" for f, c in CASES])
def test_parse_matches_transformers_or_is_refused_by_name(fam, case):
    raw = copy.deepcopy(case["config"])
    parse = MODULES[fam].parse_config
    if case["name"] in REFUSED[fam]:
        cls, text = REFUSED[fam][case["name"]]
        with pytest.raises(cls) as e:
            parse(raw)
        assert text in str(e.value), str(e.value)
        assert raw == case["config"]
        return
    assert "error" not in case["parsed"], f"transformers refuses {case['name']}: memra must too"
    cfg = parse(raw)
    assert raw == case["config"], "parse_config must not modify its input"
    got = _fields(cfg)
    bad = {k: (got.get(k, "<absent>"), want) for k, want in case["parsed"].items()
           if not _same(got.get(k), want)}
    assert not bad, f"{case['name']}: (memra, transformers) differ: {bad}"


@pytest.mark.parametrize("fam,case", [(f, c) for f, c in CASES if c["name"] not in REFUSED[f]],
                         ids=lambda v: v["name"] if isinstance(v, dict) else v)
def test_read_config_picks_the_family(tmp_path, fam, case):
    (tmp_path / "config.json").write_text(json.dumps(case["config"]))
    family, cfg = read_config(tmp_path)
    assert family is MODULES[fam].FAMILY
    assert cfg.layer_types == case["parsed"]["layer_types"]
    plan = family.layer_plan(cfg)
    assert [p.mixer for p in plan] == ["gdn" if t == qwen_common.GDN else "attention" for t in cfg.layer_types]
    assert [p.ffn for p in plan] == cfg.mlp_layer_types


def _saved(fam: str, name: str = "save_pretrained_causal_fixture") -> dict:
    name = "save_pretrained_fixture" if fam == "qwen3_next" else name
    return copy.deepcopy(next(c["config"] for f, c in CASES if f == fam and c["name"] == name))


@pytest.mark.parametrize("fam,change,error,text", [
    ("qwen3_5", {"hidden_size": 64.0}, memra.ContractError, "hidden_size must be an integer"),
    ("qwen3_5", {"rope_parameters": {"rope_type": 3}}, memra.ContractError, "rope_parameters.rope_type"),
    ("qwen3_5", {"rope_parameters": {"rope_type": "default", "rope_theta": 1e7, "partial_rotary_factor": 0.2}},
     memra.UnsupportedError, "odd 51 dims"),
    ("qwen3_5", {"rope_parameters": {"rope_type": "default", "rope_theta": 1e7, "partial_rotary_factor": 1.5}},
     memra.ContractError, "rotates 384 of head_dim = 256"),
    ("qwen3_5", {"rope_parameters": {"rope_type": "linear", "factor": 2.0}}, memra.UnsupportedError,
     "rope_type = 'linear'"),
    ("qwen3_5", {"rope_parameters": {"type": "dynamic", "factor": 2.0}}, memra.UnsupportedError,
     "rope_type = 'dynamic'"),
    ("qwen3_5", {"layer_types": None, "full_attention_interval": 0}, memra.ContractError,
     "full_attention_interval must be >= 1"),
    ("qwen3_5", {"num_key_value_heads": 3}, memra.ContractError, "num_attention_heads (4)"),
    ("qwen3_5", {"rms_norm_eps": -1e-6}, memra.ContractError, "rms_norm_eps must be at least 0"),
    ("qwen3_5_moe", {"num_experts_per_tok": 9}, memra.ContractError, "num_experts_per_tok (9) exceeds"),
    ("qwen3_5_moe", {"num_experts": 0}, memra.ContractError, "num_experts must be an integer >= 1"),
    ("qwen3_next", {"decoder_sparse_step": 0}, memra.ContractError, "decoder_sparse_step must be >= 1"),
    ("qwen3_next", {"mlp_only_layers": [0.5]}, memra.ContractError, "mlp_only_layers must be a list of integers"),
])
def test_bad_values_are_named(fam, change, error, text):
    raw = _saved(fam)
    raw.update(change)
    with pytest.raises(error) as e:
        MODULES[fam].parse_config(raw)
    assert text in str(e.value), str(e.value)


@pytest.mark.parametrize("fam", sorted(MODULES))
def test_a_zero_rms_norm_eps_is_taken_as_transformers_takes_it(fam):
    # transformers' RMSNorm adds eps to the variance whatever it is; every family takes 0 (the
    # Qwen parse refused it while glm5_next and Kimi-Linear took it).
    raw = _saved(fam)
    raw["rms_norm_eps"] = 0.0
    assert MODULES[fam].parse_config(raw).rms_norm_eps == 0.0


def test_conditional_layout_reads_the_nested_text_config():
    cond = _saved("qwen3_5", "save_pretrained_conditional_fixture")
    cfg = qwen3_5.parse_config(cond)
    assert cfg.layout == "conditional" and cfg.model_type == "qwen3_5" and cfg.tie_word_embeddings
    for bad, text in (({"text_config": [1]}, "text_config must be a JSON object"),
                      ({"tie_word_embeddings": 1}, "tie_word_embeddings must be true or false")):
        with pytest.raises(memra.ContractError, match=text):
            qwen3_5.parse_config({**cond, **bad})
    nested = copy.deepcopy(cond)
    nested["text_config"]["model_type"] = "qwen3_5_moe_text"
    with pytest.raises(memra.ContractError, match="wraps a 'qwen3_5_text' text model"):
        qwen3_5.parse_config(nested)
    nested["text_config"]["model_type"] = "qwen3_5_text"
    nested["text_config"]["hidden_size"] = "64"
    with pytest.raises(memra.ContractError, match=r"text_config\.hidden_size"):
        qwen3_5.parse_config(nested)


def test_qwen3_5_moe_always_renormalises():
    # Qwen3_5MoeTopKRouter divides by the chosen weights' sum whatever config.json says; the key is
    # kept (transformers sets it as an attribute) and changes nothing.
    raw = _saved("qwen3_5_moe")
    raw["norm_topk_prob"] = False
    cfg = qwen3_5_moe.parse_config(raw)
    assert cfg.extra["norm_topk_prob"] is False and not hasattr(cfg, "norm_topk_prob")
