"""pytest configuration: the `cuda` marker and --require-cuda (DESIGN.md "Conventions").

A test marked ``@pytest.mark.cuda`` skips, with the reason, where no CUDA device is usable; with
``--require-cuda`` the same situation fails the test, so a GPU run can never pass by skipping.
"""

from __future__ import annotations

import os

import pytest

# Under pytest-xdist each worker's numpy would start a BLAS thread per core: 8 workers on the
# H200 machine's 16 cores ran the numpy references of test_cuda_mla_prefill_tc.py past a 300 s
# limit (session 18), where two threads a worker finish the CUDA suite in 73 s. Set before any
# test module imports numpy; an explicit setting wins.
if "PYTEST_XDIST_WORKER" in os.environ:
    for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(_var, "2")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--require-cuda", action="store_true", default=False,
                     help="fail (instead of skip) tests marked cuda when no CUDA device is usable")


def pytest_runtest_setup(item: pytest.Item) -> None:
    if "cuda" not in item.keywords:
        return
    import memra

    if memra.cuda_available():
        return
    reason = memra.cuda_unavailable_reason()
    if item.config.getoption("--require-cuda"):
        pytest.fail(f"--require-cuda given but CUDA is unavailable: {reason}", pytrace=False)
    pytest.skip(f"no CUDA: {reason}")


@pytest.fixture(scope="module")
def e():
    """A CUDA Engine for the tests of one module (tests marked cuda only reach it with a device)."""
    import memra

    return memra.Engine("cuda")


@pytest.fixture
def loads(monkeypatch):
    """The CLI's loader as a stand-in that records the path and fails the test: a flag refused
    before the load leaves the list empty."""
    from memra import cli

    seen = []

    def load(path, **kw):
        seen.append(path)
        raise AssertionError("loaded")

    monkeypatch.setattr(cli, "load", load)
    return seen
