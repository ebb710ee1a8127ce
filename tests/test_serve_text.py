"""memra.serve.text.TextStream against whole decodes (CPU, the fixtures' tokenizers).

The pieces TextStream returns for a sequence of ids, joined, must equal the sequence's whole
decode (tokenizers.Tokenizer.decode, special tokens skipped), cut at the first stop string when
one matches; special tokens and ids outside the vocabulary anywhere in the sequence (they give
no text wherever they stand) change nothing, and a long run of them keeps each decode short.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import tokenizers

import memra
from memra.serve.text import TextStream

FIXTURES = Path(__file__).resolve().parent / "fixtures"
FOLDERS = [memra.default_checkpoint(), FIXTURES / "tiny_kimi_linear", FIXTURES / "tiny_qwen3_5"]


def _tokenizer(folder: Path) -> tokenizers.Tokenizer:
    return tokenizers.Tokenizer.from_file(str(folder / "tokenizer.json"))


def _stream(tok, ids, stop=()) -> str:
    ts = TextStream(tok, list(stop))
    out = "".join(ts.add(i) for i in ids)
    return out + ts.finish()


def _expected(tok, ids, stop=()) -> str:
    # The whole decode cut where the first stop string to complete begins: the least end, then
    # the least beginning (a fixed string's first occurrence is also its first completion).
    text = tok.decode(list(ids), skip_special_tokens=True)
    hits = [(i + len(s), i) for s in stop if s and (i := text.find(s)) >= 0]
    return text[: min(hits)[1]] if hits else text


def _draws(tok, r, n):
    """Random id sequences: vocabulary ids (byte tokens split multi-byte characters), the
    special tokens and ids just past the vocabulary mixed in."""
    vocab = tok.get_vocab_size(with_added_tokens=False)
    specials = sorted(i for i, t in tok.get_added_tokens_decoder().items() if t.special)
    outside = [tok.get_vocab_size(with_added_tokens=True) + k for k in range(3)]
    pool = specials + [i for i in outside if tok.id_to_token(i) is None]
    for _ in range(n):
        ids = [int(i) for i in r.integers(0, vocab, int(r.integers(1, 40)))]
        for _ in range(int(r.integers(0, 6))):
            if pool:
                ids.insert(int(r.integers(0, len(ids) + 1)), int(r.choice(pool)))
        yield ids


@pytest.mark.parametrize("folder", FOLDERS, ids=lambda p: p.name)
def test_pieces_join_to_the_whole_decode(folder) -> None:
    tok = _tokenizer(folder)
    r = np.random.default_rng(len(folder.name))
    for ids in _draws(tok, r, 300):
        assert _stream(tok, ids) == _expected(tok, ids), ids
        text = tok.decode(ids, skip_special_tokens=True)
        if len(text) >= 4:  # a stop string taken from the text itself, spanning tokens
            a = int(r.integers(0, len(text) - 2))
            stop = [text[a : a + int(r.integers(1, 4))]]
            assert _stream(tok, ids, stop) == _expected(tok, ids, stop), (ids, stop)


def test_a_run_of_special_tokens_keeps_the_decodes_short() -> None:
    # 4000 EOS tokens (ignore_eos) between two words: each decode used to take the whole run
    # (the window grew until a token gave text), a cost growing with the square of its length.
    folder = memra.default_checkpoint()
    tok = _tokenizer(folder)
    eos = next(i for i, t in tok.get_added_tokens_decoder().items() if t.special)
    ids = tok.encode("hi", add_special_tokens=False).ids + [eos] * 4000 + \
        tok.encode(" there", add_special_tokens=False).ids
    longest = []

    class Counting:
        def __init__(self, inner):
            self.inner = inner

        def decode(self, seq, **kw):
            longest.append(len(seq))
            return self.inner.decode(seq, **kw)

        def __getattr__(self, name):
            return getattr(self.inner, name)

    assert _stream(Counting(tok), ids) == "hi there"
    assert max(longest) <= 8, max(longest)


def test_long_stop_strings_cost_a_token_no_more_than_short_ones() -> None:
    # 64 stop strings of 1024 characters (the most a request may send) while the text held back
    # is 1023 characters long (the tail of it that could start one of them): each token used to
    # try every prefix length of every stop string, 64 x 1023 loop turns (5 ms a token on the
    # event loop). Counted in Python lines run, not in time.
    import sys

    from memra.serve import text as text_module

    tok = _tokenizer(memra.default_checkpoint())
    a = tok.encode("a", add_special_tokens=False).ids[0]
    ts = TextStream(tok, ["b" * 1024] * 63 + ["a" * 1023 + "c"])
    for _ in range(1023):
        assert ts.add(a) == ""  # the "a"s may start the last stop string: all held
    assert ts.add(a) == "a"  # from here on each "a" lets the first one held go
    lines = 0

    def tracer(frame, event, arg):
        nonlocal lines
        if frame.f_code.co_filename != text_module.__file__:
            return None
        if event == "line":
            lines += 1
            if lines > 100_000:
                raise AssertionError("a token ran more than 100000 lines of memra.serve.text")
        return tracer

    sys.settrace(tracer)
    try:
        pieces = [ts.add(a) for _ in range(50)]
    finally:
        sys.settrace(None)
    assert pieces == ["a"] * 50
    assert lines <= 50 * 64 * 20, lines  # a few lines a stop string, not one per prefix length


@pytest.mark.parametrize("folder", FOLDERS, ids=lambda p: p.name)
def test_overlapping_stops_cut_where_the_first_completed_one_begins(folder) -> None:
    # "bcd" completes before "abcde" does, so the text ends before "bcd" whether the characters
    # arrive one a token (the byte-level tokenizer) or several (merges; an incomplete UTF-8
    # sequence held back): the cut was the earliest beginning among the stops that completed in
    # one piece, so it hung on how the text was split into pieces.
    tok = _tokenizer(folder)
    for text, stop, want in (("xabcdef", ["bcd", "abcde"], "xa"), ("xabcdef", ["abcde", "bcd"], "xa"),
                             ("\u00e9abcd\u00e9", ["bcd", "\u00e9abcd\u00e9"], "\u00e9a")):
        ids = tok.encode(text, add_special_tokens=False).ids
        if tok.decode(ids, skip_special_tokens=True) != text:
            continue  # the tokenizer does not round-trip this text
        assert _expected(tok, ids, stop) == want
        assert _stream(tok, ids, stop) == want, (ids, stop)
        ts = TextStream(tok, stop)  # the whole text as one piece
        assert ts._emit("", text) == want and ts.stopped


def test_stops_completing_on_one_character_cut_at_the_earliest_beginning() -> None:
    # Several stop strings completing on the same character: the text ends where the one that
    # begins first begins, whatever the order of the list (str.find on the whole text). The
    # later-listed stop here always begins later, so taking the last one's cut would be wrong.
    tok = _tokenizer(memra.default_checkpoint())
    ids = tok.encode("hello there", add_special_tokens=False).ids
    for stop, want in ((["hel", "el"], ""), (["ell", "ll"], "h"), (["o t", " t"], "hell"),
                       (["x", "o t", "t", " t"], "hell")):
        assert _expected(tok, ids, stop) == want
        assert _stream(tok, ids, stop) == want, stop
