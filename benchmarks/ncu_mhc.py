"""Driver for ncu: the mHC mapping at decode (T = 1, hc = 4, D = 4096, bf16 fn, 20 Sinkhorn
iterations: GLM-5.3-Flash's geometry), three calls; see benchmarks/results/*-ncu*.md."""
import torch

import memra
from memra import _core

e = memra.Engine("cuda")
hc, D = 4, 4096
mix = (2 + hc) * hc
streams = torch.randn(1, hc, D, device="cuda")
fn = (torch.randn(mix, hc * D, device="cuda") * 0.01).to(torch.bfloat16)
base = torch.randn(mix, device="cuda") * 0.1
scale = torch.rand(3, device="cuda")
torch.cuda.synchronize()
for _ in range(3):
    out = _core.mhc_pre(streams, fn, base, scale, 20, 1e-6, 1e-5, engine=e)
e.synchronize()
print("done")
