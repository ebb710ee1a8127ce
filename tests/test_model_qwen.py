"""The tiny Qwen3.5 / Qwen3.5-MoE / Qwen3-Next models (all five model types) on the CPU backend
against transformers 5.17's stored outputs (tests/fixtures/<type>_reference.npz, made by
tests/fixtures/make_qwen_fixtures.py): logits, greedy tokens, every decode step of the greedy
continuation, expert choices and the cache after a prefill; the cache invariants (prefill(T-1) +
decode(1) == prefill(T), T = 1, prompts shorter than the conv kernel, batches of different
lengths == each alone); generate, stream and generate_batch; the two layouts of one MoE model;
the loader's notices and named errors.

Tolerances (rel_err = max|a - ref| / max|ref|): logits and decode steps 1e-4 against transformers
(the issue's bound; ~1e-6 observed: float32 in another order); cache states 1e-5 against
transformers (its chunked GDN form against memra's recurrent scan); prefill / decode splits 1e-5
for logits and every state plane (the issue's bound).

No torch / transformers here: the references are recorded in the fixtures.
"""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

import memra
from moe_reference import ExpertRecorder
from memra.models import qwen3_5, qwen3_5_moe, qwen3_next

ROOT = Path(__file__).resolve().parents[1]
FIX = ROOT / "tests" / "fixtures"
TYPES = ("qwen3_5_text", "qwen3_5", "qwen3_5_moe_text", "qwen3_5_moe", "qwen3_next")
FAMILY = {"qwen3_5_text": qwen3_5, "qwen3_5": qwen3_5, "qwen3_5_moe_text": qwen3_5_moe,
          "qwen3_5_moe": qwen3_5_moe, "qwen3_next": qwen3_next}
CONDITIONAL = ("qwen3_5", "qwen3_5_moe")
MOE_LAYERS = {"qwen3_5_text": (), "qwen3_5": (), "qwen3_5_moe_text": (0, 1, 2, 3), "qwen3_5_moe": (0, 1, 2, 3),
              "qwen3_next": (1, 2, 3)}
GDN_LAYERS, ATTN_LAYERS = (0, 2), (1, 3)
REF = {t: np.load(FIX / f"{t}_reference.npz") for t in TYPES}
_MODELS: dict[str, memra.Model] = {}


def model_of(t: str) -> memra.Model:
    if t not in _MODELS:
        _MODELS[t] = memra.load(FIX / f"tiny_{t}", max_batch=4, max_len=128, progress=False)
    return _MODELS[t]


def rel_err(a, ref) -> float:
    return float(np.abs(np.asarray(a, np.float64) - ref).max() / np.abs(ref).max())


def snapshot(model: memra.Model, cache: memra.Cache, slot: int) -> dict[str, np.ndarray]:
    """Every committed state plane of `slot`: GDN state and conv ring, attention K/V rows."""
    out: dict[str, np.ndarray] = {}
    for i, spec in enumerate(model.net.state_specs()):
        if spec.kind == "gdn":
            out[f"{i}.state"], out[f"{i}.conv"] = cache.gdn_state(i, slot), cache.gdn_conv(i, slot)
        else:
            out[f"{i}.keys"], out[f"{i}.values"] = cache.attn_keys(i, slot), cache.attn_values(i, slot)
    return out


def write_folder(dst: Path, t: str, tensors: dict[str, np.ndarray], config: dict | None = None) -> Path:
    shutil.copytree(FIX / f"tiny_{t}", dst)
    save_file({k: np.ascontiguousarray(v) for k, v in tensors.items()}, str(dst / "model.safetensors"),
              metadata={"format": "pt"})
    if config is not None:
        (dst / "config.json").write_text(json.dumps(config))
    return dst


def tensors_of(t: str) -> dict[str, np.ndarray]:
    return load_file(str(FIX / f"tiny_{t}" / "model.safetensors"))


# ------------------------------------------------------------------ against transformers
@pytest.mark.parametrize("t", TYPES)
def test_family_and_plan(t: str) -> None:
    m = model_of(t)
    assert m.net.family is FAMILY[t].FAMILY
    assert [p.mixer for p in m.net.plan] == ["gdn", "attention", "gdn", "attention"]
    assert [i for i, p in enumerate(m.net.plan) if p.ffn == "sparse"] == list(MOE_LAYERS[t])
    assert (m.net.lm_head is m.net.embed) == (t == "qwen3_5")  # the conditional dense fixture is tied
    assert m.config.layout == ("conditional" if t in CONDITIONAL else "causal")


@pytest.mark.parametrize("name", ["a", "b", "c"])
@pytest.mark.parametrize("t", TYPES)
def test_logits_match_transformers(t: str, name: str) -> None:
    logits = model_of(t).logits(REF[t][f"prompt_{name}"])
    want = REF[t][f"logits_f32_{name}"]
    assert logits.dtype == np.float32 and logits.shape == want.shape
    err = rel_err(logits, want)
    print(f"{t} prompt {name} (T={len(want)}): rel_err vs transformers f32 {err:.2e}")
    assert err <= 1e-4, err


@pytest.mark.parametrize("name", ["a", "b", "c"])
@pytest.mark.parametrize("t", TYPES)
def test_greedy_and_every_decode_step_match_transformers(t: str, name: str) -> None:
    m, R = model_of(t), REF[t]
    want = R[f"greedy_{name}"].tolist()
    assert m.generate(R[f"prompt_{name}"], len(want), ignore_eos=True) == want
    seq, full = R[f"seq_{name}"], R[f"logits_f32_seq_{name}"]
    T = len(R[f"prompt_{name}"])
    cache = m.new_cache(1, len(seq))
    rows = [m.prefill(cache, 0, seq[:T])] + [m.decode(cache, [0], [int(x)])[0] for x in seq[T:]]
    err = rel_err(np.stack(rows), full[T - 1:])
    assert err <= 1e-4, err


@pytest.mark.parametrize("t", TYPES)
def test_stream_yields_the_greedy_tokens(t: str) -> None:
    m, R = model_of(t), REF[t]
    want = R["greedy_b"].tolist()
    with m.stream(R["prompt_b"], len(want), ignore_eos=True) as tokens:
        assert list(tokens) == want
    assert all(m.cache.length(s) == 0 and m.cache.owner(s) == 0 for s in range(m.cache.max_batch))


@pytest.mark.parametrize("t", [t for t in TYPES if MOE_LAYERS[t]])
@pytest.mark.parametrize("name", ["a", "b"])
def test_expert_choices_match_transformers(t: str, name: str) -> None:
    m = memra.load(FIX / f"tiny_{t}", max_batch=1, max_len=128, progress=False)
    rec = {i: ExpertRecorder(m.net.blocks[i].ffn) for i in MOE_LAYERS[t]}
    for i, r in rec.items():
        m.net.blocks[i].ffn = r
    m.logits(REF[t][f"seq_{name}"])
    for i, r in rec.items():
        np.testing.assert_array_equal(r.chosen[0], REF[t][f"experts_{name}_layer{i}"], err_msg=f"layer {i}")


@pytest.mark.parametrize("t", TYPES)
def test_cache_after_prefill_matches_transformers(t: str) -> None:
    m, R = model_of(t), REF[t]
    ids = R["prompt_a"]
    cache = m.new_cache(1, 128)
    m.prefill(cache, 0, ids)
    for i in GDN_LAYERS:
        assert rel_err(cache.gdn_state(i, 0), R[f"state_a_layer{i}_recurrent"]) <= 1e-5, i
        # transformers keeps the last K inputs; memra's ring the last K - 1 (all a step needs).
        assert rel_err(cache.gdn_conv(i, 0), R[f"state_a_layer{i}_conv"][:, 1:]) <= 1e-5, i
    for i in ATTN_LAYERS:
        # transformers' cache rows [kv_heads, T, head_dim]: keys after k_norm and RoPE.
        assert rel_err(cache.attn_keys(i, 0), R[f"state_a_layer{i}_keys"].transpose(1, 0, 2)) <= 1e-5, i
        assert rel_err(cache.attn_values(i, 0), R[f"state_a_layer{i}_values"].transpose(1, 0, 2)) <= 1e-5, i


def test_rope_frequencies_are_transformers() -> None:
    layer = model_of("qwen3_5_text").net.blocks[1].mixer.layer
    np.testing.assert_array_equal(layer.inv_freq, REF["qwen3_5_text"]["rope_inv_freq"])


def test_the_two_moe_layouts_give_the_same_logits() -> None:
    # qwen3_5_moe_text and qwen3_5_moe hold the same text model (the fixture script copies it).
    for name in "abc":
        ids = REF["qwen3_5_moe"][f"prompt_{name}"]
        np.testing.assert_array_equal(model_of("qwen3_5_moe").logits(ids), model_of("qwen3_5_moe_text").logits(ids))


# ------------------------------------------------------------------ cache invariants and edge cases
@pytest.mark.parametrize("t", TYPES)
@pytest.mark.parametrize("T", [2, 3, 4, 5, 12, 64, 65, 73])
def test_prefill_then_decode_equals_prefill(t: str, T: int) -> None:
    # T - 1 = 1, 2: prompts shorter than the conv kernel (4); 64 / 65: around transformers' chunk.
    m = model_of(t)
    ids = REF[t]["seq_a"][:T].astype(np.int32)
    whole = m.new_cache(1, T)
    full = m.prefill(whole, 0, ids)
    split = m.new_cache(1, T)
    m.prefill(split, 0, ids[:-1])
    last = m.decode(split, [0], [ids[-1]])[0]
    assert rel_err(last, full) <= 1e-5, T
    a, b = snapshot(m, whole, 0), snapshot(m, split, 0)
    assert a.keys() == b.keys()
    for k in a:
        assert rel_err(b[k], a[k]) <= 1e-5, (T, k)


@pytest.mark.parametrize("t", TYPES)
def test_one_token_prompt(t: str) -> None:
    m, R = model_of(t), REF[t]
    first = R["prompt_c"][:1]
    by_prefill = m.prefill(m.new_cache(1, 4), 0, first)
    by_decode = m.decode(m.new_cache(1, 4), [0], first)[0]
    assert rel_err(by_prefill, R["logits_f32_c"][0]) <= 1e-4
    assert rel_err(by_decode, by_prefill) <= 1e-5


@pytest.mark.parametrize("t", TYPES)
def test_batch_of_different_lengths_equals_each_alone(t: str) -> None:
    m, R = model_of(t), REF[t]
    prompts = [R["prompt_a"], R["prompt_b"], R["prompt_c"]]
    together = m.generate_batch(prompts, 12, ignore_eos=True)
    assert together == [R[f"greedy_{n}"].tolist() for n in "abc"]
    assert together == [m.generate(p, 12, ignore_eos=True) for p in prompts]


@pytest.mark.parametrize("t", ["qwen3_5", "qwen3_next"])
def test_decode_of_mixed_slots_leaks_nothing(t: str) -> None:
    m, R = model_of(t), REF[t]
    a, c = R["prompt_a"].astype(np.int32), R["prompt_c"].astype(np.int32)
    cache = m.new_cache(3, 96)
    m.prefill(cache, 0, a)
    m.prefill(cache, 2, c)
    joint = m.decode(cache, [2, 0], [7, 9])
    for row, ids, tok in ((1, a, 9), (0, c, 7)):
        alone = m.new_cache(1, 96)
        m.prefill(alone, 0, ids)
        assert rel_err(joint[row], m.decode(alone, [0], [tok])[0]) <= 1e-6
    assert cache.length(1) == 0


def test_multi_turn_prefill_continues_the_slot() -> None:
    m = model_of("qwen3_next")
    ids = REF["qwen3_next"]["prompt_a"].astype(np.int32)
    whole = m.prefill(m.new_cache(1, 80), 0, ids)
    cache = m.new_cache(1, 80)
    for a, b in ((0, 2), (2, 40), (40, len(ids))):  # a turn shorter than the conv kernel first
        turns = m.prefill(cache, 0, ids[a:b])
    assert rel_err(turns, whole) <= 1e-5


def test_full_cache_and_bad_input_change_nothing() -> None:
    m = model_of("qwen3_5_moe")
    ids = REF["qwen3_5_moe"]["prompt_b"].astype(np.int32)
    cache = m.new_cache(1, len(ids) + 1)
    m.prefill(cache, 0, ids)
    before = snapshot(m, cache, 0)
    with pytest.raises(memra.CacheFullError):
        m.prefill(cache, 0, ids[:2])
    with pytest.raises(memra.ContractError):
        m.prefill(cache, 0, [m.config.vocab_size])
    for k, v in snapshot(m, cache, 0).items():
        np.testing.assert_array_equal(before[k], v)
    assert np.isfinite(m.decode(cache, [0], [1])).all()  # still usable


# ------------------------------------------------------------------ norms, names and notices
def test_zero_centred_norm_is_the_reference_arithmetic() -> None:
    # Qwen3_5RMSNorm: _norm(x.float()) * (1.0 + w.float()). memra stores 1 + w (f32) and its
    # rms_norm forms w' * (x * inv): the same two f32 factors, so the same bits for the same inv.
    # The reference here sums x^2 in memra's order (sequential f32), the one thing it fixes.
    from memra import _core
    from memra.models.residual import zero_centred

    g = np.random.default_rng(3)
    x = (g.standard_normal((5, 64)) * 3).astype(np.float32)
    w = (g.standard_normal(64) * 0.25).astype(np.float32)
    eps = np.float32(1e-6)
    ss = np.cumsum(x * x, axis=1, dtype=np.float32)[:, -1:]
    inv = np.float32(1) / np.sqrt(ss / np.float32(64) + eps)
    want = (x * inv) * (np.float32(1.0) + w)
    got = _core.rms_norm(x, zero_centred(w), eps=float(eps))
    np.testing.assert_array_equal(got, want)
    assert zero_centred(w).dtype == np.float32
    np.testing.assert_array_equal(model_of("qwen3_5_text").net.final_norm,
                                  1.0 + tensors_of("qwen3_5_text")["model.norm.weight"].astype(np.float32))


@pytest.mark.parametrize("t", TYPES)
def test_loader_notices_once_each(t: str, caplog) -> None:
    with caplog.at_level(logging.DEBUG, logger="memra"):
        memra.load(FIX / f"tiny_{t}", max_batch=1, max_len=8, progress=False)
    msgs = [r.getMessage() for r in caplog.records if r.name == "memra" and r.levelno >= logging.WARNING]
    vision = [s for s in msgs if "vision-tower" in s]
    mtp = [s for s in msgs if "multi-token-prediction" in s]
    assert len(vision) == (1 if t in CONDITIONAL else 0), msgs
    assert len(mtp) == (0 if t.endswith("_text") else 1), msgs
    assert len(msgs) == len(vision) + len(mtp), msgs


def _expect_load_error(path: Path, *needles: str, error=memra.ContractError) -> None:
    with pytest.raises(error) as e:
        memra.load(path, max_batch=1, max_len=16, progress=False)
    for n in needles:
        assert n in str(e.value), (n, str(e.value))


_L = "model.layers"
BAD_NAMES = [
    ("qwen3_5_text", lambda t: {**t, f"{_L}.0.mlp.foo.weight": t[f"{_L}.0.mlp.up_proj.weight"]},
     [f"{_L}.0.mlp.foo.weight"]),
    ("qwen3_5_text", lambda t: {**t, f"{_L}.0.linear_attn.in_proj_ba.weight":
                                t[f"{_L}.0.linear_attn.in_proj_b.weight"]},
     [f"{_L}.0.linear_attn", "in_proj_ba.weight"]),
    ("qwen3_5_text", lambda t: {**t, f"{_L}.0.self_attn.q_norm.weight": t[f"{_L}.1.self_attn.q_norm.weight"]},
     [f"{_L}.0", "self_attn"]),
    ("qwen3_5_text", lambda t: {k: v for k, v in t.items() if k != f"{_L}.1.self_attn.k_norm.weight"},
     [f"{_L}.1.self_attn", "k_norm.weight"]),
    ("qwen3_5_text", lambda t: {**t, f"{_L}.1.self_attn.o_proj.bias": t["model.norm.weight"]},
     [f"{_L}.1.self_attn", "o_proj.bias", "attention_bias is false"]),
    ("qwen3_5_text", lambda t: {k: v for k, v in t.items() if k != "lm_head.weight"}, ["lm_head"]),
    ("qwen3_5_moe_text", lambda t: {k: v for k, v in t.items() if k != f"{_L}.2.mlp.shared_expert_gate.weight"},
     [f"{_L}.2.mlp", "shared_expert_gate.weight"]),
    ("qwen3_5_moe_text", lambda t: {k: v for k, v in t.items() if k != f"{_L}.3.mlp.experts.7.down_proj.weight"},
     [f"{_L}.3.mlp", "experts.7.down_proj.weight"]),
    # glm5_next's plural name: no route takes it (transformers would not load it either)
    ("qwen3_5_moe_text", lambda t: {**t, f"{_L}.0.mlp.shared_experts.up_proj.weight":
                                    t[f"{_L}.0.mlp.shared_expert.up_proj.weight"]},
     [f"{_L}.0.mlp.shared_experts.up_proj.weight"]),
    ("qwen3_5_moe_text", lambda t: {**t, f"{_L}.0.mlp.gate.e_score_correction_bias": t["model.norm.weight"]},
     [f"{_L}.0.mlp.gate.e_score_correction_bias"]),
    ("qwen3_next", lambda t: {**t, f"{_L}.2.linear_attn.in_proj_z.weight": t[f"{_L}.2.linear_attn.in_proj_ba.weight"]},
     [f"{_L}.2.linear_attn", "in_proj_z.weight"]),
    ("qwen3_next", lambda t: {k: v for k, v in t.items() if k != f"{_L}.0.mlp.gate_proj.weight"},
     [f"{_L}.0.mlp", "gate_proj.weight"]),
    # an unknown name; a layer past config.json's (Qwen's MTP weights are mtp.*, never layers.N)
    ("qwen3_5_moe", lambda t: {**t, "model.language_model.foo": t["lm_head.weight"]},
     ["model.language_model.foo"]),
    ("qwen3_5_moe", lambda t: {**t, "model.language_model.layers.9.mlp.gate.weight":
                               t["model.language_model.layers.0.mlp.gate.weight"]},
     ["model.language_model.layers.9.mlp.gate.weight", "past config.json's num_hidden_layers=4"]),
]


@pytest.mark.parametrize("t,change,needles", BAD_NAMES, ids=[f"{b[0]}-{i}" for i, b in enumerate(BAD_NAMES)])
def test_bad_names_on_disk_are_named(tmp_path, t, change, needles) -> None:
    _expect_load_error(write_folder(tmp_path / "ckpt", t, change(tensors_of(t))), *needles)


def test_conditional_layout_loads_causal_names(tmp_path) -> None:
    # model.layers.* (the causal prefix) in a conditional checkpoint: the same model.
    t = tensors_of("qwen3_5_moe")
    moved = {("model." + k[len("model.language_model."):] if k.startswith("model.language_model.") else k): v
             for k, v in t.items()}
    other = memra.load(write_folder(tmp_path / "moved", "qwen3_5_moe", moved), max_batch=1, max_len=16,
                       progress=False)
    ids = REF["qwen3_5_moe"]["prompt_b"]
    np.testing.assert_array_equal(other.logits(ids), model_of("qwen3_5_moe").logits(ids))


def test_untied_conditional_needs_its_head_and_tied_causal_needs_none(tmp_path) -> None:
    t = tensors_of("qwen3_5")
    cfg = json.loads((FIX / "tiny_qwen3_5" / "config.json").read_text())
    cfg["tie_word_embeddings"] = False  # the top level decides: text_config's true is not enough
    _expect_load_error(write_folder(tmp_path / "untied", "qwen3_5", t, cfg), "lm_head")
    t = tensors_of("qwen3_5_text")
    cfg = json.loads((FIX / "tiny_qwen3_5_text" / "config.json").read_text())
    cfg["tie_word_embeddings"] = True
    headless = {k: v for k, v in t.items() if k != "lm_head.weight"}
    other = memra.load(write_folder(tmp_path / "tied", "qwen3_5_text", headless, cfg), max_batch=1, max_len=16,
                       progress=False)
    assert other.net.lm_head is other.net.embed
