"""The REST API (docs/configuration.md, "API"; docs/api.md): DRF's classes, throttling,
bodies and pages, event streams, idempotency, the Prometheus token and the OpenAPI
document."""

from __future__ import annotations

from typing import Any

from config.settings.environment import env

# Every API view is authenticated by API key, throttled per key and answers errors as
# {code, message, details} unless it says otherwise.
REST_FRAMEWORK: dict[str, Any] = {
    "DEFAULT_RENDERER_CLASSES": ["rest_framework.renderers.JSONRenderer"],
    "DEFAULT_PARSER_CLASSES": ["api.parsers.BoundedJSONParser"],
    "DEFAULT_AUTHENTICATION_CLASSES": ["api.authentication.ApiKeyAuthentication"],
    "DEFAULT_PERMISSION_CLASSES": [
        "rest_framework.permissions.IsAuthenticated",
        "api.permissions.ScopePermission",
    ],
    "DEFAULT_THROTTLE_CLASSES": ["api.throttling.ApiKeyRateThrottle"],
    "EXCEPTION_HANDLER": "api.errors.api_exception_handler",
    "DEFAULT_SCHEMA_CLASS": "api.schema.PublicAutoSchema",
}
API_THROTTLE_RATE = env.string(
    "API_THROTTLE_RATE", "1200/min", "requests per API key (n/sec|min|hour|day)"
)
_rate_count, _, _rate_period = API_THROTTLE_RATE.partition("/")
if (
    not _rate_count.isdigit()
    or int(_rate_count) < 1
    or _rate_period not in ("s", "sec", "second", "m", "min", "minute", "h", "hour", "d", "day")
):
    env.errors.append(f"API_THROTTLE_RATE must look like 1200/min, got {API_THROTTLE_RATE!r}")
API_MAX_BODY_BYTES = env.integer(
    "API_MAX_BODY_BYTES", 2_000_000, "largest accepted request body, bytes", minimum=1000
)
API_PAGE_SIZE = env.integer("API_PAGE_SIZE", 50, "default page size", minimum=1)
API_MAX_PAGE_SIZE = env.integer(
    "API_MAX_PAGE_SIZE", 500, "largest page size a client may ask", minimum=1
)
# A run's event stream (api/streams.py) sends a comment this often, in seconds, so that
# proxies and clients see a live connection, and reads PostgreSQL again each time (a
# wake-up lost with Redis is then late by this much at most).
API_STREAM_HEARTBEAT_S = env.number(
    "API_STREAM_HEARTBEAT_S", 15, "seconds between an event stream's keep-alive comments"
)
if not 0 < API_STREAM_HEARTBEAT_S <= 300:
    env.errors.append(f"API_STREAM_HEARTBEAT_S must be in (0, 300], got {API_STREAM_HEARTBEAT_S}")
# A write of an event stream (its events, a keep-alive) must be taken by the client
# within this many seconds, or the stream is dropped and its place freed: a client that
# stops reading would otherwise hold its connection, and its place, for good.
API_STREAM_SEND_TIMEOUT_S = env.number(
    "API_STREAM_SEND_TIMEOUT_S", 10, "seconds a client may take to accept one write of a stream"
)
if not 0 < API_STREAM_SEND_TIMEOUT_S <= 300:
    env.errors.append(
        f"API_STREAM_SEND_TIMEOUT_S must be in (0, 300], got {API_STREAM_SEND_TIMEOUT_S}"
    )
IDEMPOTENCY_TTL_HOURS = env.integer(
    "IDEMPOTENCY_TTL_HOURS", 24, "hours an Idempotency-Key response is kept", minimum=1
)
# Prometheus (`GET /metrics`, web/prometheus.py): it answers only to this bearer
# token; unset, the endpoint does not exist. `make run` generates one into .data/metrics-token.
METRICS_TOKEN = env.string(
    "METRICS_TOKEN", "", "bearer token /metrics answers to; empty: no /metrics (404)"
)
SPECTACULAR_SETTINGS: dict[str, Any] = {
    "TITLE": "Run orchestrator API",
    "DESCRIPTION": (
        "Create, start, watch and control runs; read your balance and ledger. "
        "Authenticate with `Authorization: Bearer <api key>`. Errors are "
        "`{code, message, details}`; every POST accepts an `Idempotency-Key`. "
        "See docs/api.md."
    ),
    "VERSION": "1",
    "SERVE_INCLUDE_SCHEMA": False,
    # The docs pages' scripts from our static files (drf_spectacular_sidecar), never a CDN.
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    # The schema and its docs page are public (they describe, they do not expose data).
    "SERVE_PERMISSIONS": ["rest_framework.permissions.AllowAny"],
    "SERVE_AUTHENTICATION": [],
    "SCHEMA_PATH_PREFIX": r"/api/v1",
    "COMPONENT_SPLIT_REQUEST": True,
    "ENUM_NAME_OVERRIDES": {
        "RunStatusEnum": "runs.states.RunStatus",
        "NodeStatusEnum": "runs.states.NodeStatus",
        "StepStatusEnum": "runs.states.StepStatus",
        "ModeEnum": "runs.models.Mode",
        "FailureModeEnum": "runs.models.FailureMode",
        "ScheduleStatusEnum": "schedules.models.ScheduleStatus",
        "FireStatusEnum": "schedules.models.FireStatus",
        "CallbackStatusEnum": "api.callbacks.CALLBACK_STATUSES",
    },
    "POSTPROCESSING_HOOKS": [
        "drf_spectacular.hooks.postprocess_schema_enums",
        "api.schema.strict_request_bodies",
    ],
}
