"""The DSA indexer's prefill scorer on tensor cores (``memra._core.kpool_score(...,
tensor_cores=True)`` on a CUDA engine: cuda/dsa_score_tc.cu, the arm of bf16 models) against the
CPU f32 scorer (cpu::kpool_score, the same binding without an engine), and the exact selection
over the scores it gives.

score[i, p] = sum_h (w[i, h] * head_scale) * relu(qk_scale * q[i, h, :] . key[p, :]), -inf for
pools after the query. Shapes: GLM-5.3-Flash's indexer (32 heads x 128, pools of 4) and 16 x 64
(the other instantiation); t_q = 1, 2, 63, 64, 65, 300, 2000; first_pos > 0 (a slot that holds
tokens already). Kimi-Linear has no indexer.

Tolerances (derived from bf16; S[i, p] = sum_h |w[i, h] * head_scale| * qk_scale *
sum_c |q[i, h, c] * key[p, c]|, the score's sum of |terms|):
- same operands (q and keys rounded to bf16 on the host, the CPU scoring them in f32): the
  products are exact in f32 on both sides (8 x 8 significant bits), so a head's dot differs only
  by its summation order, each side within d * 2^-24 of sum_c |q k|; relu is 1-Lipschitz and the
  weighting and head sum are the same f32 operations in the same order (each moving by <= Hi
  ulps of the sum of |terms|): |d| <= (2 d + 2 Hi) * 2^-24 * S.
- unrounded inputs against the f32 scorer (the 2x rule's op-level bound): each product of two
  bf16-rounded factors is within 2^-8 + 2^-18 of the exact one, so |d| <= 2^-8 * 1.01 * S plus
  the bound above.
- -inf exactly where the CPU has it.
- selection: kpool_select on the device over the tensor-core scores equals the CPU's select over
  the same scores (exact; ties to the lower pool). Against the f32 scorer's selection the overlap
  (|both| / |f32's|, per query, over the pools) is printed and asserted >= 0.9 on average.
Kernel check: torch.profiler lists ``score_tc_kernel`` and not ``score_tiled_kernel``.
"""

from __future__ import annotations


import numpy as np
import pytest

from memra import _core
from cuda_helpers import bf16_round, f32, kernel_names, rng

pytestmark = pytest.mark.cuda

GLM = (32, 128)  # index_n_heads, index_head_dim
SMALL = (16, 64)
POOL = 4


class Case:
    def __init__(self, t_q, first_pos, Hi, d, seed):
        r = rng(seed)
        self.t_q, self.first_pos, self.Hi, self.d = t_q, first_pos, Hi, d
        self.n_pools = (first_pos + t_q) // POOL
        self.q = f32(r.standard_normal((t_q, Hi, d)))
        self.w = f32(r.standard_normal((t_q, Hi)))
        self.keys = f32(r.standard_normal((max(self.n_pools, 1), d)))[:self.n_pools]
        self.keys = f32(self.keys)
        self.kw = dict(pool=POOL, first_pos=first_pos, qk_scale=float(d ** -0.5),
                       head_scale=float(Hi ** -0.5))

    def gpu(self, e, q=None, keys=None, tc=True):
        q = self.q if q is None else q
        keys = self.keys if keys is None else keys
        return e.to_host(_core.kpool_score(e.to_device(q), e.to_device(self.w), e.to_device(keys),
                                           tensor_cores=tc, engine=e, **self.kw))

    def cpu(self, q=None, keys=None):
        q = self.q if q is None else q
        keys = self.keys if keys is None else keys
        return _core.kpool_score(q, self.w, keys, **self.kw)

    def abs_sum(self):
        """S[i, p]: the sum of |terms| of each score (float64)."""
        aw = np.abs(self.w.astype(np.float64)) * self.kw["head_scale"] * self.kw["qk_scale"]
        wq = np.einsum("th,thc->tc", aw, np.abs(self.q.astype(np.float64)))
        return wq @ np.abs(self.keys.astype(np.float64)).T


def check_close(got, want, bound):
    assert got.shape == want.shape and got.dtype == np.float32
    inf = np.isneginf(want)
    np.testing.assert_array_equal(np.isneginf(got), inf)
    assert np.all(np.isfinite(got[~inf]))
    err = np.abs(got.astype(np.float64) - want.astype(np.float64))[~inf]
    b = bound[~inf]
    assert np.all(err <= b), f"max excess {float((err - b).max()):.3g}, max |d| {float(err.max()):.3g}"


CASES = [(1, 3), (2, 6), (63, 0), (64, 0), (65, 0), (300, 0), (2000, 0), (1, 777), (65, 130),
         (300, 41)]


@pytest.mark.parametrize("geom", [GLM, SMALL], ids=["glm_32x128", "16x64"])
@pytest.mark.parametrize("t_q,first_pos", CASES)
def test_scores_match_cpu(e, geom, t_q, first_pos):
    c = Case(t_q, first_pos, *geom, seed=t_q * 5 + first_pos + geom[0])
    if c.n_pools == 0:
        pytest.skip("no complete pool")
    S = c.abs_sum()
    same = (2 * c.d + 2 * c.Hi) * 2.0 ** -24 * S
    qr, kr = bf16_round(c.q), bf16_round(c.keys)
    got = c.gpu(e)
    # The kernel rounds q and keys itself: the same bytes as on pre-rounded inputs.
    np.testing.assert_array_equal(got, c.gpu(e, q=qr, keys=kr))
    check_close(got, c.cpu(q=qr, keys=kr), same)
    check_close(got, c.cpu(), 2.0 ** -8 * 1.01 * S + same)


def select(score, first_pos, select_k, engine=None):
    width = select_k * POOL + POOL - 1
    out = _core.kpool_select(engine.to_device(score) if engine else score, pool=POOL,
                             select_k=select_k, width=width, first_pos=first_pos, engine=engine)
    return engine.to_host(out) if engine else out


@pytest.mark.parametrize("t_q,first_pos", [(300, 0), (2000, 0), (65, 130)])
def test_selection_exact_and_overlap(e, t_q, first_pos):
    c = Case(t_q, first_pos, *GLM, seed=t_q + first_pos)
    k = 64  # pools selected (index_topk 256 at pools of 4)
    tc = c.gpu(e)
    sel = select(tc, first_pos, k, engine=e)
    np.testing.assert_array_equal(sel, select(tc, first_pos, k))  # exact over the given scores
    ref = select(c.cpu(), first_pos, k)
    overlaps = []
    for i in range(t_q):
        a = set(sel[i][sel[i] >= 0].tolist())
        b = set(ref[i][ref[i] >= 0].tolist())
        if b:
            overlaps.append(len(a & b) / len(b))
    mean, worst = float(np.mean(overlaps)), float(np.min(overlaps))
    print(f"\nselected-set overlap vs the f32 scorer (t_q={t_q}, first_pos={first_pos}, "
          f"top {k} pools): mean {mean:.4f}, min {worst:.4f}")
    assert mean >= 0.9


def test_other_widths_keep_the_f32_scorer(e):
    """d = 32 (no tensor-core instantiation): tensor_cores=True gives the f32 scorer's bytes."""
    c = Case(70, 3, 8, 32, seed=9)
    np.testing.assert_array_equal(c.gpu(e), c.gpu(e, tc=False))
    np.testing.assert_array_equal(c.gpu(e, tc=False), c.cpu())


def test_profiler_shows_the_tensor_core_kernel(e, tmp_path):
    c = Case(200, 0, *GLM, seed=2)

    def kernels(tc):
        args = (e.to_device(c.q), e.to_device(c.w), e.to_device(c.keys))
        return " ".join(kernel_names(
            lambda: (_core.kpool_score(*args, tensor_cores=tc, engine=e, **c.kw), e.synchronize()),
            tmp_path / "trace.json"))

    new, old = kernels(True), kernels(False)
    assert "score_tc_kernel" in new and "score_tiled_kernel" not in new, new
    assert "score_tiled_kernel" in old and "score_tc_kernel" not in old, old
