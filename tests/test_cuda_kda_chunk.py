"""The chunked (WY / UT) delta-rule form on tensor cores (cuda/kda_chunk*.cu; ``kda_scan`` /
``gdn_scan`` with ``chunked=True``, the bf16 models' prefill) against the sequential scan.

Two parts:
- CPU (no device): ``chunk_scan`` below re-implements the kernels' chunk algebra step by step
  (64-row chunks, the 16-row sub-blocks' relative decays, the block forward substitution of
  (I + A)^-1, W / U, then the state across chunks). In float64 it equals a float64 sequential
  scan to rounding, and the f32 CPU oracle (``_core.kda_scan``) to its own f32 error: the algebra
  is the scan's before any GPU is involved. Run in float32 with every matrix-product operand
  rounded to TF32 (what mma.sync m16n8k8 .tf32 sees), it gives the error the kernels should
  show, which must sit inside the tolerance the GPU tests use.
- CUDA (marked cuda): the kernels against the CPU scan on bf16-rounded inputs, the edge lengths,
  batches with their own initial states, strong decays, GDN's per-head decay with grouped heads,
  the state hand-off to the sequential decode step, and the kernels' names in the profiler.

Tolerance (derived from bf16): |got - want| <= 2^-9 * max|want| per output tensor (o and the final
state separately), 2^-9 being bf16's unit roundoff: the chunked arm may be off the f32 scan by
no more than one bf16 rounding of its largest output, the error a bf16 model already accepts by
rounding each value it stores. The inputs are bf16-rounded (as a bf16 model's would be) so the
CPU oracle sees exactly the kernel's inputs. The TF32 emulation below measures 5e-4 to 7e-4 of
max|want| (T = 65 .. 1000; under half the tolerance), while one bf16 rounding of the inputs moves
the scan's outputs by 3e-3 to 6e-3 of max|want| (the delta rule amplifies input error), several
times the TF32 arm's error; the f32 sequential scan on the GPU agrees with the CPU to ~1e-6.
"""

from __future__ import annotations


import numpy as np
import pytest

from memra import _core
from cuda_helpers import bf16_round, f32, kernel_names, rng

DK = DV = 128
C, SUB = 64, 16
REL = 2.0 ** -9  # bf16's unit roundoff, relative to the output tensor's largest magnitude


# ---------------------------------------------------------------- references (numpy)


def tf32(x):
    """x rounded to TF32 (10-bit mantissa, nearest, ties away: cvt.rna.tf32.f32), as float32."""
    b = np.ascontiguousarray(x, np.float32).view(np.uint32)
    return ((b + np.uint32(0x1000)) & np.uint32(0xFFFFE000)).view(np.float32)


def seq_scan(q, k, v, g, beta, state, scale):
    """The scan's recurrence in float64 (cpu::kda_scan's steps). q, k, g [T, H, dk]; v [T, H, dv];
    beta [T, H]; state [H, dk, dv] or None."""
    T, H, dk = q.shape
    dv = v.shape[2]
    S = np.zeros((H, dk, dv)) if state is None else state.astype(np.float64).copy()
    o = np.zeros((T, H, dv))
    for t in range(T):
        S *= np.exp(g[t].astype(np.float64))[:, :, None]
        kv = np.einsum("hk,hkv->hv", k[t].astype(np.float64), S)
        d = beta[t].astype(np.float64)[:, None] * (v[t] - kv)
        S += k[t].astype(np.float64)[:, :, None] * d[:, None, :]
        o[t] = np.einsum("hk,hkv->hv", scale * q[t].astype(np.float64), S)
    return o, S


def block_inverse(A, mm=None):
    """(I + A)^-1 for strictly lower A [64, 64] as the kernel forms it: the four 16 x 16 diagonal
    blocks by forward substitution, then the blocks below by levels I - J = 1, 2, 3. mm: the
    product each level's two steps take over their whole K (X = A_I,[J, I) T_[J, I),J, then
    -T_II X), e.g. an emulation of the kernel's mma (scripts/emulate_kda_inverse.py); None: the
    exact algebra in A's dtype, X summed block by block."""
    n = A.shape[0]
    Tm = np.zeros_like(A)
    for I in range(n // SUB):
        b = slice(I * SUB, (I + 1) * SUB)
        Ab, Tb = A[b, b], np.zeros((SUB, SUB), A.dtype)
        for i in range(SUB):
            Tb[i, i] = 1.0
            for j in range(i):
                Tb[i, j] = -np.dot(Ab[i, j:i], Tb[j:i, j])
        Tm[b, b] = Tb
    blk = lambda I: slice(I * SUB, (I + 1) * SUB)  # noqa: E731
    for d in range(1, n // SUB):
        for J in range(n // SUB - d):
            I = J + d
            if mm is None:
                X = sum(A[blk(I), blk(M)] @ Tm[blk(M), blk(J)] for M in range(J, I))
                Tm[blk(I), blk(J)] = -Tm[blk(I), blk(I)] @ X
            else:
                K = slice(J * SUB, I * SUB)
                Tm[blk(I), blk(J)] = -mm(Tm[blk(I), blk(I)], mm(A[blk(I), K], Tm[K, blk(J)]))
    return Tm


def f16(x):
    """x rounded to float16 (to nearest even; the kernels' scratch for W, KG, QG, Aqk)."""
    return np.asarray(x, np.float32).astype(np.float16).astype(np.float32)


def chunk_scan(q, k, v, g, beta, state, scale, dtype=np.float64, rnd=lambda x: x, gdn=False):
    """The kernels' chunk algebra (cuda/kda_chunk*.cu), per head and 64-row chunk; rows past T
    are zeros. dtype float64 with rnd = identity: exact algebra; float32 with rnd = tf32: the
    kernels' arithmetic (mma operands rounded to TF32, f32 accumulation; W, KG, QG and Aqk
    through their f16 scratch, which TF32 then holds exactly). gdn: g equal over the
    channels (GDN's decay broadcast), the A's formed as GDN's instantiation does (k k^T and
    q k^T, then exp(G_t - G_s) per element)."""
    T, H, dk = q.shape
    dv = v.shape[2]
    mm = lambda a, b: (rnd(a.astype(dtype)) @ rnd(b.astype(dtype))).astype(dtype)  # noqa: E731
    o = np.zeros((T, H, dv), dtype)
    S_out = np.zeros((H, dk, dv), dtype)
    for h in range(H):
        S = np.zeros((dk, dv), dtype) if state is None else state[h].astype(dtype)
        for t0 in range(0, T, C):
            L = min(C, T - t0)
            pad = lambda x: np.concatenate(  # noqa: E731
                [x[t0:t0 + L, h].astype(dtype), np.zeros((C - L,) + x.shape[2:], dtype)])
            qc, kc, vc, gc, bc = pad(q), pad(k), pad(v), pad(g), pad(beta)
            G = np.cumsum(gc, axis=0, dtype=dtype)
            Akk = np.zeros((C, C), dtype)
            Aqk = np.zeros((C, C), dtype)
            if gdn:
                d = G[:, None, 0] - G[None, :, 0]
                e = np.exp(np.where(np.tril(np.ones((C, C), bool)), d, -np.inf)).astype(dtype)
                Akk = np.tril(mm(kc, kc.T) * e, -1)
                Aqk = mm(qc, kc.T) * e
            # KDA with every g of the chunk >= -SAFE_G: one reference row r = 16 I + 8 per row
            # block for every J <= I, exp(G_t - G_r) exp(G_r - G_s) with factors <= exp(8 SAFE_G)
            safe = not gdn and float(gc.min()) >= -SAFE_G
            for I in range(C // SUB if safe else 0):
                rows = slice(I * SUB, (I + 1) * SUB)
                r = I * SUB + SUB // 2
                left = np.exp(G[rows] - G[r])
                for J in range(I + 1):
                    cols = slice(J * SUB, (J + 1) * SUB)
                    right = kc[cols] * np.exp(G[r] - G[cols])
                    kk, qk = mm(kc[rows] * left, right.T), mm(qc[rows] * left, right.T)
                    if I == J:  # the products above the diagonal are dropped
                        kk, qk = np.tril(kk, -1), np.tril(qk)
                    Akk[rows, cols], Aqk[rows, cols] = kk, qk
            for I in range(0 if gdn or safe else C // SUB):
                rows = slice(I * SUB, (I + 1) * SUB)
                # Diagonal sub-block: element by element (exponents G_t - G_s <= 0, s <= t).
                diff = G[rows][:, None, :] - G[rows][None, :, :]  # [t, s, c]
                causal = np.tril(np.ones((SUB, SUB), bool))[:, :, None]
                e = np.exp(np.where(causal, diff, -np.inf))
                kk = np.einsum("tc,sc,tsc->ts", kc[rows], kc[rows], e)
                qk = np.einsum("tc,sc,tsc->ts", qc[rows], kc[rows], e)
                Akk[rows, rows] = np.tril(kk, -1)
                Aqk[rows, rows] = np.tril(qk)
                # Below it: exp(G_t - G_r) exp(G_r - G_s), r = the sub-block's first row.
                r = I * SUB
                left = np.exp(G[rows] - G[r])
                for J in range(I):
                    cols = slice(J * SUB, (J + 1) * SUB)
                    right = kc[cols] * np.exp(G[r] - G[cols])
                    Akk[rows, cols] = mm(kc[rows] * left, right.T)
                    Aqk[rows, cols] = mm(qc[rows] * left, right.T)
            Akk *= bc[:, None]
            Aqk *= dtype(scale)
            Tm = block_inverse(Akk)
            store = f16 if rnd is tf32 else (lambda x: x)  # noqa: E731
            W = store(mm(Tm, bc[:, None] * kc * np.exp(G)))
            U = mm(Tm, bc[:, None] * vc)
            QG = store(dtype(scale) * qc * np.exp(G))
            KG = store(kc * np.exp(G[-1] - G))
            D = U - mm(W, S)
            O = mm(QG, S) + mm(store(Aqk), D)
            S = np.exp(G[-1])[:, None] * S + mm(KG.T, D)
            o[t0:t0 + L, h] = O[:L]
        S_out[h] = S
    return o, S_out


def split_scan(q, k, v, g, beta, state, scale):
    """The kernels' split in float64 (cuda/kda_chunk.cuh): the intra kernel's per-chunk tiles,
    the state kernel's chain (D = U - W S, S <- exp(G_last) S + KG^T D), writing the state
    entering each chunk and D, then the output kernel on its own: O = [QG | Aqk] [S_c ; D]."""
    T, H, dk = q.shape
    dv = v.shape[2]
    o = np.zeros((T, H, dv))
    S_out = np.zeros((H, dk, dv))
    for h in range(H):
        tiles = []  # per chunk: W, U, KG, exp(G_last), [QG | Aqk]
        for t0 in range(0, T, C):
            L = min(C, T - t0)
            pad = lambda x: np.concatenate(  # noqa: E731
                [x[t0:t0 + L, h].astype(np.float64), np.zeros((C - L,) + x.shape[2:])])
            qc, kc, vc, gc, bc = pad(q), pad(k), pad(v), pad(g), pad(beta)
            G = np.cumsum(gc, axis=0)
            causal = np.tril(np.ones((C, C)))
            E = np.exp(np.where(causal[:, :, None] > 0, G[:, None, :] - G[None, :, :], -np.inf))
            Akk = bc[:, None] * np.einsum("tc,sc,tsc->ts", kc, kc, E) * np.tril(causal, -1)
            Aqk = scale * np.einsum("tc,sc,tsc->ts", qc, kc, E)
            Tm = np.linalg.inv(np.eye(C) + Akk)
            tiles.append((Tm @ (bc[:, None] * kc * np.exp(G)), Tm @ (bc[:, None] * vc),
                          kc * np.exp(G[-1] - G), np.exp(G[-1]),
                          np.concatenate([scale * qc * np.exp(G), Aqk], axis=1), L))
        S = np.zeros((dk, dv)) if state is None else state[h].astype(np.float64)
        bops = []
        for W, U, KG, El, _, _ in tiles:  # the sequential chain
            D = U - W @ S
            bops.append(np.concatenate([S, D], axis=0))
            S = El[:, None] * S + KG.T @ D
        S_out[h] = S
        for c, ((*_, A, L), Bm) in enumerate(zip(tiles, bops)):  # every chunk independently
            o[c * C:c * C + L, h] = (A @ Bm)[:L]
    return o, S_out


def inputs(T, H=2, B=None, seed=0, strong=False, with_state=True, gdn_heads=None):
    """bf16-rounded scan inputs: q, k L2-normalised; g per channel (KDA) or, with
    gdn_heads=(Hk, Hv), GDN's per-value-head decay and key heads Hk. strong: decays of -8..-30
    per step (exp(-G) overflows f32 within a chunk)."""
    r = rng(seed)
    lead = (T,) if B is None else (B, T)
    Hq = H if gdn_heads is None else gdn_heads[0]
    Hv = H if gdn_heads is None else gdn_heads[1]

    def unit(shape):
        x = r.standard_normal(shape)
        return bf16_round(x / np.sqrt((x * x).sum(-1, keepdims=True) + 1e-6))

    q, k = unit(lead + (Hq, DK)), unit(lead + (Hq, DK))
    v = bf16_round(r.standard_normal(lead + (Hv, DV)))
    gshape = lead + ((Hv, DK) if gdn_heads is None else (Hv,))
    if strong:
        g = bf16_round(-r.uniform(8.0, 30.0, gshape))
    else:  # glm5_next's lower-bound gate: -5 sigmoid(.), with many near-zero decays
        g = bf16_round(-5.0 / (1.0 + np.exp(-2.0 * r.standard_normal(gshape) + 2.0)))
    beta = bf16_round(1.0 / (1.0 + np.exp(-r.standard_normal(lead + (Hv,)))))
    slead = (Hv,) if B is None else (B, Hv)
    state = f32(0.3 * r.standard_normal(slead + (DK, DV))) if with_state else None
    return q, k, v, g, beta, state


def err_rel(got, want):
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    return float(np.abs(got - want).max()) / max(float(np.abs(want).max()), 1e-30)


def assert_close(got, want, rel=REL, what=""):
    assert np.all(np.isfinite(got)), what
    e = err_rel(got, want)
    assert e <= rel, f"{what}: max|d| / max|want| = {e:.3g} > {rel:.3g}"


SCALE = DK ** -0.5
SAFE_G = 5.5  # cuda/kda_chunk_intra.cu's kSafeG


# ---------------------------------------------------------------- CPU: the algebra


@pytest.mark.parametrize("T", [1, 2, 17, 63, 64, 65, 100, 200])
@pytest.mark.parametrize("strong", [False, True])
def test_chunk_algebra_equals_the_scan_in_float64(T, strong):
    q, k, v, g, beta, state = inputs(T, seed=T, strong=strong)
    o, s = chunk_scan(q, k, v, g, beta, state, SCALE)
    ro, rs = seq_scan(q, k, v, g, beta, state, SCALE)
    assert err_rel(o, ro) < 1e-12 and err_rel(s, rs) < 1e-12
    # and the f32 CPU oracle, to its own f32 rounding
    co, cs = _core.kda_scan(q, k, v, g, beta, state)
    assert err_rel(co, o) < 1e-5 and err_rel(cs, s) < 1e-5


@pytest.mark.parametrize("T", [1, 63, 64, 65, 200])
def test_the_kernel_split_equals_the_scan_in_float64(T):
    q, k, v, g, beta, state = inputs(T, seed=100 + T, strong=T == 200)
    o, s = split_scan(q, k, v, g, beta, state, SCALE)
    ro, rs = seq_scan(q, k, v, g, beta, state, SCALE)
    assert err_rel(o, ro) < 1e-10 and err_rel(s, rs) < 1e-10


def test_chunk_algebra_gdn_grouped_heads_in_float64():
    Hk, Hv, T = 2, 4, 130
    q, k, v, g, beta, state = inputs(T, seed=7, gdn_heads=(Hk, Hv))
    rep = Hv // Hk  # value head h reads key head h // rep
    qe, ke = np.repeat(q, rep, axis=1), np.repeat(k, rep, axis=1)
    ge = np.repeat(g[:, :, None], DK, axis=2)
    o, s = chunk_scan(qe, ke, v, ge, beta, state, SCALE)
    co, cs = _core.gdn_scan(q, k, v, g, beta, state)
    assert err_rel(co, o) < 1e-5 and err_rel(cs, s) < 1e-5


@pytest.mark.parametrize("T,strong", [(1, False), (129, False), (200, True)])
def test_gdn_instantiation_algebra_and_tf32_error(T, strong):
    # GDN's A's as plain products scaled per element: exact in float64, and in the TF32
    # emulation inside half the GPU tolerance against the f32 CPU oracle.
    Hk, Hv = 1, 2
    q, k, v, g, beta, state = inputs(T, seed=1200 + T, strong=strong, gdn_heads=(Hk, Hv))
    qe, ke = np.repeat(q, Hv // Hk, axis=1), np.repeat(k, Hv // Hk, axis=1)
    ge = np.repeat(g[:, :, None], DK, axis=2)
    o, s = chunk_scan(qe, ke, v, ge, beta, state, SCALE, gdn=True)
    ro, rs = seq_scan(qe, ke, v, ge, beta, state, SCALE)
    assert err_rel(o, ro) < 1e-12 and err_rel(s, rs) < 1e-12
    o, s = chunk_scan(qe, ke, v, ge, beta, state, SCALE, dtype=np.float32, rnd=tf32, gdn=True)
    co, cs = _core.gdn_scan(q, k, v, g, beta, state)
    assert max(err_rel(o, co), err_rel(s, cs)) < REL / 2


def test_strong_decays_overflow_the_split_exponent_but_not_the_chunk_form():
    # exp(-G) alone (G the chunk's cumulative log decay) overflows f32 within one chunk at these
    # decays; the relative form never evaluates a positive exponent.
    q, k, v, g, beta, state = inputs(64, seed=3, strong=True)
    G = np.cumsum(g.astype(np.float32), axis=0)
    with np.errstate(over="ignore"):
        assert np.isinf(np.exp(-G)).any()
    o, s = chunk_scan(q, k, v, g, beta, state, SCALE, dtype=np.float32, rnd=tf32)
    assert np.all(np.isfinite(o)) and np.all(np.isfinite(s))


@pytest.mark.parametrize("T,strong", [(65, False), (200, False), (200, True), (1000, False)])
def test_tf32_emulation_sits_inside_the_gpu_tolerance(T, strong):
    # The kernels' arithmetic (f32, TF32 operands) against the f32 CPU oracle: the GPU tests'
    # tolerance must hold with margin (the GPU's other difference is the order of the sums).
    q, k, v, g, beta, state = inputs(T, H=1, seed=40 + T, strong=strong)
    o, s = chunk_scan(q, k, v, g, beta, state, SCALE, dtype=np.float32, rnd=tf32)
    co, cs = _core.kda_scan(q, k, v, g, beta, state)
    err = max(err_rel(o, co), err_rel(s, cs))
    assert err < REL / 2, err
    # What one bf16 rounding of the inputs does to the scan (each of q, k, v, beta moved by
    # bf16's unit roundoff, random sign): several times the TF32 arm's error.
    r = rng(T)

    def nudge(x):
        return f32(x * (1.0 + REL * r.choice([-1.0, 1.0], x.shape)))

    po, ps = _core.kda_scan(nudge(q), nudge(k), nudge(v), g, nudge(beta), state)
    assert max(err_rel(po, co), err_rel(ps, cs)) > 4 * err


# ---------------------------------------------------------------- CUDA


def scan_dev(e, q, k, v, g, beta, state=None, **kw):
    dev = [e.to_device(a) for a in (q, k, v, g, beta)]
    ds = None if state is None else e.to_device(state)
    o, s = _core.kda_scan(*dev, ds, engine=e, **kw)
    return e.to_host(o), e.to_host(s)


def gdn_dev(e, q, k, v, g, beta, state=None, **kw):
    dev = [e.to_device(a) for a in (q, k, v, g, beta)]
    ds = None if state is None else e.to_device(state)
    o, s = _core.gdn_scan(*dev, ds, engine=e, **kw)
    return e.to_host(o), e.to_host(s)


@pytest.mark.cuda
@pytest.mark.parametrize("T", [1, 2, 63, 64, 65, 100, 1000, 4097])
@pytest.mark.parametrize("with_state", [False, True])
def test_chunked_matches_the_cpu_scan(e, T, with_state):
    H = 2 if T > 1000 else 3
    q, k, v, g, beta, state = inputs(T, H=H, seed=T, with_state=with_state)
    o, s = scan_dev(e, q, k, v, g, beta, state, chunked=True)
    co, cs = _core.kda_scan(q, k, v, g, beta, state)
    assert_close(o, co, what=f"o T={T}")
    assert_close(s, cs, what=f"state T={T}")
    # and the sequential CUDA arm (the f32 path), which sits within 1e-5 of the CPU
    go, gs = scan_dev(e, q, k, v, g, beta, state)
    assert_close(o, go, what=f"o vs the CUDA scan T={T}")
    assert_close(s, gs, what=f"state vs the CUDA scan T={T}")


@pytest.mark.cuda
@pytest.mark.parametrize("T", [65, 130])
def test_chunked_batch_with_own_states(e, T):
    q, k, v, g, beta, state = inputs(T, H=2, B=3, seed=500 + T)
    o, s = scan_dev(e, q, k, v, g, beta, state, chunked=True, batch=True)
    co, cs = _core.kda_scan(q, k, v, g, beta, state, batch=True)
    assert_close(o, co, what="o")
    assert_close(s, cs, what="state")
    for b in range(3):  # each sequence as its own call
        ob, sb = scan_dev(e, q[b], k[b], v[b], g[b], beta[b], state[b], chunked=True)
        assert_close(ob, co[b], what=f"o[{b}]")
        assert_close(sb, cs[b], what=f"state[{b}]")


@pytest.mark.cuda
def test_chunked_many_heads_take_the_state_kernels_column_halves(e):
    # The state kernel runs a warpgroup per half of a head's columns: 80 heads are 160 blocks,
    # more than an H100 / H200 has SMs (a second wave), and columns 64-127 of every head.
    q, k, v, g, beta, state = inputs(130, H=80, seed=450)
    o, s = scan_dev(e, q, k, v, g, beta, state, chunked=True)
    co, cs = _core.kda_scan(q, k, v, g, beta, state)
    assert_close(o, co, what="o")
    assert_close(s, cs, what="state")


@pytest.mark.cuda
@pytest.mark.parametrize("T,H,kind", [(130, 2, "tiny"), (130, 2, "huge"), (200, 2, "alternating"),
                                      (130, 80, "alternating")])
def test_chunked_keeps_each_state_columns_own_precision(e, T, H, kind):
    # The state kernel rounds S and D to f16 after scaling each state column by a power of two
    # (cuda/kda_chunk_state.cu). Value columns scaled by 1e-30 (all), by 1e36 (all: rows of S
    # and D near and past 2^118, where a scale clamped at 2^-100 overflowed f16), or by 1e-12
    # and 1e12 in a pattern that gives the two columns a thread holds (v0 + 2 g, v0 + 2 g + 1)
    # different magnitudes, 24 decades apart inside every warp's 16 columns. Each output and
    # state column is linear in its own v and state column, so every column must keep the
    # relative precision of its own largest magnitude, which no scaling, one scale per warp or
    # per thread, or a clamped scale would lose. H = 80 fills more than one wave of blocks.
    q, k, v, g, beta, state = inputs(T, H=H, seed=800 + T + H)
    c = np.arange(DV)
    mag = {"tiny": np.full(DV, 1e-30), "huge": np.full(DV, 1e36),
           "alternating": np.where(((c >> 3) ^ c) & 1, 1e12, 1e-12)}[kind].astype(np.float32)
    v, state = f32(v * mag), f32(state * mag)
    o, s = scan_dev(e, q, k, v, g, beta, state, chunked=True)
    co, cs = _core.kda_scan(q, k, v, g, beta, state)
    for got, want, what in ((o, co, "o"), (s, cs, "state")):
        assert np.all(np.isfinite(got)), what
        for col in range(DV):
            d = np.abs(got[..., col].astype(np.float64) - want[..., col]).max()
            ref = np.abs(want[..., col].astype(np.float64)).max()
            assert ref > 0 and d <= REL * ref, f"{what} column {col} (x {mag[col]:.3g}): {d / ref:.3g}"


@pytest.mark.cuda
@pytest.mark.parametrize("T", [64, 200])
def test_chunked_strong_decays_stay_finite_and_close(e, T):
    q, k, v, g, beta, state = inputs(T, H=2, seed=600 + T, strong=True)
    o, s = scan_dev(e, q, k, v, g, beta, state, chunked=True)
    co, cs = _core.kda_scan(q, k, v, g, beta, state)
    assert_close(o, co, what="o")
    assert_close(s, cs, what="state")


def mixed_inputs(T=200, H=2, seed=650):
    """Default decays, except one chunk (rows 64..127) of strong ones and one row of g = -6:
    chunks 0 and 3 take the intra kernel's safe path (every g >= -5.5), chunks 1 and 2 the
    element-wise diagonal."""
    q, k, v, g, beta, state = inputs(T, H=H, seed=seed)
    _, _, _, gs, _, _ = inputs(T, H=H, seed=seed + 1, strong=True)
    g = g.copy()
    g[64:128] = gs[64:128]
    g[150, 0, 5] = -6.0
    return q, k, v, g, beta, state


def test_mixed_safe_chunks_tf32_emulation():
    q, k, v, g, beta, state = mixed_inputs()
    o, s = chunk_scan(q, k, v, g, beta, state, SCALE)
    ro, rs = seq_scan(q, k, v, g, beta, state, SCALE)
    assert err_rel(o, ro) < 1e-12 and err_rel(s, rs) < 1e-12
    o, s = chunk_scan(q, k, v, g, beta, state, SCALE, dtype=np.float32, rnd=tf32)
    co, cs = _core.kda_scan(q, k, v, g, beta, state)
    assert max(err_rel(o, co), err_rel(s, cs)) < REL / 2


@pytest.mark.cuda
def test_chunked_mixed_safe_and_strong_chunks(e):
    q, k, v, g, beta, state = mixed_inputs()
    o, s = scan_dev(e, q, k, v, g, beta, state, chunked=True)
    co, cs = _core.kda_scan(q, k, v, g, beta, state)
    assert_close(o, co, what="o")
    assert_close(s, cs, what="state")


@pytest.mark.cuda
@pytest.mark.parametrize("T", [1, 65, 300])
def test_chunked_gdn_grouped_heads(e, T):
    q, k, v, g, beta, state = inputs(T, seed=700 + T, gdn_heads=(2, 4))
    o, s = gdn_dev(e, q, k, v, g, beta, state, chunked=True)
    co, cs = _core.gdn_scan(q, k, v, g, beta, state)
    assert_close(o, co, what="o")
    assert_close(s, cs, what="state")


@pytest.mark.cuda
@pytest.mark.parametrize("T", [1, 63, 129, 333])
def test_chunked_gdn_batch_in_place(e, T):
    # GDN's chunked form reads key head h // 2 and the per-head decay in place (no expansion):
    # two sequences with their own states, Hv = 2 Hk, odd lengths, against the CPU scan.
    q, k, v, g, beta, state = inputs(T, B=2, seed=1000 + T, gdn_heads=(2, 4))
    o, s = gdn_dev(e, q, k, v, g, beta, state, chunked=True, batch=True)
    co, cs = _core.gdn_scan(q, k, v, g, beta, state, batch=True)
    assert_close(o, co, what=f"o T={T}")
    assert_close(s, cs, what=f"state T={T}")
    # and the sequential CUDA arm over the expanded heads
    go, gs = gdn_dev(e, q, k, v, g, beta, state, batch=True)
    assert_close(o, go, what=f"o vs the CUDA scan T={T}")
    assert_close(s, gs, what=f"state vs the CUDA scan T={T}")


@pytest.mark.cuda
def test_chunked_gdn_strong_decays_in_place(e):
    q, k, v, g, beta, state = inputs(200, seed=1100, strong=True, gdn_heads=(1, 3))
    o, s = gdn_dev(e, q, k, v, g, beta, state, chunked=True)
    co, cs = _core.gdn_scan(q, k, v, g, beta, state)
    assert_close(o, co, what="o")
    assert_close(s, cs, what="state")


@pytest.mark.cuda
@pytest.mark.parametrize("T", [64, 100])
def test_chunked_prefill_state_continues_in_the_decode_step(e, T):
    # The chunked prefill's state, in the scan's layout, feeds the sequential one-step kernel.
    q, k, v, g, beta, state = inputs(T + 1, H=2, seed=800 + T)
    head, tail = slice(0, T), slice(T, T + 1)
    dev = lambda a: e.to_device(a)  # noqa: E731
    _, s_mid = _core.kda_scan(*(dev(a[head]) for a in (q, k, v, g, beta)), dev(state),
                              engine=e, chunked=True)
    o1, s1 = _core.kda_scan(*(dev(a[tail]) for a in (q, k, v, g, beta)), s_mid, engine=e)
    co, cs = _core.kda_scan(q, k, v, g, beta, state)
    assert_close(e.to_host(o1), co[tail], what="decode o")
    assert_close(e.to_host(s1), cs, what="decode state")


def cuda_kernels(e, tmp_path, fn):
    return " ".join(kernel_names(lambda: (fn(), e.synchronize()), tmp_path / "trace.json"))


@pytest.mark.cuda
def test_the_chunked_kernels_ran(e, tmp_path):
    q, k, v, g, beta, state = inputs(130, H=2, seed=900)
    dev = [e.to_device(a) for a in (q, k, v, g, beta, state)]
    chunked = cuda_kernels(e, tmp_path, lambda: _core.kda_scan(*dev, engine=e, chunked=True))
    for name in ("chunk_intra_kernel", "chunk_state_kernel"):
        assert name in chunked, chunked
    assert "scan_kernel" not in chunked.replace("chunk_", ""), chunked
    plain = cuda_kernels(e, tmp_path, lambda: _core.kda_scan(*dev, engine=e))
    assert "scan_kernel" in plain and "chunk_intra_kernel" not in plain, plain
    # GDN's chunked form: the same kernels on its heads in place, no expansion
    q, k, v, g, beta, state = inputs(130, seed=901, gdn_heads=(2, 4))
    dev = [e.to_device(a) for a in (q, k, v, g, beta, state)]
    gdn = cuda_kernels(e, tmp_path, lambda: _core.gdn_scan(*dev, engine=e, chunked=True))
    for name in ("chunk_intra_kernel", "chunk_state_kernel"):
        assert name in gdn, gdn
    assert "gdn_expand_kernel" not in gdn and "scan_kernel" not in gdn.replace("chunk_", ""), gdn
