"""``Client``: every route a client of the API uses, as a typed method, over httpx.

    with Client("http://127.0.0.1:8000", "ork_...") as client:
        run = client.submit({"name": "hello", "agents": [...]})
        done = client.wait(run["id"])

- **Errors** are exceptions (``orchestrator_client.errors``) carrying the API's ``code``,
  ``message``, ``details`` and the HTTP ``status``.
- **Retries.** Every POST carries an ``Idempotency-Key``, one per logical call, sent again
  on each retry of that call, so the server applies it once whatever happens to the
  answers (docs/api.md, "Idempotency"). A call is retried, up to ``retries`` times with
  exponential backoff (``backoff`` doubling up to ``max_backoff``, with jitter), when the
  server could not be reached or the connection broke, on 502, 503 and 504, on 429 (after
  its ``Retry-After``), and on 409 ``idempotency_key_in_use`` (a retry that overtook the
  first request, still running). The two POSTs the API does not key (a multipart upload,
  a callback) are retried only when nothing can have happened: the connection was never
  made, or the answer was 429 or 503.
- **Lists** are ``Paginator``s: iterate them for every item, following ``next`` links
  (``client.runs(status="failed")``, ``client.events(run_id)``); nothing is fetched until
  then.

This package imports nothing from the server's code (an import-linter contract in
pyproject.toml keeps it so): it needs httpx only.
"""

from __future__ import annotations

import email.utils
import json
import random
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import IO, Any, Literal, Protocol, cast, runtime_checkable
from urllib.parse import quote, urlsplit, urlunsplit

import httpx

from orchestrator_client import config, sse
from orchestrator_client._version import __version__
from orchestrator_client.errors import ApiError, TransportError, error_class
from orchestrator_client.pagination import Paginator
from orchestrator_client.plans import (
    PlanFile,
    PlanFormat,
    at_plan_positions,
    json_body_with,
    yaml_body_with,
)
from orchestrator_client.types import (
    STATUS_ONLY,
    TERMINAL_STATUSES,
    Agent,
    Artifact,
    Balance,
    Decision,
    Escalation,
    Event,
    ForkPreview,
    LedgerEntry,
    Organization,
    Page,
    PublishedTool,
    RateLimit,
    RunDetail,
    Runner,
    RunnerJob,
    Schedule,
    ScheduleDetail,
    ScheduleFire,
    Secret,
    Step,
    Task,
    UploadStarted,
    Webhook,
    WebhookCreated,
    WebhookDelivery,
)
from orchestrator_client.types import (
    Run as RunSummary,
)
from orchestrator_client.watch import RunWatcher, WatchUpdate

API_PREFIX = "/api/v1"
RETRY_STATUSES = frozenset({429, 502, 503, 504})
# A POST the server does not key may have run before a 502 or 504 came back: only these
# answers say for sure that nothing was done.
UNKEYED_RETRY_STATUSES = frozenset({429, 503})
IN_USE = "idempotency_key_in_use"

# A run's event stream sends a comment every 15 s (the server's API_STREAM_HEARTBEAT_S):
# a read that waits this long means the connection is gone, and the stream is resumed.
STREAM_READ_TIMEOUT = 60.0

# How a call may be retried: "keyed" (GET, PUT, DELETE and POSTs with an
# Idempotency-Key: a repeat does nothing new), "unkeyed" (a POST without one).
RetryMode = Literal["keyed", "unkeyed"]


def api_root(url: str) -> str:
    """The server's root URL from what a person typed (with or without ``/api/v1``)."""
    root = url.strip().rstrip("/")
    if root.endswith(API_PREFIX):
        root = root[: -len(API_PREFIX)]
    if not root.startswith(("http://", "https://")):
        raise ValueError(f"the URL must start with http:// or https://, not {url!r}")
    return root


def retry_after_seconds(value: str | None) -> float | None:
    """A ``Retry-After`` header as seconds from now: delta-seconds or an HTTP date."""
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def _error_from(response: httpx.Response) -> ApiError:
    status = response.status_code
    retry_after = retry_after_seconds(response.headers.get("Retry-After"))
    try:
        body: Any = response.json()
    except ValueError:
        body = response.text
    if isinstance(body, dict) and isinstance(body.get("code"), str):
        code = body["code"]
        message = str(body.get("message") or code)
        details = body.get("details")
    else:
        # Not the API's own answer (a proxy's error page, a server that is not ours).
        code = f"http_{status}"
        text = " ".join(str(body).split())[:200]
        message = f"{response.reason_phrase or 'HTTP error'}" + (f": {text}" if text else "")
        details = None
    return error_class(status, code)(
        status=status,
        code=code,
        message=message,
        details=details,
        retry_after=retry_after,
        body=body,
    )


def decoded(response: httpx.Response) -> Any:
    """A successful answer's JSON; an ``ApiError`` (``invalid_response``) when it is not
    JSON (the URL points at a server that is not the API)."""
    try:
        return response.json()
    except ValueError as exc:
        text = " ".join(response.text.split())[:200]
        raise ApiError(
            status=response.status_code,
            code="invalid_response",
            message=f"the answer to {response.request.method} {response.request.url} is not "
            f"JSON (is this the orchestrator's URL?): {text}",
            body=response.text,
        ) from exc


@runtime_checkable
class BuiltPlan(Protocol):
    """A plan built in Python (``orchestrator_client.tools.plan.Plan``): what it gives
    is the plan as JSON data."""

    def to_dict(self) -> dict[str, Any]: ...


PlanData = Mapping[str, Any] | BuiltPlan


def plan_data(plan: PlanData) -> dict[str, Any]:
    """A plan to send: a dict as it is, a built plan as its ``to_dict()``."""
    return plan.to_dict() if isinstance(plan, BuiltPlan) else dict(plan)


def _id(value: object) -> str:
    """A path segment: ids and names are quoted, never trusted to be URL-safe."""
    return quote(str(value), safe="")


class Client:
    """The API of one server, with one API key.

    ``url`` is the server's root (``http://127.0.0.1:8000``; a trailing ``/api/v1`` is
    accepted too). ``timeout`` is seconds per request; ``retries`` how many times a call
    is tried again after a transient failure (0: never). ``transport`` and ``sleep`` are
    for tests (an httpx transport, and what waits between tries).
    """

    def __init__(
        self,
        url: str,
        api_key: str,
        *,
        timeout: float = 30.0,
        retries: int = 3,
        backoff: float = 0.5,
        max_backoff: float = 8.0,
        max_retry_after: float = 60.0,
        transport: httpx.BaseTransport | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.url = api_root(url)
        self.retries = max(0, retries)
        self.backoff = backoff
        self.max_backoff = max_backoff
        self.max_retry_after = max_retry_after
        self._sleep = sleep
        self._http = httpx.Client(
            base_url=self.url + API_PREFIX,
            headers={
                "Authorization": f"Bearer {api_key}",
                "Accept": "application/json",
                "User-Agent": f"orchestrator-client/{__version__}",
            },
            timeout=timeout,
            transport=transport,
        )

    @classmethod
    def from_config(cls, **options: Any) -> Client:
        """A client for what ``orch login`` saved, or ``ORCH_URL`` and ``ORCH_API_KEY``
        (``config.load``; ``config.ConfigError`` when neither says)."""
        settings = config.load()
        return cls(settings.url, settings.api_key, **options)

    # ------------------------------------------------------------------ lifecycle
    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # ------------------------------------------------------------------ transport
    def _delay(self, attempt: int) -> float:
        """Exponential backoff with jitter: about backoff * 2**attempt, capped."""
        ceiling = min(self.max_backoff, self.backoff * 2.0**attempt)
        return ceiling * (0.5 + random.random() / 2)  # noqa: S311 (jitter, not a secret)

    def _same_origin(self, url: str) -> str:
        """A ``next`` link on this server: its host replaced by ours if it differs (a
        proxy that rewrote the Host), so the API key never goes anywhere else."""
        link, base = urlsplit(url), urlsplit(self.url)
        if (link.scheme, link.netloc) == (base.scheme, base.netloc):
            return url
        return urlunsplit((base.scheme, base.netloc, link.path, link.query, ""))

    def request(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, Any] | None = None,
        json: Any = None,
        content: bytes | None = None,
        files: Mapping[str, Any] | None = None,
        data: Mapping[str, Any] | None = None,
        headers: Mapping[str, str] | None = None,
        idempotency_key: str | None = None,
        retry: RetryMode = "keyed",
        authenticated: bool = True,
        rewind: Callable[[], None] | None = None,
        follow_redirects: bool = False,
    ) -> httpx.Response:
        """Send one logical call, retrying as the module says; the successful answer,
        or the error raised. ``path`` is relative to ``/api/v1`` or an absolute URL."""
        send_headers = dict(headers or {})
        if idempotency_key is not None:
            send_headers["Idempotency-Key"] = idempotency_key
        if path.startswith(("http://", "https://")):
            path = self._same_origin(path)
        retry_statuses = RETRY_STATUSES if retry == "keyed" else UNKEYED_RETRY_STATUSES
        attempt = 0
        while True:
            if attempt and rewind is not None:
                rewind()
            request = self._http.build_request(
                method,
                path,
                params=dict(params) if params is not None else None,
                json=json,
                content=content,
                files=files,
                data=data,
                headers=send_headers,
            )
            if not authenticated:
                del request.headers["Authorization"]
            try:
                response = self._http.send(request, follow_redirects=follow_redirects)
            except httpx.TransportError as exc:
                never_sent = isinstance(exc, httpx.ConnectError | httpx.ConnectTimeout)
                transient = isinstance(
                    exc, httpx.TimeoutException | httpx.NetworkError | httpx.RemoteProtocolError
                )
                if transient and (retry == "keyed" or never_sent) and attempt < self.retries:
                    self._sleep(self._delay(attempt))
                    attempt += 1
                    continue
                raise TransportError(
                    f"{method} {request.url}: {exc or type(exc).__name__}"
                ) from exc
            if response.is_success or response.is_redirect:
                return response
            error = _error_from(response)
            retryable = response.status_code in retry_statuses or (
                error.code == IN_USE and idempotency_key is not None
            )
            if not retryable or attempt >= self.retries:
                raise error
            wait = error.retry_after
            if wait is not None and wait > self.max_retry_after:
                raise error  # told to come back later than we are willing to wait
            self._sleep(wait if wait is not None else self._delay(attempt))
            attempt += 1

    def _get(self, path: str, params: Mapping[str, Any] | None = None) -> Any:
        return decoded(self.request("GET", path, params=params))

    def _post(self, path: str, body: Mapping[str, Any] | None = None, **options: Any) -> Any:
        key = options.pop("idempotency_key", None) or str(uuid.uuid4())
        payload = {k: v for k, v in (body or {}).items() if v is not None}
        return decoded(self.request("POST", path, json=payload, idempotency_key=key, **options))

    def _pages(self, path: str, params: Mapping[str, Any] | None, limit: int | None) -> Any:
        def fetch(target: str, query: dict[str, Any] | None) -> Any:
            return self._get(target, query)

        return Paginator(fetch, path, dict(params or {}), limit=limit)

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

    def _post_plan_text(
        self,
        route: str,
        text: str,
        format: PlanFormat,
        fields: dict[str, Any],
        idempotency_key: str | None,
    ) -> Any:
        """POST ``fields`` and the plan as written. A refusal to parse it says where in
        the plan, not in the body around it (``plans.at_plan_positions``)."""
        if format == "yaml":
            content, media = yaml_body_with(text, fields), "application/yaml"
        else:
            content, media = json_body_with(text, fields), "application/json"
        try:
            response = self.request(
                "POST",
                route,
                content=content.encode("utf-8"),
                headers={"Content-Type": media},
                idempotency_key=idempotency_key or str(uuid.uuid4()),
            )
        except ApiError as exc:
            if exc.code in ("invalid_json", "invalid_yaml"):
                exc.message = at_plan_positions(exc.message, format=format, fields=fields)
                exc.args = (exc.message,)
            raise
        return decoded(response)

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
            RunDetail, self._get(f"runs/{_id(run_id)}", {"exclude": parts} if parts else None)
        )

    def delete_run(self, run_id: str) -> None:
        """Soft delete (CREATED runs only; 409 otherwise)."""
        self.request("DELETE", f"runs/{_id(run_id)}")

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
        path = f"runs/{_id(run_id)}/fork"
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
        return cast(Decision, self._post(f"runs/{_id(run_id)}/approve", body, idempotency_key=key))

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
        return cast(Decision, self._post(f"runs/{_id(run_id)}/reject", body, idempotency_key=key))

    def _action(
        self, run_id: str, action: str, body: Mapping[str, Any] | None, key: str | None
    ) -> RunDetail:
        return cast(
            RunDetail, self._post(f"runs/{_id(run_id)}/{action}", body, idempotency_key=key)
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
        return cast(Paginator[Agent], self._pages(f"runs/{_id(run_id)}/agents", params, limit))

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
        return cast(Paginator[Task], self._pages(f"runs/{_id(run_id)}/tasks", params, limit))

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
        return cast(Paginator[Step], self._pages(f"runs/{_id(run_id)}/steps", params, limit))

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
        return cast(Paginator[Event], self._pages(f"runs/{_id(run_id)}/events", params, limit))

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
                    f"runs/{_id(run_id)}/events/stream",
                    headers=headers,
                    timeout=stream_timeout,
                ) as response:
                    if not response.is_success:
                        response.read()
                        error = _error_from(response)
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
        response = self.request("PUT", f"secrets/{_id(name)}", json={"value": value})
        return cast(Secret, decoded(response))

    def delete_secret(self, name: str) -> None:
        self.request("DELETE", f"secrets/{_id(name)}")

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
            "PUT", f"rate-limits/{_id(name)}", json={"limit": limit, "period": period}
        )
        return cast(RateLimit, decoded(response))

    def delete_rate_limit(self, name: str) -> None:
        self.request("DELETE", f"rate-limits/{_id(name)}")

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
        return cast(Webhook, self._get(f"webhooks/{_id(webhook_id)}"))

    def update_webhook(self, webhook_id: str, **fields: Any) -> Webhook:
        """Change the fields given (``url``, ``events``, ``secret``, ``description``,
        ``enabled``: False disables it, True enables it again)."""
        response = self.request("PATCH", f"webhooks/{_id(webhook_id)}", json=fields)
        return cast(Webhook, decoded(response))

    def delete_webhook(self, webhook_id: str) -> None:
        self.request("DELETE", f"webhooks/{_id(webhook_id)}")

    def test_webhook(
        self, webhook_id: str, *, idempotency_key: str | None = None
    ) -> WebhookDelivery:
        """Queue a ``webhook.test`` delivery to the endpoint; follow it in its deliveries."""
        path = f"webhooks/{_id(webhook_id)}/test"
        return cast(WebhookDelivery, self._post(path, None, idempotency_key=idempotency_key))

    def webhook_deliveries(
        self, webhook_id: str, *, page_size: int | None = None, limit: int | None = None
    ) -> Paginator[WebhookDelivery]:
        """The endpoint's deliveries, newest first, each with every attempt."""
        path = f"webhooks/{_id(webhook_id)}/deliveries"
        return cast(Paginator[WebhookDelivery], self._pages(path, {"page_size": page_size}, limit))

    def redeliver_webhook(
        self, webhook_id: str, delivery_id: str, *, idempotency_key: str | None = None
    ) -> WebhookDelivery:
        """Send a delivery again (same id and body), retried for a new window."""
        path = f"webhooks/{_id(webhook_id)}/deliveries/{_id(delivery_id)}/redeliver"
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
        return cast(RunnerJob, self._get(f"runner-jobs/{_id(job_id)}"))

    def stop_runner_job(self, job_id: str, *, idempotency_key: str | None = None) -> RunnerJob:
        path = f"runner-jobs/{_id(job_id)}/stop"
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
        return cast(Escalation, self._get(f"escalations/{_id(escalation_id)}"))

    def acknowledge_escalation(
        self, escalation_id: str, *, note: str | None = None, idempotency_key: str | None = None
    ) -> Escalation:
        path = f"escalations/{_id(escalation_id)}/acknowledge"
        return cast(Escalation, self._post(path, {"note": note}, idempotency_key=idempotency_key))

    def resolve_escalation(
        self,
        escalation_id: str,
        *,
        action: Literal["resume", "retry", "replan", "cancel"],
        note: str | None = None,
        idempotency_key: str | None = None,
    ) -> Escalation:
        path = f"escalations/{_id(escalation_id)}/resolve"
        body = {"action": action, "note": note}
        return cast(Escalation, self._post(path, body, idempotency_key=idempotency_key))

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
        return cast(ScheduleDetail, self._get(f"schedules/{_id(schedule_id)}"))

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
        response = self.request("PATCH", f"schedules/{_id(schedule_id)}", json=fields)
        return cast(ScheduleDetail, decoded(response))

    def delete_schedule(self, schedule_id: str) -> None:
        self.request("DELETE", f"schedules/{_id(schedule_id)}")

    def pause_schedule(
        self, schedule_id: str, *, idempotency_key: str | None = None
    ) -> ScheduleDetail:
        path = f"schedules/{_id(schedule_id)}/pause"
        return cast(ScheduleDetail, self._post(path, None, idempotency_key=idempotency_key))

    def resume_schedule(
        self, schedule_id: str, *, idempotency_key: str | None = None
    ) -> ScheduleDetail:
        path = f"schedules/{_id(schedule_id)}/resume"
        return cast(ScheduleDetail, self._post(path, None, idempotency_key=idempotency_key))

    def trigger_schedule(
        self, schedule_id: str, *, idempotency_key: str | None = None
    ) -> ScheduleFire:
        """Start a run of the schedule now; the fire names it (``fire["run"]["id"]``)."""
        path = f"schedules/{_id(schedule_id)}/trigger"
        return cast(ScheduleFire, self._post(path, None, idempotency_key=idempotency_key))

    def schedule_fires(
        self, schedule_id: str, *, page_size: int | None = None, limit: int | None = None
    ) -> Paginator[ScheduleFire]:
        """What became of each due time and trigger, newest first."""
        path = f"schedules/{_id(schedule_id)}/fires"
        return cast(Paginator[ScheduleFire], self._pages(path, {"page_size": page_size}, limit))

    # ------------------------------------------------------------------ artifacts
    def artifacts(
        self, run_id: str, *, page_size: int | None = None, limit: int | None = None
    ) -> Paginator[Artifact]:
        path = f"runs/{_id(run_id)}/artifacts"
        return cast(Paginator[Artifact], self._pages(path, {"page_size": page_size}, limit))

    def upload_artifact(
        self,
        run_id: str,
        name: str,
        content: bytes | IO[bytes],
        *,
        content_type: str | None = None,
    ) -> Artifact:
        """Upload a file to the run (multipart, streamed by the server). The API does not
        key this route (a second upload of a name is 409 ``artifact_exists``), so it is
        retried only when it cannot have happened."""
        return self._multipart(f"runs/{_id(run_id)}/artifacts", name, content, content_type, {})

    def upload_job_artifact(
        self,
        job_id: str,
        runner_id: str,
        name: str,
        content: bytes | IO[bytes],
        *,
        content_type: str | None = None,
    ) -> Artifact:
        """Upload a file as an artifact of the step whose job the runner ``runner_id``
        holds (a runner route: 409 ``not_job_owner`` once it no longer holds it);
        retried as ``upload_artifact`` is."""
        path = f"runner/jobs/{_id(job_id)}/artifacts"
        return self._multipart(path, name, content, content_type, {"runner_id": runner_id})

    def _multipart(
        self,
        path: str,
        name: str,
        content: bytes | IO[bytes],
        content_type: str | None,
        fields: dict[str, str],
    ) -> Artifact:
        """POST an artifact's file to ``path``, with ``fields`` beside its name."""
        stream = content if not isinstance(content, bytes) else None
        start = stream.tell() if stream is not None and stream.seekable() else None

        def rewind() -> None:
            if stream is not None and start is not None:
                stream.seek(start)

        media = content_type or "application/octet-stream"
        form = {"name": name, **fields, **({"content_type": content_type} if content_type else {})}
        response = self.request(
            "POST",
            path,
            data=form,
            files={"file": (name, content, media)},
            retry="unkeyed",
            rewind=rewind if start is not None else None,
        )
        return cast(Artifact, decoded(response))

    def start_artifact_upload(
        self,
        run_id: str,
        name: str,
        size: int,
        *,
        content_type: str | None = None,
        sha256: str | None = None,
        idempotency_key: str | None = None,
    ) -> UploadStarted:
        """Reserve a large upload and learn where its bytes go (docs/artifacts.md)."""
        body = {"name": name, "size": size, "content_type": content_type, "sha256": sha256}
        path = f"runs/{_id(run_id)}/artifacts/uploads"
        return cast(UploadStarted, self._post(path, body, idempotency_key=idempotency_key))

    def send_artifact_content(self, artifact_id: str, content: bytes) -> None:
        """The bytes of a started upload, to the API itself (filesystem storage: the
        upload target's ``api_key`` is true)."""
        self.request(
            "PUT",
            f"artifacts/{_id(artifact_id)}/content",
            content=content,
            headers={"Content-Type": "application/octet-stream"},
        )

    def complete_artifact_upload(
        self,
        artifact_id: str,
        *,
        parts: list[dict[str, Any]] | None = None,
        sha256: str | None = None,
        idempotency_key: str | None = None,
    ) -> Artifact:
        body = {"parts": parts, "sha256": sha256}
        path = f"artifacts/{_id(artifact_id)}/complete"
        return cast(Artifact, self._post(path, body, idempotency_key=idempotency_key))

    def get_artifact(self, artifact_id: str) -> Artifact:
        return cast(Artifact, self._get(f"artifacts/{_id(artifact_id)}"))

    def delete_artifact(self, artifact_id: str) -> None:
        self.request("DELETE", f"artifacts/{_id(artifact_id)}")

    def download_artifact(self, artifact_id: str) -> bytes:
        """The artifact's bytes (a redirect to storage is followed; httpx does not send
        the API key to another host)."""
        path = f"artifacts/{_id(artifact_id)}/download"
        return self.request("GET", path, follow_redirects=True).content

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
            f"callbacks/{_id(token)}",
            json=body,
            retry="unkeyed",
            authenticated=False,
        )
        return cast(dict[str, Any], decoded(response))


def _schedule_fields(**fields: Any) -> dict[str, Any]:
    """A schedule's body fields, those not given left out (the server's defaults)."""
    return {
        name: dict(value) if isinstance(value, Mapping) else value
        for name, value in fields.items()
        if value is not None
    }


__all__ = ["API_PREFIX", "Client", "Page", "api_root", "retry_after_seconds"]
