#!/usr/bin/env python3
"""MLA absorbed decode (one query row per sequence) over a bf16 latent cache: memra vs torch.

memra: memra._core.mla_attn_absorbed(q_lat [1, H, R] f32, cache [L, R] bf16, scale=, engine=e)
       -> o_lat [1, H, R] f32. The current ABI takes one sequence per call, so at B > 1 the
       timed region holds B calls (B host-side launches; see the JSON "note").
peer:  torch, batched: q_lat [B, H, R] bf16 @ cache^T [B, R, L] -> scores * scale in f32 ->
       softmax (f32) -> bf16 @ cache [B, L, R] -> [B, H, R].
H = 64 heads, rank R = 512, no rope columns (d_rope = 0), scale = 192**-0.5 (a
qk_head_dim of 128 + 64). bytes = B * L * R * 2 (the cache, read once).
max_rel_err_ref / peer_max_rel_err_ref: memra / torch vs a float32 evaluation over the same
bf16 cache (max |diff| / max |ref|, all B sequences); max_rel_err: memra vs the peer.

    python3 benchmarks/bench_mla_decode.py [--quick]
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


def main() -> int:
    p = base_parser(__doc__.split("\n\n")[0])
    args = p.parse_args()
    b = Bench(args, "mla_decode")
    torch = b.torch
    from memra import _core

    heads, shapes = (H, SHAPES) if b.cuda else SMOKE
    # memra's CPU op takes a float32 cache only (bf16 is a CUDA path).
    cdt = torch.bfloat16 if b.cuda else torch.float32
    ops = ["mla_attn_decode", "mla_attn_absorbed"] if b.cuda else ["mla_attn_absorbed"]
    for (B, L), op in [(bl, op) for bl in shapes for op in ops]:
        shape = {"B": B, "L": L, "H": heads, "R": R, "d_rope": 0, "cache_dtype": str(cdt)[6:]}
        nbytes = B * L * R * cache_elem_bytes(torch, cdt)
        extra = {"memra_op": op}
        if B > 1 and op == "mla_attn_absorbed":
            extra["note"] = (f"memra: {B} mla_attn_absorbed calls (t_q=1, one sequence each) inside "
                             "each timed region; peer: one batched call")
        if op == "mla_attn_decode":
            extra["note"] = ("memra: one batched decode launch plan (device lengths and cache "
                             "pointers; q rounded to bf16 for the tensor-core products)")
        log(f"mla_decode: B={B} L={L}")
        gen = torch.Generator(device=b.dev).manual_seed(0)
        cache = torch.randn(B, L, R, device=b.dev, dtype=torch.float32, generator=gen).to(cdt)
        q32 = torch.randn(B, 1, heads, R, device=b.dev, dtype=torch.float32, generator=gen)
        qp = q32[:, 0].to(cdt)  # the peer's query [B, H, R]
        qs = [q32[i] for i in range(B)]  # [1, H, R] f32 views, contiguous
        cs = [cache[i] for i in range(B)]  # [L, R] views, contiguous

        if op == "mla_attn_decode":
            q_b = q32[:, 0].contiguous()  # [B, H, R]
            t_kv = torch.full((B,), L, dtype=torch.int32, device=b.dev)

            def run_memra():
                o = _core.mla_attn_decode(q_b, cs, t_kv, scale=SCALE, max_t_kv=L, engine=b.engine)
                return [o]
        else:
            def run_memra():
                return [_core.mla_attn_absorbed(qs[i], cs[i], scale=SCALE, engine=b.engine) for i in range(B)]

        def run_peer():
            s = torch.bmm(qp, cache.transpose(1, 2)).float().mul_(SCALE)
            pr = torch.softmax(s, dim=-1).to(cdt)
            return torch.bmm(pr, cache)

        # Correctness: memra and the peer against float32 over the same cache values.
        memra_us = peer_us = None
        try:
            b.sync()
            if op == "mla_attn_decode":
                o_m = to_torch(run_memra()[0], b.engine, b.dev)  # [B, H, R]
            else:
                o_m = torch.stack([to_torch(o, b.engine, b.dev)[0] for o in run_memra()])  # [B, H, R]
            b.sync()
        except Exception as e:  # noqa: BLE001
            extra["memra_error"] = f"{type(e).__name__}: {e}"
            o_m = None
        try:
            o_p = run_peer().float()
        except Exception as e:  # noqa: BLE001
            extra["peer_unavailable"] = f"{type(e).__name__}: {e}"
            o_p = None
        err_m = err_p = err_mp = 0.0
        for i in range(B):
            c = cache[i].float()
            ref = torch.softmax((q32[i, 0] @ c.T) * SCALE, dim=-1) @ c
            if o_m is not None:
                err_m = max(err_m, rel_err(o_m[i], ref))
            if o_p is not None:
                err_p = max(err_p, rel_err(o_p[i], ref))
            if o_m is not None and o_p is not None:
                err_mp = max(err_mp, rel_err(o_m[i], o_p[i]))
        if o_m is not None:
            extra["max_rel_err_ref"] = err_m
        if o_p is not None:
            extra["peer_max_rel_err_ref"] = err_p
        if o_m is not None and o_p is not None:
            extra["max_rel_err"] = err_mp
        del o_m, o_p
        b.release()

        if "memra_error" not in extra:
            memra_us = b.time_memra(run_memra)
        if "peer_unavailable" not in extra:
            peer_us = b.time_torch(run_peer)
        b.emit(shape, memra_us, PEER, peer_us, nbytes, **extra)
        del cache, q32, qp, qs, cs
        b.release()
    return 0


def cache_elem_bytes(torch, dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


if __name__ == "__main__":
    sys.exit(main())
