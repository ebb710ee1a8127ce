"""``memra generate`` refusing bad sampling flags before it loads a checkpoint: the named
ContractError on stderr, exit status 1, and no load (it once read the checkpoint and allocated
the cache first). The loader is a stand-in here."""

from __future__ import annotations

import pytest

from memra import cli


@pytest.fixture
def loads(monkeypatch):
    seen = []

    def load(path, **kw):
        seen.append(path)
        raise AssertionError("loaded")

    monkeypatch.setattr(cli, "load", load)
    return seen


@pytest.mark.parametrize("flags,named", [
    (["--temperature", "-1"], "temperature"),
    (["--temperature", "inf"], "temperature"),
    (["--top-p", "2"], "top_p"),
    (["--top-p", "0"], "top_p"),
    (["--top-k", "-3"], "top_k"),
    (["--max-new-tokens", "-1"], "max_new_tokens"),
    (["--seed", "-1"], "seed"),
])
def test_bad_sampling_flags_fail_before_the_load(loads, capsys, flags, named):
    assert cli.main(["generate", *flags]) == 1
    err = capsys.readouterr().err
    assert "ContractError (40025)" in err and named in err, err
    assert loads == []


def test_good_sampling_flags_reach_the_load(loads):
    with pytest.raises(AssertionError, match="loaded"):
        cli.main(["generate", "--temperature", "0.7", "--top-p", "0.9", "--top-k", "5", "--seed", "3"])
    assert len(loads) == 1


def test_more_new_tokens_than_cache_rows_fail_before_the_load(loads, capsys):
    assert cli.main(["generate", "--max-new-tokens", "100", "--max-len", "64"]) == 1
    err = capsys.readouterr().err
    assert "CacheFullError (30002)" in err and "--max-len 64" in err, err
    assert loads == []
