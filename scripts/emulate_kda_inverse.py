"""Float64 emulation of the chunked KDA intra kernel's block inverse (cuda/kda_chunk_intra.cu):
(I + Akk)^-1 for 64-row chunks, the diagonal 16 x 16 blocks by f32 forward substitution and the
level products T_IJ = -T_II sum_{M=J}^{I-1} A_IM T_MJ either in f32 (the form before session
16) or as m16n8k8 TF32 mma in 3xTF32 (cvt.rna operands hi + lo; lo hi + hi lo + hi hi, each
k-step's exact sum rounded once into the f32 accumulator: the hardware's accumulation may round
differently). The inverse itself is tests/test_cuda_kda_chunk.py's block_inverse (the tests'
emulation of the kernel), its products swapped in. Akk comes from the bench's inputs (k
L2-normalised, g = logsigmoid(randn + 2), beta = sigmoid(randn)) in float64, rounded to f32.
Prints each form's max|T - T64| / max|T64| over the chunks (median, max). No GPU.

    python3 scripts/emulate_kda_inverse.py [--chunks 20]
"""
import argparse
import pathlib
import sys

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "tests"))
from test_cuda_kda_chunk import block_inverse, tf32  # noqa: E402

f32 = np.float32


def mm_3xtf32(a, b):
    ah, bh = tf32(a), tf32(b)
    al, bl = tf32(a - ah), tf32(b - bh)
    acc = np.zeros((a.shape[0], b.shape[1]), dtype=f32)
    for k0 in range(0, a.shape[1], 8):
        s = slice(k0, k0 + 8)
        for x, y in ((al, bh), (ah, bl), (ah, bh)):
            acc = (acc + (x[:, s].astype(np.float64) @ y[s].astype(np.float64))).astype(f32)
    return acc


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--chunks", type=int, default=20)
    args = p.parse_args()
    rng = np.random.default_rng(0)
    errs = {"f32": [], "3xtf32": []}
    for _ in range(args.chunks):
        k = rng.standard_normal((64, 128))
        k /= np.linalg.norm(k, axis=1, keepdims=True)
        g = -np.logaddexp(0.0, -(rng.standard_normal((64, 128)) + 2.0))  # logsigmoid
        G = np.cumsum(g, axis=0)
        beta = 1.0 / (1.0 + np.exp(-rng.standard_normal(64)))
        akk = np.zeros((64, 64))
        for t in range(64):
            akk[t, :t] = beta[t] * np.sum(k[t] * k[:t] * np.exp(G[t] - G[:t]), axis=1)
        akk = akk.astype(f32)
        want = np.linalg.inv(np.eye(64) + akk.astype(np.float64))
        for name, mm in (("f32", None), ("3xtf32", mm_3xtf32)):
            got = block_inverse(akk, mm)
            errs[name].append(np.abs(got - want).max() / np.abs(want).max())
    for name, e in errs.items():
        print(f"{name}: max|T - T64| / max|T64| median {np.median(e):.3g}, max {max(e):.3g}")


if __name__ == "__main__":
    main()
