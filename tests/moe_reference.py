"""MoE test helpers: the float64 reference bound of the routed experts' tensor-core arm
(cuda/moe_tc.cu), shared by tests/test_cuda_moe.py and tests/test_cuda_moe_tc.py, the float64 MLP of the CPU op
tests, and
ExpertRecorder, which the model tests use to read the experts each token chose.

The arm rounds x to bfloat16 (once per token) and h = clamped_swiglu(g, u) to bfloat16 (the down
GEMM's operand) and accumulates in float32; the products of two bf16 values are exact. Against
cpu::moe_forward on the same bf16-valued weights, for output (t, d):

    |y_tc - y_cpu| <= sum_j |w_tj| sum_i |down[e_tj, d, i]| * dh_tji  +  1e-5 * max|y_cpu|

with dh = 2**-8 |h(x_b)| (bf16's unit roundoff: round to nearest with an 8-bit significand)
+ |h(x) - h(x_b)| (the rounding of x, zero when the CPU is given x_b itself), h computed in
float64, plus 2**-12 of the same sum for the float32 accumulations' order (the GPU's and the
CPU's, around 1e-6 relative each) and 1e-5 * max|y| as the float32 tests allow.
"""

from __future__ import annotations

import numpy as np

from cuda_helpers import bf16_round


def swiglu64(g, u, limit):
    """cpu::clamped_swiglu in float64."""
    gate = np.minimum(g, limit)
    up = np.clip(u, -limit, limit)
    return gate / (1.0 + np.exp(-gate)) * up


def mlp64(x, gw, uw, dw, limit):
    """Glm5NextTextMLP.forward in float64 (the gate clamped above, up both ways): x [T, D],
    gw, uw [I, D], dw [D, I] -> [T, D]."""
    x = np.asarray(x, np.float64)
    return swiglu64(x @ gw.T.astype(np.float64), x @ uw.T.astype(np.float64), limit) @ dw.T.astype(np.float64)


def hidden64(x, idx, g, u, limit):
    """h [T, top_k, I] float64 of every (token, slot); g, u [E, I, D]."""
    T, k = idx.shape
    h = np.zeros((T, k, g.shape[1]))
    x64 = np.asarray(x, np.float64)
    for ex in np.unique(idx):
        t, j = np.nonzero(idx == ex)
        xe = x64[t]
        h[t, j] = swiglu64(xe @ g[ex].T.astype(np.float64), xe @ u[ex].T.astype(np.float64), limit)
    return h


def tc_bound(x, idx, w, g, u, d, limit, want):
    """Elementwise bound [T, D] of |y_tc - y_cpu(x)| (module docstring). x is what the CPU ran on:
    pass bf16_round(x) for the comparison without the rounding of x."""
    x = np.asarray(x, np.float32)
    xb = bf16_round(x)
    hb = hidden64(xb, idx, g, u, limit)
    habs = np.abs(hb)
    dh = 2.0**-8 * habs
    if not np.array_equal(x, xb):
        dh += np.abs(hidden64(x, idx, g, u, limit) - hb)
    dh += 2.0**-12 * habs  # float32 order
    # Sums of nonnegative terms: float32 is plenty for the bound itself.
    T, k = idx.shape
    dh = dh.astype(np.float32)
    bound = np.zeros((T, d.shape[1]), np.float32)
    wa = np.abs(np.asarray(w, np.float32))
    for ex in np.unique(idx):
        da_t = np.ascontiguousarray(np.abs(d[ex]).T, np.float32)  # [I, D]
        for j in range(k):  # one slot at a time: its tokens are distinct (a token may repeat an id)
            t = np.nonzero(idx[:, j] == ex)[0]
            if t.size:
                bound[t] += wa[t, j][:, None] * (dh[t, j] @ da_t)
    return bound.astype(np.float64) + 1e-5 * float(np.abs(want).max())


def assert_within_tc_bound(got, x, idx, w, g, u, d, limit, want, extra_rel=0.0):
    """|got - want| <= tc_bound (+ extra_rel * max|want|) elementwise; got finite float32."""
    assert got.shape == want.shape and got.dtype == np.float32
    assert np.all(np.isfinite(got))
    tol = tc_bound(x, idx, w, g, u, d, limit, want) + extra_rel * float(np.abs(want).max())
    err = np.abs(got.astype(np.float64) - want.astype(np.float64))
    worst = np.unravel_index(np.argmax(err - tol), err.shape)
    assert np.all(err <= tol), (f"|d| = {err[worst]:.3g} > bound {tol[worst]:.3g} at {worst} "
                                f"(max|y| {float(np.abs(want).max()):.3g})")


class ExpertRecorder:
    """Wraps a MoeLayer: forward records the experts each token chose (the same call)."""

    def __init__(self, moe) -> None:
        self.moe, self.chosen = moe, []

    def forward(self, x):
        y, idx = self.moe.forward_with_experts(x)
        self.chosen.append(np.sort(idx, axis=1))
        return y
