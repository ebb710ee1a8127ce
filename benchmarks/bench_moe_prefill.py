#!/usr/bin/env python3
"""Routed experts at prefill lengths: memra's moe_forward, tensor-core arm vs CUDA-core arm, vs torch.

memra: memra._core.moe_forward(x [T, D] f32, idx [T, k] int32, w [T, k] f32, gate/up [E, I, D],
       down [E, D, I] bf16 DeviceWeights, limit=, engine=e) -> y [T, D] f32. The default engine
       runs the tensor-core arm (cuda/moe_tc.cu: grouped GEMMs, mma.sync bf16 -> f32, each
       expert's weights read once per chunk of 16384 token-slot pairs); `old_*` fields are the
       CUDA-core grouped kernels (cuda/moe_grouped.cu) on an Engine made with
       KernelOptions(moe_tensor_cores=False), the arm before it. `memra_kernel_us` /
       `old_kernel_us`: the kernels alone (torch.profiler); `memra_us` adds the binding's host
       copy of the ids (its range check).
peer:  torch, bf16: for each expert (lists made on the host beforehand, which a captured graph
       could not do), gather the rows, F.linear gate and up (cuBLAS), the clamped SwiGLU in f32,
       F.linear down, * routing weight, index_add_ into y f32: what per-expert cuBLAS GEMMs with
       host-known counts give.
Roofline: flops = 6 * T * k * I * D (gate, up, down); `gemm_tflops` is torch's bf16 GEMM rate
measured in the same run (8192 x 8192 x 8192, f32 accumulation); `tc_roofline_us` = flops /
that rate, and `frac_of_tc_roofline` = tc_roofline_us / memra_kernel_us.
Shapes: GLM-5.3-Flash widths (D = 4096, I = 2048, 32 routed experts, top 8), T = 1024 and 8192
(--rows), uniform random routing (seeded).

    python3 benchmarks/bench_moe_prefill.py [--quick] [--rows 1024,8192]
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from common import Bench, base_parser, log, rel_err, to_torch  # noqa: E402

GEOM = dict(E=32, D=4096, I=2048, k=8)
ROWS = "1024,8192"
SMOKE = (dict(E=6, D=32, I=16, k=2), [5, 17])
LIMIT = 7.0
PEER = "torch per-expert gather + F.linear (bf16, cuBLAS)"


def gemm_tflops(torch, dev, n=8192, reps=10):
    """torch's bf16 GEMM rate (TFLOP/s) at n x n x n, median of `reps` event-timed calls."""
    import statistics
    a = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    torch.cuda.synchronize(dev)
    ts = []
    for _ in range(reps):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        a @ b
        e.record()
        e.synchronize()
        ts.append(s.elapsed_time(e) * 1e-3)
    return 2 * n**3 / statistics.median(ts) / 1e12


def main() -> int:
    p = base_parser(__doc__.split("\n\n")[0])
    p.add_argument("--rows", default=ROWS, help=f"token counts T (default {ROWS})")
    args = p.parse_args()
    b = Bench(args, "moe_prefill")
    torch = b.torch
    import numpy as np
    import memra
    from memra import _core

    geom, rows = (GEOM, [int(t) for t in args.rows.split(",")]) if b.cuda else SMOKE
    E, D, I, k = geom["E"], geom["D"], geom["I"], geom["k"]
    e = b.engine
    # The CUDA-core arm (the weights are shared: uploads finish before they are handed out; the
    # inputs are each engine's own, on its own stream).
    e_old = (memra.Engine("cuda", args.device_index,
                          options=memra.KernelOptions(moe_tensor_cores=False)) if b.cuda else None)
    rate = gemm_tflops(torch, b.dev) if b.cuda else None
    if rate:
        log(f"moe_prefill: torch bf16 GEMM 8192^3: {rate:.1f} TFLOP/s")
    gen = torch.Generator(device=b.dev).manual_seed(0)
    gw = (torch.randn(E, I, D, generator=gen, device=b.dev) * D ** -0.5).to(torch.bfloat16)
    uw = (torch.randn(E, I, D, generator=gen, device=b.dev) * D ** -0.5).to(torch.bfloat16)
    dw = (torch.randn(E, D, I, generator=gen, device=b.dev) * I ** -0.5).to(torch.bfloat16)

    def host_weight(t):
        return _core.Weight(t.cpu().view(torch.int16).numpy().view(np.uint16), dtype="bfloat16")

    if b.cuda:
        mg, mu, md = (_core.DeviceWeight(e, host_weight(t), dtype="bfloat16") for t in (gw, uw, dw))
    else:
        mg, mu, md = ([host_weight(t[i]) for i in range(E)] for t in (gw, uw, dw))
    rng = np.random.default_rng(0)
    for T in rows:
        shape = {"T": T, "E": E, "top_k": k, "D": D, "I": I, "w_dtype": "bfloat16"}
        log(f"moe_prefill: {shape}")
        idx = np.stack([rng.permutation(E)[:k] for _ in range(T)]).astype(np.int32)
        wts = rng.uniform(0.05, 0.5, (T, k)).astype(np.float32)
        x32 = torch.randn(T, D, generator=gen, device=b.dev).float()
        xh = x32.cpu().numpy()
        if b.cuda:
            xm, im, wm = e.to_device(xh), e.to_device(idx), e.to_device(wts)
            xo, io, wo = e_old.to_device(xh), e_old.to_device(idx), e_old.to_device(wts)

            def run_memra():
                return _core.moe_forward(xm, im, wm, mg, mu, md, limit=LIMIT, engine=e)

            def run_old():
                return _core.moe_forward(xo, io, wo, mg, mu, md, limit=LIMIT, engine=e_old)
        else:
            def run_memra():
                return _core.moe_forward(xh, idx, wts, mg, mu, md, limit=LIMIT)
            run_old = None

        lists = []
        for ex in sorted(set(idx.reshape(-1).tolist())):
            t_, j_ = np.nonzero(idx == ex)
            lists.append((ex, torch.as_tensor(t_, device=b.dev),
                          torch.as_tensor(wts[t_, j_], device=b.dev).unsqueeze(1)))
        xb = x32.to(torch.bfloat16)

        def run_peer(xin=xb, f32=False):
            y = torch.zeros(T, D, dtype=torch.float32, device=b.dev)
            for ex, toks, w in lists:
                xe = xin[toks]
                g_, u_, d_ = (gw[ex], uw[ex], dw[ex]) if not f32 else \
                    (gw[ex].float(), uw[ex].float(), dw[ex].float())
                g = torch.nn.functional.linear(xe, g_).float().clamp(max=LIMIT)
                u = torch.nn.functional.linear(xe, u_).float().clamp(-LIMIT, LIMIT)
                h = (torch.nn.functional.silu(g) * u).to(xin.dtype)
                y.index_add_(0, toks, torch.nn.functional.linear(h, d_).float() * w)
            return y

        flops = 6 * T * k * I * D
        nbytes = len(lists) * 3 * I * D * 2 + T * D * 8  # weights once, x in and y out (f32)
        memra_us = b.time_memra(run_memra)
        memra_k = b.kernel_us(run_memra)
        peer_us = b.time_torch(run_peer)
        old_k = None
        extra = {}
        if run_old is not None:
            b.use_engine(e_old)
            extra["old_us"] = b.time_memra(run_old)
            old_k = b.kernel_us(run_old)
            y_old = to_torch(run_old(), e_old, b.dev).float()
            b.use_engine(e)
        got = to_torch(run_memra(), e if b.cuda else None, b.dev).float()
        want = run_peer()
        ref = run_peer(x32, f32=True)
        roof = flops / (rate * 1e12) * 1e6 if rate else None
        if run_old is not None:
            extra["old_max_rel_err_ref"] = rel_err(y_old, ref)
            extra["tc_vs_old_max_rel_err"] = rel_err(got, y_old)
        b.emit(shape, memra_us, PEER, peer_us, nbytes,
               flops=flops, gemm_tflops=rate, tc_roofline_us=roof,
               memra_kernel_us=memra_k, old_kernel_us=old_k,
               kernel_speedup_vs_old=(old_k / memra_k) if (old_k and memra_k) else None,
               frac_of_tc_roofline=(roof / memra_k) if (roof and memra_k) else None,
               memra_tflops=(flops / memra_k / 1e6) if memra_k else None,
               peer_kernel_us=b.kernel_us(run_peer),
               max_rel_err=rel_err(got, want), max_rel_err_ref=rel_err(got, ref),
               peer_max_rel_err_ref=rel_err(want, ref), **extra)
        del ref, want, got
        b.release()
    return 0


if __name__ == "__main__":
    sys.exit(main())
