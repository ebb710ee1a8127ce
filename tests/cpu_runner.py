"""A CPU stand-in for memra.decode_graph.DecodeRunner, so the CUDA branches of generation and
of the server's scheduler (chained steps, rows of several samplings in one step) run here."""

from __future__ import annotations

import numpy as np

import memra


class CpuRunner:
    """A CPU stand-in for memra.decode_graph.DecodeRunner with its chaining contract: a sampling
    step leaves its draws as the bucket's ids, step(ids=None) takes them (only right after a
    sampling step of the same slots), and any other step on the bucket ends the chain. Lets the
    pipelined generation loop (Model._decode_rows) run here, as it does on a CUDA engine."""

    def __init__(self, model: memra.Model) -> None:
        from memra.decode_graph import DecodeRunner

        self.m = model
        self.bucket_size = DecodeRunner.bucket_size.__get__(self)
        self.cache = model.cache
        self.buckets: dict[int, dict] = {}
        self.chained_steps = 0

    def can_chain(self, slots) -> bool:
        b = self.buckets.get(self.bucket_size(len(slots)))
        return b is not None and b["chain"] == tuple(int(s) for s in slots)

    nonfinite_flags = True  # a sampling step's bucket carries the sampler's per-row flags

    def step(self, slots, ids, sampling=None, counters=None, seeds=None, owners=None):
        b = self.buckets.setdefault(self.bucket_size(len(slots)), {"chain": None, "ids": None})
        key = tuple(int(s) for s in slots)
        if ids is None:
            if b["chain"] != key:
                raise ValueError("cannot chain")
            ids = b["ids"][: len(slots)]
            self.chained_steps += 1
        m = self.m
        h = m.net.hidden(m.cache, np.asarray(slots, np.int32), np.asarray(ids, np.int32), decode=True)
        for s, o in zip(slots, owners or [0] * len(slots)):
            m.cache.commit(int(s), 1, owner=int(o))
        logits = m.net.logits_of(h)
        if sampling is None:  # logits only (rows of several samplings draw after the step)
            b["chain"] = None
            return type("Bucket", (), {"logits": logits})()
        toks = np.array([m._pick(logits, j, sampling.temperature, sampling.top_k, sampling.top_p,
                                 int(seeds[j]), int(counters[j])) for j in range(len(slots))], np.int32)
        flags = np.full(len(slots), -1, np.int32)  # memra._core.sample's nonfinite output
        memra._core.sample(logits, np.zeros(len(slots), np.uint64), temperature=0.0, nonfinite=flags)
        b["ids"], b["chain"] = toks, key
        return type("Bucket", (), {"tokens": toks, "logits": logits, "nonfinite": flags})()
