"""The API's profiler (bench/profile_api.py, api_layers.py, api_fixture.py): every route
answers through the whole stack, its statements and round trips are counted, its layers
add up to the request, and the instrumentation leaves nothing behind. Measuring is the
profiler's, not the suite's."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from bench import profile_api
from bench.api_layers import LAYER_NAMES, Ledger


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_layer_entered_inside_another_is_charged_once(monkeypatch: Any) -> None:
    clock = Clock()
    monkeypatch.setattr(time, "perf_counter", clock)
    ledger = Ledger()

    assert ledger.enter("django", force=True)
    clock.now = 1.0
    assert ledger.enter("services")
    clock.now = 4.0
    assert ledger.enter("connection", force=True)
    clock.now = 4.5
    ledger.leave()
    assert not ledger.enter("services")  # already on top: nothing to leave
    clock.now = 6.0
    ledger.leave()
    assert ledger.enter("auth")
    assert not ledger.enter("services")  # the key lookup's ORM stays auth's
    clock.now = 7.0
    ledger.leave()
    clock.now = 8.0
    ledger.leave()

    spent = {name: tally.seconds for name, tally in ledger.tallies.items() if tally.seconds}
    assert spent == {"django": 2.0, "services": 4.5, "connection": 0.5, "auth": 1.0}
    assert ledger.stack == []


@pytest.mark.django_db(transaction=True)
def test_every_route_is_answered_and_split_into_layers_that_add_up() -> None:
    from api.authentication import ApiKeyAuthentication
    from common import logcontext

    authenticate, bound = ApiKeyAuthentication.authenticate, logcontext.bound

    report = profile_api.profile(requests=3, warmup=1, profiled_route="create", top=5)

    assert [route.name for route in report.routes] == list(profile_api.ROUTE_NAMES)
    for route in report.routes:
        assert all(200 <= status < 300 for status in route.statuses), route.name
        assert sum(route.statuses.values()) == 6  # plain and instrumented
        assert route.queries > 0, route.name
        assert route.sql_ms > 0, route.name
        # The throttle's script (the request counter goes out at most once a second).
        assert route.redis >= 1, route.name
        for layer in ("auth", "throttle", "connection", "drf", "django"):
            assert route.layer_ms(layer) > 0, (route.name, layer)
        posted = route.label.startswith("POST")
        assert (route.layer_ms("idempotency") > 0) == posted, route.name
        if route.name != "floor":
            assert route.layer_ms("services") > 0, route.name
        assert route.layers_ms == pytest.approx(route.instrumented_ms, rel=0.05, abs=0.05)
    assert "cProfile of create" in report.profile_text
    document = json.loads(json.dumps(report.as_dict()))
    assert set(document["routes"]["start"]["layers"]) == set(LAYER_NAMES)
    assert len(profile_api.table(report).splitlines()) == 2 + len(report.routes)
    # The instrumented pass put every attribute back.
    assert ApiKeyAuthentication.authenticate is authenticate
    assert logcontext.bound is bound
