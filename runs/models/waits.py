"""What a step waits on outside the worker: runners and their jobs (a `runner` step, a
worker tool), and a `callback` or `poll` step's wait."""

from __future__ import annotations

import uuid

from django.db import models
from django.db.models import Q

from billing.models import Organization
from runs.models.base import status_in
from runs.models.hierarchy import Run

# --------------------------------------------------------------------------- runners
# The runner protocol (docs/runners.md): runners are processes on other hosts
# that long-poll this coordinator for jobs. A `runner` step's attempt is one job; the
# step stays RUNNING, with no worker and no lease, until the job's runner reports.


# The waiting_reason of a step parked on a worker tool's job that no online worker of
# its organization offers (docs/tools.md); cleared when a worker claims the job, or when
# the job ends unclaimed.
NO_WORKER_OFFERS_TOOL = "no_worker_offers_tool"


class RunnerJobStatus(models.TextChoices):
    PENDING = "pending"  # waiting for a runner that matches its demands
    CLAIMED = "claimed"  # a runner has it, and has not said it started
    RUNNING = "running"
    STOPPING = "stopping"  # a stop was asked for; the runner has not confirmed it
    COMPLETED = "completed"
    FAILED = "failed"
    STOPPED = "stopped"


class Runner(models.Model):
    """A registered runner. Its id is derived from (organization, hostname, project_dir,
    executor_type): the same host and directory reconnect as the same runner."""

    id = models.CharField(primary_key=True, max_length=40)
    organization = models.ForeignKey(Organization, on_delete=models.CASCADE, related_name="runners")
    hostname = models.CharField(max_length=255)
    project_dir = models.CharField(max_length=1000)
    executor_type = models.CharField(max_length=100)
    tags = models.JSONField(default=list, blank=True)
    # The published tools an `orch worker` offers, {name: version} (docs/tools.md): it
    # claims the jobs of those tools and no other; a runner offering none, `runner` jobs.
    tools = models.JSONField(default=dict, blank=True)
    registered_at = models.DateTimeField()
    last_heartbeat = models.DateTimeField()
    deregistered_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["organization", "hostname", "project_dir"]
        indexes = [models.Index(fields=["organization", "last_heartbeat"], name="runner_org_beat")]

    def __str__(self) -> str:
        return f"{self.id} ({self.hostname}:{self.project_dir})"


class RunnerJob(models.Model):
    """One attempt of a `runner` step, or of a step of a published tool that runs on an
    `orch worker` (``tool`` set: docs/tools.md), as a runner receives it."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    organization = models.ForeignKey(
        Organization, on_delete=models.CASCADE, related_name="runner_jobs"
    )
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="runner_jobs")
    # No index of its own: runnerjob_one_per_attempt leads with it.
    step = models.ForeignKey(
        "Step", on_delete=models.CASCADE, related_name="runner_jobs", db_index=False
    )
    attempt = models.PositiveIntegerField()
    priority = models.PositiveSmallIntegerField(default=5)
    type = models.CharField(max_length=20, default="start_session")
    prompt = models.TextField()
    session_id = models.CharField(max_length=40)
    agent_name = models.CharField(max_length=100, blank=True)
    project_dir = models.CharField(max_length=1000, blank=True)
    # {"hostname", "project_dir", "executor_type": exact when set; "tags": all required}
    demands = models.JSONField(default=dict, blank=True)
    # A resume_session job goes to the runner that holds its session, and only there.
    required_runner = models.ForeignKey(
        Runner, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    status = models.CharField(
        max_length=10, choices=RunnerJobStatus.choices, default=RunnerJobStatus.PENDING
    )
    runner = models.ForeignKey(
        Runner, null=True, blank=True, on_delete=models.SET_NULL, related_name="jobs"
    )
    result = models.JSONField(null=True, blank=True)
    error = models.TextField(blank=True)
    signal = models.CharField(max_length=10, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    claimed_at = models.DateTimeField(null=True, blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    stop_requested_at = models.DateTimeField(null=True, blank=True)
    # When a poll handed the stop command to the runner (it is handed over once).
    stop_delivered_at = models.DateTimeField(null=True, blank=True)
    completed_at = models.DateTimeField(null=True, blank=True)
    # When a pending job fails with no_matching_runner.
    timeout_at = models.DateTimeField()
    # Its step attempt's traceparent, handed to the runner (which continues the trace).
    trace_context = models.CharField(max_length=128, blank=True, default="", db_default="")
    # A worker tool's job: the tool, its version when the job was made, and the step's
    # rendered params; "" for a `runner` step's job (its prompt says what to do).
    tool = models.CharField(max_length=64, blank=True, default="", db_default="")
    tool_version = models.CharField(max_length=40, blank=True, default="", db_default="")
    params = models.JSONField(null=True, blank=True)
    # What the tool last said of its progress (``Context.heartbeat``), sent with the
    # worker's heartbeats.
    progress = models.JSONField(null=True, blank=True)
    # A worker tool's failure as the tool classified it (an engine error code, and
    # whether the step's retry policy may try again); "" for a `runner_failed`.
    error_code = models.CharField(max_length=40, blank=True, default="", db_default="")
    retryable = models.BooleanField(null=True, blank=True)

    class Meta:
        ordering = ["created_at"]
        indexes = [
            # What a poll claims: an organization's pending jobs, by priority then age.
            models.Index(
                fields=["organization", "priority", "created_at"],
                name="runnerjob_claimable",
                condition=Q(status="pending"),
            ),
            # What a runner holds (its stop commands, and the stale-runner sweep).
            models.Index(
                fields=["runner", "status"],
                name="runnerjob_held",
                condition=Q(status__in=["claimed", "running", "stopping"]),
            ),
            models.Index(fields=["session_id"], name="runnerjob_session"),
        ]
        constraints = [
            models.UniqueConstraint(fields=["step", "attempt"], name="runnerjob_one_per_attempt"),
            status_in("runnerjob", RunnerJobStatus),
        ]

    def __str__(self) -> str:
        return f"job {self.id} ({self.status})"


# --------------------------------------------------------------------------- waits
# A `callback` or `poll` step's attempt waits here (runs.callbacks; docs/runners.md,
# "Asynchronous steps"): RUNNING with no worker until a callback is posted, a poll's
# condition holds, or its time runs out.


class StepWaitKind(models.TextChoices):
    CALLBACK = "callback"
    POLL = "poll"


class StepWaitStatus(models.TextChoices):
    WAITING = "waiting"
    COMPLETED = "completed"  # the callback said completed, or done_when held
    FAILED = "failed"  # the callback said failed, failed_when held, or polls ran out
    CLOSED = "closed"  # the attempt ended otherwise (cancelled, timed out)


class StepWait(models.Model):
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    run = models.ForeignKey(
        Run, on_delete=models.CASCADE, related_name="waits", db_constraint=False
    )
    # No index of its own: stepwait_one_per_attempt leads with it.
    step = models.ForeignKey(
        "Step",
        on_delete=models.CASCADE,
        related_name="waits",
        db_index=False,
        db_constraint=False,
    )
    attempt = models.PositiveIntegerField()
    kind = models.CharField(max_length=10, choices=StepWaitKind.choices)
    status = models.CharField(
        max_length=10, choices=StepWaitStatus.choices, default=StepWaitStatus.WAITING
    )
    # A callback's secret, as its SHA-256 (the token itself is never stored).
    token_digest = models.CharField(max_length=64, blank=True)
    # A poll's rendered parameters (url, interval, max_attempts, done_when, ...).
    params = models.JSONField(default=dict, blank=True)
    polls = models.PositiveIntegerField(default=0)
    next_poll_at = models.DateTimeField(null=True, blank=True)
    last_response = models.JSONField(null=True, blank=True)
    expires_at = models.DateTimeField()
    result = models.JSONField(null=True, blank=True)
    error = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    ended_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["created_at"]
        indexes = [
            # What the sweep looks at: the waits still open, by when they are due.
            models.Index(
                fields=["next_poll_at"], name="stepwait_due", condition=Q(status="waiting")
            ),
            models.Index(
                fields=["expires_at"], name="stepwait_expiry", condition=Q(status="waiting")
            ),
        ]
        constraints = [
            models.UniqueConstraint(fields=["step", "attempt"], name="stepwait_one_per_attempt"),
            status_in("stepwait", StepWaitStatus),
        ]

    def __str__(self) -> str:
        return f"{self.kind} wait {self.id} ({self.status})"
