"""The runner protocol over HTTP (docs/runners.md), and what clients see of runners.

Runner routes (``runner_route``: open to ``runner`` and ``full`` keys) register, poll,
heartbeat, deregister and report; the client routes list runners, show a job and stop
it. Every route is scoped to the key's organization: another organization's runner or
job is 404. Each view validates its input and calls one service of ``runs.waits.runners``.
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from typing import Any, ClassVar, cast
from uuid import UUID

import redis
from django.conf import settings
from django.db import connection
from drf_spectacular.utils import OpenApiResponse, extend_schema, extend_schema_view
from rest_framework import serializers
from rest_framework.exceptions import AuthenticationFailed
from rest_framework.request import Request
from rest_framework.response import Response

from api.authentication import OrganizationSuspended, client_of, organization_of
from api.base import ApiView, list_schema, page_response, validated
from api.errors import LIST_ERRORS, WRITE_ERRORS, error_responses
from api.idempotency import idempotent
from api.pagination import PageQuery, paginated
from api.serializers import EmptyInput, InputSerializer, StrictBooleanField, StrictCharField
from billing import quotas
from billing.selectors import ORGANIZATION_SUSPENDED
from common import leases
from common.errors import ERROR_CODES
from common.stores import broker_redis
from runs import selectors
from runs.filters import RunnerJobFilter
from runs.models import Runner
from runs.waits import runners

TAG_RUNNERS = "runners"
logger = logging.getLogger(__name__)


# --------------------------------------------------------------------------- shapes
class RegisterInput(InputSerializer):
    hostname = StrictCharField(max_length=255)
    project_dir = StrictCharField(max_length=1000)
    executor_type = StrictCharField(max_length=100)
    tags = serializers.ListField(
        child=StrictCharField(max_length=100), required=False, max_length=50
    )
    tools = serializers.ListField(
        child=serializers.DictField(),
        required=False,
        max_length=200,
        help_text="An `orch worker`'s published tools (docs/tools.md), each `{name, "
        "version, description, params_schema, output_schema, cost}`: kept in the "
        "organization's catalogue (`GET /tools`); the runner then claims the jobs of "
        "those tools at those versions, and no `runner` step's. 409 "
        "`tool_version_conflict` for a version published before with another schema, "
        "`tool_name_taken` for a tool of the fleet.",
    )


class RegisterOutput(serializers.Serializer[Any]):
    runner_id = serializers.CharField()
    poll_endpoint = serializers.CharField()
    poll_timeout_seconds = serializers.IntegerField()
    heartbeat_interval_seconds = serializers.IntegerField()


# The most jobs a runner claims in one poll, and reports the progress of at once (as
# many as its slots).
MAX_HELD_JOBS = 100


class RunnerIdInput(InputSerializer):
    runner_id = StrictCharField(max_length=40)


class HeartbeatInput(RunnerIdInput):
    progress = serializers.DictField(
        child=serializers.JSONField(allow_null=True),
        required=False,
        help_text="By job id, what the tool of each job the runner holds last said of its "
        "progress (any JSON), shown at `GET /runner-jobs/{id}`.",
    )

    def validate_progress(self, value: dict[str, Any]) -> dict[str, Any]:
        if len(value) > MAX_HELD_JOBS:
            raise serializers.ValidationError(f"at most {MAX_HELD_JOBS} jobs")
        for job_id in value:
            try:
                UUID(job_id)
            except ValueError:
                raise serializers.ValidationError(f"{job_id!r} is not a job id") from None
        return value


class OkOutput(serializers.Serializer[Any]):
    ok = serializers.BooleanField()


class PollQuery(serializers.Serializer[Any]):
    """The query of a poll (text, as query strings are)."""

    runner_id = serializers.CharField(max_length=40, help_text="The runner's id.")
    wait = serializers.IntegerField(
        required=False, min_value=0, max_value=30, help_text="Seconds to hold: 0 to 30."
    )
    max_jobs = serializers.IntegerField(
        required=False,
        min_value=0,
        max_value=MAX_HELD_JOBS,
        help_text="Claim up to this many jobs at once (a runner's free slots), answered "
        "as `jobs`; 0 claims none and waits for stop commands only. Without it, one job, "
        "answered as `job`.",
    )


class JobOutput(serializers.Serializer[Any]):
    """A runner job, as its runner receives it and clients read it."""

    id = serializers.UUIDField()
    status = serializers.CharField()
    type = serializers.CharField()
    prompt = serializers.CharField()
    session_id = serializers.CharField()
    agent_name = serializers.CharField()
    project_dir = serializers.CharField()
    demands = serializers.JSONField()
    run = serializers.UUIDField(source="run_id")
    step = serializers.IntegerField(source="step_id")
    attempt = serializers.IntegerField()
    runner_id = serializers.CharField(allow_null=True)
    result = serializers.JSONField(allow_null=True)
    error = serializers.CharField()
    signal = serializers.CharField()
    created_at = serializers.DateTimeField()
    claimed_at = serializers.DateTimeField(allow_null=True)
    started_at = serializers.DateTimeField(allow_null=True)
    stop_requested_at = serializers.DateTimeField(allow_null=True)
    completed_at = serializers.DateTimeField(allow_null=True)
    timeout_at = serializers.DateTimeField()
    traceparent = serializers.CharField(
        source="trace_context",
        required=False,
        help_text="The W3C traceparent of the step attempt the job belongs to (empty when "
        "the run is not traced): a runner continues the run's trace from it.",
    )
    tool = serializers.CharField(
        help_text="A worker tool's job: the tool to call (docs/tools.md); empty for a "
        "`runner` step's job."
    )
    tool_version = serializers.CharField(help_text="The tool's version the job was made for.")
    params = serializers.JSONField(
        allow_null=True, help_text="A worker tool's job: the step's rendered params."
    )
    progress = serializers.JSONField(
        allow_null=True, help_text="What the tool last said of its progress."
    )
    error_code = serializers.CharField(
        help_text="A failed worker tool's job: the error code it failed with."
    )
    step_path = serializers.CharField(
        help_text="Its step's place in the plan, `agent.task.step` (a worker tool's "
        "`Context.step_path`)."
    )


class RunnerOutput(serializers.Serializer[Any]):
    runner_id = serializers.CharField(source="id")
    status = serializers.SerializerMethodField()
    hostname = serializers.CharField()
    project_dir = serializers.CharField()
    executor_type = serializers.CharField()
    tags = serializers.ListField(child=serializers.CharField())
    tools = serializers.DictField(
        child=serializers.CharField(),
        help_text="The published tools it offers, by name: their versions (an `orch worker`).",
    )
    registered_at = serializers.DateTimeField()
    last_heartbeat = serializers.DateTimeField()

    def get_status(self, runner: Runner) -> str:
        return runners.runner_status(runner)


class PollOutput(serializers.Serializer[Any]):
    """One of: ``stop_jobs``, ``job`` (``jobs`` when the poll gave ``max_jobs``),
    ``deregistered``."""

    stop_jobs = serializers.ListField(child=serializers.UUIDField(), required=False)
    job = JobOutput(required=False)
    jobs = JobOutput(many=True, required=False)
    deregistered = serializers.BooleanField(required=False)


class CompletedInput(RunnerIdInput):
    result = serializers.JSONField(required=False, allow_null=True)


class FailedInput(RunnerIdInput):
    error = StrictCharField(max_length=10_000, allow_blank=True)
    code = serializers.ChoiceField(
        choices=sorted(ERROR_CODES),
        required=False,
        help_text="A worker tool's failure as it classified it: the step's attempt fails "
        "with this code (docs/api.md, step errors) instead of `runner_failed`.",
    )
    retryable = StrictBooleanField(
        required=False,
        help_text="With `code`: whether the step's retry policy may try again (the code's "
        "own default when omitted).",
    )


class StoppedInput(RunnerIdInput):
    signal = serializers.ChoiceField(choices=runners.SIGNALS)


class ReportItemInput(InputSerializer):
    """One report of a batch: a job and what the report of its ``kind`` takes."""

    job = serializers.UUIDField()
    kind = serializers.ChoiceField(choices=["started", "completed", "failed", "stopped"])
    result = serializers.JSONField(required=False, allow_null=True)
    error = StrictCharField(max_length=10_000, allow_blank=True, required=False)
    code = serializers.ChoiceField(choices=sorted(ERROR_CODES), required=False)
    retryable = StrictBooleanField(required=False)
    signal = serializers.ChoiceField(choices=runners.SIGNALS, required=False)

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        kind = attrs["kind"]
        allowed = _REPORT_FIELDS[kind]
        extra = sorted(name for name in attrs if name not in ("job", "kind", *allowed))
        if extra:
            raise serializers.ValidationError(
                {name: [f"not a field of a {kind} report"] for name in extra}
            )
        required = {"failed": "error", "stopped": "signal"}.get(kind)
        if required and required not in attrs:
            raise serializers.ValidationError({required: ["This field is required."]})
        return attrs


# The fields each kind of report takes beside its job (the single routes' bodies).
_REPORT_FIELDS: dict[str, tuple[str, ...]] = {
    "started": (),
    "completed": ("result",),
    "failed": ("error", "code", "retryable"),
    "stopped": ("signal",),
}


class ReportsInput(RunnerIdInput):
    reports = serializers.ListField(
        child=ReportItemInput(),
        max_length=MAX_HELD_JOBS,
        help_text="Up to 100 reports, each on another job the runner holds: `{job, kind}` "
        "with what the single route of that kind takes (`completed`: `result`; `failed`: "
        "`error`, `code`, `retryable`; `stopped`: `signal`).",
    )

    def validate_reports(self, value: list[dict[str, Any]]) -> list[dict[str, Any]]:
        jobs = [str(item["job"]) for item in value]
        if len(set(jobs)) < len(jobs):
            raise serializers.ValidationError("each job is reported at most once in a batch")
        return value


class RefusalOutput(serializers.Serializer[Any]):
    code = serializers.CharField(help_text="`not_found`, `not_job_owner`, `invalid_transition`.")
    message = serializers.CharField()


class ReportAnswerOutput(serializers.Serializer[Any]):
    job = serializers.UUIDField()
    ok = serializers.BooleanField(help_text="Applied, or the repeat of a report applied.")
    refused = RefusalOutput(
        required=False, help_text="Why the report was refused (when `ok` is false)."
    )


class ReportsOutput(serializers.Serializer[Any]):
    results = ReportAnswerOutput(many=True, help_text="One per report, in their order.")


# --------------------------------------------------------------------------- runner routes
class RunnerApi(ApiView):
    runner_route = True


class RegisterApi(RunnerApi):
    @extend_schema(
        tags=[TAG_RUNNERS],
        summary="Register a runner",
        operation_id="runner_register",
        request=RegisterInput,
        responses={201: RegisterOutput, **error_responses(*WRITE_ERRORS)},
    )
    @idempotent
    def post(self, request: Request) -> Response:
        """Register (201), or reconnect an identity that went stale or deregistered (201,
        the same runner_id). 409 ``duplicate_runner`` while that identity is online."""
        data = validated(RegisterInput, request.data)
        registration = runners.register(organization=organization_of(request), **data)
        return Response(
            {
                "runner_id": registration.runner.pk,
                "poll_endpoint": "/api/v1/runner/jobs",
                "poll_timeout_seconds": settings.RUNNER_POLL_TIMEOUT,
                "heartbeat_interval_seconds": settings.RUNNER_HEARTBEAT_INTERVAL,
            },
            status=201,
        )


class PollApi(RunnerApi):
    queries: ClassVar[dict[str, type[serializers.Serializer[Any]]]] = {"get": PollQuery}

    @extend_schema(
        tags=[TAG_RUNNERS],
        summary="Poll for a job or stop commands",
        operation_id="runner_poll",
        parameters=[PollQuery],
        responses={
            200: PollOutput,
            204: OpenApiResponse(description="nothing for this runner within the wait"),
            **error_responses(*LIST_ERRORS),
        },
    )
    def get(self, request: Request) -> Response:
        """Stop commands first, else one job claimed for this runner, else 204 after
        waiting up to ``wait`` seconds (woken at once when a job or a stop arrives). An
        organization holds at most its quota `runner_polls` at once: a poll that would
        wait past it is refused with 429 `too_many_polls` (`Retry-After`). A hold ends
        when its key is revoked (401) or its organization suspended (403
        `organization_suspended`), having claimed nothing since."""
        query = self.query
        client = client_of(request)
        wait = query.get("wait", settings.RUNNER_POLL_TIMEOUT)
        result = held_poll(
            client.organization,
            query["runner_id"],
            float(wait),
            api_key_id=client.api_key.pk,
            limit=query.get("max_jobs", 1),
        )
        if result.refused == ORGANIZATION_SUSPENDED:
            raise OrganizationSuspended
        if result.refused:
            raise AuthenticationFailed("unknown or revoked API key")
        if result.empty:
            return Response(status=204)
        return Response(poll_body(result, many="max_jobs" in query))


def poll_body(result: runners.Poll, *, many: bool = False) -> dict[str, Any]:
    if result.deregistered:
        return {"deregistered": True}
    if result.stop_jobs:
        return {"stop_jobs": result.stop_jobs}
    if many:
        return {"jobs": JobOutput(result.jobs, many=True).data}
    return {"job": JobOutput(result.job).data}


# A held poll looks again at least this often, whatever it hears: a wake-up lost with
# Redis costs latency, never a job; a revoked key ends its hold within this time.
RECHECK_S = 5.0
# A held poll's lease outlives its longest hold by this much, unrenewed: a web process
# that dies frees its polls' places that long after they would have ended.
LEASE_MARGIN_S = RECHECK_S + 10


def held_polls_key(organization_id: Any) -> str:
    """The sorted set of an organization's held polls (``common.leases``)."""
    return f"orchestrator:runners:held:{organization_id}"


def polls_held(organization_id: Any) -> int:
    """How many polls the organization has held now (its quota `runner_polls`)."""
    return leases.held(held_polls_key(organization_id))


def held_poll(
    organization: Any, runner_id: str, wait: float, *, api_key_id: Any = None, limit: int = 1
) -> runners.Poll:
    """Poll, and while there is nothing, hold up to ``wait`` seconds listening on the
    runner's and the organization's Redis channels (subscribed before the next look, so
    that nothing published after it is missed). Without Redis the poll still holds, and
    looks every ``RECHECK_S``: a broker outage slows delivery, it refuses no poll.

    Only a hold takes one of the organization's places (its quota `runner_polls`, a
    lease in Redis, ``TooManyPolls`` past it): a poll that finds something at once, or
    does not wait, holds nothing. Each look reads ``api_key_id`` again (``runners.poll``),
    at every wake-up and every ``RECHECK_S``: the hold of a revoked key, or a suspended
    organization's (the suspension wakes its polls), ends ``refused``."""
    deadline = time.monotonic() + wait
    first = runners.poll(
        organization=organization, runner_id=runner_id, api_key_id=api_key_id, limit=limit
    )
    if not first.empty or wait <= 0:
        return first
    lease = leases.Lease(
        held_polls_key(organization.pk), ttl_s=wait + LEASE_MARGIN_S, what="runner poll"
    )
    places = quotas.quota_of(organization, quotas.RUNNER_POLLS)
    if not lease.take(places):
        # A place frees when a hold ends: within the longest hold.
        raise quotas.TooManyPolls(places, retry_after=max(1, math.ceil(RECHECK_S)))
    client = broker_redis(socket_connect_timeout=2, socket_timeout=RECHECK_S + 5)
    pubsub = client.pubsub(ignore_subscribe_messages=True)
    listening = _subscribe(
        pubsub, runners.runner_channel(runner_id), runners.organization_channel(organization.pk)
    )
    try:
        while True:
            result = runners.poll(
                organization=organization,
                runner_id=runner_id,
                registered_at=first.registered_at,
                api_key_id=api_key_id,
                limit=limit,
            )
            left = deadline - time.monotonic()
            if not result.empty or left <= 0:
                return result
            # No database connection is held while waiting: hundreds of polls must not
            # hold hundreds of PostgreSQL connections (config/gunicorn.py).
            if not connection.in_atomic_block:  # (a test's transaction stays open)
                connection.close()
            pause = min(left, RECHECK_S)
            if listening:
                try:
                    pubsub.get_message(timeout=pause)
                    continue
                except redis.RedisError:
                    listening = False
            time.sleep(pause)
    finally:
        lease.release()
        with contextlib.suppress(redis.RedisError):
            pubsub.close()
            client.close()


def _subscribe(pubsub: Any, *channels: str) -> bool:
    try:
        pubsub.subscribe(*channels)
    except redis.RedisError as exc:
        logger.warning(
            "runner poll without wake-ups (Redis: %s); looking every %ss", exc, RECHECK_S
        )
        return False
    return True


class HeartbeatApi(RunnerApi):
    @extend_schema(
        tags=[TAG_RUNNERS],
        summary="A runner's heartbeat",
        operation_id="runner_heartbeat",
        request=HeartbeatInput,
        responses={200: OkOutput, **error_responses(*WRITE_ERRORS, 404)},
    )
    @idempotent
    def post(self, request: Request) -> Response:
        """The runner is alive (a poll counts as one too), and, with `progress`, how far
        the tools of its jobs got. A runner silent for longer than the stale time (120 s
        unless the server says otherwise) loses its jobs, which fail with `runner_lost`;
        a deregistered runner stays deregistered."""
        data = validated(HeartbeatInput, request.data)
        runners.heartbeat(
            organization=organization_of(request),
            runner_id=data["runner_id"],
            progress=data.get("progress"),
        )
        return Response({"ok": True})


class DeregisterApi(RunnerApi):
    @extend_schema(
        tags=[TAG_RUNNERS],
        summary="Deregister a runner",
        operation_id="runner_deregister",
        request=RunnerIdInput,
        responses={200: OkOutput, **error_responses(*WRITE_ERRORS, 404)},
    )
    @idempotent
    def post(self, request: Request) -> Response:
        """The runner leaves; jobs it still holds are recovered (``runner_lost``)."""
        data = validated(RunnerIdInput, request.data)
        runners.deregister(organization=organization_of(request), runner_id=data["runner_id"])
        return Response({"ok": True})


class ReportApi(RunnerApi):
    """A runner's report on a job (``kind``), with its body (``input``)."""

    kind: ClassVar[str] = ""
    input: ClassVar[type[InputSerializer]] = RunnerIdInput

    @idempotent
    def post(self, request: Request, job_id: UUID) -> Response:
        data = validated(self.input, request.data)
        runners.report(
            organization=organization_of(request),
            runner_id=data["runner_id"],
            job_id=job_id,
            report=runners.Report(
                self.kind,
                result=data.get("result"),
                error=data.get("error", ""),
                signal=data.get("signal", ""),
                code=data.get("code", ""),
                retryable=data.get("retryable"),
            ),
        )
        return Response({"ok": True})


class ReportsApi(RunnerApi):
    @extend_schema(
        tags=[TAG_RUNNERS],
        summary="Report on several jobs at once",
        operation_id="runner_reports",
        request=ReportsInput,
        responses={200: ReportsOutput, **error_responses(*WRITE_ERRORS, 404)},
    )
    @idempotent
    def post(self, request: Request) -> Response:
        """Several reports of one runner (each what `POST /runner/jobs/{id}/<kind>` does)
        in one request and one transaction. Each is answered alone, in order: `ok`, or
        `refused` with the code its single route would answer (`not_found`,
        `not_job_owner`, `invalid_transition`), having changed nothing of its job; the
        others are applied all the same. 404 for a runner not found."""
        data = validated(ReportsInput, request.data)
        items = data["reports"]
        answers = runners.report_many(
            organization=organization_of(request),
            runner_id=data["runner_id"],
            reports=[
                (
                    item["job"],
                    runners.Report(
                        item["kind"],
                        result=item.get("result"),
                        error=item.get("error", ""),
                        signal=item.get("signal", ""),
                        code=item.get("code", ""),
                        retryable=item.get("retryable"),
                    ),
                )
                for item in items
            ],
        )
        results = [
            {"job": str(item["job"]), "ok": True}
            if refusal is None
            else {
                "job": str(item["job"]),
                "ok": False,
                "refused": {"code": getattr(refusal, "code", "conflict"), "message": str(refusal)},
            }
            for item, refusal in zip(items, answers, strict=True)
        ]
        return Response({"results": results})


# What each report does, as clients read it in the schema.
_REPORTED = {
    "started": "The runner has started the job: claimed -> running. After a stop was sent "
    "to the job, the stop stands and this changes nothing.",
    "completed": "The job finished: its step completes with `result` (any JSON) as its "
    "output, and the `runner` tool's price is charged.",
    "failed": "The job failed: its step's attempt fails with `runner_failed` (or a worker "
    "tool's `code`) and `error` as the message; the step's retry policy may make a new "
    "attempt, with a new job.",
    "stopped": "The job ended on a stop command, by `signal` (`SIGTERM`, or `SIGKILL` "
    "5 s later): its step's attempt fails with `runner_stopped`, not retried.",
}


def _reporting(kind: str, body: type[InputSerializer]) -> type[ReportApi]:
    """The view of one report: ``POST /runner/jobs/{id}/<kind>``."""
    view = type(
        f"{kind.capitalize()}Api",
        (ReportApi,),
        {"kind": kind, "input": body, "__module__": __name__},
    )
    schema = extend_schema(
        tags=[TAG_RUNNERS],
        summary=f"Report a job {kind}",
        description=f"{_REPORTED[kind]} The same report again changes nothing. 409 "
        "`not_job_owner` from a runner that does not hold the job, `invalid_transition` "
        "when the job's state does not allow the report.",
        operation_id=f"runner_job_{kind}",
        request=body,
        responses={200: OkOutput, **error_responses(*WRITE_ERRORS, 404)},
    )
    return cast(type[ReportApi], extend_schema_view(post=schema)(view))


StartedApi = _reporting("started", RunnerIdInput)
CompletedApi = _reporting("completed", CompletedInput)
FailedApi = _reporting("failed", FailedInput)
StoppedApi = _reporting("stopped", StoppedInput)


# --------------------------------------------------------------------------- client routes
RunnerPage = paginated(RunnerOutput, "PaginatedRunnerList")


class RunnersApi(ApiView):
    queries: ClassVar[dict[str, type[serializers.Serializer[Any]]]] = {"get": PageQuery}

    @extend_schema(
        tags=[TAG_RUNNERS],
        summary="List the organization's runners",
        operation_id="runners_list",
        parameters=[PageQuery],
        responses={200: RunnerPage, **error_responses(*LIST_ERRORS)},
    )
    def get(self, request: Request) -> Response:
        """Every runner that registered, online, stale or deregistered."""
        rows = Runner.objects.filter(organization=organization_of(request)).order_by(
            "hostname", "project_dir", "executor_type"
        )
        return page_response(request, rows, self.query, RunnerOutput)


JobPage = paginated(JobOutput, "PaginatedJobList")


class RunnerJobsApi(ApiView):
    queries: ClassVar[dict[str, type[serializers.Serializer[Any]]]] = {"get": PageQuery}
    filterset = RunnerJobFilter

    @list_schema(
        "List the organization's runner jobs",
        PageQuery,
        RunnerJobFilter,
        JobPage,
        "runner_jobs_list",
        tag=TAG_RUNNERS,
    )
    def get(self, request: Request) -> Response:
        """Newest first. A run's `runner` steps name their current job (`job`); this list
        finds every attempt's, by run, step, status or runner."""
        jobs = selectors.runner_job_list(organization=organization_of(request), query=self.filters)
        return page_response(request, jobs, self.query, JobOutput)


class RunnerJobApi(ApiView):
    @extend_schema(
        tags=[TAG_RUNNERS],
        summary="Show a runner job",
        operation_id="runner_jobs_retrieve",
        responses={200: JobOutput, **error_responses(*LIST_ERRORS)},
    )
    def get(self, request: Request, job_id: UUID) -> Response:
        """One runner job: its status and demands, the runner that holds it, its run,
        step, attempt and session, its result, error or signal, and its timestamps."""
        job = selectors.runner_job(organization=organization_of(request), job_id=job_id)
        if job is None:
            raise runners.RunnerJobNotFound(f"runner job {job_id} not found")
        return Response(JobOutput(job).data)


class RunnerJobStopApi(ApiView):
    @extend_schema(
        tags=[TAG_RUNNERS],
        summary="Stop a runner job",
        operation_id="runner_jobs_stop",
        request=EmptyInput,
        responses={200: JobOutput, **error_responses(*WRITE_ERRORS, 404)},
    )
    @idempotent
    def post(self, request: Request, job_id: UUID) -> Response:
        """claimed or running -> stopping; its runner is told at once. 409 otherwise."""
        validated(EmptyInput, request.data)
        organization = organization_of(request)
        stopped = runners.stop_job(organization=organization, job_id=job_id)
        # Read again with its step's path, as the other routes read a job.
        job = selectors.runner_job(organization=organization, job_id=stopped.pk)
        return Response(JobOutput(job).data)
