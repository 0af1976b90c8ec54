"""The tracing helpers every layer uses (common.tracing), the SDK's set-up from the OTEL_*
variables (config.otel) and the trace ids on log lines (common.logcontext,
config.logging)."""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime, timedelta

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from common import logcontext, tracing
from config import otel
from config.env import Env
from config.logging import JsonFormatter, TextFormatter

CLIENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"

logger = logging.getLogger("tests.tracing")


def test_off_every_helper_is_a_no_op_and_stores_nothing() -> None:
    assert not tracing.enabled
    with tracing.span("x") as span:
        assert not span.is_recording()
        assert tracing.traceparent() == ""
    assert tracing.span("x") is tracing.span("y")  # one shared no-op, nothing allocated
    assert tracing.run_context() == ""
    assert tracing.ids() is None
    assert tracing.start("x") is trace.INVALID_SPAN


def test_a_span_continues_a_stored_traceparent(traced: InMemorySpanExporter) -> None:
    with tracing.span("child", parent_context=CLIENT) as span:
        stored = tracing.traceparent()
    (finished,) = traced.get_finished_spans()
    assert finished.context.trace_id == int("0af7651916cd43dd8448eb211c80319c", 16)
    assert finished.parent is not None
    assert finished.parent.span_id == int("b7ad6b7169203331", 16)
    assert (
        stored == f"00-{finished.context.trace_id:032x}-{span.get_span_context().span_id:016x}-01"
    )


def test_an_empty_stored_context_traces_nothing(traced: InMemorySpanExporter) -> None:
    """A run created while tracing was off keeps no context: nothing is traced for it."""
    with tracing.span("untraced", parent_context="") as span:
        assert not span.is_recording()
    tracing.emit("wait", parent_context="", started=datetime.now(UTC), ended=datetime.now(UTC))
    assert traced.get_finished_spans() == ()


def test_a_request_traceparent_is_honoured_from_a_wsgi_environ(
    traced: InMemorySpanExporter,
) -> None:
    context = tracing.from_headers({"HTTP_TRACEPARENT": CLIENT})
    assert context is not None
    assert tracing.from_headers({"HTTP_TRACEPARENT": "garbage"}) is None
    assert tracing.from_headers({}) is None


def test_a_new_runs_context_is_the_current_span_or_a_root_of_its_own(
    traced: InMemorySpanExporter,
) -> None:
    with tracing.span("request") as request:
        assert tracing.run_context() == tracing.traceparent(request)
    own = tracing.run_context()
    assert own
    assert own[3:35] != tracing.traceparent(request)[3:35]
    linked = tracing.run_context(linked_to=tracing.traceparent(request))
    root = {span.name: span for span in traced.get_finished_spans() if span.parent is None}
    assert set(root) == {"request", "run"}
    child = [s for s in traced.get_finished_spans() if tracing.traceparent(s) == linked]  # type: ignore[arg-type]
    assert child[0].links[0].context.span_id == request.get_span_context().span_id


def test_an_emitted_wait_has_the_databases_times(traced: InMemorySpanExporter) -> None:
    began = datetime(2026, 1, 1, tzinfo=UTC)
    tracing.emit(
        "wait approval", parent_context=CLIENT, started=began, ended=began + timedelta(seconds=3)
    )
    (span,) = traced.get_finished_spans()
    assert span.end_time is not None
    assert span.start_time is not None
    assert span.end_time - span.start_time == 3_000_000_000


def test_log_records_carry_the_trace_and_span_ids_beside_the_run(
    traced: InMemorySpanExporter, caplog: pytest.LogCaptureFixture
) -> None:
    logcontext.install()
    with caplog.at_level(logging.WARNING), logcontext.bound(run_id="r1", step_id=7):
        with tracing.span("step") as span:
            logger.warning("inside")
        logger.warning("outside")
    inside, outside = caplog.records
    context = span.get_span_context()
    assert (inside.trace_id, inside.span_id) == (  # type: ignore[attr-defined]
        f"{context.trace_id:032x}",
        f"{context.span_id:016x}",
    )
    assert not hasattr(outside, "trace_id")
    line = json.loads(JsonFormatter().format(inside))
    assert line["run_id"] == "r1"
    assert line["trace_id"] == f"{context.trace_id:032x}"
    text = TextFormatter("%(levelname)s %(message)s").format(inside)
    assert text == (
        f"WARNING inside [run_id=r1 step_id=7 trace_id={context.trace_id:032x} "
        f"span_id={context.span_id:016x}]"
    )
    assert TextFormatter("%(message)s").format(logging.makeLogRecord({"msg": "x"})) == "x"


def test_the_otel_variables_are_read_through_the_settings_env() -> None:
    env = Env(
        environ={
            "OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318",
            "OTEL_EXPORTER_OTLP_HEADERS": "api-key=s3cr%3Dt,x=1",
            "OTEL_SERVICE_NAME": "orch",
            "OTEL_TRACES_SAMPLER": "parentbased_traceidratio",
            "OTEL_TRACES_SAMPLER_ARG": "0.25",
        }
    )
    config = otel.read(env)
    assert env.errors == []
    assert config.endpoint == "http://collector:4318"
    assert config.service_name == "orch"
    assert otel.parse_headers(config.headers) == {"api-key": "s3cr=t", "x": "1"}
    assert "0.25" in otel.sampler(config.sampler, config.sampler_arg).get_description()
    assert not otel.read(Env(environ={})).endpoint  # off by default
    wrong = Env(environ={"OTEL_EXPORTER_OTLP_ENDPOINT": "ftp://x", "OTEL_TRACES_SAMPLER": "no"})
    otel.read(wrong)
    assert len(wrong.errors) == 2
