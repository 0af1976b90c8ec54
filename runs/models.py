"""The run hierarchy: Run -> RunAttempt -> Agent -> Task -> Step, and RunEvent.

The links of the rows every run and step writes (a run to its organization; an attempt,
agent, task, step, event and wait to its parents) are foreign keys the database does not
check (``db_constraint=False``): each is written from its parent's row in the same
transaction, and no such parent is ever deleted, so PostgreSQL's check at commit (a query
and a key-share lock on the parent's row per link) guarded nothing.
``manage.py check_invariants`` finds an orphan instead (``runs.orphans``; docs/engine.md,
"Links the database does not check"). Counters carry check constraints so that they
cannot go negative, and statuses are constrained to their tables' states. Rows are never
changed except through ``runs.transitions`` and the services; nothing here has behaviour
beyond small derived properties.
"""

from __future__ import annotations

import uuid
from decimal import Decimal

from django.db import models
from django.db.models import Q
from django.utils import timezone

from billing.models import Organization
from runs.states import NodeStatus, RunStatus, StepStatus


class FailureMode(models.TextChoices):
    FAIL_FAST = "fail-fast"
    CONTINUE = "continue"
    RETRY = "retry"


class Mode(models.TextChoices):
    """How a parent runs its children."""

    SEQUENTIAL = "sequential"
    PARALLEL = "parallel"
    DAG = "dag"


def _non_negative(model: str, *fields: str) -> models.CheckConstraint:
    """One constraint for all of a row's counters: PostgreSQL prepares each CHECK of a
    table again for every statement that writes it (about 7 us each; a step's row is
    written four times), so one condition costs less than one per column."""
    return models.CheckConstraint(
        condition=Q(**{f"{field}__gte": 0 for field in fields}), name=f"{model}_counts_gte_0"
    )


def _status_in(model: str, choices: type[models.TextChoices]) -> models.CheckConstraint:
    return models.CheckConstraint(
        condition=Q(status__in=choices.values), name=f"{model}_status_valid"
    )


class Timestamps(models.Model):
    """When an entity started, finished, and last changed state."""

    created_at = models.DateTimeField(auto_now_add=True)
    status_changed_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    completed_at = models.DateTimeField(null=True, blank=True)
    duration_ms = models.BigIntegerField(null=True, blank=True)

    class Meta:
        abstract = True


class Run(Timestamps):
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    # Found by the indexes that begin with it (run_org_created and the others).
    organization = models.ForeignKey(
        Organization,
        on_delete=models.PROTECT,
        related_name="runs",
        db_index=False,
        db_constraint=False,
    )
    name = models.CharField(max_length=200)
    status = models.CharField(max_length=20, choices=RunStatus.choices, default=RunStatus.CREATED)
    priority = models.PositiveSmallIntegerField(default=5)
    plan = models.JSONField(help_text="The plan exactly as submitted.")
    failure_mode = models.CharField(
        max_length=12, choices=FailureMode.choices, default=FailureMode.FAIL_FAST
    )
    mode = models.CharField(max_length=12, choices=Mode.choices, default=Mode.PARALLEL)
    max_attempts = models.PositiveSmallIntegerField(default=3)
    max_agents = models.PositiveIntegerField(default=10)
    attempt_number = models.PositiveSmallIntegerField(default=0)
    agent_count = models.IntegerField(default=0)
    variables = models.JSONField(default=dict, blank=True)
    # The plan's `timeouts` (milliseconds by key); settings.RUN_TIMEOUT_DEFAULTS fill gaps.
    timeouts = models.JSONField(default=dict, blank=True)

    # Engine bookkeeping of the current attempt's agents (see runs.engine).
    open_children = models.IntegerField(default=0)
    active_children = models.IntegerField(default=0)
    waiting_approvals = models.IntegerField(default=0)
    automatic_retries = models.PositiveSmallIntegerField(default=0)
    last_error = models.JSONField(null=True, blank=True)
    cancel_reason = models.TextField(blank=True)
    created_by = models.CharField(max_length=200, blank=True)
    # The W3C traceparent of the run's trace (common.tracing): the span of the request
    # that created it, written in the transaction that creates it; "" untraced.
    trace_context = models.CharField(max_length=128, blank=True, default="", db_default="")
    updated_at = models.DateTimeField(auto_now=True)
    picked_up_at = models.DateTimeField(null=True, blank=True)
    # When the lost-message sweep last re-sent this run's pick-up or resume message.
    redispatched_at = models.DateTimeField(null=True, blank=True)

    cancelled_at = models.DateTimeField(null=True, blank=True)
    last_heartbeat = models.DateTimeField(null=True, blank=True)
    deleted_at = models.DateTimeField(null=True, blank=True)
    # A child run (the `run` tool; runs.children): the run and the step attempt that
    # started it, how that step waits for it, and how deep it is (the top run is 0).
    parent_run = models.ForeignKey(
        "self",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="children",
        db_index=False,  # run_child: child runs only
    )
    parent_step = models.ForeignKey(
        "Step", null=True, blank=True, on_delete=models.SET_NULL, related_name="+", db_index=False
    )
    parent_step_attempt = models.PositiveIntegerField(null=True, blank=True)
    parent_mode = models.CharField(max_length=16, blank=True)
    depth = models.PositiveSmallIntegerField(default=0)
    # When the parent took note of this child's end (its step completed or failed, or
    # its on_callback handlers released): the notification is acted on once.
    parent_notified_at = models.DateTimeField(null=True, blank=True)
    # The plan's `escalation` and `replan` thresholds as it gave them; settings fill the
    # rest when the engine reads them (runs.engine.policy).
    policy = models.JSONField(default=dict, blank=True, db_default={})
    # Re-plans asked for (capped by `replan.max_replans`); while one is with its planner
    # the run holds one extra open child, so it cannot finish under the planner's feet.
    replan_count = models.PositiveSmallIntegerField(default=0, db_default=0)
    replan_pending_since = models.DateTimeField(null=True, blank=True)
    # Admission (runs.admission; docs/fairness.md): why a PENDING run waits to start
    # (its organization's limit of running runs, its concurrency key's, or earlier runs
    # ahead of it), empty when it does not. A plan's `concurrency` limits the runs with
    # the same evaluated key running at once (``concurrency_max``; 0: no key).
    queued_reason = models.CharField(max_length=300, blank=True, db_default="")
    # When admission let this attempt start: a run admitted and not yet picked up holds
    # its place among the organization's running runs.
    admitted_at = models.DateTimeField(null=True, blank=True)
    concurrency_key = models.CharField(max_length=255, blank=True, db_default="")
    concurrency_max = models.PositiveIntegerField(default=0, db_default=0)
    # A step of its plan spends rate limits: its end gives back what they reserved
    # (runs.step_admission); False spares every other run that work.
    rate_limited = models.BooleanField(default=False, db_default=False)
    # What its next attempt takes as completed without running it (runs.reuse): the
    # steps, by path (`agent.task.step`), each `{"attempt": N, "step": ID}` of the step
    # whose output it reuses. Set by a retry with `reuse` and by a fork; empty otherwise.
    reuse = models.JSONField(default=dict, blank=True, db_default={})
    # A fork (runs.reuse.run_fork): the run it was forked from, and the step from which
    # it runs again; the source lists its forks (``forks``).
    forked_from_run = models.ForeignKey(
        "self",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="forks",
        db_index=False,  # run_fork: forks only
    )
    forked_from_step = models.CharField(max_length=320, blank=True, db_default="")

    class Meta:
        ordering = ["-created_at"]
        indexes = [
            models.Index(
                fields=["organization", "status", "-created_at"], name="run_org_status_created"
            ),
            models.Index(fields=["organization", "-created_at"], name="run_org_created"),
            models.Index(
                fields=["organization", "priority", "created_at"], name="run_org_priority"
            ),
            models.Index(fields=["status", "status_changed_at"], name="run_status_changed"),
            # A run's children and forks; most runs are neither, and take no entry.
            models.Index(
                fields=["parent_run"], name="run_child", condition=Q(parent_run__isnull=False)
            ),
            models.Index(
                fields=["forked_from_run"],
                name="run_fork",
                condition=Q(forked_from_run__isnull=False),
            ),
            # What fair dispatch and admission read: an organization's runs waiting or
            # under way, in the order they are served (priority, then FIFO).
            models.Index(
                fields=["organization", "priority", "created_at"],
                name="run_active_order",
                condition=Q(
                    status__in=[
                        "pending",
                        "running",
                        "waiting_approval",
                        "paused",
                        "resuming",
                        "escalated",
                    ]
                ),
            ),
            models.Index(
                fields=["organization", "concurrency_key", "status"],
                name="run_concurrency_key",
                condition=~Q(concurrency_key=""),
            ),
            # Runs waiting for a place (runs.admission.WAITING): few, looked for on
            # every start.
            models.Index(
                fields=["organization", "priority", "created_at"],
                name="run_waiting",
                condition=Q(
                    status__in=["pending", "retrying"],
                    admitted_at__isnull=True,
                    parent_run__isnull=True,
                ),
            ),
        ]
        constraints = [
            _status_in("run", RunStatus),
            _non_negative(
                "run", "agent_count", "open_children", "active_children", "waiting_approvals"
            ),
            models.CheckConstraint(condition=Q(priority__lte=9), name="run_priority_0_9"),
            models.CheckConstraint(condition=Q(max_attempts__gte=1), name="run_max_attempts_gte_1"),
            models.CheckConstraint(
                condition=Q(attempt_number__lte=models.F("max_attempts")),
                name="run_attempt_number_lte_max",
            ),
            # One child per attempt of a `run` step: a recording delivered twice finds it.
            models.UniqueConstraint(
                fields=["parent_step", "parent_step_attempt"],
                name="run_one_child_per_step_attempt",
                condition=Q(parent_step__isnull=False),
            ),
        ]

    def __str__(self) -> str:
        return f"{self.name} ({self.id})"


class RunAttempt(models.Model):
    """One try of a run. Every earlier attempt keeps its agents, tasks and steps."""

    # No index of its own: attempt_unique_number leads with it.
    run = models.ForeignKey(
        Run, on_delete=models.CASCADE, related_name="attempts", db_index=False, db_constraint=False
    )
    attempt_number = models.PositiveSmallIntegerField()
    created_at = models.DateTimeField(auto_now_add=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    outcome = models.CharField(max_length=20, choices=RunStatus.choices, blank=True)
    # Its credits: billing.Reservation (``attempt.reservation``).

    class Meta:
        ordering = ["run", "attempt_number"]
        constraints = [
            models.UniqueConstraint(fields=["run", "attempt_number"], name="attempt_unique_number"),
            models.CheckConstraint(condition=Q(attempt_number__gte=1), name="attempt_number_gte_1"),
        ]

    def __str__(self) -> str:
        return f"attempt {self.attempt_number} of {self.run_id}"


class Node(Timestamps):
    """What an agent and a task have alike (a node of the run's tree, whose states are
    ``NodeStatus``): its place among its siblings, how it runs its children and meets
    their failure, and the counters the engine keeps of them."""

    # Copied from the attempt so events and filters need no join.
    attempt_number = models.PositiveSmallIntegerField()
    name = models.CharField(max_length=100)
    position = models.PositiveIntegerField()
    status = models.CharField(max_length=20, choices=NodeStatus.choices, default=NodeStatus.PENDING)
    mode = models.CharField(max_length=12, choices=Mode.choices, default=Mode.SEQUENTIAL)
    failure_mode = models.CharField(
        max_length=12, choices=FailureMode.choices, default=FailureMode.FAIL_FAST
    )
    depends_on = models.JSONField(default=list, blank=True)
    pending_dependencies = models.IntegerField(default=0)
    # Names of the siblings that wait for this one (the reverse of depends_on; in a
    # sequential parent, the next sibling). Kept so that finishing a node finds its
    # successors without scanning its siblings.
    dependents = models.JSONField(default=list, blank=True)
    dispatched_at = models.DateTimeField(null=True, blank=True)
    open_children = models.IntegerField(default=0)
    active_children = models.IntegerField(default=0)
    retry_count = models.IntegerField(default=0)
    timeout_ms = models.BigIntegerField(null=True, blank=True)
    last_error = models.JSONField(null=True, blank=True)

    class Meta:
        abstract = True

    def __str__(self) -> str:
        return self.name


class Agent(Node):
    # No single-column indexes on these two: agent_run_status and agent_unique_name lead
    # with them (see Step.task for why a redundant one costs more than its writes).
    run = models.ForeignKey(
        Run, on_delete=models.CASCADE, related_name="agents", db_index=False, db_constraint=False
    )
    attempt = models.ForeignKey(
        RunAttempt,
        on_delete=models.CASCADE,
        related_name="agents",
        db_index=False,
        db_constraint=False,
    )
    max_concurrent_tasks = models.PositiveIntegerField(default=5)
    task_count = models.IntegerField(default=0)

    class Meta:
        ordering = ["attempt", "position"]
        indexes = [models.Index(fields=["run", "status"], name="agent_run_status")]
        constraints = [
            models.UniqueConstraint(fields=["attempt", "name"], name="agent_unique_name"),
            _status_in("agent", NodeStatus),
            _non_negative(
                "agent",
                "pending_dependencies",
                "task_count",
                "retry_count",
                "open_children",
                "active_children",
            ),
        ]


class Task(Node):
    # No single-column indexes: task_run_status and task_unique_name lead with these (see
    # Step.task).
    run = models.ForeignKey(
        Run, on_delete=models.CASCADE, related_name="tasks", db_index=False, db_constraint=False
    )
    agent = models.ForeignKey(
        Agent, on_delete=models.CASCADE, related_name="tasks", db_index=False, db_constraint=False
    )
    # An agent-level retry runs the agent's tasks again as new rows of the next
    # generation, so the failed generation stays as it ended, for audit.
    generation = models.PositiveSmallIntegerField(default=0)
    max_concurrent_steps = models.PositiveIntegerField(default=3)
    step_count = models.IntegerField(default=0)

    class Meta:
        ordering = ["agent", "generation", "position"]
        # An agent's tasks are found through task_unique_name (agent, generation, name),
        # in plan order through task_ready: as a step's (Step.Meta).
        indexes = [
            models.Index(fields=["run", "status"], name="task_run_status"),
            # An agent's tasks ready but not started (held by max_concurrent_tasks): what
            # dispatch looks for after every task, as step_ready for steps.
            models.Index(
                fields=["agent", "generation", "position"],
                name="task_ready",
                condition=Q(status="pending", pending_dependencies=0, dispatched_at__isnull=True),
            ),
        ]
        constraints = [
            models.UniqueConstraint(
                fields=["agent", "generation", "name"], name="task_unique_name"
            ),
            _status_in("task", NodeStatus),
            _non_negative(
                "task",
                "pending_dependencies",
                "step_count",
                "retry_count",
                "open_children",
                "active_children",
            ),
        ]


class Step(Timestamps):
    # No index of its own: step_run_status leads with it.
    run = models.ForeignKey(
        Run, on_delete=models.CASCADE, related_name="steps", db_index=False, db_constraint=False
    )
    # No index of its own: the unique (task, generation, name) index leads with it, and a
    # second one on task alone tempted the planner into walking a wide task's rows (with
    # a generic plan made while the table was small, whatever its size since).
    task = models.ForeignKey(
        Task, on_delete=models.CASCADE, related_name="steps", db_index=False, db_constraint=False
    )
    # Copied from the attempt so events and filters need no join.
    attempt_number = models.PositiveSmallIntegerField()
    # A handler's name is its step's joined to its own ("fetch.on_error.notify"): room
    # for two of a plan's names (at most 100 characters each) and the joint.
    name = models.CharField(max_length=255)
    position = models.PositiveIntegerField()
    generation = models.PositiveSmallIntegerField(default=0)
    tool = models.CharField(max_length=64)
    params = models.JSONField(default=dict, blank=True)
    when = models.TextField(blank=True)
    on_error = models.JSONField(default=list, blank=True)
    # Set on an `on_error` handler step: the step whose failure it handles. Indexed for
    # handlers only (step_handler): every other row would take an entry of NULL.
    handler_for = models.ForeignKey(
        "self",
        null=True,
        blank=True,
        on_delete=models.CASCADE,
        related_name="handlers",
        db_index=False,
        db_constraint=False,
    )
    # A `run` step in async_callback mode keeps its on_callback handlers here until it
    # runs; each handler step created from them points back at it (``callback_for``).
    on_callback = models.JSONField(default=list, blank=True)
    # No index: handlers are found by their task (step_unique_name), and the step table
    # is the hot path's.
    callback_for = models.ForeignKey(
        "self",
        null=True,
        blank=True,
        on_delete=models.CASCADE,
        related_name="callback_handlers",
        db_index=False,
        db_constraint=False,
    )
    retry = models.JSONField(default=dict, blank=True)
    timeout_ms = models.BigIntegerField(null=True, blank=True)
    depends_on = models.JSONField(default=list, blank=True)
    pending_dependencies = models.IntegerField(default=0)
    # Names of the siblings that wait for this one (the reverse of depends_on; in a
    # sequential parent, the next sibling). Kept so that finishing a node finds its
    # successors without scanning its siblings.
    dependents = models.JSONField(default=list, blank=True)
    dispatched_at = models.DateTimeField(null=True, blank=True)
    status = models.CharField(max_length=20, choices=StepStatus.choices, default=StepStatus.PENDING)
    attempts = models.IntegerField(default=0)
    failures = models.IntegerField(default=0)
    reclaims = models.IntegerField(default=0)
    next_run_at = models.DateTimeField(null=True, blank=True)
    # The rate limits it spends (the plan's, templates unrendered: runs.step_admission) and,
    # while it is parked, why: "rate_limited:<name>" (their units), "timer" (a wait step
    # until next_run_at); "" otherwise.
    rate_limits = models.JSONField(default=list, blank=True, db_default=[])
    waiting_reason = models.CharField(max_length=120, blank=True, default="", db_default="")
    # Milliseconds it spent parked (in a rate limit's line, on a timer) before the attempt
    # that ran its tool: started_at and duration_ms are that attempt's alone. Added up by
    # each claim that ends a wait (engine.step_claim), and by a pause.
    waited_ms = models.BigIntegerField(default=0, db_default=0)
    # Parked beyond the step-message horizon (RATE_LIMIT_MAX_COUNTDOWN_S): no message
    # carries it; the wake sweep sends its message once next_run_at comes within the
    # horizon (runs.engine.dispatch.wake_asleep). Set with next_run_at by whoever parks it.
    asleep = models.BooleanField(default=False, db_default=False)
    # While its attempt waits outside the worker (runs.engine.waiting.park): the attempt's
    # span, the parent of the wait's span and of a runner's job.
    trace_context = models.CharField(max_length=128, blank=True, default="", db_default="")
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    # What a fleet tool last said of its progress (``Context.heartbeat``), written with
    # its lease's renewal (orchestrator.heartbeat), as ``{"attempt": N, "value": ...}``:
    # shown with the step while N is its latest attempt. A worker tool's is its job's
    # (RunnerJob.progress), read from there (runs/queries/steps_page.sql).
    progress = models.JSONField(null=True, blank=True)
    worker = models.CharField(max_length=200, blank=True)
    # Celery task id of the attempt in flight, for revoke(terminate=True) on cancel.
    celery_task_id = models.CharField(max_length=100, blank=True)
    output = models.JSONField(null=True, blank=True)
    error = models.JSONField(null=True, blank=True)
    cost = models.DecimalField(max_digits=18, decimal_places=6, default=Decimal("0"))
    # A failed step whose on_error handlers all succeeded: it counts as done.
    handled = models.BooleanField(default=False)
    # Its retry budgets count from here: an escalation resumed gives a failed step its
    # retries again (attempts and failures themselves are never reset: a charge is keyed
    # by the attempt's number).
    retry_base_attempts = models.IntegerField(default=0, db_default=0)
    retry_base_failures = models.IntegerField(default=0, db_default=0)
    # Completed without running (runs.reuse): with the output of an earlier attempt's
    # step (`{"attempt": N, "step": ID}`, known when the attempt is materialised), or of
    # a cache entry (`{"run": ID, "step": ID}`, found when it is claimed); null otherwise.
    reused_from = models.JSONField(null=True, blank=True)
    cached_from = models.JSONField(null=True, blank=True)
    # The plan's `cache` (`{"key": template, "ttl_ms": N}`), or null.
    cache = models.JSONField(null=True, blank=True)
    # Its attempt's claim (pending -> running) and plain completion (running -> completed)
    # are events of the run's history kept on this row, not rows of runs_runevent: each
    # its id, drawn from the events' sequence by the statement that claims or completes,
    # and what it shows that the row does not keep otherwise (the claim's time, the cost
    # the completion shows). engine.run_history lists them among the event rows; a change
    # of the row that would alter one writes it as a row first, with its id
    # (runs/engine/sql/run_history.sql; docs/engine.md, "A step's history"). Written by
    # the database's code alone.
    claim_event = models.BigIntegerField(null=True, blank=True, editable=False)
    claimed_at = models.DateTimeField(null=True, blank=True, editable=False)
    completion_event = models.BigIntegerField(null=True, blank=True, editable=False)
    completion_cost = models.TextField(blank=True, default="", db_default="", editable=False)

    class Meta:
        ordering = ["task", "generation", "position"]
        # Each index takes an entry for every new version of a row it covers, and a step's
        # row has four (written, dispatched, claimed, recorded): the partial ones cover
        # only the rows their readers look for. A task's steps are found through
        # step_unique_name (task, generation, name), in plan order through step_ready.
        indexes = [
            models.Index(fields=["run", "status"], name="step_run_status"),
            models.Index(
                fields=["next_run_at"],
                name="step_pending_due",
                condition=Q(status="pending", next_run_at__isnull=False),
            ),
            models.Index(
                fields=["handler_for"], name="step_handler", condition=Q(handler_for__isnull=False)
            ),
            models.Index(
                fields=["lease_expires_at"],
                name="step_running_lease",
                condition=Q(status="running"),
            ),
            # The steps of a task that are ready but not yet dispatched (held by its
            # concurrency limit): what dispatch looks for after every step, found
            # without walking a wide task's other rows.
            models.Index(
                fields=["task", "generation", "position"],
                name="step_ready",
                condition=Q(status="pending", pending_dependencies=0, dispatched_at__isnull=True),
            ),
            # A run's steps dispatched and not yet claimed: what a doorbell claims next
            # (runs.transitions.claim_next_step), in plan order.
            models.Index(
                fields=["run", "id"],
                name="step_claimable",
                condition=Q(status="pending", dispatched_at__isnull=False),
            ),
            models.Index(
                fields=["waiting_reason"],
                name="step_rate_waiting",
                condition=~Q(waiting_reason=""),
            ),
            # What the wake sweep sends next, in wake order.
            models.Index(
                fields=["next_run_at"],
                name="step_asleep",
                condition=Q(asleep=True, status="pending"),
            ),
            # An organization's parked waits (its quota), counted through its runs.
            models.Index(fields=["run"], name="step_timer", condition=Q(waiting_reason="timer")),
            # A run's events kept on its steps' rows, in id order (engine.run_history): a
            # page of its history is cut on these as on event_run_order. Only the
            # versions that hold such an event take an entry.
            models.Index(
                fields=["run", "claim_event"],
                name="step_claim_event",
                condition=Q(claim_event__isnull=False),
            ),
            models.Index(
                fields=["run", "completion_event"],
                name="step_completion_event",
                condition=Q(completion_event__isnull=False),
            ),
        ]
        constraints = [
            models.UniqueConstraint(fields=["task", "generation", "name"], name="step_unique_name"),
            _status_in("step", StepStatus),
            _non_negative(
                "step", "pending_dependencies", "attempts", "failures", "reclaims", "cost"
            ),
        ]

    def __str__(self) -> str:
        return self.name


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


class StepCacheEntry(models.Model):
    """A completed step whose plan declared `cache`: its output answers the same
    organization's steps of the same tool, rendered key and inputs within their `ttl`
    (runs.reuse). Written when the step completes by running its tool, never for a
    reused or cached one; one entry per organization, tool, key and inputs, the newest
    write replacing the older. `POST /cache/invalidate` deletes entries by key."""

    id = models.BigAutoField(primary_key=True)
    organization = models.ForeignKey(Organization, on_delete=models.CASCADE, db_index=False)
    tool = models.CharField(max_length=64)
    key = models.CharField(max_length=1000)
    # The keyed digest of the step's rendered params (runs.reuse.cache_inputs); empty
    # for a cache declared with `inputs: false`, and for entries written before inputs
    # were kept (which therefore answer only such caches).
    inputs = models.CharField(max_length=64, blank=True, default="", db_default="")
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="+", db_index=False)
    step = models.ForeignKey("Step", on_delete=models.CASCADE, related_name="+")
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        verbose_name_plural = "step cache entries"
        constraints = [
            # The lookup's index too, and invalidation's (by organization and key).
            models.UniqueConstraint(
                fields=["organization", "key", "tool", "inputs"], name="stepcache_unique"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.tool} {self.key}"


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
    database's view engine.run_history (runs/engine/sql/run_history.sql); read-only."""

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
        db_table = '"engine"."run_history"'
        ordering = ["run", "id"]


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
            _status_in("runnerjob", RunnerJobStatus),
        ]

    def __str__(self) -> str:
        return f"job {self.id} ({self.status})"


# --------------------------------------------------------------------------- published tools
# Tools written with the client's ``@tool`` (docs/tools.md): each version a package of the
# fleet or an organization's ``orch worker`` published, with the JSON Schema a plan's
# steps are checked against at submission (``runs.catalogue``).


class ToolPlacement(models.TextChoices):
    FLEET = "fleet"  # installed on the Celery workers: every organization's
    WORKER = "worker"  # offered by an organization's own workers (runners)


class PublishedTool(models.Model):
    """One version of a published tool. A version's schema never changes once published
    (``digest``): a change is a new version, and the newest first published is the
    current one, that plans are checked against and jobs are made for."""

    # None: the fleet's, every organization's.
    organization = models.ForeignKey(
        Organization,
        null=True,
        blank=True,
        on_delete=models.CASCADE,
        related_name="published_tools",
    )
    name = models.CharField(max_length=64)
    version = models.CharField(max_length=40)
    placement = models.CharField(max_length=10, choices=ToolPlacement.choices)
    description = models.TextField(blank=True)
    params_schema = models.JSONField(default=dict)
    output_schema = models.JSONField(default=dict)
    # The cost rule as the tool declares it: {"credits": "0.02"}, {"computed": true}, {}.
    cost = models.JSONField(default=dict, blank=True)
    digest = models.CharField(max_length=64)
    published_at = models.DateTimeField()
    last_published_at = models.DateTimeField()
    # The fleet workers that published it at their start: {hostname: when}.
    published_by = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["name", "-published_at"]
        constraints = [
            models.UniqueConstraint(
                fields=["organization", "name", "version"],
                name="publishedtool_one_per_version",
                nulls_distinct=False,
            ),
            models.CheckConstraint(
                condition=Q(placement__in=ToolPlacement.values),
                name="publishedtool_placement_valid",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.name} {self.version} ({self.placement})"


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
            _status_in("stepwait", StepWaitStatus),
        ]

    def __str__(self) -> str:
        return f"{self.kind} wait {self.id} ({self.status})"


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
            _status_in("escalation", EscalationStatus),
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


# --------------------------------------------------------------------------- fairness
# Fair sharing of the workers between organizations (runs.fairness; docs/fairness.md).


class FairTurn(models.Model):
    """When fair dispatch last gave an organization a worker: organizations as loaded
    as each other are served in turn, the longest waiting first."""

    organization = models.OneToOneField(
        Organization, on_delete=models.CASCADE, primary_key=True, related_name="+"
    )
    served_at = models.DateTimeField()

    def __str__(self) -> str:
        return f"{self.organization_id} served at {self.served_at}"


class StepSlot(models.Model):
    """One of an organization's ``max_running_steps`` slots: a worker holds one while it
    executes that organization's steps, so that no more than that many execute at once.
    A holder that died lets its slot go when ``expires_at`` passes."""

    id = models.BigAutoField(primary_key=True)
    organization = models.ForeignKey(
        Organization, on_delete=models.CASCADE, related_name="+", db_index=False
    )
    slot = models.PositiveIntegerField()
    holder = models.CharField(max_length=200, blank=True)
    expires_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["organization", "slot"], name="stepslot_unique"),
        ]

    def __str__(self) -> str:
        return f"slot {self.slot} of {self.organization_id} ({self.holder or 'free'})"
