"""The full attention's prefill on tensor cores (marked cuda): cuda/attention_tc.cu, the direct form
of memra_cuda_attention over a bf16 cache on an Engine made with
KernelOptions(attn_prefill_tensor_cores=True), against the CPU op (memra/cpu/attention.h) on
inputs rounded to bf16 and against the f32 CUDA-core kernel, plus the option's wiring.

Tolerance (bf16-derived): with q, k and v bf16 values on both sides, what remains is the rounding
of the softmax weights p to bf16 before P V (unit roundoff u = 2^-8: p~ = p (1 + d), |d| <= u).
The output is sum p~ v / sum p~, a convex combination, so its error is at most u * max|v - o| <=
2u * max|v| (then times sigmoid(gate) <= 1); f32 sums and exp2f add ~1e-6. The test allows
|got - want| <= u * max|v| elementwise (half the worst case; the errors' signs are random: an
emulation of the kernel's algorithm in numpy stays below u / 4 on these shapes) and an RMS error of
u / 2 * rms(v). A wrong mask (one row more or less), head, tile or item is O(1 / rows) of max|v|,
at least 50x the bound on these shapes.

What these would catch: a fragment or ldmatrix slip (O(1)), the grouped heads packed into the item
rows (Hq / Hkv 1, 2, 8: the wrong head's output), the causal limit on the diagonal tiles and the
padding item rows (T 7, 64, 65, 200 with pos0 0 and odd: tiles that straddle and exceed the
queries), the cp.async pipeline (T 200 walks 4 tiles with both buffers refilled), the zero-padded
head widths (hd 40, 96: the 64 / 128 instantiations over fewer columns), the gate, and the
dispatch (T = 1, f32 caches, hd 18 and the option off keep the f32 kernel's bytes).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import memra
from memra import _core
from cuda_helpers import bf16_bits, bf16_round, engine_with, f32, kernel_names, rng

pytestmark = pytest.mark.cuda

U = 2.0 ** -8  # bf16's unit roundoff
TC = "attention_tc_kernel"
F32 = "attention_kernel"
ROOT = Path(__file__).resolve().parents[1]
FIX = ROOT / "tests" / "fixtures"


def tc_engine() -> memra.Engine:
    return engine_with(attn_prefill_tensor_cores=True)


def f32_engine() -> memra.Engine:
    """The option's off arm: the f32 CUDA-core kernel over the bf16 cache too."""
    return engine_with(attn_prefill_tensor_cores=False)


def make(T, pos0, Hq, Hkv, hd, seed, cache="bfloat16"):
    """q (bf16 values), gate, the cache planes [pos0 + T + 3, Hkv, hd] (bf16 bits or f32) and
    the values' float32 copy (for the bound)."""
    g = rng(seed)
    L = pos0 + T + 3
    k, v = bf16_round(g.standard_normal((L, Hkv, hd))), bf16_round(g.standard_normal((L, Hkv, hd)))
    q = bf16_round(g.standard_normal((T, Hq, hd)))
    gate = f32(g.standard_normal((T, Hq, hd)))
    if cache == "bfloat16":
        kc, vc = bf16_bits(k), bf16_bits(v)
    else:
        kc, vc = k, v
    return q, gate, kc, vc, v[:pos0 + T]


def run(eng, q, kc, vc, gate, pos0, scale):
    d = eng.to_device
    return eng.to_host(_core.attention(d(q), d(kc), d(vc), scale=scale,
                                       gate=d(gate) if gate is not None else None, pos0=pos0, engine=eng))


def within_bf16_bound(got, want, v, what):
    assert got.shape == want.shape and got.dtype == np.float32 and np.isfinite(got).all(), what
    err = np.abs(got.astype(np.float64) - want.astype(np.float64))
    vmax, vrms = float(np.abs(v).max()), float(np.sqrt(np.mean(np.square(v, dtype=np.float64))))
    bound = U * vmax + 1e-5 * float(np.abs(want).max())
    rms = float(np.sqrt(np.mean(err ** 2)))
    print(f"{what}: max err {err.max():.3g} (bound {bound:.3g}), rms {rms:.3g} (bound {U / 2 * vrms:.3g})")
    assert err.max() <= bound, f"{what}: max |d| = {err.max():.3g} > u * max|v| = {bound:.3g}"
    assert rms <= U / 2 * vrms, f"{what}: rms |d| = {rms:.3g} > u / 2 * rms(v) = {U / 2 * vrms:.3g}"


# (Hq, Hkv, hd): Hq / Hkv 1, 2, 8, 8; head widths 64, 256, 128, 256, and 96 / 40 (zero-padded
# columns of the 128 / 64 instantiations).
GEOMETRIES = [(2, 2, 64), (4, 2, 256), (16, 2, 128), (8, 1, 256), (8, 4, 96), (3, 3, 40)]


@pytest.mark.parametrize("T,pos0", [(7, 0), (64, 0), (65, 37), (200, 0), (7, 101), (2, 1)])
@pytest.mark.parametrize("Hq,Hkv,hd", GEOMETRIES)
def test_tc_prefill_matches_cpu_within_bf16(T, pos0, Hq, Hkv, hd):
    tc, e = tc_engine(), f32_engine()
    q, gate, kc, vc, v = make(T, pos0, Hq, Hkv, hd, seed=T * 7 + pos0 + Hq * hd)
    scale = hd ** -0.5
    for gt in (gate, None):
        want = _core.attention(q, kc, vc, scale=scale, gate=gt, pos0=pos0)
        got = run(tc, q, kc, vc, gt, pos0, scale)
        tag = f"T {T} pos0 {pos0} heads {Hq}/{Hkv} hd {hd} gate {gt is not None}"
        within_bf16_bound(got, want, v, "tc vs cpu, " + tag)
        # ... and against the f32 CUDA-core kernel on the same inputs (within 1e-5 of the CPU).
        within_bf16_bound(got, run(e, q, kc, vc, gt, pos0, scale), v, "tc vs f32 kernel, " + tag)
    assert np.array_equal(run(tc, q, kc, vc, None, pos0, scale), got)  # no atomics: run to run


def test_tc_prefill_large_scores_and_long_rows():
    # Scores of tens (scale 1 over hd 128: standard deviation 11): the running max moves across
    # the tiles and most weights underflow; 300 queries after a 211-row prefix: up to 8 tiles a
    # block, 19 blocks of 64 items a K/V head.
    tc = tc_engine()
    T, pos0, Hq, Hkv, hd = 300, 211, 8, 2, 128
    q, gate, kc, vc, v = make(T, pos0, Hq, Hkv, hd, seed=5)
    want = _core.attention(q, kc, vc, scale=1.0, gate=gate, pos0=pos0)
    within_bf16_bound(run(tc, q, kc, vc, gate, pos0, 1.0), want, v, "large scores")


@pytest.mark.parametrize("case", ["option off", "T = 1", "f32 cache", "hd 18"])
def test_the_f32_kernel_keeps_its_bytes(case):
    # Where the tensor-core kernel does not run, the option changes nothing: the same bytes as an
    # engine without it (the f32 kernel itself is held to the CPU by tests/test_cuda_attention.py).
    T, hd, cache, eng = 65, 128, "bfloat16", tc_engine()
    if case == "option off":
        eng = f32_engine()
    elif case == "T = 1":
        T = 1
    elif case == "f32 cache":
        cache = "float32"
    else:
        hd = 18
    q, gate, kc, vc, _ = make(T, 9, 4, 2, hd, seed=3, cache=cache)
    got = run(eng, q, kc, vc, gate, 9, 0.1)
    assert np.array_equal(got, run(f32_engine(), q, kc, vc, gate, 9, 0.1)), case


def test_the_tensor_core_kernel_is_the_one_that_ran(tmp_path):
    q, gate, kc, vc, _ = make(64, 5, 4, 2, 256, seed=11)
    for name, eng, want in (("on", tc_engine(), TC), ("default", engine_with(), TC), ("off", f32_engine(), F32)):
        d = eng.to_device
        args = (d(q), d(kc), d(vc))
        g = d(gate)

        def call():
            _core.attention(*args, scale=0.0625, gate=g, pos0=5, engine=eng)
            eng.synchronize()

        names = " ".join(kernel_names(call, tmp_path / f"{name}.json"))
        assert want in names and (TC if want == F32 else F32) not in names, (name, names)
    # The decode form (slots) keeps the f32 kernel with the option on.
    eng = tc_engine()
    d = eng.to_device
    kd, vd = d(kc[None]), d(vc[None])
    ld = d(np.array([20], np.int32))
    qd, sd = d(q[:1]), d(np.array([0], np.int32))

    def decode():
        _core.attention(qd, kd, vd, scale=0.0625, slots=sd, lengths=ld, engine=eng)
        eng.synchronize()

    names = " ".join(kernel_names(decode, tmp_path / "decode.json"))
    assert F32 in names and TC not in names, names


# ------------------------------------------------------------------ the Qwen fixtures in bf16

TYPES = ("qwen3_5_text", "qwen3_next")


def rel_err(a, ref) -> float:
    return float(np.abs(np.asarray(a, np.float64) - ref).max() / np.abs(ref).max())


@pytest.fixture(scope="module")
def tc_models():
    opts = memra.KernelOptions(attn_prefill_tensor_cores=True)
    return {t: memra.load(FIX / f"tiny_{t}", device="cuda", dtype="bfloat16", max_batch=2, max_len=128,
                          progress=False, kernel_options=opts) for t in TYPES}


@pytest.mark.parametrize("t", TYPES)
def test_model_bf16_logits_with_tc_prefill_within_twice_transformers(t, tc_models, tmp_path):
    # tests/test_cuda_model_qwen.py's 2x rule (prompts of 73, 12 and 2 tokens: every prefill takes
    # the tensor-core kernel), and a multi-turn prefill (40 tokens, then the other 33 appended to
    # the slot: the second call's queries start at pos0 = 40) against the prompt's last row.
    R, m = np.load(FIX / f"{t}_reference.npz"), tc_models[t]
    for name in "abc":
        ids = R[f"prompt_{name}"]
        yard = rel_err(R[f"logits_bf16_{name}"], R[f"logits_f32_{name}"])
        err = rel_err(m.logits(ids), R[f"logits_f32_{name}"])
        print(f"{t} bf16 tc {name}: memra {err:.2e}, transformers-bf16 {yard:.2e}")
        assert err <= 2 * yard, (name, err, yard)
    # The multi-turn row is one of prompt a's rows: held to the same bound as the one-shot rows
    # above (max |d| over the prompt's logits scale).
    ids, ref = R["prompt_a"], R["logits_f32_a"]
    cache = m.new_cache(1, len(ids))
    m.prefill(cache, 0, ids[:40])
    last = m.prefill(cache, 0, ids[40:])
    yard = rel_err(R["logits_bf16_a"], ref)
    err = float(np.abs(last.astype(np.float64) - ref[-1]).max() / np.abs(ref).max())
    print(f"{t} bf16 tc multi-turn: memra {err:.2e}, transformers-bf16 {yard:.2e}")
    assert err <= 2 * yard, (err, yard)
    names = " ".join(kernel_names(lambda: (m.logits(ids), m.engine.synchronize()), tmp_path / f"{t}.json"))
    assert TC in names and F32 not in names, names
