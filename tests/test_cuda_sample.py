"""Sampling on the CUDA backend (``memra._core.sample`` with ``engine=memra.Engine("cuda")``,
kernels in cuda/sample.cu and cuda/sample_greedy.cu) against the same op on the CPU backend
(cpp/src/cpu/sample.cpp, the numeric oracle), plus the argument contract on the device.

The GPU reproduces the CPU's f32 arithmetic operation for operation (glibc's expf bit for bit,
every sum in cpu/sample.h's blocked order: L-block sums left to right, then the block sums left to
right): identical tokens (np.array_equal).

A small shape for ``compute-sanitizer --tool racecheck`` / ``--tool memcheck``:
``python -m pytest tests/test_cuda_sample.py -k sanitizer``.
"""

from __future__ import annotations

import numpy as np
import pytest

import memra
from memra import _core
from cuda_helpers import expect, f32, randn, rng

pytestmark = pytest.mark.cuda

ST = _core.status


# ---------------------------------------------------------------- sample


def sample_both(e, logits, ctr, **kw):
    want = _core.sample(logits, ctr, **kw)
    got = e.to_host(_core.sample(e.to_device(logits), e.to_device(ctr), engine=e, **kw))
    assert got.dtype == np.int32 and got.shape == want.shape
    return got, want


SAMPLE_CASES = [  # temperature, top_k, top_p
    (1.0, 0, 1.0), (0.7, 5, 1.0), (1.3, 0, 0.9), (0.9, 12, 0.6), (2.0, 1, 1.0), (0.5, 0, 1e-7),
    (1.0, 1000, 0.95), (0.05, 0, 0.5),
]


@pytest.mark.parametrize("temperature,top_k,top_p", SAMPLE_CASES)
@pytest.mark.parametrize("V", [1, 2, 101, 4097, 20000])
def test_sample_identical_tokens(e, V, temperature, top_k, top_p):
    r = rng(V + int(temperature * 100) + top_k)
    B = 48
    logits = randn(r, B, V, scale=3.0)
    for seed in (0, 77, 2**63 + 5):
        ctr = np.arange(seed % 1000, seed % 1000 + B, dtype=np.uint64) * np.uint64(3)
        got, want = sample_both(e, logits, ctr, temperature=temperature, top_k=top_k,
                                top_p=top_p, seed=seed)
        np.testing.assert_array_equal(got, want)


def test_sample_many_counters_one_row(e):
    # One row drawn 4096 times (counters 0..4095) in one batched call: every draw identical.
    r = rng(11)
    V = 300
    row = randn(r, 1, V, scale=2.0)
    logits = f32(np.repeat(row, 4096, axis=0))
    ctr = np.arange(4096, dtype=np.uint64)
    for kw in (dict(temperature=1.0), dict(temperature=0.8, top_k=40, top_p=0.9)):
        got, want = sample_both(e, logits, ctr, seed=123, **kw)
        np.testing.assert_array_equal(got, want)
        assert len(np.unique(got)) > 10


def test_sample_large_vocab(e):
    r = rng(12)
    B, V = 3, 160000
    logits = randn(r, B, V, scale=4.0)
    ctr = np.array([5, 2**40, 2**64 - 1], np.uint64)
    for kw in (dict(temperature=1.0), dict(temperature=0.6, top_p=0.9),
               dict(temperature=1.0, top_k=50), dict(temperature=1.5, top_k=100000, top_p=0.99)):
        got, want = sample_both(e, logits, ctr, seed=9, **kw)
        np.testing.assert_array_equal(got, want)


def test_sample_ties_quantised_logits(e):
    # Integer logits: many exactly equal probabilities, so (p desc, id asc) decides the order.
    r = rng(13)
    B, V = 64, 500
    logits = f32(r.integers(-3, 4, (B, V)))
    ctr = np.arange(B, dtype=np.uint64) + np.uint64(1000)
    for kw in (dict(temperature=1.0, top_k=7), dict(temperature=0.5, top_p=0.3),
               dict(temperature=1.0, top_k=150, top_p=0.8), dict(temperature=1e-3)):
        got, want = sample_both(e, logits, ctr, seed=4, **kw)
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("V", [511, 512, 513, 4095, 4096, 4097, 8192, 8193, 12289])
def test_sample_block_edges(e, V):
    # cpu/sample.h's blocks (kSampleBlock = 512) and the kernels' spans (8 blocks): V and k on and
    # around their edges, flat rows so the top-p cut and the draws land in later blocks; a few
    # rows without a distribution (argmax from span 0, every span's keys) or with one entry.
    r = rng(V + 7)
    B = 24
    logits = randn(r, B, V, scale=0.4)
    logits[0, :] = -np.inf
    logits[0, V - 1] = 0.5                  # a single finite entry, in the last block
    logits[1, V - 2] = np.nan               # NaN in the last span: argmax
    logits[2, :] = -np.inf                  # nothing finite: argmax = 0
    logits[3, :] = 2.0                      # all equal: p = 1 / V, ids in order
    logits[4, V // 2] = np.inf              # +inf: argmax
    ctr = np.arange(B, dtype=np.uint64) * np.uint64(7) + np.uint64(V)
    for kw in (dict(temperature=1.0), dict(temperature=0.8, top_p=0.9),
               dict(temperature=1.0, top_k=512), dict(temperature=1.0, top_k=513, top_p=0.99),
               dict(temperature=1.1, top_k=4096, top_p=0.95), dict(temperature=0.9, top_k=4097),
               dict(temperature=1.0, top_k=V - 1, top_p=0.999)):
        got, want = sample_both(e, logits, ctr, seed=21, **kw)
        np.testing.assert_array_equal(got, want)


def uniform_np(seed, counters):
    """cpu/sample.h uniform_from_counter over a uint64 array (numpy's uint64 arithmetic wraps)."""
    g = np.uint64(0x9E3779B97F4A7C15)
    with np.errstate(over="ignore"):
        z = np.uint64(seed) ^ (g * (counters + np.uint64(1)))
        z = z + g
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    z ^= z >> np.uint64(31)
    return (z >> np.uint64(40)).astype(np.float64) / float(1 << 24)


def test_sample_tail_row_later_blocks(e):
    # One large entry then tiny equal ones, each below half an ulp of a running sum near 1: only
    # the blocked order lets them add up (blocks 1.. sum their own terms from 0). The counters
    # with u near 1 draw from the tail (sorted position = id there), and top_p = 0.99996 cuts in
    # a later block; GPU and CPU must agree on every one.
    V, seed = 20000, 3
    row = np.full(V, -17.5, np.float32)
    row[0] = 0.0
    ctr_all = np.arange(1 << 20, dtype=np.uint64)
    u = uniform_np(seed, ctr_all)
    ctr = np.concatenate([ctr_all[u > 1 - 4e-4][:40], ctr_all[:24]])
    logits = f32(np.repeat(row[None], len(ctr), axis=0))
    for kw in (dict(temperature=1.0), dict(temperature=1.0, top_p=0.99996),
               dict(temperature=1.0, top_k=9000), dict(temperature=1.0, top_k=4100, top_p=0.99998)):
        got, want = sample_both(e, logits, ctr, seed=seed, **kw)
        np.testing.assert_array_equal(got, want)
        assert (got[:40] >= 512).sum() >= 5


def test_sample_greedy_and_degenerate_rows(e):
    r = rng(14)
    B, V = 8, 64
    logits = randn(r, B, V)
    logits[0, [3, 17]] = 9.0                # greedy tie: the lower id
    logits[1, :] = -np.inf                  # no distribution: argmax = 0
    logits[2, :] = -np.inf
    logits[2, 40] = 0.0                     # a single finite entry
    logits[3, 0] = np.nan                   # NaN at id 0: the CPU's argmax keeps 0
    logits[4, 5] = np.nan                   # NaN elsewhere: never wins
    logits[4, 6] = 7.0
    logits[5, 9] = np.inf                   # +inf: no distribution, argmax = the inf
    logits[6, :] = 1.5                      # all equal
    ctr = np.arange(B, dtype=np.uint64)
    for kw in (dict(temperature=0.0), dict(temperature=-1.0), dict(temperature=1.0),
               dict(temperature=0.7, top_k=3, top_p=0.5), dict(temperature=1.0, top_k=1)):
        got, want = sample_both(e, logits, ctr, seed=3, **kw)
        np.testing.assert_array_equal(got, want)
    got, _ = sample_both(e, logits, ctr, temperature=0.0)
    assert got[0] == 3 and got[1] == 0 and got[2] == 40 and got[3] == 0 and got[4] == 6
    assert got[5] == 9 and got[6] == 0


@pytest.mark.parametrize("V", [8193, 154880, 160001])
def test_sample_greedy_large_vocab_split(e, V):
    # V > 4 * 2048: greedy runs split over 2048-id blocks and one warp per row combines them
    # (cuda/sample.cu greedy_partial_kernel / greedy_final_kernel): the same ids as the CPU's
    # argmax, including ties across block boundaries, NaN rows and rows without a finite value.
    r = rng(15)
    B = 9
    logits = randn(r, B, V, scale=3.0)
    logits[0, [2047, 2048, V - 1]] = 50.0          # ties straddling a block edge: the lowest id
    logits[1, :] = -np.inf                          # nothing finite: 0
    logits[2, 0] = np.nan                           # NaN at id 0: the CPU keeps 0
    logits[3, 1::7] = np.nan                        # NaNs elsewhere never win
    logits[3, V - 2] = 60.0
    logits[4, :] = 1.25                             # all equal: 0
    logits[5, V - 1] = np.inf                       # +inf in the last (partial) block
    logits[6, 4095] = 70.0
    logits[6, 6144] = 70.0
    logits[7, :] = np.nan                           # all NaN: 0
    got, want = sample_both(e, logits, np.arange(B, dtype=np.uint64), temperature=0.0)
    np.testing.assert_array_equal(got, want)
    assert got[0] == 2047 and got[1] == 0 and got[2] == 0 and got[3] == V - 2
    assert got[4] == 0 and got[5] == V - 1 and got[6] == 4095 and got[7] == 0


def test_sample_contract_errors(e):
    r = rng(15)
    lh = randn(r, 3, 10)
    ch = np.arange(3, dtype=np.uint64)
    f = _core.sample

    def logits():  # fresh one-shot device arrays per call
        return e.to_device(lh)

    def ctr():
        return e.to_device(ch)

    expect(memra.ContractError, ST.CONTRACT_DEVICE, f, lh, ctr(), temperature=1.0, engine=e)
    expect(memra.ContractError, ST.CONTRACT_DEVICE, f, logits(), ch, temperature=1.0, engine=e)
    expect(memra.ContractError, ST.CONTRACT_DTYPE, f, logits(), e.to_device(ch.astype(np.int64)),
                    temperature=1.0, engine=e)
    expect(memra.ContractError, ST.CONTRACT_SHAPE, f, logits(), e.to_device(ch[:2].copy()), temperature=1.0,
                    engine=e)
    expect(memra.ContractError, ST.CONTRACT_VALUE, f, logits(), ctr(), temperature=1.0, top_p=0.0, engine=e)
    expect(memra.ContractError, ST.CONTRACT_VALUE, f, logits(), ctr(), temperature=float("nan"), engine=e)
    assert e.to_host(f(logits(), ctr(), temperature=1.0, engine=e)).shape == (3,)


# ---------------------------------------------------------------- non-finite flags


def nonfinite_rows(r, B, V):
    """logits [B, V] and the flags the CPU's definition gives: NaN / +inf / -inf placed at the
    first, a middle, the last id and in the middle of later spans / split chunks; finite rows
    (one near +-FLT_MAX) in between."""
    logits = randn(r, B, V, scale=3.0)
    bad = (np.nan, np.inf, -np.inf)
    spots = sorted({0, V // 2, V - 1, min(V - 1, 4096 + 3), min(V - 1, 2048 * 5 + 1)})
    k = 0
    for b in range(B):
        if b % 3 == 2:
            if b % 6 == 5:
                logits[b, 0], logits[b, V - 1] = 3.0e38, -3.0e38
            continue
        logits[b, spots[k % len(spots)]] = bad[k % 3]
        k += 1
    want = (~np.isfinite(logits).all(axis=1)).astype(np.int32)
    return logits, want


def flags_both(e, logits, ctr, **kw):
    B = logits.shape[0]
    want_flags = np.full(B, -1, np.int32)
    want = _core.sample(logits, ctr, nonfinite=want_flags, **kw)
    nf = e.to_device(np.full(B, -1, np.int32))
    got = e.to_host(_core.sample(e.to_device(logits), e.to_device(ctr), nonfinite=nf, engine=e, **kw))
    return got, want, e.to_host(nf), want_flags


@pytest.mark.parametrize("V", [1, 101, 4097, 8193, 20000, 154880])
@pytest.mark.parametrize("kw", [dict(temperature=0.0), dict(temperature=1.0, seed=4),
                                dict(temperature=0.7, top_k=40, top_p=0.9, seed=9)])
def test_sample_nonfinite_flags_vs_cpu(e, V, kw):
    # Greedy (one block per row up to V = 8192, split above) and sampled rows (the max kernel's
    # span flags ORed by the esum kernel): the CPU's flags, and the same tokens as without them.
    r = rng(V + 17)
    B = 12
    logits, want_flags = nonfinite_rows(r, B, V)
    ctr = np.arange(B, dtype=np.uint64) * np.uint64(7)
    got, want, flags, cpu_flags = flags_both(e, logits, ctr, **kw)
    np.testing.assert_array_equal(cpu_flags, want_flags)
    np.testing.assert_array_equal(flags, want_flags)
    np.testing.assert_array_equal(got, want)
    plain = e.to_host(_core.sample(e.to_device(logits), e.to_device(ctr), engine=e, **kw))
    np.testing.assert_array_equal(got, plain)  # the flag changes no draw
    seeds = np.arange(50, 50 + B, dtype=np.uint64)
    nf = e.to_device(np.full(B, -1, np.int32))
    got = e.to_host(_core.sample(e.to_device(logits), e.to_device(ctr), seeds=e.to_device(seeds),
                                 nonfinite=nf, engine=e, **kw))
    np.testing.assert_array_equal(got, _core.sample(logits, ctr, seeds=seeds, **kw))
    np.testing.assert_array_equal(e.to_host(nf), want_flags)


@pytest.mark.parametrize("V", [300, 20000])
@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_sample_nonfinite_flags_in_a_captured_graph(e, V, temperature):
    # The flags are written by the captured launches themselves: replays over new logits (copied
    # into the graph's input on the device) give each replay's flags, with no host step between.
    # nf and out are reset to -1 before every replay, so each check sees that replay's writes.
    B = 6
    dev_logits = e.to_device(np.zeros((B, V), np.float32))
    ctr = e.to_device(np.arange(B, dtype=np.uint64))
    nf = e.to_device(np.full(B, -1, np.int32))
    out = e.to_device(np.full(B, -1, np.int32))
    kw = dict(temperature=temperature, top_k=20, top_p=0.95, seed=3)
    # One eager call first, as DecodeRunner runs a bucket's first step (kernels loaded before the
    # capture); its flags go to an array of its own.
    warm = e.to_device(np.full(B, -1, np.int32))
    e.to_host(_core.sample(dev_logits, ctr, nonfinite=warm, engine=e, **kw))
    assert (e.to_host(warm) == 0).all()  # zero logits are finite
    e.begin_capture()
    try:
        tok = _core.sample(dev_logits, ctr, nonfinite=nf, engine=e, **kw)
        e.copy_into(out, tok)
        del tok
    except BaseException:
        e.abort_capture()
        raise
    g = e.end_capture()
    for trial in range(3):
        logits, want_flags = nonfinite_rows(rng(V + trial), B, V)
        if trial == 1:
            logits[:] = np.abs(logits)  # NaN stays NaN, -inf becomes +inf
            logits[np.isnan(logits)] = 1.0  # every row finite but the +inf ones
            want_flags = (~np.isfinite(logits).all(axis=1)).astype(np.int32)
        e.copy_into(dev_logits, e.to_device(logits))
        e.copy_into(nf, np.full(B, -1, np.int32))
        e.copy_into(out, np.full(B, -1, np.int32))
        g.replay()
        np.testing.assert_array_equal(e.to_host(nf), want_flags)
        np.testing.assert_array_equal(e.to_host(out), _core.sample(logits, np.arange(B, dtype=np.uint64), **kw))


def test_sample_nonfinite_contract_errors(e):
    lh = randn(rng(18), 3, 10)
    ch = np.arange(3, dtype=np.uint64)
    f = _core.sample
    kw = dict(temperature=1.0, engine=e)
    for bad, code in ((np.zeros(3, np.int32), ST.CONTRACT_DEVICE),
                      (e.to_device(np.zeros(3, np.int64)), ST.CONTRACT_DTYPE),
                      (e.to_device(np.zeros(4, np.int32)), ST.CONTRACT_SHAPE)):
        expect(memra.ContractError, code, f, e.to_device(lh), e.to_device(ch), nonfinite=bad, **kw)
    nf = e.to_device(np.full(3, -1, np.int32))
    expect(memra.ContractError, ST.CONTRACT_VALUE, f, e.to_device(lh), e.to_device(ch), nonfinite=nf,
           top_p=0.0, **kw)
    assert (e.to_host(nf) == -1).all()  # nothing written on an error


# ---------------------------------------------------------------- NonFiniteError through generation


def _cuda_model(path, dtype):
    return memra.load(path, device="cuda", dtype=dtype, max_batch=4, max_len=64, progress=False)


def _nan_setup(tmp_path, dtype):
    """(ref, m, prompt, first): the embedded checkpoint and a copy whose embedding row `first` is
    NaN, where `first` is the greedy first token after `prompt` (not in it), so m's logits after
    the prompt are finite and feeding `first` makes that row's next logits NaN."""
    from nan_checkpoint import nan_embedding_row

    ref = _cuda_model(memra.default_checkpoint(), dtype)
    for prompt in ([5, 6, 7], [3, 4], [12, 13, 14, 15], [20, 21]):
        first = ref.generate(prompt, 1, ignore_eos=True)[0]
        if first not in prompt:
            return ref, _cuda_model(nan_embedding_row(tmp_path, first), dtype), prompt, first
    pytest.skip("every candidate prompt holds its own greedy first token")


def _feeds(prompt, toks, first):
    """Whether a sequence feeds `first` before its last token (its prompt or a drawn token)."""
    return first in list(prompt) + list(toks[:-1])


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_nan_model_ends_generation_with_nonfinite_error(tmp_path, dtype):
    # A checkpoint whose embedding row `first` is NaN: the prompt's logits are finite (first is
    # drawn), feeding `first` makes that row's next logits NaN, which the sampler flags inside
    # the decode step. generate / stream / generate_batch raise NonFiniteError, the finite rows'
    # tokens are those of the unmodified model, and the model stays usable. Greedy rows (the
    # argmax kernels) and sampled rows (temperature > 0 with top_k = 1: the sampling kernels, and
    # the same draws as greedy whatever the seed). The first decode step of a bucket and key runs
    # eagerly (generate), the next is captured and replayed (stream): both flag.
    from nan_checkpoint import nan_final_norm

    from memra.decode_graph import Sampling

    ref, m, prompt, first = _nan_setup(tmp_path, dtype)
    others = [[1, 2], [9, 10, 11], [30, 31]]
    runner = m._runner
    assert runner is not None and runner.nonfinite_flags
    for kw in (dict(), dict(temperature=0.7, top_k=1, seed=11)):
        assert ref.generate(prompt, 1, ignore_eos=True, **kw) == [first]
        key = Sampling.of(kw.get("temperature", 0.0), kw.get("top_k"), kw.get("top_p"))
        with pytest.raises(memra.NonFiniteError) as info:
            m.generate(prompt, 5, ignore_eos=True, **kw)  # the bucket's first step: eager
        assert info.value.code == memra.errors.NON_FINITE == 60001
        assert "sequence 0" in str(info.value)
        got = []
        with pytest.raises(memra.NonFiniteError):
            for t in m.stream(prompt, 5, ignore_eos=True, **kw):  # captured, then replayed
                got.append(t)
        assert got == [first]
        assert key in runner._buckets[1].graphs, "the flagged step did not run from a graph"
        assert all(m.cache.owner(s) == 0 for s in range(4))
        want_others = ref.generate_batch(others, 4, ignore_eos=True, **kw)
        if not any(_feeds(p, w, first) for p, w in zip(others, want_others)):
            assert m.generate_batch(others, 4, ignore_eos=True, **kw) == want_others
            with pytest.raises(memra.NonFiniteError) as info:  # bucket 4: a replayed graph
                m.generate_batch([others[0], prompt, others[2]], 4, ignore_eos=True, **kw)
            assert "sequence 1" in str(info.value)
            assert m.generate_batch(others, 4, ignore_eos=True, **kw) == want_others  # still usable
        assert all(m.cache.owner(s) == 0 for s in range(4))
    dead = _cuda_model(nan_final_norm(tmp_path), dtype)
    with pytest.raises(memra.NonFiniteError):  # the prompt's own logits: no first token
        dead.generate([1, 2], 3)
    assert dead.cache.owner(0) == 0


def test_nan_rows_of_several_sampling_keys(tmp_path):
    # Rows with different samplings in one step draw after it, one sampling launch per key, each
    # with its own flags (memra.batch.DecodeBatch._launch_device): the greedy row fed `first` is
    # flagged, the other (temperature > 0, top_k = 1: the greedy draw through the sampling
    # kernels, so a rounding difference from batching cannot change it) gets its token.
    from memra.batch import DecodeBatch, RowSampling

    ref, m, prompt, first = _nan_setup(tmp_path, "float32")
    other = [1, 2]
    want = ref.generate(other, 2, ignore_eos=True)
    if _feeds(other, want, first):
        pytest.skip("the other row feeds the NaN embedding row too")
    batch = DecodeBatch(m)
    leases = m.take_slots(2)
    try:
        a = batch.start(np.array(prompt, np.int32), RowSampling(0.0, None, None, 0), leases[0])
        b = batch.start(np.array(other, np.int32), RowSampling(0.8, 1, None, 5), leases[1])
        assert a.last == first and b.last == want[0]
        handle = batch.launch([a, b])
        assert handle.flags is not None and len(handle.flags) == 2  # one flag read per key
        res = {id(r): x for r, x in batch.collect(handle)}
        assert isinstance(res[id(a)], memra.NonFiniteError)
        assert res[id(b)] == want[1]
    finally:
        for lease in leases:
            lease.release()
    assert m.generate(other, 2, ignore_eos=True) == want  # still usable


# ---------------------------------------------------------------- sanitizer-sized


def test_sanitizer_small_shapes(e):
    """One small call of sample (for compute-sanitizer racecheck / memcheck)."""
    r = rng(16)
    s = _core.sample(e.to_device(randn(r, 2, 5000)), e.to_device(np.arange(2, dtype=np.uint64)),
                     temperature=1.0, top_p=0.9, engine=e)
    assert e.to_host(s).shape == (2,)
