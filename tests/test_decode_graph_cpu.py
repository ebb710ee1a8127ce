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
