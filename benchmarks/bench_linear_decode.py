#!/usr/bin/env python3
"""Decode-shaped linear layers (few rows, a big bf16 weight): memra's two arms vs torch (cuBLAS).

memra: memra._core.linear(x [T, K] f32, DeviceWeight [N, K] bf16, engine=e) -> [T, N] f32
       (x rounded to bf16, f32 accumulation; T = 1: memra's GEMV; T = 2..64: cuBLAS, or with
       KernelOptions(linear_skinny=True) memra's weight-streaming wgmma kernel,
       cuda/linear_skinny.cu). memra_us / memra_kernel_us: the default Engine; cublas_kernel_us
       and skinny_kernel_us: the kernels alone (torch.profiler) on Engines made with
       KernelOptions(pdl=False) and linear_skinny False / True (so a programmatic dependent's
       wait is not in the figure), what a CUDA-graph step pays; the skinny arm's output against
       the float32 product over the same bf16 x and w is skinny_max_rel_err_ref.
peer:  torch.nn.functional.linear(x bf16 [T, K], w bf16 [N, K]) -> bf16 (cuBLAS), the same
       weight tensor.
Shapes: the projections a decode step of bench_model_decode's model reads (GLM-5.3-Flash widths,
hidden 4096): KDA q|k|v (4096 -> 3 x 8192) and o (8192 -> 4096), MLA q_b (1536 -> 16384) and o
(16384 -> 4096), the dense MLP's gate|up (4096 -> 2 x 12288) and down (12288 -> 4096), the
shared expert's gate|up (4096 -> 2 x 2048) and down (2048 -> 4096), the LM head (4096 ->
154880); T = 1, 4, 8, 32, 64 (--rows). bytes = N * K * 2 (the weight, read once);
frac_of_copy = that over the measured copy rate (skinny_frac_of_copy, cublas_frac_of_copy: the
kernel times').

    python3 benchmarks/bench_linear_decode.py [--quick] [--rows 8,32,64] [--shapes kda_o,mla_o]
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from common import Bench, base_parser, log, rel_err, to_torch  # noqa: E402

SHAPES = [("kda_qkv", 4096, 24576), ("kda_o", 8192, 4096), ("mla_q_b", 1536, 16384),
          ("mla_o", 16384, 4096), ("mlp_gate_up", 4096, 24576), ("mlp_down", 12288, 4096),
          ("shared_gate_up", 4096, 4096), ("shared_down", 2048, 4096), ("lm_head", 4096, 154880)]
ROWS = [1, 4, 8, 32, 64]
SMOKE = ([("tiny", 64, 48)], [1, 3])
PEER = "torch.nn.functional.linear (bf16, cuBLAS)"


def main() -> int:
    p = base_parser(__doc__.split("\n\n")[0])
    p.add_argument("--rows", default=None, help="comma-separated T (default 1,4,8,32,64)")
    p.add_argument("--shapes", default=None, help="comma-separated shape names (default all)")
    args = p.parse_args()
    b = Bench(args, "linear_decode")
    torch = b.torch
    import numpy as np
    from memra import _core

    shapes, rows = (SHAPES, ROWS) if b.cuda else SMOKE
    if args.rows:
        rows = [int(t) for t in args.rows.split(",")]
    if args.shapes:
        shapes = [s for s in shapes if s[0] in args.shapes.split(",")]
    e = b.engine
    arms = {}
    if b.cuda:
        import memra
        arms = {name: memra.Engine("cuda", args.device_index,
                                   options=memra.KernelOptions(pdl=False, linear_skinny=on))
                for name, on in (("cublas", False), ("skinny", True))}
    for name, K, N in shapes:
        gen = torch.Generator(device="cpu").manual_seed(0)
        w32 = torch.randn(N, K, generator=gen) / K ** 0.5
        wb = w32.to(torch.bfloat16)
        # memra's weight: the same bf16 values (bits as uint16 for the binding).
        bits = wb.view(torch.int16).numpy().view(np.uint16)
        weight = _core.Weight(bits, dtype="bfloat16")
        dw = _core.DeviceWeight(e, weight, dtype="bfloat16") if b.cuda else weight
        arm_w = {n: _core.DeviceWeight(ae, weight, dtype="bfloat16") for n, ae in arms.items()}
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
            extra = {}
            for n, ae in arms.items():
                xa = ae.to_device(x32.numpy())

                def run_arm(ae=ae, xa=xa, wa=arm_w[n]):
                    return _core.linear(xa, wa, engine=ae)

                b.use_engine(ae)
                k_us = b.kernel_us(run_arm)
                extra[f"{n}_kernel_us"] = k_us
                if k_us:
                    extra[f"{n}_frac_of_copy"] = round(N * K * 2 / k_us / 1e6 / b.copy_TBps, 4)
                extra[f"{n}_max_rel_err_ref"] = rel_err(to_torch(run_arm(), ae, b.dev).float(), ref)
                b.use_engine(e)
            b.emit(shape, memra_us, PEER, peer_us, N * K * 2,
                   memra_kernel_us=b.kernel_us(run_memra), peer_kernel_us=b.kernel_us(run_peer),
                   max_rel_err=rel_err(got, want), max_rel_err_ref=rel_err(got, ref),
                   peer_max_rel_err_ref=rel_err(want, ref), **extra)
            b.release()
        del dw, w_dev, arm_w
    return 0


if __name__ == "__main__":
    sys.exit(main())
