"""Fuzz of memra's public API with bad arguments (DESIGN.md "Status codes": bad input gets a named
memra error; nothing changes on error; the engine stays usable).

The callables: memra.__all__ (functions, and the constructors and public methods of its classes;
the error classes themselves are raised, not called, and are left out), and the functional ops
listed in python/memra/_core.pyi. tests/fuzz_api_cases.py (and fuzz_api_cases_gdn.py) hold, for each, a valid call and bad
values per argument; a public callable without an entry fails test_every_public_callable_has_cases.

test_fuzz_bad_calls calls, on the CPU, every bad value of the table once, then makes seeded random
bad calls (at least MIN_RANDOM, one to three bad arguments at once; bounded in count and time),
and checks after each one:
- it raised a memra error (MemraError subclass, with a code), never Python's own exception;
  TypeError is accepted only for a wrong number of arguments or an unknown keyword;
- the error message names the bad argument;
- no cache changed (every slot's length, flags and state planes, compared byte for byte), and no
  array argument was written;
- every 50 calls and at the end, a reference forward pass gives the bytes it gave before.
"""

from __future__ import annotations

import inspect
import os
import re
import time
import types
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

import memra
from memra.errors import MemraError

from fuzz_api_cases import CASES as BASE_CASES, EXEMPT
from fuzz_api_cases_gdn import GDN_CASES
from fuzz_api_world import World

ROOT = Path(__file__).resolve().parents[1]
CASES = {**BASE_CASES, **GDN_CASES}
SEED = 20260117
MIN_RANDOM, RANDOM_CALLS, BUDGET_S = 1000, 1500, 45.0
REFERENCE_EVERY = 50
UNKNOWN_KEYWORD = "fuzz_unknown_keyword"


def public_callables() -> set[str]:
    names: set[str] = set()
    for name in memra.__all__:
        obj = getattr(memra, name)
        if isinstance(obj, type):
            if issubclass(obj, BaseException):
                continue
            # A class whose instances come from elsewhere (DeviceArray, LayerStateSpec) has no
            # __init__ of its own: calling it is Python's "cannot create instances" TypeError.
            init = vars(obj).get("__init__")
            if init is not None and not isinstance(init, types.WrapperDescriptorType):
                names.add(f"{name}()")
            for attr in vars(obj):
                raw = inspect.getattr_static(obj, attr)
                if attr.startswith("_") or isinstance(raw, property):
                    continue
                if callable(raw) or isinstance(raw, (staticmethod, classmethod)):
                    names.add(f"{name}.{attr}")
        elif callable(obj):
            names.add(f"memra.{name}")
    pyi = (ROOT / "python" / "memra" / "_core.pyi").read_text()
    for fn in re.findall(r"^def (\w+)\(", pyi, re.M):
        if f"memra.{fn}" not in names:
            names.add(f"_core.{fn}")
    return names


_PLANES = ("kda_state", "kda_conv", "gdn_state", "gdn_conv", "latent_rows", "pool_keys", "attn_keys",
           "attn_values")
_readable: dict[int, list[tuple[int, str]]] = {}  # id(cache) -> the (layer, plane) it holds


def snapshot(cache) -> list:
    """Everything a caller can read of a cache: lengths, flags, owners, every state plane of every slot
    (which planes a layer holds is found once: reading another kind raises, and always will)."""
    if id(cache) not in _readable:
        _readable[id(cache)] = []
        for layer in range(cache.num_layers):
            for plane in _PLANES:
                try:
                    getattr(cache, plane)(layer, 0)
                except MemraError:
                    continue
                _readable[id(cache)].append((layer, plane))
    out: list = [cache.max_batch, cache.max_len, cache.num_layers]
    for s in range(cache.max_batch):
        out.append((cache.length(s), cache.cur(s), cache.owner(s)))
        out.extend(getattr(cache, plane)(layer, s).tobytes() for layer, plane in _readable[id(cache)])
    return out


def world_state(world: World) -> list:
    return [snapshot(c) for c in world.caches()]


def arrays_of(kwargs: dict) -> list[tuple[str, bytes]]:
    """Bytes of every numpy array among the arguments (also inside lists): a refused call writes none."""
    out = []
    for k, v in kwargs.items():
        for i, a in enumerate(v if isinstance(v, (list, tuple)) else [v]):
            if isinstance(a, np.ndarray) and a.dtype != object:
                out.append((f"{k}[{i}]", a.tobytes()))
    return out


def bad_values(case, param: str, good, world: World) -> list[tuple[str, object]]:
    out = []
    spec = case.bad[param]
    for item in [spec] if isinstance(spec, types.FunctionType) else spec:
        if isinstance(item, types.FunctionType):
            out.extend(item(good, world))
        else:
            out.append((repr(item)[:40], item))
    return out


def _named(name: str, message: str) -> bool:
    return re.search(rf"(?<![A-Za-z0-9_]){re.escape(name)}(?![A-Za-z0-9_])", message) is not None


def _scalars(v, depth: int = 0) -> list:
    """The scalars of a value for the message check: itself, or those of a short list / array."""
    if isinstance(v, np.ndarray) and v.size <= 16 and v.dtype != object:
        v = v.tolist()
    if isinstance(v, (list, tuple)) and depth < 2:
        return [x for item in v for x in _scalars(item, depth + 1)]
    if isinstance(v, os.PathLike):
        return [os.fspath(v)]
    return [v] if isinstance(v, (int, float, str)) and not isinstance(v, bool) else []


def names_argument(message: str, bad: dict[str, tuple[str, object]], args: dict) -> bool:
    """True when the message names an argument of the call (the bad one, or the one it disagrees
    with), or a bad value (a scalar, or a scalar in a short list or array), or the key a bad dict
    lacks."""
    if any(_named(a, message) for a in args):
        return True
    for label, v in bad.values():
        if any(str(x) and str(x) in message for x in _scalars(v)):
            return True
        if label.startswith("missing ") and label.split()[-1] in message:
            return True
    return False


class Fuzz:
    def __init__(self, world: World) -> None:
        self.world = world
        self.rng = np.random.default_rng(SEED)
        self.calls = 0
        self.outcomes: Counter = Counter()  # exception class name (or "accepted") -> calls
        self.failures: dict[tuple, str] = {}  # (callable, argument, kind) -> one example
        self.state = world_state(world)
        self.reference = world.model.logits(world.ref_ids).tobytes()

    def fail(self, key: tuple, text: str) -> None:
        self.failures.setdefault(key, text)

    def call(self, name: str, bad: dict[str, tuple[str, object]], extra_kwargs: dict | None = None) -> None:
        """One bad call of `name`: its good arguments with `bad` ({argument: (label, value)}) put in."""
        w, case = self.world, CASES[name]
        kwargs = case.good(w)
        for p, (_, v) in bad.items():
            kwargs[p] = v
        kwargs.update(extra_kwargs or {})
        arity = extra_kwargs is not None
        before = arrays_of(kwargs)
        what = ", ".join(f"{p}={label}" for p, (label, _) in bad.items()) or "arity"
        key = (name, tuple(bad), what)
        self.calls += 1
        try:
            result = case.target(w)(**kwargs)
        except MemraError as e:
            self.outcomes[type(e).__name__] += 1
            if e.code == 0:
                self.fail(key, f"{type(e).__name__} without a code: {e}")
            elif bad and not names_argument(str(e), bad, kwargs) and not (
                    case.cuda_only and isinstance(e, memra.UnsupportedError)):
                self.fail(key, f"{type(e).__name__} does not name the argument: {e}")
        except TypeError as e:
            self.outcomes["TypeError (arity)" if arity else "TypeError"] += 1
            if not arity:
                self.fail(key, f"bare TypeError: {e}")
        except Exception as e:  # noqa: BLE001 - what the fuzz is looking for
            self.outcomes[type(e).__name__] += 1
            self.fail(key, f"bare {type(e).__name__}: {e}")
        else:
            self.outcomes["accepted"] += 1
            if isinstance(result, types.GeneratorType):
                result.close()
            self.fail(key, f"accepted the bad value(s), returned {type(result).__name__}")
        if arrays_of(kwargs) != before:
            self.fail((name, tuple(bad), "arrays"), f"{what}: an array argument was written by a refused call")
        state = world_state(w)
        if state != self.state:
            self.fail((name, tuple(bad), "cache"), f"{what}: a cache changed")
            self.state = state
        if self.calls % REFERENCE_EVERY == 0:
            self.check_engine(f"after {name}({what})")

    def check_engine(self, when: str) -> None:
        try:
            got = self.world.model.logits(self.world.ref_ids).tobytes()
        except Exception as e:  # noqa: BLE001
            self.fail(("engine", when), f"the reference call raised {type(e).__name__}: {e}")
            return
        if got != self.reference:
            self.fail(("engine", when), "the reference call gives other bytes")

    def random_bad(self, name: str, params: list[str], k: int) -> dict[str, tuple[str, object]]:
        case, w = CASES[name], self.world
        good = case.good(w)
        chosen = self.rng.choice(len(params), size=min(k, len(params)), replace=False)
        out = {}
        for i in chosen:
            p = params[int(i)]
            values = bad_values(case, p, good.get(p), w)
            out[p] = values[int(self.rng.integers(len(values)))]
        return out


@pytest.fixture(scope="module")
def world() -> World:
    w = World(SEED)
    w.ref_ids = [3, 1, 4, 1, 5, 9, 2, 6]
    return w


def test_every_public_callable_has_cases():
    names = public_callables()
    missing = sorted(names - set(CASES) - set(EXEMPT))
    assert not missing, f"public callables without bad-value cases in tests/fuzz_api_cases.py: {missing}"
    stale = sorted(set(CASES) - names)
    assert not stale, f"cases for callables that are not public (renamed or removed?): {stale}"
    for name, case in CASES.items():
        assert all(case.bad[p] for p in case.bad), f"{name}: an argument with an empty bad list"


def test_good_calls_are_valid():
    """The table's good calls run (so the bad calls' errors come from the bad values)."""
    w = World(SEED + 1)
    for name, case in CASES.items():
        if case.cuda_only:
            # The world is on the CPU (also on a GPU machine): UnsupportedError, or where even the
            # arguments need CUDA (a DecodeSlots) another memra error about the placeholder.
            with pytest.raises(MemraError):
                case.target(w)(**case.good(w))
            continue
        result = case.target(w)(**case.good(w))
        if isinstance(result, types.GeneratorType):
            list(result)


def test_fuzz_bad_calls(world):
    fuzz = Fuzz(world)
    start = time.monotonic()
    rng = fuzz.rng
    names = sorted(CASES)
    # The table exhaustively: every bad value of every argument once; every callable once with an
    # unknown keyword.
    for name in names:
        case = CASES[name]
        good = case.good(world)
        for p in case.bad:
            for label, value in bad_values(case, p, good.get(p), world):
                fuzz.call(name, {p: (label, value)})
        fuzz.call(name, {}, {UNKNOWN_KEYWORD: 1})
    swept = fuzz.calls
    # Then random calls: one bad argument, or two or three at once.
    with_params = [n for n in names if CASES[n].bad]
    while fuzz.calls - swept < RANDOM_CALLS and (fuzz.calls - swept < MIN_RANDOM or
                                                 time.monotonic() - start < BUDGET_S):
        name = with_params[int(rng.integers(len(with_params)))]
        k = int(rng.choice([1, 2, 3], p=[0.6, 0.3, 0.1]))
        fuzz.call(name, fuzz.random_bad(name, list(CASES[name].bad), k))
    fuzz.check_engine("at the end")
    elapsed = time.monotonic() - start
    print(f"\nfuzz: {len(CASES)} callables, {swept} table calls + {fuzz.calls - swept} random calls "
          f"in {elapsed:.1f} s; outcomes: {dict(sorted(fuzz.outcomes.items()))}; "
          f"{len(fuzz.failures)} distinct failures")
    assert fuzz.calls - swept >= MIN_RANDOM
    report = "\n".join(f"{k[0]} [{k[-1]}]: {' | '.join(v.splitlines())[:300]}" for k, v in sorted(
        fuzz.failures.items(), key=lambda kv: str(kv[0])))
    assert not fuzz.failures, f"{len(fuzz.failures)} bad calls were not answered with a named memra error:\n{report}"
