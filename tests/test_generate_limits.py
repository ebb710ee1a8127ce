"""How much a generation may ask of a slot (CPU): the prompt takes one cache row a token and every
new token but the last (never fed back) one more, so ``len(prompt) + max(max_new_tokens - 1, 0)
<= max_len``; beyond it generate, stream and generate_batch raise CacheFullError naming the prompt
before anything runs, whatever max_new_tokens is (0 too), and leave every slot free.
"""

from __future__ import annotations

import logging

import numpy as np
import pytest

import memra

MAX_LEN = 8


@pytest.fixture(scope="module")
def model() -> memra.Model:
    logging.getLogger("memra").setLevel(logging.ERROR)
    return memra.load(memra.default_checkpoint(), max_batch=2, max_len=MAX_LEN, progress=False)


def _free(model: memra.Model) -> bool:
    c = model.cache
    return all(c.length(s) == 0 and c.owner(s) == 0 for s in range(c.max_batch))


@pytest.mark.parametrize("n,new", [(MAX_LEN + 1, 0), (MAX_LEN + 2, 0), (MAX_LEN + 1, 1), (MAX_LEN, 2),
                                   (2, MAX_LEN)])
def test_a_prompt_that_does_not_fit_is_cache_full(model, n, new):
    for call, arg in ((lambda: model.generate([1] * n, new), "prompt_ids"),
                      (lambda: model.stream([1] * n, new), "prompt_ids"),
                      (lambda: model.generate_batch([[1], [1] * n], new), "prompts[1]")):
        with pytest.raises(memra.CacheFullError) as info:
            call()
        assert info.value.code == 30002
        assert arg in str(info.value) and f"{n} tokens" in str(info.value) and str(MAX_LEN) in str(info.value)
        assert _free(model)


@pytest.mark.parametrize("n,new", [(MAX_LEN, 0), (MAX_LEN, 1), (MAX_LEN - 1, 2), (1, MAX_LEN)])
def test_a_prompt_that_fits_runs(model, n, new):
    got = model.generate([1] * n, new, ignore_eos=True)
    assert len(got) == new
    assert model.generate_batch([[1], [1] * n], new, ignore_eos=True)[1] == got
    assert _free(model)


@pytest.mark.parametrize("ids,named", [([2**70], "holds 1180591620717411303424, which does not fit in int32"),
                                       ([5, -(2**64)], "holds -18446744073709551616"),
                                       ([2**31], "holds 2147483648"),
                                       ([1.5], "must hold integers"), ([True, 2**70], "must hold integers")])
def test_token_ids_past_int32_are_named_as_such(model, ids, named):
    # Python ints past int64 reach numpy as objects: integers all the same, too large (40023),
    # not "must hold integers" (40020) as before; non-integers keep 40020.
    with pytest.raises(memra.ContractError, match=named) as ei:
        model.generate(ids, max_new_tokens=1)
    assert ei.value.code == (40020 if "integers" in named else 40023)
    assert _free(model)


@pytest.mark.parametrize("ids,named,code", [
    ([np.int64(5), 2**70], "holds 1180591620717411303424", 40023),  # numpy and Python ints mixed
    ([-1, 2**63], "holds 9223372036854775808", 40023),  # numpy would make it float64
    (np.array([1, 2**70], dtype=object), "holds 1180591620717411303424", 40023),
    ([[1], [1, 2]], "non-empty 1-D sequence", 40000),
])
def test_token_ids_of_mixed_kinds(model, ids, named, code):
    with pytest.raises(memra.ContractError, match=named) as ei:
        model.generate(ids, max_new_tokens=1)
    assert ei.value.code == code
    assert _free(model)


def test_an_object_array_of_small_ints_is_ids(model):
    # np.array([...], dtype=object) of ordinary ints: token ids (the first form of the check for
    # ints past int64 raised StopIteration here)
    want = model.generate([1, 2], max_new_tokens=2)
    assert model.generate(np.array([1, 2], dtype=object), max_new_tokens=2) == want
    assert _free(model)


def test_a_prompt_id_outside_the_vocabulary_names_prompt_ids(model):
    vocab = model.config.vocab_size
    for op, call in (("generate", lambda: model.generate([1, vocab], 2)), ("stream", lambda: model.stream([vocab], 2))):
        with pytest.raises(memra.ContractError, match=rf"^{op}: prompt_ids: token id {vocab} is outside") as ei:
            call()
        assert ei.value.code == 40023
    assert _free(model)


@pytest.mark.parametrize("kw,named", [({"temperature": -1}, "temperature"), ({"top_k": -1}, "top_k"),
                                      ({"top_p": 2.0}, "top_p"), ({"seed": -1}, "seed"),
                                      ({"max_new_tokens": -1}, "max_new_tokens"),
                                      ({"stop_token_ids": 1.5}, "stop_token_ids"),
                                      ({"ignore_eos": 1}, "ignore_eos")])
def test_generate_batch_names_itself_in_its_argument_errors(model, kw, named):
    args = {"max_new_tokens": 2, **kw}
    with pytest.raises(memra.ContractError, match=rf"^generate_batch: {named}\b"):
        model.generate_batch([[1], [2]], **args)
    assert _free(model)
