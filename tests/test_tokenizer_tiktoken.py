"""Kimi-Linear's ``tiktoken.model`` read as a ``tokenizers.Tokenizer`` (memra.tokenizer) against
tiktoken itself: ``tiktoken.Encoding`` with the release's regex and the same ranks and special
tokens, as the release's ``tokenization_kimi.TikTokenTokenizer`` builds it, is the reference for
every encode and decode here.

The ranks are learned on a small corpus (the ``tokenizers`` BPE trainer) plus whole words no merge
reaches, so both of tiktoken's paths are exercised: merging, and a pre-token that is a token."""

from __future__ import annotations

import base64
import json
import random
import shutil
from pathlib import Path

import pytest

import memra
from memra import cli
from memra.errors import ContractError
from memra.tokenizer import KIMI_PATTERN, KIMI_RESERVED_SPECIAL, byte_alphabet, read_tokenizer

tiktoken = pytest.importorskip("tiktoken")  # a test dependency (pyproject's [test]): the reference

FIXTURES = Path(__file__).parent / "fixtures"
CORPUS = [
    "The quick brown fox jumps over the lazy dog's back; it's 12345 o'clock. WE'LL SEE, I'm sure.",
    "我们今天去公园散步，天气很好。机器学习和深度学习。日本語のテキストも少し。",
    "Ünïcödé façade naïve café — “quotes” «guillemets» 😀🎉👍🏽 Ωμέγα Кириллица",
    "def f(x):\n    return x**2  # comment\n\n\tTabs\r\n  trailing   \n",
    "HELLO World I'M HERE We'LL see 3.14159 1000000 2024-12-05 $100 #tag @user",
]
UNREACHABLE = [b" unreachablexyz", b"Qzqzq", "中文词".encode()]  # tokens no merge of the corpus makes
TEXTS = CORPUS + [
    "", " ", "x", "  \n\n  x  ", "\r\n\r\n", "a unreachablexyz b", " unreachablexyz", "Qzqzq!", "中文词中文",
    "Don'T they're WE'VE", "1234567", "x" * 300, " " * 40 + "y", "\t\t\n \u3000全角", "e\u0301 combining",
]


def ranks_of(vocab: dict[str, int]) -> dict[bytes, int]:
    back = {c: b for b, c in enumerate(byte_alphabet())}
    return {bytes(back[c] for c in tok): i for tok, i in vocab.items()}


@pytest.fixture(scope="module")
def ranks() -> dict[bytes, int]:
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    t = Tokenizer(models.BPE())
    t.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(vocab_size=700, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    t.train_from_iterator(CORPUS * 20, trainer)
    out = ranks_of(t.get_vocab())
    assert sorted(out.values()) == list(range(len(out))) and len(out) > 400
    for tok in UNREACHABLE:
        out[tok] = len(out)
    return out


def write_folder(folder: Path, ranks: dict[bytes, int], named: dict[int, str], **config) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    lines = [f"{base64.b64encode(t).decode()} {r}" for t, r in sorted(ranks.items(), key=lambda kv: kv[1])]
    (folder / "tiktoken.model").write_text("\n".join(lines) + "\n")
    cfg = {"tokenizer_class": "TikTokenTokenizer", "bos_token": "[BOS]", "eos_token": "[EOS]",
           "auto_map": {"AutoTokenizer": ["tokenization_kimi.TikTokenTokenizer", None]},
           "added_tokens_decoder": {str(i): {"content": s, "special": True} for i, s in named.items()}}
    cfg.update(config)
    (folder / "tokenizer_config.json").write_text(json.dumps(cfg))
    return folder


def kimi_names(n: int) -> dict[int, str]:
    return {n: "[BOS]", n + 1: "[EOS]", n + 4: "<|im_end|>", n + 5: "<|im_user|>", n + 6: "<|im_assistant|>",
            n + 10: "<|im_middle|>"}


def reference(ranks: dict[bytes, int], named: dict[int, str]):
    """tokenization_kimi.TikTokenTokenizer's tiktoken.Encoding: ids n .. n + 257 after the ranks."""
    n = len(ranks)
    specials = {named.get(i, f"<|reserved_token_{i}|>"): i for i in range(n, n + KIMI_RESERVED_SPECIAL)}
    return tiktoken.Encoding("kimi", pat_str=KIMI_PATTERN, mergeable_ranks=ranks, special_tokens=specials)


@pytest.fixture(scope="module")
def pair(ranks, tmp_path_factory):
    named = kimi_names(len(ranks))
    tok = read_tokenizer(write_folder(tmp_path_factory.mktemp("kimi_tok"), ranks, named))
    return tok, reference(ranks, named)


def random_texts(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    points = [c for c in (rng.randrange(32, 0x30000) for _ in range(400)) if not 0xD800 <= c < 0xE000][:300]
    pool = list("aZ 9\n\r\t中文é😀'-.,!?sStT") + [chr(c) for c in points]  # no lone surrogates
    return ["".join(rng.choice(pool) for _ in range(rng.randrange(0, 60))) for _ in range(n)]


def test_texts_encode_and_decode_as_tiktoken(pair) -> None:
    tok, ref = pair
    for text in TEXTS + random_texts(2000, seed=0):
        want = ref.encode(text, allowed_special="all")
        assert tok.encode(text).ids == want, text
        assert tok.decode(want, skip_special_tokens=False) == ref.decode(want), text


def test_a_pre_token_that_is_a_token_is_taken_whole(pair, ranks) -> None:
    # tiktoken's shortcut: no merge path reaches these; merging alone would split them.
    tok, ref = pair
    for word in UNREACHABLE:
        text = word.decode()
        assert tok.encode(text).ids == ref.encode(text) == [ranks[word]], text


def test_special_tokens_are_named_matched_and_skipped(pair, ranks) -> None:
    tok, ref = pair
    n = len(ranks)
    assert tok.get_vocab_size(with_added_tokens=True) == n + KIMI_RESERVED_SPECIAL == ref.n_vocab
    assert tok.token_to_id("[EOS]") == n + 1 and tok.token_to_id(f"<|reserved_token_{n + 2}|>") == n + 2
    text = "[BOS]<|im_user|>Hi there<|im_middle|>ok<|im_end|>[EOS]"
    ids = ref.encode(text, allowed_special="all")
    assert tok.encode(text).ids == ids and ids[0] == n and ids[-1] == n + 1
    assert tok.decode(ids, skip_special_tokens=True) == "Hi thereok"
    assert tok.decode(ids, skip_special_tokens=False) == text


def test_a_split_utf8_sequence_decodes_with_replacement_characters(pair, ranks) -> None:
    tok, ref = pair
    data = "é中😀".encode()
    for k in range(1, len(data) + 1):
        ids = [ranks[bytes([b])] for b in data[:k]]
        assert tok.decode(ids) == ref.decode(ids) == data[:k].decode("utf-8", "replace"), k


def test_the_servers_token_bound_holds(pair) -> None:
    # A Split that keeps its matches drops no text: the byte-level bound stays.
    from memra.serve.handlers import max_token_chars

    tok, _ = pair
    per = max_token_chars(tok)
    assert per is not None
    for text in TEXTS + random_texts(300, seed=1):
        assert len(text) <= per * len(tok.encode(text).ids) or not text, text


def test_load_reads_the_tiktoken_model_and_the_cli_takes_text(ranks, tmp_path, capsys) -> None:
    # The Kimi-Linear fixture with its tokenizer.json swapped for a tiktoken.model: ids fit its
    # vocabulary of 272 when the ranks are the 256 bytes and a few merges.
    small = {t: r for t, r in ranks.items() if r < 256 or r < 268 and len(t) > 1}
    small = {t: i for i, t in enumerate(sorted(small, key=small.get))}
    folder = tmp_path / "kimi"
    shutil.copytree(FIXTURES / "tiny_kimi_linear", folder)
    (folder / "tokenizer.json").unlink()
    write_folder(folder, small, kimi_names(len(small)))
    model = memra.load(folder, max_batch=1, max_len=64, progress=False)
    ref = reference(small, kimi_names(len(small)))
    assert model.tokenizer.encode("The fox, 42.").ids == ref.encode("The fox, 42.")
    assert cli.main(["generate", str(folder), "--prompt", "The fox", "--max-new-tokens", "3", "--ignore-eos"]) == 0
    ids = model.generate(ref.encode("The fox"), max_new_tokens=3, ignore_eos=True)
    assert capsys.readouterr().out.strip() == ref.decode(ids).strip()


def test_a_tiktoken_model_of_another_class_is_not_read(ranks, tmp_path) -> None:
    folder = write_folder(tmp_path, ranks, {}, tokenizer_class="SomethingElse", auto_map={})
    assert read_tokenizer(folder) is None
    (folder / "tokenizer_config.json").unlink()
    assert read_tokenizer(folder) is None


@pytest.mark.parametrize("case, words", [
    ("bad_line", "line 2 is not 'base64(token) rank'"),
    ("bad_base64", "line 1 is not 'base64(token) rank'"),
    ("repeated", "line 3 holds a repeated token"),
    ("gap", "the ranks are not 0.."),
    ("no_byte", "byte 7 is not a token of its own"),
    ("special_in_vocab", "is also a token of the vocabulary"),
    ("special_twice", "is named twice"),
    ("bad_decoder", "added_tokens_decoder["),
    ("bad_config", "tokenizer_config.json is not valid JSON"),
])
def test_a_malformed_tokenizer_is_named(ranks, tmp_path, case, words) -> None:
    named = kimi_names(len(ranks))
    folder = write_folder(tmp_path, ranks, named)
    model_file = folder / "tiktoken.model"
    lines = model_file.read_text().splitlines()
    if case == "bad_line":
        lines[1] += " 7"
    elif case == "bad_base64":
        lines[0] = "@@@ 0"
    elif case == "repeated":
        lines[2] = lines[1].split()[0] + " 2"
    elif case == "gap":
        lines[-1] = lines[-1].split()[0] + f" {len(lines) + 3}"
    elif case == "no_byte":
        lines = [ln if base64.b64decode(ln.split()[0]) != b"\x07" else f"{base64.b64encode(b'@7@').decode()} "
                 f"{ln.split()[1]}" for ln in lines]  # its rank kept by another token
    elif case == "special_in_vocab":
        write_folder(folder, ranks, {**named, len(ranks) + 2: "a"})
    elif case == "special_twice":
        write_folder(folder, ranks, {**named, len(ranks) + 2: "[BOS]"})
    elif case == "bad_decoder":
        write_folder(folder, ranks, {}, added_tokens_decoder={str(len(ranks)): {"content": 5}})
    elif case == "bad_config":
        (folder / "tokenizer_config.json").write_text("{not json")
    if case in ("bad_line", "bad_base64", "repeated", "gap", "no_byte"):
        model_file.write_text("\n".join(lines) + "\n")
    with pytest.raises(ContractError) as e:
        read_tokenizer(folder)
    assert words in str(e.value) and e.value.code == 40025, str(e.value)
