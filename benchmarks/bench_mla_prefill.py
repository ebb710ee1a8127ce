#!/usr/bin/env python3
"""MLA prefill attention and the DSA indexer's prefill scorer: the f32 CUDA-core arm against the
bf16 tensor-core arm (issue 20), kernel time, with the tensor-core roofline.

ops (one sequence of T queries at p0 = 0, GLM-5.3-Flash widths unless said):
  mla_causal   _core.mla_attn_absorbed(q_lat [T, H, R] f32, cache [T, R + d_rope] bf16, q_pe,
               scale=, tensor_cores=) at GLM (H 64, R 512) and Kimi-Linear (H 32, R 512, rope 64)
  mla_gathered _core.mla_attn_gathered(..., idx [T, 2051], check_range=False): each query's top
               512 pools of 4 rows (random, visible) plus its tail, GLM widths
  dsa_score    _core.kpool_score(q [T, 32, 128] f32, w [T, 32], keys [T / 4, 128], pool=4,
               tensor_cores=)
memra_us = the new arm's kernel time (torch.profiler: the summed kernel durations of one call,
median); old_kernel_us the f32 arm's (fewer reps at 32K: it runs for seconds). peer: none (the
old arm is the figure beside ours; the peers of the whole prefill are in the model bench).
roofline_us = the op's multiply-adds x 2 / the bf16 GEMM rate torch measures here (8192^3
matmul): causal (R + d_rope + R) per (query, visible row, head), gathered the same per listed
row, the scorer d per (query, visible pool, head); frac_of_roofline = roofline_us / memra_us.
bytes (for frac_of_copy): the cache / keys and q read once, the output written once.

    python3 benchmarks/bench_mla_prefill.py [--quick] [--lengths 1024,8192,32768]
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from common import Bench, base_parser, gemm_tflops, log  # noqa: E402

GLM = dict(H=64, R=512, dr=0)
KIMI = dict(H=32, R=512, dr=64)
TOPK_POOLS, POOL = 512, 4


def main() -> int:
    p = base_parser(__doc__.split("\n\n")[0])
    p.add_argument("--lengths", default=None, help="comma-separated T (default 1024,8192,32768)")
    p.add_argument("--old-max-t", type=int, default=None,
                   help="longest T the f32 arm is timed at (default 32768; --quick 8192)")
    args = p.parse_args()
    b = Bench(args, "mla_prefill")
    torch = b.torch
    from memra import _core

    e = b.engine
    lengths = ([int(t) for t in args.lengths.split(",")] if args.lengths
               else ([1024, 8192, 32768] if b.cuda else [64]))
    old_max = args.old_max_t or (8192 if args.quick else 32768)
    tf = gemm_tflops(b)
    log(f"bf16 GEMM rate: {tf:.1f} TFLOP/s")
    gen = torch.Generator(device="cpu").manual_seed(0)
    dev = b.dev
    cdt = torch.bfloat16 if b.cuda else torch.float32  # the CPU backend takes f32 caches

    def arr(x):
        return x.contiguous()

    def run_pair(op, shape, call, macs, nbytes):
        # CPU smoke test: wall clock (the wiring; the arms are the same CPU op there).
        timer = b.kernel_us if b.cuda else (lambda fn, reps=None: b.time_memra(fn))
        new_us = timer(lambda: call(True))
        old_us = None
        if shape["T"] <= old_max:
            old_us = timer(lambda: call(False), reps=2 if shape["T"] > 8192 else None)
        roof = 2 * macs / (tf * 1e6)
        b.emit(dict(op=op, **shape), new_us, "memra f32 CUDA-core arm", old_us, nbytes,
               old_kernel_us=old_us, roofline_us=roof,
               frac_of_roofline=(roof / new_us) if new_us else None,
               speedup_vs_old=(old_us / new_us) if (old_us and new_us) else None,
               gemm_tflops=tf, macs=macs)
        b.release()

    for T in lengths:
        vis = T * (T + 1) // 2  # (query, visible row) pairs, causal from row 0
        for name, g in (("glm", GLM), ("kimi", KIMI)):
            H, R, dr = g["H"], g["R"], g["dr"]
            q = arr(torch.randn(T, H, R, generator=gen).mul_(8 / R ** 0.5)).to(dev)
            pe = arr(torch.randn(T, H, dr, generator=gen)).to(dev) if dr else None
            cache = torch.randn(T, R + dr, generator=gen).to(cdt).to(dev)

            def call(tc, q=q, pe=pe, cache=cache):
                return _core.mla_attn_absorbed(q, cache, pe, scale=0.06, tensor_cores=tc,
                                               engine=e)

            macs = vis * H * (2 * R + dr)
            nbytes = T * (R + dr) * 2 + q.numel() * 4 * 2
            run_pair("mla_causal", dict(geom=name, T=T, H=H, R=R, d_rope=dr), call, macs, nbytes)
            del q, pe, cache

        # Gathered (GLM-5.3-Flash DSA): top 512 pools of 4 among the visible ones, plus the tail.
        H, R = GLM["H"], GLM["R"]
        width = TOPK_POOLS * POOL + POOL - 1
        i = torch.arange(T).unsqueeze(1)
        n_vis_pools = (i + 1) // POOL
        pools = (torch.rand(T, TOPK_POOLS, generator=gen) * n_vis_pools).long()
        rows = (pools.unsqueeze(2) * POOL + torch.arange(POOL)).reshape(T, -1)
        rows = torch.where(n_vis_pools > 0, rows, torch.full_like(rows, -1))
        tail = i - (i % POOL) + torch.arange(POOL - 1)
        tail = torch.where(tail <= i, tail, torch.full_like(tail, -1))
        idx = torch.cat([rows, tail], 1).to(torch.int32).contiguous().to(dev)
        listed = int(torch.minimum(i.squeeze(1) + 1, torch.full((T,), TOPK_POOLS * POOL + POOL - 1))
                     .sum())
        q = arr(torch.randn(T, H, R, generator=gen).mul_(8 / R ** 0.5)).to(dev)
        cache = torch.randn(T, R, generator=gen).to(cdt).to(dev)

        def gcall(tc, q=q, cache=cache, idx=idx):
            return _core.mla_attn_gathered(q, cache, idx, scale=0.06, check_range=False,
                                           tensor_cores=tc, engine=e)

        run_pair("mla_gathered", dict(geom="glm", T=T, H=H, R=R, width=width), gcall,
                 listed * H * 2 * R, T * width * R * 2 + q.numel() * 8)
        del q, cache, idx

        # The indexer's scorer.
        Hi, d = 32, 128
        qi = torch.randn(T, Hi, d, generator=gen).to(dev)
        w = torch.randn(T, Hi, generator=gen).to(dev)
        keys = torch.randn(max(T // POOL, 1), d, generator=gen).to(dev)
        n_pools = T // POOL

        def scall(tc, qi=qi, w=w, keys=keys):
            return _core.kpool_score(qi, w, keys, pool=POOL, first_pos=0, qk_scale=d ** -0.5,
                                     head_scale=Hi ** -0.5, tensor_cores=tc, engine=e)

        pairs = sum(min((t + 1) // POOL, n_pools) for t in range(T))
        run_pair("dsa_score", dict(T=T, Hi=Hi, d=d, pool=POOL), scall, pairs * Hi * d,
                 qi.numel() * 4 + T * n_pools * 4)
        del qi, w, keys
    return 0


if __name__ == "__main__":
    sys.exit(main())
