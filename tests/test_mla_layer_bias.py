"""memra.MlaLayer (dense, unrotated: KimiLinearAttention's form) with attention_bias against a float64
numpy transcription of transformers 5.17 models/kimi_linear/modeling_kimi_linear.py
KimiLinearAttention.forward:

* q = q_proj(x) (q_lora_rank None), or q_b_proj(q_a_layernorm(q_a_proj(x))) with q_a_proj's bias;
* compressed_kv = kv_a_proj_with_mqa(x) (with its bias), split [kv_lora_rank, qk_rope_head_dim];
  kv_a_layernorm (KimiLinearRMSNorm: x * rsqrt(mean(x^2) + eps) * w) on the first part, the rope
  part as is (never rotated in Kimi-Linear);
* expand_kv: kv_b_proj of the normed latent per head -> k_nope | v; key = k_nope | k_rot;
* causal eager attention with scaling = qk_head_dim ** -0.5; o_proj (with its bias).

The frozen fixtures (tiny_kimi_linear, tiny_glm5_next_*) have attention_bias false, so without these
cases the three biases the layer loads are never exercised on the CPU. numpy only. Tolerance:
1e-5 * max|y| (f32 against float64).
"""

from __future__ import annotations

import numpy as np
import pytest

import memra
from memra import _core

TOL = 1e-5
EPS = 1e-6  # KimiLinearRMSNorm's default, which q_a_layernorm / kv_a_layernorm keep


def rms(x, w):
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + EPS) * w.astype(np.float64)


def ref_attention(w, x, H, ql, R, dn, dr, dv):
    """KimiLinearAttention.forward in float64 for one causal sequence x [T, D]."""
    x64, T = x.astype(np.float64), len(x)

    def lin(name, a):
        b = w.get(name + ".bias")
        return a @ w[name + ".weight"].T.astype(np.float64) + (0.0 if b is None else b)

    if ql:
        q = lin("q_b_proj", rms(lin("q_a_proj", x64), w["q_a_layernorm.weight"]))
    else:
        q = lin("q_proj", x64)
    q = q.reshape(T, H, dn + dr)
    ckv = lin("kv_a_proj_with_mqa", x64)
    c, k_rot = rms(ckv[:, :R], w["kv_a_layernorm.weight"]), ckv[:, R:]
    kv = (c @ w["kv_b_proj.weight"].T.astype(np.float64)).reshape(T, H, dn + dv)
    k = np.concatenate([kv[..., :dn], np.broadcast_to(k_rot[:, None, :], (T, H, dr))], -1)
    v = kv[..., dn:]
    s = np.einsum("thd,jhd->htj", q, k) * (dn + dr) ** -0.5
    s = np.where(np.tril(np.ones((T, T), bool))[None], s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    o = np.einsum("htj,jhd->thd", p, v).reshape(T, H * dv)
    return lin("o_proj", o)


def weights(g, D, H, ql, R, dn, dr, dv):
    def lin(n, k):
        return (g.standard_normal((n, k)) / np.sqrt(k)).astype(np.float32)

    def bias(n):
        return (0.5 * g.standard_normal(n)).astype(np.float32)

    w = {"kv_a_proj_with_mqa.weight": lin(R + dr, D), "kv_a_proj_with_mqa.bias": bias(R + dr),
         "kv_a_layernorm.weight": (1.0 + 0.3 * g.standard_normal(R)).astype(np.float32),
         "kv_b_proj.weight": lin(H * (dn + dv), R), "o_proj.weight": lin(D, H * dv), "o_proj.bias": bias(D)}
    if ql:
        w.update({"q_a_proj.weight": lin(ql, D), "q_a_proj.bias": bias(ql),
                  "q_a_layernorm.weight": (1.0 + 0.3 * g.standard_normal(ql)).astype(np.float32),
                  "q_b_proj.weight": lin(H * (dn + dr), ql)})
    else:
        w["q_proj.weight"] = lin(H * (dn + dr), D)
    return w


def rel_err(got, want) -> float:
    return float(np.abs(got.astype(np.float64) - want).max() / np.abs(want).max())


CASES = [  # D, H, q_lora_rank, kv_rank, d_nope, d_rope, d_v, T
    (24, 2, 0, 16, 8, 4, 8, 21),
    (32, 3, 12, 16, 8, 8, 6, 17),
]


@pytest.mark.parametrize("case", CASES, ids=[f"ql{c[2]}" for c in CASES])
def test_mla_layer_with_biases_matches_kimi_linear_attention(case):
    D, H, ql, R, dn, dr, dv, T = case
    g = np.random.default_rng(D * T)
    w = weights(g, D, H, ql, R, dn, dr, dv)
    x = g.standard_normal((T, D)).astype(np.float32)
    want = ref_attention(w, x, H, ql, R, dn, dr, dv)
    layer = _core.MlaLayer(memra.Engine("cpu"), {k: _core.Weight(v) for k, v in w.items()}, hidden=D,
                           heads=H, q_lora_rank=ql, kv_rank=R, d_nope=dn, d_rope=dr, d_v=dv, rms_eps=EPS,
                           rotate=False, dtype="float32")
    cache = memra.Cache(memra.Engine("cpu"), [layer.state_spec()], max_batch=1, max_len=T)
    t0 = T // 2
    y0, _ = layer.prefill(cache, 0, 0, x[:t0])
    cache.commit(0, t0)
    ys = [y0]
    for t in range(t0, T):  # the decode path, one row at a time
        y, _ = layer.decode(cache, 0, np.array([0], np.int32), x[t:t + 1])
        cache.commit(0, 1)
        ys.append(y)
    assert rel_err(np.concatenate(ys), want) <= TOL
    for name in [k for k in w if k.endswith(".bias")]:  # each bias alone moves y past TOL
        wn = {k: v for k, v in w.items() if k != name}
        assert rel_err(want.astype(np.float32), ref_attention(wn, x, H, ql, R, dn, dr, dv)) > 100 * TOL, name
