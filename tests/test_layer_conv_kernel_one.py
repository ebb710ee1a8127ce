"""A linear-attention layer whose short convolution has one tap (``linear_conv_kernel_dim`` = 1,
which the configs and the layers take): its ``forward`` ran into the conv op's "output ring
required" refusal (the ring has no columns at K = 1, so the layer passed none), though
``prefill`` on a cache ran. Found by a fuzzing pass over the Kimi-Linear and Qwen paths."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import ml_dtypes  # noqa: F401 - numpy reads the fixtures' bfloat16 through it
import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

import memra
from memra import _core

FIXTURES = Path(__file__).resolve().parent / "fixtures"


def _one_tap(tmp_path: Path, fixture: str, conv_keys: tuple[str, ...]) -> Path:
    """The fixture with every conv weight cut to its last tap and the config saying K = 1."""
    dst = tmp_path / fixture
    shutil.copytree(FIXTURES / fixture, dst)
    t = load_file(str(dst / "model.safetensors"))
    save_file({k: np.ascontiguousarray(v[..., -1:]) if k.endswith(conv_keys) else v for k, v in t.items()},
              str(dst / "model.safetensors"))
    cfg = json.loads((dst / "config.json").read_text())
    cfg["linear_conv_kernel_dim"] = 1
    (dst / "config.json").write_text(json.dumps(cfg))
    return dst


@pytest.mark.parametrize("fixture,conv_keys", [("tiny_qwen3_5_text", ("conv1d.weight",)),
                                               ("tiny_kimi_linear", ("q_conv1d.weight", "k_conv1d.weight",
                                                                     "v_conv1d.weight"))])
def test_forward_of_a_one_tap_conv_layer_equals_its_prefill(tmp_path, fixture, conv_keys) -> None:
    model = memra.load(_one_tap(tmp_path, fixture, conv_keys), max_batch=1, max_len=16, progress=False)
    layer = next(b.mixer.layer for b in model.net.blocks
                 if isinstance(getattr(b.mixer, "layer", None), (_core.GdnLayer, _core.KdaLayer)))
    x = np.random.default_rng(0).standard_normal((5, model.config.hidden_size)).astype(np.float32)
    cache = _core.Cache(model.engine, [layer.state_spec()], max_batch=1, max_len=8)
    want = np.asarray(layer.prefill(cache, 0, 0, x))
    got = np.asarray(layer.forward(x))
    np.testing.assert_array_equal(got, want)
    assert np.isfinite(got).all() and np.abs(got).max() > 0
