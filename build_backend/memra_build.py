"""memra's PEP 517 backend: scikit-build-core, plus the `nvidia-cublas` wheel as a build
requirement when the CUDA backend will be built (nvcc reachable and MEMRA_CUDA is not OFF).

Build isolation hides the environment's packages from CMake, so cuBLAS's headers must be asked for
here; CPU-only builds (no nvcc, or MEMRA_CUDA=OFF) never download the ~400 MB wheel
(../shared/BUILD.md, step 3).
"""

from __future__ import annotations

import os
import shutil

from scikit_build_core import build as _skbuild
from scikit_build_core.build import *  # noqa: F401,F403  (build_wheel, build_sdist, ...)


def _cuda_requires() -> list[str]:
    if os.environ.get("MEMRA_CUDA", "AUTO").upper() == "OFF":
        return []
    nvcc = shutil.which("nvcc") or (os.path.exists("/usr/local/cuda/bin/nvcc") and "/usr/local/cuda/bin/nvcc")
    return ["nvidia-cublas"] if nvcc else []


def get_requires_for_build_wheel(config_settings=None) -> list[str]:
    return list(_skbuild.get_requires_for_build_wheel(config_settings)) + _cuda_requires()


def get_requires_for_build_editable(config_settings=None) -> list[str]:
    return list(_skbuild.get_requires_for_build_editable(config_settings)) + _cuda_requires()
