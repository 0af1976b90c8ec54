"""A claimed step's asks, before its tool runs: a wait step's timer (docs/api.md,
"Waits"), then its rate limits (docs/rate-limits.md). Its keys and units, a wait's ``for``
or ``until``, are rendered here, where the step's references resolve (variables, earlier
steps' outputs); step admission (``runs.admission.step_admission``) then lets the tool run or parks
the step, without holding this worker, until its time or its units come."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any

from django.db import transaction
from django.utils import timezone
from opentelemetry.trace import Span

from common import metrics
from common.expressions import ExpressionError, parsed
from common.templates import Reference, TemplateError, UnresolvedReference, render_value
from common.tools.base import ToolError
from orchestrator import step_spans
from orchestrator.context import StepContext
from orchestrator.tools import builtin
from ratelimits.models import KEY_MAX_LENGTH
from runs.admission import step_admission
from runs.admission.step_admission import Admission
from runs.engine import dispatch
from runs.engine.outcomes import Outcome
from runs.models import Step

RUN = "run"  # the units are granted: run the tool
WAIT = "wait"  # the step waits for its units (or its attempt is not its own any more)


def ask(step: Step, attempt: int, span: Span) -> tuple[str, Outcome | None]:
    """(RUN, None): the step spends no rate limit, or its units are granted; (WAIT, None):
    it waits for them (its attempt's ``span`` says so), or its attempt is not its own any
    more; (RUN, outcome): an attempt that fails before its tool runs (a key or units that
    do not render, units beyond the limit)."""
    if step.tool == "wait":
        verdict, refusal = _timer(step, attempt, span)
        if verdict == WAIT or refusal is not None:
            return verdict, refusal
    if not step_admission.spends(step):
        return RUN, None
    try:
        wanted = _wanted(step, StepContext(step, step.run_id, attempt))
    except (TemplateError, UnresolvedReference, ValueError) as exc:
        return RUN, Outcome(error=ToolError("template_error", f"rate_limits: {exc}", False))
    with transaction.atomic():
        admission = step_admission.admit(
            step_id=step.pk, run_id=step.run_id, attempt=attempt, tool=step.tool, wanted=wanted
        )
        _fill_freed_place(step, admission)
    if admission.refused:
        return RUN, Outcome(error=ToolError(admission.code, admission.refused, False))
    if admission.go:
        metrics.rate_limit_granted(admission.granted, admission.waited_s)
        step_spans.rate_limit_waited(admission.waited_s, admission.granted)
        return RUN, None
    if admission.reason:
        metrics.rate_limit_wait(admission.reason.removeprefix(step_admission.WAITING_PREFIX))
    span.set_attribute("orchestrator.outcome", "waiting_rate_limit")
    return WAIT, None


def _timer(step: Step, attempt: int, span: Span) -> tuple[str, Outcome | None]:
    """A wait step: RUN once its time has come (or when its ``when`` does not hold: the
    attempt then skips it as any step), WAIT while it is parked."""
    resolve = _without_secrets(StepContext(step, step.run_id, attempt))
    try:
        if step.when and not parsed(step.when).truthy(resolve):
            return RUN, None
    except (ExpressionError, TemplateError, UnresolvedReference):
        return RUN, None  # the attempt reports it (condition_error), as for any step
    try:
        until, for_ms = builtin.wait_time(render_value(step.params, resolve), timezone.now())
    except (TemplateError, UnresolvedReference) as exc:
        return RUN, Outcome(error=ToolError("template_error", f"params: {exc}", False))
    except ToolError as exc:
        return RUN, Outcome(error=exc)
    admission = timer(step, attempt, until, for_ms)
    if admission.refused:  # past the quota of parked waits, or beyond the reservation
        return RUN, Outcome(error=ToolError(admission.code, admission.refused, False))
    if admission.go:
        return RUN, None
    span.set_attribute("orchestrator.outcome", "waiting_timer")
    return WAIT, None


def timer(step: Step, attempt: int, until: datetime | None, for_ms: int | None) -> Admission:
    """The wait step's timer (``step_admission.timer``); parked, the place it gave back
    taken in the same transaction."""
    with transaction.atomic():
        admission = step_admission.timer(
            step_id=step.pk, run_id=step.run_id, attempt=attempt, until=until, for_ms=for_ms
        )
        _fill_freed_place(step, admission)
    return admission


def _fill_freed_place(step: Step, admission: Admission) -> None:
    # A parked step holds no place of its task (runs.admission.step_admission): the task's next
    # ready step takes the one it gave back.
    if admission.freed:
        dispatch.place_freed(step.run_id, step.task_id)


def _without_secrets(context: StepContext) -> Callable[[Reference], Any]:
    """The step's references but its secrets: what is asked here is stored and shown to
    operators (a key with its grants, a wake time with its event)."""

    def resolve(ref: Reference) -> Any:
        if ref[0] == "secrets":
            raise UnresolvedReference("secrets cannot be used in rate limits or waits", ref)
        return context(ref)

    return resolve


def _wanted(step: Step, context: StepContext) -> list[step_admission.Wanted]:
    resolve = _without_secrets(context)
    wanted = []
    for use in step.rate_limits:
        key = render_value(use.get("key", ""), resolve)
        key = key if isinstance(key, str) else str(key)
        if len(key) > KEY_MAX_LENGTH:
            raise ValueError(f"key of {use['name']!r} renders to {len(key)} characters")
        units = render_value(use.get("units", 1), resolve)
        if isinstance(units, str) and units.strip().isdigit():
            units = int(units)
        if isinstance(units, bool) or not isinstance(units, int) or units < 1:
            raise ValueError(
                f"units of {use['name']!r} render to {units!r}, not a whole number from 1"
            )
        wanted.append(step_admission.Wanted(use["name"], key, units))
    return wanted
