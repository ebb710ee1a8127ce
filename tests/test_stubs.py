"""The checked-in type stubs (python/memra/_core.pyi) equal what nanobind's stubgen produces for
the built extension, so the Python surface cannot drift silently. Regenerate with:
    python -m nanobind.stubgen -m memra._core -o python/memra/_core.pyi
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_stub_matches_extension(tmp_path: Path) -> None:
    pytest.importorskip("nanobind.stubgen", reason="nanobind is a [test] extra")
    out = tmp_path / "_core.pyi"
    r = subprocess.run([sys.executable, "-m", "nanobind.stubgen", "-m", "memra._core", "-o", str(out)],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    checked_in = (ROOT / "python" / "memra" / "_core.pyi").read_text()
    assert out.read_text() == checked_in, "python/memra/_core.pyi is stale: regenerate it (see module docstring)"


def test_py_typed_is_shipped() -> None:
    assert (ROOT / "python" / "memra" / "py.typed").exists()
