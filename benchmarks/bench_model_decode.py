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

import os
import sys
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
# The checkpoint's random-weight rules are the test fixture's (tests/fixtures/glm5_next_init.py).
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures"))

# Before fla / transformers are imported: let Triton keep autotune results on disk, so a second run
# on the same machine skips fla's (long) chunk_kda autotune.
os.environ.setdefault("TRITON_CACHE_AUTOTUNING", "1")

from common import base_parser, emit_record  # noqa: E402
from decode_common import (  # noqa: E402, F401  (MARKER, folder_ready, peer_kernels, sync: also bmd.* to others)
    MARKER, add_outcomes, build_and_save, checkpoint_text_bytes, decode_figures, folder_ready, generate_peer,
    peer_kernels, peer_then_memra, sync)
from decode_setup import (  # noqa: E402
    add_decode_args, ensure_checkpoint, parse_decode_args, random_prompts, run_fields)
from glm5_next_init import init_rule, init_targets  # noqa: E402

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


def build_checkpoint(folder: Path, args, tc: dict, dev, torch) -> float:
    """Build, initialise and save the model (build_and_save); returns seconds."""
    from transformers import Glm5NextConfig, Glm5NextForConditionalGeneration

    cfg = Glm5NextConfig(text_config=dict(tc), vision_config=dict(VISION), tie_word_embeddings=False)

    def finish(model) -> int:
        to_checkpoint_dtype(model, torch)
        return sum(p.numel() for name, p in model.named_parameters() if not name.startswith("model.visual."))

    return build_and_save(folder, dev, torch, lambda: Glm5NextForConditionalGeneration(cfg),
                          lambda m: init_weights(m, args.seed, torch), finish, marker_of(args, tc), "model_decode")


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
def run_peer(args, folder: Path, dev, torch, prompts, batches, peer_steps, match_steps) -> tuple[dict, dict]:
    """transformers on the folder (generate_peer): per B {peer_tok_s, tokens (seq 0), ...}; and
    common info."""
    from transformers import Glm5NextForConditionalGeneration
    from transformers.models.glm5_next import modeling_glm5_next as mod

    info = {"peer_kernels": peer_kernels(mod)}
    res = generate_peer(torch, dev, Glm5NextForConditionalGeneration, folder, prompts, batches, peer_steps,
                        match_steps, info, "model_decode")
    return res, info


# ============================================================================ main
def main() -> int:
    p = base_parser(__doc__.split("\n\n")[0])
    p.add_argument("--folder", default=None,
                   help="checkpoint folder, built when missing (default /tmp/memra-bench-glm5next-<L>L<E>E[-tiny])")
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--experts", type=int, default=None, help="routed experts (default 32; --tiny: 8)")
    add_decode_args(p)
    args, b, plan = parse_decode_args(p, "model_decode", gen_quick=64, profile_quick=5)
    torch, dev = b.torch, b.dev
    tc = text_config(args)
    folder = Path(args.folder or f"/tmp/memra-bench-glm5next-{args.layers}L{tc['n_routed_experts']}E"
                  + ("-tiny" if args.tiny else ""))
    build_s = ensure_checkpoint("model_decode", folder, args, marker_of(args, tc),
                                lambda: build_checkpoint(folder, args, tc, dev, torch))
    if args.build_only:
        return 0

    from memra.config import read_config
    _, cfg = read_config(folder)
    ckpt_bytes, ckpt_tensors, ckpt_params = checkpoint_text_bytes(folder)
    ctx = args.prompt_len + plan.warmup + plan.steps / 2  # mean context of the timed steps
    prompts = random_prompts(args.seed, min(cfg.vocab_size - 1, 150000), args.prompt_len, max(plan.batches))

    # ---- transformers first (then freed), memra second
    peer, peer_info, mem, mem_info = peer_then_memra(
        args, b, folder, prompts, plan.batches, plan.warmup, plan.steps, plan.peer_steps, plan.gen_steps,
        "model_decode",
        lambda ps: run_peer(args, folder, dev, torch, ps, plan.batches, plan.peer_steps, args.match_steps))

    # ---- one JSON line per B
    for B in plan.batches:
        rb = decode_bytes(cfg, B, ctx)
        r1 = decode_bytes(cfg, 1, ctx)
        mr, pr = mem[B], peer[B]
        rec = {
            "bench": "model_decode",
            "shape": {"model": "glm5_next", "layers": cfg.num_hidden_layers, "experts": cfg.n_routed_experts,
                      "top_k": cfg.num_experts_per_tok, "hidden": cfg.hidden_size, "vocab": cfg.vocab_size,
                      "layer_types": "".join("K" if t == "linear_attention" else "M" for t in cfg.layer_types),
                      "mlp_types": "".join("D" if t == "dense" else "E" for t in cfg.mlp_layer_types),
                      "text_params": ckpt_params, "B": B, "prompt_len": args.prompt_len,
                      "dtype": "bfloat16" if b.cuda else "float32"},
            **decode_figures(mr, pr, peer_info.get("peer", "transformers"), rb, r1, B, b.copy_TBps,
                             TARGET_FRAC),
            "memra_sampled_step_ms_median": mr.get("memra_sampled_step_ms_median"),
            "inventory_matches_checkpoint": rb["inventory"] == ckpt_bytes,
            **run_fields(b, plan, folder, build_s, ctx, ckpt_bytes, ckpt_tensors),
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
