"""A schedule's routes on ``Client``: run a plan by cron or every interval, and steer
and read the schedule (docs/schedules.md)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal, cast

from orchestrator_client.http import HttpClient, decoded, segment
from orchestrator_client.pagination import Paginator
from orchestrator_client.plans import PlanData, PlanFormat, plan_data
from orchestrator_client.types import Schedule, ScheduleDetail, ScheduleFire


class Schedules(HttpClient):
    """A schedule's routes (the module's doc)."""

    # ------------------------------------------------------------------ schedules
    def schedules(
        self,
        *,
        status: Literal["active", "paused", "ended"] | None = None,
        name: str | None = None,
        page_size: int | None = None,
        limit: int | None = None,
    ) -> Paginator[Schedule]:
        """Your schedules, newest first (``name``: part of it)."""
        params = {"status": status, "name": name, "page_size": page_size}
        return cast(Paginator[Schedule], self._pages("schedules", params, limit))

    def get_schedule(self, schedule_id: str) -> ScheduleDetail:
        return cast(ScheduleDetail, self._get(f"schedules/{segment(schedule_id)}"))

    def create_schedule(
        self,
        plan: PlanData,
        *,
        name: str,
        cron: str | None = None,
        interval: str | float | None = None,
        timezone: str | None = None,
        start_at: str | None = None,
        end_at: str | None = None,
        overlap: Literal["skip", "allow", "cancel_previous"] | None = None,
        catchup: Literal["none", "latest", "all"] | None = None,
        variables: Mapping[str, Any] | None = None,
        idempotency_key: str | None = None,
    ) -> ScheduleDetail:
        """Run ``plan`` by ``cron`` (in ``timezone``) or every ``interval`` (``"30s"``,
        ``"5m"``, or seconds); docs/schedules.md has the policies."""
        body = _schedule_fields(
            name=name,
            cron=cron,
            interval=interval,
            timezone=timezone,
            start_at=start_at,
            end_at=end_at,
            overlap=overlap,
            catchup=catchup,
            variables=variables,
        )
        body["plan"] = plan_data(plan)
        return cast(ScheduleDetail, self._post("schedules", body, idempotency_key=idempotency_key))

    def create_schedule_text(
        self,
        text: str,
        *,
        format: PlanFormat,
        name: str,
        idempotency_key: str | None = None,
        **fields: Any,
    ) -> ScheduleDetail:
        """``create_schedule`` with the plan as written (JSON or YAML text), sent as it
        is for the API to validate, as ``submit_text`` sends a run's."""
        values = _schedule_fields(name=name, **fields)
        return cast(
            ScheduleDetail,
            self._post_plan_text("schedules", text, format, values, idempotency_key),
        )

    def update_schedule(self, schedule_id: str, **fields: Any) -> ScheduleDetail:
        """Change the fields given (``plan``, ``name``, ``cron``, ``interval``,
        ``timezone``, ``start_at``, ``end_at``, ``overlap``, ``catchup``, ``variables``);
        ``start_at=None`` and ``end_at=None`` clear them."""
        response = self.request("PATCH", f"schedules/{segment(schedule_id)}", json=fields)
        return cast(ScheduleDetail, decoded(response))

    def delete_schedule(self, schedule_id: str) -> None:
        self.request("DELETE", f"schedules/{segment(schedule_id)}")

    def pause_schedule(
        self, schedule_id: str, *, idempotency_key: str | None = None
    ) -> ScheduleDetail:
        path = f"schedules/{segment(schedule_id)}/pause"
        return cast(ScheduleDetail, self._post(path, None, idempotency_key=idempotency_key))

    def resume_schedule(
        self, schedule_id: str, *, idempotency_key: str | None = None
    ) -> ScheduleDetail:
        path = f"schedules/{segment(schedule_id)}/resume"
        return cast(ScheduleDetail, self._post(path, None, idempotency_key=idempotency_key))

    def trigger_schedule(
        self, schedule_id: str, *, idempotency_key: str | None = None
    ) -> ScheduleFire:
        """Start a run of the schedule now; the fire names it (``fire["run"]["id"]``)."""
        path = f"schedules/{segment(schedule_id)}/trigger"
        return cast(ScheduleFire, self._post(path, None, idempotency_key=idempotency_key))

    def schedule_fires(
        self, schedule_id: str, *, page_size: int | None = None, limit: int | None = None
    ) -> Paginator[ScheduleFire]:
        """What became of each due time and trigger, newest first."""
        path = f"schedules/{segment(schedule_id)}/fires"
        return cast(Paginator[ScheduleFire], self._pages(path, {"page_size": page_size}, limit))


def _schedule_fields(**fields: Any) -> dict[str, Any]:
    """A schedule's body fields, those not given left out (the server's defaults)."""
    return {
        name: dict(value) if isinstance(value, Mapping) else value
        for name, value in fields.items()
        if value is not None
    }
