#!/usr/bin/env python3
"""KDA decode step (T = 1) over B sequences: memra vs fla, same inputs, same run.

memra: memra._core.kda_scan(q, k, v, g, beta, state, scale=, batch=True, engine=e)
       -> (o [B, 1, H, 128], state_out [B, H, 128, 128]), one launch, input state untouched.
peer:  fla.ops.kda.fused_recurrent_kda(q, k, v, g, beta, scale=, initial_state=state,
       output_final_state=True, use_qk_l2norm_in_kernel=False) (flash-linear-attention 0.6.0)
       -> (o, final_state), a new final state (not in place), so both read and write the state.
Inputs (float32, torch CUDA tensors, both ops take them as they are): q, k L2-normalised
[B, 1, H, 128]; v [B, 1, H, 128]; g = logsigmoid(randn) (log decay) [B, 1, H, 128];
beta = sigmoid(randn) [B, 1, H]; state 0.1 randn [B, H, 128, 128].
bytes = state traffic, 2 * B * H * 128 * 128 * 4 (read + write); q, k, v, g and o (f32, B * H * 128
each) are 5 / 256 (~2 %) more, not counted: the target (issue 20's 0.92) was set in these terms.
memra_kernel_us: the kernel alone (torch.profiler) on an Engine made with KernelOptions(pdl=False)
(as bench_gemv.py): launched as a programmatic dependent, the kernel starts before the launch in
front of it ends and its profiled duration includes that wait (memra_pdl_kernel_us: the default
Engine's kernel timed that way; gpu_span_us: the default Engine's GPU time a call).
max_rel_err: memra vs fla (max |diff| / max |fla| over o and the state); max_rel_err_ref and
peer_max_rel_err_ref: memra / fla vs a float32 torch evaluation of the same step.

memra_loop_us / peer_loop_us: the call as a decode loop pays it, wall clock of `reps` calls
enqueued back to back with one synchronisation at the end, per call (GPU-bound from B = 64: the
calls' GPU throughput; host-bound at B = 1); loop_ratio = peer_loop_us / memra_loop_us. The event
timer (memra_us) overstates a call launched as a programmatic dependent: at H = 64, B = 64 it read
150.5 us with PDL and 136.6 us without, while the profiler put the same event loop's kernels
138.1 us apart and the loop timer read 134.2 us (benchmarks/results/2026-12-02-h200-s10-kda-decode-call.jsonl).

Where the call costs more than its kernel: host_us (host time per call with the calls
enqueued back to back, allocations included), gpu_span_us (under the profiler, GPU time from one
call's kernel to the next's, gaps included), nonkernel (the copies / memsets a call puts on the
GPU, by name, us per call) and the memory pool's reserved bytes before and at most during the
timed calls (pool_reserved_gib, pool_reserved_peak_gib: a pool that maps new memory for every
call's output shows a peak far above one call's need).

    python3 benchmarks/bench_kda_decode.py [--quick] [--shapes 32:8,64:4]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from common import Bench, base_parser, log, rel_err, to_torch, trace_events  # noqa: E402

D = 128
SHAPES = [(64, 1), (64, 64), (64, 256), (32, 1), (32, 64), (32, 256)]  # (H, B)
SMOKE_SHAPES = [(2, 1), (2, 3)]  # --device cpu
PEER = "fla.ops.kda.fused_recurrent_kda (flash-linear-attention 0.6.0)"


def load_fla():
    """(fused_recurrent_kda, None) or (None, why it is unavailable)."""
    try:
        import fla  # noqa: F401
        from fla.ops.kda import fused_recurrent_kda
        ver = getattr(fla, "__version__", "?")
        if ver != "0.6.0":
            log(f"kda_decode: fla version {ver}, the reference table used 0.6.0")
        return fused_recurrent_kda, None
    except Exception as e:  # noqa: BLE001 - any import failure means: no peer
        return None, f"{type(e).__name__}: {e}"


def make_inputs(torch, dev, B, H, seed=0):
    F = torch.nn.functional
    gen = torch.Generator(device=dev).manual_seed(seed)

    def r(*shape):
        return torch.randn(*shape, device=dev, dtype=torch.float32, generator=gen)

    q = F.normalize(r(B, 1, H, D), dim=-1).contiguous()
    k = F.normalize(r(B, 1, H, D), dim=-1).contiguous()
    v = r(B, 1, H, D)
    g = F.logsigmoid(r(B, 1, H, D))
    beta = torch.sigmoid(r(B, 1, H))
    state = 0.1 * r(B, H, D, D)
    return q, k, v, g, beta, state


def reference(torch, q, k, v, g, beta, state, scale):
    """One step of S = S exp(g)[:, None]; S += k (beta (v - k^T S)); o = (scale q)^T S, in f32."""
    q0, k0, v0, g0, b0 = q[:, 0], k[:, 0], v[:, 0], g[:, 0], beta[:, 0]
    S = state * torch.exp(g0)[..., None]
    kS = torch.einsum("bhk,bhkv->bhv", k0, S)
    u = b0[..., None] * (v0 - kS)
    S = S + k0[..., None] * u[..., None, :]
    o = torch.einsum("bhk,bhkv->bhv", q0 * scale, S)
    return o[:, None], S


def per_call_us(b, fn, until_done: bool) -> float:
    """Microseconds per call of `reps` calls enqueued back to back without a wait in between,
    after the warm-up calls. until_done=False: host time (what the host pays per call, output
    allocation included; above the kernel time it is what the event timer measures);
    until_done=True: wall clock up to one synchronisation at the end (the loop timer)."""
    b.sync()
    for _ in range(b.warmup):
        fn()
    b.sync()
    t0 = time.perf_counter()
    for _ in range(b.reps):
        fn()
    if until_done:
        b.sync()
    t1 = time.perf_counter()
    b.sync()
    return (t1 - t0) / b.reps * 1e6


def gpu_timeline(b, fn) -> dict:
    """Under torch.profiler: gpu_span_us, the median GPU time from one call's first kernel to the
    next call's (gaps and non-kernel work included), and nonkernel, the copies / memsets the
    calls put on the GPU ({name: us per call}). {} on the CPU."""
    if not b.cuda:
        return {}
    from torch.profiler import ProfilerActivity, profile
    b.sync()
    for _ in range(b.warmup):
        fn()
    b.sync()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(b.reps):
            fn()
        b.sync()
    gpu = [e for e in trace_events(prof) if isinstance(e, dict) and "dur" in e and
           str(e.get("cat", "")).lower() in ("kernel", "gpu_memcpy", "gpu_memset")]
    kernels = sorted(float(e["ts"]) for e in gpu if str(e.get("cat")).lower() == "kernel")
    out = {}
    if len(kernels) >= 2:
        out["gpu_span_us"] = round(statistics.median(
            kernels[i + 1] - kernels[i] for i in range(len(kernels) - 1)), 3)
    other = {}
    for e in gpu:
        if str(e.get("cat")).lower() != "kernel":
            name = str(e.get("name", "?"))
            other[name] = other.get(name, 0.0) + float(e["dur"]) / b.reps
    out["nonkernel"] = {k: round(v, 3) for k, v in other.items()}
    return out


def pool_gib(engine, key: str):
    m = engine.memory() if engine is not None else None
    return round(m[key] / 2**30, 3) if m else None


def parse_shapes(text: str) -> list[tuple[int, int]]:
    """'32:8,64:4' -> [(32, 8), (64, 4)] (heads H, batch B; both positive)."""
    try:
        shapes = [tuple(int(x) for x in pair.split(":")) for pair in text.split(",")]
    except ValueError:
        shapes = []
    if not shapes or any(len(hb) != 2 or min(hb) < 1 for hb in shapes):
        raise argparse.ArgumentTypeError(f"--shapes: expected H:B pairs like 32:8,64:4, got {text!r}")
    return shapes


def measure_memra(b, run_memra, run_nopdl) -> dict:
    """memra's figures on b's engine: event time, kernel time (run_nopdl: the same call on an
    Engine without programmatic launch), and where a call's time goes (module docstring)."""
    eng = b.engine
    rec = {"memra_us": b.time_memra(run_memra), "memra_pdl_kernel_us": b.kernel_us(run_memra)}
    rec["memra_kernel_us"] = (b.kernel_us(run_nopdl) if run_nopdl is not None
                              else rec["memra_pdl_kernel_us"])
    if b.cuda:
        rec["memra_loop_us"] = round(per_call_us(b, run_memra, until_done=True), 3)
        b.sync()
        rec["pool_reserved_gib"] = pool_gib(eng, "pool_reserved")
        eng.memory(reset_peak=True)
        rec["host_us"] = round(per_call_us(b, run_memra, until_done=False), 3)
        rec["pool_reserved_peak_gib"] = pool_gib(eng, "pool_reserved_peak")
        rec.update(gpu_timeline(b, run_memra))
    return rec


def main() -> int:
    p = base_parser(__doc__.split("\n\n")[0])
    p.add_argument("--shapes", type=parse_shapes, default=None,
                   help="H:B pairs, comma-separated, instead of the default shapes "
                        "(e.g. 32:8,32:16 around the decode step's part-shape switch)")
    args = p.parse_args()
    b = Bench(args, "kda_decode")
    torch = b.torch
    import memra
    from memra import _core

    fused_recurrent_kda, why = (None, "no peer in the --device cpu smoke test") if not b.cuda else load_fla()
    if why:
        log(f"kda_decode: peer unavailable: {why}")
    scale = D ** -0.5
    e_nopdl = (memra.Engine("cuda", args.device_index, options=memra.KernelOptions(pdl=False))
               if b.cuda else None)
    for H, B in args.shapes or (SHAPES if b.cuda else SMOKE_SHAPES):
        shape = {"H": H, "B": B, "T": 1, "dk": D, "dv": D, "dtype": "float32"}
        nbytes = 2 * B * H * D * D * 4
        extra = {"memra_op": "kda_scan(batch=True)"}
        log(f"kda_decode: H={H} B={B}")
        x = make_inputs(torch, b.dev, B, H)
        q, k, v, g, beta, state = x

        def run_memra():
            return _core.kda_scan(q, k, v, g, beta, state, scale=scale, batch=True, engine=b.engine)

        def run_nopdl():
            return _core.kda_scan(q, k, v, g, beta, state, scale=scale, batch=True, engine=e_nopdl)

        def run_peer():
            return fused_recurrent_kda(q, k, v, g, beta, scale=scale, initial_state=state,
                                       output_final_state=True, use_qk_l2norm_in_kernel=False)

        # Correctness first (also the first, compiling call of each side).
        o_ref, s_ref = reference(torch, *x, scale)
        memra_us = peer_us = None
        try:
            b.sync()
            o_m, s_m = (to_torch(t, b.engine, b.dev) for t in run_memra())
            b.sync()
            extra["max_rel_err_ref"] = max(rel_err(o_m, o_ref), rel_err(s_m, s_ref))
        except Exception as e:  # noqa: BLE001
            extra["memra_error"] = f"{type(e).__name__}: {e}"
            o_m = s_m = None
        if fused_recurrent_kda is not None:
            try:
                o_f, s_f = run_peer()
                b.sync()
                extra["peer_max_rel_err_ref"] = max(rel_err(o_f, o_ref), rel_err(s_f, s_ref))
                if o_m is not None:
                    extra["max_rel_err"] = max(rel_err(o_m, o_f), rel_err(s_m, s_f))
                del o_f, s_f
            except Exception as e:  # noqa: BLE001
                why_shape = f"{type(e).__name__}: {e}"
                extra["peer_unavailable"] = why_shape
                log(f"kda_decode: peer failed at H={H} B={B}: {why_shape}")
        else:
            extra["peer_unavailable"] = why
        del o_ref, s_ref, o_m, s_m
        b.release()

        if "memra_error" not in extra:
            # The kernels alone (memra_kernel_us): what the step costs inside a CUDA graph (at
            # B = 1 the event timer measures the binding's host work).
            first = measure_memra(b, run_memra, run_nopdl if e_nopdl is not None else None)
            memra_us = first.pop("memra_us")
            extra.update(first)
        if fused_recurrent_kda is not None and "peer_unavailable" not in extra:
            peer_us = b.time_torch(run_peer)
            extra["peer_loop_us"] = round(per_call_us(b, run_peer, until_done=True), 3)
            extra["peer_kernel_us"] = b.kernel_us(run_peer)
        mk, pk = extra.get("memra_kernel_us"), extra.get("peer_kernel_us")
        if mk:
            extra["kernel_frac_of_copy"] = round(nbytes / mk / 1e6 / b.copy_TBps, 4)
            if pk:
                extra["kernel_ratio"] = round(pk / mk, 4)
        ml, pl = extra.get("memra_loop_us"), extra.get("peer_loop_us")
        if ml and pl:
            extra["loop_ratio"] = round(pl / ml, 4)
        b.emit(shape, memra_us, PEER, peer_us, nbytes, **extra)
        del x, q, k, v, g, beta, state
        b.release()
    return 0


if __name__ == "__main__":
    sys.exit(main())
