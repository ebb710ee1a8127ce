"""memra: an inference engine for hybrid linear-attention language models.

``memra.load(path)`` reads a Hugging Face checkpoint folder (config.json + safetensors) and
returns a model that prefills, decodes and generates. Every op is also usable on its own over
DLPack arrays through :mod:`memra._core` (``memra._core.rms_norm``, ``kda_scan``, ...).
"""

import atexit
import os
import threading

from . import _core
from ._core import (
    AttentionLayer,
    Cache,
    DeviceArray,
    DeviceWeight,
    Engine,
    GdnLayer,
    HyperConnection,
    KdaLayer,
    KernelOptions,
    LayerStateSpec,
    MlaLayer,
    MlpLayer,
    MoeLayer,
    Weight,
    cuda_available,
    cuda_unavailable_reason,
)
from .errors import (
    CacheFullError,
    ContractError,
    CudaError,
    LibraryError,
    MemraError,
    NonFiniteError,
    OutOfMemoryError,
    UnsupportedError,
)

from .checkpoint import default_checkpoint, load
from .model import Model


def _quiet_threads() -> list[int]:
    """Threads that hold no memra object: tqdm's monitor (load's progress bar starts it)."""
    return [t.ident for t in threading.enumerate() if type(t).__name__ == "TMonitor"]


# A thread still inside memra when the interpreter finalizes would abort the process: the exit
# first waits for such calls (memra._core._finish_native_calls says why); a fork's child starts
# the count over.
atexit.register(lambda: _core._finish_native_calls(_quiet_threads()))
os.register_at_fork(before=lambda: _core._before_fork(_quiet_threads()), after_in_child=_core._after_fork_in_child)

__version__ = "0.1.0"

__all__ = [
    "AttentionLayer",
    "Cache",
    "DeviceArray",
    "DeviceWeight",
    "Engine",
    "GdnLayer",
    "HyperConnection",
    "KdaLayer",
    "KernelOptions",
    "LayerStateSpec",
    "MlaLayer",
    "MlpLayer",
    "Model",
    "MoeLayer",
    "Weight",
    "cuda_available",
    "cuda_unavailable_reason",
    "default_checkpoint",
    "load",
    "CacheFullError",
    "ContractError",
    "CudaError",
    "LibraryError",
    "MemraError",
    "NonFiniteError",
    "OutOfMemoryError",
    "UnsupportedError",
]
