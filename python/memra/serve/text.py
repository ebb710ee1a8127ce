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
        self.skip = skip_special_tokens
        self.ids: list[int] = []  # every id taken
        self._text_ids: list[int] = []  # the ids that can give text: the window's
        self._silent: dict[int, bool] = {}  # id -> it gives no text anywhere (cached)
        self._specials: set[int] | None = None  # the special added tokens' ids (when first needed)
        self._prefix = 0  # _text_ids[_prefix:_read] were decoded into text already emitted or held
        self._read = 0
        self._held = ""  # decoded text not emitted yet (it may start a stop string)
        self.stopped = False

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
        return self._emit(self._held + self._new_text(final=False))

    def finish(self) -> str:
        """The text still held back once generation ended without a stop string (an
        incomplete stop-string prefix, an incomplete UTF-8 sequence)."""
        if self.stopped or self.tokenizer is None:
            return ""
        text = self._held + self._new_text(final=True)
        self._held = ""
        cut = self._find_stop(text)  # a stop string completed by the last bytes
        if cut is not None:
            self.stopped = True
            return text[:cut]
        return text

    def _find_stop(self, text: str) -> int | None:
        hits = [i for i in (text.find(s) for s in self.stop) if i >= 0]
        return min(hits) if hits else None

    def _emit(self, text: str) -> str:
        cut = self._find_stop(text)
        if cut is not None:
            self.stopped = True
            self._held = ""
            return text[:cut]
        hold = 0  # the longest tail of text that is a proper prefix of a stop string
        for s in self.stop:
            for k in range(min(len(s) - 1, len(text)), hold, -1):
                if text.endswith(s[:k]):
                    hold = k
                    break
        self._held = text[len(text) - hold:] if hold else ""
        return text[:len(text) - hold]
