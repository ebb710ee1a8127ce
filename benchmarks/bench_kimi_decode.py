#!/usr/bin/env python3
"""Whole-model decode tokens/s of a Kimi-Linear model at Kimi-Linear-48B-A3B widths (8 layers, 64
routed experts, random bf16 weights), memra vs transformers (+ fla when importable) on the same
checkpoint folder, against the active-weight roofline.

Checkpoint: transformers' KimiLinearForCausalLM with the released 48B-A3B geometry (REFERENCES.md
"Real geometry"; tests/fixtures/kimi_linear_config_cases.json "released_48b_a3b") -- hidden 2304;
KDA 32 heads x 128, conv 4 (softplus gate); MLA 32 heads, no query LoRA (q_proj), kv_lora 512,
nope 128, rope 64 (never rotated), v 128; MoE 1024 wide, top 8 of one group, 1 shared expert,
routed scaling 2.446, dense 9216 in the first layer; vocab 163840 -- but 8 layers (the release's
schedule: every 4th MLA, i.e. KDA at 0-2 and 4-6, MLA at 3 and 7; dense MLP at 0, MoE at 1-7) and
64 routed experts. Built on the device in float32, every tensor drawn at random with an
O(1)-activation scale (init_rule: the rules of tests/fixtures/make_kimi_linear_fixtures.py at this
hidden size), stored in bf16 (no module of this family stays fp32), saved with save_pretrained
(safetensors, 5 GB shards) into --folder and reused when it is there (a marker file records the
geometry and seed; --rebuild makes it again).

memra:  memra.load(folder, device="cuda", dtype="bfloat16", ...): decode_common.run_memra's
        protocol (prefill not timed, warm-up steps with the CUDA-graph capture, timed greedy
        steps with a host read of the B tokens each, the public generate / generate_batch API,
        the per-kernel breakdown of the step from torch.profiler: memra_kernels_top).
peer:   transformers KimiLinearForCausalLM.from_pretrained(folder, dtype=bfloat16).generate
        (greedy, min_new_tokens = max_new_tokens); peer_kernels says whether its KDA / conv
        functions resolved to fla / causal_conv1d (importable before transformers' kimi_linear
        module is first imported) or to its torch fallback.
roofline: bytes one decode step reads, from the checkpoint's own tensors (safetensors headers):
        every tensor once (attention, KDA, norms, routers, shared experts, dense MLP, LM head)
        except the routed experts, counted for the E * (1 - (1 - k/E)^B) distinct experts B tokens
        touch per MoE layer (top_k at B = 1), and the embedding (B rows); plus per token the KDA
        recurrent state read + written (H * 128 * 128 * 4 * 2 per KDA layer) and conv ring (f32),
        and the MLA cache rows [512 + 64] bf16 read at the mean context of the timed steps and
        the new row written. roofline_tok_s = copy_TBps / (bytes_per_step / B).
Goal at B = 1 (issue 18): memra_generate_tok_s >= 0.75 of the roofline (meets_target).

    python3 benchmarks/bench_kimi_decode.py [--quick] [--folder DIR] [--batches 1,32]
    python3 benchmarks/bench_kimi_decode.py --device cpu --tiny   # smoke test: tiny widths, f32
"""

from __future__ import annotations

import json
import math
import os
import re
import sys
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
# Before fla / transformers are imported: Triton keeps autotune results on disk (fla's chunk_kda
# autotune is long).
os.environ.setdefault("TRITON_CACHE_AUTOTUNING", "1")

from common import base_parser, emit_record  # noqa: E402
# The whole-model protocol of the glm5_next benchmark (family-free: memra.load picks the family).
from decode_common import (  # noqa: E402
    add_outcomes, build_and_save, checkpoint_text_bytes, decode_figures, generate_peer, peer_kernels,
    peer_then_memra)
from decode_setup import (  # noqa: E402
    add_decode_args, ensure_checkpoint, parse_decode_args, random_prompts, run_fields)

BUILD_VERSION = 1  # bump when the weights recipe changes (a folder of another version is rebuilt)
K, M = "linear_attention", "full_attention"

# Kimi-Linear-48B-A3B widths (transformers KimiLinearConfig fields); layers / experts from the
# arguments, the layer schedules from them (layer_schedule).
KIMI_TEXT = dict(
    vocab_size=163840, hidden_size=2304, intermediate_size=9216, moe_intermediate_size=1024,
    num_attention_heads=32, num_key_value_heads=32, q_lora_rank=None, kv_lora_rank=512,
    qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128, linear_num_heads=32,
    linear_head_dim=128, linear_conv_kernel_dim=4, num_experts_per_tok=8, n_group=1, topk_group=1,
    n_shared_experts=1, routed_scaling_factor=2.446, norm_topk_prob=True, rms_norm_eps=1e-5,
    tie_word_embeddings=False, max_position_embeddings=1048576, pad_token_id=163839,
    eos_token_id=163586, bos_token_id=163584,
)
# --tiny (and --device cpu): the same structure at the test fixture's toy widths (KDA head_dim
# stays 128, the CUDA kernels' size).
TINY_TEXT = dict(
    KIMI_TEXT, vocab_size=512, hidden_size=64, intermediate_size=96, moe_intermediate_size=32,
    num_attention_heads=4, num_key_value_heads=4, kv_lora_rank=32, qk_nope_head_dim=24,
    qk_rope_head_dim=8, v_head_dim=16, linear_num_heads=2, num_experts_per_tok=2,
    max_position_embeddings=4096, pad_token_id=511, eos_token_id=510, bos_token_id=None,
)
TARGET_FRAC = 0.75  # issue 18: memra at B = 1 reaches >= 0.75 of the roofline


# ============================================================================ checkpoint
def text_config(args) -> dict:
    tc = dict(TINY_TEXT if args.tiny else KIMI_TEXT)
    L = args.layers
    tc["num_hidden_layers"] = L
    # The release: full attention at 1-based layers 4, 8, ... and the last; one dense layer first.
    tc["layer_types"] = [M if (i + 1) % 4 == 0 or i == L - 1 else K for i in range(L)]
    tc["mlp_layer_types"] = ["dense"] + ["sparse"] * (L - 1)
    tc["num_local_experts"] = args.experts if args.experts else (8 if args.tiny else 64)
    return tc


def init_rule(name: str, shape: tuple, h: int) -> tuple[float, float]:
    """(std, mean) of the normal draw for parameter / buffer `name` (module names): the test
    fixture's rules (make_kimi_linear_fixtures.init_rule) at hidden size h."""
    leaf = name.rsplit(".", 1)[-1]
    if "embed_tokens" in name:
        return 1.0, 0.0
    if name == "lm_head.weight":
        return 2.0 / math.sqrt(h), 0.0
    if leaf == "e_score_correction_bias":
        return 0.1, 0.0
    if leaf == "A_log":
        return 0.5, 0.0
    if leaf == "dt_bias":
        return 1.0, -1.0
    if "conv1d" in name:
        return 0.5, 0.0
    if len(shape) == 1 and leaf == "weight":
        return 0.2, 1.0  # RMSNorm weights, o_norm, kv_a_layernorm
    if name.endswith("mlp.experts.gate_up_proj") or name.endswith("mlp.experts.down_proj"):
        return 1.0 / math.sqrt(shape[2]), 0.0  # [E, out, in]
    if name.endswith("mlp.gate.weight"):
        return 1.5 / math.sqrt(shape[1]), 0.0  # router logits O(1.5): spread choices
    if len(shape) >= 2:
        return 1.0 / math.sqrt(shape[-1]), 0.0  # nn.Linear [out, in]
    return 1.0 / math.sqrt(h), 0.0


def init_weights(model, seed: int, torch) -> None:
    """Every parameter and e_score_correction_bias buffer drawn on the model's device."""
    dev = next(model.parameters()).device
    gen = torch.Generator(device=dev).manual_seed(seed)
    h = model.config.hidden_size
    targets = sorted(model.named_parameters()) + sorted(
        (n, b) for n, b in model.named_buffers() if "e_score_correction_bias" in n)
    with torch.no_grad():
        for name, p in targets:
            std, mean = init_rule(name, tuple(p.shape), h)
            p.normal_(mean, std, generator=gen)


def to_bf16(model, torch) -> None:
    """bf16 for every parameter and the correction-bias buffers (this family keeps no fp32 module)."""
    with torch.no_grad():
        for _, p in model.named_parameters():
            p.data = p.data.to(torch.bfloat16)
        for name, b in model.named_buffers():
            if "e_score_correction_bias" in name:
                b.data = b.data.to(torch.bfloat16)
    model.config.dtype = torch.bfloat16


def marker_of(args, tc: dict) -> dict:
    return {"version": BUILD_VERSION, "seed": args.seed, "text_config": tc}


def build_checkpoint(folder: Path, args, tc: dict, dev, torch) -> float:
    """Build, initialise and save the model (decode_common.build_and_save); returns seconds."""
    from transformers import KimiLinearConfig, KimiLinearForCausalLM

    cfg = KimiLinearConfig(**tc)

    def finish(model) -> int:
        n = sum(p.numel() for p in model.parameters())
        to_bf16(model, torch)
        return n

    return build_and_save(folder, dev, torch, lambda: KimiLinearForCausalLM(cfg),
                          lambda m: init_weights(m, args.seed, torch), finish, marker_of(args, tc), "kimi_decode")


def checkpoint_tensors(folder: Path) -> dict[str, int]:
    """{name: bytes} of every tensor in the folder's safetensors files (headers only)."""
    out = {}
    for f in sorted(folder.glob("*.safetensors")):
        with open(f, "rb") as fh:
            hlen = int.from_bytes(fh.read(8), "little")
            header = json.loads(fh.read(hlen))
        for name, meta in header.items():
            if name != "__metadata__":
                a, b = meta["data_offsets"]
                out[name] = b - a
    return out


# ============================================================================ roofline
EXPERT = re.compile(r"\.experts\.\d+\.")


def decode_bytes(cfg, tensors: dict[str, int], B: int, ctx: float) -> dict:
    """Bytes one decode step of B tokens reads (and the state it writes), by component, for the
    parsed config (memra.models.kimi_linear.KimiLinearConfig) and the checkpoint's tensors."""
    E, k = cfg.num_local_experts, cfg.num_experts_per_tok
    distinct = E * (1.0 - (1.0 - k / E) ** B)
    out = dict(kda_weights=0, mla_weights=0, norm_weights=0, dense_mlp_weights=0,
               moe_router_weights=0, moe_shared_weights=0, moe_routed_weights=0, lm_head_weights=0,
               embedding_rows=0, kda_state=0, mla_cache=0)
    routed_all = 0
    for name, nbytes in tensors.items():
        if "embed_tokens" in name:
            out["embedding_rows"] += B * nbytes / cfg.vocab_size
        elif name.startswith("lm_head."):
            out["lm_head_weights"] += nbytes
        elif EXPERT.search(name):
            out["moe_routed_weights"] += nbytes * distinct / E
            routed_all += nbytes
        elif ".shared_experts." in name:
            out["moe_shared_weights"] += nbytes
        elif ".gate." in name and ("block_sparse_moe" in name or ".mlp." in name):
            out["moe_router_weights"] += nbytes
        elif "layernorm" in name or name.endswith("norm.weight"):
            out["norm_weights"] += nbytes
        elif ".self_attn." in name:
            layer = int(re.search(r"layers\.(\d+)\.", name).group(1))
            out["kda_weights" if cfg.layer_types[layer] == K else "mla_weights"] += nbytes
        else:  # the dense MLP
            out["dense_mlp_weights"] += nbytes
    F, W = 4, 2
    for i in range(cfg.num_hidden_layers):
        if cfg.layer_types[i] == K:
            H, dk, Kc = cfg.linear_num_heads, cfg.linear_head_dim, cfg.linear_conv_kernel_dim
            out["kda_state"] += B * (2 * H * dk * dk * F + 2 * 3 * H * dk * (Kc - 1) * F)
        else:
            row = cfg.kv_lora_rank + cfg.qk_rope_head_dim
            out["mla_cache"] += B * (ctx + 1) * row * W  # the visible rows read + the new row
    out = {key: int(round(v)) for key, v in out.items()}
    weights = sum(v for key, v in out.items() if key.endswith("_weights"))
    state = out["kda_state"] + out["mla_cache"]
    inventory = weights - out["moe_routed_weights"] + routed_all
    return dict(breakdown=out, weights=weights, state=state,
                step=weights + out["embedding_rows"] + state, inventory=int(inventory),
                experts_read_per_moe_layer=round(distinct, 3))


# ============================================================================ peer
def run_peer(args, folder: Path, dev, torch, prompts, batches, peer_steps, match_steps) -> tuple[dict, dict]:
    """transformers on the folder (decode_common.generate_peer): per B {peer_tok_s, tokens
    (seq 0), ...}; and common info."""
    from transformers import KimiLinearForCausalLM
    from transformers.models.kimi_linear import modeling_kimi_linear as mod

    info = {"peer_kernels": peer_kernels(mod)}
    res = generate_peer(torch, dev, KimiLinearForCausalLM, folder, prompts, batches, peer_steps, match_steps,
                        info, "kimi_decode")
    return res, info


# ============================================================================ main
def main() -> int:
    p = base_parser(__doc__.split("\n\n")[0])
    p.add_argument("--folder", default=None,
                   help="checkpoint folder, built when missing (default /tmp/memra-bench-kimi-<L>L<E>E[-tiny])")
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--experts", type=int, default=None, help="routed experts (default 64; --tiny: 8)")
    add_decode_args(p)
    args, b, plan = parse_decode_args(p, "kimi_decode", gen_quick=64, profile_quick=5)
    torch, dev = b.torch, b.dev
    tc = text_config(args)
    folder = Path(args.folder or f"/tmp/memra-bench-kimi-{args.layers}L{tc['num_local_experts']}E"
                  + ("-tiny" if args.tiny else ""))
    build_s = ensure_checkpoint("kimi_decode", folder, args, marker_of(args, tc),
                                lambda: build_checkpoint(folder, args, tc, dev, torch))
    if args.build_only:
        return 0

    from memra.config import read_config
    _, cfg = read_config(folder)
    tensors = checkpoint_tensors(folder)
    ckpt_bytes, ckpt_tensors, ckpt_params = checkpoint_text_bytes(folder)
    ctx = args.prompt_len + plan.warmup + plan.steps / 2  # mean context of the timed steps
    prompts = random_prompts(args.seed, min(cfg.vocab_size - 16, 160000), args.prompt_len, max(plan.batches))

    # ---- transformers first (then freed), memra second
    peer, peer_info, mem, mem_info = peer_then_memra(
        args, b, folder, prompts, plan.batches, plan.warmup, plan.steps, plan.peer_steps, plan.gen_steps,
        "kimi_decode",
        lambda ps: run_peer(args, folder, dev, torch, ps, plan.batches, plan.peer_steps, args.match_steps))

    # ---- one JSON line per B
    for B in plan.batches:
        rb, r1 = decode_bytes(cfg, tensors, B, ctx), decode_bytes(cfg, tensors, 1, ctx)
        mr, pr = mem[B], peer[B]
        rec = {
            "bench": "kimi_decode",
            "shape": {"model": "kimi_linear", "layers": cfg.num_hidden_layers, "experts": cfg.num_local_experts,
                      "top_k": cfg.num_experts_per_tok, "hidden": cfg.hidden_size, "vocab": cfg.vocab_size,
                      "layer_types": "".join("K" if t == K else "M" for t in cfg.layer_types),
                      "mlp_types": "".join("D" if t == "dense" else "E" for t in cfg.mlp_layer_types),
                      "mla": f"H{cfg.num_attention_heads} R{cfg.kv_lora_rank} nope{cfg.qk_nope_head_dim} "
                             f"rope{cfg.qk_rope_head_dim} v{cfg.v_head_dim}",
                      "text_params": ckpt_params, "B": B, "prompt_len": args.prompt_len,
                      "dtype": "bfloat16" if b.cuda else "float32"},
            **decode_figures(mr, pr, peer_info.get("peer", "transformers"), rb, r1, B, b.copy_TBps,
                             TARGET_FRAC),
            "inventory_matches_checkpoint": rb["inventory"] + int(
                sum(v for n, v in tensors.items() if "embed_tokens" in n)) == ckpt_bytes,
            **run_fields(b, plan, folder, build_s, ctx, ckpt_bytes, ckpt_tensors),
        }
        add_outcomes(rec, mr, pr, peer_info, mem_info)
        emit_record(rec)
    return 0

if __name__ == "__main__":
    try:
        sys.exit(main())
    except (SystemExit, KeyboardInterrupt):
        raise
    except Exception as exc:  # a one-line record in the output too, then the traceback on stderr
        emit_record({"bench": "kimi_decode", "error": f"{type(exc).__name__}: {exc}"})
        raise
