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
