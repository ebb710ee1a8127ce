"""The kimi_linear family's config.json parse (memra.models.kimi_linear.parse_config) against
transformers' own parse, and its refusals.

CPU only; no torch / transformers (the expected parses are recorded in
tests/fixtures/kimi_linear_config_cases.json by tests/fixtures/make_kimi_linear_fixtures.py).
A case transformers parses is either parsed to the same fields by memra, or refused by memra for
the named reason listed in REFUSED (where transformers would run something else than the config
says, or fail when it builds or runs the model); a case transformers refuses memra refuses too.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

import memra
from memra.config import read_config
from memra.models import kimi_linear
from memra.models.kimi_linear import KimiLinearConfig, layer_plan, parse_config

FIXTURES = Path(__file__).resolve().parent / "fixtures"
CASES = json.loads((FIXTURES / "kimi_linear_config_cases.json").read_text())
BY_NAME = {c["name"]: c for c in CASES}
RELEASE = BY_NAME["released_form_fixture_geometry"]["config"]

# case -> (error memra raises, text its message must hold). Reasons:
REFUSED = {
    # transformers refuses: an entry past the last layer (IndexError), a layer in neither list
    "kda_layers_past_the_end": (memra.ContractError, "kda_layers[5] = 8 is outside [1, 7]"),
    "kda_layers_not_covering_every_layer": (memra.ContractError, "layers [7] (1-based) are in neither"),
    # transformers silently maps entry 0 to the last layer
    "kda_layers_zero_based_by_mistake": (memra.ContractError, "kda_layers[0] = 0 is outside [1, 7]"),
    # transformers' modeling fails at the first forward (kv_b_proj expands into every head)
    "num_key_value_heads_below_heads": (memra.ContractError, "num_key_value_heads (2)"),
    # transformers builds a KDA layer for it, then calls it as attention
    "unknown_layer_type": (memra.UnsupportedError, "layer 2 has layer type 'sliding_attention'"),
    # arithmetic memra's Kimi-Linear does not run (none is in the release)
    "q_lora_rank_set": (memra.UnsupportedError, "q_lora_rank = 16"),
    "hidden_act_gelu": (memra.UnsupportedError, "hidden_act = 'gelu'"),
    "attention_bias_true": (memra.UnsupportedError, "attention_bias = true"),
    # remote-code fields transformers ignores, set to what would change what runs
    "ignored_mla_use_nope_false": (memra.UnsupportedError, "mla_use_nope = false"),
    "ignored_router_softmax": (memra.UnsupportedError, "moe_router_activation_func = 'softmax'"),
    "ignored_moe_layer_freq_2": (memra.UnsupportedError, "moe_layer_freq = 2 makes layers [3, 5] dense"),
    "ignored_use_grouped_topk_false": (memra.UnsupportedError, "use_grouped_topk = false"),
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
    return type(got) is type(want) and got == want


def _fields(cfg: KimiLinearConfig) -> dict:
    """memra's config in the fixture's terms: ``tie_word_embeddings`` is config.json's value
    (transformers' attribute), ``lm_head_tied`` whether the head is the embedding."""
    d = cfg.as_dict()
    d["lm_head_tied"] = d.pop("tie_word_embeddings")
    d["tie_word_embeddings"] = d.pop("declared_tie_word_embeddings")
    return d


def _release(**changes) -> dict:
    raw = copy.deepcopy(RELEASE)
    raw.update(changes)
    return raw


def _lac(**changes) -> dict:
    return dict(RELEASE["linear_attn_config"], **changes)


def test_cases_cover_both_forms_and_every_refusal():
    assert len(CASES) >= 20 and set(REFUSED) <= set(BY_NAME)
    assert "layer_types" in BY_NAME["save_pretrained_fixture"]["config"]
    assert "linear_attn_config" in BY_NAME["released_48b_a3b"]["config"]


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_parse_matches_transformers_or_is_refused_by_name(case):
    raw = copy.deepcopy(case["config"])
    if case["name"] in REFUSED:
        cls, text = REFUSED[case["name"]]
        with pytest.raises(cls) as e:
            parse_config(raw)
        assert text in str(e.value), str(e.value)
        assert raw == case["config"]
        return
    assert "error" not in case["parsed"], f"transformers refuses {case['name']}: memra must too"
    cfg = parse_config(raw)
    assert isinstance(cfg, KimiLinearConfig)
    assert raw == case["config"], "parse_config must not modify its input"
    got = _fields(cfg)
    bad = {k: (got.get(k, "<absent>"), want) for k, want in case["parsed"].items()
           if k not in got or not _same(got[k], want)}
    assert not bad, f"{case['name']}: (memra, transformers) differ: {bad}"
    assert got["lm_head_tied"] is False


@pytest.mark.parametrize("case", [c for c in CASES if c["name"] not in REFUSED], ids=lambda c: c["name"])
def test_read_config_from_folder(tmp_path, case):
    (tmp_path / "config.json").write_text(json.dumps(case["config"]))
    family, cfg = read_config(tmp_path)
    assert family is kimi_linear.FAMILY
    assert cfg.layer_types == case["parsed"]["layer_types"]


def test_release_48b_plan():
    cfg = parse_config(BY_NAME["released_48b_a3b"]["config"])
    plan = layer_plan(cfg)
    assert [i for i, p in enumerate(plan) if p.mixer == "mla"] == [3, 7, 11, 15, 19, 23, 26]
    assert [p.ffn for p in plan] == ["dense"] + ["sparse"] * 26
    assert [p.state.kind for p in plan].count("kda") == 20
    assert cfg.num_local_experts == 256 and cfg.n_group == 1 and cfg.num_experts_per_tok == 8
    assert memra.Cache.bytes_needed(1, 1, [plan[3].state]) > 0


def test_aliases_win_over_their_fields():
    # transformers sets config.json's attribute_map aliases after the fields (checked against
    # KimiLinearConfig(num_experts=8, num_local_experts=16).num_local_experts == 8).
    cfg = parse_config(_release(num_local_experts=16, n_group=4, model_max_length=7, max_position_embeddings=5))
    assert (cfg.num_local_experts, cfg.n_group, cfg.max_position_embeddings) == (8, 2, 7)


def test_explicit_head_dims_are_kept_and_unused():
    cfg = parse_config(_release(head_dim=72, qk_head_dim=5))
    assert (cfg.head_dim, cfg.qk_head_dim) == (72, 5)
    assert (parse_config(RELEASE).head_dim, parse_config(RELEASE).qk_head_dim) == (8, 32)


@pytest.mark.parametrize("changes, cls, text", [
    (dict(linear_attn_config=_lac(kda_layers=[1, 2, 3, 4, 5, 7])), memra.ContractError,
     "layer 3 (1-based) is in both"),
    (dict(linear_attn_config=_lac(kda_layers=[-1, 1, 2, 4, 5])), memra.ContractError, "kda_layers[0] = -1"),
    (dict(linear_attn_config={k: v for k, v in RELEASE["linear_attn_config"].items() if k != "kda_layers"}),
     memra.ContractError, "has full_attn_layers but no kda_layers"),
    (dict(linear_attn_config=_lac(kda_layers=[1, 2, "4"])), memra.ContractError,
     "linear_attn_config.kda_layers must be a list of integers"),
    (dict(linear_attn_config=None), memra.ContractError, "linear_attn_config must be a JSON object"),
    (dict(layer_types=["linear_attention"] * 6), memra.ContractError, "layer_types has 6 entries"),
    (dict(layer_types=["linear_attention"] * 6 + ["mamba"]), memra.ContractError, "layer_types[6] = 'mamba'"),
    (dict(mlp_layer_types=["dense"] * 6 + ["moe"]), memra.ContractError, "mlp_layer_types[6] = 'moe'"),
    (dict(v_head_dim=None), memra.ContractError, "v_head_dim must be an integer >= 1"),
    (dict(num_experts_per_token=None), memra.ContractError, "num_experts_per_tok must be an integer >= 1"),
    (dict(num_experts=9), memra.ContractError, "must split into n_group (2) groups"),
    (dict(num_expert_group=8), memra.ContractError, "groups of at least 2 experts"),
    (dict(topk_group=3), memra.ContractError, "topk_group (3) exceeds n_group (2)"),
    (dict(num_experts_per_token=5), memra.UnsupportedError, "experts of dropped groups"),
    (dict(moe_layer_freq=0), memra.ContractError, "moe_layer_freq must be >= 1"),
    (dict(hidden_size=64.0), memra.ContractError, "hidden_size must be an integer"),
    (dict(moe_renormalize="yes"), memra.ContractError, "moe_renormalize must be true or false"),
    (dict(rms_norm_eps=-1e-6), memra.ContractError, "rms_norm_eps must be at least 0"),
    (dict(model_type="kimi_k25"), memra.UnsupportedError, "kimi_linear"),
])
def test_refusals_are_named(changes, cls, text):
    with pytest.raises(cls) as e:
        parse_config(_release(**changes))
    assert text in str(e.value), str(e.value)


@pytest.mark.parametrize("changes", [
    dict(use_grouped_topk=False, topk_group=2),              # every group kept: grouping changes nothing
    dict(moe_layer_freq=2, first_k_dense_replace=7),         # no MoE layer at all
    dict(mla_use_nope=False, qk_rope_head_dim=0),             # no rope columns to rotate
    dict(layer_types=["linear_attention"] * 7, mla_use_nope=False),
    dict(layer_types=["linear_attention"] * 7, linear_attn_config=_lac(kda_layers=[0])),  # lists unused
    dict(moe_renormalize=False, routed_scaling_factor=1),
])
def test_remote_code_fields_that_change_nothing_are_accepted(changes):
    parse_config(_release(**changes))

