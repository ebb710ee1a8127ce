"""mHC on the CUDA backend (``memra._core.mhc_pre`` (with the fused input norm) / ``mhc_post`` /
``mhc_post_head_norm`` / ``hc_head_mean`` / ``hc_expand`` and the ``HyperConnection`` layer with
``engine=memra.Engine("cuda")``; kernels in cuda/mhc_*.cu) against the same ops on the CPU
backend (cpp/src/cpu/mhc.cpp: the numeric oracle) or against the separate kernels they fuse,
plus the argument contract.

Tolerances (both sides f32 unless said):
- mhc_pre, f32 fn: the GPU applies the RMS factor after the GEMM (fn(x r) = r fn(x)) and sums in
  cuBLAS's order: logits agree to ~1e-6 relative; sigmoid/softmax/Sinkhorn are the CPU's
  operations in the CPU's order: ``atol=1e-5`` on post/comb (values O(1)), collapsed
  ``atol=1e-5 * max|streams|``.
- mhc_pre, bf16 fn: the streams are rounded to bf16 in the GEMM (the CPU multiplies f32
  normalised rows): logit errors ~1e-3 (see linear (b)), through sigmoid (slope <= 0.25 * scale)
  and softmax: ``atol=1e-2`` on post/comb, collapsed ``atol=3e-2 * max|streams|`` (hc = 4 terms).
- mhc_post, hc_head_mean: the CPU's operations in the CPU's order without contraction:
  ``np.array_equal``.

A small shape for ``compute-sanitizer --tool racecheck`` / ``memcheck``:
``python -m pytest tests/test_cuda_mhc.py -k sanitizer``.
"""

from __future__ import annotations

import numpy as np
import pytest

import memra
from memra import _core
from cuda_helpers import bf16_weight, close, expect, f32, kernel_names, rng

pytestmark = pytest.mark.cuda

ST = _core.status
NORM_TOL = dict(rtol=1e-5, atol=1e-5)


def dev_weight(e, w, dtype=None):
    return memra.DeviceWeight(e, w, dtype=dtype)


# ---------------------------------------------------------------- mHC


def mhc_inputs(T, hc, D, seed, fn_dtype="float32"):
    r = rng(seed)
    mix = (2 + hc) * hc
    streams = f32(r.standard_normal((T, hc, D)) * 3)
    fn = r.standard_normal((mix, hc * D)) / np.sqrt(hc * D)
    fw = _core.Weight(f32(fn)) if fn_dtype == "float32" else bf16_weight(fn)
    base = f32(r.standard_normal(mix) * 0.5)
    scale = np.array([0.7, 1.3, 0.5], np.float32)
    return streams, fw, base, scale


def mhc_both(e, streams, fw, base, scale, **kw):
    want = _core.mhc_pre(streams, fw, base, scale, **kw)
    got = _core.mhc_pre(e.to_device(streams), dev_weight(e, fw), e.to_device(base), e.to_device(scale),
                        engine=e, **kw)
    return [e.to_host(g) for g in got], want


# T <= 64 with 16-byte rows (hc * D % 4 == 0) and (2 + hc) * hc < 64 takes the split decode path
# (cuda/mhc_pre.cu mhc_partial_kernel + mhc_finish_kernel; hc = 6, 7: the block Sinkhorn there;
# T > 32: a warp's second row); larger T, odd rows and wider hc the GEMM + one-block-per-token
# mapping.
@pytest.mark.parametrize("T", [1, 2, 32, 33, 64, 65, 200])
@pytest.mark.parametrize("hc,D,iters", [(4, 33, 20), (4, 200, 20), (4, 1024, 20), (3, 5, 1),
                                        (1, 16, 3), (2, 9, 3), (6, 70, 5), (7, 4, 4), (8, 16, 3)])
def test_mhc_pre_f32_matches_cpu(e, T, hc, D, iters):
    streams, fw, base, scale = mhc_inputs(T, hc, D, seed=T * 100 + hc * 10 + D)
    kw = dict(sinkhorn_iters=iters, hc_eps=1e-6, norm_eps=1e-5)
    (post, comb, col), (wpost, wcomb, wcol) = mhc_both(e, streams, fw, base, scale, **kw)
    close(post, wpost, dict(rtol=0, atol=1e-5))
    close(comb, wcomb, dict(rtol=0, atol=1e-5))
    close(col, wcol, dict(rtol=0, atol=1e-5 * float(np.abs(streams).max())))


@pytest.mark.parametrize("T", [1, 3, 32, 40, 64, 65])
def test_mhc_pre_glm_width(e, T):
    # GLM-5.3-Flash: hc = 4 streams of hidden 4096 (the RMS over 16384 values per token); T <= 64
    # the split decode path, T = 65 the GEMM + mapping kernel.
    streams, fw, base, scale = mhc_inputs(T, 4, 4096, seed=77)
    kw = dict(sinkhorn_iters=20, hc_eps=1e-6, norm_eps=1e-6)
    (post, comb, col), (wpost, wcomb, wcol) = mhc_both(e, streams, fw, base, scale, **kw)
    close(post, wpost, dict(rtol=0, atol=1e-5))
    close(comb, wcomb, dict(rtol=0, atol=1e-5))
    close(col, wcol, dict(rtol=0, atol=1e-5 * float(np.abs(streams).max())))


@pytest.mark.parametrize("T,D", [(1, 33), (2, 4096), (48, 4096), (64, 256), (65, 256)])
def test_mhc_pre_bf16_fn_matches_cpu(e, T, D):
    streams, fw, base, scale = mhc_inputs(T, 4, D, seed=T + D, fn_dtype="bfloat16")
    kw = dict(sinkhorn_iters=20, hc_eps=1e-6, norm_eps=1e-5)
    (post, comb, col), (wpost, wcomb, wcol) = mhc_both(e, streams, fw, base, scale, **kw)
    close(post, wpost, dict(rtol=0, atol=1e-2))
    close(comb, wcomb, dict(rtol=0, atol=1e-2))
    close(col, wcol, dict(rtol=0, atol=3e-2 * float(np.abs(streams).max())))


# mhc_pre with the block's input norm (rms_eps / rms_weight): at decode rows (T <= 64, D <= 4096)
# cuda/mhc_pre.cu fuses the RMSNorm into mhc_finish_norm_kernel<G>, which must give the bytes of
# mhc_pre followed by rms_norm on the same engine (same columns per thread, same reduction); past
# those bounds the op runs the two kernels. Against the CPU (mhc_pre then rms_norm): the
# collapsed row's tolerance above, through a norm of O(1) gain.
@pytest.mark.parametrize("T", [1, 3, 32, 33, 64, 65])
@pytest.mark.parametrize("hc,D", [(4, 4096), (4, 200), (4, 33), (1, 16), (7, 4), (6, 70), (8, 16),
                                  (2, 4100)])
@pytest.mark.parametrize("weighted", [True, False])
def test_mhc_pre_norm_equals_mhc_pre_then_rms_norm(e, T, hc, D, weighted):
    streams, fw, base, scale = mhc_inputs(T, hc, D, seed=T * 7 + hc * 3 + D)
    kw = dict(sinkhorn_iters=20, hc_eps=1e-6, norm_eps=1e-5)
    w = f32(rng(D).standard_normal(D)) if weighted else None
    ds, dfw, db, dsc = e.to_device(streams), dev_weight(e, fw), e.to_device(base), e.to_device(scale)
    dw = None if w is None else e.to_device(w)
    post, comb, col = _core.mhc_pre(ds, dfw, db, dsc, engine=e, **kw)
    want = e.to_host(_core.rms_norm(col, dw, eps=1e-6, engine=e))
    fpost, fcomb, fout = (e.to_host(a) for a in
                          _core.mhc_pre(ds, dfw, db, dsc, rms_weight=dw, rms_eps=1e-6, engine=e, **kw))
    np.testing.assert_array_equal(fpost, e.to_host(post))
    np.testing.assert_array_equal(fcomb, e.to_host(comb))
    np.testing.assert_array_equal(fout, want)
    cpost, ccomb, cout = _core.mhc_pre(streams, fw, base, scale, rms_weight=w, rms_eps=1e-6, **kw)
    close(fpost, cpost, dict(rtol=0, atol=1e-5))
    close(fcomb, ccomb, dict(rtol=0, atol=1e-5))
    close(fout, cout, dict(rtol=0, atol=1e-4 * max(1.0, float(np.abs(cout).max()))))


# HyperConnection.post_pre: the previous site's mhc_post, then this site's pre with the block's
# input norm. At one decode row with hc = 4 (D % 4 == 0, D <= 4096; GLM-5.3) cuda/mhc_site.cu runs it
# as one launch (mhc_site_kernel: the split partials, then the block that finishes last maps,
# collapses, normalises and runs the Sinkhorn), and pre(norm=, eps=) at that row the same kernel
# without the expansion. At other rows of the split path (T <= 64) with hc in {1, 2, 4} and
# D % 4 == 0 the expansion runs inside mhc_partial_kernel (POST_HC), whose lanes store the new
# streams. All must give the bytes of the separate kernels on the same engine: mhc_post, pre
# without a norm (mhc_partial_kernel + mhc_finish_kernel), then rms_norm. Other shapes (odd D,
# hc 3 or > 4, T > 64) run mhc_post's launch inside the call. Against the CPU layer: the
# tolerances of test_mhc_pre_norm_equals_mhc_pre_then_rms_norm.
def hc_layer(e, fw, base, scale, hc, D, dtype="float32"):
    w = {"fn": fw, "base": _core.Weight(base), "scale": _core.Weight(scale)}
    kw = dict(hidden=D, hc_mult=hc, sinkhorn_iters=20, hc_eps=1e-6, norm_eps=1e-5, dtype=dtype)
    return _core.HyperConnection(e, w, **kw), _core.HyperConnection(_core.Engine("cpu"), w, **kw)


@pytest.mark.parametrize("T,hc,D", [(1, 4, 4096), (1, 4, 2048), (1, 4, 1020), (1, 4, 200),
                                    (1, 4, 36), (1, 4, 4), (1, 4, 33), (1, 4, 4100), (3, 4, 4096),
                                    (33, 4, 64), (1, 2, 64), (1, 6, 70), (2, 4, 4096),
                                    (32, 4, 4096), (3, 4, 4100), (3, 4, 33), (5, 2, 64), (3, 1, 16),
                                    (4, 6, 72), (2, 3, 12), (64, 4, 4096), (40, 2, 64), (65, 4, 64)])
@pytest.mark.parametrize("weighted", [True, False])
@pytest.mark.parametrize("fn_dtype", ["float32", "bfloat16"])
def test_hc_post_pre_equals_separate_kernels(e, T, hc, D, weighted, fn_dtype):
    streams, fw, base, scale = mhc_inputs(T, hc, D, seed=T * 5 + hc * 11 + D, fn_dtype=fn_dtype)
    r = rng(D + 3)
    y = f32(r.standard_normal((T, D)) * 2)
    post_prev = f32(r.uniform(0.1, 2.0, (T, hc)))
    comb_prev = f32(r.uniform(0.0, 0.5, (T, hc, hc)))
    w = f32(r.standard_normal(D)) if weighted else None
    gpu, cpu = hc_layer(e, fw, base, scale, hc, D, dtype=fn_dtype)
    dy, dp, dc, ds = (e.to_device(a) for a in (y, post_prev, comb_prev, streams))
    dw = None if w is None else e.to_device(w)
    got = [e.to_host(a) for a in gpu.post_pre(dy, dp, dc, ds, norm=dw, eps=1e-6)]
    new = _core.mhc_post(dy, dp, dc, ds, engine=e)
    post, comb, col = gpu.pre(new)
    want = [e.to_host(new), e.to_host(post), e.to_host(comb),
            e.to_host(_core.rms_norm(col, dw, eps=1e-6, engine=e))]
    for g, wt in zip(got, want):
        np.testing.assert_array_equal(g, wt)
    # pre(norm=, eps=) on the new streams: the site kernel without the expansion at one row.
    for g, wt in zip(gpu.pre(new, norm=dw, eps=1e-6), want[1:]):
        np.testing.assert_array_equal(e.to_host(g), wt)
    cst, cpost, ccomb, cout = cpu.post_pre(y, post_prev, comb_prev, streams, norm=w, eps=1e-6)
    np.testing.assert_array_equal(got[0], cst)  # mhc_post is bit-identical to the CPU
    atol = 1e-5 if fn_dtype == "float32" else 1e-2
    close(got[1], cpost, dict(rtol=0, atol=atol))
    close(got[2], ccomb, dict(rtol=0, atol=atol))
    otol = 1e-4 if fn_dtype == "float32" else 3e-2
    close(got[3], cout, dict(rtol=0, atol=otol * max(1.0, float(np.abs(cout).max()))))


@pytest.mark.parametrize("T,hc,D", [(32, 4, 4096), (64, 4, 4096), (48, 2, 64), (5, 2, 64), (3, 1, 16)])
def test_hc_post_pre_fuses_the_expansion_at_decode_rows(e, tmp_path, T, hc, D):
    # At decode rows (B = 32 and 64 of GLM's geometry; hc 2 and 1) the site is two launches: the
    # split pass that expands the streams (mhc_partial_kernel<W, POST_HC = hc>), then the
    # finishing kernel with the norm; no mhc_post launch of its own.
    streams, fw, base, scale = mhc_inputs(T, hc, D, seed=31)
    gpu, _ = hc_layer(e, fw, base, scale, hc, D)
    r = rng(T)
    args = [e.to_device(f32(a)) for a in (r.standard_normal((T, D)),
                                         r.uniform(0.1, 2.0, (T, hc)),
                                         r.uniform(0.0, 0.5, (T, hc, hc)), streams)]
    names = kernel_names(lambda: (gpu.post_pre(*args, norm=None, eps=1e-6), e.synchronize()),
                         tmp_path / "trace.json")
    assert len(names) == 2, names
    assert f"mhc_partial_kernel<float, {hc}>" in names[0], names
    assert "mhc_finish_norm_kernel" in names[1], names


@pytest.mark.parametrize("T,D,n", [(1, 4096, 4), (3, 33, 4), (2, 7, 1), (70000, 3, 2)])
def test_hc_expand_matches_cpu(e, T, D, n):
    # One kernel (cuda/mhc_post.cu hc_expand_kernel; T past 65535 rows strides the grid).
    x = f32(rng(T + D).standard_normal((T, D)))
    got = e.to_host(_core.hc_expand(e.to_device(x), n, engine=e))
    np.testing.assert_array_equal(got, _core.hc_expand(x, n))


def test_hc_post_pre_repeated_and_interleaved(e):
    # The site kernel's arrival counter must be back at 0 after every launch: alternate two
    # widths (128 and 2 splits) and a captured-graph-free loop, and compare every result with the
    # first of its width.
    cases = []
    for D in (4096, 4, 2048):
        streams, fw, base, scale = mhc_inputs(1, 4, D, seed=D)
        gpu, _ = hc_layer(e, fw, base, scale, 4, D)
        r = rng(D)
        args = [e.to_device(f32(a)) for a in (r.standard_normal((1, D)), r.uniform(0.1, 2, (1, 4)),
                                              r.uniform(0, 0.5, (1, 4, 4)), streams)]
        cases.append((gpu, args, e.to_device(f32(r.standard_normal(D)))))
    first = {}
    for rep in range(4):
        for i, (gpu, args, w) in enumerate(cases):
            got = [e.to_host(a) for a in gpu.post_pre(*args, norm=w, eps=1e-6)]
            got += [e.to_host(a) for a in gpu.pre(args[3], norm=w, eps=1e-6)]
            if rep == 0:
                first[i] = got
            for g, f in zip(got, first[i]):
                np.testing.assert_array_equal(g, f)


def test_hc_post_pre_contract(e):
    streams, fw, base, scale = mhc_inputs(1, 4, 64, seed=93)
    gpu, _ = hc_layer(e, fw, base, scale, 4, 64)
    y, p, c = f32(np.ones((1, 64))), f32(np.ones((1, 4))), f32(np.ones((1, 4, 4)))
    dy, dp, dc, ds = (e.to_device(a) for a in (y, p, c, streams))
    for bad in (-1.0, float("inf"), float("nan")):
        expect(memra.ContractError, ST.CONTRACT_VALUE, gpu.post_pre, dy, dp, dc, ds, eps=bad)
    expect(memra.ContractError, ST.CONTRACT_SHAPE, gpu.post_pre, e.to_device(f32(np.ones((2, 64)))),
           dp, dc, ds, eps=1e-6)
    expect(memra.ContractError, ST.CONTRACT_SHAPE, gpu.post_pre, dy, dp, e.to_device(f32(np.ones((1, 4, 3)))),
           ds, eps=1e-6)
    expect(memra.ContractError, ST.CONTRACT_DEVICE, gpu.post_pre, y, dp, dc, ds, eps=1e-6)
    expect(memra.ContractError, ST.CONTRACT_SHAPE, gpu.post_pre, dy, dp, dc, ds,
           norm=e.to_device(f32(np.ones(63))), eps=1e-6)
    # Nothing changed: the call still works and matches the separate kernels.
    got = gpu.post_pre(dy, dp, dc, ds, eps=1e-6)
    np.testing.assert_array_equal(e.to_host(got[0]), e.to_host(_core.mhc_post(dy, dp, dc, ds, engine=e)))


def test_mhc_pre_norm_contract(e):
    streams, fw, base, scale = mhc_inputs(1, 4, 64, seed=92)
    ds, dfw, db, dsc = e.to_device(streams), dev_weight(e, fw), e.to_device(base), e.to_device(scale)
    kw = dict(sinkhorn_iters=20, hc_eps=1e-6, norm_eps=1e-6)
    w = e.to_device(f32(np.ones(64)))
    for bad in (-1.0, float("inf"), float("nan")):
        expect(memra.ContractError, ST.CONTRACT_VALUE, _core.mhc_pre, ds, dfw, db, dsc, engine=e,
               rms_weight=w, rms_eps=bad, **kw)
    expect(memra.ContractError, ST.CONTRACT_VALUE, _core.mhc_pre, ds, dfw, db, dsc, engine=e,
           rms_weight=w, **kw)
    expect(memra.ContractError, ST.CONTRACT_SHAPE, _core.mhc_pre, ds, dfw, db, dsc, engine=e,
           rms_weight=e.to_device(f32(np.ones(63))), rms_eps=1e-6, **kw)
    expect(memra.ContractError, ST.CONTRACT_DEVICE, _core.mhc_pre, ds, dfw, db, dsc, engine=e,
           rms_weight=f32(np.ones(64)), rms_eps=1e-6, **kw)


def test_mhc_pre_contract(e):
    streams, fw, base, scale = mhc_inputs(2, 4, 3, seed=90)
    ds, dfw, db, dsc = e.to_device(streams), dev_weight(e, fw), e.to_device(base), e.to_device(scale)
    kw = dict(sinkhorn_iters=20, hc_eps=1e-6, norm_eps=1e-6)
    expect(memra.ContractError, ST.CONTRACT_VALUE, _core.mhc_pre, ds, dfw, db, dsc, engine=e,
           **{**kw, "sinkhorn_iters": 0})
    expect(memra.ContractError, ST.CONTRACT_SHAPE, _core.mhc_pre, ds, dfw, e.to_device(base[:-1].copy()),
           dsc, engine=e, **kw)
    expect(memra.ContractError, ST.CONTRACT_DEVICE, _core.mhc_pre, ds, fw, db, dsc, engine=e, **kw)
    expect(memra.ContractError, ST.CONTRACT_DEVICE, _core.mhc_pre, streams, dfw, db, dsc, engine=e, **kw)
    # hc = 65 streams: comb does not fit the kernel's shared-memory layout.
    s65, f65, b65, sc65 = mhc_inputs(1, 65, 1, seed=91)
    expect(memra.UnsupportedError, ST.UNSUPPORTED_GEOMETRY, _core.mhc_pre, e.to_device(s65),
           dev_weight(e, f65), e.to_device(b65), e.to_device(sc65), engine=e, **kw)
    np.testing.assert_array_equal(e.to_host(ds), streams)


@pytest.mark.parametrize("T,hc,D", [(1, 4, 33), (65, 4, 200), (3, 1, 7), (200, 4, 4096), (2, 3, 1),
                                    (32, 4, 4096), (1, 4, 8)])
def test_mhc_post_and_head_mean_are_bit_identical(e, T, hc, D):
    r = rng(T + hc + D)
    y, post = f32(r.standard_normal((T, D))), f32(r.standard_normal((T, hc)))
    comb, res = f32(r.standard_normal((T, hc, hc))), f32(r.standard_normal((T, hc, D)))
    got = e.to_host(_core.mhc_post(e.to_device(y), e.to_device(post), e.to_device(comb), e.to_device(res),
                                   engine=e))
    np.testing.assert_array_equal(got, _core.mhc_post(y, post, comb, res))
    got = e.to_host(_core.hc_head_mean(e.to_device(res), engine=e))
    np.testing.assert_array_equal(got, _core.hc_head_mean(res))


@pytest.mark.parametrize("T,hc,D,weighted", [(1, 4, 4096, True), (1, 4, 33, False), (3, 1, 7, True),
                                              (65, 4, 200, True), (2, 9, 64, True), (1, 4, 5000, True)])
def test_mhc_post_head_norm_is_the_three_ops(e, T, hc, D, weighted):
    # The model's head in one launch (hc <= 8, D <= 4096; hc = 9 and D = 5000 take the three
    # launches): the bytes of mhc_post, hc_head_mean and rms_norm on the GPU, and close to the
    # CPU (the norm's sum order differs).
    r = rng(T * 7 + hc + D)
    y, post = f32(r.standard_normal((T, D))), f32(r.standard_normal((T, hc)))
    comb, res = f32(r.standard_normal((T, hc, hc))), f32(r.standard_normal((T, hc, D)))
    w = f32(1.0 + 0.1 * r.standard_normal(D)) if weighted else None
    dev = [e.to_device(a) for a in (y, post, comb, res)]
    dw = e.to_device(w) if weighted else None
    got = e.to_host(_core.mhc_post_head_norm(*dev, dw, eps=1e-5, engine=e))
    three = _core.rms_norm(_core.hc_head_mean(_core.mhc_post(*dev, engine=e), engine=e), dw,
                           eps=1e-5, engine=e)
    np.testing.assert_array_equal(got, e.to_host(three))
    want = _core.mhc_post_head_norm(y, post, comb, res, w, eps=1e-5)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * float(np.abs(want).max()))
    expect(memra.ContractError, ST.CONTRACT_VALUE, _core.mhc_post_head_norm, *dev, dw, eps=-1.0,
           engine=e)
    expect(memra.ContractError, ST.CONTRACT_SHAPE, _core.mhc_post_head_norm, dev[0],
           e.to_device(f32(np.zeros((T, hc + 1)))), *dev[2:], dw, eps=1e-5, engine=e)
    expect(memra.ContractError, ST.CONTRACT_DEVICE, _core.mhc_post_head_norm, y, *dev[1:], dw,
           eps=1e-5, engine=e)


def test_mhc_post_contract(e):
    r = rng(95)
    T, hc, D = 2, 4, 3
    y, post = f32(r.standard_normal((T, D))), f32(r.standard_normal((T, hc)))
    comb, res = f32(r.standard_normal((T, hc, hc))), f32(r.standard_normal((T, hc, D)))
    dy, dp, dc, dr = (e.to_device(a) for a in (y, post, comb, res))
    expect(memra.ContractError, ST.CONTRACT_SHAPE, _core.mhc_post, dy, dp, e.to_device(comb[:, :3].copy()),
           dr, engine=e)
    expect(memra.ContractError, ST.CONTRACT_DEVICE, _core.mhc_post, dy, post, dc, dr, engine=e)
    expect(memra.ContractError, ST.CONTRACT_SHAPE, _core.hc_head_mean, dy, engine=e)
    expect(memra.ContractError, ST.CONTRACT_DEVICE, _core.hc_head_mean, res, engine=e)


# ---------------------------------------------------------------- sanitizer


def test_sanitizer_small_shapes(e):
    """One call of every mHC form on small odd shapes (for compute-sanitizer runs)."""
    r = rng(99)
    T = 3
    streams, fw, base, scale = mhc_inputs(T, 4, 5, seed=98)
    post, comb, col = _core.mhc_pre(e.to_device(streams), dev_weight(e, fw), e.to_device(base),
                                    e.to_device(scale), sinkhorn_iters=3, hc_eps=1e-6, norm_eps=1e-6,
                                    engine=e)
    _core.mhc_post(col, post, comb, e.to_device(streams), engine=e)
    _core.hc_head_mean(e.to_device(streams), engine=e)
    # mhc_pre's split path with two collapse blocks and the block Sinkhorn (hc = 6), a warp's
    # second row (T > 32), and the GEMM + mapping path (T > 64).
    for t, hc, dd in ((2, 4, 300), (1, 6, 70), (40, 4, 8), (66, 4, 8)):
        s2, f2, b2, c2 = mhc_inputs(t, hc, dd, seed=97)
        _core.mhc_pre(e.to_device(s2), dev_weight(e, f2), e.to_device(b2), e.to_device(c2),
                      sinkhorn_iters=3, hc_eps=1e-6, norm_eps=1e-6, engine=e)
        # ... with the input norm fused (mhc_finish_norm_kernel<G>), weighted and not.
        for rw in (e.to_device(f32(r.standard_normal(dd))), None):
            _core.mhc_pre(e.to_device(s2), dev_weight(e, f2), e.to_device(b2), e.to_device(c2),
                          sinkhorn_iters=3, hc_eps=1e-6, norm_eps=1e-6, rms_weight=rw, rms_eps=1e-6,
                          engine=e)
    # The single-launch site (hc = 4, one row): the widest norm group, a one-warp group, bf16 fn.
    for dd, fdt in ((4096, "float32"), (4, "float32"), (200, "bfloat16")):
        s2, f2, b2, c2 = mhc_inputs(1, 4, dd, seed=96, fn_dtype=fdt)
        gpu, _ = hc_layer(e, f2, b2, c2, 4, dd, dtype=fdt)
        ds2 = e.to_device(s2)
        rw = e.to_device(f32(r.standard_normal(dd)))
        gpu.pre(ds2, norm=rw, eps=1e-6)
        gpu.post_pre(e.to_device(f32(r.standard_normal((1, dd)))), e.to_device(f32(np.ones((1, 4)))),
                     e.to_device(f32(np.full((1, 4, 4), 0.25))), ds2, norm=None, eps=1e-6)
    e.synchronize()
