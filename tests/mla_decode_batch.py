"""Shared by the MLA attention tests: the batched decode's (tests/test_cuda_mla_decode.py, the
kernels of cuda/mla_decode.cu, and tests/test_cuda_mla_decode_sm90.py, its sm_90a wgmma arm)
batch of sequences with NaN-padded caches and its length pattern, the per-sequence (or
per-query: tests/test_cuda_mla_prefill_tc.py) closeness check, and the tolerances that
tests/test_cuda_mla_decode.py's docstring derives (tests/test_cuda_mla_rope.py holds its rope
columns to the same)."""

from __future__ import annotations

import ml_dtypes
import numpy as np

from memra import _core
from cuda_helpers import bf16_bits, bf16_round, f32, rng

BF16 = np.dtype(ml_dtypes.bfloat16)
F32_REL = 2e-5
BF16_REL = 1e-2
BF16_QROUND_REL = 5e-3
# t_kv per sequence, cycled over the batch (0 = idle row).
PATTERN = [1, 7, 33, 4096]


def pattern(B):
    return [PATTERN[b % len(PATTERN)] for b in range(B)]


def close_per_seq(got, want, rel, what="sequence"):
    """|got[b] - want[b]| <= rel * max|want[b]| for every sequence (or query: `what` names it
    in the message) b along the first axis (zeros: exactly zero)."""
    assert got.shape == want.shape and got.dtype == np.float32
    assert np.all(np.isfinite(got))
    for b in range(want.shape[0]):
        scale = float(np.abs(want[b]).max())
        err = float(np.abs(got[b].astype(np.float64) - want[b].astype(np.float64)).max())
        assert err <= rel * scale, (f"{what} {b}: max |d| = {err:.3g} > {rel:g} * max|y| = "
                                    f"{rel * scale:.3g}")


class Batch:
    """B sequences: q_lat [B, H, R], with dr > 0 (rope columns, Kimi-Linear) q_pe [B, H, dr], and
    per-sequence caches [t_kv + slack, R + dr] whose rows past t_kv are NaN (never to be read).
    `rows[b]` are the f32 values of the visible rows as the kernels see them (bf16-rounded for a
    bf16 cache). Draws: q, then q_pe (dr > 0 only), then each cache, so dr = 0 draws what the
    latent-only batch always drew."""

    def __init__(self, t_kv, H, R, cache_dtype, seed, slack=5, dr=0):
        r = rng(seed)
        self.t_kv = [int(t) for t in t_kv]
        self.B, self.H, self.R, self.dr, self.dtype = len(self.t_kv), H, R, dr, cache_dtype
        D = R + dr
        # Scores of std ~2 (scale 0.25, |q| ~ 16 / sqrt(D) per head as real absorbed queries).
        s = 0.5 * 16 / np.sqrt(D)
        qs = r.standard_normal((self.B, H, R))
        # Each form's expression as its batch always rounded it (the same bytes as before).
        self.q = f32(qs * s if dr else qs * 0.5 * 16 / np.sqrt(D))
        self.q_pe = f32(r.standard_normal((self.B, H, dr)) * s) if dr else None
        self.scale = 0.25
        self.rows, self.host = [], []
        for t in self.t_kv:
            full = f32(np.full((t + slack, D), np.nan))
            full[:t] = r.standard_normal((t, D))
            if cache_dtype == "bfloat16":
                full[:t] = bf16_round(full[:t])
                self.host.append(bf16_bits(full))
            else:
                self.host.append(full)
            self.rows.append(f32(full[:t]))
        self.max_t_kv = max(self.t_kv) if self.t_kv else 0

    def caches(self, e):
        return [e.to_device(c) for c in self.host]

    def cpu_caches(self):
        """f32 host caches for the CPU op (bf16 caches widened; NaN tails kept)."""
        if self.dtype == "bfloat16":
            return [f32(c.view(BF16).astype(np.float32)) for c in self.host]
        return self.host

    def _q_pe(self, q_pe):
        return self.q_pe if q_pe is None else q_pe

    def gpu(self, e, idx=None, t_kv=None, q=None, q_pe=None, caches=None, **kw):
        q = self.q if q is None else q
        q_pe = self._q_pe(q_pe)
        t = self.t_kv if t_kv is None else t_kv
        out = _core.mla_attn_decode(e.to_device(q), self.caches(e) if caches is None else caches, t,
                                    idx=None if idx is None else e.to_device(idx),
                                    q_pe=None if q_pe is None else e.to_device(q_pe),
                                    scale=self.scale, engine=e, **kw)
        return e.to_host(out)

    def cpu(self, idx=None, q=None, q_pe=None):
        q = self.q if q is None else q
        return _core.mla_attn_decode(q, self.cpu_caches(), self.t_kv, idx=idx,
                                     q_pe=self._q_pe(q_pe), scale=self.scale)

    def exact_rows(self, got):
        """t_kv = 1: o = the row's latent columns bit for bit; t_kv = 0: zeros."""
        for b, t in enumerate(self.t_kv):
            if t == 0:
                np.testing.assert_array_equal(got[b], np.zeros((self.H, self.R), np.float32))
            elif t == 1:
                np.testing.assert_array_equal(got[b], np.broadcast_to(self.rows[b][0, :self.R],
                                                                      (self.H, self.R)))


def random_lists(t_kv, width, seed):
    """Per sequence: distinct visible rows plus duplicates, -1 padding and out-of-range entries
    (>= t_kv, < -1) that must be skipped; shuffled."""
    r = rng(seed)
    idx = np.full((len(t_kv), width), -1, np.int32)
    for b, t in enumerate(t_kv):
        if t == 0:
            idx[b] = r.integers(-3, 50, width)  # an idle row: nothing visible
            continue
        n = int(r.integers(1, min(width, t) + 1))
        rows = r.choice(t, size=n, replace=False)
        extra = min(width - n, 3)
        junk = np.array([t, t + 7, -2][:extra], np.int64)
        dup = r.choice(rows, size=min(width - n - extra, n))
        row = np.full(width, -1, np.int64)
        vals = np.concatenate([rows, junk, dup])
        row[:len(vals)] = vals
        idx[b] = r.permutation(row).astype(np.int32)
    return idx
