"""`${secrets.NAME}` at run time: decrypted on the worker when the tool runs, and redacted
from everything the attempt leaves behind (output, error, events, logs, API answers);
`${step.id|name|attempt}` from the same resolver."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import pytest
from django.db import connection

from billing.secrets import secret_put
from common.redaction import REDACTED, redact, redact_text, redacting
from common.templates import UnresolvedReference, render_value
from config.logging import JsonFormatter, RedactSecrets
from orchestrator import executor
from orchestrator.context import StepContext
from runs import services
from runs.engine import control
from runs.engine.start import run_start
from runs.models import Run, Step
from runs.plan import PlanInvalid
from runs.selectors import run_history
from tests import factories
from tests.integration.engine_support import wait_for
from tests.tenants import Tenant, make_tenant

if TYPE_CHECKING:
    from pytest_django.fixtures import Settings as SettingsWrapper

    from tests.http_fixture import HttpServer

VALUE = "tok-9f8e7d6c5b4a-never-to-be-seen"
LEAKY_LOGGER = "tests.leaky_tool"


# --------------------------------------------------------------------------- helpers
def start_one_step(
    tenant: Tenant, tool: str, params: dict[str, Any], **fields: Any
) -> tuple[Run, int]:
    """A started, picked-up run of one step; returns it and the step's id (not run yet)."""
    spec = factories.plan(steps=1)
    spec["agents"][0]["tasks"][0]["steps"][0].update(tool=tool, params=params, **fields)
    run = services.run_create(organization=tenant.organization, plan=spec)
    run_start(run_id=run.pk)
    assert control.pick_up(run.pk)
    return run, Step.objects.get(run=run, name="step-0").pk


def stored_text() -> str:
    """Every row of the run hierarchy, its events and the ledger, as JSON text."""
    tables = ["runs_run", "runs_runattempt", "runs_agent", "runs_task", "runs_step"]
    tables += ["runs_runevent", "billing_ledgerentry"]
    parts = []
    with connection.cursor() as cursor:
        for table in tables:
            # The table names are the fixed list above.
            query = f"SELECT coalesce(string_agg(row_to_json(t)::text, ''), '') FROM {table} t"  # noqa: S608
            cursor.execute(query)
            parts.append(cursor.fetchone()[0])
    return "".join(parts)


def api_answers(tenant: Tenant, run: Run) -> bytes:
    """The raw bytes of every API answer about the run."""
    base = f"/api/v1/runs/{run.pk}"
    paths = [base, f"{base}/steps", f"{base}/events", f"{base}/tasks", "/api/v1/runs"]
    answers = [tenant.client.get(path) for path in paths]
    assert all(answer.status_code == 200 for answer in answers)
    return b"".join(answer.content for answer in answers)


@pytest.fixture
def tenant(db: None) -> Tenant:
    tenant = make_tenant()
    secret_put(organization=tenant.organization, name="TOKEN", value=VALUE)
    return tenant


# Callables the python tool may call in these tests (see `allow`).
def logs_and_raises(token: str) -> None:
    logging.getLogger(LEAKY_LOGGER).warning("calling the service with token=%s", token)
    raise RuntimeError(f"the service refused {token}")


def raises_value_error(token: str) -> None:
    raise ValueError(f"bad token {token!r}")


@pytest.fixture
def allow(settings: SettingsWrapper) -> Callable[[str], str]:
    def add(name: str) -> str:
        path = f"{__name__}.{name}"
        settings.PYTHON_TOOL_ALLOWLIST = [*settings.PYTHON_TOOL_ALLOWLIST, path]
        return path

    return add


# --------------------------------------------------------------------------- through the engine
@pytest.mark.django_db
def test_an_echoed_secret_is_redacted_from_the_output_and_every_api_answer(
    tenant: Tenant,
) -> None:
    params = {"token": "${secrets.TOKEN}", "header": "Bearer ${secrets.TOKEN}", "plain": "x"}
    run, step_id = start_one_step(tenant, "echo", params)

    assert executor.execute_step(step_id, worker="worker:test") == "completed"

    step = Step.objects.get(pk=step_id)
    assert step.output == {"token": REDACTED, "header": f"Bearer {REDACTED}", "plain": "x"}
    assert step.params == params  # the template is kept, never the rendered value
    assert Run.objects.get(pk=run.pk).status == "completed"
    assert VALUE.encode() not in api_answers(tenant, run)
    assert VALUE not in stored_text()


@pytest.mark.django_db
def test_the_http_tool_sends_the_real_value_and_its_echo_is_redacted(
    tenant: Tenant, http_server: HttpServer
) -> None:
    # The server echoes what it was sent, in its body and in a header.
    http_server.respond(
        "/echo", json={"received": f"Bearer {VALUE}", VALUE: "as a key"}, headers={"X-Echo": VALUE}
    )
    params = {
        "url": f"{http_server.url}/echo",
        "headers": {"Authorization": "Bearer ${secrets.TOKEN}"},
        "query": {"key": "${run.id}-${step.id}-${step.attempt}"},
    }
    run, step_id = start_one_step(tenant, "http", params)

    assert executor.execute_step(step_id, worker="worker:test") == "completed"

    (request,) = http_server.requests
    assert request.headers["authorization"] == f"Bearer {VALUE}"  # resolved on the worker
    assert request.query["key"] == [f"{run.pk}-{step_id}-1"]
    output = Step.objects.get(pk=step_id).output
    assert output["body"] == {"received": f"Bearer {REDACTED}", REDACTED: "as a key"}
    assert output["headers"]["x-echo"] == REDACTED
    assert VALUE.encode() not in api_answers(tenant, run)
    assert VALUE not in stored_text()


@pytest.mark.django_db
def test_an_error_message_holding_the_value_is_redacted(tenant: Tenant) -> None:
    params = {"code": "server_error", "message": "upstream said: ${secrets.TOKEN}"}
    run, step_id = start_one_step(tenant, "fail", params, retry={"max_attempts": 1})

    assert executor.execute_step(step_id, worker="worker:test") == "failed"

    step = Step.objects.get(pk=step_id)
    assert step.error["message"].endswith(f"server_error: upstream said: {REDACTED}")
    assert REDACTED in Run.objects.get(pk=run.pk).last_error["message"]
    assert run_history(run).exists()
    assert VALUE.encode() not in api_answers(tenant, run)
    assert VALUE not in stored_text()


@pytest.mark.django_db
def test_a_retried_error_keeps_the_value_out_of_every_event(tenant: Tenant) -> None:
    params = {"code": "rate_limited", "message": "${secrets.TOKEN}", "until_attempt": 1}
    run, step_id = start_one_step(tenant, "fail", params, retry={"max_attempts": 2})

    assert executor.execute_step(step_id, worker="worker:test") == "failed"  # will retry
    Step.objects.filter(pk=step_id).update(next_run_at=None)
    assert executor.execute_step(step_id, worker="worker:test") == "completed"

    retry_event = run_history(run).get(to_status="pending", entity="step")
    assert retry_event.payload["message"] == REDACTED
    assert VALUE.encode() not in api_answers(tenant, run)
    assert VALUE not in stored_text()


@pytest.mark.django_db
def test_a_tool_that_logs_and_raises_the_value_leaves_it_in_no_log_or_error(
    tenant: Tenant, allow: Callable[[str], str], caplog: pytest.LogCaptureFixture
) -> None:
    params = {"callable": allow("logs_and_raises"), "kwargs": {"token": "${secrets.TOKEN}"}}
    _, step_id = start_one_step(tenant, "python", params)

    with caplog.at_level(logging.INFO):
        assert executor.execute_step(step_id, worker="worker:test") == "failed"

    step = Step.objects.get(pk=step_id)
    assert step.error["code"] == "tool_error"
    assert step.error["message"] == f"RuntimeError: the service refused {REDACTED}"
    messages = caplog.messages
    assert f"calling the service with token={REDACTED}" in messages
    crash = next(r for r in caplog.records if r.name == "orchestrator.executor")
    assert crash.exc_text
    assert f"the service refused {REDACTED}" in crash.exc_text
    assert not any(VALUE in (r.getMessage() + (r.exc_text or "")) for r in caplog.records)
    assert VALUE not in stored_text()


@pytest.mark.django_db
def test_a_tool_failing_with_the_value_in_an_exception_is_redacted(
    tenant: Tenant, allow: Callable[[str], str]
) -> None:
    params = {"callable": allow("raises_value_error"), "kwargs": {"token": "${secrets.TOKEN}"}}
    _, step_id = start_one_step(tenant, "python", params)

    assert executor.execute_step(step_id, worker="worker:test") == "failed"

    error = Step.objects.get(pk=step_id).error
    assert error["code"] == "invalid_input"
    assert error["message"].endswith(f"bad token '{REDACTED}'")


@pytest.mark.django_db
def test_an_unknown_secret_fails_the_step_once_with_template_error(tenant: Tenant) -> None:
    params = {"token": "${secrets.MISSING}"}
    run, step_id = start_one_step(tenant, "echo", params, retry={"max_attempts": 5})

    assert executor.execute_step(step_id, worker="worker:test") == "failed"

    step = Step.objects.get(pk=step_id)
    assert (step.status, step.attempts) == ("failed", 1)
    assert step.error["code"] == "template_error"
    assert step.error["retryable"] is False
    assert "unknown secret 'MISSING'" in step.error["message"]
    assert Run.objects.get(pk=run.pk).status == "failed"


@pytest.mark.django_db
def test_another_organizations_secret_of_the_same_name_is_not_resolved(tenant: Tenant) -> None:
    other = make_tenant()
    _, step_id = start_one_step(other, "echo", {"token": "${secrets.TOKEN}"})

    assert executor.execute_step(step_id, worker="worker:test") == "failed"

    assert Step.objects.get(pk=step_id).error["code"] == "template_error"
    assert VALUE not in stored_text()


@pytest.mark.django_db
def test_a_secret_deleted_after_submission_fails_the_step_when_it_runs(tenant: Tenant) -> None:
    from billing.secrets import secret_delete

    _, step_id = start_one_step(tenant, "echo", {"token": "${secrets.TOKEN}"})
    assert secret_delete(organization=tenant.organization, name="TOKEN")

    assert executor.execute_step(step_id, worker="worker:test") == "failed"
    assert "unknown secret 'TOKEN'" in Step.objects.get(pk=step_id).error["message"]


@pytest.mark.django_db
def test_a_secret_in_a_condition_is_refused_at_submission(tenant: Tenant) -> None:
    spec = factories.plan(steps=1)
    spec["agents"][0]["tasks"][0]["steps"][0]["when"] = "${secrets.TOKEN} == 'x'"

    with pytest.raises(PlanInvalid, match="secrets cannot be used in conditions"):
        services.run_create(organization=tenant.organization, plan=spec)

    response = tenant.post("/api/v1/runs", {"plan": spec})
    assert response.status_code == 400
    assert "secrets cannot be used in conditions" in response.json()["message"]


@pytest.mark.django_db
def test_a_handler_resolves_and_redacts_secrets_too(tenant: Tenant) -> None:
    handler = {"name": "report", "tool": "echo", "params": {"auth": "${secrets.TOKEN}"}}
    run, step_id = start_one_step(
        tenant, "fail", {"message": "boom"}, retry={"max_attempts": 1}, on_error=[handler]
    )
    assert executor.execute_step(step_id, worker="worker:test") == "failed"
    handler_id = Step.objects.get(run=run, handler_for_id=step_id).pk

    assert executor.execute_step(handler_id, worker="worker:test") == "completed"

    assert Step.objects.get(pk=handler_id).output == {"auth": REDACTED}
    assert VALUE not in stored_text()


# --------------------------------------------------------------------------- the resolver
@pytest.mark.django_db
def test_the_context_decrypts_secrets_of_the_runs_organization_and_keeps_them(
    tenant: Tenant,
) -> None:
    run, step_id = start_one_step(tenant, "echo", {})
    context = StepContext(Step.objects.get(pk=step_id), run.pk, attempt=4)

    rendered = render_value({"a": "${secrets.TOKEN}", "n": "${step.attempt}"}, context)

    assert rendered == {"a": VALUE, "n": 4}
    assert context.secrets_used == {"TOKEN": VALUE}
    with pytest.raises(UnresolvedReference, match="unknown secret 'NOPE'"):
        context(("secrets", "NOPE"))


@pytest.mark.django_db
def test_the_step_fields_come_from_the_attempt_being_run(tenant: Tenant) -> None:
    params = {"key": "${run.id}-${step.id}-${step.attempt}", "name": "${step.name}"}
    run, step_id = start_one_step(tenant, "echo", params)

    assert executor.execute_step(step_id, worker="worker:test") == "completed"

    output = Step.objects.get(pk=step_id).output
    assert output == {"key": f"{run.pk}-{step_id}-1", "name": "step-0"}


# --------------------------------------------------------------------------- redaction itself
def test_redact_replaces_every_value_in_every_string_and_key() -> None:
    data = {"a": ["x SECRET y", ("SECRET",), 3, None, True], "SECRET-key": {"k": "SECRET"}}

    assert redact(data, ["SECRET"]) == {
        "a": [f"x {REDACTED} y", [REDACTED], 3, None, True],
        f"{REDACTED}-key": {"k": REDACTED},
    }
    assert data["a"][0] == "x SECRET y"  # a copy: the original is untouched


def test_redact_prefers_the_longest_value_and_never_rewrites_its_own_mark() -> None:
    assert redact_text("abcdef and abc", ["abc", "abcdef"]) == f"{REDACTED} and {REDACTED}"
    # One pass: the "e"s of an inserted mark are not secrets found again.
    assert redact_text("e x e", ["e"]) == f"{REDACTED} x {REDACTED}"


def test_an_empty_secret_is_not_redacted() -> None:
    assert redact({"a": "text"}, ["", ""]) == {"a": "text"}
    assert redact_text("text", [""]) == "text"


def test_redact_copes_with_output_nested_as_deep_as_json_allows() -> None:
    deep: Any = "SECRET"
    for _ in range(5000):
        deep = [deep]

    redacted = redact(deep, ["SECRET"])

    for _ in range(5000):
        redacted = redacted[0]
    assert redacted == REDACTED


class Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def test_the_log_filter_redacts_messages_arguments_tracebacks_and_extras() -> None:
    logger = logging.getLogger("tests.redaction")
    handler = Collect()
    handler.addFilter(RedactSecrets())
    logger.addHandler(handler)
    try:
        with redacting([VALUE]):
            try:
                raise RuntimeError(f"failed with {VALUE}")
            except RuntimeError:
                logger.exception("token %s", VALUE, extra={"detail": f"x{VALUE}x"})
        logger.warning("after the attempt: %s", VALUE)
    finally:
        logger.removeHandler(handler)

    during, after = handler.records
    line = JsonFormatter().format(during)
    assert VALUE not in line
    assert json.loads(line)["message"] == f"token {REDACTED}"
    assert f"failed with {REDACTED}" in json.loads(line)["exc_info"]
    assert json.loads(line)["detail"] == f"x{REDACTED}x"
    assert VALUE not in logging.Formatter().format(during)
    assert after.getMessage() == f"after the attempt: {VALUE}"  # outside an attempt: as is


def test_the_console_handler_carries_the_filter() -> None:
    console = next(h for h in logging.getLogger().handlers if isinstance(h, logging.StreamHandler))
    assert any(isinstance(f, RedactSecrets) for f in console.filters)


# --------------------------------------------------------------------------- a real worker
@pytest.mark.integration
@pytest.mark.django_db(transaction=True)
def test_a_real_worker_resolves_the_secret_and_records_it_redacted(celery_worker: str) -> None:
    spec = factories.plan(steps=1)
    spec["agents"][0]["tasks"][0]["steps"][0].update(
        tool="echo", params={"auth": "Bearer ${secrets.TOKEN}"}
    )
    organization = factories.org()
    secret_put(organization=organization, name="TOKEN", value=VALUE)
    run = services.run_create(organization=organization, plan=spec)
    run_start(run_id=run.pk)

    done = wait_for(run)

    assert done.status == "completed", done.last_error
    assert Step.objects.get(run=run).output == {"auth": f"Bearer {REDACTED}"}
    assert VALUE not in stored_text()
