"""A claimed step's asks before its tool runs, answered by one call (``before_tool``):

- whether its output is borrowed instead (``borrowed``): reused from an earlier attempt,
  or found in the organization's step cache (``runs.reuse``; docs/engine.md, "Steps
  completed without running"): recorded as the attempt's, no tool run, no rate limit
  spent, no cost. A step with a `cache` that found no entry runs its tool; once its
  completion is recorded, ``remember`` makes it an entry under the key rendered here
  and, unless the cache says `inputs: false`, the digest of its params;
- whether a wait step's time has come (docs/api.md, "Waits");
- whether its rate limits' units are granted (docs/rate-limits.md).

A wait's ``for`` or ``until`` and a rate limit's keys and units are rendered here, where
the step's references resolve (variables, earlier steps' outputs); step admission
(``runs.admission.step_admission``) then lets the tool run or parks the step, without
holding this worker, until its time or its units come.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from django.db import transaction
from django.utils import timezone
from opentelemetry.trace import Span

from common import metrics
from common.expressions import ExpressionError, parsed
from common.templates import TemplateError, UnresolvedReference, render_value
from common.tools import registry
from common.tools.base import ToolError
from orchestrator import step_spans
from orchestrator.context import StepContext, render_params
from orchestrator.tools import builtin
from ratelimits.models import KEY_MAX_LENGTH
from runs import reuse
from runs.admission import step_admission
from runs.admission.step_admission import Admission
from runs.engine import dispatch
from runs.engine.outcomes import Outcome
from runs.models import Run, Step

RUN = "run"  # its time has come, its units are granted: run the tool
WAIT = "wait"  # parked for its time or its units (or its attempt is not its own any more)


@dataclass(frozen=True, kw_only=True)
class Asked:
    """What a claimed step's asks answered: ``waits``, it is parked (its timer, its
    units, or its attempt no longer its own: nothing to record); else ``outcome``, what
    to record instead of running the tool (None: run it); and the cache key and inputs
    its completion is remembered under (key "": none; inputs "": the cache keeps none)."""

    outcome: Outcome | None = None
    waits: bool = False
    key: str = ""
    inputs: str = ""


NOTHING = Asked()
LIMITS_AND_WAITS = "rate limits or waits"
WAITS = Asked(waits=True)


def before_tool(step: Step, attempt: int, span: Span) -> Asked:
    """Every ask of ``step``'s ``attempt`` before its tool, in order: a borrowed output
    (no rate limit spent), a wait's timer, its rate limits."""
    asked = borrowed(step, attempt)
    if asked.outcome is not None:
        return asked
    if step.tool == "wait":
        verdict, refusal = _timer(step, attempt, span)
        if verdict == WAIT:
            return WAITS
        if refusal is not None:
            return replace(asked, outcome=refusal)
    verdict, refusal = _rate_limits(step, attempt, span)
    if verdict == WAIT:
        return WAITS
    return replace(asked, outcome=refusal) if refusal is not None else asked


def borrowed(step: Step, attempt: int) -> Asked:
    """Its output reused from an earlier attempt, or found in the step cache under its
    key and inputs (a cached step that found none: the key and inputs to remember)."""
    if step.reused_from:
        output = reuse.source_output(step.reused_from)
        return Asked(outcome=Outcome(output=output, borrowed={"reused_from": step.reused_from}))
    if not step.cache:
        return NOTHING
    context = StepContext(step, step.run_id, attempt)
    # A key is stored and shown: it must not hold a secret's value.
    resolve = context.without_secrets("a cache key")
    try:
        # A step its condition skips is skipped, not answered (the attempt says so).
        if step.when and not parsed(step.when).truthy(resolve):
            return NOTHING
    except (ExpressionError, TemplateError, UnresolvedReference):
        return NOTHING
    try:
        key = str(render_value(step.cache["key"], resolve))
    except (TemplateError, UnresolvedReference) as exc:
        error = ToolError("template_error", f"cache.key: {exc}", False)
        return Asked(outcome=Outcome(error=error))
    inputs = ""
    # Stored before `inputs` existed: the default, inputs kept.
    if step.cache.get("inputs", True):
        try:
            inputs = reuse.cache_inputs(_params(step, context))
        except (TemplateError, UnresolvedReference):
            # Params that cannot be rendered yet (a callback's URL) have no inputs to
            # find, nor remember: the tool runs, and reports a template error itself.
            return NOTHING
    organization_id = Run.objects.filter(pk=step.run_id).values_list("organization_id", flat=True)
    hit = reuse.cache_hit(
        organization_id=organization_id[0],
        tool=step.tool,
        key=key,
        inputs=inputs,
        ttl_ms=step.cache["ttl_ms"],
    )
    if hit is None:
        return Asked(key=key, inputs=inputs)
    output, source = hit
    outcome = Outcome(output=output, borrowed={"cached_from": source})
    return Asked(outcome=outcome, key=key, inputs=inputs)


def _params(step: Step, context: StepContext) -> Any:
    """The step's params as its tool will be given them (secrets' values included: they
    are inputs too, and only their keyed digest is kept)."""
    spec = registry.get(step.tool)
    verbatim = spec.verbatim(step.params) if spec is not None else frozenset[str]()
    return render_params(step.params, verbatim, context)


def remember(step: Step, asked: Asked, outcome: Outcome, applied: bool) -> None:
    """A cached step that ran its tool and completed becomes an entry of its key."""
    if not asked.key or asked.outcome is not None or not applied:
        return
    if outcome.error is not None or outcome.skipped or outcome.wait is not None:
        return
    organization_id = Run.objects.filter(pk=step.run_id).values_list("organization_id", flat=True)
    reuse.cache_add(
        organization_id=organization_id[0],
        run_id=step.run_id,
        step_id=step.pk,
        tool=step.tool,
        key=asked.key,
        inputs=asked.inputs,
    )


def _rate_limits(step: Step, attempt: int, span: Span) -> tuple[str, Outcome | None]:
    """(RUN, None): the step spends no rate limit, or its units are granted; (WAIT, None):
    it waits for them (its attempt's ``span`` says so), or its attempt is not its own any
    more; (RUN, outcome): an attempt that fails before its tool runs (a key or units that
    do not render, units beyond the limit)."""
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
    # What is asked here is stored and shown (a wake time with its event).
    resolve = StepContext(step, step.run_id, attempt).without_secrets(LIMITS_AND_WAITS)
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


def _wanted(step: Step, context: StepContext) -> list[step_admission.Wanted]:
    # A key is stored and shown with its grants.
    resolve = context.without_secrets(LIMITS_AND_WAITS)
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
