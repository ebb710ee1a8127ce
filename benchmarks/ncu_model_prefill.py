"""Driver for ncu: one bf16 prefill of T tokens (default 8192) on the bench_model_decode checkpoint
(GLM-5.3-Flash widths, 8 layers, 32 experts; bench_model_prefill.py or bench_model_decode.py
builds it), bracketed by cudaProfilerStart/Stop after a warm-up prefill, with programmatic
dependent launch off (KernelOptions.pdl = False) so that each kernel's time is its own and not a
wait on the one before. What bounds each prefill kernel (issue 20):

    ncu --profile-from-start off --clock-control none -k regex:"tc|chunk|nvjet|gemm" -c 60 \\
        --section SpeedOfLight --section Occupancy python3 benchmarks/ncu_model_prefill.py
"""
import argparse

import numpy as np
import torch

import memra

p = argparse.ArgumentParser()
p.add_argument("--folder", default="/tmp/memra-bench-glm5next-8L32E")
p.add_argument("--T", type=int, default=8192)
args = p.parse_args()
m = memra.load(args.folder, device="cuda", dtype="bfloat16", max_batch=2, max_len=args.T + 8,
               progress=False, kernel_options=memra.KernelOptions(pdl=False))
rng = np.random.default_rng(0)
warm = rng.integers(0, 1000, 1024).astype(np.int64).tolist()
prompt = rng.integers(0, 1000, args.T).astype(np.int64).tolist()
m.prefill(m.cache, 1, warm)
m.engine.synchronize()
torch.cuda.profiler.start()
logits = m.prefill(m.cache, 0, prompt)
m.engine.synchronize()
torch.cuda.profiler.stop()
print("done", int(np.argmax(logits)))
