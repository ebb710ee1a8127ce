"""The Kimi-Linear and Qwen fixtures are present, self-consistent and have the geometry issues 18
and 19 ask for, so CI notices a broken or regenerated-wrong fixture.

No transformers and no memra engine: numpy plus a reader of safetensors headers. The fixtures are
made by tests/fixtures/make_kimi_linear_fixtures.py and tests/fixtures/make_qwen_fixtures.py
(transformers 5.17.0); these tests check what those scripts promise in their docstrings.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
import pytest

FIXTURES = Path(__file__).resolve().parent / "fixtures"
QWEN_TYPES = ["qwen3_5_text", "qwen3_5", "qwen3_5_moe_text", "qwen3_5_moe", "qwen3_next"]
CONDITIONAL = {"qwen3_5", "qwen3_5_moe"}
MOE_TYPES = {"qwen3_5_moe_text", "qwen3_5_moe", "qwen3_next"}
PROMPT_KEYS = ["a", "b", "c"]
CHECKPOINT_LIMIT = 3 * 1024 * 1024
BF16_ONE = 0x3F80


def read_safetensors(path: Path) -> dict[str, tuple[str, list[int], np.ndarray]]:
    """name -> (dtype, shape, raw data as uint16 for BF16 / float32 for F32) from the file's
    header (8-byte little-endian length, JSON) and data."""
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + n])
    data = raw[8 + n :]
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        a, b = info["data_offsets"]
        kind = {"BF16": np.uint16, "F32": np.float32}[info["dtype"]]
        out[name] = (info["dtype"], info["shape"], np.frombuffer(data[a:b], dtype=kind))
    return out


def bf16_to_f32(u16: np.ndarray) -> np.ndarray:
    return (u16.astype(np.uint32) << 16).view(np.float32)


def check_tensors_not_default(tensors: dict) -> None:
    """Every tensor is bf16 and none is an exact 0 / 1 fill (transformers' default init of norms,
    biases, e_score_correction_bias, ...)."""
    for name, (dtype, _, data) in tensors.items():
        assert dtype == "BF16", name
        assert not np.all(data == 0), f"{name} is all zero"
        assert not np.all(data == BF16_ONE), f"{name} is all one"
        assert np.all(np.isfinite(bf16_to_f32(data))), name


def rel_err(a: np.ndarray, ref: np.ndarray) -> float:
    return float(np.max(np.abs(a.astype(np.float64) - ref)) / np.max(np.abs(ref)))


def check_reference(z, vocab: int) -> None:
    """What every family's reference npz holds, and that its parts agree with each other."""
    assert str(z["version_transformers"]) == "5.17.0"
    assert str(z["version_torch"]).startswith("2.13.")
    for p in PROMPT_KEYS:
        ids = z[f"prompt_{p}"]
        assert ids.tolist() == list(str(z[f"prompt_{p}_text"]).encode("utf-8"))  # byte-level tokenizer
        s = len(ids)
        for k in (f"logits_f32_{p}", f"logits_bf16_{p}"):
            assert z[k].shape == (s, vocab) and z[k].dtype == np.float32 and np.all(np.isfinite(z[k])), k
        err = rel_err(z[f"logits_bf16_{p}"], z[f"logits_f32_{p}"])
        assert err == pytest.approx(float(z[f"bf16_rel_err_{p}"]), rel=1e-4)
        assert 1e-4 < err < 5e-2, err  # bf16 really differs, and not by a flipped choice's jump
        new = z[f"greedy_{p}"]
        assert len(new) >= 8
        assert np.array_equal(z[f"greedy_bf16_{p}"], new)
        assert np.array_equal(z[f"seq_{p}"], np.concatenate([ids, new]))
        seq_logits = z[f"logits_f32_seq_{p}"]
        assert seq_logits.shape == (s + len(new), vocab)
        # the no-cache forward over prompt + greedy picks the greedy tokens, with the stored margins
        steps = seq_logits[s - 1 : s - 1 + len(new)]
        assert np.array_equal(steps.argmax(-1), new)
        top2 = np.sort(steps, axis=-1)[:, -2:]
        np.testing.assert_allclose(top2[:, 1] - top2[:, 0], z[f"greedy_{p}_margins"], rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(seq_logits[:s], z[f"logits_f32_{p}"], rtol=0, atol=1e-4)
    assert float(z["margin_greedy_abs"]) > 0.5 and float(z["margin_greedy_rel"]) > 0.05
    assert bool(z["bf16_same_greedy"]) and bool(z["bf16_same_experts"])


def check_experts(z, layers: list[int], n_experts: int, k: int, group_size: int | None) -> None:
    assert sorted(int(n.rsplit("layer", 1)[1]) for n in z.files if n.startswith("experts_a_")) == layers
    for p in PROMPT_KEYS:
        for i in layers:
            e = z[f"experts_{p}_layer{i}"]
            assert e.shape == (len(z[f"seq_{p}"]), k) and e.dtype == np.int32
            assert np.all((e >= 0) & (e < n_experts)) and np.all(np.diff(e, axis=-1) > 0)
            if group_size is not None:  # topk_group 1: both experts of a token in one group
                assert np.all(e[:, 0] // group_size == e[:, -1] // group_size)
    # routing differs between tokens (not one fixed expert pair)
    assert all(len({tuple(r) for r in z[f"experts_a_layer{i}"].tolist()}) >= 3 for i in layers)
    assert float(z["margin_router_abs"]) > 0 and float(z["margin_router_rel"]) > 0.02


def check_tokenizer(folder: Path) -> None:
    tok = json.loads((folder / "tokenizer.json").read_text())
    assert len(tok["model"]["vocab"]) == 256
    assert [(t["id"], t["content"]) for t in tok["added_tokens"]] == [(256, "<|endoftext|>"), (257, "<|pad|>")]
    gen = json.loads((folder / "generation_config.json").read_text())
    assert gen["eos_token_id"] == 256 and gen["pad_token_id"] == 257


# ----------------------------------------------------------------------------------------------------
# Kimi-Linear
# ----------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def kimi():
    folder = FIXTURES / "tiny_kimi_linear"
    cfg = json.loads((folder / "config.json").read_text())
    return cfg, read_safetensors(folder / "model.safetensors"), np.load(FIXTURES / "kimi_linear_reference.npz")


def test_kimi_config_geometry(kimi):
    cfg, _, _ = kimi
    assert cfg["model_type"] == "kimi_linear" and cfg["architectures"] == ["KimiLinearForCausalLM"]
    types = cfg["layer_types"]
    assert len(types) == cfg["num_hidden_layers"]
    assert types.count("linear_attention") >= 3 and types.count("full_attention") >= 2
    assert cfg["linear_head_dim"] == 128 and cfg["linear_num_heads"] >= 2
    assert cfg["q_lora_rank"] is None and cfg["qk_rope_head_dim"] > 0
    assert cfg["num_key_value_heads"] == cfg["num_attention_heads"]
    mlp = cfg["mlp_layer_types"]
    first_sparse = mlp.index("sparse")
    assert first_sparse >= 1 and set(mlp[:first_sparse]) == {"dense"} and set(mlp[first_sparse:]) == {"sparse"}
    # save_pretrained writes the release's aliases of the MoE fields
    assert cfg["num_expert_group"] > 1 and cfg["topk_group"] < cfg["num_expert_group"]
    assert cfg["num_experts"] % cfg["num_expert_group"] == 0
    assert cfg["num_experts_per_token"] <= cfg["num_experts"] // cfg["num_expert_group"] * cfg["topk_group"]
    assert cfg["routed_scaling_factor"] != 1.0 and cfg["num_shared_experts"] >= 1 and cfg["moe_renormalize"]
    assert cfg["tie_word_embeddings"] is False


def test_kimi_names_and_shapes_on_disk(kimi):
    cfg, t, _ = kimi
    h, hk, dk, kern = cfg["hidden_size"], cfg["linear_num_heads"], cfg["linear_head_dim"], cfg["linear_conv_kernel_dim"]
    heads, nope, rope, v = cfg["num_attention_heads"], cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"], cfg["v_head_dim"]
    lora, e = cfg["kv_lora_rank"], cfg["num_experts"]
    shape = {n: s for n, (_, s, _) in t.items()}
    for i, (lt, mt) in enumerate(zip(cfg["layer_types"], cfg["mlp_layer_types"])):
        a = f"model.layers.{i}.self_attn"
        if lt == "linear_attention":
            for p in "qkv":
                assert shape[f"{a}.{p}_proj.weight"] == [hk * dk, h]
                assert shape[f"{a}.{p}_conv1d.weight"] == [hk * dk, 1, kern]
            assert shape[f"{a}.A_log"] == [1, 1, hk, 1] and shape[f"{a}.dt_bias"] == [hk * dk]
            assert shape[f"{a}.f_a_proj.weight"] == [dk, h] and shape[f"{a}.f_b_proj.weight"] == [hk * dk, dk]
            assert shape[f"{a}.g_a_proj.weight"] == [dk, h] and shape[f"{a}.g_b_proj.weight"] == [hk * dk, dk]
            assert shape[f"{a}.b_proj.weight"] == [hk, h] and shape[f"{a}.o_norm.weight"] == [dk]
            assert shape[f"{a}.o_proj.weight"] == [h, hk * dk]
        else:
            assert shape[f"{a}.q_proj.weight"] == [heads * (nope + rope), h]
            assert shape[f"{a}.kv_a_proj_with_mqa.weight"] == [lora + rope, h]
            assert shape[f"{a}.kv_a_layernorm.weight"] == [lora]
            assert shape[f"{a}.kv_b_proj.weight"] == [heads * (nope + v), lora]
            assert shape[f"{a}.o_proj.weight"] == [h, heads * v]
        if mt == "dense":
            prefix = "mlp" if i == 0 else "block_sparse_moe"  # the release's name, then save_pretrained's
            assert shape[f"model.layers.{i}.{prefix}.gate_proj.weight"] == [cfg["intermediate_size"], h]
        else:
            m = f"model.layers.{i}.block_sparse_moe"
            assert shape[f"{m}.gate.weight"] == [e, h] and shape[f"{m}.gate.e_score_correction_bias"] == [e]
            for x in range(e):
                assert shape[f"{m}.experts.{x}.w1.weight"] == [cfg["moe_intermediate_size"], h]
                assert shape[f"{m}.experts.{x}.w2.weight"] == [h, cfg["moe_intermediate_size"]]
                assert shape[f"{m}.experts.{x}.w3.weight"] == [cfg["moe_intermediate_size"], h]
            assert shape[f"{m}.shared_experts.up_proj.weight"] == [cfg["moe_intermediate_size"] * cfg["num_shared_experts"], h]
    assert shape["lm_head.weight"] == [cfg["vocab_size"], h]
    assert not any(".forget_gate." in n or "gate_up_proj" in n or ".q_a_proj." in n for n in t)
    check_tensors_not_default(t)
    check_tokenizer(FIXTURES / "tiny_kimi_linear")
    assert sum(p.stat().st_size for p in (FIXTURES / "tiny_kimi_linear").iterdir()) < CHECKPOINT_LIMIT


def test_kimi_reference(kimi):
    cfg, _, z = kimi
    check_reference(z, cfg["vocab_size"])
    moe = [i for i, m in enumerate(cfg["mlp_layer_types"]) if m == "sparse"]
    check_experts(z, moe, cfg["num_experts"], cfg["num_experts_per_token"], cfg["num_experts"] // cfg["num_expert_group"])
    s = len(z["prompt_a"])
    assert s >= 65  # more than one 64-row chunk of transformers' chunked KDA
    assert len(z["prompt_c"]) < cfg["linear_conv_kernel_dim"]
    hk, dk = cfg["linear_num_heads"], cfg["linear_head_dim"]
    for i, lt in enumerate(cfg["layer_types"]):
        if lt == "linear_attention":
            assert z[f"state_a_layer{i}_conv"].shape == (3 * hk * dk, cfg["linear_conv_kernel_dim"])
            assert z[f"state_a_layer{i}_recurrent"].shape == (hk, dk, dk)
        else:
            assert z[f"state_a_layer{i}_kv_latent"].shape == (s, cfg["kv_lora_rank"])
            assert z[f"state_a_layer{i}_k_rope"].shape == (s, cfg["qk_rope_head_dim"])
    states = [k for k in z.files if k.startswith("state_a_")]
    assert all(np.all(np.isfinite(z[k])) for k in states)


def test_kimi_config_cases():
    cases = {c["name"]: c for c in json.loads((FIXTURES / "kimi_linear_config_cases.json").read_text())}
    saved = json.loads((FIXTURES / "tiny_kimi_linear" / "config.json").read_text())
    assert cases["save_pretrained_fixture"]["config"] == saved
    released = cases["released_form_fixture_geometry"]
    assert "linear_attn_config" in released["config"] and "layer_types" not in released["config"]
    assert min(released["config"]["linear_attn_config"]["kda_layers"]) == 1  # 1-based in the release
    assert released["parsed"] == {**cases["save_pretrained_fixture"]["parsed"]}
    assert cases["released_48b_a3b"]["parsed"]["layer_types"].count("full_attention") == 7
    assert any("error" in c["parsed"] for c in cases.values())
    for c in cases.values():
        assert "error" in c["parsed"] or len(c["parsed"]["layer_types"]) == c["parsed"]["num_hidden_layers"]


# ----------------------------------------------------------------------------------------------------
# Qwen3.5 / Qwen3.5-MoE / Qwen3-Next
# ----------------------------------------------------------------------------------------------------
def qwen(model_type: str):
    folder = FIXTURES / f"tiny_{model_type}"
    cfg = json.loads((folder / "config.json").read_text())
    return cfg, read_safetensors(folder / "model.safetensors"), np.load(FIXTURES / f"{model_type}_reference.npz")


@pytest.mark.parametrize("model_type", QWEN_TYPES)
def test_qwen_config_geometry(model_type):
    cfg, _, _ = qwen(model_type)
    assert cfg["model_type"] == model_type
    text = cfg["text_config"] if model_type in CONDITIONAL else cfg
    if model_type in CONDITIONAL:
        assert text["model_type"] == model_type + "_text" and "vision_config" in cfg
    assert text["linear_key_head_dim"] == text["linear_value_head_dim"] == 128
    assert text["linear_num_key_heads"] >= 2 and text["linear_num_value_heads"] == 2 * text["linear_num_key_heads"]
    assert text["head_dim"] == 256 and text["rope_parameters"]["partial_rotary_factor"] == 0.25
    assert text["num_key_value_heads"] >= 2 and text["num_attention_heads"] % text["num_key_value_heads"] == 0
    assert text["num_attention_heads"] > text["num_key_value_heads"]
    types = text["layer_types"]
    assert len(types) == text["num_hidden_layers"] and types.count("full_attention") >= 2
    assert types.count("linear_attention") >= 2
    if model_type in MOE_TYPES:
        assert text["num_experts_per_tok"] >= 2 and text["shared_expert_intermediate_size"] > 0
    if model_type == "qwen3_next":
        assert text["mlp_only_layers"] == [0] and text["norm_topk_prob"] is True


@pytest.mark.parametrize("model_type", QWEN_TYPES)
def test_qwen_names_and_shapes_on_disk(model_type):
    cfg, t, _ = qwen(model_type)
    text = cfg["text_config"] if model_type in CONDITIONAL else cfg
    h, hk, hv, dk, dv = (text[k] for k in ("hidden_size", "linear_num_key_heads", "linear_num_value_heads",
                                           "linear_key_head_dim", "linear_value_head_dim"))  # fmt: skip
    hq, hkv, hd = text["num_attention_heads"], text["num_key_value_heads"], text["head_dim"]
    conv = 2 * hk * dk + hv * dv
    lay = "model.language_model.layers" if model_type in CONDITIONAL else "model.layers"
    shape = {n: s for n, (_, s, _) in t.items()}
    for i, lt in enumerate(text["layer_types"]):
        if lt == "linear_attention":
            a = f"{lay}.{i}.linear_attn"
            if model_type == "qwen3_next":
                assert shape[f"{a}.in_proj_qkvz.weight"] == [2 * hk * dk + 2 * hv * dv, h]
                assert shape[f"{a}.in_proj_ba.weight"] == [2 * hv, h]
            else:
                assert shape[f"{a}.in_proj_qkv.weight"] == [conv, h] and shape[f"{a}.in_proj_z.weight"] == [hv * dv, h]
                assert shape[f"{a}.in_proj_b.weight"] == [hv, h] and shape[f"{a}.in_proj_a.weight"] == [hv, h]
            assert shape[f"{a}.conv1d.weight"] == [conv, 1, text["linear_conv_kernel_dim"]]
            assert shape[f"{a}.A_log"] == [hv] and shape[f"{a}.dt_bias"] == [hv] and shape[f"{a}.norm.weight"] == [dv]
            assert shape[f"{a}.out_proj.weight"] == [h, hv * dv]
        else:
            a = f"{lay}.{i}.self_attn"
            assert shape[f"{a}.q_proj.weight"] == [hq * hd * 2, h]  # [q | gate] per head
            assert shape[f"{a}.k_proj.weight"] == [hkv * hd, h] and shape[f"{a}.v_proj.weight"] == [hkv * hd, h]
            assert shape[f"{a}.q_norm.weight"] == [hd] and shape[f"{a}.k_norm.weight"] == [hd]
            assert shape[f"{a}.o_proj.weight"] == [h, hq * hd]
        m = f"{lay}.{i}.mlp"
        if model_type in MOE_TYPES and i not in text.get("mlp_only_layers", []):
            e = text["num_experts"]
            assert shape[f"{m}.gate.weight"] == [e, h] and shape[f"{m}.shared_expert_gate.weight"] == [1, h]
            for x in range(e):
                assert shape[f"{m}.experts.{x}.gate_proj.weight"] == [text["moe_intermediate_size"], h]
            assert shape[f"{m}.shared_expert.down_proj.weight"] == [h, text["shared_expert_intermediate_size"]]
        else:
            assert shape[f"{m}.gate_proj.weight"] == [text["intermediate_size"], h]
    tied = cfg["tie_word_embeddings"]
    assert ("lm_head.weight" in shape) != tied
    assert any(n.startswith("model.visual.") for n in shape) == (model_type in CONDITIONAL)
    check_tensors_not_default(t)
    check_tokenizer(FIXTURES / f"tiny_{model_type}")
    assert sum(p.stat().st_size for p in (FIXTURES / f"tiny_{model_type}").iterdir()) < CHECKPOINT_LIMIT


def test_qwen_fixtures_cover_layouts():
    """Both layouts, a tied and untied head, and multi-token-prediction weights to skip."""
    mtp = {m for m in QWEN_TYPES if any(n.startswith("mtp.") for n in qwen(m)[1])}
    assert {"qwen3_5", "qwen3_5_moe", "qwen3_next"} <= mtp
    ties = {qwen(m)[0]["tie_word_embeddings"] for m in QWEN_TYPES}
    assert ties == {True, False}


@pytest.mark.parametrize("model_type", QWEN_TYPES)
def test_qwen_reference(model_type):
    cfg, _, z = qwen(model_type)
    text = cfg["text_config"] if model_type in CONDITIONAL else cfg
    check_reference(z, text["vocab_size"])
    if model_type in MOE_TYPES:
        moe = [i for i in range(text["num_hidden_layers"]) if i not in text.get("mlp_only_layers", [])]
        check_experts(z, moe, text["num_experts"], text["num_experts_per_tok"], None)
    else:
        assert not any(n.startswith("experts_") for n in z.files)
    s = len(z["prompt_a"])
    hk, hv, dk, dv = (text[k] for k in ("linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim",
                                        "linear_value_head_dim"))  # fmt: skip
    for i, lt in enumerate(text["layer_types"]):
        if lt == "linear_attention":
            assert z[f"state_a_layer{i}_conv"].shape == (2 * hk * dk + hv * dv, text["linear_conv_kernel_dim"])
            assert z[f"state_a_layer{i}_recurrent"].shape == (hv, dk, dv)
        else:
            for k in ("keys", "values"):
                assert z[f"state_a_layer{i}_{k}"].shape == (text["num_key_value_heads"], s, text["head_dim"])
    rope = text["rope_parameters"]
    dim = int(text["head_dim"] * rope["partial_rotary_factor"])
    expect = 1.0 / (np.float32(rope["rope_theta"]) ** (np.arange(0, dim, 2, dtype=np.float32) / np.float32(dim)))
    np.testing.assert_allclose(z["rope_inv_freq"], expect, rtol=1e-6)


def test_qwen3_5_moe_layouts_hold_one_model():
    """qwen3_5_moe_text and qwen3_5_moe carry the same text weights (one model, two layouts)."""
    _, ta, za = qwen("qwen3_5_moe_text")
    _, tb, zb = qwen("qwen3_5_moe")
    text_b = {n.replace("model.language_model.", "model.", 1): v for n, v in tb.items()
              if n.startswith("model.language_model.") or n == "lm_head.weight"}  # fmt: skip
    assert set(text_b) == set(ta)
    assert all(np.array_equal(ta[n][2], text_b[n][2]) for n in ta)
    for p in PROMPT_KEYS:
        np.testing.assert_allclose(za[f"logits_f32_{p}"], zb[f"logits_f32_{p}"], rtol=0, atol=1e-5)


@pytest.mark.parametrize("family,members", [("qwen3_5", ["qwen3_5_text", "qwen3_5"]),
                                            ("qwen3_5_moe", ["qwen3_5_moe_text", "qwen3_5_moe"]),
                                            ("qwen3_next", ["qwen3_next"])])  # fmt: skip
def test_qwen_config_cases(family, members):
    cases = json.loads((FIXTURES / f"{family}_config_cases.json").read_text())
    names = [c["name"] for c in cases]
    assert len(names) == len(set(names)) >= 10
    saved = [json.loads((FIXTURES / f"tiny_{m}" / "config.json").read_text()) for m in members]
    assert all(any(c["config"] == s for c in cases) for s in saved)
    for c in cases:
        p = c["parsed"]
        if "error" in p:
            assert p["error"] and "message" in p
            continue
        assert len(p["layer_types"]) == p["num_hidden_layers"] == len(p["mlp_kinds"])
        assert p["rotary_dim"] == int(p["head_dim"] * p["rope_parameters"].get("partial_rotary_factor", 1.0))
    assert any("error" in c["parsed"] for c in cases)


def test_fixture_tree_stays_small():
    total = sum(p.stat().st_size for p in FIXTURES.rglob("*") if p.is_file())
    assert total < 40 * 1024 * 1024, total
