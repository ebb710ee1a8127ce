#!/usr/bin/env python3
"""Whole-model prefill of a glm5_next model at GLM-5.3-Flash widths: time to first token, tokens/s,
peak device memory and where the time goes, memra vs transformers (+ fla when importable) on the
same checkpoint folder, against the tensor-core roofline.

Checkpoint: the folder bench_model_decode.py builds (8 layers, 32 experts, random bf16 weights;
its docstring says how), built by its own code when missing (same arguments, same marker: one
folder serves both benches).

memra:  memra.load(folder, device="cuda", dtype="bfloat16", max_batch=1 or the batch's prompts,
        max_len = the longest prompt + 8). Time to first token (TTFT) = wall clock from the
        Model.prefill(cache, 0, ids) call until the last prompt token's logits are on the host
        (prefill returns them as numpy), slot freed and the device idle before each call, after one
        warm-up call on another prompt of the same length; the median of --reps calls (default 5
        up to 8K tokens, 3 at 32K, 1 beyond; --quick 3 / 1). tok/s = T / TTFT. Prompts above
        KernelOptions.prefill_chunk (default 8192) run in chunks (docs/prefill.md); the record
        says the chunk. The batch: P prompts of L tokens (default 8 x 2048) into slots 0..P-1, in
        two arms (one record each, "arm"): "sequential", one Model.prefill after another, wall
        clock from the first call to the last prompt's logits on the host; "batched", one
        Model.prefill_batch(cache, slots, prompts) call (rows packed, calls bounded by
        prefill_chunk: docs/prefill.md), wall clock to all P last-token logits on the host, after
        a warm-up call on other prompts; first_tokens_match compares the arms' argmaxes. Also
        generate_batch(prompts, max_new_tokens=1), the API path (it prefills batched where
        Model.prefill_batch exists) plus slot leasing and sampling.
peer:   transformers' Glm5NextForConditionalGeneration.from_pretrained(folder, dtype=bfloat16)
        forward(input_ids, use_cache=True, logits_to_keep=1) (generate's prefill), last logits
        copied to the host; the median of up to 3 calls (wall clock) after a warm-up call (fla's
        Triton autotune happens there; TRITON_CACHE_AUTOTUNING keeps it on disk for the next
        run); prompts up to --peer-max-len (default 8192; --quick 1024) tokens. peer_kernels says
        which KDA implementation it ran; first_token_match compares the two argmaxes.
roofline: bf16 FLOPs of the prefill (prefill_flops: projections, the KDA chunked form, MLA
        attention in memra's absorbed form over the rows it reads -- all earlier rows, or at most
        index_topk + index_kpool - 1 gathered rows on a DSA layer --, the indexer's projections and
        pool scoring, mHC, dense MLPs, MoE router + shared expert + top-k experts, and the LM head
        on the last row only) / the bf16 GEMM rate measured in the same run (torch.matmul bf16
        8192^3, else memra's cuBLAS linear). frac_of_roofline = memra tok/s / (T / that time).
memory: memra_pool_peak_bytes = Engine.memory()'s pool_used_peak over the timed calls (weights,
        cache and scratch: every memra allocation), memra_scratch_peak_bytes = that minus the
        pool's use before the call; device_used_peak_bytes = cudaMemGetInfo's used bytes sampled
        every 5 ms during the calls (the whole device: CUDA contexts, torch's cache; also for
        builds without Engine.memory).
kernels: one more call under torch.profiler (CUDA activity; T <= --profile-max-len): kernel time
        summed by kind (the source file each memra kernel is defined in, cuda/*.cu: kda, mla, dsa,
        moe, mhc, mlp, basic = norms / rope / embedding, gemm = memra's GEMV / linear and
        cuBLAS, other) and the top kernels.

    python3 benchmarks/bench_model_prefill.py [--quick] [--lengths 1024,8192] [--batch 8x2048]
    python3 benchmarks/bench_model_prefill.py --device cpu     # smoke test: tiny widths, CPU, f32
"""

from __future__ import annotations

import gc
import os
import re
import statistics
import sys
import threading
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_model_decode as bmd  # noqa: E402  (sets TRITON_CACHE_AUTOTUNING before fla loads)
from common import Bench, base_parser, emit_record, kernel_durations, kernel_option_fields, log  # noqa: E402
from decode_setup import ensure_checkpoint  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
KDA_CHUNK = 64  # the chunked KDA form's chunk (fla's chunk_kda), for its FLOP count
# Issue 20's targets: T -> (field, bound).
TARGETS = {1024: ("memra_ttft_s", "<=", 0.030), 8192: ("memra_tok_s", ">=", 40000.0),
           32768: ("memra_tok_s", ">=", 30000.0)}


# ============================================================================ FLOPs
def _sum_min(a: int, b: int, w: int) -> int:
    """sum of min(v, w) for v in [a, b]."""
    if b < a:
        return 0
    if b <= w:
        return (a + b) * (b - a + 1) // 2
    if a > w:
        return w * (b - a + 1)
    return (a + w) * (w - a + 1) // 2 + w * (b - w)


def _sum_pools(a: int, b: int, p: int) -> int:
    """sum of v // p for v in [a, b] (complete pools seen by the query at position v - 1)."""
    def upto(n: int) -> int:
        q, r = divmod(n, p)
        return p * q * (q - 1) // 2 + q * (r + 1)
    return upto(b) - upto(a - 1) if b >= a else 0


def prefill_flops(cfg, T: int, pos0: int = 0) -> dict:
    """bf16 FLOPs (2 per multiply-add) of a prefill of tokens [pos0, pos0 + T) of one sequence, by
    component, for a parsed glm5_next config. Query at position p reads p + 1 rows (causal) or
    at most index_topk + index_kpool - 1 (a DSA layer's index list width) and scores its
    (p + 1) // index_kpool complete pools (full indexer layers)."""
    D, V, hc = cfg.hidden_size, cfg.vocab_size, cfg.hc_mult
    a, b = pos0 + 1, pos0 + T  # keys seen by the first and the last query
    out = defaultdict(int)
    for i in range(cfg.num_hidden_layers):
        if cfg.layer_types[i] == "linear_attention":
            H, dk, K = cfg.linear_num_heads, cfg.linear_head_dim, cfg.linear_conv_kernel_dim
            qkv = H * dk
            mats = 3 * qkv * D + dk * D + qkv * dk + H * D + dk * D + qkv * dk + D * qkv
            out["kda_proj"] += 2 * T * mats
            out["kda_conv"] += 2 * T * 3 * qkv * K
            dv = dk
            # chunked form per token and head: the state read for q and for the delta and the
            # state update (3 dk dv), the intra-chunk products q k^T and k k^T (2 C dk) and the
            # two products with the value rows (2 C dv).
            out["kda_scan"] += 2 * T * H * (3 * dk * dv + 2 * KDA_CHUNK * (dk + dv))
        else:
            H, ql, R, dr = cfg.num_attention_heads, cfg.q_lora_rank, cfg.kv_lora_rank, cfg.qk_rope_head_dim
            dn, dv = cfg.qk_nope_head_dim, cfg.v_head_dim
            q_mats = (ql * D + H * (dn + dr) * ql) if ql else H * (dn + dr) * D
            out["mla_proj"] += 2 * T * (q_mats + (R + dr) * D + H * dn * R + H * R * dv + D * H * dv)
            sparse = cfg.layer_types[i] == "deepseek_sparse_attention"
            keys = _sum_min(a, b, cfg.index_topk + cfg.index_kpool - 1) if sparse else (a + b) * T // 2
            out["mla_attention"] += 2 * H * keys * ((R + dr) + R)
            if sparse and cfg.indexer_types[i] == "full":
                Hi, di = cfg.index_n_heads, cfg.index_head_dim
                out["indexer_proj"] += 2 * T * (Hi * di * ql + di * D + Hi * D + di * D)
                out["indexer_scores"] += 2 * Hi * di * _sum_pools(a, b, cfg.index_kpool)
        out["mhc"] += 2 * 2 * T * (2 + hc) * hc * hc * D
        if cfg.mlp_layer_types[i] == "dense":
            out["dense_mlp"] += 2 * T * 3 * cfg.intermediate_size * D
        else:
            I, E, k = cfg.moe_intermediate_size, cfg.n_routed_experts, cfg.num_experts_per_tok
            out["moe_router"] += 2 * T * E * D
            out["moe_shared"] += 2 * T * 3 * I * cfg.n_shared_experts * D
            out["moe_experts"] += 2 * T * k * 3 * I * D
    out["lm_head"] += 2 * V * D  # the last row's logits only
    out = dict(out)
    return {"total": sum(out.values()), "breakdown": out}


# ============================================================================ measurements
def gemm_rate(b: Bench, e) -> tuple[float, str]:
    """Dense bf16 GEMM FLOP/s measured now: torch.matmul 8192^3 (cuBLAS), else memra's linear."""
    torch = b.torch
    if not b.cuda:
        import numpy as np
        x = np.ones((512, 512), np.float32)
        t = time.perf_counter()
        for _ in range(5):
            x @ x
        return 5 * 2 * 512**3 / (time.perf_counter() - t), "numpy f32 512^3 (CPU smoke test)"
    n = 8192
    try:
        x = torch.randn(n, n, device=b.dev, dtype=torch.bfloat16)
        y = torch.randn(n, n, device=b.dev, dtype=torch.bfloat16)
        us = b.time_torch(lambda: torch.matmul(x, y))
        x = y = None  # free them before memra runs
        b.release()
        return 2 * n**3 / (us * 1e-6), f"torch.matmul bf16 {n}^3"
    except Exception as ex:  # noqa: BLE001 - memra's cuBLAS path instead
        log(f"model_prefill: torch GEMM failed ({ex}); timing memra's linear")
    import numpy as np

    import memra
    from memra import _core
    w = _core.DeviceWeight(e, memra.Weight(np.ones((n, n), np.float32)), dtype="bfloat16")
    x = e.to_device(np.ones((n, n), np.float32))
    _core.linear(x, w, engine=e)
    e.synchronize()
    t = time.perf_counter()
    for _ in range(5):
        _core.linear(x, w, engine=e)
    e.synchronize()
    return 5 * 2 * n**3 / (time.perf_counter() - t), f"memra linear bf16 weight {n}^3 (cuBLAS)"


class DevicePeak:
    """Peak of cudaMemGetInfo's used bytes while the block runs (sampled every 5 ms)."""

    def __init__(self, torch, dev):
        self.torch, self.dev, self.peak = torch, dev, None

    def _used(self):
        free, total = self.torch.cuda.mem_get_info(self.dev)
        return total - free

    def __enter__(self):
        if self.dev.type != "cuda":
            return self
        self.peak = self._used()
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()
        return self

    def _run(self):
        while not self._stop.wait(0.005):
            self.peak = max(self.peak, self._used())

    def __exit__(self, *exc):
        if self.dev.type == "cuda":
            self._stop.set()
            self._t.join()
            self.peak = max(self.peak, self._used())
        return False


def kernel_kinds() -> dict[str, str]:
    """memra kernel name -> kind, from the cuda/*.cu file that defines it."""
    kinds = {"kda": "kda", "gdn": "gdn", "mla": "mla", "dsa": "dsa", "moe": "moe", "mhc": "mhc",
             "mlp": "mlp", "gemv": "gemm", "linear": "gemm", "attention": "attention", "basic": "basic",
             "sample": "sample"}
    out: dict[str, set] = defaultdict(set)
    for f in sorted((ROOT / "cuda").glob("*.cu*")):
        kind = next((k for p, k in kinds.items() if f.stem.startswith(p)), "other")
        text = f.read_text(errors="replace")
        for g in re.finditer(r"__global__", text):  # the name follows within a few tokens
            m = re.search(r"\b(\w+_kernel)\s*\(", text[g.end():g.end() + 300])
            if m:
                out[m.group(1)].add(kind)
    return {name: "|".join(sorted(k)) for name, k in out.items()}


CUBLAS = re.compile(r"gemm|cutlass|xmma|cublas|splitK|gemv2|Kernel2", re.I)


def kind_of(name: str, kinds: dict[str, str]) -> str:
    for ident in re.findall(r"\w+_kernel\b", name):
        if ident in kinds:
            return kinds[ident]
    return "gemm" if CUBLAS.search(name) else "other"


def profile_call(fn, kinds: dict[str, str]) -> dict:
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
    by_kind, by_name = defaultdict(float), defaultdict(lambda: [0.0, 0])
    for name, us in kernel_durations(prof, names=True):
        by_kind[kind_of(name, kinds)] += us
        by_name[name[:100]][0] += us
        by_name[name[:100]][1] += 1
    total = sum(by_kind.values())
    top = sorted(by_name.items(), key=lambda kv: -kv[1][0])[:20]
    return {"memra_gpu_ms": round(total / 1e3, 3),
            "memra_kernel_ms_by_kind": {k: round(v / 1e3, 3) for k, v in sorted(by_kind.items(), key=lambda kv: -kv[1])},
            "memra_kernels_top": [[k, round(v[0] / 1e3, 3), v[1]] for k, v in top]}


# ============================================================================ memra
def run_memra(args, b: Bench, folder: Path, lengths, batch, prompts, reps_of) -> tuple[dict, dict]:
    import numpy as np

    import memra
    torch, dev = b.torch, b.dev
    max_len = max(lengths + ([batch[1]] if batch else [])) + 8
    t0 = time.perf_counter()
    m = memra.load(folder, device="cuda:%d" % args.device_index if b.cuda else "cpu",
                   dtype="bfloat16" if b.cuda else "float32", max_batch=max(1, batch[0] if batch else 1),
                   max_len=max_len, progress=False,
                   kernel_options=memra.KernelOptions(**kernel_option_fields(args.kernel_options)))
    e = m.engine if m.engine.is_cuda else None
    if e is not None:
        e.synchronize()
    has_mem = e is not None and hasattr(e, "memory")
    info = {"memra_load_s": round(time.perf_counter() - t0, 2), "cache_bytes": m.cache.nbytes,
            "max_len": max_len, "prefill_chunk": getattr(m, "prefill_chunk", None),
            "kernel_options": kernel_option_fields(args.kernel_options),
            "memra_weights_and_cache_bytes": e.memory()["pool_used"] if has_mem else None}
    log(f"model_prefill: memra.load {info['memra_load_s']} s, cache {m.cache.nbytes / 2**30:.2f} GiB, "
        f"prefill_chunk {info['prefill_chunk']}")
    kinds = kernel_kinds()
    cache = m.cache

    def timed(calls):
        """Run `calls` (each prefills and leaves logits on the host) with memory watched; wall s."""
        if e is not None:
            e.synchronize()
        before = e.memory(reset_peak=True) if has_mem else None
        with DevicePeak(torch, dev) as dp:
            t = time.perf_counter()
            out = [c() for c in calls]
            dt = time.perf_counter() - t
        after = e.memory() if has_mem else None
        mem = {"device_used_peak_bytes": dp.peak}
        if has_mem:
            mem["memra_pool_peak_bytes"] = after["pool_used_peak"]
            mem["memra_scratch_peak_bytes"] = after["pool_used_peak"] - before["pool_used"]
        return dt, out, mem

    res = {}
    for T in lengths:
        r = {}
        warm, ids = prompts[("warm", T)], prompts[("timed", T)]
        try:
            cache.free(0)
            m.prefill(cache, 0, warm)
            cache.free(0)
            times, mems = [], []
            for _ in range(reps_of(T)):
                dt, out, mem = timed([lambda: m.prefill(cache, 0, ids)])
                cache.free(0)
                times.append(dt)
                mems.append(mem)
            r["memra_times_s"] = [round(t, 5) for t in times]
            r["memra_ttft_s"] = statistics.median(times)
            r["memra_tok_s"] = T / r["memra_ttft_s"]
            r["memra_first_token"] = int(np.argmax(out[0]))
            for k in mems[0]:
                vals = [x[k] for x in mems if x[k] is not None]
                r[k] = max(vals) if vals else None
            if e is not None and T <= args.profile_max_len and not args.no_profile:
                r.update(profile_call(lambda: m.prefill(cache, 0, ids), kinds))
                cache.free(0)
            log(f"model_prefill: memra T={T}: TTFT {r['memra_ttft_s'] * 1e3:.1f} ms, {r['memra_tok_s']:.0f} tok/s, "
                f"pool peak {r.get('memra_pool_peak_bytes')}, by kind {r.get('memra_kernel_ms_by_kind')}")
        except Exception as ex:  # noqa: BLE001 - e.g. out of memory at a length: report, go on
            r["memra_error"] = f"{type(ex).__name__}: {ex}"
            log(f"model_prefill: memra T={T} failed: {r['memra_error']}")
            try:
                cache.free(0)
            except Exception:  # noqa: BLE001
                pass
        res[T] = r
    if batch:
        P, L = batch
        r, seq_logits = {}, None
        ps, warm = prompts[("batch", L)][:P], prompts[("batch_warm", L)][:P]
        try:
            for s in range(P):
                cache.free(s)
            for s in range(P):
                m.prefill(cache, s, warm[s])
            for s in range(P):
                cache.free(s)
            dt, seq_logits, mem = timed([lambda s=s: m.prefill(cache, s, ps[s]) for s in range(P)])
            r.update(mem)
            r["memra_ttft_s"] = dt  # the last prompt's first logits
            r["memra_tok_s"] = P * L / dt
            for s in range(P):
                cache.free(s)
            m.generate_batch(warm, 1, ignore_eos=True)
            t = time.perf_counter()
            m.generate_batch(ps, 1, ignore_eos=True)
            r["memra_generate_batch_s"] = round(time.perf_counter() - t, 5)
            log(f"model_prefill: memra {P} x {L}: {dt:.3f} s sequential prefills ({r['memra_tok_s']:.0f} tok/s), "
                f"generate_batch {r['memra_generate_batch_s']:.3f} s")
        except Exception as ex:  # noqa: BLE001
            r["memra_error"] = f"{type(ex).__name__}: {ex}"
            log(f"model_prefill: memra batch failed: {r['memra_error']}")
        r["arm"] = "sequential"
        res["batch"] = r
        res["batched"] = run_batched(m, cache, P, L, ps, warm, timed, seq_logits)
    m = cache = None
    gc.collect()
    return res, info


def run_batched(m, cache, P: int, L: int, ps, warm, timed, seq_logits) -> dict:
    """The batched arm: one Model.prefill_batch of the P prompts into slots 0..P-1 (after a
    warm-up call on other prompts), wall clock to the [P, vocab] logits on the host."""
    import numpy as np

    r: dict = {"arm": "batched"}
    if not hasattr(m, "prefill_batch"):
        r["memra_error"] = "this build has no Model.prefill_batch"
        return r
    from memra.batch_prefill import plan_calls
    slots = list(range(P))
    try:
        for s in slots:
            cache.free(s)
        m.prefill_batch(cache, slots, warm)
        for s in slots:
            cache.free(s)
        dt, out, mem = timed([lambda: m.prefill_batch(cache, slots, ps)])
        for s in slots:
            cache.free(s)
        r.update(mem)
        r["memra_ttft_s"] = dt  # every prompt's first logits
        r["memra_tok_s"] = P * L / dt
        r["calls"] = len(plan_calls([L] * P, m.prefill_chunk))
        if seq_logits is not None:
            r["first_tokens_match"] = bool((np.argmax(out[0], axis=1) ==
                                            np.array([np.argmax(x) for x in seq_logits])).all())
        log(f"model_prefill: memra {P} x {L}: {dt:.3f} s batched prefill ({r['memra_tok_s']:.0f} tok/s, "
            f"{r['calls']} calls)")
    except Exception as ex:  # noqa: BLE001
        r["memra_error"] = f"{type(ex).__name__}: {ex}"
        log(f"model_prefill: memra batched prefill failed: {r['memra_error']}")
    return r


# ============================================================================ peer
def run_peer(args, b: Bench, folder: Path, lengths, prompts, reps_of) -> tuple[dict, dict]:
    import transformers
    from transformers import Glm5NextForConditionalGeneration
    from transformers.models.glm5_next import modeling_glm5_next as mod
    torch, dev = b.torch, b.dev
    info = {"peer_kernels": bmd.peer_kernels(mod)}
    try:
        import fla
        fla_ver = getattr(fla, "__version__", "?")
    except Exception as ex:  # noqa: BLE001
        fla_ver, info["fla_unavailable"] = None, f"{type(ex).__name__}: {ex}"
    dtype = torch.bfloat16 if b.cuda else torch.float32
    t0 = time.perf_counter()
    import importlib.util
    # straight onto the device when accelerate is there (transformers wants it for a device_map)
    kw = {"device_map": str(dev)} if b.cuda and importlib.util.find_spec("accelerate") else {}
    model = Glm5NextForConditionalGeneration.from_pretrained(folder, dtype=dtype, **kw).to(dev).eval()
    info["peer_load_s"] = round(time.perf_counter() - t0, 2)
    info["peer"] = (f"transformers {transformers.__version__}" + (f" + fla {fla_ver}" if fla_ver else " (no fla)")
                    + f": Glm5NextForConditionalGeneration forward(use_cache=True, logits_to_keep=1), "
                    f"{str(dtype)[6:]}, attn {model.config._attn_implementation}")

    def call(ids):
        x = torch.tensor([ids], dtype=torch.long, device=dev)
        bmd.sync(torch, dev)
        t = time.perf_counter()
        with torch.no_grad():
            out = model(input_ids=x, use_cache=True, logits_to_keep=1)
        last = out.logits[0, -1].float().cpu()
        return time.perf_counter() - t, int(last.argmax())

    res = {}
    for T in lengths:
        r = {}
        try:
            t = time.perf_counter()
            call(prompts[("warm", T)])
            r["peer_warmup_s"] = round(time.perf_counter() - t, 2)
            if b.cuda:
                torch.cuda.reset_peak_memory_stats(dev)
            times = []
            for _ in range(min(3, reps_of(T))):  # seconds a call at 8K: three suffice
                dt, tok = call(prompts[("timed", T)])
                times.append(dt)
            r["peer_times_s"] = [round(x, 5) for x in times]
            r["peer_ttft_s"] = statistics.median(times)
            r["peer_tok_s"] = T / r["peer_ttft_s"]
            r["peer_first_token"] = tok
            if b.cuda:
                r["peer_torch_peak_bytes"] = torch.cuda.max_memory_allocated(dev)
            log(f"model_prefill: peer T={T}: TTFT {r['peer_ttft_s'] * 1e3:.1f} ms (warm-up {r['peer_warmup_s']} s)")
        except Exception as ex:  # noqa: BLE001
            r["peer_unavailable"] = f"{type(ex).__name__}: {ex}"
            log(f"model_prefill: peer T={T} failed: {r['peer_unavailable']}")
        res[T] = r
    model = None
    gc.collect()
    b.release()
    return res, info


# ============================================================================ main
def main() -> int:
    p = base_parser(__doc__.split("\n\n")[0])
    p.add_argument("--tiny", action="store_true", help="toy widths (implied by --device cpu)")
    p.add_argument("--folder", default=None, help="checkpoint folder (default: bench_model_decode.py's)")
    p.add_argument("--rebuild", action="store_true")
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--experts", type=int, default=None, help="routed experts (default 32; --tiny: 8)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--lengths", default=None,
                   help="prompt lengths at B = 1 (default 1024,8192,32768,131072; --quick 1024,8192; cpu 16,48)")
    p.add_argument("--batch", default=None,
                   help="PxL: P prompts of L tokens, prefilled one after another and in one batched "
                        "prefill (default 8x2048; --quick and cpu: none unless given; 'none' skips it)")
    p.add_argument("--peer-max-len", type=int, default=None,
                   help="longest prompt given to transformers (default 8192; --quick 1024)")
    p.add_argument("--skip-peer", action="store_true")
    p.add_argument("--profile-max-len", type=int, default=32768,
                   help="profile one more call per length up to this T (kernel time by kind)")
    p.add_argument("--no-profile", action="store_true")
    p.add_argument("--kernel-options", default="",
                   help="memra.KernelOptions fields, FIELD=VALUE,... (e.g. prefill_chunk=4096)")
    p.epilog = "--reps sets the timed calls per length (default 5 up to 8K, 3 at 32K, 1 beyond; --quick 3 / 1)."
    args = p.parse_args()
    cpu = args.device == "cpu"
    args.tiny = args.tiny or cpu
    b = Bench(args, "model_prefill")
    torch = b.torch
    lengths = [int(x) for x in (args.lengths or ("16,48" if cpu else "1024,8192" if args.quick
                                                 else "1024,8192,32768,131072")).split(",")]
    batch_arg = args.batch or ("none" if (args.quick or cpu) else "8x2048")
    batch = None if batch_arg == "none" else tuple(int(x) for x in batch_arg.lower().split("x"))
    peer_max = args.peer_max_len or (1024 if args.quick else 8192)

    def reps_of(T: int) -> int:
        if args.reps is not None:
            return args.reps
        if args.quick or cpu:
            return 3 if T <= 8192 else 1
        return 5 if T <= 8192 else 3 if T <= 32768 else 1

    tc = bmd.text_config(args)
    folder = Path(args.folder or f"/tmp/memra-bench-glm5next-{args.layers}L{tc['n_routed_experts']}E"
                  + ("-tiny" if args.tiny else ""))
    build_s = ensure_checkpoint("model_prefill", folder, args, bmd.marker_of(args, tc),
                                lambda: bmd.build_checkpoint(folder, args, tc, b.dev, torch))
    from memra.config import read_config
    _, cfg = read_config(folder)

    import numpy as np
    rng = np.random.default_rng(args.seed + 2)
    hi = min(cfg.vocab_size - 1, 150000)
    prompts = {}
    for T in lengths:
        prompts[("warm", T)] = rng.integers(0, hi, T).tolist()
        prompts[("timed", T)] = rng.integers(0, hi, T).tolist()
    if batch:
        for key in ("batch", "batch_warm"):
            prompts[(key, batch[1])] = [rng.integers(0, hi, batch[1]).tolist() for _ in range(batch[0])]

    rate, rate_how = gemm_rate(b, b.engine)
    log(f"model_prefill: bf16 GEMM {rate / 1e12:.1f} TFLOP/s ({rate_how})")

    peer_lengths = [T for T in lengths if T <= peer_max]
    peer, peer_info = {}, {}
    if args.skip_peer or cpu or not peer_lengths:
        why = "--skip-peer" if args.skip_peer else "CPU smoke test" if cpu else f"every T > --peer-max-len {peer_max}"
        peer_info["peer_unavailable"] = why
    else:
        try:
            peer, peer_info = run_peer(args, b, folder, peer_lengths, prompts, reps_of)
        except Exception as ex:  # noqa: BLE001 - not importable, out of memory, ...
            peer_info["peer_unavailable"] = f"{type(ex).__name__}: {ex}"
            log(f"model_prefill: transformers failed: {peer_info['peer_unavailable']}")
            b.release()
    mem, mem_info = run_memra(args, b, folder, lengths, batch, prompts, reps_of)

    shape0 = {"model": "glm5_next", "layers": cfg.num_hidden_layers, "experts": cfg.n_routed_experts,
              "top_k": cfg.num_experts_per_tok, "hidden": cfg.hidden_size, "vocab": cfg.vocab_size,
              "dtype": "bfloat16" if b.cuda else "float32"}
    common = {"gemm_flops_per_s": rate, "gemm": rate_how, "device": b.device_name, "folder": str(folder),
              "build_s": build_s, "memra_timer": "wall clock: prefill call to logits on the host",
              "peer": peer_info.get("peer", "transformers"),
              **{k: v for k, v in peer_info.items() if k != "peer"}, **mem_info}
    def peer_row(T: int) -> dict:
        if T in peer:
            return peer[T]
        if "peer_unavailable" in peer_info:
            return {"peer_unavailable": peer_info["peer_unavailable"]}
        return {"peer_unavailable": f"T > --peer-max-len {peer_max}"}

    rows = [(T, 1, T, mem.get(T, {}), peer_row(T)) for T in lengths]
    if batch:
        for arm in ("batch", "batched"):
            rows.append((batch[1], batch[0], batch[0] * batch[1], mem.get(arm, {}),
                         {"peer_unavailable": "not run for the batch"}))
    for T, B, tokens, mr, pr in rows:
        fl = prefill_flops(cfg, T)
        roof_tok_s = tokens / (B * fl["total"] / rate)
        mt, pt = mr.get("memra_tok_s"), pr.get("peer_tok_s")
        rec = {"bench": "model_prefill", "shape": {**shape0, "T": T, "B": B},
               "memra_ttft_s": round(mr["memra_ttft_s"], 5) if mr.get("memra_ttft_s") else None,
               "memra_tok_s": round(mt, 1) if mt else None,
               "peer_ttft_s": round(pr["peer_ttft_s"], 5) if pr.get("peer_ttft_s") else None,
               "peer_tok_s": round(pt, 1) if pt else None,
               "ratio": round(mt / pt, 4) if (mt and pt) else None,
               "flops_per_prompt": fl["total"], "flops_breakdown": fl["breakdown"],
               "roofline_tok_s": round(roof_tok_s, 1),
               "frac_of_roofline": round(mt / roof_tok_s, 4) if mt else None}
        if B == 1 and T in TARGETS and mt:
            field, op, bound = TARGETS[T]
            v = rec[field]
            rec["target"] = f"{field} {op} {bound}"
            rec["meets_target"] = v <= bound if op == "<=" else v >= bound
        if mr.get("memra_first_token") is not None and pr.get("peer_first_token") is not None:
            rec["first_token_match"] = mr["memra_first_token"] == pr["peer_first_token"]
        rec.update({k: v for k, v in mr.items() if k not in rec and k not in ("memra_tok_s", "memra_ttft_s")})
        rec.update({k: v for k, v in pr.items() if k not in rec and k not in ("peer_tok_s", "peer_ttft_s")})
        rec.update({k: v for k, v in common.items() if k not in rec})
        emit_record(rec)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except (SystemExit, KeyboardInterrupt):
        raise
    except Exception as exc:  # a one-line record in bench.jsonl too, then the traceback on stderr
        emit_record({"bench": "model_prefill", "error": f"{type(exc).__name__}: {exc}"})
        raise
