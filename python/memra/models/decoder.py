"""The one decoder loop every family runs, over the blocks its family built.

Token embedding (into the residual kind's stream), then per layer: residual in, mixer, residual
out (with the FFN's input norm), FFN; then the final norm and the LM head. The loop never asks
which family it runs: the residual kind (memra.models.residual), the mixer interface and the
per-step context (memra.models.layers) carry every difference.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .. import _core
from ..errors import ContractError, check_token_ids
from ..loader import CheckpointTensors
from .layers import StepContext, norm_vector
from .registry import BuildArgs, Family, LayerPlan


class DecoderModel:
    """A family's text model on one Engine: embedding, blocks, final norm, LM head.

    Built from a parsed config, its layer plan (``family.layer_plan(config)``, the plan the
    cache was sized from) and the checkpoint's tensors grouped by the family's name table;
    raises ContractError naming any missing, extra or mis-shaped tensor. dtype: the compute
    dtype of the weights ('float32', or 'bfloat16' on CUDA).
    """

    def __init__(self, engine: _core.Engine, family: Family, cfg: Any, plan: list[LayerPlan],
                 tensors: CheckpointTensors, *, dtype: str = "float32") -> None:
        self.engine = engine
        self.family = family
        self.cfg = cfg
        self.plan = list(plan)
        self.dtype = dtype
        # Functional ops take engine=None for the CPU backend, the engine itself for CUDA.
        self._e = engine if engine.is_cuda else None
        D, V, L = cfg.hidden_size, cfg.vocab_size, cfg.num_hidden_layers
        if len(self.plan) != L:
            raise ContractError(f"load: the layer plan has {len(self.plan)} layers for {L}", 40025)
        extra_layers = sorted(set(tensors.layers) - set(range(L)))
        if extra_layers:
            raise ContractError(f"load: tensors for layers {extra_layers} beyond num_hidden_layers", 40024)
        top = dict(tensors.top)
        if "embed_tokens" not in top:
            raise ContractError("load: missing tensor 'embed_tokens.weight'", 40024)
        self.embed = top.pop("embed_tokens")
        if list(self.embed.shape) != [V, D]:
            raise ContractError(
                f"load: embed_tokens.weight has shape {list(self.embed.shape)}, expected [{V}, {D}]", 40000)
        if "norm" not in top:
            raise ContractError("load: missing tensor 'norm.weight'", 40024)
        self.final_norm = norm_vector("norm", {"weight": top.pop("norm")}, D)
        # A stored lm_head is used even when tie_word_embeddings is true: transformers 5's
        # PreTrainedModel.tie_weights ties only where the checkpoint lacks one of the two (or
        # both hold the same values), and warns that it does not tie them otherwise.
        if "lm_head" in top:
            self.lm_head = top.pop("lm_head")
        elif cfg.tie_word_embeddings:
            self.lm_head = self.embed
        else:
            raise ContractError("load: missing tensor 'lm_head.weight' (tie_word_embeddings is false)", 40024)
        if list(self.lm_head.shape) != [V, D]:
            raise ContractError(
                f"load: lm_head.weight has shape {list(self.lm_head.shape)}, expected [{V}, {D}]", 40000)
        if top:
            raise ContractError(f"load: unexpected model-level tensor(s) {sorted(top)}", 40024)
        self.residual = family.residual(cfg)
        self.final_norm = self.residual.norm_weight(self.final_norm)
        self.blocks = [
            family.build_block(BuildArgs(engine=engine, config=cfg, dtype=dtype, index=i, plan=p,
                                         groups=tensors.layers.get(i, {}), where=f"model.layers.{i}"))
            for i, p in enumerate(self.plan)]
        if self._e is not None:
            # Embedding and LM head converted once to the compute dtype; norm weights to the device.
            tied = self.lm_head is self.embed
            self.embed = _core.DeviceWeight(engine, self.embed, dtype=dtype)
            self.lm_head = self.embed if tied else _core.DeviceWeight(engine, self.lm_head, dtype=dtype)
            self.final_norm = engine.to_device(self.final_norm)
            for b in self.blocks:
                b.mixer_site.to_device(engine)
                b.ffn_site.to_device(engine)

    @property
    def vocab_size(self) -> int:
        """Rows of the LM head (the config's vocab_size)."""
        return int(self.cfg.vocab_size)

    @property
    def op_engine(self) -> _core.Engine | None:
        """The engine functional ops take: None for the CPU backend, the engine for CUDA."""
        return self._e

    def state_specs(self) -> list[_core.LayerStateSpec]:
        """One cache plane per layer, in layer order (the layer plan's)."""
        return [p.state for p in self.plan]

    # ------------------------------------------------------------------ forward
    def hidden(self, cache: _core.Cache, slots: np.ndarray, ids: np.ndarray, *, decode: bool,
               record: dict[int, np.ndarray] | None = None, offsets: np.ndarray | None = None):
        """Final hidden states after the mixer + FFN stack; does NOT commit the cache.

        prefill (decode=False): slots [1], ids [T] -> [T, hidden].
        packed prefill (decode=False, offsets given): slots [P] (distinct), ids [N] the P
        sequences' token rows one after another, offsets [P + 1] int (cu_seqlens: sequence j's
        rows are [offsets[j], offsets[j + 1]), offsets[0] = 0, offsets[P] = N, each non-empty)
        -> [N, hidden] in the same packed rows. Every row-wise part (embedding, residual, norms,
        FFNs, final norm) runs once over the N rows; each mixer continues slots[j] from
        sequence j's rows alone (its per-slot prefill on those rows, the outputs put back at the
        same offsets: :meth:`_mix`), with a StepContext of its own per sequence (the DSA index
        lists are per sequence).
        decode (decode=True): slots [B], ids [B] (one token each) -> [B, hidden].
        slots and ids are host int32 arrays; on a CUDA engine a decode may instead take a
        memra._core.DecodeSlots and device ids already range-checked (decode_graph.DecodeRunner:
        no host round trip, so the step can be captured). The result lives on the engine's device
        (numpy on the CPU, a DLPack CUDA array on a GPU). `record`, when given, receives the index
        list each full DSA layer used (as host arrays; see StepContext; a packed prefill's in
        packed rows).
        """
        if offsets is None:
            ctxs = [StepContext(decode=decode, engine=self._e, record=record)]
        else:
            offsets = [int(o) for o in offsets]
            if decode or len(offsets) != len(slots) + 1 or offsets[0] != 0 or offsets[-1] != len(ids) \
                    or any(b <= a for a, b in zip(offsets, offsets[1:])):
                raise ContractError(f"DecoderModel.hidden: offsets {offsets} do not split {len(ids)} prefill "
                                    f"rows into {len(slots)} non-empty sequences", 40025)
            ctxs = [StepContext(decode=False, engine=self._e, record=None if record is None else {})
                    for _ in slots]
        stream = self.residual.begin(self._embed(ids), self._e)
        y = None
        for i, b in enumerate(self.blocks):
            h = stream.enter(b.mixer_site, y)  # residual in (with the mixer's input norm)
            if offsets is None:
                y = (b.mixer.decode if decode else b.mixer.prefill)(cache, i, slots, h, ctxs[0])
            else:
                y = self._mix(b.mixer, cache, i, slots, h, ctxs, offsets)
            h = stream.enter(b.ffn_site, y)  # residual out (with the FFN's input norm)
            y = b.ffn.forward(h)
        if offsets is not None and record is not None:
            for layer in ctxs[0].record:
                record[layer] = np.concatenate([c.record[layer] for c in ctxs])
        return stream.head(y, self.final_norm)

    def _mix(self, mixer, cache: _core.Cache, layer: int, slots, h, ctxs: list[StepContext],
             offsets: list[int]):
        """A packed prefill's mixer: sequence j's rows of h continue slots[j] through the
        mixer's own per-slot prefill, and the outputs go back at the same offsets ([N, hidden]).

        Each mixer carries a slot's state (recurrent planes, conv rings, latent / key / value
        rows, the DSA pools and tail rings) from that slot's rows alone, so the sequences are run
        one after another here; the rows are taken as views on the CPU and copied on CUDA
        (take_rows), and the outputs stacked by one concat_rows."""
        e = self._e
        if len(ctxs) == 1:
            return mixer.prefill(cache, layer, slots, h, ctxs[0])
        parts = []
        for j, ctx in enumerate(ctxs):
            a, b = offsets[j], offsets[j + 1]
            x = h[a:b] if e is None else _core.take_rows(h, a, b - a, engine=e)
            parts.append(mixer.prefill(cache, layer, slots[j:j + 1], x, ctx))
        return _core.concat_rows(parts, engine=e)

    def _embed(self, ids):
        """The token rows, expanded into the residual kind's streams (one launch)."""
        e, expand = self._e, self.residual.expand
        if e is None:
            return _core.embedding(self.embed, ids, expand=expand)
        if isinstance(ids, np.ndarray):
            # Range-checked here on the host copy, so the device gather needs no host round trip.
            check_token_ids(ids, self.vocab_size, "embedding")
            ids = e.to_device(ids)
        return _core.embedding(self.embed, ids, engine=e, check_range=False, expand=expand)

    def logits_of(self, hidden):
        """LM head: hidden [N, hidden] -> logits [N, vocab] float32 on the engine's device."""
        return _core.linear(hidden, self.lm_head, engine=self._e)

    def last_row(self, hidden):
        """The last row [1, hidden] of hidden [T, hidden], on the engine's device."""
        return _core.take_rows(hidden, int(hidden.shape[0]) - 1, 1, engine=self._e)

    def to_host(self, arr) -> np.ndarray:
        """A numpy copy (waits for the device) of an array from this model's backend."""
        return self.engine.to_host(arr) if self._e is not None else arr
