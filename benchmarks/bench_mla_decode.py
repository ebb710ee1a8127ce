#!/usr/bin/env python3
"""MLA absorbed decode (one query row per sequence) over a bf16 latent cache: memra vs torch.

memra: memra._core.mla_attn_decode(q_lat [B, H, R] f32, caches (one device bf16 [B, L, R]
       array; until session 18 a list of B [L, R] views, whose B DLPack imports made memra_us
       ~300 us at B = 64), t_kv (device int32 [B]), scale=, max_t_kv=L, engine=e) -> o_lat
       [B, H, R] f32: the batched op, one launch plan for the B sequences (the decode graph's
       call). --per-sequence adds
       mla_attn_absorbed(q_lat [1, H, R], cache [L, R]) once per sequence, B calls per timed
       region (memra_op names which).
peer:  torch, batched: q_lat [B, H, R] bf16 @ cache^T [B, R, L] -> scores * scale in f32 ->
       softmax (f32) -> bf16 @ cache [B, L, R] -> [B, H, R].
H = 64 heads, rank R = 512, no rope columns (d_rope = 0), scale = 192**-0.5 (a
qk_head_dim of 128 + 64). bytes = B * L * R * 2 (the cache, read once).
memra_us / peer_us: CUDA-event medians per call (common.Bench); memra_kernel_us /
peer_kernel_us: the summed device time of the kernels one call launches (torch.profiler over
--profile-calls calls, memsets and copies excluded; common.Bench.kernel_us where present), so
launch gaps and host overhead drop out; memra's on an Engine made with KernelOptions(pdl=False)
besides the arm's options (as bench_kda_decode.py: launched as a programmatic dependent, the
attention kernel and the split combine start before the launch in front of them ends and their
profiled durations include that wait; memra_pdl_kernel_us is the default Engine's figure taken
that way); memra_kernels_us: memra_kernel_us by kernel;
kernel_frac_of_copy = bytes / memra_kernel_us against the copy yardstick.
max_rel_err_ref / peer_max_rel_err_ref: memra / torch vs a float32 evaluation over the same
bf16 cache (max |diff| / max |ref|, all B sequences); max_rel_err: memra vs the peer.
--variant (KernelOptions.mla_decode_variant of the engine memra runs on): 0 or 1, "all" times
both in turn (the peer once per shape, its figures repeated on each line), "default" the
engine's default; `variant` in each line says which. --tc-mt / --split-tiles set
KernelOptions.mla_tc_mt / mla_split_tiles (the mma.sync arm's head tiles a block, 64-row tiles a
split; 0 = chosen by the op); --merge sets KernelOptions.mla_merge (the wgmma arm's split merge:
1 combine launch, 2 cluster, 3 grid barrier; 0 = chosen by the op); `options` in each line gives
the engine's non-default fields.

    python3 benchmarks/bench_mla_decode.py [--quick] [--per-sequence] [--profile-calls N]
        [--variant all] [--tc-mt 2|4] [--split-tiles N] [--merge 0|1|2|3]
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from common import Bench, base_parser, log, rel_err, to_torch  # noqa: E402

H, R = 64, 512
SCALE = 192 ** -0.5
SHAPES = [(64, 4096), (8, 32768)]  # (B, L)
SMOKE = (4, [(2, 64), (3, 33)])  # --device cpu: (H, [(B, L)]), float32 cache
PEER = "torch bmm + softmax(f32) + bmm (bf16)"


def variants(arg: str) -> list[str]:
    if arg == "all":
        return ["0", "1"]
    if arg not in ("default", "0", "1"):
        raise SystemExit(f"--variant: 0, 1, all or default, got {arg!r}")
    return [arg]


def kernel_time(b, fn, calls: int):
    """Device time (us) of the kernels one call of fn launches: common.Bench.kernel_us where this
    checkout has it, else kernel_us below."""
    if hasattr(b, "kernel_us"):
        us = b.kernel_us(fn, calls)
        if us is None:
            raise RuntimeError("the profiler recorded no kernels")
        return us
    return kernel_us(b.torch, fn, calls)


def kernel_us(torch, fn, calls: int):
    """Summed device time (us) of the kernels one call of fn launches: torch.profiler (CUPTI sees
    every stream of the process, memra's included) over `calls` calls after one warm-up call."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    total = 0.0
    n = 0
    for evt in prof.events():
        if evt.device_type != torch.autograd.DeviceType.CUDA:
            continue
        if evt.name.startswith(("Memcpy", "Memset")):
            continue
        total += evt.time_range.elapsed_us()
        n += 1
    if n == 0:
        raise RuntimeError("the profiler recorded no kernels")
    return total / calls


def main() -> int:
    p = base_parser(__doc__.split("\n\n")[0])
    p.add_argument("--per-sequence", action="store_true",
                   help="also time mla_attn_absorbed once per sequence (B calls per region)")
    p.add_argument("--profile-calls", type=int, default=20,
                   help="calls inside the torch.profiler region for the kernel-only times")
    p.add_argument("--shapes", default=None,
                   help="B:L pairs, comma-separated (default 64:4096,8:32768)")
    p.add_argument("--variant", default="default",
                   help="KernelOptions.mla_decode_variant: 0, 1, all (each in turn), default")
    p.add_argument("--tc-mt", type=int, default=0, help="KernelOptions.mla_tc_mt: 2 or 4 (0: by B)")
    p.add_argument("--split-tiles", type=int, default=0,
                   help="KernelOptions.mla_split_tiles: 64-row tiles a split (0: the cost model)")
    p.add_argument("--merge", type=int, default=0,
                   help="KernelOptions.mla_merge: 1 combine, 2 cluster, 3 grid barrier (0: chosen)")
    args = p.parse_args()
    import memra
    from memra import _core

    base = dict(mla_tc_mt=args.tc_mt, mla_split_tiles=args.split_tiles, mla_merge=args.merge)
    b = Bench(args, "mla_decode", kernel_options=memra.KernelOptions(**base))
    torch = b.torch
    engines = {"default": b.engine}

    def engine_for(var: str, pdl: bool = True):
        """The engine of a variant arm (one per arm and pdl setting, made once; the same
        device)."""
        key = var if pdl else f"{var}/nopdl"
        if key not in engines:
            kw = dict(base)
            if var != "default":
                kw["mla_decode_variant"] = int(var)
            opts = memra.KernelOptions(pdl=pdl, **kw)
            engines[key] = (memra.Engine("cuda", args.device_index, options=opts) if b.cuda
                            else memra.Engine("cpu", options=opts))
        return engines[key]

    heads, shapes = (H, SHAPES) if b.cuda else SMOKE
    if args.shapes:
        shapes = [tuple(int(v) for v in bl.split(":")) for bl in args.shapes.split(",")]
    # memra's CPU op takes a float32 cache only (bf16 is a CUDA path).
    cdt = torch.bfloat16 if b.cuda else torch.float32
    ops = ["mla_attn_decode"]
    if args.per_sequence or not b.cuda:
        ops.append("mla_attn_absorbed")
    for B, L in shapes:
        log(f"mla_decode: B={B} L={L}")
        gen = torch.Generator(device=b.dev).manual_seed(0)
        cache = torch.randn(B, L, R, device=b.dev, dtype=torch.float32, generator=gen).to(cdt)
        q32 = torch.randn(B, 1, heads, R, device=b.dev, dtype=torch.float32, generator=gen)
        qp = q32[:, 0].to(cdt)  # the peer's query [B, H, R]
        qs = [q32[i] for i in range(B)]  # [1, H, R] f32 views, contiguous
        cs = [cache[i] for i in range(B)]  # [L, R] views, contiguous
        q_b = q32[:, 0].contiguous()  # [B, H, R]
        t_kv = torch.full((B,), L, dtype=torch.int32, device=b.dev)
        refs = []
        for i in range(B):
            c = cache[i].float()
            refs.append(torch.softmax((q32[i, 0] @ c.T) * SCALE, dim=-1) @ c)

        def run_peer():
            s = torch.bmm(qp, cache.transpose(1, 2)).float().mul_(SCALE)
            pr = torch.softmax(s, dim=-1).to(cdt)
            return torch.bmm(pr, cache)

        peer = {}
        try:
            o_p = run_peer().float()
            peer["err"] = max(rel_err(o_p[i], refs[i]) for i in range(B))
            peer["out"] = o_p
        except Exception as e:  # noqa: BLE001
            peer["unavailable"] = f"{type(e).__name__}: {e}"

        for op in ops:
            for var in (variants(args.variant) if op == "mla_attn_decode" else ["default"]):
                b.use_engine(engine_for(var))
                shape = {"B": B, "L": L, "H": heads, "R": R, "d_rope": 0,
                         "cache_dtype": str(cdt)[6:]}
                nbytes = B * L * R * cache_elem_bytes(torch, cdt)
                defaults = memra.KernelOptions().to_dict()
                extra = {"memra_op": op, "variant": var,
                         "options": {k: v for k, v in b.engine.options.to_dict().items()
                                     if v != defaults[k]}}
                if op == "mla_attn_decode":
                    extra["note"] = ("memra: one batched decode launch plan (device lengths and "
                                     "cache pointers; q rounded to bf16 for the tensor-core "
                                     "products)")

                    def run_on(eng):
                        return [_core.mla_attn_decode(q_b, cache, t_kv, scale=SCALE, max_t_kv=L,
                                                      engine=eng)]
                else:
                    extra["note"] = (f"memra: {B} mla_attn_absorbed calls (t_q=1, one sequence "
                                     "each) inside each timed region; peer: one batched call")

                    def run_on(eng):
                        return [_core.mla_attn_absorbed(qs[i], cs[i], scale=SCALE, engine=eng)
                                for i in range(B)]

                def run_memra():
                    return run_on(b.engine)

                memra_us = None
                try:
                    b.sync()
                    outs = run_memra()
                    if op == "mla_attn_decode":
                        o_m = to_torch(outs[0], b.engine, b.dev)  # [B, H, R]
                    else:
                        o_m = torch.stack([to_torch(o, b.engine, b.dev)[0] for o in outs])
                    b.sync()
                    extra["max_rel_err_ref"] = max(rel_err(o_m[i], refs[i]) for i in range(B))
                    if "out" in peer:
                        extra["max_rel_err"] = max(rel_err(o_m[i], peer["out"][i])
                                                   for i in range(B))
                    del o_m, outs
                except Exception as e:  # noqa: BLE001
                    extra["memra_error"] = f"{type(e).__name__}: {e}"
                if "unavailable" in peer:
                    extra["peer_unavailable"] = peer["unavailable"]
                else:
                    extra["peer_max_rel_err_ref"] = peer["err"]
                b.release()

                if "memra_error" not in extra:
                    memra_us = b.time_memra(run_memra)
                if "unavailable" not in peer and "us" not in peer:
                    peer["us"] = b.time_torch(run_peer)
                if b.cuda:
                    if "memra_error" not in extra:
                        try:
                            extra["memra_pdl_kernel_us"] = round(
                                kernel_time(b, run_memra, args.profile_calls), 3)
                            e_nopdl = engine_for(var, pdl=False)

                            def run_nopdl():
                                return run_on(e_nopdl)
                            k_us = kernel_time(b, run_nopdl, args.profile_calls)
                            extra["memra_kernels_us"] = {
                                k: round(v, 3) for k, v in
                                (b.kernel_us_by_name(run_nopdl, args.profile_calls)
                                 or {}).items()}
                            extra["memra_kernel_us"] = round(k_us, 3)
                            extra["kernel_frac_of_copy"] = round(
                                nbytes / k_us / 1e6 / b.copy_TBps, 4)
                        except Exception as e:  # noqa: BLE001
                            extra["memra_kernel_us"] = None
                            extra["profiler_error"] = f"{type(e).__name__}: {e}"
                    if "unavailable" not in peer:
                        if "kernel_us" not in peer:
                            try:
                                peer["kernel_us"] = round(
                                    kernel_time(b, run_peer, args.profile_calls), 3)
                            except Exception as e:  # noqa: BLE001
                                peer["kernel_us"] = None
                                extra["profiler_error"] = f"{type(e).__name__}: {e}"
                        extra["peer_kernel_us"] = peer["kernel_us"]
                b.emit(shape, memra_us, PEER, peer.get("us"), nbytes, **extra)
                b.release()
        b.use_engine(engines["default"])
        del cache, q32, qp, qs, cs, q_b, t_kv, refs, peer
        b.release()
    return 0


def cache_elem_bytes(torch, dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


if __name__ == "__main__":
    sys.exit(main())
