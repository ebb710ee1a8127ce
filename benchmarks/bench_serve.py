#!/usr/bin/env python3
"""``memra serve`` under a bounded loopback load, against ``generate_batch`` on the same work.

Model: the 8-layer bench checkpoint of benchmarks/bench_model_decode.py (GLM-5.3-Flash widths,
random bf16 weights; built by that script with --build-only when the folder is missing, which
needs torch and transformers). The folder has no tokenizer, so prompts are token-id lists.

Server: ``python -m memra serve FOLDER`` in a subprocess on 127.0.0.1 (a free port), --max-batch
= the largest client count, --max-len = prompt + new tokens. Load: for each client count C
(default 1, 8, 32, 64), C concurrent streamed completions (official openai client, AsyncOpenAI,
one process apart from the server), each a --prompt-len random-id prompt and --new-tokens new
tokens (greedy, ignore_eos, return_token_ids); --rounds rounds per C, the first a warm-up (CUDA
graph capture of the buckets), the figures of the last. Per C one JSON line:

- output_tok_s: tokens received / (last token's arrival - first request's send);
- ttft_ms_p50 / p99: from sending a request until its first token reaches the client;
- itl_ms_p50 / p99: between successive tokens of a request, at the client;
- mean_rows_per_step: requests per decode step (the server's memra_decode_batch_rows);
- generate_batch_tok_s: ``Model.generate_batch`` on the same C prompts and new tokens in this
  process (after the server is stopped; one warm-up call, the best of --rounds timed calls,
  prefill included as the server's figure includes it);
- server_vs_generate_batch: output_tok_s / generate_batch_tok_s; overhead = 1 - that (goal:
  under 0.10, issue 21).

    python3 benchmarks/bench_serve.py                         # GPU: bf16, the 8-layer folder
    python3 benchmarks/bench_serve.py --device cpu            # smoke test: toy widths, small load

--quick (run_all.sh passes its arguments to every bench) keeps the client counts 1 and 32 and 64
new tokens a request on CUDA; --device cpu means --tiny unless --folder names a checkpoint.
"""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))
from serve_helpers import metric  # noqa: E402


def log(*a) -> None:
    print(*a, file=sys.stderr, flush=True)


def percentile(xs: list[float], q: float) -> float | None:
    """The q-th percentile (0..100) by linear interpolation between order statistics."""
    if not xs:
        return None
    s = sorted(xs)
    k = (len(s) - 1) * q / 100
    lo = int(k)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ensure_folder(args) -> Path:
    """The bench checkpoint folder, built by bench_model_decode.py --build-only when missing."""
    experts = 8 if args.tiny else 32
    folder = Path(args.folder or f"/tmp/memra-bench-glm5next-{args.layers}L{experts}E" + ("-tiny" if args.tiny else ""))
    if not (folder / "config.json").exists():
        cmd = [sys.executable, str(HERE / "bench_model_decode.py"), "--build-only", "--folder", str(folder),
               "--layers", str(args.layers), "--device", args.device] + (["--tiny"] if args.tiny else [])
        log("serve: building the checkpoint:", " ".join(cmd))
        subprocess.run(cmd, check=True)
    return folder


class Server:
    """``python -m memra serve`` in a subprocess; stopped with SIGINT (then killed)."""

    def __init__(self, folder: Path, args, max_batch: int, max_len: int) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        cmd = [sys.executable, "-m", "memra", "serve", str(folder), "--port", str(self.port),
               "--device", args.device, "--max-batch", str(max_batch), "--max-len", str(max_len),
               "--max-waiting", str(4 * max_batch), "--served-model-name", "bench", "--log-level", "warning"]
        if args.dtype:
            cmd += ["--dtype", args.dtype]
        log("serve:", " ".join(cmd))
        self.proc = subprocess.Popen(cmd)
        deadline = time.monotonic() + args.start_timeout
        while True:
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise SystemExit(f"serve: the server did not come up (exit code {self.proc.returncode})")
            time.sleep(0.5)

    def metrics(self) -> str:
        with urllib.request.urlopen(self.url + "/metrics", timeout=10) as r:
            return r.read().decode()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(2)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


async def one_request(client, prompt: list[int], new: int) -> dict:
    sent = time.perf_counter()
    stamps: list[float] = []
    stream = await client.completions.create(model="bench", prompt=prompt, max_tokens=new, temperature=0,
                                             stream=True, extra_body={"ignore_eos": True, "return_token_ids": True})
    async for chunk in stream:
        now = time.perf_counter()
        stamps += [now] * len(chunk.choices[0].token_ids or []) if chunk.choices else []
    return {"sent": sent, "stamps": stamps}


async def load_round(url: str, prompts: list[list[int]], new: int, timeout: float) -> list[dict]:
    import openai

    client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=timeout)
    try:
        return await asyncio.wait_for(asyncio.gather(*(one_request(client, p, new) for p in prompts)), timeout)
    finally:
        await client.close()


def summarize(results: list[dict], new: int) -> dict:
    start = min(r["sent"] for r in results)
    end = max(r["stamps"][-1] for r in results if r["stamps"])
    tokens = sum(len(r["stamps"]) for r in results)
    ttft = [(r["stamps"][0] - r["sent"]) * 1e3 for r in results if r["stamps"]]
    itl = [(b - a) * 1e3 for r in results for a, b in zip(r["stamps"], r["stamps"][1:])]
    r3 = lambda x: None if x is None else round(x, 3)  # noqa: E731
    return {"tokens": tokens, "complete": all(len(r["stamps"]) == new for r in results),
            "output_tok_s": r3(tokens / (end - start)), "ttft_ms_p50": r3(percentile(ttft, 50)),
            "ttft_ms_p99": r3(percentile(ttft, 99)), "itl_ms_p50": r3(percentile(itl, 50)),
            "itl_ms_p99": r3(percentile(itl, 99))}


def run_generate_batch(folder: Path, args, prompts, clients: list[int], max_len: int) -> dict[int, float]:
    import memra

    m = memra.load(folder, device=args.device, dtype=args.dtype, max_batch=max(clients), max_len=max_len,
                   progress=False)
    out = {}
    for C in clients:
        m.generate_batch(prompts[:C], args.new_tokens, ignore_eos=True)  # warm-up (graph capture)
        best = None
        for _ in range(max(1, args.rounds - 1)):
            t0 = time.perf_counter()
            m.generate_batch(prompts[:C], args.new_tokens, ignore_eos=True)
            dt = time.perf_counter() - t0
            best = dt if best is None else min(best, dt)
        out[C] = C * args.new_tokens / best
        log(f"serve: generate_batch C={C}: {out[C]:.1f} tok/s")
    return out


def main() -> int:
    import argparse

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    p.add_argument("--dtype", default=None, choices=["float32", "bfloat16"], help="default: bf16 on CUDA, f32 on CPU")
    p.add_argument("--tiny", action="store_true",
                   help="toy widths (bench_model_decode's --tiny); implied by --device cpu without --folder")
    p.add_argument("--quick", action="store_true", help="CUDA: clients 1,32 and 64 new tokens (shorter run)")
    p.add_argument("--folder", default=None, help="bench checkpoint (default: bench_model_decode's path)")
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--clients", default=None, help="concurrent clients (default 1,8,32,64; cpu: 1,4)")
    p.add_argument("--prompt-len", type=int, default=None, help="prompt tokens (default 1024; cpu 64)")
    p.add_argument("--new-tokens", type=int, default=None, help="new tokens per request (default 128; cpu 16)")
    p.add_argument("--rounds", type=int, default=2, help="rounds per client count (the first warms up)")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds for one round")
    p.add_argument("--start-timeout", type=float, default=900.0, help="seconds for the server to come up")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    cpu = args.device == "cpu"
    args.tiny = args.tiny or (cpu and args.folder is None)
    default_clients = "1,4" if cpu else ("1,32" if args.quick else "1,8,32,64")
    clients = [int(c) for c in (args.clients or default_clients).split(",")]
    args.prompt_len = args.prompt_len or (64 if cpu else 1024)
    args.new_tokens = args.new_tokens or (16 if cpu else (64 if args.quick else 128))
    max_len = args.prompt_len + args.new_tokens
    folder = ensure_folder(args)

    import numpy as np

    from memra.config import read_config
    _, cfg = read_config(folder)
    rng = np.random.default_rng(args.seed + 1)
    hi = min(cfg.vocab_size - 1, 150000)  # clear of the special ids at the top of the vocabulary
    prompts = [rng.integers(0, hi, args.prompt_len).tolist() for _ in range(max(clients))]

    records = {}
    server = Server(folder, args, max(clients), max_len)
    try:
        for C in clients:
            for r in range(args.rounds):
                before = server.metrics()
                res = asyncio.run(load_round(server.url, prompts[:C], args.new_tokens, args.timeout))
                after = server.metrics()
                summ = summarize(res, args.new_tokens)
                steps = metric(after, "memra_decode_batch_rows_count") - metric(before, "memra_decode_batch_rows_count")
                rows = metric(after, "memra_decode_batch_rows_sum") - metric(before, "memra_decode_batch_rows_sum")
                summ["mean_rows_per_step"] = round(rows / steps, 2) if steps else None
                log(f"serve: C={C} round {r}: {summ}")
            records[C] = summ
    finally:
        server.stop()
    base = run_generate_batch(folder, args, prompts, clients, max_len)
    for C in clients:
        rec = records[C]
        ratio = rec["output_tok_s"] / base[C] if base.get(C) else None
        print(json.dumps({
            "bench": "serve",
            "shape": {"model": "glm5_next", "layers": cfg.num_hidden_layers, "hidden": cfg.hidden_size,
                      "vocab": cfg.vocab_size, "clients": C, "prompt_len": args.prompt_len,
                      "new_tokens": args.new_tokens, "device": args.device,
                      "dtype": args.dtype or ("float32" if cpu else "bfloat16")},
            **rec,
            "generate_batch_tok_s": round(base[C], 3),
            "server_vs_generate_batch": None if ratio is None else round(ratio, 4),
            "overhead": None if ratio is None else round(1 - ratio, 4),
            "meets_goal_overhead_lt_0.10": None if ratio is None else bool(1 - ratio < 0.10),
        }), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
