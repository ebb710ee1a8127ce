#!/usr/bin/env python3
"""One mHC site at a batch-1 decode row: memra's single launch against its separate kernels and a
torch peer.

memra: HyperConnection.post_pre(y [1, D], post [1, hc], comb [1, hc, hc], streams [1, hc, D],
       norm=w, eps=) (cuda/mhc_site.cu mhc_site_kernel: the previous site's expansion, the split-K
       logits, and in the block that finishes last the mapping, the collapse + RMSNorm and the
       Sinkhorn). memra_kernel_us: the kernels of one call (common.Bench.kernel_us, what a CUDA
       graph step pays). separate_kernel_us: the same site as the unfused ops through their own
       bindings on the same engine (mhc_post, HyperConnection.pre without a norm: mhc_partial +
       mhc_finish, then rms_norm; bytes_identical_to_separate compares them). sinkhorn1_kernel_us:
       the single
       launch with one Sinkhorn iteration instead of hc_sinkhorn_iters (20), which bounds what the
       Sinkhorn's dependent chain costs inside the launch.
peer:  torch (f32): post * y + comb^T @ streams, then the reference mapping (RMS-scaled logits,
       sigmoids, softmax, 20 Sinkhorn rounds, collapse, RMSNorm) as eager ops; time per call with
       CUDA events (launch-bound, as eager torch is at this size).
GLM-5.3-Flash geometry: hc = 4 streams of D = 4096, f32 fn [24, 16384].

Batched decode rows (T = 2 .. 64, one record each of --rows): HyperConnection.pre(streams [T, hc,
D], norm=w, eps=) (cuda/mhc_pre.cu: mhc_partial_kernel's split-K partials of every row, then
mhc_finish_norm_kernel), timed on an Engine made with KernelOptions(pdl=False) so that each
kernel's profiled duration is its own (`kernels_us`: the median duration of each kernel by name);
the peer is the same mapping in torch f32 without the expansion.

    python3 benchmarks/bench_mhc_site.py [--quick] [--rows 8,32]
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from common import Bench, base_parser, log, rel_err, to_torch  # noqa: E402

HC, D, ITERS, EPS = 4, 4096, 20, 1e-6
PEER = "torch eager f32 (mhc_post + mapping + Sinkhorn + collapse + RMSNorm)"


def main() -> int:
    p = base_parser(__doc__.split("\n\n")[0])
    p.add_argument("--rows", default="32", help="batched decode rows, comma-separated ('' = none)")
    args = p.parse_args()
    b = Bench(args, "mhc_site")
    if not b.cuda:
        log("mhc_site: CUDA only (the single launch is a CUDA path)")
        return 0
    torch = b.torch
    import numpy as np

    from memra import _core

    mix = (2 + HC) * HC
    rng = np.random.default_rng(0)
    fn = (rng.standard_normal((mix, HC * D)) / np.sqrt(HC * D)).astype(np.float32)
    base = (rng.standard_normal(mix) * 0.5).astype(np.float32)
    scale = np.array([0.7, 1.3, 0.5], np.float32)
    w = rng.standard_normal(D).astype(np.float32)
    streams = (rng.standard_normal((1, HC, D)) * 3).astype(np.float32)
    y = rng.standard_normal((1, D)).astype(np.float32)
    post = rng.uniform(0.1, 2.0, (1, HC)).astype(np.float32)
    comb = rng.uniform(0.0, 0.5, (1, HC, HC)).astype(np.float32)
    weights = {"fn": _core.Weight(fn), "base": _core.Weight(base), "scale": _core.Weight(scale)}

    def layer(engine, iters):
        return _core.HyperConnection(engine, weights, hidden=D, hc_mult=HC, sinkhorn_iters=iters,
                                     hc_eps=EPS, norm_eps=1e-6, dtype="float32")

    def runner(engine, iters):
        hc = layer(engine, iters)
        a = [engine.to_device(v) for v in (y, post, comb, streams, w)]
        return lambda: hc.post_pre(a[0], a[1], a[2], a[3], norm=a[4], eps=1e-6)

    def separate(engine):
        hc = layer(engine, ITERS)
        a = [engine.to_device(v) for v in (y, post, comb, streams, w)]

        def run():
            new = _core.mhc_post(a[0], a[1], a[2], a[3], engine=engine)
            pst, cmb, col = hc.pre(new)
            return new, pst, cmb, _core.rms_norm(col, a[4], eps=1e-6, engine=engine)
        return run

    e = b.engine
    fused, sep, fused1 = runner(e, ITERS), separate(e), runner(e, 1)
    got = [to_torch(t, e, b.dev) for t in fused()]
    want = [to_torch(t, e, b.dev) for t in sep()]
    identical = all(bool(torch.equal(g, h)) for g, h in zip(got, want))

    # The peer, in torch f32 on the same device.
    dev = b.dev
    tf, tb, ts = (torch.as_tensor(v, device=dev) for v in (fn, base, scale))
    tw, tst, ty, tp, tc = (torch.as_tensor(v, device=dev) for v in (w, streams, y, post, comb))

    def run_peer():
        new = tp[..., None] * ty[:, None, :] + torch.matmul(tc.transpose(1, 2), tst)
        return (new, *torch_pre_norm(torch, new, tf, tb, ts, tw))

    ref = run_peer()
    err = max(rel_err(g, r) for g, r in zip(got, ref))
    shape = {"T": 1, "hc": HC, "D": D, "sinkhorn_iters": ITERS, "fn_dtype": "float32"}
    memra_us = b.time_memra(fused)
    peer_us = b.time_torch(run_peer)
    extra = {
        "memra_kernel_us": b.kernel_us(fused),
        "separate_kernel_us": b.kernel_us(sep),
        "sinkhorn1_kernel_us": b.kernel_us(fused1),
        "bytes_identical_to_separate": identical,
        "max_rel_err_vs_peer": err,
        "note": "memra_us / peer_us: CUDA events per call (host launch included); *_kernel_us: "
                "device time of the kernels of one call",
    }
    nbytes = fn.nbytes + 3 * streams.nbytes + y.nbytes  # fn, residual read, new streams written + read
    b.emit(shape, memra_us, PEER, peer_us, nbytes, **extra)
    for T in [int(t) for t in filter(None, args.rows.split(","))]:
        batched_rows(b, args, layer, T, fn, base, scale, w)
    return 0


def torch_pre_norm(torch, streams, fn, base, scale, w):
    """The peer's mapping of streams [T, HC, D] (f32 tensors): the RMS-scaled logits (fn [mix,
    HC * D]), pre, post, the softmaxed comb through ITERS Sinkhorn rounds, the collapse and the
    RMSNorm with weight w [D] -> (post [T, HC], comb [T, HC, HC], out [T, D])."""
    T = streams.shape[0]
    flat = streams.reshape(T, -1)
    inv = torch.rsqrt(flat.pow(2).mean(-1, keepdim=True) + 1e-6)
    lg = (flat @ fn.T) * inv
    pre = torch.sigmoid(lg[:, :HC] * scale[0] + base[:HC]) + EPS
    pst = 2 * torch.sigmoid(lg[:, HC:2 * HC] * scale[1] + base[HC:2 * HC])
    c = torch.softmax((lg[:, 2 * HC:] * scale[2] + base[2 * HC:]).view(T, HC, HC), -1) + EPS
    c = c / (c.sum(-2, keepdim=True) + EPS)
    for _ in range(ITERS - 1):
        c = c / (c.sum(-1, keepdim=True) + EPS)
        c = c / (c.sum(-2, keepdim=True) + EPS)
    h = (pre[..., None] * streams).sum(1)
    return pst, c, h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6) * w


def batched_rows(b, args, layer, T, fn, base, scale, w):
    """One record: pre with the fused norm at T decode rows (the split path), kernels alone."""
    import numpy as np

    import memra
    torch = b.torch
    streams = (np.random.default_rng(T).standard_normal((T, HC, D)) * 3).astype(np.float32)
    e = memra.Engine("cuda", args.device_index, options=memra.KernelOptions(pdl=False))
    b.use_engine(e)
    hc, hc1 = layer(e, ITERS), layer(e, 1)
    ds, dw = e.to_device(streams), e.to_device(w)

    def run():
        return hc.pre(ds, norm=dw, eps=1e-6)

    def run1():
        return hc1.pre(ds, norm=dw, eps=1e-6)

    r = np.random.default_rng(T + 1)
    site_in = [e.to_device(a.astype(np.float32)) for a in (
        r.standard_normal((T, D)), r.uniform(0.1, 2.0, (T, HC)), r.uniform(0.0, 0.5, (T, HC, HC)))]

    def run_site():  # the whole site: the previous sublayer's expansion, then pre + norm
        return hc.post_pre(site_in[0], site_in[1], site_in[2], ds, norm=dw, eps=1e-6)

    got = [to_torch(t, e, b.dev) for t in run()]
    dev = b.dev
    tf, tb, ts, tw, tst = (torch.as_tensor(v, device=dev) for v in (fn, base, scale, w, streams))

    def run_peer():
        return torch_pre_norm(torch, tst, tf, tb, ts, tw)

    err = max(rel_err(g, r) for g, r in zip(got, run_peer()))
    shape = {"T": T, "hc": HC, "D": D, "sinkhorn_iters": ITERS, "fn_dtype": "float32",
             "form": "pre+norm, batched rows"}
    b.emit(shape, b.time_memra(run), PEER, b.time_torch(run_peer),
           fn.nbytes + streams.nbytes + T * D * 4,
           memra_kernel_us=b.kernel_us(run), sinkhorn1_kernel_us=b.kernel_us(run1),
           kernels_us=b.kernel_us_by_name(run, reps=50), site_kernel_us=b.kernel_us(run_site),
           site_kernels_us=b.kernel_us_by_name(run_site, reps=50), max_rel_err_vs_peer=err,
           note="KernelOptions(pdl=False) engine: each kernel's duration is its own")


if __name__ == "__main__":
    sys.exit(main())
