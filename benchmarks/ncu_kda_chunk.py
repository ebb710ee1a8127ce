"""Driver for ncu and a per-kernel breakdown of the chunked delta-rule prefill (cuda/kda_chunk*.cu):
KDA at 64 heads x 128, B = 1, T = 8192, and GDN at 16 key / 32 value heads, B = 1, T = 8192, three
calls each (KDA's q / k / v / g f32 as bench_kda_prefill.py gives them, --bf16-in: bf16; KDA's o
bf16 with --bf16-o). With --profile it also prints, per
kernel name, the median duration per call from torch.profiler (no ncu needed).

    ncu --clock-control none -k regex:chunk_ -c 12 --section SpeedOfLight --section Occupancy \\
        --section LaunchStats python3 benchmarks/ncu_kda_chunk.py
    python3 benchmarks/ncu_kda_chunk.py --profile [--nopdl] [--bf16-in] [--bf16-o] [--T 1024]

--nopdl runs on an Engine made with KernelOptions(pdl=False): each profiled duration is then the
kernel alone (a programmatic dependent's duration includes its wait for the kernel in front), and
the call's wall time is printed too (CUDA events around each call, median).
"""
import argparse
import collections
import statistics

import torch

import memra
from memra import _core

p = argparse.ArgumentParser()
p.add_argument("--profile", action="store_true")
p.add_argument("--T", type=int, default=8192)
p.add_argument("--nopdl", action="store_true")
p.add_argument("--bf16-in", action="store_true", help="KDA's q / k / v / g in bf16 (default f32)")
p.add_argument("--bf16-o", action="store_true", help="KDA's o in bf16 (default f32)")
args = p.parse_args()
e = memra.Engine("cuda", options=memra.KernelOptions(pdl=False) if args.nopdl else None)
F = torch.nn.functional
D = 128


def inputs(Hk, Hv, per_channel, T):
    r = lambda *s: torch.randn(*s, device="cuda")  # noqa: E731
    q = F.normalize(r(1, T, Hk, D), dim=-1)
    k = F.normalize(r(1, T, Hk, D), dim=-1)
    v = r(1, T, Hv, D)
    g = F.logsigmoid(r(1, T, Hv, D) + 2.0) if per_channel else F.logsigmoid(r(1, T, Hv) + 2.0)
    return q, k, v, g, torch.sigmoid(r(1, T, Hv)), 0.1 * r(1, Hv, D, D)


kda_in = list(inputs(64, 64, True, args.T))
if args.bf16_in:
    kda_in[:4] = [x.to(torch.bfloat16) for x in kda_in[:4]]
cases = [("kda", _core.kda_scan, tuple(kda_in)),
         ("gdn", _core.gdn_scan, inputs(16, 32, False, args.T))]
for name, fn, x in cases:
    torch.cuda.synchronize()
    kw = {"o_dtype": "bfloat16"} if name == "kda" and args.bf16_o else {}
    call = lambda: fn(*x, scale=D ** -0.5, batch=True, chunked=True, engine=e, **kw)  # noqa: E731
    for _ in range(3):
        call()
    e.synchronize()
    if not args.profile:
        continue
    stream = torch.cuda.ExternalStream(e.cuda_stream)
    ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
          for _ in range(10)]
    for s0, s1 in ev:
        s0.record(stream)
        call()
        s1.record(stream)
    torch.cuda.synchronize()
    e.synchronize()
    call_us = statistics.median(a.elapsed_time(b) * 1e3 for a, b in ev)
    print(f"{name} T={args.T}: call {call_us:.1f} us (events, {'no PDL' if args.nopdl else 'PDL'})")
    from torch.profiler import ProfilerActivity, profile
    n = 10
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(n):
            call()
        e.synchronize()
    per = collections.defaultdict(list)
    for ev in prof.events():
        if ev.device_type == torch.autograd.DeviceType.CUDA:
            per[ev.name[:90]].append(ev.device_time_total if hasattr(ev, "device_time_total")
                                     else ev.cuda_time_total)
    for k, v in sorted(per.items(), key=lambda kv: -sum(kv[1])):
        print(f"{name} T={args.T}: {sum(v) / n:9.1f} us/call  x{len(v) // n}  {k}")
