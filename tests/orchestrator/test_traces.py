"""The shapes of a run's spans, in process, with the SDK's in-memory exporter: the API
request that creates a run is its trace's root (continuing a client's traceparent), the
context is kept on the run's row, and the worker's spans (pick-up, attempts, recordings,
waits) hang from it. The same over OTLP/HTTP with a real worker:
tests/integration/test_traces.py."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode
from rest_framework.test import APIClient

from api.runners import JobOutput
from common import tracing
from orchestrator import executor
from orchestrator.tasks import pick_up_run_task
from orchestrator_client.runner import Runner
from runs import services
from runs.engine import control
from runs.engine.start import run_start
from runs.models import Run, RunnerJob, Step
from runs.people import approvals
from runs.selectors import runner_job_list
from runs.waits import children
from tests import factories
from tests.factories import step
from tests.support import wait_until
from tests.tenants import make_tenant

pytestmark = pytest.mark.django_db(transaction=True)

CLIENT_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT = f"00-{CLIENT_TRACE}-00f067aa0ba902b7-01"


def plan_of(*steps: dict[str, Any], **task: Any) -> dict[str, Any]:
    spec = factories.plan(steps=1)
    spec["agents"][0]["tasks"][0] = {"name": "work", "steps": list(steps), **task}
    return spec


def started(*steps: dict[str, Any], **task: Any) -> Run:
    run = services.run_create(organization=factories.org(), plan=plan_of(*steps, **task))
    return run_start(run_id=run.pk)


def serve(run: Run) -> int:
    return executor.serve(
        str(run.pk), run.priority, worker="worker:test", task_id="bell-1", hard_limits=False
    )


def named(spans: Sequence[ReadableSpan], name: str) -> list[ReadableSpan]:
    return [span for span in spans if span.name == name]


def span_id_of(traceparent: str) -> int:
    return int(traceparent[36:52], 16)


def test_the_creating_request_is_the_runs_trace_and_continues_the_clients(
    traced: InMemorySpanExporter,
) -> None:
    tenant = make_tenant()
    answer = tenant.post(
        "/api/v1/runs", {"plan": factories.plan(steps=1), "start": True}, traceparent=CLIENT
    )
    assert answer.status_code == 201, answer.json()
    run = Run.objects.get(pk=answer.json()["id"])
    (request,) = named(traced.get_finished_spans(), "POST /api/v1/runs")
    assert request.kind == SpanKind.SERVER
    assert f"{request.context.trace_id:032x}" == CLIENT_TRACE
    assert request.parent is not None
    assert request.parent.span_id == 0x00F067AA0BA902B7
    assert run.trace_context == tracing.traceparent(request)  # type: ignore[arg-type]
    assert request.attributes is not None
    assert request.attributes["http.response.status_code"] == 201
    assert request.attributes["orchestrator.run.id"] == str(run.pk)


def test_without_a_traceparent_the_request_is_the_root(traced: InMemorySpanExporter) -> None:
    tenant = make_tenant()
    answer = tenant.post("/api/v1/runs", {"plan": factories.plan(steps=1)})
    (request,) = named(traced.get_finished_spans(), "POST /api/v1/runs")
    assert request.parent is None
    run = Run.objects.get(pk=answer.json()["id"])
    # Started by a request of its own: linked to the run's trace, which it keeps.
    tenant.post(f"/api/v1/runs/{run.pk}/start", {})
    (start,) = named(traced.get_finished_spans(), "POST /api/v1/runs/{run_id}/start")
    assert start.links[0].context.span_id == request.context.span_id
    assert Run.objects.get(pk=run.pk).trace_context == run.trace_context


def test_a_request_span_names_its_route_template_never_the_token_in_its_path(
    traced: InMemorySpanExporter,
) -> None:
    token = "cbt_0123456789abcdef.s3cr3t-callback-credential"
    answer = APIClient().post(f"/api/v1/callbacks/{token}", {"status": "completed"}, format="json")
    assert answer.status_code == 404, answer.json()
    (request,) = traced.get_finished_spans()
    assert request.name == "POST /api/v1/callbacks/{token}"
    assert request.attributes is not None
    assert request.attributes["http.route"] == "/api/v1/callbacks/{token}"
    assert request.attributes["http.response.status_code"] == 404
    shown = [request.name, *map(str, request.attributes.values())]
    assert not [text for text in shown if "s3cr3t" in text or "0123456789abcdef" in text]


def test_tracing_off_keeps_no_context_and_makes_no_span(traced: InMemorySpanExporter) -> None:
    tracing.enable(False)
    run = started(step("a"), step("b"))
    serve(run)
    assert Run.objects.get(pk=run.pk).status == "completed"
    assert Run.objects.get(pk=run.pk).trace_context == ""
    assert traced.get_finished_spans() == ()


def test_each_attempt_is_a_span_of_the_run_with_its_recording(
    traced: InMemorySpanExporter,
) -> None:
    run = started(step("a", tool="echo", params={"x": 1}), step("b"))
    assert serve(run) == 2
    spans = traced.get_finished_spans()
    root = span_id_of(Run.objects.get(pk=run.pk).trace_context)
    for name, tool in (("a", "echo"), ("b", "noop")):
        (attempt,) = named(spans, f"step {name}")
        assert attempt.parent is not None
        assert attempt.parent.span_id == root
        assert attempt.attributes is not None
        assert attempt.attributes["orchestrator.tool"] == tool
        assert attempt.attributes["orchestrator.attempt"] == 1
        assert attempt.attributes["orchestrator.outcome"] == "completed"
        assert "orchestrator.cost" in attempt.attributes
        records = [s for s in named(spans, "record") if s.parent == attempt.context]
        assert len(records) == 1


def test_a_retried_failure_has_its_delay_and_a_backoff_span(
    traced: InMemorySpanExporter,
) -> None:
    retry = {"max_attempts": 2, "backoff": "fixed", "base_delay_ms": 5000, "jitter": 0}
    flaky = step("flaky", tool="fail", params={"code": "transient", "until_attempt": 1})
    run = started({**flaky, "retry": retry})
    serve(run)
    spans = traced.get_finished_spans()
    (attempt,) = named(spans, "step flaky")
    assert attempt.attributes is not None
    assert attempt.attributes["orchestrator.outcome"] == "failed"
    assert attempt.attributes["orchestrator.error.code"] == "transient"
    assert attempt.attributes["orchestrator.retry"] is True
    assert 4000 < attempt.attributes["orchestrator.retry.delay_ms"] <= 5000
    assert attempt.status.status_code == StatusCode.ERROR
    (backoff,) = named(spans, "wait backoff")
    assert backoff.parent is not None
    assert backoff.parent.span_id == attempt.context.span_id
    assert backoff.end_time is not None
    assert backoff.start_time is not None
    assert 4.0e9 < backoff.end_time - backoff.start_time <= 5.0e9


def test_the_pick_up_is_a_span_of_the_run(traced: InMemorySpanExporter, settings: Any) -> None:
    settings.ENGINE_START_AT_ONCE_STEPS = 0  # every run waits for its pick-up
    run = started(step("a"))
    assert pick_up_run_task.run(str(run.pk), run.priority)
    spans = traced.get_finished_spans()
    (pick_up,) = named(spans, "run pick_up")
    assert pick_up.parent is not None
    assert pick_up.parent.span_id == span_id_of(Run.objects.get(pk=run.pk).trace_context)
    assert pick_up.attributes is not None
    assert pick_up.attributes["orchestrator.picked_up"]
    assert named(spans, "step a")  # served after it, by the same task


def test_an_approval_wait_is_a_span_from_the_database_times(
    traced: InMemorySpanExporter,
) -> None:
    run = started(step("sign", tool="approval"), step("after"))
    control.pick_up(run.pk)
    waited = Step.objects.get(run=run, name="sign").status_changed_at
    approvals.run_approve(run_id=run.pk)
    (wait,) = named(traced.get_finished_spans(), "wait approval")
    assert wait.parent is not None
    assert wait.parent.span_id == span_id_of(Run.objects.get(pk=run.pk).trace_context)
    assert wait.start_time == int(waited.timestamp() * 1e9)
    assert wait.attributes is not None
    assert wait.attributes["orchestrator.wait.outcome"] == "approved"


def test_a_child_run_is_a_trace_of_its_own_linked_to_its_parent_step(
    traced: InMemorySpanExporter,
) -> None:
    child_plan = factories.plan(steps=1)
    run = started(step("spawn", tool="run", params={"plan": child_plan, "execution_mode": "sync"}))
    serve(run)
    parent_step = Step.objects.get(run=run, name="spawn")
    child = Run.objects.get(parent_run=run)
    (attempt,) = named(traced.get_finished_spans(), "step spawn")
    assert parent_step.trace_context == tracing.traceparent(attempt)  # type: ignore[arg-type]
    assert child.trace_context[3:35] != run.trace_context[3:35]
    # The parent's own root (created here, outside any request) has no link.
    (root,) = [s for s in named(traced.get_finished_spans(), "run") if s.links]
    assert root.links[0].context.span_id == attempt.context.span_id
    serve(child)
    assert children.child_ended(child.pk)
    (wait,) = named(traced.get_finished_spans(), "wait child_run")
    assert wait.parent is not None
    assert wait.parent.span_id == attempt.context.span_id
    assert wait.links[0].context.trace_id == root.context.trace_id
    served = [s for s in traced.get_finished_spans() if s.name.startswith("step ")]
    assert {s.context.trace_id for s in served if s.name != "step spawn"} == {root.context.trace_id}


def test_a_runner_job_carries_its_attempts_context_and_the_runner_continues_it(
    traced: InMemorySpanExporter, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = started(step("agent", tool="runner", params={"prompt": "go"}))
    serve(run)
    job = RunnerJob.objects.get(run=run)
    (attempt,) = named(traced.get_finished_spans(), "step agent")
    assert job.trace_context == tracing.traceparent(attempt)  # type: ignore[arg-type]
    payload = dict(JobOutput(runner_job_list(organization=run.organization).get(pk=job.pk)).data)
    assert payload["traceparent"] == job.trace_context

    posted: list[tuple[str, dict[str, Any]]] = []
    runner = Runner(
        url="http://127.0.0.1:1",
        api_key="k",
        command=[
            sys.executable,
            "-c",
            "import os, json; print(json.dumps(os.environ['TRACEPARENT']))",
        ],
        hostname="h",
        project_dir="",
        executor_type="command",
        runner_id="r1",
    )
    monkeypatch.setattr(runner, "_post", lambda path, body: posted.append((path, body)))
    payload["id"] = str(payload["id"])
    runner.start(payload)
    # The job's own thread reports it (started, then completed).
    wait_until(lambda: len(posted) == 2, timeout=10, what="the runner's completion report")
    (job_span,) = named(traced.get_finished_spans(), "runner job")
    assert job_span.parent is not None
    assert job_span.parent.span_id == attempt.context.span_id
    assert posted[1][1]["result"] == tracing.traceparent(job_span)  # type: ignore[arg-type]
