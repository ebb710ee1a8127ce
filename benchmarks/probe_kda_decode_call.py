#!/usr/bin/env python3
"""Where a KDA decode call's time goes beyond its kernel: one shape, several timers.

bench_kda_decode.py's event timer reads memra's call at H = 64, B = 256 ~60 us above the
kernel (fla's call sits ~4 us above its own), while the profiler's GPU span of back-to-back
calls equals the kernel. This probe times the same call (memra._core.kda_scan, batch=True,
T = 1; fla.ops.kda.fused_recurrent_kda when it imports) by
  events   CUDA events around each call on the op's stream (bench_kda_decode's memra_us);
  loop     wall clock of `reps` calls enqueued back to back, one sync at the end, per call;
  span     torch.profiler over the events loop: median kernel duration and the median gap
           from one kernel's end to the next kernel's start while the events sit between them;
each for the default Engine and one made with KernelOptions(pdl=False). One JSON line per shape.

    python3 benchmarks/probe_kda_decode_call.py [--shapes 64:256,64:64,32:256,32:64]
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_kda_decode import D, load_fla, make_inputs  # noqa: E402
from common import trace_events  # noqa: E402


def events_us(torch, stream, fn, reps):
    ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
          for _ in range(reps)]
    for s, e in ev:
        s.record(stream)
        fn()
        e.record(stream)
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) * 1e3 for s, e in ev)


def loop_us(torch, fn, reps):
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / reps * 1e6


def span(torch, stream, fn, reps, with_events):
    from torch.profiler import ProfilerActivity, profile
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        if with_events:
            events_us(torch, stream, fn, reps)
        else:
            for _ in range(reps):
                fn()
        torch.cuda.synchronize()
    ks = sorted((float(e["ts"]), float(e["dur"])) for e in trace_events(prof)
                if isinstance(e, dict) and str(e.get("cat", "")).lower() == "kernel")
    if len(ks) < 3:
        return {}
    gaps = [ks[i + 1][0] - (ks[i][0] + ks[i][1]) for i in range(len(ks) - 1)]
    return {"kernel_us": round(statistics.median(d for _, d in ks), 3),
            "gap_us": round(statistics.median(gaps), 3),
            "start_to_start_us": round(statistics.median(
                ks[i + 1][0] - ks[i][0] for i in range(len(ks) - 1)), 3)}


def main() -> int:
    import argparse
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", default="64:256,64:64,32:256,32:64")
    ap.add_argument("--reps", type=int, default=30)
    args = ap.parse_args()
    import torch
    import memra
    from memra import _core
    dev = torch.device("cuda", 0)
    fla_fn, why = load_fla()
    engines = {"pdl": memra.Engine("cuda", 0),
               "nopdl": memra.Engine("cuda", 0, options=memra.KernelOptions(pdl=False))}
    scale = D ** -0.5
    for item in args.shapes.split(","):
        H, B = (int(x) for x in item.split(":"))
        q, k, v, g, beta, state = make_inputs(torch, dev, B, H)
        torch.cuda.synchronize()
        rec = {"probe": "kda_decode_call", "H": H, "B": B, "reps": args.reps}
        for name, e in engines.items():
            stream = torch.cuda.ExternalStream(e.cuda_stream, device=dev)

            def fn(e=e):
                return _core.kda_scan(q, k, v, g, beta, state, scale=scale, batch=True, engine=e)

            for _ in range(3):
                fn()
            e.synchronize()
            rec[f"memra_{name}_events_us"] = round(events_us(torch, stream, fn, args.reps), 3)
            e.synchronize()
            rec[f"memra_{name}_loop_us"] = round(loop_us(torch, fn, args.reps), 3)
            e.synchronize()
            rec[f"memra_{name}_span_events"] = span(torch, stream, fn, args.reps, True)
            rec[f"memra_{name}_span_loop"] = span(torch, stream, fn, args.reps, False)
            e.synchronize()
        if fla_fn is not None:
            def pf():
                return fla_fn(q, k, v, g, beta, scale=scale, initial_state=state,
                              output_final_state=True, use_qk_l2norm_in_kernel=False)
            for _ in range(3):
                pf()
            cur = torch.cuda.current_stream(dev)
            rec["fla_events_us"] = round(events_us(torch, cur, pf, args.reps), 3)
            rec["fla_loop_us"] = round(loop_us(torch, pf, args.reps), 3)
            rec["fla_span_events"] = span(torch, cur, pf, args.reps, True)
        else:
            rec["fla_unavailable"] = why
        print(json.dumps(rec), flush=True)
        del q, k, v, g, beta, state
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
