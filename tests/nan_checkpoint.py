"""Copies of the embedded checkpoint with NaN weights, for the non-finite-logits tests."""

from __future__ import annotations

import shutil
from pathlib import Path

import ml_dtypes  # noqa: F401  (bfloat16 for safetensors' numpy framework)
import numpy as np
from safetensors.numpy import load_file, save_file

import memra

PREFIX = "model.language_model."


def _copy_with(tmp: Path, name: str, edit) -> Path:
    src = memra.default_checkpoint()
    folder = tmp / f"nan_{name.replace('.', '_')}"
    shutil.copytree(src, folder)
    tensors = load_file(str(src / "model.safetensors"))
    arr = tensors[PREFIX + name].copy()
    edit(arr)
    tensors[PREFIX + name] = arr
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    return folder


def nan_embedding_row(tmp: Path, token: int) -> Path:
    """A checkpoint whose embedding row `token` is NaN: logits stay finite until `token` is fed."""
    def edit(a: np.ndarray) -> None:
        a[token] = np.nan
    return _copy_with(tmp, "embed_tokens.weight", edit)


def nan_final_norm(tmp: Path) -> Path:
    """A checkpoint whose final norm is NaN: every row of logits is NaN."""
    def edit(a: np.ndarray) -> None:
        a[:] = np.nan
    return _copy_with(tmp, "norm.weight", edit)
