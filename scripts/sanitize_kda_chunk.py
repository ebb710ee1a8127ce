"""Small launches of the chunked KDA scan (cuda/kda_chunk*.cu) for `compute-sanitizer --tool
racecheck` and `--tool memcheck`: T = 130 at 2 heads (a ragged third chunk) and T = 70 at 80
heads (more state blocks than SMs), with an entering state, each with f32 and with bf16 q / k /
v / g and a bf16 o (the bf16 instances' staging and stores). Prints each call's max relative
error against the CPU scan (TF32 operands: ~1e-3 is expected; bf16 o adds its rounding).
Run: compute-sanitizer --tool racecheck --error-exitcode 1 python3 scripts/sanitize_kda_chunk.py"""

import ml_dtypes
import numpy as np

import memra
from memra import _core

e = memra.Engine("cuda")
rng = np.random.default_rng(0)


def f32(x):
    return np.ascontiguousarray(x, dtype=np.float32)


def unit(shape):
    x = f32(rng.standard_normal(shape))
    return f32(x / np.linalg.norm(x, axis=-1, keepdims=True))


for T, H in ((130, 2), (70, 80)):
    q, k = unit((T, H, 128)), unit((T, H, 128))
    v = f32(rng.standard_normal((T, H, 128)))
    g = f32(-0.1 * np.abs(rng.standard_normal((T, H, 128))))
    beta = f32(rng.uniform(0, 1, (T, H)))
    state = f32(0.1 * rng.standard_normal((H, 128, 128)))
    q, k, v, g = (f32(x.astype(ml_dtypes.bfloat16)) for x in (q, k, v, g))
    co, cs = _core.kda_scan(q, k, v, g, beta, state)
    for bf16 in (False, True):
        ins = [x.astype(ml_dtypes.bfloat16) if bf16 else x for x in (q, k, v, g)]
        dev = [e.to_device(a) for a in (*ins, beta, state)]
        o, s = _core.kda_scan(*dev, engine=e, chunked=True,
                              o_dtype="bfloat16" if bf16 else "float32")
        o = np.asarray(e.to_host(o), np.float32)
        err = max(float(np.abs(o - co).max() / np.abs(co).max()),
                  float(np.abs(e.to_host(s) - cs).max() / np.abs(cs).max()))
        print(f"T={T} H={H} bf16={bf16}: max rel err {err:.2e}")
