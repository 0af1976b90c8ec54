"""The API's answers as typed dictionaries: what the JSON holds, field by field.

They describe; nothing is converted. Ids of runs, ledger entries, artifacts and runner jobs
are UUID strings; ids of agents, tasks, steps and events are integers; credits are decimal
strings (never floats: ``Decimal(run["credits"]["held"])``); dates are ISO 8601 strings.
The shapes follow the OpenAPI schema served at ``/api/schema/`` (docs/api.md).
"""

from __future__ import annotations

from typing import Any, Generic, Literal, NotRequired, TypedDict, TypeVar

RunStatus = Literal[
    "created",
    "pending",
    "running",
    "waiting_approval",
    "paused",
    "resuming",
    "retrying",
    "escalated",
    "completed",
    "failed",
    "cancelled",
]
TERMINAL_STATUSES: frozenset[str] = frozenset({"completed", "failed", "cancelled"})
STEP_TERMINAL_STATUSES: frozenset[str] = frozenset({"completed", "failed", "skipped", "cancelled"})
# What a status poll leaves out of a run (``Client.get_run(exclude=...)``): the parts that
# grow with the run, so that the poll of a 20,000-step run stays a few KB.
STATUS_ONLY: tuple[str, ...] = ("outputs", "plan")

Item = TypeVar("Item")


class Page(TypedDict, Generic[Item]):
    """One page of a list. ``count`` is absent from cursor pages (a run's events)."""

    count: NotRequired[int]
    next: str | None
    previous: str | None
    results: list[Item]


class Credits(TypedDict):
    reserved: str
    charged: str
    refunded: str
    held: str


class ErrorInfo(TypedDict):
    code: str
    message: str


class Run(TypedDict):
    """A run as lists show it."""

    id: str
    name: str
    status: RunStatus
    priority: int
    failure_mode: str
    mode: str
    attempt_number: int
    max_attempts: int
    last_error: ErrorInfo | None
    cancel_reason: str
    created_by: str
    created_at: str
    updated_at: str
    started_at: str | None
    picked_up_at: str | None
    completed_at: str | None
    cancelled_at: str | None
    deleted_at: str | None
    last_heartbeat: str | None
    duration_ms: int | None
    credits: Credits
    parent_run: str | None
    parent_step: int | None
    depth: int
    replan_count: int
    queued_reason: str
    concurrency_key: str


class Counts(TypedDict):
    agents: dict[str, int]
    tasks: dict[str, int]
    steps: dict[str, int]


class Progress(TypedDict):
    steps_total: int
    steps_finished: int
    percent: float


class ChildRun(TypedDict):
    id: str
    status: RunStatus
    mode: str
    step: int | None
    created_at: str


class RunDetail(Run):
    """One run: its plan and the current attempt's counts, progress and outputs (``plan``
    and ``outputs`` with ``outputs_truncated`` are absent when the read excluded them)."""

    plan: NotRequired[dict[str, Any]]
    variables: dict[str, Any]
    counts: Counts
    progress: Progress
    children: list[ChildRun]
    forked_from: dict[str, Any] | None  # a fork: {"run", "step"}
    forks: list[str]  # the runs forked from this one
    outputs: NotRequired[dict[str, Any]]
    outputs_truncated: NotRequired[bool]


class ForkPreview(TypedDict):
    """A fork's dry run: the steps it would reuse and run, and what it would reserve."""

    reuse: list[str]
    run: list[str]
    reservation: str


class Decision(TypedDict):
    """The answer to approve and reject: the run after it, and the steps decided."""

    run: RunDetail
    steps: list[int]


class Agent(TypedDict):
    id: int
    name: str
    attempt_number: int
    position: int
    status: str
    mode: str
    failure_mode: str
    depends_on: list[str]
    task_count: int
    retry_count: int
    last_error: dict[str, Any] | None
    created_at: str
    started_at: str | None
    completed_at: str | None
    duration_ms: int | None


class Task(TypedDict):
    id: int
    agent_id: int
    agent_name: str
    name: str
    attempt_number: int
    generation: int
    position: int
    status: str
    mode: str
    failure_mode: str
    depends_on: list[str]
    step_count: int
    retry_count: int
    last_error: dict[str, Any] | None
    created_at: str
    started_at: str | None
    completed_at: str | None
    duration_ms: int | None


class Step(TypedDict):
    id: int
    task_id: int
    task_name: str
    agent_name: str
    name: str
    attempt_number: int
    generation: int
    position: int
    tool: str
    params: Any
    when: str
    depends_on: list[str]
    handler_for: int | None
    status: str
    attempts: int
    failures: int
    reclaims: int
    next_run_at: str | None
    # "rate_limited:<name>" while it waits for a rate limit's units, "timer" while a wait
    # step waits for its time (next_run_at)
    waiting_reason: str
    rate_limits: list[dict[str, Any]]
    output: Any
    error: dict[str, Any] | None
    handled: bool
    cost: str
    reused_from: dict[str, Any] | None  # completed with an earlier attempt's output
    cached_from: dict[str, Any] | None  # completed from the step cache
    created_at: str
    started_at: str | None
    completed_at: str | None
    duration_ms: int | None
    waited_ms: int  # time parked (rate limits, timers) before the attempt that ran the tool
    job: str | None  # a `runner` step's or a worker tool's: its current attempt's runner job
    child_run: str | None  # a `run` step: the child run its current attempt started
    progress: Any  # what a published tool last said of how far it got (docs/tools.md)


class Event(TypedDict):
    """One entry of a run's history. ``path`` names the entity in the plan
    (``agent.task.step``, ``agent.task``, ``agent``; empty for the run); a step's
    transitions carry the step's attempt in ``payload["attempt"]``."""

    id: int
    attempt_number: int
    entity: str
    entity_id: str
    path: str
    kind: str
    from_status: str
    to_status: str
    actor: str
    message: str
    payload: Any
    created_at: str


class Balance(TypedDict):
    available: str
    reserved: str
    spent: str
    total: str


class LedgerEntry(TypedDict):
    id: str
    type: Literal["grant", "reserve", "charge", "refund"]
    amount: str
    run: str | None
    step: int | None
    reason: str
    actor: str
    created_at: str


class Limits(TypedDict):
    max_running_runs: int
    max_running_steps: int
    max_pending_runs: int
    share: int


class Usage(TypedDict):
    runs_running: int
    runs_queued: int
    runs_pending: int
    steps_executing: int


class Quota(TypedDict):
    limit: int
    used: int


class Quotas(TypedDict):
    """How many of each the organization may hold, and holds (docs/tenants.md)."""

    webhook_endpoints: Quota
    schedules: Quota
    rate_limits: Quota
    event_streams: Quota
    runner_polls: Quota
    webhooks_in_flight: Quota
    artifacts: Quota
    artifact_bytes: Quota
    parked_waits: Quota


class Organization(TypedDict):
    id: str
    name: str
    limits: Limits
    usage: Usage
    quotas: Quotas


class Secret(TypedDict):
    """A secret as the API shows it: never its value."""

    name: str
    created_at: str
    updated_at: str


class RateLimit(TypedDict):
    """A rate limit shared by the organization's steps (docs/rate-limits.md)."""

    name: str
    limit: int
    period: str
    period_ms: int
    created_at: str
    updated_at: str


class Runner(TypedDict):
    runner_id: str
    status: str
    hostname: str
    project_dir: str
    executor_type: str
    tags: list[str]
    # The published tools an `orch worker` offers: their versions by name.
    tools: dict[str, str]
    registered_at: str
    last_heartbeat: str


class RunnerJob(TypedDict):
    id: str
    status: str
    type: str
    prompt: str
    session_id: str
    agent_name: str
    project_dir: str
    demands: dict[str, Any]
    run: str
    step: int
    attempt: int
    runner_id: str | None
    result: Any
    error: str
    signal: str
    created_at: str
    claimed_at: str | None
    started_at: str | None
    stop_requested_at: str | None
    completed_at: str | None
    timeout_at: str
    # The W3C traceparent of the step attempt that asked for the job, when the run is
    # traced (docs/observability.md): a runner continues the trace from it.
    traceparent: NotRequired[str]
    # A worker tool's job (docs/tools.md): its tool and version, the step's rendered
    # params, the tool's last progress and, failed, its error code; "" / None otherwise.
    tool: str
    tool_version: str
    params: Any
    progress: Any
    error_code: str
    step_path: str  # the step's `agent.task.step`


class ToolVersion(TypedDict):
    version: str
    published_at: str
    last_published_at: str


class ToolOffer(TypedDict):
    """Who offers a published tool now: a fleet worker, or an `orch worker` (a runner)."""

    placement: Literal["fleet", "worker"]
    version: str
    worker: str
    hostname: str
    tags: list[str]
    since: str


class PublishedTool(TypedDict):
    """A tool written with ``@tool`` that plans may name (docs/tools.md)."""

    name: str
    version: str
    placement: Literal["fleet", "worker"]
    description: str
    params_schema: dict[str, Any]
    output_schema: dict[str, Any]
    cost: dict[str, Any]
    versions: list[ToolVersion]
    offered_by: list[ToolOffer]


class Artifact(TypedDict):
    id: str
    name: str
    size: int
    sha256: str
    content_type: str
    status: Literal["uploading", "available"]
    run: str
    step: int | None
    created_at: str
    completed_at: str | None
    expires_at: str | None
    download_url: str


class UploadTarget(TypedDict):
    method: str
    url: str
    headers: dict[str, str]
    api_key: bool
    parts: list[dict[str, Any]]
    part_size: int


class UploadStarted(TypedDict):
    artifact: Artifact
    upload: UploadTarget


class EscalationError(TypedDict):
    step: int
    path: str
    attempt: int
    code: str
    message: str
    at: str


class Escalation(TypedDict):
    id: str
    run: str
    attempt_number: int
    status: Literal["open", "acknowledged", "resolved"]
    reason: str
    severity: str
    errors: list[EscalationError]
    opened_at: str
    acknowledged_at: str | None
    acknowledged_by: str
    resolved_at: str | None
    resolved_by: str
    resolution: str
    note: str
    notified_at: str | None


ScheduleStatus = Literal["active", "paused", "ended"]


class RunRef(TypedDict):
    """A run named by a schedule or one of its fires, with its status now."""

    id: str
    status: RunStatus


class Schedule(TypedDict):
    """A schedule as lists show it (docs/schedules.md): ``cron`` or ``interval`` (the
    other null), its next and last due time and its last run."""

    id: str
    name: str
    status: ScheduleStatus
    cron: str | None
    interval: str | None
    timezone: str
    start_at: str | None
    end_at: str | None
    overlap: Literal["skip", "allow", "cancel_previous"]
    catchup: Literal["none", "latest", "all"]
    variables: dict[str, Any]
    next_due_at: str | None
    last_due_at: str | None
    last_run: RunRef | None
    paused_at: str | None
    # Why it is paused (itself: its runs refused for credits again and again); None
    # while not paused.
    paused_reason: Literal["manual", "insufficient_credits"] | None
    created_by: str
    created_at: str
    updated_at: str


class ScheduleDetail(Schedule):
    plan: dict[str, Any]


class ScheduleFire(TypedDict):
    """A due time handled, or a trigger: fired with its run, or skipped with ``reason``
    (``overlap``, ``missed``, ``insufficient_credits``, ``too_many_pending_runs``,
    ``invalid_plan``, ``suspended``)."""

    id: int
    schedule: str
    kind: Literal["scheduled", "manual"]
    due_at: str
    status: Literal["fired", "skipped"]
    reason: str
    message: str
    run: RunRef | None
    created_at: str


class Webhook(TypedDict):
    """An endpoint the organization's run events are POSTed to (docs/webhooks.md); its
    secret is never shown again after the create."""

    id: str
    url: str
    events: list[str]
    description: str
    enabled: bool
    disabled_at: str | None
    disabled_reason: str
    consecutive_failures: int
    failing_since: str | None
    last_delivered_at: str | None
    created_by: str
    created_at: str
    updated_at: str


class WebhookCreated(Webhook):
    """The create's answer: the endpoint with its signing secret, shown this once."""

    secret: str


class WebhookAttempt(TypedDict):
    number: int
    status_code: int | None
    ok: bool
    error: str
    duration_ms: int
    created_at: str


class WebhookDelivery(TypedDict):
    """One event for one endpoint, with every attempt; ``id`` is the body's and the
    X-Orchestrator-Delivery header's, the same on every attempt."""

    id: str
    type: str
    status: Literal["pending", "delivered", "failed"]
    run: str | None
    next_attempt_at: str
    last_status_code: int | None
    last_error: str
    delivered_at: str | None
    created_at: str
    attempts: list[WebhookAttempt]
