"""memra.load on what stands at a checkpoint's paths and on what its index and config claim (CPU):
a symbolic link to nothing, a FIFO or a device where a file should be, a side file too large to
read whole, an index whose weight_map disagrees with its shards or points outside the folder, a
config.json that says fewer layers than the checkpoint holds, a sigmoid router without its
e_score_correction_bias, sizes of 0, and sampling defaults memra does not apply.

Each refusal is a ContractError naming the file, tensor or key; a good load works after it."""

from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path

import pytest
from memra.errors import ContractError
from safetensors.numpy import load_file, save_file
from test_loader_errors import TINY, _copy, _load, _refused, _sharded


KIMI = Path(__file__).parent / "fixtures" / "tiny_kimi_linear"
P = "model.language_model."


def _edit_config(folder: Path, **changes) -> Path:
    raw = json.loads((folder / "config.json").read_text())
    text = raw.get("text_config", raw)
    text.update(changes)
    (folder / "config.json").write_text(json.dumps(raw))
    return folder


def _drop_tensor(folder: Path, name: str) -> Path:
    tensors = load_file(str(folder / "model.safetensors"))
    del tensors[name]
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    return folder


def _good_load_still_works() -> None:
    assert _load(TINY).logits([1, 2, 3]).shape[-1] > 0


@pytest.mark.parametrize("src,name", [
    (TINY, P + "layers.5.mlp.gate.e_score_correction_bias"),
    (KIMI, "model.layers.2.block_sparse_moe.gate.e_score_correction_bias"),
])
def test_a_sigmoid_router_without_its_bias_is_named(tmp_path, src, name) -> None:
    # zeros in its place chose other experts (logits 6.7 off on the tiny checkpoint)
    folder = tmp_path / "ckpt"
    shutil.copytree(src, folder)
    if name not in load_file(str(folder / "model.safetensors")):
        pytest.fail(f"the fixture has no {name}")
    _refused(_drop_tensor(folder, name), "e_score_correction_bias")
    _good_load_still_works()


def test_a_config_with_fewer_layers_than_the_checkpoint_is_named(tmp_path) -> None:
    # glm5_next: layer num_hidden_layers is the MTP layer (skipped); the ones after it are the
    # checkpoint's real layers that config.json no longer counts.
    folder = _edit_config(_copy(tmp_path), num_hidden_layers=4)
    _refused(folder, f"{P}layers.5.", "belongs to layer 5, past config.json's num_hidden_layers=4")
    kimi = tmp_path / "kimi"
    shutil.copytree(KIMI, kimi)
    raw = json.loads((kimi / "config.json").read_text())
    raw["num_hidden_layers"] = 6
    for key in ("layer_types", "mlp_layer_types"):
        if isinstance(raw.get(key), list):
            raw[key] = raw[key][:6]
    (kimi / "config.json").write_text(json.dumps(raw))
    _refused(kimi, "model.layers.6.", "past config.json's num_hidden_layers=6")


def test_a_layer_number_in_other_digits_is_no_layer(tmp_path) -> None:
    folder = _copy(tmp_path)
    tensors = load_file(str(folder / "model.safetensors"))
    name = P + "layers.0.input_layernorm.weight"
    tensors[P + "layers.\u0660.input_layernorm.weight"] = tensors.pop(name)  # ARABIC-INDIC DIGIT ZERO
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    _refused(folder, "layers.\u0660.input_layernorm.weight")


@pytest.mark.parametrize("case,words", [
    ("ghost", ["lists tensor 'ghost.weight'", "which does not hold it"]),
    ("wrong_shard", ["is in model-00001-of-00002.safetensors, but model.safetensors.index.json lists it in "
                     "model-00002-of-00002.safetensors"]),
    ("unlisted", ["does not list it"]),
    ("outside", ["'../elsewhere.safetensors', which is not the name of a file in"]),
    ("absolute", ["which is not the name of a file in"]),
    ("empty", ["to '', which is not the name"]),
    ("dot", ["to '.', which is not the name"]),
])
def test_an_index_that_disagrees_with_its_shards_is_named(tmp_path, case, words) -> None:
    folder = _sharded(tmp_path)
    index = folder / "model.safetensors.index.json"
    raw = json.loads(index.read_text())
    wm = raw["weight_map"]
    first = next(k for k, v in wm.items() if v.startswith("model-00001"))
    if case == "ghost":
        wm["ghost.weight"] = "model-00001-of-00002.safetensors"
    elif case == "wrong_shard":
        wm[first] = "model-00002-of-00002.safetensors"
    elif case == "unlisted":
        del wm[first]
    elif case == "outside":
        (tmp_path / "elsewhere.safetensors").write_bytes((folder / "model-00001-of-00002.safetensors").read_bytes())
        wm[first] = "../elsewhere.safetensors"
    elif case == "absolute":
        wm[first] = str(folder / "model-00001-of-00002.safetensors")
    else:
        wm[first] = "" if case == "empty" else "."
    index.write_text(json.dumps(raw))
    _refused(folder, *words)
    _good_load_still_works()


@pytest.mark.parametrize("name", ["generation_config.json", "tokenizer.json", "model.safetensors.index.json",
                                  "config.json", "model.safetensors"])
def test_a_symbolic_link_to_nothing_is_named_not_taken_for_absent(tmp_path, name) -> None:
    # Path.exists() is False for it: generation_config.json's EOS ids and sampling defaults, or
    # the tokenizer, were dropped without a word.
    folder = _copy(tmp_path)
    (folder / name).unlink(missing_ok=True)
    (folder / name).symlink_to(tmp_path / "nowhere")
    _refused(folder, name, "symbolic link to nothing")
    _good_load_still_works()


@pytest.mark.parametrize("name", ["config.json", "generation_config.json", "tokenizer.json"])
def test_a_device_where_a_side_file_should_be_is_named(tmp_path, name) -> None:
    # /dev/zero never ends: reading it whole once ran the process out of memory
    folder = _copy(tmp_path)
    (folder / name).unlink()
    (folder / name).symlink_to("/dev/zero")
    _refused(folder, name, "not a regular file")


def test_a_fifo_shard_is_named_instead_of_blocking(tmp_path) -> None:
    folder = _copy(tmp_path)
    (folder / "model.safetensors").unlink()
    os.mkfifo(folder / "model.safetensors")
    _refused(folder, "model.safetensors", "not a regular file")


def test_a_side_file_past_the_limit_is_named_before_it_is_read(tmp_path) -> None:
    from memra.config import MAX_SIDE_FILE_BYTES

    folder = _copy(tmp_path)
    with open(folder / "generation_config.json", "r+b") as f:
        f.truncate(MAX_SIDE_FILE_BYTES + 1)  # sparse: no disk, no read
    _refused(folder, "generation_config.json", f"is {MAX_SIDE_FILE_BYTES + 1} bytes, more than the")


def test_a_tokenizer_config_nested_past_the_parser_is_named(tmp_path) -> None:
    folder = tmp_path / "kimi"
    shutil.copytree(KIMI, folder)
    (folder / "tokenizer.json").unlink()
    (folder / "tiktoken.model").write_text("")
    (folder / "tokenizer_config.json").write_text("[" * 100000 + "]" * 100000)
    _refused(folder, "tokenizer_config.json", "RecursionError")


@pytest.mark.parametrize("src,key,words", [
    (TINY, "moe_intermediate_size", "moe_intermediate_size must be an integer >= 1"),
    (TINY, "kv_lora_rank", "kv_lora_rank must be an integer >= 1"),
    (TINY, "linear_head_dim", "linear_head_dim must be an integer >= 1"),
    (TINY, "intermediate_size", "intermediate_size must be an integer >= 1"),
    (KIMI, "num_experts", "num_experts / num_local_experts must be an integer >= 1"),
    (KIMI, "num_expert_group", "num_expert_group / n_group must be an integer >= 1"),
])
def test_a_size_of_zero_is_named_by_its_key(tmp_path, src, key, words) -> None:
    folder = tmp_path / "ckpt"
    shutil.copytree(src, folder)
    _refused(_edit_config(folder, **{key: 0}), words)


def test_sampling_defaults_memra_does_not_apply_are_said(tmp_path, caplog) -> None:
    caplog.set_level(logging.WARNING, logger="memra")
    folder = _copy(tmp_path, gen={"repetition_penalty": 1.05, "min_p": 0.0, "presence_penalty": 0.5})
    _load(folder)
    said = [r.getMessage() for r in caplog.records if "does not apply" in r.getMessage()]
    assert len(said) == 1 and "repetition_penalty=1.05" in said[0] and "presence_penalty=0.5" in said[0], said
    assert "min_p" not in said[0]  # its neutral value changes nothing
    caplog.clear()
    _load(_copy(tmp_path / "plain"))
    assert not [r for r in caplog.records if "does not apply" in r.getMessage()]


def test_a_tokenizer_larger_than_the_vocabulary_is_said(tmp_path, caplog) -> None:
    # Its ids past vocab_size are refused when a text encodes to them; the load says so once.
    from tokenizers import AddedToken, Tokenizer

    caplog.set_level(logging.WARNING, logger="memra")
    folder = _copy(tmp_path)
    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    vocab = json.loads((folder / "config.json").read_text())
    vocab = vocab.get("text_config", vocab)["vocab_size"]
    extra = [f"<extra_{i}>" for i in range(vocab + 3 - tok.get_vocab_size(True))]
    tok.add_tokens([AddedToken(t) for t in extra])
    tok.save(str(folder / "tokenizer.json"))
    m = _load(folder)
    said = [r.getMessage() for r in caplog.records if "past the model's vocab_size" in r.getMessage()]
    assert len(said) == 1 and f"has {vocab + 3} ids" in said[0] and f"vocab_size {vocab}" in said[0], said
    with pytest.raises(ContractError, match=f"token id {vocab + 2} is outside"):
        m.generate(m.tokenizer.encode(extra[-1]).ids, 1)
    caplog.clear()
    _load(_copy(tmp_path / "plain"))
    assert not [r for r in caplog.records if "vocab_size" in r.getMessage()]


def _write_raw(path: Path, header: dict, data: bytes, size: int | None = None) -> None:
    """A safetensors file of `header` and `data`, extended (sparse) to `size` bytes of data."""
    import struct

    head = json.dumps(header).encode()
    head += b" " * (-len(head) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(head)) + head + data)
        if size is not None:
            f.truncate(8 + len(head) + size)


def _raw_tensors(folder: Path) -> tuple[dict, bytes]:
    """(header without __metadata__, data) of the folder's model.safetensors."""
    import struct

    raw = (folder / "model.safetensors").read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    header.pop("__metadata__", None)
    return header, raw[8 + n:]


def test_a_tensor_of_more_dimensions_than_numpy_holds_is_named(tmp_path) -> None:
    # 65 dimensions of 1 around the norm's 272 values: numpy's bare ValueError before
    folder = _copy(tmp_path)
    header, data = _raw_tensors(folder)
    name = P + "layers.0.input_layernorm.weight"
    header[name]["shape"] = [1] * 64 + header[name]["shape"]
    _write_raw(folder / "model.safetensors", header, data)
    _refused(folder, f"reading tensor {name!r}", "ValueError")
    _good_load_still_works()


def test_a_signal_during_a_tensor_read_is_no_load_error() -> None:
    # memra serve's SIGTERM handler raises a BaseException so that the load's error handling
    # lets it pass: reading a tensor must not turn it into a ContractError.
    from memra.loader import _read_tensor

    class Stop(BaseException):
        pass

    class Shard:
        def get_tensor(self, name):
            raise Stop()

    with pytest.raises(Stop):
        _read_tensor(Shard(), Path("model.safetensors"), "w", "F32")


def test_a_tensor_the_host_cannot_hold_is_an_out_of_memory_error(tmp_path) -> None:
    # A [2^26, 64] bf16 embedding (8 GiB, a sparse file) under a 4 GB data limit: safetensors'
    # Rust code raised PanicException, a BaseException no `except Exception` sees.
    import subprocess
    import sys

    folder = _copy(tmp_path)
    header, data = _raw_tensors(folder)
    name = P + "embed_tokens.weight"
    rows = 2**26
    packed, kept = b"", {}  # the other tensors packed without the embedding's bytes (no gap)
    for k, v in sorted(header.items(), key=lambda kv: kv[1]["data_offsets"][0]):
        if k != name:
            a, b = v["data_offsets"]
            kept[k] = dict(v, data_offsets=[len(packed), len(packed) + b - a])
            packed += data[a:b]
    kept[name] = {"dtype": "BF16", "shape": [rows, 64], "data_offsets": [len(packed), len(packed) + rows * 128]}
    _write_raw(folder / "model.safetensors", kept, packed, size=len(packed) + rows * 128)
    code = ("import resource, memra\n"
            "resource.setrlimit(resource.RLIMIT_DATA, (4 * 10**9, 4 * 10**9))\n"
            f"try:\n    memra.load({str(folder)!r}, max_batch=1, max_len=16, progress=False)\n"
            "except memra.OutOfMemoryError as e:\n    print('OOM', e.code, e)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.startswith("OOM 30001") and repr(name) in r.stdout and "[67108864, 64]" in r.stdout, r.stdout


def test_a_name_with_a_final_newline_is_no_weights_name(tmp_path) -> None:
    # re.match's "$" also matches before a final "\n": the tensor was taken as the real weight
    folder = _copy(tmp_path)
    header, data = _raw_tensors(folder)
    name = P + "layers.0.input_layernorm.weight"
    header[name + "\n"] = header.pop(name)
    _write_raw(folder / "model.safetensors", header, data)
    _refused(folder, "unexpected tensor", repr(name + "\n"))


def test_an_index_listing_no_tensor_is_named(tmp_path) -> None:
    folder = _sharded(tmp_path)
    index = folder / "model.safetensors.index.json"
    raw = json.loads(index.read_text())
    raw["weight_map"] = {}
    index.write_text(json.dumps(raw))
    _refused(folder, "model.safetensors.index.json", "weight_map lists no tensor")
