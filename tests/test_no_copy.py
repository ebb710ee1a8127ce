"""copy.copy, copy.deepcopy and pickle of memra's objects: UnsupportedError (50000) naming the
class (README: Python's own TypeError is left for wrong argument counts and unknown keywords).
A copy of a Cache, a layer or an Engine would share or duplicate engine memory; one of a stream,
lease or decode batch would hold its cache slot twice. KernelOptions, a value, still pickles."""

from __future__ import annotations

import copy
import pickle
from pathlib import Path

import numpy as np
import pytest

import memra
from memra import _core
from memra.batch import DecodeBatch, SlotLease, TokenStream

NATIVE = sorted(n for n, c in vars(_core).items()
                if isinstance(c, type) and not issubclass(c, BaseException) and n not in ("KernelOptions", "status"))
COPIES = {"copy": copy.copy, "deepcopy": copy.deepcopy, "pickle": pickle.dumps}


def _refused(obj) -> None:
    name = type(obj).__name__
    for how, fn in COPIES.items():
        with pytest.raises(memra.UnsupportedError, match=rf"^{name}: .*not copied or pickled") as ei:
            fn(obj)
        assert ei.value.code == 50000, how


def _native_objects(root, depth=0, seen=None) -> dict[str, object]:
    """One instance of each memra._core class reachable from `root`'s attributes."""
    seen = {} if seen is None else seen
    if depth > 5:
        return seen
    if type(root).__module__ == "memra._core":
        seen.setdefault(type(root).__name__, root)
        return seen
    items = root if isinstance(root, (list, tuple)) else \
        root.values() if isinstance(root, dict) else \
        [getattr(root, s) for s in getattr(type(root), "__slots__", ()) if hasattr(root, s)] + \
        list(getattr(root, "__dict__", {}).values())
    for v in items:
        if not isinstance(v, (str, bytes, int, float, np.ndarray)):
            _native_objects(v, depth + 1, seen)
    return seen


def test_every_native_class_refuses():
    for name in NATIVE:
        for method in ("__copy__", "__deepcopy__", "__reduce_ex__"):
            assert method in vars(getattr(_core, name)), f"{name}.{method}"


def test_native_objects_refuse_copies():
    model = memra.load(memra.default_checkpoint(), max_batch=2, max_len=32, progress=False)
    cache = model.new_cache(2, 32)
    model.prefill(cache, 0, [1, 2, 3])
    found = _native_objects(model.net)
    qwen = memra.load(Path(__file__).resolve().parent / "fixtures" / "tiny_qwen3_5", max_batch=1, max_len=8,
                      progress=False)
    found.update(_native_objects(qwen.net))  # GDN and attention layers
    found.update(Cache=cache, SlotSnapshot=cache.snapshot(0), Engine=model.engine,
                 Weight=_core.Weight(np.zeros((2, 2), np.float32)), LayerStateSpec=model.net.state_specs()[0])
    cpu_only = {"DeviceArray", "DeviceWeight", "HostRead", "DecodeSlots", "CudaGraph"}  # CUDA objects
    assert set(NATIVE) - cpu_only <= set(found), sorted(set(NATIVE) - cpu_only - set(found))
    for obj in found.values():
        _refused(obj)
    # Refusing changed nothing: the slot continues as before.
    np.testing.assert_array_equal(model.prefill(cache, 0, [4]), model.logits([1, 2, 3, 4])[-1])


def test_slot_holders_refuse_copies():
    model = memra.load(memra.default_checkpoint(), max_batch=2, max_len=32, progress=False)
    with model.stream([1, 2, 3], 4) as stream:
        first = next(stream)
        assert isinstance(stream, TokenStream)
        _refused(stream)
        rest = list(stream)
    assert [first, *rest] == model.generate([1, 2, 3], 4)
    (lease,) = model.take_slots(1)
    assert isinstance(lease, SlotLease)
    _refused(lease)
    lease.release()
    _refused(DecodeBatch(model))
    assert all(model.cache.owner(s) == 0 for s in range(2))  # every slot given back


def test_kernel_options_still_pickle():
    o = memra.KernelOptions(pdl=False)
    assert pickle.loads(pickle.dumps(o)).pdl is False and copy.deepcopy(o).pdl is False


@pytest.mark.cuda
def test_cuda_objects_refuse_copies():
    model = memra.load(memra.default_checkpoint(), device="cuda", max_batch=1, max_len=16, progress=False)
    model.generate([1, 2, 3], 3)  # captures the decode graphs (DecodeSlots, CudaGraph)
    found = _native_objects(model._runner)
    found.update(_native_objects(model.net))
    a = model.engine.to_device(np.zeros(4, np.float32))
    found.update(DeviceArray=a, HostRead=model.engine.to_host_async(a),
                 DeviceWeight=_core.DeviceWeight(model.engine, _core.Weight(np.zeros((2, 2), np.float32))))
    assert {"DeviceArray", "DeviceWeight", "HostRead", "DecodeSlots", "CudaGraph"} <= set(found), sorted(found)
    for obj in found.values():
        _refused(obj)
    assert model.generate([1, 2, 3], 3) == model.generate([1, 2, 3], 3)
