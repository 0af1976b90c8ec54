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

Such a step's output is *borrowed* (its outcome's ``borrowed``: ``reused_from`` or
``cached_from``); the worker's side of the feature is ``orchestrator.asks``.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.db import transaction
from django.utils import timezone

from billing.models import Organization
from common.digests import keyed_digest
from common.queries import fetch
from runs.models import Run, Step, StepCacheEntry
from runs.plan.fields import CACHE_KEY_MAX_LENGTH
from runs.queries import QUERIES
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
# What the key of the inputs' digest is derived from SECRET_KEY for (common.digests).
INPUTS_PURPOSE = "runs.reuse.cache_inputs"


def cache_inputs(params: Any) -> str:
    """What a step's cache entry is kept under beside its key: the keyed digest of the
    step's rendered params, so that two steps of one key whose inputs differ never
    answer each other. Keyed (an HMAC from ``SECRET_KEY``), as params may hold a
    secret's value and the digest is stored."""
    return keyed_digest(INPUTS_PURPOSE, params)


def cache_hit(
    *, organization_id: Any, tool: str, key: str, inputs: str, ttl_ms: int
) -> tuple[Any, dict[str, Any]] | None:
    """The organization's entry of ``tool``, ``key`` and ``inputs`` ("" for a cache
    without inputs), younger than ``ttl_ms``, whose step completed: (its output,
    ``{"run": ID, "step": ID}``); None when there is none."""
    if len(key) > CACHE_KEY_MAX_LENGTH:
        return None
    since = timezone.now() - timedelta(milliseconds=ttl_ms)
    found = (
        StepCacheEntry.objects.filter(
            organization_id=organization_id,
            key=key,
            tool=tool,
            inputs=inputs,
            created_at__gte=since,
            step__status=StepStatus.COMPLETED,
        )
        .values_list("run_id", "step_id", "step__output")
        .first()
    )
    if found is None:
        return None
    run_id, step_id, output = found
    return output, {"run": str(run_id), "step": step_id}


def cache_add(
    *, organization_id: Any, run_id: Any, step_id: int, tool: str, key: str, inputs: str
) -> None:
    """A step that ran its tool and completed answers later steps of its key and inputs,
    in place of the entry that did (one entry per organization, tool, key and inputs:
    an upsert, runs/queries/step_cache_put.sql, so that misses do not pile up rows). Its
    output is read from the step when it answers, so an entry of a step that did not
    complete (a charge beyond the reservation) answers nothing."""
    if len(key) > CACHE_KEY_MAX_LENGTH:
        return
    entry = {
        "organization": organization_id,
        "key": key,
        "tool": tool,
        "inputs": inputs,
        "run": run_id,
        "step": step_id,
        "now": timezone.now(),
    }
    fetch(QUERIES["step_cache_put"], entry)


@transaction.atomic
def cache_invalidate(*, organization: Organization, key: str) -> int:
    """Drop the organization's entries of ``key`` (every tool, whatever their inputs);
    how many there were."""
    deleted, _ = StepCacheEntry.objects.filter(organization=organization, key=key).delete()
    return deleted
