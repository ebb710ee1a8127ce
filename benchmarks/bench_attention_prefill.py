#!/usr/bin/env python3
"""The gated full attention's prefill (Qwen3.5 / Qwen3-Next): the f32 CUDA-core kernel against the
bf16 tensor-core kernel (KernelOptions.attn_prefill_tensor_cores), with torch SDPA as the peer.

op:    _core.attention(q [T, Hq, hd] f32, k_cache / v_cache [T, Hkv, hd] bf16, scale=hd^-0.5,
       gate [T, Hq, hd] f32, pos0=0, engine=e): one sequence's causal prefill, o * sigmoid(gate).
       memra_us / memra_kernel_us: the tensor-core arm (an Engine made with
       KernelOptions(attn_prefill_tensor_cores=True)); old_us / old_kernel_us: the f32 kernel
       (the default Engine). *_us by CUDA events around one call, *_kernel_us the kernels alone
       (torch.profiler).
peer:  torch.nn.functional.scaled_dot_product_attention over bf16 [1, H, T, hd] (is_causal, the
       K/V heads repeated for the groups; torch picks its flash kernel), then * sigmoid(gate) in
       bf16: what transformers' sdpa attention path runs.
Accuracy: max_rel_err / old_max_rel_err / peer_max_rel_err: each arm against float32 SDPA math on
the same bf16 q, k, v (max |d| / max |ref|).
Roofline: flops = 4 * hd * Hq * T (T + 1) / 2 (the two products over the causal half);
`gemm_tflops` is torch's bf16 8192^3 matmul rate in the same run, `frac_of_tc_roofline` =
flops / rate / memra_kernel_us.
Shapes: Qwen3.5-4B's attention (16 query heads, 4 K/V heads, head_dim 256), T = 1024 and 8192
(--lengths).

    python3 benchmarks/bench_attention_prefill.py [--quick] [--lengths 1024,8192]
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from common import Bench, base_parser, gemm_tflops, log, rel_err, to_torch  # noqa: E402

GEOM = dict(Hq=16, Hkv=4, hd=256)
SMOKE = (dict(Hq=4, Hkv=2, hd=64), [7, 70])
PEER = "torch SDPA (bf16, causal, flash) + sigmoid gate"


def main() -> int:
    p = base_parser(__doc__.split("\n\n")[0])
    p.add_argument("--lengths", default=None, help="comma-separated T (default 1024,8192)")
    args = p.parse_args()
    b = Bench(args, "attention_prefill")
    torch = b.torch
    import numpy as np
    import memra
    from memra import _core

    geom, lengths = (GEOM, [1024, 8192]) if b.cuda else SMOKE
    if args.lengths:
        lengths = [int(t) for t in args.lengths.split(",")]
    Hq, Hkv, hd = geom["Hq"], geom["Hkv"], geom["hd"]
    G = Hq // Hkv
    scale = hd ** -0.5
    e_old = b.engine
    e_tc = (memra.Engine("cuda", args.device_index,
                         options=memra.KernelOptions(attn_prefill_tensor_cores=True)) if b.cuda else e_old)
    rate = gemm_tflops(b)
    log(f"attention_prefill: torch bf16 GEMM: {rate:.1f} TFLOP/s")
    gen = torch.Generator(device=b.dev).manual_seed(0)
    for T in lengths:
        shape = {"T": T, "Hq": Hq, "Hkv": Hkv, "hd": hd, "cache": "bfloat16", "pos0": 0}
        log(f"attention_prefill: {shape}")
        qb = torch.randn(T, Hq, hd, generator=gen, device=b.dev).to(torch.bfloat16)
        kb = torch.randn(T, Hkv, hd, generator=gen, device=b.dev).to(torch.bfloat16)
        vb = torch.randn(T, Hkv, hd, generator=gen, device=b.dev).to(torch.bfloat16)
        gate = torch.randn(T, Hq, hd, generator=gen, device=b.dev)
        host = {
            "q": qb.float().cpu().numpy(),
            "k": kb.cpu().view(torch.int16).numpy().view(np.uint16),
            "v": vb.cpu().view(torch.int16).numpy().view(np.uint16),
            "gate": gate.cpu().numpy(),
        }

        def op(eng):
            if not b.cuda:
                return lambda: _core.attention(host["q"], host["k"], host["v"], scale=scale,
                                               gate=host["gate"], pos0=0)
            d = {n: eng.to_device(a) for n, a in host.items()}
            return lambda: _core.attention(d["q"], d["k"], d["v"], scale=scale, gate=d["gate"],
                                           pos0=0, engine=eng)

        run_tc, run_old = op(e_tc), op(e_old)
        # SDPA wants [B, H, T, hd]; the K/V heads repeated for the groups (h // G), as repeat_kv.
        qt = qb.transpose(0, 1)[None]
        kt = kb.transpose(0, 1).repeat_interleave(G, dim=0)[None]
        vt = vb.transpose(0, 1).repeat_interleave(G, dim=0)[None]
        gb = gate.to(torch.bfloat16)

        def run_peer(f32=False):
            if f32:
                o = torch.nn.functional.scaled_dot_product_attention(
                    qt.float(), kt.float(), vt.float(), is_causal=True, scale=scale)
                return o[0].transpose(0, 1) * torch.sigmoid(gate)
            o = torch.nn.functional.scaled_dot_product_attention(qt, kt, vt, is_causal=True, scale=scale)
            return o[0].transpose(0, 1) * torch.sigmoid(gb)

        flops = 4 * hd * Hq * T * (T + 1) // 2
        nbytes = T * Hq * hd * 4 * 3 + 2 * T * Hkv * hd * 2  # q, gate in, o out (f32); K, V once
        b.use_engine(e_tc)
        memra_us = b.time_memra(run_tc)
        memra_k = b.kernel_us(run_tc)
        got = to_torch(run_tc(), e_tc if b.cuda else None, b.dev).float()
        b.use_engine(e_old)
        old_us = b.time_memra(run_old)
        old_k = b.kernel_us(run_old)
        got_old = to_torch(run_old(), e_old if b.cuda else None, b.dev).float()
        peer_us = b.time_torch(run_peer) if b.cuda else None
        peer_k = b.kernel_us(run_peer)
        ref = run_peer(f32=True)
        roof = flops / (rate * 1e12) * 1e6
        b.emit(shape, memra_us, PEER, peer_us, nbytes,
               flops=flops, gemm_tflops=rate, tc_roofline_us=roof,
               memra_kernel_us=memra_k, old_us=old_us, old_kernel_us=old_k, peer_kernel_us=peer_k,
               kernel_speedup_vs_old=(old_k / memra_k) if (old_k and memra_k) else None,
               kernel_ratio_vs_peer=(peer_k / memra_k) if (peer_k and memra_k) else None,
               memra_tflops=(flops / memra_k / 1e6) if memra_k else None,
               frac_of_tc_roofline=(roof / memra_k) if memra_k else None,
               max_rel_err=rel_err(got, ref), old_max_rel_err=rel_err(got_old, ref),
               peer_max_rel_err=rel_err(run_peer().float(), ref))
        del got, got_old, ref
        b.release()
    return 0


if __name__ == "__main__":
    sys.exit(main())
