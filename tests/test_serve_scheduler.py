"""memra.serve.scheduler without HTTP: continuous batching over the model's cache slots.

Each request's tokens must equal Model.generate's for it alone (a separately loaded model),
among 32 concurrent requests of mixed lengths and samplings on 8 slots; also through the CUDA
branch of memra.batch (chained steps, rows of several samplings in one step) run here with a CPU
stand-in for the decode runner. Admissions interleave with decode steps; cancelled requests free
their slots at once; a full queue refuses.
"""

from __future__ import annotations

import asyncio
import sys
import threading
import time

import numpy as np
import pytest

import memra
from cpu_runner import CpuRunner
from memra.batch import RowSampling
from memra.serve.scheduler import QueueFullError, Request, Scheduler


def _load(max_batch: int, max_len: int = 96) -> memra.Model:
    return memra.load(memra.default_checkpoint(), max_batch=max_batch, max_len=max_len, progress=False)


def _jobs(n: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        prompt = [int(t) for t in rng.integers(0, 256, int(rng.integers(1, 30)))]
        s = [RowSampling(0.0), RowSampling(0.8, 20, None), RowSampling(1.1, None, 0.9),
             RowSampling(0.6, 5, 0.7)][i % 4]
        out.append((prompt, int(rng.integers(1, 20)), RowSampling(s.temperature, s.top_k, s.top_p, 1000 + i)))
    return out


def _request(prompt, n, sampling, stop=()) -> Request:
    return Request(prompt_ids=np.array(prompt, np.int32), max_tokens=n, sampling=sampling, stop_ids=frozenset(stop))


async def _tokens(req: Request, deadline: float = 30.0) -> list[int]:
    out = []
    while True:
        ev = await asyncio.wait_for(req.events.get(), deadline)
        if isinstance(ev, Exception):
            raise ev
        out.append(ev[0])
        if ev[1] is not None:
            return out


def _hold_in_decode(sched: Scheduler):
    """(gate, inside): the engine thread sets `inside` when it enters a decode step and waits
    there until `gate` is set (10 s at most), so a test acts while a step is in flight."""
    gate, inside = threading.Event(), threading.Event()
    decode = sched._decode

    def held_decode(pending, events):
        inside.set()
        gate.wait(10)
        return decode(pending, events)

    sched._decode = held_decode
    return gate, inside


def _run(sched: Scheduler, body):
    async def main():
        sched.start()
        try:
            return await body()
        finally:
            sched.stop()
    return asyncio.run(main())


def _run_queued(sched: Scheduler, reqs: list[Request]) -> list[list[int]]:
    """Every request submitted before the engine thread starts (no race for round 1), then
    each one's tokens."""
    async def main():
        for r in reqs:
            sched.submit(r)
        sched.start()
        try:
            return await asyncio.gather(*(_tokens(r) for r in reqs))
        finally:
            sched.stop()
    return asyncio.run(main())


def _log_rounds(sched: Scheduler) -> list[str]:
    """The engine's admissions ("prefill") and decode steps ("stepN" for N rows), in order."""
    log = []
    start, launch = sched.batch.start, sched.batch.launch
    sched.batch.start = lambda *a, **k: (log.append("prefill"), start(*a, **k))[1]
    sched.batch.launch = lambda rows, *a: (log.append(f"step{len(rows)}"), launch(rows, *a))[1]
    return log


@pytest.mark.parametrize("runner", ["cpu", "cuda_branch"])
def test_32_concurrent_requests_equal_generate(runner: str) -> None:
    ref = _load(1)
    m = _load(8)
    if runner == "cuda_branch":
        m._runner = CpuRunner(m)
    jobs = _jobs(32)
    stop = {ref.generate(jobs[5][0], 3, ignore_eos=True)[2]}  # one request ends on a stop id
    sched = Scheduler(m, max_waiting=64)
    steps = []
    sched.on_step = steps.append

    async def body():
        reqs = [_request(p, n, s, stop if i == 5 else ()) for i, (p, n, s) in enumerate(jobs)]
        for r in reqs:
            sched.submit(r)
        return await asyncio.gather(*(_tokens(r) for r in reqs))

    got = _run(sched, body)
    for i, ((p, n, s), g) in enumerate(zip(jobs, got)):
        want = ref.generate(p, n, temperature=s.temperature, top_k=s.top_k, top_p=s.top_p, seed=s.seed,
                            ignore_eos=True, stop_token_ids=list(stop) if i == 5 else None)
        assert g == want, (i, p, n, s)
    assert max(steps) == 8  # requests were decoded together
    assert all(m.cache.owner(s) == 0 and m.cache.length(s) == 0 for s in range(8))


def test_chained_steps_while_the_batch_stays_the_same() -> None:
    # One sampling key (seeds differ): the CUDA branch chains each step before reading the
    # previous one's tokens, and rows ending with a step in flight drop its draw.
    ref = _load(1)
    m = _load(4)
    m._runner = CpuRunner(m)
    jobs = [([3 + i, 17, 5, 9][: 1 + i], 6 + 3 * i, RowSampling(0.8, 20, 0.9, 50 + i)) for i in range(4)]
    sched = Scheduler(m)

    async def body():
        reqs = [_request(p, n, s) for p, n, s in jobs]
        for r in reqs:
            sched.submit(r)
        return await asyncio.gather(*(_tokens(r) for r in reqs))

    got = _run(sched, body)
    for (p, n, s), g in zip(jobs, got):
        assert g == ref.generate(p, n, temperature=0.8, top_k=20, top_p=0.9, seed=s.seed, ignore_eos=True)
    assert m._runner.chained_steps > 5
    assert all(m.cache.owner(s) == 0 and m.cache.length(s) == 0 for s in range(4))


def test_prefill_is_interleaved_with_decode_steps() -> None:
    m = _load(4)
    sched = Scheduler(m, prefill_budget=1)  # one admission per round while others decode
    log = _log_rounds(sched)

    async def body():
        reqs = [_request([1 + i, 2, 3], 6, RowSampling(0.0)) for i in range(3)]
        for r in reqs:
            sched.submit(r)
        await asyncio.gather(*(_tokens(r) for r in reqs))

    _run(sched, body)
    assert log[:5] == ["prefill", "step1", "prefill", "step2", "prefill"], log


def test_cancel_frees_the_slot_and_a_full_queue_refuses() -> None:
    m = _load(1, max_len=512)
    sched = Scheduler(m, max_waiting=1)

    async def body():
        long = _request([1, 2, 3], 500, RowSampling(0.0))
        sched.submit(long)
        await asyncio.wait_for(long.events.get(), 10)  # it runs
        queued = _request([4], 2, RowSampling(0.0))
        sched.submit(queued)
        with pytest.raises(QueueFullError):
            sched.submit(_request([5], 2, RowSampling(0.0)))
        sched.cancel(long)
        assert await _tokens(queued) == _load(1).generate([4], 2)  # it got the slot back
        end = time.monotonic() + 10
        while sched.running or sched.slots_in_use():
            assert time.monotonic() < end
            await asyncio.sleep(0.01)
        assert long.done and m.cache.owner(0) == 0

    _run(sched, body)


def test_a_cancelled_waiting_request_leaves_the_queue_at_once() -> None:
    """A waiting request cancelled while the engine thread is inside a long step (a decode of a
    full batch, a big prefill) stops counting toward max_waiting at once: a new request is
    queued, not refused with a 429 until the engine's next round."""
    m = _load(1, max_len=512)
    sched = Scheduler(m, max_waiting=1)
    gate, inside = _hold_in_decode(sched)

    async def body():
        long = _request([1, 2, 3], 500, RowSampling(0.0))
        sched.submit(long)
        await asyncio.wait_for(long.events.get(), 10)  # admitted: its first token
        assert await asyncio.to_thread(inside.wait, 10)
        queued = _request([4], 2, RowSampling(0.0))
        sched.submit(queued)
        sched.cancel(queued)
        assert sched.waiting == 0
        third = _request([5], 2, RowSampling(0.0))
        try:
            sched.submit(third)  # before: QueueFullError, the cancelled one still counted
        finally:
            sched.cancel(long)
            gate.set()
        assert await _tokens(third) == _load(1).generate([5], 2)
        assert not queued.events.qsize()  # a cancelled request gets no events

    _run(sched, body)


def test_stop_fails_requests_in_flight() -> None:
    m = _load(1, max_len=512)
    sched = Scheduler(m)
    reqs = []

    async def body():
        reqs.extend([_request([1, 2], 500, RowSampling(0.0)), _request([3], 5, RowSampling(0.0))])
        for r in reqs:
            sched.submit(r)
        await asyncio.wait_for(reqs[0].events.get(), 10)

    _run(sched, body)
    assert m.cache.owner(0) == 0 and not sched.running and not sched.waiting
    assert all(r.done or r.events.qsize() for r in reqs)


@pytest.mark.parametrize("where", ["start", "take_free_slots"])
def test_a_failing_admission_fails_that_request_only(where: str, monkeypatch) -> None:
    # An exception that is not a MemraError while a request is admitted (a bug) used to leave it
    # in neither queue: its client waited forever and the running count stayed one too high. It
    # now fails that request with an "internal error" MemraError; the next one runs.
    import memra.serve.scheduler as sched_mod

    m = _load(1)
    sched = Scheduler(m)
    calls = {"n": 0}
    if where == "start":
        real = sched.batch.start

        def flaky(*a, **k):
            calls["n"] += 1
            if calls["n"] == 1:
                raise RuntimeError("boom")
            return real(*a, **k)
        monkeypatch.setattr(sched.batch, "start", flaky)
    else:
        real = sched_mod.take_free_slots

        def flaky(*a, **k):
            calls["n"] += 1
            if calls["n"] == 1:
                raise RuntimeError("boom")
            return real(*a, **k)
        monkeypatch.setattr(sched_mod, "take_free_slots", flaky)

    async def body():
        bad, good = _request([1, 2], 3, RowSampling(0.0)), _request([4], 2, RowSampling(0.0))
        sched.submit(bad)
        ev = await asyncio.wait_for(bad.events.get(), 10)
        assert isinstance(ev, memra.MemraError) and "internal error: boom" in str(ev)
        assert bad.done and sched.running == 0
        sched.submit(good)
        assert await _tokens(good) == _load(1).generate([4], 2)

    _run(sched, body)
    assert not sched.running and m.cache.owner(0) == 0


def test_a_slot_held_outside_the_server_is_one_warning_not_a_flood(caplog) -> None:
    # A slot held outside the server (a user's cache.hold or generation on the same model)
    # used to log "no free slot" on every round it blocked an admission: a hundred warnings a
    # second while idle, one per decode step while others ran. It is logged once per stall.
    import logging

    m = _load(1)
    sched = Scheduler(m)
    token = m.cache.hold(0)

    async def body():
        req = _request([1, 2], 3, RowSampling(0.0))
        sched.submit(req)
        await asyncio.sleep(0.3)  # some thirty rounds find no free slot
        assert req.events.empty() and sched.waiting == 1
        m.cache.release(0, token)
        return await _tokens(req)

    with caplog.at_level(logging.WARNING, logger="memra.serve"):
        got = _run(sched, body)
    assert got == _load(1).generate([1, 2], 3)
    warned = [r for r in caplog.records if "no free slot" in r.getMessage()]
    assert len(warned) == 1, len(warned)


def test_a_full_server_queues_without_trying_an_admission(caplog) -> None:
    # While every slot runs one of the server's own requests, a waiting request waits for one of
    # them to finish: admitting it then would find no free slot and log the warning meant for a
    # slot held outside the server. Each request still gets its max_tokens tokens (no stop ids).
    import logging

    sched = Scheduler(_load(1))

    async def body():
        a, b = _request([1, 2], 6, RowSampling(0.0)), _request([3], 2, RowSampling(0.0))
        sched.submit(a)
        sched.submit(b)
        return await _tokens(a), await _tokens(b)

    with caplog.at_level(logging.WARNING, logger="memra.serve"):
        got = _run(sched, body)
    assert [len(t) for t in got] == [6, 2]
    assert not [r for r in caplog.records if "no free slot" in r.getMessage()]


@pytest.mark.parametrize("budget,want", [
    (3, ["prefill", "step1", "prefill", "step2", "prefill", "step3"]),  # one 3-token prompt a round
    (6, ["prefill", "prefill", "step2", "prefill", "step3"]),           # two: the budget spent exactly
    (5, ["prefill", "prefill", "step2", "prefill", "step3"]),           # the second prompt passes it
])
def test_the_prefill_budget_is_spent_exactly(budget, want) -> None:
    # "at most prefill_budget prompt tokens per round while others are decoding": once a round's
    # admissions have used the whole budget (0 left) the running requests step first.
    m = _load(4)
    sched = Scheduler(m, prefill_budget=budget)
    log = _log_rounds(sched)
    _run_queued(sched, [_request([1 + i, 2, 3], 6, RowSampling(0.0)) for i in range(3)])
    assert log[:len(want)] == want, log


def test_a_request_that_found_no_free_slot_keeps_its_place(monkeypatch) -> None:
    # A request whose admission finds no free slot (one held outside the server) goes back to
    # the head of the queue, not its end: requests are admitted in arrival order.
    import memra.serve.scheduler as sched_mod

    sched = Scheduler(_load(1))
    real, calls = sched_mod.take_free_slots, {"n": 0}

    def busy_once(*a, **k):
        calls["n"] += 1
        if calls["n"] == 1:
            raise memra.ContractError("no free slot (one held outside the server)", 40025)
        return real(*a, **k)

    monkeypatch.setattr(sched_mod, "take_free_slots", busy_once)
    order = []
    start = sched.batch.start
    sched.batch.start = lambda ids, *a, **k: (order.append(int(ids[0])), start(ids, *a, **k))[1]
    _run_queued(sched, [_request([t], 2, RowSampling(0.0)) for t in (1, 2, 3)])
    assert calls["n"] >= 2 and order == [1, 2, 3], order


def test_a_stop_id_as_the_last_allowed_token_finishes_with_stop() -> None:
    # vLLM's StopChecker tests the stop token ids before the length cap, so a stop id that is
    # also the max_tokens-th token finishes the request with "stop", not "length".
    m = _load(1)
    prompt = [5, 6, 7]
    run = m.generate(prompt, 8, ignore_eos=True)
    n = next(i for i in range(1, len(run)) if run[i] not in run[:i]) + 1  # run[n-1] is new there
    sched = Scheduler(m)

    async def body():
        req = _request(prompt, n, RowSampling(0.0), stop=(run[n - 1],))
        sched.submit(req)
        events = []
        while not events or events[-1][1] is None:
            events.append(await asyncio.wait_for(req.events.get(), 10))
        return events

    events = _run(sched, body)
    assert [t for t, _ in events] == run[:n]
    assert [r for _, r in events] == [None] * (n - 1) + ["stop"]


def test_a_cancelled_running_request_ends_at_the_next_round() -> None:
    # cancel(): "a running one's slot is freed at the start of the next round". Cancelled while
    # the engine thread is inside round 1's decode step, the request gets that step's token and
    # no other (it asked for 500).
    m = _load(1, max_len=512)
    sched = Scheduler(m)
    gate, inside = _hold_in_decode(sched)

    async def body():
        req = _request([1, 2, 3], 500, RowSampling(0.0))
        sched.submit(req)
        await asyncio.wait_for(req.events.get(), 10)  # admitted: its first token
        assert await asyncio.to_thread(inside.wait, 10)
        sched.cancel(req)
        gate.set()
        end = time.monotonic() + 10
        while not req.done or sched.running:
            assert time.monotonic() < end
            await asyncio.sleep(0.01)
        return req

    req = _run(sched, body)
    assert req.row.count == 2 and m.cache.owner(0) == 0 and m.cache.length(0) == 0


def test_a_cancelled_running_request_frees_its_place_for_submit_at_once() -> None:
    # A request ended by a stop string or a disconnect counted as running until the engine's next
    # round: with every slot taken and max_waiting 0, the next request got a 429 though nothing
    # would run.
    m = _load(1, max_len=512)
    sched = Scheduler(m, max_waiting=0)
    gate, inside = _hold_in_decode(sched)

    async def body():
        a = _request([1, 2, 3], 500, RowSampling(0.0))
        sched.submit(a)
        await asyncio.wait_for(a.events.get(), 10)
        assert await asyncio.to_thread(inside.wait, 10)
        with pytest.raises(QueueFullError):
            sched.submit(_request([4], 2, RowSampling(0.0)))
        sched.cancel(a)
        b = _request([4], 2, RowSampling(0.0))
        sched.submit(b)  # refused before
        gate.set()
        return await _tokens(b)

    want = _load(1).generate([4], 2)
    assert _run(sched, body) == want
    assert m.cache.owner(0) == 0 and sched.running == 0 and sched._n_cancelled == 0


def test_a_slot_that_cannot_be_given_back_does_not_stop_the_engine(monkeypatch) -> None:
    # A failing release inside the engine's error path (a round that failed) killed the engine
    # thread: the request in flight and every later one were never answered.
    from memra.batch import SlotLease

    m = _load(2)
    sched = Scheduler(m)
    real_release, real_collect = SlotLease.release, sched.batch.collect
    state = {"fail": False}

    def release(self):
        if state["fail"]:
            raise memra.MemraError("cache.free failed")
        real_release(self)

    def collect(handle, *a):
        if state["fail"]:
            raise memra.MemraError("a step failed")
        return real_collect(handle, *a)

    monkeypatch.setattr(SlotLease, "release", release)
    sched.batch.collect = collect

    async def body():
        a = _request([1, 2], 40, RowSampling(0.0))
        sched.submit(a)
        await asyncio.wait_for(a.events.get(), 10)
        state["fail"] = True  # the next round fails, and so does giving a's slot back
        while True:
            ev = await asyncio.wait_for(a.events.get(), 10)
            if isinstance(ev, Exception):
                break
        assert "internal error" in str(ev)
        state["fail"] = False
        b = _request([3], 2, RowSampling(0.0))
        sched.submit(b)
        return await _tokens(b)

    assert len(_run(sched, body)) == 2
    assert sched._thread is not None and not sched._thread.is_alive()  # stopped by _run, not dead


def test_a_failing_last_collect_at_shutdown_still_ends_every_request() -> None:
    # At shutdown the chained step's collect ran outside any handling: when it raised, the
    # engine thread ended before it failed the running and queued requests.
    m = _load(1, max_len=512)
    m._runner = CpuRunner(m)
    sched = Scheduler(m)
    real_collect = sched.batch.collect

    def collect(handle, *a):
        if sys._getframe(1).f_code is Scheduler._serve.__code__:  # the shutdown path's collect
            raise memra.MemraError("device error while reading the last step")
        return real_collect(handle, *a)

    sched.batch.collect = collect

    async def body():
        a, q = _request([1, 2], 400, RowSampling(0.0)), _request([5], 3, RowSampling(0.0))
        sched.submit(a)
        sched.submit(q)
        for _ in range(10):
            await asyncio.wait_for(a.events.get(), 10)
        sched.request_stop()
        await asyncio.to_thread(sched._thread.join, 10)
        await asyncio.sleep(0.05)
        ends = []
        for r in (a, q):
            while not r.events.empty():
                ev = r.events.get_nowait()
                if isinstance(ev, Exception):
                    ends.append(str(ev))
        return ends

    ends = _run(sched, body)
    assert len(ends) == 2 and all("shutting down" in e for e in ends), ends


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")  # the bug re-raised
def test_a_dead_engine_refuses_new_requests_with_its_own_code(monkeypatch) -> None:
    # The engine thread ended by a bug past the rounds' handling: a request submitted after is a
    # ShuttingDownError whose code (the 503 body's) says the engine stopped, not a shutdown.
    from memra.serve.scheduler import ShuttingDownError

    m = _load(1)
    sched = Scheduler(m)

    def boom():
        raise SystemError("a bug")

    monkeypatch.setattr(sched, "_serve", boom)

    async def body():
        sched._thread.join(10)  # the thread logs the bug and ends
        with pytest.raises(ShuttingDownError) as refused:
            sched.submit(_request([1, 2], 2, RowSampling(0.0)))
        assert refused.value.code == "engine_stopped" and "internal error" in str(refused.value)

    _run(sched, body)
