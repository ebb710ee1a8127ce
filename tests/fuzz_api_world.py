"""The objects the API fuzz's calls run against (tests/fuzz_api_cases.py, test_fuzz_api.py): the
embedded checkpoint loaded on the CPU, a cache whose slot 0 holds tokens, layer objects made
from the checkpoint's tensors (read with safetensors, independently of memra's loader)."""

from __future__ import annotations

import json

import ml_dtypes
import numpy as np
from safetensors import safe_open

import memra
from memra import _core


class World:
    """The objects the calls need: the embedded checkpoint loaded on the CPU, a cache whose slot 0
    holds tokens, layer objects made from the checkpoint's tensors, small arrays."""

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.path = memra.default_checkpoint()
        self.model = memra.load(self.path, max_batch=2, max_len=32, progress=False)
        self.engine = self.model.engine
        self.cfg = json.loads((self.path / "config.json").read_text())["text_config"]
        self.cache = self.model.new_cache(2, 32)
        self.model.prefill(self.cache, 0, [1, 2, 3, 4, 5])
        # A cache whose slot 1 the world holds (Cache.hold): for hold / release.
        self.held_cache = self.model.new_cache(2, 4)
        self.held_token = self.held_cache.hold(1)
        # A cache of another geometry: one layer and no state (bad for every layer op).
        self.other_cache = _core.Cache(self.engine, [_core.LayerStateSpec.none()], max_batch=1, max_len=4)
        self.tensors = {}
        with safe_open(str(self.path / "model.safetensors"), "numpy") as f:
            for name in f.keys():
                self.tensors[name] = f.get_tensor(name)
        c = self.cfg
        self.kda_kw = dict(hidden=c["hidden_size"], heads=c["linear_num_heads"], head_dim=c["linear_head_dim"],
                           conv_kernel=c["linear_conv_kernel_dim"], gate="lower_bound", lower_bound=-5.0,
                           rms_eps=1e-5, dtype="float32")
        self.mla_kw = dict(hidden=c["hidden_size"], heads=c["num_attention_heads"], q_lora_rank=c["q_lora_rank"],
                           kv_rank=c["kv_lora_rank"], d_nope=c["qk_nope_head_dim"], d_rope=c["qk_rope_head_dim"],
                           d_v=c["v_head_dim"], rms_eps=1e-5, sparse=True, index_heads=c["index_n_heads"],
                           index_head_dim=c["index_head_dim"], kpool=c["index_kpool"], topk=c["index_topk"],
                           tail_rows=2 * c["index_kpool"], rotate=False, rope_base=10000.0, dtype="float32")
        self.mlp_kw = dict(hidden=c["hidden_size"], intermediate=c["intermediate_size"],
                           swiglu_limit=c["swiglu_limit"], dtype="float32")
        self.moe_kw = dict(hidden=c["hidden_size"], n_experts=c["n_routed_experts"], top_k=c["num_experts_per_tok"],
                           n_group=c["n_group"], topk_group=c["topk_group"], intermediate=c["moe_intermediate_size"],
                           shared_intermediate=c["moe_intermediate_size"] * c["n_shared_experts"],
                           norm_topk_prob=c["norm_topk_prob"], routed_scaling=c["routed_scaling_factor"],
                           swiglu_limit=c["swiglu_limit"], dtype="float32")
        self.hc_kw = dict(hidden=c["hidden_size"], hc_mult=c["hc_mult"], sinkhorn_iters=c["hc_sinkhorn_iters"],
                          hc_eps=c["hc_eps"], norm_eps=c["rms_norm_eps"], dtype="float32")
        self.kda = _core.KdaLayer(self.engine, self.weights(0, "self_attn."), **self.kda_kw)
        self.mla = _core.MlaLayer(self.engine, self.weights(2, "self_attn."), **self.mla_kw)
        self.mlp = _core.MlpLayer(self.engine, self.weights(0, "mlp."), **self.mlp_kw)
        self.moe = _core.MoeLayer(self.engine, self.weights(1, "mlp."), **self.moe_kw)
        self.hc = _core.HyperConnection(self.engine, self.hc_weights(0), **self.hc_kw)
        self.D = c["hidden_size"]
        self.hc_mult = c["hc_mult"]
        # The full attention (Qwen3.5's gated attention) over a cache of its own, slot 0 holding tokens.
        self.attn_kw = dict(hidden=self.D, heads=2, kv_heads=1, head_dim=16, rotary_dim=8, rope_theta=10000.0,
                            rms_eps=1e-6, dtype="float32")
        self._attn_w = {"q_proj.weight": self.f32(64, self.D), "k_proj.weight": self.f32(16, self.D),
                        "v_proj.weight": self.f32(16, self.D), "o_proj.weight": self.f32(self.D, 32),
                        "q_norm.weight": self.f32(16), "k_norm.weight": self.f32(16)}
        self.attn = _core.AttentionLayer(self.engine, self.attn_weights(), **self.attn_kw)
        self.attn_cache = _core.Cache(self.engine, [self.attn.state_spec()], max_batch=2, max_len=16)
        self.attn.prefill(self.attn_cache, 0, 0, self.f32(3, self.D))
        self.attn_cache.commit(0, 3)

        # A Gated DeltaNet layer of random weights (1 key head, 2 value heads of 8) and its cache.
        self.gdn_kw = dict(hidden=self.D, key_heads=1, value_heads=2, key_head_dim=8, value_head_dim=8,
                           conv_kernel=4, rms_eps=1e-6, dtype="float32")
        self.gdn = _core.GdnLayer(self.engine, self.gdn_weights(), **self.gdn_kw)
        self.gdn_cache = _core.Cache(self.engine, [self.gdn.state_spec()], max_batch=2, max_len=32)
        self.gdn.prefill(self.gdn_cache, 0, 0, self.f32(3, self.D))
        self.gdn_cache.commit(0, 3)

    # Weights of layer i whose names start with `prefix` (the layer constructors' dicts).
    def weights(self, i: int, prefix: str) -> dict[str, _core.Weight]:
        p = f"model.language_model.layers.{i}.{prefix}"
        return {k[len(p):]: self.weight(v) for k, v in self.tensors.items() if k.startswith(p)}

    def attn_weights(self) -> dict[str, _core.Weight]:
        """The AttentionLayer's weights (fresh Weight objects over the same values)."""
        return {k: _core.Weight(v) for k, v in self._attn_w.items()}

    def gdn_weights(self) -> dict[str, _core.Weight]:
        """Qwen3.5-layout weights of the World's GdnLayer (names below 'linear_attn.')."""
        D, C, vd = self.D, 2 * 8 + 2 * 8, 2 * 8
        shapes = {"in_proj_qkv.weight": (C, D), "in_proj_z.weight": (vd, D), "in_proj_b.weight": (2, D),
                  "in_proj_a.weight": (2, D), "conv1d.weight": (C, 1, 4), "A_log": (2,), "dt_bias": (2,),
                  "norm.weight": (8,), "out_proj.weight": (D, vd)}
        return {n: self.W(*s) for n, s in shapes.items()}

    def hc_weights(self, i: int) -> dict[str, _core.Weight]:
        p = f"model.language_model.layers.{i}.hc_attn_"
        return {k[len(p):]: self.weight(v) for k, v in self.tensors.items() if k.startswith(p)}

    @staticmethod
    def weight(a: np.ndarray) -> _core.Weight:
        if a.dtype == ml_dtypes.bfloat16:
            return _core.Weight(a.view(np.uint16), dtype="bfloat16")
        return _core.Weight(np.ascontiguousarray(a))

    def f32(self, *shape) -> np.ndarray:
        return self.rng.standard_normal(shape).astype(np.float32)

    def W(self, *shape) -> _core.Weight:
        return _core.Weight(self.f32(*shape))

    def specs(self) -> list[_core.LayerStateSpec]:
        c = self.cfg
        out = []
        for kind, indexer in zip(c["layer_types"], c["indexer_types"]):
            if kind == "linear_attention":
                out.append(_core.LayerStateSpec.kda(heads=c["linear_num_heads"], head_dim=c["linear_head_dim"],
                                                    conv_kernel=c["linear_conv_kernel_dim"]))
            else:
                full = indexer == "full"
                out.append(_core.LayerStateSpec.mla(
                    row_width=c["kv_lora_rank"] + c["qk_rope_head_dim"],
                    index_head_dim=c["index_head_dim"] if full else 0, kpool=c["index_kpool"] if full else 0,
                    tail_rows=2 * c["index_kpool"] if full else 0))
        return out

    def decode_slots(self):
        """A DecodeSlots of the cache on CUDA; on the CPU, where none can be made, None."""
        return _core.DecodeSlots(self.cache, 1) if self.engine.is_cuda else None

    def caches(self) -> list[_core.Cache]:
        """The caches a bad call must leave unchanged."""
        return [self.cache, self.model.cache, self.other_cache, self.held_cache, self.attn_cache,
                self.gdn_cache]
