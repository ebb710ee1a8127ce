#!/usr/bin/env python3
"""Whole-model decode tokens/s of a glm5_next model at GLM-5.3-Flash widths (8 layers, 32 experts,
random bf16 weights), memra vs transformers on the same checkpoint folder, against the roofline.

Checkpoint: transformers' Glm5NextForConditionalGeneration (tiny vision tower, which memra skips)
with a Glm5NextTextConfig at GLM-5.3-Flash widths -- hidden 4096; KDA 64 heads x 128, conv 4, lower
bound -5; MLA 64 heads, q_lora 1536, kv_lora 512, nope 256, v 256, NoPE; DSA indexer 32 heads x
128, kpool 4, topk 2048; MoE 2048 wide, top 8, 1 shared expert, dense 12288 -- but 8 layers and 32
routed experts; vocab 154880. The layer schedules are Glm5NextTextConfig.__post_init__'s: KDA at
0-2 and 4-6, MLA (full DSA indexer) at 3 and 7; dense MLP at 0-2, MoE at 3-7. 6.96e9 text
parameters, 13.9 GB in bf16. Built on the device in float32, every tensor drawn at random with an
O(1)-activation scale (the rules of tests/fixtures/make_glm5_next_fixtures.py: fan-in scaled
projections, routers of logit std 1.5 so routing is spread, no exact 0/1 fills), stored in bf16
except transformers' fp32-strict tensors (conv1d, dt_bias, A_log, e_score_correction_bias), saved
with save_pretrained (safetensors, 5 GB shards) into --folder and reused when it is there
(a marker file records the geometry and seed; --rebuild makes it again).

memra:  memra.load(folder, device="cuda", dtype="bfloat16", max_batch=max(B), max_len=...); each of
        B slots of the model's own cache is prefilled with its prompt (--prompt-len random ids;
        prefill not timed), then `warmup` decode steps (>= 3: CUDA-graph capture happens in the
        first steps), then `reps` timed steps. One step = Model._decode (what decode / generate /
        generate_batch run) + greedy _core.sample over the B rows on the device + one host read of
        the B tokens (wall clock; the host read synchronises every step). memra_tok_s =
        B * steps / time. memra_generate_tok_s: the public generate (B = 1) / generate_batch
        (B > 1) API, which pipelines its steps (step k + 1 is queued before step k's tokens are
        read), min over three calls of time(gen_steps + 1 new tokens) - min over three of time(1
        new token), after a warm-up call; generate_frac_of_roofline is its fraction of the
        roofline. (Two calls each read 0.747 and 0.773 at B = 32 in two runs of one build:
        results/2026-12-02-h200-s4.md; time(1) carries the batched prefill.)
peer:   transformers Glm5NextForConditionalGeneration.from_pretrained(folder, dtype=bfloat16) on
        the device, generate(do_sample=False, max_new_tokens = min_new_tokens = n) on the same
        prompts; peer_tok_s = B * peer_steps / (time(peer_steps + 1) - time(1)) after a warm-up
        call (fla's Triton autotune happens there). peer_kernels says which KDA / conv
        implementation transformers resolved (fla when it was importable before transformers'
        glm5_next module was first imported, else its torch fallback).
roofline: bytes one decode step reads (bytes_breakdown): every KDA / MLA / indexer / mHC projection
        and norm, the dense MLPs, per MoE layer the router + shared expert + the routed experts the
        B tokens touch (top_k at B = 1; E * (1 - (1 - k/E)^B) expected distinct experts for B > 1),
        the LM head (vocab x hidden) and the B embedding rows, at checkpoint dtypes (bf16; the
        fp32-strict tensors 4 bytes); plus per token the KDA recurrent state read + written
        (H * 128 * 128 * 4 * 2 per KDA layer) and conv ring, and the MLA latent rows the gathered
        attention reads and the pool keys the indexer scores at the mean context of the timed
        steps. bytes_per_token = bytes_per_step / B; roofline_tok_s = copy_TBps / bytes_per_token.
        inventory_bytes (all weights, every expert) is checked against the checkpoint's own tensor
        bytes (safetensors headers): inventory_matches_checkpoint.
greedy_match: leading steps at which memra's greedy token equals transformers' (sequence 0 of
        each B; bf16 random models can diverge: reported, not asserted).

    python3 benchmarks/bench_model_decode.py [--quick] [--folder DIR] [--batches 1,32]
    python3 benchmarks/bench_model_decode.py --device cpu      # smoke test: tiny widths, CPU, f32
"""

from __future__ import annotations

import gc
import json
import math
import os
import shutil
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
# The checkpoint's random-weight rules are the test fixture's (tests/fixtures/glm5_next_init.py).
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures"))

# Before fla / transformers are imported: let Triton keep autotune results on disk, so a second run
# on the same machine skips fla's (long) chunk_kda autotune.
os.environ.setdefault("TRITON_CACHE_AUTOTUNING", "1")

from common import Bench, base_parser, emit_record, kernel_durations, kernel_option_fields, log  # noqa: E402
from glm5_next_init import init_rule, init_targets  # noqa: E402

MARKER = "memra_bench_build.json"
BUILD_VERSION = 1  # bump when the weights recipe changes (a folder of another version is rebuilt)

# GLM-5.3-Flash widths (REFERENCES.md "Real geometry"), 8 layers / 32 experts set by the arguments.
GLM_TEXT = dict(
    vocab_size=154880, hidden_size=4096, intermediate_size=12288, moe_intermediate_size=2048,
    num_attention_heads=64, num_key_value_heads=64, n_shared_experts=1, num_experts_per_tok=8,
    n_group=1, topk_group=1, routed_scaling_factor=2.5, norm_topk_prob=True,
    q_lora_rank=1536, kv_lora_rank=512, qk_nope_head_dim=256, v_head_dim=256, qk_rope_head_dim=0,
    index_n_heads=32, index_head_dim=128, index_kpool=4, index_topk=2048,
    index_kpool_always_select_tail=True,
    linear_num_heads=64, linear_head_dim=128, linear_conv_kernel_dim=4, linear_lower_bound=-5.0,
    hc_mult=4, hc_sinkhorn_iters=20, hc_eps=1e-6, rms_norm_eps=1e-5, swiglu_limit=10.0,
    max_position_embeddings=1048576, tie_word_embeddings=False, eos_token_id=None,
)
# --tiny (and --device cpu): the same structure at toy widths (KDA head_dim stays 128, the CUDA
# kernels' size); topk 16 so the indexer really selects at the smoke test's contexts.
TINY_TEXT = dict(
    GLM_TEXT, vocab_size=512, hidden_size=64, intermediate_size=96, moe_intermediate_size=32,
    num_attention_heads=4, num_key_value_heads=4, num_experts_per_tok=2, q_lora_rank=32,
    kv_lora_rank=32, qk_nope_head_dim=16, v_head_dim=16, index_n_heads=4, index_head_dim=32,
    index_topk=16, linear_num_heads=2, max_position_embeddings=4096, pad_token_id=511,
)
# The smallest vision tower the class accepts (memra skips these weights with a notice).
VISION = dict(depth=1, hidden_size=32, num_heads=2, intermediate_size=32, out_hidden_size=64,
              projection_intermediate_size=32, patch_size=2, image_size=8, temporal_patch_size=1,
              spatial_merge_size=2)
TARGET_FRAC = 0.8  # issue 4: memra at B = 1 reaches >= 0.8 of the roofline


# ============================================================================ checkpoint
def text_config(args) -> dict:
    tc = dict(TINY_TEXT if args.tiny else GLM_TEXT)
    tc["num_hidden_layers"] = args.layers
    tc["n_routed_experts"] = args.experts if args.experts else (8 if args.tiny else 32)
    return tc


def _fill(t, gen, std: float, mean: float = 0.0) -> None:
    t.normal_(mean, std, generator=gen)


def init_weights(model, seed: int, torch) -> None:
    """Every parameter (and the e_score_correction_bias buffers) drawn at random with an
    O(1)-activation scale, on the model's device: tests/fixtures/glm5_next_init.py's rules, the
    ones of memra's test fixture."""
    dev = next(model.parameters()).device
    gen = torch.Generator(device=dev).manual_seed(seed)
    h = model.config.text_config.hidden_size
    with torch.no_grad():
        for name, p in init_targets(model):
            kind, std, mean = init_rule(name, p.shape, h)
            if kind == "rand+0.5":
                p.copy_(torch.rand(p.shape, generator=gen, device=dev) + 0.5)
            else:
                _fill(p, gen, std, mean)


def to_checkpoint_dtype(model, torch) -> None:
    """bf16 everywhere except transformers' fp32-strict modules (what from_pretrained(dtype=bf16)
    keeps and save_pretrained then writes)."""
    keep = model._keep_in_fp32_modules_strict
    for name, t in list(model.named_parameters()) + list(model.named_buffers()):
        if "rotary_pos_emb" in name or any(k in name for k in keep):
            continue
        t.data = t.data.to(torch.bfloat16)
    model.config.dtype = torch.bfloat16


def marker_of(args, tc: dict) -> dict:
    return {"version": BUILD_VERSION, "seed": args.seed, "text_config": tc, "vision_config": VISION}


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


def build_checkpoint(folder: Path, args, tc: dict, dev, torch) -> float:
    """Build, initialise and save the model (build_and_save); returns seconds."""
    from transformers import Glm5NextConfig, Glm5NextForConditionalGeneration

    cfg = Glm5NextConfig(text_config=dict(tc), vision_config=dict(VISION), tie_word_embeddings=False)

    def finish(model) -> int:
        to_checkpoint_dtype(model, torch)
        return sum(p.numel() for name, p in model.named_parameters() if not name.startswith("model.visual."))

    return build_and_save(folder, dev, torch, lambda: Glm5NextForConditionalGeneration(cfg),
                          lambda m: init_weights(m, args.seed, torch), finish, marker_of(args, tc), "model_decode")


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


# ============================================================================ roofline
def decode_bytes(cfg, B: int, ctx: float) -> dict:
    """Bytes one decode step of B tokens reads (and the state it writes), by component, for a
    parsed glm5_next config (memra.models.glm5_next.Glm5NextConfig). Weights at checkpoint dtypes: bf16, the
    fp32-strict tensors (conv taps, dt_bias, A_log, e_score_correction_bias) 4 bytes. `ctx`: the
    context (cached tokens) at which the attention/indexer cache reads are counted."""
    W, F = 2, 4
    D, V = cfg.hidden_size, cfg.vocab_size
    out = dict(kda_weights=0, mla_weights=0, indexer_weights=0, mhc_weights=0, norm_weights=0,
               dense_mlp_weights=0, moe_router_weights=0, moe_shared_weights=0, moe_routed_weights=0,
               lm_head_weights=V * D * W, embedding_rows=B * D * W, kda_state=0, mla_cache=0)
    all_experts = 0  # bytes if every routed expert were read (for the checkpoint check)
    E, k = cfg.n_routed_experts, cfg.num_experts_per_tok
    distinct = E * (1.0 - (1.0 - k / E) ** B)
    hc = cfg.hc_mult
    out["norm_weights"] += D * W  # final norm
    for i in range(cfg.num_hidden_layers):
        if cfg.layer_types[i] == "linear_attention":
            H, dk, K = cfg.linear_num_heads, cfg.linear_head_dim, cfg.linear_conv_kernel_dim
            qkv = H * dk
            mats = 3 * qkv * D + dk * D + qkv * dk + H * D + dk * D + qkv * dk + D * qkv
            out["kda_weights"] += mats * W + (3 * qkv * K + qkv + H) * F
            out["norm_weights"] += dk * W  # o_norm
            # recurrent state read + written, conv ring read + written (f32)
            out["kda_state"] += B * (2 * H * dk * dk * F + 2 * 3 * qkv * (K - 1) * F)
        else:
            H, ql, R, dr = cfg.num_attention_heads, cfg.q_lora_rank, cfg.kv_lora_rank, cfg.qk_rope_head_dim
            dn, dv = cfg.qk_nope_head_dim, cfg.v_head_dim
            out["mla_weights"] += (ql * D + H * (dn + dr) * ql + (R + dr) * D + H * (dn + dv) * R + D * H * dv) * W
            out["norm_weights"] += (ql + R) * W
            rows = min(ctx, cfg.index_topk + cfg.index_kpool - 1)  # gathered rows (all, below topk)
            out["mla_cache"] += B * (rows + 1) * (R + dr) * W  # rows read + the new row written (bf16)
            if cfg.indexer_types[i] == "full":
                Hi, di, P = cfg.index_n_heads, cfg.index_head_dim, cfg.index_kpool
                out["indexer_weights"] += (Hi * di * ql + di * D + Hi * D + di * D) * W + (2 * di + P * di) * W
                out["mla_cache"] += B * int(ctx // P) * di * F  # pool keys scored (f32 in memra's cache)
        mix = (2 + hc) * hc
        out["mhc_weights"] += 2 * (mix * hc * D + mix + 3) * W
        out["norm_weights"] += 2 * D * W  # input / post-attention RMSNorm
        if cfg.mlp_layer_types[i] == "dense":
            out["dense_mlp_weights"] += 3 * cfg.intermediate_size * D * W
        else:
            I = cfg.moe_intermediate_size
            out["moe_router_weights"] += E * D * W + E * F
            out["moe_shared_weights"] += 3 * I * cfg.n_shared_experts * D * W
            out["moe_routed_weights"] += distinct * 3 * I * D * W
            all_experts += E * 3 * I * D * W
    out = {key: int(round(v)) for key, v in out.items()}
    weights = sum(v for key, v in out.items() if key.endswith("_weights"))
    state = out["kda_state"] + out["mla_cache"]
    inventory = weights - out["moe_routed_weights"] + all_experts + V * D * W  # + the embedding table
    return dict(breakdown=out, weights=weights, state=state, step=weights + out["embedding_rows"] + state,
                inventory=int(inventory), experts_read_per_moe_layer=round(distinct, 3))


# ============================================================================ peer
def peer_kernels(mod) -> dict:
    """Which implementation transformers' glm5_next resolved for its KDA / conv functions
    (use_kernel_func_from_hub_with_fallback keeps it in the closure variable `implementation`)."""
    import inspect
    out = {}
    for name in ("chunk_kimi_delta_attention", "recurrent_kimi_delta_attention", "causal_conv1d_fn",
                 "causal_conv1d_update"):
        fn = getattr(mod, name, None)
        try:
            impl = inspect.getclosurevars(fn).nonlocals.get("implementation")
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


def run_peer(args, folder: Path, dev, torch, prompts, batches, peer_steps, match_steps) -> tuple[dict, dict]:
    """transformers on the folder (generate_peer): per B {peer_tok_s, tokens (seq 0), ...}; and
    common info."""
    from transformers import Glm5NextForConditionalGeneration
    from transformers.models.glm5_next import modeling_glm5_next as mod

    info = {"peer_kernels": peer_kernels(mod)}
    res = generate_peer(torch, dev, Glm5NextForConditionalGeneration, folder, prompts, batches, peer_steps,
                        match_steps, info, "model_decode")
    return res, info


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


# ============================================================================ memra
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


# ============================================================================ main
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


def main() -> int:
    p = base_parser(__doc__.split("\n\n")[0])
    p.add_argument("--tiny", action="store_true", help="toy widths (implied by --device cpu)")
    p.add_argument("--folder", default=None,
                   help="checkpoint folder, built when missing (default /tmp/memra-bench-glm5next-<L>L<E>E[-tiny])")
    p.add_argument("--rebuild", action="store_true", help="build the checkpoint again even if the folder is there")
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--experts", type=int, default=None, help="routed experts (default 32; --tiny: 8)")
    p.add_argument("--batches", default=None, help="comma-separated batch sizes (default 1,32; cpu: 1,3)")
    p.add_argument("--profile-steps", type=int, default=5,
                   help="decode steps profiled per kernel after the timing (0: none)")
    p.add_argument("--prompt-len", type=int, default=None, help="prompt tokens per sequence (default 128; cpu 16)")
    p.add_argument("--peer-steps", type=int, default=None,
                   help="transformers' timed decode steps (default 16, --quick 8; cpu 3)")
    p.add_argument("--gen-steps", type=int, default=None,
                   help="memra generate-API timed steps (default 32, --quick 16; cpu 3)")
    p.add_argument("--match-steps", type=int, default=8, help="greedy steps compared with transformers")
    p.add_argument("--skip-peer", action="store_true")
    p.add_argument("--build-only", action="store_true", help="make the checkpoint folder (if missing) and exit")
    p.add_argument("--kernel-options", default="",
                   help="memra.KernelOptions fields for memra's engine, FIELD=VALUE,... (e.g. pdl=0); "
                        "compare arms with ab_model_replay.py, not with separate runs")
    p.add_argument("--seed", type=int, default=0)
    p.epilog = ("--warmup / --reps set memra's warm-up decode steps (at least 3) and timed decode steps "
                "(defaults 10 / 100, --quick 3 / 20).")
    args = p.parse_args()
    cpu = args.device == "cpu"
    args.tiny = args.tiny or cpu
    if cpu:  # smoke test: a few steps only
        args.warmup = 3 if args.warmup is None else args.warmup
        args.reps = 4 if args.reps is None else args.reps
    b = Bench(args, "model_decode")
    torch = b.torch
    dev = b.dev
    batches = [int(x) for x in (args.batches or ("1,3" if cpu else "1,32")).split(",")]
    prompt_len = args.prompt_len or (16 if cpu else 128)
    args.prompt_len = prompt_len
    peer_steps = args.peer_steps or (3 if cpu else (8 if args.quick else 16))
    gen_steps = args.gen_steps or (3 if cpu else (64 if args.quick else 128))
    warmup, steps = max(3, b.warmup), b.reps
    tc = text_config(args)
    folder = Path(args.folder or f"/tmp/memra-bench-glm5next-{args.layers}L{tc['n_routed_experts']}E"
                  + ("-tiny" if args.tiny else ""))

    # ---- checkpoint
    ready, why = folder_ready(folder, marker_of(args, tc))
    build_s = None
    if args.rebuild or not ready:
        if folder.exists() and not (folder / MARKER).exists() and any(folder.iterdir()):
            raise SystemExit(f"model_decode: {folder} exists and was not made by this script; "
                             "pass another --folder")
        log(f"model_decode: building the checkpoint in {folder} ({'--rebuild' if args.rebuild else why})")
        build_s = round(build_checkpoint(folder, args, tc, dev, torch), 2)
    else:
        log(f"model_decode: reusing {folder}")
    if args.build_only:
        return 0

    from memra.config import read_config
    _, cfg = read_config(folder)
    ckpt_bytes, ckpt_tensors, ckpt_params = checkpoint_text_bytes(folder)
    ctx = prompt_len + warmup + steps / 2  # mean context of the timed steps

    # ---- prompts (same length: transformers needs no padding)
    import numpy as np
    rng = np.random.default_rng(args.seed + 1)
    hi = min(cfg.vocab_size - 1, 150000)  # clear of the special / pad ids at the top of the vocabulary
    prompts = [rng.integers(0, hi, prompt_len).astype(np.int64).tolist() for _ in range(max(batches))]

    # ---- transformers first (then freed), memra second
    peer, peer_info, mem, mem_info = peer_then_memra(
        args, b, folder, prompts, batches, warmup, steps, peer_steps, gen_steps, "model_decode",
        lambda ps: run_peer(args, folder, dev, torch, ps, batches, peer_steps, args.match_steps))

    # ---- one JSON line per B
    for B in batches:
        rb = decode_bytes(cfg, B, ctx)
        r1 = decode_bytes(cfg, 1, ctx)
        mr, pr = mem[B], peer[B]
        rec = {
            "bench": "model_decode",
            "shape": {"model": "glm5_next", "layers": cfg.num_hidden_layers, "experts": cfg.n_routed_experts,
                      "top_k": cfg.num_experts_per_tok, "hidden": cfg.hidden_size, "vocab": cfg.vocab_size,
                      "layer_types": "".join("K" if t == "linear_attention" else "M" for t in cfg.layer_types),
                      "mlp_types": "".join("D" if t == "dense" else "E" for t in cfg.mlp_layer_types),
                      "text_params": ckpt_params, "B": B, "prompt_len": prompt_len,
                      "dtype": "bfloat16" if b.cuda else "float32"},
            **decode_figures(mr, pr, peer_info.get("peer", "transformers"), rb, r1, B, b.copy_TBps,
                             TARGET_FRAC),
            "memra_sampled_step_ms_median": mr.get("memra_sampled_step_ms_median"),
            "checkpoint_text_bytes": ckpt_bytes,
            "checkpoint_text_tensors": ckpt_tensors,
            "inventory_matches_checkpoint": rb["inventory"] == ckpt_bytes,
            "context_for_cache_bytes": ctx,
            "device": b.device_name,
            "warmup_steps": warmup,
            "steps": steps,
            "peer_steps": peer_steps,
            "gen_steps": gen_steps,
            "memra_timer": "wall clock per step (each step ends with a host read of the tokens)",
            "folder": str(folder),
            "build_s": build_s,
        }
        add_outcomes(rec, mr, pr, peer_info, mem_info,
                     memra_keys=("memra_api", "memra_error", "memra_generate_error",
                                 "generate_equals_step_loop", "memra_generate_times_s"))
        emit_record(rec)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except (SystemExit, KeyboardInterrupt):
        raise
    except Exception as exc:  # a one-line record in bench.jsonl too, then the traceback on stderr
        emit_record({"bench": "model_decode", "error": f"{type(exc).__name__}: {exc}"})
        raise
