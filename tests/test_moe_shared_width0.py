"""A zero-width shared expert (n_shared_experts 0 / shared_expert_intermediate_size 0).

transformers 5.17 takes such a config: it builds the shared MLP at width 0 (it adds nothing; Qwen's
sigmoid gate scales a zero vector) and its save_pretrained writes the empty tensors ([0, hidden]
gate / up, [hidden, 0] down; Qwen's [1, hidden] gate too). memra loads those folders as a MoE
without a shared expert. The oracle: the same checkpoint with its shared expert kept at full
width and its down projection zeroed, which memra runs through the shared MLP itself, adds an
exact zero to the same routed sum.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import ml_dtypes  # noqa: F401  (bfloat16 for safetensors' numpy framework)
import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

import memra
from memra import _core

FIX = Path(__file__).resolve().parent / "fixtures"
# family folder -> the config key of the shared width (inside text_config where there is one)
CASES = {
    "glm5_next": (memra.default_checkpoint(), "n_shared_experts"),
    "kimi_linear": (FIX / "tiny_kimi_linear", "num_shared_experts"),
    "qwen3_5_moe_text": (FIX / "tiny_qwen3_5_moe_text", "shared_expert_intermediate_size"),
    "qwen3_next": (FIX / "tiny_qwen3_next", "shared_expert_intermediate_size"),
}
PROMPTS = ([5], [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9], list(range(7, 77)))


def _is_shared_proj(name: str) -> bool:
    return (".shared_experts." in name or ".shared_expert." in name) and name.endswith("_proj.weight")


def _variant(src: Path, dst: Path, key: str, *, zero_width: bool, drop_empty: bool = False) -> Path:
    """A copy of `src`: zero_width -> the shared width 0 and its projections at width 0 (left out
    when drop_empty); else the shared expert as it is with its down projections zeroed."""
    shutil.copytree(src, dst)
    tensors = load_file(str(src / "model.safetensors"))
    out = {}
    for name, t in tensors.items():
        if _is_shared_proj(name):
            if zero_width:
                if drop_empty:
                    continue
                t = np.zeros((t.shape[0], 0) if name.endswith("down_proj.weight") else (0, t.shape[1]), t.dtype)
            elif name.endswith("down_proj.weight"):
                t = np.zeros_like(t)
        out[name] = np.ascontiguousarray(t)
    save_file(out, str(dst / "model.safetensors"), metadata={"format": "pt"})
    if zero_width:
        cfg = json.loads((src / "config.json").read_text())
        text = cfg["text_config"] if isinstance(cfg.get("text_config"), dict) else cfg
        assert text.get(key, 1) != 0, key
        text[key] = 0
        (dst / "config.json").write_text(json.dumps(cfg))
    return dst


@pytest.mark.parametrize("family", list(CASES))
@pytest.mark.parametrize("drop_empty", [False, True], ids=["empty-tensors", "no-tensors"])
def test_zero_width_shared_expert_adds_nothing(tmp_path, family, drop_empty):
    src, key = CASES[family]
    zero = memra.load(_variant(src, tmp_path / "zero", key, zero_width=True, drop_empty=drop_empty),
                      max_batch=2, max_len=128, progress=False)
    oracle = memra.load(_variant(src, tmp_path / "oracle", key, zero_width=False), max_batch=2, max_len=128,
                        progress=False)
    plain = memra.load(src, max_batch=2, max_len=128, progress=False)
    for ids in PROMPTS:
        got, want = zero.logits(ids), oracle.logits(ids)
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-6 * float(np.abs(want).max()))
        # The fixture's shared expert matters, so the comparison above can tell the two apart.
        assert float(np.abs(plain.logits(ids) - want).max()) > 1e-3 * float(np.abs(want).max())
    assert zero.generate(PROMPTS[1], 6) == oracle.generate(PROMPTS[1], 6)


def _moe_weights(D: int, E: int, I: int, rng) -> dict[str, np.ndarray]:
    w = {"gate.weight": rng.standard_normal((E, D)).astype(np.float32)}
    for e in range(E):
        w[f"experts.{e}.gate_proj.weight"] = rng.standard_normal((I, D)).astype(np.float32) * 0.2
        w[f"experts.{e}.up_proj.weight"] = rng.standard_normal((I, D)).astype(np.float32) * 0.2
        w[f"experts.{e}.down_proj.weight"] = rng.standard_normal((D, I)).astype(np.float32) * 0.2
    return w


def _moe(weights, D, E, I, shared, shared_gate):
    weights = {k: _core.Weight(np.ascontiguousarray(v)) for k, v in weights.items()}
    return _core.MoeLayer(_core.Engine("cpu"), weights, hidden=D, n_experts=E, top_k=2, n_group=1, topk_group=1,
                          intermediate=I, shared_intermediate=shared, norm_topk_prob=True, routed_scaling=1.0,
                          swiglu_limit=float("inf"), scoring="softmax", shared_gate=shared_gate, dtype="float32")


@pytest.mark.parametrize("shared_gate", [False, True])
def test_moe_layer_takes_and_checks_empty_shared_tensors(shared_gate):
    D, E, I = 16, 4, 8
    rng = np.random.default_rng(3)
    routed = _moe_weights(D, E, I, rng)
    empty = {"shared_experts.gate_proj.weight": np.zeros((0, D), np.float32),
             "shared_experts.up_proj.weight": np.zeros((0, D), np.float32),
             "shared_experts.down_proj.weight": np.zeros((D, 0), np.float32)}
    gate = {"shared_expert_gate.weight": rng.standard_normal((1, D)).astype(np.float32)} if shared_gate else {}
    x = rng.standard_normal((5, D)).astype(np.float32)
    want = _moe(routed, D, E, I, 0, False).forward(x)
    got = _moe({**routed, **empty, **gate}, D, E, I, 0, shared_gate).forward(x)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    # An empty tensor of the wrong shape is still named.
    bad = {**routed, **empty, **gate, "shared_experts.down_proj.weight": np.zeros((0, D), np.float32)}
    with pytest.raises(memra.ContractError, match="shared_experts.down_proj.weight"):
        _moe(bad, D, E, I, 0, shared_gate)


def test_moe_layer_refuses_a_shared_gate_it_was_not_asked_for():
    D, E, I = 16, 4, 8
    rng = np.random.default_rng(4)
    w = {**_moe_weights(D, E, I, rng), "shared_expert_gate.weight": np.zeros((1, D), np.float32)}
    with pytest.raises(memra.ContractError, match="shared_expert_gate.weight"):
        _moe(w, D, E, I, 0, False)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype,tol", [("float32", 1e-5), ("bfloat16", 2e-2)])
@pytest.mark.parametrize("family", list(CASES))
def test_zero_width_shared_expert_on_cuda(tmp_path, family, dtype, tol):
    # The CUDA layer without a shared expert (gated or not) against the zeroed one, prefill and
    # the captured decode steps.
    src, key = CASES[family]
    kw = dict(device="cuda", dtype=dtype, max_batch=2, max_len=128, progress=False)
    zero = memra.load(_variant(src, tmp_path / "zero", key, zero_width=True), **kw)
    oracle = memra.load(_variant(src, tmp_path / "oracle", key, zero_width=False), **kw)
    for ids in PROMPTS:
        got, want = np.asarray(zero.logits(ids)), np.asarray(oracle.logits(ids))
        np.testing.assert_allclose(got, want, rtol=0, atol=tol * float(np.abs(want).max()))
    if dtype == "float32":
        assert zero.generate(PROMPTS[1], 6) == oracle.generate(PROMPTS[1], 6)
