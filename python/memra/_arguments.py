"""Which argument nanobind could not convert: the ContractError behind memra._core's TypeErrors.

nanobind answers a call whose arguments it cannot convert with a TypeError ("incompatible
function arguments") that lists the signature but not the argument at fault. memra._core puts a
check in front of each of its functions (python/src/bind_arguments.cpp) that calls
:func:`explain` with the function, the arguments and that TypeError; explain binds the arguments
to the function's signature (``__nb_signature__``, every overload), tests each value against its
parameter's type with nanobind's conversion rules, and returns a ContractError naming the
function, the argument and the value (CONTRACT_DTYPE for a value of another type, None included;
CONTRACT_RANGE for an int outside the C++ type's range; CONTRACT_DTYPE for a bool where an int
goes, which nanobind's own int caster takes as 0 / 1 but memra._core's Index refuses, the slot
and layer numbers of Cache's methods), or None when the arguments do not even
bind (a wrong number of arguments, an unknown or repeated keyword): Python's TypeError stands.

Arrays are hardly judged here: memra._core's array caster takes any object but memra's own
(which an overload may take instead), and its checks name a bad array themselves.
"""

from __future__ import annotations

import operator
import re
from dataclasses import dataclass

from . import _core
from .errors import ContractError, shown

_CONTRACT_DTYPE = _core.status.CONTRACT_DTYPE
_CONTRACT_RANGE = _core.status.CONTRACT_RANGE


@dataclass
class _Param:
    name: str
    type: str  # nanobind's rendering: "int", "float | None", "memra._core.Cache", ...
    has_default: bool
    kw_only: bool


def _split_top(text: str, sep: str) -> list[str]:
    """`text` split at `sep` outside brackets."""
    out, depth, start, i = [], 0, 0, 0
    while i < len(text):
        c = text[i]
        if c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
        elif depth == 0 and text.startswith(sep, i):
            out.append(text[start:i])
            start = i + len(sep)
            i = start
            continue
        i += 1
    out.append(text[start:])
    return [s.strip() for s in out]


def _params(signature: str) -> list[_Param] | None:
    """The parameters of a nanobind signature 'def f(a: int, *, b: float = \\0) -> R'."""
    m = re.match(r"def [\w.]+\((.*)\)(?: -> .*)?$", signature, re.S)
    if m is None:
        return None
    params, kw_only = [], False
    for item in _split_top(m.group(1), ",") if m.group(1).strip() else []:
        if item == "*":
            kw_only = True
            continue
        if item.startswith("*"):  # *args / **kwargs: nothing to judge
            return None
        head, _, default = item.partition(" = ")
        name, _, type_ = head.partition(": ")
        params.append(_Param(name.strip(), type_.strip() or "object", bool(default), kw_only))
    return params


def _bind(params: list[_Param], args: tuple, kwargs: dict) -> list[tuple[_Param, object]] | None:
    """(parameter, value) pairs as Python would bind them, or None when they do not bind."""
    positional = [p for p in params if not p.kw_only]
    if len(args) > len(positional):
        return None
    bound = {p.name: v for p, v in zip(positional, args)}
    names = {p.name for p in params}
    for k, v in kwargs.items():
        if k not in names or k in bound:
            return None
        bound[k] = v
    if any(p.name not in bound and not p.has_default for p in params):
        return None
    return [(p, bound[p.name]) for p in params if p.name in bound]


def _is_memra_object(v) -> bool:
    return type(v).__module__ == "memra._core"


def _fits(type_: str, v) -> bool:
    """Whether nanobind converts v to a parameter rendered as `type_` (unknown types: yes)."""
    alternatives = _split_top(type_, "|")
    if len(alternatives) > 1:
        return any(_fits(t, v) for t in alternatives)
    t = type_.strip()
    if t == "None":
        return v is None
    if v is None:
        return False
    if t == "int":
        if isinstance(v, float):
            return False
        try:
            operator.index(v)
        except TypeError:
            return False
        return True
    if t == "float":
        if isinstance(v, (str, bytes, complex)):
            return False
        try:
            float(v)
        except (TypeError, ValueError, OverflowError):
            return False
        return True
    if t == "bool":
        return v is True or v is False  # nanobind's bool caster takes only these (not numpy.bool_)
    if t == "str":
        return isinstance(v, str)
    if t.startswith("ndarray") or t == "object":
        return not (t.startswith("ndarray") and _is_memra_object(v))
    m = re.fullmatch(r"collections\.abc\.Sequence\[(.*)\]", t)
    if m:
        return isinstance(v, (list, tuple)) and all(_fits(m.group(1), x) for x in v)
    m = re.fullmatch(r"collections\.abc\.Mapping\[str, (.*)\]", t)
    if m:
        return isinstance(v, dict) and all(isinstance(k, str) and _fits(m.group(1), x) for k, x in v.items())
    m = re.fullmatch(r"memra\._core\.(\w+)", t)
    if m:
        cls = getattr(_core, m.group(1), None)
        return cls is None or isinstance(v, cls)
    return True


def _describe(type_: str) -> str:
    """A parameter type in words: 'an int', 'a memra.Cache or None', ..."""
    words = []
    for t in _split_top(type_, "|"):
        if t == "None":
            words.append("None")
        elif t in ("int", "float", "bool", "str"):
            words.append({"int": "an int", "float": "a number", "bool": "True or False", "str": "a str"}[t])
        elif t.startswith("ndarray"):
            words.append("an array (numpy, or any DLPack / buffer-protocol tensor)")
        elif m := re.fullmatch(r"collections\.abc\.Sequence\[(.*)\]", t):
            words.append(f"a list of {_describe(m.group(1)).removeprefix('a ').removeprefix('an ')}")
        elif m := re.fullmatch(r"collections\.abc\.Mapping\[str, (.*)\]", t):
            words.append(f"a dict of str to {_describe(m.group(1)).removeprefix('a ').removeprefix('an ')}")
        elif m := re.fullmatch(r"memra\._core\.(\w+)", t):
            import memra

            words.append(f"a memra.{m.group(1)}" if hasattr(memra, m.group(1)) else f"a memra._core.{m.group(1)}")
        else:
            words.append(t)
    return " or ".join(words)


def _range_problem(v) -> str | None:
    """Why an int that nanobind refused is out of range (its C++ type is int32, int64 or uint64)."""
    try:
        i = operator.index(v)
    except TypeError:
        return None
    if not -(2**63) <= i < 2**64:
        return "is outside any 64-bit integer"
    if not -(2**31) <= i < 2**31:
        return "is outside the 32-bit range [-2^31, 2^31) of this argument"
    if i < 0:
        return "is negative, and this argument is unsigned"
    return None


def explain(func, args: tuple, kwargs: dict, error: TypeError) -> ContractError | None:
    """The ContractError for a call of `func` that nanobind refused with `error`, or None when
    the arguments do not bind to any overload (Python's TypeError then stands)."""
    if "incompatible function arguments" not in str(error):
        return None  # a TypeError from inside the function: not an argument conversion
    name = getattr(func, "__qualname__", getattr(func, "__name__", "?"))
    misfit: dict[str, tuple[object, list[str]]] = {}  # argument -> (value, its types over the overloads)
    ranged: list[tuple[str, object, str]] = []  # from overloads whose every value has the right type
    bound_any = False
    for signature, *_ in getattr(func, "__nb_signature__", ()):
        params = _params(signature)
        bound = _bind(params, args, kwargs) if params is not None else None
        if bound is None:
            continue
        bound_any = True
        bad = [(p, v) for p, v in bound if p.name != "self" and not _fits(p.type, v)]
        if bad:
            p, v = bad[0]
            misfit.setdefault(p.name, (v, []))[1].append(p.type)
            continue
        for p, v in bound:
            why = _range_problem(v) if p.type.split(" |")[0] == "int" else None
            if why:
                ranged.append((p.name, v, why))
                break
        else:  # every value fits its type and range: an int argument that refuses a bool took one
            bools = [(p, v) for p, v in bound if isinstance(v, bool) and "bool" not in _split_top(p.type, "|")]
            if bools:
                misfit.setdefault(bools[0][0].name, (bools[0][1], []))[1].append("int")
    if not bound_any:
        return None
    if ranged:  # an overload that takes every value's type: its int was out of range
        arg, v, why = ranged[0]
        return ContractError(f"{name}: argument '{arg}' = {v} {why}", _CONTRACT_RANGE)
    for arg, (v, types) in misfit.items():
        expected = " or ".join(dict.fromkeys(_describe(t) for t in types))
        return ContractError(f"{name}: argument '{arg}' must be {expected}, got {shown(v)}", _CONTRACT_DTYPE)
    first = str(error).splitlines()[0]
    return ContractError(f"{name}: the arguments do not convert ({first})", _CONTRACT_DTYPE)
