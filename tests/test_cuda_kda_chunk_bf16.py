"""bfloat16 q / k / v / g into ``kda_scan`` (fla ``chunk_kda``'s inputs): read at half the bytes
and widened exactly to float32 (a bf16 is the high half of its f32), so every result must be
the float32 call's on the widened arrays, bit for bit, on either backend. And o_dtype='bfloat16'
(``chunk_kda``'s output dtype): the float32 o rounded to nearest even, bit for bit.

- CPU (no device): the reference widens and runs its f32 scan; bf16 arrays as DLPack bfloat16
  (ml_dtypes) or as uint16 raw bits; k, v, g must share q's dtype (ContractError naming them).
- CUDA (marked cuda): the chunked kernels' bf16 instance (cuda/kda_chunk_intra.cu,
  ``chunk_intra_kernel<false, true>``) against the f32 instance on the same values, bit for bit,
  over the edge lengths (T = 1, under a chunk, a chunk, tails, many chunks), batches with their
  own states, strong decays (the element-wise diagonal) and mixed chunks; against the CPU scan
  within the chunked form's tolerance (test_cuda_kda_chunk.py's REL); the sequential CUDA scan
  refuses bf16 (UnsupportedError), and the profiler shows the bf16 instance ran.
"""

from __future__ import annotations

import numpy as np
import pytest

import memra
from memra import _core
from cuda_helpers import BF16, bf16_bits, kernel_names
from test_cuda_kda_chunk import assert_close, inputs, mixed_inputs


def as_bf16(arrays, raw=False):
    """The bf16-rounded f32 inputs as bfloat16 arrays: ml_dtypes bfloat16, or uint16 raw bits."""
    return [bf16_bits(a) if raw else np.asarray(a, np.float32).astype(BF16) for a in arrays]


# ---------------------------------------------------------------- CPU


@pytest.mark.parametrize("raw", [False, True])
@pytest.mark.parametrize("batch", [False, True])
def test_cpu_bf16_inputs_equal_the_widened_f32_call(raw, batch):
    q, k, v, g, beta, state = inputs(70, H=2, B=2 if batch else None, seed=3)
    want = _core.kda_scan(q, k, v, g, beta, state, batch=batch)
    got = _core.kda_scan(*as_bf16((q, k, v, g), raw), beta, state, batch=batch)
    for w, x in zip(want, got):
        assert x.dtype == np.float32
        np.testing.assert_array_equal(x, w)


@pytest.mark.parametrize("bad", ["k", "v", "g"])
def test_inputs_must_share_q_dtype(bad):
    q, k, v, g, beta, state = inputs(5, H=1, seed=4)
    args = dict(zip("qkvg", as_bf16((q, k, v, g))))
    args[bad] = {"k": k, "v": v, "g": g}[bad]  # float32 beside bfloat16 q
    with pytest.raises(memra.ContractError) as ei:
        _core.kda_scan(args["q"], args["k"], args["v"], args["g"], beta, state)
    assert ei.value.code == 40020 and f"'{bad}'" in str(ei.value), str(ei.value)
    # and a float32 q with a bfloat16 input
    args = dict(q=q, k=k, v=v, g=g)
    args[bad] = as_bf16([args[bad]])[0]
    with pytest.raises(memra.ContractError) as ei:
        _core.kda_scan(args["q"], args["k"], args["v"], args["g"], beta, state)
    assert ei.value.code == 40020 and f"'{bad}'" in str(ei.value), str(ei.value)
    # float16 is neither
    with pytest.raises(memra.ContractError) as ei:
        _core.kda_scan(q.astype(np.float16), k, v, g, beta, state)
    assert ei.value.code == 40020 and "'q'" in str(ei.value), str(ei.value)
    with pytest.raises(memra.ContractError) as ei:
        _core.kda_scan(q, k, v, g, beta, state, o_dtype="float16")
    assert ei.value.code == 40025 and "o_dtype" in str(ei.value), str(ei.value)
    # nothing was changed: the call with good arguments still runs
    o, s = _core.kda_scan(q, k, v, g, beta, state)
    assert np.all(np.isfinite(o)) and np.all(np.isfinite(s))


@pytest.mark.parametrize("batch", [False, True])
def test_cpu_bf16_o_is_the_f32_o_rounded(batch):
    q, k, v, g, beta, state = inputs(70, H=2, B=2 if batch else None, seed=6)
    o32, s32 = _core.kda_scan(q, k, v, g, beta, state, batch=batch)
    o16, s16 = _core.kda_scan(*as_bf16((q, k, v, g)), beta, state, batch=batch,
                              o_dtype="bfloat16")
    assert o16.dtype == BF16 and o16.shape == o32.shape
    np.testing.assert_array_equal(o16.view(np.uint16), o32.astype(BF16).view(np.uint16))
    np.testing.assert_array_equal(s16, s32)


# ---------------------------------------------------------------- CUDA


def run_dev(e, q, k, v, g, beta, state, **kw):
    dev = [e.to_device(a) for a in (q, k, v, g, beta)]
    ds = None if state is None else e.to_device(state)
    o, s = _core.kda_scan(*dev, ds, engine=e, **kw)
    return e.to_host(o), e.to_host(s)


def check_bf16(e, q, k, v, g, beta, state, raw=False, batch=False, what=""):
    """The bf16 call equals the f32 call on the same values bit for bit, and the CPU scan within
    the chunked form's tolerance."""
    o32, s32 = run_dev(e, q, k, v, g, beta, state, chunked=True, batch=batch)
    o16, s16 = run_dev(e, *as_bf16((q, k, v, g), raw), beta, state, chunked=True, batch=batch)
    np.testing.assert_array_equal(o16, o32, err_msg=f"o {what}")
    np.testing.assert_array_equal(s16, s32, err_msg=f"state {what}")
    co, cs = _core.kda_scan(q, k, v, g, beta, state, batch=batch)
    assert_close(o16, co, what=f"o {what}")
    assert_close(s16, cs, what=f"state {what}")
    # bf16 o: the f32 o rounded to nearest even (the state unchanged)
    ob, sb = run_dev(e, *as_bf16((q, k, v, g), raw), beta, state, chunked=True, batch=batch,
                     o_dtype="bfloat16")
    assert ob.dtype == BF16, ob.dtype
    np.testing.assert_array_equal(ob.view(np.uint16), o32.astype(BF16).view(np.uint16),
                                  err_msg=f"bf16 o {what}")
    np.testing.assert_array_equal(sb, s32, err_msg=f"state with bf16 o {what}")


@pytest.mark.cuda
@pytest.mark.parametrize("T", [1, 2, 63, 64, 65, 100, 1000, 4097])
@pytest.mark.parametrize("with_state", [False, True])
def test_bf16_chunked_is_the_f32_chunked_on_the_widened_inputs(e, T, with_state):
    H = 2 if T > 1000 else 3
    q, k, v, g, beta, state = inputs(T, H=H, seed=T + 7, with_state=with_state)
    check_bf16(e, q, k, v, g, beta, state, raw=T % 2 == 1, what=f"T={T}")


@pytest.mark.cuda
@pytest.mark.parametrize("T", [65, 130])
def test_bf16_chunked_batch_with_own_states(e, T):
    q, k, v, g, beta, state = inputs(T, H=2, B=3, seed=520 + T)
    check_bf16(e, q, k, v, g, beta, state, batch=True, what=f"B=3 T={T}")


@pytest.mark.cuda
@pytest.mark.parametrize("T", [64, 200])
def test_bf16_chunked_strong_decays(e, T):
    q, k, v, g, beta, state = inputs(T, H=2, seed=610 + T, strong=True)
    check_bf16(e, q, k, v, g, beta, state, what=f"strong T={T}")


@pytest.mark.cuda
def test_bf16_chunked_mixed_safe_and_strong_chunks(e):
    check_bf16(e, *mixed_inputs(seed=660), what="mixed")


@pytest.mark.cuda
def test_bf16_chunked_many_heads(e):
    # 80 heads x 3 chunks: more intra blocks than one wave of the device
    check_bf16(e, *inputs(130, H=80, seed=455), what="H=80")


@pytest.mark.cuda
def test_bf16_needs_the_chunked_form_on_cuda(e):
    q, k, v, g, beta, state = inputs(3, H=1, seed=5)
    dev = [e.to_device(a) for a in (*as_bf16((q, k, v, g)), beta, state)]
    with pytest.raises(memra.UnsupportedError):
        _core.kda_scan(*dev, engine=e)
    f32_dev = [e.to_device(a) for a in (q, k, v, g, beta, state)]
    with pytest.raises(memra.UnsupportedError):
        _core.kda_scan(*f32_dev, engine=e, o_dtype="bfloat16")
    # the engine stays usable: the chunked call runs
    o, _ = _core.kda_scan(*dev, engine=e, chunked=True)
    assert np.all(np.isfinite(e.to_host(o)))


@pytest.mark.cuda
def test_the_bf16_instance_ran(e, tmp_path):
    q, k, v, g, beta, state = inputs(130, H=2, seed=910)
    dev = [e.to_device(a) for a in (*as_bf16((q, k, v, g)), beta, state)]
    names = " ".join(kernel_names(lambda: (_core.kda_scan(*dev, engine=e, chunked=True,
                                                          o_dtype="bfloat16"),
                                           e.synchronize()), tmp_path / "trace.json"))
    assert "::chunk_intra_kernel<false, true>" in names, names
    assert "::chunk_state_kernel<true>" in names, names
