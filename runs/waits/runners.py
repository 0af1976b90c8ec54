"""The runner protocol's services (docs/runners.md).

A runner registers with a key of its organization, long-polls for jobs, reports what
it does with each, and heartbeats. A job is one attempt of a `runner` step, created when
the worker parks the step (``runs.engine.waiting``); the step ends through
``outcomes.record`` when the job's runner reports, like any attempt: the charge, retries
(``runner_failed`` and ``runner_lost`` are retryable, a new job per attempt) and failure
modes are the engine's. Every function takes the caller's organization and finds
nothing of another's (``RunnerNotFound``, ``RunnerJobNotFound``: 404).

Job states: pending -> claimed -> running -> completed | failed | stopped, with stopping
between running (or claimed) and stopped once a stop was asked for (a cancel, the
step's timeout, ``stop_job``). A report repeated as it was first made changes nothing
and answers as the first did; any other report the job's state does not allow is
``InvalidTransition``; a report from a runner that does not hold the job is
``NotJobOwner``.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any
from uuid import UUID

from django.conf import settings
from django.core.exceptions import ValidationError as DjangoValidationError
from django.db import transaction
from django.db.models import Min
from django.utils import timezone

from billing.models import Organization
from billing.pricing import tool_price
from billing.selectors import key_refused
from common import tracing
from common.queries import fetch
from common.tools.base import ToolError
from runs import catalogue
from runs.engine.outcomes import Outcome, record
from runs.engine.waiting import Parked
from runs.models import (
    NO_WORKER_OFFERS_TOOL,
    EventKind,
    Runner,
    RunnerJob,
    RunnerJobStatus,
    Step,
)
from runs.outbox import after_commit, wake_runners
from runs.queries import QUERIES
from runs.selectors import with_step_path
from runs.services import lock_run
from runs.states import InvalidTransition
from runs.transitions import record_event

J = RunnerJobStatus
HELD = (J.CLAIMED, J.RUNNING, J.STOPPING)
SIGNALS = ("SIGTERM", "SIGKILL")


class RunnerNotFound(Exception):
    code = "not_found"


class RunnerJobNotFound(Exception):
    code = "not_found"


class DuplicateRunner(Exception):
    """An online runner already has this identity (409 ``duplicate_runner``)."""

    code = "duplicate_runner"

    def __init__(self, runner: Runner) -> None:
        super().__init__("an online runner with this identity already exists")
        self.runner = runner

    @property
    def details(self) -> dict[str, str]:
        return {
            "runner_id": self.runner.id,
            "hostname": self.runner.hostname,
            "project_dir": self.runner.project_dir,
            "executor_type": self.runner.executor_type,
        }


class NotJobOwner(Exception):
    """A report about a job from a runner that does not hold it (409 ``not_job_owner``)."""

    code = "not_job_owner"


def organization_channel(organization_id: Any) -> str:
    """The Redis channel that wakes every held poll of an organization (a new job)."""
    return f"orchestrator:runners:{organization_id}"


def runner_channel(runner_id: str) -> str:
    """The Redis channel that wakes one runner's held poll (a stop command)."""
    return f"orchestrator:runner:{runner_id}"


def runner_id_for(organization_id: Any, hostname: str, project_dir: str, executor_type: str) -> str:
    """Deterministic within the organization: the same host, directory and executor type
    reconnect as the same runner."""
    identity = "\x00".join([str(organization_id), hostname, project_dir, executor_type])
    return "rnr_" + hashlib.sha256(identity.encode()).hexdigest()[:24]


def is_online(runner: Runner, now: datetime | None = None) -> bool:
    now = now or timezone.now()
    fresh = now - runner.last_heartbeat < timedelta(seconds=settings.RUNNER_STALE_AFTER)
    return runner.deregistered_at is None and fresh


def runner_status(runner: Runner, now: datetime | None = None) -> str:
    if runner.deregistered_at is not None:
        return "deregistered"
    return "online" if is_online(runner, now) else "stale"


@dataclass(frozen=True)
class Registration:
    runner: Runner
    reconnected: bool


# --------------------------------------------------------------------------- registry
@transaction.atomic
def register(
    *,
    organization: Organization,
    hostname: str,
    project_dir: str,
    executor_type: str,
    tags: list[str] | None = None,
    tools: list[dict[str, Any]] | None = None,
) -> Registration:
    """Register a runner, or reconnect one whose earlier registration went stale or was
    deregistered (its jobs were, or are now, recovered). ``DuplicateRunner`` while the
    identity is online.

    ``tools``: the definitions of the published tools an ``orch worker`` offers
    (docs/tools.md), kept in the organization's catalogue (``catalogue.publish``: a
    version published before with another schema is refused, and nothing is registered);
    the runner then claims the jobs of those tools, at those versions, and no other."""
    now = timezone.now()
    runner_id = runner_id_for(organization.pk, hostname, project_dir, executor_type)
    tags = sorted(set(tags or []))
    definitions = [catalogue.definition_from(tool) for tool in tools or []]
    offered = {definition.name: definition.version for definition in definitions}
    if len(offered) < len(definitions):
        raise catalogue.InvalidToolDefinition("tools: each tool is offered once")
    if definitions:
        catalogue.publish(organization=organization, definitions=definitions, by=runner_id)
    # Two registrations of one identity at once: the row lock orders them.
    existing = Runner.objects.select_for_update().filter(pk=runner_id).first()
    if existing is None:
        runner = Runner.objects.create(
            id=runner_id,
            organization=organization,
            hostname=hostname,
            project_dir=project_dir,
            executor_type=executor_type,
            tags=tags,
            tools=offered,
            registered_at=now,
            last_heartbeat=now,
        )
        return Registration(runner, reconnected=False)
    if is_online(existing, now):
        raise DuplicateRunner(existing)
    _recover_jobs(existing, now, "the runner registered again: its earlier jobs were lost")
    existing.tags, existing.tools, existing.registered_at = tags, offered, now
    existing.last_heartbeat, existing.deregistered_at = now, None
    existing.save(
        update_fields=["tags", "tools", "registered_at", "last_heartbeat", "deregistered_at"]
    )
    return Registration(existing, reconnected=True)


def _runner(organization: Organization, runner_id: str, *, lock: bool = False) -> Runner:
    query = Runner.objects.filter(organization=organization, pk=runner_id)
    runner = (query.select_for_update() if lock else query).first()
    if runner is None:
        raise RunnerNotFound(f"runner {runner_id} not found")
    return runner


def heartbeat(
    *, organization: Organization, runner_id: str, progress: dict[str, Any] | None = None
) -> Runner:
    """A runner is alive. A deregistered runner stays deregistered (its poll says so).
    ``progress``: what the tools of the jobs it holds last said of their progress, by job
    id (``Context.heartbeat``), kept on each job it still holds (another's is ignored)."""
    runner = _runner(organization, runner_id)
    now = timezone.now()
    Runner.objects.filter(pk=runner.pk, deregistered_at__isnull=True).update(last_heartbeat=now)
    runner.last_heartbeat = now
    for job_id, value in sorted((progress or {}).items()):
        RunnerJob.objects.filter(pk=job_id, runner=runner, status__in=HELD).update(progress=value)
    return runner


@transaction.atomic
def deregister(*, organization: Organization, runner_id: str) -> Runner:
    """The runner leaves: the jobs it still holds are recovered (``runner_lost``)."""
    runner = _runner(organization, runner_id, lock=True)
    now = timezone.now()
    if runner.deregistered_at is None:
        _recover_jobs(runner, now, "the runner deregistered while holding the job")
        runner.deregistered_at = now
        runner.save(update_fields=["deregistered_at"])
    return runner


# --------------------------------------------------------------------------- polls
@dataclass(frozen=True)
class Poll:
    """What a poll hands a runner: stop commands first, else jobs (one, or up to the
    free slots it asked for), else nothing."""

    deregistered: bool = False
    stop_jobs: list[str] = field(default_factory=list)
    jobs: list[RunnerJob] = field(default_factory=list)
    # The registration this look was made for: a held poll passes it to its next looks.
    registered_at: datetime | None = None
    # Why the poll's key may no longer be used (``billing.selectors.key_refused``), or "".
    refused: str = ""

    @property
    def job(self) -> RunnerJob | None:
        return self.jobs[0] if self.jobs else None

    @property
    def empty(self) -> bool:
        return not (self.refused or self.deregistered or self.stop_jobs or self.jobs)


# The claim (priority, then age, SKIP LOCKED; a worker tool's job to a runner offering
# that tool at its version) is a statement written once: runs/queries/runner_jobs_claim.sql.


@transaction.atomic
def poll(
    *,
    organization: Organization,
    runner_id: str,
    registered_at: datetime | None = None,
    api_key_id: Any = None,
    limit: int = 1,
) -> Poll:
    """One look for the runner (the API holds the request and looks again when woken):
    its stop commands not yet handed over, else the first ``limit`` pending jobs it
    matches (priority, then age; claimed atomically: ``SKIP LOCKED`` lets concurrent
    polls take different jobs; ``limit`` 0 claims none, for a runner whose slots are all
    busy and who waits for stop commands only), else nothing. A poll's first look counts
    as a heartbeat (the runner was there to send it); the later looks of a held poll do
    not, and claim nothing once the runner has gone stale.

    ``registered_at``: the registration a held poll began under. If the runner has
    registered again since (its process restarted while this poll was held, and the
    server never saw the old connection close), the poll belongs to a process that is
    gone: it ends as deregistered and claims nothing, or the job it claimed would never
    reach the new process (found by the restart test).

    ``api_key_id``: the key the poll came with. A held poll outlives the request's
    authentication, so each look reads the key and its organization again (one read by
    primary keys) before it hands anything over: a look that begins once the key's
    revocation or the organization's suspension has committed claims nothing and ends the
    hold (``refused``)."""
    refused = key_refused(api_key_id) if api_key_id is not None else ""
    if refused:
        return Poll(refused=refused, registered_at=registered_at)
    # Locked: a registration and a claim for one runner never interleave.
    runner = _runner(organization, runner_id, lock=True)
    superseded = registered_at is not None and runner.registered_at != registered_at
    if runner.deregistered_at is not None or superseded:
        return Poll(deregistered=True, registered_at=runner.registered_at)
    now = timezone.now()
    if registered_at is None:
        Runner.objects.filter(pk=runner.pk).update(last_heartbeat=now)
    elif not is_online(runner, now):
        # A later look of a held poll proves nothing: a runner whose host vanished
        # leaves its poll held (no reset ever comes). Counting those looks kept such a
        # runner alive, and able to claim jobs, until the poll ended (make chaos-net:
        # its job recovered 37.5 s after the host was lost, against 6 s stale time).
        return Poll(registered_at=runner.registered_at)
    stops = RunnerJob.objects.filter(
        runner=runner, status=J.STOPPING, stop_delivered_at__isnull=True
    )
    stop_ids = [str(job_id) for job_id in stops.values_list("id", flat=True)]
    if stop_ids:
        RunnerJob.objects.filter(pk__in=stop_ids).update(stop_delivered_at=now)
        return Poll(stop_jobs=stop_ids, registered_at=runner.registered_at)
    if limit <= 0:
        return Poll(registered_at=runner.registered_at)
    _, rows = fetch(
        QUERIES["runner_jobs_claim"],
        {
            "runner": runner.pk,
            "organization": organization.pk,
            "now": now,
            "hostname": runner.hostname,
            "project_dir": runner.project_dir,
            "executor_type": runner.executor_type,
            "tags": _json_list(runner.tags),
            "tools": json.dumps(runner.tools),
            "limit": limit,
        },
    )
    claimed = [row[0] for row in rows]
    if not claimed:
        return Poll(registered_at=runner.registered_at)
    jobs = list(
        with_step_path(RunnerJob.objects.select_related("run"))
        .filter(pk__in=claimed)
        .order_by("priority", "created_at", "id")
    )
    waited = [job.step_id for job in jobs if job.tool]
    if waited:
        Step.objects.filter(pk__in=waited, waiting_reason=NO_WORKER_OFFERS_TOOL).update(
            waiting_reason=""
        )
    for job in jobs:
        _event(job, f"claimed by runner {runner.pk}")
    return Poll(jobs=jobs, registered_at=runner.registered_at)


def _json_list(values: list[str]) -> str:
    return json.dumps(sorted(values))


# --------------------------------------------------------------------------- reports
@dataclass(frozen=True)
class Report:
    kind: str  # started | completed | failed | stopped
    result: Any = None
    error: str = ""
    signal: str = ""
    # A worker tool's failure as it classified it (an engine error code and whether it
    # may be retried); "" for `runner_failed`, retried by the step's policy.
    code: str = ""
    retryable: bool | None = None


_FROM: dict[str, tuple[str, ...]] = {
    "started": (J.CLAIMED,),
    "completed": (J.CLAIMED, J.RUNNING, J.STOPPING),
    "failed": (J.CLAIMED, J.RUNNING, J.STOPPING),
    "stopped": (J.CLAIMED, J.RUNNING, J.STOPPING),
}
_TO = {"started": J.RUNNING, "completed": J.COMPLETED, "failed": J.FAILED, "stopped": J.STOPPED}


@transaction.atomic
def report(*, organization: Organization, runner_id: str, job_id: Any, report: Report) -> RunnerJob:
    """Apply a runner's report on a job, and record the step's attempt when it ends."""
    runner = _runner(organization, runner_id)
    job = _locked_job(organization, job_id)
    return _apply(runner, job, report)


@transaction.atomic
def report_many(
    *, organization: Organization, runner_id: str, reports: Sequence[tuple[Any, Report]]
) -> list[Exception | None]:
    """Apply several reports of one runner, each on another job, in one transaction: what
    ``report`` does for each, in the order given within each run. Each answers alone: None
    once applied (or a repeat of one applied), else why it was refused
    (``RunnerJobNotFound``, ``NotJobOwner``, ``InvalidTransition``), having changed
    nothing of its job; the others are applied all the same. ``RunnerNotFound`` refuses
    them all.

    Each run is locked once, then its jobs, runs in the order of their ids: the order of
    ``_locked_job`` (run, then job) for each, and one order between runs, so that two
    batches never wait on each other."""
    runner = _runner(organization, runner_id)
    answers: list[Exception | None] = [None] * len(reports)
    keys = [_job_key(job_id) for job_id, _ in reports]
    runs = dict(
        RunnerJob.objects.filter(
            organization=organization, pk__in=[key for key in keys if key is not None]
        ).values_list("pk", "run_id")
    )
    by_run: dict[UUID, list[tuple[int, UUID]]] = {}
    for index, key in enumerate(keys):
        if key is not None and key in runs:
            by_run.setdefault(runs[key], []).append((index, key))
        else:
            answers[index] = RunnerJobNotFound(f"runner job {reports[index][0]} not found")
    for run_id, mine in sorted(by_run.items()):
        run = lock_run(run_id, light=True)
        locked = RunnerJob.objects.select_for_update().filter(pk__in=[key for _, key in mine])
        jobs = {job.pk: job for job in locked.order_by("pk")}
        for index, key in mine:
            job = jobs[key]
            job.run = run
            try:
                _apply(runner, job, reports[index][1])
            except (NotJobOwner, InvalidTransition) as exc:
                answers[index] = exc
    return answers


def held_job(*, organization: Organization, runner_id: str, job_id: Any) -> RunnerJob:
    """The job ``runner_id`` holds now (claimed, running or stopping), for what the
    runner does on its behalf beside its reports (an artifact its tool saves):
    ``RunnerNotFound``, ``RunnerJobNotFound`` (another organization's, or no such job),
    ``NotJobOwner`` (another runner's, or one this runner no longer holds)."""
    runner = _runner(organization, runner_id)
    key = _job_key(job_id)
    job = RunnerJob.objects.filter(organization=organization, pk=key).first() if key else None
    if job is None:
        raise RunnerJobNotFound(f"runner job {job_id} not found")
    if job.runner_id != runner.pk or job.status not in HELD:
        raise NotJobOwner(f"runner {runner.pk} does not hold job {job.pk}")
    return job


def _job_key(job_id: Any) -> UUID | None:
    """A job id as the table keys it; None for one no job can have."""
    try:
        return job_id if isinstance(job_id, UUID) else UUID(str(job_id))
    except ValueError:
        return None


def _apply(runner: Runner, job: RunnerJob, report: Report) -> RunnerJob:
    """``report`` on ``job``, locked after its run: raises, having written nothing, when
    the runner does not hold it or its state does not allow the report."""
    if job.runner_id != runner.pk:
        raise NotJobOwner(f"runner {runner.pk} does not hold job {job.pk}")
    target = _TO[report.kind]
    if _repeats(job, report, target):
        return job
    if job.status == J.STOPPING and report.kind == "started":
        return job  # it started before the stop reached it: the stop still stands
    if job.status not in _FROM[report.kind]:
        raise InvalidTransition("runner_job", job.status, target)
    now = timezone.now()
    job.status = target
    fields = ["status"]
    if report.kind == "started":
        job.started_at = now
        fields.append("started_at")
    else:
        job.completed_at = now
        job.result = report.result if report.kind == "completed" else None
        job.error = report.error if report.kind == "failed" else ""
        job.signal = report.signal if report.kind == "stopped" else ""
        job.error_code = report.code if report.kind == "failed" else ""
        job.retryable = report.retryable if report.kind == "failed" and report.code else None
        fields += ["completed_at", "result", "error", "signal", "error_code", "retryable"]
    job.save(update_fields=fields)
    _event(job, f"{report.kind}, reported by runner {runner.pk}")
    if report.kind != "started":
        if tracing.enabled:
            _trace_wait(job)
        record(job.step_id, job.run_id, job.attempt, _outcome(job))
    return job


def _trace_wait(job: RunnerJob) -> None:
    """The step's wait for its runner job, a span under the step's attempt from the
    job's creation to its end (emitted at commit); the runner's own span for the job is
    its sibling (orchestrator_client/runner.py)."""
    attributes = {
        "orchestrator.run.id": str(job.run_id),
        "orchestrator.step.id": job.step_id,
        "orchestrator.attempt": job.attempt,
        "orchestrator.wait.kind": "runner_job",
        "orchestrator.runner_job.id": str(job.pk),
        "orchestrator.runner_job.status": job.status,
        "orchestrator.runner.id": job.runner_id or "",
    }
    transaction.on_commit(
        lambda: tracing.emit(
            "wait runner_job",
            parent_context=job.trace_context,
            started=job.created_at,
            ended=job.completed_at or timezone.now(),
            attributes=attributes,
        )
    )


def _repeats(job: RunnerJob, report: Report, target: str) -> bool:
    """The report is the one already applied (a runner retrying a request)."""
    if job.status != target:
        return False
    if report.kind == "completed":
        return bool(job.result == report.result)
    if report.kind == "failed":
        return job.error == report.error and job.error_code == report.code
    if report.kind == "stopped":
        return job.signal == report.signal
    return True


def _outcome(job: RunnerJob) -> Outcome:
    # A worker tool's job is priced as its tool (BILLING_TOOL_PRICES, by its name).
    price = tool_price(job.tool or "runner")
    if job.status == J.COMPLETED:
        return Outcome(output=job.result, cost=price)
    if job.status == J.FAILED:
        code = job.error_code or "runner_failed"
        error = ToolError(code, job.error or "the runner failed", job.retryable)
        return Outcome(error=error, cost=price)
    return Outcome(
        error=ToolError("runner_stopped", f"the runner stopped the job ({job.signal})", False),
        cost=price,
    )


def _locked_job(organization: Organization | None, job_id: Any) -> RunnerJob:
    """The job, locked after its run: the order every path that ends a job's step takes
    (a cancel locks the run, then stops its jobs), so that two never wait on each other.
    """
    query = (
        RunnerJob.objects.all()
        if organization is None
        else RunnerJob.objects.filter(organization=organization)
    )
    try:
        run_id = query.values_list("run_id", flat=True).get(pk=job_id)
    except (RunnerJob.DoesNotExist, ValueError, DjangoValidationError) as exc:
        raise RunnerJobNotFound(f"runner job {job_id} not found") from exc
    run = lock_run(run_id, light=True)
    job = RunnerJob.objects.select_for_update().get(pk=job_id)
    job.run = run
    return job


# --------------------------------------------------------------------------- stop
@transaction.atomic
def stop_job(*, organization: Organization, job_id: Any) -> RunnerJob:
    """Ask the job's runner to stop it (``stopping``); the runner reports ``stopped``
    and the step fails with ``runner_stopped``. Only a claimed or running job can be."""
    job = _locked_job(organization, job_id)
    if job.status == J.STOPPING:
        return job
    if job.status not in (J.CLAIMED, J.RUNNING):
        raise InvalidTransition("runner_job", job.status, J.STOPPING)
    _stop(job, timezone.now(), "stop requested")
    return job


# --------------------------------------------------------------------------- sweeps
def sweep(now: datetime | None = None) -> dict[str, int]:
    """The beat's look at runners and jobs: the jobs of stale runners recovered
    (``runner_lost``, retryable), pending jobs past their match timeout failed
    (``no_matching_runner``). Each in its own transaction; safe to run twice."""
    now = now or timezone.now()
    stale_before = now - timedelta(seconds=settings.RUNNER_STALE_AFTER)
    lost = 0
    stale = Runner.objects.filter(last_heartbeat__lt=stale_before, jobs__status__in=HELD).distinct()
    for runner_id in stale.values_list("pk", flat=True):
        with transaction.atomic():
            runner = Runner.objects.select_for_update().get(pk=runner_id)
            if runner.last_heartbeat < stale_before:
                lost += _recover_jobs(runner, now, "the runner stopped sending heartbeats")
    timed_out = _time_out_steps(now)
    unmatched = 0
    overdue = RunnerJob.objects.filter(status=J.PENDING, timeout_at__lte=now)
    for job_id in overdue.values_list("pk", flat=True)[:1000]:
        with transaction.atomic():
            job = _locked_job(None, job_id)
            if job.status != J.PENDING:
                continue
            job.status, job.completed_at = J.FAILED, now
            job.error = "no runner matching the job's demands claimed it in time"
            job.save(update_fields=["status", "completed_at", "error"])
            _event(job, "no matching runner")
            record(
                job.step_id,
                job.run_id,
                job.attempt,
                Outcome(error=ToolError("no_matching_runner", job.error, False)),
            )
            unmatched += 1
    return {"runner_lost": lost, "no_matching_runner": unmatched, "timeout": timed_out}


# A parked step has no worker to enforce its timeout: its job's age does, from the
# attempt's job (a retry's new job starts the clock again), with the step's own limit. A
# worker tool's step waits for a worker as long as its run does: its clock starts when a
# worker claims the job (NULL until then: never overdue).
_PARKED_JOBS = Parked(
    id="j.id",
    rows="""FROM runs_runnerjob AS j JOIN runs_step AS s ON s.id = j.step_id
WHERE j.status IN ('pending', 'claimed', 'running')
  AND s.status = 'running' AND s.attempts = j.attempt""",
    clock="(CASE WHEN j.tool = '' THEN j.created_at ELSE j.claimed_at END)",
)


def next_due() -> datetime | None:
    """The earliest moment ``sweep`` has something to do: a runner holding jobs goes
    stale, a pending job's match timeout or a parked step's own timeout passes."""
    stale = Runner.objects.filter(jobs__status__in=HELD).aggregate(at=Min("last_heartbeat"))["at"]
    dues = [
        stale + timedelta(seconds=settings.RUNNER_STALE_AFTER) if stale else None,
        RunnerJob.objects.filter(status=J.PENDING).aggregate(at=Min("timeout_at"))["at"],
        _PARKED_JOBS.next_deadline(),
    ]
    return min((due for due in dues if due is not None), default=None)


def _time_out_steps(now: datetime) -> int:
    """Fail, with ``timeout`` (retried by the step's policy), the attempts whose job has
    outlived the step's timeout, and stop their jobs."""
    count = 0
    for job_id in _PARKED_JOBS.overdue(now):
        with transaction.atomic():
            job = _locked_job(None, job_id)
            if job.status not in (J.PENDING, J.CLAIMED, J.RUNNING):
                continue
            message = "the step timed out waiting for its runner job"
            job.error = message
            _stop(job, now, message)
            error = ToolError("timeout", message)
            record(job.step_id, job.run_id, job.attempt, Outcome(error=error, cost=Decimal(0)))
            count += 1
    return count


def _stop(job: RunnerJob, now: datetime, why: str) -> None:
    """End a pending job here; ask the runner of a claimed or running one to stop it."""
    if job.status == J.PENDING:
        job.status, job.completed_at = J.STOPPED, now
    else:
        job.status = J.STOPPING
        runner_ids = [str(job.runner_id)]
        after_commit(lambda: wake_runners(None, runner_ids))
    job.stop_requested_at = now
    job.save(update_fields=["status", "completed_at", "stop_requested_at", "error"])
    _event(job, why)


def _recover_jobs(runner: Runner, now: datetime, why: str) -> int:
    """Fail the jobs ``runner`` holds, and their steps' attempts with ``runner_lost``
    (retried by the step's policy: a new job per attempt). A job being stopped simply
    ends: its step left RUNNING already, or leaves it now as stopped."""
    held = RunnerJob.objects.filter(runner=runner, status__in=HELD).order_by("run_id", "pk")
    # Runs in the order of their ids, as a batch of reports locks them (``report_many``).
    jobs = [_locked_job(None, job_id) for job_id in held.values_list("pk", flat=True)]
    jobs = [job for job in jobs if job.runner_id == runner.pk and job.status in HELD]
    for job in jobs:
        stopping = job.status == J.STOPPING
        job.status = J.STOPPED if stopping else J.FAILED
        job.completed_at, job.error = now, why
        job.save(update_fields=["status", "completed_at", "error"])
        _event(job, why)
        error = (
            ToolError("runner_stopped", why, False)
            if stopping
            else ToolError("runner_lost", why, True)
        )
        record(job.step_id, job.run_id, job.attempt, Outcome(error=error, cost=Decimal(0)))
    return len(jobs)


def _event(job: RunnerJob, message: str) -> None:
    record_event(
        job.run,
        EventKind.RUNNER,
        actor="runner",
        message=f"job {job.pk}: {message}",
        payload={"job": str(job.pk), "status": job.status},
        entity="step",
        entity_id=str(job.step_id),
    )
