"""The orchestrator's Python client and the ``orch`` CLI (docs/cli.md).

Usable without Django: it imports nothing of the server's code, only httpx (and typer and
rich for the CLI).

    from orchestrator_client import Client

    with Client("http://127.0.0.1:8000", "ork_...") as client:
        run = client.submit(plan)          # create and start
        done = client.wait(run["id"])      # until completed, failed or cancelled
"""

from __future__ import annotations

from orchestrator_client._version import __version__
from orchestrator_client.client import Client, api_root
from orchestrator_client.errors import (
    ApiError,
    AuthenticationFailed,
    BadRequest,
    Conflict,
    IdempotencyKeyReused,
    InsufficientCredits,
    InvalidPlan,
    InvalidTransition,
    NotFound,
    OrchestratorError,
    PermissionDenied,
    QuotaExceeded,
    RateLimited,
    ServerError,
    TransportError,
)
from orchestrator_client.pagination import Paginator
from orchestrator_client.plans import PlanFile, PlanFileError
from orchestrator_client.watch import RunWatcher, WatchUpdate

__all__ = [
    "ApiError",
    "AuthenticationFailed",
    "BadRequest",
    "Client",
    "Conflict",
    "IdempotencyKeyReused",
    "InsufficientCredits",
    "InvalidPlan",
    "InvalidTransition",
    "NotFound",
    "OrchestratorError",
    "Paginator",
    "PermissionDenied",
    "PlanFile",
    "PlanFileError",
    "QuotaExceeded",
    "RateLimited",
    "RunWatcher",
    "ServerError",
    "TransportError",
    "WatchUpdate",
    "__version__",
    "api_root",
]
