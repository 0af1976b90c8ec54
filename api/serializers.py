"""Output serializers shared by the views, and the strict input fields they build on.

No logic here: outputs only name what a row (or a selector's summary) already holds;
inputs only check shape. Inputs refuse what JSON would not mean (a string for a boolean,
a number for a string) and fields they do not know, so that a client's typo or a field
it may not set (``organization``, ``status``, ``id``...) is an error, never ignored.
"""

from __future__ import annotations

import decimal
import functools
from collections.abc import Callable, Iterable, Mapping
from datetime import datetime
from decimal import Decimal
from typing import Any

from django.utils import timezone
from rest_framework import serializers
from rest_framework.fields import SkipField, empty

from billing.models import EntryType
from runs.models import EventKind, FailureMode, Mode
from runs.selectors import RunDetail
from runs.states import NodeStatus, RunStatus, StepStatus


# --------------------------------------------------------------------------- inputs
class StrictBooleanField(serializers.BooleanField):
    """``true`` or ``false`` only (DRF also takes "yes", "on", 1...)."""

    def to_internal_value(self, data: Any) -> bool:
        if not isinstance(data, bool):
            self.fail("invalid", input=data)
        return data


class StrictCharField(serializers.CharField):
    """A JSON string only (DRF also takes numbers), its length checked as sent.

    DRF trims whitespace before checking ``max_length``, so a string the schema refuses
    (over ``maxLength`` with trailing spaces) was accepted (found by the schema test).
    """

    def run_validation(self, data: Any = empty) -> Any:
        # DRF returns a blank string (all whitespace included) before to_internal_value
        # sees it: 1,001 spaces were a valid 1,000-character reason (found by the schema
        # test in a fresh clone).
        self._check_length(data)
        return super().run_validation(data)

    def to_internal_value(self, data: Any) -> str:
        if not isinstance(data, str):
            self.fail("invalid")
        self._check_length(data)
        return super().to_internal_value(data)

    def _check_length(self, data: Any) -> None:
        if isinstance(data, str) and self.max_length is not None and len(data) > self.max_length:
            self.fail("max_length", max_length=self.max_length)


class StrictIntegerField(serializers.IntegerField):
    """A JSON integer only (DRF also takes "5" and 5.0)."""

    def to_internal_value(self, data: Any) -> int:
        if isinstance(data, bool) or not isinstance(data, int):
            self.fail("invalid")
        return super().to_internal_value(data)


class InputSerializer(serializers.Serializer[Any]):
    """A request body: an object whose every field is known."""

    def to_internal_value(self, data: Any) -> Any:
        if isinstance(data, Mapping):
            unknown = sorted(str(key) for key in data if key not in self.fields)
            if unknown:
                raise serializers.ValidationError(
                    {key: ["unknown field; it cannot be set here"] for key in unknown}
                )
        return super().to_internal_value(data)


class EmptyInput(InputSerializer):
    """No fields: an empty object or no body at all."""


# --------------------------------------------------------------------------- outputs
_MISSING = object()
Convert = Callable[[Any], Any]


def _current_is_utc() -> bool:
    """Whether DRF would write a date-time in UTC: the time zone is UTC unless a request
    activated another (nothing here does; the check keeps the short path honest)."""
    return timezone.get_current_timezone_name() == "UTC"


def _short(field: serializers.Field[Any, Any, Any, Any]) -> Convert:
    """A value's representation as ``field.to_representation`` gives it, the short way
    for the types the outputs are made of (a date-time already in UTC, a Decimal, a
    UUID, a number, a string, JSON); the field's own method for anything else. Each is
    held equal to the field's by tests/api/test_outputs.py."""
    exact = field.to_representation
    if isinstance(field, serializers.DateTimeField) and not hasattr(field, "format"):
        if hasattr(field, "timezone"):
            return exact

        def iso(value: Any) -> Any:
            # At offset 0 DRF's conversion to UTC changes nothing but the offset's name.
            if type(value) is datetime:
                text = value.isoformat()
                if text.endswith("+00:00"):
                    return text[:-6] + "Z"
            return exact(value)

        return iso
    if isinstance(field, serializers.DecimalField) and field.coerce_to_string:
        if field.localize or field.normalize_output or field.rounding:
            return exact
        if field.decimal_places is None:
            return exact
        places = Decimal(".1") ** field.decimal_places
        context = decimal.Context(prec=field.max_digits) if field.max_digits else None

        def fixed(value: Any) -> Any:
            if type(value) is Decimal:
                return f"{value.quantize(places, context=context):f}"
            return exact(value)

        return fixed
    if isinstance(field, serializers.UUIDField) and field.uuid_format == "hex_verbose":
        return str
    if isinstance(field, serializers.IntegerField):
        return int
    if isinstance(field, serializers.CharField):
        return str
    if isinstance(field, serializers.JSONField) and not field.binary:
        return _same
    return exact


def _same(value: Any) -> Any:
    return value


# One field of a FastOutput: its name in the answer; the row's attribute it reads ("" for
# the row itself, a nested output's `source="*"`; None: through DRF's `get_attribute`);
# its conversion; the field.
_Column = tuple[str, str | None, Convert, serializers.Field[Any, Any, Any, Any]]


class FastOutput(serializers.Serializer[Any]):
    """An output serializer whose rows are written the short way, by plain functions
    instead of DRF's general path, with exactly the same result (tests/api/test_outputs.py
    holds every output class to it): each field's value by one ``getattr`` (a key of a
    dict row) where its source is a plain attribute, converted by ``_short``; a nested
    FastOutput by its own columns. The fields are bound once per class, not deep-copied
    for every serializer made (DRF's ``Serializer.fields``): a run's detail spent more on
    that than on its SQL (make profile-api). DRF's general path (``Field.get_attribute``:
    sources through dicts, callables, managers, defaults) is kept for any field or value
    that needs it. The classes stay what the OpenAPI schema is made from.

    ``Output.row(instance)`` and ``Output.rows(instances)`` write rows directly;
    ``Output(instance).data`` (DRF's way, used where a serializer nests another) comes
    to the same."""

    @classmethod
    def _columns(cls, utc: bool) -> list[_Column]:
        """The fields, bound once per class, with their conversions: ``_short``'s when
        date-times are written in UTC, the fields' own otherwise."""
        key = "_fast_utc" if utc else "_fast_exact"
        columns: list[_Column] | None = cls.__dict__.get(key)
        if columns is None:
            columns = []
            for field in cls()._readable_fields:
                attrs = field.source_attrs
                attr = attrs[0] if len(attrs) == 1 else "" if field.source == "*" else None
                if isinstance(field, FastOutput):
                    convert: Convert = functools.partial(type(field)._row, utc=utc)
                else:
                    convert = _short(field) if utc else field.to_representation
                columns.append((str(field.field_name), attr, convert, field))
            setattr(cls, key, columns)
        return columns

    @classmethod
    def _row(cls, instance: Any, *, utc: bool) -> dict[str, Any]:
        ret: dict[str, Any] = {}
        get = instance.get if type(instance) is dict else None
        for name, attr, convert, field in cls._columns(utc):
            if attr:
                value = getattr(instance, attr, _MISSING) if get is None else get(attr, _MISSING)
            else:
                value = instance if attr == "" else _MISSING
            if value is _MISSING or callable(value):
                try:
                    value = field.get_attribute(instance)
                except SkipField:
                    continue
            ret[name] = None if value is None else convert(value)
        return ret

    @classmethod
    def row(cls, instance: Any) -> dict[str, Any]:
        return cls._row(instance, utc=_current_is_utc())

    @classmethod
    def rows(cls, instances: Iterable[Any]) -> list[dict[str, Any]]:
        utc = _current_is_utc()
        return [cls._row(instance, utc=utc) for instance in instances]

    def to_representation(self, instance: Any) -> Any:
        return type(self).row(instance)


def credits_field(help_text: str, **kwargs: Any) -> serializers.DecimalField:
    return serializers.DecimalField(
        max_digits=24, decimal_places=6, coerce_to_string=True, help_text=help_text, **kwargs
    )


class CreditsOutput(FastOutput):
    """A run's credits, as its selectors set them on the run (``credits_reserved``...)."""

    reserved = credits_field("Reserved over all attempts.", source="credits_reserved")
    charged = credits_field("Charged for steps over all attempts.", source="credits_charged")
    refunded = credits_field("Given back when attempts ended.", source="credits_refunded")
    held = credits_field("Still reserved: neither charged nor refunded yet.", source="credits_held")


class RunOutput(FastOutput):
    """A run as lists show it (without its plan and summary)."""

    id = serializers.UUIDField()
    name = serializers.CharField()
    status = serializers.ChoiceField(choices=RunStatus.choices)
    priority = serializers.IntegerField()
    failure_mode = serializers.ChoiceField(choices=FailureMode.choices)
    mode = serializers.ChoiceField(choices=Mode.choices)
    attempt_number = serializers.IntegerField(help_text="The current attempt; 0 before start.")
    max_attempts = serializers.IntegerField()
    last_error = serializers.JSONField(
        allow_null=True, help_text="`{code, message}` of the failure, or null."
    )
    cancel_reason = serializers.CharField()
    created_by = serializers.CharField()
    created_at = serializers.DateTimeField()
    updated_at = serializers.DateTimeField()
    started_at = serializers.DateTimeField(allow_null=True)
    picked_up_at = serializers.DateTimeField(allow_null=True)
    completed_at = serializers.DateTimeField(allow_null=True)
    cancelled_at = serializers.DateTimeField(allow_null=True)
    deleted_at = serializers.DateTimeField(allow_null=True)
    last_heartbeat = serializers.DateTimeField(allow_null=True)
    duration_ms = serializers.IntegerField(allow_null=True)
    credits = CreditsOutput(source="*")
    parent_run = serializers.UUIDField(
        source="parent_run_id", allow_null=True, help_text="The run whose `run` step started it."
    )
    parent_step = serializers.IntegerField(
        source="parent_step_id", allow_null=True, help_text="The `run` step that started it."
    )
    depth = serializers.IntegerField(help_text="0 for a top run, its parent's + 1 for a child.")
    replan_count = serializers.IntegerField(
        help_text="Re-plans asked of its planner (at most the plan's `replan.max_replans`)."
    )
    queued_reason = serializers.CharField(
        help_text="Why a PENDING run waits to start (its organization's limit of running "
        "runs, its concurrency key's, or earlier runs ahead of it); empty when it does not."
    )
    concurrency_key = serializers.CharField(
        help_text="The plan's `concurrency.key`, rendered from the run's variables; empty "
        "without one."
    )


class CountsOutput(serializers.Serializer[Any]):
    agents = serializers.DictField(child=serializers.IntegerField(), help_text="By status.")
    tasks = serializers.DictField(child=serializers.IntegerField(), help_text="By status.")
    steps = serializers.DictField(child=serializers.IntegerField(), help_text="By status.")


class ProgressOutput(serializers.Serializer[Any]):
    steps_total = serializers.IntegerField(help_text="Steps of the attempt (handlers excluded).")
    steps_finished = serializers.IntegerField(help_text="Of those, how many have ended.")
    percent = serializers.FloatField()


class ChildRunOutput(FastOutput):
    id = serializers.UUIDField()
    status = serializers.ChoiceField(choices=RunStatus.choices)
    mode = serializers.CharField(
        source="parent_mode", help_text="sync, async_poll or async_callback."
    )
    step = serializers.IntegerField(source="parent_step_id", allow_null=True)
    created_at = serializers.DateTimeField()


class RunDetailOutput(RunOutput):
    """A run with its plan and the current attempt's counts and progress."""

    # plan, outputs and outputs_truncated are left out by `?exclude=` (RunDetailQuery):
    # not required in the schema, so generated clients accept their absence.
    plan = serializers.JSONField(
        required=False, help_text="The plan exactly as submitted (left out by `exclude=plan`)."
    )
    variables = serializers.JSONField()
    counts = CountsOutput(help_text="The current attempt's agents, tasks and steps by status.")
    progress = ProgressOutput()
    children = ChildRunOutput(many=True, help_text="The runs its `run` steps started.")
    forked_from = serializers.JSONField(
        allow_null=True,
        help_text="A fork (`POST /runs/{id}/fork`): `{run, step}`, the run it was forked "
        "from and the step it runs again from; null otherwise.",
    )
    forks = serializers.ListField(
        child=serializers.UUIDField(), help_text="The runs forked from this one, oldest first."
    )
    outputs = serializers.DictField(
        child=serializers.JSONField(),
        required=False,
        help_text='`{"agent.task.step": output}` of the current attempt\'s completed steps, '
        "in plan order, up to 1 MB of JSON (left out, with `outputs_truncated`, by "
        "`exclude=outputs`).",
    )
    outputs_truncated = serializers.BooleanField(
        required=False,
        help_text="Some completed steps' outputs were left out of `outputs` (1 MB).",
    )

    @classmethod
    def _row(cls, instance: Any, *, utc: bool) -> dict[str, Any]:
        assert isinstance(instance, RunDetail)
        run, summary = instance.run, instance.summary
        data = RunOutput._row(run, utc=utc)
        if "plan" not in instance.excluded:
            data["plan"] = run.plan
        data["variables"] = run.variables
        data["counts"] = summary.counts
        data["progress"] = {
            "steps_total": summary.steps_total,
            "steps_finished": summary.steps_finished,
            "percent": summary.percent,
        }
        data["children"] = [ChildRunOutput._row(child, utc=utc) for child in instance.children]
        data["forked_from"] = (
            {"run": str(run.forked_from_run_id), "step": run.forked_from_step}
            if run.forked_from_run_id is not None
            else None
        )
        data["forks"] = [str(fork) for fork in getattr(run, "fork_ids", None) or ()]
        if instance.outputs is not None:
            data["outputs"] = instance.outputs.values
            data["outputs_truncated"] = instance.outputs.truncated
        return data


class ApprovalOutput(serializers.Serializer[Any]):
    run = RunDetailOutput()
    steps = serializers.ListField(
        child=serializers.IntegerField(), help_text="Ids of the steps decided (none: a no-op)."
    )


class NodeOutput(FastOutput):
    """What an agent's and a task's outputs have alike (``runs.models.Node``)."""

    id = serializers.IntegerField()
    name = serializers.CharField()
    attempt_number = serializers.IntegerField()
    position = serializers.IntegerField()
    status = serializers.ChoiceField(choices=NodeStatus.choices)
    mode = serializers.ChoiceField(choices=Mode.choices)
    failure_mode = serializers.ChoiceField(choices=FailureMode.choices)
    depends_on = serializers.ListField(child=serializers.CharField())
    retry_count = serializers.IntegerField()
    last_error = serializers.JSONField(allow_null=True)
    created_at = serializers.DateTimeField()
    started_at = serializers.DateTimeField(allow_null=True)
    completed_at = serializers.DateTimeField(allow_null=True)
    duration_ms = serializers.IntegerField(allow_null=True)


class AgentOutput(NodeOutput):
    task_count = serializers.IntegerField()


class TaskOutput(NodeOutput):
    agent_id = serializers.IntegerField()
    agent_name = serializers.CharField(source="agent.name")
    generation = serializers.IntegerField(help_text="0, then 1, 2... for each agent-level retry.")
    step_count = serializers.IntegerField()


class StepOutput(FastOutput):
    """A step of one attempt of the run: where it is in the plan, its tool and
    parameters, its status and attempts, its output or error, and its cost."""

    id = serializers.IntegerField()
    task_id = serializers.IntegerField()
    task_name = serializers.CharField()
    agent_name = serializers.CharField()
    name = serializers.CharField()
    attempt_number = serializers.IntegerField()
    generation = serializers.IntegerField()
    position = serializers.IntegerField()
    tool = serializers.CharField()
    params = serializers.JSONField()
    when = serializers.CharField()
    depends_on = serializers.ListField(child=serializers.CharField())
    handler_for = serializers.IntegerField(
        source="handler_for_id", allow_null=True, help_text="The step whose failure this handles."
    )
    status = serializers.ChoiceField(choices=StepStatus.choices)
    attempts = serializers.IntegerField()
    failures = serializers.IntegerField()
    reclaims = serializers.IntegerField()
    next_run_at = serializers.DateTimeField(allow_null=True)
    waiting_reason = serializers.CharField(
        help_text="Why a PENDING (or PAUSED) step waits: `rate_limited:<name>` while it waits "
        "for a rate limit's units, `timer` while a `wait` step waits for its time (until "
        "`next_run_at`, its wake time); a RUNNING step of a worker tool, "
        "`no_worker_offers_tool` while no online worker offers its tool at its version "
        "(docs/tools.md); empty when it does not."
    )
    rate_limits = serializers.JSONField(
        help_text="The rate limits it spends, as the plan wrote them: `[{name, units, key}]`."
    )
    output = serializers.JSONField(allow_null=True)
    error = serializers.JSONField(allow_null=True, help_text="`{code, message, retryable}`.")
    handled = serializers.BooleanField(help_text="Failed, but its on_error handlers succeeded.")
    cost = credits_field("Credits charged for this step.")
    reused_from = serializers.JSONField(
        allow_null=True,
        help_text="Completed without running, with the output of an earlier attempt's step "
        "(a retry with `reuse`, a fork): `{attempt, step}`; null otherwise.",
    )
    cached_from = serializers.JSONField(
        allow_null=True,
        help_text="Completed without running, with the output of a step of the step cache "
        "(its plan's `cache`): `{run, step}`; null otherwise.",
    )
    created_at = serializers.DateTimeField()
    started_at = serializers.DateTimeField(allow_null=True)
    completed_at = serializers.DateTimeField(allow_null=True)
    duration_ms = serializers.IntegerField(
        allow_null=True,
        help_text="The attempt that ran the tool, from `started_at`; time parked is `waited_ms`.",
    )
    waited_ms = serializers.IntegerField(
        help_text="Milliseconds it waited parked before that attempt: in a rate limit's line, "
        "on a `wait` step's timer (a pause not counted)."
    )
    job = serializers.UUIDField(
        allow_null=True,
        help_text="A `runner` step or a worker tool's: its current attempt's runner job "
        "(`GET /runner-jobs/{id}`, `POST /runner-jobs/{id}/stop`), from the moment the "
        "attempt creates it; null for other tools and before.",
    )
    progress = serializers.JSONField(
        allow_null=True,
        help_text="What a published tool (docs/tools.md) last said of how far it got in the "
        "current attempt (`Context.heartbeat`, any JSON): a worker tool's as its job has it "
        "(within a second), a fleet tool's as the step's lease renewal wrote it (every "
        "`ENGINE_HEARTBEAT_SECONDS`); null before it says anything.",
    )
    child_run = serializers.UUIDField(
        allow_null=True,
        help_text="A `run` step: the child run its current attempt started, from the moment "
        "it exists; null for other tools and before.",
    )


class EventOutput(FastOutput):
    """Something that happened to the run or one of its parts: a transition, a retry, a
    charge, an approval, an error, an operator's action."""

    id = serializers.IntegerField()
    attempt_number = serializers.IntegerField()
    entity = serializers.CharField(help_text="run, agent, task or step.")
    entity_id = serializers.CharField()
    # read_only: every answer carries it (the default fills in a row read without its
    # annotation), so the schema lists it as required, as clients may rely on.
    path = serializers.CharField(
        default="",
        read_only=True,
        help_text="Where the entity is in the plan, as people read it: `agent.task.step`, "
        "`agent.task` or `agent`; empty for the run itself.",
    )
    kind = serializers.ChoiceField(choices=EventKind.choices)
    from_status = serializers.CharField()
    to_status = serializers.CharField()
    actor = serializers.CharField()
    message = serializers.CharField()
    payload = serializers.JSONField()
    created_at = serializers.DateTimeField()


class LedgerEntryOutput(serializers.Serializer[Any]):
    id = serializers.UUIDField()
    type = serializers.ChoiceField(choices=EntryType.choices)
    amount = credits_field("Always positive; the type says which way it moves.")
    run = serializers.UUIDField(source="run_id", allow_null=True)
    step = serializers.IntegerField(
        source="step_id",
        allow_null=True,
        help_text="Null: a charge is a run attempt's, its steps' costs are on the steps. Set "
        "only on a charge of one step attempt, from an attempt that began before charges "
        "were kept per attempt.",
    )
    reason = serializers.CharField()
    actor = serializers.CharField()
    created_at = serializers.DateTimeField()


class BalanceOutput(serializers.Serializer[Any]):
    available = credits_field("What new reservations can use.")
    reserved = credits_field("Held for runs in progress.")
    spent = credits_field("Charged, ever.")
    total = credits_field("available + reserved.")
