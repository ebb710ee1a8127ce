#!/usr/bin/env python3
"""The KDA short conv's batched decode (cuda/kda_conv.cu) at the bench model's width, kernel alone.

memra: memra._core.kda_conv(x [B, C] f32, w [C, K] f32, rings [B, C, K-1] f32, batch=True,
       l2_dk=, engine=e) -> (y, rings_out): B rows of one token through the decode kernel
       (the TABLES form). C = 3 x 64 x 128 = 24576 (glm5_next's fused q|k|v), K = 4.
       Arms: "vec_l2" (l2_dk = 128: conv_decode_vec_kernel with the fused L2 norm of q and k,
       KdaLayer's launch), "vec" (no norm), "scalar" (C = 24574, not a multiple of 4: the
       scalar conv_decode_kernel, the form every row took before the vector kernel).
       `memra_kernel_us`: the kernels alone (torch.profiler) on an Engine made with
       KernelOptions(pdl=False); `kernel_frac_of_copy`: bytes / that time / the measured copy.
peer:  torch, the same arithmetic in eager ops (cat, mul, sum, silu, norm): a reference time.
bytes = x + y + rings in + rings out + w, f32.

    python3 benchmarks/bench_kda_conv_decode.py [--quick]
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from common import Bench, base_parser, log, rel_err, to_torch  # noqa: E402

K = 4
ARMS = [("vec_l2", 24576, 128), ("vec", 24576, 0), ("scalar", 24574, 0)]
ROWS = [32, 64, 256]
SMOKE = ([("vec_l2", 256, 128), ("scalar", 254, 0)], [3])
PEER = "torch eager (cat, mul, sum, silu, L2 norm)"


def main() -> int:
    p = base_parser(__doc__.split("\n\n")[0])
    args = p.parse_args()
    b = Bench(args, "kda_conv_decode")
    torch = b.torch
    import memra
    from memra import _core

    arms, rows = (ARMS, ROWS) if b.cuda else SMOKE
    e = (memra.Engine("cuda", args.device_index, options=memra.KernelOptions(pdl=False))
         if b.cuda else None)
    if e is not None:
        b.use_engine(e)
    gen = torch.Generator(device=b.dev).manual_seed(0)
    for B in rows:
        for arm, C, l2_dk in arms:
            shape = {"arm": arm, "B": B, "C": C, "K": K, "l2_dk": l2_dk}
            log(f"kda_conv_decode: {shape}")
            x = torch.randn(B, C, generator=gen, device=b.dev)
            w = 0.5 * torch.randn(C, K, generator=gen, device=b.dev)
            rg = torch.randn(B, C, K - 1, generator=gen, device=b.dev)
            xh, wh, rh = (t.cpu().numpy() for t in (x, w, rg))
            if b.cuda:
                xm, wm, rm = e.to_device(xh), e.to_device(wh), e.to_device(rh)

                def run_memra():
                    return _core.kda_conv(xm, wm, rm, batch=True, l2_dk=l2_dk, engine=e)
            else:
                def run_memra():
                    return _core.kda_conv(xh, wh, rh, batch=True, l2_dk=l2_dk)

            def run_peer():
                win = torch.cat([rg, x.unsqueeze(-1)], dim=-1)  # [B, C, K]
                y = torch.nn.functional.silu((win * w).sum(-1))
                if l2_dk:
                    y = torch.nn.functional.normalize(y.view(B, C // l2_dk, l2_dk), dim=-1,
                                                      eps=1e-6).view(B, C)
                return y, win[..., 1:]

            nbytes = 4 * (B * C * 2 + B * C * (K - 1) * 2 + C * K)
            memra_us = b.time_memra(run_memra)
            peer_us = b.time_torch(run_peer)
            memra_k = b.kernel_us(run_memra)
            got = to_torch(run_memra()[0], e, b.dev).float()
            want = run_peer()[0]
            b.emit(shape, memra_us, PEER, peer_us, nbytes,
                   memra_kernel_us=memra_k, peer_kernel_us=b.kernel_us(run_peer),
                   kernel_frac_of_copy=(nbytes / memra_k / 1e6 / b.copy_TBps) if memra_k else None,
                   max_rel_err=rel_err(got, want))
            b.release()
    return 0


if __name__ == "__main__":
    sys.exit(main())
