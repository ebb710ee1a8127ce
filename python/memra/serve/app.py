"""The FastAPI application of ``memra serve``: routes, the OpenAI error format, start and stop.

=====================================  ==============================================
``GET /health``                        200 when the server is up
``GET /v1/models``                     the one model (``--served-model-name`` or the folder's name)
``POST /v1/completions``               text completion (memra.serve.handlers)
``POST /v1/chat/completions``          chat completion through the checkpoint's chat template
``GET /metrics``                       Prometheus metrics (memra.serve.metrics)
=====================================  ==============================================

Errors are OpenAI's body ``{"error": {"message", "type", "param", "code"}}``: 400 for malformed
JSON (the position named) or a bad field (named in ``param``), 400 with both numbers when the
prompt plus ``max_tokens`` exceed ``--max-len``, 404 ``model_not_found``, 429 when every slot is
busy and ``--max-waiting`` requests are queued; an unknown route is a 404 and a wrong method a
405 in the same format. A 500 means a bug in memra, never bad input.
"""

from __future__ import annotations

import contextlib
import logging
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from ..errors import ContractError, MemraError
from .chat_template import load_chat_template
from .handlers import APIError, ServerState, chat_completion, completion
from .metrics import Metrics
from .protocol import ChatCompletionRequest, CompletionRequest, ErrorInfo, ErrorResponse, ModelCard, ModelList
from .scheduler import Scheduler

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
        return APIError(400, f"malformed JSON body: {detail}")
    if err.get("type") in ("model_type", "model_attributes_type") and not loc:
        return APIError(400, "the request body must be a JSON object")
    param = ".".join(loc) or None
    msg = str(err.get("msg", "invalid value")).removeprefix("Value error, ")
    return APIError(400, f"{param}: {msg}" if param else msg, param=param)


async def parse(request: Request, cls):
    """The body of `request` as pydantic model `cls` (APIError 400 when it is not one)."""
    body = await request.body()
    try:
        return cls.model_validate_json(body or b"{}")
    except ValidationError as e:
        raise validation_error(e) from None


def create_app(model, served_model_name: str | None = None, *, max_waiting: int = 64,
               prefill_budget: int = 2048) -> FastAPI:
    """The server of one loaded memra.Model (its own cache's slots are the batch).

    served_model_name: the id of GET /v1/models and the ``model`` requests must name (default:
    the checkpoint folder's name); max_waiting: requests queued beyond the free slots before a
    429; prefill_budget: prompt tokens prefilled per scheduler round while others decode.
    The scheduler's thread starts with the app (lifespan) and stops with it.
    """
    name = served_model_name or Path(model.path).name
    scheduler = Scheduler(model, max_waiting=max_waiting, prefill_budget=prefill_budget)
    metrics = Metrics(scheduler)
    scheduler.on_token = metrics.on_token
    scheduler.on_step = metrics.batch_rows.observe
    state = ServerState(model=model, name=name, scheduler=scheduler, metrics=metrics,
                        template=load_chat_template(model.path))

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        scheduler.start()
        log.info("memra serve: %s, %d slots x %d tokens on %s", name, model.cache.max_batch,
                 model.cache.max_len, "cuda" if model.engine.is_cuda else "cpu")
        try:
            yield
        finally:
            scheduler.stop()

    app = FastAPI(title="memra", lifespan=lifespan)
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
        return error_json(e.status_code, f"{request.method} {request.url.path}: {e.detail}", kind)

    @app.exception_handler(ContractError)
    async def _contract(request: Request, e: ContractError) -> JSONResponse:
        return error_json(400, str(e), "invalid_request_error", code=e.code)

    @app.exception_handler(MemraError)
    async def _memra(request: Request, e: MemraError) -> JSONResponse:
        log.error("memra serve: %s (%d): %s", type(e).__name__, e.code, e)
        return error_json(500, f"{type(e).__name__}: {e}", "server_error", code=e.code)

    @app.exception_handler(Exception)
    async def _bug(request: Request, e: Exception) -> JSONResponse:
        log.exception("memra serve: unhandled error")
        return error_json(500, f"internal server error: {type(e).__name__}", "server_error")

    @app.get("/health")
    async def health() -> Response:
        return Response(status_code=200)

    @app.get("/v1/models")
    async def models() -> dict:
        return ModelList(data=[ModelCard(id=name, max_model_len=model.cache.max_len)]).model_dump()

    @app.get("/metrics")
    async def prometheus() -> Response:
        return Response(metrics.render(), media_type=metrics.content_type)

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await completion(state, await parse(request, CompletionRequest), request)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        return await chat_completion(state, await parse(request, ChatCompletionRequest), request)

    return app
