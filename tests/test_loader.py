"""memra.load / memra.loader on modified copies of the tiny glm5_next checkpoint (CPU).

Only numpy + safetensors + ml_dtypes (no torch / transformers): the reference logits are recorded
in tests/fixtures/glm5_next_tiny_reference.npz by tests/fixtures/make_glm5_next_fixtures.py.
"""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

import memra

FIXTURES = Path(__file__).resolve().parent / "fixtures"
TINY = memra.default_checkpoint()
BF16 = np.dtype(ml_dtypes.bfloat16)
P = "model.language_model."  # prefix of the text model's tensors on disk
SIDE_FILES = ("config.json", "generation_config.json", "tokenizer.json")


# ------------------------------------------------------------------ helpers
@pytest.fixture(scope="module")
def ref():
    return np.load(FIXTURES / "glm5_next_tiny_reference.npz")


@pytest.fixture(scope="module")
def tiny_tensors() -> dict[str, np.ndarray]:
    t = load_file(str(TINY / "model.safetensors"))
    assert any(v.dtype == BF16 for v in t.values())
    return t


@pytest.fixture(scope="module")
def bf16_logits(ref):
    """Logits of prompt_a from the shipped single-file bf16 checkpoint."""
    return _load(TINY).logits(ref["prompt_a"])


def _load(path: Path, **kw) -> memra.Model:
    kw.setdefault("max_batch", 1)
    kw.setdefault("max_len", 64)
    return memra.load(path, progress=False, **kw)


def _write(dst: Path, tensors: dict[str, np.ndarray], *, config_edit=None, shards: int = 1) -> Path:
    """A checkpoint folder at `dst` with the tiny checkpoint's side files and `tensors`
    (one model.safetensors, or `shards` shards + model.safetensors.index.json as transformers writes)."""
    dst.mkdir(parents=True, exist_ok=True)
    for f in SIDE_FILES:
        shutil.copy(TINY / f, dst / f)
    if config_edit is not None:
        raw = json.loads((dst / "config.json").read_text())
        config_edit(raw)
        (dst / "config.json").write_text(json.dumps(raw, indent=2))
    tensors = {k: np.ascontiguousarray(v) for k, v in tensors.items()}
    if shards == 1:
        save_file(tensors, str(dst / "model.safetensors"), metadata={"format": "pt"})
        return dst
    names = sorted(tensors)
    groups = [names[i::shards] for i in range(shards)]  # interleaved: every shard holds every kind
    weight_map = {}
    for s, group in enumerate(groups):
        fname = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        save_file({k: tensors[k] for k in group}, str(dst / fname), metadata={"format": "pt"})
        weight_map.update({k: fname for k in group})
    index = {
        "metadata": {"total_parameters": int(sum(v.size for v in tensors.values())),
                     "total_size": int(sum(v.nbytes for v in tensors.values()))},
        "weight_map": dict(sorted(weight_map.items())),
    }
    (dst / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
    return dst


def _rel_err(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.abs(got.astype(np.float64) - want).max() / np.abs(want).max())


def _converted(tensors, dtype) -> dict[str, np.ndarray]:
    """Every bf16 tensor converted to `dtype` (float32 tensors stay float32, as a converter that
    only rewrites the bf16 ones would leave them; a full f16 conversion is tested separately)."""
    return {k: (v.astype(np.float32).astype(dtype) if v.dtype == BF16 else v) for k, v in tensors.items()}


# ------------------------------------------------------------------ reference + formats
def test_single_file_matches_transformers(ref, bf16_logits):
    assert bf16_logits.shape == ref["logits_a"].shape
    assert bf16_logits.dtype == np.float32
    err = _rel_err(bf16_logits, ref["logits_a"])
    print(f"single-file bf16 vs transformers logits_a: max abs err / max abs logit = {err:.3e}")
    assert err < 1e-4


def test_sharded_checkpoint_is_bit_identical(tmp_path, ref, tiny_tensors, bf16_logits):
    path = _write(tmp_path / "sharded", tiny_tensors, shards=3)
    assert not (path / "model.safetensors").exists()
    index = json.loads((path / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) == 3
    logits = _load(path).logits(ref["prompt_a"])
    np.testing.assert_array_equal(logits, bf16_logits)
    err = _rel_err(logits, ref["logits_a"])
    print(f"sharded bf16 vs transformers logits_a: max abs err / max abs logit = {err:.3e}")
    assert err < 1e-4


def test_sharded_index_wins_over_single_file(tmp_path, ref, tiny_tensors, bf16_logits):
    # transformers prefers the index when both exist; a stale single file must not be read.
    path = _write(tmp_path / "both", tiny_tensors, shards=3)
    (path / "model.safetensors").write_bytes(b"garbage, not safetensors")
    np.testing.assert_array_equal(_load(path).logits(ref["prompt_a"]), bf16_logits)


def test_float32_checkpoint(tmp_path, ref, tiny_tensors, bf16_logits):
    path = _write(tmp_path / "f32", _converted(tiny_tensors, np.float32))
    assert all(v.dtype == np.float32 for v in load_file(str(path / "model.safetensors")).values())
    logits = _load(path).logits(ref["prompt_a"])
    # bf16 -> f32 is exact, so the weights are the same numbers: only the storage differs.
    err = _rel_err(logits, bf16_logits)
    print(f"f32 checkpoint vs bf16 checkpoint: rel err = {err:.3e}")
    assert err <= 1e-6
    assert _rel_err(logits, ref["logits_a"]) < 1e-4


def test_float16_checkpoint(tmp_path, ref, tiny_tensors, bf16_logits):
    # Everything (bf16 and the float32 tensors) stored as float16. bf16 -> f16 keeps the value
    # exactly when it is in f16's normal range (f16 has 11 significand bits to bf16's 8), so the bf16
    # weights change only where they are tiny (< 6.1e-5: subnormal, absolute error <= 3e-8) or
    # huge (none here; max |w| ~ 4.5); the float32 tensors (mHC, A_log, dt_bias, ...) are rounded to
    # relative 2**-11 ~ 4.9e-4. Propagated through 6 layers that gives ~4e-4 of the max logit
    # (measured 3.7e-4); 5e-3 leaves a 10x margin and still catches a wrong dtype reading
    # (O(1) errors).
    f16 = {k: v.astype(np.float32).astype(np.float16) for k, v in tiny_tensors.items()}
    for k, v in tiny_tensors.items():
        assert np.isfinite(f16[k]).all(), k
    path = _write(tmp_path / "f16", f16)
    logits = _load(path).logits(ref["prompt_a"])
    err = _rel_err(logits, bf16_logits)
    print(f"f16 checkpoint vs bf16 checkpoint: rel err = {err:.3e}")
    assert np.isfinite(logits).all()
    assert err < 5e-3
    assert (logits.argmax(-1) == bf16_logits.argmax(-1)).mean() >= 0.9


def test_mixed_dtype_shards(tmp_path, ref, tiny_tensors, bf16_logits):
    # Shard 1 float32, shards 2-3 bf16: dtype is per tensor, not per checkpoint.
    path = _write(tmp_path / "mixed", tiny_tensors, shards=3)
    first = path / "model-00001-of-00003.safetensors"
    t = load_file(str(first))
    save_file({k: v.astype(np.float32) for k, v in t.items()}, str(first), metadata={"format": "pt"})
    assert _rel_err(_load(path).logits(ref["prompt_a"]), bf16_logits) <= 1e-6


def test_legacy_language_model_layout(tmp_path, ref, tiny_tensors, bf16_logits):
    # The older VLM layout: language_model.model.* for the text model, language_model.lm_head.weight.
    def rename(k):
        if k == "lm_head.weight":
            return "language_model.lm_head.weight"
        if k.startswith(P):
            return "language_model.model." + k[len(P):]
        return k
    path = _write(tmp_path / "legacy", {rename(k): v for k, v in tiny_tensors.items()}, shards=2)
    np.testing.assert_array_equal(_load(path).logits(ref["prompt_a"]), bf16_logits)


def test_text_only_layout(tmp_path, ref, tiny_tensors, bf16_logits):
    # A text-only save: model.* + lm_head.weight, no vision tower.
    t = {("model." + k[len(P):] if k.startswith(P) else k): v for k, v in tiny_tensors.items()
         if not k.startswith("model.visual.")}
    path = _write(tmp_path / "text", t)
    np.testing.assert_array_equal(_load(path).logits(ref["prompt_a"]), bf16_logits)


# ------------------------------------------------------------------ notices
def test_skip_notices_once_each(tmp_path, tiny_tensors, caplog):
    # Sharded, so that each kind of skipped tensor shows up in several shards.
    path = _write(tmp_path / "sharded", tiny_tensors, shards=3)
    n_vision = sum(k.startswith("model.visual.") for k in tiny_tensors)
    n_mtp = sum(k.startswith(P + "layers.6.") for k in tiny_tensors)
    assert n_vision > 3 and n_mtp > 3
    with caplog.at_level(logging.DEBUG, logger="memra"):
        _load(path)
    msgs = [r.getMessage() for r in caplog.records if r.name == "memra" and r.levelno >= logging.WARNING]
    vision = [m for m in msgs if "vision" in m]
    mtp = [m for m in msgs if "multi-token-prediction" in m]
    shared = [m for m in msgs if "shared_head" in m]
    assert len(vision) == 1, msgs
    assert len(mtp) == 1, msgs
    assert len(shared) == 1, msgs
    assert len(msgs) == 3, msgs


def test_no_notices_without_skipped_tensors(tmp_path, tiny_tensors, caplog):
    text_only = {k: v for k, v in tiny_tensors.items()
                 if not k.startswith("model.visual.") and not k.startswith(P + "layers.6.")}
    path = _write(tmp_path / "text_only", text_only)
    with caplog.at_level(logging.DEBUG, logger="memra"):
        _load(path)
    assert not [r for r in caplog.records if r.name == "memra" and r.levelno >= logging.WARNING]


# ------------------------------------------------------------------ contract errors
def test_missing_tensor(tmp_path, tiny_tensors):
    name = P + "layers.2.self_attn.kv_b_proj.weight"
    t = {k: v for k, v in tiny_tensors.items() if k != name}
    with pytest.raises(memra.ContractError, match="kv_b_proj") as ei:
        _load(_write(tmp_path / "c", t))
    assert "layers.2" in str(ei.value)
    assert 40000 <= ei.value.code < 50000


@pytest.mark.parametrize("name,named", [
    ("layers.0.self_attn.A_log", "A_log"),                                  # KDA
    ("layers.2.mlp.experts.5.up_proj.weight", "experts.5.up_proj.weight"),  # MoE expert
    ("layers.1.mlp.gate.weight", "gate.weight"),                            # router
    ("layers.0.hc_attn_fn", "fn"),                                          # mHC
    ("layers.4.post_attention_layernorm.weight", "post_attention_layernorm"),
    ("layers.5.self_attn.indexer.wk.weight", "indexer.wk.weight"),          # full DSA indexer
])
def test_missing_tensor_elsewhere(tmp_path, tiny_tensors, name, named):
    assert P + name in tiny_tensors
    t = {k: v for k, v in tiny_tensors.items() if k != P + name}
    with pytest.raises(memra.ContractError) as ei:
        _load(_write(tmp_path / "c", t))
    msg = str(ei.value)
    assert named in msg, msg
    assert ".".join(name.split(".")[:2]) + "." in msg, msg


def test_missing_top_level_tensor(tmp_path, tiny_tensors):
    for name in (P + "embed_tokens.weight", P + "norm.weight"):
        t = {k: v for k, v in tiny_tensors.items() if k != name}
        with pytest.raises(memra.ContractError, match=name[len(P):].split(".")[0]):
            _load(_write(tmp_path / name, t))


def test_extra_unknown_tensor(tmp_path, tiny_tensors):
    name = P + "layers.1.self_attn.bogus.weight"
    t = dict(tiny_tensors)
    t[name] = np.zeros((4, 4), BF16)
    with pytest.raises(memra.ContractError, match="bogus") as ei:
        _load(_write(tmp_path / "c", t))
    assert "layers.1" in str(ei.value)


def test_extra_unroutable_tensor(tmp_path, tiny_tensors):
    name = P + "rotary_emb.inv_freq"
    t = dict(tiny_tensors)
    t[name] = np.zeros((4,), np.float32)
    with pytest.raises(memra.ContractError, match="rotary_emb"):
        _load(_write(tmp_path / "c", t))


def test_misshaped_tensor(tmp_path, tiny_tensors):
    name = P + "layers.0.self_attn.q_proj.weight"
    t = dict(tiny_tensors)
    assert t[name].shape[0] != t[name].shape[1]
    t[name] = np.ascontiguousarray(t[name].T)
    with pytest.raises(memra.ContractError, match="q_proj") as ei:
        _load(_write(tmp_path / "c", t))
    assert "layers.0" in str(ei.value)


def test_misshaped_mla_tensor(tmp_path, tiny_tensors):
    name = P + "layers.3.self_attn.kv_b_proj.weight"
    t = dict(tiny_tensors)
    t[name] = np.ascontiguousarray(t[name][:-1])
    with pytest.raises(memra.ContractError, match="kv_b_proj") as ei:
        _load(_write(tmp_path / "c", t))
    assert "layers.3" in str(ei.value)


def test_misshaped_lm_head(tmp_path, tiny_tensors):
    t = dict(tiny_tensors)
    t["lm_head.weight"] = np.ascontiguousarray(t["lm_head.weight"][:-1])
    with pytest.raises(memra.ContractError, match="lm_head"):
        _load(_write(tmp_path / "c", t))


def test_missing_lm_head_untied(tmp_path, tiny_tensors):
    t = {k: v for k, v in tiny_tensors.items() if k != "lm_head.weight"}
    with pytest.raises(memra.ContractError, match="lm_head"):
        _load(_write(tmp_path / "c", t))


def _tie_top_level(raw):
    raw["tie_word_embeddings"] = True


def _tie_both(raw):
    raw["tie_word_embeddings"] = True
    raw["text_config"]["tie_word_embeddings"] = True


def _flat_tied(raw):
    text = raw.pop("text_config")
    raw.pop("vision_config")
    text.pop("model_type")
    raw.update(text)
    raw["tie_word_embeddings"] = True


@pytest.mark.parametrize("edit", [_tie_top_level, _tie_both, _flat_tied])
def test_missing_lm_head_tied(tmp_path, ref, tiny_tensors, edit):
    t = {k: v for k, v in tiny_tensors.items() if k != "lm_head.weight"}
    model = _load(_write(tmp_path / "c", t, config_edit=edit))
    assert model.config.tie_word_embeddings is True
    ids = ref["prompt_a"]
    logits = model.logits(ids)
    # Expected: the same model with embed_tokens written out as lm_head.
    t2 = dict(t)
    t2["lm_head.weight"] = t[P + "embed_tokens.weight"].copy()
    want = _load(_write(tmp_path / "explicit", t2)).logits(ids)
    np.testing.assert_array_equal(logits, want)
    # and it really is another head than the checkpoint's own lm_head
    assert _rel_err(logits, ref["logits_a"]) > 1e-2


def test_tie_only_inside_text_config_does_not_tie(tmp_path, tiny_tensors):
    # transformers' Glm5NextForConditionalGeneration reads the top-level tie_word_embeddings only.
    t = {k: v for k, v in tiny_tensors.items() if k != "lm_head.weight"}

    def tie_text_only(raw):
        raw["text_config"]["tie_word_embeddings"] = True
        raw.pop("tie_word_embeddings", None)

    with pytest.raises(memra.ContractError, match="lm_head"):
        _load(_write(tmp_path / "c", t, config_edit=tie_text_only))


def test_missing_shard(tmp_path, tiny_tensors):
    path = _write(tmp_path / "c", tiny_tensors, shards=3)
    (path / "model-00002-of-00003.safetensors").unlink()
    with pytest.raises(memra.ContractError, match="model-00002-of-00003.safetensors"):
        _load(path)


def test_bad_index(tmp_path, tiny_tensors):
    path = _write(tmp_path / "c", tiny_tensors, shards=3)
    (path / "model.safetensors.index.json").write_text("{}")
    with pytest.raises(memra.ContractError, match="index"):
        _load(path)


def test_no_safetensors(tmp_path):
    for f in SIDE_FILES:
        shutil.copy(TINY / f, tmp_path / f)
    with pytest.raises(memra.ContractError, match="safetensors"):
        _load(tmp_path)


@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.float64])
def test_unsupported_dtype(tmp_path, tiny_tensors, dtype):
    name = P + "layers.4.mlp.gate.weight"
    t = dict(tiny_tensors)
    t[name] = t[name].astype(np.float32).astype(dtype)
    with pytest.raises(memra.ContractError, match="mlp.gate.weight") as ei:
        _load(_write(tmp_path / "c", t))
    assert np.dtype(dtype).name in str(ei.value)


# ------------------------------------------------------------------ cache sizing / paths
HUGE = dict(max_batch=2**20, max_len=2**24)  # ~1e14 cache floats: no host has that much memory


def test_cache_too_large_is_out_of_memory(tmp_path, tiny_tensors):
    path = _write(tmp_path / "c", tiny_tensors)
    with pytest.raises(memra.OutOfMemoryError) as ei:
        _load(path, **HUGE)
    assert ei.value.code == 30001
    assert isinstance(ei.value, MemoryError)


@pytest.mark.parametrize("damage", ["deleted", "corrupt", "bad_tensor"])
def test_cache_refused_before_any_weight_is_read(tmp_path, tiny_tensors, damage):
    # The cache is sized from config.json alone, so the refusal comes even when the weights are
    # unreadable (and a reading loader would have raised ContractError / a safetensors error).
    t = dict(tiny_tensors)
    if damage == "bad_tensor":
        t[P + "layers.0.self_attn.q_proj.weight"] = np.zeros((3,), np.int32)
    path = _write(tmp_path / "c", t)
    if damage == "deleted":
        (path / "model.safetensors").unlink()
    elif damage == "corrupt":
        (path / "model.safetensors").write_bytes(b"\x00" * 100)
    with pytest.raises(memra.OutOfMemoryError) as ei:
        _load(path, **HUGE)
    assert ei.value.code == 30001


def test_small_cache_still_loads_after_refusal(tmp_path, tiny_tensors, ref, bf16_logits):
    path = _write(tmp_path / "c", tiny_tensors)
    with pytest.raises(memra.OutOfMemoryError):
        _load(path, **HUGE)
    np.testing.assert_array_equal(_load(path).logits(ref["prompt_a"]), bf16_logits)


def test_load_not_a_directory(tmp_path):
    f = tmp_path / "model.safetensors"
    shutil.copy(TINY / "model.safetensors", f)
    with pytest.raises(memra.ContractError, match="not a directory"):
        _load(f)
    with pytest.raises(memra.ContractError, match="not a directory"):
        _load(tmp_path / "does_not_exist")
    with pytest.raises(memra.ContractError):
        _load(TINY / "config.json")


def test_an_empty_path_is_named_not_taken_as_this_folder(tmp_path, monkeypatch):
    # Path("") is "."; the CLI refuses an empty PATH, and load does too (40024), even where the
    # working directory holds a checkpoint
    monkeypatch.chdir(TINY)
    with pytest.raises(memra.ContractError, match="load: path is empty") as ei:
        memra.load("")
    assert ei.value.code == 40024


def test_load_str_path(ref, bf16_logits):
    np.testing.assert_array_equal(_load(str(TINY)).logits(ref["prompt_a"]), bf16_logits)


def test_truncated_safetensors_is_a_named_error(tmp_path: Path) -> None:
    dst = tmp_path / "truncated"
    dst.mkdir()
    for f in SIDE_FILES:
        shutil.copy(TINY / f, dst / f)
    data = (TINY / "model.safetensors").read_bytes()
    (dst / "model.safetensors").write_bytes(data[: len(data) // 3])
    with pytest.raises(memra.ContractError) as e:
        _load(dst)
    assert "model.safetensors" in str(e.value)
