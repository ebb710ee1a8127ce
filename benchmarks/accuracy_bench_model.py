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
ties:   memra_f32's rows also say whether its divergence is explained by ties in a discrete
        choice (record field f32_divergence_explained_by_ties, details in dsa_lists /
        dsa_first_differ). memra breaks a tie in the DSA pool top-k to the lower pool index
        (cpu/dsa.h kpool_select); torch.topk picks any of the tied pools. A pool whose relu(q.k)
        is 0 on every indexer head scores exactly 0, so several pools can tie at 0 exactly at
        the select_k boundary (the tiny model, 4 heads: T = 48, layer 3, row 42); with more heads
        a near tie within f32 rounding (memra and torch sum in other orders) can flip a pool too.
        One flipped pool moves that row and, through the KDA state and the later DSA layers,
        every later row.
        How: forward hooks on the truth's full DSA indexers keep transformers' index_scores
        [T, pools] (recomputed from the hook's inputs by the indexer's own expressions:
        indexer_scores; one more [T, heads, pools] f32 temporary, 2 GB at 8K, as the indexer's
        own; its time is in truth_T*_s) and its lists; memra's lists come from
        Model.index_lists (one more prefill). Per DSA layer, the rows whose complete-pool sets
        differ; a row is "comparable" while no earlier DSA layer differed at or before it (else
        its input already differs); a comparable row is an exact tie when every pool in the
        symmetric difference scores exactly the row's select_k-th score, a near tie when within
        1e-5 of the row's max|score|. Explained = the logits agree (<= 1e-4) on every row before
        the first comparable differing row and every comparable differing row is a (near) tie;
        None when no row is over 1e-4. MoE expert flips are not listed: a flip before the first
        DSA one shows as an earlier row over 1e-4, which makes the verdict False.
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
from decode_setup import ensure_checkpoint  # noqa: E402

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


def indexer_scores(torch, ind, hidden_states, q_resid, attention_mask):
    """transformers' index_scores [T, pools] of one Glm5NextTextIndexer call without a cache
    (batch 1), by the forward's own expressions (modeling_glm5_next.py, Glm5NextTextIndexer.forward
    up to the valid_candidates mask): same kernels, same shapes, so the same f32 values."""
    F = torch.nn.functional
    B, S = hidden_states.shape[:2]
    q = ind.wq_b(q_resid).view(B, S, -1, ind.head_dim)
    k = ind.k_norm(ind.wk(hidden_states)).view(B, S, -1, ind.head_dim).squeeze(2)
    gate = F.linear(hidden_states, ind.index_kpool_compress_gate)
    packed = torch.cat([k, gate, attention_mask.to(k.dtype)[..., None]], dim=-1)
    pool_keys, _, _ = ind.get_pooled_states(packed_states=packed)
    scores = F.relu(torch.matmul(q.float(), pool_keys.transpose(-1, -2).float().unsqueeze(1))
                    * ind.softmax_scale)
    weights = ind.weights_proj(hidden_states.to(ind.weights_proj.weight.dtype)).float()
    weights = weights * (ind.n_heads**-0.5)
    return torch.matmul(weights.unsqueeze(-2), scores).squeeze(-2)[0]


def capture_indexers(torch, model, store: dict) -> list:
    """Forward hooks on the truth's full DSA indexers: store[layer] = (index_scores [T, pools]
    f32, the index lists [T, width] int32, index_kpool, select_k budget index_topk // kpool)."""
    lm = model.model.language_model
    handles = []
    for i, layer in enumerate(lm.layers):
        ind = getattr(layer.self_attn, "indexer", None)
        if ind is None:
            continue

        def hook(m, args, kwargs, out, i=i):
            s = indexer_scores(torch, m, kwargs["hidden_states"], kwargs["q_resid"],
                               kwargs["attention_mask"])
            store[i] = (s, out[0], m.index_kpool, m.index_topk // m.index_kpool)

        handles.append(ind.register_forward_hook(hook, with_kwargs=True))
    return handles


def tie_check(torch, tf: dict, lists: dict, first_over: int | None, tol: float = 1e-5) -> dict:
    """Whether memra f32's divergence is explained by ties in the DSA pool top-k (the docstring's
    "ties"). tf: capture_indexers' store; lists: Model.index_lists' {layer: [T, width]}."""
    out, first, bound, untied = {}, None, None, 0
    for L in sorted(tf):
        s, tl, pool, budget = tf[L]
        T, P = s.shape
        dev = s.device
        r = torch.arange(T, device=dev)[:, None]

        def pools(lst):  # [T, P] bool: the complete pools a list holds (tail rows left out)
            lst = lst.long()
            keep = (lst >= 0) & (lst // pool < (r + 1) // pool)
            m = torch.zeros(T, P + 1, dtype=torch.bool, device=dev)
            m.scatter_(1, torch.where(keep, lst // pool, P), True)
            return m[:, :P]

        d = pools(torch.from_numpy(lists[L]).to(dev)) ^ pools(tl)
        rows = d.any(1).nonzero().flatten()
        comp = rows if bound is None else rows[rows < bound]
        rec = {"rows_differ": int(rows.numel()), "first_row": int(rows[0]) if rows.numel() else None,
               "comparable": int(comp.numel()), "exact_ties": 0, "near_ties": 0}
        if comp.numel():
            vis = (torch.arange(P, device=dev)[None] + 1) * pool - 1 <= comp[:, None]
            sr = s[comp].masked_fill(~vis, float("-inf"))
            kth = sr.topk(min(budget, P), dim=1).values[:, -1:]
            scale = sr.masked_fill(~vis, 0).abs().amax(1, keepdim=True)
            dd = d[comp]
            exact = ((sr == kth) | ~dd).all(1)
            near = (((sr - kth).abs() <= tol * scale) | ~dd).all(1) & ~exact
            rec["exact_ties"], rec["near_ties"] = int(exact.sum()), int(near.sum())
            untied += int(comp.numel()) - rec["exact_ties"] - rec["near_ties"]
            r0 = int(comp[0])
            if first is None or r0 < first["row"]:
                ps = dd[0].nonzero().flatten()[:8].tolist()
                first = {"layer": L, "row": r0, "kth_score": float(kth[0]).hex(),
                         "differing_pools": {str(p): float(sr[0, p]).hex() for p in ps}}
        if rows.numel():
            bound = int(rows[0]) if bound is None else min(bound, int(rows[0]))
        out[str(L)] = rec
    if first_over is None:
        verdict = None
    else:
        verdict = first is not None and untied == 0 and first_over >= first["row"]
    return {"dsa_lists": out, "dsa_first_differ": first, "dsa_untied_rows": untied,
            "f32_divergence_explained_by_ties": verdict}


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
    build_s = ensure_checkpoint("accuracy_bench_model", folder, args, bmd.marker_of(args, tc),
                                lambda: bmd.build_checkpoint(folder, args, tc, dev, torch))

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
    truth, tf_dsa = {}, {}
    for T in lengths:
        check_exact_f32(torch, b)
        tf_dsa[T] = {}
        hooks = [] if args.skip_memra_f32 else capture_indexers(torch, model, tf_dsa[T])
        t0 = time.perf_counter()
        truth[T] = tf_logits(torch, model, prompts[T], dev).float()
        b.sync()
        for h in hooks:
            h.remove()
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
            x_argmax = int(x[-1].argmax())
            del x
            if tag == "memra_f32":
                where = {**where, **tie_check(torch, tf_dsa.pop(T), m.index_lists(prompts[T]),
                                              where["first_row_over_1e-4"])}
            errs[T][tag] = (err, last, int(x_argmax), where)
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
