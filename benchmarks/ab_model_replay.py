"""A/B of kernel options on the decode graph replay (B = 1 by default), arms interleaved in one
process.

Replays of one build move ~1 % between machines and runs, which is as large as most single
changes; separate bench_model_decode runs per arm cannot tell them apart. Here every arm is its
own memra.load of the same checkpoint with the arm's memra.KernelOptions (its engine is made
with them), all side by side, and the rounds alternate between them in a shuffled order, so
drift (clocks, temperature, other tenants) hits every arm alike. Two builds are compared by
running this once per build on one machine, alternating.

    PYTHONPATH=build/dev-gpu/site python3 benchmarks/ab_model_replay.py \\
        new nopdl:pdl=0 rows1:gemv_rows=1,gemv_tall_rows=1 [--rounds 12] [--steps 40]

An arm is NAME or NAME:FIELD=VALUE,FIELD=VALUE with KernelOptions fields (switches take 0 / 1 /
true / false; the first arm is the reference). Needs the bench_model_decode checkpoint (its
--quick run builds it). Prints one JSON line per arm: median and min over rounds of the per-step
replay time (µs), the difference of medians from the first arm, and the greedy tokens'
agreement with the first arm (options documented as speed only must not change the bytes).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time

import numpy as np

import memra

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import kernel_option_fields  # noqa: E402


def parse_arm(s: str) -> tuple[str, dict]:
    """NAME[:FIELD=VALUE,...] -> (NAME, {field: typed value}), checked before any load."""
    name, _, rest = s.partition(":")
    return name, kernel_option_fields(rest)


def load_arm(folder: str, fields: dict, max_len: int, prompts: list, batch: int):
    """memra.load with the arm's kernel options, prefill of `batch` sequences and the first
    decode steps (eager, capture, replays). Returns the model, its greedy tokens (every row's,
    step by step) and the captured graph of the batch's bucket."""
    m = memra.load(folder, device="cuda", dtype="bfloat16", max_batch=batch, max_len=max_len,
                   progress=False, kernel_options=memra.KernelOptions(**fields))
    slots = list(range(batch))
    last = [int(np.argmax(m.prefill(m.cache, s, prompts[s]))) for s in slots]
    toks = [list(last)]
    for i in range(4):  # eager, capture, then replays
        last = [int(t) for t in m._decode_sampled(slots, last, 0.0, None, None, [0] * batch, i + 1)]
        toks.append(list(last))
    bucket = m._runner._buckets[m._runner.bucket_size(batch)]
    graph = next(g for s, g in bucket.graphs.items() if s is not None)
    return m, toks, graph


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("arms", nargs="+")
    p.add_argument("--folder", default="/tmp/memra-bench-glm5next-8L32E")
    p.add_argument("--rounds", type=int, default=12)
    p.add_argument("--steps", type=int, default=40, help="replays timed per arm and round")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--batch", type=int, default=1, help="sequences a step (the graph's bucket)")
    p.add_argument("--prompt-len", type=int, default=128, help="tokens each sequence holds before the steps")
    a = p.parse_args()
    arms = [parse_arm(s) for s in a.arms]
    max_len = a.prompt_len + 8 + a.rounds * (a.steps + 1) + 8
    rng = np.random.default_rng(a.seed)
    # One prompt a sequence: with one prompt for all, every row routes alike and the MoE reads
    # top_k experts a layer instead of (nearly) all of them.
    prompts = [rng.integers(0, 1000, a.prompt_len).astype(np.int64).tolist() for _ in range(a.batch)]
    runs = []
    for name, fields in arms:
        t = time.perf_counter()
        m, toks, graph = load_arm(a.folder, fields, max_len, prompts, a.batch)
        print(f"ab: loaded {name} {fields} in {time.perf_counter() - t:.1f} s", file=sys.stderr, flush=True)
        runs.append({"name": name, "options": fields, "m": m, "graph": graph, "toks": toks, "us": []})
    order = random.Random(a.seed)
    for r in range(a.rounds):
        idx = list(range(len(runs)))
        order.shuffle(idx)
        for i in idx:
            run = runs[i]
            e = run["m"].engine
            run["graph"].replay()  # its first replay after another arm's pays the switch
            e.synchronize()
            t = time.perf_counter()
            for _ in range(a.steps):
                run["graph"].replay()
            e.synchronize()
            run["us"].append((time.perf_counter() - t) / a.steps * 1e6)
    ref = statistics.median(runs[0]["us"])
    for run in runs:
        med = statistics.median(run["us"])
        print(json.dumps({"bench": "ab_model_replay", "arm": run["name"], "options": run["options"],
                          "batch": a.batch, "prompt_len": a.prompt_len,
                          "replay_us_median": round(med, 1), "replay_us_min": round(min(run["us"]), 1),
                          "delta_us_vs_first": round(med - ref, 1), "rounds": a.rounds,
                          "steps_per_round": a.steps,
                          "tokens_equal_first": run["toks"] == runs[0]["toks"]}), flush=True)


if __name__ == "__main__":
    main()
