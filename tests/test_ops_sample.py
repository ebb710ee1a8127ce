"""Sampling of the CPU backend (``memra._core.sample`` / ``uniform_from_counter``,
cpu/sample.cpp) against numpy references of the spec in cpp/include/memra/cpu/sample.h (the
counter-based uniform, softmax / top-k / top-p, the blocked order of every sum). numpy only.
"""

from __future__ import annotations

import numpy as np
import pytest

import memra
from memra import _core

S = _core.status


def rng(seed):
    return np.random.default_rng(seed)


def randn(r, *shape, scale=1.0):
    return (r.standard_normal(shape) * scale).astype(np.float32)


def expect_contract(code, fn, *args, **kwargs):
    with pytest.raises(memra.ContractError) as ei:
        fn(*args, **kwargs)
    assert ei.value.code == code, str(ei.value)
    return ei.value


# ---------------------------------------------------------------- sampling

M64 = (1 << 64) - 1
GOLDEN = 0x9E3779B97F4A7C15


def uniform_ref(seed, counter):
    """The formula cpu/sample.h documents (splitmix64 step, top 24 bits)."""
    z = seed ^ ((GOLDEN * (counter + 1)) & M64)
    z = (z + GOLDEN) & M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    z ^= z >> 31
    return (z >> 40) / float(1 << 24)


def sample_ref(row, temperature, top_k, top_p, u):
    """cpu/sample.h's sample in float32, step by step, for V <= kSampleBlock (one block, where the
    blocked order is plain left to right); returns (token, margin of u*M to a boundary)."""
    f = np.float32
    z = row.astype(f) / f(temperature)
    e = np.exp(z - z.max()).astype(f)
    s = np.cumsum(e, dtype=f)[-1]
    p = (e / s).astype(f)
    order = np.lexsort((np.arange(len(p)), -p))
    k = len(p) if top_k <= 0 or top_k > len(p) else top_k
    kept = order[:k]
    q = (p[kept] / np.cumsum(p[kept], dtype=f)[-1]).astype(f)
    c = np.cumsum(q, dtype=f)
    n = k
    if top_p < 1.0:
        n = int(np.argmax(c >= f(top_p))) + 1 if (c >= f(top_p)).any() else k
    c = c[:n]
    rr = f(f(u) * c[-1])
    i = int(np.argmax(c > rr)) if (c > rr).any() else n - 1
    return int(kept[i]), float(np.min(np.abs(c - rr)))


def test_uniform_from_counter_formula():
    for seed, ctr in [(0, 0), (0, 1), (12345, 7), (M64, M64), (2**40 + 3, 2**33)]:
        assert _core.uniform_from_counter(seed, ctr) == uniform_ref(seed, ctr)


@pytest.mark.parametrize("temperature,top_k,top_p", [(1.0, 0, 1.0), (0.7, 5, 1.0),
                                                     (1.3, 0, 0.9), (0.9, 12, 0.6)])
def test_sample_matches_reference(temperature, top_k, top_p):
    r = rng(5)
    B, V, seed = 64, 101, 77
    logits = randn(r, B, V, scale=2.0)
    ctr = np.arange(1000, 1000 + B, dtype=np.uint64)
    out = _core.sample(logits, ctr, temperature=temperature, top_k=top_k, top_p=top_p, seed=seed)
    assert out.dtype == np.int32 and out.shape == (B,)
    checked = 0
    for b in range(B):
        tok, margin = sample_ref(logits[b], temperature, top_k, top_p, uniform_ref(seed, 1000 + b))
        if margin > 1e-5:  # exp may differ by an ulp between libm and numpy: skip knife edges
            assert out[b] == tok, b
            checked += 1
    assert checked > B // 2


# cpu/sample.h's blocked order at V > kSampleBlock, against a step-by-step numpy float32 transcription
# with glibc's expf itself (ctypes), so the reference's every rounding is the spec's and the
# tokens must be equal, with no knife edges to skip.

SAMPLE_BLOCK = 512  # cpu/sample.h kSampleBlock


def _glibc_expf():
    import ctypes
    import ctypes.util

    name = ctypes.util.find_library("m")
    try:
        libm = ctypes.CDLL(name)
        fn = libm.expf
        fn.restype, fn.argtypes = ctypes.c_float, [ctypes.c_float]
        ctypes.CDLL(None).gnu_get_libc_version  # glibc only: AttributeError elsewhere
    except (OSError, AttributeError, TypeError):
        pytest.skip("the spec's exp is glibc's expf; no glibc here")
    return lambda x: np.array([fn(float(v)) for v in x], np.float32)


def blocked_running(t, block=SAMPLE_BLOCK):
    """cpu/sample.h's blocked order over t (float32): (c [n], the sum). W = left-to-right sums inside
    each block, P = left-to-right sums of the block sums, c_i = P_b + W_i."""
    f = np.float32
    t = np.asarray(t, f)
    c = np.empty(len(t), f)
    P = f(0.0)
    for lo in range(0, len(t), block):
        W = np.cumsum(t[lo:lo + block], dtype=f)  # numpy's cumsum is sequential
        c[lo:lo + block] = P + W
        P = f(P + W[-1])
    return c, P


def sequential_running(t):
    """The old order (one running sum left to right), to show the tests tell them apart."""
    c = np.cumsum(np.asarray(t, np.float32), dtype=np.float32)
    return c, c[-1]


class BlockedRef:
    """cpu/sample.h's sample of one row up to the draw; draw(u) gives (token, sorted position)."""

    def __init__(self, row, temperature, top_k, top_p, expf, running=blocked_running):
        f = np.float32
        V = len(row)
        self.token = None
        z = row.astype(f) / f(temperature)
        finite_z = z[~np.isnan(z)]
        m = finite_z.max() if finite_z.size else f(-np.inf)
        with np.errstate(invalid="ignore"):
            e = expf(z - m)
        s = running(e)[1]
        if not (s > 0) or not np.isfinite(s):  # no distribution: the CPU's argmax
            best = 0
            for i in range(1, V):
                if row[i] > row[best]:
                    best = i
            self.token = best
            return
        p = e / s
        order = np.lexsort((np.arange(V), -p))  # p desc, id asc
        k = V if top_k <= 0 or top_k > V else top_k
        self.kept = order[:k]
        mk = running(p[self.kept])[1]
        self.q = p[self.kept] / mk
        self.c, self.mass = running(self.q)
        self.n = k
        if top_p < 1.0:
            hit = np.flatnonzero(self.c >= f(top_p))
            if hit.size:
                self.n, self.mass = int(hit[0]) + 1, self.c[hit[0]]

    def draw(self, u):
        if self.token is not None:
            return self.token, -1
        r = np.float32(u) * self.mass
        hit = np.flatnonzero(self.c[:self.n] > r)
        if hit.size:
            return int(self.kept[hit[0]]), int(hit[0])
        pos = np.flatnonzero(self.q[:self.n] > 0)
        j = int(pos[-1]) if pos.size else 0
        return int(self.kept[j]), j


def uniform_np(seed, counters):
    """uniform_ref over a uint64 array (numpy's uint64 arithmetic wraps modulo 2^64)."""
    g = np.uint64(GOLDEN)
    with np.errstate(over="ignore"):
        z = np.uint64(seed) ^ (g * (counters.astype(np.uint64) + np.uint64(1)))
        z = z + g
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    z ^= z >> np.uint64(31)
    return (z >> np.uint64(40)).astype(np.float64) / float(1 << 24)


@pytest.mark.parametrize("V", [3000, 4096, 5001])
@pytest.mark.parametrize("temperature,top_k,top_p", [(1.0, 0, 1.0), (0.8, 0, 0.9),
                                                     (1.0, 2000, 0.95), (1.2, 700, 1.0),
                                                     (0.6, 1500, 0.8), (1.0, 512, 1.0),
                                                     (1.0, 513, 0.99)])
def test_sample_blocked_order_matches_reference(V, temperature, top_k, top_p):
    # Flat-ish rows over several blocks: the top-p cut and the draws land in later blocks.
    expf = _glibc_expf()
    r = rng(V + top_k)
    B, seed = 10, 31
    logits = randn(r, B, V, scale=0.4)
    ctr = np.arange(B, dtype=np.uint64) * np.uint64(5) + np.uint64(11)
    out = _core.sample(logits, ctr, temperature=temperature, top_k=top_k, top_p=top_p, seed=seed)
    us = uniform_np(seed, ctr)
    late_cut = late_draw = 0
    for b in range(B):
        ref = BlockedRef(logits[b], temperature, top_k, top_p, expf)
        tok, pos = ref.draw(us[b])
        assert out[b] == tok, b
        late_cut += ref.n - 1 >= SAMPLE_BLOCK
        late_draw += pos >= SAMPLE_BLOCK
    if top_k not in (512, 513):  # kept entries past block 0: the cut and some draws land there
        assert late_cut == B and late_draw > 0


def test_sample_blocked_order_tail_row():
    # One large entry then 4095 tiny equal ones, each below half an ulp of a running sum near 1:
    # left to right they would vanish (c stuck at 1.0, the token always id 0), but each later
    # block sums its own tiny terms from 0, so c climbs through blocks 1..7 (by ~1.3e-5 each).
    # The top-p cut and the draws with u near 1 (searched counters) land there.
    expf = _glibc_expf()
    V, seed = 4096, 3
    row = np.full(V, -17.5, np.float32)
    row[0] = 0.0
    ctr_all = np.arange(1 << 20, dtype=np.uint64)
    us_all = uniform_np(seed, ctr_all)
    for top_k, top_p in [(0, 1.0), (0, 0.99996), (3000, 1.0)]:
        ref = BlockedRef(row, 1.0, top_k, top_p, expf)
        seq = BlockedRef(row, 1.0, top_k, top_p, expf, running=sequential_running)
        # counters whose u * M falls past c at the end of block 0
        tail_u = ref.c[SAMPLE_BLOCK - 1] / ref.mass
        pick = np.flatnonzero(us_all > tail_u)[:12]
        assert pick.size >= 4
        ctr = np.concatenate([ctr_all[pick], ctr_all[:4]])
        out = _core.sample(np.repeat(row[None], len(ctr), axis=0), ctr, temperature=1.0,
                           top_k=top_k, top_p=top_p, seed=seed)
        want = [ref.draw(u) for u in uniform_np(seed, ctr)]
        np.testing.assert_array_equal(out, [t for t, _ in want])
        assert all(pos >= SAMPLE_BLOCK for _, pos in want[:pick.size])
        assert any(out[i] != seq.draw(u)[0] for i, u in enumerate(uniform_np(seed, ctr)))
        if top_p < 1.0:
            assert ref.n - 1 >= SAMPLE_BLOCK and seq.n == 1


def test_sample_top_p_one_keeps_the_entries_past_a_running_sum_of_one():
    # top_p = 1.0 filters nothing (cpu/sample.h: the cut needs top_p < 1). In this row the
    # blocked running sum of q reaches 1.0 at sorted position 4091 and ends at 1.0000001, so a
    # cut there (top_p <= 1 taken as a filter) would shrink M and move the draws of u near 1:
    # the counters below (found by search over uniform_ref) give u = 1 - j * 2**-24, j = 1..5.
    expf = _glibc_expf()
    V, seed = 4096, 3
    row = np.full(V, -17.25, np.float32)
    row[0] = 0.0
    ref = BlockedRef(row, 1.0, 0, 1.0, expf)
    first_one = int(np.flatnonzero(ref.c >= np.float32(1.0))[0])
    assert first_one < V - 1 and ref.mass > ref.c[first_one]  # the row exercises the boundary
    ctr = np.array([670186, 8341893, 8816860, 12683273, 14889096, 0, 1], np.uint64)
    us = uniform_np(seed, ctr)
    assert np.all(us[:5] >= 1 - 5 / 2**24)
    out = _core.sample(np.repeat(row[None], len(ctr), axis=0), ctr, temperature=1.0, top_k=0,
                       top_p=1.0, seed=seed)
    want = [ref.draw(u)[0] for u in us]
    np.testing.assert_array_equal(out, want)
    assert any(t > first_one for t in want)  # a draw past the would-be cut


def test_sample_blocked_order_degenerate_rows():
    # Rows without a distribution take the argmax; one finite entry or all equal entries still
    # go through the blocked sums (p = 1 / V each over 6 blocks).
    expf = _glibc_expf()
    V, seed = 3000, 8
    rows = np.zeros((6, V), np.float32)
    rows[0, :] = 1.5                          # all equal: p = 1/V, ids in order, c blocked
    rows[1, :] = -np.inf
    rows[1, 2900] = 0.25                      # a single finite entry, in a later block: drawn
    rows[2, :] = -np.inf                      # all -inf: no distribution, argmax = 0
    rows[3] = randn(rng(9), V)
    rows[3, 0] = np.nan                       # NaN at id 0: argmax keeps 0
    rows[4] = randn(rng(10), V)
    rows[4, 7] = np.nan                       # NaN elsewhere: argmax of the rest
    rows[5] = randn(rng(11), V)
    rows[5, 2222] = np.inf                    # +inf: argmax = the inf
    ctr = np.array([900, 901, 902, 903, 904, 905], np.uint64)
    us = uniform_np(seed, ctr)
    for kw in (dict(top_k=0, top_p=1.0), dict(top_k=2000, top_p=0.7)):
        out = _core.sample(rows, ctr, temperature=0.9, seed=seed, **kw)
        want = [BlockedRef(rows[b], 0.9, kw["top_k"], kw["top_p"], expf).draw(us[b])[0]
                for b in range(len(rows))]
        np.testing.assert_array_equal(out, want)
        assert out[1] == 2900 and out[2] == 0 and out[3] == 0 and out[5] == 2222
        assert out[4] == np.nanargmax(rows[4])
    # All equal: the token is the draw's position (ids in order), over several blocks.
    ctr = np.arange(64, dtype=np.uint64)
    out = _core.sample(np.repeat(rows[:1], 64, axis=0), ctr, temperature=1.0, seed=seed)
    ref = BlockedRef(rows[0], 1.0, 0, 1.0, expf)
    np.testing.assert_array_equal(out, [ref.draw(u)[0] for u in uniform_np(seed, ctr)])
    assert (out >= SAMPLE_BLOCK).sum() > 32


def test_sample_greedy_and_degenerate_filters():
    r = rng(6)
    B, V = 9, 40
    logits = randn(r, B, V)
    logits[:, 3] = logits[:, 17] = 9.0  # ties at the top go to the lower id
    ctr = np.arange(B, dtype=np.int64)
    greedy = _core.sample(logits, ctr, temperature=0.0)
    assert greedy.tolist() == [3] * B
    assert _core.sample(logits, ctr, temperature=1.0, top_k=1).tolist() == [3] * B
    assert _core.sample(logits, ctr, temperature=1.0, top_p=1e-7).tolist() == [3] * B
    a = _core.sample(logits, ctr, temperature=1.0, seed=5)
    b = _core.sample(logits, ctr, temperature=1.0, seed=5)
    np.testing.assert_array_equal(a, b)


def test_sample_histogram():
    logits = np.array([[1.0, 0.0, 2.0, -1.0, 0.5]], np.float32)
    p = np.exp(logits[0] / 0.8)
    p /= p.sum()
    n = 20000
    toks = np.array([_core.sample(logits, np.array([c], np.uint64), temperature=0.8, seed=9)[0]
                     for c in range(n)])
    freq = np.bincount(toks, minlength=5) / n
    np.testing.assert_allclose(freq, p, atol=5 * np.sqrt(p * (1 - p) / n).max())


def test_sample_contract_errors():
    r = rng(7)
    logits = randn(r, 3, 10)
    ctr = np.arange(3, dtype=np.uint64)
    expect_contract(S.CONTRACT_DTYPE, _core.sample, logits.astype(np.float64), ctr,
                    temperature=1.0)
    expect_contract(S.CONTRACT_DTYPE, _core.sample, logits, ctr.astype(np.int32), temperature=1.0)
    expect_contract(S.CONTRACT_SHAPE, _core.sample, logits, ctr[:2], temperature=1.0)
    expect_contract(S.CONTRACT_SHAPE, _core.sample, logits[0], ctr[:1], temperature=1.0)
    expect_contract(S.CONTRACT_STRIDE, _core.sample, randn(r, 3, 20)[:, ::2], ctr, temperature=1.0)
    expect_contract(S.CONTRACT_STRIDE, _core.sample, logits, np.arange(6, dtype=np.uint64)[::2],
                    temperature=1.0)
    expect_contract(S.CONTRACT_RANGE, _core.sample, logits, np.array([0, -1, 2], np.int64),
                    temperature=1.0)
    expect_contract(S.CONTRACT_VALUE, _core.sample, logits, ctr, temperature=1.0, top_p=0.0)


# ---------------------------------------------------------------- non-finite flags


def nonfinite_rows(r, V):
    """Rows [B, V]: NaN, +inf, -inf each at the first, a middle and the last id (flag 1), then
    finite rows, one with values near +-FLT_MAX (flag 0)."""
    rows, want = [], []
    for v in (np.nan, np.inf, -np.inf):
        for at in (0, V // 2, V - 1):
            x = randn(r, V, scale=3.0)
            x[at] = v
            rows.append(x)
            want.append(1)
    for i in range(3):
        x = randn(r, V, scale=3.0)
        if i == 1:
            x[0], x[-1] = 3.0e38, -3.0e38
        rows.append(x)
        want.append(0)
    return np.stack(rows).astype(np.float32), np.array(want, np.int32)


@pytest.mark.parametrize("V", [1, 7, 1100])
@pytest.mark.parametrize("temperature,top_k,top_p", [(0.0, 0, 1.0), (1.0, 0, 1.0), (0.7, 5, 0.9)])
def test_sample_nonfinite_flags(V, temperature, top_k, top_p):
    r = rng(V)
    logits, want = nonfinite_rows(r, V)
    B = len(logits)
    ctr = np.arange(B, dtype=np.uint64) * np.uint64(5)
    seeds = np.arange(100, 100 + B, dtype=np.uint64)
    for kw in (dict(seed=3), dict(seeds=seeds)):
        kw.update(temperature=temperature, top_k=top_k, top_p=top_p)
        plain = _core.sample(logits, ctr, **kw)
        flags = np.full(B, -1, np.int32)
        got = _core.sample(logits, ctr, nonfinite=flags, **kw)
        np.testing.assert_array_equal(flags, want)
        np.testing.assert_array_equal(got, plain)  # the draws do not change
    flags = np.full(B, -1, np.int32)
    _core.sample(logits[:0], ctr[:0], temperature=temperature, nonfinite=flags[:0])  # no rows
    np.testing.assert_array_equal(_core.sample(logits[B - 3:], ctr[:3], temperature=temperature,
                                               nonfinite=flags[:3]), _core.sample(logits[B - 3:], ctr[:3],
                                                                                  temperature=temperature))
    assert (flags[:3] == 0).all() and (flags[3:] == -1).all()


def test_sample_nonfinite_contract_errors():
    r = rng(8)
    logits = randn(r, 3, 10)
    ctr = np.arange(3, dtype=np.uint64)
    flags = np.full(3, -1, np.int32)
    expect_contract(S.CONTRACT_DTYPE, _core.sample, logits, ctr, temperature=1.0,
                    nonfinite=np.zeros(3, np.int64))
    expect_contract(S.CONTRACT_DTYPE, _core.sample, logits, ctr, temperature=1.0, nonfinite="x")
    expect_contract(S.CONTRACT_SHAPE, _core.sample, logits, ctr, temperature=1.0,
                    nonfinite=np.zeros(2, np.int32))
    expect_contract(S.CONTRACT_SHAPE, _core.sample, logits, ctr, temperature=1.0,
                    nonfinite=np.zeros((3, 1), np.int32))
    expect_contract(S.CONTRACT_STRIDE, _core.sample, logits, ctr, temperature=1.0,
                    nonfinite=np.zeros(6, np.int32)[::2])
    ro = np.zeros(3, np.int32)
    ro.flags.writeable = False
    expect_contract(S.CONTRACT_VALUE, _core.sample, logits, ctr, temperature=1.0, nonfinite=ro)
    expect_contract(S.CONTRACT_VALUE, _core.sample, logits, ctr, temperature=1.0, top_p=0.0,
                    nonfinite=flags)
    assert (flags == -1).all()  # nothing written on an error
