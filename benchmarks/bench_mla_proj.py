#!/usr/bin/env python3
"""MLA q absorption and v decompression at decode widths: memra vs torch einsum (cuBLAS).

memra: memra._core.mla_absorb_q(q_nope [T, H, d_nope] f32, kv_b, d_v=, engine=e) -> q_lat
       [T, H, R] f32 and mla_decompress_v(o_lat [T, H, R] f32, kv_b, d_nope=, engine=e) -> [T, H,
       d_v] f32, kv_b a bf16 DeviceWeight [H * (d_nope + d_v), R]; arm 0 (auto: the streaming
       kernel below T = 64, the CPU's bytes).
peer:  torch.einsum over bf16 operands, the same kv_b viewed [H, d_nope + d_v, R]:
       absorb 'thn,hnr->thr' (W_uk = kv_b[:, :d_nope]), decompress 'thr,hvr->thv' (W_uv =
       kv_b[:, d_nope:]) -> bf16 (cuBLAS batched GEMM).
Shapes: H = 64, R = 512 with d_nope = d_v = 128 (glm_128) and 256 (glm_256, the widths of
bench_model_decode); T = 1, 8, 32. bytes = the half of kv_b the op reads, H * d * R * 2, read once;
frac_of_copy = that over the measured copy rate (memra_us, event-timed, includes the host at
T = 1); kernel_frac_of_copy = bytes / memra_kernel_us over copy_TBps (the kernels alone, what a
CUDA-graph step pays).
Extra fields: memra_kernel_us / peer_kernel_us (torch.profiler); arm{1,2,3}_kernel_us: memra's
explicit arms (1 per-position kernel, 2 streaming kernel, 3 cuBLASLt on bf16-rounded
activations); max_rel_err_ref / peer_max_rel_err_ref vs a float64 einsum over the same bf16
weights (memra's activations f32, the peer's rounded to bf16); arm2_equals_arm1: byte equality.

    python3 benchmarks/bench_mla_proj.py [--quick]
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from common import Bench, base_parser, log, rel_err, to_torch  # noqa: E402

GEOMS = [("glm_128", 64, 512, 128, 128), ("glm_256", 64, 512, 256, 256)]  # (name, H, R, dn, dv)
ROWS = [1, 8, 32]
SMOKE = ([("tiny", 4, 32, 16, 16)], [1, 3])
PEER = "torch.einsum (bf16, cuBLAS)"


def main() -> int:
    p = base_parser(__doc__.split("\n\n")[0])
    args = p.parse_args()
    b = Bench(args, "mla_proj")
    torch = b.torch
    import numpy as np
    from memra import _core

    geoms, rows = (GEOMS, ROWS) if b.cuda else SMOKE
    e = b.engine
    for name, H, R, dn, dv in geoms:
        gen = torch.Generator(device="cpu").manual_seed(0)
        kv32 = torch.randn(H * (dn + dv), R, generator=gen) / dn ** 0.5
        kvb = kv32.to(torch.bfloat16)
        bits = kvb.view(torch.int16).numpy().view(np.uint16)
        weight = _core.Weight(bits, dtype="bfloat16")
        dw = _core.DeviceWeight(e, weight, dtype="bfloat16") if b.cuda else weight
        w3 = kvb.to(b.dev).view(H, dn + dv, R)
        w_uk, w_uv = w3[:, :dn], w3[:, dn:]
        for which in ("absorb", "decompress"):
            d = dn if which == "absorb" else dv
            K = dn if which == "absorb" else R
            for T in rows:
                shape = {"name": name, "op": which, "T": T, "H": H, "R": R, "d_nope": dn, "d_v": dv,
                         "w_dtype": "bfloat16"}
                log(f"mla_proj: {shape}")
                x32 = torch.randn(T, H, K, generator=gen)
                xb = x32.to(torch.bfloat16).to(b.dev)
                if which == "absorb":
                    fn, kw = _core.mla_absorb_q, dict(d_v=dv)

                    def run_peer():
                        return torch.einsum("thn,hnr->thr", xb, w_uk)
                    ref = torch.einsum("thn,hnr->thr", x32.to(b.dev).double(), w_uk.double())
                else:
                    fn, kw = _core.mla_decompress_v, dict(d_nope=dn)

                    def run_peer():
                        return torch.einsum("thr,hvr->thv", xb, w_uv)
                    ref = torch.einsum("thr,hvr->thv", x32.to(b.dev).double(), w_uv.double())
                xm = e.to_device(x32.numpy()) if b.cuda else x32.numpy()

                def run_arm(arm):
                    if b.cuda:
                        return lambda: fn(xm, dw, arm=arm, engine=e, **kw)
                    return lambda: fn(xm, dw, **kw)

                run_memra = run_arm(0)
                memra_us = b.time_memra(run_memra)
                peer_us = b.time_torch(run_peer)
                got = to_torch(run_memra(), e if b.cuda else None, b.dev).float()
                want = run_peer().float()
                extra = dict(memra_kernel_us=b.kernel_us(run_memra), peer_kernel_us=b.kernel_us(run_peer),
                             max_rel_err=rel_err(got, want), max_rel_err_ref=rel_err(got, ref),
                             peer_max_rel_err_ref=rel_err(want, ref))
                nbytes = H * d * R * 2
                if b.cuda:
                    for arm in (1, 2, 3):
                        try:
                            extra[f"arm{arm}_kernel_us"] = b.kernel_us(run_arm(arm))
                        except Exception as err:  # noqa: BLE001  (e.g. cuBLASLt declines)
                            extra[f"arm{arm}_error"] = f"{type(err).__name__}: {err}"
                    a1 = to_torch(run_arm(1)(), e, b.dev)
                    a2 = to_torch(run_arm(2)(), e, b.dev)
                    b.sync()
                    extra["arm2_equals_arm1"] = bool(torch.equal(a1, a2))
                    k_us = extra["memra_kernel_us"]
                    if k_us:
                        extra["kernel_frac_of_copy"] = round(nbytes / k_us / 1e6 / b.copy_TBps, 4)
                        extra["kernel_ratio"] = (round(extra["peer_kernel_us"] / k_us, 4)
                                                 if extra["peer_kernel_us"] else None)
                b.emit(shape, memra_us, PEER, peer_us, nbytes, **extra)
                b.release()
    return 0


if __name__ == "__main__":
    sys.exit(main())
