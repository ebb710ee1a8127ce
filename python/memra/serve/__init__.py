"""``memra serve``: an OpenAI-compatible HTTP server with continuous batching.

    from memra.serve import create_app, run
    run(memra.load(path), host="127.0.0.1", port=8000)

Parts: :mod:`~memra.serve.app` (FastAPI routes, errors), :mod:`~memra.serve.handlers`
(completions and chat, streaming), :mod:`~memra.serve.scheduler` (continuous batching over the
model's cache slots), :mod:`~memra.serve.protocol` (the OpenAI request / response bodies),
:mod:`~memra.serve.chat_template` (transformers-compatible chat templates),
:mod:`~memra.serve.text` (incremental detokenizing, stop strings), :mod:`~memra.serve.metrics`
(Prometheus). Needs the packages fastapi, uvicorn, prometheus-client and jinja2 (memra's
dependencies).
"""

from __future__ import annotations


def create_app(model, served_model_name: str | None = None, **kwargs):
    """The FastAPI app serving `model` (see memra.serve.app.create_app)."""
    from .app import create_app as make

    return make(model, served_model_name, **kwargs)


SHUTDOWN_TIMEOUT_S = 5.0


def server(app, config):
    """A uvicorn.Server for a create_app `app` (config: its uvicorn.Config) whose shutdown first
    stops the app's scheduler: requests in flight end at once with "the server is shutting
    down" (a stream's last event before [DONE]; a 503 otherwise) and new ones get a 503, so their
    connections close and Ctrl-C or SIGTERM stops the server promptly, where uvicorn would wait
    for every running generation to finish. A connection that is not closed by then (a client
    still sending its body) is cut after SHUTDOWN_TIMEOUT_S seconds, unless the config sets its
    own ``timeout_graceful_shutdown``: uvicorn would wait for it for ever."""
    import uvicorn

    if config.timeout_graceful_shutdown is None:
        config.timeout_graceful_shutdown = SHUTDOWN_TIMEOUT_S

    class _Server(uvicorn.Server):
        async def shutdown(self, sockets=None):
            app.state.memra.scheduler.request_stop()
            await super().shutdown(sockets)
            # A second Ctrl-C (force_exit) makes uvicorn skip the app's lifespan shutdown; the
            # loop's teardown then cancelled the lifespan task, which starlette and uvicorn log
            # as a traceback. Ending it here costs the scheduler's current round, which the
            # scheduler's atexit stop waits for anyway.
            event = getattr(self.lifespan, "shutdown_event", None)  # set once the app's shutdown ran
            if self.force_exit and event is not None and not event.is_set():
                await self.lifespan.shutdown()

    return _Server(config)


def run(model, *, host: str = "127.0.0.1", port: int = 8000, served_model_name: str | None = None,
        max_waiting: int = 64, prefill_budget: int = 2048, max_request_bytes: int | None = None,
        log_level: str | int = "info") -> None:
    """Serve `model` with uvicorn until interrupted (Ctrl-C); the options are create_app's.
    log_level: one of uvicorn's names or a logging level number (logging.DEBUG), as uvicorn
    takes. ContractError (40025) for a host that is not a non-empty string, a port outside
    [0, 65535], another log_level, or what create_app refuses; nothing is served."""
    import uvicorn

    from ..batch import count_arg
    from ..errors import ContractError

    if not (isinstance(host, str) and host):
        raise ContractError(f"serve.run: host must be a non-empty string, got {host!r}", 40025)
    count_arg(port, "serve.run: port", 0, 65535)
    levels = ("critical", "error", "warning", "info", "debug", "trace")
    if not (log_level in levels or (isinstance(log_level, int) and not isinstance(log_level, bool)
                                    and log_level >= 0)):
        raise ContractError(f"serve.run: log_level must be one of {list(levels)}, got {log_level!r}", 40025)
    app = create_app(model, served_model_name, max_waiting=max_waiting, prefill_budget=prefill_budget,
                     max_request_bytes=max_request_bytes)
    server(app, uvicorn.Config(app, host=host, port=port, log_level=log_level)).run()


__all__ = ["SHUTDOWN_TIMEOUT_S", "create_app", "run", "server"]
