"""README.md's "Use" example runs as written on the embedded checkpoint (its CPU lines), so the
README stays true as the API moves."""

from __future__ import annotations

from pathlib import Path

import numpy as np

README = Path(__file__).resolve().parents[1] / "README.md"


def test_the_use_example_runs_on_the_embedded_checkpoint() -> None:
    text = README.read_text()
    use = text.split("## Use", 1)[1]
    block = use.split("```python\n", 1)[1].split("```", 1)[0]
    assert '"path/to/GLM-5.3-Flash-folder"' in block and "gpu = memra.load" in block
    cpu_part = block.split("gpu = memra.load")[0].replace('"path/to/GLM-5.3-Flash-folder"',
                                                            "memra.default_checkpoint()")
    cpu_part = cpu_part.replace(": ...", ": pass")
    env: dict = {}
    exec(compile(cpu_part, str(README), "exec"), env)  # noqa: S102 - the project's own README
    model = env["model"]
    vocab = model.config.vocab_size
    assert env["logits"].shape == (3, vocab) and env["logits"].dtype == np.float32
    assert env["lasts"].shape == (2, vocab) and env["step"].shape == (2, vocab)
    assert env["outs"][0] == model.generate(env["ids_a"], 32)
    # the streams gave their slots back (the with block, and the for loop run to its end)
    assert [model.cache.owner(s) for s in range(model.cache.max_batch)] == [0] * model.cache.max_batch
