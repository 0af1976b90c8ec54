"""Log records carry the run, step, attempt and organization being worked on
(common.logcontext): in the executor, in a run's Celery task, and in an API request."""

from __future__ import annotations

import json
import logging
import threading
from typing import Any

import pytest

from common import logcontext
from config.logging import JsonFormatter
from runs.engine.start import run_start
from tests import factories

logger = logging.getLogger("tests.logcontext")


def record_of(caplog: pytest.LogCaptureFixture, message: str) -> logging.LogRecord:
    return next(record for record in caplog.records if record.getMessage() == message)


def test_bound_fields_reach_every_record_and_the_json_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    logcontext.install()
    with caplog.at_level(logging.WARNING), logcontext.bound(run_id="r1", organization_id="o1"):
        with logcontext.bound(step_id=7, attempt=None):
            logcontext.add(attempt=2)
            logger.warning("inside")
        logger.warning("outside the step")
    logger.warning("unbound")

    inside = record_of(caplog, "inside")
    assert (inside.run_id, inside.organization_id, inside.step_id, inside.attempt) == (  # type: ignore[attr-defined]
        "r1",
        "o1",
        7,
        2,
    )
    outside = record_of(caplog, "outside the step")
    assert not hasattr(outside, "step_id")
    assert not hasattr(record_of(caplog, "unbound"), "run_id")
    line = json.loads(JsonFormatter().format(inside))
    assert (line["run_id"], line["step_id"], line["attempt"]) == ("r1", 7, 2)


def test_threads_never_borrow_each_others_fields(caplog: pytest.LogCaptureFixture) -> None:
    logcontext.install()
    ready = threading.Barrier(2)

    def work(run: str) -> None:
        with logcontext.bound(run_id=run):
            ready.wait(5)
            logger.warning("from %s", run)

    with caplog.at_level(logging.WARNING):
        threads = [threading.Thread(target=work, args=(run,)) for run in ("a", "b")]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(10)

    for run in ("a", "b"):
        assert record_of(caplog, f"from {run}").run_id == run  # type: ignore[attr-defined]


# --------------------------------------------------------------------------- the engine
def logs_a_line() -> str:
    logging.getLogger("tests.tool").warning("a tool's own log line")
    return "logged"


@pytest.mark.django_db
def test_a_tools_log_lines_name_the_run_step_attempt_and_organization(
    settings: Any, caplog: pytest.LogCaptureFixture
) -> None:
    from orchestrator import executor
    from runs import services
    from runs.engine import control
    from runs.models import Step

    path = f"{__name__}.logs_a_line"
    settings.PYTHON_TOOL_ALLOWLIST = [*settings.PYTHON_TOOL_ALLOWLIST, path]
    organization = factories.org()
    spec = factories.plan(steps=1)
    spec["agents"][0]["tasks"][0]["steps"] = [
        {"name": "s1", "tool": "python", "params": {"callable": path}}
    ]
    run = services.run_create(organization=organization, plan=spec)
    run_start(run_id=run.pk)
    with caplog.at_level(logging.INFO):
        assert control.pick_up(run.pk)
        step = Step.objects.get(run=run)
        assert executor.execute_step(step.pk, worker="worker:test") == "completed"

    line = record_of(caplog, "a tool's own log line")
    assert line.organization_id == str(organization.pk)  # type: ignore[attr-defined]
    assert line.run_id == str(run.pk)  # type: ignore[attr-defined]
    assert line.step_id == step.pk  # type: ignore[attr-defined]
    assert line.attempt == 1  # type: ignore[attr-defined]


@pytest.mark.django_db(transaction=True)
def test_a_run_task_binds_its_run_and_the_pick_up_its_organization(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    from orchestrator import tasks
    from runs import services
    from runs.engine import control

    organization = factories.org()
    run = services.run_create(organization=organization, plan=factories.plan(steps=1))
    run_start(run_id=run.pk)
    seen: dict[str, Any] = {}
    original = control.pick_up

    def watched(run_id: Any, actor: str = "worker") -> bool:
        picked = original(run_id, actor=actor)
        seen.update(logcontext.current())
        return picked

    monkeypatch.setattr(control, "pick_up", watched)
    monkeypatch.setattr(tasks, "_serve_after_pick_up", lambda *args, **kwargs: None)

    assert tasks.pick_up_run_task.apply(args=[str(run.pk), 5]).get() is True

    assert seen == {"run_id": str(run.pk), "organization_id": str(organization.pk)}


# --------------------------------------------------------------------------- the API
@pytest.mark.django_db
def test_an_api_request_binds_its_run_and_organization(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from runs import selectors, services
    from tests.tenants import make_tenant

    tenant = make_tenant()
    run = services.run_create(organization=tenant.organization, plan=factories.plan())
    seen: dict[str, Any] = {}
    original = selectors.run_detail

    def watched(**kwargs: Any) -> Any:
        seen.update(logcontext.current())
        return original(**kwargs)

    monkeypatch.setattr(selectors, "run_detail", watched)

    assert tenant.get(f"/api/v1/runs/{run.pk}").status_code == 200
    assert seen == {"run_id": str(run.pk), "organization_id": str(tenant.organization.pk)}
    assert logcontext.current() == {}
