"""``memra serve``'s sampling fields and defaults held to Model.generate's rules (CPU, loopback).

A request's ``temperature`` / ``top_k`` / ``top_p`` that the sampler would refuse (a temperature
finite as a double but inf as a float32, a top_k beyond int32, a top_p of 0) is a 400 naming the
field, refused before the request is scheduled, on both endpoints, streamed or not; the values
generate takes are served. The defaults a request falls back on come from generation_config.json
as memra.load checked them (a bad one never gets that far: tests/test_loader_errors.py).
"""

from __future__ import annotations

import json
import logging
import shutil

import pytest

httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

import memra  # noqa: E402
from serve_helpers import ServerThread, post_json, wait_idle  # noqa: E402

MAX_LEN = 64
BAD = [
    ({"temperature": 1e39}, "temperature", "float32"),
    ({"temperature": -1}, "temperature", ">= 0"),
    ({"temperature": 1.0, "top_k": 2**31}, "top_k", "2147483647"),
    ({"temperature": 1.0, "top_k": 2**40}, "top_k", "2147483647"),
    ({"temperature": 1.0, "top_p": 0}, "top_p", "(0, 1]"),
    ({"temperature": 1.0, "top_p": 1.5}, "top_p", "(0, 1]"),
    ({"temperature": 1.0, "top_p": 1e-46}, "top_p", "rounds to 0"),  # > 0 as a double, 0 as a float32
]


@pytest.fixture(autouse=True)
def _quiet(caplog):
    caplog.set_level(logging.ERROR, logger="memra")


@pytest.fixture(scope="module")
def model() -> memra.Model:
    return memra.load(memra.default_checkpoint(), max_batch=2, max_len=MAX_LEN, progress=False)


@pytest.fixture(scope="module")
def server(model):
    with ServerThread(model, served_model_name="tiny") as s:
        yield s


def _post(server: ServerThread, chat: bool, fields: dict) -> httpx.Response:
    body = {"messages": [{"role": "user", "content": "Hi"}]} if chat else {"prompt": "Hello"}
    path = "/v1/chat/completions" if chat else "/v1/completions"
    return httpx.post(server.url + path, json={**body, "max_tokens": 3, **fields}, timeout=30)


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("chat", [False, True])
@pytest.mark.parametrize("fields,param,words", BAD)
def test_a_value_the_sampler_refuses_is_a_400_naming_the_field(server, model, chat, stream, fields, param, words):
    with pytest.raises(memra.ContractError, match=param):  # what generate says of the same value
        model.generate([1, 2], 2, **fields)
    r = _post(server, chat, {**fields, "stream": stream})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" and err["param"] == param, err
    assert param in err["message"] and words in err["message"], err
    wait_idle(server)  # nothing was scheduled


@pytest.mark.parametrize("fields", [{"temperature": 0}, {"temperature": 3.0e38, "seed": 1},
                                    {"temperature": 1.0, "top_k": -1, "seed": 1},
                                    {"temperature": 1.0, "top_k": 2**31 - 1, "top_p": 1.0, "seed": 1}])
def test_values_generate_takes_are_served(server, fields):
    r = _post(server, False, fields)
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] >= 1


@pytest.mark.parametrize("seed", [-1, -(2**63)])
def test_a_negative_seed_is_generate_with_the_seed_plus_2_to_the_64(server, model, seed):
    # vLLM takes int64 seeds; generate takes 0 .. 2^64 - 1, and the README maps one onto the other.
    r = post_json(server, "/v1/completions", {"prompt": [3, 4, 5], "max_tokens": 6, "temperature": 1.0, "seed": seed,
                                              "ignore_eos": True, "return_token_ids": True})
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["token_ids"] == model.generate([3, 4, 5], 6, temperature=1.0, seed=seed + 2**64,
                                                                 ignore_eos=True)


def test_the_defaults_are_generation_configs(tmp_path, model):
    folder = tmp_path / "ckpt"
    shutil.copytree(memra.default_checkpoint(), folder)
    gen = json.loads((folder / "generation_config.json").read_text())
    gen.update(temperature=0.9, top_k=7, top_p=0.8)
    (folder / "generation_config.json").write_text(json.dumps(gen))
    sampled = memra.load(folder, max_batch=1, max_len=MAX_LEN, progress=False)
    prompt = [5, 6, 7]
    want = model.generate(prompt, 6, temperature=0.9, top_k=7, top_p=0.8, seed=11, ignore_eos=True)
    assert want != model.generate(prompt, 6, temperature=1.0, seed=11, ignore_eos=True)  # the defaults matter
    with ServerThread(sampled) as s:
        r = httpx.post(s.url + "/v1/completions", timeout=30, json={
            "prompt": prompt, "max_tokens": 6, "seed": 11, "ignore_eos": True, "return_token_ids": True})
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["token_ids"] == want
