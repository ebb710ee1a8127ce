"""Runs the GoogleTest C++ tests (tests/cpp/*.cpp) through pytest.

The binary is configured and built with CMake into build/pytest-cpp (MEMRA_BUILD_PYTHON=OFF,
MEMRA_CUDA=OFF; GoogleTest from the system, e.g. Debian's libgtest-dev), then each C++ test suite
runs as one pytest case so a failure names the suite.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BUILD = ROOT / "build" / "pytest-cpp"


@pytest.fixture(scope="session")
def gtest_binary() -> Path:
    gen = ["-G", "Ninja"] if shutil.which("ninja") else []
    cfg = subprocess.run(
        ["cmake", "-S", str(ROOT), "-B", str(BUILD), *gen, "-DMEMRA_BUILD_TESTS=ON",
         "-DMEMRA_BUILD_PYTHON=OFF", "-DMEMRA_CUDA=OFF", "-DCMAKE_BUILD_TYPE=Release"],
        capture_output=True, text=True)
    assert cfg.returncode == 0, f"cmake configure failed:\n{cfg.stdout}\n{cfg.stderr}"
    build = subprocess.run(["cmake", "--build", str(BUILD), "--target", "memra_cpp_tests", "-j", "2"],
                           capture_output=True, text=True)
    assert build.returncode == 0, f"C++ test build failed:\n{build.stdout[-4000:]}\n{build.stderr[-4000:]}"
    return BUILD / "memra_cpp_tests"


def _suites() -> list[str]:
    names = []
    for src in sorted((ROOT / "tests" / "cpp").glob("*.cpp")):
        for line in src.read_text().splitlines():
            line = line.strip()
            if line.startswith("TEST(") or line.startswith("TEST_F(") or line.startswith("TEST_P("):
                suite = line.split("(", 1)[1].split(",", 1)[0].strip()
                if suite not in names:
                    names.append(suite)
    return names


@pytest.mark.parametrize("suite", _suites())
def test_cpp_suite(gtest_binary: Path, suite: str) -> None:
    r = subprocess.run([str(gtest_binary), f"--gtest_filter={suite}.*"], capture_output=True, text=True)
    sys.stdout.write(r.stdout[-2000:])
    assert r.returncode == 0, f"C++ suite {suite} failed:\n{r.stdout[-6000:]}\n{r.stderr[-2000:]}"
    assert "[  PASSED  ]" in r.stdout
