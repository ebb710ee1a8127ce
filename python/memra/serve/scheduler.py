"""Continuous batching: one thread owns the model and its cache slots; requests join and leave
between decode steps.

The engine thread loops: drop cancelled requests (their slots freed at once), admit waiting
requests into free slots (prefill + first token; at most ``prefill_budget`` prompt tokens per
round while others are decoding, so their prefill is interleaved with the running requests'
decode steps), then one decode step over every running request (memra.batch.DecodeBatch: each
row sampled with its own temperature / top-k / top-p / seed, so a request's tokens do not
depend on what else runs). On a CUDA engine, while the running set stays the same and nothing
waits, the next step is chained before the current one's tokens are read (no idle device
between steps). The model is used from this thread only: the engine is not thread-safe.

Results reach the asyncio side through ``loop.call_soon_threadsafe``: one call for the round's
first tokens (before its decode step), one for the step's tokens; a
request's events are ``(token, finish_reason or None)`` tuples and then, for a failure, a
:class:`memra.MemraError` (NonFiniteError ends only that request).
"""

from __future__ import annotations

import asyncio
import atexit
import logging
import threading
import time
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from ..batch import DecodeBatch, Row, RowSampling, take_free_slots
from ..errors import MemraError

log = logging.getLogger("memra.serve")


class QueueFullError(Exception):
    """Every slot is busy and ``max_waiting`` requests are queued (HTTP 429)."""


# The error body's code of a request the server's stop ended or refused (HTTP 503).
SHUTTING_DOWN = "server_shutting_down"


class ShuttingDownError(Exception):
    """The server is stopping, or its engine thread ended after an internal error: no request is
    taken any more (HTTP 503). ``code``: the error body's code, SHUTTING_DOWN or
    "engine_stopped"."""

    def __init__(self, message: str, code: str) -> None:
        super().__init__(message)
        self.code = code


class StoppedError(MemraError):
    """The last event of a request still running or queued when the server stopped (HTTP 503:
    the request was fine, and another server may take it)."""


@dataclass(eq=False)
class Request:
    """One generation request as the scheduler runs it.

    prompt_ids: int32 [T] (checked against the vocabulary); max_tokens: new tokens at most;
    sampling: its RowSampling; stop_ids: token ids that end it (EOS unless ignore_eos, plus
    stop_token_ids), included in its tokens. ``events`` receives its results on the event loop.
    """

    prompt_ids: np.ndarray
    max_tokens: int
    sampling: RowSampling
    stop_ids: frozenset[int]
    events: asyncio.Queue = field(default_factory=asyncio.Queue)
    arrival: float = field(default_factory=time.monotonic)
    cancelled: bool = False
    cancel_counted: bool = False  # cancelled while it held (or was taking) a slot: a free slot to submit
    done: bool = False  # finished, failed or cancelled (set on the engine thread, under the condition)
    row: Row | None = None


class Scheduler:
    """Runs requests on one model with continuous batching (see the module docstring).

    model: a memra.Model whose own cache holds the slots (``max_batch`` of them are used);
    max_waiting: requests queued beyond the free slots before :meth:`submit` refuses;
    prefill_budget: prompt tokens prefilled per round while other requests decode (a longer
    prompt is still admitted, alone). Call :meth:`start` inside the event loop, :meth:`stop`
    to end the thread (requests in flight are cancelled).
    """

    def __init__(self, model, *, max_waiting: int = 64, prefill_budget: int = 2048) -> None:
        self.model = model
        self.max_batch = model.cache.max_batch
        self.max_waiting = max_waiting
        self.prefill_budget = prefill_budget
        self.batch = DecodeBatch(model)
        self._cv = threading.Condition()
        self._waiting: deque[Request] = deque()
        self._running: list[Request] = []
        self._n_running = 0
        self._n_cancelled = 0  # of those, cancelled: their slots come back next round
        self._stopping = False
        self._dead = False  # the engine thread ended (a bug): nothing would answer a request
        self._stalled = False  # admissions blocked by slots held outside the server (logged once)
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.on_token = None  # optional callback(request, now) on the loop, per token (metrics)
        self.on_step = None  # optional callback(rows) on the engine thread, per decode step launched

    # ------------------------------------------------------------------ asyncio side
    def start(self, loop: asyncio.AbstractEventLoop | None = None) -> None:
        """Start the engine thread; results are delivered on `loop` (default: the running one)."""
        self._loop = loop or asyncio.get_running_loop()
        self._thread = threading.Thread(target=self._run, name="memra-engine", daemon=True)
        self._thread.start()
        # At exit the thread is stopped and joined (registered after memra's exit hook, this runs
        # before it): every request ends with a "shutting down" error, not cut by its SystemExit.
        atexit.register(self.stop)

    def request_stop(self) -> None:
        """Ask the engine thread to stop after its current round, without waiting for it: every
        request in flight or queued then ends with a "the server is shutting down" MemraError,
        so that their connections close (the server's shutdown waits for them)."""
        with self._cv:
            self._stopping = True
            self._cv.notify()

    @property
    def stopping(self) -> bool:
        """Whether a stop was asked (request_stop or stop)."""
        return self._stopping

    def stop(self) -> None:
        """Stop the engine thread after its current round and wait for it; every request is
        cancelled."""
        atexit.unregister(self.stop)
        self.request_stop()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()

    def submit(self, req: Request) -> None:
        """Queue a request (QueueFullError when every slot is busy and max_waiting are queued;
        ShuttingDownError once the server is stopping)."""
        with self._cv:
            if self._stopping:
                raise ShuttingDownError("the server is shutting down", SHUTTING_DOWN)
            if self._dead:
                raise ShuttingDownError("the server's engine stopped after an internal error", "engine_stopped")
            # A running request already cancelled (a stop string, a disconnect) gives its slot back
            # at the start of the next round: its slot counts as free here.
            free = self.max_batch - self._n_running + self._n_cancelled
            if len(self._waiting) >= max(free, 0) + self.max_waiting:
                # The queue holds requests for the free slots (not yet admitted) plus max_waiting.
                raise QueueFullError(f"{self._n_running} of {self.max_batch} slots are running requests and "
                                     f"{len(self._waiting)} more are queued, the most the queue takes (the "
                                     f"{max(free, 0)} free slots + --max-waiting {self.max_waiting})")
            self._waiting.append(req)
            self._cv.notify()

    def cancel(self, req: Request) -> None:
        """The client is done with `req` (it disconnected, or a stop string ended it): a waiting
        request leaves the queue at once (it no longer counts toward max_waiting); a running one's
        slot is freed at the start of the next round. A finished request is left as it is."""
        with self._cv:  # done is set under the condition too: a finish cannot slip in between
            if req.done or req.cancelled:
                return
            req.cancelled = True
            for i, r in enumerate(self._waiting):
                if r is req:
                    del self._waiting[i]
                    break
            else:  # it holds a slot, or is taking one
                req.cancel_counted = True
                self._n_cancelled += 1
            self._cv.notify()

    @property
    def running(self) -> int:
        """Requests holding a slot."""
        return self._n_running

    @property
    def waiting(self) -> int:
        """Requests queued for a slot."""
        return len(self._waiting)

    def slots_in_use(self) -> int:
        """Slots of the model's cache that are held or hold tokens."""
        c = self.model.cache
        return sum(1 for s in range(c.max_batch) if c.owner(s) or c.length(s))

    # ------------------------------------------------------------------ engine thread
    def _run(self) -> None:
        try:
            self._serve()
        except BaseException:  # a bug past the rounds' own handling: no request is left unanswered
            log.exception("memra serve: the engine thread failed")
            with self._cv:
                self._dead = True
            self._end_all(MemraError("the server's engine stopped after an internal error"))
            raise

    def _serve(self) -> None:
        pending = None  # a chained step in flight (CUDA), launched last round
        while True:
            with self._cv:
                while not (self._stopping or self._waiting or self._running):
                    self._cv.wait()
                if self._stopping:
                    break
            events: list = []
            try:
                self._drop_cancelled()
                self._admit(events)
                self._deliver(events)
                events = []
                pending = self._decode(pending, events)
            except Exception as e:  # a bug: fail the requests in flight, keep serving
                log.exception("memra serve: engine round failed")
                pending = None
                for req in list(self._running):
                    self._finish(req, events, MemraError(f"internal error: {e}"))
            self._deliver(events)
        if pending is not None:
            try:
                self.batch.collect(pending)
            except Exception:  # the requests end below all the same
                log.exception("memra serve: collecting the last step failed")
        self._end_all(StoppedError("the server is shutting down"))

    def _end_all(self, error: MemraError) -> None:
        """End every running and queued request with `error` (its last event)."""
        events: list = []
        for req in list(self._running):
            self._finish(req, events, error)
        with self._cv:
            events += [(req, error) for req in self._waiting]
            self._waiting.clear()
        self._deliver(events)

    def _drop_cancelled(self) -> None:
        for req in [r for r in self._running if r.cancelled]:
            self._finish(req, [], None)
        with self._cv:
            if any(r.cancelled for r in self._waiting):
                self._waiting = deque(r for r in self._waiting if not r.cancelled)

    def _admit(self, events: list) -> None:
        budget = self.prefill_budget
        while True:
            with self._cv:
                if not self._waiting or self._n_running >= self.max_batch:
                    return
                if self._running and budget <= 0:
                    return  # next round: the running requests take a decode step first
                req = self._waiting.popleft()
                self._n_running += 1
            budget -= len(req.prompt_ids)
            try:
                (lease,) = take_free_slots(self.model, 1, "serve", [])
            except MemraError as e:  # a slot held outside the server (a user's generation)
                with self._cv:
                    self._uncount(req)
                    self._waiting.appendleft(req)
                if not self._stalled:  # once per stall, not every round it lasts
                    log.warning("memra serve: no free slot; waiting for one held outside the server: %s", e)
                    self._stalled = True
                if not self._running:
                    time.sleep(0.01)  # nothing else to do until that slot comes back
                return
            except Exception as e:  # noqa: BLE001 - a bug: this request fails, the others go on
                with self._cv:
                    self._uncount(req)
                    req.done = True
                self._fail_admission(req, e, events)
                continue
            self._stalled = False
            try:
                req.row = self.batch.start(req.prompt_ids, req.sampling, lease, "serve")
            except Exception as e:  # noqa: BLE001 - this request fails; the others go on
                lease.release()
                with self._cv:
                    self._uncount(req)
                    req.done = True
                self._fail_admission(req, e, events)
                continue
            self._running.append(req)
            self._token(req, req.row.last, events)

    def _fail_admission(self, req: Request, e: Exception, events: list) -> None:
        """`req` could not start (its slot already given back): its last event is the error, a
        MemraError as it came (a bad prompt, a full cache) or, for anything else (a bug, logged),
        an "internal error" MemraError naming it (done already set, with its slot's count)."""
        if not isinstance(e, MemraError):
            log.error("memra serve: admitting a request failed", exc_info=e)
            e = MemraError(f"internal error: {e}")
        events.append((req, e))

    def _token(self, req: Request, tok: int, events: list) -> None:
        """Record a token of `req`; finish it after a stop id or its max_tokens-th token."""
        reason = "stop" if tok in req.stop_ids else "length" if req.row.count >= req.max_tokens else None
        events.append((req, (tok, reason)))
        if reason is not None:
            self._finish(req, events, None)

    def _uncount(self, req: Request) -> None:
        """`req` no longer takes a slot (call with the condition held)."""
        self._n_running -= 1
        if req.cancel_counted:
            req.cancel_counted = False
            self._n_cancelled -= 1

    def _finish(self, req: Request, events: list, error: MemraError | None) -> None:
        """Give the request's slot back now; `error` (if any) is its last event. A slot that
        cannot be given back (its free failed) stays held and is logged; the request ends all
        the same, so the engine's own error path never fails on it."""
        if req.row is not None:
            try:
                req.row.lease.release()
            except Exception as e:  # noqa: BLE001 - logged; the request and the engine go on
                log.error("memra serve: giving back slot %d failed: %s", req.row.slot, e)
        with self._cv:
            req.done = True
            if req in self._running:
                self._running.remove(req)
                self._uncount(req)
        if error is not None:
            events.append((req, error))

    def _decode(self, pending, events: list):
        """One decode step over the running requests, or the collection of the step chained last
        round; returns the step chained for next round, if any."""
        live = {id(r.row): r for r in self._running}
        if pending is None:
            if not live:
                return None
            pending = self._launch([r.row for r in self._running])
        nxt = None
        with self._cv:  # chain only while no request waits for a free slot or leaves
            quiet = not (self._waiting and self._n_running < self.max_batch) and \
                not any(r.cancelled for r in self._running)
        same = len(pending.rows) == len(live) and all(id(r) in live for r in pending.rows)
        if (quiet and same and self.batch.pipelined
                and all(r.row.count + 2 <= r.max_tokens for r in self._running)):
            nxt = self.batch.try_chain(pending.rows, "serve")
            if nxt is not None and self.on_step is not None:
                self.on_step(len(pending.rows))
        for row, res in self.batch.collect(pending, "serve"):
            req = live.get(id(row))
            if req is None or req.done:
                continue  # finished or cancelled meanwhile: the draw is dropped
            if isinstance(res, MemraError):
                self._finish(req, events, res)
            else:
                self._token(req, res, events)
        return nxt

    def _launch(self, rows: list[Row]):
        handle = self.batch.launch(rows, "serve")
        if self.on_step is not None:
            self.on_step(len(rows))
        return handle

    def _deliver(self, events: list) -> None:
        if events and self._loop is not None:
            try:
                self._loop.call_soon_threadsafe(self._put, events)
            except RuntimeError:  # the event loop is closed: nobody is waiting any more
                pass

    def _put(self, events: list) -> None:
        now = time.monotonic()
        for req, ev in events:
            req.events.put_nowait(ev)
            if self.on_token is not None and isinstance(ev, tuple):
                self.on_token(req, now)
