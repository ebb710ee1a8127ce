"""``memra serve`` at edges a break-it pass found (session 22 of 2026-12-04): the metrics of a
request whose tokens keep coming after its handler ended it (a stop string, a disconnect).
"""

from __future__ import annotations

import types

import numpy as np
import pytest

pytest.importorskip("fastapi")
pytest.importorskip("prometheus_client")

from memra.serve.metrics import Metrics  # noqa: E402
from serve_helpers import metric  # noqa: E402


def _scheduler():
    return types.SimpleNamespace(running=0, waiting=0, max_batch=1, slots_in_use=lambda: 0)


def test_tokens_after_a_request_ended_do_not_count_it_again() -> None:
    # A stop string is found on the event loop, so the scheduler has often drawn one or two more
    # tokens of the request before it sees the cancel; they reach the loop after on_end. They
    # are generated tokens, but not a second first token: its prompt and time to first token
    # are counted once.
    m = Metrics(_scheduler())
    req = _Req()
    m.on_token(req, 1.0)
    m.on_token(req, 1.5)
    m.on_end(req, "stop")
    m.on_token(req, 2.0)  # drawn before the scheduler saw the cancel
    m.on_token(req, 2.5)
    text = m.render().decode()
    assert metric(text, "memra_prompt_tokens_total") == 5
    assert metric(text, "memra_time_to_first_token_seconds_count") == 1
    assert metric(text, "memra_inter_token_latency_seconds_count") == 1
    assert metric(text, "memra_generation_tokens_total") == 4
    assert metric(text, "memra_requests_total", 'finish_reason="stop"') == 1


def test_a_request_ended_before_its_first_token_still_counts_its_prompt() -> None:
    # A client that leaves during its prompt's prefill ends the request on the loop before its
    # first token arrives; the prompt was still prefilled, so it counts (once), while the time
    # to first token, which nobody saw, does not.
    m = Metrics(_scheduler())
    req = _Req()
    m.on_end(req, "cancelled")
    m.on_token(req, 1.0)  # drawn after the prefill, before the scheduler saw the cancel
    m.on_token(req, 1.5)
    text = m.render().decode()
    assert metric(text, "memra_prompt_tokens_total") == 5
    assert metric(text, "memra_generation_tokens_total") == 2
    assert metric(text, "memra_time_to_first_token_seconds_count") == 0
    assert metric(text, "memra_inter_token_latency_seconds_count") == 0


class _Req:
    prompt_ids = np.zeros(5, np.int32)
    arrival = 0.0
