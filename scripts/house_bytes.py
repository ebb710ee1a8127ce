#!/usr/bin/env python3
"""Snapshot of a build's output bytes, for refactors that must change no number (issue 17).

For each checkpoint folder: the full-prefill logits of a fixed prompt (``Model.logits``), then a
prefill of the same prompt into slot 0 of the model's own cache and 8 greedy decode steps through
``Model.decode`` (on CUDA: the captured decode graphs), every step's logits kept, and the greedy
tokens of ``generate``. Written to one .npz per run; ``--compare A B`` prints one JSON line per
array saying whether the two snapshots are ``np.array_equal`` (bit for bit: NaN-free arrays of the
same dtype and shape).

    python3 scripts/house_bytes.py --out snap.npz [--device cuda] [--dtype bfloat16] FOLDER...
    python3 scripts/house_bytes.py --compare old.npz new.npz
"""

from __future__ import annotations

import argparse
import json
import sys

import numpy as np


def snapshot(folders: list[str], device: str, dtype: str | None, prompt_len: int, steps: int) -> dict:
    import memra

    out: dict[str, np.ndarray] = {}
    for n, folder in enumerate(folders):
        model = memra.load(folder, device=device, dtype=dtype, max_batch=2, max_len=prompt_len + steps + 8,
                           progress=False)
        vocab = model.config.vocab_size
        ids = np.random.default_rng(1234 + n).integers(0, vocab, size=prompt_len).astype(np.int32)
        key = f"m{n}"
        out[f"{key}.logits"] = model.logits(ids)
        cache = model.cache
        cache.free(0)
        last = model.prefill(cache, 0, ids)
        rows = [last]
        tok = int(np.argmax(last))
        for _ in range(steps):
            row = model.decode(cache, [0], [tok])[0]
            rows.append(row)
            tok = int(np.argmax(row))
        cache.free(0)
        out[f"{key}.steps"] = np.stack(rows)
        out[f"{key}.generate"] = np.array(model.generate(ids, steps, ignore_eos=True), np.int32)
        del model
    return out


def compare(a_path: str, b_path: str) -> bool:
    a, b = np.load(a_path), np.load(b_path)
    ok = sorted(a.files) == sorted(b.files)
    for k in sorted(set(a.files) | set(b.files)):
        same = k in a.files and k in b.files and a[k].dtype == b[k].dtype and np.array_equal(a[k], b[k])
        diff = None
        if not same and k in a.files and k in b.files and a[k].shape == b[k].shape:
            diff = float(np.max(np.abs(a[k].astype(np.float64) - b[k].astype(np.float64))))
        print(json.dumps({"array": k, "array_equal": bool(same), "max_abs_diff": diff,
                          "a": a_path, "b": b_path}))
        ok = ok and same
    return ok


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("folders", nargs="*")
    p.add_argument("--out")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default=None)
    p.add_argument("--prompt-len", type=int, default=24)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--compare", nargs=2, metavar=("A", "B"))
    args = p.parse_args()
    if args.compare:
        return 0 if compare(*args.compare) else 1
    if not args.out or not args.folders:
        p.error("--out and at least one folder are needed (or --compare A B)")
    np.savez(args.out, **snapshot(args.folders, args.device, args.dtype, args.prompt_len, args.steps))
    return 0


if __name__ == "__main__":
    sys.exit(main())
