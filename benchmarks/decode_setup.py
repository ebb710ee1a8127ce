"""The whole-model decode benches' main() set-up (bench_model_decode, bench_kimi_decode,
bench_qwen_decode; bench_model_prefill and accuracy_bench_model make their checkpoint with it):
the shared arguments and what they come to (add_decode_args, parse_decode_args, DecodePlan), the
checkpoint made or reused (ensure_checkpoint), the prompts (random_prompts) and the record's run
fields (run_fields). What the runs themselves share is in decode_common.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from common import log
from decode_common import MARKER, folder_ready

def add_decode_args(p) -> None:
    """The arguments every whole-model decode bench takes (after its own: folders, geometry)."""
    p.add_argument("--tiny", action="store_true", help="toy widths (implied by --device cpu)")
    p.add_argument("--rebuild", action="store_true", help="build the checkpoint(s) again even if there")
    p.add_argument("--build-only", action="store_true", help="make the checkpoint folder(s) (if missing) and exit")
    p.add_argument("--batches", default=None, help="comma-separated batch sizes (default 1,32; cpu: 1,3)")
    p.add_argument("--prompt-len", type=int, default=None, help="prompt tokens per sequence (default 128; cpu 16)")
    p.add_argument("--peer-steps", type=int, default=None,
                   help="transformers' timed decode steps (default 16, --quick 8; cpu 3)")
    p.add_argument("--gen-steps", type=int, default=None,
                   help="memra generate-API timed steps (default 128, --quick: the bench's; cpu 3)")
    p.add_argument("--profile-steps", type=int, default=None,
                   help="decode steps profiled per kernel after the timing (default 5, --quick: the bench's; "
                        "0: none; CUDA only)")
    p.add_argument("--match-steps", type=int, default=8, help="greedy steps compared with transformers")
    p.add_argument("--skip-peer", action="store_true")
    p.add_argument("--kernel-options", default="",
                   help="memra.KernelOptions fields for memra's engine, FIELD=VALUE,... (e.g. pdl=0); "
                        "compare arms with ab_builds.py, not with separate runs")
    p.add_argument("--seed", type=int, default=0)
    p.epilog = ("--warmup / --reps set memra's warm-up decode steps (at least 3) and timed decode steps "
                "(defaults 10 / 100, --quick 3 / 20).")


@dataclass
class DecodePlan:
    """What a decode bench's arguments come to: the batch sizes and memra's warm-up / timed steps,
    transformers' timed steps and the generate API's (args.prompt_len, args.tiny and
    args.profile_steps are filled in on args itself)."""

    cpu: bool
    batches: list
    warmup: int
    steps: int
    peer_steps: int
    gen_steps: int


def parse_decode_args(p, tag: str, *, gen_quick: int, profile_quick: int):
    """Parse, make the Bench (common.py) and the plan: (args, bench, DecodePlan). On the CPU a
    smoke test (tiny widths, a few steps); --quick: gen_quick generate steps and profile_quick
    profiled ones."""
    from common import Bench

    args = p.parse_args()
    cpu = args.device == "cpu"
    args.tiny = args.tiny or cpu
    if cpu:  # smoke test: a few steps only
        args.warmup = 3 if args.warmup is None else args.warmup
        args.reps = 4 if args.reps is None else args.reps
    b = Bench(args, tag)
    batches = [int(x) for x in (args.batches or ("1,3" if cpu else "1,32")).split(",")]
    args.prompt_len = args.prompt_len or (16 if cpu else 128)
    if args.profile_steps is None:
        args.profile_steps = profile_quick if args.quick else 5
    peer_steps = args.peer_steps or (3 if cpu else (8 if args.quick else 16))
    gen_steps = args.gen_steps or (3 if cpu else (gen_quick if args.quick else 128))
    return args, b, DecodePlan(cpu, batches, max(3, b.warmup), b.reps, peer_steps, gen_steps)


def ensure_checkpoint(tag: str, folder: Path, args, marker: dict, build, what: str = "the checkpoint"):
    """The bench's checkpoint in `folder`: reused when its marker matches (and no --rebuild),
    else made by build() -> seconds (returned, rounded); a folder this script did not make is
    never overwritten (SystemExit)."""
    ready, why = folder_ready(folder, marker)
    if ready and not args.rebuild:
        log(f"{tag}: reusing {folder}")
        return None
    if folder.exists() and not (folder / MARKER).exists() and any(folder.iterdir()):
        raise SystemExit(f"{tag}: {folder} exists and was not made by this script; pass another folder")
    log(f"{tag}: building {what} in {folder} ({'--rebuild' if args.rebuild else why})")
    return round(build(), 2)


def random_prompts(seed: int, hi: int, prompt_len: int, n: int) -> list:
    """n prompts of prompt_len ids in [0, hi) (the same length: transformers needs no padding;
    hi keeps them clear of the special ids at the top of the vocabulary)."""
    import numpy as np

    rng = np.random.default_rng(seed + 1)
    return [rng.integers(0, hi, prompt_len).astype(np.int64).tolist() for _ in range(n)]


def run_fields(b, plan: DecodePlan, folder: Path, build_s, ctx: float, ckpt_bytes: int,
               ckpt_tensors: int) -> dict:
    """The record fields every decode bench writes after its shape and figures."""
    return {
        "checkpoint_text_bytes": ckpt_bytes,
        "checkpoint_text_tensors": ckpt_tensors,
        "context_for_cache_bytes": ctx,
        "device": b.device_name,
        "warmup_steps": plan.warmup,
        "steps": plan.steps,
        "peer_steps": plan.peer_steps,
        "gen_steps": plan.gen_steps,
        "memra_timer": "wall clock per step (each step ends with a host read of the tokens)",
        "folder": str(folder),
        "build_s": build_s,
    }
