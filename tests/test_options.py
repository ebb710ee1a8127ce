"""memra.KernelOptions (cpp/include/memra/options.h, python/src/bind_options.cpp): the typed
options that choose the CUDA kernels' arms, given once when an Engine is made. These run on the
CPU: construction, defaults, validation (every bad field or value a ContractError naming both),
the value semantics (repr, equality, hashing, replace, to_dict, copy and pickle) and the plumbing through
Engine(options=) and memra.load(kernel_options=). The arms themselves are exercised by the CUDA
tests (tests/test_cuda_*.py) through engines made with these options."""

from __future__ import annotations

import copy
import pickle

import numpy as np
import pytest

import memra
from memra import KernelOptions

# The documented defaults (docs/options.md): the arms the A/B runs kept. Written out here, not
# read from the class, so a changed default fails this test.
DEFAULTS = dict(pdl=True, gemv=True, gemv_rows=0, gemv_tall_rows=0, mhc_defer=True,
                mla_decode_variant=1, mla_merge=0, mla_tc_mt=0, mla_split_tiles=0, moe_grouped_min_t=2,
                attn_decode_unsplit=False, prefill_chunk=8192, moe_tensor_cores=True,
                attn_prefill_tensor_cores=True)
NUMERICS = {"gemv", "mla_decode_variant", "mla_merge", "mla_tc_mt", "mla_split_tiles", "moe_grouped_min_t",
            "attn_decode_unsplit", "prefill_chunk", "moe_tensor_cores", "attn_prefill_tensor_cores"}


def test_defaults_and_fields() -> None:
    k = KernelOptions()
    assert k.to_dict() == DEFAULTS
    assert list(k.to_dict()) == list(DEFAULTS)
    for name, value in DEFAULTS.items():
        got = getattr(k, name)
        assert got == value and type(got) is type(value), name


def test_every_field_says_whether_it_changes_numerics() -> None:
    for name in DEFAULTS:
        doc = getattr(KernelOptions, name).__doc__ or ""
        if name in NUMERICS:
            assert doc.startswith("Changes numerics"), (name, doc)
        else:
            assert doc.startswith("Speed only"), (name, doc)
    cls_doc = KernelOptions.__doc__ or ""
    assert all(n in cls_doc for n in NUMERICS)


GOOD = [dict(pdl=False), dict(gemv=False), dict(gemv_rows=1), dict(gemv_rows=8),
        dict(gemv_tall_rows=2), dict(mhc_defer=False), dict(mla_decode_variant=0),
        dict(mla_tc_mt=4), dict(mla_merge=1), dict(mla_merge=3),
        dict(mla_split_tiles=3),
        dict(moe_grouped_min_t=10**9), dict(gemv_rows=np.int32(4)), dict(attn_decode_unsplit=True),
        dict(prefill_chunk=0), dict(prefill_chunk=1), dict(moe_tensor_cores=False),
        dict(attn_prefill_tensor_cores=False),
        dict(pdl=False, gemv_rows=2, mla_tc_mt=2)]


@pytest.mark.parametrize("kw", GOOD, ids=[",".join(f"{k}={v}" for k, v in kw.items()) for kw in GOOD])
def test_keyword_construction(kw) -> None:
    k = KernelOptions(**kw)
    want = dict(DEFAULTS, **{n: int(v) if not isinstance(v, bool) else v for n, v in kw.items()})
    assert k.to_dict() == want
    assert k != KernelOptions() and not (k == KernelOptions())


BAD = [
    (dict(foo=1), "foo"), (dict(gemv_row=2), "gemv_row"),
    (dict(pdl=1), "pdl"), (dict(pdl="yes"), "pdl"), (dict(pdl=None), "pdl"),
    (dict(gemv_rows=3), "gemv_rows"), (dict(gemv_rows=-1), "gemv_rows"), (dict(gemv_rows=16), "gemv_rows"),
    (dict(gemv_rows=True), "gemv_rows"), (dict(gemv_rows=2.0), "gemv_rows"), (dict(gemv_rows="2"), "gemv_rows"),
    (dict(gemv_tall_rows=5), "gemv_tall_rows"), (dict(mla_decode_variant=2), "mla_decode_variant"),
    (dict(mla_decode_variant=4), "mla_decode_variant"), (dict(mla_decode_variant=5), "mla_decode_variant"),
    (dict(mla_decode_variant=-1), "mla_decode_variant"), (dict(mla_tc_mt=1), "mla_tc_mt"),
    (dict(mla_merge=4), "mla_merge"), (dict(mla_merge=-1), "mla_merge"), (dict(mla_merge=True), "mla_merge"),
    (dict(mla_tc_mt=8), "mla_tc_mt"), (dict(mla_split_tiles=-2), "mla_split_tiles"),
    (dict(mla_split_tiles=2**31), "mla_split_tiles"), (dict(moe_grouped_min_t=0), "moe_grouped_min_t"),
    (dict(mhc_defer=np.float32(1)), "mhc_defer"), (dict(attn_decode_unsplit=1), "attn_decode_unsplit"),
    (dict(prefill_chunk=-1), "prefill_chunk"), (dict(prefill_chunk=True), "prefill_chunk"),
    (dict(moe_tensor_cores=0), "moe_tensor_cores"),
    (dict(attn_prefill_tensor_cores=1), "attn_prefill_tensor_cores"),
    (dict(pdl=np.int8(1)), "pdl"),
    # Deleted once the H200 settled its A/B (docs/options.md): an unknown field now.
    (dict(kda_decode_lines=True), "kda_decode_lines"),
]


@pytest.mark.parametrize("kw,field", BAD, ids=[f"{f}-{i}" for i, (_, f) in enumerate(BAD)])
def test_bad_fields_and_values_are_contract_errors_naming_them(kw, field) -> None:
    with pytest.raises(memra.ContractError) as ei:
        KernelOptions(**kw)
    msg = str(ei.value)
    assert ei.value.code == 40025
    assert field in msg, msg
    value = next(iter(kw.values()))
    assert repr(value) in msg or str(value) in msg, msg
    with pytest.raises(memra.ContractError):
        KernelOptions().replace(**kw)


def test_switches_take_numpy_bools_as_load_does() -> None:
    # As memra.load(cuda_graphs=np.True_) and the integer fields' numpy integers; numpy's other
    # scalars stay refused (mhc_defer=np.float32(1) in BAD).
    k = KernelOptions(pdl=np.False_, gemv=np.bool_(True))
    assert k.pdl is False and k.gemv is True and k == KernelOptions(pdl=False)
    assert KernelOptions().replace(mhc_defer=np.True_).mhc_defer is True
    for bad in (np.int8(1), np.array([True]), np.array(True)):
        with pytest.raises(memra.ContractError, match="pdl"):
            KernelOptions(pdl=bad)


def test_positional_arguments_are_refused() -> None:
    with pytest.raises((memra.ContractError, TypeError)):
        KernelOptions(True)  # type: ignore[misc]


def test_value_semantics() -> None:
    k = KernelOptions(pdl=False, mla_split_tiles=5)
    assert repr(k).startswith("KernelOptions(pdl=False, gemv=True,")
    assert eval(repr(k), {"KernelOptions": KernelOptions}) == k
    assert KernelOptions(**k.to_dict()) == k
    assert hash(k) == hash(KernelOptions(mla_split_tiles=5, pdl=False))
    assert len({KernelOptions(), KernelOptions(), k}) == 2
    assert (KernelOptions() == 3) is False and (KernelOptions() != "x") is True
    r = k.replace(pdl=True)
    assert r == KernelOptions(mla_split_tiles=5) and k.pdl is False  # k unchanged
    with pytest.raises(AttributeError):
        k.pdl = True  # type: ignore[misc]


def test_copy_deepcopy_and_pickle_give_the_same_value() -> None:
    # They raised TypeError (cannot pickle), so a dataclass holding options could not be copied.
    k = KernelOptions(gemv_rows=4, pdl=False, prefill_chunk=512)
    for c in (copy.copy(k), copy.deepcopy({"o": k})["o"], pickle.loads(pickle.dumps(k))):
        assert type(c) is KernelOptions and c == k and c.to_dict() == k.to_dict()
    bad = pickle.dumps(k).replace(b"gemv_rows", b"gemv_rowz")  # a state naming no field
    with pytest.raises(memra.ContractError, match="gemv_rowz"):
        pickle.loads(bad)
    with pytest.raises(TypeError), pytest.warns(RuntimeWarning):  # no re-initialising a live value
        k.__setstate__({"pdl": True})
    assert k.pdl is False


def test_engine_refuses_a_bool_device_index() -> None:
    with pytest.raises(memra.ContractError, match="device_index"):
        memra.Engine("cpu", False)  # type: ignore[arg-type]


def test_engine_keeps_its_options() -> None:
    k = KernelOptions(gemv_rows=4, mhc_defer=False)
    e = memra.Engine("cpu", options=k)
    assert e.options == k
    assert memra.Engine("cpu").options == KernelOptions()
    assert memra.Engine("cpu", 0, options=None).options == KernelOptions()


@pytest.mark.parametrize("bad", [{"pdl": False}, "pdl=0", 1, KernelOptions])
def test_engine_refuses_options_that_are_not_kernel_options(bad) -> None:
    with pytest.raises(memra.ContractError, match="options"):
        memra.Engine("cpu", options=bad)


def test_load_passes_kernel_options_to_its_engine() -> None:
    k = KernelOptions(pdl=False, moe_grouped_min_t=7)
    m = memra.load(memra.default_checkpoint(), max_batch=1, max_len=32, progress=False, kernel_options=k)
    assert m.engine.options == k
    m = memra.load(memra.default_checkpoint(), max_batch=1, max_len=32, progress=False)
    assert m.engine.options == KernelOptions()
    with pytest.raises(memra.ContractError, match="kernel_options"):
        memra.load(memra.default_checkpoint(), progress=False, kernel_options={"pdl": False})


def test_exported() -> None:
    assert "KernelOptions" in memra.__all__ and memra.KernelOptions is memra._core.KernelOptions


def test_the_package_namespace_is_its_exports_and_submodules() -> None:
    # `from __future__ import annotations` in __init__ left a public name `annotations`.
    import types
    public = {n for n in dir(memra) if not n.startswith("_")}
    extra = {n for n in public - set(memra.__all__) if not isinstance(getattr(memra, n), types.ModuleType)}
    assert extra == set(), extra
    assert set(memra.__all__) <= public
