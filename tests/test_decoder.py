"""The shared decoder loop (memra.models.decoder), the per-step context, the layer interfaces
and the residual kinds, on the CPU.

- The per-step context: a "shared" DSA layer attends over exactly the index list the full DSA
  layer before it chose (spied on the tiny glm5_next model, and on stand-in layers).
- The layer interfaces: every FFN's forward returns one array; MoeLayer's experts agree with
  the functional router.
- A family made of nothing but its own parts (a toy family with the plain residual, registered
  for the test) loads, prefills, decodes and generates through the shared machinery, and its
  logits equal a float64 numpy transcription of the pre-norm decoder.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np
import pytest
from safetensors.numpy import save_file

import memra
from memra import _core
from memra.config import check_fields, field_table
from memra.loader import NameTable, Route
from memra.models import (Block, BuildArgs, Family, LayerPlan, MlaMixer, NormSite, PlainResidual,
                          StepContext, registry)
from memra.models.layers import check_groups, located, norm_vector

FULL, SHARED = 2, 3  # the tiny checkpoint's layer 3 reuses layer 2's index list


# ------------------------------------------------------------------ per-step context
class _Spy:
    """Delegates to a memra layer, logging (layer, topk given, index list returned) per call."""

    def __init__(self, layer, log):
        self._layer, self._log = layer, log

    def _call(self, name, args):
        out = getattr(self._layer, name)(*args)
        self._log.append((args[1], args[4], out[1]))
        return out

    def prefill(self, *args):
        return self._call("prefill", args)

    def decode(self, *args):
        return self._call("decode", args)


@pytest.fixture(scope="module")
def tiny() -> memra.Model:
    return memra.load(memra.default_checkpoint(), max_batch=2, max_len=32, progress=False)


def _spied(model, fn):
    log = []
    mixers = [b.mixer for b in model.net.blocks if isinstance(b.mixer, MlaMixer)]
    saved = [m.layer for m in mixers]
    for m in mixers:
        m.layer = _Spy(m.layer, log)
    try:
        return fn(), log
    finally:
        for m, layer in zip(mixers, saved):
            m.layer = layer


def _check_handoff(log):
    by_layer = {entry[0]: entry for entry in log}
    assert sorted(by_layer) == [2, 3, 5]
    assert by_layer[FULL][1] is None and by_layer[5][1] is None  # full layers choose their own
    given, chosen = by_layer[SHARED][1], by_layer[FULL][2]
    assert given is chosen  # the very array, not a copy
    assert given.shape[1] > 0 and (np.asarray(given) >= 0).any()


def test_shared_dsa_layer_gets_the_full_layers_index_list_in_prefill(tiny):
    ids = [3, 1, 4, 1, 5, 9, 2, 6]
    want = tiny.logits(ids)
    got, log = _spied(tiny, lambda: tiny.logits(ids))
    np.testing.assert_array_equal(got, want)  # spying changed nothing
    _check_handoff(log)


def test_shared_dsa_layer_gets_the_full_layers_index_list_in_decode(tiny):
    cache = tiny.new_cache(2, 16)
    tiny.prefill(cache, 0, [5, 6, 7])
    tiny.prefill(cache, 1, [8, 9])
    _, log = _spied(tiny, lambda: tiny.decode(cache, [0, 1], [10, 11]))
    _check_handoff(log)


def test_index_lists_are_recorded_through_the_context(tiny):
    rec = tiny.index_lists([7, 8, 9, 10, 11])
    assert sorted(rec) == [2, 5]
    assert all(isinstance(v, np.ndarray) and v.dtype == np.int32 and v.shape[0] == 5 for v in rec.values())


class _FakeMla:
    """Stands in for memra.MlaLayer: returns y = x and a distinct index list per call."""

    def __init__(self):
        self.given = []

    def prefill(self, cache, layer, slot, x, topk):
        self.given.append(topk)
        return x, np.full((len(x), 3), layer, np.int32)

    decode = prefill


def test_context_hand_off_with_stand_in_layers():
    roles = ["full", "shared", "", "full", "shared", "shared"]
    fakes = [_FakeMla() for _ in roles]
    mixers = [MlaMixer(f, r) for f, r in zip(fakes, roles)]
    ctx = StepContext(decode=False, record={})
    x = np.ones((2, 4), np.float32)
    for i, m in enumerate(mixers):
        m.prefill(None, i, np.zeros(1, np.int32), x, ctx)
    given = [f.given[0] for f in fakes]
    assert given[0] is None and given[2] is None and given[3] is None
    assert (given[1] == 0).all() and (given[4] == 3).all() and (given[5] == 3).all()
    assert sorted(ctx.record) == [0, 3]


def test_shared_layer_without_a_full_one_before_is_refused():
    ctx = StepContext(decode=True)
    with pytest.raises(memra.ContractError, match="shared DSA layer"):
        MlaMixer(_FakeMla(), "shared").decode(None, 0, np.zeros(1, np.int32), np.ones((1, 4), np.float32), ctx)
    with pytest.raises(memra.ContractError, match="indexer"):
        MlaMixer(_FakeMla(), "sparse")


# ------------------------------------------------------------------ layer interfaces
def _w(r, *shape, scale=0.3):
    return _core.Weight(np.ascontiguousarray(r.standard_normal(shape).astype(np.float32) * scale))


def test_every_ffn_returns_one_array():
    r = np.random.default_rng(0)
    D, I, E, K, T = 16, 8, 4, 2, 3
    e = memra.Engine("cpu")
    mlp = memra.MlpLayer(e, {"gate_proj.weight": _w(r, I, D), "up_proj.weight": _w(r, I, D),
                             "down_proj.weight": _w(r, D, I)}, hidden=D, intermediate=I, swiglu_limit=7.0,
                         dtype="float32")
    w = {"gate.weight": _w(r, E, D), "gate.e_score_correction_bias": _w(r, E, scale=0.1)}
    for n in range(E):
        w |= {f"experts.{n}.gate_proj.weight": _w(r, I, D), f"experts.{n}.up_proj.weight": _w(r, I, D),
              f"experts.{n}.down_proj.weight": _w(r, D, I)}
    w |= {"shared_experts.gate_proj.weight": _w(r, I, D), "shared_experts.up_proj.weight": _w(r, I, D),
          "shared_experts.down_proj.weight": _w(r, D, I)}
    kw = dict(hidden=D, n_experts=E, top_k=K, n_group=1, topk_group=1, intermediate=I, shared_intermediate=I,
              norm_topk_prob=True, routed_scaling=2.5, swiglu_limit=7.0, dtype="float32")
    moe = memra.MoeLayer(e, dict(w), **kw)
    x = r.standard_normal((T, D)).astype(np.float32)
    for layer in (mlp, moe):
        y = layer.forward(x)
        assert isinstance(y, np.ndarray) and y.shape == (T, D) and y.dtype == np.float32
    y, experts = moe.forward_with_experts(x)
    np.testing.assert_array_equal(moe.forward(x), y)
    idx, _ = _core.moe_route(x, w["gate.weight"], w["gate.e_score_correction_bias"].to_numpy(), top_k=K,
                             n_group=1, topk_group=1, norm_topk_prob=True, scaling=2.5)
    np.testing.assert_array_equal(experts, idx)
    # A size below 1 is named by itself: the message was the routing rule's, naming top_k.
    for key in ("intermediate", "hidden"):
        for bad in (0, -1):
            with pytest.raises(memra.ContractError, match=rf"MoeLayer: {key} must be >= 1, got {bad}"):
                memra.MoeLayer(e, dict(w), **dict(kw, **{key: bad}))


# ------------------------------------------------------------------ residual kinds
def _rms(x, w, eps):
    return x / np.sqrt((x**2).mean(-1, keepdims=True) + eps) * w


def test_plain_residual_stream_is_the_pre_norm_decoder():
    r = np.random.default_rng(1)
    T, D, eps = 3, 8, 1e-6
    x0, y1, y2 = (r.standard_normal((T, D)).astype(np.float32) for _ in range(3))
    w1, w2, wf = (r.standard_normal(D).astype(np.float32) for _ in range(3))
    s = PlainResidual(eps).begin(x0, None)
    h1 = s.enter(NormSite(w1), None)
    h2 = s.enter(NormSite(w2), y1)
    out = s.head(y2, wf)
    x = x0.astype(np.float64)
    np.testing.assert_allclose(h1, _rms(x, w1, eps), rtol=1e-5, atol=1e-6)
    x = x + y1
    np.testing.assert_allclose(h2, _rms(x, w2, eps), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(out, _rms(x + y2, wf, eps), rtol=1e-5, atol=1e-6)


# ------------------------------------------------------------------ a toy family
@dataclass
class ToyConfig:
    """A pre-norm decoder: a stateless mixer y = tanh(x) * scale, then a SwiGLU MLP."""

    vocab_size: int = 32
    hidden_size: int = 16
    intermediate_size: int = 24
    num_hidden_layers: int = 2
    rms_norm_eps: float = 1e-6
    mixer_scale: float = 0.5
    eos_token_id: int | list[int] | None = None
    tie_word_embeddings: bool = False
    model_type: str = "toy_plain"


class _TanhMixer:
    """A stateless mixer behind the mixer interface (numpy, CPU)."""

    def __init__(self, scale):
        self.scale = np.float32(scale)

    def prefill(self, cache, layer, slots, x, ctx):
        assert isinstance(ctx, StepContext) and ctx.decode is False
        return np.tanh(x) * self.scale

    def decode(self, cache, layer, slots, x, ctx):
        assert ctx.decode is True and len(slots) == len(x)
        return np.tanh(x) * self.scale


def _toy_build(a: BuildArgs) -> Block:
    cfg, D = a.config, a.config.hidden_size
    check_groups(a.where, a.groups, {"mlp", "input_layernorm", "post_attention_layernorm"})
    ffn = located(f"{a.where}.mlp", _core.MlpLayer, a.engine, dict(a.groups.get("mlp", {})), hidden=D,
                  intermediate=cfg.intermediate_size, swiglu_limit=1e6, dtype=a.dtype)
    return Block(mixer_site=NormSite(norm_vector(f"{a.where}.input_layernorm", a.groups["input_layernorm"], D)),
                 mixer=_TanhMixer(cfg.mixer_scale),
                 ffn_site=NormSite(norm_vector(f"{a.where}.post_attention_layernorm",
                                               a.groups["post_attention_layernorm"], D)),
                 ffn=ffn)


def _toy_parse(raw):
    check_fields(raw, field_table(ToyConfig))
    return ToyConfig(**{k: v for k, v in raw.items() if k in field_table(ToyConfig) or k == "model_type"})


TOY = Family(
    name="toy_plain", model_types=("toy_plain",), reference="tests/test_decoder.py",
    parse_config=_toy_parse,
    layer_plan=lambda cfg: [LayerPlan("tanh", "dense", _core.LayerStateSpec.none())] * cfg.num_hidden_layers,
    names=NameTable(prefixes=("model.",), routes=(
        Route(r"^layers\.(?P<layer>\d+)\.mlp\.(?P<key>.+)$", "mlp"),
        Route(r"^layers\.(?P<layer>\d+)\.(?P<n>input_layernorm|post_attention_layernorm)\.weight$", r"\g<n>",
              "weight"),
        Route(r"^(?P<key>embed_tokens|norm|lm_head)\.weight$", "top"))),
    residual=lambda cfg: PlainResidual(cfg.rms_norm_eps),
    build_block=_toy_build,
)


@pytest.fixture()
def toy(tmp_path, monkeypatch):
    monkeypatch.setattr(registry, "_BY_TYPE", dict(registry._BY_TYPE))
    registry.register(TOY)
    cfg = ToyConfig()
    r = np.random.default_rng(7)
    D, I, V = cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size
    t = {"model.embed_tokens.weight": r.standard_normal((V, D)), "model.norm.weight": 1 + 0.2 * r.standard_normal(D),
         "lm_head.weight": 0.5 * r.standard_normal((V, D))}
    for i in range(cfg.num_hidden_layers):
        t |= {f"model.layers.{i}.input_layernorm.weight": 1 + 0.2 * r.standard_normal(D),
              f"model.layers.{i}.post_attention_layernorm.weight": 1 + 0.2 * r.standard_normal(D),
              f"model.layers.{i}.mlp.gate_proj.weight": 0.3 * r.standard_normal((I, D)),
              f"model.layers.{i}.mlp.up_proj.weight": 0.3 * r.standard_normal((I, D)),
              f"model.layers.{i}.mlp.down_proj.weight": 0.3 * r.standard_normal((D, I))}
    t = {k: np.ascontiguousarray(v.astype(np.float32)) for k, v in t.items()}
    save_file(t, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "toy_plain", "num_hidden_layers": 2}))
    return tmp_path, cfg, t


def _toy_reference(cfg: ToyConfig, t, ids):
    """float64 numpy: embedding, per layer x += mixer(rms(x)); x += mlp(rms(x)); rms, head."""
    f = {k: v.astype(np.float64) for k, v in t.items()}
    x = f["model.embed_tokens.weight"][ids]
    for i in range(cfg.num_hidden_layers):
        p = f"model.layers.{i}."
        x = x + np.tanh(_rms(x, f[p + "input_layernorm.weight"], cfg.rms_norm_eps)) * cfg.mixer_scale
        h = _rms(x, f[p + "post_attention_layernorm.weight"], cfg.rms_norm_eps)
        g, u = h @ f[p + "mlp.gate_proj.weight"].T, h @ f[p + "mlp.up_proj.weight"].T
        x = x + (g / (1 + np.exp(-g)) * u) @ f[p + "mlp.down_proj.weight"].T
    return _rms(x, f["model.norm.weight"], cfg.rms_norm_eps) @ f["lm_head.weight"].T


def test_a_family_of_its_own_parts_runs_through_the_shared_loop(toy):
    path, cfg, t = toy
    m = memra.load(path, max_batch=2, max_len=16, progress=False)
    assert m.net.family is TOY and m.config.num_hidden_layers == 2
    ids = [1, 5, 9, 30]
    want = _toy_reference(cfg, t, ids)
    logits = m.logits(ids)
    assert float(np.abs(logits - want).max() / np.abs(want).max()) < 1e-5
    # prefill(T-1) + decode(1) == prefill(T) on the stateless toy, and generation runs.
    cache = m.new_cache(2, 8)
    m.prefill(cache, 0, ids[:-1])
    np.testing.assert_allclose(m.decode(cache, [0], [ids[-1]])[0], logits[-1], rtol=1e-6, atol=1e-6)
    assert len(m.generate(ids, 3, ignore_eos=True)) == 3


def test_a_toy_checkpoint_with_a_stray_tensor_names_it(toy):
    path, _, t = toy
    t = dict(t, **{"model.layers.0.self_attn.q_proj.weight": np.zeros((4, 4), np.float32)})
    save_file(t, str(path / "model.safetensors"))
    with pytest.raises(memra.ContractError, match="self_attn.q_proj"):
        memra.load(path, max_batch=1, max_len=8, progress=False)


def test_a_toy_config_value_of_the_wrong_type_is_named(toy):
    path, _, _ = toy
    (path / "config.json").write_text(json.dumps({"model_type": "toy_plain", "mixer_scale": "half"}))
    with pytest.raises(memra.ContractError, match="config: mixer_scale must be a finite number"):
        memra.load(path, max_batch=1, max_len=8, progress=False)
