"""Long prompts in chunks (KernelOptions.prefill_chunk, docs/prefill.md) on the CUDA backend, and
Engine.memory (marked cuda: skips without a device, fails under --require-cuda).

On CUDA a chunk's GEMMs have fewer rows than the one-shot prefill's (cuBLAS may pick another
kernel) and the MLA attention may split its rows differently, so chunked and one-shot prefills
are compared within the f32 bound of the issue (rel_err = max|err| / max|ref| <= 1e-5), as
tests/test_cuda_model.py compares prefill(T-1) + decode(1) with prefill(T); the same code path
(prefill_chunk 0 against a chunk of the whole prompt) gives the same bytes. bf16: chunked logits
keep the 2x rule against transformers' bf16 error on the wide-margin fixture. No new kernels run
here (the test of the tensor-core arms is each kernel's own).
"""

from __future__ import annotations

import gc
from pathlib import Path

import numpy as np
import pytest

import memra
from memra import KernelOptions

from test_prefill_chunks import assert_same_planes, failing_hidden, planes, prompt, Boom

pytestmark = pytest.mark.cuda

ROOT = Path(__file__).resolve().parents[1]
GLM = ROOT / "python" / "memra" / "data" / "tiny_glm5_next"
KIMI = ROOT / "tests" / "fixtures" / "tiny_kimi_linear"
BF16_DIR = ROOT / "tests" / "fixtures" / "tiny_glm5_next_bf16"
BF16_REF = ROOT / "tests" / "fixtures" / "glm5_next_bf16_reference.npz"
T = 41


def rel_err(a: np.ndarray, ref: np.ndarray) -> float:
    return float(np.abs(a.astype(np.float64) - ref).max() / np.abs(ref).max())


def gpu(path: Path, chunk: int, dtype: str = "float32", **kw) -> memra.Model:
    return memra.load(path, device="cuda", dtype=dtype, max_batch=kw.pop("max_batch", 2),
                      max_len=kw.pop("max_len", 96), progress=False,
                      kernel_options=KernelOptions(prefill_chunk=chunk), **kw)


@pytest.mark.parametrize("path", [GLM, KIMI], ids=["glm5_next", "kimi_linear"])
def test_f32_chunked_within_1e5_of_one_shot(path: Path) -> None:
    one = gpu(path, 0)
    ids = prompt(one, T)
    ref = one.logits(ids)
    np.testing.assert_array_equal(gpu(path, T).logits(ids), ref)  # the same single call
    whole = one.new_cache(1, T)
    last = one.prefill(whole, 0, ids)
    for c in (1, 3, 7, T - 1):
        m = gpu(path, c)
        got = m.logits(ids)
        assert got.shape == ref.shape and np.isfinite(got).all()
        assert rel_err(got, ref) <= 1e-5, (c, rel_err(got, ref))
        cache = m.new_cache(1, T)
        assert rel_err(m.prefill(cache, 0, ids), last) <= 1e-5, c
        for a, b in zip(planes(cache, 0), planes(whole, 0)):
            assert a.shape == b.shape and rel_err(a, b) <= 1e-5, c


def test_f32_multi_turn_slot_continues_in_chunks() -> None:
    one, m = gpu(GLM, 0), gpu(GLM, 3)
    first, second = prompt(one, 10, seed=2), prompt(one, 31, seed=3)
    ca, cb = one.new_cache(2, 64), m.new_cache(2, 64)
    one.prefill(ca, 1, first)
    m.prefill(cb, 1, first)
    assert rel_err(m.prefill(cb, 1, second), one.prefill(ca, 1, second)) <= 1e-5
    assert cb.length(1) == 41
    for a, b in zip(planes(cb, 1), planes(ca, 1)):
        assert rel_err(a, b) <= 1e-5
    assert rel_err(m.decode(cb, [1], [7]), one.decode(ca, [1], [7])) <= 1e-5
    assert m.generate(second, 6, ignore_eos=True) == one.generate(second, 6, ignore_eos=True)


@pytest.mark.parametrize("name", ["a", "b", "c"])
def test_bf16_chunked_keeps_the_2x_rule(name: str) -> None:
    ref = np.load(BF16_REF)
    ids, f32 = ref[f"ids_{name}"], ref[f"logits_f32_{name}"]
    yard = rel_err(ref[f"logits_bf16_{name}"], f32)
    got = gpu(BF16_DIR, 7, dtype="bfloat16").logits(ids)
    err = rel_err(got, f32)
    print(f"bf16 chunked {name}: memra {err:.2e}, transformers-bf16 {yard:.2e}")
    assert err <= 2 * yard, (err, yard)


@pytest.mark.parametrize("held", [0, 9])
def test_failed_chunk_leaves_the_slot_as_it_was(held: int) -> None:
    m, ref = gpu(GLM, 4), gpu(GLM, 4)
    cache, ref_cache = m.new_cache(2, 64), ref.new_cache(2, 64)
    if held:
        first = prompt(m, held, seed=7)
        m.prefill(cache, 0, first)
        ref.prefill(ref_cache, 0, first)
    before = planes(cache, 0)
    undo = failing_hidden(m, 3)  # chunks 1 and 2 committed, chunk 3 fails
    with pytest.raises(Boom):
        m.prefill(cache, 0, prompt(m, 20, seed=8))
    undo()
    assert cache.length(0) == held
    assert list(cache.device_lengths()) == [held, 0]
    assert_same_planes(planes(cache, 0), before)  # byte copies back
    more = prompt(m, 13, seed=9)
    assert rel_err(m.prefill(cache, 0, more), ref.prefill(ref_cache, 0, more)) <= 1e-6
    # The model's own cache through generation (decode graphs read the device mirrors).
    assert m.generate(more, 4, ignore_eos=True) == ref.generate(more, 4, ignore_eos=True)


def test_engine_memory_and_the_chunked_peak() -> None:
    n = 16384
    peaks = {}
    for chunk in (0, 512):
        m = gpu(GLM, chunk, max_batch=1, max_len=n)
        e = m.engine
        e.synchronize()
        st = e.memory(reset_peak=True)
        assert set(st) == {"device_total", "device_used", "pool_used", "pool_used_peak", "pool_reserved",
                           "pool_reserved_peak"}
        assert 0 < st["pool_used"] <= st["pool_used_peak"] and st["pool_used"] <= st["pool_reserved"]
        assert st["pool_reserved"] <= st["device_used"] <= st["device_total"]
        after = e.memory()
        assert after["pool_used_peak"] >= after["pool_used"]
        assert np.isfinite(m.prefill(m.cache, 0, prompt(m, n, seed=1))).all()
        e.synchronize()
        end = e.memory()
        peaks[chunk] = end["pool_used_peak"] - st["pool_used"]
        print(f"prefill_chunk {chunk}: scratch peak {peaks[chunk] / 2**20:.1f} MiB")
        assert peaks[chunk] > 0
        del m, e  # its engine's context goes too, after its stream's frees ran
        gc.collect()
    # One-shot, the indexer's scores alone are T x T / kpool f32 (256 MiB); chunked, 1 / 32 of it.
    assert peaks[512] * 2 < peaks[0], peaks
