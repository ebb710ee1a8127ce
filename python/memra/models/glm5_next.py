"""GLM-5.3-Flash (``glm5_next``) text model over memra's layer objects.

Reference: transformers 5.17 ``models/glm5_next/modeling_glm5_next.py``
(``Glm5NextTextModel.forward`` and ``Glm5NextTextDecoderLayer.forward``): token embedding copied
into ``hc_mult`` residual streams; per layer an mHC site around the mixer (KDA or MLA with the
DSA k-pool indexer; a "shared" DSA layer reuses the index list of the full DSA layer before it)
and an mHC site around the FFN (dense SwiGLU MLP or MoE); then the plain mean over the streams,
the final RMSNorm and the LM head.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from .. import _core
from ..config import Glm5NextConfig
from ..errors import ContractError, MemraError, check_token_ids
from ..loader import CheckpointTensors


@dataclass
class _Block:
    kind: str  # "kda" | "mla"
    indexer: str  # "full" | "shared" | "" (KDA)
    attn_hc: _core.HyperConnection
    input_norm: np.ndarray
    mixer: Any
    ffn_hc: _core.HyperConnection
    post_norm: np.ndarray
    mlp: Any
    sparse_mlp: bool


def _located(where: str, fn, *args, **kwargs):
    """Run a layer constructor; re-raise its error with the checkpoint location prefixed."""
    try:
        return fn(*args, **kwargs)
    except MemraError as e:
        raise type(e)(f"{where}: {e}", e.code) from None


def _norm_vector(where: str, group: dict[str, _core.Weight], size: int) -> np.ndarray:
    w = group.get("weight")
    if w is None:
        raise ContractError(f"{where}: missing tensor 'weight' (expected shape [{size}])", 40024)
    if list(w.shape) != [size]:
        raise ContractError(f"{where}: tensor 'weight' has shape {list(w.shape)}, expected [{size}]", 40000)
    if len(group) != 1:
        raise ContractError(f"{where}: unexpected tensor(s) {sorted(set(group) - {'weight'})}", 40024)
    return w.to_numpy()


class Glm5NextTextModel:
    """The glm5_next text model on one Engine.

    Built from a parsed :class:`~memra.config.Glm5NextConfig` and the checkpoint's tensors;
    raises ContractError naming any missing, extra or mis-shaped tensor.
    """

    def __init__(self, engine: _core.Engine, cfg: Glm5NextConfig, tensors: CheckpointTensors,
                 *, tie_word_embeddings: bool, dtype: str = "float32") -> None:
        self.engine = engine
        self.cfg = cfg
        self.dtype = dtype
        # Functional ops take engine=None for the CPU backend, the engine itself for CUDA.
        self._e = engine if engine.is_cuda else None
        D = cfg.hidden_size
        extra_layers = sorted(set(tensors.layers) - set(range(cfg.num_hidden_layers)))
        if extra_layers:
            raise ContractError(f"load: tensors for layers {extra_layers} beyond num_hidden_layers", 40024)
        top = dict(tensors.top)
        if "embed_tokens" not in top:
            raise ContractError("load: missing tensor 'embed_tokens.weight'", 40024)
        self.embed = top.pop("embed_tokens")
        if list(self.embed.shape) != [cfg.vocab_size, D]:
            raise ContractError(
                f"load: embed_tokens.weight has shape {list(self.embed.shape)}, expected "
                f"[{cfg.vocab_size}, {D}]", 40000)
        if "norm" not in top:
            raise ContractError("load: missing tensor 'norm.weight'", 40024)
        self.final_norm = _norm_vector("norm", {"weight": top.pop("norm")}, D)
        if "lm_head" in top:
            self.lm_head = top.pop("lm_head")
        elif tie_word_embeddings:
            self.lm_head = self.embed
        else:
            raise ContractError("load: missing tensor 'lm_head.weight' (tie_word_embeddings is false)", 40024)
        if list(self.lm_head.shape) != [cfg.vocab_size, D]:
            raise ContractError(
                f"load: lm_head.weight has shape {list(self.lm_head.shape)}, expected [{cfg.vocab_size}, {D}]",
                40000)
        self.blocks: list[_Block] = [self._block(i, tensors.layers.get(i, {})) for i in range(cfg.num_hidden_layers)]
        if self._e is not None:
            # Embedding and LM head converted once to the compute dtype; norm weights to the device.
            tied = self.lm_head is self.embed
            self.embed = _core.DeviceWeight(engine, self.embed, dtype=dtype)
            self.lm_head = self.embed if tied else _core.DeviceWeight(engine, self.lm_head, dtype=dtype)
            self.final_norm = engine.to_device(self.final_norm)
            for b in self.blocks:
                b.input_norm = engine.to_device(b.input_norm)
                b.post_norm = engine.to_device(b.post_norm)

    # ------------------------------------------------------------------ construction
    def _block(self, i: int, groups: dict[str, dict[str, _core.Weight]]) -> _Block:
        cfg, e, D = self.cfg, self.engine, self.cfg.hidden_size
        p = f"model.layers.{i}"
        unknown = set(groups) - {"mixer", "mlp", "input_layernorm", "post_attention_layernorm", "attn_hc", "ffn_hc"}
        if unknown:
            raise ContractError(f"{p}: unexpected tensor group(s) {sorted(unknown)}", 40024)
        hc = {}
        for site in ("attn_hc", "ffn_hc"):
            hc[site] = _located(
                f"{p}.hc_{site[:-3]}_*", _core.HyperConnection, e, dict(groups.get(site, {})),
                hidden=D, hc_mult=cfg.hc_mult, sinkhorn_iters=cfg.hc_sinkhorn_iters,
                hc_eps=cfg.hc_eps, norm_eps=cfg.rms_norm_eps, dtype=self.dtype)
        mixer_w = dict(groups.get("mixer", {}))
        kind = "kda" if cfg.layer_types[i] == "linear_attention" else "mla"
        indexer = ""
        if kind == "kda":
            mixer = _located(
                f"{p}.self_attn", _core.KdaLayer, e, mixer_w, hidden=D, heads=cfg.linear_num_heads,
                head_dim=cfg.linear_head_dim, conv_kernel=cfg.linear_conv_kernel_dim,
                gate="lower_bound" if cfg.linear_lower_bound is not None else "softplus",
                lower_bound=float(cfg.linear_lower_bound or 0.0), rms_eps=cfg.rms_norm_eps,
                dtype=self.dtype)
        else:
            indexer = cfg.indexer_types[i]
            full = indexer == "full"
            mixer = _located(
                f"{p}.self_attn", _core.MlaLayer, e, mixer_w, hidden=D, heads=cfg.num_attention_heads,
                q_lora_rank=cfg.q_lora_rank, kv_rank=cfg.kv_lora_rank, d_nope=cfg.qk_nope_head_dim,
                d_rope=cfg.qk_rope_head_dim, d_v=cfg.v_head_dim, rms_eps=cfg.rms_norm_eps, sparse=True,
                index_heads=cfg.index_n_heads if full else 0,
                index_head_dim=cfg.index_head_dim if full else 0, kpool=cfg.index_kpool,
                topk=cfg.index_topk, tail_rows=2 * cfg.index_kpool, rotate=False, dtype=self.dtype)
        mlp_w = dict(groups.get("mlp", {}))
        sparse = cfg.mlp_layer_types[i] == "sparse"
        if sparse:
            mlp = _located(
                f"{p}.mlp", _core.MoeLayer, e, mlp_w, hidden=D, n_experts=cfg.n_routed_experts,
                top_k=cfg.num_experts_per_tok, n_group=cfg.n_group, topk_group=cfg.topk_group,
                intermediate=cfg.moe_intermediate_size,
                shared_intermediate=cfg.moe_intermediate_size * cfg.n_shared_experts,
                norm_topk_prob=cfg.norm_topk_prob, routed_scaling=cfg.routed_scaling_factor,
                swiglu_limit=cfg.swiglu_limit, dtype=self.dtype)
        else:
            mlp = _located(f"{p}.mlp", _core.MlpLayer, e, mlp_w, hidden=D,
                           intermediate=cfg.intermediate_size, swiglu_limit=cfg.swiglu_limit,
                           dtype=self.dtype)
        return _Block(
            kind=kind, indexer=indexer, attn_hc=hc["attn_hc"],
            input_norm=_norm_vector(f"{p}.input_layernorm", groups.get("input_layernorm", {}), D),
            mixer=mixer, ffn_hc=hc["ffn_hc"],
            post_norm=_norm_vector(f"{p}.post_attention_layernorm", groups.get("post_attention_layernorm", {}), D),
            mlp=mlp, sparse_mlp=sparse)

    def state_specs(self) -> list[_core.LayerStateSpec]:
        """One cache plane per layer, in layer order."""
        return [b.mixer.state_spec() for b in self.blocks]

    # ------------------------------------------------------------------ forward
    def hidden(self, cache: _core.Cache, slots: np.ndarray, ids: np.ndarray, *, decode: bool,
               record: dict[int, np.ndarray] | None = None):
        """Final hidden states after the mixer + FFN stack; does NOT commit the cache.

        prefill (decode=False): slots [1], ids [T] -> [T, hidden].
        decode (decode=True): slots [B], ids [B] (one token each) -> [B, hidden].
        slots and ids are host int32 arrays; on a CUDA engine a decode may instead take a
        memra.DecodeSlots and device ids already range-checked (decode_graph.DecodeRunner: no host
        round trip, so the step can be captured). The result lives on the engine's device (numpy
        on the CPU, a DLPack CUDA array on a GPU). `record`, when given, receives the index list each
        full DSA layer used (as host arrays).
        """
        cfg, e = self.cfg, self._e
        eps = cfg.rms_norm_eps
        # The embedding rows expanded into the hc residual streams (hc_expand), in one launch.
        if e is None:
            streams = _core.embedding(self.embed, ids, expand=cfg.hc_mult)
        else:
            if isinstance(ids, np.ndarray):
                # Range-checked here on the host copy, so the device gather needs no host round trip.
                check_token_ids(ids, cfg.vocab_size, "embedding")
                ids = e.to_device(ids)
            streams = _core.embedding(self.embed, ids, engine=e, check_range=False, expand=cfg.hc_mult)
        topk = None
        for i, b in enumerate(self.blocks):
            # Each mHC site: the previous site's expansion, this site's mapping and the block's
            # input norm in one call (one launch on CUDA at a decode row of batch 1).
            if i == 0:
                post, comb, h = b.attn_hc.pre(streams, norm=b.input_norm, eps=eps)
            else:
                streams, post, comb, h = b.attn_hc.post_pre(h, post, comb, streams,
                                                            norm=b.input_norm, eps=eps)
            if b.kind == "kda":
                h = b.mixer.decode(cache, i, slots, h) if decode else b.mixer.prefill(cache, i, int(slots[0]), h)
            else:
                given = topk if b.indexer == "shared" else None
                if decode:
                    h, idx = b.mixer.decode(cache, i, slots, h, given)
                else:
                    h, idx = b.mixer.prefill(cache, i, int(slots[0]), h, given)
                if b.indexer == "full":
                    topk = idx
                    if record is not None:
                        record[i] = self.engine.to_host(idx) if e else idx
            streams, post, comb, h = b.ffn_hc.post_pre(h, post, comb, streams,
                                                       norm=b.post_norm, eps=eps)
            h = b.mlp.forward(h)  # every FFN returns y [T, hidden]
        # The last expansion, the hyper head's mean and the final norm (one launch on CUDA).
        return _core.mhc_post_head_norm(h, post, comb, streams, self.final_norm, eps=eps, engine=e)

    def logits_of(self, hidden):
        """LM head: hidden [N, hidden] -> logits [N, vocab] float32 on the engine's device."""
        return _core.linear(hidden, self.lm_head, engine=self._e)

    def last_row(self, hidden):
        """The last row [1, hidden] of hidden [T, hidden], on the engine's device."""
        return _core.take_rows(hidden, int(hidden.shape[0]) - 1, 1, engine=self._e)

    def to_host(self, arr) -> np.ndarray:
        """A numpy copy (waits for the device) of an array from this model's backend."""
        return self.engine.to_host(arr) if self._e is not None else arr


def state_specs_for(cfg: Glm5NextConfig) -> list[_core.LayerStateSpec]:
    """The cache planes a glm5_next model needs, from its config alone (so a cache can be sized
    and refused before any weight is read)."""
    specs = []
    for i in range(cfg.num_hidden_layers):
        if cfg.layer_types[i] == "linear_attention":
            specs.append(_core.LayerStateSpec.kda(heads=cfg.linear_num_heads, head_dim=cfg.linear_head_dim,
                                                  conv_kernel=cfg.linear_conv_kernel_dim))
        elif cfg.indexer_types[i] == "full":
            specs.append(_core.LayerStateSpec.mla(row_width=cfg.kv_lora_rank + cfg.qk_rope_head_dim,
                                                  index_head_dim=cfg.index_head_dim, kpool=cfg.index_kpool,
                                                  tail_rows=2 * cfg.index_kpool))
        else:
            specs.append(_core.LayerStateSpec.mla(row_width=cfg.kv_lora_rank + cfg.qk_rope_head_dim))
    return specs
