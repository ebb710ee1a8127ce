"""The user-facing :class:`Model` (made by ``memra.load``, memra/checkpoint.py): logits,
prefill/decode over a Cache, and generation (greedy or sampled; one prompt, streamed, or a batch
of prompts decoded together)."""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np

from . import _core, batch_prefill
from ._interrupts import guarded
from .batch import (DecodeBatch, RowSampling, SlotLease, TokenStream, close_then_release, commit_rows, count_arg,
                    generation_args, hold_for_call, release_all, release_holds, take_free_slots)
from .decode_graph import DecodeRunner, Sampling
from .errors import NON_FINITE, CacheFullError, ContractError, NonFiniteError, UnsupportedError, \
    check_owners, check_token_ids, ids_arg, in_sequence, is_int, listed, shown
from .loader import GenerationConfig

log = logging.getLogger("memra")


def _cache_arg(cache, what: str, num_layers: int) -> _core.Cache:
    """`cache` when it is a memra.Cache of `num_layers` layers (ContractError naming it
    otherwise: a cache of fewer layers fails in the layer past its end, one of more would have
    its extra layers silently left alone)."""
    if not isinstance(cache, _core.Cache):
        raise ContractError(f"{what}: cache must be a memra.Cache (model.new_cache()), got {shown(cache)}", 40020)
    try:
        layers = cache.num_layers
    except TypeError:  # made with Cache.__new__ and never initialised (nanobind's TypeError)
        raise ContractError(f"{what}: cache was never initialised (make it with model.new_cache())",
                            40020) from None
    if layers != num_layers:
        raise ContractError(f"{what}: cache has {layers} layers, the model {num_layers} "
                            "(make it with model.new_cache())", 40025)
    return cache


class Model:
    """A loaded model on one Engine. Made by :func:`load`.

    Attributes: ``path`` (the checkpoint folder), ``config`` (parsed), ``engine``,
    ``eos_token_ids``, ``cache`` (the default cache of ``max_batch`` x ``max_len`` used by the
    generate methods), ``tokenizer`` (a ``tokenizers.Tokenizer`` when the folder has
    ``tokenizer.json`` or Kimi's ``tiktoken.model``: memra.tokenizer.read_tokenizer; else None),
    ``generation_config`` (memra.loader.GenerationConfig: generation_config.json's checked EOS
    ids and sampling defaults, which ``memra serve`` uses; generate's own defaults are greedy).

    On a CUDA engine, decode steps over ``cache`` (generation, and :meth:`decode` on it) run as
    CUDA graphs replayed per batch bucket (memra.decode_graph); the bytes equal eager steps.

    Slots of ``cache``: a generation, stream or server request holds the slot it runs in
    (``cache.owner(slot)`` != 0) and nothing else may change it (ContractError 40026); generation
    takes only free slots (held by nobody and holding no tokens), never one holding your tokens
    (memra.batch says the whole rule).

    A Model is neither copied nor pickled (UnsupportedError): it owns its engine, weights and
    cache; load the folder again for another.
    """

    def __init__(self, path: Path, engine: _core.Engine, config, net, cache: _core.Cache,
                 eos_token_ids: list[int], tokenizer, *, cuda_graphs: bool = True,
                 generation_config: GenerationConfig | None = None) -> None:
        self.path = path
        self.engine = engine
        self.config = config
        self.net = net
        self.cache = cache
        self.eos_token_ids = eos_token_ids
        self.tokenizer = tokenizer
        self.generation_config = generation_config or GenerationConfig(list(eos_token_ids))
        # Every use of the engine (enqueues, host reads, slot bookkeeping) holds this lock: the
        # engine's context is not thread-safe, and generations on several threads share it.
        self._lock = threading.RLock()
        self._pending_reads: deque = deque()  # memra.batch._read_async's window (CUDA)
        # CUDA: decode steps over self.cache through device-resident batches, captured once per
        # batch bucket and replayed (cuda_graphs=False: the same steps run eagerly).
        self._runner = DecodeRunner(net, cache, graphs=cuda_graphs) if engine.is_cuda else None

    def __repr__(self) -> str:
        return (f"Model({self.config.model_type!r}, path={str(self.path)!r}, engine={self.engine!r}, "
                f"dtype={self.dtype!r}, cache={self.cache.max_batch} x {self.cache.max_len})")

    def __copy__(self):
        raise UnsupportedError("Model: a model is not copied (it owns its engine, weights and cache; a "
                               "copy would share them): memra.load the folder again for a second one", 50000)

    def __deepcopy__(self, memo):
        self.__copy__()

    def __reduce__(self):
        raise UnsupportedError("Model: a model is not pickled (it owns device memory and an engine): "
                               "pass its path and memra.load it where it is needed", 50000)

    # ------------------------------------------------------------------ caches
    def new_cache(self, max_batch: int, max_len: int) -> _core.Cache:
        """A fresh Cache with `max_batch` slots of `max_len` tokens each (OutOfMemoryError if it
        cannot fit, before anything is allocated)."""
        return _core.Cache(self.engine, self.net.state_specs(),
                           max_batch=count_arg(max_batch, "new_cache: max_batch", 1),
                           max_len=count_arg(max_len, "new_cache: max_len", 1), latent_dtype=self.dtype)

    @property
    def dtype(self) -> str:
        """Compute dtype of the weights: 'float32' (CPU, or CUDA f32) or 'bfloat16' (CUDA)."""
        return self.net.dtype

    # ------------------------------------------------------------------ forward
    @property
    def prefill_chunk(self) -> int:
        """Prompt tokens a prefill runs at a time (``engine.options.prefill_chunk``; 0: the whole
        prompt at once). docs/prefill.md."""
        return int(self.engine.options.prefill_chunk)

    def _chunks(self, n: int) -> list[tuple[int, int]]:
        """[start, stop) of each chunk of an n-token prompt."""
        step = self.prefill_chunk or n
        return [(a, min(a + step, n)) for a in range(0, n, step)]

    def logits(self, token_ids) -> np.ndarray:
        """Full prefill of `token_ids` [T] from an empty cache -> logits [T, vocab] float32 (a
        prompt longer than ``prefill_chunk`` runs in chunks, each one's rows copied to the host).
        ContractError for empty or non-integer ids or an id outside the vocabulary (40023);
        OutOfMemoryError when a cache of T tokens does not fit. The rows are the forward pass's
        as computed, as transformers' logits are: weights holding NaN or inf give non-finite
        rows here and from prefill / decode, where generate / stream / the server raise
        NonFiniteError rather than draw a token from such a row."""
        with self._lock:
            ids = ids_arg(token_ids, "logits")
            self._check_vocab(ids, "logits: token_ids")
            cache = self.new_cache(1, len(ids))
            chunks = self._chunks(len(ids))
            rows = []
            for a, b in chunks:
                h = self.net.hidden(cache, np.zeros(1, np.int32), ids[a:b], decode=False)
                rows.append(self.net.to_host(self.net.logits_of(h)))
                if b < len(ids):
                    cache.commit(0, b - a)
            return rows[0] if len(rows) == 1 else np.concatenate(rows)

    @guarded
    def prefill(self, cache: _core.Cache, slot: int, token_ids) -> np.ndarray:
        """Append `token_ids` [T] to `slot` (which may already hold tokens: multi-turn) and return
        the logits of the last one [vocab] (numpy float32). A prompt longer than
        ``prefill_chunk`` tokens runs in chunks (docs/prefill.md). CacheFullError (nothing
        written) when they do not fit; ContractError: CONTRACT_RANGE for a slot outside [0,
        cache.max_batch), 40026 for a slot of the model's own cache that a generation in flight
        holds (use new_cache() for slots of your own), 40025 for a slot that is not an int or a
        cache of another layer count than the model's (40020: not an initialised memra.Cache),
        and for the token ids as :meth:`generate` names them; on any error the slot is left as
        it was. The slot is held (Cache.hold) for the call, so another thread's free / commit
        of it meanwhile is refused (40026)."""
        with self._lock:
            _cache_arg(cache, "prefill", self.cache.num_layers)
            self._check_not_held(cache, [slot], "prefill")
            return self.net.to_host(self._prefill(cache, slot, token_ids))[0]

    def _prefill(self, cache: _core.Cache, slot: int, token_ids, owner: int = 0):
        """prefill, leaving the logits [1, vocab] on the engine's device; `owner`: the token the
        slot is held with (0: not held).

        A prompt longer than ``prefill_chunk`` runs in chunks, each through every layer and
        committed before the next (a slot holding tokens is continued exactly so). Every check
        that can refuse the prompt (room for all of it, the owner, the token ids) runs before
        the first chunk; should a chunk or the logits fail anyway (out of memory, an interrupt),
        the slot is put back as it was before the call: freed when it was empty, else restored
        from a snapshot taken first (Cache.snapshot), and the error goes on."""
        with self._lock:
            ids = ids_arg(token_ids, "prefill")
            self._check_vocab(ids, "prefill: token_ids")
            if not is_int(slot):
                raise ContractError(f"prefill: slot must be an integer, got {slot!r}", 40025)
            if not 0 <= int(slot) < cache.max_batch:  # every bad index one range error
                raise ContractError(f"prefill: slot {int(slot)} is outside [0, {cache.max_batch})", 40023)
            slots = np.array([int(slot)], np.int32)
            check_owners(cache, slots, [owner], "prefill")
            chunks = self._chunks(len(ids))
            slot = int(slot)
            # Held before its length is read: no other thread frees it between the checks and
            # the chunks.
            taken: list[tuple[int, int]] = []
            try:
                (owner,) = hold_for_call(cache, slots, [owner], taken)
                self._check_room(cache, slots, len(ids), "prefill")
                # The undo of a failure: a slot holding tokens goes back to a snapshot taken
                # first (uncommitted or not: the DSA indexer writes its tail ring before the
                # commit, docs/prefill.md), an empty one is freed once a chunk was committed.
                # The flag is set before the commit, so no interrupt between the two skips the
                # undo.
                saved = cache.snapshot(slot) if cache.length(slot) > 0 else None
                committed = False
                try:
                    for a, b in chunks:
                        h = self.net.hidden(cache, slots, ids[a:b], decode=False)
                        committed = True
                        cache.commit(slot, b - a, owner=owner)
                    return self.net.logits_of(self.net.last_row(h))
                except BaseException as e:
                    if saved is not None or committed:  # (a second Ctrl-C waits for the undo)
                        batch_prefill.put_back(cache, slot, saved, owner, e, "prefill")
                    raise
            finally:
                release_holds(cache, taken)

    @guarded
    def prefill_batch(self, cache: _core.Cache, slots, prompts) -> np.ndarray:
        """Append prompts[j] (token ids [T_j]; lengths may differ) to slots[j] (distinct; each
        may already hold tokens) in one batched prefill and return the logits of each prompt's
        last token [P, vocab] (numpy float32; [0, vocab] for no prompts). Row j is what
        ``prefill(cache, slots[j], prompts[j])`` returns (the same bytes on the CPU; on CUDA
        within the rounding of GEMMs over more rows). The prompts' rows are packed: the row-wise
        layers run once over all of them, the mixers per sequence; a call holds at most
        ``prefill_chunk`` rows (memra.batch_prefill, docs/prefill.md). Checked before anything
        runs: ContractError naming prompts[i] (empty, not integers, an id outside the vocabulary)
        or slots (not one per prompt, outside the cache, repeated; held by a generation in
        flight: code 40026) or the cache (40025: another layer count than the model's);
        CacheFullError (nothing written) when a prompt does not fit its slot. On any error every
        slot is left as it was. The slots are held for the call, as :meth:`prefill`'s."""
        with self._lock:
            _cache_arg(cache, "prefill_batch", self.cache.num_layers)
            slots, ids = batch_prefill.check_args(self, cache, slots, prompts, "prefill_batch")
            self._check_not_held(cache, slots, "prefill_batch")
            if not ids:
                return np.zeros((0, self.config.vocab_size), np.float32)
            return self.net.to_host(self._prefill_batch(cache, slots, ids))

    def _prefill_batch(self, cache: _core.Cache, slots: np.ndarray, prompts: list[np.ndarray],
                       owners: list[int] | None = None):
        """prefill_batch of checked arguments (P >= 1), the logits [P, vocab] left on the
        engine's device; `owners`: the token each slot is held with (None: none held)."""
        with self._lock:
            owners = [0] * len(slots) if owners is None else [int(o) for o in owners]
            check_owners(cache, slots, owners, "prefill_batch")
            taken: list[tuple[int, int]] = []
            try:
                owners = hold_for_call(cache, slots, owners, taken)
                return batch_prefill.run(self, cache, slots, prompts, owners, "prefill_batch")
            finally:
                release_holds(cache, taken)

    @guarded
    def decode(self, cache: _core.Cache, slots, token_ids) -> np.ndarray:
        """One token for each of `slots` (distinct) -> logits [len(slots), vocab] (numpy float32).
        Checked before any layer runs: ContractError for as many slots as tokens not given
        (40000), a repeated slot (40025), a slot outside [0, cache.max_batch) or a token id
        outside the vocabulary (40023), a slot held by a generation, stream or request in flight
        (40026), a cache of another layer count than the model's (40025); CacheFullError (30002)
        when a slot already holds ``cache.max_len`` tokens. On any error the cache is
        unchanged, but for a Ctrl-C that arrives while the step's rows are committed: it is
        raised once all are, with the step in the cache (docs/prefill.md). The slots are held
        for the call, as :meth:`prefill`'s."""
        with self._lock:
            _cache_arg(cache, "decode", self.cache.num_layers)
            self._check_not_held(cache, slots, "decode")
            return self.net.to_host(self._decode(cache, slots, token_ids))

    def _check_not_held(self, cache: _core.Cache, slots, what: str) -> None:
        """ContractError (40026) when a valid slot among `slots` is held (Cache.hold); bad slot
        values are left to the full checks."""
        try:
            flat = np.atleast_1d(np.asarray(slots, dtype=object)).ravel()
        except (ValueError, TypeError):  # ragged nesting numpy cannot shape even as objects
            flat = []
        slots = [int(s) for s in flat if is_int(s) and 0 <= int(s) < cache.max_batch]
        check_owners(cache, slots, [0] * len(slots), what)

    def _decode(self, cache: _core.Cache, slots, token_ids, owners: list[int] | None = None,
                before_commit=None):
        """decode, leaving the logits [B, vocab] on the engine's device; `owners`: the token each
        slot is held with (None: none held). Without the decode runner the step is committed
        after its logits are taken and after ``before_commit(logits)`` returns (an error in
        either leaves the cache unchanged)."""
        with self._lock:
            slots = ids_arg(slots, "decode", "slots")
            ids = ids_arg(token_ids, "decode")
            if len(slots) != len(ids):
                raise ContractError(f"decode: {len(slots)} slots but {len(ids)} tokens", 40000)
            values, counts = np.unique(slots, return_counts=True)
            if (counts > 1).any():
                raise ContractError(f"decode: slots must be distinct (one token per slot a step), but "
                                    f"{values[counts > 1].tolist()} appear more than once", 40025)
            self._check_vocab(ids, "decode: token_ids")
            self._check_room(cache, slots, 0, "decode")  # the slots' range (room: once held, below)
            owners = [0] * len(slots) if owners is None else owners
            check_owners(cache, slots, owners, "decode")
            taken: list[tuple[int, int]] = []
            try:
                owners = hold_for_call(cache, slots, owners, taken)
                self._check_room(cache, slots, 1, "decode")
                if self._runner is not None and cache is self.cache:
                    b = self._runner.step(slots, ids, owners=owners)  # (under the lock: copied before another step)
                    return _core.take_rows(b.logits, 0, len(slots), engine=self.engine)
                h = self.net.hidden(cache, slots, ids, decode=True)
                logits = self.net.logits_of(h)
                if before_commit is not None:
                    before_commit(logits)
                # Every row's commit or none: the logits are taken first, and an interrupt waits.
                commit_rows(cache, slots, owners)
                return logits
            finally:
                release_holds(cache, taken)

    def _check_vocab(self, ids: np.ndarray, what: str) -> None:
        check_token_ids(ids, self.config.vocab_size, what)

    def _decode_sampled(self, slots: list[int], toks: list[int], temperature: float, top_k, top_p,
                        seeds: list[int], step: int) -> list[int]:
        """One decode step over self.cache that also draws the next token of every row (on a CUDA
        engine inside the step's graph): row j feeds toks[j] to slots[j] and draws with seed
        seeds[j] and counter `step` -- what _decode + _pick per row give."""
        if self._runner is None:
            logits = self._decode(self.cache, slots, toks)
            return [self._pick(logits, j, temperature, top_k, top_p, seeds[j], step) for j in range(len(slots))]
        slots_a = ids_arg(slots, "decode", "slots")
        ids = ids_arg(toks, "decode")
        self._check_room(self.cache, slots_a, 1, "decode")
        self._check_vocab(ids, "decode")
        sampling = Sampling.of(temperature, top_k, top_p)
        n = len(slots)
        with self._lock:  # the bucket's tokens are read before another step
            b = self._runner.step(slots_a, ids, sampling, counters=np.full(n, step, np.uint64),
                                  seeds=np.array(seeds, np.uint64))
            return [int(t) for t in self.engine.to_host(b.tokens)[:n]]

    def index_lists(self, token_ids) -> dict[int, np.ndarray]:
        """The DSA index list [T, index_topk + index_kpool - 1] each full DSA layer uses for a full
        prefill of `token_ids` (entries -1 are unused), keyed by layer index (in chunks of
        ``prefill_chunk`` tokens, as the prefill runs)."""
        with self._lock:
            ids = ids_arg(token_ids, "index_lists")
            self._check_vocab(ids, "index_lists: token_ids")
            cache = self.new_cache(1, len(ids))
            parts: dict[int, list[np.ndarray]] = {}
            for a, b in self._chunks(len(ids)):
                record: dict[int, np.ndarray] = {}
                self.net.hidden(cache, np.zeros(1, np.int32), ids[a:b], decode=False, record=record)
                for layer, idx in record.items():
                    parts.setdefault(layer, []).append(idx)
                if b < len(ids):
                    cache.commit(0, b - a)
            return {layer: p[0] if len(p) == 1 else np.concatenate(p) for layer, p in parts.items()}

    def _check_room(self, cache: _core.Cache, slots: np.ndarray, n: int, what: str) -> None:
        # Every layer checks its own room too; checking here first keeps a step all-or-nothing
        # (no layer runs when any slot would overflow).
        for s in slots:
            if not 0 <= int(s) < cache.max_batch:
                raise ContractError(f"{what}: slot {int(s)} is outside [0, {cache.max_batch})", 40023)
            if cache.length(int(s)) + n > cache.max_len:
                raise CacheFullError(
                    f"{what}: slot {int(s)} holds {cache.length(int(s))} of {cache.max_len} tokens; "
                    f"{n} more do not fit", 30002)

    # ------------------------------------------------------------------ generation
    def _stop_ids(self, stop_token_ids, ignore_eos: bool, op: str = "generate") -> set[int]:
        if not isinstance(ignore_eos, (bool, np.bool_)):
            raise ContractError(f"{op}: ignore_eos must be True or False, got {ignore_eos!r}", 40025)
        stops = set() if ignore_eos else set(self.eos_token_ids)
        what = f"{op}: stop_token_ids"
        if stop_token_ids is None:
            return stops
        if is_int(stop_token_ids):
            stop_token_ids = [int(stop_token_ids)]
        elif isinstance(stop_token_ids, np.ndarray) and stop_token_ids.ndim == 0:
            stop_token_ids = stop_token_ids.reshape(1)
        elif isinstance(stop_token_ids, (bool, float, str, bytes, bytearray)) or not isinstance(
                stop_token_ids, (Sequence, set, frozenset, np.ndarray)):
            raise ContractError(f"{what} must be an integer id or a sequence of ids, got "
                                f"{type(stop_token_ids).__name__}", 40025)
        # An array goes in whole, so a 2-D one is shown as the array it is.
        ids = ids_arg(stop_token_ids if isinstance(stop_token_ids, np.ndarray) else list(stop_token_ids),
                      op, "stop_token_ids", empty_ok=True)
        check_token_ids(ids, self.config.vocab_size, what)
        return stops | set(ids.tolist())

    def _check_fits(self, n: int, max_new_tokens: int, what: str) -> None:
        """CacheFullError naming the prompt (`what`) unless n + max(max_new_tokens - 1, 0) <=
        max_len: the prompt takes n rows, every new token but the last (never fed back) one."""
        need = n + max(max_new_tokens - 1, 0)
        if need > self.cache.max_len:
            if max_new_tokens == 0:
                raise CacheFullError(f"{what} of {n} tokens needs {n} cache rows, beyond max_len "
                                     f"{self.cache.max_len}", 30002)
            new = f"{max_new_tokens} new token{'' if max_new_tokens == 1 else 's'}"
            raise CacheFullError(f"{what} of {n} tokens + {new} need {need} cache rows (the last new token is "
                                 f"not fed back), beyond max_len {self.cache.max_len}", 30002)

    def take_slots(self, n: int, what: str = "take_slots") -> list[SlotLease]:
        """Hold n free slots of the model's own cache (held by nobody, holding no tokens) for
        sequences of your own making (memra.batch.DecodeBatch; the server's scheduler): each
        :class:`memra.batch.SlotLease` gives its slot back with ``release()``. ContractError when
        fewer than n are free; slots holding your tokens are never taken. A Ctrl-C while the
        slots are taken gives them back before KeyboardInterrupt goes on; one that arrives after
        this returns, before your own ``try``, is yours to handle (as with ``open()``)."""
        n = count_arg(n, f"{what}: n", 1)
        leases: list[SlotLease] = []
        try:
            take_free_slots(self, n, what, leases)
        except BaseException:  # a Ctrl-C as the holds finished: none is left held
            release_all(leases)
            raise
        return leases

    def _pick(self, logits, row: int, temperature: float, top_k, top_p, seed: int, step: int) -> int:
        """Sample row `row` of logits [B, vocab] (on the engine's device) with memra's sampler;
        on a CUDA engine the sampling runs there and only the token comes back."""
        with self._lock:
            e = self.net.op_engine
            one = logits if logits.shape[0] == 1 else _core.take_rows(logits, row, 1, engine=e)
            counters = np.array([step], np.uint64)
            tok = _core.sample(one, e.to_device(counters) if e else counters, temperature=float(temperature),
                               top_k=int(top_k or 0), top_p=float(1.0 if top_p is None else top_p),
                               seed=int(seed), engine=e)
            return int(self.net.to_host(tok)[0])

    def stream(self, prompt_ids, max_new_tokens: int, temperature: float = 0.0, top_k: int | None = None,
               top_p: float | None = None, seed: int | None = None, stop_token_ids=None,
               ignore_eos: bool = False) -> TokenStream:
        """New tokens one at a time, as an iterator (see :meth:`generate` for the arguments).

        The arguments are checked here, before iteration starts (the errors of :meth:`generate`
        but the free slot's); the slot of the model's cache is taken at the first ``next()``
        (ContractError there when none is free) and given back with the last token, or at once
        when the stream is closed (``close()``, or leaving ``with model.stream(...) as s:``),
        without waiting for the garbage collector (which also closes a dropped stream, whenever
        it runs). NonFiniteError (after the tokens before it) when a row
        of logits is not finite."""
        return TokenStream(self._checked_stream("stream", prompt_ids, max_new_tokens, temperature, top_k, top_p,
                                                seed, stop_token_ids, ignore_eos))

    def _checked_stream(self, op: str, prompt_ids, max_new_tokens, temperature, top_k, top_p, seed,
                        stop_token_ids, ignore_eos) -> Iterator[int]:
        """stream / generate: the arguments checked (errors naming `op`), the tokens' generator
        unstarted (generate runs it bare: a Ctrl-C in a TokenStream's __del__ is lost)."""
        ids = ids_arg(prompt_ids, op, "prompt_ids")
        if len(ids):
            self._check_vocab(ids, f"{op}: prompt_ids")
        seed = generation_args(max_new_tokens, temperature, top_k, top_p, seed, op)
        self._check_fits(len(ids), max_new_tokens, f"{op}: prompt_ids")
        stops = self._stop_ids(stop_token_ids, ignore_eos, op)
        rs = RowSampling(float(temperature), top_k, top_p, seed)
        return self._stream(ids, max_new_tokens, rs, stops, op)

    def _stream(self, ids: np.ndarray, max_new_tokens: int, rs: RowSampling, stops: set[int],
                op: str) -> Iterator[int]:
        if max_new_tokens == 0:
            return
        leases: list[SlotLease] = []
        rows = None
        try:  # the slot goes back before the last token is yielded
            (lease,) = take_free_slots(self, 1, op, leases)
            rows = self._decode_rows([ids], [lease], max_new_tokens, stops, [rs], op)
            for _, tok, last in rows:
                if last:
                    lease.release()
                yield tok
        finally:
            close_then_release(rows, leases)

    @guarded
    def generate(self, prompt_ids, max_new_tokens: int, temperature: float = 0.0, top_k: int | None = None,
                 top_p: float | None = None, seed: int | None = None, stop_token_ids=None,
                 ignore_eos: bool = False) -> list[int]:
        """Generate up to `max_new_tokens` after `prompt_ids`; returns the new tokens only.

        temperature 0 is greedy (argmax, ties to the lower id); otherwise temperature, then
        top_k, then top_p, drawn with memra's counter-based RNG from `seed` (the same seed gives
        the same tokens on every backend; None is seed 0, so unseeded sampling repeats itself).
        Stops after an EOS id of the checkpoint (included in the output, as transformers does)
        unless `ignore_eos`, or after any of `stop_token_ids` (an id or a sequence of ids).
        prompt_ids: a non-empty sequence (or 1-D integer array) of token ids. Returns a list of
        ints. CacheFullError when the prompt (whatever max_new_tokens is) or prompt + new tokens
        - 1 (the last is never fed back) exceed the cache's max_len; NonFiniteError when a row of
        logits is not finite (no token is drawn from it); ContractError when no slot of the
        model's cache is free (memra.batch: generation never takes a slot holding your tokens),
        for an empty or non-integer prompt (40000 / 40020), an id outside the vocabulary
        (40023), or max_new_tokens (an int >= 0), temperature (finite, >= 0), top_k (None or an
        int >= 0), top_p (None or in (0, 1]), seed (None or in [0, 2^64)) or ignore_eos of another
        type or range, or stop_token_ids that is no id or sequence of ids (40025); its ids are held
        to the prompt's rules (40000 / 40020 / 40023); each named, before anything runs.
        On a CUDA engine the steps are pipelined (the next one is queued before this one's token
        is read); the tokens are those of one step at a time.
        """
        return list(self._checked_stream("generate", prompt_ids, max_new_tokens, temperature, top_k, top_p, seed,
                                         stop_token_ids, ignore_eos))

    @guarded
    def generate_batch(self, prompts: Sequence, max_new_tokens: int, temperature: float = 0.0,
                       top_k: int | None = None, top_p: float | None = None, seed: int | None = None,
                       stop_token_ids=None, ignore_eos: bool = False) -> list[list[int]]:
        """Generate for several prompts of different lengths, decoding them together (one decode
        step serves every unfinished prompt). Prompt i samples with seed + i (seed None: 0), so
        each result equals ``generate(prompts[i], seed=seed + i, ...)`` wherever the batched
        steps' rounding does not decide a token: a batched step sums in other orders than a
        one-row step, and in bfloat16 it runs the routed experts on tensor cores with their
        inputs rounded to bfloat16 (KernelOptions.moe_tensor_cores). At most
        ``cache.max_batch`` prompts. The prompts are prefilled together (:meth:`prefill_batch`:
        their rows packed), each first token drawn from its own row of the logits.
        NonFiniteError naming the sequence when a row of one sequence's logits is not finite: the
        call ends there and no sequence's tokens are returned (:meth:`stream` one prompt at a time,
        or memra.batch.DecodeBatch, keeps the others going). The argument errors of
        :meth:`generate` (prompt i named as ``prompts[i]``), and ContractError for more prompts
        than ``cache.max_batch`` or than free slots, or seed + len(prompts) past 2^64;
        CacheFullError naming the prompt that cannot fit."""
        if not listed(prompts):
            raise ContractError(f"generate_batch: prompts must be a list of token id lists, got "
                                f"{shown(prompts)}", 40020)
        all_ids = [ids_arg(p, "generate_batch", f"prompts[{i}]") for i, p in enumerate(prompts)]
        n = len(all_ids)
        # Every argument is checked before anything runs, also when there is nothing to do.
        seed = generation_args(max_new_tokens, temperature, top_k, top_p, seed, "generate_batch")
        stops = self._stop_ids(stop_token_ids, ignore_eos, "generate_batch")
        if n > self.cache.max_batch:
            raise ContractError(f"generate_batch: {n} prompts exceed the cache's max_batch "
                                f"{self.cache.max_batch}", 40025)
        if n > 0 and seed + n - 1 > 2**64 - 1:
            raise ContractError(f"generate_batch: prompt i samples with seed + i, and seed {seed} + "
                                f"{n - 1} does not fit in 64 bits", 40025)
        for i, ids in enumerate(all_ids):
            self._check_fits(len(ids), max_new_tokens, f"generate_batch: prompts[{i}]")
            self._check_vocab(ids, f"generate_batch: prompts[{i}]")
        if n == 0:
            return []
        if max_new_tokens == 0:
            return [[] for _ in range(n)]
        out: list[list[int]] = [[] for _ in range(n)]
        leases: list[SlotLease] = []
        rows = None
        try:
            take_free_slots(self, n, "generate_batch", leases)
            rs = [RowSampling(float(temperature), top_k, top_p, seed + i) for i in range(n)]
            rows = self._decode_rows(all_ids, leases, max_new_tokens, stops, rs, "generate_batch")
            for i, tok, _ in rows:
                out[i].append(tok)
        finally:
            close_then_release(rows, leases)
        return out

    def _decode_rows(self, prompts: list[np.ndarray], leases: list[SlotLease], max_new_tokens: int,
                     stops: set[int], samplings: list[RowSampling], what: str) -> Iterator[tuple[int, int, bool]]:
        """The tokens of sequences i = 0..n-1 decoding together (prompts[i] prefilled into the
        slot of leases[i], sampled with samplings[i]), as (i, token, last) in the order they are
        produced: first tokens, then one per unfinished row per step. A row is finished after a
        token in `stops` or its max_new_tokens-th token (last = True on that one). NonFiniteError
        naming the sequence when one's logits are not finite.

        On a CUDA engine the steps are pipelined: while the rows stay the same, step k + 1 is
        enqueued (chained on the device: its ids are step k's draws) before step k's tokens are
        read back (Engine.to_host_async), so the device does not wait for the host between
        steps. A row that stops on a token then has one step too many in flight: that draw is
        dropped, and the slot's extra cached token goes when the slot is freed. The tokens are
        those of one synchronous step at a time."""
        batch = DecodeBatch(self)
        rows, finished = [], []
        index: dict[int, int] = {}

        def take(i: int, tok: int) -> tuple[int, int, bool]:
            finished[i] = tok in stops or rows[i].count == max_new_tokens
            return i, tok, finished[i]

        # All prompts prefilled together (one batched prefill: Model._prefill_batch).
        for i, r in enumerate(batch.start_many(prompts, samplings, leases, what)):
            if isinstance(r, NonFiniteError):
                raise NonFiniteError(in_sequence(what, i, r), NON_FINITE) from None
            rows.append(r)
            index[id(r)] = i
            finished.append(False)
        for i, r in enumerate(rows):
            yield take(i, r.last)
        active = [r for i, r in enumerate(rows) if not finished[i]]
        pending = deque([batch.launch(active, what)]) if active else deque()
        while pending:
            step = pending[0]
            # Queue the next step of the same rows first, when every one of them still needs a
            # token after the one in flight (unless that one stops it).
            # (A list, not a generator: one all() leaves unfinished is closed by the garbage
            # collector, where a Ctrl-C at its first bytecode would be lost.)
            if len(pending) == 1 and all([not finished[index[id(r)]] and r.count + 2 <= max_new_tokens
                                          for r in step.rows]):
                nxt = batch.try_chain(step.rows, what)
                if nxt is not None:
                    pending.append(nxt)
            pending.popleft()
            for r, res in batch.collect(step, what):
                i = index[id(r)]
                if finished[i]:
                    continue  # a draw past the row's end (its step was chained before the stop)
                if isinstance(res, NonFiniteError):
                    raise NonFiniteError(in_sequence(what, i, res), NON_FINITE)
                yield take(i, res)
            if not pending:
                active = [r for r in step.rows if not finished[index[id(r)]]]
                if active:
                    pending.append(batch.launch(active, what))
