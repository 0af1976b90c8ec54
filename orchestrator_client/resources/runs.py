"""A run's routes on ``Client``: create, start and steer runs, read their parts and
history, and follow one to its end (polled, or the server's event stream)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any, Literal, cast

import httpx

from orchestrator_client import sse
from orchestrator_client.errors import TransportError
from orchestrator_client.http import RETRY_STATUSES, HttpClient, error_from, segment
from orchestrator_client.pagination import Paginator
from orchestrator_client.plans import PlanData, PlanFile, plan_data
from orchestrator_client.types import (
    STATUS_ONLY,
    TERMINAL_STATUSES,
    Agent,
    Decision,
    Event,
    ForkPreview,
    RunDetail,
    Step,
    Task,
)
from orchestrator_client.types import Run as RunSummary
from orchestrator_client.watch import RunWatcher, WatchUpdate

# A run's event stream sends a comment every 15 s (the server's API_STREAM_HEARTBEAT_S):
# a read that waits this long means the connection is gone, and the stream is resumed.
STREAM_READ_TIMEOUT = 60.0


class Runs(HttpClient):
    """A run's routes (the module's doc)."""

    # ------------------------------------------------------------------ runs
    def runs(
        self,
        *,
        status: str | list[str] | None = None,
        name: str | None = None,
        created_after: str | None = None,
        created_before: str | None = None,
        priority: int | None = None,
        parent_run: str | None = None,
        schedule: str | None = None,
        ordering: str | None = None,
        page_size: int | None = None,
        limit: int | None = None,
    ) -> Paginator[RunSummary]:
        """Your runs, newest first unless ``ordering`` says (``status`` may be a list);
        ``schedule``: the runs that schedule started."""
        params = {
            "status": status,
            "name": name,
            "created_after": created_after,
            "created_before": created_before,
            "priority": priority,
            "parent_run": parent_run,
            "schedule": schedule,
            "ordering": ordering,
            "page_size": page_size,
        }
        return cast(Paginator[RunSummary], self._pages("runs", params, limit))

    def create_run(
        self,
        plan: PlanData,
        *,
        start: bool = False,
        idempotency_key: str | None = None,
    ) -> RunDetail:
        """Create a run from a plan (a dict, or a ``Plan`` built in Python); with
        ``start`` also start it."""
        return cast(
            RunDetail,
            self._post(
                "runs", {"plan": plan_data(plan), "start": start}, idempotency_key=idempotency_key
            ),
        )

    def submit(
        self,
        plan: PlanData,
        *,
        start: bool = True,
        idempotency_key: str | None = None,
    ) -> RunDetail:
        """Create and start a run (``create_run`` with ``start=True``)."""
        return self.create_run(plan, start=start, idempotency_key=idempotency_key)

    def submit_text(
        self,
        text: str,
        *,
        format: Literal["json", "yaml"],
        start: bool = True,
        idempotency_key: str | None = None,
    ) -> RunDetail:
        """Create (and start) a run from a plan as written: JSON or YAML text holding the
        plan itself. It is sent as it is, for the API to validate (``invalid_json``,
        ``invalid_yaml``, ``invalid_plan``); YAML as ``application/yaml``."""
        return cast(
            RunDetail,
            self._post_plan_text("runs", text, format, {"start": start}, idempotency_key),
        )

    def submit_file(
        self, path: str | Path, *, start: bool = True, idempotency_key: str | None = None
    ) -> RunDetail:
        """Create (and start) a run from a plan file: ``.json``, ``.yaml`` or ``.yml``
        (another name is read as JSON when it starts with ``{``, else as YAML)."""
        plan = PlanFile.read(Path(path))
        return self.submit_text(
            plan.text, format=plan.format, start=start, idempotency_key=idempotency_key
        )

    def get_run(self, run_id: str, *, exclude: Iterable[str] = ()) -> RunDetail:
        """One run. ``exclude`` leaves parts out: ``"plan"``, ``"outputs"`` (with
        ``outputs_truncated``); ``STATUS_ONLY`` both, for a poll that stays a few KB
        whatever the size of the run."""
        parts = ",".join(exclude)
        return cast(
            RunDetail, self._get(f"runs/{segment(run_id)}", {"exclude": parts} if parts else None)
        )

    def delete_run(self, run_id: str) -> None:
        """Soft delete (CREATED runs only; 409 otherwise)."""
        self.request("DELETE", f"runs/{segment(run_id)}")

    def start_run(self, run_id: str, *, idempotency_key: str | None = None) -> RunDetail:
        return self._action(run_id, "start", None, idempotency_key)

    def cancel_run(
        self, run_id: str, *, reason: str | None = None, idempotency_key: str | None = None
    ) -> RunDetail:
        return self._action(run_id, "cancel", {"reason": reason}, idempotency_key)

    def pause_run(self, run_id: str, *, idempotency_key: str | None = None) -> RunDetail:
        return self._action(run_id, "pause", None, idempotency_key)

    def resume_run(self, run_id: str, *, idempotency_key: str | None = None) -> RunDetail:
        return self._action(run_id, "resume", None, idempotency_key)

    def retry_run(
        self, run_id: str, *, reuse: str | None = None, idempotency_key: str | None = None
    ) -> RunDetail:
        """A new attempt of a failed run; ``reuse="completed"``: the steps the ended one
        completed are taken as completed, neither run nor charged again."""
        return self._action(run_id, "retry", {"reuse": reuse}, idempotency_key)

    def fork_run(
        self,
        run_id: str,
        from_step: str,
        *,
        plan: PlanData | PlanFile | None = None,
        variables: Mapping[str, Any] | None = None,
        start: bool = True,
        idempotency_key: str | None = None,
    ) -> RunDetail:
        """A new run of an ended one, run again from ``from_step`` (`agent.task.step`):
        what came before it and completed is reused. ``plan``: an edited plan, or a plan
        file as read (``PlanFile.read``), sent as written, JSON or YAML, as ``submit_file``
        sends it."""
        fields = {"from": from_step, "variables": variables, "start": start}
        return cast(RunDetail, self._post_fork(run_id, plan, fields, idempotency_key))

    def _post_fork(
        self,
        run_id: str,
        plan: PlanData | PlanFile | None,
        fields: dict[str, Any],
        idempotency_key: str | None,
    ) -> Any:
        path = f"runs/{segment(run_id)}/fork"
        if isinstance(plan, PlanFile):
            given = {name: value for name, value in fields.items() if value is not None}
            return self._post_plan_text(path, plan.text, plan.format, given, idempotency_key)
        body = {**fields, "plan": None if plan is None else plan_data(plan)}
        return self._post(path, body, idempotency_key=idempotency_key)

    def fork_preview(
        self,
        run_id: str,
        from_step: str,
        *,
        plan: PlanData | PlanFile | None = None,
        variables: Mapping[str, Any] | None = None,
    ) -> ForkPreview:
        """What ``fork_run`` would reuse, run and reserve (a dry run: nothing created)."""
        fields = {"from": from_step, "variables": variables, "dry_run": True}
        return cast(ForkPreview, self._post_fork(run_id, plan, fields, None))

    def invalidate_cache(self, key: str) -> int:
        """Drop the organization's step cache entries of ``key``; how many there were."""
        return int(self._post("cache/invalidate", {"key": key})["invalidated"])

    def approve(
        self,
        run_id: str,
        *,
        step_id: int | None = None,
        comment: str | None = None,
        idempotency_key: str | None = None,
    ) -> Decision:
        """Complete the steps waiting for approval (one with ``step_id``, else all)."""
        body = {"step_id": step_id, "comment": comment}
        key = idempotency_key
        return cast(
            Decision, self._post(f"runs/{segment(run_id)}/approve", body, idempotency_key=key)
        )

    def reject(
        self,
        run_id: str,
        *,
        step_id: int | None = None,
        comment: str | None = None,
        idempotency_key: str | None = None,
    ) -> Decision:
        """Fail the steps waiting for approval (``approval_rejected``)."""
        body = {"step_id": step_id, "comment": comment}
        key = idempotency_key
        return cast(
            Decision, self._post(f"runs/{segment(run_id)}/reject", body, idempotency_key=key)
        )

    def _action(
        self, run_id: str, action: str, body: Mapping[str, Any] | None, key: str | None
    ) -> RunDetail:
        return cast(
            RunDetail, self._post(f"runs/{segment(run_id)}/{action}", body, idempotency_key=key)
        )

    # ------------------------------------------------------------------ a run's parts
    def agents(
        self,
        run_id: str,
        *,
        attempt: int | None = None,
        status: str | None = None,
        page_size: int | None = None,
        limit: int | None = None,
    ) -> Paginator[Agent]:
        params = {"attempt": attempt, "status": status, "page_size": page_size}
        return cast(Paginator[Agent], self._pages(f"runs/{segment(run_id)}/agents", params, limit))

    def tasks(
        self,
        run_id: str,
        *,
        attempt: int | None = None,
        agent: int | None = None,
        status: str | None = None,
        page_size: int | None = None,
        limit: int | None = None,
    ) -> Paginator[Task]:
        params = {"attempt": attempt, "agent": agent, "status": status, "page_size": page_size}
        return cast(Paginator[Task], self._pages(f"runs/{segment(run_id)}/tasks", params, limit))

    def steps(
        self,
        run_id: str,
        *,
        attempt: int | None = None,
        task: int | None = None,
        status: str | None = None,
        tool: str | None = None,
        page_size: int | None = None,
        limit: int | None = None,
    ) -> Paginator[Step]:
        """The steps of one attempt (the current one unless ``attempt`` says); each names
        the runner ``job`` or the ``child_run`` its current attempt started."""
        params = {
            "attempt": attempt,
            "task": task,
            "status": status,
            "tool": tool,
            "page_size": page_size,
        }
        return cast(Paginator[Step], self._pages(f"runs/{segment(run_id)}/steps", params, limit))

    def events(
        self,
        run_id: str,
        *,
        after: int | None = None,
        attempt: int | None = None,
        kind: str | None = None,
        page_size: int | None = None,
        limit: int | None = None,
    ) -> Paginator[Event]:
        """The run's history so far, oldest first (pages by cursor)."""
        params = {"after": after, "attempt": attempt, "kind": kind, "page_size": page_size}
        return cast(Paginator[Event], self._pages(f"runs/{segment(run_id)}/events", params, limit))

    # ------------------------------------------------------------------ following a run
    def follow_events(
        self,
        run_id: str,
        *,
        after: int | None = None,
        attempt: int | None = None,
        kind: str | None = None,
        interval: float = 1.0,
    ) -> Iterator[Event]:
        """Every event of the run, as it happens, until the run has ended.

        Each round reads the run's status *before* reading the events after the last one
        seen: once that status is terminal, the round has read every event up to the end,
        and the iterator stops. A run that is retried later is a new story: follow again.
        """
        last = after
        while True:
            ended = self.get_run(run_id, exclude=STATUS_ONLY)["status"] in TERMINAL_STATUSES
            for event in self.events(run_id, after=last, attempt=attempt, kind=kind, page_size=500):
                last = event["id"]
                yield event
            if ended:
                return
            self._sleep(interval)

    def stream_events(self, run_id: str, last_event_id: int | None = None) -> Iterator[Event]:
        """Every event of the run after ``last_event_id`` (all without it) as it happens,
        from the server's event stream (``GET .../events/stream``), until the run has
        ended: the events list's events, in its order.

        A connection that drops (or goes silent for ``STREAM_READ_TIMEOUT``) is opened
        again with ``Last-Event-ID``, the last event's id: no event is missed or repeated.
        Failures in a row, with no connection made between them, are retried as a call
        is (``retries``, backoff; 429 and 5xx answers after their ``Retry-After``); an
        API error (404 for a run you cannot see) is raised. The server ends the stream
        once the run has ended and every event is sent; a stream that ends while the run
        has not (a proxy closed it) is resumed. After a stream's end, the run's status is
        read and, once it has ended, the events after the last one received (normally
        none): what a proxy may have cut short."""
        last = last_event_id
        failures = 0
        timeout = self._http.timeout
        read = max(timeout.read or 0.0, STREAM_READ_TIMEOUT)
        stream_timeout = httpx.Timeout(
            timeout.connect, read=read, write=timeout.write, pool=timeout.pool
        )
        while True:
            headers = {"Accept": "text/event-stream"}
            if last is not None:
                headers["Last-Event-ID"] = str(last)
            try:
                with self._http.stream(
                    "GET",
                    f"runs/{segment(run_id)}/events/stream",
                    headers=headers,
                    timeout=stream_timeout,
                ) as response:
                    if not response.is_success:
                        response.read()
                        error = error_from(response)
                        wait = error.retry_after
                        if (
                            response.status_code not in RETRY_STATUSES
                            or failures >= self.retries
                            or (wait is not None and wait > self.max_retry_after)
                        ):
                            raise error
                        self._sleep(wait if wait is not None else self._delay(failures))
                        failures += 1
                        continue
                    failures = 0  # connected: a later drop starts a new count
                    for message in sse.messages(response.iter_lines()):
                        event = cast(Event, json.loads(message.data))
                        last = event["id"]
                        yield event
            except httpx.TransportError as exc:
                if failures >= self.retries:
                    raise TransportError(f"the event stream of run {run_id}: {exc}") from exc
                self._sleep(self._delay(failures))
                failures += 1
                continue
            if self.get_run(run_id, exclude=STATUS_ONLY)["status"] in TERMINAL_STATUSES:
                yield from self.events(run_id, after=last, page_size=500)
                return
            self._sleep(self._delay(0))  # cut short by something else: resume, gently

    def wait(
        self, run_id: str, *, interval: float = 1.0, timeout: float | None = None
    ) -> RunDetail:
        """Poll until the run has ended (completed, failed or cancelled); return it.
        ``TimeoutError`` after ``timeout`` seconds."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            run = self.get_run(run_id, exclude=STATUS_ONLY)
            if run["status"] in TERMINAL_STATUSES:
                return self.get_run(run_id)  # the whole run, outputs and all, once
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(f"run {run_id} is still {run['status']} after {timeout} s")
            self._sleep(interval)

    def watch(self, run_id: str, *, interval: float = 1.0) -> Iterator[WatchUpdate]:
        """Updates (progress overall and per agent, new events, failures as they happen)
        until the run has ended; the last one has ``done`` set (``watch.RunWatcher``)."""
        return iter(RunWatcher(self, run_id, interval=interval))
