#!/usr/bin/env python3
"""Dense projections at decode batch sizes: memra's linear (2..64 rows, bf16 weight) vs torch.

memra: memra._core.linear(x [T, K] f32, w [N, K] bf16 DeviceWeight, engine=e) -> y [T, N] f32:
       x rounded to bf16, then the weight-streaming tensor-core GEMM (cuda/linear_tc.cu,
       KernelOptions.skinny_gemm). `memra_us` is the event time of the call;
       `memra_kernel_us` the kernels alone (what a CUDA-graph step pays), profiled on an Engine
       made with KernelOptions(pdl=False) (under programmatic launch a kernel's profiled duration
       includes its wait for the one in front); `kernel_frac_of_copy` the weight's bytes over that
       time against the measured copy rate. `cublas_kernel_us`: the same call on an Engine made
       with KernelOptions(skinny_gemm=False, pdl=False), i.e. the round kernel, cuBLAS's GEMM and
       its split-K reduction (the arm it replaces), and `cublas_launches` their count.
peer:  torch F.linear(x_bf16, w_bf16) (cuBLAS through torch, bf16 output), kernel time alone.
Shapes: the bench model's (GLM-5.3-Flash widths: hidden 4096, KDA 64 x 128 heads, MLA 64 heads
x 256, dense MLP 12288, vocab 154880) at T = 8, 32, 64. bytes = the weight, N x K x 2.

    python3 benchmarks/bench_skinny_gemm.py [--quick]
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from common import Bench, base_parser, log, rel_err, to_torch  # noqa: E402

# (name, N, K)
SHAPES = [("kda_qkv", 24576, 4096), ("kda_o", 4096, 8192), ("mla_o", 4096, 16384),
          ("mla_q_b", 16384, 1536), ("mlp_gate", 12288, 4096), ("mlp_down", 4096, 12288),
          ("lm_head", 154880, 4096)]
ROWS = [8, 32, 64]
SMOKE = ([("tiny", 48, 64)], [3])
PEER = "torch F.linear bf16 (cuBLAS)"


def main() -> int:
    p = base_parser(__doc__.split("\n\n")[0])
    args = p.parse_args()
    b = Bench(args, "skinny_gemm")
    torch = b.torch
    import numpy as np
    import memra
    from memra import _core

    shapes, rows = (SHAPES, ROWS) if b.cuda else SMOKE
    if args.quick and b.cuda:
        rows = [32]
    e = b.engine
    e_nopdl = (memra.Engine("cuda", args.device_index, options=memra.KernelOptions(pdl=False))
               if b.cuda else None)
    e_blas = (memra.Engine("cuda", args.device_index,
                           options=memra.KernelOptions(pdl=False, skinny_gemm=False))
              if b.cuda else None)
    gen = torch.Generator(device=b.dev).manual_seed(0)
    for name, N, K in shapes:
        w = (torch.randn(N, K, generator=gen, device=b.dev) * K ** -0.5).to(torch.bfloat16)
        hw = _core.Weight(w.cpu().view(torch.int16).numpy().view(np.uint16), dtype="bfloat16")
        if b.cuda:
            dw = _core.DeviceWeight(e, hw, dtype="bfloat16")
        for T in rows:
            shape = {"gemm": name, "T": T, "N": N, "K": K, "w_dtype": "bfloat16"}
            log(f"skinny_gemm: {shape}")
            x32 = torch.randn(T, K, generator=gen, device=b.dev).float()
            xh = x32.cpu().numpy()
            if b.cuda:
                xm, xn, xb_ = e.to_device(xh), e_nopdl.to_device(xh), e_blas.to_device(xh)

                def run_memra():
                    return _core.linear(xm, dw, engine=e)

                def run_nopdl():
                    return _core.linear(xn, dw, engine=e_nopdl)

                def run_blas():
                    return _core.linear(xb_, dw, engine=e_blas)
            else:
                def run_memra():
                    return _core.linear(xh, hw)
            xb = x32.to(torch.bfloat16)

            def run_peer():
                return torch.nn.functional.linear(xb, w)

            nbytes = N * K * 2
            memra_us = b.time_memra(run_memra)
            peer_us = b.time_torch(run_peer)
            memra_k = blas_k = None
            blas_n = None
            if b.cuda:
                memra_k = b.kernel_us(run_nopdl)
                e_nopdl.synchronize()
                blas_by = b.kernel_us_by_name(run_blas)
                blas_k = sum(blas_by.values())
                blas_n = len(blas_by)
                e_blas.synchronize()
            got = to_torch(run_memra(), e if b.cuda else None, b.dev).float()
            ref = (x32.to(torch.bfloat16).float() @ w.float().t())
            copy = b.copy_TBps
            b.emit(shape, memra_us, PEER, peer_us, nbytes,
                   memra_kernel_us=memra_k, peer_kernel_us=b.kernel_us(run_peer),
                   kernel_frac_of_copy=(nbytes / memra_k / 1e6 / copy) if memra_k else None,
                   cublas_kernel_us=blas_k, cublas_kernels=blas_n,
                   cublas_frac_of_copy=(nbytes / blas_k / 1e6 / copy) if blas_k else None,
                   max_rel_err_ref=rel_err(got, ref),
                   peer_max_rel_err_ref=rel_err(run_peer().float(), ref))
            b.release()
    return 0


if __name__ == "__main__":
    sys.exit(main())
