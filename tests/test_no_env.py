"""No library code reads the environment at run time (issue 17: options are typed fields of
memra.KernelOptions, given when an Engine is made). The scan covers the C++ runtime (cpp/), the
CUDA library (cuda/), the bindings (python/src) and the package (python/memra); build-time
CMake options are not code and are not scanned. Tests, benchmarks and scripts may use the
environment (they are not scanned)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LIBRARY_DIRS = ("cpp", "cuda", "python/src", "python/memra")
SUFFIXES = {".c", ".cc", ".cpp", ".cxx", ".h", ".hpp", ".cu", ".cuh", ".py", ".pyi"}

# getenv / secure_getenv / std::getenv / os.getenv calls, os.environ, `from os import environ`
# (or getenv), and the C `environ` array.
PATTERNS = [
    re.compile(r"\b(?:secure_)?getenv\s*\("),
    re.compile(r"\bos\s*\.\s*environ\b"),
    re.compile(r"\bfrom\s+os\s+import\b[^\n]*\b(?:environ|getenv)\b"),
    re.compile(r"\bextern\s+char\s*\*\s*\*\s*environ\b"),
]


def environment_reads(paths) -> list[str]:
    """'file:line: text' for every line of the given files (and of the source files under the
    given directories) that reads the environment."""
    hits = []
    for p in map(Path, paths):
        files = [p] if p.is_file() else sorted(f for f in p.rglob("*") if f.suffix in SUFFIXES and f.is_file())
        for f in files:
            for n, line in enumerate(f.read_text(errors="replace").splitlines(), 1):
                if any(pat.search(line) for pat in PATTERNS):
                    hits.append(f"{f}:{n}: {line.strip()}")
    return hits


def test_library_code_reads_no_environment() -> None:
    dirs = [ROOT / d for d in LIBRARY_DIRS]
    assert all(d.is_dir() for d in dirs), dirs
    hits = environment_reads(dirs)
    assert not hits, "library code reads the environment (use memra.KernelOptions):\n" + "\n".join(hits)


def test_the_scan_finds_planted_reads(tmp_path: Path) -> None:
    planted = {
        "knob.cu": 'if (const char* v = std::getenv("MEMRA_X")) ctx->x = 1;\n',
        "knob.cpp": 'const char* v = secure_getenv("MEMRA_X");\n',
        "knob.h": "extern char** environ;\n",
        "knob.py": 'import os\nflag = os.environ.get("MEMRA_X")\n',
        "knob2.py": 'import os\nflag = os.getenv("MEMRA_X")\n',
        "knob3.py": "from os import environ\n",
    }
    for name, text in planted.items():
        (tmp_path / name).write_text(text)
    (tmp_path / "clean.cpp").write_text("// options come from KernelOptions, not the environment\nint x = 1;\n")
    (tmp_path / "clean.py").write_text("environment = {}\nopts = dict(getenvironment=1)\n")
    hits = environment_reads([tmp_path])
    for name in planted:
        assert any(h.startswith(str(tmp_path / name) + ":") for h in hits), (name, hits)
    assert not any("clean" in h for h in hits), hits
    assert len(hits) == len(planted), hits
    # A single file is scanned as well.
    assert len(environment_reads([tmp_path / "knob.cu"])) == 1
