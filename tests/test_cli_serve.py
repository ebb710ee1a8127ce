"""``memra serve`` refusing a bad flag before it loads a checkpoint: exit status 2 with a line
naming the flag (main's contract), and no load. The loader is a stand-in here; the port check
binds a real socket."""

from __future__ import annotations

import socket

import pytest

from memra import cli


def exit_status(argv: list[str]) -> int:
    try:
        return cli.main(argv)
    except SystemExit as e:  # argparse's usage error
        return e.code


@pytest.mark.parametrize("flags, words", [
    (["--max-len", "0"], "--max-len"),
    # load's bounds, said before the load as the others are
    (["--max-len", "100000000000"], "--max-len must be in [1, 2147483647]"),
    (["--max-batch", "100000000000"], "--max-batch must be in [1, 2147483647]"),
    (["--max-waiting", "-1"], "--max-waiting must be in [0,"),
    (["--max-request-bytes", "0"], "--max-request-bytes"),
    (["--served-model-name", ""], "--served-model-name must not be empty"),
    (["--host", ""], "--host must not be empty"),
    (["--host", "no-such-host.invalid"], "does not resolve"),
    (["--port", "65536"], "--port"),
    ([""], "PATH must name a checkpoint folder"),
])
def test_a_bad_serve_flag_exits_2_before_the_load(loads, capsys, flags, words):
    assert exit_status(["serve", "--port", "0", *flags]) == 2
    assert words in capsys.readouterr().err
    assert loads == []


def test_a_taken_port_exits_2_before_the_load(loads, capsys):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert exit_status(["serve", "--port", str(port)]) == 2
    assert str(port) in capsys.readouterr().err
    assert loads == []
