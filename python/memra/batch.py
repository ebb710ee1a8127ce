"""Sequences decoding together over a model's own cache, one token each per step, joining and
leaving between steps: the piece that generation (``Model.generate`` / ``stream`` /
``generate_batch``) and the server's scheduler (``memra.serve.scheduler``) share.

Slot ownership. A sequence holds its slot of ``model.cache`` with an owner token
(``Cache.hold``) from :meth:`Model.take_slots` until :meth:`SlotLease.release`; while it is held,
``Cache.free`` / ``copy_slot`` (into it) / ``commit`` / ``commit_host`` and ``Model.prefill`` /
``decode`` on that slot raise ContractError (code 40026, ``CONTRACT_SLOT_HELD``) unless given
its token, so nothing outside can corrupt a generation in flight. The library takes only *free*
slots: held by nobody and holding no tokens (length 0). A slot that holds tokens and no owner
is the user's (filled with ``Model.prefill`` / ``decode``): generation never takes or clears it.
To keep an empty slot from generation, hold it yourself (``token = model.cache.hold(slot)``,
later ``model.cache.release(slot, token)``).

Non-finite logits. A row whose logits hold NaN or +-inf (NaN weights, an overflow) gets no
token: its result is a :class:`memra.NonFiniteError`. On the CPU every row is checked on the host
before it is sampled; on a CUDA engine the row after a prompt is checked on the host, and decode
rows through the sampler's per-row flag inside the captured step (``DecodeRunner.nonfinite_flags``).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from . import _core
from .decode_graph import Sampling
from ._interrupts import guarded, uninterrupted
from .errors import NON_FINITE, ContractError, NonFiniteError, NotCopied, is_int

if TYPE_CHECKING:
    from .model import Model


@uninterrupted
def hold_for_call(cache: _core.Cache, slots, owners: list[int], taken: list[tuple[int, int]]) -> list[int]:
    """Hold each slot of `slots` whose owner in `owners` is 0 (not held: a public prefill /
    decode on the user's slot) for the length of one call, and return the owners with those
    tokens in. Another thread's ``Cache.free`` / ``commit`` of such a slot mid-call is then
    refused (40026) instead of interleaving with the call's chunks and commits (silently
    different logits), and generation cannot take an empty slot being prefilled. The slots are
    checked (valid, not held by others) by the caller first. Each hold goes into `taken` as it
    is taken: the caller's list, given back by :func:`release_holds` in a ``finally`` around
    this call, so neither an error nor a Ctrl-C (passed on as this returns) leaves one held."""
    for s, o in zip(slots, owners):
        if not o:
            taken.append((int(s), cache.hold(int(s))))
    tokens = dict(taken)
    return [int(o) or tokens[int(s)] for s, o in zip(slots, owners)]


@uninterrupted
def release_holds(cache: _core.Cache, taken: list[tuple[int, int]]) -> None:
    """Give back the holds :func:`hold_for_call` took (a Ctrl-C waits for the last)."""
    for s, t in taken:
        cache.release(s, t)


@uninterrupted
def commit_rows(cache: _core.Cache, slots, owners: list[int]) -> None:
    """Commit one token to each of `slots` (each with its owner token): a decode step's rows, all
    of them or, on an error, those before it (a Ctrl-C waits for the last)."""
    for s, o in zip(slots, owners):
        cache.commit(int(s), 1, owner=o)


class SlotLease(NotCopied):
    """One slot of a model's own cache held (``Cache.hold``) by one sequence.

    ``slot`` and ``token`` (the owner token the library passes to the cache's mutations).
    :meth:`release` forgets the slot's contents and gives it back; it may be called more than
    once (later calls do nothing). Made by :meth:`memra.Model.take_slots`.
    """

    __slots__ = ("model", "slot", "token")

    def __init__(self, model: Model, slot: int, token: int) -> None:
        self.model = model
        self.slot = slot
        self.token = token

    @property
    def held(self) -> bool:
        """Whether the slot is still held by this lease."""
        return self.token != 0

    @uninterrupted
    def release(self) -> None:
        """Free the slot (length 0, recurrent state zeroed) and stop holding it (a Ctrl-C waits for
        the three steps); nothing once the interpreter exits (a daemon thread may hold the lock)."""
        if not self.token or _core._exit_began():
            return
        with self.model._lock:
            self.model.cache.free(self.slot, owner=self.token)
            self.model.cache.release(self.slot, self.token)
            self.token = 0


@uninterrupted
def release_all(leases: list[SlotLease]) -> None:
    """Release every lease of `leases` (a Ctrl-C waits for the last)."""
    for lease in leases:
        lease.release()


@uninterrupted
def close_then_release(rows: Iterator | None, leases: list[SlotLease]) -> None:
    """The way out of a generation (a Ctrl-C waits for it): close its rows' generator (the
    garbage collector's close loses a Ctrl-C), then give the slots back, also if that raises."""
    try:
        if rows is not None:
            rows.close()
    finally:
        release_all(leases)


_F32_MAX = float(np.finfo(np.float32).max)  # the sampler's temperature is a float32
_INT32_MAX = 2**31 - 1  # the sampler's top_k is an int32


def sampling_problem(name: str, value) -> str | None:
    """What memra's sampler refuses in `value` as its argument `name` (``temperature``,
    ``top_k`` or ``top_p``), as "must be ..., got ..."; None when it takes it.

    temperature: a finite number >= 0 that stays finite as a float32 (0: greedy); top_k: an
    integer in [0, 2^31) or None (0 and None: off); top_p: a number in (0, 1] that stays above 0
    as a float32 (1e-46 would reach the sampler as 0), or None (off).
    The one rule for Model.generate's arguments, the server's request fields
    (memra.serve.protocol) and the sampling defaults of generation_config.json (memra.loader),
    so none of them reaches the sampler with a value it would refuse mid-generation.
    """
    def number(v) -> bool:  # not a bool, nor a timedelta64 (a numpy integer type)
        return is_int(v) or isinstance(v, (float, np.floating))

    if name == "temperature":
        try:  # a Python int beyond float's range overflows float(): not a finite number either
            # A value past float32's range would reach the sampler as inf.
            ok = number(value) and math.isfinite(float(value)) and 0 <= float(value) <= _F32_MAX
        except OverflowError:
            ok = False
        return None if ok else f"must be a finite float32 number >= 0, got {value!r}"
    if value is None:
        return None
    if name == "top_k":
        if not is_int(value):
            return f"must be an integer, got {value!r}"
        return None if 0 <= int(value) <= _INT32_MAX else f"must be in [0, {_INT32_MAX}], got {int(value)}"
    if name == "top_p":
        ok = number(value) and 0.0 < value <= 1.0
        if ok and not np.float32(value) > 0:
            return f"must be in (0, 1] as a float32 (the sampler's type), got {value!r}, which rounds to 0"
        return None if ok else f"must be in (0, 1], got {value!r}"
    raise ValueError(f"sampling_problem: {name!r} is not a sampling argument")


def count_arg(value, what: str, lo: int, hi: int = 2**31 - 1) -> int:
    """An integer argument in [lo, hi] (ContractError otherwise, never a TypeError)."""
    if not is_int(value):
        raise ContractError(f"{what} must be an integer, got {value!r}", 40025)
    if not lo <= int(value) <= hi:
        raise ContractError(f"{what} must be in [{lo}, {hi}], got {int(value)}", 40025)
    return int(value)


def generation_args(max_new_tokens, temperature, top_k, top_p, seed, what: str = "generate") -> int:
    """Check generate / stream's arguments (ContractError naming `what` and the first bad one,
    40025: max_new_tokens an integer >= 0, temperature / top_k / top_p as sampling_problem says,
    seed None or an integer in [0, 2^64)) without a model; returns the seed (None: 0). The CLI
    calls it before it loads a checkpoint."""
    count_arg(max_new_tokens, f"{what}: max_new_tokens", 0)
    for name, value in (("temperature", temperature), ("top_k", top_k), ("top_p", top_p)):
        if problem := sampling_problem(name, value):
            raise ContractError(f"{what}: {name} {problem}", 40025)
    return 0 if seed is None else count_arg(seed, f"{what}: seed", 0, 2**64 - 1)


@dataclass(frozen=True)
class RowSampling:
    """How one sequence draws its tokens: temperature (0: greedy, argmax with ties to the lower
    id), then top_k (None or 0: off), then top_p (None or 1: off), with memra's counter-based
    RNG: the sequence's k-th new token (from 0) is drawn with (`seed`, counter k)."""

    temperature: float = 0.0
    top_k: int | None = None
    top_p: float | None = None
    seed: int = 0

    @property
    def key(self) -> Sampling:
        """The Sampling a decode step bakes in for this row (rows with one key share a step's
        sampling, inside the captured graph on a CUDA engine)."""
        return Sampling.of(self.temperature, self.top_k, self.top_p)


class Row:
    """One sequence of a :class:`DecodeBatch`: its slot (a :class:`SlotLease`), its sampling,
    ``count`` (tokens drawn and collected so far), ``last`` (the last one: the next step feeds
    it), ``inflight`` (steps launched for it and not yet collected) and ``failed`` (the
    NonFiniteError that ended it, else None: its step was committed without a token, so a
    further step would feed ``last`` a second time)."""

    __slots__ = ("lease", "sampling", "count", "last", "inflight", "failed")

    def __init__(self, lease: SlotLease, sampling: RowSampling, first: int) -> None:
        self.lease = lease
        self.sampling = sampling
        self.count = 1
        self.last = first
        self.inflight = 0
        self.failed: NonFiniteError | None = None

    @property
    def slot(self) -> int:
        """The row's slot of the model's cache."""
        return self.lease.slot


class StepHandle:
    """A decode step launched by :meth:`DecodeBatch.launch`; :meth:`DecodeBatch.collect` reads
    its tokens. ``rows``: the step's rows in its own row order."""

    __slots__ = ("rows", "reads", "flags", "results", "collected")

    def __init__(self, rows: list[Row], reads=None, flags=None, results=None) -> None:
        self.rows = rows
        self.reads = reads  # [(first row, rows, HostRead of int32 tokens)] (CUDA)
        self.flags = flags  # [(first row, rows, HostRead of int32 non-finite flags)], or None (CUDA)
        self.results = results  # [int | NonFiniteError] computed at launch (CPU)
        self.collected = False  # collect() takes a step's draws once


def _read_async(m: Model, arr) -> _core.HostRead:
    """Engine.to_host_async through one window of pending reads for the whole model (every
    DecodeBatch, stream and thread on it): the engine has Engine.READ_SLOTS readback slots and a
    read's slot is reused by the READ_SLOTS-th read after it, so before that could happen the
    oldest pending read is waited for (a HostRead keeps its array: its owner's later wait()
    returns it). Nine streams consumed in turn once outran the slots (ContractError from next()).
    Call with the model's lock held."""
    q = m._pending_reads
    while len(q) >= _core.Engine.READ_SLOTS - 1:
        q.popleft().wait()
    r = m.engine.to_host_async(arr)
    q.append(r)
    return r


def _not_finite(what: str, slot: int, k: int) -> NonFiniteError:
    return NonFiniteError(f"{what}: the logits for new token {k} of the sequence in slot {slot} are "
                          f"not finite (NaN or inf): no token was drawn", NON_FINITE)


class DecodeBatch(NotCopied):
    """Decode steps over any subset of a model's sequences, each row sampled with its own
    :class:`RowSampling` (memra.Model's engine lock is held for every call; not for use from
    several threads at once).

    :meth:`start` prefills a prompt into a leased slot and draws its first token; :meth:`launch`
    enqueues one step for some rows (each fed its last token); :meth:`collect` reads the step's
    tokens and advances the rows. On the CPU a launch computes the step at once. On a CUDA engine
    steps run as captured graphs (memra.decode_graph); rows sharing one sampling key draw inside
    the graph, and while the same rows stay together the next step can be *chained*
    (:meth:`can_chain`): launched before the previous one is collected, its ids the previous
    draws still on the device. Rows with different keys share the step's layers and draw in one
    sampling launch per key after it (not chained).

    A row's tokens do not depend on the other rows of a step: row j's logits are those of its
    slot alone, drawn with its own seed and counter, so they equal ``Model.generate``'s.

    After a KeyboardInterrupt from a call (Ctrl-C), release the rows' leases rather than go on:
    a step may be in the cache that the rows did not count (its commits are whole; the
    bookkeeping after them is not held back, docs/prefill.md).
    """

    def __init__(self, model: Model) -> None:
        self.model = model

    @property
    def pipelined(self) -> bool:
        """Whether steps can be chained (a CUDA engine's decode runner)."""
        return self.model._runner is not None

    # ------------------------------------------------------------------ rows in and out
    @guarded
    def start(self, prompt_ids: np.ndarray, sampling: RowSampling, lease: SlotLease,
              what: str = "generate") -> Row:
        """Prefill `prompt_ids` (int32 [T], checked) into the leased (empty) slot and draw the
        first new token (counter 0) -> a Row. ContractError (40025) for a sampling the sampler
        refuses or a lease no longer held, before anything runs; NonFiniteError when the logits
        after the prompt are not finite; the lease stays with the caller either way (release
        it)."""
        _check_row_sampling(sampling, what)
        _check_leases(self.model, [lease], what)
        m = self.model
        with m._lock:
            logits = m._prefill(m.cache, lease.slot, prompt_ids, owner=lease.token)
            host = m.net.to_host(logits)
            if not np.isfinite(host).all():
                raise _not_finite(what, lease.slot, 0)
            s = sampling
            src = host if m._runner is None else logits  # CUDA: draw on the device, as decode steps do
            tok = m._pick(src, 0, s.temperature, s.top_k, s.top_p, s.seed, 0)
        return Row(lease, sampling, tok)

    @guarded
    def start_many(self, prompts: list[np.ndarray], samplings: list[RowSampling], leases: list[SlotLease],
                   what: str = "generate") -> list[Row | NonFiniteError]:
        """:meth:`start` for several prompts at once: one batched prefill of prompts[j] (int32
        [T_j], checked) into the slot of leases[j] (Model._prefill_batch: the prompts' rows
        packed), then each prompt's first token drawn from its own row of the logits as start
        draws it -> a Row per prompt, or the NonFiniteError of a prompt whose logits are not
        finite (the others still start). A single prompt goes through :meth:`start`. The leases
        stay with the caller either way (release them)."""
        if len(prompts) == 1:
            try:
                return [self.start(prompts[0], samplings[0], leases[0], what)]
            except NonFiniteError as e:
                return [e]
        for s in samplings:
            _check_row_sampling(s, what)
        _check_leases(self.model, leases, what)
        m = self.model
        out: list[Row | NonFiniteError] = []
        with m._lock:
            slots = np.array([lease.slot for lease in leases], np.int32)
            logits = m._prefill_batch(m.cache, slots, list(prompts), [lease.token for lease in leases])
            host = m.net.to_host(logits)
            src = host if m._runner is None else logits  # CUDA: draw on the device, as decode steps do
            for j, (s, lease) in enumerate(zip(samplings, leases)):
                if not np.isfinite(host[j]).all():
                    out.append(_not_finite(what, lease.slot, 0))
                    continue
                tok = m._pick(src, j, s.temperature, s.top_k, s.top_p, s.seed, 0)
                out.append(Row(lease, s, tok))
        return out

    # ------------------------------------------------------------------ steps
    def can_chain(self, rows: list[Row]) -> bool:
        """Whether a step of `rows` can be launched now without collecting the one in flight:
        a CUDA engine, every row has exactly that one step in flight, they share one sampling
        key, and that step (the runner's last on its bucket) sampled exactly these slots."""
        runner = self.model._runner
        if runner is None or not rows or any(r.inflight != 1 for r in rows):
            return False
        if len({r.sampling.key for r in rows}) != 1:
            return False
        return runner.can_chain(np.array([r.slot for r in rows], np.int32))

    @guarded
    def launch(self, rows: list[Row], what: str = "decode") -> StepHandle:
        """Enqueue one decode step feeding each row its last token (or, when :meth:`can_chain`,
        the draws of the step in flight) and drawing the next. Every row needs room for one
        more token (CacheFullError otherwise, nothing run), its lease still held, no
        NonFiniteError ending it and, unless chained, no step in flight (ContractError 40025 for
        no rows, a released lease, a failed row or a step in flight, nothing run)."""
        return self._launch(rows, what, chain_only=False)

    @guarded
    def try_chain(self, rows: list[Row], what: str = "decode") -> StepHandle | None:
        """:meth:`launch` of a step chained on the one in flight when it can be chained now, else
        None. The check and the launch are one hold of the model's lock, so no other thread's
        step on the same bucket comes between them (checking :meth:`can_chain` first, then
        launching, could raise ContractError when it did)."""
        return self._launch(rows, what, chain_only=True)

    def _launch(self, rows: list[Row], what: str, chain_only: bool) -> StepHandle | None:
        if not rows:
            raise ContractError(f"{what}: DecodeBatch.launch needs at least one row", 40025)
        _check_leases(self.model, [r.lease for r in rows], what)
        for r in rows:
            if r.failed is not None:
                raise ContractError(f"{what}: DecodeBatch.launch: the row in slot {r.slot} ended with "
                                    f"NonFiniteError ({r.failed}); release it", 40025)
        m = self.model
        with m._lock:
            chained = self.can_chain(rows)
            if chain_only and not chained:
                return None
            if not chained and any(r.inflight for r in rows):
                raise ContractError(f"{what}: DecodeBatch.launch: a row has a step in flight; collect it first",
                                    40025)
            slots = np.array([r.slot for r in rows], np.int32)
            m._check_room(m.cache, slots, 1, what)
            if m._runner is None:
                handle = self._launch_host(rows, slots, what)
            else:
                handle = self._launch_device(rows, chained)
        for r in handle.rows:
            r.inflight += 1
        return handle

    def _launch_host(self, rows: list[Row], slots: np.ndarray, what: str) -> StepHandle:
        """CPU: the step now; each row checked for finite logits, then sampled on its own, before
        the step is committed (a failure in the sampler leaves the cache as it was)."""
        m = self.model
        lasts = np.array([r.last for r in rows], np.int32)
        results: list = []

        def draw(logits) -> None:
            finite = np.isfinite(logits).all(axis=1)
            for j, r in enumerate(rows):
                s = r.sampling
                if not finite[j]:
                    results.append(_not_finite(what, r.slot, r.count))
                else:
                    results.append(m._pick(logits, j, s.temperature, s.top_k, s.top_p, s.seed, r.count))

        m._decode(m.cache, slots, lasts, owners=[r.lease.token for r in rows], before_commit=draw)
        return StepHandle(rows, results=results)

    def _launch_device(self, rows: list[Row], chained: bool) -> StepHandle:
        """CUDA: one step through the decode runner (a captured graph after its first use)."""
        m = self.model
        runner = m._runner
        keys = {r.sampling.key for r in rows}
        if len(keys) > 1:  # rows of one key next to each other: each key samples a row range
            order = sorted(keys, key=lambda k: (k.temperature, k.top_k, k.top_p))
            rows = sorted(rows, key=lambda r: order.index(r.sampling.key))
        slots = np.array([r.slot for r in rows], np.int32)
        owners = [r.lease.token for r in rows]
        counters = np.array([r.count + r.inflight for r in rows], np.uint64)
        seeds = np.array([r.sampling.seed for r in rows], np.uint64)
        ids = None if chained else np.array([r.last for r in rows], np.int32)
        if ids is not None:
            m._check_vocab(ids, "decode")
        n = len(rows)
        if len(keys) == 1:
            b = runner.step(slots, ids, next(iter(keys)), counters=counters, seeds=seeds, owners=owners)
            flags = [(0, n, _read_async(m, b.nonfinite))] if runner.nonfinite_flags else None
            return StepHandle(rows, reads=[(0, n, _read_async(m, b.tokens))], flags=flags)
        b = runner.step(slots, ids, None, owners=owners)
        op_e = m.net.op_engine
        dev = (lambda a: op_e.to_device(a)) if op_e is not None else (lambda a: a)
        reads, flag_reads, a = [], [], 0

        while a < n:
            key = rows[a].sampling.key
            k = next((j for j in range(a, n) if rows[j].sampling.key != key), n) - a
            flags = dict(nonfinite=dev(np.zeros(k, np.int32))) if runner.nonfinite_flags else {}
            tok = _core.sample(_core.take_rows(b.logits, a, k, engine=op_e), dev(counters[a:a + k]),
                               temperature=key.temperature, top_k=key.top_k, top_p=key.top_p,
                               seeds=dev(seeds[a:a + k]), engine=op_e, **flags)
            reads.append((a, k, _read_async(m, tok)))
            if flags:
                flag_reads.append((a, k, _read_async(m, flags["nonfinite"])))
            a += k
        return StepHandle(rows, reads=reads, flags=flag_reads or None)

    @guarded
    def collect(self, handle: StepHandle, what: str = "decode") -> list[tuple[Row, object]]:
        """Wait for a launched step's draws -> [(row, token or NonFiniteError)] in the step's row
        order. A row that got a token advances (count, last); every row's step is off its
        in-flight count. The result of a row the caller has finished meanwhile is its to drop.
        ContractError (40025) for a handle already collected (its draws advanced the rows once)."""
        if handle.collected:
            raise ContractError(f"{what}: this step was collected already", 40025)
        m = self.model
        rows = handle.rows
        results = handle.results
        if results is None:
            n = len(rows)
            toks = np.empty(n, np.int64)
            flags = np.zeros(n, np.int32)
            with m._lock:  # the context's readback slots are shared with other threads
                for a, k, read in handle.reads:
                    toks[a:a + k] = read.wait()[:k]
                for a, k, read in handle.flags or ():
                    flags[a:a + k] = read.wait()[:k]
            results = [_not_finite(what, r.slot, r.count) if flags[j] else int(toks[j])
                       for j, r in enumerate(rows)]
        handle.collected = True
        out = []
        for r, res in zip(rows, results):
            r.inflight -= 1
            if not isinstance(res, NonFiniteError):
                r.count += 1
                r.last = int(res)
            else:
                r.failed = res
            out.append((r, res))
        return out


def _check_row_sampling(s: RowSampling, what: str) -> None:
    """ContractError (40025) naming the first field of `s` the sampler refuses."""
    if not isinstance(s, RowSampling):
        raise ContractError(f"{what}: sampling must be a memra.batch.RowSampling, got {type(s).__name__}", 40025)
    generation_args(0, s.temperature, s.top_k, s.top_p, s.seed, what)


def _check_leases(model: Model, leases: list[SlotLease], what: str) -> None:
    """ContractError (40025) for a lease already released or taken on another model: a step on
    its slot would run unowned, into a slot that generation does not hold (or that holds the
    user's own tokens)."""
    foreign = [lease.slot for lease in leases if lease.model is not model]
    if foreign:
        raise ContractError(f"{what}: the lease of slot(s) {foreign} was taken on another model "
                            f"(Model.take_slots of this DecodeBatch's model makes its leases)", 40025)
    gone = [lease.slot for lease in leases if not lease.held]
    if gone:
        raise ContractError(f"{what}: the lease of slot(s) {gone} was released; a released row cannot run", 40025)


def take_free_slots(model: Model, n: int, what: str, into: list[SlotLease]) -> list[SlotLease]:
    """Hold n free slots of ``model.cache`` (held by nobody and holding no tokens), lowest first,
    and append their leases to `into` (the caller's list, released in a ``finally`` around this
    call: a Ctrl-C raised as the holds finish never loses one); returns them too. ContractError
    (CONTRACT_VALUE) naming which slots are held (Cache.owner) and which hold the user's tokens
    when fewer than n are free. Nothing is taken on an error."""
    cache = model.cache
    with model._lock:  # waited for outside the protected holds: a Ctrl-C ends the wait
        free, held, user = [], [], []
        for s in range(cache.max_batch):
            if cache.owner(s):
                held.append(s)
            elif cache.length(s):
                user.append(s)
            else:
                free.append(s)
        if len(free) < n:
            raise ContractError(
                f"{what}: {n} free slot(s) of the model's cache needed but only {len(free)} of "
                f"{cache.max_batch} are free (held by a generation, stream or server request in flight "
                f"or by a cache.hold() token: {held}; holding your "
                f"tokens, never taken: {user}; model.cache.free(slot) empties one of yours; a held one "
                f"comes back when its generation or stream ends, or with cache.release)", 40025)
        k = len(into)
        _hold_free(model, free[:n], into)
        return into[k:]


@uninterrupted
def _hold_free(model: Model, slots: list[int], into: list[SlotLease]) -> None:
    """Hold `slots` (free, under the model's lock) into leases appended to `into`; on an error
    the holds so far go back."""
    cache = model.cache
    leases: list[SlotLease] = []
    try:
        for s in slots:
            token = cache.hold(s)
            leases.append(SlotLease(model, s, token))
            cache.free(s, owner=token)
    except BaseException:
        release_all(leases)
        raise
    into.extend(leases)


class TokenStream(NotCopied, Iterator[int]):
    """The iterator :meth:`memra.Model.stream` returns: new token ids one at a time.

    It holds a slot of the model's cache from its first token until its last; ``close()`` gives
    the slot back at once (later ``next()`` raises StopIteration), and so does leaving a
    ``with model.stream(...) as tokens:`` block, so a stream dropped early never waits for the
    garbage collector to free its slot. A stream that ended with an error (no free slot at the
    first ``next()``, non-finite logits, a Ctrl-C) raises ContractError (40025) naming it at
    every later ``next()``, not an empty end. Not for use from several threads at once.
    """

    __slots__ = ("_gen", "_failed")

    def __init__(self, gen: Iterator[int]) -> None:
        self._gen = gen
        self._failed: str | None = None

    def __iter__(self) -> TokenStream:
        return self

    @guarded
    def __next__(self) -> int:
        if self._failed is not None:
            raise ContractError(f"stream: this stream ended with {self._failed}; it yields nothing more "
                                "(start another)", 40025)
        try:
            return next(self._gen)
        except StopIteration:
            raise
        except BaseException as e:
            self._failed = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
            raise

    @guarded
    def close(self) -> None:
        """Stop the stream and give its slot back now (idempotent)."""
        self._gen.close()

    def __enter__(self) -> TokenStream:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:
        gen = getattr(self, "_gen", None)
        if gen is not None:
            gen.close()
