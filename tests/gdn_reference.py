"""Independent references of the Gated DeltaNet (Qwen3.5 / Qwen3-Next) for memra's GDN tests.

numpy float64 transcriptions of transformers 5.17 ``models/qwen3_5/modeling_qwen3_5.py``
(``causal_conv1d_update`` / ``causal_conv1d_fn``, ``l2norm``, ``torch_recurrent_gated_delta_rule``,
``Qwen3_5RMSNormGated``, ``Qwen3_5GatedDeltaNet.forward``), random layer weights, the Qwen3-Next
interleaving (the inverse of ``fix_query_key_value_ordering``) and a runner of transformers' own
modules (pure-torch path; needs torch and transformers, imported lazily). Used by
tests/test_ops_gdn.py, tests/test_layer_gdn.py, tests/test_cuda_gdn.py and
tests/fixtures/make_gdn_layer_fixture.py.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

L2_EPS = 1e-6  # modeling_qwen3_5.l2norm


@dataclass(frozen=True)
class Geometry:
    hidden: int = 48
    key_heads: int = 2
    value_heads: int = 4
    key_head_dim: int = 16
    value_head_dim: int = 24
    conv_kernel: int = 4
    rms_eps: float = 1e-6

    @property
    def C(self) -> int:  # conv channels q | k | v
        return 2 * self.key_heads * self.key_head_dim + self.value_heads * self.value_head_dim

    @property
    def vd(self) -> int:
        return self.value_heads * self.value_head_dim

    def layer_kw(self) -> dict:
        """GdnLayer's keyword arguments."""
        return dict(hidden=self.hidden, key_heads=self.key_heads, value_heads=self.value_heads,
                    key_head_dim=self.key_head_dim, value_head_dim=self.value_head_dim,
                    conv_kernel=self.conv_kernel, rms_eps=self.rms_eps)

    def spec_kw(self) -> dict:
        """LayerStateSpec.gdn's keyword arguments."""
        return dict(key_heads=self.key_heads, value_heads=self.value_heads,
                    key_head_dim=self.key_head_dim, value_head_dim=self.value_head_dim,
                    conv_kernel=self.conv_kernel)


def f32(a) -> np.ndarray:
    return np.ascontiguousarray(a, dtype=np.float32)


# ---------------------------------------------------------------- ops (float64)


def conv(x, w, ring):
    """causal_conv1d_update over ring ++ x: x [T, C], w [C, K], ring [C, K-1] (the last K-1 inputs,
    oldest first) -> (silu(conv) [T, C], new ring [C, K-1])."""
    x, w, ring = (np.asarray(a, np.float64) for a in (x, w, ring))
    K, T = w.shape[1], x.shape[0]
    cat = np.concatenate([ring.T, x], axis=0)  # [K-1+T, C]
    acc = sum(w[:, j] * cat[j: j + T] for j in range(K))
    return acc / (1.0 + np.exp(-acc)), cat[cat.shape[0] - (K - 1):].T.copy()


def gates(a, b, dt_bias, A_log):
    """g = -exp(A_log) * F.softplus(a + dt_bias) (threshold 20), beta = sigmoid(b). a, b [T, H]."""
    x = np.asarray(a, np.float64) + np.asarray(dt_bias, np.float64)
    with np.errstate(over="ignore"):
        sp = np.where(x > 20.0, x, np.log1p(np.exp(np.minimum(x, 20.0))))
        beta = 1.0 / (1.0 + np.exp(-np.asarray(b, np.float64)))
    return -np.exp(np.asarray(A_log, np.float64)) * sp, beta


def l2norm(x, eps=L2_EPS):
    x = np.asarray(x, np.float64)
    return x / np.sqrt((x * x).sum(-1, keepdims=True) + eps)


def scan(q, k, v, g, beta, state=None, scale=None):
    """torch_recurrent_gated_delta_rule after q.repeat_interleave / k.repeat_interleave: q, k
    [T, Hk, dk]; v [T, Hv, dv]; g, beta [T, Hv]; state [Hv, dk, dv] -> (o [T, Hv, dv], state)."""
    q, k, v, g, beta = (np.asarray(a, np.float64) for a in (q, k, v, g, beta))
    T, Hk, dk = q.shape
    Hv, dv = v.shape[1:]
    q = np.repeat(q, Hv // Hk, axis=1)  # repeat_interleave: value head h reads key head h // r
    k = np.repeat(k, Hv // Hk, axis=1)
    q = q * (dk ** -0.5 if scale is None else scale)
    S = np.zeros((Hv, dk, dv)) if state is None else np.asarray(state, np.float64).copy()
    o = np.zeros((T, Hv, dv))
    for t in range(T):
        S = S * np.exp(g[t])[:, None, None]
        kv = (S * k[t][..., None]).sum(-2)
        delta = (v[t] - kv) * beta[t][:, None]
        S = S + k[t][..., None] * delta[:, None, :]
        o[t] = (S * q[t][..., None]).sum(-2)
    return o, S


def gated_norm(x, z, w, eps):
    """Qwen3_5RMSNormGated: w * x * rsqrt(mean(x^2) + eps) * silu(z), rows of x, z [N, D]."""
    x, z, w = (np.asarray(a, np.float64) for a in (x, z, w))
    n = x / np.sqrt((x * x).mean(-1, keepdims=True) + eps)
    return w * n * (z / (1.0 + np.exp(-z)))


def layer(geo: Geometry, w: dict, x, ring=None, state=None):
    """Qwen3_5GatedDeltaNet.forward of one sequence x [T, hidden] from (ring, state) (None: zeros)
    with the Qwen3.5-layout weights `w` -> (y [T, hidden], ring [C, K-1], state [Hv, dk, dv])."""
    x = np.asarray(x, np.float64)
    T = x.shape[0]
    Hk, Hv, dk, dv = geo.key_heads, geo.value_heads, geo.key_head_dim, geo.value_head_dim
    W = {n: np.asarray(a, np.float64) for n, a in w.items()}
    ring = np.zeros((geo.C, geo.conv_kernel - 1)) if ring is None else ring
    mixed, ring = conv(x @ W["in_proj_qkv.weight"].T, W["conv1d.weight"][:, 0, :], ring)
    q = l2norm(mixed[:, : Hk * dk].reshape(T, Hk, dk))
    k = l2norm(mixed[:, Hk * dk: 2 * Hk * dk].reshape(T, Hk, dk))
    v = mixed[:, 2 * Hk * dk:].reshape(T, Hv, dv)
    g, beta = gates(x @ W["in_proj_a.weight"].T, x @ W["in_proj_b.weight"].T, W["dt_bias"], W["A_log"])
    o, state = scan(q, k, v, g, beta, state)
    z = (x @ W["in_proj_z.weight"].T).reshape(T * Hv, dv)
    o = gated_norm(o.reshape(T * Hv, dv), z, W["norm.weight"], geo.rms_eps).reshape(T, Hv * dv)
    return o @ W["out_proj.weight"].T, ring, state


# ---------------------------------------------------------------- weights


def weights(geo: Geometry, seed: int) -> dict[str, np.ndarray]:
    """Random Qwen3.5-layout weights (names below ``linear_attn.``) with O(1) activations: no
    parameter at transformers' 0 / 1 init; decays exp(g) mostly in (0.3, 0.99) so the state
    remembers."""
    r = np.random.default_rng(seed)
    D, C, vd, Hv = geo.hidden, geo.C, geo.vd, geo.value_heads
    return {
        "in_proj_qkv.weight": f32(r.standard_normal((C, D)) / np.sqrt(D)),
        "in_proj_z.weight": f32(r.standard_normal((vd, D)) / np.sqrt(D)),
        "in_proj_b.weight": f32(r.standard_normal((Hv, D)) / np.sqrt(D)),
        "in_proj_a.weight": f32(r.standard_normal((Hv, D)) / np.sqrt(D)),
        "conv1d.weight": f32(0.5 * r.standard_normal((C, 1, geo.conv_kernel))),
        "A_log": f32(r.uniform(-3.0, -0.5, Hv)),
        "dt_bias": f32(r.uniform(-1.0, 1.0, Hv)),
        "norm.weight": f32(1.0 + 0.2 * r.standard_normal(geo.value_head_dim)),
        "out_proj.weight": f32(r.standard_normal((D, vd)) / np.sqrt(vd)),
    }


def interleave(geo: Geometry, w: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The same layer in Qwen3-Next's layout: in_proj_qkvz rows per key head i are
    q_i | k_i | v_i | z_i and in_proj_ba rows b_i | a_i (what fix_query_key_value_ordering splits)."""
    Hk, Hv, dk, dv = geo.key_heads, geo.value_heads, geo.key_head_dim, geo.value_head_dim
    r = Hv // Hk
    qkv, z = w["in_proj_qkv.weight"], w["in_proj_z.weight"]
    q, k, v = qkv[: Hk * dk], qkv[Hk * dk: 2 * Hk * dk], qkv[2 * Hk * dk:]
    qkvz, ba = [], []
    for i in range(Hk):
        qkvz += [q[i * dk:(i + 1) * dk], k[i * dk:(i + 1) * dk], v[i * r * dv:(i + 1) * r * dv],
                 z[i * r * dv:(i + 1) * r * dv]]
        ba += [w["in_proj_b.weight"][i * r:(i + 1) * r], w["in_proj_a.weight"][i * r:(i + 1) * r]]
    out = {n: a for n, a in w.items() if not n.startswith("in_proj_")}
    out["in_proj_qkvz.weight"] = f32(np.concatenate(qkvz))
    out["in_proj_ba.weight"] = f32(np.concatenate(ba))
    return out


# ---------------------------------------------------------------- transformers


def run_transformers(geo: Geometry, w: dict[str, np.ndarray], x: np.ndarray, prefill: int,
                     next_layout: bool = False) -> dict[str, np.ndarray]:
    """transformers' own module (Qwen3_5GatedDeltaNet, or Qwen3NextGatedDeltaNet with the
    interleaved weights when next_layout) in float32 on the CPU, pure-torch path: x[:prefill]
    through one call with a DynamicCache (the chunked form), then each later row as a one-token
    call (causal_conv1d_update + the recurrent form). Returns y [T, hidden], the cache's conv
    state as memra's ring (its last K-1 columns) and the recurrent state, after the last call."""
    import torch
    from transformers.cache_utils import DynamicCache

    if next_layout:
        from transformers import Qwen3NextConfig as Config
        from transformers.models.qwen3_next.modeling_qwen3_next import Qwen3NextGatedDeltaNet as Module
        w = interleave(geo, w)
    else:
        from transformers import Qwen3_5TextConfig as Config
        from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5GatedDeltaNet as Module
    cfg = Config(hidden_size=geo.hidden, linear_num_key_heads=geo.key_heads,
                 linear_num_value_heads=geo.value_heads, linear_key_head_dim=geo.key_head_dim,
                 linear_value_head_dim=geo.value_head_dim, linear_conv_kernel_dim=geo.conv_kernel,
                 num_hidden_layers=1, layer_types=["linear_attention"], rms_norm_eps=geo.rms_eps,
                 hidden_act="silu")
    m = Module(cfg, 0).float().eval()
    m.load_state_dict({n: torch.from_numpy(np.array(a)) for n, a in w.items()}, strict=True)
    cache = DynamicCache(config=cfg)
    xt = torch.from_numpy(f32(x))[None]
    ys = []
    with torch.no_grad():
        ys.append(m(xt[:, :prefill], cache_params=cache)[0])
        for t in range(prefill, x.shape[0]):
            ys.append(m(xt[:, t: t + 1], cache_params=cache)[0])
    layer_cache = cache.layers[0]
    return {"y": torch.cat(ys).numpy(),
            "ring": layer_cache.conv_states[0][0, :, 1:].numpy().copy(),
            "state": layer_cache.recurrent_states[0][0].numpy().copy()}


def rel_err(a, ref) -> float:
    a, ref = np.asarray(a, np.float64), np.asarray(ref, np.float64)
    return float(np.max(np.abs(a - ref)) / np.max(np.abs(ref)))
