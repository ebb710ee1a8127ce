"""The CUDA library probe on a machine with a GPU (marked cuda: skips here with the reason, fails
under --require-cuda when no device is usable)."""

from __future__ import annotations

import pytest

import memra


@pytest.mark.cuda
def test_cuda_library_loads_and_sees_a_device() -> None:
    assert memra.cuda_available()
    assert memra.cuda_unavailable_reason() is None
    with pytest.raises(memra.ContractError) as e:
        memra.Engine("cuda", device_index=10_000)
    assert e.value.code == memra._core.status.CONTRACT_RANGE


def test_cpu_engine_is_always_available() -> None:
    assert memra.Engine("cpu").device == "cpu"
    reason = memra.cuda_unavailable_reason()
    assert (reason is None) == memra.cuda_available()


def test_cuda_library_is_built_where_nvcc_is() -> None:
    # CI has nvcc but no GPU: the CUDA sources must still have compiled into the package
    # (MEMRA_CUDA=AUTO), and import memra must still work without a driver.
    import os
    import shutil
    from pathlib import Path

    if shutil.which("nvcc") is None or os.environ.get("MEMRA_CUDA", "AUTO").upper() == "OFF":
        pytest.skip("no nvcc here (or MEMRA_CUDA=OFF): the CUDA library is not built")
    assert (Path(memra._core.__file__).parent / "libmemra_cuda.so").exists()
    reason = memra.cuda_unavailable_reason() or ""
    assert "built without" not in reason, reason
    # Without the [cuda] extra the library cannot find cuBLAS at run time; anything else missing
    # would be a broken build.
    if "could not be loaded" in reason:
        assert "libcublas" in reason and "memra[cuda]" in reason, reason
    if "(code 10035)" in reason:  # with cuBLAS there and no driver: the runtime's words alone misled
        assert reason.startswith("no NVIDIA driver, or one older than the CUDA 13 runtime"), reason
