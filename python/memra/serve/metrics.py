"""The server's Prometheus metrics (prometheus-client), in a registry of its own so several
servers can live in one process. Names follow vLLM's where one exists, with the ``memra_``
prefix:

==========================================  =====================================================
``memra_requests_total{finish_reason}``     requests ended: stop, length, error, cancelled
``memra_prompt_tokens_total``               prompt tokens of admitted requests
``memra_generation_tokens_total``           tokens generated
``memra_time_to_first_token_seconds``       histogram: request arrival to its first token
``memra_inter_token_latency_seconds``       histogram: between a request's successive tokens
``memra_requests_running``                  requests holding a cache slot
``memra_requests_waiting``                  requests queued for a slot
``memra_cache_slots_in_use``                slots of the model's cache held or holding tokens
``memra_cache_slots_total``                 slots of the model's cache (--max-batch)
``memra_decode_batch_rows``                 histogram: requests decoded together per step
``memra_http_errors_total{status}``         responses with an error status (400, 404, 413, 429,
                                            499, 500, 503, ...) the app gave: refused requests,
                                            and failures before a response started (an error
                                            inside a stream is a request ended with finish_reason
                                            error; uvicorn's own answer to malformed HTTP never
                                            reaches the app)
==========================================  =====================================================

Latencies are taken where the tokens reach the request's handler on the event loop.
"""

from __future__ import annotations

import weakref

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0,
                    2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)


class Metrics:
    """The metrics of one server; the gauges read `scheduler` when scraped."""

    content_type = CONTENT_TYPE_LATEST

    def __init__(self, scheduler) -> None:
        r = self.registry = CollectorRegistry()
        self.requests = Counter("memra_requests", "Requests ended, by finish reason", ["finish_reason"], registry=r)
        self.prompt_tokens = Counter("memra_prompt_tokens", "Prompt tokens of admitted requests", registry=r)
        self.generation_tokens = Counter("memra_generation_tokens", "Tokens generated", registry=r)
        self.ttft = Histogram("memra_time_to_first_token_seconds", "Request arrival to its first token",
                              buckets=_LATENCY_BUCKETS, registry=r)
        self.itl = Histogram("memra_inter_token_latency_seconds", "Time between a request's successive tokens",
                             buckets=_LATENCY_BUCKETS, registry=r)
        Gauge("memra_requests_running", "Requests holding a cache slot", registry=r).set_function(
            lambda: scheduler.running)
        Gauge("memra_requests_waiting", "Requests queued for a cache slot", registry=r).set_function(
            lambda: scheduler.waiting)
        Gauge("memra_cache_slots_in_use", "Cache slots held or holding tokens", registry=r).set_function(
            scheduler.slots_in_use)
        Gauge("memra_cache_slots_total", "Cache slots (--max-batch)", registry=r).set(scheduler.max_batch)
        self.http_errors = Counter("memra_http_errors", "Responses with an HTTP error status, by status",
                                   ["status"], registry=r)
        self.batch_rows = Histogram("memra_decode_batch_rows", "Requests decoded together per decode step",
                                    buckets=tuple(2.0**i for i in range(11)), registry=r)
        self._last: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # request -> its last token's time
        # requests on_end saw -> whether their prompt was counted (a token had reached the loop)
        self._ended: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    def on_token(self, req, now: float) -> None:
        """A token of `req` reached its handler at `now` (time.monotonic). A token of a request
        that already ended (drawn before the scheduler saw its cancel: a stop string, a
        disconnect) counts as generated only, not as its first token or a latency; its prompt
        counts once, also when the request ended before its first token (a client that left
        during the prefill: the prompt was still prefilled)."""
        if req in self._ended:
            if not self._ended[req]:
                self.prompt_tokens.inc(len(req.prompt_ids))
                self._ended[req] = True
            self.generation_tokens.inc()
            return
        last = self._last.get(req)
        if last is None:
            self.ttft.observe(now - req.arrival)
            self.prompt_tokens.inc(len(req.prompt_ids))
        else:
            self.itl.observe(now - last)
        self._last[req] = now
        self.generation_tokens.inc()

    def on_end(self, req, reason: str) -> None:
        """`req` ended with `reason` (stop, length, error, cancelled)."""
        self._ended[req] = self._last.pop(req, None) is not None
        self.requests.labels(finish_reason=reason).inc()

    def render(self) -> bytes:
        """The exposition text for GET /metrics."""
        return generate_latest(self.registry)
