#!/usr/bin/env python3
"""Accuracy of every family's fixture against transformers' own logits (one JSON line per
fixture, prompt and backend), the figures the tests assert, printed.

Fixtures: tests/fixtures/<name>_reference.npz (transformers 5.17 float32 logits `logits_f32_<p>`,
its bfloat16 logits `logits_bf16_<p>` and their error against the f32 ones `bf16_rel_err_<p>`,
greedy tokens `greedy_<p>`) beside the checkpoint folder tests/fixtures/tiny_<name> (or the
embedded glm5_next checkpoint). For each prompt: memra CPU f32 vs transformers f32; on CUDA, f32 vs
memra's CPU, and bf16 vs transformers f32 with the 2x rule's ratio (memra bf16 rel_err /
transformers bf16 rel_err, <= 2 passes); greedy tokens vs transformers'. rel_err = max|a - ref| /
max|ref| (DESIGN.md).

    python3 benchmarks/accuracy_families.py [--device cuda] [--families kimi_linear,qwen3_5_text,...]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
FIX = ROOT / "tests" / "fixtures"
FAMILIES = ["glm5_next_bf16", "kimi_linear", "qwen3_5_text", "qwen3_5", "qwen3_5_moe_text", "qwen3_5_moe",
            "qwen3_next"]


def rel_err(a, ref) -> float:
    a, ref = np.asarray(a, np.float64), np.asarray(ref, np.float64)
    return float(np.max(np.abs(a - ref)) / np.max(np.abs(ref)))


def folder(name: str) -> Path:
    return FIX / f"tiny_{name}"


def prompts(z) -> list[str]:
    return sorted({k.split("_")[-1] for k in z.files if k.startswith("logits_f32_") and "seq" not in k})


def ids_of(z, p: str):
    return z[f"prompt_{p}"] if f"prompt_{p}" in z.files else z[f"ids_{p}"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--families", default=",".join(FAMILIES))
    a = ap.parse_args()
    import memra

    for name in a.families.split(","):
        npz = FIX / f"{name}_reference.npz"
        if not npz.exists() or not folder(name).exists():
            print(json.dumps({"fixture": name, "skipped": "no fixture"}))
            continue
        z = np.load(npz)
        try:
            cpu = memra.load(folder(name), device="cpu", progress=False)
        except memra.MemraError as e:
            print(json.dumps({"fixture": name, "error": f"{type(e).__name__}: {e}"}))
            continue
        runs = {"cpu": cpu}
        if a.device == "cuda":
            for dt in ("float32", "bfloat16"):
                try:
                    runs[dt] = memra.load(folder(name), device="cuda", dtype=dt, progress=False)
                except memra.MemraError as e:
                    print(json.dumps({"fixture": name, "dtype": dt, "error": f"{type(e).__name__}: {e}"}))
        for p in prompts(z):
            ids = ids_of(z, p)
            ref = z[f"logits_f32_{p}"]
            out = {"fixture": name, "prompt": p, "T": int(len(ids))}
            lc = cpu.logits(ids)
            out["cpu_f32_vs_transformers_f32"] = rel_err(lc, ref)
            greedy = z[f"greedy_{p}"] if f"greedy_{p}" in z.files else None
            if greedy is not None:
                out["cpu_greedy_equal"] = cpu.generate(ids, len(greedy), ignore_eos=True) == greedy.tolist()
            if "float32" in runs:
                lg = runs["float32"].logits(ids)
                out["cuda_f32_vs_cpu"] = rel_err(lg, lc)
                if greedy is not None:
                    out["cuda_f32_greedy_equal"] = runs["float32"].generate(ids, len(greedy), ignore_eos=True) == greedy.tolist()
            if "bfloat16" in runs and f"bf16_rel_err_{p}" in z.files:
                lb = runs["bfloat16"].logits(ids)
                ours, theirs = rel_err(lb, ref), float(z[f"bf16_rel_err_{p}"])
                out.update({"cuda_bf16_vs_transformers_f32": ours, "transformers_bf16_vs_f32": theirs,
                            "bf16_ratio": ours / theirs if theirs else None,
                            "bf16_2x_rule": ours <= 2 * theirs})
            print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
