"""memra.load refusing a malformed checkpoint folder with a named error (CPU): a side file or
shard that cannot be read (a directory where the file should be, no permission), a JSON file past
the parser's limits, a tensor held by two shards or one weight under two names, a dtype memra does
not read (FP8 / FP4 named from the header), EOS ids outside the vocabulary (generation_config.json
or config.json), a sampling default the sampler refuses, glm5_next settings memra does not run
(hidden_act, attention_bias, a top_k its group routing cannot reach) and a device string outside
"cpu" | "cuda" | "cuda:N".

Copies of the embedded tiny checkpoint, edited one thing at a time; each refusal is a
ContractError whose message names the file, key or argument at fault.
"""

from __future__ import annotations

import json
import logging
import pathlib
import shutil
from pathlib import Path

import ml_dtypes  # noqa: F401  (bfloat16 for safetensors' numpy framework)
import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

import memra
from memra.errors import ContractError
from memra.models import family_for

TINY = memra.default_checkpoint()
SIDE_FILES = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json")


@pytest.fixture(autouse=True)
def _quiet(caplog):
    caplog.set_level(logging.ERROR, logger="memra")  # the skip notices of every load


def _load(path: Path, **kw) -> memra.Model:
    return memra.load(path, max_batch=1, max_len=16, progress=False, **kw)


def _copy(tmp_path: Path, gen: dict | None = None) -> Path:
    """The tiny checkpoint copied, with `gen` merged into its generation_config.json."""
    dst = tmp_path / "ckpt"
    shutil.copytree(TINY, dst)
    if gen is not None:
        raw = json.loads((dst / "generation_config.json").read_text())
        raw.update(gen)
        (dst / "generation_config.json").write_text(json.dumps(raw))
    return dst


def _sharded(tmp_path: Path, shards: int = 2, *, repeat: str | None = None) -> Path:
    """The tiny checkpoint in `shards` shards + model.safetensors.index.json; `repeat`: a tensor
    written into the last shard too (the index still maps it to its first one)."""
    dst = tmp_path / "sharded"
    dst.mkdir()
    for f in SIDE_FILES:
        shutil.copy(TINY / f, dst / f)
    tensors = load_file(str(TINY / "model.safetensors"))
    names = sorted(tensors)
    weight_map = {}
    for s in range(shards):
        fname = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        group = {k: tensors[k] for k in names[s::shards]}
        weight_map.update({k: fname for k in group})
        if repeat is not None and s == shards - 1 and repeat not in group:
            group[repeat] = tensors[repeat]
        save_file(group, str(dst / fname), metadata={"format": "pt"})
    (dst / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return dst


def _refused(path: Path, *words: str, **kw) -> ContractError:
    """memra.load(path) raises a ContractError whose message holds every one of `words`."""
    with pytest.raises(ContractError) as info:
        _load(path, **kw)
    for w in words:
        assert w in str(info.value), f"{w!r} not in: {info.value}"
    return info.value


# ------------------------------------------------------------------ unreadable files
@pytest.mark.parametrize("name", ["config.json", "generation_config.json", "model.safetensors.index.json",
                                  "model.safetensors"])
def test_a_directory_where_a_file_goes_is_named(tmp_path, name):
    path = _copy(tmp_path)
    if name == "model.safetensors.index.json":
        path = _sharded(tmp_path)
    (path / name).unlink()
    (path / name).mkdir()
    e = _refused(path, str(path / name))
    assert e.code == 40025


def test_a_shard_that_is_a_directory_is_named(tmp_path):
    path = _sharded(tmp_path, 3)
    shard = path / "model-00002-of-00003.safetensors"
    shard.unlink()
    shard.mkdir()
    _refused(path, shard.name)


@pytest.mark.parametrize("name", ["config.json", "generation_config.json", "model.safetensors.index.json"])
def test_a_file_without_read_permission_is_named(tmp_path, monkeypatch, name):
    # chmod 000 does not stop root, so the read itself is made to fail as it would for a user.
    path = _sharded(tmp_path)
    target = path / name
    read_text = pathlib.Path.read_text

    def denied(self, *args, **kwargs):
        if self == target:
            raise PermissionError(13, "Permission denied", str(self))
        return read_text(self, *args, **kwargs)

    monkeypatch.setattr(pathlib.Path, "read_text", denied)
    _refused(path, str(target), "Permission denied")


# ------------------------------------------------------------------ shards
@pytest.mark.parametrize("name", ["model.language_model.embed_tokens.weight",
                                  "model.visual.blocks.0.attn.k_norm.weight"])
def test_a_tensor_in_two_shards_is_refused_naming_both(tmp_path, name):
    # A routed tensor and a skipped (vision) one: either way the checkpoint is malformed.
    path = _sharded(tmp_path, 3, repeat=name)
    first = json.loads((path / "model.safetensors.index.json").read_text())["weight_map"][name]
    last = "model-00003-of-00003.safetensors"
    assert first != last
    _refused(path, repr(name), first, last)


def _tensors_with(tmp_path: Path, edit) -> Path:
    """The tiny checkpoint copied with its tensors edited by `edit(dict)`."""
    dst = _copy(tmp_path)
    tensors = load_file(str(TINY / "model.safetensors"))
    edit(tensors)
    save_file(tensors, str(dst / "model.safetensors"), metadata={"format": "pt"})
    return dst


W = "model.language_model.layers.0.mlp.gate_proj.weight"


@pytest.mark.parametrize("alias", ["model.layers.0.mlp.gate_proj.weight"])  # another accepted prefix
def test_one_weight_under_two_names_is_refused_naming_both(tmp_path, alias):
    def edit(t):
        t[alias] = (t[W].astype(np.float32) * 2).astype(t[W].dtype)  # which copy would win cannot be told

    e = _refused(_tensors_with(tmp_path, edit), "same weight under two names")
    assert W in str(e) and alias in str(e)


@pytest.mark.parametrize("dtype,name", [(ml_dtypes.float8_e4m3fn, "F8_E4M3"), (ml_dtypes.float8_e5m2, "F8_E5M2")])
def test_an_fp8_tensor_is_named_with_its_dtype(tmp_path, dtype, name):
    def edit(t):
        t[W] = t[W].astype(np.float32).astype(dtype)

    e = _refused(_tensors_with(tmp_path, edit), W, name)
    assert e.code == memra._core.status.CONTRACT_DTYPE


def test_shards_without_repeats_still_load(tmp_path):
    want = _load(TINY).logits([1, 2, 3])
    np.testing.assert_array_equal(_load(_sharded(tmp_path, 3)).logits([1, 2, 3]), want)


# ------------------------------------------------------------------ generation_config.json
@pytest.mark.parametrize("eos", [-5, 99999, [256, 99999], [-1]])
def test_an_eos_token_id_outside_the_vocabulary_is_refused(tmp_path, eos):
    bad = eos if isinstance(eos, int) else next(e for e in eos if not 0 <= e < 272)
    e = _refused(_copy(tmp_path, {"eos_token_id": eos}), "generation_config.json", "eos_token_id", str(bad))
    assert e.code == memra._core.status.CONTRACT_RANGE


@pytest.mark.parametrize("eos", [-5, 99999, [3, 272]])
def test_config_jsons_eos_token_id_is_checked_too(tmp_path, eos):
    # Without generation_config.json the EOS ids come from config.json, held to the same rule.
    dst = _copy(tmp_path)
    (dst / "generation_config.json").unlink()
    raw = json.loads((dst / "config.json").read_text())
    (raw.get("text_config") or raw)["eos_token_id"] = eos
    (dst / "config.json").write_text(json.dumps(raw))
    e = _refused(dst, "config.json", "eos_token_id")
    assert e.code == memra._core.status.CONTRACT_RANGE


@pytest.mark.parametrize("text,words", [("[" * 100000 + "]" * 100000, "RecursionError"),
                                        ('{"vocab_size": ' + "9" * 5000 + "}", "digits")])
@pytest.mark.parametrize("name", ["config.json", "generation_config.json", "model.safetensors.index.json"])
def test_json_past_the_parsers_limits_is_named(tmp_path, text, words, name):
    dst = _copy(tmp_path)
    (dst / name).write_text(text)
    _refused(dst, name)


@pytest.mark.parametrize("edit,error,words", [
    ({"hidden_act": "gelu"}, memra.UnsupportedError, "hidden_act"),
    ({"attention_bias": True}, memra.UnsupportedError, "attention_bias"),
    ({"num_experts_per_tok": 5, "n_group": 2, "topk_group": 1}, memra.UnsupportedError, "topk_group"),
    ({"n_group": 3}, ContractError, "n_group"),
    ({"n_group": 2, "topk_group": 3}, ContractError, "topk_group (3) exceeds n_group (2)"),
    ({"n_group": 0}, ContractError, "n_group must be a positive integer"),
    ({"linear_lower_bound": 0.5}, ContractError, "linear_lower_bound must be a finite number <= 0"),
    ({"topk_group": 0}, ContractError, "topk_group must be a positive integer"),
    # Found by a fuzzing pass: -1 shared experts was taken as none, 1e300 reached the layers as a
    # float32 inf, a negative position count was taken.
    ({"n_shared_experts": -1}, ContractError, "n_shared_experts must be an integer >= 0, got -1"),
    ({"rms_norm_eps": 1e300}, ContractError, "rms_norm_eps must be a finite number (a float32"),
    ({"rms_norm_eps": -1.0}, ContractError, "rms_norm_eps must be at least 0"),
    ({"hc_eps": -1e-6}, ContractError, "hc_eps must be at least 0"),
    ({"routed_scaling_factor": 10**400}, ContractError, "routed_scaling_factor must be a finite number"),
    ({"max_position_embeddings": -1}, ContractError, "max_position_embeddings must be at least 1"),
])
def test_glm_settings_memra_does_not_run_are_refused(tmp_path, edit, error, words):
    # The tiny checkpoint: 8 routed experts. transformers would use these settings (another
    # activation, biases memra would not add, experts of dropped groups); memra refuses them.
    dst = _copy(tmp_path)
    raw = json.loads((dst / "config.json").read_text())
    (raw.get("text_config") or raw).update(edit)
    (dst / "config.json").write_text(json.dumps(raw))
    with pytest.raises(error, match=words.replace("(", r"\(").replace(")", r"\)")):
        _load(dst)


@pytest.mark.parametrize("key,value,words", [
    ("temperature", float("nan"), "finite"),
    ("temperature", 1e39, "float32"),
    ("temperature", -0.5, ">= 0"),
    ("top_p", 0, "(0, 1]"),
    ("top_p", 1.5, "(0, 1]"),
    ("top_k", 2**31, "int32"),
    ("top_k", 2**40, "int32"),
    ("top_k", -1, "[0, "),
    ("top_k", 2.5, "integer"),
])
def test_a_sampling_default_the_sampler_refuses_is_named_at_load(tmp_path, key, value, words):
    _refused(_copy(tmp_path, {key: value}), "generation_config.json", key, words)


def test_the_sampler_rule_is_generates_rule():
    # The loader holds the defaults to the rule Model.generate holds its arguments to.
    m = _load(TINY)
    for kw in ({"temperature": 1e39}, {"temperature": 1.0, "top_k": 2**31}, {"temperature": 1.0, "top_p": 0}):
        with pytest.raises(ContractError, match=next(iter(kw.keys() - {"temperature"}), "temperature")):
            m.generate([1, 2], 2, **kw)


def test_good_sampling_defaults_are_taken(tmp_path):
    m = _load(_copy(tmp_path, {"temperature": 0.6, "top_k": 20, "top_p": 0.95, "eos_token_id": [3, 7]}))
    g = m.generation_config
    assert (g.temperature, g.top_k, g.top_p, g.eos_token_ids) == (0.6, 20, 0.95, [3, 7])
    assert m.eos_token_ids == [3, 7]
    plain = _load(TINY).generation_config
    assert (plain.temperature, plain.top_k, plain.top_p, plain.eos_token_ids) == (None, None, None, [256])


# ------------------------------------------------------------------ device
@pytest.mark.parametrize("device", ["cpu:", "cuda:", "cpu:0", "cuda:+1", "cuda:1x", "CPU", " cpu", "cuda:99999999999"])
def test_a_device_outside_the_grammar_is_named(device):
    e = _refused(TINY, "device", repr(device), device=device)
    assert e.code == 40025


def test_cpu_still_loads():
    assert not _load(TINY, device="cpu").engine.is_cuda


FAMILY_FOLDERS = [TINY] + [Path(__file__).resolve().parent / "fixtures" / f"tiny_{f}" for f in
                           ("kimi_linear", "qwen3_5", "qwen3_5_moe", "qwen3_next")]


@pytest.mark.parametrize("src", FAMILY_FOLDERS, ids=lambda p: p.name)
def test_swish_is_silu(tmp_path, src):
    # transformers' ACT2FN maps both names to nn.SiLU (and the Qwen short conv's kernels take
    # either name): the same model in every family.
    dst = tmp_path / "ckpt"
    shutil.copytree(src, dst)
    raw = json.loads((dst / "config.json").read_text())
    text = raw.get("text_config") or raw
    assert text["hidden_act"] == "silu"
    text["hidden_act"] = "swish"
    (dst / "config.json").write_text(json.dumps(raw))
    np.testing.assert_array_equal(_load(dst).logits([1, 2, 3]), _load(src).logits([1, 2, 3]))


def test_integer_sampling_defaults_are_taken_as_floats(tmp_path):
    # JSON writes 1.0 as 1 just as often; GenerationConfig types temperature and top_p as
    # floats (what the sampler takes), and top_k stays an int.
    g = _load(_copy(tmp_path, {"temperature": 1, "top_k": 3, "top_p": 1})).generation_config
    assert (g.temperature, g.top_k, g.top_p) == (1.0, 3, 1.0)
    assert type(g.temperature) is float and type(g.top_p) is float and type(g.top_k) is int


def test_bfloat16_on_the_cpu_names_what_was_asked() -> None:
    # The message quoted dtype='float32', the value the user had not given (a break-it pass of
    # the CLI, session 24); it names bfloat16, the CUDA device it needs and the way out.
    import memra

    with pytest.raises(memra.UnsupportedError, match="dtype='bfloat16' needs a CUDA device") as info:
        memra.load(memra.default_checkpoint(), dtype="bfloat16", progress=False)
    assert "dtype='float32' or leave it out" in str(info.value)


@pytest.mark.parametrize("theta", [1e-45, 1e-300, 1e-35])
def test_a_rope_theta_whose_angles_overflow_float32_is_named(tmp_path, theta):
    # 1e-45 made every logits row NaN: the largest frequency 1 / theta ** ((d - 2) / d) is inf
    # in float32, or (1e-35) finite but times a position past float32's range.
    src = next(p for p in FAMILY_FOLDERS if p.name == "tiny_qwen3_5")
    dst = tmp_path / "ckpt"
    shutil.copytree(src, dst)
    raw = json.loads((dst / "config.json").read_text())
    (raw.get("text_config") or raw).setdefault("rope_parameters", {})["rope_theta"] = theta
    (dst / "config.json").write_text(json.dumps(raw))
    with pytest.raises(ContractError, match=r"rope_theta = .* is too small"):
        _load(dst)
    (raw.get("text_config") or raw)["rope_parameters"]["rope_theta"] = 1e-20  # small, but its angles fit
    (dst / "config.json").write_text(json.dumps(raw))
    assert np.isfinite(_load(dst).logits([1, 2, 3])).all()


@pytest.mark.parametrize("log2_theta,refused", [(-104, True), (-96, False)])
def test_the_rope_angle_rule_is_the_int32_positions(tmp_path, log2_theta, refused):
    # tiny_qwen3_5 rotates 64 dims: the largest frequency is theta ** -(62 / 64), and an angle
    # overflows float32 (~2^128) at some int32 position iff that frequency * 2^31 does. theta =
    # 2^-104: 2^(100.75 + 31), refused; 2^-96: 2^(93 + 31), taken.
    raw = json.loads((next(p for p in FAMILY_FOLDERS if p.name == "tiny_qwen3_5") / "config.json").read_text())
    raw["text_config"]["rope_parameters"]["rope_theta"] = 2.0 ** log2_theta
    assert (2.0 ** (-log2_theta * 62 / 64 + 31) > float(np.finfo(np.float32).max)) == refused
    parse = family_for(raw).parse_config
    if refused:
        with pytest.raises(ContractError, match=r"rope_theta = .* is too small"):
            parse(raw)
    else:
        parse(raw)


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])  # the loader's two conversion paths
def test_a_scalar_tensor_is_named_with_its_own_shape(tmp_path, dtype):
    # np.ascontiguousarray made the 0-d tensor 1-d: the refusal said shape [1].
    dst = _copy(tmp_path)
    tensors = load_file(str(dst / "model.safetensors"))
    name = next(k for k in tensors if k.endswith("embed_tokens.weight"))
    tensors[name] = np.array(1.0, ml_dtypes.bfloat16 if dtype == "bfloat16" else np.float32)
    save_file(tensors, str(dst / "model.safetensors"))
    with pytest.raises(ContractError, match=r"embed_tokens\.weight.*got shape \[\]"):
        _load(dst)


@pytest.mark.parametrize("index,words", [({"metadata": {}}, r"got a JSON object without it \(keys \['metadata'\]\)"),
                                         ([1, 2], "got a JSON list"), (5, "got a JSON int$"),
                                         ("weight_map", "got a JSON str$")])
def test_an_index_without_a_weight_map_says_so(tmp_path, index, words):
    dst = _copy(tmp_path)
    (dst / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(ContractError, match=r"is not a safetensors index: it must be a JSON object with a "
                                            r"\"weight_map\", " + words):
        _load(dst)
