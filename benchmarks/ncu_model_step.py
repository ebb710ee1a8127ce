"""Driver for ncu: one greedy decode step (B = 1, or B rows with --batch B) of the
bench_model_decode checkpoint (GLM-5.3-Flash widths, 8 layers, 32 experts; build it first with
bench_model_decode.py --quick), bracketed by cudaProfilerStart/Stop so that `ncu
--profile-from-start off` sees exactly the step's kernels, each run alone (no programmatic
overlap): the per-kernel time and DRAM bytes behind the step profile.

    ncu --profile-from-start off --clock-control none --csv --print-units base \
        --metrics gpu__time_duration.sum,dram__bytes_read.sum,launch__grid_size,launch__block_size \
        python3 benchmarks/ncu_model_step.py [folder] [--batch B]
"""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import step_driver_setup  # noqa: E402

m, slots, toks, seeds = step_driver_setup(sys.argv[1:], max_len=192)
torch.cuda.profiler.start()
toks = m._decode_sampled(slots, toks, 0.0, None, None, seeds, 99)
m.engine.synchronize()
torch.cuda.profiler.stop()
print("done", toks[:4])
