"""Driver for ncu: one greedy B = 1 decode step of the bench_model_decode checkpoint (GLM-5.3-Flash
widths, 8 layers, 32 experts; build it first with bench_model_decode.py --quick), bracketed by
cudaProfilerStart/Stop so that `ncu --profile-from-start off` sees exactly the step's kernels, each
run alone (no programmatic overlap): the per-kernel time and DRAM bytes behind the step profile.

    ncu --profile-from-start off --clock-control none --csv --print-units base \
        --metrics gpu__time_duration.sum,dram__bytes_read.sum,launch__grid_size,launch__block_size \
        python3 benchmarks/ncu_model_step.py [folder]
"""
import sys

import numpy as np
import torch

import memra

folder = sys.argv[1] if len(sys.argv) > 1 else "/tmp/memra-bench-glm5next-8L32E"
m = memra.load(folder, device="cuda", dtype="bfloat16", max_batch=1, max_len=192, progress=False)
rng = np.random.default_rng(0)
prompt = rng.integers(0, 1000, 128).astype(np.int64).tolist()
tok = int(np.argmax(m.prefill(m.cache, 0, prompt)))
seeds = [0]
for i in range(4):  # eager, capture, replays: the profiled step is a graph replay
    tok = int(np.asarray(m._decode_sampled([0], [tok], 0.0, None, None, seeds, i + 1))[0])
m.engine.synchronize()
torch.cuda.profiler.start()
tok = int(np.asarray(m._decode_sampled([0], [tok], 0.0, None, None, seeds, 99))[0])
m.engine.synchronize()
torch.cuda.profiler.stop()
print("done", tok)
