"""The engine's own paths announce what they do: a run finished by the SQL hot path (the
PL/pgSQL function that records a run's last step), and one failed by the general path,
each has its delivery, written in the engine's transaction (the engine in process, as
tests/runs/engine plays it)."""

from __future__ import annotations

from decimal import Decimal

import pytest

from common.tools.base import ToolError
from runs.engine.outcomes import Outcome
from tests.runs.conftest import transport  # noqa: F401 - fixtures the harness needs
from tests.runs.engine.conftest import engine_run  # noqa: F401
from tests.runs.engine.harness import EngineRun
from tests.runs.engine.test_hotpath import Start, hot_path_calls, one_agent, step
from tests.webhooks.support import endpoint
from webhooks.models import WebhookDelivery

pytestmark = pytest.mark.django_db


def deliveries(run: EngineRun) -> list[tuple[str, str]]:
    rows = WebhookDelivery.objects.filter(run=run.run).order_by("id")
    return [(d.event_type, d.payload["run"]["status"]) for d in rows]


def test_a_run_completed_by_the_sql_hot_path_has_its_delivery(
    engine_run: Start,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls = hot_path_calls(monkeypatch)
    run = engine_run(one_agent({"name": "t", "steps": [step("one"), step("two")]}))
    endpoint(run.run.organization)

    run.finish("one")
    run.finish("two", Outcome(output={"last": True}, cost=Decimal("0.001")))

    assert calls == [True, True]  # both recorded by the hot path, the run's end included
    assert run.refresh().status == "completed"
    assert deliveries(run) == [("run.completed", "completed")]


def test_a_run_failed_by_the_general_path_has_its_delivery(
    engine_run: Start,  # noqa: F811
) -> None:
    run = engine_run(one_agent({"name": "t", "steps": [step("only", retry={"max_attempts": 1})]}))
    endpoint(run.run.organization)

    run.finish("only", Outcome(error=ToolError("tool_error", "no", False)))

    assert run.refresh().status == "failed"
    assert deliveries(run) == [("run.failed", "failed")]
