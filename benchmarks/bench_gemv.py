#!/usr/bin/env python3
"""Decode GEMMs (T = 1 and 4 rows) at the GLM-5.3-Flash widths of bench_model_decode: memra's
GEMV (cuda/gemv.cu) vs cuBLAS through memra (an Engine made with KernelOptions(gemv=False): the
same call, x rounded to bf16 by a separate launch, then cublasGemmEx) vs torch F.linear on bf16
(peer).

memra: memra._core.linear(x [T, K] f32, w bf16 DeviceWeight [N, K], engine=e) -> y [T, N] f32.
peer:  torch.nn.functional.linear(x bf16, w bf16) -> bf16 (cuBLAS).
memra_us / cublas_kernel_us / peer_us are the kernels alone (torch.profiler; what a CUDA-graph step
pays); memra's are measured on an Engine made with KernelOptions(pdl=False), because with
programmatic dependent launch a kernel starts before its predecessor ends and its profiled duration includes
that wait. memra_chain_us: events around 20 back-to-back calls / 20 with launch on (a chain of
GEMMs as in a decode step; host launch cost included, which hides under GPU time from ~10 us up).
Weights are rotated over enough copies that every call reads DRAM, not L2 (> 200 MB per
rotation). bytes = the weight, read once; frac_of_copy = bytes / memra_us over the copy rate.
Extra fields: max_rel_err_cpu (memra vs a float64 product of the same bf16 operands),
gemv_rows (--gemv-rows: KernelOptions.gemv_rows of every memra engine here; 0 = from N).

    python3 benchmarks/bench_gemv.py [--quick] [--only kda_o,mla_o] [--rows 1] [--gemv-rows 4]
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from common import Bench, base_parser, log, rel_err, to_torch  # noqa: E402

# (name, K, N) at hidden 4096 (bench_model_decode's model).
SHAPES = [
    ("kda_qkv", 4096, 24576), ("kda_o", 8192, 4096), ("mlp_gate_up", 4096, 24576),
    ("mlp_down", 12288, 4096), ("shared_gate_up", 4096, 4096), ("shared_down", 2048, 4096),
    ("mla_o", 16384, 4096), ("mla_in", 4096, 2336), ("mla_qb", 1536, 20480), ("lm_head", 4096, 154880),
]
ROWS = [1, 4]
SMOKE = ([("tiny", 64, 48)], [1, 3])
PEER = "torch F.linear (bf16, cuBLAS)"


def main() -> int:
    p = base_parser(__doc__.split("\n\n")[0])
    p.add_argument("--only", default=None, help="comma-separated shape names (default: all)")
    p.add_argument("--rows", default=None, help="comma-separated T values (default 1,4)")
    p.add_argument("--gemv-rows", type=int, default=0,
                   help="KernelOptions.gemv_rows of the memra engines: 1, 2, 4, 8 (0: from N)")
    args = p.parse_args()
    import memra

    b = Bench(args, "gemv", kernel_options=memra.KernelOptions(gemv_rows=args.gemv_rows))
    torch = b.torch
    import numpy as np
    from memra import _core

    shapes, rows = (SHAPES, ROWS) if b.cuda else SMOKE
    if args.only:
        shapes = [sh for sh in shapes if sh[0] in args.only.split(",")]
    if args.rows:
        rows = [int(v) for v in args.rows.split(",")]
    def engine_with(**fields):
        opts = memra.KernelOptions(gemv_rows=args.gemv_rows, **fields)
        return memra.Engine("cuda", args.device_index, options=opts)

    e = b.engine
    e_blas = engine_with(gemv=False, pdl=False) if b.cuda else None
    e_flat = engine_with(pdl=False) if b.cuda else None
    for name, K, N in shapes:
        nbytes = 2 * K * N
        copies = max(1, -(-200_000_000 // nbytes)) if b.cuda else 1
        gen = torch.Generator(device="cpu").manual_seed(K + N)
        w32 = torch.randn(N, K, generator=gen) / K ** 0.5
        wb = w32.to(torch.bfloat16)
        bits = wb.view(torch.int16).numpy().view(np.uint16)
        weight = _core.Weight(bits, dtype="bfloat16")
        dws = [_core.DeviceWeight(e, weight, dtype="bfloat16") for _ in range(copies)] if b.cuda else [weight]
        dbs = [_core.DeviceWeight(e_blas, weight, dtype="bfloat16") for _ in range(copies)] if b.cuda else []
        dfs = [_core.DeviceWeight(e_flat, weight, dtype="bfloat16") for _ in range(copies)] if b.cuda else []
        tws = [wb.to(b.dev) for _ in range(copies)]
        for T in rows:
            x = torch.randn(T, K, generator=gen)
            xn = x.numpy()
            if b.cuda:
                xd, xb, xf = e.to_device(xn), e_blas.to_device(xn), e_flat.to_device(xn)
            xt = x.to(b.dev).to(torch.bfloat16)
            it = {"m": 0, "c": 0, "p": 0, "f": 0}

            def memra_call():
                it["m"] = (it["m"] + 1) % copies
                return _core.linear(xd, dws[it["m"]], engine=e) if b.cuda else _core.linear(xn, weight)

            def flat_call():
                it["f"] = (it["f"] + 1) % copies
                return _core.linear(xf, dfs[it["f"]], engine=e_flat)

            def chain():
                for _ in range(20):
                    memra_call()

            def blas_call():
                it["c"] = (it["c"] + 1) % copies
                return _core.linear(xb, dbs[it["c"]], engine=e_blas)

            def peer_call():
                it["p"] = (it["p"] + 1) % copies
                return torch.nn.functional.linear(xt, tws[it["p"]])

            y = to_torch(memra_call(), e, b.dev)
            ref = (x.to(torch.bfloat16).double() @ wb.double().T)
            err = rel_err(y.cpu(), ref)
            memra_k = b.kernel_us(flat_call) if b.cuda else None
            blas_k = b.kernel_us(blas_call) if b.cuda else None
            peer_k = b.kernel_us(peer_call) if b.cuda else None
            memra_us = memra_k if memra_k else b.time_memra(memra_call)
            chain_us = b.time_memra(chain) / 20 if b.cuda else None
            log(f"{name} T={T}: memra {memra_us:.1f} us (chain {chain_us}), cuBLAS {blas_k} us, "
                f"torch {peer_k} us, err {err:.2e}")
            b.emit({"name": name, "T": T, "K": K, "N": N, "dtype": "bfloat16"}, memra_us, PEER, peer_k,
                   nbytes, memra_kernel_us=memra_k, memra_chain_us=chain_us,
                   chain_frac_of_copy=(nbytes / chain_us / 1e6 / b.copy_TBps) if chain_us else None,
                   cublas_kernel_us=blas_k,
                   cublas_frac_of_copy=(nbytes / blas_k / 1e6 / b.copy_TBps) if blas_k else None,
                   max_rel_err_cpu=err, gemv_rows=args.gemv_rows or None)
        del dws, dbs, dfs, tws
        b.release()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
