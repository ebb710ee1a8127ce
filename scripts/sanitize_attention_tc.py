"""Small launches of the bf16 tensor-core prefill attention (cuda/attention_tc.cu) for
`compute-sanitizer --tool racecheck` and `--tool memcheck`: grouped heads, a causal diagonal that
straddles tiles, a prefix (pos0), padded head widths and the cp.async double buffer (T = 200).
Run: compute-sanitizer --tool racecheck --error-exitcode 1 python3 scripts/sanitize_attention_tc.py"""

import ml_dtypes
import numpy as np

import memra
from memra import _core

e = memra.Engine("cuda", options=memra.KernelOptions(attn_prefill_tensor_cores=True))
rng = np.random.default_rng(0)
d = e.to_device


def bf16_bits(x):
    """x rounded to bfloat16, as the raw uint16 bits memra takes (tests/cuda_helpers.bf16_bits)."""
    return np.ascontiguousarray(np.asarray(x, np.float32).astype(ml_dtypes.bfloat16)).view(np.uint16)


for T, pos0, Hq, Hkv, hd in [(65, 37, 4, 2, 256), (200, 0, 16, 2, 128), (7, 3, 8, 4, 96),
                             (33, 0, 3, 3, 40)]:
    L = pos0 + T
    kc = bf16_bits(rng.standard_normal((L, Hkv, hd)))
    vc = bf16_bits(rng.standard_normal((L, Hkv, hd)))
    q = rng.standard_normal((T, Hq, hd)).astype(np.float32)
    gate = rng.standard_normal((T, Hq, hd)).astype(np.float32)
    o = _core.attention(d(q), d(kc), d(vc), scale=hd ** -0.5, gate=d(gate), pos0=pos0, engine=e)
    e.to_host(o)
print("attention_tc launches done")
