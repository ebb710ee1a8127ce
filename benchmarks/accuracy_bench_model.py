#!/usr/bin/env python3
"""bf16 accuracy of memra's whole-model prefill on the bench model, by the 2x rule (issue 20:
"Exactness kept"): memra bf16's error against the float32 truth at most twice transformers' bf16
error against the same truth, at T = 1K and 8K.

Checkpoint: the folder bench_model_decode.py builds (glm5_next at GLM-5.3-Flash widths, 8 layers,
32 experts, random bf16 weights; built by its code when missing, same marker, so one folder serves
the benches). Prompts: T random ids (numpy seed --seed + 3, ids below 150000), one per T.

truth:  transformers 5.17 Glm5NextForConditionalGeneration.from_pretrained(folder, dtype=float32,
        attn_implementation="eager") forward(use_cache=False) over the whole prompt, on the device,
        WITHOUT fla (the script refuses to run when fla is importable: fla's float32 KDA kernels
        run in TF32 and are no truth; transformers then runs its own torch chunk form, recorded as
        peer_kernels) and with TF32 off (torch.backends.cuda.matmul / cudnn allow_tf32 = False,
        float32 matmul precision "highest", checked before each forward).
rows:   per T one JSON line per candidate, its logits [T, vocab] against the truth's:
        rel_err = max|x - truth| / max|truth| over all T rows, rel_err_last_row over the last row,
        argmax_last_equal (the last row's argmax against the truth's):
        - transformers_bf16: the truth model .to(bfloat16) (every tensor bf16, as the test
          fixtures' yardstick, tests/fixtures/make_glm5_next_bf16_fixtures.py): the yardstick;
        - transformers_bf16keep: from_pretrained(dtype=bfloat16) (A_log, dt_bias, conv taps and
          e_score_correction_bias kept in f32, as memra's bf16 path does); --skip-bf16-keep;
        - memra_bf16: memra.load(folder, device="cuda", dtype="bfloat16").logits(ids), with
          ratio = rel_err / the yardstick's, ratio_last_row likewise, pass_2x = ratio <= 2 (and
          the ratios to transformers_bf16keep);
        - memra_f32: dtype="float32" (the CUDA-core / sequential arms); --skip-memra-f32.
arms:   one more memra bf16 call at the smallest T under torch.profiler: which tensor-core kernels
        ran (tests/test_cuda_tc_arms.py's names: routed experts, KDA chunks, MLA prefill attention,
        indexer scorer) and whether any of the CUDA-core kernels they replace did
        (record "arms").
memory: f32 eager attention at 8K holds 64 x 8K x 8K f32 scores (17 GB) and transformers' torch
        KDA chunk form a [heads, chunks, 64, 64, 128] f32 decay tensor (17 GB) per layer; the
        truth stays on the device (5 GB at 8K), each model is freed before the next loads.

    python3 benchmarks/accuracy_bench_model.py [--lengths 1024,8192] [--skip-memra-f32]
    python3 benchmarks/accuracy_bench_model.py --device cpu      # smoke test: tiny widths, CPU
"""

from __future__ import annotations

import gc
import importlib.util
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests"))
import bench_model_decode as bmd  # noqa: E402
from common import Bench, base_parser, emit_record, kernel_durations, log  # noqa: E402

TRUTH = "transformers float32, eager attention, no fla, TF32 off"


def rel_errs(torch, x, truth) -> tuple[float, float, dict]:
    """(max|x - truth| / max|truth| over all rows, the same over the last row, where the error
    sits: per row max|x - truth| / max|truth|, its median, how many rows exceed 1e-4 and 1e-2 and
    the first and worst row), in row blocks (no second [T, V] temporary). A decision that flips
    (an expert or a DSA pool on a near tie) moves a few rows by a lot and leaves the rest; an
    arithmetic error moves every row a little."""
    den = float(truth.abs().max())
    rows = []
    for a in range(0, truth.shape[0], 1024):
        rows.append((x[a:a + 1024].float() - truth[a:a + 1024]).abs().amax(dim=1) / den)
    rows = torch.cat(rows).double().cpu()
    last = float((x[-1].float() - truth[-1]).abs().max()) / float(truth[-1].abs().max())
    over = (rows > 1e-4).nonzero().flatten()
    where = {"row_err_median": float(rows.median()), "rows_over_1e-4": int(over.numel()),
             "rows_over_1e-2": int((rows > 1e-2).sum()), "worst_row": int(rows.argmax()),
             "first_row_over_1e-4": int(over[0]) if over.numel() else None}
    return float(rows.max()), last, where


def check_exact_f32(torch, b: Bench) -> None:
    if b.cuda:
        assert not torch.backends.cuda.matmul.allow_tf32 and not torch.backends.cudnn.allow_tf32, "TF32 is on"
        assert torch.get_float32_matmul_precision() == "highest"


def free(b: Bench) -> None:
    """After the caller dropped its references: collect, give torch's cached blocks back."""
    gc.collect()
    if b.cuda:
        b.torch.cuda.synchronize()
        b.torch.cuda.empty_cache()


def tf_logits(torch, model, ids, dev):
    with torch.no_grad():
        out = model(input_ids=torch.tensor([ids], dtype=torch.long, device=dev), use_cache=False)
    return out.logits[0]


def arms_of(names: str) -> dict:
    from test_cuda_tc_arms import CUDA_CORE, TENSOR_CORE, ran

    return {"tensor_core_ran": {op: all(ran(k, names) for k in ks) for op, ks in TENSOR_CORE.items()},
            "cuda_core_ran": {op: any(ran(k, names) for k in ks) for op, ks in CUDA_CORE.items()}}


def main() -> int:
    p = base_parser(__doc__.split("\n\n")[0])
    p.add_argument("--tiny", action="store_true", help="toy widths (implied by --device cpu)")
    p.add_argument("--folder", default=None, help="checkpoint folder (default: bench_model_decode.py's)")
    p.add_argument("--rebuild", action="store_true")
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--experts", type=int, default=None, help="routed experts (default 32; --tiny: 8)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--lengths", default=None, help="prompt lengths (default 1024,8192; cpu 16,48)")
    p.add_argument("--skip-bf16-keep", action="store_true")
    p.add_argument("--skip-memra-f32", action="store_true")
    p.add_argument("--no-profile", action="store_true")
    args = p.parse_args()
    cpu = args.device == "cpu"
    args.tiny = args.tiny or cpu
    if args.copy_gib is None:
        args.copy_gib = 0.25  # Bench's bandwidth yardstick: not used here
    if importlib.util.find_spec("fla") is not None:
        raise SystemExit("accuracy_bench_model: fla is importable; the float32 truth must not use it "
                         "(its KDA kernels run in TF32): run without fla on PYTHONPATH")
    b = Bench(args, "accuracy_bench_model")
    torch, dev = b.torch, b.dev
    lengths = [int(x) for x in (args.lengths or ("16,48" if cpu else "1024,8192")).split(",")]

    tc = bmd.text_config(args)
    folder = Path(args.folder or f"/tmp/memra-bench-glm5next-{args.layers}L{tc['n_routed_experts']}E"
                  + ("-tiny" if args.tiny else ""))
    ready, why = bmd.folder_ready(folder, bmd.marker_of(args, tc))
    build_s = None
    if args.rebuild or not ready:
        if folder.exists() and not (folder / bmd.MARKER).exists() and any(folder.iterdir()):
            raise SystemExit(f"accuracy_bench_model: {folder} exists and was not made by the benches")
        log(f"accuracy_bench_model: building the checkpoint in {folder} ({'--rebuild' if args.rebuild else why})")
        build_s = round(bmd.build_checkpoint(folder, args, tc, dev, torch), 2)

    import numpy as np

    import memra
    import transformers
    from transformers import Glm5NextForConditionalGeneration
    from transformers.models.glm5_next import modeling_glm5_next as mod

    from memra.config import read_config
    _, cfg = read_config(folder)
    rng = np.random.default_rng(args.seed + 3)
    hi = min(cfg.vocab_size - 1, 150000)
    prompts = {T: rng.integers(0, hi, T).tolist() for T in lengths}
    kinds = bmd.peer_kernels(mod)
    if any(v not in ("torch fallback (transformers)", "unknown") for v in kinds.values()):
        raise SystemExit(f"accuracy_bench_model: transformers resolved kernels outside itself: {kinds}")
    common = {"bench": "accuracy_bench_model", "model": "glm5_next", "layers": cfg.num_hidden_layers,
              "experts": cfg.n_routed_experts, "hidden": cfg.hidden_size, "vocab": cfg.vocab_size,
              "truth": TRUTH, "transformers": transformers.__version__, "peer_kernels": kinds,
              "device": b.device_name, "folder": str(folder), "build_s": build_s}
    kw = {"device_map": str(dev)} if b.cuda and importlib.util.find_spec("accelerate") else {}
    times = {}

    # -- the truth, then the same model in bf16 (the yardstick) --
    t0 = time.perf_counter()
    model = Glm5NextForConditionalGeneration.from_pretrained(
        folder, dtype=torch.float32, attn_implementation="eager", **kw).to(dev).eval()
    times["truth_load_s"] = round(time.perf_counter() - t0, 1)
    truth = {}
    for T in lengths:
        check_exact_f32(torch, b)
        t0 = time.perf_counter()
        truth[T] = tf_logits(torch, model, prompts[T], dev).float()
        b.sync()
        times[f"truth_T{T}_s"] = round(time.perf_counter() - t0, 2)
        log(f"accuracy_bench_model: truth T={T} in {times[f'truth_T{T}_s']} s, max|logit| "
            f"{float(truth[T].abs().max()):.3f}")
    errs: dict = {T: {} for T in lengths}
    model = model.to(torch.bfloat16)
    for T in lengths:
        x = tf_logits(torch, model, prompts[T], dev)
        e_, l_, w_ = rel_errs(torch, x, truth[T])
        errs[T]["transformers_bf16"] = (e_, l_, int(x[-1].float().argmax()), w_)
        del x
    model = None
    free(b)
    if not args.skip_bf16_keep:
        t0 = time.perf_counter()
        model = Glm5NextForConditionalGeneration.from_pretrained(
            folder, dtype=torch.bfloat16, attn_implementation="eager", **kw).to(dev).eval()
        times["bf16keep_load_s"] = round(time.perf_counter() - t0, 1)
        for T in lengths:
            x = tf_logits(torch, model, prompts[T], dev)
            e_, l_, w_ = rel_errs(torch, x, truth[T])
            errs[T]["transformers_bf16keep"] = (e_, l_, int(x[-1].float().argmax()), w_)
            del x
        model = None
        free(b)

    # -- memra --
    arms = None
    for dtype in (["bfloat16"] if b.cuda else []) + ([] if args.skip_memra_f32 else ["float32"]):
        t0 = time.perf_counter()
        m = memra.load(folder, device="cuda" if b.cuda else "cpu", dtype=dtype, max_batch=1,
                       max_len=max(lengths) + 8, progress=False)
        times[f"memra_{dtype}_load_s"] = round(time.perf_counter() - t0, 1)
        tag = "memra_bf16" if dtype == "bfloat16" else "memra_f32"
        for T in lengths:
            x = torch.from_numpy(m.logits(prompts[T])).to(dev)
            err, last, where = rel_errs(torch, x, truth[T])
            errs[T][tag] = (err, last, int(x[-1].argmax()), where)
            del x
        if dtype == "bfloat16" and not args.no_profile:
            from torch.profiler import ProfilerActivity, profile
            m.engine.synchronize()
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                m.logits(prompts[min(lengths)])
                m.engine.synchronize()
            arms = arms_of("\n".join(n for n, _ in kernel_durations(prof, names=True)))
        m = None
        free(b)

    for T in lengths:
        want = int(truth[T][-1].argmax())
        yard = errs[T]["transformers_bf16"]
        keep = errs[T].get("transformers_bf16keep")
        for tag, (err, last, arg, where) in errs[T].items():
            rec = {**common, "T": T, "candidate": tag, "rel_err": err, "rel_err_last_row": last,
                   "argmax_last_equal": arg == want, **where}
            if tag == "memra_bf16":
                rec.update({"yardstick": "transformers_bf16", "ratio": err / yard[0],
                            "ratio_last_row": last / yard[1], "pass_2x": err <= 2 * yard[0]})
                if keep:
                    rec.update({"ratio_to_bf16keep": err / keep[0], "ratio_last_row_to_bf16keep": last / keep[1]})
            if tag == "memra_f32":
                rec["note"] = "memra float32 (CUDA-core / sequential arms) against the same truth"
            emit_record(rec)
    emit_record({**common, "record": "arms", "T": min(lengths), "arms": arms, **times,
                 "tensor_core_arms_all_ran": None if arms is None else all(arms["tensor_core_ran"].values()),
                 "cuda_core_arms_none_ran": None if arms is None else not any(arms["cuda_core_ran"].values())})
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except (SystemExit, KeyboardInterrupt):
        raise
    except Exception as exc:  # a one-line record in the output too, then the traceback on stderr
        emit_record({"bench": "accuracy_bench_model", "error": f"{type(exc).__name__}: {exc}"})
        raise
