#!/usr/bin/env python3
"""Whole-model decode tokens/s of Qwen3.5 models, memra vs transformers (+ fla when importable) on
the same checkpoint folder, against the weight-bandwidth roofline, at two geometries:

- ``4b``: the Qwen3.5-4B shape (REFERENCES.md "Real geometry"; tests/fixtures/qwen3_5_config_cases.json
  "release_like_4b_reconstructed"): hidden 2560, 32 layers (every 4th full attention), Gated
  DeltaNet 16 key / 32 value heads x 128 (conv 4), attention 16 q / 4 kv heads x 256 (rotary
  25 %, theta 1e7), dense MLP 9216, vocab 248320, tied head. ``Qwen3_5ForCausalLM``.
- ``35b``: Qwen3.5-35B-A3B widths with 8 layers and 64 experts: hidden 2048, layers 3 and 7 full
  attention (16 q / 2 kv x 256), GDN 16 / 32 x 128, MoE top 8 of 64, 512 wide, shared expert 512
  with its sigmoid gate, vocab 248320, untied head. ``Qwen3_5MoeForCausalLM``.

Checkpoints: built on the device in float32, every tensor drawn at random with an
O(1)-activation scale (init_rule: the rules of tests/fixtures/make_qwen_fixtures.py at this hidden
size; nothing left at transformers' 0 / 1 init), stored in bf16 (transformers keeps no module of
this family in fp32), saved with save_pretrained (safetensors, 5 GB shards) into --folder-<model>
(default /tmp/memra-bench-qwen-<model>[-tiny]) and reused when there (a marker file records the
geometry and seed; --rebuild makes it again).

memra:  memra.load(folder, device="cuda", dtype="bfloat16"): decode_common.run_memra's
        protocol (prefill not timed, warm-up steps with the CUDA-graph capture, timed greedy steps
        with a host read of the B tokens each, the public generate / generate_batch API, the
        per-kernel breakdown of a step from torch.profiler).
peer:   transformers <cls>.from_pretrained(folder, dtype=bfloat16).generate (greedy,
        min_new_tokens = max_new_tokens); peer_kernels says whether its gated-delta-rule and conv
        functions resolved to fla / causal_conv1d or to transformers' torch fallback.
roofline: bytes one decode step reads, from the checkpoint's own tensors (safetensors headers):
        every tensor once (GDN, attention, norms, MLP, router, shared expert, LM head: the
        embedding matrix when tied) except the routed experts, counted for the
        E * (1 - (1 - k/E)^B) distinct experts B tokens touch per MoE layer, and the embedding
        rows (B); plus per token the GDN state [Hv, dk, dv] f32 and conv ring (f32) read + written,
        and the attention's K and V rows (bf16) read at the mean context of the timed steps plus
        the new row written. roofline_tok_s = copy_TBps / (bytes_per_step / B).
Goal at B = 1 (issue 19): memra at least 0.8 of the roofline (meets_target).

    python3 benchmarks/bench_qwen_decode.py [--model 4b|35b|both] [--quick] [--batches 1,32]
    python3 benchmarks/bench_qwen_decode.py --device cpu --tiny   # smoke test: tiny widths, f32

--quick (20 timed steps, 32 generate steps, 8 peer steps) is meant to finish both models, the
checkpoints' first build included, in about three minutes on one H200; fla's first call adds its
Triton autotuning (cached for later runs: TRITON_CACHE_AUTOTUNING). elapsed_s in each record is
that model's wall time (build, peer, memra).
"""

from __future__ import annotations

import math
import os
import re
import sys
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
os.environ.setdefault("TRITON_CACHE_AUTOTUNING", "1")  # before fla / transformers are imported

from common import base_parser, emit_record  # noqa: E402
from decode_common import (  # noqa: E402
    add_outcomes, build_and_save, checkpoint_text_bytes, decode_figures, generate_peer, peer_kernels,
    peer_then_memra)
from decode_setup import (  # noqa: E402
    add_decode_args, ensure_checkpoint, parse_decode_args, random_prompts, run_fields)
from bench_kimi_decode import checkpoint_tensors  # noqa: E402

BUILD_VERSION = 1  # bump when the weights recipe changes
GDN, ATTN = "linear_attention", "full_attention"
TARGET_FRAC = 0.8  # issue 19: memra at B = 1 reaches >= 0.8 of the roofline

_COMMON = dict(vocab_size=248320, linear_num_key_heads=16, linear_num_value_heads=32, linear_key_head_dim=128,
               linear_value_head_dim=128, linear_conv_kernel_dim=4, head_dim=256, rms_norm_eps=1e-6,
               max_position_embeddings=262144, eos_token_id=248044, pad_token_id=248044, bos_token_id=None,
               rope_parameters={"rope_type": "default", "rope_theta": 10_000_000.0, "partial_rotary_factor": 0.25,
                                "mrope_section": [11, 11, 10], "mrope_interleaved": True})
MODELS = {
    "4b": ("Qwen3_5TextConfig", "Qwen3_5ForCausalLM",
           dict(_COMMON, hidden_size=2560, intermediate_size=9216, num_hidden_layers=32, num_attention_heads=16,
                num_key_value_heads=4, tie_word_embeddings=True)),
    "35b": ("Qwen3_5MoeTextConfig", "Qwen3_5MoeForCausalLM",
            dict(_COMMON, hidden_size=2048, num_hidden_layers=8, num_attention_heads=16, num_key_value_heads=2,
                 num_experts=64, num_experts_per_tok=8, moe_intermediate_size=512,
                 shared_expert_intermediate_size=512, tie_word_embeddings=False)),
}
# --tiny (and --device cpu): the same structures at the test fixtures' toy widths (GDN head dims
# stay 128 and the attention's 256, the real models' and the CUDA kernels' sizes).
TINY = dict(vocab_size=512, hidden_size=64, linear_num_key_heads=2, linear_num_value_heads=4, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=4096, eos_token_id=510, pad_token_id=511)
TINY_BY_MODEL = {"4b": dict(TINY, intermediate_size=96, num_hidden_layers=4),
                 "35b": dict(TINY, num_hidden_layers=4, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=16,
                             shared_expert_intermediate_size=32)}


# ============================================================================ checkpoint
def text_config(args, which: str) -> dict:
    tc = dict(MODELS[which][2], **(TINY_BY_MODEL[which] if args.tiny else {}))
    if which == "35b" and args.experts:
        tc["num_experts"] = args.experts
    tc["layer_types"] = [ATTN if (i + 1) % 4 == 0 else GDN for i in range(tc["num_hidden_layers"])]
    return tc


def init_rule(name: str, shape: tuple, h: int) -> tuple[float, float]:
    """(std, mean) of the normal draw for parameter `name`: make_qwen_fixtures.init_rule at hidden h."""
    leaf = name.rsplit(".", 1)[-1]
    if "embed_tokens" in name:
        return 1.0, 0.0
    if name == "lm_head.weight":
        return 2.0 / math.sqrt(h), 0.0
    if leaf == "A_log":
        return 0.5, 0.0
    if leaf == "dt_bias":
        return 1.0, 0.0
    if "conv1d" in name:
        return 0.5, 0.0
    if name.endswith("linear_attn.norm.weight"):
        return 0.2, 1.0  # the GDN output norm: plain w * rmsnorm(x) * silu(z)
    if len(shape) == 1:
        return 0.25, 0.0  # the zero-centred x * (1 + w) norms
    if name.endswith("mlp.experts.gate_up_proj") or name.endswith("mlp.experts.down_proj"):
        return 1.0 / math.sqrt(shape[2]), 0.0  # [E, out, in]
    if name.endswith("mlp.gate.weight"):
        return 1.5 / math.sqrt(shape[1]), 0.0
    return 1.0 / math.sqrt(shape[-1]), 0.0  # nn.Linear [out, in], shared_expert_gate included


def marker_of(args, tc: dict) -> dict:
    return {"version": BUILD_VERSION, "seed": args.seed, "text_config": tc}


def build_checkpoint(folder: Path, args, which: str, tc: dict, dev, torch) -> float:
    """Build, initialise (on `dev`), cast to bf16 and save (decode_common.build_and_save);
    returns seconds."""
    import transformers

    cfg_cls, lm_cls = (getattr(transformers, n) for n in MODELS[which][:2])
    h = tc["hidden_size"]

    def init(model) -> None:
        gen = torch.Generator(device=next(model.parameters()).device).manual_seed(args.seed)
        with torch.no_grad():
            for name, p in sorted(model.named_parameters()):
                std, mean = init_rule(name, tuple(p.shape), h)
                p.normal_(mean, std, generator=gen)

    def finish(model) -> int:
        with torch.no_grad():
            for _, p in model.named_parameters():
                p.data = p.data.to(torch.bfloat16)
        model.config.dtype = torch.bfloat16
        return sum(p.numel() for p in model.parameters())

    def extra(tmp: Path) -> None:
        transformers.GenerationConfig(eos_token_id=tc["eos_token_id"], pad_token_id=tc["pad_token_id"],
                                      do_sample=False).save_pretrained(tmp)

    return build_and_save(folder, dev, torch, lambda: lm_cls(cfg_cls(**tc)), init, finish, marker_of(args, tc),
                          f"qwen_decode: {which}", extra)


# ============================================================================ roofline
EXPERT = re.compile(r"\.experts\.\d+\.")


def decode_bytes(cfg, tensors: dict[str, int], B: int, ctx: float) -> dict:
    """Bytes one decode step of B tokens reads (and the state it writes), by component, for the
    parsed config (memra.models.qwen_common.QwenTextConfig) and the checkpoint's tensors."""
    E, k = getattr(cfg, "num_experts", 0), getattr(cfg, "num_experts_per_tok", 0)
    distinct = E * (1.0 - (1.0 - k / E) ** B) if E else 0.0
    out = dict(gdn_weights=0, attention_weights=0, norm_weights=0, dense_mlp_weights=0, moe_router_weights=0,
               moe_shared_weights=0, moe_routed_weights=0, lm_head_weights=0, embedding_rows=0, gdn_state=0,
               kv_cache=0)
    routed_all = 0
    for name, nbytes in tensors.items():
        if "embed_tokens" in name:
            out["embedding_rows"] += B * nbytes / cfg.vocab_size
            if cfg.tie_word_embeddings:
                out["lm_head_weights"] += nbytes  # the tied head reads the whole matrix
        elif name.startswith("lm_head."):
            out["lm_head_weights"] += nbytes
        elif EXPERT.search(name):
            out["moe_routed_weights"] += nbytes * distinct / E
            routed_all += nbytes
        elif ".shared_expert" in name:  # shared_expert.* and shared_expert_gate
            out["moe_shared_weights"] += nbytes
        elif ".mlp.gate.weight" in name:
            out["moe_router_weights"] += nbytes
        elif "layernorm" in name or (name.endswith("norm.weight") and ".linear_attn." not in name
                                     and ".self_attn." not in name):
            out["norm_weights"] += nbytes
        elif ".linear_attn." in name:
            out["gdn_weights"] += nbytes
        elif ".self_attn." in name:
            out["attention_weights"] += nbytes
        else:
            out["dense_mlp_weights"] += nbytes
    F, W = 4, 2
    for t in cfg.layer_types:
        if t == GDN:
            Hk, Hv, dk, dv = (cfg.linear_num_key_heads, cfg.linear_num_value_heads, cfg.linear_key_head_dim,
                              cfg.linear_value_head_dim)
            C, Kc = 2 * Hk * dk + Hv * dv, cfg.linear_conv_kernel_dim
            out["gdn_state"] += B * (2 * Hv * dk * dv * F + 2 * C * (Kc - 1) * F)
        else:
            row = 2 * cfg.num_key_value_heads * cfg.head_dim  # a key and a value row
            out["kv_cache"] += B * (ctx + 1) * row * W
    out = {key: int(round(v)) for key, v in out.items()}
    weights = sum(v for key, v in out.items() if key.endswith("_weights"))
    state = out["gdn_state"] + out["kv_cache"]
    return dict(breakdown=out, weights=weights, state=state, step=weights + out["embedding_rows"] + state,
                inventory=int(weights - out["moe_routed_weights"] + routed_all),
                experts_read_per_moe_layer=round(distinct, 3))


# ============================================================================ peer
# transformers' gated-delta-rule and conv functions: (the kernel's name, the module attribute
# transformers decorated with it), for decode_common.peer_kernels.
GDN_KERNELS = (("chunk_gated_delta_rule", "torch_chunk_gated_delta_rule"),
               ("fused_recurrent_gated_delta_rule", "torch_recurrent_gated_delta_rule"),
               ("causal_conv1d_fn", "causal_conv1d_fn"), ("causal_conv1d_update", "causal_conv1d_update"))


def run_peer(which: str, folder: Path, dev, torch, prompts, batches, peer_steps, match_steps) -> tuple[dict, dict]:
    """transformers on the folder (decode_common.generate_peer): per B {peer_tok_s, tokens
    (seq 0), ...}; and common info."""
    import importlib

    import transformers

    mod = importlib.import_module("transformers.models.qwen3_5.modeling_qwen3_5" if which == "4b"
                                  else "transformers.models.qwen3_5_moe.modeling_qwen3_5_moe")
    info = {"peer_kernels": peer_kernels(mod, GDN_KERNELS)}
    res = generate_peer(torch, dev, getattr(transformers, MODELS[which][1]), folder, prompts, batches, peer_steps,
                        match_steps, info, f"qwen_decode: {which}")
    return res, info


# ============================================================================ main
def run_model(which: str, args, b, plan) -> None:
    torch, dev = b.torch, b.dev
    t_start = time.perf_counter()
    tc = text_config(args, which)
    default = f"/tmp/memra-bench-qwen-{which}" + (f"-{tc.get('num_experts')}E" if which == "35b" else "")
    folder = Path(getattr(args, f"folder_{which}") or default + ("-tiny" if args.tiny else ""))
    build_s = ensure_checkpoint("qwen_decode", folder, args, marker_of(args, tc),
                                lambda: build_checkpoint(folder, args, which, tc, dev, torch), which)
    if args.build_only:
        return
    from memra.config import read_config
    _, cfg = read_config(folder)
    tensors = checkpoint_tensors(folder)
    ckpt_bytes, ckpt_tensors, ckpt_params = checkpoint_text_bytes(folder)
    ctx = args.prompt_len + plan.warmup + plan.steps / 2  # mean context of the timed steps
    prompts = random_prompts(args.seed, min(cfg.vocab_size - 16, 240000), args.prompt_len, max(plan.batches))

    peer, peer_info, mem, mem_info = peer_then_memra(
        args, b, folder, prompts, plan.batches, plan.warmup, plan.steps, plan.peer_steps, plan.gen_steps,
        "qwen_decode",
        lambda ps: run_peer(which, folder, dev, torch, ps, plan.batches, plan.peer_steps, args.match_steps))

    for B in plan.batches:
        rb, r1 = decode_bytes(cfg, tensors, B, ctx), decode_bytes(cfg, tensors, 1, ctx)
        mr, pr = mem[B], peer[B]
        rec = {
            "bench": "qwen_decode",
            "shape": {"model": f"qwen3.5-{which}", "model_type": cfg.model_type, "layers": cfg.num_hidden_layers,
                      "experts": getattr(cfg, "num_experts", None), "top_k": getattr(cfg, "num_experts_per_tok", None),
                      "hidden": cfg.hidden_size, "vocab": cfg.vocab_size,
                      "layer_types": "".join("G" if t == GDN else "A" for t in cfg.layer_types),
                      "gdn": f"Hk{cfg.linear_num_key_heads} Hv{cfg.linear_num_value_heads} "
                             f"dk{cfg.linear_key_head_dim} dv{cfg.linear_value_head_dim}",
                      "attention": f"H{cfg.num_attention_heads} KV{cfg.num_key_value_heads} d{cfg.head_dim} "
                                   f"rot{cfg.rotary_dim}",
                      "tied": cfg.tie_word_embeddings, "text_params": ckpt_params, "B": B,
                      "prompt_len": args.prompt_len, "dtype": "bfloat16" if b.cuda else "float32"},
            **decode_figures(mr, pr, peer_info.get("peer", "transformers"), rb, r1, B, b.copy_TBps,
                             TARGET_FRAC),
            # the tied head is the embedding, counted once in the inventory
            "inventory_matches_checkpoint": rb["inventory"] + (0 if cfg.tie_word_embeddings else int(
                sum(v for n, v in tensors.items() if "embed_tokens" in n))) == ckpt_bytes,
            **run_fields(b, plan, folder, build_s, ctx, ckpt_bytes, ckpt_tensors),
            "elapsed_s": round(time.perf_counter() - t_start, 1),  # this model: build, peer and memra
        }
        add_outcomes(rec, mr, pr, peer_info, mem_info)
        emit_record(rec)


def main() -> int:
    p = base_parser(__doc__.split("\n\n")[0])
    p.add_argument("--model", choices=("4b", "35b", "both"), default="both")
    p.add_argument("--folder-4b", dest="folder_4b", default=None, help="the 4b checkpoint folder (built when missing)")
    p.add_argument("--folder-35b", dest="folder_35b", default=None, help="the 35b checkpoint folder")
    p.add_argument("--experts", type=int, default=None, help="35b: routed experts (default 64; --tiny: 8)")
    add_decode_args(p)
    args, b, plan = parse_decode_args(p, "qwen_decode", gen_quick=32, profile_quick=3)
    for which in (("4b", "35b") if args.model == "both" else (args.model,)):
        run_model(which, args, b, plan)
    return 0

if __name__ == "__main__":
    try:
        sys.exit(main())
    except (SystemExit, KeyboardInterrupt):
        raise
    except Exception as exc:  # a one-line record in the output too, then the traceback on stderr
        emit_record({"bench": "qwen_decode", "error": f"{type(exc).__name__}: {exc}"})
        raise
