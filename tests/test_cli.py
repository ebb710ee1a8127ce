"""``memra generate`` (memra.cli) from the outside: the embedded checkpoint's greedy tokens
against transformers' stored ones, and what it says for a bad folder, flag or prompt (exit 1 for
a memra error with its class and code, 2 for a usage error)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import memra

ROOT = Path(__file__).resolve().parents[1]
REF = np.load(ROOT / "tests" / "fixtures" / "glm5_next_tiny_reference.npz")


def test_cli_generates_from_the_embedded_checkpoint() -> None:
    r = subprocess.run([sys.executable, "-m", "memra", "generate", "--max-new-tokens", "5",
                        "--prompt-ids", ",".join(str(int(t)) for t in REF["prompt_a"])],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    want = [int(t) for t in REF["greedy_a"][:5]]
    assert r.stdout.strip() == ",".join(map(str, want))
    assert "tokens/s" in r.stderr
    r = subprocess.run([sys.executable, "-m", "memra", "generate", "--max-new-tokens", "3"],
                       capture_output=True, text=True)
    assert r.returncode == 0 and "tokens/s" in r.stderr, r.stderr


def test_cli_names_an_unsupported_model_before_the_missing_tokenizer(tmp_path) -> None:
    # It said "no tokenizer ...; use --prompt-ids", and only with ids did it name the model_type.
    (tmp_path / "config.json").write_text('{"model_type": "llama"}')
    r = subprocess.run([sys.executable, "-m", "memra", "generate", str(tmp_path)], capture_output=True, text=True)
    assert r.returncode == 1 and "model_type 'llama'" in r.stderr and "tokenizer" not in r.stderr, r.stderr


def test_cli_names_a_config_it_cannot_read(tmp_path, monkeypatch, capsys) -> None:
    # The CLI's own read of config.json (before the tokenizer) names an unreadable file as load
    # does (memra.loader.naming_unreadable), not with a traceback. Root reads a chmod 000 file, so
    # the read is made to fail.
    import memra.cli

    (tmp_path / "config.json").write_text('{"model_type": "glm5_next"}')
    real = Path.read_text

    def read_text(self, *a, **k):
        if self.name == "config.json":
            raise PermissionError(13, "Permission denied", str(self))
        return real(self, *a, **k)

    monkeypatch.setattr(Path, "read_text", read_text)
    assert memra.cli.main(["generate", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("memra: ContractError (40025): load: ") and "could not be read: Permission denied" in err, err


def test_cli_says_its_version() -> None:
    r = subprocess.run([sys.executable, "-m", "memra", "--version"], capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout.strip() == f"memra {memra.__version__}", (r.stdout, r.stderr)


@pytest.mark.parametrize("args, words", [(["--prompt-ids", "1,,2"], "--prompt-ids"),
                                         (["--prompt-ids", "1,2,"], "--prompt-ids"),
                                         (["--prompt", ""], "no tokens")])
def test_cli_refuses_empty_prompt_items(args, words) -> None:
    """An empty --prompt-ids item is an error (it once vanished: "1,,2" ran as 1,2), and an empty
    --prompt says it encodes to no tokens (it once named prompt_ids, an argument not given)."""
    r = subprocess.run([sys.executable, "-m", "memra", "generate", "--max-new-tokens", "2", *args],
                       capture_output=True, text=True)
    assert r.returncode == 2 and words in r.stderr, r.stderr
