"""One DAG run's whole trace, end to end: created through the API with a client's
`traceparent`, executed by the session's real Celery worker, every span exported over
OTLP/HTTP to a receiver on the loopback (bench/collector.py, decoding
``ExportTraceServiceRequest``), then the tree checked: parents, links, attributes
(docs/observability.md prints such a tree)."""

from __future__ import annotations

from typing import Any

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from bench.collector import Collector, ReceivedSpan, tree
from runs.models import Run, Step
from tests.integration.engine_support import wait_for
from tests.support import wait_until
from tests.tenants import make_tenant
from tests.tracing_support import export_to, provider

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("celery_worker")]

CLIENT_TRACE = "5b8efff798038103d269b633813fc60c"
CLIENT_SPAN = "eee19b7ec3c1b174"
CLIENT = f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"

RETRY = {"max_attempts": 2, "backoff": "fixed", "base_delay_ms": 200, "jitter": 0}
CHILD = {
    "name": "child",
    "agents": [
        {"name": "a", "tasks": [{"name": "t", "steps": [{"name": "inner", "tool": "noop"}]}]}
    ],
}
DAG = {
    "name": "traced-dag",
    "agents": [
        {
            "name": "agent",
            "tasks": [
                {
                    "name": "dag",
                    "mode": "dag",
                    "steps": [
                        {"name": "fetch", "tool": "echo", "params": {"n": 1}},
                        {
                            "name": "flaky",
                            "tool": "fail",
                            "params": {"code": "transient", "until_attempt": 1},
                            "retry": RETRY,
                            "depends_on": ["fetch"],
                        },
                        {
                            "name": "spawn",
                            "tool": "run",
                            "params": {"plan": CHILD, "execution_mode": "sync"},
                            "depends_on": ["fetch"],
                        },
                        {"name": "sign", "tool": "approval", "depends_on": ["flaky", "spawn"]},
                        {"name": "report", "tool": "noop", "depends_on": ["sign"]},
                    ],
                }
            ],
        }
    ],
}


@pytest.fixture
def exported(traced: InMemorySpanExporter, otlp_collector: Collector) -> Collector:
    """Tracing on here too, this process's spans (the API's) exported to the collector
    the worker exports to."""
    export_to(otlp_collector.endpoint)
    return otlp_collector


def test_a_dag_runs_whole_trace_over_otlp(exported: Collector) -> None:
    tenant = make_tenant()
    created = tenant.post("/api/v1/runs", {"plan": DAG, "start": True}, traceparent=CLIENT)
    assert created.status_code == 201, created.json()
    run_id = created.json()["id"]
    wait_for(Run.objects.get(pk=run_id), ("waiting_approval",))
    assert tenant.post(f"/api/v1/runs/{run_id}/approve", {}).status_code == 200
    run = wait_for(Run.objects.get(pk=run_id))
    assert run.status == "completed"
    child = Run.objects.get(parent_run=run)
    provider().force_flush()

    def trace_of(trace_id: str, names: set[str]) -> dict[str, list[ReceivedSpan]] | None:
        spans: dict[str, list[ReceivedSpan]] = {}
        for span in exported.spans(trace_id):
            spans.setdefault(span.name, []).append(span)
        return spans if names <= set(spans) else None

    expected = {
        "POST /api/v1/runs",
        *(f"step {name}" for name in ("fetch", "flaky", "spawn", "report")),
        "record",
        "wait backoff",
        "wait child_run",
        "wait approval",
    }
    spans = wait_until(lambda: trace_of(CLIENT_TRACE, expected), timeout=10, what="the run's spans")
    child_trace = child.trace_context[3:35]
    child_spans = wait_until(
        lambda: trace_of(child_trace, {"run", "step inner"}), timeout=10, what="the child's"
    )

    # The tree as docs/observability.md prints it (shown with `pytest -s`).
    print(tree([s for found in spans.values() for s in found], run.created_at.timestamp()))
    print(tree([s for found in child_spans.values() for s in found], run.created_at.timestamp()))

    # The client's span is the parent of the request that created the run; the request's
    # span is the run's context, the parent of every attempt.
    (request,) = spans["POST /api/v1/runs"]
    assert request.parent_span_id == CLIENT_SPAN
    assert request.service == "orchestrator-tests"
    assert run.trace_context == f"00-{CLIENT_TRACE}-{request.span_id}-01"
    attempts = [s for name, found in spans.items() if name.startswith("step ") for s in found]
    assert {s.parent_span_id for s in attempts} == {request.span_id}
    assert {s.service for s in attempts} == {"orchestrator-test-worker"}
    by_attempt = {(s.name, s.attributes["orchestrator.attempt"]): s for s in attempts}
    assert set(by_attempt) == {
        ("step fetch", 1), ("step flaky", 1), ("step flaky", 2), ("step spawn", 1),
        ("step report", 1),
    }  # fmt: skip
    assert by_attempt["step fetch", 1].attributes["orchestrator.tool"] == "echo"
    assert by_attempt["step fetch", 1].attributes["orchestrator.outcome"] == "completed"
    assert "orchestrator.cost" in by_attempt["step fetch", 1].attributes

    # Every attempt's recording is its child.
    records = spans["record"]
    assert sorted(s.parent_span_id for s in records) == sorted(s.span_id for s in attempts)

    # The failed attempt: its retry delay, a backoff span, then the second attempt.
    failed = by_attempt["step flaky", 1]
    assert failed.attributes["orchestrator.outcome"] == "failed"
    assert failed.attributes["orchestrator.retry"] is True
    assert 0 < failed.attributes["orchestrator.retry.delay_ms"] <= 200
    (backoff,) = spans["wait backoff"]
    assert backoff.parent_span_id == failed.span_id
    assert by_attempt["step flaky", 2].attributes["orchestrator.outcome"] == "completed"

    # The child run: a trace of its own, linked to the parent step's attempt; the step's
    # wait for it a span under the attempt, linked to the child's trace.
    spawn = by_attempt["step spawn", 1]
    assert spawn.attributes["orchestrator.outcome"] == "waiting"
    assert Step.objects.get(run=run, name="spawn").trace_context[36:52] == spawn.span_id
    (child_root,) = child_spans["run"]
    assert child_root.parent_span_id == ""
    assert child_root.links == [(CLIENT_TRACE, spawn.span_id, {"relation": "parent step"})]
    (inner,) = child_spans["step inner"]
    assert inner.parent_span_id == child_root.span_id
    (waited,) = spans["wait child_run"]
    assert waited.parent_span_id == spawn.span_id
    assert waited.links[0][:2] == (child_trace, child_root.span_id)
    assert waited.attributes["orchestrator.child_run.status"] == "completed"

    # The approval: a wait from the database's times, under the run's context.
    (approval,) = spans["wait approval"]
    assert approval.parent_span_id == request.span_id
    assert approval.attributes["orchestrator.wait.outcome"] == "approved"
    assert approval.end_ns > approval.start_ns
    assert _within(approval, request, by_attempt["step report", 1])


def _within(wait: ReceivedSpan, first: ReceivedSpan, last: ReceivedSpan) -> Any:
    """The wait began after the run's request and ended before its last step began."""
    return first.start_ns <= wait.start_ns and wait.end_ns <= last.start_ns
