"""The full-attention ops (memra._core.rope_inv_freq, attn_prep, kv_append, attention) on the CPU
against float64 numpy transcriptions of transformers 5.17 models/qwen3_5/modeling_qwen3_5.py:

* ``ref_prep``: Qwen3_5Attention.forward up to apply_rotary_pos_emb: torch.chunk of q_proj's output
  viewed [T, H, 2 * hd] (query, then gate), Qwen3_5RMSNorm (x * rsqrt(mean(x^2) + eps) * (1 + w),
  here the weight passed as is), apply_rotary_pos_emb with rotate_half over the first rotary_dim
  dims (cos / sin = cat(freqs, freqs), freqs = inv_freq * position in float32, as
  Qwen3_5TextRotaryEmbedding computes them for text-only positions).
* ``ref_attention``: eager_attention_forward with repeat_kv (query head h reads K/V head
  h // (Hq / Hkv)), a causal mask, then attn_output * sigmoid(gate).

numpy only: CI has neither torch nor transformers (the comparison with transformers' own modules
is tests/test_attention_layer.py, live where transformers is installed, frozen otherwise).
Tolerances: |got - want| <= 2e-6 * max|want| (f32 sums against float64).
"""

from __future__ import annotations

from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

import memra
from memra import _core

S = _core.status
TOL = 2e-6


def rng(seed):
    return np.random.default_rng(seed)


def f32(a):
    return np.ascontiguousarray(a, dtype=np.float32)


def close(got, want, rel=TOL):
    assert got.shape == want.shape and got.dtype == np.float32
    assert np.isfinite(got).all()
    scale = max(float(np.abs(want).max()), 1e-30)
    err = float(np.abs(got.astype(np.float64) - want).max())
    assert err <= rel * scale, f"max |d| = {err:.3g} > {rel:g} * {scale:.3g}"


# ---------------------------------------------------------------- references (float64)


def ref_inv_freq_f32(theta, dim):
    """compute_default_rope_parameters in torch's float32 arithmetic: base as f32, the exponent an
    f32 division, the power rounded once, the reciprocal an f32 division."""
    e = np.arange(0, dim, 2, dtype=np.float32) / np.float32(dim)
    p = np.power(np.float64(np.float32(theta)), e.astype(np.float64)).astype(np.float32)
    return (np.float32(1.0) / p).astype(np.float32)


def rms(x, w, eps):
    x = x.astype(np.float64)
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w.astype(np.float64)


def ref_rope(x, positions, inv_freq, rot):
    """apply_rotary_pos_emb over the first `rot` dims of x [T, H, hd] (float64 products; the angle
    float32(position) * inv_freq rounded to float32 as the reference's freqs)."""
    if rot == 0:
        return x
    freqs = (np.float32(1.0) * positions.astype(np.float32)[:, None] * inv_freq[None, :]).astype(np.float32)
    emb = np.concatenate([freqs, freqs], -1).astype(np.float64)
    cos, sin = np.cos(emb)[:, None, :], np.sin(emb)[:, None, :]
    xr, xp = x[..., :rot], x[..., rot:]
    half = rot // 2
    rotated = np.concatenate([-xr[..., half:], xr[..., :half]], -1)
    return np.concatenate([xr * cos + rotated * sin, xp], -1)


def ref_prep(qg, k, qw, kw, eps, rot, inv_freq, positions):
    hd = k.shape[-1]
    q, gate = qg[..., :hd], qg[..., hd:]
    q = ref_rope(rms(q, qw, eps), positions, inv_freq, rot)
    kk = ref_rope(rms(k, kw, eps), positions, inv_freq, rot)
    return q, gate.astype(np.float64), kk


def ref_attention(q, K, V, n_keys, scale, gate=None):
    """q [T, Hq, hd]; K, V [rows, Hkv, hd]; query t sees rows < n_keys[t]."""
    T, Hq, hd = q.shape
    G = Hq // K.shape[1]
    out = np.zeros((T, Hq, hd))
    for t in range(T):
        n = n_keys[t]
        if n <= 0:
            continue
        k = np.repeat(K[:n].astype(np.float64), G, axis=1)  # repeat_kv: head h -> K/V head h // G
        v = np.repeat(V[:n].astype(np.float64), G, axis=1)
        s = np.einsum("hd,jhd->hj", q[t].astype(np.float64), k) * scale
        p = np.exp(s - s.max(-1, keepdims=True))
        p /= p.sum(-1, keepdims=True)
        out[t] = np.einsum("hj,jhd->hd", p, v)
    if gate is not None:
        out = out / (1.0 + np.exp(-gate.astype(np.float64)))
    return out


def prep_inputs(g, T, Hq, Hkv, hd):
    return (f32(g.standard_normal((T, Hq, 2 * hd))), f32(g.standard_normal((T, Hkv, hd))),
            f32(1.0 + 0.3 * g.standard_normal(hd)), f32(1.0 + 0.3 * g.standard_normal(hd)))


# ---------------------------------------------------------------- rope_inv_freq


@pytest.mark.parametrize("theta", [10000.0, 1e6, 1e7, 123456.7])
@pytest.mark.parametrize("dim", [2, 16, 24, 64, 128, 256])
def test_rope_inv_freq_is_the_reference_formula_bit_for_bit(theta, dim):
    got = _core.rope_inv_freq(theta, dim)
    assert got.dtype == np.float32 and got.shape == (dim // 2,)
    assert np.array_equal(got, ref_inv_freq_f32(theta, dim))
    assert got[0] == 1.0


def test_rope_inv_freq_equals_transformers_frozen():
    # The attention fixture froze transformers' own float32 inv_freq (theta 1e7, 64 dims).
    z = np.load(Path(__file__).parent / "fixtures" / "qwen3_5_attention_reference.npz")
    assert np.array_equal(_core.rope_inv_freq(1e7, 64), z["rope_inv_freq"])


def test_rope_inv_freq_against_torch_within_one_ulp():
    torch = pytest.importorskip("torch")
    for theta in (10000.0, 1e6, 1e7, 5e6):
        for dim in (32, 64, 96, 128, 256):
            want = (1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.float) / dim))).numpy()
            got = _core.rope_inv_freq(theta, dim)
            ulps = np.abs(got.view(np.int32).astype(np.int64) - want.view(np.int32).astype(np.int64))
            assert ulps.max() <= 1, (theta, dim)  # torch's float pow is not correctly rounded


def test_rope_inv_freq_refusals():
    with pytest.raises(memra.ContractError) as ei:
        _core.rope_inv_freq(1e4, 7)
    assert ei.value.code == S.CONTRACT_ODD_ROPE and "dim" in str(ei.value)
    for theta in (0.0, -1.0, float("nan"), float("inf")):
        with pytest.raises(memra.ContractError, match="theta"):
            _core.rope_inv_freq(theta, 8)


# ---------------------------------------------------------------- attn_prep


@pytest.mark.parametrize("T", [1, 63, 65, 200])
@pytest.mark.parametrize("Hq,Hkv,hd,rot", [(4, 2, 256, 64), (3, 1, 16, 8), (2, 2, 12, 12), (4, 1, 32, 0)])
def test_attn_prep_matches_reference(T, Hq, Hkv, hd, rot):
    g = rng(T * 31 + hd)
    qg, k, qw, kw = prep_inputs(g, T, Hq, Hkv, hd)
    inv = _core.rope_inv_freq(1e7 if hd == 256 else 1e4, rot)
    pos0 = 5
    q, gate, kk = _core.attn_prep(qg, k, qw, kw, eps=1e-6, rotary_dim=rot, inv_freq=inv if rot else None,
                                  pos0=pos0)
    wq, wg, wk = ref_prep(qg, k, qw, kw, 1e-6, rot, inv, np.arange(pos0, pos0 + T))
    close(q, wq)
    close(kk, wk)
    assert np.array_equal(gate, qg[..., hd:])  # the split copies the gate half exactly


def test_partial_rotary_touches_only_the_rotated_dims():
    # Dims past rotary_dim are the norm's output bit for bit; the rotated ones follow
    # apply_rotary_pos_emb (rotate_half: the first half pairs with the second, not interleaved).
    g = rng(7)
    T, Hq, Hkv, hd, rot = 9, 4, 2, 256, 64
    qg, k, qw, kw = prep_inputs(g, T, Hq, Hkv, hd)
    inv = _core.rope_inv_freq(1e7, rot)
    q, _, kk = _core.attn_prep(qg, k, qw, kw, eps=1e-6, rotary_dim=rot, inv_freq=inv, pos0=100)
    q0, _, k0 = _core.attn_prep(qg, k, qw, kw, eps=1e-6, rotary_dim=0, pos0=100)
    assert np.array_equal(q[..., rot:], q0[..., rot:]) and np.array_equal(kk[..., rot:], k0[..., rot:])
    assert not np.array_equal(q[..., :rot], q0[..., :rot])
    # Position 0 rotates by nothing (cos 1, sin 0): the norm's output exactly.
    qz, _, kz = _core.attn_prep(qg[:1], k[:1], qw, kw, eps=1e-6, rotary_dim=rot, inv_freq=inv, pos0=0)
    assert np.array_equal(qz, q0[:1]) and np.array_equal(kz, k0[:1])
    # The reference's rotate-half pairs, and not the interleaved (GPT-J) pairs, explain the output.
    pos = np.arange(100, 100 + T)
    close(q, ref_rope(rms(qg[..., :hd], qw, 1e-6), pos, inv, rot))
    x = rms(qg[..., :hd], qw, 1e-6)
    inter = x.copy()
    ang = (pos.astype(np.float32)[:, None] * inv[None]).astype(np.float64)
    c, s = np.cos(ang)[:, None], np.sin(ang)[:, None]
    inter[..., 0:rot:2], inter[..., 1:rot:2] = x[..., 0:rot:2] * c - x[..., 1:rot:2] * s, x[..., 1:rot:2] * c + x[..., 0:rot:2] * s
    assert np.abs(q - inter).max() > 1e-2


def test_attn_prep_rotation_matches_transformers():
    torch = pytest.importorskip("torch")
    M = pytest.importorskip("transformers.models.qwen3_5.modeling_qwen3_5")
    g = rng(8)
    T, H, hd, rot = 20, 2, 256, 64
    qg, k, _, _ = prep_inputs(g, T, H, H, hd)
    ones = np.ones(hd, np.float32)
    inv = _core.rope_inv_freq(1e7, rot)
    q, _, kk = _core.attn_prep(qg, k, ones, ones, eps=1e-6, rotary_dim=rot, inv_freq=inv, pos0=37)
    xq = torch.from_numpy(rms(qg[..., :hd], ones, 1e-6).astype(np.float32)).transpose(0, 1)[None]
    xk = torch.from_numpy(rms(k, ones, 1e-6).astype(np.float32)).transpose(0, 1)[None]
    freqs = torch.from_numpy(inv)[None, :] * torch.arange(37, 37 + T, dtype=torch.float32)[:, None]
    emb = torch.cat([freqs, freqs], -1)[None]
    wq, wk = M.apply_rotary_pos_emb(xq, xk, emb.cos(), emb.sin())
    close(q, wq[0].transpose(0, 1).double().numpy(), 1e-6)
    close(kk, wk[0].transpose(0, 1).double().numpy(), 1e-6)


def test_attn_prep_device_form_equals_direct_form():
    # Rows at lengths[slots[t]] give the bytes of the direct form at the same positions; an idle
    # row (-1) sits at position 0.
    g = rng(9)
    T, Hq, Hkv, hd, rot = 4, 4, 2, 32, 16
    qg, k, qw, kw = prep_inputs(g, T, Hq, Hkv, hd)
    inv = _core.rope_inv_freq(1e4, rot)
    lengths = np.array([7, 0, 30, 12], np.int32)
    slots = np.array([2, 0, -1, 3], np.int32)
    got = _core.attn_prep(qg, k, qw, kw, eps=1e-6, rotary_dim=rot, inv_freq=inv, slots=slots, lengths=lengths)
    for t, pos in enumerate([30, 7, 0, 12]):
        want = _core.attn_prep(qg[t:t + 1], k[t:t + 1], qw, kw, eps=1e-6, rotary_dim=rot, inv_freq=inv, pos0=pos)
        for a, b in zip(got, want):
            assert np.array_equal(a[t:t + 1], b)


# ---------------------------------------------------------------- kv_append


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_kv_append_direct_and_device_forms(dtype):
    g = rng(10)
    Hkv, hd, L = 2, 8, 16
    bf = dtype == "bfloat16"
    mk = (lambda shape: np.zeros(shape, ml_dtypes.bfloat16)) if bf else (lambda shape: np.zeros(shape, np.float32))
    k, v = f32(g.standard_normal((5, Hkv, hd))), f32(g.standard_normal((5, Hkv, hd)))
    kc, vc = mk((L, Hkv, hd)), mk((L, Hkv, hd))
    _core.kv_append(k, v, kc, vc, pos0=3)
    want = (lambda a: a.astype(ml_dtypes.bfloat16)) if bf else (lambda a: a)
    assert np.array_equal(kc[3:8], want(k)) and np.array_equal(vc[3:8], want(v))
    assert not kc[:3].astype(np.float32).any() and not kc[8:].astype(np.float32).any()
    # Device form: row t into [slots[t], lengths[slots[t]]]; the idle row writes nothing.
    kb, vb = mk((3, L, Hkv, hd)), mk((3, L, Hkv, hd))
    lengths = np.array([4, 0, 15], np.int32)
    _core.kv_append(k[:3], v[:3], kb, vb, slots=np.array([2, -1, 0], np.int32), lengths=lengths)
    assert np.array_equal(kb[2, 15], want(k[0])) and np.array_equal(vb[0, 4], want(v[2]))
    mask = np.ones((3, L), bool)
    mask[2, 15] = mask[0, 4] = False
    assert not kb.astype(np.float32)[mask].any() and not vb.astype(np.float32)[mask].any()


def test_kv_append_refusals_write_nothing():
    k = f32(np.ones((3, 2, 4)))
    kc, vc = np.zeros((8, 2, 4), np.float32), np.zeros((8, 2, 4), np.float32)
    with pytest.raises(memra.ContractError) as ei:
        _core.kv_append(k, k, kc, vc, pos0=6)
    assert ei.value.code == S.CONTRACT_RANGE and "pos0" in str(ei.value)
    kb, vb = np.zeros((2, 8, 2, 4), np.float32), np.zeros((2, 8, 2, 4), np.float32)
    cases = [(np.array([0, 2, 1], np.int32), np.array([0, 0], np.int32), S.CONTRACT_RANGE, "slots"),
             (np.array([0, 0, 1], np.int32), np.array([0, 0], np.int32), S.CONTRACT_VALUE, "twice"),
             (np.array([0, 1, -1], np.int32), np.array([0, 8], np.int32), S.CONTRACT_RANGE, "lengths")]
    for slots, lengths, code, word in cases:
        with pytest.raises(memra.ContractError) as ei:
            _core.kv_append(k, k, kb, vb, slots=slots, lengths=lengths)
        assert ei.value.code == code and word in str(ei.value)
    assert not kc.any() and not kb.any() and not vb.any()
    ro = np.zeros((8, 2, 4), np.float32)
    ro.flags.writeable = False
    with pytest.raises(memra.ContractError, match="k_cache"):
        _core.kv_append(k, k, ro, vc)


# ---------------------------------------------------------------- attention


@pytest.mark.parametrize("T", [1, 63, 65, 200])
@pytest.mark.parametrize("Hq,Hkv,hd", [(4, 2, 256), (8, 1, 16), (3, 3, 20)])
def test_attention_direct_form_matches_reference(T, Hq, Hkv, hd):
    g = rng(T + 7 * hd + Hq)
    pos0 = 0 if T > 64 else 9  # a chunk after a cached prefix, or the whole prompt
    L = pos0 + T + 3
    q, gate = f32(g.standard_normal((T, Hq, hd))), f32(g.standard_normal((T, Hq, hd)))
    K, V = f32(g.standard_normal((L, Hkv, hd))), f32(g.standard_normal((L, Hkv, hd)))
    scale = hd ** -0.5
    n = np.arange(pos0 + 1, pos0 + T + 1)
    close(_core.attention(q, K, V, scale=scale, gate=gate, pos0=pos0), ref_attention(q, K, V, n, scale, gate))
    close(_core.attention(q, K, V, scale=scale, pos0=pos0), ref_attention(q, K, V, n, scale))


def test_attention_grouped_heads_read_kv_head_h_div_group():
    # K/V heads far apart: query head h must read K/V head h // (Hq / Hkv) (repeat_kv), not h % Hkv.
    g = rng(11)
    T, Hq, Hkv, hd = 3, 6, 2, 8
    q = f32(g.standard_normal((T, Hq, hd)))
    K = f32(g.standard_normal((T, Hkv, hd)))
    V = f32(np.stack([np.full((T, hd), 1.0), np.full((T, hd), -5.0)], 1))
    got = _core.attention(q, K, V, scale=0.5, pos0=0)
    assert np.allclose(got[:, :3], 1.0) and np.allclose(got[:, 3:], -5.0)
    close(got, ref_attention(q, K, V, np.arange(1, T + 1), 0.5))


def test_attention_device_form_rows_are_independent_and_idle_rows_zero():
    g = rng(12)
    B, MB, L, Hq, Hkv, hd = 4, 3, 40, 4, 2, 16
    K, V = f32(g.standard_normal((MB, L, Hkv, hd))), f32(g.standard_normal((MB, L, Hkv, hd)))
    q, gate = f32(g.standard_normal((B, Hq, hd))), f32(g.standard_normal((B, Hq, hd)))
    lengths = np.array([5, 39, 0], np.int32)
    slots = np.array([1, -1, 0, 2], np.int32)
    got = _core.attention(q, K, V, scale=0.25, gate=gate, slots=slots, lengths=lengths)
    assert not got[1].any()
    for b, s in ((0, 1), (2, 0), (3, 2)):
        n = int(lengths[s]) + 1  # the row appended at its length included
        want = ref_attention(q[b:b + 1], K[s], V[s], [n], 0.25, gate[b:b + 1])
        close(got[b:b + 1], want)
        # The direct form of the same query at position n - 1 over the slot's planes: same bytes.
        same = _core.attention(q[b:b + 1], K[s][:n], V[s][:n], scale=0.25, gate=gate[b:b + 1], pos0=n - 1)
        assert np.array_equal(got[b:b + 1], same)


def test_attention_over_bf16_cache_reads_the_rounded_rows():
    g = rng(13)
    T, Hq, Hkv, hd = 5, 2, 1, 8
    q = f32(g.standard_normal((T, Hq, hd)))
    K, V = g.standard_normal((T, Hkv, hd)), g.standard_normal((T, Hkv, hd))
    kb, vb = K.astype(ml_dtypes.bfloat16), V.astype(ml_dtypes.bfloat16)
    got = _core.attention(q, kb, vb, scale=0.3)
    want = _core.attention(q, f32(kb.astype(np.float32)), f32(vb.astype(np.float32)), scale=0.3)
    assert np.array_equal(got, want)
    got_bits = _core.attention(q, kb.view(np.uint16), vb.view(np.uint16), scale=0.3)  # raw bits
    assert np.array_equal(got_bits, want)


def test_attention_refusals_are_named():
    q = f32(np.ones((2, 4, 8)))
    K = f32(np.ones((6, 2, 8)))
    checks = [
        (dict(q=f32(np.ones((2, 3, 8))), k_cache=K, v_cache=K, scale=1.0), memra.ContractError, "heads"),
        (dict(q=q, k_cache=K, v_cache=f32(np.ones((6, 1, 8))), scale=1.0), memra.ContractError, "v_cache"),
        (dict(q=q, k_cache=K, v_cache=K, scale=float("nan")), memra.ContractError, "scale"),
        (dict(q=q, k_cache=K, v_cache=K, scale=1.0, pos0=5), memra.ContractError, "pos0"),
        (dict(q=q, k_cache=K, v_cache=K, scale=1.0, gate=f32(np.ones((2, 4, 7)))), memra.ContractError, "gate"),
        (dict(q=f32(np.ones((2, 2, 300))), k_cache=f32(np.ones((6, 1, 300))), v_cache=f32(np.ones((6, 1, 300))),
              scale=1.0), memra.UnsupportedError, "256"),
        (dict(q=q, k_cache=K, v_cache=K, scale=1.0, lengths=np.zeros(2, np.int32)), memra.ContractError, "lengths"),
    ]
    for kw, cls, word in checks:
        with pytest.raises(cls) as ei:
            _core.attention(**kw)
        assert word in str(ei.value), str(ei.value)


def test_attn_prep_refusals_are_named():
    g = rng(14)
    qg, k, qw, kw = prep_inputs(g, 3, 4, 2, 16)
    inv = _core.rope_inv_freq(1e4, 8)
    checks = [
        (dict(rotary_dim=7, inv_freq=inv), S.CONTRACT_ODD_ROPE, "rotary_dim"),
        (dict(rotary_dim=18, inv_freq=inv), S.CONTRACT_VALUE, "rotary_dim"),
        (dict(rotary_dim=8), S.CONTRACT_MISSING, "inv_freq"),
        (dict(rotary_dim=8, inv_freq=inv[:3]), S.CONTRACT_SHAPE, "inv_freq"),
        (dict(rotary_dim=8, inv_freq=inv, pos0=-1), S.CONTRACT_RANGE, "pos0=-1 must be >= 0"),
        (dict(rotary_dim=8, inv_freq=inv, slots=np.array([0, 1, 2], np.int32), lengths=np.zeros(2, np.int32)),
         S.CONTRACT_RANGE, "slots"),
    ]
    for kw_, code, word in checks:
        with pytest.raises(memra.ContractError) as ei:
            _core.attn_prep(qg, k, qw, kw, eps=1e-6, **kw_)
        assert ei.value.code == code and word in str(ei.value), str(ei.value)
    with pytest.raises(memra.ContractError, match="heads"):
        _core.attn_prep(f32(np.ones((3, 3, 32))), k, qw, kw, eps=1e-6, rotary_dim=0)
    with pytest.raises(memra.ContractError, match="eps"):
        _core.attn_prep(qg, k, qw, kw, eps=-1.0, rotary_dim=0)
