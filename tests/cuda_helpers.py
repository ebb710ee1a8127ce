"""Shared helpers of the CUDA op tests (tests/test_cuda_*.py): seeded generators and normal
draws, float32 and bfloat16 conversions, f32 / bf16 Weights and their device uploads, CUDA engines made with given kernel options, the names of the
kernels a call launched. The `e` fixture (a CUDA Engine per module, default options) lives in
conftest.py."""

from __future__ import annotations

import atexit
import functools
import json
from collections import Counter
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

import memra
from memra import _core

BF16 = np.dtype(ml_dtypes.bfloat16)


def rng(seed: int) -> np.random.Generator:
    return np.random.default_rng(seed)


def f32(a) -> np.ndarray:
    """A C-contiguous float32 copy (or view) of `a`."""
    return np.ascontiguousarray(a, dtype=np.float32)


def bf16_round(x) -> np.ndarray:
    """x rounded to bfloat16 (round to nearest even) and widened back to float32."""
    return f32(np.asarray(x, np.float32).astype(BF16).astype(np.float32))


def randn(r: np.random.Generator, *shape: int, scale: float = 1.0) -> np.ndarray:
    """Standard normal float32 values of `shape` from `r`, times `scale`."""
    return f32(r.standard_normal(shape) * scale)


def weight(a) -> _core.Weight:
    """A memra Weight holding `a` as float32."""
    return _core.Weight(f32(a))


def dweight(e: memra.Engine, a, dtype: str | None = None) -> memra.DeviceWeight:
    """`a` as a float32 Weight uploaded to engine `e` (in `dtype` when given)."""
    return memra.DeviceWeight(e, weight(a), dtype=dtype)


def bf16_bits(x) -> np.ndarray:
    """x rounded to bfloat16, as the raw uint16 bits memra takes for bf16 arrays."""
    return np.ascontiguousarray(np.asarray(x, np.float32).astype(BF16)).view(np.uint16)


def bf16_weight(w) -> _core.Weight:
    """A memra Weight holding `w` rounded to bfloat16."""
    return _core.Weight(np.ascontiguousarray(np.asarray(w, np.float32).astype(BF16)).view(np.uint16),
                        dtype="bfloat16")


def close(got, want, tol) -> None:
    """Finite float32 `got` within np.testing.assert_allclose(**tol) of `want`."""
    assert got.shape == want.shape and got.dtype == np.float32
    assert np.all(np.isfinite(got))
    np.testing.assert_allclose(got, want, **tol)


def scaled_close(got, want, rtol, atol_rel) -> None:
    """Finite float32 `got` within rtol of `want` plus atol_rel * max|want| (absolute)."""
    assert got.shape == want.shape and got.dtype == np.float32
    assert np.all(np.isfinite(got))
    np.testing.assert_allclose(got, want, rtol=rtol, atol=atol_rel * float(np.abs(want).max()))


def close_scaled(got, want, rel) -> None:
    """|got - want| <= rel * max|want| elementwise (sums and GEMMs: the error scales with the row)."""
    assert got.shape == want.shape and got.dtype == np.float32
    assert np.all(np.isfinite(got))
    scale = max(float(np.abs(want).max()), 1e-30)
    err = float(np.abs(got.astype(np.float64) - want.astype(np.float64)).max())
    assert err <= rel * scale, f"max |d| = {err:.3g} > {rel:g} * max|y| = {rel * scale:.3g}"


def expect(cls, code, fn, *args, **kwargs):
    """fn(*args, **kwargs) raises `cls` with `.code == code`; returns the exception."""
    with pytest.raises(cls) as ei:
        fn(*args, **kwargs)
    assert ei.value.code == code, str(ei.value)
    return ei.value


@functools.lru_cache(maxsize=None)
def _engine_with(fields: tuple) -> memra.Engine:
    return memra.Engine("cuda", options=memra.KernelOptions(**dict(fields)))


atexit.register(_engine_with.cache_clear)  # the engines go before the interpreter tears down


def engine_with(**fields) -> memra.Engine:
    """A CUDA Engine made with memra.KernelOptions(**fields): one per distinct set of fields in
    the process (a context holds tens of MB of workspaces). Arrays an op reads must come from
    the engine that runs it (each engine has its own stream)."""
    return _engine_with(tuple(sorted(fields.items())))


# The driver carries out some of a captured graph's copy nodes as kernels of these names (seen:
# memcpy32_post), where the eager step's cudaMemcpyAsync shows as a copy: copies, not kernels.
DRIVER_COPY_KERNELS = ("memcpy", "memset")


def kernel_names(fn, trace: Path) -> list[str]:
    """The names of the CUDA kernels `fn` launched, in launch order: torch.profiler (CUDA
    activity) written to the Chrome trace `trace`, whose kernels are the events of category
    "kernel"; copies, memsets and the driver's copy kernels are left out. Waits for the whole
    device before and after `fn`. Skips the test where torch is missing."""
    torch = pytest.importorskip("torch", reason="the kernel census reads torch.profiler")
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    prof.export_chrome_trace(str(trace))
    events = json.loads(Path(trace).read_text())
    events = events.get("traceEvents", []) if isinstance(events, dict) else events
    names = [str(ev.get("name")) for ev in events
             if isinstance(ev, dict) and str(ev.get("cat", "")).lower() == "kernel"]
    return [n for n in names if not n.startswith(DRIVER_COPY_KERNELS)]


def kernel_census(fn, trace: Path) -> Counter:
    """kernel_names(fn, trace) counted by name."""
    return Counter(kernel_names(fn, trace))
