"""Arrays that arrive over DLPack and still cannot be used (python/src/args.cpp's caster,
device_args.cpp's require_writable): each is a ContractError naming the op and the argument,
nothing is written, and no read goes through a null pointer.

- a null data pointer behind a non-empty shape (a torch tensor whose storage was freed, as FSDP
  frees parameters; here a hand-made DLPack capsule, so the test needs no torch);
- a written array that shares memory with what the op reads (sample's nonfinite flags);
- a producer whose __dlpack__ raises: a Ctrl-C, SystemExit or MemoryError passes through as
  it is, any other error is named in the refusal (nanobind clears it);
- torch only (skipped without it): the negative bit (the memory holds the values negated),
  requires_grad on a written tensor (autograd would not see the write), the meta device, sparse
  and nested layouts.
"""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

from memra import _core
from memra.errors import ContractError

S = _core.status


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _DLDevice), ("ndim", ctypes.c_int32),
                ("dtype", _DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


class _DLManagedTensor(ctypes.Structure):
    pass


_DELETER = ctypes.CFUNCTYPE(None, ctypes.POINTER(_DLManagedTensor))
_DLManagedTensor._fields_ = [("dl_tensor", _DLTensor), ("manager_ctx", ctypes.c_void_p),
                             ("deleter", _DELETER)]
_KEEP: list = []  # the structs and the deleter outlive every capsule made here
_NO_DELETE = _DELETER(lambda p: None)


def null_capsule(*shape: int, code: int = 2, bits: int = 32):
    """A DLPack capsule ("dltensor") of a host array of `shape` whose data pointer is NULL:
    what torch exports for a tensor whose storage was resized to 0. code 0 int, 2 float."""
    dims = (ctypes.c_int64 * len(shape))(*shape)
    m = _DLManagedTensor()
    m.dl_tensor = _DLTensor(None, _DLDevice(1, 0), len(shape), _DLDataType(code, bits, 1), dims, None, 0)
    m.deleter = _NO_DELETE
    _KEEP.extend([dims, m])
    new = ctypes.pythonapi.PyCapsule_New
    new.restype, new.argtypes = ctypes.py_object, [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
    return new(ctypes.addressof(m), b"dltensor", None)


def refused(fn, *words, code=None):
    with pytest.raises(ContractError) as info:
        fn()
    for w in words:
        assert w in str(info.value), f"{w!r} not in: {info.value}"
    if code is not None:
        assert info.value.code == code, str(info.value)
    return info.value


def f32(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


# ---------------------------------------------------------------- no memory behind the shape


FREED = [
    ("take_rows", "x", lambda a: _core.take_rows(a, 1, 2)),
    ("Weight", "array", lambda a: _core.Weight(a)),
    ("concat_rows", "parts", lambda a: _core.concat_rows([a, f32(5, 8)])),
    ("rms_norm", "weight", lambda a: _core.rms_norm(f32(2, 8), a, eps=1e-6)),
    ("sample", "logits", lambda a: _core.sample(a, np.zeros(5, np.uint64), temperature=0.0)),
]


@pytest.mark.parametrize("op,name,call", FREED, ids=[f[0] for f in FREED])
def test_a_null_data_pointer_is_refused_not_read(op, name, call):
    # These once read the data (or took a null optional for None) before any check: a segfault,
    # or rms_norm without its weight.
    e = refused(lambda: call(null_capsule(5, 8)), op, "no memory behind it", "[5, 8]")
    assert name in str(e)


def test_a_null_int_array_is_refused_too():
    refused(lambda: _core.sample(f32(5, 8), null_capsule(5, code=0, bits=64), temperature=0.0),
            "sample", "counters", "no memory behind it")
    # embedding is an overload set: the capsule, consumed by the first pass, is refused there.
    refused(lambda: _core.embedding(_core.Weight(f32(10, 4)), null_capsule(3, code=0, bits=32)),
            "embedding", "'ids'", "no memory behind it")


def test_an_empty_array_with_a_null_pointer_is_still_an_array():
    # Zero elements: nothing is read, and numpy's / torch's empty exports may carry NULL.
    y = _core.take_rows(null_capsule(0, 8), 0, 0)
    assert np.asarray(y).shape == (0, 8)


# ---------------------------------------------------------------- written while read


def test_sample_refuses_nonfinite_flags_over_its_logits():
    logits = np.zeros((4, 16), np.float32)
    logits[3, 1] = 100.0
    before = logits.copy()
    flags = logits[3].view(np.int32)[:4]  # row 3's first columns: written before row 3 was read
    refused(lambda: _core.sample(logits, np.arange(4, dtype=np.uint64), temperature=0.0, nonfinite=flags),
            "sample", "'logits' overlaps 'nonfinite'", code=S.CONTRACT_VALUE)
    np.testing.assert_array_equal(logits, before)
    counters = np.arange(4, dtype=np.int64)
    refused(lambda: _core.sample(f32(4, 16), counters, temperature=0.0, nonfinite=counters.view(np.int32)[:4]),
            "'counters' overlaps 'nonfinite'")
    np.testing.assert_array_equal(counters, np.arange(4))
    seeds = np.arange(4, dtype=np.uint64)
    refused(lambda: _core.sample(f32(4, 16), np.arange(4, dtype=np.uint64), temperature=0.0, seeds=seeds,
                                 nonfinite=seeds.view(np.int32)[4:]), "'seeds' overlaps 'nonfinite'")


# ---------------------------------------------------------------- a producer's export that raises


class Producer:
    """A DLPack producer whose __dlpack__ runs `export` first (it may raise), then gives `x`'s."""

    def __init__(self, x, export):
        self.x, self.export = x, export

    def __dlpack__(self, **kw):
        self.export()
        return self.x.__dlpack__(**kw)

    def __dlpack_device__(self):
        return (1, 0)


def _raise(error):
    def export():
        raise error
    return export


EXPORTS = [
    ("rms_norm", lambda a: _core.rms_norm(a, None, eps=1e-6)),
    ("Weight", lambda a: _core.embedding(_core.Weight(a), np.arange(5, dtype=np.int32))),
    ("embedding", lambda a: _core.embedding(_core.Weight(f32(10, 8)), a)),  # an overload set
]


def _good(op):
    return np.arange(5, dtype=np.int32) if op == "embedding" else f32(5, 8)


@pytest.mark.parametrize("op,call", EXPORTS, ids=[e[0] for e in EXPORTS])
def test_a_ctrl_c_during_a_producers_export_is_a_keyboard_interrupt(op, call):
    # nanobind clears what a __dlpack__ raises: a Ctrl-C landing in torch's (Python) __dlpack__
    # was lost, the call refused with "must be a float32 array".
    import signal

    previous = signal.signal(signal.SIGINT, signal.default_int_handler)  # not ignored here
    try:
        with pytest.raises(KeyboardInterrupt):
            call(Producer(_good(op), lambda: signal.raise_signal(signal.SIGINT)))
    finally:
        signal.signal(signal.SIGINT, previous)
    np.testing.assert_array_equal(call(Producer(_good(op), lambda: None)), call(_good(op)))


@pytest.mark.parametrize("error", [KeyboardInterrupt(), SystemExit(3), MemoryError("no room")],
                         ids=lambda e: type(e).__name__)
def test_a_producers_interrupt_or_out_of_memory_passes_through(error):
    with pytest.raises(BaseException) as info:
        _core.rms_norm(Producer(f32(5, 8), _raise(error)), None, eps=1e-6)
    assert info.value is error
    np.testing.assert_array_equal(_core.rms_norm(f32(5, 8), None, eps=1e-6),
                                  _core.rms_norm(f32(5, 8), None, eps=1e-6))


@pytest.mark.parametrize("op,call", EXPORTS, ids=[e[0] for e in EXPORTS])
def test_a_producers_refusal_is_named_with_its_reason(op, call):
    # It read as a wrong type: "must be a float32 array, got <Producer>".
    e = refused(lambda: call(Producer(_good(op), _raise(RuntimeError("no export\nof this")))),
                op, "its __dlpack__() raised RuntimeError: no export of this", code=S.CONTRACT_DTYPE)
    assert "\n" not in str(e)
    np.testing.assert_array_equal(call(Producer(_good(op), lambda: None)), call(_good(op)))


class Refusing(np.ndarray):
    """An array whose __dlpack__ refuses (torch's refuses a tensor that requires grad)."""

    def __dlpack__(self, **kw):
        raise RuntimeError("ask elsewhere")


def test_a_refused_export_still_goes_the_other_ways():
    # nanobind's fallbacks (the buffer protocol here, torch's to_dlpack for a tensor that
    # requires grad) still take what the producer's __dlpack__ refuses.
    x = f32(5, 8)
    np.testing.assert_array_equal(_core.rms_norm(x.view(Refusing), None, eps=1e-6),
                                  _core.rms_norm(x, None, eps=1e-6))


def test_a_read_only_numpy_array_is_exported_with_max_version():
    # numpy refuses a read-only array's export without max_version (BufferError).
    x = f32(5, 8)
    x.flags.writeable = False
    with pytest.raises(BufferError):
        x.__dlpack__()
    np.testing.assert_array_equal(_core.rms_norm(x, None, eps=1e-6), _core.rms_norm(x.copy(), None, eps=1e-6))


# ---------------------------------------------------------------- torch's own kinds of tensor


def test_torch_negative_bit_is_refused():
    torch = pytest.importorskip("torch")
    x = torch.randn(2, 8)
    xn = torch._neg_view(-x)  # equal to x; its memory holds -x
    assert torch.equal(xn, x) and xn.is_neg()
    refused(lambda: _core.rms_norm(xn, None, eps=1e-6), "rms_norm", "'x'", "negative bit", ".resolve_neg()")
    imag = torch.tensor([1 + 2j]).conj().imag  # the public way to one: -2 read, 2 in memory
    refused(lambda: _core.sigmoid(imag), "sigmoid", "negative bit")
    y = _core.rms_norm(xn.resolve_neg(), None, eps=1e-6)
    np.testing.assert_array_equal(y, _core.rms_norm(x, None, eps=1e-6))
    cache = torch._neg_view(torch.zeros(4, 1, 4))
    refused(lambda: _core.kv_append(torch.ones(1, 1, 4), torch.ones(1, 1, 4), cache, torch.zeros(4, 1, 4),
                                    pos0=0), "kv_append", "'k_cache'", "negative bit")
    assert torch.count_nonzero(cache.resolve_neg()) == 0


def test_torch_written_tensor_that_requires_grad_is_refused():
    torch = pytest.importorskip("torch")
    a = torch.ones(4, 1, 4, requires_grad=True)
    k_cache = a * 1.0
    loss = (k_cache ** 2).sum()  # saves k_cache: a write autograd cannot see corrupts the gradient
    refused(lambda: _core.kv_append(torch.full((1, 1, 4), 5.0), torch.zeros(1, 1, 4), k_cache,
                                    torch.zeros(4, 1, 4), pos0=0),
            "kv_append", "'k_cache'", "requires grad", code=S.CONTRACT_VALUE)
    loss.backward()
    assert torch.equal(a.grad, torch.full((4, 1, 4), 2.0))
    # Read-only arguments that require grad are read as they are.
    x = torch.randn(2, 8, requires_grad=True)
    np.testing.assert_array_equal(_core.rms_norm(x, None, eps=1e-6),
                                  _core.rms_norm(x.detach().numpy(), None, eps=1e-6))


@pytest.mark.parametrize("kind", ["meta", "sparse", "nested", "float8"])
def test_torch_tensors_without_a_dense_host_form_are_named(kind):
    torch = pytest.importorskip("torch")
    if kind == "meta":
        t, words = torch.empty(3, 8, device="meta"), ["meta device has no memory"]
    elif kind == "sparse":
        t, words = torch.zeros(3, 8).to_sparse(), ["layout torch.sparse_coo", ".to_dense()"]
    elif kind == "nested":
        t, words = torch.nested.nested_tensor([torch.zeros(8), torch.zeros(8)]), ["nested tensor"]
    else:
        t, words = torch.zeros(3, 8).to(torch.float8_e4m3fn), ["DLPack type code", "8 bits"]
    e = refused(lambda: _core.rms_norm(t, None, eps=1e-6), "rms_norm", "'x'", *words)
    assert "\n" not in str(e)
