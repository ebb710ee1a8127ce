"""The KDA decode step's kernel and the planes the kda_scan binding names at T == 1 on CUDA
(marked cuda).

- scan_decode_lines_kernel (cuda/kda_decode_lines.cu: a block per 64 columns of a head in 256-byte
  row segments from three full waves of such blocks, else per 32 columns in 128-byte lines; the
  column sums across the block's warps through shared memory) does
  scan_kernel's operations in its fixed order, so chained one step at a time it must give the
  T-step kernel's bytes (``np.array_equal``); against the CPU oracle the scan tolerance of
  tests/test_cuda_kda.py (``rtol=1e-5, atol=1e-6``: 4 chains plus a tree vs one ascending chain,
  CUDA's expf). (The half-line scan_decode_kernel, its A/B arm, was deleted with
  KernelOptions.kda_decode_lines once the H200 settled it: docs/options.md.)
- At T == 1 without ``chunked`` the binding names the states by their stride
  (MEMRA_KDA_PLANES_STRIDED: no pointer table uploaded): a null state reads zeros, every row
  writes its own plane.
- The census asserts which kernel ran (torch.profiler): one launch, the decode kernel, in the part
  shape the grid asks for (halves from three waves of 4 blocks an SM on every SM, quarters
  below).

Shapes: B = 1 (latency form), odd H, B = 64 (the bench's batch) in quarters, B = 288 x 5 heads in
halves (on up to 240 SMs), every column part of a head written.
"""

from __future__ import annotations

import memra
import numpy as np
import pytest

from memra import _core
from cuda_helpers import close, f32, kernel_names, rng

pytestmark = pytest.mark.cuda

DK = DV = 128
SCAN_TOL = dict(rtol=1e-5, atol=1e-6)
KERNEL = "::scan_decode_lines_kernel"  # a templated name


def l2norm(x, eps=1e-6):
    return x / np.sqrt((x * x).sum(-1, keepdims=True) + eps)


def inputs(B, T, H, seed, with_state=True):
    """[B, T, H, *] step inputs (q, k L2-normalised, g a log decay in (-5, 0), beta in (0, 1))
    and a [B, H, dk, dv] state (or None)."""
    r = rng(seed)
    q = f32(l2norm(r.standard_normal((B, T, H, DK))))
    k = f32(l2norm(r.standard_normal((B, T, H, DK))))
    v = f32(r.standard_normal((B, T, H, DV)))
    g = f32(-5.0 / (1.0 + np.exp(-2.0 * r.standard_normal((B, T, H, DK)))))
    beta = f32(1.0 / (1.0 + np.exp(-r.standard_normal((B, T, H)))))
    state = f32(0.3 * r.standard_normal((B, H, DK, DV))) if with_state else None
    return (q, k, v, g, beta), state


def scan(eng, arrays, state, **kw):
    dev = [eng.to_device(a) for a in arrays]
    ds = None if state is None else eng.to_device(state)
    o, s = _core.kda_scan(*dev, ds, engine=eng, batch=True, **kw)
    return eng.to_host(o), eng.to_host(s)


@pytest.mark.parametrize("B,H", [(1, 1), (3, 5), (64, 3), (288, 5)])
@pytest.mark.parametrize("with_state", [True, False])
def test_decode_steps_equal_the_t_step_kernel(e, B, H, with_state):
    T = 3
    arrays, state = inputs(B, T, H, seed=10 * B + H + with_state, with_state=with_state)
    o_full, s_full = scan(e, arrays, state)  # T = 3: scan_kernel over the pointer tables
    s = None if state is None else e.to_device(state)
    for t in range(T):  # T = 1 each: the decode kernel over the STRIDED planes
        step = [e.to_device(np.ascontiguousarray(a[:, t : t + 1])) for a in arrays]
        o, s = _core.kda_scan(*step, s, engine=e, batch=True)
        np.testing.assert_array_equal(e.to_host(o)[:, 0], o_full[:, t], err_msg=f"o, step {t}")
    np.testing.assert_array_equal(e.to_host(s), s_full)
    co, cs = _core.kda_scan(*arrays, state, batch=True)  # the CPU oracle
    close(o_full, co, SCAN_TOL)
    close(s_full, cs, SCAN_TOL)


def test_one_sequence_form_takes_the_same_kernel(e):
    # batch=False at T == 1 ([1, H, *] inputs, [H, dk, dv] state): the same planes, one row.
    arrays, state = inputs(1, 1, 3, seed=88)
    ob, sb = scan(e, arrays, state)
    dev = [e.to_device(a[0]) for a in arrays]
    o, s = _core.kda_scan(*dev, e.to_device(state[0]), engine=e)
    np.testing.assert_array_equal(e.to_host(o), ob[0])
    np.testing.assert_array_equal(e.to_host(s), sb[0])


def decode_kernels(e, B, H, seed, trace):
    """The kernels one kda_scan step of B sequences and H heads launched (kernel_names)."""
    arrays, state = inputs(B, 1, H, seed=seed)
    dev = [e.to_device(a) for a in arrays]
    ds = e.to_device(state)
    return kernel_names(lambda: (_core.kda_scan(*dev, ds, engine=e, batch=True),
                                 e.synchronize()), trace)


def test_the_kernel_ran(e, tmp_path):
    names = decode_kernels(e, 8, 2, 99, tmp_path / "trace.json")
    joined = " ".join(names)
    assert KERNEL in joined, names
    assert len(names) == 1, names  # one launch: no table kernel, no second pass


# (batch as an offset from the smallest batch whose halves fill three full waves, or 1, or the
# batch of one full wave; the shape that must run)
@pytest.mark.parametrize("from_wave,half", [(None, False), ("one", False), (-1, False), (0, True)])
def test_the_part_shape_follows_the_grid(e, tmp_path, from_wave, half):
    """TABLES / STRIDED at T = 1: the halves (<false, false, true>: 256 threads, 64 columns) once
    their grid B * H * 2 fills three waves of 4 blocks an SM on every SM, the quarters
    (<false, false, false>: 128 threads, 32 columns) below it (B = 1, one full wave, one batch
    short of three); the bytes of both against the T-step kernel are
    test_decode_steps_equal_the_t_step_kernel's."""
    torch = pytest.importorskip("torch", reason="the SM count and the census read torch")
    sms = torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count
    H = 4
    wave = -(-4 * sms // (2 * H))  # the smallest batch of one full wave of halves
    B = (1 if from_wave is None else wave if from_wave == "one"
         else -(-3 * 4 * sms // (2 * H)) + from_wave)
    names = decode_kernels(e, B, H, 7, tmp_path / "trace.json")
    want = KERNEL + ("<false, false, true>" if half else "<false, false, false>")
    assert len(names) == 1 and want in names[0], names


def test_sanitizer_decode_kernels(e):
    """Small enough for compute-sanitizer (racecheck: the decode kernel's three block
    barriers over its shared vectors and column partials; memcheck: the STRIDED planes' ends):
    with and without a state."""
    for with_state in (True, False):
        arrays, state = inputs(2, 1, 1, seed=5 + with_state, with_state=with_state)
        o, s = scan(e, arrays, state)
        co, cs = _core.kda_scan(*arrays, state, batch=True)
        close(o, co, SCAN_TOL)
        close(s, cs, SCAN_TOL)


def test_large_outputs_come_back_from_the_kept_blocks():
    """A released block above 1 GiB stays on its context (at most two) and is handed to the next
    allocation of its exact size (cuda/context.cu: the pool did not reuse a 2 GiB kda_scan
    output between calls on the H200); a live block is never handed out twice, and the values
    are right in a reused block. State [B, H, 128, 128] of just over 1 GiB from zeros: after one
    step S = k (beta v)^T exactly (0 + x = x), checked on a few heads."""
    torch = pytest.importorskip("torch")
    eng = memra.Engine("cuda", options=memra.KernelOptions(pdl=False))  # a context of its own
    B, H = 2, 8200  # 2 * 8200 * 64 KiB > 1 GiB
    arrays, _ = inputs(B, 1, H, seed=123, with_state=False)
    dev = [eng.to_device(a) for a in arrays]

    def ptr(x):
        return torch.from_dlpack(x).data_ptr()

    def check(s):
        q, k, v, g, beta = arrays
        got = torch.from_dlpack(s)[:, :3].cpu().numpy()
        for b in range(B):
            for h in range(3):
                d = (v[b, 0, h] * beta[b, 0, h]).astype(np.float32)
                np.testing.assert_array_equal(got[b, h], k[b, 0, h][:, None] * d[None, :])

    _, s1 = _core.kda_scan(*dev, None, engine=eng, batch=True)
    eng.synchronize()
    p1 = ptr(s1)
    check(s1)
    del s1  # kept
    _, s2 = _core.kda_scan(*dev, None, engine=eng, batch=True)
    assert ptr(s2) == p1, "the kept block was not reused"
    _, s3 = _core.kda_scan(*dev, None, engine=eng, batch=True)  # s2 alive: a new block
    assert ptr(s3) != ptr(s2)
    eng.synchronize()
    check(s2)
    check(s3)
    del s2, s3
    _, s4 = _core.kda_scan(*dev, None, engine=eng, batch=True)
    eng.synchronize()
    check(s4)
