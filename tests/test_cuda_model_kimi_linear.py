"""The tiny Kimi-Linear model on the CUDA backend (marked cuda: skips without a device, fails under
--require-cuda), in float32 and bfloat16, against memra's CPU backend (the oracle) and
transformers 5.17's stored outputs (tests/fixtures/kimi_linear_reference.npz).

These need the CUDA MLA layer with Kimi-Linear's forms (rope columns scored unrotated, q_proj
without query LoRA); until that lands the CUDA layer refuses them by name at load
(UnsupportedError) and every test here fails on a GPU.

Tolerances (rel_err = max|a - ref| / max|ref|):
- float32 vs the CPU backend: 1e-5 (the issue's bound; TF32 off, summation order only), greedy
  tokens identical; against transformers 1e-4 as on the CPU.
- bfloat16: at most 2x the error of transformers run in bfloat16 (from_pretrained(dtype=bf16)),
  both against transformers' float32 logits (DESIGN.md's 2x rule); greedy tokens identical to
  transformers' bf16 run, which makes every f32 choice on this fixture.
- graph replay vs eager steps: byte-exact (the same kernels on the same bucket-padded buffers).
- prefill(T-1) + decode(1) vs prefill(T): 1e-5 in f32 for logits and every state plane.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import memra
from memra import _core

pytestmark = pytest.mark.cuda

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "tests" / "fixtures" / "tiny_kimi_linear"
REF = np.load(ROOT / "tests" / "fixtures" / "kimi_linear_reference.npz")
MLA_LAYER = 2


def rel_err(a, ref) -> float:
    return float(np.abs(np.asarray(a, np.float64) - ref).max() / np.abs(ref).max())


def _load(device: str, dtype: str = "float32", graphs: bool = True) -> memra.Model:
    return memra.load(TINY, device=device, dtype=dtype, max_batch=4, max_len=128, progress=False,
                      cuda_graphs=graphs)


@pytest.fixture(scope="module")
def cpu() -> memra.Model:
    return _load("cpu")


@pytest.fixture(scope="module")
def gpu32() -> memra.Model:
    return _load("cuda")


@pytest.fixture(scope="module")
def gpu16() -> memra.Model:
    return _load("cuda", "bfloat16")


def _planes(m: memra.Model, cache: memra.Cache, slot: int) -> dict[str, np.ndarray]:
    out = {}
    for i, spec in enumerate(m.net.state_specs()):
        if spec.kind == "kda":
            out[f"{i}.state"], out[f"{i}.conv"] = cache.kda_state(i, slot), cache.kda_conv(i, slot)
        else:
            out[f"{i}.latent"] = np.asarray(cache.latent_rows(i, slot), np.float32)
    return out


# ------------------------------------------------------------------ float32
@pytest.mark.parametrize("name", ["a", "b", "c"])
def test_f32_logits_match_cpu_and_transformers(cpu, gpu32, name: str) -> None:
    ids = REF[f"prompt_{name}"]
    got = gpu32.logits(ids)
    assert got.dtype == np.float32 and np.isfinite(got).all()
    err_cpu, err_tf = rel_err(got, cpu.logits(ids)), rel_err(got, REF[f"logits_f32_{name}"])
    print(f"f32 {name}: vs CPU {err_cpu:.2e}, vs transformers {err_tf:.2e}")
    assert err_cpu <= 1e-5, err_cpu
    assert err_tf <= 1e-4, err_tf


@pytest.mark.parametrize("name", ["a", "b", "c"])
def test_f32_greedy_and_decode_steps_match_cpu(cpu, gpu32, name: str) -> None:
    ids = REF[f"prompt_{name}"]
    want = REF[f"greedy_{name}"].tolist()
    assert gpu32.generate(ids, len(want), ignore_eos=True) == cpu.generate(ids, len(want), ignore_eos=True) == want
    seq = REF[f"seq_{name}"]
    rows = {}
    for m in (cpu, gpu32):
        cache = m.new_cache(1, len(seq))
        rows[m] = [m.prefill(cache, 0, ids)] + [m.decode(cache, [0], [int(t)])[0] for t in seq[len(ids):]]
    assert rel_err(np.stack(rows[gpu32]), np.stack(rows[cpu])) <= 1e-5


@pytest.mark.parametrize("T", [2, 3, 4, 5, 65, 73])
def test_f32_prefill_then_decode_equals_prefill(gpu32, T: int) -> None:
    ids = REF["seq_a"][:T]
    whole = gpu32.new_cache(1, T)
    full = gpu32.prefill(whole, 0, ids)
    split = gpu32.new_cache(1, T)
    gpu32.prefill(split, 0, ids[:-1])
    last = gpu32.decode(split, [0], [int(ids[-1])])[0]
    assert rel_err(last, full) <= 1e-5, T
    a, b = _planes(gpu32, whole, 0), _planes(gpu32, split, 0)
    for k in a:
        assert rel_err(b[k], a[k]) <= 1e-5, (T, k)


def test_f32_states_match_cpu(cpu, gpu32) -> None:
    ids = REF["prompt_a"]
    caches = {}
    for m in (cpu, gpu32):
        caches[m] = m.new_cache(1, 80)
        m.prefill(caches[m], 0, ids)
    a, b = _planes(cpu, caches[cpu], 0), _planes(gpu32, caches[gpu32], 0)
    for k in a:
        assert rel_err(b[k], a[k]) <= 1e-5, k


def test_f32_batch_of_different_lengths_equals_each_alone(gpu32) -> None:
    prompts = [REF["prompt_a"], REF["prompt_b"], REF["prompt_c"]]
    together = gpu32.generate_batch(prompts, 12, ignore_eos=True)
    assert together == [REF[f"greedy_{n}"].tolist() for n in "abc"]
    assert together == [gpu32.generate(p, 12, ignore_eos=True) for p in prompts]


def test_f32_mla_layer_with_rope_columns_matches_cpu(cpu, gpu32) -> None:
    # The MLA layer alone, prefill then batched decode steps over device slots of different
    # lengths (one idle row): the rope columns in the latent append, the prefill attention and
    # the batched decode attention.
    e = gpu32.engine
    spec = gpu32.net.plan[MLA_LAYER].state
    layers = {cpu: cpu.net.blocks[MLA_LAYER].mixer.layer, gpu32: gpu32.net.blocks[MLA_LAYER].mixer.layer}
    g = np.random.default_rng(5)
    prompts = {0: g.standard_normal((9, 64)).astype(np.float32), 2: g.standard_normal((3, 64)).astype(np.float32)}
    steps = [g.standard_normal((3, 64)).astype(np.float32) for _ in range(4)]
    out = {}
    for m, layer in layers.items():
        cache = memra.Cache(m.engine, [spec], max_batch=3, max_len=16)
        dev = e.to_device if m is gpu32 else (lambda a: a)
        host = e.to_host if m is gpu32 else (lambda a: a)
        rows = []
        for slot, x in prompts.items():
            rows.append(host(layer.prefill(cache, 0, slot, dev(x))[0]))
            cache.commit(slot, len(x))
        for x in steps:
            if m is gpu32:
                ds = _core.DecodeSlots(cache, 3)
                ds.set(np.array([2, 0], np.int32))
                y = host(layer.decode(cache, 0, ds, dev(x))[0])
                assert np.isfinite(y).all()
                cache.commit_decode(ds)
                for s in (2, 0):
                    cache.commit_host(s, 1)
                rows.append(y[:2])
            else:
                rows.append(layer.decode(cache, 0, np.array([2, 0], np.int32), x[:2])[0])
                for s in (2, 0):
                    cache.commit(s, 1)
        out[m] = (rows, [np.asarray(cache.latent_rows(0, s), np.float32) for s in (0, 2)])
    for a, b in zip(out[gpu32][0], out[cpu][0]):
        assert rel_err(a, b) <= 1e-5
    for a, b in zip(out[gpu32][1], out[cpu][1]):
        assert rel_err(a, b) <= 1e-5


# ------------------------------------------------------------------ bfloat16
@pytest.mark.parametrize("name", ["a", "b", "c"])
def test_bf16_within_twice_transformers_bf16_error(gpu16, name: str) -> None:
    ids = REF[f"prompt_{name}"]
    yard = float(REF[f"bf16_rel_err_{name}"])
    err = rel_err(gpu16.logits(ids), REF[f"logits_f32_{name}"])
    print(f"bf16 {name}: memra {err:.2e}, transformers-bf16 {yard:.2e}")
    assert err <= 2 * yard, (err, yard)


@pytest.mark.parametrize("name", ["a", "b", "c"])
def test_bf16_greedy_matches_transformers_bf16(gpu16, name: str) -> None:
    want = REF[f"greedy_bf16_{name}"].tolist()
    assert gpu16.generate(REF[f"prompt_{name}"], len(want), ignore_eos=True) == want


# ------------------------------------------------------------------ decode graphs
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_graph_replay_equals_eager_bytes(dtype: str) -> None:
    # Three prompts of different lengths in a bucket of four (one idle row), and a fourth slot
    # holding its own prompt that the steps must leave untouched.
    graph, eager = _load("cuda", dtype, graphs=True), _load("cuda", dtype, graphs=False)
    prompts = [REF["prompt_a"], REF["prompt_b"], REF["prompt_c"]]
    runs = {}
    for m in (graph, eager):
        c = m.cache
        firsts = [m.prefill(c, s, p) for s, p in enumerate(prompts)]
        m.prefill(c, 3, REF["prompt_b"][:5])
        idle_before = _planes(m, c, 3)
        toks = [int(np.argmax(f)) for f in firsts]
        logits = []
        for _ in range(8):
            lg = m.decode(c, [0, 1, 2], toks)
            logits.append(lg)
            toks = [int(t) for t in np.argmax(lg, axis=1)]
        for k, v in _planes(m, c, 3).items():
            np.testing.assert_array_equal(v, idle_before[k], err_msg=k)
        runs[m] = (logits, [_planes(m, c, s) for s in range(3)])
    assert graph._runner._buckets[4].graphs, "no graph was captured"
    for step, (a, b) in enumerate(zip(runs[graph][0], runs[eager][0])):
        np.testing.assert_array_equal(a, b, err_msg=f"step {step}")
    for s, (pa, pb) in enumerate(zip(runs[graph][1], runs[eager][1])):
        for k in pa:
            np.testing.assert_array_equal(pa[k], pb[k], err_msg=f"slot {s} {k}")
    for m in (graph, eager):  # the slots prefilled above are the user's: generation never takes them
        for s in range(m.cache.max_batch):
            m.cache.free(s)
    assert graph.generate_batch(prompts, 12, ignore_eos=True) == eager.generate_batch(prompts, 12, ignore_eos=True)
