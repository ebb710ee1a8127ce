"""Decode steps replayed from CUDA graphs (memra.decode_graph, docs/decode_graphs.md) against the
same steps run eagerly, on the tiny glm5_next checkpoints (marked cuda).

Both models run the same kernels on the same bucket-padded buffers, so every comparison here is
byte-exact (np.array_equal): a kernel missing from the graph, a table built on the host and
baked into it, or a position read on the host would show as a difference at the next step.
The prompts cross k-pool boundaries and the DSA selection (topk 8 = 2 pools of 4) during the
steps; three sequences in a bucket of four leave one idle row, and a fourth slot holding its own
prompt must come out untouched.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import memra
from memra import _core
from memra.errors import ContractError, UnsupportedError

pytestmark = pytest.mark.cuda

ROOT = Path(__file__).resolve().parents[1]
BF16_DIR = ROOT / "tests" / "fixtures" / "tiny_glm5_next_bf16"
PROMPTS = [[3, 17, 5, 9, 200, 41, 7, 7, 12], [11, 2, 98, 31, 4, 4, 60, 5, 19, 23, 71, 8, 1], [90, 14, 6, 33, 2]]
IDLE_PROMPT = [5, 6, 7, 8, 9, 10]
STEPS = 8


def _load(graphs: bool, dtype: str, options: memra.KernelOptions | None = None) -> memra.Model:
    path = memra.default_checkpoint() if dtype == "float32" else BF16_DIR
    return memra.load(path, device="cuda", dtype=dtype, max_batch=4, max_len=64, progress=False,
                      cuda_graphs=graphs, kernel_options=options)


@pytest.fixture(scope="module", params=["float32", "bfloat16"])
def pair(request):
    return _load(True, request.param), _load(False, request.param)


@pytest.fixture(scope="module")
def alike(pair):
    """For comparing a row decoded alone (B = 1) with the same row decoded in a batch, token for
    token: a graph model whose batched steps round as its one-row steps do, up to summation order.
    float32: the pair's graph model. bfloat16: the checkpoint with
    KernelOptions(moe_tensor_cores=False); the default runs a batch's routed experts on tensor
    cores (x and h rounded to bf16, docs/ffn.md) while one row keeps the per-pair kernels, so a
    sampled token may differ between the two wherever two candidates lie within that rounding."""
    graph, _ = pair
    if graph.dtype == "float32":
        return graph
    return _load(True, "bfloat16", memra.KernelOptions(moe_tensor_cores=False))


def _state(m: memra.Model, slot: int) -> list[np.ndarray]:
    """Every plane of `slot` as host arrays (recurrent state, conv ring, latent rows, pool keys)."""
    c, out = m.cache, [np.array([m.cache.length(slot)])]
    for i, spec in enumerate(m.net.state_specs()):
        if spec.kind == "kda":
            out += [c.kda_state(i, slot), c.kda_conv(i, slot)]
        else:
            out.append(np.asarray(c.latent_rows(i, slot)))
            if m.net.plan[i].options.get("indexer") == "full":
                out.append(c.pool_keys(i, slot))
    return out


def _run(m: memra.Model, steps: int = STEPS):
    """Prefill the three prompts (slots 0-2) and the idle prompt (slot 3), then greedy decode
    steps over slots 0-2 only; returns the logits of every step and the final tokens."""
    c = m.cache
    for s in range(4):
        c.free(s)
    firsts = [m.prefill(c, s, p) for s, p in enumerate(PROMPTS)]
    m.prefill(c, 3, IDLE_PROMPT)
    toks = [int(np.argmax(f)) for f in firsts]
    logits = []
    for _ in range(steps):
        lg = m.decode(c, [0, 1, 2], toks)
        logits.append(lg)
        toks = [int(t) for t in np.argmax(lg, axis=1)]
    return logits, toks


def test_replay_equals_eager_bytes(pair) -> None:
    graph, eager = pair
    lg_g, _ = _run(graph)
    lg_e, _ = _run(eager)
    # The graph model captured its bucket-4 step and replayed it from the second step on.
    assert graph._runner._buckets[4].graphs, "no graph was captured"
    assert not eager._runner._buckets[4].graphs
    for step, (a, b) in enumerate(zip(lg_g, lg_e)):
        assert np.array_equal(a, b), f"step {step}: replayed logits differ from eager"
    for s in range(4):
        for k, (a, b) in enumerate(zip(_state(graph, s), _state(eager, s))):
            assert np.array_equal(a, b), f"slot {s} plane {k}: replayed cache differs from eager"
        assert graph.cache.length(s) == eager.cache.length(s)
    # The device mirrors followed the host's view.
    assert np.array_equal(graph.cache.device_lengths(), np.array([graph.cache.length(s) for s in range(4)]))
    assert np.array_equal(graph.cache.device_cur(), np.array([graph.cache.cur(s) for s in range(4)]))


def test_idle_rows_and_other_slots_untouched(pair) -> None:
    graph, _ = pair
    c = graph.cache
    for s in range(4):
        c.free(s)
    for s, p in enumerate(PROMPTS):
        graph.prefill(c, s, p)
    graph.prefill(c, 3, IDLE_PROMPT)
    before = _state(graph, 3)
    toks = [1, 2, 3]
    for _ in range(4):
        toks = [int(t) for t in np.argmax(graph.decode(c, [0, 1, 2], toks), axis=1)]
    for k, (a, b) in enumerate(zip(before, _state(graph, 3))):
        assert np.array_equal(a, b), f"idle slot 3 plane {k} changed"
    # One row in a bucket of one, then back to the bucket of four with another slot order.
    graph.decode(c, [1], [toks[1]])
    graph.decode(c, [2, 0, 1], [toks[2], toks[0], toks[1]])
    assert [c.length(s) for s in range(4)] == [len(PROMPTS[0]) + 5, len(PROMPTS[1]) + 6,
                                               len(PROMPTS[2]) + 5, len(IDLE_PROMPT)]


def test_decode_is_bit_identical_run_to_run(pair) -> None:
    graph, _ = pair
    a, ta = _run(graph)
    b, tb = _run(graph)
    assert ta == tb
    for x, y in zip(a, b):
        assert np.array_equal(x, y)


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_generation_through_graph_equals_eager(pair, alike, temperature: float) -> None:
    graph, eager = pair
    for m in pair:  # slots the earlier tests prefilled by hand are the user's: generation never takes them
        for s in range(m.cache.max_batch):
            m.cache.free(s)
    kw = dict(max_new_tokens=10, temperature=temperature, top_k=20, top_p=0.9, seed=7, ignore_eos=True)
    got = graph.generate_batch(PROMPTS, **kw)
    want = eager.generate_batch(PROMPTS, **kw)
    assert got == want
    assert graph.generate(PROMPTS[1], **kw) == eager.generate(PROMPTS[1], **kw)
    # generate_batch's contract: prompt i equals generate(prompt i, seed + i) (see `alike`).
    one = dict(kw, seed=kw["seed"] + 2)
    batch = got if alike is graph else alike.generate_batch(PROMPTS, **kw)
    assert batch[2] == alike.generate(PROMPTS[2], **one)


def test_copy_into_refuses_overlapping_device_views(e) -> None:
    """Engine.copy_into between two device views that share bytes (undefined for an async
    device copy) is CONTRACT_VALUE naming src and dst; the same array, and disjoint views of one
    buffer, copy."""
    torch = pytest.importorskip("torch")
    x = torch.arange(8, dtype=torch.float32, device=e.device)
    torch.cuda.synchronize()  # torch's stream, then the engine's
    with pytest.raises(ContractError) as info:
        e.copy_into(x[0:4], x[2:6])
    assert info.value.code == _core.status.CONTRACT_VALUE
    assert "'src'" in str(info.value) and "'dst'" in str(info.value)
    e.copy_into(x[0:4], x[4:8])
    e.copy_into(x, x)
    e.synchronize()
    assert x.tolist() == [4, 5, 6, 7, 4, 5, 6, 7]


def test_capture_refuses_host_copies_and_recovers(e) -> None:
    x = e.to_device(np.ones((2, 8), np.float32))
    w = e.to_device(np.ones(8, np.float32))
    e.begin_capture()
    assert e.capturing
    try:
        with pytest.raises(UnsupportedError) as info:
            e.to_device(np.zeros(4, np.float32))
        assert info.value.code == 50003
        with pytest.raises(UnsupportedError):
            e.to_host(x)
        with pytest.raises(ContractError):
            e.begin_capture()
    finally:
        e.abort_capture()
    assert not e.capturing
    # The engine works after the aborted capture, and a captured op replays.
    out = e.to_device(np.zeros((2, 8), np.float32))
    e.begin_capture()
    y = _core.rms_norm(x, w, eps=1e-5, engine=e)
    e.copy_into(out, y)
    del y
    g = e.end_capture()
    assert np.array_equal(e.to_host(out), np.zeros((2, 8), np.float32))  # recorded, not run
    g.replay()
    want = _core.rms_norm(np.ones((2, 8), np.float32), np.ones(8, np.float32), eps=1e-5)
    np.testing.assert_allclose(e.to_host(out), want, rtol=1e-6)
    with pytest.raises(ContractError):
        e.end_capture()


def test_decode_slots_validation(pair) -> None:
    graph, _ = pair
    c = graph.cache
    ds = _core.DecodeSlots(c, 4)
    assert list(ds.slots) == [-1, -1, -1, -1]
    ds.set(np.array([2, 0], np.int32))
    assert list(ds.slots) == [2, 0, -1, -1] and ds.active == 2
    for bad, code in (([0, 0], 40025), ([4], 40023), ([-1], 40023), ([0, 1, 2, 3, 0], 40000)):
        with pytest.raises(ContractError) as info:
            ds.set(np.array(bad, np.int32))
        assert info.value.code == code
        assert list(ds.slots) == [2, 0, -1, -1]  # unchanged by the refusal
    with pytest.raises(ContractError):
        _core.DecodeSlots(c, 0)
    other = graph.new_cache(2, 16)
    with pytest.raises(ContractError):
        other.commit_decode(ds)
    cpu = memra.load(memra.default_checkpoint(), max_batch=2, max_len=16, progress=False)
    with pytest.raises(UnsupportedError):
        _core.DecodeSlots(cpu.cache, 2)


def test_to_host_async_reads_behind_earlier_work_only(e) -> None:
    a = e.to_device(np.arange(1000, dtype=np.int32))
    r = e.to_host_async(a)
    e.copy_into(a, np.zeros(1000, np.int32))  # enqueued after the read: must not show in it
    assert np.array_equal(r.wait(), np.arange(1000))
    assert np.array_equal(e.to_host(a), np.zeros(1000))
    # Slots are reused READ_SLOTS reads later: the oldest ticket is then refused, not misread.
    reads = [e.to_host_async(a) for _ in range(_core.Engine.READ_SLOTS + 1)]
    with pytest.raises(ContractError) as info:
        reads[0].wait()
    assert info.value.code == 40025
    assert np.array_equal(reads[-1].wait(), np.zeros(1000))
    with pytest.raises(ContractError) as info:
        e.to_host_async(e.to_device(np.zeros(64 * 1024 // 4 + 1, np.float32)))
    assert info.value.code == 40000
    e.begin_capture()
    try:
        with pytest.raises(UnsupportedError) as info:
            e.to_host_async(a)
        assert info.value.code == 50003
    finally:
        e.abort_capture()


def _one_step_at_a_time(m: memra.Model, prompts, n: int, stops: set[int], kw) -> list[list[int]]:
    """generate_batch's tokens from unpipelined steps (Model._decode_sampled: each waits for its
    tokens before the next is launched)."""
    c = m.cache
    slots = list(range(len(prompts)))
    out = []
    for s, p in zip(slots, prompts):
        c.free(s)
        out.append([m._pick(m._prefill(c, s, p), 0, kw["temperature"], kw["top_k"], kw["top_p"],
                            kw["seed"] + s, 0)])
    active = [i for i in slots if out[i][-1] not in stops]
    step = 0
    while active:
        step += 1
        toks = m._decode_sampled(active, [out[i][-1] for i in active], kw["temperature"], kw["top_k"],
                                 kw["top_p"], [kw["seed"] + i for i in active], step)
        for i, t in zip(active, toks):
            out[i].append(t)
        active = [i for i in active if out[i][-1] not in stops and len(out[i]) < n]
    for s in slots:
        c.free(s)
    return out


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_pipelined_generation_equals_one_step_at_a_time(alike, temperature: float) -> None:
    # Chained steps (ids drawn on the device), rows leaving the batch at a stop token with a step
    # already in flight, and at max_new_tokens, against steps that each wait for their tokens.
    # A row's batch can shrink to one row in one run and not in the other, and the last check
    # decodes a prompt alone: the `alike` model.
    graph = alike
    kw = dict(temperature=temperature, top_k=20, top_p=0.9, seed=7)
    free = _one_step_at_a_time(graph, PROMPTS, 10, set(), kw)
    assert graph.generate_batch(PROMPTS, 10, ignore_eos=True, **kw) == free
    stop = free[1][4]
    want = _one_step_at_a_time(graph, PROMPTS, 10, {stop}, kw)
    assert want[1][-1] == stop and len(want[1]) <= 5
    assert graph.generate_batch(PROMPTS, 10, stop_token_ids=[stop], ignore_eos=True, **kw) == want
    assert graph.generate(PROMPTS[1], 10, stop_token_ids=[stop], ignore_eos=True, **dict(kw, seed=8)) == want[1]


def test_interleaved_streams_through_graphs(pair) -> None:
    # Two streams of one bucket size advanced alternately: each one's chained step (ids drawn on
    # the device) must not follow the other stream's step, so after a foreign step a stream waits
    # for its token and uploads it. Both give their own generate()'s tokens.
    graph, _ = pair
    for s in range(graph.cache.max_batch):  # slots earlier tests prefilled by hand are the user's
        graph.cache.free(s)
    kw = dict(temperature=0.8, top_k=20, top_p=0.9, ignore_eos=True)
    want = [graph.generate(PROMPTS[0], 9, seed=3, **kw), graph.generate(PROMPTS[1], 9, seed=4, **kw)]
    a = graph.stream(PROMPTS[0], 9, seed=3, **kw)
    b = graph.stream(PROMPTS[1], 9, seed=4, **kw)
    got = [[], []]
    for _ in range(9):
        got[0].append(next(a))
        got[1].append(next(b))
    assert got == want


def test_many_streams_consumed_in_turn_share_the_readback_slots() -> None:
    # Twelve streams advanced in turn leave more reads pending than the engine's READ_SLOTS
    # readback slots; each read once kept its slot until its stream collected it, so the 32nd
    # later read reused it (ContractError from next(), the stream's tokens lost). The reads now
    # go through one window per model that waits for the oldest first. Each stream gives its
    # own generate()'s tokens.
    m = memra.load(memra.default_checkpoint(), device="cuda", max_batch=12, max_len=64, progress=False)
    kw = dict(temperature=0.8, top_k=20, top_p=0.9, ignore_eos=True)
    prompts = [[3 + i, 17, 5 + 2 * i] for i in range(12)]
    want = [m.generate(p, 8, seed=i, **kw) for i, p in enumerate(prompts)]
    streams = [m.stream(p, 8, seed=i, **kw) for i, p in enumerate(prompts)]
    got = [[] for _ in prompts]
    for _ in range(8):
        for i, s in enumerate(streams):
            got[i].append(next(s))
    assert got == want


def test_a_failed_step_leaves_no_chain_to_another_stream() -> None:
    # Stream a (slot 0) has a chained step in flight; stream b's first decode step on the same
    # bucket uploads b's slot and ids and then fails (here: its eager step raises). The bucket's
    # chain used to survive the failure, so a's next chained step decoded b's slot with b's ids.
    m = memra.load(memra.default_checkpoint(), device="cuda", max_batch=4, max_len=64, progress=False)
    kw = dict(top_k=20, top_p=0.9, ignore_eos=True)
    want = m.generate(PROMPTS[0], 10, temperature=0.8, seed=3, **kw)
    a = m.stream(PROMPTS[0], 10, temperature=0.8, seed=3, **kw)
    got = [next(a), next(a)]
    runner = m._runner
    real = runner._body

    def fail_once(b, sampling):
        runner._body = real
        raise KeyboardInterrupt("injected into b's step")

    runner._body = fail_once  # b's sampling (another temperature) has no graph yet: an eager step
    b = m.stream(PROMPTS[1], 10, temperature=0.5, seed=4, **kw)
    with pytest.raises(KeyboardInterrupt):
        next(b)
        next(b)
    b.close()
    got += list(a)
    assert got == want
