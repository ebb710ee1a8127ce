"""MLA prefill attention on tensor cores (``memra._core.mla_attn_absorbed`` /
``mla_attn_gathered`` with ``tensor_cores=True`` on a CUDA engine: cuda/mla_prefill_tc.cu, the arm
of bf16 models) against the CPU oracle (cpu::mla_attn_absorbed / mla_attn_gathered, the same
bindings without an engine) and a float64 numpy twin of it for the long shapes (the CPU op is
sequential: T = 2000 at 64 heads would take minutes).

Inputs: a bf16 latent cache (the kernels read it as is; the oracle reads it widened, exactly), q_lat
with scores of std ~2 as real absorbed queries (decode tests' Batch), q_pe for Kimi-Linear's rope
columns. The queries are the cache's last t_q rows; p0 = t_kv - t_q > 0 is a slot that already
holds tokens.

Tolerances (derived from bf16, per query: |got[i] - want[i]| <= rel * max|want[i]|): the arm
rounds q_lat / q_pe to bf16 (2^-9 relative per element) and the softmax weights p to bf16 (2^-9
relative each; the sums use the rounded p, so o stays a convex combination of rows); scores,
softmax statistics and accumulations are f32. It is the batched decode's tensor-core kernel,
whose float64 emulation of exactly these roundings stays within 2.7e-3..6.2e-3 of max|o| of the
CPU on the unrounded q and 0.9e-3..1.3e-3 on the bf16-rounded q (tests/test_cuda_mla_decode.py):
rel = 1e-2 and 5e-3. Against the f32 CUDA-core arm (tensor_cores=False) the same 1e-2.
A query with one visible row gets that row exactly (p = 1).
Kernel check: torch.profiler lists the decode tensor-core kernels (``decode_tc`` /
``mla_decode_wgmma``) and not the f32 prefill kernel (``attn_kernel``).
"""

from __future__ import annotations


import ml_dtypes
import numpy as np
import pytest

from memra import _core
from cuda_helpers import bf16_bits, bf16_round, f32, kernel_names, rng
from mla_decode_batch import close_per_seq

pytestmark = pytest.mark.cuda

BF16 = np.dtype(ml_dtypes.bfloat16)
REL = 1e-2
QROUND_REL = 5e-3
GLM = (64, 512, 0)   # GLM-5.3-Flash: 64 heads, kv_lora 512, NoPE
KIMI = (32, 512, 64)  # Kimi-Linear: 32 heads, kv_lora 512, 64 unrotated rope columns
SMALL = (16, 128, 0)
CPU_LIMIT = 4e9      # multiply-adds the sequential CPU oracle is asked for (~seconds)


class Case:
    def __init__(self, t_q, p0, H, R, d_rope, seed):
        r = rng(seed)
        self.t_q, self.t_kv, self.H, self.R, self.dr = t_q, p0 + t_q, H, R, d_rope
        self.q = f32(r.standard_normal((t_q, H, R)) * 0.5 * 16 / np.sqrt(R))
        self.q_pe = f32(r.standard_normal((t_q, H, d_rope)) * 0.5) if d_rope else None
        self.scale = 0.25
        self.cache = bf16_round(r.standard_normal((self.t_kv, R + d_rope)))

    def gpu(self, e, idx=None, tc=True):
        dpe = None if self.q_pe is None else e.to_device(self.q_pe)
        dc = e.to_device(bf16_bits(self.cache))
        if idx is None:
            out = _core.mla_attn_absorbed(e.to_device(self.q), dc, dpe, scale=self.scale,
                                          tensor_cores=tc, engine=e)
        else:
            out = _core.mla_attn_gathered(e.to_device(self.q), dc, e.to_device(idx), dpe,
                                          scale=self.scale, tensor_cores=tc, engine=e)
        return e.to_host(out)

    def want(self, idx=None, round_q=False):
        q = bf16_round(self.q) if round_q else self.q
        pe = None if self.q_pe is None else (bf16_round(self.q_pe) if round_q else self.q_pe)
        macs = self.t_q * self.t_kv * self.H * (2 * self.R + self.dr)
        if macs <= CPU_LIMIT:  # the CPU oracle itself
            if idx is None:
                return _core.mla_attn_absorbed(q, self.cache, pe, scale=self.scale)
            return _core.mla_attn_gathered(q, self.cache, idx, pe, scale=self.scale)
        return self.numpy(q, pe, idx)

    def numpy(self, q, pe, idx):
        """cpu::mla_attn_* in numpy: products summed by float32 BLAS (~1e-6 relative, far below
        the tolerances), the max-subtracted softmax in float64 over the rows each query sees."""
        c = self.cache
        qf = q if pe is None else f32(np.concatenate([q, pe], -1))
        out = np.zeros((self.t_q, self.H, self.R), np.float32)
        p0 = self.t_kv - self.t_q
        for a in range(0, self.t_q, 64):
            b = min(self.t_q, a + 64)
            s = (qf[a:b] @ c.T).astype(np.float64) * self.scale
            rows = np.arange(self.t_kv)
            vis = rows[None, :] <= (p0 + np.arange(a, b))[:, None]
            if idx is not None:
                listed = np.zeros_like(vis)
                for i in range(a, b):
                    ent = idx[i][idx[i] >= 0]
                    listed[i - a, ent] = True
                vis &= listed
            s = np.where(vis[:, None, :], s, -np.inf)
            m = s.max(-1, keepdims=True)
            m = np.where(np.isfinite(m), m, 0.0)
            w = np.exp(s - m)
            l = w.sum(-1, keepdims=True)
            o = (f32(w) @ c[:, :self.R]).astype(np.float64)
            out[a:b] = np.where(l > 0, o / np.where(l > 0, l, 1.0), 0.0)
        return out


def random_lists(t_q, t_kv, width, seed):
    """Per query i (row t_kv - t_q + i): distinct visible rows, duplicates, -1 padding, shuffled."""
    r = rng(seed)
    p0 = t_kv - t_q
    idx = np.full((t_q, width), -1, np.int32)
    for i in range(t_q):
        vis = p0 + i + 1
        n = int(r.integers(1, min(width, vis) + 1))
        rows = r.choice(vis, size=n, replace=False)
        dup = r.choice(rows, size=min(width - n, 2))
        row = np.full(width, -1, np.int64)
        vals = np.concatenate([rows, dup])
        row[:len(vals)] = vals
        idx[i] = r.permutation(row).astype(np.int32)
    return idx


@pytest.mark.parametrize("geom", [GLM, KIMI, SMALL], ids=["glm", "kimi", "h16_r128"])
@pytest.mark.parametrize("t_q,p0", [(1, 0), (2, 0), (63, 0), (64, 0), (65, 0), (300, 0),
                                    (1, 700), (65, 130), (300, 37)])
def test_causal_matches_cpu(e, geom, t_q, p0):
    c = Case(t_q, p0, *geom, seed=t_q * 7 + p0 + geom[0])
    got = c.gpu(e)
    close_per_seq(got, c.want(), REL, what="query")
    close_per_seq(got, c.want(round_q=True), QROUND_REL, what="query")
    if p0 == 0:  # query 0 sees row 0 alone: that row exactly
        np.testing.assert_array_equal(got[0], np.broadcast_to(c.cache[0, :c.R], (c.H, c.R)))


@pytest.mark.parametrize("geom", [GLM, KIMI], ids=["glm", "kimi"])
def test_causal_long(e, geom):
    c = Case(2000, 0, *geom, seed=2000 + geom[0])
    got = c.gpu(e)
    close_per_seq(got, c.want(round_q=True), QROUND_REL, what="query")
    close_per_seq(got, c.gpu(e, tc=False), REL, what="query")  # the f32 CUDA-core arm


@pytest.mark.parametrize("geom", [GLM, KIMI], ids=["glm", "kimi"])
@pytest.mark.parametrize("t_q,p0,width", [(1, 0, 8), (65, 0, 32), (300, 0, 67), (63, 500, 67),
                                          (2000, 0, 256)])
def test_gathered_matches_cpu(e, geom, t_q, p0, width):
    c = Case(t_q, p0, *geom, seed=t_q + p0 + width)
    idx = random_lists(t_q, c.t_kv, width, seed=t_q + width)
    got = c.gpu(e, idx)
    close_per_seq(got, c.want(idx, round_q=True), QROUND_REL, what="query")
    if t_q <= 300:
        close_per_seq(got, c.want(idx), REL, what="query")


def test_gathered_all_padding_gives_zeros(e):
    c = Case(5, 10, *GLM, seed=3)
    idx = np.full((5, 9), -1, np.int32)
    idx[2, 4] = 7  # one query with one row: that row exactly
    got = c.gpu(e, idx)
    assert not np.any(got[[0, 1, 3, 4]])
    np.testing.assert_array_equal(got[2], np.broadcast_to(c.cache[7, :c.R], (c.H, c.R)))


def test_prefill_is_the_decode_kernel_over_query_lengths(e):
    """Query i is a decode row of p0 + i + 1 rows: the same launch plan, the same bytes."""
    c = Case(40, 90, *KIMI, seed=11)
    got = c.gpu(e)
    dc = [e.to_device(bf16_bits(c.cache)) for _ in range(c.t_q)]
    lens = [c.t_kv - c.t_q + i + 1 for i in range(c.t_q)]
    dec = e.to_host(_core.mla_attn_decode(e.to_device(c.q), dc, lens, q_pe=e.to_device(c.q_pe),
                                          scale=c.scale, max_t_kv=c.t_kv, engine=e))
    np.testing.assert_array_equal(got, dec)


def test_unsupported_geometry_keeps_the_f32_arm(e):
    """R = 32 (no tensor-core instantiation): tensor_cores=True runs the f32 kernel, same bytes."""
    c = Case(20, 5, 4, 32, 0, seed=5)
    np.testing.assert_array_equal(c.gpu(e), c.gpu(e, tc=False))


def test_profiler_shows_the_tensor_core_kernel(e, tmp_path):
    def kernels(geom, tc):
        c = Case(70, 30, *geom, seed=1)
        args = (e.to_device(c.q), e.to_device(bf16_bits(c.cache)),
                None if c.q_pe is None else e.to_device(c.q_pe))
        return " ".join(kernel_names(
            lambda: (_core.mla_attn_absorbed(*args, scale=c.scale, tensor_cores=tc, engine=e),
                     e.synchronize()), tmp_path / "trace.json"))

    for geom in (GLM, KIMI):
        new = kernels(geom, True)
        assert ("decode_tc" in new or "mla_decode_wgmma" in new), new
        assert "attn_kernel" not in new, new
        old = kernels(geom, False)
        assert "attn_kernel" in old and "decode_tc" not in old, old
