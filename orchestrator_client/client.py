"""``Client``: every route a client of the API uses, as a typed method, over httpx.

    with Client("http://127.0.0.1:8000", "ork_...") as client:
        run = client.submit({"name": "hello", "agents": [...]})
        done = client.wait(run["id"])

How a call is sent, retried (each POST under one ``Idempotency-Key``) and read, errors
included: ``orchestrator_client.http``. A run's, a schedule's and an artifact's routes:
``orchestrator_client.resources``; the others (billing, secrets, rate limits, webhooks,
runners, escalations, callbacks) here. Lists are ``Paginator``s
(``client.runs(status="failed")``, ``client.events(run_id)``): nothing is fetched until
they are iterated.

This package imports nothing from the server's code (an import-linter contract in
pyproject.toml keeps it so): it needs httpx only.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal, cast
from urllib.parse import quote

from orchestrator_client import config
from orchestrator_client.http import (
    API_PREFIX,
    api_root,
    decoded,
    retry_after_seconds,
    segment,
)
from orchestrator_client.pagination import Paginator
from orchestrator_client.resources.artifacts import Artifacts
from orchestrator_client.resources.runs import Runs
from orchestrator_client.resources.schedules import Schedules
from orchestrator_client.types import (
    Balance,
    Escalation,
    LedgerEntry,
    Organization,
    Page,
    PublishedTool,
    RateLimit,
    Runner,
    RunnerJob,
    Secret,
    Webhook,
    WebhookCreated,
    WebhookDelivery,
)


class Client(Runs, Schedules, Artifacts):
    """The API of one server, with one API key.

    ``url`` is the server's root (``http://127.0.0.1:8000``; a trailing ``/api/v1`` is
    accepted too). ``timeout`` is seconds per request; ``retries`` how many times a call
    is tried again after a transient failure (0: never). ``transport`` and ``sleep`` are
    for tests (an httpx transport, and what waits between tries).
    """

    @classmethod
    def from_config(cls, **options: Any) -> Client:
        """A client for what ``orch login`` saved, or ``ORCH_URL`` and ``ORCH_API_KEY``
        (``config.load``; ``config.ConfigError`` when neither says)."""
        settings = config.load()
        return cls(settings.url, settings.api_key, **options)

    # ------------------------------------------------------------------ billing
    def balance(self) -> Balance:
        return cast(Balance, self._get("billing/balance"))

    def ledger(
        self,
        *,
        type: str | None = None,
        run: str | None = None,
        page_size: int | None = None,
        limit: int | None = None,
    ) -> Paginator[LedgerEntry]:
        """Every movement of your credits, newest first (``type``: grant, reserve, charge,
        refund; ``run``: one run's)."""
        params = {"type": type, "run": run, "page_size": page_size}
        return cast(Paginator[LedgerEntry], self._pages("billing/ledger", params, limit))

    def organization(self) -> Organization:
        """Your organization's limits and quotas in force, and their use."""
        return cast(Organization, self._get("organization"))

    # ------------------------------------------------------------------ secrets
    def secrets(
        self, *, page_size: int | None = None, limit: int | None = None
    ) -> Paginator[Secret]:
        return cast(Paginator[Secret], self._pages("secrets", {"page_size": page_size}, limit))

    def put_secret(self, name: str, value: str) -> Secret:
        """Create or replace a secret; the answer never holds the value."""
        response = self.request("PUT", f"secrets/{segment(name)}", json={"value": value})
        return cast(Secret, decoded(response))

    def delete_secret(self, name: str) -> None:
        self.request("DELETE", f"secrets/{segment(name)}")

    # ------------------------------------------------------------------ rate limits
    def rate_limits(
        self, *, page_size: int | None = None, limit: int | None = None
    ) -> Paginator[RateLimit]:
        return cast(
            Paginator[RateLimit], self._pages("rate-limits", {"page_size": page_size}, limit)
        )

    def put_rate_limit(self, name: str, *, limit: int, period: str) -> RateLimit:
        """Declare or change the rate limit ``name``: at most ``limit`` units in any
        window of ``period`` (``"1m"``), shared by every step that names it."""
        response = self.request(
            "PUT", f"rate-limits/{segment(name)}", json={"limit": limit, "period": period}
        )
        return cast(RateLimit, decoded(response))

    def delete_rate_limit(self, name: str) -> None:
        self.request("DELETE", f"rate-limits/{segment(name)}")

    # ------------------------------------------------------------------ webhooks
    def webhooks(
        self, *, page_size: int | None = None, limit: int | None = None
    ) -> Paginator[Webhook]:
        """Your organization's webhook endpoints, newest first (docs/webhooks.md)."""
        return cast(Paginator[Webhook], self._pages("webhooks", {"page_size": page_size}, limit))

    def create_webhook(
        self,
        url: str,
        *,
        events: Sequence[str],
        secret: str | None = None,
        description: str | None = None,
        idempotency_key: str | None = None,
    ) -> WebhookCreated:
        """Register an endpoint for ``events``; the answer's ``secret`` (generated when
        none is given) is shown this once."""
        body = {"url": url, "events": list(events), "secret": secret, "description": description}
        return cast(WebhookCreated, self._post("webhooks", body, idempotency_key=idempotency_key))

    def webhook(self, webhook_id: str) -> Webhook:
        return cast(Webhook, self._get(f"webhooks/{segment(webhook_id)}"))

    def update_webhook(self, webhook_id: str, **fields: Any) -> Webhook:
        """Change the fields given (``url``, ``events``, ``secret``, ``description``,
        ``enabled``: False disables it, True enables it again)."""
        response = self.request("PATCH", f"webhooks/{segment(webhook_id)}", json=fields)
        return cast(Webhook, decoded(response))

    def delete_webhook(self, webhook_id: str) -> None:
        self.request("DELETE", f"webhooks/{segment(webhook_id)}")

    def test_webhook(
        self, webhook_id: str, *, idempotency_key: str | None = None
    ) -> WebhookDelivery:
        """Queue a ``webhook.test`` delivery to the endpoint; follow it in its deliveries."""
        path = f"webhooks/{segment(webhook_id)}/test"
        return cast(WebhookDelivery, self._post(path, None, idempotency_key=idempotency_key))

    def webhook_deliveries(
        self, webhook_id: str, *, page_size: int | None = None, limit: int | None = None
    ) -> Paginator[WebhookDelivery]:
        """The endpoint's deliveries, newest first, each with every attempt."""
        path = f"webhooks/{segment(webhook_id)}/deliveries"
        return cast(Paginator[WebhookDelivery], self._pages(path, {"page_size": page_size}, limit))

    def redeliver_webhook(
        self, webhook_id: str, delivery_id: str, *, idempotency_key: str | None = None
    ) -> WebhookDelivery:
        """Send a delivery again (same id and body), retried for a new window."""
        path = f"webhooks/{segment(webhook_id)}/deliveries/{segment(delivery_id)}/redeliver"
        return cast(WebhookDelivery, self._post(path, None, idempotency_key=idempotency_key))

    # ------------------------------------------------------------------ runners
    def runners(
        self, *, page_size: int | None = None, limit: int | None = None
    ) -> Paginator[Runner]:
        return cast(Paginator[Runner], self._pages("runners", {"page_size": page_size}, limit))

    def runner_jobs(
        self,
        *,
        run: str | None = None,
        step: int | None = None,
        status: str | Sequence[str] | None = None,
        runner_id: str | None = None,
        page_size: int | None = None,
        limit: int | None = None,
    ) -> Paginator[RunnerJob]:
        """Your runner jobs, newest first: one run's, one step's (every attempt), in some
        states (``status``: one or several), or one runner's."""
        params = {
            "run": run,
            "step": step,
            "status": status,
            "runner_id": runner_id,
            "page_size": page_size,
        }
        return cast(Paginator[RunnerJob], self._pages("runner-jobs", params, limit))

    def tools(
        self, *, page_size: int | None = None, limit: int | None = None
    ) -> Paginator[PublishedTool]:
        """The published tools your plans may name: the fleet's and your workers', each
        with its schemas, versions and who offers it now (docs/tools.md)."""
        return cast(Paginator[PublishedTool], self._pages("tools", {"page_size": page_size}, limit))

    def get_tool(self, name: str) -> PublishedTool:
        return cast(PublishedTool, self._get(f"tools/{quote(name, safe='')}"))

    def get_runner_job(self, job_id: str) -> RunnerJob:
        return cast(RunnerJob, self._get(f"runner-jobs/{segment(job_id)}"))

    def stop_runner_job(self, job_id: str, *, idempotency_key: str | None = None) -> RunnerJob:
        path = f"runner-jobs/{segment(job_id)}/stop"
        return cast(RunnerJob, self._post(path, None, idempotency_key=idempotency_key))

    # ------------------------------------------------------------------ escalations
    def escalations(
        self,
        *,
        status: str | None = None,
        run: str | None = None,
        page_size: int | None = None,
        limit: int | None = None,
    ) -> Paginator[Escalation]:
        params = {"status": status, "run": run, "page_size": page_size}
        return cast(Paginator[Escalation], self._pages("escalations", params, limit))

    def get_escalation(self, escalation_id: str) -> Escalation:
        return cast(Escalation, self._get(f"escalations/{segment(escalation_id)}"))

    def acknowledge_escalation(
        self, escalation_id: str, *, note: str | None = None, idempotency_key: str | None = None
    ) -> Escalation:
        path = f"escalations/{segment(escalation_id)}/acknowledge"
        return cast(Escalation, self._post(path, {"note": note}, idempotency_key=idempotency_key))

    def resolve_escalation(
        self,
        escalation_id: str,
        *,
        action: Literal["resume", "retry", "replan", "cancel"],
        note: str | None = None,
        idempotency_key: str | None = None,
    ) -> Escalation:
        path = f"escalations/{segment(escalation_id)}/resolve"
        body = {"action": action, "note": note}
        return cast(Escalation, self._post(path, body, idempotency_key=idempotency_key))

    # ------------------------------------------------------------------ callbacks
    def post_callback(
        self,
        token: str,
        *,
        status: Literal["completed", "failed"],
        result: Any = None,
        error: Any = None,
    ) -> dict[str, Any]:
        """End a ``callback`` step. No API key is sent: the token is the credential.
        Single-use (409 ``callback_used`` the second time), so retried only when it
        cannot have been received."""
        body: dict[str, Any] = {"status": status}
        if result is not None:
            body["result"] = result
        if error is not None:
            body["error"] = error
        response = self.request(
            "POST",
            f"callbacks/{segment(token)}",
            json=body,
            retry="unkeyed",
            authenticated=False,
        )
        return cast(dict[str, Any], decoded(response))


__all__ = ["API_PREFIX", "Client", "Page", "api_root", "retry_after_seconds"]
