"""Completion and chat-completion requests: prompt, limits and sampling checked (400s named),
the request queued on the scheduler (429 when full), its tokens turned into text with stop
strings cut out (memra.serve.text), and the answer sent whole or as server-sent events
(``data: {chunk}`` lines ending in ``data: [DONE]``; a failure mid-stream, such as a
NonFiniteError, is a ``data: {"error": {...}}`` event before ``[DONE]``).

A client that disconnects cancels its request (streaming: Starlette cancels the response
stream; otherwise the handler watches for ``http.disconnect``): the scheduler frees its slot in
its next round.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass

import numpy as np
from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from ..batch import RowSampling
from ..errors import ContractError, MemraError, NonFiniteError
from ..tokenizer import NO_TOKENIZER, encode_text
from .protocol import (ChatChoice, ChatChunkChoice, ChatCompletionChunk, ChatCompletionRequest,
                       ChatCompletionResponse, ChatDelta, ChatMessageOut, CompletionChoice, CompletionRequest,
                       CompletionResponse, ErrorInfo, Usage)
from .scheduler import SHUTTING_DOWN, QueueFullError, Request as GenRequest, ShuttingDownError, StoppedError
from .text import TextStream


class APIError(Exception):
    """An HTTP error in the OpenAI format (memra.serve.app renders it)."""

    def __init__(self, status: int, message: str, type_: str = "invalid_request_error",
                 param: str | None = None, code=None) -> None:
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type_, param, code


@dataclass
class ServerState:
    """What the handlers share: the model, its served name, the scheduler, metrics, the chat
    template (None: the checkpoint has none)."""

    model: object
    name: str
    scheduler: object
    metrics: object
    template: object
    max_request_bytes: int = 1 << 20  # the largest request body taken (413 past it)

    def __post_init__(self) -> None:
        # Sampling defaults: the checkpoint's generation_config.json where it sets them (as vLLM
        # does), else OpenAI's (temperature 1, top_p 1, no top-k). memra.load checked them with
        # the sampler's rules, so a request relying on them cannot fail on them.
        gen = self.model.generation_config
        self.default_temperature = gen.temperature if gen.temperature is not None else 1.0
        self.default_top_p = gen.top_p
        self.default_top_k = gen.top_k
        tok = self.model.tokenizer
        self.max_token_chars = max_token_chars(tok) if tok is not None else None


@dataclass
class Piece:
    """New text of a request (stop strings cut out), the token ids it came from, and the finish
    reason on the last piece."""

    text: str
    ids: list[int]
    finish: str | None


def _check_ids(state: ServerState, ids, param: str) -> list[int]:
    vocab = state.model.config.vocab_size
    bad = [t for t in ids if not 0 <= t < vocab]
    if bad:
        raise APIError(400, f"{param}: token id {bad[0]} is outside the vocabulary [0, {vocab})", param=param)
    return list(ids)


def _pre_tokenizers(spec: dict | None) -> list[dict]:
    """A tokenizer.json pre_tokenizer, Sequences flattened."""
    if not spec:
        return []
    if spec.get("type") == "Sequence":
        return [p for sub in spec.get("pretokenizers") or [] for p in _pre_tokenizers(sub)]
    return [spec]


def _keeps_text(spec: dict) -> bool:
    """Whether a pre-tokenizer only cuts the text (a Split that removes no match)."""
    return spec.get("type") == "Split" and spec.get("behavior") != "Removed"


def max_token_chars(tok) -> int | None:
    """The most characters of text one token of `tok` (a ``tokenizers.Tokenizer``) can stand for,
    where its vocabulary bounds that: a byte-level BPE (a ByteLevel pre-tokenizer, alone or after
    regex Splits that drop nothing: every byte of the text becomes one character of the token
    alphabet, none is dropped) without a normalizer (which could drop or merge characters), an
    unknown token, or an added token that strips the whitespace around it; then the longest vocabulary entry (an entry's character is
    one byte, so at most one character of text). None otherwise (no early refusal)."""
    try:
        spec = json.loads(tok.to_str())
    except Exception:  # noqa: BLE001 - a tokenizer that cannot describe itself: no bound
        return None
    model = spec.get("model") or {}
    pre = _pre_tokenizers(spec.get("pre_tokenizer"))
    if (spec.get("normalizer") is not None or model.get("type") != "BPE" or model.get("unk_token") is not None
            or not any(p.get("type") == "ByteLevel" for p in pre)
            or any(p.get("type") != "ByteLevel" and not _keeps_text(p) for p in pre)
            or any(a.get("lstrip") or a.get("rstrip") for a in spec.get("added_tokens") or [])):
        return None
    return max((len(t) for t in tok.get_vocab(with_added_tokens=True)), default=None)


def _refuse_if_certainly_long(state: ServerState, text: str, param: str) -> None:
    """400 for a prompt text that cannot fit --max-len whatever its tokens (len(text) / the most
    characters a token stands for), before tokenizing it: encoding holds the GIL, so a prompt of
    megabytes would stall every request for seconds."""
    per_token = state.max_token_chars
    max_len = state.model.cache.max_len
    if per_token and len(text) > per_token * max_len:
        raise APIError(400, f"This model's maximum context length is {max_len} tokens. However, the prompt's "
                            f"{len(text)} characters are at least {-(-len(text) // per_token)} tokens. Please "
                            f"reduce the length of the prompt.", param=param)


def _encode(tok, text: str, param: str, add_special_tokens: bool) -> list[int]:
    """The ids of a prompt; 400 naming `param` when the tokenizer fails on it."""
    try:
        return encode_text(tok, text, param, add_special_tokens)
    except ContractError as e:
        raise APIError(400, str(e), param=param) from None


def _prompt_of_completion(state: ServerState, body: CompletionRequest) -> list[int]:
    if isinstance(body.prompt, list):
        return _check_ids(state, body.prompt, "prompt")
    tok = state.model.tokenizer
    if tok is None:
        raise APIError(400, f"prompt: this model has {NO_TOKENIZER}; send the prompt as a list of token ids",
                       param="prompt")
    _refuse_if_certainly_long(state, body.prompt, "prompt")
    ids = _encode(tok, body.prompt, "prompt", True)  # special tokens as the post-processor says (vLLM)
    if not ids:
        raise APIError(400, "prompt: the prompt is empty", param="prompt")
    return ids


def _prompt_of_chat(state: ServerState, body: ChatCompletionRequest) -> list[int]:
    tok = state.model.tokenizer
    if state.template is None or tok is None:
        raise APIError(400, "messages: this model has no chat template (tokenizer_config.json's chat_template "
                            f"or chat_template.jinja) or {NO_TOKENIZER}; use /v1/completions", param="messages")
    kwargs = dict(body.chat_template_kwargs or {})
    flags = {}
    for key in ("add_generation_prompt", "continue_final_message"):
        flags[key] = kwargs.pop(key, None)  # there before the field: vLLM's order
        if flags[key] is None:
            flags[key] = getattr(body, key)
    if flags["continue_final_message"] and flags["add_generation_prompt"]:
        raise APIError(400, "continue_final_message: add_generation_prompt must be false with it (the model "
                            "continues the last message rather than starting a new one)",
                       param="continue_final_message")
    try:
        text = state.template.render([m.as_template_dict() for m in body.messages], **flags, **kwargs)
    except ContractError as e:
        raise APIError(400, f"messages: {e}", param="messages") from None
    _refuse_if_certainly_long(state, text, "messages")
    ids = _encode(tok, text, "messages", False)  # the template wrote the special tokens (transformers)
    if not ids:
        raise APIError(400, "messages: the chat template rendered an empty prompt", param="messages")
    return ids


def _returns_ids(state: ServerState, body) -> bool:
    """Whether the response carries token ids: when asked (return_token_ids, vLLM's extra), and
    always for a model without a tokenizer, whose text would be empty."""
    return body.return_token_ids or state.model.tokenizer is None


def _request(state: ServerState, body, ids: list[int], prompt_param: str) -> GenRequest:
    """The scheduler request for a checked body and prompt (APIError 400 for a bad limit)."""
    max_len = state.model.cache.max_len
    if body.max_tokens is None and len(ids) >= max_len:
        raise APIError(400, f"This model's maximum context length is {max_len} tokens. However, the prompt has "
                            f"{len(ids)} tokens, which leaves no room for the completion. Please reduce the length "
                            f"of the prompt.", param=prompt_param)
    max_tokens = body.max_tokens if body.max_tokens is not None else max_len - len(ids)
    if len(ids) + max(max_tokens, 1) > max_len:
        param = prompt_param if len(ids) >= max_len else "max_tokens"
        raise APIError(400, f"This model's maximum context length is {max_len} tokens. However, you requested "
                            f"{len(ids) + max_tokens} tokens ({len(ids)} in the prompt, {max_tokens} for the "
                            f"completion). Please reduce the length of the prompt or max_tokens.", param=param)
    if body.stop and state.model.tokenizer is None:
        raise APIError(400, f"stop: this model has {NO_TOKENIZER} to match stop strings on", param="stop")
    stop_ids = set(_check_ids(state, body.stop_token_ids, "stop_token_ids"))
    _check_ids(state, [int(k) for k in body.logit_bias or ()], "logit_bias")  # zeros only: no effect
    if not body.ignore_eos:
        stop_ids |= set(state.model.eos_token_ids)
    top_k = body.top_k if body.top_k is not None else state.default_top_k
    sampling = RowSampling(
        temperature=body.temperature if body.temperature is not None else state.default_temperature,
        top_k=top_k if top_k and top_k > 0 else None,
        top_p=body.top_p if body.top_p is not None else state.default_top_p,
        seed=body.seed % 2**64 if body.seed is not None else secrets.randbits(64))
    return GenRequest(prompt_ids=np.array(ids, np.int32), max_tokens=max_tokens, sampling=sampling,
                      stop_ids=frozenset(stop_ids))


def _submit(state: ServerState, req: GenRequest) -> None:
    try:
        state.scheduler.submit(req)
    except QueueFullError as e:
        raise APIError(429, f"the server is busy: {e}", "rate_limit_error", code="rate_limit_exceeded") from None
    except ShuttingDownError as e:
        raise APIError(503, str(e), "server_error", code=e.code) from None


async def _pieces(state: ServerState, req: GenRequest, text: TextStream) -> AsyncIterator[Piece]:
    """The request's output as it comes; the request is cancelled (its slot freed) when this
    ends early: a stop string, a disconnect, an error."""
    end = "cancelled"
    try:
        while True:
            ev = await req.events.get()
            if isinstance(ev, MemraError):
                end = "error"
                raise ev
            tok, finish = ev
            # A stop id (EOS or stop_token_ids) ends the request with "stop"; its own text is left
            # out, as vLLM leaves it out unless include_stop_str_in_output (refused here): only
            # the text held back (a stop string's possible start) comes out. Its id stays.
            if finish == "stop":
                piece = text.finish()
            else:
                piece = text.add(tok)
                if finish is not None and not text.stopped:
                    piece += text.finish()
            if text.stopped:
                finish = "stop"
            if finish is not None:
                end = finish
                yield Piece(piece, [tok], finish)
                return
            yield Piece(piece, [tok], None)
    finally:
        state.scheduler.cancel(req)
        state.metrics.on_end(req, end)


async def _until_disconnect(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def _collect(state: ServerState, req: GenRequest, text: TextStream, request: Request):
    """All pieces of a non-streamed request -> (text, ids, finish); None when the client left."""
    async def run():
        out, ids, finish = [], [], None
        async for p in _pieces(state, req, text):
            out.append(p.text)
            ids += p.ids
            finish = p.finish
        return "".join(out), ids, finish

    work = asyncio.ensure_future(run())
    gone = asyncio.ensure_future(_until_disconnect(request))
    await asyncio.wait({work, gone}, return_when=asyncio.FIRST_COMPLETED)
    gone.cancel()
    if not work.done():
        work.cancel()  # the client left: _pieces' cleanup cancels the request
        return None
    return work.result()


def _dump(model) -> dict:
    """A response model as the OpenAI wire format writes it: memra's optional extras
    (token_ids, prompt_token_ids, usage of a chunk) and a chunk delta's unset keys left out."""
    d = model.model_dump()
    for key in ("prompt_token_ids", "usage"):
        if d.get(key) is None and key in d:
            del d[key]
    for c in d.get("choices", []):
        for key in ("token_ids", "prompt_token_ids"):
            if c.get(key) is None:
                c.pop(key, None)
        if "delta" in c:
            c["delta"] = {k: v for k, v in c["delta"].items() if v is not None}
    return d


# Characters JSON leaves raw (ensure_ascii off) that str.splitlines() takes for line breaks: a
# client reading the stream by lines that way (httpx's iter_lines, requests' with
# decode_unicode) would get one event cut in two, so they are sent as \u escapes.
_LINE_BREAKS = (("\x85", "\\u0085"), ("\u2028", "\\u2028"), ("\u2029", "\\u2029"))


def _sse(obj: dict) -> str:
    """One server-sent event of `obj` as JSON on a single line (whatever line breaks the
    client's reader knows)."""
    data = json.dumps(obj, ensure_ascii=False)
    for char, escape in _LINE_BREAKS:  # str.replace: a fiftieth of str.translate's time
        data = data.replace(char, escape)
    return f"data: {data}\n\n"


def _stream(state: ServerState, body, req: GenRequest, text: TextStream, chat: bool) -> StreamingResponse:
    rid = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
    created = int(time.time())
    ids_out = _returns_ids(state, body)

    # One chunk made through the protocol's models; every later one a copy with its fields set
    # (no validation per token: the chunks of 64 streams are built on the event loop each step).
    if chat:
        template = _dump(ChatCompletionChunk(id=rid, created=created, model=state.name,
                                             choices=[ChatChunkChoice(delta=ChatDelta())]))
    else:
        template = _dump(CompletionResponse(id=rid, created=created, model=state.name,
                                            choices=[CompletionChoice(text="")]))

    def chunk(piece_text: str | None, ids: list[int] | None, finish: str | None, role: bool = False) -> dict:
        d = dict(template)
        c = dict(template["choices"][0])
        d["choices"] = [c]
        if chat:
            c["delta"] = {k: v for k, v in (("role", "assistant" if role else None), ("content", piece_text))
                          if v is not None}
        else:
            c["text"] = piece_text or ""
        c["finish_reason"] = finish
        if ids_out and ids is not None:
            c["token_ids"] = ids
        return d

    include_usage, continuous = body.stream_options.usage_chunks() if body.stream_options else (False, False)
    n_prompt = len(req.prompt_ids)

    def usage(n: int) -> dict:  # Usage's fields, without a validation per token
        return {"prompt_tokens": n_prompt, "completion_tokens": n, "total_tokens": n_prompt + n}

    async def events() -> AsyncIterator[str]:
        n = 0
        prompt_ids = req.prompt_ids.tolist() if ids_out else None  # on the first chunk (vLLM)
        try:
            if chat:
                first = chunk("", [] if ids_out else None, None, role=True)
                if continuous:
                    first["usage"] = usage(0)
                if prompt_ids is not None:
                    first["prompt_token_ids"], prompt_ids = prompt_ids, None
                yield _sse(first)
            async for p in _pieces(state, req, text):
                n += len(p.ids)
                if p.text or p.finish or ids_out:
                    c = chunk(p.text if (p.text or not chat) else None, p.ids, p.finish)
                    if p.finish:
                        c["choices"][0]["stop_reason"] = _stop_reason(state, body, text, p.finish, p.ids[-1])
                    if prompt_ids is not None:
                        c["choices"][0]["prompt_token_ids"], prompt_ids = prompt_ids, None
                    if continuous:
                        c["usage"] = usage(n)
                    yield _sse(c)
            if include_usage:
                last = chunk("", None, None)
                last["choices"], last["usage"] = [], usage(n)
                yield _sse(last)
        except MemraError as e:
            yield _sse({"error": _error_info(e).model_dump()})
        yield "data: [DONE]\n\n"

    return StreamingResponse(events(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})


def _stop_reason(state: ServerState, body, text: TextStream, finish: str | None, last: int | None):
    """vLLM's ``stop_reason``: the stop string that matched, or the stop_token_ids id that ended
    the request; None when it ended otherwise (EOS, which vLLM checks first, or max_tokens)."""
    if finish != "stop" or last is None:
        return None
    if text.matched is not None:
        return text.matched
    return None if not body.ignore_eos and last in state.model.eos_token_ids else last


def _error_info(e: MemraError) -> ErrorInfo:
    """The OpenAI error of a failure while generating: ``type`` non_finite_error or
    server_error, ``code`` memra's status code, or "server_shutting_down" for a request the
    server's stop ended (StoppedError: no memra status, the request itself was fine)."""
    code = SHUTTING_DOWN if isinstance(e, StoppedError) else e.code
    return ErrorInfo(message=f"{type(e).__name__}: {e}",
                     type="non_finite_error" if isinstance(e, NonFiniteError) else "server_error", code=code)


def check_model(state: ServerState, model: str | None) -> None:
    """404 model_not_found unless `model` (a request's ``model``, None: not given) is the served one."""
    if model is not None and model != state.name:
        raise APIError(404, f"The model `{model}` does not exist (this server serves `{state.name}`).",
                       "invalid_request_error", param="model", code="model_not_found")


async def _answer(state: ServerState, body, request: Request, ids: list[int], prompt_param: str, chat: bool):
    req = _request(state, body, ids, prompt_param)
    text = TextStream(state.model.tokenizer, body.stop)
    _submit(state, req)
    if body.stream:
        return _stream(state, body, req, text, chat)
    try:
        got = await _collect(state, req, text, request)
    except MemraError as e:  # the request was fine; the model could not finish it
        status = 422 if isinstance(e, NonFiniteError) else 503 if isinstance(e, StoppedError) else 500
        return JSONResponse({"error": _error_info(e).model_dump()}, status_code=status)
    if got is None:
        return Response(status_code=499)  # nobody reads it: the client closed the connection
    out, out_ids, finish = got
    usage = Usage(prompt_tokens=len(ids), completion_tokens=len(out_ids), total_tokens=len(ids) + len(out_ids))
    tids = out_ids if _returns_ids(state, body) else None
    pids = ids if _returns_ids(state, body) else None
    reason = _stop_reason(state, body, text, finish, out_ids[-1] if out_ids else None)
    rid = uuid.uuid4().hex
    if chat:  # the prompt's ids at the top (vLLM's chat), in the choice (vLLM's completions)
        resp = ChatCompletionResponse(id=f"chatcmpl-{rid}", model=state.name, usage=usage, prompt_token_ids=pids,
                                      choices=[ChatChoice(message=ChatMessageOut(content=out), finish_reason=finish,
                                                          stop_reason=reason, token_ids=tids)])
    else:
        resp = CompletionResponse(id=f"cmpl-{rid}", model=state.name, usage=usage,
                                  choices=[CompletionChoice(text=out, finish_reason=finish, stop_reason=reason,
                                                            token_ids=tids, prompt_token_ids=pids)])
    return JSONResponse(_dump(resp))


async def completion(state: ServerState, body: CompletionRequest, request: Request):
    """POST /v1/completions."""
    check_model(state, body.model)
    return await _answer(state, body, request, _prompt_of_completion(state, body), "prompt", chat=False)


async def chat_completion(state: ServerState, body: ChatCompletionRequest, request: Request):
    """POST /v1/chat/completions."""
    check_model(state, body.model)
    return await _answer(state, body, request, _prompt_of_chat(state, body), "messages", chat=True)
