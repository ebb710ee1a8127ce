"""What the whole-model decode benches share (bench_model_decode, bench_kimi_decode,
bench_qwen_decode; bench_model_prefill, accuracy_bench_model and ab_builds use some of it):

- checkpoint folders: the marker file that says which recipe built a folder (folder_ready), the
  build-and-save with its host fallbacks (build_and_save), the text model's bytes on disk
  (checkpoint_text_bytes);
- the peer: which implementation transformers resolved for its KDA, GDN or conv functions
  (peer_kernels) and its greedy generate loop (generate_peer);
- memra: the timed decode steps, generate and the sampled step, the profile and the graph replay
  (run_memra, profile_steps, replay_only), host memory during the load (RssPeak);
- the run and the record: transformers then memra (peer_then_memra), the figures at a batch size
  (decode_figures) and the outcome fields (add_outcomes).
The benches' main() set-up is in decode_setup.py.
"""

from __future__ import annotations

import gc
import json
import math
import os
import shutil
import statistics
import threading
import time
from pathlib import Path

from common import kernel_durations, kernel_option_fields, log


MARKER = "memra_bench_build.json"


def folder_ready(folder: Path, want: dict) -> tuple[bool, str]:
    m = folder / MARKER
    if not m.exists():
        return False, "no marker"
    try:
        have = json.loads(m.read_text())
    except json.JSONDecodeError:
        return False, "unreadable marker"
    if have != json.loads(json.dumps(want)):
        return False, "marker differs (another geometry, seed or recipe)"
    if not (folder / "config.json").exists():
        return False, "no config.json"
    return True, "reused"


def build_and_save(folder: Path, dev, torch, make_model, init, finish, marker: dict, tag: str,
                   extra=None) -> float:
    """The decode benches' checkpoint build: make_model() under torch.device(dev), init(model) (on
    CUDA a failure of either retries both on the host: slower, but a one-shot run still gets its
    folder), finish(model) -> the parameter count it logs (and the cast to the checkpoint dtypes),
    save_pretrained into folder.tmp in 5 GB shards (from host memory if the device save fails),
    extra(tmp) when given (e.g. a generation config), the marker file, then folder.tmp renamed to
    folder. Returns the seconds it took."""
    t0 = time.perf_counter()
    tmp = folder.with_name(folder.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        with torch.device(dev):
            model = make_model()
        init(model)
    except Exception as e:  # noqa: BLE001 - insurance for a one-shot run: the host path (slower)
        if dev.type != "cuda":
            raise
        log(f"{tag}: building on {dev} failed ({type(e).__name__}: {e}); building on the host")
        model = None
        gc.collect()
        torch.cuda.empty_cache()
        dev = torch.device("cpu")
        model = make_model()
        init(model)
    n = finish(model)
    sync(torch, dev)
    log(f"{tag}: built and initialised {n / 1e9:.3f}e9 text parameters on {dev} in "
        f"{time.perf_counter() - t0:.1f} s")
    t1 = time.perf_counter()
    try:
        model.save_pretrained(tmp, max_shard_size="5GB")
    except Exception as e:  # noqa: BLE001 - insurance: save from host memory instead
        if dev.type != "cuda":
            raise
        log(f"{tag}: save_pretrained from {dev} failed ({type(e).__name__}: {e}); saving from the host")
        shutil.rmtree(tmp, ignore_errors=True)
        model.to("cpu")
        model.save_pretrained(tmp, max_shard_size="5GB")
    if extra is not None:
        extra(tmp)
    (tmp / MARKER).write_text(json.dumps(marker, indent=1))
    log(f"{tag}: saved to {tmp} in {time.perf_counter() - t1:.1f} s")
    del model
    gc.collect()
    if dev.type == "cuda":
        torch.cuda.empty_cache()
    if folder.exists():
        shutil.rmtree(folder)
    tmp.rename(folder)
    return time.perf_counter() - t0


def checkpoint_text_bytes(folder: Path) -> tuple[int, int, int]:
    """(bytes, tensors, elements) of the text model's tensors in the folder's safetensors files (headers
    only): vision, MTP (layers >= num_hidden_layers) and shared_head tensors are left out, as
    memra's loader leaves them out."""
    import re
    n_layers = json.loads((folder / "config.json").read_text())
    n_layers = (n_layers.get("text_config") or n_layers)["num_hidden_layers"]
    total = count = elements = 0
    for f in sorted(folder.glob("*.safetensors")):
        with open(f, "rb") as fh:
            hlen = int.from_bytes(fh.read(8), "little")
            header = json.loads(fh.read(hlen))
        for name, meta in header.items():
            if name == "__metadata__" or re.search(r"(^|\.)(visual|vision_tower|vision_model)\.", name):
                continue
            m = re.search(r"layers\.(\d+)\.", name)
            if (m and int(m.group(1)) >= n_layers) or ".shared_head." in name:
                continue
            a, b = meta["data_offsets"]
            total += b - a
            count += 1
            elements += math.prod(meta["shape"])
    return total, count, elements


# transformers' KDA and conv functions (glm5_next, kimi_linear): (the kernel's name, the module
# attribute transformers decorated with it).
KDA_KERNELS = (("chunk_kimi_delta_attention", "chunk_kimi_delta_attention"),
               ("recurrent_kimi_delta_attention", "recurrent_kimi_delta_attention"),
               ("causal_conv1d_fn", "causal_conv1d_fn"), ("causal_conv1d_update", "causal_conv1d_update"))


def peer_kernels(mod, kernels=KDA_KERNELS) -> dict:
    """Which implementation transformers' modeling module `mod` resolved for each of `kernels`
    ((name, module attribute) pairs; default its KDA / conv functions):
    use_kernel_func_from_hub_with_fallback keeps it in the closure variable `implementation`."""
    import inspect
    out = {}
    for name, attr in kernels:
        try:
            impl = inspect.getclosurevars(getattr(mod, attr, None)).nonlocals.get("implementation")
        except Exception:  # noqa: BLE001
            impl = None
        if impl is None:
            out[name] = "unknown"
        elif (getattr(impl, "__module__", "") or "").startswith("transformers"):
            out[name] = "torch fallback (transformers)"
        else:
            out[name] = f"{getattr(impl, '__module__', '?')}.{getattr(impl, '__name__', '?')}"
    return out


def generate_peer(torch, dev, lm_cls, folder: Path, prompts, batches, peer_steps: int, match_steps: int,
                  info: dict, tag: str) -> dict:
    """transformers' greedy generate as the decode peer (bench_model_decode, bench_kimi_decode,
    bench_qwen_decode): lm_cls.from_pretrained(folder) in bfloat16 on CUDA (float32 on the CPU),
    then per B in `batches`, on prompts[:B] (equal lengths): a warm-up call (fla's Triton autotune
    happens there), time(1) and time(peer_steps + 1) of generate(do_sample=False, max_new_tokens =
    min_new_tokens = n), peer_tok_s = B * peer_steps / (time(peer_steps + 1) - time(1)). Returns
    {B: {peer_tok_s, peer_warmup_s, peer_generate_times_s, tokens (sequence 0's first
    max(match_steps, 1)), tokens_all (every sequence's)} or {peer_unavailable: why}}; adds peer,
    peer_load_s and, without fla, fla_unavailable to `info`. Frees the model's device memory before
    it returns (memra loads next). `tag` prefixes the log lines."""
    import importlib.util

    import transformers
    try:
        import fla
        fla_ver = getattr(fla, "__version__", "?")
    except Exception as e:  # noqa: BLE001
        fla_ver = None
        info["fla_unavailable"] = f"{type(e).__name__}: {e}"
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    t0 = time.perf_counter()
    if dev.type == "cuda" and importlib.util.find_spec("accelerate") is not None:
        # straight onto the device (transformers wants accelerate for a device_map)
        model = lm_cls.from_pretrained(folder, dtype=dtype, device_map=str(dev))
    else:  # through host memory (~14 GB at GLM widths), then moved
        model = lm_cls.from_pretrained(folder, dtype=dtype).to(dev)
    model.eval()
    info["peer_load_s"] = round(time.perf_counter() - t0, 2)
    tcfg = getattr(model.config, "text_config", None) or model.config  # multimodal wrappers
    experts = getattr(tcfg, "_experts_implementation", None) or getattr(model.config, "_experts_implementation", None)
    info["peer"] = (f"transformers {transformers.__version__}" + (f" + fla {fla_ver}" if fla_ver else " (no fla)")
                    + f": {lm_cls.__name__}.generate, {str(dtype)[6:]}, attn "
                    f"{model.config._attn_implementation}, experts {experts}")
    pad = tcfg.pad_token_id

    def generate(ids, n):
        sync(torch, dev)
        t = time.perf_counter()
        with torch.no_grad():
            out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=n,
                                 min_new_tokens=n, do_sample=False, pad_token_id=pad)
        sync(torch, dev)
        dt = time.perf_counter() - t
        if out.shape[1] != ids.shape[1] + n:
            raise RuntimeError(f"generate returned {out.shape[1] - ids.shape[1]} new tokens, asked {n}")
        return dt, out[:, ids.shape[1]:].tolist()

    res = {}
    for B in batches:
        r = {}
        try:
            ids = torch.tensor(prompts[:B], dtype=torch.long, device=dev)
            t = time.perf_counter()
            generate(ids, 2)  # warm-up (Triton autotune of fla's kernels on the first call)
            r["peer_warmup_s"] = round(time.perf_counter() - t, 2)
            t1, _ = generate(ids, 1)
            tn, toks = generate(ids, peer_steps + 1)
            r["peer_tok_s"] = B * peer_steps / (tn - t1) if tn > t1 else None
            r["peer_generate_times_s"] = [round(t1, 4), round(tn, 4)]
            r["tokens"] = toks[0][:max(match_steps, 1)]
            r["tokens_all"] = [row[:max(match_steps, 1)] for row in toks]
            log(f"{tag}: peer B={B}: {r['peer_tok_s']} tok/s (warm-up {r['peer_warmup_s']} s, "
                f"generate 1 / {peer_steps + 1} tokens {r['peer_generate_times_s']} s)")
        except Exception as e:  # noqa: BLE001
            r["peer_unavailable"] = f"{type(e).__name__}: {e}"
            log(f"{tag}: peer B={B} failed: {r['peer_unavailable']}")
        res[B] = r
    model = None  # free the device memory before memra loads
    gc.collect()
    if dev.type == "cuda":
        torch.cuda.empty_cache()
    return res


def peer_then_memra(args, b, folder: Path, prompts, batches, warmup, steps, peer_steps, gen_steps, tag: str,
                    peer_fn) -> tuple[dict, dict, dict, dict]:
    """The two sides of a decode bench on one folder: transformers first (peer_fn(prompts) ->
    (per-B results, info); skipped with --skip-peer) and its device memory released, then memra
    (run_memra). A side that fails becomes {B: {peer_unavailable | memra_error: why}}, so the
    other side and the roofline are still reported. Returns (peer, peer_info, mem, mem_info)."""
    peer, peer_info = ({B: {"peer_unavailable": "--skip-peer"} for B in batches}, {})
    if not args.skip_peer:
        try:
            peer, peer_info = peer_fn(prompts)
        except Exception as e:  # noqa: BLE001
            why = f"{type(e).__name__}: {e}"
            log(f"{tag}: transformers failed: {why}")
            peer = {B: {"peer_unavailable": why} for B in batches}
        b.release()
    try:
        mem, mem_info = run_memra(args, folder, "cuda:%d" % args.device_index if b.cuda else "cpu",
                                  "bfloat16" if b.cuda else "float32", prompts, batches, warmup, steps,
                                  gen_steps, args.match_steps)
    except Exception as e:  # noqa: BLE001 - e.g. memra.load failed: still report the peer and the roofline
        why = f"{type(e).__name__}: {e}"
        log(f"{tag}: memra failed: {why}")
        mem, mem_info = {B: {"memra_error": why} for B in batches}, {}
    return peer, peer_info, mem, mem_info


class RssPeak:
    """Peak resident set size of this process while the block runs (sampled every 50 ms)."""

    def __enter__(self):
        self.page = os.sysconf("SC_PAGE_SIZE")
        self.start = self.peak = self._rss()
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()
        return self

    def _rss(self) -> int:
        try:
            with open("/proc/self/statm") as f:
                return int(f.read().split()[1]) * self.page
        except OSError:
            return 0

    def _run(self):
        while not self._stop.wait(0.05):
            self.peak = max(self.peak, self._rss())

    def __exit__(self, *exc):
        self._stop.set()
        self._t.join()
        self.peak = max(self.peak, self._rss())
        return False


def run_memra(args, folder: Path, engine_dev: str, dtype: str, prompts, batches, warmup, steps, gen_steps,
              match_steps) -> tuple[dict, dict]:
    import numpy as np

    import memra
    from memra import _core

    sampled_steps = 8  # the first runs eagerly, the second captures the sampled graph; the rest replay
    max_len = args.prompt_len + max(warmup + steps + sampled_steps + args.profile_steps + kReplaySteps + 1,
                                    gen_steps + 1, 5) + 8
    info = {}
    with RssPeak() as rss:
        t0 = time.perf_counter()
        m = memra.load(folder, device=engine_dev, dtype=dtype, max_batch=max(batches), max_len=max_len,
                       progress=False,
                       kernel_options=memra.KernelOptions(**kernel_option_fields(args.kernel_options)))
        if m.engine.is_cuda:
            m.engine.synchronize()
        info["memra_load_s"] = round(time.perf_counter() - t0, 2)
    info["kernel_options"] = kernel_option_fields(args.kernel_options)  # the non-default fields
    info["memra_load_rss_GiB"] = {"before": round(rss.start / 2**30, 2), "peak": round(rss.peak / 2**30, 2),
                                  "after": round(rss._rss() / 2**30, 2)}
    log(f"model_decode: memra.load {info['memra_load_s']} s, host RSS {info['memra_load_rss_GiB']}")
    e = m.engine if m.engine.is_cuda else None
    cache = m.cache

    def host(x):
        return np.asarray(m.engine.to_host(x)) if e is not None else np.asarray(x)

    res = {}
    for B in batches:
        r = {}
        slots = list(range(B))
        try:
            if hasattr(m, "_decode_sampled"):
                r["memra_api"] = ("Model._decode_sampled (generate / generate_batch's step: greedy sampling "
                                  "inside the step, a CUDA graph per batch bucket) + host read of B tokens")
                seeds, counter = [0] * B, [0]

                def step(toks):
                    counter[0] += 1
                    return np.asarray(m._decode_sampled(slots, [int(t) for t in toks], 0.0, None, None, seeds,
                                                        counter[0]), np.int32)
            elif hasattr(m, "_decode"):
                r["memra_api"] = "Model._decode + _core.sample(temperature=0) on the device + host read of B tokens"
                counters = np.zeros(B, np.uint64)
                counters = e.to_device(counters) if e is not None else counters

                def step(toks):
                    logits = m._decode(cache, slots, toks)
                    return host(_core.sample(logits, counters, temperature=0.0, engine=e)).astype(np.int32)
            else:  # a build whose Model lost _decode: the public decode (logits to the host)
                r["memra_api"] = "Model.decode (host logits) + numpy argmax"

                def step(toks):
                    return np.argmax(m.decode(cache, slots, toks), axis=1).astype(np.int32)

            for s in slots:
                cache.free(s)
            first = np.array([int(np.argmax(m.prefill(cache, s, prompts[i]))) for i, s in enumerate(slots)],
                             np.int32)
            toks, seq0 = first, [int(first[0])]
            for _ in range(warmup):
                toks = step(toks)
                seq0.append(int(toks[0]))
            if e is not None:
                e.synchronize()
            times = []
            for _ in range(steps):
                t = time.perf_counter()
                toks = step(toks)
                times.append(time.perf_counter() - t)
                seq0.append(int(toks[0]))
            r["memra_tok_s"] = B * steps / sum(times)
            r["memra_step_ms_median"] = round(statistics.median(times) * 1e3, 4)
            if hasattr(m, "_decode_sampled"):
                # The same step drawing with temperature 0.8, top_p 0.95 (sampling inside the graph).
                stimes, stoks = [], toks
                for i in range(sampled_steps):
                    t = time.perf_counter()
                    stoks = np.asarray(m._decode_sampled(slots, [int(v) for v in stoks], 0.8, None, 0.95,
                                                         seeds, 1000 + i), np.int32)
                    stimes.append(time.perf_counter() - t)
                r["memra_sampled_step_ms_median"] = round(statistics.median(stimes[2:]) * 1e3, 4)
                r["memra_sampled_tok_s"] = B * (sampled_steps - 2) / sum(stimes[2:])
                toks = stoks
            if e is not None and args.profile_steps > 0:
                toks, prof = profile_steps(step, toks, args.profile_steps)
                r.update(prof)
                r.update(replay_only(m, B, e))
            for s in slots:
                cache.free(s)
            r["tokens"] = seq0[:max(match_steps, 1)]
            log(f"model_decode: memra B={B}: {r['memra_tok_s']:.2f} tok/s (median step "
                f"{r['memra_step_ms_median']} ms)")
        except Exception as ex:  # noqa: BLE001
            r["memra_error"] = f"{type(ex).__name__}: {ex}"
            log(f"model_decode: memra B={B} failed: {r['memra_error']}")
            for s in slots:
                try:
                    cache.free(s)
                except Exception:  # noqa: BLE001
                    pass
        # The public generation API (includes its per-step sampling and host round trips).
        try:
            if B == 1:
                def gen(n):
                    return [m.generate(prompts[0], n, ignore_eos=True)]
            else:
                def gen(n):
                    return m.generate_batch(prompts[:B], n, ignore_eos=True)

            def timed(n):
                if e is not None:
                    e.synchronize()
                t = time.perf_counter()
                out = gen(n)
                return time.perf_counter() - t, out

            timed(4)  # warm-up (graph capture for this batch size, if any)
            t1 = min(timed(1)[0] for _ in range(3))  # prefill + first token (the part subtracted)
            tn, out = timed(gen_steps + 1)
            tn = min(tn, *(timed(gen_steps + 1)[0] for _ in range(2)))
            r["memra_generate_tok_s"] = B * gen_steps / (tn - t1) if tn > t1 else None
            r["memra_generate_times_s"] = [round(t1, 4), round(tn, 4)]
            if "tokens" in r:
                r["generate_equals_step_loop"] = out[0][:len(r["tokens"])] == r["tokens"][:len(out[0])]
        except Exception as ex:  # noqa: BLE001
            r["memra_generate_error"] = f"{type(ex).__name__}: {ex}"
            log(f"model_decode: memra generate B={B} failed: {r['memra_generate_error']}")
        res[B] = r
    m = cache = None
    gc.collect()
    return res, info


def profile_steps(step, toks, n: int):
    """Run n decode steps under torch.profiler (CUDA activity) and sum the kernels per name: what
    the GPU spends per step (memra_gpu_us_per_step; the rest of the step is host time) and the
    kernels that take most of it (memra_kernels_top: [name, us per step, launches per step])."""
    from collections import defaultdict

    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(n):
            toks = step(toks)
    per = defaultdict(lambda: [0.0, 0])
    total = 0.0
    for name, us in kernel_durations(prof, names=True):
        name = name[:90]
        per[name][0] += us
        per[name][1] += 1
        total += us
    top = sorted(per.items(), key=lambda kv: -kv[1][0])
    out = {"memra_gpu_us_per_step": round(total / n, 2),
           "memra_launches_per_step": round(sum(v[1] for v in per.values()) / n, 1),
           "memra_kernels_top": [[k, round(v[0] / n, 2), round(v[1] / n, 2)] for k, v in top]}
    log(f"model_decode: GPU time {total / n:.1f} us per step; top kernels (us/step, launches/step):")
    for k, v in top:
        log(f"  {v[0] / n:9.1f} {v[1] / n:6.1f}  {k}")
    return toks, out


kReplaySteps = 21  # graph replays in replay_only (the cache needs room for them)


def replay_only(m, B: int, e) -> dict:
    """GPU time of the greedy step alone: its captured graph replayed back to back (no host work
    between steps; the cache is not committed host-side, so run it last). memra_replay_us_per_step
    minus memra_gpu_us_per_step is the time between the graph's kernels."""
    runner = getattr(m, "_runner", None)
    if runner is None:
        return {}
    b = runner._buckets.get(runner.bucket_size(B))
    graph = None if b is None else next((g for s, g in b.graphs.items() if s is not None), None)
    if graph is None:
        return {}
    n = kReplaySteps - 1
    graph.replay()
    e.synchronize()
    t = time.perf_counter()
    for _ in range(n):
        graph.replay()
    e.synchronize()
    us = (time.perf_counter() - t) / n * 1e6
    log(f"model_decode: graph replay alone {us:.1f} us per step")
    return {"memra_replay_us_per_step": round(us, 2)}


def sync(torch, dev) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def leading_match(a, b) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def decode_figures(mr: dict, pr: dict, peer_name: str, rb: dict, r1: dict, B: int, copy_TBps: float,
                   target_frac: float) -> dict:
    """The figures every whole-model decode bench reports at batch B: memra's tok/s (the
    synchronous step, generate's, the sampled step's), its profile, the peer's tok/s and the
    ratios, the step's bytes (rb, r1: the bench's decode_bytes at B and at 1) and the roofline at
    copy_TBps. meets_target (B = 1 only) is read on the public API's throughput (generate,
    pipelined: what a user gets and what the peer's figure is), the synchronous step's when
    generate failed."""
    mt, pt, gt = mr.get("memra_tok_s"), pr.get("peer_tok_s"), mr.get("memra_generate_tok_s")
    st = mr.get("memra_sampled_tok_s")
    roof = copy_TBps * 1e12 / (rb["step"] / B)
    return {
        "memra_tok_s": round(mt, 3) if mt else None,
        "memra_step_ms_median": mr.get("memra_step_ms_median"),
        "memra_generate_tok_s": round(gt, 3) if gt else None,
        "memra_sampled_tok_s": round(st, 3) if st else None,
        "memra_gpu_us_per_step": mr.get("memra_gpu_us_per_step"),
        "memra_replay_us_per_step": mr.get("memra_replay_us_per_step"),
        "memra_launches_per_step": mr.get("memra_launches_per_step"),
        "memra_kernels_top": (mr.get("memra_kernels_top") or [])[:48],
        "peer": peer_name,
        "peer_tok_s": round(pt, 3) if pt else None,
        "ratio": round(mt / pt, 4) if (mt and pt) else None,
        "generate_ratio": round(gt / pt, 4) if (gt and pt) else None,
        "bytes_per_token": int(rb["step"] / B),
        "bytes_per_step": rb["step"],
        "bytes_breakdown": rb["breakdown"],
        "experts_read_per_moe_layer": rb["experts_read_per_moe_layer"],
        "roofline_tok_s": round(roof, 2),
        "frac_of_roofline": round(mt / roof, 4) if mt else None,
        "generate_frac_of_roofline": round(gt / roof, 4) if gt else None,
        "copy_TBps": round(copy_TBps, 4),
        "target_frac_at_B1": target_frac if B == 1 else None,
        "meets_target": ((gt or mt or 0.0) / roof >= target_frac) if B == 1 else None,
        "B1_weight_bytes": r1["weights"],
        "inventory_bytes": rb["inventory"],
    }


def add_outcomes(rec: dict, mr: dict, pr: dict, peer_info: dict, mem_info: dict,
                 memra_keys=("memra_api", "memra_error", "memra_generate_error",
                             "generate_equals_step_loop")) -> dict:
    """rec plus the greedy tokens of both sides (and how many lead alike), memra's and the
    peer's outcome fields where present, the peer's and the load's info; returns rec."""
    if "tokens" in mr and "tokens" in pr:
        n = min(len(mr["tokens"]), len(pr["tokens"]))
        rec["greedy_match"] = f"{leading_match(mr['tokens'], pr['tokens'])}/{n}"
        rec["memra_tokens"], rec["peer_tokens"] = mr["tokens"][:n], pr["tokens"][:n]
    for key in memra_keys:
        if key in mr:
            rec[key] = mr[key]
    for key in ("peer_unavailable", "peer_warmup_s", "peer_generate_times_s"):
        if key in pr:
            rec[key] = pr[key]
    rec.update({k: v for k, v in peer_info.items() if k != "peer"})
    rec.update(mem_info)
    return rec

