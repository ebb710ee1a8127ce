"""In-graph cost of each kernel of the decode step (B = 1, or B rows with --batch B; a memra
build with CMake MEMRA_TRACE=ON: every kernel's block 0 records when its pdl_wait returned, i.e.
when the kernel in front of it completed; cuda/trace.cu). The difference between consecutive
records is what each kernel adds to the step's critical path inside the programmatic chain,
which ncu (each kernel alone) cannot show.
Needs the bench_model_decode checkpoint (build it with bench_model_decode.py --quick first).

    MEMRA_CMAKE_ARGS=-DMEMRA_TRACE=ON bash scripts/gpu_tests.sh tests/test_cuda_probe.py
    PYTHONPATH=build/dev-gpu/site python3 benchmarks/trace_model_step.py [folder] [--batch B] > trace.jsonl

Prints one JSON line per kernel position of the step: index, blocks, threads, mean / min
microseconds from its predecessor's completion to its own over the traced steps, and a last line
with the step's total. The position's kernel name comes from the ncu sequence of the same step
(benchmarks/ncu_model_step.py; results/*-ncu-step.txt list it in order).
"""
import ctypes
import json
import os
import sys

import numpy as np

import memra

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import step_driver_setup  # noqa: E402

steps = int(os.environ.get("TRACE_STEPS", "20"))
lib = ctypes.CDLL(os.path.join(os.path.dirname(memra.__file__), "libmemra_cuda.so"))
m, slots, toks, seeds = step_driver_setup(sys.argv[1:], max_len=256)  # the traced steps: replays
B = len(slots)
cap = 1 << 16
rc = lib.memra_cuda_trace_begin(ctypes.c_uint(cap))
if rc != 0:
    print(json.dumps({"bench": "trace_model_step", "error": f"trace_begin returned {rc} (a build "
                      "without MEMRA_TRACE gives 50000)"}))
    sys.exit(1)
for i in range(steps):
    toks = m._decode_sampled(slots, toks, 0.0, None, None, seeds, 100 + i)
rec = np.zeros(cap, dtype=[("t_ns", "<u8"), ("blocks", "<u4"), ("threads", "<u4")])
n = ctypes.c_uint(0)
rc = lib.memra_cuda_trace_end(rec.ctypes.data_as(ctypes.c_void_p), ctypes.c_uint(cap), ctypes.byref(n))
rec = rec[: min(n.value, cap)]
per = len(rec) // steps
if rc != 0 or per == 0 or len(rec) % steps:
    print(json.dumps({"bench": "trace_model_step", "error": f"rc {rc}, {len(rec)} records over "
                      f"{steps} steps (not a whole number per step)"}))
    sys.exit(1)
t = rec["t_ns"].astype(np.int64).reshape(steps, per)
d = np.diff(t, axis=1) / 1000.0  # d[:, i]: kernel i's completion minus its predecessor's
for i in range(per - 1):
    print(json.dumps({"index": i, "blocks": int(rec["blocks"][i]), "threads": int(rec["threads"][i]),
                      "mean_us": round(float(d[:, i].mean()), 2),
                      "min_us": round(float(d[:, i].min()), 2)}))
print(json.dumps({"bench": "trace_model_step", "B": B, "kernels_per_step": per, "steps": steps,
                  "step_us_mean": round(float((t[:, -1] - t[:, 0]).mean() / 1000.0), 1)}))
