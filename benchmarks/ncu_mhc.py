"""Driver for ncu: mhc_pre at decode (T = 1, hc = 4, D = 4096, 20 Sinkhorn iterations:
GLM-5.3-Flash's geometry; f32 fn, as the model uploads it), three calls; see
benchmarks/results/*-ncu*.md."""
import numpy as np

import memra
from memra import _core

e = memra.Engine("cuda")
hc, D = 4, 4096
mix = (2 + hc) * hc
r = np.random.default_rng(0)
streams = e.to_device(r.standard_normal((1, hc, D)).astype(np.float32))
# f32 fn: what HyperConnection uploads (cpp/src/layers/ffn_layers_cuda.cpp)
fn = memra.DeviceWeight(e, _core.Weight((r.standard_normal((mix, hc * D)) * 0.01).astype(np.float32)))
base = e.to_device((r.standard_normal(mix) * 0.1).astype(np.float32))
scale = e.to_device(r.random(3).astype(np.float32))
for _ in range(3):
    out = _core.mhc_pre(streams, fn, base, scale, sinkhorn_iters=20, hc_eps=1e-6, norm_eps=1e-5,
                        engine=e)
e.synchronize()
print("done")
