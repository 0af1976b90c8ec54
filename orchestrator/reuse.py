"""A claimed step whose output is another step's: reused from an earlier attempt, or
found in the organization's step cache (``runs.reuse``; docs/engine.md, "Steps completed
without running").

The executor asks ``borrowed`` before a step's rate limits and tool: an outcome it
returns is recorded as the attempt's (no tool run, no rate limit spent, no cost). A step
with a `cache` that found no entry runs its tool; once its completion is recorded,
``remember`` makes it an entry under the key rendered here and, unless the cache says
`inputs: false`, the digest of its params rendered here (``runs.reuse.cache_inputs``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from common.expressions import ExpressionError, parsed
from common.templates import Reference, TemplateError, UnresolvedReference, render_value
from common.tools import registry
from common.tools.base import ToolError
from orchestrator.context import StepContext, render_params
from runs import reuse
from runs.engine.outcomes import Outcome
from runs.models import Run, Step


@dataclass(frozen=True)
class Borrowing:
    """What ``borrowed`` found: the outcome to record instead of running the tool
    (None: run it), and the cache key and inputs its completion is remembered under
    (key "": none; inputs "": the cache keeps none)."""

    outcome: Outcome | None = None
    key: str = ""
    inputs: str = ""


NOTHING = Borrowing()


def borrowed(step: Step, attempt: int) -> Borrowing:
    if step.reused_from:
        output = reuse.source_output(step.reused_from)
        return Borrowing(Outcome(output=output, borrowed={"reused_from": step.reused_from}))
    if not step.cache:
        return NOTHING
    context = StepContext(step, step.run_id, attempt)

    def resolve(ref: Reference) -> object:
        # A key is stored and shown: it must not hold a secret's value.
        if ref[0] == "secrets":
            raise UnresolvedReference("secrets cannot be used in a cache key", ref)
        return context(ref)

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
        return Borrowing(Outcome(error=error))
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
        return Borrowing(key=key, inputs=inputs)
    output, source = hit
    return Borrowing(Outcome(output=output, borrowed={"cached_from": source}), key, inputs)


def _params(step: Step, context: StepContext) -> Any:
    """The step's params as its tool will be given them (secrets' values included: they
    are inputs too, and only their keyed digest is kept)."""
    spec = registry.get(step.tool)
    verbatim = spec.verbatim(step.params) if spec is not None else frozenset[str]()
    return render_params(step.params, verbatim, context)


def remember(step: Step, borrowing: Borrowing, outcome: Outcome, applied: bool) -> None:
    """A cached step that ran its tool and completed becomes an entry of its key."""
    if not borrowing.key or borrowing.outcome is not None or not applied:
        return
    if outcome.error is not None or outcome.skipped or outcome.wait is not None:
        return
    organization_id = Run.objects.filter(pk=step.run_id).values_list("organization_id", flat=True)
    reuse.cache_add(
        organization_id=organization_id[0],
        run_id=step.run_id,
        step_id=step.pk,
        tool=step.tool,
        key=borrowing.key,
        inputs=borrowing.inputs,
    )
