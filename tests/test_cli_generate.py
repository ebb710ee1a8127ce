"""``memra generate`` refusing bad sampling flags before it loads a checkpoint: the named
ContractError on stderr, exit status 1, and no load (it once read the checkpoint and allocated
the cache first). The loader is a stand-in here."""

from __future__ import annotations

import pytest

from memra import cli


@pytest.mark.parametrize("flags", [
    ["--temperature", "-1"], ["--temperature", "inf"], ["--top-p", "2"], ["--top-p", "0"],
    ["--top-k", "-3"], ["--max-new-tokens", "-1"], ["--seed", "-1"],
])
def test_bad_sampling_flags_fail_before_the_load(loads, capsys, flags):
    # Named by the flag the user typed, not by the library's parameter (top_p).
    assert cli.main(["generate", *flags]) == 1
    err = capsys.readouterr().err
    assert "ContractError (40025)" in err and f"{flags[0]} must" in err, err
    assert loads == []


def test_a_bad_max_len_is_named_by_its_flag(monkeypatch, capsys):
    # load() refuses it (the real loader, on the embedded checkpoint, before reading weights)
    assert cli.main(["generate", "--max-len", "0"]) == 1
    err = capsys.readouterr().err
    assert "--max-len must be in [1," in err and "max_len must" not in err.replace("--max-len", ""), err


def test_good_sampling_flags_reach_the_load(loads):
    with pytest.raises(AssertionError, match="loaded"):
        cli.main(["generate", "--temperature", "0.7", "--top-p", "0.9", "--top-k", "5", "--seed", "3"])
    assert len(loads) == 1


def test_more_new_tokens_than_cache_rows_fail_before_the_load(loads, capsys):
    assert cli.main(["generate", "--max-new-tokens", "100", "--max-len", "64"]) == 1
    err = capsys.readouterr().err
    assert "CacheFullError (30002)" in err and "--max-len 64" in err, err
    assert loads == []


def test_a_prompt_that_is_no_utf8_or_an_empty_path_fail_before_the_load(loads, capsys):
    # undecodable argv bytes reach Python as lone surrogates; the tokenizer raised a TypeError
    # after the load (a break-it pass of the CLI, session 24)
    assert cli.main(["generate", "--prompt", "\udcff\udcfe bad"]) == 2
    assert "--prompt is not valid UTF-8" in capsys.readouterr().err
    assert cli.main(["generate", ""]) == 2  # an unset $MODEL: not the embedded model in silence
    assert "PATH must name a checkpoint folder" in capsys.readouterr().err
    assert loads == []


class _Model:
    """A stand-in whose stream draws 5, 6, then is interrupted (Ctrl-C) or ends."""

    def __init__(self, interrupt: bool) -> None:
        self.interrupt = interrupt
        self.tokenizer = None
        self.cache = type("C", (), {"max_batch": 1, "max_len": 64, "nbytes": 0})()

    def stream(self, ids, n, **kw):
        yield 5
        yield 6
        if self.interrupt:
            raise KeyboardInterrupt


def test_ctrl_c_prints_the_tokens_drawn_and_exits_130(monkeypatch, capsys):
    monkeypatch.setattr(cli, "load", lambda path, **kw: _Model(True))
    assert cli.main(["generate", "--prompt-ids", "1,2"]) == 130
    out = capsys.readouterr()
    assert out.out.strip() == "5,6" and "interrupted after 2 tokens" in out.err and "Traceback" not in out.err


def test_the_speed_line_parts_the_first_token_from_the_rest(monkeypatch, capsys):
    monkeypatch.setattr(cli, "load", lambda path, **kw: _Model(False))
    assert cli.main(["generate", "--prompt-ids", "1,2"]) == 0
    err = capsys.readouterr().err
    assert "2 tokens: the first" in err and "(prompt 2 tokens), then 1 in" in err, err


def test_a_huge_prompt_id_is_named_by_its_flag_and_value(capsys):
    assert cli.main(["generate", "--prompt-ids", "99999999999999999999"]) == 1
    err = capsys.readouterr().err
    assert "--prompt-ids holds 99999999999999999999, which does not fit in int32" in err, err


def test_the_flag_rewrite_leaves_typed_values_and_file_fields_alone(capsys, tmp_path):
    # Only "<op>: <param> must/holds" is the flag's own message (a review of session 25's rewrite).
    assert cli.main(["generate", "--device", "seed must"]) == 1
    assert "bad device 'seed must'" in capsys.readouterr().err
    assert cli.main(["generate", str(tmp_path / "top_p holds")]) == 1
    assert "top_p holds" in capsys.readouterr().err


def test_a_prompt_past_the_cache_names_the_flag(capsys):
    # after the load (the prompt's length is known then): the prompt, and --max-len by its flag
    assert cli.main(["generate", "--prompt-ids", "1,2,3", "--max-len", "3", "--max-new-tokens", "2"]) == 1
    err = capsys.readouterr().err
    assert "CacheFullError (30002): generate: the prompt of 3 tokens" in err, err
    assert err.rstrip().endswith("beyond --max-len 3"), err


def test_a_path_the_user_typed_is_shown_as_typed(tmp_path, capsys):
    # The messages' rewrites (stream -> generate, parameters -> flags) touch only the message's
    # own op and parameter: a folder named "downstream: ckpt" stays as typed.
    path = tmp_path / "downstream: ckpt"
    assert cli.main(["generate", str(path), "--prompt-ids", "1,2"]) == 1
    err = capsys.readouterr().err
    assert str(path) in err, err


def test_a_prompt_id_outside_the_vocabulary_is_named_by_its_flag(capsys):
    assert cli.main(["generate", "--prompt-ids", "1,999"]) == 1
    err = capsys.readouterr().err
    assert "generate: --prompt-ids: token id 999 is outside [0," in err, err


def test_a_prompt_past_the_cache_with_no_new_tokens(capsys):
    # no "last new token is not fed back" clause when no token is asked for
    assert cli.main(["generate", "--prompt-ids", "1,2,3,4", "--max-len", "3", "--max-new-tokens", "0"]) == 1
    err = capsys.readouterr().err
    assert "generate: the prompt of 4 tokens needs 4 cache rows, beyond --max-len 3" in err, err
    assert "fed back" not in err, err


def test_one_new_token_gives_no_rate(capsys):
    assert cli.main(["generate", "--prompt-ids", "1,2", "--max-new-tokens", "1", "--ignore-eos"]) == 0
    err = capsys.readouterr().err
    assert "memra: 1 token: the first" in err and "(prompt 2 tokens)\n" in err, err
    assert "tokens/s" not in err, err


def test_an_id_the_tokenizer_makes_past_the_vocabulary_names_the_prompt(capsys, tmp_path):
    # A tokenizer whose added tokens pass the model's vocabulary (258 + 20 against 272): the ids
    # come from --prompt, so the message names it, not --prompt-ids (a flag not given).
    import shutil

    from tokenizers import Tokenizer

    import memra

    ck = tmp_path / "ck"
    shutil.copytree(memra.default_checkpoint(), ck)
    tok = Tokenizer.from_file(str(ck / "tokenizer.json"))
    tok.add_special_tokens([f"<|t{i}|>" for i in range(20)])
    tok.save(str(ck / "tokenizer.json"))
    assert cli.main(["generate", str(ck), "--prompt", "hi <|t19|>", "--max-new-tokens", "2"]) == 1
    err = capsys.readouterr().err
    assert "generate: --prompt (its token ids): token id 277 is outside [0, 272)" in err, err


def test_an_empty_prompt_or_no_tokenizer_fail_before_the_load(loads, capsys, tmp_path):
    # Both were found after the checkpoint loaded and the cache was made (a break-it pass of the
    # CLI, session 30): with a large model, minutes for a typo.
    import shutil

    import memra

    assert cli.main(["generate", "--prompt", ""]) == 2
    assert "--prompt '' encodes to no tokens" in capsys.readouterr().err
    ck = tmp_path / "ck"
    shutil.copytree(memra.default_checkpoint(), ck)
    (ck / "tokenizer.json").unlink()
    assert cli.main(["generate", str(ck), "--prompt", "hi"]) == 2
    assert "use --prompt-ids" in capsys.readouterr().err
    assert loads == []


def test_the_text_leaves_out_the_eos_that_ended_it(monkeypatch, capsys):
    # It printed "Hi<|endoftext|>"; the server's default (skip_special_tokens) gives "Hi".
    class Model(_Model):
        def stream(self, ids, n, **kw):
            yield from (ord("H"), ord("i"), 256)  # the embedded tokenizer: byte ids, EOS 256

    monkeypatch.setattr(cli, "load", lambda path, **kw: Model(False))
    assert cli.main(["generate", "--prompt", "x"]) == 0
    assert capsys.readouterr().out == "Hi\n"


def test_a_folder_that_is_no_checkpoint_is_named_by_load(capsys, tmp_path):
    # The pre-load tokenizer check blamed a missing tokenizer for an empty folder; load names
    # the missing config.json (a review of session 30's change).
    assert cli.main(["generate", str(tmp_path), "--prompt", "hi"]) == 1
    err = capsys.readouterr().err
    assert "config.json" in err and "tokenizer" not in err, err
