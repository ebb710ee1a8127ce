"""Driver for ncu: one greedy decode step (B = 1, or B rows with --batch B) of the bench_model_decode checkpoint (GLM-5.3-Flash
widths, 8 layers, 32 experts; build it first with bench_model_decode.py --quick), bracketed by
cudaProfilerStart/Stop so that `ncu --profile-from-start off` sees exactly the step's kernels, each
run alone (no programmatic overlap): the per-kernel time and DRAM bytes behind the step profile.

    ncu --profile-from-start off --clock-control none --csv --print-units base \
        --metrics gpu__time_duration.sum,dram__bytes_read.sum,launch__grid_size,launch__block_size \
        python3 benchmarks/ncu_model_step.py [folder] [--batch B]
"""
import sys

import numpy as np
import torch

import memra

args = [a for a in sys.argv[1:]]
B = 1
if "--batch" in args:
    i = args.index("--batch")
    B = int(args[i + 1])
    del args[i:i + 2]
folder = args[0] if args else "/tmp/memra-bench-glm5next-8L32E"
m = memra.load(folder, device="cuda", dtype="bfloat16", max_batch=B, max_len=192, progress=False)
rng = np.random.default_rng(0)
slots = list(range(B))
toks = []
for s in slots:  # a 128-token prompt a row, as bench_model_decode's rows
    prompt = rng.integers(0, 1000, 128).astype(np.int64).tolist()
    toks.append(int(np.argmax(m.prefill(m.cache, s, prompt))))
seeds = list(range(B))
for i in range(4):  # eager, capture, replays: the profiled step is a graph replay
    toks = m._decode_sampled(slots, toks, 0.0, None, None, seeds, i + 1)
m.engine.synchronize()
torch.cuda.profiler.start()
toks = m._decode_sampled(slots, toks, 0.0, None, None, seeds, 99)
m.engine.synchronize()
torch.cuda.profiler.stop()
print("done", toks[:4])
