"""memra.AttentionLayer (the gated full attention of Qwen3.5 / Qwen3-Next) on the CPU against
transformers 5.17 Qwen3_5Attention, and its cache contract (LayerStateSpec.attention).

The reference is transformers' own module: live where transformers is installed (random weights,
several geometries: GQA, head_dim 256 and small ones, full and partial rotary, biases), and
frozen for CI in tests/fixtures/qwen3_5_attention_reference.npz (make_qwen_attention_fixture.py:
layer 1 of tests/fixtures/tiny_qwen3_5, 4 query / 2 KV heads of 256, rotary 64 of 256, theta 1e7).
Tolerance against transformers' float32 (and float64) outputs: 1e-5 * max|y|; measured ~1e-6.

The CPU chain runs every row on its own (projections, norms, rotation and attention are per row
and per query), so a decode row and a prefill row at the same position give the same bytes, and
a row's bytes do not depend on the other rows of its batch: those comparisons are exact.
"""

from __future__ import annotations

import json
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from safetensors import safe_open

import memra
from memra import _core
from memra.models.layers import AttentionMixer, StepContext

FIX = Path(__file__).parent / "fixtures"
TINY = FIX / "tiny_qwen3_5"
TOL = 1e-5


def rel_err(got, want) -> float:
    return float(np.abs(got.astype(np.float64) - want).max() / np.abs(want).max())


def tiny_weights() -> dict[str, _core.Weight]:
    """Layer 1's self_attn.* of the tiny Qwen3.5 checkpoint (bf16 on disk, as memra reads them)."""
    p = "model.language_model.layers.1.self_attn."
    out = {}
    with safe_open(str(TINY / "model.safetensors"), "numpy") as f:
        for name in f.keys():
            if name.startswith(p):
                out[name[len(p):]] = _core.Weight(f.get_tensor(name).view(np.uint16), dtype="bfloat16")
    return out


TINY_KW = dict(hidden=64, heads=4, kv_heads=2, head_dim=256, rotary_dim=64, rope_theta=1e7, rms_eps=1e-6)


def tiny_layer(engine=None, dtype="float32"):
    return memra.AttentionLayer(engine or memra.Engine("cpu"), tiny_weights(), **TINY_KW, dtype=dtype)


def random_weights(g, hidden, heads, kv_heads, head_dim, bias=False) -> dict[str, np.ndarray]:
    """float32 weights with O(1) activations; zero-centred norm weights away from 0."""
    def lin(n, k):
        return (g.standard_normal((n, k)) / np.sqrt(k)).astype(np.float32)
    w = {"q_proj.weight": lin(heads * 2 * head_dim, hidden), "k_proj.weight": lin(kv_heads * head_dim, hidden),
         "v_proj.weight": lin(kv_heads * head_dim, hidden), "o_proj.weight": lin(hidden, heads * head_dim),
         "q_norm.weight": (0.3 * g.standard_normal(head_dim)).astype(np.float32),
         "k_norm.weight": (0.3 * g.standard_normal(head_dim)).astype(np.float32)}
    if bias:
        for n, rows in (("q", heads * 2 * head_dim), ("k", kv_heads * head_dim), ("v", kv_heads * head_dim),
                        ("o", hidden)):
            w[f"{n}_proj.bias"] = (0.5 * g.standard_normal(rows)).astype(np.float32)
    return w


def run_prefill_decode(layer, x, t0, engine=None):
    """prefill(x[:t0]) then decode the remaining rows one at a time in slot 1; all rows' y."""
    cache = memra.Cache(engine or memra.Engine("cpu"), [layer.state_spec()], max_batch=2, max_len=len(x) + 4)
    ys = [layer.prefill(cache, 0, 1, x[:t0])]
    cache.commit(1, t0)
    for t in range(t0, len(x)):
        ys.append(layer.decode(cache, 0, np.array([1], np.int32), x[t:t + 1]))
        cache.commit(1, 1)
    return np.concatenate(ys), cache


# ---------------------------------------------------------------- against transformers


def test_layer_matches_frozen_transformers_reference():
    z = np.load(FIX / "qwen3_5_attention_reference.npz")
    layer = tiny_layer()
    assert np.array_equal(layer.inv_freq, z["rope_inv_freq"])
    assert layer.scale == np.float32(256 ** -0.5)
    cache = memra.Cache(memra.Engine("cpu"), [layer.state_spec()], max_batch=1, max_len=64)
    y = layer.prefill(cache, 0, 0, z["x"])
    assert rel_err(y, z["y"]) <= TOL and rel_err(y, z["y_f64"]) <= TOL
    for t0 in (1, 25, 39):
        yd, _ = run_prefill_decode(layer, z["x"], t0)
        assert rel_err(yd, z["y_f64"]) <= TOL, t0


LIVE = [  # hidden, heads, kv_heads, head_dim, partial_rotary_factor, rope_theta, attention_bias, T
    (48, 4, 2, 32, 0.5, 1e4, False, 65),
    (40, 3, 1, 256, 0.25, 1e7, True, 63),
    (32, 2, 2, 18, 1.0, 1e6, False, 33),
    (24, 8, 2, 16, 0.0, 1e4, False, 17),
]


@pytest.mark.parametrize("case", LIVE, ids=[f"h{c[0]}-q{c[1]}-kv{c[2]}-d{c[3]}-r{c[4]}" for c in LIVE])
def test_layer_matches_transformers_live(case):
    torch = pytest.importorskip("torch")
    M = pytest.importorskip("transformers.models.qwen3_5.modeling_qwen3_5")
    from transformers.models.qwen3_5.configuration_qwen3_5 import Qwen3_5TextConfig

    hidden, heads, kv, hd, prf, theta, bias, T = case
    text = json.loads((TINY / "config.json").read_text())["text_config"]
    text.update(hidden_size=hidden, num_attention_heads=heads, num_key_value_heads=kv, head_dim=hd,
                attention_bias=bias, partial_rotary_factor=prf)
    text["rope_parameters"] = dict(text["rope_parameters"], rope_theta=theta, partial_rotary_factor=prf)
    config = Qwen3_5TextConfig(**text)
    config._attn_implementation = "eager"
    g = np.random.default_rng(hidden + hd)
    w = random_weights(g, hidden, heads, kv, hd, bias)
    attn = M.Qwen3_5Attention(config, layer_idx=1).eval()
    attn.load_state_dict({k: torch.from_numpy(v) for k, v in w.items()}, strict=True)
    rotary = M.Qwen3_5TextRotaryEmbedding(config)
    x = g.standard_normal((T, hidden)).astype(np.float32)
    with torch.no_grad():
        h = torch.from_numpy(x)[None]
        cos, sin = rotary(h, torch.arange(T)[None, None, :].expand(3, 1, T))
        mask = torch.full((T, T), float("-inf")).triu(1)[None, None]
        want = attn(h, position_embeddings=(cos, sin), attention_mask=mask)[0][0].double().numpy()
    rot = int(hd * prf)  # transformers' dim = int(head_dim * partial_rotary_factor)
    layer = memra.AttentionLayer(memra.Engine("cpu"), {k: _core.Weight(v) for k, v in w.items()}, hidden=hidden,
                                 heads=heads, kv_heads=kv, head_dim=hd, rotary_dim=rot, rope_theta=theta,
                                 rms_eps=config.rms_norm_eps)
    assert np.array_equal(layer.inv_freq, rotary.inv_freq.numpy())
    cache = memra.Cache(memra.Engine("cpu"), [layer.state_spec()], max_batch=1, max_len=T)
    assert rel_err(layer.prefill(cache, 0, 0, x), want) <= TOL
    yd, _ = run_prefill_decode(layer, x, T // 2)
    assert rel_err(yd, want) <= TOL


def ref_layer(w, x, heads, kv_heads, head_dim, rotary_dim, rope_theta, eps):
    """Qwen3_5Attention.forward in float64 (attention_bias: every projection's bias when given),
    from the op references of test_ops_attention.py: q_proj's output viewed [T, H, 2 * hd] (query,
    gate), zero-centred q / k norms (1 + w), rotate_half RoPE on the first rotary_dim dims, causal
    eager attention with repeat_kv, * sigmoid(gate), o_proj."""
    from test_ops_attention import ref_attention, ref_inv_freq_f32, ref_prep

    x64, T = x.astype(np.float64), len(x)

    def proj(n):
        b = w.get(f"{n}_proj.bias")
        return x64 @ w[f"{n}_proj.weight"].T.astype(np.float64) + (0.0 if b is None else b)

    qg = proj("q").reshape(T, heads, 2 * head_dim)
    k, v = proj("k").reshape(T, kv_heads, head_dim), proj("v").reshape(T, kv_heads, head_dim)
    qn, kn = (1.0 + w[f"{n}_norm.weight"].astype(np.float64) for n in "qk")
    pos = np.arange(T, dtype=np.int32)
    q, gate, kk = ref_prep(qg, k, qn, kn, eps, rotary_dim, ref_inv_freq_f32(rope_theta, rotary_dim), pos)
    o = ref_attention(q, kk, v, pos + 1, head_dim**-0.5, gate).reshape(T, heads * head_dim)
    b = w.get("o_proj.bias")
    return o @ w["o_proj.weight"].T.astype(np.float64) + (0.0 if b is None else b)


@pytest.mark.parametrize("case", [(40, 3, 1, 256, 64, 1e7, 63), (48, 4, 2, 32, 16, 1e4, 33)])
def test_layer_with_biases_matches_numpy_reference(case):
    # The frozen fixture has no biases (attention_bias False) and the live test skips without
    # transformers: here every projection carries one (0.5 * N(0, 1), as large as the products),
    # so dropping any of q / k / v / o_proj's bias moves y far past TOL.
    hidden, heads, kv, hd, rot, theta, T = case
    g = np.random.default_rng(hidden * hd)
    w = random_weights(g, hidden, heads, kv, hd, bias=True)
    x = g.standard_normal((T, hidden)).astype(np.float32)
    want = ref_layer(w, x, heads, kv, hd, rot, theta, 1e-6)
    layer = memra.AttentionLayer(memra.Engine("cpu"), {k: _core.Weight(v) for k, v in w.items()},
                                 hidden=hidden, heads=heads, kv_heads=kv, head_dim=hd, rotary_dim=rot,
                                 rope_theta=theta, rms_eps=1e-6)
    cache = memra.Cache(memra.Engine("cpu"), [layer.state_spec()], max_batch=1, max_len=T)
    assert rel_err(layer.prefill(cache, 0, 0, x), want) <= TOL
    yd, _ = run_prefill_decode(layer, x, T // 2)
    assert rel_err(yd, want) <= TOL
    for n in "qkvo":  # each bias matters on its own: without it the reference moves past TOL
        wn = {k: v for k, v in w.items() if k != f"{n}_proj.bias"}
        assert rel_err(want.astype(np.float32), ref_layer(wn, x, heads, kv, hd, rot, theta, 1e-6)) > 100 * TOL, n


# ---------------------------------------------------------------- steps, batches, cache


@pytest.mark.parametrize("T", [1, 2, 63, 65])
def test_prefill_then_decode_equals_prefill(T):
    g = np.random.default_rng(T)
    x = g.standard_normal((T, 64)).astype(np.float32)
    layer = tiny_layer()
    whole = memra.Cache(memra.Engine("cpu"), [layer.state_spec()], max_batch=2, max_len=80)
    y = layer.prefill(whole, 0, 1, x)
    whole.commit(1, T)
    yd, steps = run_prefill_decode(layer, x, T - 1) if T > 1 else (None, None)
    if T == 1:  # decode of a fresh slot equals its prefill
        steps = memra.Cache(memra.Engine("cpu"), [layer.state_spec()], max_batch=2, max_len=80)
        yd = layer.decode(steps, 0, np.array([1], np.int32), x)
        steps.commit(1, 1)
    assert rel_err(yd[-1:], y[-1:]) <= TOL
    assert np.array_equal(yd, y)  # row by row on the CPU: the same bytes
    assert np.array_equal(steps.attn_keys(0, 1), whole.attn_keys(0, 1))
    assert np.array_equal(steps.attn_values(0, 1), whole.attn_values(0, 1))


def test_batches_of_different_lengths_do_not_leak_rows():
    layer = tiny_layer()
    g = np.random.default_rng(5)
    prompts = {0: 7, 1: 20, 2: 3}
    xs = {s: g.standard_normal((n, 64)).astype(np.float32) for s, n in prompts.items()}
    steps = [[2, 0, 1], [0], [1, 2], [2, 1, 0], [1]]
    xd = [g.standard_normal((len(r), 64)).astype(np.float32) for r in steps]
    e = memra.Engine("cpu")
    batched = memra.Cache(e, [layer.state_spec()], max_batch=4, max_len=32)
    for s, x in xs.items():
        layer.prefill(batched, 0, s, x)
        batched.commit(s, len(x))
    layer.prefill(batched, 0, 3, g.standard_normal((5, 64)).astype(np.float32))  # an untouched slot
    batched.commit(3, 5)
    idle = (batched.attn_keys(0, 3), batched.attn_values(0, 3))
    outs = []
    for rows, x in zip(steps, xd):
        outs.append(layer.decode(batched, 0, np.array(rows, np.int32), x))
        for s in rows:
            batched.commit(s, 1)
    assert np.array_equal(batched.attn_keys(0, 3), idle[0]) and np.array_equal(batched.attn_values(0, 3), idle[1])
    for s, x in xs.items():  # each sequence alone, in a cache of its own
        alone = memra.Cache(e, [layer.state_spec()], max_batch=1, max_len=32)
        layer.prefill(alone, 0, 0, x)
        alone.commit(0, len(x))
        for rows, xb, yb in zip(steps, xd, outs):
            if s in rows:
                b = rows.index(s)
                y = layer.decode(alone, 0, np.array([0], np.int32), xb[b:b + 1])
                alone.commit(0, 1)
                assert np.array_equal(y, yb[b:b + 1]), (s, rows)
        assert np.array_equal(alone.attn_keys(0, 0), batched.attn_keys(0, s))
        assert np.array_equal(alone.attn_values(0, 0), batched.attn_values(0, s))


def test_full_slot_is_refused_and_nothing_changes():
    layer = tiny_layer()
    e = memra.Engine("cpu")
    cache = memra.Cache(e, [layer.state_spec()], max_batch=2, max_len=6)
    x = np.random.default_rng(1).standard_normal((6, 64)).astype(np.float32)
    layer.prefill(cache, 0, 0, x)
    cache.commit(0, 6)
    before = (cache.attn_keys(0, 0), cache.attn_values(0, 0))
    with pytest.raises(memra.CacheFullError):
        layer.decode(cache, 0, np.array([0], np.int32), x[:1])
    with pytest.raises(memra.CacheFullError):
        layer.prefill(cache, 0, 1, np.zeros((7, 64), np.float32))
    assert cache.length(0) == 6 and cache.length(1) == 0
    assert np.array_equal(cache.attn_keys(0, 0), before[0]) and np.array_equal(cache.attn_values(0, 0), before[1])
    layer.prefill(cache, 0, 1, x[:2])  # still usable


def test_state_spec_and_cache_bytes():
    layer = tiny_layer()
    spec = layer.state_spec()
    assert spec.kind == "attention"
    assert _core.LayerStateSpec.attention(kv_heads=2, head_dim=256).kind == "attention"
    kda = _core.LayerStateSpec.kda(heads=2, head_dim=8, conv_kernel=4)
    mla = _core.LayerStateSpec.mla(row_width=32)
    # Two planes [max_batch, max_len, kv_heads, head_dim] f32; the other kinds' bytes unchanged.
    base = _core.Cache.bytes_needed(3, 16, [kda, mla])
    assert _core.Cache.bytes_needed(3, 16, [kda, mla, spec]) == base + 2 * 3 * 16 * 2 * 256 * 4
    assert _core.Cache.bytes_needed(3, 16, [spec]) == 2 * 3 * 16 * 2 * 256 * 4


def test_copy_slot_and_free():
    layer = tiny_layer()
    e = memra.Engine("cpu")
    cache = memra.Cache(e, [layer.state_spec()], max_batch=2, max_len=16)
    x = np.random.default_rng(2).standard_normal((5, 64)).astype(np.float32)
    layer.prefill(cache, 0, 0, x)
    cache.commit(0, 5)
    cache.copy_slot(0, 1)
    assert np.array_equal(cache.attn_keys(0, 1), cache.attn_keys(0, 0))
    assert np.array_equal(cache.attn_values(0, 1), cache.attn_values(0, 0))
    y0 = layer.decode(cache, 0, np.array([0, 1], np.int32), np.stack([x[0], x[0]]))
    assert np.array_equal(y0[0], y0[1])  # the copy continues like the original
    cache.free(1)
    assert cache.length(1) == 0 and cache.attn_keys(0, 1).shape == (0, 2, 256)


def test_mixer_adapter_calls_the_layer():
    layer = tiny_layer()
    e = memra.Engine("cpu")
    mixer = AttentionMixer(layer)
    a = memra.Cache(e, [layer.state_spec()], max_batch=1, max_len=8)
    b = memra.Cache(e, [layer.state_spec()], max_batch=1, max_len=8)
    x = np.random.default_rng(3).standard_normal((3, 64)).astype(np.float32)
    ctx = StepContext(decode=False)
    assert np.array_equal(mixer.prefill(a, 0, np.array([0], np.int32), x, ctx), layer.prefill(b, 0, 0, x))
    a.commit(0, 3)
    b.commit(0, 3)
    got = mixer.decode(a, 0, np.array([0], np.int32), x[:1], StepContext(decode=True))
    assert np.array_equal(got, layer.decode(b, 0, np.array([0], np.int32), x[:1]))


# ---------------------------------------------------------------- refusals


def test_bad_weights_and_geometry_are_named():
    e = memra.Engine("cpu")
    w = tiny_weights()
    cases = [
        (dict(weights={k: v for k, v in w.items() if k != "q_norm.weight"}), memra.ContractError, "q_norm.weight"),
        (dict(weights={**w, "q_proj.weight": w["k_proj.weight"]}), memra.ContractError, "q_proj.weight"),
        (dict(weights={**w, "extra.weight": w["k_norm.weight"]}), memra.ContractError, "extra.weight"),
        (dict(rotary_dim=63), memra.ContractError, "rotary_dim"),
        (dict(rotary_dim=258), memra.ContractError, "rotary_dim"),
        (dict(heads=3), memra.ContractError, "kv_heads"),
        (dict(rms_eps=-1.0), memra.ContractError, "rms_eps"),
        (dict(rope_theta=0.0), memra.ContractError, "rope_theta"),
        # frequencies inf, or an int32 position times the largest overflows f32: NaN rows before
        (dict(rope_theta=1e-50), memra.ContractError, "rope_theta=1e-50 is too small"),
        (dict(rope_theta=1e-35), memra.ContractError, "rope_theta=1e-35 is too small"),
        (dict(dtype="float16"), memra.ContractError, "dtype"),
        (dict(head_dim=512), memra.UnsupportedError, "head_dim"),
    ]
    for change, cls, word in cases:
        kw = dict(TINY_KW, weights=w, dtype="float32")
        kw.update(change)
        weights = kw.pop("weights")
        with pytest.raises(cls) as ei:
            memra.AttentionLayer(e, weights, **kw)
        assert word in str(ei.value), str(ei.value)
    with pytest.raises(memra.ContractError) as ei:
        memra.AttentionLayer(e, w, **dict(TINY_KW, rotary_dim=63))
    assert ei.value.code == _core.status.CONTRACT_ODD_ROPE


def test_cache_of_another_kind_or_geometry_is_refused():
    layer = tiny_layer()
    e = memra.Engine("cpu")
    x = np.zeros((2, 64), np.float32)
    other = [_core.LayerStateSpec.mla(row_width=32), _core.LayerStateSpec.attention(kv_heads=2, head_dim=128)]
    for spec in other:
        cache = memra.Cache(e, [spec], max_batch=1, max_len=8)
        with pytest.raises(memra.ContractError, match="cache layer 0"):
            layer.prefill(cache, 0, 0, x)
        assert cache.length(0) == 0
    cache = memra.Cache(e, [layer.state_spec()], max_batch=2, max_len=8)
    with pytest.raises(memra.ContractError, match="slots"):
        layer.decode(cache, 0, np.array([1, 1], np.int32), x)
    with pytest.raises(memra.ContractError, match="slot"):
        layer.decode(cache, 0, np.array([2], np.int32), x[:1])
    with pytest.raises(memra.ContractError, match="x"):
        layer.prefill(cache, 0, 0, np.zeros((2, 63), np.float32))
    with pytest.raises(memra.ContractError, match="layer"):
        layer.prefill(cache, 1, 0, x)
    with pytest.raises(memra.UnsupportedError):  # device slots need a CUDA cache
        _core.DecodeSlots(cache, 1)
    with pytest.raises(memra.ContractError, match="kv_heads"):
        _core.LayerStateSpec.attention(kv_heads=0, head_dim=8)
