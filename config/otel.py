"""The OpenTelemetry SDK, set up in one place for every process that traces: the web
(``config/wsgi.py``, in each gunicorn worker) and the Celery worker's pool processes
(``config/celery.py``, at ``worker_process_init``: a prefork child after its fork). The
reference runner, part of the client, which imports nothing of the server, sets up its
own (``orchestrator_client/tracing.py``).

Off unless ``OTEL_EXPORTER_OTLP_ENDPOINT`` is set: then no SDK provider is installed, the
API stays the no-op one and ``common.tracing.enabled`` stays False. The ``OTEL_*``
variables are read by the settings (``config/settings/core.py``, docs/configuration.md)
and handed to the SDK explicitly here. It imports no app.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote

from common import tracing

logger = logging.getLogger(__name__)

SAMPLERS = (
    "parentbased_always_on",
    "parentbased_always_off",
    "parentbased_traceidratio",
    "always_on",
    "always_off",
    "traceidratio",
)


@dataclass(frozen=True)
class TracingConfig:
    endpoint: str  # the collector's base URL; traces go to {endpoint}/v1/traces
    headers: str = ""  # W3C baggage style: key1=value1,key2=value2
    service_name: str = "orchestrator"
    sampler: str = "parentbased_always_on"
    sampler_arg: float = 1.0
    schedule_delay_ms: int = 5000
    export_timeout_s: float = 10.0


def read(env: Any) -> TracingConfig:
    """The OTEL_* variables through an ``config.env.Env`` (the settings)."""
    return TracingConfig(
        endpoint=env.url(
            "OTEL_EXPORTER_OTLP_ENDPOINT",
            "",
            "OTLP/HTTP collector base URL (traces go to /v1/traces); empty: tracing off",
            schemes=("http", "https"),
        ),
        headers=env.string(
            "OTEL_EXPORTER_OTLP_HEADERS", "", "headers sent to the collector: key=value,..."
        ),
        service_name=env.string(
            "OTEL_SERVICE_NAME", "orchestrator", "service.name of the traces' resource"
        ),
        sampler=env.choice(
            "OTEL_TRACES_SAMPLER", "parentbased_always_on", SAMPLERS, "which traces are kept"
        ),
        sampler_arg=env.number(
            "OTEL_TRACES_SAMPLER_ARG", 1.0, "the ratio kept by the traceidratio samplers"
        ),
        schedule_delay_ms=env.integer(
            "OTEL_BSP_SCHEDULE_DELAY", 5000, "ms between two exports of finished spans", minimum=1
        ),
    )


def parse_headers(text: str) -> dict[str, str]:
    headers = {}
    for item in text.split(","):
        name, _, value = item.partition("=")
        if name.strip() and value.strip():
            headers[unquote(name.strip())] = unquote(value.strip())
    return headers


_provider: Any = None


def setup(config: TracingConfig, service_suffix: str = "") -> bool:
    """Install the SDK's tracer provider with an OTLP/HTTP exporter when ``config`` names
    an endpoint (once per process); whether tracing is on."""
    global _provider
    if _provider is not None:
        return True
    if not config.endpoint:
        return False
    # Imported only when on: a process without an endpoint never loads the SDK.
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    provider = TracerProvider(
        resource=Resource.create(
            {"service.name": config.service_name, "service.namespace": "orchestrator"}
            | ({"orchestrator.process": service_suffix} if service_suffix else {})
        ),
        sampler=sampler(config.sampler, config.sampler_arg),
    )
    exporter = OTLPSpanExporter(
        endpoint=config.endpoint.rstrip("/") + "/v1/traces",
        headers=parse_headers(config.headers),
        timeout=config.export_timeout_s,
    )
    provider.add_span_processor(
        BatchSpanProcessor(exporter, schedule_delay_millis=config.schedule_delay_ms)
    )
    install(provider)
    return True


def install(provider: Any) -> None:
    """Make ``provider`` the process's (tests pass one with an in-memory exporter)."""
    global _provider
    from opentelemetry import trace

    _provider = provider
    trace.set_tracer_provider(provider)
    tracing.enable(True)


def sampler(name: str, ratio: float) -> Any:
    from opentelemetry.sdk.trace import sampling

    return {
        "always_on": sampling.ALWAYS_ON,
        "always_off": sampling.ALWAYS_OFF,
        "traceidratio": sampling.TraceIdRatioBased(ratio),
        "parentbased_always_on": sampling.ParentBased(sampling.ALWAYS_ON),
        "parentbased_always_off": sampling.ParentBased(sampling.ALWAYS_OFF),
        "parentbased_traceidratio": sampling.ParentBased(sampling.TraceIdRatioBased(ratio)),
    }[name]


def setup_from_settings(process: str) -> bool:
    """``setup`` with the values the Django settings read (web and worker)."""
    from django.conf import settings

    return setup(settings.TRACING, process)


def flush(timeout_ms: int = 5000) -> None:
    """Export what is finished (a process about to exit, a test about to read)."""
    if _provider is not None:
        _provider.force_flush(timeout_ms)
