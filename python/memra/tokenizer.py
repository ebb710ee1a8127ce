"""A checkpoint folder's tokenizer as a ``tokenizers.Tokenizer``: ``tokenizer.json`` as it is, or a
tiktoken BPE model (``tiktoken.model``, as the Kimi-Linear release ships) converted at load.

The conversion reproduces the release's ``tokenization_kimi.TikTokenTokenizer`` (which wraps
``tiktoken.Encoding``) with the ``tokenizers`` library, so every caller of ``model.tokenizer``
(the CLI, the server's prompts, stop strings and streamed text) sees one kind of tokenizer:

- the vocabulary: each line of ``tiktoken.model`` is ``base64(token bytes) rank``; the token is
  written in the GPT-2 byte-to-character alphabet of a byte-level BPE, its id is its rank;
- the merges: every split of a token into two tokens, ordered by the merged token's rank, so a
  merge's priority is the rank tiktoken compares; ``ignore_merges`` because tiktoken takes a
  pre-token that is itself a token whole, before merging (both break ties to the left);
- the pre-tokenizer: the release's regex (``KIMI_PATTERN``), pieces kept whole ("isolated"), then
  bytes to the byte-level alphabet; the decoder maps them back (invalid UTF-8 becomes U+FFFD, as
  ``bytes.decode("utf-8", "replace")`` does);
- the special tokens: ids ``n .. n + 257`` after the ``n`` ranks, named by
  ``tokenizer_config.json``'s ``added_tokens_decoder`` where it names them, else
  ``<|reserved_token_{id}|>``; matched in the text as the release's ``encode`` does
  (``allowed_special="all"``). No BOS is added: the release's ``encode`` adds none.

Known differences, none of which the release's own special tokens meet (printable ASCII
without spaces, none a prefix of another):

- the release's ``encode`` cuts runs of more than 25,000 consecutive (non-)whitespace
  characters before tiktoken (a tiktoken stack limit); a run that long pre-tokenizes differently;
- a special token whose text holds a space or a non-ASCII character decodes through the
  byte-level decoder like the vocabulary (``decode(..., skip_special_tokens=False)`` then
  differs from tiktoken's; encoding does not);
- where one special's text is a prefix of another's, ``tokenizers`` matches the longer one,
  tiktoken the one its regex lists first.
"""

from __future__ import annotations

import base64
import binascii
from pathlib import Path

from .config import side_file
from .errors import ContractError, is_library_failure
from .loader import read_json_file

# tokenization_kimi.TikTokenTokenizer.pat_str (moonshotai/Kimi-Linear-48B-A3B-Instruct), joined.
KIMI_PATTERN = "|".join([
    r"""[\p{Han}]+""",
    r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+"""
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
    r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*"""
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
    r"""\p{N}{1,3}""",
    r""" ?[^\s\p{L}\p{N}]+[\r\n]*""",
    r"""\s*[\r\n]+""",
    r"""\s+(?!\S)""",
    r"""\s+""",
])
KIMI_RESERVED_SPECIAL = 256 + 2  # TikTokenTokenizer.num_reserved_special_tokens + 2 ids after the ranks
_TIKTOKEN_CLASSES = ("TikTokenTokenizer",)  # tokenizer_config.json's tokenizer_class / auto_map
# What a folder without a tokenizer lacks, for the messages of the CLI and the server.
NO_TOKENIZER = ("no tokenizer memra reads (tokenizer.json, or a tiktoken.model with a tokenizer_config.json "
                "naming TikTokenTokenizer)")


def byte_alphabet() -> list[str]:
    """GPT-2's byte-to-character map of a byte-level BPE (what ``pre_tokenizers.ByteLevel``
    writes): entry b is the character byte b becomes. Printable Latin-1 bytes stand for
    themselves; the other 68 take the code points from 256 up, in byte order."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table, extra = {b: chr(b) for b in keep}, 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + extra)
            extra += 1
    return [table[b] for b in range(256)]


def read_tiktoken_ranks(file: Path) -> dict[bytes, int]:
    """``tiktoken.model``'s lines ``base64(token bytes) rank`` as {token: rank}. ContractError
    (40025) naming the file and line for a line of another form, a repeated token or rank, ranks
    that are not 0..n-1, or a byte missing as a token of its own (byte-level BPE needs all 256)."""
    ranks: dict[bytes, int] = {}
    try:
        lines = file.read_bytes().splitlines()
    except OSError as e:
        raise ContractError(f"load: {file} could not be read: {e.strerror or e}", 40025) from None
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        parts = line.split()
        try:
            if len(parts) != 2:
                raise ValueError
            token, rank = base64.b64decode(parts[0], validate=True), int(parts[1])
        except (ValueError, binascii.Error):
            raise ContractError(f"load: {file} line {n} is not 'base64(token) rank'", 40025) from None
        if not token or token in ranks or rank < 0:
            what = "an empty token" if not token else "a repeated token" if token in ranks else "a negative rank"
            raise ContractError(f"load: {file} line {n} holds {what}", 40025)
        ranks[token] = rank
    if sorted(ranks.values()) != list(range(len(ranks))):
        raise ContractError(f"load: {file}: the ranks are not 0..{len(ranks) - 1}, each once", 40025)
    missing = [b for b in range(256) if bytes([b]) not in ranks]
    if missing:
        raise ContractError(f"load: {file}: byte {missing[0]} is not a token of its own (a byte-level BPE "
                            f"needs all 256)", 40025)
    return ranks


def tiktoken_tokenizer(ranks: dict[bytes, int], specials: dict[int, tuple[str, bool]], pattern: str):
    """The ``tokenizers.Tokenizer`` that encodes and decodes as ``tiktoken.Encoding(pat_str=pattern,
    mergeable_ranks=ranks, special_tokens=...)`` with every special allowed. specials: id ->
    (text, skipped by ``decode(skip_special_tokens=True)``), the ids right after the ranks.
    ContractError (40025) for a special whose text is also a token, or two specials of one text."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers

    alphabet = byte_alphabet()

    def text(token: bytes) -> str:
        return "".join(alphabet[b] for b in token)

    vocab = {text(t): r for t, r in ranks.items()}
    merges = []  # (merged rank, left rank, right rank)
    for token, rank in ranks.items():
        for i in range(1, len(token)):
            left, right = ranks.get(token[:i]), ranks.get(token[i:])
            if left is not None and right is not None:
                merges.append((rank, left, right))
    merges.sort()
    by_rank = {r: t for t, r in vocab.items()}
    bpe = models.BPE(vocab, [(by_rank[lr], by_rank[rr]) for _, lr, rr in merges], ignore_merges=True)
    tok = Tokenizer(bpe)
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(pattern), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    n = len(ranks)
    for i in sorted(specials):
        content, special = specials[i]
        if i != n + len(tok.get_added_tokens_decoder()) or content in vocab:
            raise ContractError(f"load: the special token {content!r} (id {i}) is also a token of the "
                                f"vocabulary or out of order", 40025)
        tok.add_tokens([AddedToken(content, special=special, normalized=False)])
        if tok.token_to_id(content) != i:
            raise ContractError(f"load: the special token {content!r} (id {i}) is named twice", 40025)
    return tok


def _tiktoken_class(config: dict) -> bool:
    names = [config.get("tokenizer_class")]
    auto = (config.get("auto_map") or {}).get("AutoTokenizer") if isinstance(config.get("auto_map"), dict) else None
    names += list(auto) if isinstance(auto, (list, tuple)) else [auto]
    return any(isinstance(s, str) and s.rsplit(".", 1)[-1] in _TIKTOKEN_CLASSES for s in names)


def _kimi_specials(config: dict, n: int, file: Path) -> dict[int, tuple[str, bool]]:
    """tokenization_kimi's special tokens: ids n .. n + 257, named by added_tokens_decoder."""
    named = config.get("added_tokens_decoder") or {}
    if not isinstance(named, dict):
        raise ContractError(f"load: {file}: added_tokens_decoder must be an object", 40025)
    specials = {}
    for i in range(n, n + KIMI_RESERVED_SPECIAL):
        entry = named.get(str(i))
        if entry is None:
            specials[i] = (f"<|reserved_token_{i}|>", True)
        elif isinstance(entry, dict) and isinstance(entry.get("content"), str) and entry["content"]:
            specials[i] = (entry["content"], bool(entry.get("special", True)))
        else:
            raise ContractError(f"load: {file}: added_tokens_decoder[{str(i)!r}] has no content string", 40025)
    return specials


def encode_text(tokenizer, text: str, what: str, add_special_tokens: bool = True) -> list[int]:
    """The ids of `text` through `tokenizer` (a ``tokenizers.Tokenizer``). ContractError (40025)
    naming `what` when the tokenizer fails on it: the tokenizers library raises a bare Exception,
    or from its Rust code a PanicException, a BaseException (a pre-tokenizer regex past its
    backtracking limit, a post-processor's token missing from the vocabulary)."""
    try:
        return tokenizer.encode(text, add_special_tokens=add_special_tokens).ids
    except BaseException as e:
        if not is_library_failure(e):
            raise
        raise ContractError(f"{what}: the tokenizer failed on the text ({type(e).__name__}: {e})", 40025) from None


def read_tokenizer(path: Path):
    """The folder's tokenizer (a ``tokenizers.Tokenizer``), or None when it has none memra reads:
    ``tokenizer.json``; else ``tiktoken.model`` with a ``tokenizer_config.json`` naming
    tokenization_kimi's ``TikTokenTokenizer`` (converted: see the module's docstring). A
    ``tiktoken.model`` of another tokenizer class is not read (its regex lives in that class's
    code). ContractError (40025) naming the file that cannot be read or is malformed."""
    from tokenizers import Tokenizer

    if side_file(path / "tokenizer.json", "load") is not None:
        file = path / "tokenizer.json"
        try:
            tok = Tokenizer.from_file(str(file))
        except Exception as e:  # the tokenizers library raises a bare Exception
            raise ContractError(f"load: {file} could not be read: {e}", 40025) from None
        # The file's truncation and padding are not applied: transformers' fast tokenizers turn
        # them off for a call that asks for neither (PreTrainedTokenizerFast.
        # set_truncation_and_padding), as vLLM's and generate's prompts are, so a prompt is never
        # cut short or padded (a padding to 2^40 tokens aborted the first encode).
        tok.no_truncation()
        tok.no_padding()
        # The empty text encoded now: a post-processor naming a token the vocabulary lacks fails
        # at every encode (a Rust panic), which would otherwise surface at the first prompt. (Not
        # a word: a closed vocabulary without [UNK], DNA or SMILES, fails on text it lacks.)
        encode_text(tok, "", f"load: {file}")
        return tok
    model_file, config_file = path / "tiktoken.model", path / "tokenizer_config.json"
    if side_file(model_file, "load") is None or side_file(config_file, "load") is None:
        return None
    config = read_json_file(config_file)  # the reader of every JSON side file: each failure named
    if not _tiktoken_class(config):
        return None
    ranks = read_tiktoken_ranks(model_file)
    return tiktoken_tokenizer(ranks, _kimi_specials(config, len(ranks), config_file), KIMI_PATTERN)
