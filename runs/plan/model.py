"""The run plan, declared once.

These pydantic models are three things at once:

- the structural validation of a submitted plan (``read_plan``): strict types, unknown
  fields refused, each field's constraint as its type declares it (``runs.plan.fields``),
  every problem reported with its path in the plan's own words;
- the typed plan the engine, ``materialize`` and the reservation read, with every default
  filled in: field names are the typed plan's (``timeout_ms``), aliases the submitted
  JSON's keys (``timeout``);
- the OpenAPI ``Plan`` schema, generated from them (``api.schema``).

What the whole plan must satisfy beyond each field (known tools, unique names,
dependencies, templates, ...) is checked by ``runs.plan.checks``; ``runs.plan.parse_plan``
runs both.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from decimal import Decimal
from functools import cache
from typing import Annotated, Any, Literal, get_args

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic.fields import FieldInfo

from runs.plan.errors import PlanError, a, join, path_of, suggest
from runs.plan.fields import (
    REFUSED,
    UNKNOWN_FIELD,
    CacheKey,
    Children,
    ConcurrencyKey,
    Condition,
    Credits,
    Duration,
    ErrorCode,
    ErrorCodes,
    Handlers,
    JsonObject,
    NodeName,
    NotForHandlers,
    Number,
    OneOf,
    PlannerName,
    RateKey,
    RateLimitName,
    RateLimitUses,
    RateUnits,
    RunName,
    SiblingNames,
    ToolName,
    Whole,
    limits_of,
    refused,
)
from runs.plan.guard import Limits

# The same choices as runs.models.Mode and FailureMode (the rows' columns); a test holds
# them equal.
ModeName = Literal["sequential", "parallel", "dag"]
FailureModeName = Literal["fail-fast", "continue", "retry"]
BackoffName = Literal["fixed", "linear", "exponential"]
ExhaustedName = Literal["fail", "escalate"]
MODES: tuple[str, ...] = get_args(ModeName)
FAILURE_MODES: tuple[str, ...] = get_args(FailureModeName)


class PlanModel(BaseModel):
    """What every part of a plan shares: strict types (no ``"5"`` for 5), no unknown
    fields, immutable."""

    model_config = ConfigDict(
        strict=True,
        extra="forbid",
        frozen=True,
        # A plan arrives by its JSON keys (``parse_plan`` validates by alias only); code
        # builds one by field name.
        validate_by_alias=True,
        validate_by_name=True,
        # A field's docstring is its description in the OpenAPI schema.
        use_attribute_docstrings=True,
        allow_inf_nan=False,
    )


class RetryPolicy(PlanModel):
    """A step's retry policy. Only retryable error codes are retried; `retry_on` narrows
    them."""

    max_attempts: Annotated[int, Whole(1, "max_retry_attempts")] = 3
    """How many times the step may be claimed."""
    max_failures: Annotated[int, Whole(1, "max_retry_attempts")] = Field(
        default_factory=lambda fields: fields["max_attempts"]
    )
    """How many attempts may fail; `max_attempts` when omitted."""
    backoff: Annotated[BackoffName, OneOf()] = "exponential"
    base_delay_ms: Annotated[int, Whole(0, 3_600_000)] = 100
    max_delay_ms: Annotated[int, Whole(0, 3_600_000)] = Field(
        default_factory=lambda fields: max(30_000, fields["base_delay_ms"])
    )
    """The longest delay, at least `base_delay_ms`; 30000 or `base_delay_ms` when omitted."""
    multiplier: Annotated[float, Number(1.0, 10.0)] = 2.0
    jitter: Annotated[float, Number(0.0, 1.0)] = 0.1
    """Each delay is spread by up to this fraction of itself, either way."""
    retry_on: Annotated[tuple[Annotated[str, ErrorCode()], ...], ErrorCodes()] = ()
    """Retry only these codes; every retryable code when empty."""
    on_exhausted: Annotated[ExhaustedName, OneOf()] = "fail"
    """When the budgets are spent: `fail` the step, or `escalate` the run to people."""

    @field_validator("max_delay_ms")
    @classmethod
    def _not_below_the_base(cls, cap: int, info: ValidationInfo) -> int:
        base = info.data.get("base_delay_ms", cls.model_fields["base_delay_ms"].default)
        if cap < base:
            raise refused(f"must be at least base_delay_ms ({base}), got {cap}")
        return cap

    @property
    def caps_escalate(self) -> bool:
        """A plan that wrote `max_delay_ms` escalates a retry whose backoff would exceed
        it; one that did not is capped by the default, never escalated."""
        return "max_delay_ms" in self.model_fields_set

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RetryPolicy:
        """The policy a step row stores (``as_dict``); a key it lacks takes the plan's
        default, so there is one set of defaults (these fields)."""
        known = {name: data[name] for name in cls.model_fields if name in data}
        known["retry_on"] = tuple(known.get("retry_on", ()))
        # Stored by the engine from a plan already checked: taken as it is. Whether the
        # plan wrote max_delay_ms travels as its own key (rows stored before it: no).
        written = set(known) if data.get("max_delay_set") else set(known) - {"max_delay_ms"}
        return cls.model_construct(_fields_set=written, **known)

    def as_dict(self) -> dict[str, Any]:
        return {**self.model_dump(mode="json"), "max_delay_set": self.caps_escalate}


class RateLimitUse(PlanModel):
    """Units of one of the organization's rate limits that the step spends each time it
    runs; it waits, without holding a worker, until they are available."""

    name: Annotated[str, RateLimitName()]
    units: Annotated[int | str, RateUnits()] = 1
    key: Annotated[str, RateKey()] = ""
    """Each rendered key has a window of its own (`${variables.customer}`)."""


class StepCache(PlanModel):
    """A step's cache: a completed step of the same organization, tool, rendered key and
    (unless `inputs` is false) rendered params, younger than `ttl`, answers it at once,
    charged nothing (`cached_from`)."""

    key: Annotated[str, CacheKey()]
    """Text with `${...}` templates, rendered when the step runs (`${params.url}` is not
    available: write the values the key depends on)."""
    ttl_ms: Annotated[int, Duration()] = Field(validation_alias="ttl")
    """How old an entry may be: `30s`, `5m`, `1.5h`, `7d`... at most a year."""
    inputs: bool = True
    """Whether an entry answers only a step whose rendered params are the same as its
    own (default), or any step of the key whatever its params (false: the key alone
    says what the output depends on)."""

    def stored(self) -> dict[str, Any]:
        return {"key": self.key, "ttl_ms": self.ttl_ms, "inputs": self.inputs}


class StepPlan(PlanModel):
    """One tool invocation."""

    name: Annotated[str, NodeName()]
    tool: Annotated[str, ToolName()]
    params: Annotated[dict[str, Any], JsonObject()] = Field(default_factory=dict)
    """The tool's parameters; strings may hold `${...}` templates. Those that are
    durations (`timeout` of `http`, `llm`, `callback` and `poll`, `interval` of `poll`,
    `match_timeout` of `runner`) take the forms of `timeout`: `250ms`, `30s`, `5m`,
    `1.5h`, `7d`, or seconds."""
    when: Annotated[str, Condition()] = ""
    """A condition; the step is skipped when it is false."""
    retry: RetryPolicy = RetryPolicy()
    timeout_ms: Annotated[int | None, Duration("max_step_timeout_ms")] = Field(
        None, validation_alias="timeout"
    )
    depends_on: Annotated[tuple[str, ...], SiblingNames("step")] = ()
    """Steps of the same task this one waits for (the task's mode must be `dag`)."""
    on_error: Annotated[tuple[HandlerPlan, ...], Handlers()] = ()
    """Steps run in order once this one has failed for good."""
    on_callback: Annotated[tuple[HandlerPlan, ...], Handlers()] = ()
    """For a `run` step in `async_callback` mode: steps run in order once its child run
    has ended, reading `${callback.child_run}`, `${callback.status}`,
    `${callback.outputs}` and `${callback.error}`."""
    rate_limits: Annotated[tuple[RateLimitUse, ...], RateLimitUses()] = ()
    """Rate limits the step spends units of (docs/rate-limits.md)."""
    cache: StepCache | None = None
    """Answer the step from an earlier completed step of the organization (docs/engine.md,
    "Steps completed without running")."""

    def rate_limits_stored(self) -> list[dict[str, Any]]:
        """What the step row keeps of its rate limits (the templates, unrendered)."""
        return [use.model_dump() for use in self.rate_limits]


class HandlerPlan(StepPlan):
    """A step run when its step has failed for good: no dependencies, no handlers of its
    own."""

    depends_on: Annotated[tuple[str, ...], NotForHandlers()] = ()
    on_error: Annotated[tuple[HandlerPlan, ...], NotForHandlers()] = ()
    on_callback: Annotated[tuple[HandlerPlan, ...], NotForHandlers()] = ()
    cache: Annotated[StepCache | None, NotForHandlers()] = None

    def stored(self) -> dict[str, Any]:
        """What a step row keeps of its handler until the step fails (``from_stored``
        reads it back): the one description of a handler between the two."""
        return {
            "name": self.name,
            "tool": self.tool,
            "params": self.params,
            "when": self.when,
            "retry": self.retry.as_dict(),
            "timeout_ms": self.timeout_ms,
            "rate_limits": self.rate_limits_stored(),
        }

    @classmethod
    def from_stored(cls, data: Mapping[str, Any], *, name: str) -> HandlerPlan:
        """The handler ``stored()`` kept, called ``name`` now (its step's name joined to
        its own, which may be longer than a plan may write): built from a plan already
        checked, so taken as it is, not validated again."""
        return cls.model_construct(
            name=name,
            tool=data["tool"],
            params=data.get("params", {}),
            when=data.get("when", ""),
            retry=RetryPolicy.from_dict(data.get("retry", {})),
            timeout_ms=data.get("timeout_ms"),
            rate_limits=tuple(
                RateLimitUse.model_construct(**use) for use in data.get("rate_limits", ())
            ),
        )


StepPlan.model_rebuild()


class TaskPlan(PlanModel):
    """A task: its steps run sequentially, in parallel or as a dag."""

    name: Annotated[str, NodeName()]
    mode: Annotated[ModeName, OneOf()] = "sequential"
    failure_mode: Annotated[FailureModeName, OneOf()] = "fail-fast"
    max_concurrent_steps: Annotated[int, Whole(1, 10_000)] = 3
    depends_on: Annotated[tuple[str, ...], SiblingNames("task")] = ()
    """Tasks of the same agent this one waits for (the agent's mode must be `dag`)."""
    timeout_ms: Annotated[int | None, Duration()] = Field(None, validation_alias="timeout")
    steps: Annotated[tuple[StepPlan, ...], Children("max_steps_per_task")]


class AgentPlan(PlanModel):
    """An agent: its tasks run sequentially, in parallel or as a dag."""

    name: Annotated[str, NodeName()]
    mode: Annotated[ModeName, OneOf()] = "sequential"
    failure_mode: Annotated[FailureModeName, OneOf()] = "fail-fast"
    max_concurrent_tasks: Annotated[int, Whole(1, 10_000)] = 5
    depends_on: Annotated[tuple[str, ...], SiblingNames("agent")] = ()
    """Agents of the run this one waits for (the run's mode must be `dag`)."""
    timeout_ms: Annotated[int | None, Duration()] = Field(None, validation_alias="timeout")
    tasks: Annotated[tuple[TaskPlan, ...], Children("max_tasks_per_agent")]


class Timeouts(PlanModel):
    """Timeouts by level (the default of each agent, task and step) and by run state."""

    # Durations as written; in milliseconds once read.
    run: Annotated[int | None, Duration()] = None
    agent: Annotated[int | None, Duration()] = None
    task: Annotated[int | None, Duration()] = None
    step: Annotated[int | None, Duration("max_step_timeout_ms")] = None
    pending: Annotated[int | None, Duration()] = None
    paused: Annotated[int | None, Duration()] = None
    resuming: Annotated[int | None, Duration()] = None
    retrying: Annotated[int | None, Duration()] = None
    escalated: Annotated[int | None, Duration()] = None
    """How long an escalated run waits for a person before it fails (escalation_timeout)."""


class EscalationPolicy(PlanModel):
    """When a failing run is handed to people (docs/escalation.md). Each threshold left
    out is the setting's (ESCALATION_*). Only failures that would be retried escalate."""

    enabled: bool = True
    window_ms: Annotated[int | None, Duration()] = Field(None, validation_alias="window")
    """How far back failures count; 5 minutes by default."""
    max_errors: Annotated[int | None, Whole(0, 1_000_000)] = None
    """More failed attempts than this in the window escalates; 5 by default."""
    max_error_rate: Annotated[float | None, Number(0.0, 1.0)] = None
    """A larger share of failed attempts in the window escalates; 0.5 by default..."""
    min_attempts: Annotated[int | None, Whole(1, 1_000_000)] = None
    """...once the window holds at least this many attempts; 10 by default."""


class ReplanPolicy(PlanModel):
    """When a running run asks a planner for new agents (docs/escalation.md). Each
    threshold left out is the setting's (REPLAN_*, ORCH_PLANNER)."""

    enabled: bool = True
    agent_failure_ratio: Annotated[float | None, Number(0.0, 1.0)] = None
    """More than this share of the run's agents failed; 0.5 by default."""
    task_failures: Annotated[int | None, Whole(0, 1_000_000)] = None
    """More than this many tasks failed; 10 by default."""
    max_replans: Annotated[int | None, Whole(0, 100)] = None
    """Re-plans the run may make; 2 by default."""
    planner: Annotated[str | None, PlannerName()] = None
    """Which of the configured planners; ORCH_PLANNER by default."""


class ConcurrencyPolicy(PlanModel):
    """At most `max_runs` runs of the organization with the same `key` run at once; the
    others wait their turn (priority, then FIFO). Useful for one run per customer or
    repository at a time."""

    key: Annotated[str, ConcurrencyKey()]
    """Text, with `${variables...}` templates rendered when the run is created."""
    max_runs: Annotated[int, Whole(1, 10_000)] = 1


class Plan(PlanModel):
    """A run's plan: agents, their tasks and the tasks' steps. Every problem is reported
    at once, with its path, as `invalid_plan`."""

    name: Annotated[str, RunName()]
    priority: Annotated[int, Whole(0, 9)] = 5
    """0 runs first; FIFO within a priority."""
    failure_mode: Annotated[FailureModeName, OneOf()] = "fail-fast"
    mode: Annotated[ModeName, OneOf()] = "parallel"
    max_attempts: Annotated[int, Whole(1, 10)] = 3
    """Run-level attempts (retry after failure)."""
    credits: Annotated[Decimal | None, Credits()] = None
    """Credits to reserve; estimated from the plan when omitted."""
    variables: Annotated[dict[str, Any], JsonObject("max_variables_bytes")] = Field(
        default_factory=dict
    )
    """Read by `${variables.<name>}`."""
    timeouts: Timeouts = Timeouts()
    max_agents: Annotated[int, Whole(1, "max_agents")] = 10
    """Agents running at once; 10, or the limit when it is lower."""
    escalation: EscalationPolicy = EscalationPolicy()
    replan: ReplanPolicy = ReplanPolicy()
    concurrency: ConcurrencyPolicy | None = None
    agents: Annotated[tuple[AgentPlan, ...], Children("max_agents")]

    @model_validator(mode="after")
    def _fill_in(self, info: ValidationInfo) -> Plan:
        """What a plan leaves to its levels: each agent's, task's and step's timeout
        defaults to ``timeouts`` of its level; ``max_agents`` to at most the limit.

        In place: every node was created by this validation and nobody holds it yet, and
        copying each step of a large plan to set one default would cost as much as
        validating it (frozen is a promise to the plan's readers).
        """
        timeouts = self.timeouts
        for agent in self.agents:
            _default_timeout(agent, timeouts.agent)
            for task in agent.tasks:
                _default_timeout(task, timeouts.task)
                if timeouts.step is not None:
                    for step in task.steps:
                        _default_timeout(step, timeouts.step)
                        for handler in (*step.on_error, *step.on_callback):
                            _default_timeout(handler, timeouts.step)
        if "max_agents" not in self.model_fields_set:
            self.__dict__["max_agents"] = min(self.max_agents, limits_of(info).max_agents)
        return self

    @property
    def timeouts_ms(self) -> dict[str, int]:
        """The timeouts the plan sets, by level and state."""
        return self.timeouts.model_dump(exclude_none=True)

    @property
    def policy(self) -> dict[str, Any]:
        """The escalation and re-plan thresholds the plan sets (``Run.policy``)."""
        return {
            "escalation": self.escalation.model_dump(exclude_none=True),
            "replan": self.replan.model_dump(exclude_none=True),
        }

    @property
    def step_count(self) -> int:
        return sum(len(task.steps) for agent in self.agents for task in agent.tasks)


def _default_timeout(node: AgentPlan | TaskPlan | StepPlan, timeout_ms: int | None) -> None:
    if node.timeout_ms is None and timeout_ms is not None:
        node.__dict__["timeout_ms"] = timeout_ms


# --------------------------------------------------------------------------- reading
def read_plan(data: Any, limits: Limits) -> tuple[Plan | None, list[PlanError]]:
    """The typed plan, or every structural problem of ``data`` in the order they appear
    in it (problems of an object before those of its fields)."""
    try:
        plan = Plan.model_validate(data, by_alias=True, by_name=False, context={"limits": limits})
    except ValidationError as exc:
        located = [
            (_position(data, error["loc"]), problem)
            for error in exc.errors(include_url=False)
            if (problem := _problem(error)) is not None
        ]
        located.sort(key=lambda pair: pair[0])
        return None, [problem for _, problem in located]
    return plan, []


def _problem(error: Any) -> PlanError | None:
    """One of pydantic's errors in the plan's words, or None when it only echoes
    another (a default that could not be computed because its source was refused)."""
    kind: str = error["type"]
    location: tuple[str | int, ...] = error["loc"]
    if kind == "default_factory_not_called":
        return None
    if kind == REFUSED:
        return PlanError(path_of(location), error["ctx"]["message"])
    if kind == "missing":
        return PlanError(path_of(location), "is required")
    if kind in ("extra_forbidden", UNKNOWN_FIELD):
        key = str(location[-1])
        allowed = list(_input_fields(_model_at(location[:-1])))
        hint = suggest(key, allowed) or f"; allowed: {', '.join(allowed)}"
        return PlanError(join(path_of(location[:-1]), key), f"unknown field{hint}")
    if kind in ("model_type", "model_attributes_type", "dict_type"):
        return PlanError(path_of(location), f"must be an object, got {a(error['input'])}")
    # No field type raises any other kind today; a new one is worded by pydantic until
    # it is given words (tests/runs/test_plan_model.py looks for pydantic's wording).
    return PlanError(path_of(location), str(error["msg"]))


def _position(data: Any, location: Iterable[str | int]) -> tuple[int, ...]:
    """Where ``location`` is in ``data``: the position of each key or index on the way;
    a missing field sorts first among its object's problems."""
    position: list[int] = []
    node = data
    for part in location:
        if isinstance(node, dict):
            if part not in node:
                position.append(-1)
                break
            position.append(list(node).index(part))
            node = node[part]
        elif isinstance(node, list | tuple) and isinstance(part, int) and part < len(node):
            position.append(part)
            node = node[part]
        else:
            break
    return tuple(position)


@cache
def _input_fields(model: type[PlanModel]) -> dict[str, FieldInfo]:
    """A model's fields by the key a plan writes them with, in order; a field refused
    where the model is used (a handler's ``depends_on``) is not one of them."""
    return {
        (field.validation_alias if isinstance(field.validation_alias, str) else name): field
        for name, field in model.model_fields.items()
        if not any(isinstance(marker, NotForHandlers) for marker in field.metadata)
    }


def _model_at(location: Iterable[str | int]) -> type[PlanModel]:
    """The model whose fields are at ``location`` in a plan."""
    model: type[PlanModel] = Plan
    for part in location:
        if isinstance(part, str):
            field = _input_fields(model).get(part)
            model = (_nested_model(field.annotation) if field else None) or model
    return model


def _nested_model(annotation: Any) -> type[PlanModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, PlanModel):
        return annotation
    for argument in get_args(annotation):
        found = _nested_model(argument)
        if found is not None:
            return found
    return None
