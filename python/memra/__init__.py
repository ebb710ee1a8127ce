"""memra: an inference engine for hybrid linear-attention language models.

``memra.load(path)`` reads a Hugging Face checkpoint folder (config.json + safetensors) and
returns a model that prefills, decodes and generates. Every op is also usable on its own over
DLPack arrays through :mod:`memra.ops`.
"""

from __future__ import annotations

from . import _core
from .errors import (
    CacheFullError,
    ContractError,
    CudaError,
    LibraryError,
    MemraError,
    OutOfMemoryError,
    UnsupportedError,
)

__version__ = "0.1.0"

__all__ = [
    "CacheFullError",
    "ContractError",
    "CudaError",
    "LibraryError",
    "MemraError",
    "OutOfMemoryError",
    "UnsupportedError",
]
