"""Small launches of the KDA scan / conv decode arm and the DSA scorers and selects for
`compute-sanitizer --tool racecheck` (issue: racecheck clean on the scan and select kernels).
Run: compute-sanitizer --tool racecheck --error-exitcode 1 python3 scripts/sanitize_kernels.py"""

import numpy as np

import memra
from memra import _core

e = memra.Engine("cuda")
rng = np.random.default_rng(0)
d = e.to_device


def f32(*shape):
    return np.ascontiguousarray(rng.standard_normal(shape).astype(np.float32))


# KDA scan: B = 2 sequences x T = 5 steps, 1 head of 128 (prefill and decode forms).
B, T, H, dk = 2, 5, 1, 128
q, k = f32(B, T, H, dk), f32(B, T, H, dk)
q /= np.linalg.norm(q, axis=-1, keepdims=True)
k /= np.linalg.norm(k, axis=-1, keepdims=True)
v, g = f32(B, T, H, dk), -np.abs(f32(B, T, H, dk))
beta = 1 / (1 + np.exp(-f32(B, T, H)))
state = f32(B, H, dk, dk) * 0.1
o, s = _core.kda_scan(d(q), d(k), d(v), d(g), d(beta), d(state), batch=True, engine=e)
e.to_host(o)
o1, s1 = _core.kda_scan(d(q[0]), d(k[0]), d(v[0]), d(g[0]), d(beta[0]), d(state[0]), engine=e)
e.to_host(o1)
# Conv decode arm (batched) and prefill arm.
C, K = 3 * 128, 4
x, w, ring = f32(B, C), f32(C, K), f32(B, C, K - 1)
y, r = _core.kda_conv(d(x), d(w), d(ring), batch=True, engine=e)
e.to_host(y)
y, r = _core.kda_conv(d(f32(7, C)), d(w), d(ring[0]), engine=e)
e.to_host(y)
# DSA: tiled and reference scorers, radix and reference selects (ties included).
tq, Hi, di, P, n_pools = 5, 4, 32, 4, 300
qi, wi, keys = f32(tq, Hi, di), f32(tq, Hi), f32(n_pools, di)
for ref in (False, True):
    sc = _core.kpool_score(d(qi), d(wi), d(keys), pool=P, first_pos=n_pools * P - tq, qk_scale=0.2,
                           head_scale=0.5, reference=ref, engine=e)
    e.to_host(sc)
score = np.round(f32(tq, n_pools), 1)  # many ties
for ref in (False, True):
    idx = _core.kpool_select(d(score), pool=P, select_k=16, width=16 * P + P - 1,
                             first_pos=n_pools * P - tq, reference=ref, engine=e)
    e.to_host(idx)
print("kernel launches done")
