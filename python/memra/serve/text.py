"""Generated token ids to text, a piece at a time, with stop strings cut out.

:class:`TextStream` decodes incrementally the way vLLM does (a window of already-read tokens
decoded with the new ones, so tokenizers whose decoders strip a leading space or join pieces
across tokens give the text a whole decode would) and holds back a piece ending in an
incomplete UTF-8 sequence (U+FFFD) until the next token completes it. Stop strings are matched
on the decoded text, including a match spanning several tokens; text that could still be the
start of a stop string is held back until it is not, and a matched stop string and everything
after it are never emitted (OpenAI's semantics). Ids that give no text wherever they stand
(special tokens when they are skipped, ids outside the vocabulary: ``Tokenizer.decode`` drops
both before its decoder runs) never enter the window, so a long run of them (EOS under
ignore_eos) costs a constant decode per token, not one growing with the run.
"""

from __future__ import annotations


class TextStream:
    """The text of a growing sequence of generated token ids.

    tokenizer: a ``tokenizers.Tokenizer``, or None (no text: every piece is "");
    stop: stop strings (empty ones ignored); skip_special_tokens: as ``Tokenizer.decode`` (the
    EOS token and other special tokens give no text).
    """

    def __init__(self, tokenizer, stop: list[str] = (), skip_special_tokens: bool = True) -> None:
        self.tokenizer = tokenizer
        self.stop = [s for s in stop if s]
        # Stop strings are matched as KMP automata fed each emitted character once: per stop, the
        # longest prefix of it the text ends with (_state) and its failure function (_fail,
        # computed when first needed). Trying every prefix length of every stop on each token
        # instead cost 64 stops x 1023 lengths per token once the text held 1023 characters
        # (5 ms a token), on the event loop.
        self._state = [0] * len(self.stop)
        self._fail: list[list[int]] | None = None
        self.skip = skip_special_tokens
        self.ids: list[int] = []  # every id taken
        self._text_ids: list[int] = []  # the ids that can give text: the window's
        self._silent: dict[int, bool] = {}  # id -> it gives no text anywhere (cached)
        self._specials: set[int] | None = None  # the special added tokens' ids (when first needed)
        self._prefix = 0  # _text_ids[_prefix:_read] were decoded into text already emitted or held
        self._read = 0
        self._held = ""  # decoded text not emitted yet (it may start a stop string)
        self.stopped = False
        self.matched: str | None = None  # the stop string that stopped it

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=self.skip) if ids else ""

    def _gives_no_text(self, token_id: int) -> bool:
        """Whether decode drops `token_id` wherever it stands: outside the vocabulary, or a
        special token while they are skipped."""
        silent = self._silent.get(token_id)
        if silent is None:
            if self.skip and self._specials is None:
                self._specials = {i for i, t in self.tokenizer.get_added_tokens_decoder().items() if t.special}
            silent = self.tokenizer.id_to_token(token_id) is None or (self.skip and token_id in self._specials)
            self._silent[token_id] = silent
        return silent

    def _new_text(self, final: bool) -> str:
        """Text the ids past ``_read`` add (all of it when `final`, even an incomplete char)."""
        before = self._decode(self._text_ids[self._prefix:self._read])
        after = self._decode(self._text_ids[self._prefix:])
        if len(after) > len(before) and (final or not after.endswith("\ufffd")):
            self._prefix, self._read = self._read, len(self._text_ids)
            return after[len(before):]
        return ""

    def add(self, token_id: int) -> str:
        """Take one more token; returns the text that can be emitted now ("" when none). After a
        stop string matched, ``stopped`` is True and the text up to it has been returned; later
        tokens give nothing."""
        if self.stopped or self.tokenizer is None:
            self.ids.append(int(token_id))
            return ""
        self.ids.append(int(token_id))
        if self._gives_no_text(int(token_id)):
            return ""
        self._text_ids.append(int(token_id))
        return self._emit(self._held, self._new_text(final=False))

    def finish(self) -> str:
        """The text still held back once generation ended without a stop string (an
        incomplete stop-string prefix, an incomplete UTF-8 sequence)."""
        if self.stopped or self.tokenizer is None:
            return ""
        held, new = self._held, self._new_text(final=True)
        text = held + new
        self._held = ""
        cut = self._find_stop(text, len(held))  # a stop string completed by the last bytes
        if cut is not None:
            self.stopped = True
            return text[:cut]
        return text

    def _find_stop(self, text: str, start: int) -> int | None:
        """Feed text[start:] to the stop strings' automata; the index in `text` where the first
        stop string completed in it begins (None: none did). The automata had read text[:start].

        "First completed" is the match whose last character comes first; of stops completing on
        the same character, the one beginning first (the longer). So the cut is the same however
        the text arrives (a character at a time, or several tokens' worth at once when an
        incomplete UTF-8 sequence was held back)."""
        if not self.stop or start >= len(text):
            return None
        if self._fail is None:
            self._fail = [_failure(s) for s in self.stop]
        best = None  # (end, begin) of the first completed match
        for j, s in enumerate(self.stop):
            fail, state, m = self._fail[j], self._state[j], len(s)
            for i in range(start, len(text)):
                c = text[i]
                while state and s[state] != c:
                    state = fail[state - 1]
                if s[state] == c:
                    state += 1
                if state == m:  # this stop's first match; a later one ends later
                    best = min(best or (i + 1, i + 1 - m, s), (i + 1, i + 1 - m, s))
                    break
            self._state[j] = state
        if best is None:
            return None
        self.matched = best[2]
        return best[1]

    def _emit(self, held: str, new: str) -> str:
        text = held + new
        cut = self._find_stop(text, len(held))
        if cut is not None:
            self.stopped = True
            self._held = ""
            return text[:cut]
        # the longest tail of text that is a proper prefix of a stop string (the automata read
        # all of the text; no state is longer than it: held was the longest one before)
        hold = max(self._state, default=0)
        self._held = text[len(text) - hold:] if hold else ""
        return text[:len(text) - hold]


def _failure(s: str) -> list[int]:
    """KMP's failure function of `s`: f[i] is the length of the longest proper prefix of
    s[:i + 1] that is also its suffix."""
    f = [0] * len(s)
    k = 0
    for i in range(1, len(s)):
        while k and s[i] != s[k]:
            k = f[k - 1]
        if s[i] == s[k]:
            k += 1
        f[i] = k
    return f
