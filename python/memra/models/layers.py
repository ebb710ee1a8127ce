"""The mixer interface, the per-step context, and helpers the family block builders share.

Every mixer has ``prefill(cache, layer, slots, x, ctx)`` and ``decode(cache, layer, slots, x,
ctx)`` -> y, so the decoder loop calls every layer alike:

- cache: the memra.Cache; layer: the layer's index (its plane in the cache);
- slots: prefill: host int32 [1] (the one slot continued); decode: host int32 [B] or a
  memra._core.DecodeSlots (CUDA; device-resident, for captured steps);
- x: the normed input [T, hidden] (prefill) or [B, hidden] (decode) on the engine's device;
- ctx: the :class:`StepContext` of this forward pass (a batched prefill gives each sequence
  its own, and calls the mixer once per sequence: DecoderModel.hidden's ``offsets``).

The adapters below wrap memra's layer objects (``.layer``) into that interface with the same
calls, arguments and order as the layer's own methods. An FFN needs no adapter: memra.MlpLayer
and memra.MoeLayer both have ``forward(x) -> y``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from .. import _core
from ..errors import ContractError, MemraError


@dataclass
class StepContext:
    """What the layers of one forward pass (a prefill or a decode step) hand each other.

    decode: whether this is a decode step; engine: the engine functional ops take (None for the
    CPU backend, the engine itself for CUDA); record: when not None, receives the index list
    [rows, index_width] int32 (host numpy) each full DSA layer chose, keyed by layer index
    (Model.index_lists). index_list: the index list the last full DSA layer chose (on the
    engine's device), which a later "shared" DSA layer reuses (glm5_next; reference:
    ``Glm5NextTextDecoderLayer`` passing ``topk_indices`` on).
    """

    decode: bool
    engine: _core.Engine | None = None
    record: dict[int, np.ndarray] | None = None
    index_list: Any = None


class KdaMixer:
    """Kimi Delta Attention (memra.KdaLayer) behind the mixer interface."""

    def __init__(self, layer: _core.KdaLayer) -> None:
        self.layer = layer

    def prefill(self, cache: _core.Cache, layer: int, slots, x, ctx: StepContext):
        """Continue slots[0] by x [T, hidden] -> y [T, hidden] (visible at cache.commit)."""
        return self.layer.prefill(cache, layer, int(slots[0]), x)

    def decode(self, cache: _core.Cache, layer: int, slots, x, ctx: StepContext):
        """One token for each of slots [B]: x [B, hidden] -> y [B, hidden]."""
        return self.layer.decode(cache, layer, slots, x)


class AttentionMixer:
    """The gated full attention (memra.AttentionLayer: Qwen3.5 / Qwen3-Next) behind the mixer
    interface. Its cache layer is ``layer.state_spec()`` (LayerStateSpec.attention)."""

    def __init__(self, layer: _core.AttentionLayer) -> None:
        self.layer = layer

    def prefill(self, cache: _core.Cache, layer: int, slots, x, ctx: StepContext):
        """Continue slots[0] by x [T, hidden] -> y [T, hidden] (visible at cache.commit)."""
        return self.layer.prefill(cache, layer, int(slots[0]), x)

    def decode(self, cache: _core.Cache, layer: int, slots, x, ctx: StepContext):
        """One token for each of slots [B] (host int32 or _core.DecodeSlots): x [B, hidden]."""
        return self.layer.decode(cache, layer, slots, x)


class GdnMixer(KdaMixer):
    """Gated DeltaNet (memra.GdnLayer, Qwen3.5 / Qwen3-Next) behind the mixer interface: the
    same calls as KdaMixer (prefill of slots[0], decode of the rows' slots; capturable on CUDA
    with a memra._core.DecodeSlots)."""

    def __init__(self, layer: _core.GdnLayer) -> None:
        self.layer = layer


class MlaMixer:
    """Multi-head latent attention (memra.MlaLayer) behind the mixer interface.

    indexer: ``"full"`` (the layer's own DSA indexer chooses the index list, handed on through
    ``ctx.index_list`` and recorded in ``ctx.record``), ``"shared"`` (the layer attends over
    ``ctx.index_list``, the list of the full DSA layer before it) or ``""`` (dense MLA, no
    indexer; the layer's empty index list is dropped).
    """

    def __init__(self, layer: _core.MlaLayer, indexer: str) -> None:
        if indexer not in ("full", "shared", ""):
            raise ContractError(f"MlaMixer: indexer must be 'full', 'shared' or '', got {indexer!r}", 40025)
        self.layer = layer
        self.indexer = indexer

    def prefill(self, cache: _core.Cache, layer: int, slots, x, ctx: StepContext):
        """Continue slots[0] by x [T, hidden] -> y [T, hidden] (visible at cache.commit)."""
        y, idx = self.layer.prefill(cache, layer, int(slots[0]), x, self._given(ctx))
        self._hand_on(layer, idx, ctx)
        return y

    def decode(self, cache: _core.Cache, layer: int, slots, x, ctx: StepContext):
        """One token for each of slots [B]: x [B, hidden] -> y [B, hidden]."""
        y, idx = self.layer.decode(cache, layer, slots, x, self._given(ctx))
        self._hand_on(layer, idx, ctx)
        return y

    def _given(self, ctx: StepContext):
        if self.indexer != "shared":
            return None
        if ctx.index_list is None:
            raise ContractError("MlaMixer: a shared DSA layer runs before any full DSA layer chose an "
                                "index list", 40025)
        return ctx.index_list

    def _hand_on(self, layer: int, idx, ctx: StepContext) -> None:
        if self.indexer != "full":
            return
        ctx.index_list = idx
        if ctx.record is not None:
            ctx.record[layer] = ctx.engine.to_host(idx) if ctx.engine is not None else idx


def located(where: str, fn, *args, **kwargs):
    """Run a layer constructor; re-raise its memra error with the checkpoint location prefixed."""
    try:
        return fn(*args, **kwargs)
    except MemraError as e:
        raise type(e)(f"{where}: {e}", e.code) from None


def check_groups(where: str, groups, allowed: set[str]) -> None:
    """ContractError naming the tensor groups of a layer that no part of it takes."""
    unknown = set(groups) - allowed
    if unknown:
        raise ContractError(f"{where}: unexpected tensor group(s) {sorted(unknown)}", 40024)


def norm_vector(where: str, group, size: int) -> np.ndarray:
    """The one tensor ``weight`` [size] of a norm's tensor group, as float32 numpy.
    ContractError naming it when missing, mis-shaped, or joined by other tensors."""
    w = group.get("weight")
    if w is None:
        raise ContractError(f"{where}: missing tensor 'weight' (expected shape [{size}])", 40024)
    if list(w.shape) != [size]:
        raise ContractError(f"{where}: tensor 'weight' has shape {list(w.shape)}, expected [{size}]", 40000)
    if len(group) != 1:
        raise ContractError(f"{where}: unexpected tensor(s) {sorted(set(group) - {'weight'})}", 40024)
    return w.to_numpy()
