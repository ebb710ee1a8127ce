"""A/B of decode knobs on the graph replay (B = 1 by default), arms interleaved in one process.

Replays of one build move ~1 % between machines and runs, which is as large as most single
changes; separate bench_model_decode runs per arm cannot tell them apart. Here every arm is its
own memra.load of the same checkpoint, loaded and captured with the arm's MEMRA_* knobs set
(some are read when an Engine's CUDA context is created, others when a step is enqueued), all
side by side, and the rounds alternate between them in a shuffled order, so drift (clocks,
temperature, other tenants) hits every arm alike.

    PYTHONPATH=build/dev-gpu/site python3 benchmarks/ab_model_replay.py \\
        new old:MEMRA_GEMV_P1=0,MEMRA_KDA_SLOTS=0 [--rounds 12] [--steps 40]

An arm is NAME or NAME:VAR=VALUE,VAR=VALUE (the first arm is the reference). Needs the
bench_model_decode checkpoint (its --quick run builds it). Prints one JSON line per arm: median
and min over rounds of the per-step replay time (µs), the difference of medians from the first
arm, and the greedy tokens' agreement with the first arm (knobs must not change the bytes).
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


def parse_arm(s: str) -> tuple[str, dict]:
    name, _, rest = s.partition(":")
    env = dict(kv.split("=", 1) for kv in rest.split(",") if kv)
    return name, env


def load_arm(folder: str, env: dict, max_len: int, prompt: list, batch: int):
    """memra.load, prefill of `batch` sequences and the first decode steps (eager, capture,
    replays) with the arm's environment set: knobs read at context creation and knobs read when
    a step is enqueued (captured into the graph) both take effect. Returns the model, its greedy
    tokens (every row's, step by step) and the captured graph of the batch's bucket."""
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        m = memra.load(folder, device="cuda", dtype="bfloat16", max_batch=batch, max_len=max_len,
                       progress=False)
        slots = list(range(batch))
        last = [int(np.argmax(m.prefill(m.cache, s, prompt))) for s in slots]
        toks = [list(last)]
        for i in range(4):  # eager, capture, then replays
            last = [int(t) for t in m._decode_sampled(slots, last, 0.0, None, None, [0] * batch, i + 1)]
            toks.append(list(last))
        bucket = m._runner._buckets[m._runner.bucket_size(batch)]
        graph = next(g for s, g in bucket.graphs.items() if s is not None)
        return m, toks, graph
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("arms", nargs="+")
    p.add_argument("--folder", default="/tmp/memra-bench-glm5next-8L32E")
    p.add_argument("--rounds", type=int, default=12)
    p.add_argument("--steps", type=int, default=40, help="replays timed per arm and round")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--batch", type=int, default=1, help="sequences a step (the graph's bucket)")
    a = p.parse_args()
    arms = [parse_arm(s) for s in a.arms]
    max_len = 128 + 8 + a.rounds * (a.steps + 1) + 8
    rng = np.random.default_rng(a.seed)
    prompt = rng.integers(0, 1000, 128).astype(np.int64).tolist()
    runs = []
    for name, env in arms:
        t = time.perf_counter()
        m, toks, graph = load_arm(a.folder, env, max_len, prompt, a.batch)
        print(f"ab: loaded {name} {env} in {time.perf_counter() - t:.1f} s", file=sys.stderr, flush=True)
        runs.append({"name": name, "env": env, "m": m, "graph": graph, "toks": toks, "us": []})
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
        print(json.dumps({"bench": "ab_model_replay", "arm": run["name"], "env": run["env"],
                          "batch": a.batch,
                          "replay_us_median": round(med, 1), "replay_us_min": round(min(run["us"]), 1),
                          "delta_us_vs_first": round(med - ref, 1), "rounds": a.rounds,
                          "steps_per_round": a.steps,
                          "tokens_equal_first": run["toks"] == runs[0]["toks"]}), flush=True)


if __name__ == "__main__":
    main()
