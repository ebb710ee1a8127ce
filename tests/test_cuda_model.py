"""The whole tiny glm5_next model on the CUDA backend (marked cuda: skips without a device, fails
under --require-cuda), in float32 and bfloat16, against memra's CPU backend (the oracle) and
against transformers 5.17's stored outputs.

Tolerances (max|err| / max|logit|):
- float32 vs the CPU backend: 1e-5 (the issue's bound; TF32 is off, only summation order differs:
  cuBLAS and tree reductions against the CPU's sequential sums, ~1e-6 observed), greedy tokens and
  DSA index sets identical.
- bfloat16: at most 2x the error of transformers run in bfloat16, both measured against
  transformers' float32 logits, on the wide-margin fixture tests/fixtures/tiny_glm5_next_bf16
  (made by make_glm5_next_bf16_fixtures.py) whose routing, index and greedy margins survive bf16.
- prefill(T-1) + decode(1) vs prefill(T): 1e-5 in f32 (different GEMM shapes may pick different
  cuBLAS kernels, so not bit-identical), batching vs alone likewise.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import memra

pytestmark = pytest.mark.cuda

ROOT = Path(__file__).resolve().parents[1]
REF = np.load(ROOT / "tests" / "fixtures" / "glm5_next_tiny_reference.npz")
BF16_DIR = ROOT / "tests" / "fixtures" / "tiny_glm5_next_bf16"
BF16_REF = ROOT / "tests" / "fixtures" / "glm5_next_bf16_reference.npz"
FULL_DSA_LAYERS = (2, 5)


def rel_err(a: np.ndarray, ref: np.ndarray) -> float:
    return float(np.abs(a - ref).max() / np.abs(ref).max())


@pytest.fixture(scope="module")
def cpu() -> memra.Model:
    return memra.load(memra.default_checkpoint(), max_batch=4, max_len=128, progress=False)


@pytest.fixture(scope="module")
def gpu32() -> memra.Model:
    return memra.load(memra.default_checkpoint(), device="cuda", dtype="float32", max_batch=4,
                      max_len=128, progress=False)


@pytest.fixture(scope="module")
def gpu16() -> memra.Model:
    return memra.load(BF16_DIR, device="cuda", dtype="bfloat16", max_batch=4, max_len=128,
                      progress=False)


@pytest.mark.parametrize("name", ["a", "b", "c"])
def test_f32_logits_match_cpu_and_transformers(cpu: memra.Model, gpu32: memra.Model, name: str) -> None:
    ids = REF[f"prompt_{name}"]
    got = gpu32.logits(ids)
    assert got.dtype == np.float32 and got.shape == REF[f"logits_{name}"].shape
    assert np.isfinite(got).all()
    err_cpu = rel_err(got, cpu.logits(ids))
    err_tf = rel_err(got, REF[f"logits_{name}"])
    print(f"f32 {name}: vs CPU {err_cpu:.2e}, vs transformers {err_tf:.2e}")
    assert err_cpu < 1e-5, err_cpu
    assert err_tf < 1e-4, err_tf


@pytest.mark.parametrize("name", ["a", "b"])
def test_f32_greedy_and_index_sets(cpu: memra.Model, gpu32: memra.Model, name: str) -> None:
    ids = REF[f"prompt_{name}"]
    assert gpu32.generate(ids, 16, ignore_eos=True) == cpu.generate(ids, 16, ignore_eos=True)
    assert gpu32.generate(ids, 16, ignore_eos=True) == REF[f"greedy_{name}"].tolist()
    got, want = gpu32.index_lists(ids), cpu.index_lists(ids)
    for layer in FULL_DSA_LAYERS:
        for t in range(len(ids)):
            g = set(got[layer][t].tolist()) - {-1}
            assert g == set(want[layer][t].tolist()) - {-1}, (layer, t)


def test_f32_sampling_matches_cpu(cpu: memra.Model, gpu32: memra.Model) -> None:
    ids = REF["prompt_b"]
    for seed in (0, 7, 12345):
        kw = dict(temperature=0.8, top_k=50, top_p=0.9, seed=seed, ignore_eos=True)
        assert gpu32.generate(ids, 12, **kw) == cpu.generate(ids, 12, **kw)


def test_f32_prefill_then_decode_equals_prefill(gpu32: memra.Model) -> None:
    ids = REF["prompt_a"]
    for T in (1, 2, 5, len(ids)):
        whole = gpu32.new_cache(1, 64)
        full = gpu32.prefill(whole, 0, ids[:T])
        split = gpu32.new_cache(1, 64)
        if T > 1:
            gpu32.prefill(split, 0, ids[: T - 1])
            last = gpu32.decode(split, [0], [int(ids[T - 1])])[0]
        else:
            last = gpu32.prefill(split, 0, ids[:1])
        assert rel_err(last, full) < 1e-5, T
        # States relative to each plane's magnitude (the ring holds pre-conv projections, whose
        # GEMM shape differs between the two runs).
        for i, spec in enumerate(gpu32.net.state_specs()):
            if spec.kind == "kda":
                assert rel_err(split.kda_state(i, 0), whole.kda_state(i, 0)) < 1e-5, (T, i)
                assert rel_err(split.kda_conv(i, 0), whole.kda_conv(i, 0)) < 1e-5, (T, i)
            else:
                assert rel_err(split.latent_rows(i, 0), whole.latent_rows(i, 0)) < 1e-5, (T, i)


def test_f32_two_prompts_batched_equal_each_alone(gpu32: memra.Model) -> None:
    a, b = REF["prompt_a"], REF["prompt_b"]
    together = gpu32.generate_batch([a, b], 10, ignore_eos=True)
    assert together == [gpu32.generate(a, 10, ignore_eos=True), gpu32.generate(b, 10, ignore_eos=True)]
    # One decode step of both slots against each slot alone.
    cache = gpu32.new_cache(2, 64)
    gpu32.prefill(cache, 0, a)
    gpu32.prefill(cache, 1, b)
    both = gpu32.decode(cache, [0, 1], [5, 9])
    for slot, ids, tok in ((0, a, 5), (1, b, 9)):
        alone = gpu32.new_cache(1, 64)
        gpu32.prefill(alone, 0, ids)
        one = gpu32.decode(alone, [0], [tok])[0]
        assert rel_err(both[slot], one) < 1e-5


def test_cache_full_and_bad_input_change_nothing(gpu32: memra.Model) -> None:
    cache = gpu32.new_cache(1, 8)
    gpu32.prefill(cache, 0, [1, 2, 3])
    before = cache.kda_state(0, 0)
    with pytest.raises(memra.CacheFullError):
        gpu32.prefill(cache, 0, list(range(6)))
    with pytest.raises(memra.ContractError):
        gpu32.prefill(cache, 0, [1, 2**40])
    with pytest.raises(memra.ContractError) as e:
        gpu32.prefill(cache, 0, [1, gpu32.config.vocab_size])
    assert e.value.code == memra._core.status.CONTRACT_RANGE
    assert cache.length(0) == 3
    np.testing.assert_array_equal(cache.kda_state(0, 0), before)
    assert np.isfinite(gpu32.decode(cache, [0], [4])).all()  # still usable


def test_cpu_cache_refused_by_cuda_layers(gpu32: memra.Model, cpu: memra.Model) -> None:
    cache = cpu.new_cache(1, 8)
    with pytest.raises(memra.ContractError) as e:
        gpu32.prefill(cache, 0, [1, 2])
    assert e.value.code == memra._core.status.CONTRACT_DEVICE


def test_unsupported_kda_head_dim_is_refused_on_cuda() -> None:
    # head_dim 64: the CUDA kernels are instantiated for 128 only -> UnsupportedError (50002) by
    # name when the layer is made; the CPU backend builds and runs the same layer.
    D, H, dk, K = 32, 2, 64, 4
    qkv = H * dk
    rng = np.random.default_rng(0)

    def W(*shape: int) -> memra.Weight:
        return memra.Weight(np.ascontiguousarray(rng.standard_normal(shape).astype(np.float32) * 0.1))

    w = {"q_proj.weight": W(qkv, D), "k_proj.weight": W(qkv, D), "v_proj.weight": W(qkv, D),
         "q_conv1d.weight": W(qkv, 1, K), "k_conv1d.weight": W(qkv, 1, K), "v_conv1d.weight": W(qkv, 1, K),
         "f_a_proj.weight": W(dk, D), "f_b_proj.weight": W(qkv, dk), "dt_bias": W(qkv), "A_log": W(H),
         "b_proj.weight": W(H, D), "g_a_proj.weight": W(dk, D), "g_b_proj.weight": W(qkv, dk),
         "o_norm.weight": W(dk), "o_proj.weight": W(D, qkv)}
    kw = dict(hidden=D, heads=H, head_dim=dk, conv_kernel=K, dtype="float32")
    with pytest.raises(memra.UnsupportedError) as e:
        memra.KdaLayer(memra.Engine("cuda"), dict(w), **kw)
    assert e.value.code == memra._core.status.UNSUPPORTED_GEOMETRY
    layer = memra.KdaLayer(memra.Engine("cpu"), dict(w), **kw)
    assert np.isfinite(layer.forward(np.ones((3, D), np.float32))).all()


@pytest.mark.parametrize("name", ["a", "b", "c"])
def test_bf16_within_twice_transformers_bf16_error(gpu16: memra.Model, name: str) -> None:
    ref = np.load(BF16_REF)
    ids = ref[f"ids_{name}"]
    f32 = ref[f"logits_f32_{name}"]
    # Yardstick: transformers with the whole model in bf16 (model.to(torch.bfloat16)); the
    # from_pretrained(dtype=bf16) variant, which keeps A_log / dt_bias / conv taps in f32 as
    # memra does, is printed beside it.
    yard = rel_err(ref[f"logits_bf16_{name}"], f32)
    keep = rel_err(ref[f"logits_bf16keep_{name}"], f32)
    got = gpu16.logits(ids)
    err = rel_err(got, f32)
    print(f"bf16 {name}: memra {err:.2e}, transformers-bf16 {yard:.2e} (f32-kept parts {keep:.2e})")
    assert err <= 2 * yard, (err, yard)


@pytest.mark.parametrize("name", ["a", "b"])
def test_bf16_greedy_and_routing_match_f32_reference(gpu16: memra.Model, name: str) -> None:
    ref = np.load(BF16_REF)
    ids = ref[f"ids_{name}"]
    want = ref[f"greedy_{name}"].tolist()
    assert gpu16.generate(ids, len(want), ignore_eos=True) == want
    got = gpu16.index_lists(ids)
    for layer in FULL_DSA_LAYERS:
        for t in range(len(ids)):
            want_set = set(ref[f"topk_{name}_layer{layer}"][t].tolist()) - {-1}
            assert set(got[layer][t].tolist()) - {-1} == want_set, (layer, t)
