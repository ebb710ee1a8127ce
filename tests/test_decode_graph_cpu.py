"""The parts of memra.decode_graph that decide which captured graph a CUDA decode step uses, run
on the CPU (no device needed): the bucket a batch pads to and the sampling key a step bakes in.
The CUDA tests exercise them only through whole steps, where a wrong bucket or key still gives
the right tokens (just more graphs, or rows split over more sampling launches), so mutation
testing (docs/testing_mutations.md, Python layer) found them unchecked. Expected values are the
docstrings' rules worked by hand.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from memra.batch import RowSampling
from memra.decode_graph import DecodeRunner, Sampling


def _runner(max_batch: int) -> DecodeRunner:
    # bucket_size reads only the cache's max_batch; the network only its engine
    return DecodeRunner(SimpleNamespace(engine=None), SimpleNamespace(max_batch=max_batch))


@pytest.mark.parametrize("max_batch,want", [
    (8, {1: 1, 2: 2, 3: 4, 4: 4, 5: 8, 7: 8, 8: 8}),
    (6, {1: 1, 2: 2, 3: 4, 4: 4, 5: 6, 6: 6}),  # the cap: 8 > max_batch
    (1, {1: 1}),
    (64, {17: 32, 32: 32, 33: 64, 64: 64}),
])
def test_bucket_is_the_smallest_power_of_two_capped_at_max_batch(max_batch, want) -> None:
    r = _runner(max_batch)
    assert {n: r.bucket_size(n) for n in want} == want


def test_greedy_steps_share_one_key_whatever_top_k_and_top_p() -> None:
    # "temperature <= 0: greedy, whatever top_k and top_p say, so every greedy row shares one
    # graph": the key is (0, 0, 1) for any greedy arguments.
    greedy = Sampling(0.0, 0, 1.0)
    for top_k, top_p in [(None, None), (5, None), (None, 0.5), (40, 0.9), (0, 1.0)]:
        assert Sampling.of(0.0, top_k, top_p) == greedy
        assert RowSampling(0.0, top_k, top_p, seed=3).key == greedy
    assert len({RowSampling(0.0, k, p).key for k, p in [(None, None), (5, 0.5), (7, None)]}) == 1


def test_a_sampled_step_keys_off_as_the_sampler_reads_off() -> None:
    # top_k None is 0 (off) and top_p None is 1.0 (off), as Model._pick passes them to the sampler
    assert Sampling.of(0.7, None, None) == Sampling(0.7, 0, 1.0)
    assert Sampling.of(0.7, 5, 0.9) == Sampling(0.7, 5, 0.9)
    assert Sampling.of(0.7, None, None) != Sampling.of(0.8, None, None)


def _capturing_runner(max_graphs: int):
    """A runner whose device half is stubbed: captures return fresh graph objects, replays and
    eager bodies are counted; the host commits go to a stand-in cache."""
    from collections import OrderedDict

    log = []

    class Graph:
        def __init__(self, key):
            self.key = key

        def replay(self):
            log.append(("replay", self.key))

    engine = SimpleNamespace(copy_into=lambda d, s: None, begin_capture=lambda: None, abort_capture=lambda: None)
    cache = SimpleNamespace(max_batch=4, owner=lambda s: 0, commit_host=lambda s, n, owner=0: None)
    r = DecodeRunner(SimpleNamespace(engine=engine), cache, max_graphs=max_graphs)
    bucket = SimpleNamespace(slots=SimpleNamespace(set=lambda s: None, size=1), ids=None, counters=None,
                             seeds=None, chain=None, graphs=OrderedDict(), eager=OrderedDict(),
                             replayed={}, steps=0)
    r._bucket = lambda n: bucket
    current = []
    r._body = lambda b, sampling: log.append(("eager", sampling)) if not current else None

    def end_capture():
        return Graph(current[-1])

    def capture(b, sampling):
        current.append(sampling)
        try:
            return DecodeRunner._capture(r, b, sampling)
        finally:
            current.pop()

    engine.end_capture = end_capture
    r._capture = capture
    return r, bucket, log


def test_a_bucket_keeps_at_most_max_graphs_and_does_not_thrash() -> None:
    import numpy as np

    r, bucket, log = _capturing_runner(max_graphs=3)
    keys = [Sampling.of(0.5 + i / 10, None, None) for i in range(6)]

    def step(key):
        log.clear()
        r.step(np.array([0], np.int32), np.array([1], np.int32), key, np.zeros(1, np.uint64),
               np.zeros(1, np.uint64))
        return log[0][0]

    assert [step(k) for k in keys[:3]] == ["eager"] * 3  # a key's first step runs eagerly
    assert [step(k) for k in keys[:3]] == ["replay"] * 3  # its second is captured and replayed
    # Four keys in turn with room for three: the fourth stays eager, nothing is re-captured
    # (dropping the least recently used graph at each miss would capture at every step).
    seen = [step(k) for _ in range(10) for k in keys[:4]]
    assert seen == ["replay", "replay", "replay", "eager"] * 10
    assert list(bucket.graphs) == keys[:3]
    # Once the oldest graph has been idle for 4 * max_graphs of the bucket's steps, a new key
    # takes its place.
    for _ in range(12):
        assert step(keys[4]) in ("eager", "replay")
    assert keys[4] in bucket.graphs and len(bucket.graphs) == 3 and keys[0] not in bucket.graphs
    assert step(keys[0]) == "eager"  # dropped: eager once more, then captured when there is room
    for k in keys:
        step(k)
    assert len(bucket.graphs) <= 3 and len(bucket.eager) <= 12


@pytest.mark.parametrize("bad", [0, -1, 2.0, True, None])
def test_max_graphs_must_be_a_positive_integer(bad) -> None:
    from memra.errors import ContractError

    with pytest.raises(ContractError, match="max_graphs"):
        DecodeRunner(SimpleNamespace(engine=None), SimpleNamespace(max_batch=4), max_graphs=bad)


def test_a_step_with_a_token_that_holds_no_slot_enqueues_nothing() -> None:
    # The runner's host commit comes after the device step: a token the cache would refuse there
    # (released, or another cache's) must be refused before anything is enqueued.
    import numpy as np
    import pytest

    import memra

    r, bucket, log = _capturing_runner(max_graphs=3)
    with pytest.raises(memra.ContractError, match="not held by the owner token"):
        r.step(np.array([0], np.int32), np.array([1], np.int32), Sampling.of(0.5, None, None),
               np.zeros(1, np.uint64), np.zeros(1, np.uint64), owners=[7])
    assert log == [] and bucket.steps == 0
