"""The decode step on a CUDA engine, eager or replayed from a CUDA graph (docs/decode_graphs.md).

A step feeds one token to each of up to ``cache.max_batch`` sequences. Its batch is padded to a
*bucket* (1, 2, 4, ... capped at ``max_batch``) whose rows live on the device at fixed addresses
(:class:`memra._core.DecodeSlots`, token ids, sampling counters and seeds); idle rows read and
write no state. Everything a step needs from the cache (positions, ping-pong planes) is read on
the device, and the step commits on the device (``Cache.commit_decode``), so the work it
enqueues is the same at every position: captured once per (bucket, sampling arguments), the
graph is replayed for any slots and lengths. Eager and replayed steps run the same kernels on
the same buffers, hence the same bytes (tests/test_cuda_decode_graph.py checks it).

The first step of a bucket runs eagerly (it also warms cuBLAS' heuristics and loads kernels
lazily, which a capture must not do); later steps capture once, then replay.

A sampling step writes its tokens over the bucket's ids (``tokens`` is ``ids``), so the next
step of the same rows can be *chained*: enqueued with ``ids=None`` before the host has read
anything, reading its ids on the device. Generation (memra.model) queues step k + 1 that way
and only then waits for step k's tokens (Engine.to_host_async), so the device never idles
while the host reads a token, checks it and launches the next graph.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

import numpy as np

from . import _core
from ._interrupts import uninterrupted
from .errors import ContractError, check_owners


@dataclass(frozen=True)
class Sampling:
    """Sampling arguments baked into a captured step (memra._core.sample's)."""

    temperature: float
    top_k: int
    top_p: float

    @staticmethod
    def of(temperature: float, top_k, top_p) -> "Sampling":
        """The Sampling a step bakes in for these arguments (temperature <= 0: greedy, whatever
        top_k and top_p say, so every greedy row shares one graph)."""
        if temperature <= 0:
            return Sampling(0.0, 0, 1.0)
        return Sampling(float(temperature), int(top_k or 0), float(1.0 if top_p is None else top_p))


@dataclass
class _Bucket:
    slots: _core.DecodeSlots
    ids: object  # device int32 [size]
    counters: object  # device uint64 [size]
    seeds: object  # device uint64 [size]
    logits: object  # device float32 [size, vocab]
    tokens: object  # device int32 [size]: the same array as ids (a step's draws feed the next)
    nonfinite: object  # device int32 [size]: 1 where a sampling step's row of logits was not finite
    # Sampling | None -> CudaGraph, least recently replayed first (DecodeRunner.max_graphs of them)
    graphs: OrderedDict = field(default_factory=OrderedDict)
    # Sampling | None -> the bucket's step count at the graph's last replay (or capture)
    replayed: dict = field(default_factory=dict)
    # The keys of the last eager steps not captured since (a second step captures), oldest first
    eager: OrderedDict = field(default_factory=OrderedDict)
    steps: int = 0  # steps run on the bucket
    # The slots of the last step when it sampled (its tokens are in ids), else None.
    chain: tuple | None = None


class DecodeRunner:
    """Decode steps of one network (memra.models.DecoderModel, any family) over one CUDA cache.

    It uses only the network's shared surface: ``engine``, ``vocab_size``,
    ``hidden(cache, slots, ids, decode=True)`` and ``logits_of``.

    ``graphs=False`` runs every step eagerly (the same kernels, for comparison and debugging).
    ``max_graphs``: the most graphs a bucket keeps (one per sampling key), so a server whose
    requests bring ever new temperatures holds a bounded set. With the bucket full, a new key
    runs eagerly (the same bytes, slower) unless the graph replayed least recently has been idle
    for ``4 * max_graphs`` of the bucket's steps: then that one is dropped for it. More keys in
    turn than ``max_graphs`` thus leave the extra ones eager, instead of capturing at every step.
    Not thread-safe: its buckets and chains are shared by every caller (memra.Model serializes
    its steps and their readbacks under its engine lock).

    A sampling step also flags each row whose logits are not finite (NaN weights, an overflow)
    in the bucket's ``nonfinite`` [size] int32: the sampler writes it (``_core.sample``'s
    ``nonfinite=``) in the same launches that draw the tokens, inside the captured graph, so
    that generation ends that row with memra.NonFiniteError instead of using its draw.
    ``nonfinite_flags`` says whether the sampler writes that flag; memra.batch reads it back
    only then.
    """

    nonfinite_flags = True

    def __init__(self, net, cache: _core.Cache, *, graphs: bool = True, max_graphs: int = 8) -> None:
        if isinstance(max_graphs, bool) or not isinstance(max_graphs, int) or max_graphs < 1:
            raise ContractError(f"DecodeRunner: max_graphs must be a positive integer, got {max_graphs!r}", 40025)
        self.net = net
        self.cache = cache
        self.engine = net.engine
        self.graphs = graphs
        self.max_graphs = max_graphs
        self._buckets: dict[int, _Bucket] = {}

    def bucket_size(self, n: int) -> int:
        """The smallest power of two >= n, capped at the cache's max_batch."""
        size = 1
        while size < n:
            size *= 2
        return min(size, self.cache.max_batch)

    def _bucket(self, n: int) -> _Bucket:
        size = self.bucket_size(n)
        b = self._buckets.get(size)
        if b is None:
            e, vocab = self.engine, self.net.vocab_size
            ids = e.to_device(np.zeros(size, np.int32))
            b = _Bucket(slots=_core.DecodeSlots(self.cache, size), ids=ids,
                        counters=e.to_device(np.zeros(size, np.uint64)),
                        seeds=e.to_device(np.zeros(size, np.uint64)),
                        logits=e.to_device(np.zeros((size, vocab), np.float32)),
                        tokens=ids, nonfinite=e.to_device(np.zeros(size, np.int32)))
            self._buckets[size] = b
        return b

    def _body(self, b: _Bucket, sampling: Sampling | None) -> None:
        """The step's work on the device (what a graph records): layers, head, sample, commit."""
        e = self.engine
        h = self.net.hidden(self.cache, b.slots, b.ids, decode=True)
        logits = self.net.logits_of(h)
        e.copy_into(b.logits, logits)
        if sampling is not None:
            flags = dict(nonfinite=b.nonfinite) if self.nonfinite_flags else {}
            tok = _core.sample(logits, b.counters, temperature=sampling.temperature, top_k=sampling.top_k,
                               top_p=sampling.top_p, seeds=b.seeds, engine=e, **flags)
            e.copy_into(b.tokens, tok)
        self.cache.commit_decode(b.slots)

    def can_chain(self, slots) -> bool:
        """Whether the last step of the bucket for len(slots) rows sampled exactly `slots`, so a
        step of them may take its ids from the device (step(ids=None)). Another generation's
        step on the same bucket in between (an interleaved stream) ends the chain."""
        b = self._buckets.get(self.bucket_size(len(slots)))
        return b is not None and b.chain == tuple(int(s) for s in slots)

    def step(self, slots: np.ndarray, ids: np.ndarray | None, sampling: Sampling | None = None,
             counters: np.ndarray | None = None, seeds: np.ndarray | None = None,
             owners: list[int] | None = None) -> _Bucket:
        """One token for each of `slots` [n] (host int32, distinct, validated and with room: the
        caller checks): ids [n] int32 in range, or None to chain (the ids are the tokens the
        previous step of these same slots drew, still on the device: ValueError when that step
        had other slots or did not sample); counters / seeds [n] uint64 (the draw index and seed
        of each row; read when `sampling` has temperature > 0, greedy draws need none); owners
        [n]: the owner token each slot is held with (Cache.hold; None: the slots must not be
        held), checked before anything is enqueued (errors.check_owners: ContractError
        CONTRACT_SLOT_HELD for a slot held by another token or a token that holds none). Enqueues
        the step and advances the cache
        (device and host); returns the bucket whose ``logits[:n]`` (and ``tokens[:n]`` when
        sampling) hold the results once the stream reaches them, until the bucket's next step."""
        owners = [0] * len(slots) if owners is None else [int(o) for o in owners]
        check_owners(self.cache, slots, owners, "decode")
        n = len(slots)
        b = self._bucket(n)
        size = b.slots.size
        e = self.engine
        key = tuple(int(s) for s in slots)
        if ids is None:
            if b.chain != key:
                raise ValueError(f"DecodeRunner.step: cannot chain slots {list(key)}: the bucket's last "
                                 f"step {'sampled ' + str(list(b.chain)) if b.chain else 'did not sample'}")
        # No chain until this step is enqueued: the uploads below replace the bucket's slots and
        # ids, so a failure from here on (an allocation, a capture, an interrupt) must leave
        # nothing a later step could chain from (it would decode the failed step's slots).
        b.chain = None
        if ids is not None:
            b.slots.set(slots)
            pad = np.zeros(size, np.int32)
            pad[:n] = ids
            e.copy_into(b.ids, pad)
        if sampling is not None and sampling.temperature > 0:  # greedy reads neither
            for dst, src in ((b.counters, counters), (b.seeds, seeds)):
                row = np.zeros(size, np.uint64)
                row[:n] = src
                e.copy_into(dst, row)
        graph = b.graphs.get(sampling)
        if graph is None and self.graphs and sampling in b.eager and self._room_for_a_graph(b):
            graph = self._capture(b, sampling)
        if graph is not None:
            b.graphs.move_to_end(sampling)
            b.replayed[sampling] = b.steps
        b.steps += 1
        self._run_and_commit(b, graph, sampling, slots, owners)
        b.chain = key if sampling is not None else None
        return b

    @uninterrupted
    def _run_and_commit(self, b: _Bucket, graph, sampling: Sampling | None, slots, owners: list[int]) -> None:
        """Enqueue the step (`graph`'s replay, or the eager body) and commit its rows on the
        host. The device commits every row inside the step: the host's commits follow it with
        Ctrl-C held back, so an interrupt never leaves some rows' host lengths behind the
        device."""
        if graph is not None:
            graph.replay()
        else:
            self._body(b, sampling)
            b.eager[sampling] = None
            b.eager.move_to_end(sampling)
            while len(b.eager) > 4 * self.max_graphs:
                b.eager.popitem(last=False)
        for s, o in zip(slots, owners):
            self.cache.commit_host(int(s), 1, owner=o)

    def _capture(self, b: _Bucket, sampling: Sampling | None):
        e = self.engine
        e.begin_capture()
        try:
            self._body(b, sampling)
        except BaseException:
            e.abort_capture()
            raise
        graph = e.end_capture()
        b.graphs[sampling] = graph
        b.eager.pop(sampling, None)
        return graph

    def _room_for_a_graph(self, b: _Bucket) -> bool:
        """Whether bucket `b` may capture another graph: it holds fewer than max_graphs, or its
        least recently replayed one has been idle for 4 * max_graphs steps (dropped here; freed
        once its replays in flight end, as cudaGraphExecDestroy defers)."""
        if len(b.graphs) < self.max_graphs:
            return True
        oldest = next(iter(b.graphs))
        if b.steps - b.replayed.get(oldest, 0) < 4 * self.max_graphs:
            return False
        del b.graphs[oldest]
        b.replayed.pop(oldest, None)
        return True
