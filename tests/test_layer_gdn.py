"""GdnLayer (the Gated DeltaNet mixer) and the Cache's GDN state on the CPU backend.

Truth: the numpy float64 transcription of ``Qwen3_5GatedDeltaNet.forward`` in
tests/gdn_reference.py (``RTOL`` below), transformers' own Qwen3_5GatedDeltaNet /
Qwen3NextGatedDeltaNet modules on the pure-torch path (skipped without transformers), and, for
CI without transformers, tests/fixtures/gdn_layer_reference.npz made from those modules by
tests/fixtures/make_gdn_layer_fixture.py. A prefill of T-1 tokens then a decode step equals a
prefill of T tokens bit for bit on the CPU (outputs and every state plane): each op of a step does
the same arithmetic whatever the number of rows.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import memra
from memra import _core

import gdn_reference as R

GEO = R.Geometry()  # hidden 48, Hk 2, Hv 4 (value head h reads key head h // 2), dk 16, dv 24, K 4
RTOL = 1e-5  # rel_err (max abs error / max abs value) against the f64 reference
TF_RTOL = 2e-5  # against transformers' f32 modules (their chunked prefill sums differently)
FIXTURE = Path(__file__).parent / "fixtures" / "gdn_layer_reference.npz"
ST = _core.status


@pytest.fixture(scope="module")
def eng():
    return memra.Engine("cpu")


def make_layer(eng, w, geo=GEO, **kw):
    return _core.GdnLayer(eng, {n: _core.Weight(a) for n, a in w.items()}, **{**geo.layer_kw(), **kw},
                          dtype="float32")


def new_cache(eng, layer, max_batch=3, max_len=512):
    return _core.Cache(eng, [layer.state_spec()], max_batch=max_batch, max_len=max_len)


def x_of(T, seed, geo=GEO, scale=1.0):
    return R.f32(scale * np.random.default_rng(seed).standard_normal((T, geo.hidden)))


def run_prefill_decode(layer, cache, slot, x, n_prefill):
    """x[:n_prefill] as one prefill, then each later row as a decode step (committed)."""
    ys = [layer.prefill(cache, 0, slot, x[:n_prefill])]
    cache.commit(slot, n_prefill)
    for t in range(n_prefill, x.shape[0]):
        ys.append(layer.decode(cache, 0, np.array([slot], np.int32), x[t:t + 1]))
        cache.commit(slot, 1)
    return np.concatenate(ys)


# ---------------------------------------------------------------- the state spec


def test_state_spec_and_cache_planes(eng):
    spec = _core.LayerStateSpec.gdn(**GEO.spec_kw())
    assert spec.kind == "gdn"
    layer = make_layer(eng, R.weights(GEO, 0))
    assert layer.state_spec().kind == "gdn"
    cache = _core.Cache(eng, [spec], max_batch=2, max_len=8)
    assert cache.gdn_state(0, 1).shape == (4, 16, 24)
    assert cache.gdn_conv(0, 1).shape == (GEO.C, 3)
    # Two ping-pong pairs of ring [160, 3] and state [4, 16, 24] f32 per slot, each plane of all
    # slots 256-byte aligned.
    per_slot = 2 * (160 * 3 + 4 * 16 * 24) * 4
    assert per_slot * 2 <= _core.Cache.bytes_needed(2, 8, [spec]) <= per_slot * 2 + 4 * 256


def test_kda_spec_bytes_are_unchanged():
    kda = _core.LayerStateSpec.kda(heads=2, head_dim=8, conv_kernel=4)
    # conv [3*16, 3] + state [2, 8, 8] f32, ping-pong, 4 slots: planes rounded up to 256 bytes.
    expect = 2 * (((4 * 48 * 3 * 4 + 255) // 256) * 256 + ((4 * 2 * 64 * 4 + 255) // 256) * 256)
    assert _core.Cache.bytes_needed(4, 8, [kda]) == expect


@pytest.mark.parametrize("kw", [dict(key_heads=0), dict(value_heads=3), dict(key_head_dim=0),
                                dict(value_head_dim=-1), dict(conv_kernel=0)])
def test_bad_spec_is_refused(kw):
    with pytest.raises(memra.ContractError) as ei:
        _core.LayerStateSpec.gdn(**{**GEO.spec_kw(), **kw})
    assert "LayerStateSpec.gdn" in str(ei.value)


# ---------------------------------------------------------------- against the references


@pytest.mark.parametrize("T", [1, 2, 3, 63, 65, 200])
def test_prefill_matches_reference(eng, T):
    w = R.weights(GEO, T)
    layer = make_layer(eng, w)
    cache = new_cache(eng, layer)
    x = x_of(T, 100 + T)
    y = layer.prefill(cache, 0, 1, x)
    cache.commit(1, T)
    ry, rring, rstate = R.layer(GEO, w, x)
    assert R.rel_err(y, ry) <= RTOL
    assert R.rel_err(cache.gdn_conv(0, 1), rring) <= RTOL
    assert R.rel_err(cache.gdn_state(0, 1), rstate) <= RTOL
    np.testing.assert_array_equal(layer.forward(x), y)


@pytest.mark.parametrize("T", [1, 2, 4, 63, 65, 200])
def test_prefill_then_decode_equals_prefill(eng, T):
    w = R.weights(GEO, 7)
    layer = make_layer(eng, w)
    x = x_of(T, 200 + T)
    full = new_cache(eng, layer)
    y_full = layer.prefill(full, 0, 0, x)
    full.commit(0, T)
    split = new_cache(eng, layer)
    if T > 1:
        y_head = layer.prefill(split, 0, 0, x[:T - 1])
        split.commit(0, T - 1)
    else:
        y_head = np.zeros((0, GEO.hidden), np.float32)
    y_tail = layer.decode(split, 0, np.array([0], np.int32), x[T - 1:])
    split.commit(0, 1)
    np.testing.assert_array_equal(np.concatenate([y_head, y_tail]), y_full)
    np.testing.assert_array_equal(split.gdn_conv(0, 0), full.gdn_conv(0, 0))
    np.testing.assert_array_equal(split.gdn_state(0, 0), full.gdn_state(0, 0))


def test_qwen3_next_layout_gives_the_same_bytes(eng):
    w = R.weights(GEO, 11)
    a, b = make_layer(eng, w), make_layer(eng, R.interleave(GEO, w))
    assert not a.interleaved and b.interleaved
    x = x_of(17, 12)
    np.testing.assert_array_equal(a.forward(x), b.forward(x))


def test_gqa_head_mapping_against_numpy(eng):
    """Hv = 2 Hk; a key head repeated in the GGUF order (h % Hk) gives another output."""
    w = R.weights(GEO, 21)
    x = x_of(10, 22)
    y = make_layer(eng, w).forward(x)
    assert R.rel_err(y, R.layer(GEO, w, x)[0]) <= RTOL
    # The same weights with the value heads (and their z, b, a, out_proj columns) of key head 0 and
    # 1 swapped in pairs 1 <-> 2: the transformers order makes this a different layer.
    perm = np.array([0, 2, 1, 3])
    dv, Hk, dk = GEO.value_head_dim, GEO.key_heads, GEO.key_head_dim
    cols = np.concatenate([np.arange(h * dv, (h + 1) * dv) for h in perm])
    w2 = dict(w)
    qkv = w["in_proj_qkv.weight"]
    w2["in_proj_qkv.weight"] = R.f32(np.concatenate([qkv[: 2 * Hk * dk], qkv[2 * Hk * dk:][cols]]))
    w2["in_proj_z.weight"] = R.f32(w["in_proj_z.weight"][cols])
    conv = w["conv1d.weight"]
    w2["conv1d.weight"] = R.f32(np.concatenate([conv[: 2 * Hk * dk], conv[2 * Hk * dk:][cols]]))
    for n in ("in_proj_b.weight", "in_proj_a.weight", "A_log", "dt_bias"):
        w2[n] = R.f32(w[n][perm])
    w2["out_proj.weight"] = R.f32(w["out_proj.weight"][:, cols])
    y2 = make_layer(eng, w2).forward(x)
    assert R.rel_err(y2, R.layer(GEO, w2, x)[0]) <= RTOL
    assert R.rel_err(y2, y) > 1e-2


def test_gate_extremes_stay_finite_for_hundreds_of_steps(eng):
    """a + dt_bias far past the softplus threshold (no memory), beta saturated at 0 and 1."""
    w = R.weights(GEO, 31)
    w["dt_bias"] = R.f32([40.0, -40.0, 0.0, 25.0])
    w["in_proj_b.weight"] = R.f32(w["in_proj_b.weight"] * 200.0)  # beta ~ 0 or ~ 1
    layer = make_layer(eng, w)
    cache = new_cache(eng, layer)
    x = x_of(400, 32, scale=3.0)
    y = run_prefill_decode(layer, cache, 2, x, 300)
    assert np.all(np.isfinite(y)) and np.all(np.isfinite(cache.gdn_state(0, 2)))
    ry, _, rstate = R.layer(GEO, w, x)
    assert R.rel_err(y, ry) <= RTOL
    assert R.rel_err(cache.gdn_state(0, 2), rstate) <= RTOL


def test_batches_of_different_lengths_do_not_leak(eng):
    w = R.weights(GEO, 41)
    layer = make_layer(eng, w)
    lens = {0: 5, 1: 1, 2: 70}
    xs = {s: x_of(n + 3, 50 + s) for s, n in lens.items()}
    batched = new_cache(eng, layer)
    for s, n in lens.items():
        layer.prefill(batched, 0, s, xs[s][:n])
        batched.commit(s, n)
    outs = {s: [] for s in lens}
    for step in range(3):
        order = [2, 0, 1] if step % 2 == 0 else [1, 2]  # slot 0 idles on odd steps
        rows = [lens[s] + len(outs[s]) for s in order]
        x = np.stack([xs[s][r] for s, r in zip(order, rows)])
        y = layer.decode(batched, 0, np.array(order, np.int32), x)
        for i, s in enumerate(order):
            outs[s].append(y[i])
            batched.commit(s, 1)
    for s, n in lens.items():
        alone = new_cache(eng, layer)
        steps = len(outs[s])
        y = run_prefill_decode(layer, alone, 0, xs[s][: n + steps], n)
        np.testing.assert_array_equal(np.stack(outs[s]), y[n:])
        np.testing.assert_array_equal(batched.gdn_state(0, s), alone.gdn_state(0, 0))
        np.testing.assert_array_equal(batched.gdn_conv(0, s), alone.gdn_conv(0, 0))


def test_free_and_copy_slot_cover_the_gdn_planes(eng):
    layer = make_layer(eng, R.weights(GEO, 51))
    cache = new_cache(eng, layer)
    layer.prefill(cache, 0, 0, x_of(6, 52))
    cache.commit(0, 6)
    cache.copy_slot(0, 1)
    np.testing.assert_array_equal(cache.gdn_state(0, 1), cache.gdn_state(0, 0))
    np.testing.assert_array_equal(cache.gdn_conv(0, 1), cache.gdn_conv(0, 0))
    cache.free(0)
    assert not cache.gdn_state(0, 0).any() and not cache.gdn_conv(0, 0).any()
    assert cache.gdn_state(0, 1).any()


# ---------------------------------------------------------------- transformers


@pytest.mark.parametrize("next_layout", [False, True])
@pytest.mark.parametrize("T,n_prefill", [(12, 9), (5, 2), (70, 66)])
def test_matches_transformers_module(eng, next_layout, T, n_prefill):
    pytest.importorskip("transformers")
    w = R.weights(GEO, 60 + T)
    x = x_of(T, 61 + T)
    ref = R.run_transformers(GEO, w, x, n_prefill, next_layout=next_layout)
    layer = make_layer(eng, R.interleave(GEO, w) if next_layout else w)
    cache = new_cache(eng, layer)
    y = run_prefill_decode(layer, cache, 1, x, n_prefill)
    assert R.rel_err(y, ref["y"]) <= TF_RTOL
    assert R.rel_err(cache.gdn_conv(0, 1), ref["ring"]) <= TF_RTOL
    assert R.rel_err(cache.gdn_state(0, 1), ref["state"]) <= TF_RTOL


def test_matches_frozen_transformers_reference(eng):
    """CI's check against transformers (tests/fixtures/gdn_layer_reference.npz)."""
    ref = np.load(FIXTURE)
    geo = R.Geometry(*[int(v) for v in ref["geometry"]], rms_eps=float(ref["rms_eps"]))
    for layout in ("qwen3_5", "qwen3_next"):
        names = [k[len(layout) + 3:] for k in ref.files if k.startswith(f"{layout}_w_")]
        w = {n: ref[f"{layout}_w_{n}"] for n in names}
        layer = make_layer(eng, w, geo)
        assert layer.interleaved == (layout == "qwen3_next")
        cache = new_cache(eng, layer)
        y = run_prefill_decode(layer, cache, 0, ref["x"], int(ref["n_prefill"]))
        assert R.rel_err(y, ref[f"{layout}_y"]) <= TF_RTOL
        assert R.rel_err(cache.gdn_conv(0, 0), ref[f"{layout}_ring"]) <= TF_RTOL
        assert R.rel_err(cache.gdn_state(0, 0), ref[f"{layout}_state"]) <= TF_RTOL


# ---------------------------------------------------------------- bad inputs


def test_bad_construction_is_named(eng):
    w = R.weights(GEO, 71)
    for name in ("in_proj_qkv.weight", "A_log", "norm.weight"):
        with pytest.raises(memra.ContractError) as ei:
            make_layer(eng, {k: v for k, v in w.items() if k != name})
        assert name in str(ei.value)
    with pytest.raises(memra.ContractError) as ei:
        make_layer(eng, w, value_heads=3)
    assert "value_heads" in str(ei.value)
    with pytest.raises(memra.ContractError) as ei:  # a Qwen3.5 tensor beside the Qwen3-Next ones
        make_layer(eng, {**R.interleave(GEO, w), "in_proj_z.weight": w["in_proj_z.weight"]})
    assert "in_proj_z.weight" in str(ei.value)
    # A per-head vector may carry unit extents ([1, 1, Hv, 1]); the same count in two non-unit
    # extents is another tensor.
    make_layer(eng, dict(w, A_log=w["A_log"].reshape(1, 1, -1, 1)))
    with pytest.raises(memra.ContractError) as ei:
        make_layer(eng, dict(w, A_log=w["A_log"].reshape(2, -1)))
    assert "'A_log' has shape [2, 2], expected [4]" in str(ei.value)
    bad = dict(w, **{"conv1d.weight": R.f32(np.zeros((GEO.C, 1, 3)))})
    with pytest.raises(memra.ContractError) as ei:
        make_layer(eng, bad)
    assert "conv1d.weight" in str(ei.value)


def test_bad_calls_change_nothing(eng):
    layer = make_layer(eng, R.weights(GEO, 81))
    kda = _core.LayerStateSpec.kda(heads=2, head_dim=16, conv_kernel=4)
    other = _core.LayerStateSpec.gdn(**{**GEO.spec_kw(), "value_head_dim": 16})
    cache = _core.Cache(eng, [layer.state_spec(), kda, other], max_batch=2, max_len=4)
    layer.prefill(cache, 0, 0, x_of(3, 82))
    cache.commit(0, 3)
    before = (cache.gdn_state(0, 0), cache.gdn_conv(0, 0), cache.length(0), cache.cur(0))
    x1 = x_of(1, 83)
    for call, cls in [
        (lambda: layer.prefill(cache, 1, 0, x1), memra.ContractError),  # a KDA layer
        (lambda: layer.prefill(cache, 2, 0, x1), memra.ContractError),  # another GDN geometry
        (lambda: layer.prefill(cache, 3, 0, x1), memra.ContractError),  # no such layer
        (lambda: layer.prefill(cache, 0, 2, x1), memra.ContractError),  # no such slot
        (lambda: layer.prefill(cache, 0, 0, x_of(2, 84)), memra.CacheFullError),
        (lambda: layer.decode(cache, 0, np.array([0, 0], np.int32), x_of(2, 85)), memra.ContractError),
        (lambda: layer.decode(cache, 0, np.array([0], np.int32), x_of(2, 86)), memra.ContractError),
        (lambda: layer.forward(np.zeros((2, 47), np.float32)), memra.ContractError),
        (lambda: layer.forward(np.zeros((2, 48), np.float64)), memra.ContractError),
    ]:
        with pytest.raises(cls):
            call()
        after = (cache.gdn_state(0, 0), cache.gdn_conv(0, 0), cache.length(0), cache.cur(0))
        np.testing.assert_array_equal(after[0], before[0])
        np.testing.assert_array_equal(after[1], before[1])
        assert after[2:] == before[2:]
    y = layer.decode(cache, 0, np.array([0], np.int32), x1)  # still usable
    assert np.all(np.isfinite(y))


def test_gdn_mixer_runs_the_layer(eng):
    """memra.models.GdnMixer: the decoder loop's mixer interface over GdnLayer."""
    from memra.models import GdnMixer, StepContext

    layer = make_layer(eng, R.weights(GEO, 91))
    mixer = GdnMixer(layer)
    a, b = new_cache(eng, layer), new_cache(eng, layer)
    x = x_of(6, 92)
    ctx = StepContext(decode=False, engine=None)
    np.testing.assert_array_equal(mixer.prefill(a, 0, np.array([1], np.int32), x[:5], ctx),
                                  layer.prefill(b, 0, 1, x[:5]))
    a.commit(1, 5)
    b.commit(1, 5)
    np.testing.assert_array_equal(mixer.decode(a, 0, np.array([1], np.int32), x[5:], ctx),
                                  layer.decode(b, 0, np.array([1], np.int32), x[5:]))
