#!/usr/bin/env python3
"""Host cost of an op's arguments over DLPack: a tiny CPU op (rms_norm, x [1, 64] f32 and its
weight [64]) called with numpy arrays and with torch CPU tensors of the same memory.

The torch call pays torch's own export (``Tensor.__dlpack__``, timed alone beside it: the peer
figure, torch's cost that memra cannot avoid) and memra's checks of a torch argument (an
isinstance against torch.Tensor, then ``is_neg()``: python/src/args.cpp refuses a tensor whose
negative bit is set, which DLPack does not carry). ``torch_check_us_per_arg`` = (torch call -
numpy call - export) / 2 arguments: what those checks add to each torch argument.
Wall clock (time.perf_counter over N calls after one warm-up), microseconds a call, median of
--rounds rounds. One JSON line on stdout. The tensors live on the CPU whatever the machine:
--device is accepted for run_all.sh and changes nothing; --quick takes 2,000 calls a round.

    python3 benchmarks/bench_dlpack_args.py [--calls 20000] [--rounds 5]
"""

from __future__ import annotations

import os
import platform
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from common import base_parser, emit_record  # noqa: E402


def per_call_us(fn, calls: int, rounds: int) -> float:
    fn()
    samples = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        samples.append((time.perf_counter() - t0) / calls * 1e6)
    return statistics.median(samples)


def main() -> int:
    p = base_parser(__doc__.split("\n\n")[0])
    p.add_argument("--calls", type=int, default=None, help="calls a round (default 20000)")
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args()
    args.calls = args.calls or (2000 if args.quick else 20000)
    import numpy as np
    import torch

    from memra import _core

    x = np.random.default_rng(0).random((1, 64), dtype=np.float32)
    w = np.ones(64, np.float32)
    tx, tw = torch.from_numpy(x), torch.from_numpy(w)
    numpy_us = per_call_us(lambda: _core.rms_norm(x, w, eps=1e-6), args.calls, args.rounds)
    torch_us = per_call_us(lambda: _core.rms_norm(tx, tw, eps=1e-6), args.calls, args.rounds)
    export_us = per_call_us(lambda: (tx.__dlpack__(), tw.__dlpack__()), args.calls, args.rounds)
    same = np.array_equal(_core.rms_norm(x, w, eps=1e-6), _core.rms_norm(tx, tw, eps=1e-6))
    emit_record({
        "bench": "dlpack_args", "op": "rms_norm", "shape": {"x": [1, 64], "weight": [64]},
        "numpy_call_us": round(numpy_us, 3), "torch_call_us": round(torch_us, 3),
        "peer": "torch Tensor.__dlpack__ x 2 (export alone)", "peer_us": round(export_us, 3),
        "torch_check_us_per_arg": round((torch_us - numpy_us - export_us) / 2, 3),
        "same_values": bool(same), "torch": torch.__version__, "cpu": platform.processor() or platform.machine(),
        "calls": args.calls, "rounds": args.rounds,
    })
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
