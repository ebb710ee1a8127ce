"""Shared helpers for memra's benchmarks (DESIGN.md, Conventions: CUDA events after warm-up,
medians, the peer's figure from the same run beside ours).

- ``Bench`` owns the device, the memra Engine and the timers:
  ``time_torch(fn)`` records CUDA events on torch's current stream around ``fn``;
  ``time_memra(fn)`` records them on memra's stream (``Engine.cuda_stream`` wrapped in
  ``torch.cuda.ExternalStream``), where memra enqueues all of its work.
  Both warm up, synchronise the device, then time ``reps`` calls, one event pair per call, and
  return the median in microseconds. One call per event pair includes the host's launch cost
  whenever it exceeds the GPU's work (small shapes): that is what a decode step pays.
- ``copy_TBps``: a measured device-to-device copy bandwidth (torch, 2 GiB; bytes read + written
  / time), the yardstick for ``frac_of_copy``.
- ``kernel_us(fn)``: the GPU kernels alone (torch.profiler, CUDA activity): per call the sum of
  the durations of the kernels it launched, median over calls; no host overhead, which is what a
  call costs inside a CUDA graph (at small shapes the event timers above measure the host).
- ``emit(...)``: one JSON object per measured shape on stdout (progress goes to stderr).
- ``kernel_option_fields(text)``: "field=value,..." as typed memra.KernelOptions fields (the
  benchmarks' way to pick kernel arms; docs/options.md).

``--device cpu`` is a smoke test of the wiring (CPU engine, tiny shapes, wall-clock timing, no
peer): it checks signatures and the numerics of the comparison on a machine without a GPU.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import tempfile
import time


def kernel_option_fields(text: str) -> dict:
    """'FIELD=VALUE,FIELD=VALUE' -> {field: value} typed as memra.KernelOptions' defaults (a
    switch takes 0 / 1 / true / false, the rest an int); KernelOptions checks names and values
    (a ContractError naming the field). '' -> {}."""
    import memra

    defaults = memra.KernelOptions().to_dict()
    fields = {}
    for kv in filter(None, text.split(",")):
        field, _, value = kv.partition("=")
        if isinstance(defaults.get(field), bool):
            if value.lower() not in ("0", "1", "false", "true"):
                raise SystemExit(f"kernel option {field} takes 0 / 1 / true / false, got {value!r}")
            fields[field] = value.lower() in ("1", "true")
        else:
            try:
                fields[field] = int(value)
            except ValueError:
                raise SystemExit(f"kernel option {field} takes an int, got {value!r}") from None
    memra.KernelOptions(**fields)
    return fields


BENCH_MODEL_FOLDER = "/tmp/memra-bench-glm5next-8L32E"  # bench_model_decode.py --quick builds it


def step_driver_setup(argv: list, max_len: int, device: str = "cuda"):
    """The decode-step drivers' shared start (ncu_model_step.py, trace_model_step.py): argv =
    [folder] [--batch B] -> (model, slots, toks, seeds) after a 128-token prompt a row was
    prefilled (as bench_model_decode's rows) and four steps ran (eager, capture, replays), so the
    next step is a graph replay. device "cpu" (float32) is the wiring's smoke test."""
    import numpy as np

    import memra

    args = list(argv)
    B = 1
    if "--batch" in args:
        i = args.index("--batch")
        B = int(args[i + 1])
        del args[i:i + 2]
    folder = args[0] if args else BENCH_MODEL_FOLDER
    m = memra.load(folder, device=device, dtype="bfloat16" if device == "cuda" else "float32",
                   max_batch=B, max_len=max_len, progress=False)
    rng = np.random.default_rng(0)
    slots = list(range(B))
    toks = []
    for s in slots:
        prompt = rng.integers(0, min(1000, m.config.vocab_size), 128).astype(np.int64).tolist()
        toks.append(int(np.argmax(m.prefill(m.cache, s, prompt))))
    seeds = list(range(B))
    for i in range(4):
        toks = m._decode_sampled(slots, toks, 0.0, None, None, seeds, i + 1)
    m.engine.synchronize()
    return m, slots, toks, seeds


def base_parser(description: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--quick", action="store_true",
                   help="short run: 3 warm-up calls and 20 timed calls per measurement "
                        "(default 10 / 100)")
    p.add_argument("--warmup", type=int, default=None, help="warm-up calls (overrides --quick)")
    p.add_argument("--reps", type=int, default=None, help="timed calls (overrides --quick)")
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda",
                   help="cpu: smoke test of the wiring on tiny shapes (wall clock, no peer)")
    p.add_argument("--device-index", type=int, default=0)
    p.add_argument("--copy-gib", type=float, default=None,
                   help="size of the copy that measures the bandwidth yardstick (default 2)")
    return p


def log(*a) -> None:
    print(*a, file=sys.stderr, flush=True)


def _finite(x):
    """JSON has no NaN/inf: keep them visible as strings."""
    if isinstance(x, float) and not math.isfinite(x):
        return repr(x)
    return x


def rel_err(a, b) -> float:
    """max |a - b| / max |b| (both torch tensors, compared in float64 on a's device)."""
    a = a.double().reshape(-1)
    b = b.double().reshape(-1).to(a.device)
    den = b.abs().max().item()
    num = (a - b).abs().max().item()
    r = num / den if den > 0 else num
    return r if math.isfinite(r) else math.inf  # a NaN must not vanish inside max()


def to_torch(x, engine=None, device=None):
    """A memra result (DLPack CUDA DeviceArray, or a host array for the CPU engine) as a torch
    tensor, zero-copy. DeviceArray.__dlpack__ waits for memra's stream when torch names one;
    should DLPack fail, a copy through engine.to_host (CUDA) or numpy (host)."""
    import numpy as np
    import torch
    if isinstance(x, torch.Tensor):
        return x
    try:
        return torch.from_dlpack(x)
    except Exception as e:  # noqa: BLE001
        if engine is not None and engine.is_cuda:
            log(f"to_torch: DLPack import failed ({type(e).__name__}: {e}); copying via to_host")
            return torch.from_numpy(np.asarray(engine.to_host(x))).to(device)
        return torch.from_numpy(np.asarray(x))


class Bench:
    def __init__(self, args: argparse.Namespace, bench: str, kernel_options=None):
        import torch
        import memra

        self.torch = torch
        self.bench = bench
        self.cuda = args.device == "cuda"
        self.warmup = args.warmup if args.warmup is not None else (3 if args.quick else 10)
        self.reps = args.reps if args.reps is not None else (20 if args.quick else 100)
        torch.set_grad_enabled(False)
        self.memra_stream = None
        self.memra_timer = "cpu-wall"
        if self.cuda:
            if not torch.cuda.is_available():
                raise SystemExit(f"{bench}: torch sees no CUDA device (use --device cpu for a smoke test)")
            if not memra.cuda_available():
                raise SystemExit(f"{bench}: memra has no CUDA here: {memra.cuda_unavailable_reason()}")
            torch.cuda.set_device(args.device_index)
            self.dev = torch.device("cuda", args.device_index)
            self.device_name = torch.cuda.get_device_name(self.dev)
            self.engine = memra.Engine("cuda", args.device_index, options=kernel_options)
            sp = getattr(self.engine, "cuda_stream", None)
            if sp:
                self.memra_stream = torch.cuda.ExternalStream(sp, device=self.dev)
                self.memra_timer = "cuda-events"
            else:  # a build older than Engine.cuda_stream: wall clock around a synchronised call
                self.memra_timer = "wall+sync (memra build lacks Engine.cuda_stream)"
                log(f"{bench}: WARNING memra.Engine has no cuda_stream; memra timed by wall clock")
            # f32 references must not run in TF32.
            torch.set_float32_matmul_precision("highest")
            torch.backends.cuda.matmul.allow_tf32 = False
            torch.backends.cudnn.allow_tf32 = False
        else:
            self.dev = torch.device("cpu")
            self.device_name = "cpu (smoke test)"
            self.engine = memra.Engine("cpu", options=kernel_options)
        gib = args.copy_gib if args.copy_gib is not None else 2.0
        if not self.cuda:
            gib = min(gib, 1 / 16)
        self.copy_TBps = self.measure_copy(gib)
        log(f"{bench}: {self.device_name}, copy {gib:g} GiB: {self.copy_TBps:.3f} TB/s; "
            f"warmup {self.warmup}, reps {self.reps}, memra timer {self.memra_timer}")

    def use_engine(self, engine) -> None:
        """Run, synchronise and time memra's work on `engine` from here on (e.g. an Engine made
        with other memra.KernelOptions: it has its own stream)."""
        self.engine = engine
        if self.cuda:
            sp = getattr(engine, "cuda_stream", None)
            self.memra_stream = self.torch.cuda.ExternalStream(sp, device=self.dev) if sp else None

    # -------------------------------------------------------------------------------- timing
    def sync(self) -> None:
        if self.cuda:
            self.torch.cuda.synchronize(self.dev)  # waits for every stream of the device
            self.engine.synchronize()

    def _events(self, fn, stream) -> float:
        torch = self.torch
        self.sync()  # inputs made on torch's stream are complete before memra reads them
        for _ in range(self.warmup):
            fn()
        self.sync()
        ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
              for _ in range(self.reps)]
        for s, e in ev:
            s.record(stream)
            fn()
            e.record(stream)
        self.sync()
        return statistics.median(s.elapsed_time(e) * 1e3 for s, e in ev)

    def _wall(self, fn) -> float:
        self.sync()
        for _ in range(self.warmup):
            fn()
        self.sync()
        ts = []
        for _ in range(self.reps):
            t0 = time.perf_counter()
            fn()
            self.sync()
            ts.append((time.perf_counter() - t0) * 1e6)
        return statistics.median(ts)

    def time_torch(self, fn) -> float:
        """Median microseconds per call of torch (or Triton) work on torch's current stream."""
        if not self.cuda:
            return self._wall(fn)
        return self._events(fn, self.torch.cuda.current_stream(self.dev))

    def time_memra(self, fn) -> float:
        """Median microseconds per call of memra work on memra's stream."""
        if not self.cuda or self.memra_stream is None:
            return self._wall(fn)
        return self._events(fn, self.memra_stream)

    def kernel_us(self, fn, reps: int | None = None):
        """Median over `reps` calls of fn of the summed durations of the CUDA kernels each call
        launched (torch.profiler with CUDA activity; copies and memsets are not kernels), in
        microseconds; None on the CPU or when the profiler records no kernels. Every call must
        launch the same number of kernels (true of the benchmarked ops); otherwise the mean."""
        if not self.cuda:
            return None
        n = reps if reps is not None else self.reps
        durs = kernel_durations(self._profile(fn, n))
        if not durs:
            return None
        per_call, rem = divmod(len(durs), n)
        if per_call == 0 or rem:
            log(f"{self.bench}: {len(durs)} kernels over {n} calls; reporting the mean per call")
            return sum(durs) / n
        return statistics.median(sum(durs[i * per_call:(i + 1) * per_call]) for i in range(n))

    def kernel_us_by_name(self, fn, reps: int | None = None):
        """{kernel name: median duration in us} over `reps` calls of fn (torch.profiler, as
        kernel_us); names shortened to the template-id (namespace and parameters dropped, 60
        characters). None on the CPU."""
        if not self.cuda:
            return None
        by = {}
        n = reps if reps is not None else self.reps
        for name, dur in kernel_durations(self._profile(fn, n), names=True):
            name = name.replace("(anonymous namespace)::", "").replace("<unnamed>::", "")
            by.setdefault(name.split("(")[0].removeprefix("void ")[:60], []).append(dur)
        return {k: statistics.median(v) for k, v in by.items()}

    def _profile(self, fn, n: int):
        """The torch.profiler record (CUDA activity) of n calls of fn after the warm-up calls,
        the device synchronised before and after."""
        from torch.profiler import ProfilerActivity, profile
        self.sync()
        for _ in range(self.warmup):
            fn()
        self.sync()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(n):
                fn()
            self.sync()
        return prof

    def measure_copy(self, gib: float) -> float:
        """Device-to-device copy bandwidth in TB/s (bytes read + written / median time)."""
        torch = self.torch
        n = int(gib * 2**30)
        src = torch.ones(n, dtype=torch.uint8, device=self.dev)
        dst = torch.empty_like(src)
        us = self.time_torch(lambda: dst.copy_(src))
        del src, dst
        if self.cuda:
            torch.cuda.empty_cache()
        return 2 * n / us / 1e6

    def release(self) -> None:
        """Between shapes: finish all work, return torch's cached blocks."""
        self.sync()
        if self.cuda:
            self.torch.cuda.empty_cache()

    # ---------------------------------------------------------------------------- reporting
    def emit(self, shape: dict, memra_us, peer: str, peer_us, nbytes: int, **extra) -> dict:
        memra_TBps = nbytes / memra_us / 1e6 if memra_us else None
        rec = {
            "bench": self.bench,
            "shape": shape,
            "memra_us": round(memra_us, 3) if memra_us else memra_us,
            "peer": peer,
            "peer_us": round(peer_us, 3) if peer_us else peer_us,
            "ratio": round(peer_us / memra_us, 4) if (peer_us and memra_us) else None,
            "bytes": int(nbytes),
            "memra_TBps": round(memra_TBps, 4) if memra_TBps else None,
            "peer_TBps": round(nbytes / peer_us / 1e6, 4) if peer_us else None,
            "frac_of_copy": round(memra_TBps / self.copy_TBps, 4) if memra_TBps else None,
            "copy_TBps": round(self.copy_TBps, 4),
            "device": self.device_name,
            "warmup": self.warmup,
            "reps": self.reps,
            "memra_timer": self.memra_timer,
        }
        for k, v in extra.items():
            rec[k] = _finite(v)
        print(json.dumps(rec), flush=True)
        return rec


def _finite_deep(x):
    """_finite through dicts and lists (nested records)."""
    if isinstance(x, dict):
        return {k: _finite_deep(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_finite_deep(v) for v in x]
    return _finite(x)


def emit_record(rec: dict) -> dict:
    """Print one JSON object (a whole record made by the caller, e.g. a whole-model figure that does
    not fit Bench.emit's per-op fields) on stdout; NaN/inf anywhere in it become strings."""
    rec = _finite_deep(rec)
    print(json.dumps(rec), flush=True)
    return rec


def trace_events(prof) -> list:
    """The events of a finished torch.profiler run, read from its Chrome trace (stable across
    torch versions, unlike the profiler's Python event objects)."""
    fd, path = tempfile.mkstemp(suffix=".json")
    os.close(fd)
    try:
        prof.export_chrome_trace(path)
        with open(path) as f:
            events = json.load(f)
    finally:
        os.unlink(path)
    if isinstance(events, dict):
        events = events.get("traceEvents", [])
    return events


def gemm_tflops(b) -> float:
    """torch's dense GEMM rate in TFLOP/s on b's device: bf16 8192^3 on CUDA (the tensor-core
    yardstick of the prefill benches' rooflines), f32 256^3 on the CPU (a smoke figure)."""
    torch = b.torch
    n = 8192 if b.cuda else 256
    x = torch.randn(n, n, device=b.dev, dtype=torch.bfloat16 if b.cuda else torch.float32)
    y = torch.randn_like(x)
    us = b.time_torch(lambda: x @ y)
    return 2 * n ** 3 / us / 1e6


def kernel_durations(prof, names: bool = False) -> list:
    """Durations (us) of the GPU kernels a finished torch.profiler run recorded, in start order,
    read from its Chrome trace (stable across torch versions: events of category 'kernel');
    names=True: (name, duration) pairs."""
    ks = [e for e in trace_events(prof)
          if isinstance(e, dict) and str(e.get("cat", "")).lower() == "kernel" and "dur" in e]
    ks.sort(key=lambda e: float(e.get("ts", 0.0)))
    if names:
        return [(str(e.get("name", "?")), float(e["dur"])) for e in ks]
    return [float(e["dur"]) for e in ks]
