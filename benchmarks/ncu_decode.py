"""Driver for ncu: three KDA decode steps (B = 64, 256 at 64 heads; B = 64 at 32 heads), three batched MLA decode
launches (B = 64, L = 4096) under each arm (mla_decode_variant 0: mma.sync, 1: wgmma) and three
DSA decode steps (append, score, select, gathered attention; L = 32768, B = 1 and 8) on CUDA; see
benchmarks/results/*-ncu.md."""
import os
import sys

import torch, memra
from memra import _core

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_dsa_decode import GLM, MemraDsa, Step  # noqa: E402
e = memra.Engine("cuda")
for B, H in ((64, 64), (256, 64), (64, 32)):
    q = torch.nn.functional.normalize(torch.randn(B, 1, H, 128, device="cuda"), dim=-1)
    k = torch.nn.functional.normalize(torch.randn(B, 1, H, 128, device="cuda"), dim=-1)
    v = torch.randn(B, 1, H, 128, device="cuda"); g = -torch.rand(B, 1, H, 128, device="cuda")
    beta = torch.rand(B, 1, H, device="cuda"); s = torch.randn(B, H, 128, 128, device="cuda")
    torch.cuda.synchronize()
    for _ in range(3):
        o, so = _core.kda_scan(q, k, v, g, beta, s, batch=True, engine=e)
    e.synchronize()
    del o, so
B, L = 64, 4096
cache = [torch.randn(L, 512, device="cuda").to(torch.bfloat16) for _ in range(B)]
ql = torch.randn(B, 64, 512, device="cuda"); t = torch.full((B,), L, dtype=torch.int32, device="cuda")
torch.cuda.synchronize()
for var in (0, 1):
    ev = memra.Engine("cuda", options=memra.KernelOptions(mla_decode_variant=var))
    for _ in range(3):
        o = _core.mla_attn_decode(ql, cache, t, scale=0.07, max_t_kv=L, engine=ev)
    ev.synchronize()
del o, cache
for B in (1, 8):
    st = Step(torch, torch.device("cuda"), True, GLM, 32768, B)
    dsa = MemraDsa(st, e, _core)
    torch.cuda.synchronize()
    for _ in range(3):
        dsa.step()
    e.synchronize()
    del dsa, st
print("done")
