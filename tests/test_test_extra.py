"""The `test` extra (pip install -e '.[test]', what scripts/test.sh installs) declares every
third-party module the server tests import directly: a module missing from it makes test_serve.py
skip as a whole in a fresh environment (openai >= 3 depends on httpx2, not httpx), so the README's
test command would pass without running them."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib")  # Python >= 3.11

ROOT = Path(__file__).resolve().parents[1]


def test_the_test_extra_declares_what_the_serve_tests_import() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    declared = {re.split(r"[<>=!~\[ ;]", d, maxsplit=1)[0].lower()
                for d in project["dependencies"] + project["optional-dependencies"]["test"]}
    skipped_on = set(re.findall(r'importorskip\("(\w+)"\)', (ROOT / "tests" / "test_serve.py").read_text()))
    assert skipped_on, "test_serve.py no longer guards its imports: update this test"
    assert skipped_on <= declared, f"not in the test extra or the dependencies: {sorted(skipped_on - declared)}"
