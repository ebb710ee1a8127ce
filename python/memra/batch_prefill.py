"""Batched prefill: P prompts of different lengths into P slots in one call (``Model.prefill_batch``,
and through ``DecodeBatch.start_many`` ``generate_batch``). docs/prefill.md says the whole design.

The prompts' token rows are packed one after another ([sum T_i] ids, per-sequence offsets
cu_seqlens [P + 1]) and go through ``DecoderModel.hidden(..., offsets=...)``: everything row-wise
(embedding, residual / mHC, norms, projections, dense MLPs, the MoE's routing and grouped experts,
the final norm) runs once over the packed rows; each mixer continues each slot from that sequence's
rows alone. The LM head runs on each prompt's last row only ([P, vocab]).

``prefill_chunk`` bounds the rows of one call: every prompt is first cut into pieces of at most
``prefill_chunk`` tokens (exactly the pieces ``Model.prefill`` runs it in), and the pieces are packed
in prompt order into calls of at most ``prefill_chunk`` rows, a call holding at most one piece of a
slot (a slot's pieces run in order, one call after another, each committed before the next). So
short prompts share a call, a long prompt's full pieces run alone and its tail shares the next
call with the prompts after it, and scratch stays O(prefill_chunk).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from . import _core
from ._interrupts import uninterrupted
from .errors import ContractError, check_owners, check_token_ids, ids_arg, listed, shown

if TYPE_CHECKING:
    from .model import Model

Piece = tuple[int, int, int]  # (sequence j, first token, end token) of one prompt


def plan_calls(lengths: Sequence[int], chunk: int) -> list[list[Piece]]:
    """The calls of a batched prefill of prompts of `lengths` tokens with prefill_chunk `chunk`
    (0: no bound): each a list of pieces (j, a, b), prompt j's tokens [a, b).

    Prompt j is cut at multiples of `chunk` (Model._chunks' pieces); the pieces, in prompt order,
    fill a call until the next would pass `chunk` rows or belongs to a sequence already in it."""
    calls: list[list[Piece]] = []
    cur: list[Piece] = []
    rows = 0
    for j, n in enumerate(lengths):
        step = chunk or n
        for a in range(0, n, step):
            b = min(a + step, n)
            if cur and ((chunk and rows + b - a > chunk) or cur[-1][0] == j):
                calls.append(cur)
                cur, rows = [], 0
            cur.append((j, a, b))
            rows += b - a
    if cur:
        calls.append(cur)
    return calls


def check_args(model: Model, cache: _core.Cache, slots, prompts, what: str) -> tuple[np.ndarray, list[np.ndarray]]:
    """Every check of a batched prefill that needs no slot state -> (slots int32 [P], prompts as
    int32 [T_i]): `prompts` a sequence of non-empty 1-D int sequences, `slots` as many distinct
    slots of `cache`, every token id in the vocabulary. ContractError naming the argument."""
    if not listed(prompts):
        raise ContractError(f"{what}: prompts must be a list of token id lists, got {shown(prompts)}", 40020)
    ids = [ids_arg(p, what, f"prompts[{i}]") for i, p in enumerate(prompts)]
    if not listed(slots):
        raise ContractError(f"{what}: slots must be a list of slot indices, got {shown(slots)}", 40020)
    s = ids_arg(slots, what, "slots", empty_ok=True)
    if len(s) != len(ids):
        raise ContractError(f"{what}: {len(s)} slots for {len(ids)} prompts (one slot per prompt)", 40000)
    for v in s:
        if not 0 <= int(v) < cache.max_batch:
            raise ContractError(f"{what}: slots holds {int(v)}, outside the cache's [0, {cache.max_batch})",
                                40023)
    values, counts = np.unique(s, return_counts=True)
    if (counts > 1).any():
        raise ContractError(f"{what}: slots must be distinct (one sequence per slot), but "
                            f"{values[counts > 1].tolist()} appear more than once", 40025)
    for i, p in enumerate(ids):
        check_token_ids(p, model.config.vocab_size, f"{what}: prompts[{i}]")
    return s, ids


def run(model: Model, cache: _core.Cache, slots: np.ndarray, prompts: list[np.ndarray], owners: list[int],
        what: str):
    """Prefill prompts[j] into slots[j] (held with owners[j]; 0: not held), checked by
    :func:`check_args` -> the logits of each prompt's last token [P, vocab] float32 on the
    engine's device.

    Room for every prompt is checked before anything runs (CacheFullError, nothing written);
    on any failure after (out of memory, an interrupt) every slot is put back as it was and the
    error goes on: a slot empty before the call is freed, another restored from a snapshot
    taken before the first call (Cache.snapshot: its recurrent planes, conv and tail rings)."""
    net = model.net
    for i, (s, p) in enumerate(zip(slots, prompts)):
        model._check_room(cache, np.array([s], np.int32), len(p), f"{what}: prompts[{i}]")
    check_owners(cache, slots, owners, what)
    held = [cache.length(int(s)) > 0 for s in slots]
    # What the call appended is undone per slot: a slot that held tokens goes back to its
    # snapshot, committed or not (the DSA indexer writes its tail ring before the commit,
    # docs/prefill.md); an empty one is freed once a piece of it was committed.
    saved = {j: cache.snapshot(int(s)) for j, s in enumerate(slots) if held[j]}
    committed: set[int] = set()
    e = net.op_engine
    last: list = [None] * len(slots)  # each prompt's last hidden row [1, hidden]
    try:
        for call in plan_calls([len(p) for p in prompts], model.prefill_chunk):
            offsets = np.cumsum([0] + [b - a for _, a, b in call])
            ids = np.concatenate([prompts[j][a:b] for j, a, b in call])
            h = net.hidden(cache, np.array([slots[j] for j, _, _ in call], np.int32), ids, decode=False,
                           offsets=offsets)
            _commit_pieces(cache, slots, owners, [(j, b - a) for j, a, b in call], committed)
            for (j, a, b), end in zip(call, offsets[1:]):
                if b == len(prompts[j]):
                    last[j] = _core.take_rows(h, int(end) - 1, 1, engine=e)
        return net.logits_of(_core.concat_rows(last, engine=e))
    except BaseException as e:
        _put_back_all(cache, slots, saved, owners, committed, e, what)
        raise


@uninterrupted
def _commit_pieces(cache: _core.Cache, slots, owners, pieces: list[tuple[int, int]], committed: set[int]) -> None:
    """Commit one packed call's pieces (j, rows) to slots[j] together (a Ctrl-C waits), each j
    added to `committed` before its commit (no interrupt between them skips the undo)."""
    for j, n in pieces:
        committed.add(j)
        cache.commit(int(slots[j]), n, owner=owners[j])


@uninterrupted
def _put_back_all(cache: _core.Cache, slots, saved: dict, owners, committed: set[int], error: BaseException,
                  what: str) -> None:
    """Undo a failed batched prefill in every slot it touched (a second Ctrl-C waits for all)."""
    for j in sorted(committed | set(saved)):
        put_back(cache, int(slots[j]), saved.get(j), owners[j], error, what)


@uninterrupted
def put_back(cache: _core.Cache, slot: int, saved, owner: int, error: BaseException, what: str) -> None:
    """Undo what a failed prefill appended to `slot`: restore `saved`, the snapshot of a slot that
    held tokens, or free the slot (it was empty). Should that fail too, it is noted on `error`,
    the one the caller raises (on Python 3.10, which has no notes, logged on "memra")."""
    try:
        if saved is None:
            cache.free(slot, owner=owner)
        else:
            cache.restore(saved, owner=owner)
    except Exception as undo:  # noqa: BLE001 - the first error is the one to raise
        note = f"{what}: putting slot {slot} back failed too: {undo}"
        if hasattr(error, "add_note"):  # Python 3.11+
            error.add_note(note)
        else:  # 3.10 has no notes: said on memra's logger instead
            logging.getLogger("memra").error(note)
