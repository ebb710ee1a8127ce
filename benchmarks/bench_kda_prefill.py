#!/usr/bin/env python3
"""KDA and GDN chunked prefill: memra's chunked tensor-core form vs fla's chunk kernels, same
inputs, same run.

memra: memra._core.kda_scan(q, k, v, g, beta, state, batch=True, chunked=True, engine=e)
       (cuda/kda_chunk*.cu: chunk_intra / chunk_state kernels) -> (o, state_out), on f32 q / k /
       v / g holding the bf16-rounded values fla gets (a bf16 model's activations are f32 in
       memra; its issue-bound intra kernel runs faster on them than on bf16, results s15), or
       with --memra-inputs bf16 on fla's very bf16 tensors (the same results, bit for bit);
       beta and the state f32; o in bf16 as fla's (o_dtype="bfloat16"; --memra-o f32: f32 o).
       GDN: memra._core.gdn_scan(..., batch=True, chunked=True) (the same kernels, reading the
       key heads and the per-head decay in place).
peer:  fla.ops.kda.chunk_kda(q, k, v, g, beta, scale=, initial_state=, output_final_state=True)
       and fla.ops.gated_delta_rule.chunk_gated_delta_rule(...) on bf16 q / k / v / g, f32 state
       (flash-linear-attention; skipped with the reason when it does not import). GDN with
       16 key / 32 value heads: fla is called with the key heads as they are; should it refuse
       them, with q and k repeated to the value heads (peer_repeated_heads: true).
Inputs: q, k L2-normalised, v randn, g = logsigmoid(randn + 2) per channel (KDA) or per head
(GDN), beta = sigmoid(randn), state 0.1 randn [B, H, 128, 128] f32; all rounded to bf16.
Shapes: KDA 64 and 32 heads x 128 at B = 1 T = 1K / 8K / 32K and B = 8 T = 2K; GDN 16 / 32 heads
at B = 1 T = 8K and B = 8 T = 2K. --quick: KDA 64 heads at T = 1K and 8K, GDN at T = 8K.
Figures: memra_us / peer_us the call (CUDA events), memra_kernel_us / peer_kernel_us the
kernels alone (torch.profiler), kernel_ratio = peer / memra kernel time. bytes: memra's input
and output traffic (q, k, v, g and o in their dtypes; f32 beta; the state read and written).
max_rel_err / peer_max_rel_err: memra's chunked form / fla against memra's sequential f32 scan
on the same inputs (max |d| / max |ref| over o and the final state).
fla's Triton autotune costs over a minute per shape on a fresh machine: keep its cache
(TRITON_CACHE_DIR) between runs.

    python3 benchmarks/bench_kda_prefill.py [--quick]
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from common import Bench, base_parser, log, rel_err, to_torch  # noqa: E402

D = 128
KDA_SHAPES = [(64, 1, 1024), (64, 1, 8192), (64, 1, 32768), (64, 8, 2048),
              (32, 1, 1024), (32, 1, 8192), (32, 1, 32768), (32, 8, 2048)]  # (H, B, T)
GDN_SHAPES = [(16, 32, 1, 8192), (16, 32, 8, 2048)]  # (Hk, Hv, B, T)
QUICK_KDA = [(64, 1, 1024), (64, 1, 8192)]
QUICK_GDN = [(16, 32, 1, 8192)]
SMOKE_KDA = [(2, 1, 70)]  # --device cpu
SMOKE_GDN = [(1, 2, 1, 70)]


def parse_shapes(text: str, n: int) -> list[tuple[int, ...]]:
    """'a:b:c,d:e:f' -> [(a, b, c), (d, e, f)] (each of n ints); 'none' -> []."""
    if text.strip() == "none":
        return []
    shapes = [tuple(int(v) for v in item.split(":")) for item in text.split(",") if item.strip()]
    for s in shapes:
        if len(s) != n:
            raise SystemExit(f"bench_kda_prefill: shape {s} needs {n} numbers")
    return shapes


def load_fla():
    """(chunk_kda, chunk_gated_delta_rule, None) or (None, None, why)."""
    try:
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule
        from fla.ops.kda import chunk_kda
        return chunk_kda, chunk_gated_delta_rule, None
    except Exception as e:  # noqa: BLE001 - any import failure means: no peer
        return None, None, f"{type(e).__name__}: {e}"


def make_inputs(torch, dev, B, T, Hk, Hv, per_channel, seed=0):
    F = torch.nn.functional
    gen = torch.Generator(device=dev).manual_seed(seed)

    def r(*shape):
        return torch.randn(*shape, device=dev, dtype=torch.float32, generator=gen)

    def bf(x):
        return x.to(torch.bfloat16).float().contiguous()

    q = bf(F.normalize(r(B, T, Hk, D), dim=-1))
    k = bf(F.normalize(r(B, T, Hk, D), dim=-1))
    v = bf(r(B, T, Hv, D))
    g = bf(F.logsigmoid(r(B, T, Hv, D) + 2.0) if per_channel else F.logsigmoid(r(B, T, Hv) + 2.0))
    beta = bf(torch.sigmoid(r(B, T, Hv)))
    state = 0.1 * r(B, Hv, D, D)
    return q, k, v, g, beta, state


def measure(b, name, shape, run_memra, run_seq, run_peer, peer, nbytes, extra):
    """Correctness against memra's sequential scan, then the timings; one JSON line."""
    torch = b.torch
    memra_us = peer_us = None
    try:
        b.sync()
        o_s, s_s = (to_torch(t, b.engine, b.dev) for t in run_seq())
        o_m, s_m = (to_torch(t, b.engine, b.dev) for t in run_memra())
        b.sync()
        extra["max_rel_err"] = max(rel_err(o_m, o_s), rel_err(s_m, s_s))
    except Exception as e:  # noqa: BLE001
        extra["memra_error"] = f"{type(e).__name__}: {e}"
        o_s = s_s = None
    if run_peer is not None and o_s is not None:
        try:
            o_f, s_f = run_peer()
            b.sync()
            extra["peer_max_rel_err"] = max(rel_err(o_f.float(), o_s), rel_err(s_f, s_s))
            del o_f, s_f
        except Exception as e:  # noqa: BLE001
            extra["peer_unavailable"] = f"{type(e).__name__}: {e}"
            log(f"{name}: peer failed at {shape}: {extra['peer_unavailable']}")
            run_peer = None
    b.release()
    if "memra_error" not in extra:
        memra_us = b.time_memra(run_memra)
        extra["memra_kernel_us"] = b.kernel_us(run_memra)
    if run_peer is not None and "peer_unavailable" not in extra:
        peer_us = b.time_torch(run_peer)
        extra["peer_kernel_us"] = b.kernel_us(run_peer)
    mk, pk = extra.get("memra_kernel_us"), extra.get("peer_kernel_us")
    if mk and pk:
        extra["kernel_ratio"] = round(pk / mk, 4)
    b.emit(shape, memra_us, peer, peer_us, nbytes, **extra)
    del torch
    b.release()


def main() -> int:
    p = base_parser(__doc__.split("\n\n")[0])
    p.add_argument("--kda-shapes", default=None,
                   help="KDA shapes as H:B:T,... (overrides the default / --quick list; 'none')")
    p.add_argument("--memra-inputs", choices=("bf16", "f32"), default="f32",
                   help="dtype of the q / k / v / g memra's KDA scan reads (the values are the "
                        "same bf16-rounded ones either way)")
    p.add_argument("--memra-o", choices=("bf16", "f32"), default="bf16",
                   help="dtype of the o memra's KDA scan writes (fla's is bf16)")
    p.add_argument("--gdn-shapes", default=None,
                   help="GDN shapes as Hk:Hv:B:T,... (overrides the default / --quick list; 'none')")
    args = p.parse_args()
    b = Bench(args, "kda_prefill")
    torch = b.torch
    from memra import _core

    chunk_kda, chunk_gdn, why = ((None, None, "no peer in the --device cpu smoke test")
                                 if not b.cuda else load_fla())
    if why:
        log(f"kda_prefill: peer unavailable: {why}")
    scale = D ** -0.5
    kda_shapes = SMOKE_KDA if not b.cuda else (QUICK_KDA if args.quick else KDA_SHAPES)
    gdn_shapes = SMOKE_GDN if not b.cuda else (QUICK_GDN if args.quick else GDN_SHAPES)
    if args.kda_shapes is not None:
        kda_shapes = parse_shapes(args.kda_shapes, 3)
    if args.gdn_shapes is not None:
        gdn_shapes = parse_shapes(args.gdn_shapes, 4)
    chunked = b.cuda  # the CPU engine runs its reference either way

    for H, B, T in kda_shapes:
        log(f"kda_prefill: KDA H={H} B={B} T={T}")
        shape = {"op": "kda", "H": H, "B": B, "T": T, "dk": D, "dv": D}
        q, k, v, g, beta, state = make_inputs(torch, b.dev, B, T, H, H, True)
        # bf16 on CUDA only: the CPU smoke engine reads host arrays, f32 here
        mine = (q, k, v, g)
        if b.cuda and args.memra_inputs == "bf16":
            mine = tuple(x.to(torch.bfloat16) for x in mine)
        in_item = 2 if mine[0].dtype == torch.bfloat16 else 4
        o_dtype = "bfloat16" if b.cuda and args.memra_o == "bf16" else "float32"
        o_item = 2 if o_dtype == "bfloat16" else 4
        nbytes = (in_item * 4 * B * T * H * D + o_item * B * T * H * D
                  + 4 * (B * T * H + 2 * B * H * D * D))
        extra = {"memra_op": f"kda_scan(batch=True, chunked=True, o_dtype={o_dtype!r})",
                 "memra_inputs": "bf16" if in_item == 2 else "f32",
                 "memra_o": "bf16" if o_item == 2 else "f32"}

        def run_memra():
            return _core.kda_scan(*mine, beta, state, scale=scale, batch=True,
                                  chunked=chunked, o_dtype=o_dtype, engine=b.engine)

        def run_seq():
            return _core.kda_scan(q, k, v, g, beta, state, scale=scale, batch=True,
                                  engine=b.engine)

        run_peer = None
        if chunk_kda is not None:
            qb, kb, vb, gb, bb = (x.to(torch.bfloat16) for x in (q, k, v, g, beta))

            def run_peer():
                return chunk_kda(qb, kb, vb, gb, bb, scale=scale, initial_state=state,
                                 output_final_state=True)
        else:
            extra["peer_unavailable"] = why
        measure(b, "kda_prefill", shape, run_memra, run_seq, run_peer,
                "fla.ops.kda.chunk_kda", nbytes, extra)
        del q, k, v, g, beta, state, run_peer, mine
        b.release()

    for Hk, Hv, B, T in gdn_shapes:
        log(f"kda_prefill: GDN Hk={Hk} Hv={Hv} B={B} T={T}")
        shape = {"op": "gdn", "Hk": Hk, "Hv": Hv, "B": B, "T": T, "dk": D, "dv": D}
        q, k, v, g, beta, state = make_inputs(torch, b.dev, B, T, Hk, Hv, False)
        nbytes = 4 * (2 * B * T * Hk * D + 2 * B * T * Hv * D + 2 * B * T * Hv
                      + 2 * B * Hv * D * D)
        extra = {"memra_op": "gdn_scan(batch=True, chunked=True)"}

        def run_memra():
            return _core.gdn_scan(q, k, v, g, beta, state, scale=scale, batch=True,
                                  chunked=chunked, engine=b.engine)

        def run_seq():
            return _core.gdn_scan(q, k, v, g, beta, state, scale=scale, batch=True,
                                  engine=b.engine)

        run_peer = None
        if chunk_gdn is not None:
            qb, kb, vb, gb, bb = (x.to(torch.bfloat16) for x in (q, k, v, g, beta))

            def call(qq, kk):
                return chunk_gdn(qq, kk, vb, gb, bb, scale=scale, initial_state=state,
                                 output_final_state=True)
            try:
                call(qb, kb)
                b.sync()
                run_peer = lambda: call(qb, kb)  # noqa: E731
            except Exception as e:  # noqa: BLE001 - fla without grouped value heads
                log(f"kda_prefill: fla refused Hk={Hk} < Hv={Hv} ({type(e).__name__}); "
                    "repeating q and k")
                qr = qb.repeat_interleave(Hv // Hk, dim=2).contiguous()
                kr = kb.repeat_interleave(Hv // Hk, dim=2).contiguous()
                extra["peer_repeated_heads"] = True
                run_peer = lambda: call(qr, kr)  # noqa: E731
        else:
            extra["peer_unavailable"] = why
        measure(b, "kda_prefill", shape, run_memra, run_seq, run_peer,
                "fla.ops.gated_delta_rule.chunk_gated_delta_rule", nbytes, extra)
        del q, k, v, g, beta, state, run_peer
        b.release()
    return 0


if __name__ == "__main__":
    sys.exit(main())
