#!/usr/bin/env python3
"""Decode-shaped linear layers (few rows, a big bf16 weight): memra vs torch (cuBLAS).

memra: memra._core.linear(x [T, K] f32, DeviceWeight [N, K] bf16, engine=e) -> [T, N] f32
       (x rounded to bf16, f32 accumulation; T <= 4: memra's GEMV, else cuBLAS).
peer:  torch.nn.functional.linear(x bf16 [T, K], w bf16 [N, K]) -> bf16 (cuBLAS), the same
       weight tensor.
Shapes: the GLM-5.3-Flash projections a decode step reads (hidden 4096): KDA q/k/v (4096 ->
8192), KDA o (8192 -> 4096), MLA q_a (4096 -> 1536), MLA q_b (1536 -> 16384), MLA o
(16384 -> 4096), an expert's gate/up (4096 -> 2048), the LM head (4096 -> 154880); T = 1, 4, 32.
bytes = N * K * 2 (the weight, read once); frac_of_copy = that over the measured copy rate.
memra_kernel_us / peer_kernel_us: the kernels alone (torch.profiler), what a CUDA-graph step pays.

    python3 benchmarks/bench_linear_decode.py [--quick]
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from common import Bench, base_parser, log, rel_err, to_torch  # noqa: E402

SHAPES = [("kda_qkv", 4096, 8192), ("kda_o", 8192, 4096), ("mla_q_a", 4096, 1536),
          ("mla_q_b", 1536, 16384), ("mla_o", 16384, 4096), ("expert_gate", 4096, 2048),
          ("lm_head", 4096, 154880)]
ROWS = [1, 4, 32]
SMOKE = ([("tiny", 64, 48)], [1, 3])
PEER = "torch.nn.functional.linear (bf16, cuBLAS)"


def main() -> int:
    p = base_parser(__doc__.split("\n\n")[0])
    args = p.parse_args()
    b = Bench(args, "linear_decode")
    torch = b.torch
    import numpy as np
    from memra import _core

    shapes, rows = (SHAPES, ROWS) if b.cuda else SMOKE
    e = b.engine
    for name, K, N in shapes:
        gen = torch.Generator(device="cpu").manual_seed(0)
        w32 = torch.randn(N, K, generator=gen) / K ** 0.5
        wb = w32.to(torch.bfloat16)
        # memra's weight: the same bf16 values (bits as uint16 for the binding).
        bits = wb.view(torch.int16).numpy().view(np.uint16)
        weight = _core.Weight(bits, dtype="bfloat16")
        dw = _core.DeviceWeight(e, weight, dtype="bfloat16") if b.cuda else weight
        w_dev = wb.to(b.dev)
        for T in rows:
            shape = {"name": name, "T": T, "K": K, "N": N, "w_dtype": "bfloat16"}
            log(f"linear_decode: {shape}")
            x32 = torch.randn(T, K, generator=gen)
            xb = x32.to(torch.bfloat16).to(b.dev)
            if b.cuda:
                xm = e.to_device(x32.numpy())

                def run_memra():
                    return _core.linear(xm, dw, engine=e)
            else:
                xm = x32.numpy()

                def run_memra():
                    return _core.linear(xm, dw)

            def run_peer():
                return torch.nn.functional.linear(xb, w_dev)

            memra_us = b.time_memra(run_memra)
            peer_us = b.time_torch(run_peer)
            got = to_torch(run_memra(), e if b.cuda else None, b.dev).float()
            want = run_peer().float()
            ref = torch.nn.functional.linear(xb.float(), w_dev.float())
            b.emit(shape, memra_us, PEER, peer_us, N * K * 2,
                   memra_kernel_us=b.kernel_us(run_memra), peer_kernel_us=b.kernel_us(run_peer),
                   max_rel_err=rel_err(got, want), max_rel_err_ref=rel_err(got, ref),
                   peer_max_rel_err_ref=rel_err(want, ref))
            b.release()
        del dw, w_dev
    return 0


if __name__ == "__main__":
    sys.exit(main())
