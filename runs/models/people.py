"""What people see of a failing run: its failures on record, escalation tickets and
their notifications, and re-plans."""

from __future__ import annotations

import uuid
from decimal import Decimal

from django.db import models
from django.db.models import Q
from django.utils import timezone

from billing.models import Organization
from runs.models.base import status_in
from runs.models.hierarchy import Run, Step

# --------------------------------------------------------------------------- escalation
# The engine's policy layer (runs.engine.policy, runs.escalations, runs.replanning;
# docs/escalation.md): failures on record, tickets for people, and re-plans.


class StepFailure(models.Model):
    """One failed step attempt, as the escalation triggers count them (how many in the
    window) and a ticket shows them. Written with the attempt's outcome."""

    id = models.BigAutoField(primary_key=True)
    # No index of its own: stepfailure_run_time leads with it.
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="failures", db_index=False)
    attempt_number = models.PositiveSmallIntegerField()
    step = models.ForeignKey(Step, on_delete=models.CASCADE, related_name="+", db_index=False)
    step_attempt = models.PositiveIntegerField()
    code = models.CharField(max_length=64)
    message = models.TextField(blank=True)
    retryable = models.BooleanField(default=False)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["run", "created_at"]
        indexes = [models.Index(fields=["run", "created_at"], name="stepfailure_run_time")]

    def __str__(self) -> str:
        return f"{self.code} (step {self.step_id} attempt {self.step_attempt})"


class EscalationStatus(models.TextChoices):
    OPEN = "open"
    ACKNOWLEDGED = "acknowledged"
    RESOLVED = "resolved"


class EscalationReason(models.TextChoices):
    ERROR_BURST = "error_burst"  # more failed attempts in the window than allowed
    ERROR_RATE = "error_rate"  # too large a share of the window's attempts failed
    BACKOFF_EXCEEDED = "backoff_exceeded"  # a retry would wait beyond max_delay_ms
    ATTEMPTS_EXHAUSTED = "attempts_exhausted"  # a step's budget spent, on_exhausted: escalate
    OPERATOR = "operator"  # a person escalated it


class Resolution(models.TextChoices):
    RESUME = "resume"  # carry on where it stopped; failed steps get their retries again
    RETRY = "retry"  # a new attempt of the run
    REPLAN = "replan"  # the failing agents replaced by what the planner proposes
    CANCEL = "cancel"  # cancelled, unused credits refunded
    ESCALATION_TIMEOUT = "escalation_timeout"  # nobody resolved it in time: the run failed
    RUN_ENDED = "run_ended"  # the run ended otherwise while escalated


class Severity(models.TextChoices):
    LOW = "low"
    MEDIUM = "medium"
    HIGH = "high"
    CRITICAL = "critical"


class EscalationTicket(models.Model):
    """A run handed to people. One open (or acknowledged) ticket per run at a time: a
    run that keeps failing adds its failures to it instead of opening another."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    organization = models.ForeignKey(
        Organization, on_delete=models.CASCADE, related_name="escalations"
    )
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="escalations")
    attempt_number = models.PositiveSmallIntegerField()
    status = models.CharField(
        max_length=12, choices=EscalationStatus.choices, default=EscalationStatus.OPEN
    )
    reason = models.CharField(max_length=20, choices=EscalationReason.choices)
    severity = models.CharField(max_length=10, choices=Severity.choices, default=Severity.HIGH)
    # The failures that triggered it, then any that followed while it was open (bounded).
    errors = models.JSONField(default=list, blank=True)
    opened_at = models.DateTimeField()
    acknowledged_at = models.DateTimeField(null=True, blank=True)
    acknowledged_by = models.CharField(max_length=200, blank=True)
    resolved_at = models.DateTimeField(null=True, blank=True)
    resolved_by = models.CharField(max_length=200, blank=True)
    resolution = models.CharField(max_length=20, choices=Resolution.choices, blank=True)
    note = models.TextField(blank=True)
    # When on-call was told (the notification task took it): told once.
    notified_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-opened_at"]
        indexes = [
            models.Index(fields=["organization", "status", "-opened_at"], name="escalation_org"),
        ]
        constraints = [
            models.UniqueConstraint(
                fields=["run"],
                condition=~Q(status="resolved"),
                name="escalation_one_open_per_run",
            ),
            status_in("escalation", EscalationStatus),
        ]

    def __str__(self) -> str:
        return f"escalation {self.id} ({self.reason}, {self.status})"


class NotificationChannel(models.TextChoices):
    WEBHOOK = "webhook"
    EMAIL = "email"


class Notification(models.Model):
    """One delivery attempt of an escalation notice, delivered or not."""

    id = models.BigAutoField(primary_key=True)
    ticket = models.ForeignKey(
        EscalationTicket, on_delete=models.CASCADE, related_name="notifications"
    )
    channel = models.CharField(max_length=10, choices=NotificationChannel.choices)
    attempt = models.PositiveIntegerField()
    target = models.TextField()  # the URL, or the addresses
    delivered = models.BooleanField(default=False)
    status_code = models.PositiveIntegerField(null=True, blank=True)
    error = models.TextField(blank=True)
    duration_ms = models.PositiveIntegerField(default=0)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["ticket", "created_at", "id"]

    def __str__(self) -> str:
        outcome = "delivered" if self.delivered else "failed"
        return f"{self.channel} attempt {self.attempt} ({outcome})"


class ReplanStatus(models.TextChoices):
    REQUESTED = "requested"  # with the planner
    SPAWNED = "spawned"  # its agents were added to the running attempt
    EMPTY = "empty"  # the planner proposed nothing
    FAILED = "failed"  # the planner failed, its answer was refused, or credits lacked
    DROPPED = "dropped"  # the run ended before the planner answered


class ReplanTrigger(models.TextChoices):
    AGENTS_FAILED = "agents_failed"
    TASKS_FAILED = "tasks_failed"
    OPERATOR = "operator"


class Replan(models.Model):
    """One re-plan of a run: what failed, what the planner proposed, what came of it."""

    id = models.BigAutoField(primary_key=True)
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="replans")
    attempt_number = models.PositiveSmallIntegerField()
    number = models.PositiveSmallIntegerField()
    trigger = models.CharField(max_length=16, choices=ReplanTrigger.choices)
    planner = models.CharField(max_length=100)
    status = models.CharField(
        max_length=10, choices=ReplanStatus.choices, default=ReplanStatus.REQUESTED
    )
    # The failures the planner was shown, taken when it was asked.
    failures = models.JSONField(default=dict, blank=True)
    # The agents it proposed (a plan fragment), as it answered them.
    fragment = models.JSONField(null=True, blank=True)
    agents = models.JSONField(default=list, blank=True)  # the names spawned
    cost = models.DecimalField(max_digits=18, decimal_places=6, default=Decimal(0))
    error = models.JSONField(null=True, blank=True)
    usage = models.JSONField(null=True, blank=True)  # an LLM planner's token usage
    requested_by = models.CharField(max_length=200, blank=True)
    requested_at = models.DateTimeField()
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["run", "number"]
        constraints = [
            models.UniqueConstraint(fields=["run", "number"], name="replan_unique_number"),
        ]

    def __str__(self) -> str:
        return f"re-plan {self.number} of {self.run_id} ({self.status})"
