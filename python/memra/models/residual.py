"""The residual kinds: how a decoder carries its residual between sublayers.

The shared loop (memra.models.decoder) calls a kind's per-step *stream* at each site: before a
layer's mixer and before its FFN, ``h = stream.enter(site, y)`` folds the previous sublayer's
output ``y`` (None at the first site) into the residual and returns the next sublayer's input
(normed); after the last layer ``stream.head(y, final_norm)`` folds the last output in and
returns the final normed hidden state. A *site* holds the sublayer's input norm (and for mHC the
site's HyperConnection). Each site call is one fused op, so a kind fixes which kernels run and in
which order:

- :class:`PlainResidual`: the pre-norm residual of Kimi-Linear and Qwen3.5
  (``x = x + y; h = rmsnorm(x)``; transformers' ``residual + hidden_states``, then the next
  RMSNorm): ``_core.rms_norm`` at the first site, ``_core.add_rms_norm`` after. With
  ``zero_centred`` (Qwen3.5's ``x * (1 + w)`` norms) the final norm's weight becomes ``1 + w``
  at load (:func:`zero_centred`; the family's sites hold theirs converted).
- :class:`MhcResidual`: glm5_next's mHC hyper-connections (``hc_mult`` residual streams):
  ``HyperConnection.pre`` at the first site, ``HyperConnection.post_pre`` (the previous site's
  expansion, this site's mapping and the input norm in one call) after, and
  ``_core.mhc_post_head_norm`` at the head; the embedding is expanded into the streams
  (``embedding(expand=hc_mult)``). Reference: ``Glm5NextTextDecoderLayer.forward``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from .. import _core


def zero_centred(w: np.ndarray) -> np.ndarray:
    """The weight a plain weighted rms_norm multiplies by to compute a zero-centred RMSNorm:
    ``1 + w`` in float32. transformers' ``Qwen3_5RMSNorm`` computes ``_norm(x.float()) * (1.0 +
    w.float())``: the same f32 sum (1.0 + w rounds identically in numpy and torch), then one f32
    product per element, which memra's rms_norm forms as ``w' * (x * inv)`` (a product of the same
    two f32 values, so the same bits)."""
    w = np.asarray(w, dtype=np.float32)
    return np.float32(1.0) + w


@dataclass
class NormSite:
    """A plain residual site: the sublayer's input RMSNorm weight [hidden] float32 (host numpy,
    or on the engine's device after ``to_device``)."""

    norm: Any

    def to_device(self, engine: _core.Engine) -> None:
        """Move the norm weight to a CUDA engine's device."""
        self.norm = engine.to_device(self.norm)


@dataclass
class MhcSite:
    """An mHC site: the site's HyperConnection and the sublayer's input RMSNorm weight [hidden]."""

    hc: _core.HyperConnection
    norm: Any

    def to_device(self, engine: _core.Engine) -> None:
        """Move the norm weight to a CUDA engine's device (the HyperConnection is there already)."""
        self.norm = engine.to_device(self.norm)


class PlainResidual:
    """The pre-norm residual: one stream x [T, hidden]; at a site x += y, then h = rmsnorm(x).

    eps: the RMSNorm epsilon of every site and of the head.
    """

    expand: int | None = None  # the embedding goes into the stream as it is

    def __init__(self, eps: float, *, zero_centred: bool = False) -> None:
        self.eps = float(eps)
        self.zero_centred = bool(zero_centred)

    def norm_weight(self, w: np.ndarray) -> np.ndarray:
        """The final norm's weight as the head multiplies by it: w as stored, or for a
        zero-centred family (Qwen3.5: ``x * (1 + w)``) :func:`zero_centred` of it. The family's
        own sites hold their weights already converted."""
        return zero_centred(w) if self.zero_centred else w

    def begin(self, x, engine: _core.Engine | None) -> _PlainStream:
        """The per-step stream over the embedded tokens x [T, hidden] (engine None: the CPU)."""
        return _PlainStream(x, self.eps, engine)


class _PlainStream:
    def __init__(self, x, eps: float, engine) -> None:
        self.x, self.eps, self.e = x, eps, engine

    def enter(self, site: NormSite, y):
        """x += y (y None at the first site), then the sublayer's input h = rmsnorm(x) [T, hidden]."""
        if y is None:
            return _core.rms_norm(self.x, site.norm, eps=self.eps, engine=self.e)
        self.x, h = _core.add_rms_norm(self.x, y, site.norm, eps=self.eps, engine=self.e)
        return h

    def head(self, y, norm):
        """The last x += y, then the final norm: [T, hidden]."""
        return _core.add_rms_norm(self.x, y, norm, eps=self.eps, engine=self.e)[1]


class MhcResidual:
    """mHC hyper-connections: ``hc_mult`` residual streams [T, hc, hidden] mixed at every site by
    the site's HyperConnection (post [T, hc], comb [T, hc, hc] carried to the next site), and the
    plain mean over the streams at the head. eps: the RMSNorm epsilon of the input norms and
    the final norm."""

    def __init__(self, hc_mult: int, eps: float) -> None:
        self.expand = int(hc_mult)
        self.eps = eps

    def norm_weight(self, w: np.ndarray) -> np.ndarray:
        """The final norm's weight, as stored."""
        return w

    def begin(self, streams, engine: _core.Engine | None) -> _MhcStream:
        """The per-step stream over the embedded, expanded tokens streams [T, hc, hidden]."""
        return _MhcStream(streams, self.eps, engine)


class _MhcStream:
    def __init__(self, streams, eps, engine) -> None:
        self.streams, self.eps, self.e = streams, eps, engine
        self.post = self.comb = None

    def enter(self, site: MhcSite, y):
        """The previous site's expansion of y (None at the first site), this site's mapping and
        the sublayer's input norm -> h [T, hidden]."""
        # One call per site: at the first the mapping and the input norm; after that the previous
        # site's expansion too (one launch on CUDA at a decode row of batch 1).
        if y is None:
            self.post, self.comb, h = site.hc.pre(self.streams, norm=site.norm, eps=self.eps)
        else:
            self.streams, self.post, self.comb, h = site.hc.post_pre(
                y, self.post, self.comb, self.streams, norm=site.norm, eps=self.eps)
        return h

    def head(self, y, norm):
        """The last expansion, the streams' mean and the final norm -> [T, hidden]."""
        # The last expansion, the hyper head's mean and the final norm (one launch on CUDA).
        return _core.mhc_post_head_norm(y, self.post, self.comb, self.streams, norm, eps=self.eps,
                                        engine=self.e)

