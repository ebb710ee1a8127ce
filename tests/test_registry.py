"""The model registry (memra.models.registry) and the checkpoint name tables (memra.loader.NameTable).

CPU only, numpy only. Which family runs a config.json (its top-level model_type, else its
text_config's), what an unknown type says, and where names on disk go in each layout
transformers writes.
"""

from __future__ import annotations

import copy
import json

import pytest

import memra
from memra.loader import NameTable, Route
from memra.models import FAMILIES, family_for, glm5_next, registry, supported_model_types

TINY = memra.default_checkpoint()
TINY_RAW = json.loads((TINY / "config.json").read_text())
NAMES = glm5_next.NAMES


# ------------------------------------------------------------------ selection
def test_every_family_is_registered_for_its_types():
    for fam in FAMILIES:
        for t in fam.model_types:
            assert family_for({"model_type": t}) is fam
    assert {"glm5_next", "glm5_next_text"} <= set(supported_model_types())


@pytest.mark.parametrize("raw", [
    {"model_type": "glm5_next"},
    {"model_type": "glm5_next_text"},
    {"model_type": "glm5_next", "text_config": {"model_type": "glm5_next_text"}},
    # A conditional-generation wrapper memra does not know around a text model it does.
    {"model_type": "some_vlm", "text_config": {"model_type": "glm5_next_text"}},
    {"text_config": {"model_type": "glm5_next_text"}},
])
def test_the_family_is_picked_from_the_top_level_or_the_text_config_type(raw):
    assert family_for(raw) is glm5_next.FAMILY


def test_the_top_level_type_wins_over_text_config(monkeypatch):
    other = registry.Family(name="other", model_types=("other_text",), reference="-", parse_config=None,
                            layer_plan=None, names=NAMES, residual=None, build_block=None)
    monkeypatch.setattr(registry, "_BY_TYPE", dict(registry._BY_TYPE))
    registry.register(other)
    assert family_for({"model_type": "other_text", "text_config": {"model_type": "glm5_next_text"}}) is other
    assert family_for({"model_type": "glm5_next", "text_config": {"model_type": "other_text"}}) is glm5_next.FAMILY
    assert "other_text" in supported_model_types()


def test_two_families_cannot_claim_one_type(monkeypatch):
    monkeypatch.setattr(registry, "_BY_TYPE", dict(registry._BY_TYPE))
    clash = registry.Family(name="clash", model_types=("x_new", "glm5_next"), reference="-", parse_config=None,
                            layer_plan=None, names=NAMES, residual=None, build_block=None)
    with pytest.raises(ValueError, match="glm5_next"):
        registry.register(clash)
    assert "x_new" not in supported_model_types()  # nothing registered on refusal


@pytest.mark.parametrize("raw,said", [
    ({"model_type": "llama"}, "config.json has model_type 'llama', which"),
    ({"model_type": "llava", "text_config": {"model_type": "mistral"}},
     "has model_type 'llava' and text_config.model_type 'mistral', which"),
    ({"hidden_size": 64}, "no model_type"),
    ({"text_config": {}}, "no model_type"),
])
def test_an_unknown_type_is_unsupported_and_lists_the_supported(raw, said):
    with pytest.raises(memra.UnsupportedError) as ei:
        family_for(raw)
    msg = str(ei.value)
    assert said in msg, msg
    for t in supported_model_types():
        assert t in msg
    assert ei.value.code >= 50000


@pytest.mark.parametrize("raw,named", [
    ({"model_type": 5}, "model_type must be a string"),
    ({"model_type": "glm5_next", "text_config": [1]}, "text_config must be a JSON object"),
    ({"text_config": {"model_type": ["glm5_next_text"]}}, "text_config.model_type must be a string"),
])
def test_a_wrongly_typed_selector_is_a_contract_error(raw, named):
    with pytest.raises(memra.ContractError, match=named):
        family_for(raw)


def test_load_refuses_an_unknown_type_naming_the_supported(tmp_path):
    raw = copy.deepcopy(TINY_RAW)
    raw["model_type"] = "llama"
    raw["text_config"]["model_type"] = "llama_text"
    (tmp_path / "config.json").write_text(json.dumps(raw))
    with pytest.raises(memra.UnsupportedError, match="llama") as ei:
        memra.load(tmp_path, max_batch=1, max_len=16, progress=False)
    assert "glm5_next_text" in str(ei.value)


# ------------------------------------------------------------------ name tables
@pytest.mark.parametrize("prefix", ["model.language_model.", "language_model.model.", "model."])
@pytest.mark.parametrize("short,want", [
    ("layers.3.self_attn.q_proj.weight", ("layer", 3, "mixer", "q_proj.weight")),
    ("layers.0.self_attn.indexer.wk.weight", ("layer", 0, "mixer", "indexer.wk.weight")),
    ("layers.5.mlp.experts.7.down_proj.weight", ("layer", 5, "mlp", "experts.7.down_proj.weight")),
    ("layers.2.input_layernorm.weight", ("layer", 2, "input_layernorm", "weight")),
    ("layers.2.post_attention_layernorm.weight", ("layer", 2, "post_attention_layernorm", "weight")),
    ("layers.1.hc_attn_fn", ("layer", 1, "attn_hc", "fn")),
    ("layers.1.hc_ffn_scale", ("layer", 1, "ffn_hc", "scale")),
    ("embed_tokens.weight", ("top", "embed_tokens")),
    ("norm.weight", ("top", "norm")),
])
def test_glm5_next_names_in_every_layout(prefix, short, want):
    assert NAMES.route(prefix + short, 6) == want


@pytest.mark.parametrize("name", ["lm_head.weight", "language_model.lm_head.weight"])
def test_lm_head_in_both_layouts(name):
    assert NAMES.route(name, 6) == ("top", "lm_head")


@pytest.mark.parametrize("name,kind", [
    ("model.visual.blocks.0.attn.qkv.weight", "vision"),
    ("visual.merger.mlp.0.weight", "vision"),
    ("model.multi_modal_projector.linear.weight", "vision"),
    ("model.language_model.layers.6.eh_proj.weight", "mtp"),  # layer num_hidden_layers: the MTP layer
    ("model.language_model.layers.6.shared_head.norm.weight", "shared_head"),
])
def test_skipped_names(name, kind):
    assert NAMES.route(name, 6) == ("skip", kind)


def test_a_layer_past_the_mtp_layer_is_named():
    # num_hidden_layers = 6: layer 6 is the MTP layer; layer 17 means config.json says too few
    with pytest.raises(memra.ContractError, match="belongs to layer 17, past config.json's num_hidden_layers=6"):
        NAMES.route("model.language_model.layers.17.self_attn.q_proj.weight", 6)
    with pytest.raises(memra.ContractError, match="layer 7"):
        NAMES.route("model.language_model.layers.7.input_layernorm.weight", 6)


def test_layer_numbers_are_ascii_digits():
    # re's \d and int() take any Unicode digit: "layers.\u0660." would have loaded as layer 0
    with pytest.raises(memra.ContractError, match="unexpected tensor"):
        NAMES.route("model.language_model.layers.\u0660.input_layernorm.weight", 6)
    for n in ("00", "06", "01"):  # PyTorch's module names have no leading zeros
        with pytest.raises(memra.ContractError, match="leading zeros"):
            NAMES.route(f"model.language_model.layers.{n}.input_layernorm.weight", 6)


@pytest.mark.parametrize("name", [
    "model.language_model.rotary_emb.inv_freq",
    "model.language_model.layers.1.bogus.weight",
    "model.language_model.layers.1.hc_attn_gamma",
    "model.language_model.embed_tokens.bias",
    "something.else",
])
def test_an_unknown_tensor_is_named(name):
    with pytest.raises(memra.ContractError) as ei:
        NAMES.route(name, 6)
    assert repr(name) in str(ei.value)
    assert ei.value.code == 40024


def test_a_table_of_another_layout():
    # A Qwen-like layout: the first matching prefix is stripped, a family's own MTP names are
    # skipped (and no layers.N is MTP), and the group can come from the name.
    t = NameTable(
        prefixes=("model.language_model.", "model."),
        routes=(Route(r"^layers\.(?P<layer>\d+)\.(?P<g>linear_attn|self_attn)\.(?P<key>.+)$", r"\g<g>"),
                Route(r"^(?P<key>embed_tokens|norm|lm_head)\.weight$", "top")),
        mtp=(r"^mtp\.",))
    assert t.route("model.language_model.layers.0.linear_attn.in_proj_qkv.weight", 2) == (
        "layer", 0, "linear_attn", "in_proj_qkv.weight")
    assert t.route("model.layers.1.self_attn.q_proj.weight", 2) == ("layer", 1, "self_attn", "q_proj.weight")
    assert t.route("mtp.layers.0.mlp.gate.weight", 2) == ("skip", "mtp")
    assert t.route("model.visual.patch_embed.proj.weight", 2) == ("skip", "vision")
    assert t.route("lm_head.weight", 2) == ("top", "lm_head")
    with pytest.raises(memra.ContractError, match="layers.0.mlp"):
        t.route("model.layers.0.mlp.gate.weight", 2)
    with pytest.raises(memra.ContractError, match="past config.json's num_hidden_layers=2"):
        t.route("model.layers.2.self_attn.q_proj.weight", 2)
