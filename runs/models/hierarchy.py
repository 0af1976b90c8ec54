"""The run hierarchy: Run -> RunAttempt -> Agent -> Task -> Step, and the step cache.

The links of the rows every run and step writes (a run to its organization; an attempt,
agent, task, step, event and wait to its parents) are foreign keys the database does not
check (``db_constraint=False``): each is written from its parent's row in the same
transaction, and no such parent is ever deleted, so PostgreSQL's check at commit (a query
and a key-share lock on the parent's row per link) guarded nothing.
``manage.py check_invariants`` finds an orphan instead (``runs.orphans``; docs/engine.md,
"Links the database does not check"). Counters carry check constraints so that they
cannot go negative, and statuses are constrained to their tables' states. Rows are never
changed except through ``runs.transitions`` and the services; nothing here has behaviour
"""

from __future__ import annotations

import uuid
from decimal import Decimal

from django.conf import settings
from django.db import models
from django.db.models import Q
from django.utils import timezone

from billing.models import Organization
from runs.models.base import Timestamps, non_negative, status_in
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
            status_in("run", RunStatus),
            non_negative(
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
            status_in("agent", NodeStatus),
            non_negative(
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
            status_in("task", NodeStatus),
            non_negative(
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
    # each claim that ends a wait (runs.step_claim), and by a pause.
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
    # its lease's renewal (orchestrator.lease_keeper), as ``{"attempt": N, "value": ...}``:
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
    # the completion shows). runs.run_history lists them among the event rows; a change
    # of the row that would alter one writes it as a row first, with its id
    # (runs/sql/run_history.sql; docs/engine.md, "A step's history"). Written by
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
            # A run's events kept on its steps' rows, in id order (runs.run_history): a
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
            status_in("step", StepStatus),
            non_negative(
                "step", "pending_dependencies", "attempts", "failures", "reclaims", "cost"
            ),
        ]

    def __str__(self) -> str:
        return self.name

    @property
    def timeout_s(self) -> float:
        """How long an attempt may run: its own timeout, else ENGINE_DEFAULT_STEP_TIMEOUT."""
        if self.timeout_ms:
            return self.timeout_ms / 1000
        return float(settings.ENGINE_DEFAULT_STEP_TIMEOUT)


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
