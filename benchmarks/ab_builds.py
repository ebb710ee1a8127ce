#!/usr/bin/env python3
"""Interleaved A/B of two memra BUILDS on whole-model decode (issue 17: "no slowdown").

Separate benchmark runs of one build drift by about 1 % between runs on one machine, as much as
the bound being checked; so each build runs in a worker process of its own (PYTHONPATH = that
build's package folder), both load the same checkpoint once and stay resident, and the rounds
alternate between them (A B, B A, ...), so drift hits both builds alike.

A round times the public generate API (pipelined decode through the CUDA graphs): at B = 1
``generate(prompt, n + 1) - generate(prompt, 1)`` and at B > 1 the same with ``generate_batch``
over B prompts, ignore_eos, as bench_model_decode.py's generate figure. Prints one JSON line per
(build, B) with the median and min tok/s over rounds and the ratio of medians to the first build,
and whether both builds drew the same greedy tokens.

    python3 benchmarks/ab_builds.py --build old=/path/old/site --build new=/path/new/site \\
        [--folder /tmp/memra-bench-glm5next-8L32E] [--batches 1,32] [--rounds 6] [--steps 64] \\
        [--build-folder]

--build-folder: first build bench_model_decode.py's checkpoint (its defaults: 8 layers, 32
experts, seed 0) into --folder when it is not there yet (its code, on the device; needs torch and
transformers in this process), then free the device before the workers start.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import numpy as np


def worker(folder: str, batches: list[int], prompt_len: int, steps: int, seed: int) -> None:
    import memra

    m = memra.load(folder, device="cuda", dtype="bfloat16", max_batch=max(batches),
                   max_len=prompt_len + steps + 8, progress=False)
    rng = np.random.default_rng(seed)
    hi = min(m.config.vocab_size - 1, 150000)
    prompts = [rng.integers(0, hi, prompt_len).astype(np.int64).tolist() for _ in range(max(batches))]

    def gen(B: int, n: int):
        if B == 1:
            return [m.generate(prompts[0], n, ignore_eos=True)]
        return m.generate_batch(prompts[:B], n, ignore_eos=True)

    for B in batches:  # warm-up: graph capture of every bucket
        gen(B, 4)
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        B = json.loads(line)["B"]
        t0 = time.perf_counter()
        gen(B, 1)
        t1 = time.perf_counter()
        toks = gen(B, steps + 1)
        t2 = time.perf_counter()
        dt = (t2 - t1) - (t1 - t0)
        print(json.dumps({"B": B, "tok_s": B * steps / dt, "tokens": toks[0][:16]}), flush=True)


def build_folder(folder: str) -> None:
    """bench_model_decode.py's checkpoint into `folder` unless its marker is there already."""
    from pathlib import Path

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import torch

    import bench_model_decode as bmd

    args = argparse.Namespace(tiny=False, layers=8, experts=None, seed=0)
    tc = bmd.text_config(args)
    ready, why = bmd.folder_ready(Path(folder), bmd.marker_of(args, tc))
    print(f"ab_builds: folder {folder}: {why}", file=sys.stderr, flush=True)
    if not ready:
        bmd.build_checkpoint(Path(folder), args, tc, torch.device("cuda"), torch)
        torch.cuda.empty_cache()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--build", action="append", required=True, help="NAME=SITE_DIR (the first is the reference)")
    p.add_argument("--folder", default="/tmp/memra-bench-glm5next-8L32E")
    p.add_argument("--batches", default="1,32")
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--steps", type=int, default=64)
    p.add_argument("--prompt-len", type=int, default=128)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--build-folder", action="store_true",
                   help="build bench_model_decode.py's checkpoint into --folder when it is missing")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    a = p.parse_args()
    batches = [int(b) for b in a.batches.split(",")]
    if a.worker:
        worker(a.folder, batches, a.prompt_len, a.steps, a.seed)
        return 0
    if a.build_folder:
        build_folder(a.folder)
    builds = [tuple(b.split("=", 1)) for b in a.build]
    procs = {}
    for name, site in builds:
        env = dict(os.environ, PYTHONPATH=site, PYTHONUNBUFFERED="1")
        cmd = [sys.executable, os.path.abspath(__file__), "--worker", "--build", a.build[0], "--folder", a.folder,
               "--batches", a.batches, "--steps", str(a.steps), "--prompt-len", str(a.prompt_len),
               "--seed", str(a.seed)]
        procs[name] = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
    for name, proc in procs.items():
        ready = json.loads(proc.stdout.readline())
        assert ready.get("ready"), f"{name}: worker failed to start"
    res: dict = {(n, B): [] for n, _ in builds for B in batches}
    toks: dict = {}
    order = [n for n, _ in builds]
    for r in range(a.rounds):
        for B in batches:
            for name in (order if r % 2 == 0 else order[::-1]):
                proc = procs[name]
                proc.stdin.write(json.dumps({"B": B}) + "\n")
                proc.stdin.flush()
                out = json.loads(proc.stdout.readline())
                res[(name, B)].append(out["tok_s"])
                toks.setdefault((name, B), out["tokens"])
    for proc in procs.values():
        proc.stdin.close()
        proc.wait()
    ref = order[0]
    for B in batches:
        base = statistics.median(res[(ref, B)])
        for name in order:
            med = statistics.median(res[(name, B)])
            print(json.dumps({"bench": "ab_builds", "build": name, "B": B, "rounds": a.rounds, "steps": a.steps,
                              "median_tok_s": round(med, 2), "min_tok_s": round(min(res[(name, B)]), 2),
                              "max_tok_s": round(max(res[(name, B)]), 2),
                              "ratio_to_" + ref: round(med / base, 4),
                              "same_tokens_as_" + ref: toks[(name, B)] == toks[(ref, B)],
                              "all_tok_s": [round(x, 2) for x in res[(name, B)]], "folder": a.folder}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
