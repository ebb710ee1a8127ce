"""KDA ops on the CUDA backend (``memra._core.kda_gate`` / ``kda_scan`` with
``engine=memra.Engine("cuda")``, kernels in cuda/kda_*.cu) against the same ops on the CPU backend
(cpp/src/cpu/kda.cpp, the numeric oracle), plus the bit-exactness contracts between arms and the
argument contract on the device (``kda_conv``'s too; its numerics are
tests/test_cuda_kda_conv.py's).

Tolerances (both sides f32):
- gate: the same operations, CUDA's expf/logf within 2 ulp: ``rtol=1e-6``; ``atol=3e-6`` covers
  the softplus branch where one ulp of exp(x) can flip the rounding of 1 + exp(x) (an error of
  ulp(1) * exp(A_log) ~ 1.2e-7 * 12 at most here).
- scan: the GPU sums the dk = 128 products of each column as 4 ascending chains plus a warp
  tree, the CPU as one ascending chain, and CUDA's expf differs by ulps: ``rtol=1e-5, atol=1e-6``
  (o ~ 0.1, state ~ 1; observed differences ~1e-7 over hundreds of steps, the same bounds as the
  CPU tests against float64).
- Arm / chaining / batching contracts: ``np.array_equal``. The conv arms share one device
  function per output; the scan's two kernels (scan_kernel for T >= 2, scan_decode_lines_kernel
  for T == 1) do each element's operations in the same order, so one-step launches (decode
  kernel) chained equal one T-step launch bit for bit.
- Outputs the kernels overwrite are allocated without a zero fill: two runs over different
  garbage left in the memory pool (large finite values, then NaNs) must agree and be finite.

A small shape for ``compute-sanitizer --tool racecheck`` / ``--tool memcheck``:
``python -m pytest tests/test_cuda_kda.py -k sanitizer``.
"""

from __future__ import annotations

import numpy as np
import pytest

import memra
from memra import _core
from cuda_helpers import close, f32, rng
from test_cuda_kda_conv import conv_cuda, conv_inputs

pytestmark = pytest.mark.cuda

ST = _core.status
DK = DV = 128  # the only head size the scan kernel is built for
K = 4  # linear_conv_kernel_dim of glm5_next and Kimi-Linear

GATE_TOL = dict(rtol=1e-6, atol=3e-6)
SCAN_TOL = dict(rtol=1e-5, atol=1e-6)


def l2norm(x, eps=1e-6):
    return x / np.sqrt((x * x).sum(-1, keepdims=True) + eps)


# ---------------------------------------------------------------- gate


def gate_inputs(T=13, H=3, dk=128, seed=3):
    r = rng(seed)
    f = f32(4.0 * r.standard_normal((T, H * dk)))
    dt_bias = f32(r.standard_normal(H * dk))
    A_log = f32(r.standard_normal(H))
    # The softplus threshold (20) and saturation of both forms: |f + dt_bias| up to 1e4.
    probes = np.array([19.9, 20.0, 20.1, 25.0, -20.0, -30.0, 1e4, -1e4, 0.0], np.float32)
    f[0, : probes.size] = probes - dt_bias[: probes.size]
    return f, dt_bias, A_log


def gate_cuda(e, f, dt_bias, A_log, **kw):
    return e.to_host(_core.kda_gate(e.to_device(f), e.to_device(dt_bias), e.to_device(A_log),
                                    engine=e, **kw))


@pytest.mark.parametrize("form", ["lower_bound", "softplus"])
@pytest.mark.parametrize("T,H,dk", [(1, 2, 128), (13, 3, 128), (65, 2, 5)])
def test_gate_matches_cpu(e, form, T, H, dk):
    f, dt_bias, A_log = gate_inputs(T, H, dk, seed=T + dk)
    g = gate_cuda(e, f, dt_bias, A_log, form=form, lower_bound=-5.0)
    close(g, _core.kda_gate(f, dt_bias, A_log, form=form, lower_bound=-5.0), GATE_TOL)
    assert np.all(g <= 0)
    if form == "lower_bound":
        assert np.all(g >= -5.0)


def test_gate_bad_form_is_refused(e):
    f, dt_bias, A_log = gate_inputs(2, 2, 128)
    with pytest.raises(memra.ContractError) as ei:
        gate_cuda(e, f, dt_bias, A_log, form="sigmoid")
    assert ei.value.code == ST.CONTRACT_VALUE


# ---------------------------------------------------------------- scan


def scan_inputs(T, H=2, B=None, seed=0, with_state=True, g_value=None, beta_value=None):
    """One sequence ([T, H, ...]) or, with B, a batch ([B, T, H, ...]) of dk = dv = 128."""
    r = rng(seed)
    lead = (T, H) if B is None else (B, T, H)
    q = f32(l2norm(r.standard_normal(lead + (DK,))))
    k = f32(l2norm(r.standard_normal(lead + (DK,))))
    v = f32(r.standard_normal(lead + (DV,)))
    if g_value is None:
        g = f32(-5.0 / (1.0 + np.exp(-2.0 * r.standard_normal(lead + (DK,)))))
    else:
        g = np.full(lead + (DK,), g_value, np.float32)
    if beta_value is None:
        beta = f32(1.0 / (1.0 + np.exp(-r.standard_normal(lead))))
    else:
        beta = np.full(lead, beta_value, np.float32)
    slead = (H,) if B is None else (B, H)
    state = f32(0.3 * r.standard_normal(slead + (DK, DV))) if with_state else None
    return q, k, v, g, beta, state


def scan_cuda(e, q, k, v, g, beta, state=None, **kw):
    dev = [e.to_device(a) for a in (q, k, v, g, beta)]
    ds = None if state is None else e.to_device(state)
    o, s = _core.kda_scan(*dev, ds, engine=e, **kw)
    return e.to_host(o), e.to_host(s)


@pytest.mark.parametrize("T", [1, 3, 63, 65, 200])
@pytest.mark.parametrize("with_state", [False, True])
def test_scan_matches_cpu(e, T, with_state):
    q, k, v, g, beta, state = scan_inputs(T, H=3, seed=T, with_state=with_state)
    o, s = scan_cuda(e, q, k, v, g, beta, state)
    co, cs = _core.kda_scan(q, k, v, g, beta, state)
    close(o, co, SCAN_TOL)
    close(s, cs, SCAN_TOL)


def test_scan_explicit_scale(e):
    q, k, v, g, beta, state = scan_inputs(9, seed=9)
    o, s = scan_cuda(e, q, k, v, g, beta, state, scale=0.5)
    co, cs = _core.kda_scan(q, k, v, g, beta, state, scale=0.5)
    close(o, co, SCAN_TOL)
    close(s, cs, SCAN_TOL)


@pytest.mark.parametrize("T", [1, 2, 63, 65, 200])
def test_scan_prefill_then_decode_is_bit_exact(e, T):
    q, k, v, g, beta, state = scan_inputs(T, seed=200 + T)
    o_full, s_full = scan_cuda(e, q, k, v, g, beta, state)
    head, tail = slice(0, T - 1), slice(T - 1, T)
    o_head, s_mid = scan_cuda(e, q[head], k[head], v[head], g[head], beta[head], state)
    o_tail, s_end = scan_cuda(e, q[tail], k[tail], v[tail], g[tail], beta[tail], s_mid)
    np.testing.assert_array_equal(np.concatenate([o_head, o_tail]), o_full)
    np.testing.assert_array_equal(s_end, s_full)


@pytest.mark.parametrize("with_state", [False, True])
def test_scan_chained_one_step_launches_equal_one_launch(e, with_state):
    T = 63
    q, k, v, g, beta, state = scan_inputs(T, seed=300, with_state=with_state)
    o_full, s_full = scan_cuda(e, q, k, v, g, beta, state)
    # The state stays on the device between the one-step launches.
    s = None if state is None else e.to_device(state)
    for t in range(T):
        args = [e.to_device(a[t : t + 1]) for a in (q, k, v, g, beta)]
        o, s = _core.kda_scan(*args, s, engine=e)
        np.testing.assert_array_equal(e.to_host(o)[0], o_full[t])
    np.testing.assert_array_equal(e.to_host(s), s_full)


def test_scan_zero_steps_passes_the_state_through(e):
    q, k, v, g, beta, state = scan_inputs(0, seed=310)
    o, s = scan_cuda(e, q, k, v, g, beta, state)
    assert o.shape == (0, 2, DV)
    np.testing.assert_array_equal(s, state)
    _, s0 = scan_cuda(e, q, k, v, g, beta)
    np.testing.assert_array_equal(s0, np.zeros_like(state))


@pytest.mark.parametrize("T", [1, 3])
def test_scan_batch_equals_each_sequence_alone(e, T):
    # Decode shape (T = 1): B sequences with different states in one launch; T = 3 too.
    B = 6
    q, k, v, g, beta, state = scan_inputs(T, H=3, B=B, seed=320 + T)
    o, s = scan_cuda(e, q, k, v, g, beta, state, batch=True)
    assert o.shape == (B, T, 3, DV) and s.shape == (B, 3, DK, DV)
    for b in range(B):
        ob, sb = scan_cuda(e, q[b], k[b], v[b], g[b], beta[b], state[b])
        np.testing.assert_array_equal(o[b], ob)
        np.testing.assert_array_equal(s[b], sb)
    co, cs = _core.kda_scan(q, k, v, g, beta, state, batch=True)  # the CPU batch form
    close(o, co, SCAN_TOL)
    close(s, cs, SCAN_TOL)


def test_scan_batch_without_state_starts_from_zeros(e):
    B = 3
    q, k, v, g, beta, _ = scan_inputs(2, B=B, seed=330, with_state=False)
    o, s = scan_cuda(e, q, k, v, g, beta, None, batch=True)
    zeros = np.zeros((B, 2, DK, DV), np.float32)
    o0, s0 = scan_cuda(e, q, k, v, g, beta, zeros, batch=True)
    np.testing.assert_array_equal(o, o0)
    np.testing.assert_array_equal(s, s0)


def test_scan_decode_arm_equals_prefill_arm_at_t1(e):
    # One kernel serves both: a batch of B one-step sequences (decode) and one T = 1 sequence
    # (prefill) give the same bits for the same sequence.
    q, k, v, g, beta, state = scan_inputs(1, H=4, seed=340)
    o1, s1 = scan_cuda(e, q, k, v, g, beta, state)
    ob, sb = scan_cuda(e, q[None], k[None], v[None], g[None], beta[None], state[None], batch=True)
    np.testing.assert_array_equal(ob[0], o1)
    np.testing.assert_array_equal(sb[0], s1)


@pytest.mark.parametrize("with_state", [False, True])
def test_scan_decode_lines_kernel_equals_the_t_step_kernel(e, with_state):
    # T == 1 runs scan_decode_lines_kernel, T >= 2 scan_kernel: the decode shape (B = 64, odd
    # H) step by step must give the T-step kernel's bits, o of each step and the final state.
    B, H, T = 64, 3, 2
    q, k, v, g, beta, state = scan_inputs(T, H=H, B=B, seed=345 + with_state,
                                          with_state=with_state)
    o_full, s_full = scan_cuda(e, q, k, v, g, beta, state, batch=True)
    s = None if state is None else e.to_device(state)
    for t in range(T):
        args = [e.to_device(np.ascontiguousarray(a[:, t : t + 1])) for a in (q, k, v, g, beta)]
        o, s = _core.kda_scan(*args, s, engine=e, batch=True)
        np.testing.assert_array_equal(e.to_host(o)[:, 0], o_full[:, t])
    np.testing.assert_array_equal(e.to_host(s), s_full)
    co, cs = _core.kda_scan(q, k, v, g, beta, state, batch=True)
    close(o_full, co, SCAN_TOL)
    close(s_full, cs, SCAN_TOL)


@pytest.mark.parametrize(
    "T,g_value,beta_value",
    [
        (200, 0.0, None),  # g == 0: no decay, the state keeps everything
        (300, -5.0, None),  # at the lower bound for 300 steps
        (65, None, 1e-7),  # beta ~ 0: the state barely moves
        (65, None, 1.0 - 1e-7),  # beta ~ 1
        (200, 0.0, 1.0),  # pure delta rule, no decay
    ],
)
def test_scan_gate_and_beta_extremes(e, T, g_value, beta_value):
    q, k, v, g, beta, state = scan_inputs(T, seed=400 + T, g_value=g_value, beta_value=beta_value)
    o, s = scan_cuda(e, q, k, v, g, beta, state)
    co, cs = _core.kda_scan(q, k, v, g, beta, state)
    close(o, co, SCAN_TOL)
    close(s, cs, SCAN_TOL)


def test_saturated_softplus_gate_forgets_the_state(e):
    # |f + dt_bias| = 1e4 through the softplus gate: exp(g) == 0, each step starts from zero.
    T, H = 8, 2
    q, k, v, _, beta, state = scan_inputs(T, H=H, seed=500)
    f = np.full((T, H * DK), 1e4, np.float32)
    g = gate_cuda(e, f, np.zeros(H * DK, np.float32), np.zeros(H, np.float32), form="softplus")
    g = g.reshape(T, H, DK)
    o, s = scan_cuda(e, q, k, v, g, beta, state)
    assert np.all(np.isfinite(o)) and np.all(np.isfinite(s))
    sl = slice(T - 1, T)
    o1, s1 = scan_cuda(e, q[sl], k[sl], v[sl], g[sl], beta[sl])
    np.testing.assert_array_equal(o[-1:], o1)
    np.testing.assert_array_equal(s, s1)


@pytest.mark.parametrize("dk,dv", [(64, 64), (128, 64), (64, 128)])
def test_scan_unbuilt_head_size_is_unsupported(e, dk, dv):
    r = rng(600)
    T, H = 3, 2
    q = f32(l2norm(r.standard_normal((T, H, dk))))
    k = f32(l2norm(r.standard_normal((T, H, dk))))
    v = f32(r.standard_normal((T, H, dv)))
    g = np.full((T, H, dk), -0.5, np.float32)
    beta = np.full((T, H), 0.5, np.float32)
    state = f32(r.standard_normal((H, dk, dv)))
    with pytest.raises(memra.UnsupportedError) as ei:
        scan_cuda(e, q, k, v, g, beta, state)
    assert ei.value.code == ST.UNSUPPORTED_GEOMETRY
    assert "kda_scan" in str(ei.value)
    _core.kda_scan(q, k, v, g, beta, state)  # the CPU backend still runs it


# ---------------------------------------------------------------- argument contract on the device


def test_host_array_for_cuda_engine_is_refused(e):
    q, k, v, g, beta, state = scan_inputs(2, seed=700)
    dev = [e.to_device(a) for a in (q, k, v, g, beta)]
    dev[2] = v  # a host array where the engine's device is expected
    with pytest.raises(memra.ContractError) as ei:
        _core.kda_scan(*dev, e.to_device(state), engine=e)
    assert ei.value.code == ST.CONTRACT_DEVICE and "'v'" in str(ei.value)
    x, w, ring = conv_inputs(3, seed=701)
    with pytest.raises(memra.ContractError) as ei:
        _core.kda_conv(e.to_device(x), w, e.to_device(ring), engine=e)
    assert ei.value.code == ST.CONTRACT_DEVICE and "'w'" in str(ei.value)
    f, dt_bias, A_log = gate_inputs(2, 2, 128)
    with pytest.raises(memra.ContractError) as ei:
        _core.kda_gate(e.to_device(f), e.to_device(dt_bias), A_log, engine=e)
    assert ei.value.code == ST.CONTRACT_DEVICE and "'A_log'" in str(ei.value)


def test_device_array_for_cpu_backend_is_refused(e):
    x, w, ring = conv_inputs(3, seed=702)
    with pytest.raises(memra.ContractError) as ei:
        _core.kda_conv(e.to_device(x), w, ring)
    assert ei.value.code == ST.CONTRACT_DEVICE


def test_wrong_dtype_and_shape_on_device_are_refused(e):
    q, k, v, g, beta, state = scan_inputs(2, seed=703)

    def dev():  # e.to_device arrays are DLPack capsules: one use each
        return [e.to_device(a) for a in (q, k, v, g, beta)]

    bad = dev()
    bad[3] = e.to_device(g.astype(np.float64))
    with pytest.raises(memra.ContractError) as ei:
        _core.kda_scan(*bad, engine=e)
    assert ei.value.code == ST.CONTRACT_DTYPE
    with pytest.raises(memra.ContractError) as ei:
        _core.kda_scan(*dev(), e.to_device(state[:, :, :64].copy()), engine=e)
    assert ei.value.code == ST.CONTRACT_SHAPE
    with pytest.raises(memra.ContractError) as ei:  # batch=True wants [B, T, H, dk]
        _core.kda_scan(*dev(), engine=e, batch=True)
    assert ei.value.code == ST.CONTRACT_SHAPE
    x, w, ring = conv_inputs(3, seed=704)
    with pytest.raises(memra.ContractError) as ei:
        conv_cuda(e, x, w, ring, arm="decode")  # the decode arm takes one token
    assert ei.value.code == ST.CONTRACT_SHAPE
    with pytest.raises(memra.ContractError) as ei:
        conv_cuda(e, x, w, ring, arm="sideways")
    assert ei.value.code == ST.CONTRACT_VALUE


def test_inputs_are_not_modified_and_errors_change_nothing(e):
    """Reusable device buffers (CuPy, when installed) read back after the calls: the kernels
    never write their inputs, and a refused call writes nothing."""
    cp = pytest.importorskip("cupy")
    with cp.cuda.Device(0):  # the engine's device (Engine('cuda') = device_index 0)
        q, k, v, g, beta, state = scan_inputs(4, seed=10)
        host = dict(q=q, k=k, v=v, g=g, beta=beta, state=state)
        d = {n: cp.asarray(a) for n, a in host.items()}
        x, w, ring = conv_inputs(5, seed=40)
        host.update(x=x, w=w, ring=ring)
        d.update(x=cp.asarray(x), w=cp.asarray(w), ring=cp.asarray(ring))
        cp.cuda.Device().synchronize()  # memra's stream does not wait for CuPy's
        scan = (d["q"], d["k"], d["v"], d["g"], d["beta"])
        _core.kda_scan(*scan, d["state"], engine=e)
        _core.kda_scan(*scan, d["state"], engine=e, scale=0.5)
        _core.kda_conv(d["x"], d["w"], d["ring"], engine=e)  # prefill arm
        _core.kda_conv(d["x"][:1], d["w"], d["ring"], engine=e)  # decode arm
        with pytest.raises(memra.ContractError):  # state of the wrong shape: refused
            _core.kda_scan(*scan, d["state"][:1], engine=e)
        with pytest.raises(memra.UnsupportedError):  # K = 9: no kernel, nothing written
            _core.kda_conv(d["x"], cp.zeros((37, 9), cp.float32), cp.zeros((37, 8), cp.float32),
                           engine=e)
        e.synchronize()
        for n, a in host.items():
            np.testing.assert_array_equal(cp.asnumpy(d[n]), a, err_msg=n)


def test_engine_stays_usable_after_errors(e):
    r = rng(705)
    small = [f32(r.standard_normal((2, 1, 64))) for _ in range(4)]  # q, k, v, g of dk = dv = 64
    with pytest.raises(memra.UnsupportedError):
        scan_cuda(e, *small, np.full((2, 1), 0.5, np.float32))
    q, k, v, g, beta, state = scan_inputs(3, seed=706)
    o, s = scan_cuda(e, q, k, v, g, beta, state)
    co, cs = _core.kda_scan(q, k, v, g, beta, state)
    close(o, co, SCAN_TOL)
    close(s, cs, SCAN_TOL)


# ---------------------------------------------------------------- outputs allocated without a fill


def poison_pool(e, shapes, value):
    """Leave `value` in the engine's stream-ordered memory pool where the next allocations of
    these shapes are likely to land (a freed block goes back to the pool and is handed to the
    next request on the stream), so an output element a kernel forgets to write shows."""
    bufs = [e.to_device(np.full(s, value, np.float32)) for s in shapes]
    e.synchronize()
    del bufs


def run_twice_over_garbage(e, call, shapes):
    """call() -> tuple of device outputs of `shapes`; returns the host copies of two runs, the
    first over a pool poisoned with large finite values, the second with NaNs."""
    runs = []
    for value in (-3.0e38, np.nan):
        poison_pool(e, shapes, value)
        runs.append([e.to_host(a) for a in call()])
    return runs


def test_uninitialised_outputs_are_fully_written(e):
    """o, state_out, y, ring_out and g come from the memory pool without a zero fill (the
    kernels overwrite them): two runs over different garbage must agree bit for bit and be
    finite; state_out of a zero-step scan without a state still reads zeros."""
    cases = []
    # Scan: the decode kernel (B = 64, T = 1), the T-step kernel, with and without a state.
    for T, B, with_state in [(1, 64, True), (1, 64, False), (5, 3, True), (5, 3, False)]:
        q, k, v, g, beta, state = scan_inputs(T, H=2, B=B, seed=900 + T, with_state=with_state)
        dev = [e.to_device(a) for a in (q, k, v, g, beta)]
        ds = None if state is None else e.to_device(state)
        cases.append((f"scan T={T} B={B} state={with_state}",
                      lambda dev=dev, ds=ds: _core.kda_scan(*dev, ds, engine=e, batch=True),
                      [(B, T, 2, DV), (B, 2, DK, DV)]))
    # Zero steps: state_out is the state passed through, or zeros without one.
    q, k, v, g, beta, state = scan_inputs(0, H=2, seed=910)
    dev0 = [e.to_device(a) for a in (q, k, v, g, beta)]
    ds0 = e.to_device(state)
    cases.append(("scan T=0 state", lambda: _core.kda_scan(*dev0, ds0, engine=e),
                  [(0, 2, DV), (2, DK, DV)]))
    cases.append(("scan T=0 no state", lambda: _core.kda_scan(*dev0, None, engine=e),
                  [(0, 2, DV), (2, DK, DV)]))
    # Conv: prefill (T = 0 passes the ring through), decode, batched decode.
    C = 37
    for T, arm in [(65, "prefill"), (2, "prefill"), (0, "prefill"), (1, "decode")]:
        x, w, ring = conv_inputs(T, C=C, seed=920 + T)
        dx, dw, dr = e.to_device(x), e.to_device(w), e.to_device(ring)
        cases.append((f"conv T={T} {arm}",
                      lambda dx=dx, dw=dw, dr=dr, arm=arm: _core.kda_conv(dx, dw, dr, arm=arm,
                                                                          engine=e),
                      [(T, C), (C, K - 1)]))
    x, w, ring = conv_inputs(7, C=C, seed=930)
    rings = f32(np.stack([ring] * 7))
    dx, dw, drs = e.to_device(x), e.to_device(w), e.to_device(rings)
    cases.append(("conv batch", lambda: _core.kda_conv(dx, dw, drs, batch=True, engine=e),
                  [(7, C), (7, C, K - 1)]))
    # Gate.
    f, dt_bias, A_log = gate_inputs(13, 3, 128, seed=940)
    df, db, da = e.to_device(f), e.to_device(dt_bias), e.to_device(A_log)
    cases.append(("gate", lambda: (_core.kda_gate(df, db, da, engine=e),), [(13, 3 * 128)]))

    for name, call, shapes in cases:
        first, second = run_twice_over_garbage(e, call, shapes)
        for i, (a, b) in enumerate(zip(first, second)):
            assert a.shape == tuple(shapes[i]), name
            assert np.all(np.isfinite(a)) and np.all(np.isfinite(b)), f"{name}: output {i}"
            np.testing.assert_array_equal(a, b, err_msg=f"{name}: output {i}")
    zeros_case = dict((n, c) for n, c, _ in cases)["scan T=0 no state"]
    poison_pool(e, [(0, 2, DV), (2, DK, DV)], np.nan)
    _, s0 = zeros_case()
    np.testing.assert_array_equal(e.to_host(s0), np.zeros((2, DK, DV), np.float32))


def test_misaligned_scan_arrays_are_refused(e):
    """The scan kernels load q / k / g / v and the state planes as float4: a device view that
    does not start on 16 bytes is refused by name (ContractError CONTRACT_STRIDE) instead of
    faulting; the engine stays usable."""
    cp = pytest.importorskip("cupy")
    with cp.cuda.Device(0):
        host = dict(zip(("q", "k", "v", "g", "beta", "state"),
                        scan_inputs(1, H=2, B=4, seed=950)))

        def shifted(a):  # the same values one float into a larger buffer: contiguous, misaligned
            buf = cp.zeros(a.size + 1, cp.float32)
            buf[1:] = cp.asarray(a.ravel())
            return buf[1:].reshape(a.shape)

        for name in ("q", "v", "state"):
            d = {n: cp.asarray(a) for n, a in host.items()}
            d[name] = shifted(host[name])
            cp.cuda.Device().synchronize()  # memra's stream does not wait for CuPy's
            with pytest.raises(memra.ContractError) as ei:
                _core.kda_scan(d["q"], d["k"], d["v"], d["g"], d["beta"], d["state"], engine=e,
                               batch=True)
            assert ei.value.code == ST.CONTRACT_STRIDE and f"'{name}'" in str(ei.value)
        d = {n: cp.asarray(a) for n, a in host.items()}
        cp.cuda.Device().synchronize()
        o, s = _core.kda_scan(d["q"], d["k"], d["v"], d["g"], d["beta"], d["state"], engine=e,
                              batch=True)
        co, cs = _core.kda_scan(*host.values(), batch=True)
        close(e.to_host(o), co, SCAN_TOL)
        close(e.to_host(s), cs, SCAN_TOL)


# ---------------------------------------------------------------- sanitizer-sized shapes


def test_sanitizer_small_shapes(e):
    """Small enough for compute-sanitizer (racecheck / memcheck / initcheck): every kernel of
    cuda/kda_*.cu once; scan_kernel over two steps so its per-warp shared vectors are rewritten,
    and scan_decode_lines_kernel (T = 1)."""
    x, w, ring = conv_inputs(3, C=9, seed=800)
    conv_cuda(e, x, w, ring, arm="prefill")
    conv_cuda(e, x[:1], w, ring, arm="decode")
    conv_cuda(e, x[:2], w, f32(np.stack([ring, ring])), batch=True)
    f, dt_bias, A_log = gate_inputs(2, 1, 128)
    gate_cuda(e, f, dt_bias, A_log, form="lower_bound")
    gate_cuda(e, f, dt_bias, A_log, form="softplus")
    for T in (2, 1):  # scan_kernel, scan_decode_lines_kernel
        q, k, v, g, beta, state = scan_inputs(T, H=1, B=2, seed=801 + T)
        o, s = scan_cuda(e, q, k, v, g, beta, state, batch=True)
        co, cs = _core.kda_scan(q, k, v, g, beta, state, batch=True)
        close(o, co, SCAN_TOL)
        close(s, cs, SCAN_TOL)
