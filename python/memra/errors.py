"""memra's exceptions: one class per status band (the codes: cpp/include/memra/status.h, and
``memra._core.status`` by name).

Every error carries ``.code``, the integer status the C++ runtime returned (0 is never raised):

======================  =======================  ==========================================
class                   band                     meaning
======================  =======================  ==========================================
``CudaError``           10000 + cudaError_t      CUDA runtime failure
``LibraryError``        20000 + library status   cuBLAS / cuBLASLt declined or failed
``OutOfMemoryError``    30001                    out of device or host memory
``CacheFullError``      30002                    a slot's cache is full
``ContractError``       40000+                   shape / dtype / device / range violation
``UnsupportedError``    50000+                   no CUDA (50001), a geometry not instantiated
                                                 (50002), a host copy or wait inside a CUDA
                                                 graph capture (50003), a native call
                                                 after the interpreter's exit began (50004),
                                                 or a model_type / config / dtype memra
                                                 cannot run (50000)
``NonFiniteError``      60001                    a row of logits holds NaN or +-inf
======================  =======================  ==========================================

ContractError 40026 (``memra._core.status.CONTRACT_SLOT_HELD``) is a change to a cache slot that
another owner holds (a generation, stream or server request in flight; ``Cache.hold``).

After any of these the Engine stays usable and the Cache is unchanged. A NonFiniteError ends
the sequence whose logits were not finite (``generate_batch``: the whole call, naming the
sequence): memra never samples a token from such a row. (The one change it leaves: a decode step
is committed for all of its rows, the non-finite one included, whose slot then holds the token it
was fed; generation frees that slot as the sequence ends.)

The argument checks the Python API shares live here too, raising these errors: token ids
(:func:`ids_arg`, :func:`check_token_ids`), slot owners (:func:`check_owners`).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


class MemraError(Exception):
    """Base class of every memra error. ``code`` is the status code (see the module table)."""

    def __init__(self, message: str, code: int = 0) -> None:
        super().__init__(message)
        self.code = int(code)


class CudaError(MemraError, RuntimeError):
    """A CUDA runtime call failed (code 10000 + cudaError_t)."""


class LibraryError(MemraError, RuntimeError):
    """cuBLAS / cuBLASLt declined or failed (code 20000 + library status)."""


class OutOfMemoryError(MemraError, MemoryError):
    """Device or host memory would not fit the request (code 30001)."""


class CacheFullError(MemraError, MemoryError):
    """A cache slot has no room for the tokens asked for (code 30002)."""


class ContractError(MemraError, ValueError):
    """Bad input: wrong shape, dtype, device, stride, range, an argument of the wrong type, a
    missing tensor, or a change to a slot another owner holds (code 40000+; 40026 for that)."""


class UnsupportedError(MemraError, NotImplementedError):
    """Not supported here: no CUDA build or device, a geometry not instantiated, or a model_type,
    config or dtype memra cannot run (code 50000+)."""


class NonFiniteError(MemraError, ArithmeticError):
    """A row of logits held NaN or +-inf (NaN weights, an overflow), so no token was drawn from
    it (code 60001). Generation raises it for that sequence (``generate_batch`` for the call,
    naming the sequence; ``DecodeBatch`` returns it as that row's result); the server ends that
    request with an error object."""


NON_FINITE = 60001  # memra._core.status.NON_FINITE
SLOT_HELD = 40026  # memra._core.status.CONTRACT_SLOT_HELD


def in_sequence(what: str, i: int, err: Exception) -> str:
    """`what: sequence i: ` + err's message, without err's own `what: ` prefix (a batched call
    naming which of its sequences failed)."""
    return f"{what}: sequence {i}: {str(err).removeprefix(what + ': ')}"


def shown(value) -> str:
    """A value as an error message shows it: a short repr and its type, "[[1, 2], [3]] (list)"."""
    if value is None:
        return "None"
    try:
        r = repr(value)
    except Exception:  # noqa: BLE001 - a failing repr still leaves the type to show
        r = "?"
    if len(r) > 60:
        r = r[:57] + "..."
    return f"{r} ({type(value).__name__})"


def check_owners(cache, slots, owners, what: str) -> None:
    """ContractError (SLOT_HELD) before a cache update of `slots` with the owner tokens `owners`
    (0: not held): a slot held by another token (a generation, stream, server request or a
    cache.hold() of the user's), or a nonzero token that holds no slot there (released, or
    another cache's: the slot may hold the user's own tokens). The Cache's mutations refuse
    both too; checked here first because a step's device work runs before its host commit."""
    pairs = [(int(s), int(o)) for s, o in zip(slots, owners)]
    held = sorted({s for s, o in pairs if cache.owner(s) not in (0, o)})
    if held:
        raise ContractError(f"{what}: slot(s) {held} are held by another owner (a generation, stream or server "
                            f"request in flight, or a cache.hold() token: Cache.owner); use a free slot or "
                            f"model.new_cache()", SLOT_HELD)
    stale = sorted({s for s, o in pairs if o and cache.owner(s) == 0})
    if stale:
        raise ContractError(f"{what}: slot(s) {stale} are not held by the owner token given (released, "
                            f"or a token of another cache)", SLOT_HELD)


def check_token_ids(ids, vocab_size: int, what: str) -> None:
    """ContractError (40023, CONTRACT_RANGE) naming the first bad id when a numpy array of token
    ids holds one outside [0, vocab_size): the host-side check that lets a device embedding gather
    skip its own."""
    if ids.size and (int(ids.min()) < 0 or int(ids.max()) >= vocab_size):
        bad = int(ids.min()) if int(ids.min()) < 0 else int(ids.max())
        raise ContractError(f"{what}: token id {bad} is outside [0, {vocab_size})", 40023)


__all__ = [
    "MemraError",
    "CudaError",
    "LibraryError",
    "OutOfMemoryError",
    "CacheFullError",
    "ContractError",
    "UnsupportedError",
    "NonFiniteError",
]


def is_int(v) -> bool:
    """A Python or numpy integer, not a bool (nor a timedelta64, which numpy counts as one)."""
    return isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_, np.timedelta64))


def listed(v) -> bool:
    """A sequence (numpy: an array of rank >= 1), not a string: a list of prompts or slots."""
    if isinstance(v, np.ndarray):
        return v.ndim >= 1
    return isinstance(v, Sequence) and not isinstance(v, (str, bytes))


def ids_arg(token_ids, what: str, arg: str = "token_ids", empty_ok: bool = False) -> np.ndarray:
    """Token ids as a 1-D int32 array (ContractError naming `arg` for an empty (unless
    `empty_ok`), non-integer, nested or ragged input, 40023 with the value for an integer outside
    int32)."""
    shape = "a 1-D sequence of ints" if empty_ok else "a non-empty 1-D sequence of ints"
    if isinstance(token_ids, (bytes, bytearray)):  # bytes: made into an array of its bytes, or a 0-d string
        raise ContractError(f"{what}: {arg} must be {shape}, got {shown(token_ids)}", 40000)
    if isinstance(token_ids, np.ma.MaskedArray):  # np.asarray would drop the mask and feed the masked ids
        raise ContractError(f"{what}: {arg} is a masked array; memra takes every id it is given, so pass "
                            "the unmasked ids (e.g. arr.compressed())", 40000)
    try:
        arr = np.asarray(token_ids)
    except (ValueError, TypeError):  # ragged nesting
        arr = np.empty((0, 0))
    # Integers past int64 reach numpy as objects, or with a negative one as float64: their range
    # is checked on the Python values, so they are named too large, not non-integers (and an
    # object array of small ints is ids). Integer arrays, the common case, skip this loop.
    if arr.ndim == 1 and arr.size and arr.dtype.kind not in "iu" and \
            all(is_int(v) for v in token_ids):
        bad = next((int(v) for v in token_ids if not -(2**31) <= int(v) < 2**31), None)
        if bad is not None:
            raise ContractError(f"{what}: {arg} holds {bad}, which does not fit in int32", 40023)
        arr = np.array([int(v) for v in token_ids], dtype=np.int64)
    if arr.ndim != 1 or (arr.size == 0 and not empty_ok):
        raise ContractError(f"{what}: {arg} must be {shape}, got {shown(token_ids)}", 40000)
    if arr.size == 0:
        return np.zeros(0, np.int32)
    # numpy makes [True, 5] an int array: a bool among ints is refused as a bool alone is.
    if isinstance(token_ids, (list, tuple)) and arr.dtype.kind in "iu" and \
            not {bool, np.bool_}.isdisjoint(map(type, token_ids)):
        raise ContractError(f"{what}: {arg} must hold integers, not bools, got {shown(token_ids)}", 40020)
    if arr.dtype.kind not in "iu":  # numpy counts timedelta64 among its integer types
        raise ContractError(f"{what}: {arg} must hold integers, got {arr.dtype} ({shown(token_ids)})", 40020)
    if arr.min() < -(2**31) or arr.max() >= 2**31:
        bad = int(arr.max()) if arr.max() >= 2**31 else int(arr.min())
        raise ContractError(f"{what}: {arg} holds {bad}, which does not fit in int32", 40023)
    return np.ascontiguousarray(arr.astype(np.int32))


class NotCopied:
    """A base that refuses ``copy.copy``, ``copy.deepcopy`` and pickling with UnsupportedError
    (50000) naming the class: for objects that hold a slot of a model's cache, where a copy would
    hold it twice (memra._core's classes refuse alike)."""

    __slots__ = ()

    def __copy__(self):
        raise UnsupportedError(f"{type(self).__name__}: not copied or pickled (it holds a slot of its model's "
                               "cache; make another from the model)", 50000)

    def __deepcopy__(self, memo):
        self.__copy__()

    def __reduce_ex__(self, protocol):
        self.__copy__()


def is_library_failure(e: BaseException) -> bool:
    """Whether `e`, caught around a call into a Rust library (safetensors, tokenizers), is that
    library's failure: an Exception, or the PanicException pyo3 raises for a Rust panic (a
    BaseException, which no ``except Exception`` sees). A signal's exception (Ctrl-C, memra
    serve's SIGTERM during a load) is not: it passes."""
    return isinstance(e, Exception) or type(e).__name__ == "PanicException"
