"""The FastAPI application of ``memra serve``: routes, the OpenAI error format, start and stop.

=====================================  ==============================================
``GET /health`` (or ``HEAD``)          200 when the server is up
``GET /v1/models``                     the one model (``--served-model-name`` or the folder's name)
``GET /v1/models/{id}``                its card (404 ``model_not_found`` for another id)
``POST /v1/completions``               text completion (memra.serve.handlers)
``POST /v1/chat/completions``          chat completion through the checkpoint's chat template
``GET /metrics``                       Prometheus metrics (memra.serve.metrics)
=====================================  ==============================================

Errors are OpenAI's body ``{"error": {"message", "type", "param", "code"}}``: 400 for malformed
JSON (the position named) or a bad field (named in ``param``), 400 with both numbers when the
prompt plus ``max_tokens`` exceed ``--max-len``, 413 for a body over ``max_request_bytes``
(read no further), 404 ``model_not_found``, 429 when every slot is
busy and ``--max-waiting`` requests are queued; an unknown route is a 404 and a wrong method a
405 in the same format. A 500 means a bug in memra, never bad input; a 503, a server that is
stopping (a request running or queued when it stopped, or one that arrives then) or whose
engine thread ended after such a bug. Each error status is counted in /metrics
(``memra_http_errors_total{status}``). A client that disconnects
before its body is read gets nothing (499 in the access log) and no error is logged.
"""

from __future__ import annotations

import asyncio
import contextlib
import email.message
import logging
import os
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from ..batch import count_arg
from ..errors import ContractError, MemraError
from .chat_template import load_chat_template
from .handlers import APIError, ServerState, chat_completion, check_model, completion
from .metrics import Metrics
from .protocol import ChatCompletionRequest, CompletionRequest, ErrorInfo, ErrorResponse, ModelCard, ModelList
from .scheduler import SHUTTING_DOWN, Scheduler

log = logging.getLogger("memra.serve")


def error_json(status: int, message: str, type_: str, param: str | None = None, code=None) -> JSONResponse:
    """An OpenAI error body with HTTP `status`."""
    body = ErrorResponse(error=ErrorInfo(message=message, type=type_, param=param, code=code))
    return JSONResponse(body.model_dump(), status_code=status)


def validation_error(e: ValidationError | RequestValidationError) -> APIError:
    """The first problem pydantic found, as a 400 naming the field (or the JSON position)."""
    err = e.errors()[0]
    loc = [str(p) for p in err.get("loc", ()) if p != "body"]
    if err.get("type") == "json_invalid":
        detail = (err.get("ctx") or {}).get("error", err.get("msg", ""))
        if "hex escape" in detail:  # jiter's words for a \u escape that is no whole character too
            detail += " (a \\u escape must be a whole character: a lone surrogate such as \\ud800 is refused)"
        return APIError(400, f"malformed JSON body: {detail}")
    if err.get("type") in ("model_type", "model_attributes_type") and not loc:
        return APIError(400, "the request body must be a JSON object")
    param = ".".join(loc) or None
    msg = str(err.get("msg", "invalid value")).removeprefix("Value error, ")
    return APIError(400, f"{param}: {msg}" if param else msg, param=param)


async def read_body(request: Request, limit: int) -> bytes:
    """The request's body, refused with a 413 past `limit` bytes without reading the rest (a
    Content-Length over it is refused before any byte is read)."""
    def too_large(n: str) -> APIError:
        return APIError(413, f"the request body is {n} bytes; this server takes at most {limit} "
                             f"(max_request_bytes)", code="request_too_large")

    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise too_large(declared)
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise too_large(f"more than {limit}")
        chunks.append(chunk)
    return b"".join(chunks)


def check_content_type(request: Request) -> None:
    """APIError 415 unless the body is declared JSON (``application/json`` or a ``+json`` type)
    or not declared at all (then read as JSON, as FastAPI does). A browser page may POST
    ``text/plain`` or a form to any host without asking first (no CORS preflight); refusing
    those keeps a local server from generating for pages it never meant to serve."""
    declared = request.headers.get("content-type")
    if declared is None:
        return
    header = email.message.Message()  # FastAPI's parse of the header, and its rule below
    header["content-type"] = declared
    subtype = header.get_content_subtype()
    if header.get_content_maintype() != "application" or not (subtype == "json" or subtype.endswith("+json")):
        raise APIError(415, f"the request body must be JSON (Content-Type: application/json), got "
                            f"Content-Type: {declared[:80]!r}", code="unsupported_media_type")


async def parse(request: Request, cls, limit: int):
    """The body of `request` as pydantic model `cls` (APIError 400 when it is not one, 413 when
    it is over `limit` bytes, 415 when its Content-Type is not JSON: check_content_type); a
    warning names the fields it ignored (at most 8 of them)."""
    check_content_type(request)
    body = await read_body(request, limit)
    try:
        parsed = cls.model_validate_json(body or b"{}")
    except ValidationError as e:
        raise validation_error(e) from None
    extra = parsed.model_extra
    if extra:  # ignored, as vLLM ignores them, and named in the log as vLLM names them
        names = sorted(extra)
        shown = ", ".join(repr(n[:40]) for n in names[:8]) + (f" and {len(names) - 8} more" if len(names) > 8 else "")
        log.warning("%s: request fields memra does not know were ignored: %s", request.url.path, shown)
    return parsed


def default_max_request_bytes(max_len: int) -> int:
    """1 MiB plus 64 bytes a token of --max-len: room for any prompt that fits a slot."""
    return (1 << 20) + 64 * max_len


def _state(request: Request) -> ServerState:
    return request.app.state.memra


@contextlib.asynccontextmanager
async def _lifespan(app: FastAPI):
    st: ServerState = app.state.memra
    st.scheduler.start()
    log.info("memra serve: %s, %d slots x %d tokens on %s", st.name, st.model.cache.max_batch,
             st.model.cache.max_len, "cuda" if st.model.engine.is_cuda else "cpu")
    try:
        yield
    finally:
        st.scheduler.stop()


async def _health() -> Response:
    return Response(status_code=200)


def _card(st: ServerState) -> ModelCard:
    return ModelCard(id=st.name, max_model_len=st.model.cache.max_len)


async def _models(request: Request) -> dict:
    return ModelList(data=[_card(_state(request))]).model_dump()


async def _model_card(model_id: str, request: Request) -> dict:
    st = _state(request)
    check_model(st, model_id)
    return _card(st).model_dump()


async def _prometheus(request: Request) -> Response:
    m = _state(request).metrics
    return Response(m.render(), media_type=m.content_type)


async def _completions(request: Request):
    st = _state(request)
    return await completion(st, await parse(request, CompletionRequest, st.max_request_bytes), request)


async def _chat_completions(request: Request):
    st = _state(request)
    return await chat_completion(st, await parse(request, ChatCompletionRequest, st.max_request_bytes),
                                 request)


class _AnswerBugs:
    """ASGI middleware: an exception no handler took becomes a 500 error object (logged with its
    traceback) and the connection stays usable. Once a response has started (a stream) nothing
    can be answered any more, so the exception goes on to the server, which ends that response."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def send_started(message):
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                if message["status"] >= 400:  # refused, or failed before a response started
                    scope["app"].state.memra.metrics.http_errors.labels(status=str(message["status"])).inc()
            await send(message)

        try:
            await self.app(scope, receive, send_started)
        except asyncio.CancelledError:
            # uvicorn cancels what is left SHUTDOWN_TIMEOUT_S into a shutdown (a client still
            # sending its body, or not reading its stream): a 503 where nothing was answered
            # yet, else the connection just ends; not uvicorn's 500 and traceback for a bug
            if not scope["app"].state.memra.scheduler.stopping:
                raise
            if not started:
                await error_json(503, "the server is shutting down", "server_error",
                                 code=SHUTTING_DOWN)(scope, receive, send_started)
        except Exception as e:
            if started:
                raise
            log.exception("memra serve: unhandled error")
            await error_json(500, f"internal server error: {type(e).__name__}", "server_error")(
                scope, receive, send_started)


def create_app(model, served_model_name: str | None = None, *, max_waiting: int = 64,
               prefill_budget: int = 2048, max_request_bytes: int | None = None) -> FastAPI:
    """The server of one loaded memra.Model (its own cache's slots are the batch).

    served_model_name: the id of GET /v1/models and the ``model`` requests must name (default:
    the checkpoint folder's name); max_waiting: requests queued beyond the free slots before a
    429; prefill_budget: prompt tokens prefilled per scheduler round while others decode;
    max_request_bytes: the largest request body taken (413 past it; default
    default_max_request_bytes(the cache's max_len)), so that no body of megabytes is parsed,
    rendered or tokenized on the event loop. The scheduler's thread starts with the app
    (lifespan) and stops with it. ContractError (40025) for a model that is not a memra.Model, a
    served_model_name that is not None or a non-empty string, a max_waiting that is not an
    integer >= 0, or a prefill_budget or max_request_bytes that is not a positive integer
    (batch.count_arg); ContractError for the checkpoint's chat template when it cannot be read
    or does not compile (serve.chat_template.load_chat_template).
    """
    from ..model import Model

    if not isinstance(model, Model):
        raise ContractError(f"create_app: model must be a memra.Model (memra.load), got "
                            f"{type(model).__name__}", 40025)
    if served_model_name is not None and not (isinstance(served_model_name, str) and served_model_name):
        raise ContractError("create_app: served_model_name must be None or a non-empty string, got "
                            f"{served_model_name!r}", 40025)
    max_waiting = count_arg(max_waiting, "create_app: max_waiting", 0)
    prefill_budget = count_arg(prefill_budget, "create_app: prefill_budget", 1)
    limit = (default_max_request_bytes(model.cache.max_len) if max_request_bytes is None
             else count_arg(max_request_bytes, "create_app: max_request_bytes", 1, 2**63 - 1))
    # The folder's name with "." and ".." resolved ("memra serve ." served ""), a link's own name
    # kept (the name the user typed).
    name = served_model_name or Path(os.path.abspath(model.path)).name or str(model.path)
    scheduler = Scheduler(model, max_waiting=max_waiting, prefill_budget=prefill_budget)
    metrics = Metrics(scheduler)
    scheduler.on_token = metrics.on_token
    scheduler.on_step = metrics.batch_rows.observe
    state = ServerState(model=model, name=name, scheduler=scheduler, metrics=metrics,
                        template=load_chat_template(model.path), max_request_bytes=limit)

    app = FastAPI(title="memra", lifespan=_lifespan)
    app.state.memra = state

    @app.exception_handler(APIError)
    async def _api_error(request: Request, e: APIError) -> JSONResponse:
        return error_json(e.status, e.message, e.type, e.param, e.code)

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, e: RequestValidationError) -> JSONResponse:
        err = validation_error(e)
        return error_json(400, err.message, err.type, err.param)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, e: StarletteHTTPException) -> JSONResponse:
        kind = "not_found_error" if e.status_code == 404 else "invalid_request_error"
        r = error_json(e.status_code, f"{request.method} {request.url.path}: {e.detail}", kind)
        r.headers.update(e.headers or {})  # a 405's Allow (RFC 9110 15.5.6 requires it)
        return r

    @app.exception_handler(ContractError)
    async def _contract(request: Request, e: ContractError) -> JSONResponse:
        return error_json(400, str(e), "invalid_request_error", code=e.code)

    @app.exception_handler(MemraError)
    async def _memra(request: Request, e: MemraError) -> JSONResponse:
        log.error("memra serve: %s (%d): %s", type(e).__name__, e.code, e)
        return error_json(500, f"{type(e).__name__}: {e}", "server_error", code=e.code)

    @app.exception_handler(ClientDisconnect)
    async def _gone(request: Request, e: ClientDisconnect) -> Response:
        # The client left before its body was read: no one to answer and nothing of memra's
        # went wrong (the status is nginx's 499, for the access log).
        log.debug("memra serve: %s %s: the client disconnected before its body was read",
                  request.method, request.url.path)
        return Response(status_code=499)

    # Not an exception_handler(Exception): Starlette runs that one in its outermost middleware,
    # which answers and then re-raises, and uvicorn then drops the keep-alive connection under
    # the client's next request.
    app.add_middleware(_AnswerBugs)

    # The routes are module-level functions reading the state from request.app: FastAPI keeps
    # the endpoints it analysed in a module-level cache, and closures over the state held a
    # stopped server's model (and on CUDA its device memory) alive.
    app.add_api_route("/health", _health, methods=["GET", "HEAD"])
    app.add_api_route("/v1/models", _models, methods=["GET"])
    app.add_api_route("/v1/models/{model_id:path}", _model_card, methods=["GET"])
    app.add_api_route("/metrics", _prometheus, methods=["GET"])
    app.add_api_route("/v1/completions", _completions, methods=["POST"])
    app.add_api_route("/v1/chat/completions", _chat_completions, methods=["POST"])
    return app
