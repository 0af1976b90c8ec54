"""Steps that complete without running: with an earlier step's output, charged nothing.

Three features share one mechanism (docs/engine.md, "Steps completed without running"):

- a retry with ``reuse: "completed"`` (``retry_reuse``) and a fork
  (``runs.forks.run_fork``) write ``Run.reuse``, the steps (by path) that the next
  attempt takes as completed, each with the step whose output it takes; materialising
  the attempt copies each into its step's ``reused_from``;
- a step whose plan declares ``cache`` looks for an entry (``cache_hit``) when it is
  claimed.

Either way the worker that claims the step does not run its tool: the attempt's outcome
is the earlier output, at no cost, marked as borrowed, and the recording (the general
path of ``runs.engine.outcomes``) completes it like any other step, with an event that
says where its output came from. The step still waits for its dependencies and releases
its dependents as a step that ran, so templates and `when` conditions downstream read
its output as they would have.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.db import transaction
from django.utils import timezone

from billing.models import Organization
from runs.models import Run, Step, StepCacheEntry
from runs.plan.fields import CACHE_KEY_MAX_LENGTH
from runs.states import StepStatus

REUSE_CHOICES = ("none", "completed")


def step_path(agent: str, task: str, step: str) -> str:
    return f"{agent}.{task}.{step}"


def completed_steps(run: Run, attempt_number: int) -> dict[str, dict[str, Any]]:
    """The attempt's completed steps of the plan (handlers aside), by path, each as
    ``{"attempt": N, "step": ID}``; of a task run again (a level retry), its latest
    generation's."""
    rows = (
        Step.objects.filter(
            run=run,
            attempt_number=attempt_number,
            status=StepStatus.COMPLETED,
            handler_for__isnull=True,
            callback_for__isnull=True,
        )
        .order_by("task__generation", "generation", "id")
        .values_list("id", "name", "task__name", "task__agent__name")
    )
    return {
        step_path(agent, task, name): {"attempt": attempt_number, "step": step_id}
        for step_id, name, task, agent in rows
    }


def retry_reuse(run: Run, reuse: str) -> dict[str, dict[str, Any]]:
    """What a retry of ``run`` (its current attempt ended) takes as completed: nothing
    (``"none"``), or every step its attempt completed (``"completed"``)."""
    if reuse == "none" or run.attempt_number == 0:
        return {}
    return completed_steps(run, run.attempt_number)


def source_output(reused_from: dict[str, Any]) -> Any:
    """The output a reused step takes: its source step's."""
    return Step.objects.filter(pk=reused_from["step"]).values_list("output", flat=True).first()


# --------------------------------------------------------------------------- the cache
def cache_hit(
    *, organization_id: Any, tool: str, key: str, ttl_ms: int
) -> tuple[Any, dict[str, Any]] | None:
    """The newest completed step of the organization with ``tool`` and ``key``, younger
    than ``ttl_ms``: (its output, ``{"run": ID, "step": ID}``); None when there is none."""
    if len(key) > CACHE_KEY_MAX_LENGTH:
        return None
    since = timezone.now() - timedelta(milliseconds=ttl_ms)
    found = (
        StepCacheEntry.objects.filter(
            organization_id=organization_id,
            key=key,
            tool=tool,
            created_at__gte=since,
            step__status=StepStatus.COMPLETED,
        )
        .order_by("-created_at")
        .values_list("run_id", "step_id", "step__output")
        .first()
    )
    if found is None:
        return None
    run_id, step_id, output = found
    return output, {"run": str(run_id), "step": step_id}


def cache_add(*, organization_id: Any, run_id: Any, step_id: int, tool: str, key: str) -> None:
    """A step that ran its tool and completed answers later steps of its key. Its output
    is read from the step when it answers, so an entry of a step that did not complete
    (a charge beyond the reservation) answers nothing."""
    if len(key) > CACHE_KEY_MAX_LENGTH:
        return
    StepCacheEntry.objects.create(
        organization_id=organization_id, run_id=run_id, step_id=step_id, tool=tool, key=key
    )


@transaction.atomic
def cache_invalidate(*, organization: Organization, key: str) -> int:
    """Drop the organization's entries of ``key`` (every tool); how many there were."""
    deleted, _ = StepCacheEntry.objects.filter(organization=organization, key=key).delete()
    return deleted
