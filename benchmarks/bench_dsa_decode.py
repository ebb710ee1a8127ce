#!/usr/bin/env python3
"""DSA decode step at long context (what a glm5_next full-DSA layer does per token): indexer
bookkeeping + pool scoring + top-k selection + gathered MLA attention, memra vs a torch peer.

memra (CUDA, one launch plan per part, B sequences of one token, positions on the device):
  append: _core.kpool_append_decode(k [B, d], gate [B, d], ape [pool, d], tail_k[B], tail_gate[B],
          pool_keys[B], pos) -- the new indexer row into the ring, and the key of the pool it
          completes (pos + 1 = L is a multiple of pool, so every step writes a key);
  score:  _core.kpool_score_decode(q [B, Hi, d], w [B, Hi], pool_keys[B], pos, pool=, qk_scale=,
          head_scale=, max_pools=L/pool) -> score [B, L/pool] f32;
  select: _core.kpool_select_decode(score, pos, pool=, select_k=topk/pool, width=topk+pool-1)
          -> idx [B, width] int32;
  attend: _core.mla_attn_decode(q_lat [B, H, R] f32, caches[B] ([L, R] bf16), t_kv, idx=idx,
          scale=, max_t_kv=L) -> o_lat [B, H, R] f32 (tensor cores, bf16 cache).
  Per-sequence state is a list of device arrays (views of one torch tensor each); pos = L - 1 and
  t_kv = L are device int32 [B] arrays (the graph-replayable form).
peer:  torch, batched, same inputs: the completed pool's key (softmax over the pool of gate + ape),
  bmm(q, pool_keys^T) -> relu * qk_scale -> head mix bmm(w * head_scale) -> topk(topk/pool) ->
  rows = pool * 4 + 0..3 (+ the visible tail) -> gather the rows of the bf16 cache -> bmm(q_lat
  bf16, rows^T) * scale in f32 -> softmax -> bf16 bmm -> [B, H, R]. There is no external peer
  for the DSA k-pool decode step (no library implements glm5_next's indexer), so this is a
  straightforward torch evaluation, not a tuned kernel.
Geometry (GLM-5.3-Flash): indexer Hi = 32 heads x d = 128, kpool 4, topk 2048 (512 pools,
width 2051); MLA 64 heads, rank R = 512, NoPE, bf16 latent cache, scale = 256**-0.5; memra's
pool keys are float32 (as its Cache keeps them). Shapes: L = 32768 and 131072 cached tokens,
B = 1 and 8.
bytes = per sequence, the pool keys streamed once (L/pool * d * 4) + the selected rows read once
(topk * R * 2); stream_us = bytes / copy bandwidth; frac_of_copy = stream_us / memra_us.
memra_us is the four parts in one timed region; memra_us_parts times each part alone (CUDA events
around each call: at these sizes mostly the host's launch and pointer-table upload cost);
memra_kernel_us / memra_kernel_us_parts / peer_kernel_us: the GPU kernels alone (Bench.kernel_us,
torch.profiler), what the step costs inside a CUDA graph; kernel_frac_of_copy = bytes /
memra_kernel_us over copy_TBps.
idx_sets_equal: sequences whose index set equals the peer's; max_rel_err: o_lat vs the peer
(bf16 cache, q rounded to bf16 on both sides); max_rel_err_ref: vs a float32 evaluation of the
gathered attention over memra's own index lists.

    python3 benchmarks/bench_dsa_decode.py [--quick]
    python3 benchmarks/bench_dsa_decode.py --device cpu     # smoke test (per-sequence CPU ops)
"""

from __future__ import annotations

import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from common import Bench, base_parser, log, rel_err, to_torch  # noqa: E402

# GLM-5.3-Flash: indexer heads x dim, k-pool, top-k; MLA heads, latent rank.
GLM = dict(Hi=32, d=128, pool=4, topk=2048, H=64, R=512)
SHAPES = [(32768, 1), (32768, 8), (131072, 1), (131072, 8)]  # (L, B)
# --device cpu: the per-sequence CPU ops (the decode forms are CUDA only) on small contexts; L = 1030
# leaves a 2-row visible tail (pos + 1 not a multiple of pool) and completes no pool.
SMOKE = (dict(Hi=32, d=128, pool=4, topk=64, H=4, R=512), [(256, 1), (1030, 3)])
SCALE = 256 ** -0.5  # qk_head_dim = nope 256 + rope 0 (memra's MlaLayer: 1/sqrt(d_nope))
PEER = "torch bmm + relu + topk + gather + bmm/softmax(f32)"
PEER_NOTE = ("no library implements glm5_next's k-pool DSA decode step; the peer is a plain torch "
             "evaluation of the same scoring + selection + gathered attention")


class Step:
    """Inputs and state of one DSA decode step over B sequences of L cached tokens each."""

    def __init__(self, torch, dev, cuda, g, L, B, seed=0):
        self.torch, self.dev, self.cuda, self.L, self.B = torch, dev, cuda, L, B
        Hi, d, P, topk, H, R = (g[k] for k in ("Hi", "d", "pool", "topk", "H", "R"))
        self.Hi, self.d, self.P, self.topk, self.H, self.R = Hi, d, P, topk, H, R
        self.pos = L - 1  # the new token's row; t_kv = L rows visible after it is appended
        self.n_pools = L // P  # complete pools the query sees ((pos + 1) // pool)
        self.max_pools = self.n_pools
        self.select_k = min(topk // P, self.n_pools)
        self.width = topk + P - 1
        self.tail_rows = 2 * P  # MlaLayer's tail ring
        gen = torch.Generator(device=dev).manual_seed(seed)

        def r(*shape, scale=1.0):
            return torch.randn(*shape, device=dev, dtype=torch.float32, generator=gen) * scale

        cdt = torch.bfloat16 if cuda else torch.float32  # memra's CPU ops take f32 caches
        self.cache = r(B, L, R).to(cdt)  # latent rows; per-sequence views cache[b] are [L, R]
        self.pool_keys = r(B, self.max_pools, d)  # f32, as memra's Cache keeps them
        self.tail_k = r(B, self.tail_rows, d)
        self.tail_gate = r(B, self.tail_rows, d, scale=2.0)
        self.k = r(B, d)
        self.gate = r(B, d, scale=2.0)
        self.ape = r(P, d, scale=0.5)
        self.q = r(B, Hi, d)
        self.w = r(B, Hi) + 0.5
        self.q_lat = r(B, H, R, scale=0.5 * 16 / math.sqrt(R))  # scores of std ~2 (as test_cuda_mla_decode)
        if cuda:
            self.pos_d = torch.full((B,), self.pos, dtype=torch.int32, device=dev)
            self.t_kv_d = torch.full((B,), L, dtype=torch.int32, device=dev)
        # The peer works on its own copies of the state the append writes.
        self.peer_pool_keys = self.pool_keys.clone()
        self.peer_tail_k = self.tail_k.clone()
        self.peer_tail_gate = self.tail_gate.clone()

    # ----------------------------------------------------------------- bytes
    def bytes_total(self) -> int:
        return self.B * (self.n_pools * self.d * 4 + min(self.topk, self.L) * self.R * self.cache.element_size())

    def bytes_parts(self) -> dict:
        B = self.B
        return {
            "append": B * (2 * self.P * self.d * 4 + 2 * self.d * 4),  # pool rows + ape in, key + ring rows out
            "score": B * (self.n_pools * self.d * 4 + self.n_pools * 4),  # pool keys in, scores out
            "select": B * (self.n_pools * 4 + self.width * 4),  # scores in, index list out
            "attend": B * min(self.topk, self.L) * self.R * self.cache.element_size(),  # selected rows
        }


class MemraDsa:
    """memra's parts: the batched decode forms on CUDA; the per-sequence ops on the CPU (the decode
    forms are CUDA only), which checks the wiring and the numerics of the comparison."""

    def __init__(self, s: Step, engine, _core):
        self.s, self.e, self.core = s, engine, _core
        t = s.torch
        if s.cuda:
            self.caches = [s.cache[b] for b in range(s.B)]
            self.pks = [s.pool_keys[b] for b in range(s.B)]
            self.tks = [s.tail_k[b] for b in range(s.B)]
            self.tgs = [s.tail_gate[b] for b in range(s.B)]
        else:
            np_ = lambda x: x.contiguous().numpy()  # noqa: E731
            self.caches = [np_(s.cache[b]) for b in range(s.B)]
            self.pks = [np_(s.pool_keys[b]).copy() for b in range(s.B)]
            self.tks = [np_(s.tail_k[b]).copy() for b in range(s.B)]
            self.tgs = [np_(s.tail_gate[b]).copy() for b in range(s.B)]
            self.k, self.gate, self.ape = np_(s.k), np_(s.gate), np_(s.ape)
            self.q, self.w, self.q_lat = np_(s.q), np_(s.w), np_(s.q_lat)
        self.t = t

    def append(self):
        s, c = self.s, self.core
        if s.cuda:
            c.kpool_append_decode(s.k, s.gate, s.ape, self.tks, self.tgs, self.pks, s.pos_d, engine=self.e)
            return None
        for b in range(s.B):
            self.tks[b], self.tgs[b], self.pks[b] = c.kpool_append(
                self.k[b:b + 1], self.gate[b:b + 1], self.ape, self.tks[b], self.tgs[b], self.pks[b],
                pos=s.pos)
        return None

    def score(self):
        s, c = self.s, self.core
        kw = dict(pool=s.P, qk_scale=s.d ** -0.5, head_scale=s.Hi ** -0.5)
        if s.cuda:
            return c.kpool_score_decode(s.q, s.w, self.pks, s.pos_d, max_pools=s.max_pools, engine=self.e, **kw)
        import numpy as np
        rows = [c.kpool_score(self.q[b:b + 1], self.w[b:b + 1], np.ascontiguousarray(self.pks[b][:s.n_pools]),
                              first_pos=s.pos, **kw) for b in range(s.B)]
        return np.concatenate(rows, axis=0)

    def select(self, score):
        s, c = self.s, self.core
        kw = dict(pool=s.P, select_k=s.select_k, width=s.width)
        if s.cuda:
            return c.kpool_select_decode(score, s.pos_d, engine=self.e, **kw)
        import numpy as np
        return np.concatenate([c.kpool_select(score[b:b + 1], first_pos=s.pos, **kw) for b in range(s.B)], axis=0)

    def attend(self, idx):
        s, c = self.s, self.core
        if s.cuda:
            return c.mla_attn_decode(s.q_lat, self.caches, s.t_kv_d, idx=idx, scale=SCALE, max_t_kv=s.L,
                                     engine=self.e)
        return c.mla_attn_decode(self.q_lat, self.caches, [s.L] * s.B, idx=idx, scale=SCALE)

    def step(self):
        self.append()
        return self.attend(self.select(self.score()))


def peer_step(s: Step, want_parts: bool = False):
    """The same step in torch (batched). Returns o_lat [B, H, R] (and the rows it attended)."""
    t = s.torch
    F = t.nn.functional
    P, B, pos = s.P, s.B, s.pos
    # append: the ring row, and the key of the pool that row completes (rows from the ring + the new row)
    s.peer_tail_k[:, pos % s.tail_rows] = s.k
    s.peer_tail_gate[:, pos % s.tail_rows] = s.gate
    if (pos + 1) % P == 0:
        p = pos // P
        ring = [(p * P + i) % s.tail_rows for i in range(P)]
        kk, gg = s.peer_tail_k[:, ring], s.peer_tail_gate[:, ring]  # [B, P, d]
        wts = t.softmax(gg + s.ape[None], dim=1)
        s.peer_pool_keys[:, p] = (wts * kk).sum(1)
    # score: sum_h w_h * head_scale * relu(qk_scale * q_h . key_p)
    sc = F.relu(t.bmm(s.q, s.peer_pool_keys[:, :s.n_pools].transpose(1, 2)) * (s.d ** -0.5))  # [B, Hi, n]
    score = t.bmm((s.w * (s.Hi ** -0.5)).unsqueeze(1), sc).squeeze(1)  # [B, n]
    # select: top pools -> their rows, plus the visible tail [(pos+1) - (pos+1) % P, pos]
    top = score.topk(s.select_k, dim=-1).indices  # [B, K]
    rows = (top.unsqueeze(-1) * P + t.arange(P, device=s.dev)).flatten(1)  # [B, K*P]
    n_tail = (pos + 1) % P
    if n_tail:
        tail = t.arange(pos + 1 - n_tail, pos + 1, device=s.dev).expand(B, n_tail)
        rows = t.cat([rows, tail], dim=1)
    # attend over the gathered rows
    kv = t.gather(s.cache, 1, rows.unsqueeze(-1).expand(-1, -1, s.R))  # [B, n_rows, R]
    q = s.q_lat.to(s.cache.dtype)
    att = t.bmm(q, kv.transpose(1, 2)).float() * SCALE
    pr = t.softmax(att, dim=-1).to(s.cache.dtype)
    o = t.bmm(pr, kv)
    return (o, rows) if want_parts else o


def reference(s: Step, idx):
    """float32 gathered attention over memra's own index lists (-1 skipped, duplicates once)."""
    t = s.torch
    out = []
    for b in range(s.B):
        rows = t.unique(idx[b][idx[b] >= 0].long())
        kv = s.cache[b, rows].float()
        p = t.softmax((s.q_lat[b] @ kv.T) * SCALE, dim=-1)
        out.append(p @ kv)
    return t.stack(out)


def main() -> int:
    p = base_parser(__doc__.split("\n\n")[0])
    args = p.parse_args()
    b = Bench(args, "dsa_decode")
    torch = b.torch
    from memra import _core

    geom, shapes = (GLM, SHAPES) if b.cuda else SMOKE
    for L, B in shapes:
        log(f"dsa_decode: L={L} B={B}")
        s = Step(torch, b.dev, b.cuda, geom, L, B)
        m = MemraDsa(s, b.engine, _core)
        shape = {"L": L, "B": B, "index_heads": s.Hi, "index_head_dim": s.d, "kpool": s.P, "topk": s.topk,
                 "select_pools": s.select_k, "width": s.width, "H": s.H, "R": s.R,
                 "cache_dtype": str(s.cache.dtype)[6:], "pool_key_dtype": "float32", "pos": s.pos}
        nbytes = s.bytes_total()
        extra = {"note": "memra: " + ("batched decode forms (kpool_*_decode + mla_attn_decode), device pos/t_kv"
                                      if b.cuda else "CPU smoke: per-sequence kpool_append/score/select + "
                                      "mla_attn_decode"),
                 "peer_note": PEER_NOTE,
                 "stream_us": round(nbytes / b.copy_TBps / 1e6, 3),
                 "bytes_parts": s.bytes_parts()}

        # ---- correctness: one memra step and one peer step on the same inputs
        memra_ok = True
        try:
            b.sync()
            o_m = to_torch(m.step(), b.engine, b.dev).float()
            idx_m = to_torch(m.select(m.score()), b.engine, b.dev)
            b.sync()
        except Exception as e:  # noqa: BLE001
            extra["memra_error"] = f"{type(e).__name__}: {e}"
            log(f"dsa_decode: memra failed: {extra['memra_error']}")
            memra_ok = False
        try:
            o_p, rows_p = peer_step(s, want_parts=True)
            o_p = o_p.float()
        except Exception as e:  # noqa: BLE001
            extra["peer_unavailable"] = f"{type(e).__name__}: {e}"
            o_p = rows_p = None
        if memra_ok:
            extra["max_rel_err_ref"] = rel_err(o_m, reference(s, idx_m))
            extra["idx_entries_valid"] = int((idx_m >= 0).sum().item())
            if o_p is not None:
                same = 0
                for i in range(B):
                    got = set(idx_m[i][idx_m[i] >= 0].tolist())
                    same += got == set(rows_p[i].tolist())
                extra["idx_sets_equal"] = f"{same}/{B}"
                extra["max_rel_err"] = rel_err(o_m, o_p)
            del o_m, idx_m
        if o_p is not None:
            del o_p, rows_p
        b.release()

        # ---- timing: the four parts together, then each alone (its input fixed)
        memra_us = peer_us = None
        if memra_ok:
            memra_us = b.time_memra(m.step)
            sc = m.score()
            ix = m.select(sc)
            parts = {
                "append": b.time_memra(m.append),
                "score": b.time_memra(m.score),
                "select": b.time_memra(lambda: m.select(sc)),
                "attend": b.time_memra(lambda: m.attend(ix)),
            }
            extra["memra_us_parts"] = {k: round(v, 3) for k, v in parts.items()}
            extra["memra_over_stream"] = round(memra_us / (nbytes / b.copy_TBps / 1e6), 3)
            if b.cuda and hasattr(b, "kernel_us"):  # the kernels alone: a step's cost inside a CUDA graph
                try:
                    ku = b.kernel_us(m.step)
                    extra["memra_kernel_us"] = round(ku, 3) if ku else None
                    extra["kernel_frac_of_copy"] = round(nbytes / ku / 1e6 / b.copy_TBps, 4) if ku else None
                    kp = {"append": b.kernel_us(m.append), "score": b.kernel_us(m.score),
                          "select": b.kernel_us(lambda: m.select(sc)), "attend": b.kernel_us(lambda: m.attend(ix))}
                    extra["memra_kernel_us_parts"] = {k: (round(v, 3) if v else None) for k, v in kp.items()}
                except Exception as e:  # noqa: BLE001 - the profiler is optional
                    extra["kernel_us_error"] = f"{type(e).__name__}: {e}"
            del sc, ix
        if "peer_unavailable" not in extra:
            peer_us = b.time_torch(lambda: peer_step(s))
            if b.cuda and hasattr(b, "kernel_us"):
                try:
                    ku = b.kernel_us(lambda: peer_step(s))
                    extra["peer_kernel_us"] = round(ku, 3) if ku else None
                except Exception as e:  # noqa: BLE001
                    extra["kernel_us_error"] = f"{type(e).__name__}: {e}"
        b.emit(shape, memra_us, PEER, peer_us, nbytes, **extra)
        m = s = None  # drop this shape's buffers before the next
        b.release()
    return 0


if __name__ == "__main__":
    sys.exit(main())
