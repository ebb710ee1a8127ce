"""The ``memra`` command line (memra.cli) refusing bad flags before anything loads: an argparse
error (exit status 2, the flag named on stderr), never a traceback after the model is read. The
model and the server are stand-ins here, so nothing is loaded or served."""

from __future__ import annotations

import pytest

import memra
from memra import cli

serve = pytest.importorskip("memra.serve")


@pytest.fixture
def calls(monkeypatch):
    """What memra.cli asked for: ("load", path) and ("run", port) entries, none really done."""
    seen = []
    monkeypatch.setattr(cli, "load", lambda path, **kw: seen.append(("load", path)) or object())
    monkeypatch.setattr(serve, "run", lambda model, **kw: seen.append(("run", kw["port"])))
    monkeypatch.setattr(cli, "_listen_problem", lambda host, port: None)  # no socket touched
    return seen


@pytest.mark.parametrize("port", ["-5", "70000", "65536", "http", "8000.5", ""])
def test_a_port_outside_0_to_65535_is_an_argparse_error(calls, capsys, port):
    with pytest.raises(SystemExit) as info:
        cli.main(["serve", "--port", port])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "--port" in err and "0-65535" in err and repr(port) in err
    assert calls == []  # refused before the model loads


@pytest.mark.parametrize("port", ["0", "1", "8000", "65535"])
def test_a_port_in_range_is_served(calls, port):
    assert cli.main(["serve", "--device", "cpu", "--port", port]) == 0
    assert calls[-1] == ("run", int(port))


def test_a_server_that_cannot_be_made_is_a_named_error(monkeypatch, capsys, calls):
    def refuse(model, **kw):
        raise memra.ContractError("chat template: does not compile: x", 40025)

    monkeypatch.setattr(serve, "run", refuse)
    assert cli.main(["serve", "--device", "cpu"]) == 1
    assert "ContractError (40025): chat template" in capsys.readouterr().err


@pytest.mark.parametrize("flags,words", [
    (["--host", ""], "--host must not be empty"),
    (["--served-model-name", ""], "--served-model-name must not be empty"),
    (["--max-waiting", "99999999999999999999"], "--max-waiting must be in"),
    (["--max-request-bytes", "99999999999999999999"], "--max-request-bytes must be in"),
    (["--max-waiting", "3000000000"], "--max-waiting must be in"),  # create_app's bound, not 2^63
    ([""], "PATH must name a checkpoint folder"),
])
def test_what_the_server_would_refuse_is_said_before_the_load(calls, capsys, flags, words):
    # Each was found by create_app, run or uvicorn after the model loaded and "serving ..." was
    # printed (a break-it pass of the CLI, session 24).
    assert cli.main(["serve", *flags]) == 2
    assert words in capsys.readouterr().err
    assert calls == []


def test_a_host_that_does_not_resolve_or_a_taken_port_is_said_before_the_load(monkeypatch, capsys):
    import socket

    monkeypatch.setattr(cli, "load", lambda path, **kw: pytest.fail("loaded"))
    assert cli.main(["serve", "--host", "nonexistent.invalid"]) == 2
    assert "--host 'nonexistent.invalid' does not resolve" in capsys.readouterr().err
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert cli.main(["serve", "--port", str(port)]) == 2
        assert f"--port {port}: cannot listen there" in capsys.readouterr().err


def test_a_broken_chat_template_file_is_named_before_the_load(calls, capsys, tmp_path):
    # The server loaded every weight and printed "serving ..." before create_app found it.
    import shutil

    ck = tmp_path / "ck"
    shutil.copytree(memra.default_checkpoint(), ck)
    (ck / "tokenizer_config.json").write_text("nope")
    assert cli.main(["serve", str(ck), "--device", "cpu"]) == 1
    err = capsys.readouterr().err
    assert "ContractError (40025): chat template:" in err and "tokenizer_config.json" in err, err
    assert "serving" not in err and calls == []


def test_sigterm_during_the_load_stops_with_status_0(monkeypatch, capsys, calls):
    # The handler came after the load: a SIGTERM while loading (the longest phase on a real
    # checkpoint) ended the process with 143 (a review of session 30's change).
    import os
    import signal
    import time

    def load(path, **kw):
        try:  # as the tokenizer and safetensors readers name their files' errors
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)  # the handler interrupts this
        except Exception as e:
            raise memra.ContractError(f"load: could not be read: {e}", 40025) from None
        raise AssertionError("not interrupted")

    monkeypatch.setattr(cli, "load", load)
    before = signal.getsignal(signal.SIGTERM)
    try:
        assert cli.main(["serve", "--device", "cpu"]) == 0
        assert "stopped while loading" in capsys.readouterr().err and calls == []
        # a second SIGTERM before the process ends changes nothing (it was 143)
        assert signal.getsignal(signal.SIGTERM) == signal.SIG_IGN
    finally:
        signal.signal(signal.SIGTERM, before)
