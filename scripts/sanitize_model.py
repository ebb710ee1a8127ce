"""Drive the whole tiny glm5_next model on CUDA (f32 and bf16: prefill, batched decode, sampled
generation) for `compute-sanitizer --tool memcheck` (issue: memcheck clean on the model run).
Run: compute-sanitizer --tool memcheck --error-exitcode 1 python3 scripts/sanitize_model.py"""

from pathlib import Path

import numpy as np

import memra

root = Path(__file__).resolve().parents[1]
prompts = [list(range(3, 40)), [5, 6, 7, 8, 9, 10, 11], [42]]
for path, dtype in ((memra.default_checkpoint(), "float32"),
                    (root / "tests" / "fixtures" / "tiny_glm5_next_bf16", "bfloat16")):
    if not path.exists():
        continue
    m = memra.load(path, device="cuda", dtype=dtype, max_batch=4, max_len=96, progress=False)
    assert np.isfinite(m.logits(prompts[0])).all()
    out = m.generate_batch(prompts, 6, temperature=0.7, top_k=20, top_p=0.9, seed=3, ignore_eos=True)
    print(dtype, out)
print("model run done")
