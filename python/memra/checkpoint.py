"""``memra.load``: a Hugging Face checkpoint folder (config.json + safetensors) made into a
:class:`memra.Model` on a device, and the tiny checkpoint shipped inside the package."""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path

import numpy as np

from . import _core
from .batch import count_arg
from .config import read_config
from .errors import ContractError, UnsupportedError, shown
from .loader import naming_unreadable, read_generation_config, read_tensors
from .model import Model
from .models import DecoderModel
from .tokenizer import read_tokenizer

log = logging.getLogger("memra")


def load(path, device: str = "cpu", max_batch: int = 8, max_len: int = 4096, *, dtype: str | None = None,
         progress: bool = True, cuda_graphs: bool = True,
         kernel_options: _core.KernelOptions | None = None) -> Model:
    """Load a Hugging Face checkpoint folder (config.json + safetensors) onto `device`.

    device: "cpu" (the f32 reference backend) or "cuda" (memra's kernels on GPU 0; "cuda:N" for
    another). dtype: the compute dtype of the weights: "float32" (the only one on the CPU) or
    "bfloat16" (the default on CUDA: bf16 weights converted once at load, f32 accumulation and
    recurrent state, bf16 latent cache). cuda_graphs: on CUDA, replay decode steps from CUDA
    graphs captured per batch bucket (False: run them eagerly; the same bytes, slower).
    kernel_options: the CUDA kernels' arms (memra.KernelOptions; None: the defaults), given to
    the model's Engine (``model.engine.options``); a CPU engine ignores them but
    ``prefill_chunk``. progress: a progress bar over the safetensors shards (shown for two or
    more).

    The default cache (`max_batch` slots x `max_len` tokens) is sized from the config and
    allocated before any weight is read: OutOfMemoryError when it cannot fit. ContractError for
    a missing, extra, repeated or mis-shaped tensor, a file that cannot be read or parsed, a
    generation_config.json value memra cannot use (an EOS id outside the vocabulary, a sampling
    default the sampler refuses), each named, a path that is empty or not a folder (40024), a device but
    "cpu", "cuda", "cuda:N", a dtype but those two, or an argument of the wrong type or range
    (max_batch / max_len not a positive integer, progress / cuda_graphs not a bool,
    kernel_options not a KernelOptions); UnsupportedError for a model_type or config memra
    cannot run, a device it cannot use here (no CUDA: 50001), or "bfloat16" on the CPU.
    Ctrl-C: while the model's calls run on the main thread, memra's SIGINT handler stands in
    front of the application's (Python's default one, asyncio's, its own) and holds a SIGINT
    back while a cache is updated in several steps, passing it on once the update is whole
    (docs/prefill.md, memra._interrupts); between calls the application's handler is in place.
    Warnings on the "memra" logger: weights skipped as transformers skips them (multi-token
    prediction, vision tower), sampling defaults memra does not apply, a tokenizer with ids past
    vocab_size.
    """
    if not isinstance(cuda_graphs, (bool, np.bool_)):
        raise ContractError(f"load: cuda_graphs must be True or False, got {cuda_graphs!r}", 40025)
    if not isinstance(progress, (bool, np.bool_)):
        raise ContractError(f"load: progress must be True or False, got {shown(progress)}", 40025)
    cuda_graphs = bool(cuda_graphs)
    if not isinstance(path, (str, os.PathLike)):
        raise ContractError(f"load: path must be a folder path (str or os.PathLike), got {shown(path)}", 40020)
    if os.fspath(path) in ("", b""):  # Path("") is ".": an empty path is a mistake, not this folder
        raise ContractError("load: path is empty; it must name a checkpoint folder", 40024)
    path = Path(path)
    if not path.is_dir():
        raise ContractError(f"load: path {str(path)!r} is not a directory", 40024)
    with naming_unreadable(path / "config.json"):  # read_config names a missing or malformed one
        family, cfg = read_config(path)
    gen = read_generation_config(path, cfg)  # before any memory is taken: a bad default costs nothing
    max_batch = count_arg(max_batch, "load: max_batch", 1)
    max_len = count_arg(max_len, "load: max_len", 1)
    if not isinstance(device, str):
        raise ContractError(f"load: device must be a string such as 'cpu' or 'cuda', got {device!r}", 40025)
    # The whole grammar: "cpu" | "cuda" | "cuda:N" (ASCII digits; "cpu:" or "cuda:" is no device).
    m = re.fullmatch(r"(cpu)|(cuda)(?::([0-9]{1,9}))?", device)
    if m is None:
        raise ContractError(f"load: bad device {device!r} (expected 'cpu', 'cuda' or 'cuda:N')", 40025)
    kind, index = m.group(1) or m.group(2), m.group(3)
    if kernel_options is not None and not isinstance(kernel_options, _core.KernelOptions):
        raise ContractError(f"load: kernel_options must be a memra.KernelOptions or None, got {kernel_options!r}",
                            40025)
    engine = _core.Engine(kind, int(index or 0), options=kernel_options)
    if dtype is None:
        dtype = "bfloat16" if engine.is_cuda else "float32"
    if not isinstance(dtype, str) or dtype not in ("float32", "bfloat16"):
        raise ContractError(f"load: dtype must be 'float32' or 'bfloat16', got {dtype!r}", 40025)
    if dtype == "bfloat16" and not engine.is_cuda:
        raise UnsupportedError("load: dtype='bfloat16' needs a CUDA device; the CPU backend computes in "
                               "float32 only (give dtype='float32' or leave it out)", 50000)
    tokenizer = read_tokenizer(path)  # before the cache and weights: a bad tokenizer costs nothing
    n_tok = tokenizer.get_vocab_size(with_added_tokens=True) if tokenizer is not None else 0
    if n_tok > cfg.vocab_size:  # such ids are refused when fed (check_token_ids); said once here
        log.warning("memra: the tokenizer of %s has %d ids, past the model's vocab_size %d: a text "
                    "encoding to an id >= %d is refused", path, n_tok, cfg.vocab_size, cfg.vocab_size)
    plan = family.layer_plan(cfg)  # decided once: the cache's planes and the blocks
    specs = [p.state for p in plan]
    need = _core.Cache.bytes_needed(max_batch, max_len, specs)
    log.info("memra: cache of %d x %d tokens needs %.1f MiB", max_batch, max_len, need / 2**20)
    cache = _core.Cache(engine, specs, max_batch=max_batch, max_len=max_len, latent_dtype=dtype)
    tensors = read_tensors(path, cfg.num_hidden_layers, names=family.names, progress=progress)
    net = DecoderModel(engine, family, cfg, plan, tensors, dtype=dtype)
    return Model(path, engine, cfg, net, cache, gen.eos_token_ids, tokenizer, cuda_graphs=cuda_graphs,
                 generation_config=gen)


def default_checkpoint() -> Path:
    """The tiny glm5_next checkpoint shipped inside the package (random weights; for smoke runs)."""
    return Path(__file__).parent / "data" / "tiny_glm5_next"
