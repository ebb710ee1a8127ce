"""Batched prefill (Model.prefill_batch, docs/prefill.md) on the CUDA backend (marked cuda: skips
without a device, fails under --require-cuda).

On CUDA the packed call's row-wise GEMMs (projections, dense MLPs, the MoE's grouped experts, the
LM head) have more rows than each sequential prefill's, so cuBLAS and the MoE may pick other
kernels and sum in other orders; the mixers run each sequence's rows through the same per-slot
prefill as before. So, as tests/test_cuda_prefill_chunks.py compares chunked with one-shot:
- float32: batched against P sequential prefills within rel_err <= 1e-5 (max|err| / max|ref|)
  for the logits, every state plane the call wrote and the decode steps after, for every family
  on CUDA (glm5_next, kimi_linear, the Qwen text fixtures), with and without prefill_chunk
  bounding the calls; generate_batch's tokens equal generate's per prompt.
- bfloat16: both forms against the f32 truth (the CPU backend's sequential prefills); the
  batched error at most 2x the sequential one (the 2x rule's spirit, with a floor of one bf16
  rounding, 2**-8, below which no bf16 result is expected to come).
No new kernels run here (the concat and row copies are cudaMemcpyAsync).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import memra
from memra import KernelOptions

from test_prefill_chunks import Boom, assert_same_planes, failing_hidden, planes, prompt

pytestmark = pytest.mark.cuda

ROOT = Path(__file__).resolve().parents[1]
FIX = ROOT / "tests" / "fixtures"
GLM = ROOT / "python" / "memra" / "data" / "tiny_glm5_next"
KIMI = FIX / "tiny_kimi_linear"
F32_PATHS = [GLM, KIMI, FIX / "tiny_qwen3_5_text", FIX / "tiny_qwen3_5_moe_text", FIX / "tiny_qwen3_next"]
BF16_PATHS = [FIX / "tiny_glm5_next_bf16", KIMI, FIX / "tiny_qwen3_5_moe_text"]
SLOTS = [2, 0, 4, 1]  # not in order; slot 1 already holds HELD tokens
LENGTHS = [1, 6, 23, 11]
HELD = 9
_MODELS: dict[tuple, memra.Model] = {}


def rel_err(a: np.ndarray, ref: np.ndarray) -> float:
    a, ref = np.asarray(a, np.float64), np.asarray(ref, np.float64)
    if ref.size == 0:  # e.g. the pool keys of a slot with no complete pool
        return 0.0 if a.size == 0 else float("inf")
    scale = np.abs(ref).max()
    return float(np.abs(a - ref).max() / scale) if scale > 0 else float(np.abs(a).max())


def model(path: Path, chunk: int = 0, dtype: str = "float32", device: str = "cuda") -> memra.Model:
    key = (path, chunk, dtype, device)
    if key not in _MODELS:
        _MODELS[key] = memra.load(path, device=device, dtype=dtype if device == "cuda" else None,
                                  max_batch=5, max_len=64, progress=False,
                                  kernel_options=KernelOptions(prefill_chunk=chunk))
    return _MODELS[key]


def prompts(m: memra.Model, lengths=LENGTHS, seed: int = 20) -> list[np.ndarray]:
    return [prompt(m, n, seed=seed + i) for i, n in enumerate(lengths)]


def both(m: memra.Model) -> tuple[np.ndarray, np.ndarray, memra.Cache, memra.Cache]:
    """(sequential logits [4, vocab], batched logits, their caches): slot 1 holds HELD tokens in
    both caches first."""
    seq, bat = m.new_cache(5, 64), m.new_cache(5, 64)
    first = prompt(m, HELD, seed=3)
    for c in (seq, bat):
        m.prefill(c, 1, first)
    ps = prompts(m)
    want = np.stack([m.prefill(seq, s, p) for s, p in zip(SLOTS, ps)])
    got = m.prefill_batch(bat, SLOTS, ps)
    return want, got, seq, bat


@pytest.mark.parametrize("chunk", [0, 8])
@pytest.mark.parametrize("path", F32_PATHS, ids=[p.name for p in F32_PATHS])
def test_f32_batched_within_1e5_of_sequential(path: Path, chunk: int) -> None:
    m = model(path, chunk)
    want, got, seq, bat = both(m)
    assert got.shape == want.shape and got.dtype == np.float32 and np.isfinite(got).all()
    err = rel_err(got, want)
    print(f"{path.name} f32 chunk {chunk}: batched vs sequential {err:.2e}")
    assert err <= 1e-5, err
    for s in SLOTS:
        assert bat.length(s) == seq.length(s)
        for a, b in zip(planes(bat, s), planes(seq, s)):
            assert a.shape == b.shape and rel_err(a, b) <= 1e-5, s
    assert list(bat.device_lengths()) == [seq.length(s) for s in range(5)]
    toks = np.array([5, 7, 11, 13], np.int32)
    for _ in range(2):  # the slots continue as the sequential ones
        a, b = m.decode(seq, SLOTS, toks), m.decode(bat, SLOTS, toks)
        assert rel_err(b, a) <= 1e-5
        toks = a.argmax(axis=1).astype(np.int32)


@pytest.mark.parametrize("path", BF16_PATHS, ids=[p.name for p in BF16_PATHS])
def test_bf16_batched_keeps_the_2x_rule(path: Path) -> None:
    m = model(path, 0, "bfloat16")
    want, got, _, _ = both(m)
    truth, _, _, _ = both(model(path, 0, device="cpu"))
    err_seq, err_bat = rel_err(want, truth), rel_err(got, truth)
    print(f"{path.name} bf16: batched {err_bat:.2e}, sequential {err_seq:.2e} (vs the CPU f32)")
    assert np.isfinite(got).all()
    assert err_bat <= 2 * max(err_seq, 2.0**-8), (err_bat, err_seq)


@pytest.mark.parametrize("path", [GLM, KIMI], ids=["glm5_next", "kimi_linear"])
def test_f32_generate_batch_tokens_equal_generate(path: Path) -> None:
    m = model(path, 0)
    ps = prompts(m, [5, 1, 14])
    for kw in (dict(), dict(temperature=0.9, top_k=5, seed=5)):
        got = m.generate_batch(ps, 5, ignore_eos=True, **kw)
        seed = kw.pop("seed", 0)
        assert got == [m.generate(p, 5, ignore_eos=True, seed=seed + i, **kw) for i, p in enumerate(ps)]
    assert all(m.cache.length(s) == 0 and m.cache.owner(s) == 0 for s in range(5))


def test_failed_call_leaves_every_slot_as_it_was() -> None:
    # prefill_chunk 8: calls [p0, p1], [p2 0:8], [p2 8:16], ...: the third fails after p0, p1 and
    # p2's first piece were committed.
    m, ref = memra.load(GLM, device="cuda", dtype="float32", max_batch=5, max_len=64, progress=False,
                        kernel_options=KernelOptions(prefill_chunk=8)), model(GLM, 8)
    cache, ref_cache = m.new_cache(5, 64), ref.new_cache(5, 64)
    first = prompt(m, HELD, seed=3)
    m.prefill(cache, 1, first)
    ref.prefill(ref_cache, 1, first)
    before = [planes(cache, s) for s in range(5)]
    undo = failing_hidden(m, 3)
    with pytest.raises(Boom):
        m.prefill_batch(cache, SLOTS, prompts(m))
    undo()
    assert list(cache.device_lengths()) == [0, HELD, 0, 0, 0]
    for s in range(5):
        assert cache.length(s) == (HELD if s == 1 else 0)
        assert_same_planes(planes(cache, s), before[s])  # byte copies back
    want = np.stack([ref.prefill(ref_cache, s, p) for s, p in zip(SLOTS, prompts(m))])
    assert rel_err(m.prefill_batch(cache, SLOTS, prompts(m)), want) <= 1e-5
    ps = prompts(m, [4, 2])
    assert m.generate_batch(ps, 4, ignore_eos=True) == ref.generate_batch(ps, 4, ignore_eos=True)
