#!/usr/bin/env python3
"""Routed experts at decode batch sizes: memra's moe_forward vs torch (per-expert F.linear).

memra: memra._core.moe_forward(x [T, D] f32, idx [T, k] int32, w [T, k] f32, gate/up [E, I, D],
       down [E, D, I] bf16 DeviceWeights, limit=, engine=e) -> y [T, D] f32. T = 1 runs the
       per-pair kernels; T >= 2 the tensor-core grouped GEMMs (cuda/moe_tc.cu). The binding
       copies the ids to the host for its range check (one synchronisation per call), so the event
       time `memra_us` includes that; `memra_kernel_us` is the kernels alone (what a CUDA-graph
       step pays), profiled on an Engine made with KernelOptions(pdl=False): under programmatic
       launch a kernel starts before the one in front ends and its profiled duration includes
       that wait (`memra_pdl_kernel_us`, the default Engine's figure); `kernel_frac_of_copy`
       is its bandwidth over the measured copy rate.
       `old_kernel_us`: the CUDA-core grouped kernels (cuda/moe_grouped.cu) at the same T (an
       Engine made with KernelOptions(moe_tensor_cores=False)); `pair_kernel_us`: the per-pair
       kernels at the same T (KernelOptions(moe_grouped_min_t=2**30)); `old_equals_pair_bits`
       whether those two give the same bytes (they must).
peer:  torch, bf16: for each expert with tokens (lists made on the host beforehand), gather the
       rows, F.linear gate and up, the clamped SwiGLU in f32, F.linear down, * routing weight,
       index_add_ into y f32.
Shapes: GLM-5.3-Flash widths (D = 4096, I = 2048, 32 routed experts, top 8), T = 1, 2, 4, 8,
32, 64; uniform random routing (seeded) and, from T = 16, a skewed one as well (`"routing":
"zipf"`: each token's k distinct experts drawn with probabilities proportional to 1 / rank over a
random order of the experts, so the first few experts take most tokens; `max_pairs_per_expert`
says how far). bytes = the weights of the experts the batch selects,
each read once (distinct experts x 3 x I x D x 2).

    python3 benchmarks/bench_moe_decode.py [--quick]
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from common import Bench, base_parser, log, rel_err, to_torch  # noqa: E402

GEOM = dict(E=32, D=4096, I=2048, k=8)
ROWS = [1, 2, 4, 8, 32, 64]
SMOKE = (dict(E=6, D=32, I=16, k=2), [1, 3, 16])
LIMIT = 7.0
PEER = "torch per-expert gather + F.linear (bf16)"


def main() -> int:
    p = base_parser(__doc__.split("\n\n")[0])
    args = p.parse_args()
    b = Bench(args, "moe_decode")
    torch = b.torch
    import numpy as np
    import memra
    from memra import _core

    geom, rows = (GEOM, ROWS) if b.cuda else SMOKE
    E, D, I, k = geom["E"], geom["D"], geom["I"], geom["k"]
    e = b.engine
    # The per-pair kernels at every T, for pair_kernel_us (the weights are shared: uploads finish
    # before they are handed out; the inputs are each engine's own, on its own stream).
    e_pair = (memra.Engine("cuda", args.device_index,
                           options=memra.KernelOptions(moe_grouped_min_t=1 << 30)) if b.cuda else None)
    e_old = (memra.Engine("cuda", args.device_index,
                          options=memra.KernelOptions(moe_tensor_cores=False)) if b.cuda else None)
    e_nopdl = (memra.Engine("cuda", args.device_index, options=memra.KernelOptions(pdl=False))
               if b.cuda else None)
    gen = torch.Generator(device=b.dev).manual_seed(0)
    # bf16 weights made on the device, fan-in scaled so activations stay O(1).
    gw = (torch.randn(E, I, D, generator=gen, device=b.dev) * D ** -0.5).to(torch.bfloat16)
    uw = (torch.randn(E, I, D, generator=gen, device=b.dev) * D ** -0.5).to(torch.bfloat16)
    dw = (torch.randn(E, D, I, generator=gen, device=b.dev) * I ** -0.5).to(torch.bfloat16)

    def host_weight(t):
        return _core.Weight(t.cpu().view(torch.int16).numpy().view(np.uint16), dtype="bfloat16")

    if b.cuda:
        mg, mu, md = (_core.DeviceWeight(e, host_weight(t), dtype="bfloat16") for t in (gw, uw, dw))
    else:  # the CPU op takes one Weight per expert
        mg, mu, md = ([host_weight(t[i]) for i in range(E)] for t in (gw, uw, dw))
    rng = np.random.default_rng(0)
    zipf = 1.0 / np.arange(1, E + 1)
    zipf /= zipf.sum()
    cases = [(T, kind) for T in rows for kind in (("uniform", "zipf") if T >= 16 else ("uniform",))]
    for T, kind in cases:
        shape = {"T": T, "E": E, "top_k": k, "D": D, "I": I, "w_dtype": "bfloat16", "routing": kind}
        log(f"moe_decode: {shape}")
        if kind == "uniform":
            idx = np.stack([rng.permutation(E)[:k] for _ in range(T)]).astype(np.int32)
        else:
            order = rng.permutation(E)
            idx = np.stack([order[rng.choice(E, k, replace=False, p=zipf)] for _ in range(T)]).astype(np.int32)
        wts = rng.uniform(0.05, 0.5, (T, k)).astype(np.float32)
        x32 = (torch.randn(T, D, generator=gen, device=b.dev)).float()
        xh = x32.cpu().numpy()
        if b.cuda:
            xm, im, wm = e.to_device(xh), e.to_device(idx), e.to_device(wts)

            def run_memra():
                return _core.moe_forward(xm, im, wm, mg, mu, md, limit=LIMIT, engine=e)
        else:
            def run_memra():
                return _core.moe_forward(xh, idx, wts, mg, mu, md, limit=LIMIT)

        # The peer's per-expert lists (host, outside the timing).
        experts = sorted(set(idx.reshape(-1).tolist()))
        lists = []
        for ex in experts:
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

        nbytes = len(experts) * 3 * I * D * 2
        memra_us = b.time_memra(run_memra)
        peer_us = b.time_torch(run_peer)
        memra_pdl_k = b.kernel_us(run_memra)
        memra_k = memra_pdl_k
        if b.cuda:
            xn, i_n, wn = e_nopdl.to_device(xh), e_nopdl.to_device(idx), e_nopdl.to_device(wts)

            def run_nopdl():
                return _core.moe_forward(xn, i_n, wn, mg, mu, md, limit=LIMIT, engine=e_nopdl)

            memra_k = b.kernel_us(run_nopdl)
            e_nopdl.synchronize()
        pair_k = old_k = None
        if b.cuda and T >= 2:
            xp, ip, wp = e_pair.to_device(xh), e_pair.to_device(idx), e_pair.to_device(wts)
            xo, io, wo = e_old.to_device(xh), e_old.to_device(idx), e_old.to_device(wts)

            def run_pair():
                return _core.moe_forward(xp, ip, wp, mg, mu, md, limit=LIMIT, engine=e_pair)

            def run_old():
                return _core.moe_forward(xo, io, wo, mg, mu, md, limit=LIMIT, engine=e_old)

            pair_k = b.kernel_us(run_pair)
            y_pair = to_torch(run_pair(), e_pair, b.dev).float()
            e_pair.synchronize()
            old_k = b.kernel_us(run_old)
            y_old = to_torch(run_old(), e_old, b.dev).float()
            e_old.synchronize()
        got = to_torch(run_memra(), e if b.cuda else None, b.dev).float()
        want = run_peer()
        ref = run_peer(x32, f32=True)
        copy = b.copy_TBps
        extra = {}
        if pair_k is not None:
            extra["old_equals_pair_bits"] = bool(torch.equal(y_old, y_pair))
            extra["old_max_rel_err_ref"] = rel_err(y_old, ref)
        b.emit(shape, memra_us, PEER, peer_us, nbytes,
               experts_selected=len(experts),
               max_pairs_per_expert=int(np.bincount(idx.reshape(-1), minlength=E).max()),
               memra_kernel_us=memra_k, memra_pdl_kernel_us=memra_pdl_k, peer_kernel_us=b.kernel_us(run_peer),
               kernel_frac_of_copy=(nbytes / memra_k / 1e6 / copy) if memra_k else None,
               pair_kernel_us=pair_k,
               pair_kernel_frac_of_copy=(nbytes / pair_k / 1e6 / copy) if pair_k else None,
               old_kernel_us=old_k,
               old_kernel_frac_of_copy=(nbytes / old_k / 1e6 / copy) if old_k else None,
               max_rel_err=rel_err(got, want), max_rel_err_ref=rel_err(got, ref),
               peer_max_rel_err_ref=rel_err(want, ref), **extra)
        b.release()
    return 0


if __name__ == "__main__":
    sys.exit(main())
