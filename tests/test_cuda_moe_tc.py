"""The routed experts' tensor-core arm (cuda/moe_tc.cu: grouped GEMMs, mma.sync bf16 x bf16 -> f32)
on the CUDA backend against cpu::moe_forward (the numeric oracle), the CUDA-core arm and itself.

memra._core.moe_forward over bfloat16 DeviceWeights runs it from T = 2 (KernelOptions'
moe_grouped_min_t) when D and I are multiples of 8 (KernelOptions(moe_tensor_cores=False) keeps
the CUDA-core grouped kernels, the A/B arm). It rounds x and the SwiGLU output h to bf16 and sums
in float32 in another order, so:
- against the CPU given x rounded to bf16: the bound of tests/moe_reference.py (bf16's unit
  roundoff 2**-8 on h, propagated through |down| and |w|, plus float32 order);
- against the CPU on x itself, and against the CUDA-core arm (within 1e-5 of the CPU): the same
  bound with the rounding of x propagated too;
- against itself: every row's bytes are the same whatever the other rows of the call (each
  output sums over k in the same 16-wide steps at any tile shape, chunk or batch), so a batch
  equals its rows run in other batches, bit for bit.
Shapes: T = 2, 3, 5, 17, 64, 300, 1000 and 2100 (two chunks of 16384 pairs at top 8), top_k 1..8,
E = 8, 16, 32, 64, D = 128..2048, I = 96 and 200 (not multiples of the 64-row tiles), routings with
experts nobody chose, one expert taking every pair, and repeated ids in a token.
"""

from __future__ import annotations


import numpy as np
import pytest

from memra import _core
from cuda_helpers import bf16_round, engine_with, f32, kernel_names, rng
from moe_reference import assert_within_tc_bound

pytestmark = pytest.mark.cuda

LIMIT = 1.5


def experts(r, E, D, I):
    """bf16-valued gate, up [E, I, D] and down [E, D, I] (float32 arrays), fan-in scaled so the
    pre-activations are O(1) and some reach the clamp."""
    g = bf16_round(r.standard_normal((E, I, D)) * (1.5 / np.sqrt(D)))
    u = bf16_round(r.standard_normal((E, I, D)) * (1.5 / np.sqrt(D)))
    d = bf16_round(r.standard_normal((E, D, I)) * (1.0 / np.sqrt(I)))
    return g, u, d


def routing(r, T, E, k, kind):
    """(idx [T, k] int32, w [T, k] float32). random: k distinct experts a token; skewed: expert 1
    in every token's slot 0, experts 0 and E - 1 never chosen, token 1 repeating one id in all
    its slots; one: every slot of every token on expert E - 1; half: only the even experts."""
    if kind == "one":
        idx = np.full((T, k), E - 1, np.int32)
    elif kind == "half":
        idx = np.stack([r.permutation(np.arange(0, E, 2))[:k] for _ in range(T)]).astype(np.int32)
    else:
        idx = np.stack([r.permutation(E)[:k] for _ in range(T)]).astype(np.int32)
        if kind == "skewed":
            pool = np.array([i for i in range(E) if i not in (0, 1, E - 1)])
            for t in range(T):
                idx[t, 0] = 1
                idx[t, 1:] = r.permutation(pool)[: k - 1]
            if T > 1:
                idx[1, :] = pool[0]
    return idx, f32(r.uniform(0.05, 1.0, (T, k)))


def weights(e, g, u, d):
    import memra

    return tuple(memra.DeviceWeight(e, _core.Weight(f32(a)), dtype="bfloat16") for a in (g, u, d))


def run(e, ws, x, idx, w):
    y = _core.moe_forward(e.to_device(f32(x)), e.to_device(idx), e.to_device(w), *ws, limit=LIMIT,
                          engine=e)
    return e.to_host(y)


def cpu(x, idx, w, g, u, d):
    def per_expert(a):
        return [_core.Weight(f32(m)) for m in a]

    return _core.moe_forward(f32(x), idx, w, per_expert(g), per_expert(u), per_expert(d), limit=LIMIT)


CASES = [  # T, E, D, I, top_k, routing
    (2, 8, 128, 96, 2, "random"),
    (2, 64, 128, 200, 8, "random"),
    (3, 8, 256, 200, 3, "skewed"),
    (5, 8, 2048, 96, 7, "random"),
    (17, 8, 256, 96, 5, "random"),
    (17, 64, 256, 96, 8, "half"),
    (64, 32, 256, 200, 6, "skewed"),
    (64, 8, 128, 96, 1, "one"),
    (300, 16, 1024, 96, 8, "random"),  # 2400 pairs over 16 experts: the 128-row tiles
    (1000, 8, 256, 200, 4, "skewed"),
    (1000, 64, 256, 96, 2, "one"),     # one expert with 2000 pairs
    (1000, 16, 512, 96, 8, "half"),
    (2100, 32, 128, 96, 8, "skewed"),  # 16800 pairs: two chunks
]


def case_id(c):
    return "T{}-E{}-D{}-I{}-k{}-{}".format(*c)


@pytest.mark.parametrize("T,E,D,I,k,kind", CASES, ids=[case_id(c) for c in CASES])
def test_tc_matches_cpu_on_bf16_rounded_x(e, T, E, D, I, k, kind):
    r = rng(T * 31 + E + D + I + k)
    g, u, d = experts(r, E, D, I)
    x = f32(r.standard_normal((T, D)) * 2.0)
    idx, w = routing(r, T, E, k, kind)
    got = run(e, weights(e, g, u, d), x, idx, w)
    xb = bf16_round(x)
    assert_within_tc_bound(got, xb, idx, w, g, u, d, LIMIT, cpu(xb, idx, w, g, u, d))


@pytest.mark.parametrize("T,E,D,I,k,kind", [CASES[2], CASES[6], CASES[8]],
                         ids=[case_id(c) for c in (CASES[2], CASES[6], CASES[8])])
def test_tc_against_the_f32_op_and_the_cuda_core_arm(e, T, E, D, I, k, kind):
    r = rng(T * 37 + E + D + I + k)
    g, u, d = experts(r, E, D, I)
    x = f32(r.standard_normal((T, D)) * 2.0)
    idx, w = routing(r, T, E, k, kind)
    got = run(e, weights(e, g, u, d), x, idx, w)
    assert_within_tc_bound(got, x, idx, w, g, u, d, LIMIT, cpu(x, idx, w, g, u, d))
    cc = engine_with(moe_tensor_cores=False)
    core = run(cc, weights(cc, g, u, d), x, idx, w)
    assert_within_tc_bound(got, x, idx, w, g, u, d, LIMIT, core, extra_rel=1e-5)
    assert not np.array_equal(got, core)  # the other arm ran


@pytest.mark.parametrize("T,E,D,I,k,kind", [CASES[6], CASES[8], CASES[12]],
                         ids=[case_id(c) for c in (CASES[6], CASES[8], CASES[12])])
def test_tc_rows_do_not_depend_on_the_batch(e, T, E, D, I, k, kind):
    # Slices of other sizes take other tile shapes (16-row tiles below 64 pairs an expert) and
    # other chunkings; each row still gets the same bytes. Repeated calls too.
    r = rng(T * 41 + E + D + I + k)
    g, u, d = experts(r, E, D, I)
    x = f32(r.standard_normal((T, D)) * 2.0)
    idx, w = routing(r, T, E, k, kind)
    ws = weights(e, g, u, d)
    full = run(e, ws, x, idx, w)
    np.testing.assert_array_equal(run(e, ws, x, idx, w), full)
    cuts = [0, 2, 5, 21, T // 2, T]
    for a, b in zip(cuts, cuts[1:]):
        part = run(e, ws, x[a:b], idx[a:b], w[a:b])
        np.testing.assert_array_equal(part, full[a:b], err_msg=f"rows {a}:{b}")


def kernels(e, fn, tmp_path, name):
    """The names of the CUDA kernels fn launched (tests/cuda_helpers.kernel_names)."""
    return " ".join(kernel_names(lambda: (fn(), e.synchronize()), tmp_path / f"{name}.json"))


def test_the_tensor_core_kernels_are_the_ones_that_ran(e, tmp_path):
    r = rng(3)
    E, D, I, k = 8, 128, 96, 2
    g, u, d = experts(r, E, D, I)
    x = f32(r.standard_normal((300, D)))
    idx, w = routing(r, 300, E, k, "random")
    ws = weights(e, g, u, d)
    for T in (2, 300):  # the 16-row and the 128-row tiles
        names = kernels(e, lambda: run(e, ws, x[:T], idx[:T], w[:T]), tmp_path, f"tc{T}")
        assert names.count("moe_tc_kernel") == 2, names  # gate/up, then down
        assert "moe_grouped_kernel" not in names and "moe_gate_up_kernel" not in names, names
    # T = 1 keeps the per-pair kernels (batch-1 decode bytes unchanged).
    names = kernels(e, lambda: run(e, ws, x[:1], idx[:1], w[:1]), tmp_path, "t1")
    assert "moe_gate_up_kernel" in names and "moe_tc_kernel" not in names, names
    # The A/B arm, and float32 weights: the CUDA-core grouped kernels.
    cc = engine_with(moe_tensor_cores=False)
    ws_cc = weights(cc, g, u, d)
    names = kernels(cc, lambda: run(cc, ws_cc, x[:64], idx[:64], w[:64]), tmp_path, "cc")
    assert "moe_grouped_kernel" in names and "moe_tc_kernel" not in names, names
    import memra

    ws32 = tuple(memra.DeviceWeight(e, _core.Weight(f32(a))) for a in (g, u, d))
    names = kernels(e, lambda: run(e, ws32, x[:64], idx[:64], w[:64]), tmp_path, "f32")
    assert "moe_grouped_kernel" in names and "moe_tc_kernel" not in names, names


def test_tc_off_keeps_the_cuda_core_bytes(e):
    # moe_tensor_cores=False: the CUDA-core grouped kernels, bit-identical to the per-pair kernels
    # forced at the same T (their contract, tests/test_cuda_moe.py), here on a tensor-core shape.
    r = rng(9)
    E, D, I, k, T = 32, 256, 96, 8, 40
    g, u, d = experts(r, E, D, I)
    x = f32(r.standard_normal((T, D)))
    idx, w = routing(r, T, E, k, "skewed")
    cc = engine_with(moe_tensor_cores=False)
    pp = engine_with(moe_grouped_min_t=10**9)
    np.testing.assert_array_equal(run(cc, weights(cc, g, u, d), x, idx, w),
                                  run(pp, weights(pp, g, u, d), x, idx, w))
