"""Guards against a ptxas miscompile that only shows on a GPU as cudaErrorIllegalInstruction
(no marker: runs here, without a device).

createpolicy + cp.async.L2::cache_hint: CUDA 13.x ptxas (sm_90a) drops the policy and leaves
LDGSTS reading an unwritten uniform register pair as its memory descriptor, desc[UR1]; every
launch of the kernel then traps (IST-DASLab/marlin#44, triton-lang/triton#11660). It killed a
streaming KDA decode kernel on the H200 (branch kdadec2, 2026-12-02; not merged: it lost the A/B
to cuda/kda_decode_lines.cu). A memory descriptor is a
64-bit uniform pair and starts at an even register, so an odd desc[URn] in the SASS is the
miscompile's fingerprint. The tensor memory accelerator's bulk copies (cp.async.bulk.tensor,
UTMALDG, which take the policy as an operand) are not affected: the MLA decode kernel's
evict-first cache loads ran its tests on the H200 (session 18), and the SASS check below covers
every kernel either way.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

import memra

CUDA_DIR = Path(__file__).resolve().parents[1] / "cuda"


def test_no_cp_async_with_an_l2_cache_hint_in_the_sources() -> None:
    bad = []
    for f in sorted(CUDA_DIR.rglob("*.cu*")):
        for n, line in enumerate(f.read_text().splitlines(), 1):
            if ("cp.async" in line and "cp.async.bulk" not in line and "cache_hint" in line
                    and not line.lstrip().startswith("//")):
                bad.append(f"{f.name}:{n}: {line.strip()}")
    assert not bad, "cp.async with L2::cache_hint (ptxas miscompile):\n" + "\n".join(bad)


def cuobjdump(flag: str) -> tuple[str, str]:
    """(`cuobjdump flag` over the built libmemra_cuda.so, the library's name); skips the test
    where there is no CUDA library or no cuobjdump."""
    lib = Path(memra._core.__file__).parent / "libmemra_cuda.so"
    if not lib.exists() or shutil.which("cuobjdump") is None:
        pytest.skip("no libmemra_cuda.so or no cuobjdump here")
    out = subprocess.run(["cuobjdump", flag, str(lib)], check=True, capture_output=True,
                         text=True).stdout
    return out, lib.name


def test_no_memory_descriptor_in_an_odd_uniform_register() -> None:
    sass, _ = cuobjdump("-sass")
    kernel = ""
    bad = []
    for line in sass.splitlines():
        if "Function :" in line:
            kernel = line.split("Function :", 1)[1].strip()
        for m in re.finditer(r"desc\[UR(\d+)\]", line):
            if int(m.group(1)) % 2:
                bad.append(f"{kernel}: {line.split(';')[0].strip()}")
    assert not bad, f"{len(bad)} odd memory descriptors, e.g.:\n" + "\n".join(bad[:5])


def test_the_chunked_scan_kernels_keep_their_values_in_registers() -> None:
    # cuda/kda_chunk_state.cu holds the f32 state, two accumulator tiles and the A fragments in
    # 255 registers; a spill would put local-memory round trips on its sequential chain (and the
    # intra kernel's two blocks an SM assume its registers). ptxas reports spills as a stack
    # frame: every chunk kernel must have none.
    usage, lib_name = cuobjdump("-res-usage")
    seen, bad = 0, []
    kernel = ""
    for line in usage.splitlines():
        if line.strip().startswith("Function "):
            kernel = line.strip()[len("Function "):].rstrip(":")
            continue
        if "chunk_state_kernel" in kernel or "chunk_intra_kernel" in kernel:
            m = re.search(r"STACK:(\d+).*LOCAL:(\d+)", line)
            if m:
                seen += 1
                if int(m.group(1)) or int(m.group(2)):
                    bad.append(f"{kernel}: {line.strip()}")
            kernel = ""
    assert seen >= 3, f"found {seen} chunk kernels in {lib_name}"
    assert not bad, "chunk kernels with a stack frame or local memory:\n" + "\n".join(bad)
