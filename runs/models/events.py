"""A run's history: the event rows, and the view that reads them with the events kept
on its steps' rows."""

from __future__ import annotations

from django.db import models

from runs.models.hierarchy import Run


class EventKind(models.TextChoices):
    CREATED = "created"
    TRANSITION = "transition"
    RETRY = "retry"
    CHARGE = "charge"
    APPROVAL = "approval"
    ERROR = "error"
    OPERATOR = "operator"
    RUNNER = "runner"  # a runner job created, claimed, reported or stopped
    CHILD = "child"  # a child run started or ended
    WAIT = "wait"  # a callback opened or received, a poll made
    ESCALATION = "escalation"  # escalated, a ticket acknowledged or resolved, on-call told
    REPLAN = "replan"  # a re-plan asked for, proposed, spawned or failed
    QUEUE = "queue"  # a run waits to start (its queued_reason), or was admitted
    REUSE = "reuse"  # a step completed with a reused or cached output; a run forked


class Event(models.Model):
    """What an event of a run shows: the fields of an event row and of a listed event."""

    attempt_number = models.PositiveSmallIntegerField(default=0)
    entity = models.CharField(max_length=10)
    entity_id = models.CharField(max_length=40)
    kind = models.CharField(max_length=12, choices=EventKind.choices)
    from_status = models.CharField(max_length=20, blank=True)
    to_status = models.CharField(max_length=20, blank=True)
    actor = models.CharField(max_length=200, blank=True)
    message = models.TextField(blank=True)
    payload = models.JSONField(default=dict, blank=True)

    class Meta:
        abstract = True

    def __str__(self) -> str:
        return f"{self.entity} {self.entity_id}: {self.kind} {self.from_status}->{self.to_status}"


class RunEvent(Event):
    """Append-only history of a run: the audit trail and the source of its timeline.

    The rows of it that are written as rows: a step's claim and plain completion are kept
    on the step's row instead (``Step.claim_event``). Read a run's history, both, as
    ``HistoryEvent`` (``runs.selectors.run_history``)."""

    id = models.BigAutoField(primary_key=True)
    # No index of its own: event_run_order leads with it, and every step writes events.
    run = models.ForeignKey(
        Run, on_delete=models.CASCADE, related_name="events", db_index=False, db_constraint=False
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["run", "id"]
        indexes = [models.Index(fields=["run", "id"], name="event_run_order")]

    def save(self, *args: object, **kwargs: object) -> None:
        if not self._state.adding:
            raise ValueError("run events are append-only")
        super().save(*args, **kwargs)  # type: ignore[arg-type]

    def delete(self, *args: object, **kwargs: object) -> tuple[int, dict[str, int]]:
        raise ValueError("run events are append-only")


class HistoryManager(models.Manager["HistoryEvent"]):
    """The view's rows that are events: a step's row is in its parts whether or not it
    keeps such an event, without an id where it keeps none (run_history.sql says why)."""

    def get_queryset(self) -> models.QuerySet[HistoryEvent]:
        return super().get_queryset().filter(id__isnull=False)


class HistoryEvent(Event):
    """A run's history as its readers list it (the API's events and their stream, the
    run page, the admin, the checks and tools that read events): the event rows and the
    events kept on its steps' rows, each as its row would be, in id order. The
    database's view runs.run_history (runs/sql/run_history.sql); read-only."""

    id = models.BigIntegerField(primary_key=True)
    run = models.ForeignKey(
        Run,
        on_delete=models.DO_NOTHING,
        related_name="+",
        db_index=False,
        db_constraint=False,
    )
    created_at = models.DateTimeField()

    objects = HistoryManager()

    class Meta:
        managed = False
        db_table = '"runs"."run_history"'
        ordering = ["run", "id"]
