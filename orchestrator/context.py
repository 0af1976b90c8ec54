"""What `${...}` templates and `when` conditions read while a step runs.

References were checked against the plan when it was submitted (runs/plan/); here
they are resolved against the database, lazily: a step that reads nothing costs no
query, one that reads `${steps.fetch.output.body}` costs one.

`${secrets.NAME}` is decrypted here, on the worker, just before the tool runs, from the
run's organization's secrets; the values handed out are kept (``secrets_used``) so that
the executor can redact them from whatever the attempt leaves behind.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from billing.secrets import SecretUnreadable, secret_values
from common.templates import (
    Reference,
    UnresolvedReference,
    format_reference,
    render_value,
    resolve_in,
)
from runs.models import Run, Step, Task
from runs.waits.children import child_summary

STEP_FIELDS = ("output", "status", "error", "attempts", "cost")


class StepContext:
    """Resolver for one step attempt's references (variables, run, step, steps, tasks,
    error, secrets)."""

    def __init__(
        self, step: Step, run_id: Any, attempt: int | None = None, callback_url: str = ""
    ) -> None:
        self.step = step
        self.callback_url = callback_url
        self.run_id = run_id
        # The attempt being run: the claim has set step.attempts to it already.
        self.attempt = step.attempts if attempt is None else attempt
        self._run: Run | None = None
        # name -> value of every secret resolved for this attempt, to be redacted.
        self.secrets_used: dict[str, str] = {}

    def without_secrets(self, where: str) -> Callable[[Reference], Any]:
        """This resolver with ``secrets`` refused: what ``where`` renders is stored and
        shown (a cache key, a rate limit's key, a wait's time), or a condition, whose
        error message must not quote a value (runs/plan/ refuses secrets in all of them;
        this holds for a plan it did not check)."""

        def resolve(ref: Reference) -> Any:
            if ref[0] == "secrets":
                raise UnresolvedReference(f"secrets cannot be used in {where}", ref)
            return self(ref)

        return resolve

    def _get_run(self) -> Run:
        if self._run is None:
            self._run = Run.objects.only(
                "id", "name", "attempt_number", "priority", "variables", "organization_id"
            ).get(pk=self.run_id)
        return self._run

    def _secret(self, rest: Reference) -> str:
        # runs/plan/ allows exactly `secrets.NAME`; anything else names no secret.
        if len(rest) != 1 or not isinstance(rest[0], str):
            shown = format_reference(("secrets", *rest))
            raise UnresolvedReference(f"cannot resolve {shown}: use secrets.NAME")
        name = rest[0]
        if name not in self.secrets_used:
            organization_id = self._get_run().organization_id
            try:
                found = secret_values(organization_id=organization_id, names=[name])
            except SecretUnreadable as exc:
                raise UnresolvedReference(str(exc)) from None
            if name not in found:
                raise UnresolvedReference(f"unknown secret {name!r}: the organization has none")
            self.secrets_used[name] = found[name]
        return self.secrets_used[name]

    def _step_values(self, task_id: int, generation: int, name: str) -> dict[str, Any]:
        row = (
            Step.objects.filter(task_id=task_id, generation=generation, name=name)
            .values(*STEP_FIELDS)
            .first()
        )
        if row is None:
            raise UnresolvedReference(f"step {name!r} not found")
        row["cost"] = str(row["cost"])
        return dict(row)

    def _callback(self) -> dict[str, Any]:
        """A callback step's URL, or, in an on_callback handler, how the child run of
        the step it belongs to ended."""
        if self.callback_url:
            return {"url": self.callback_url}
        if self.step.callback_for_id is None:
            raise UnresolvedReference("no callback: not a callback step or on_callback handler")
        child = Run.objects.filter(
            parent_step_id=self.step.callback_for_id, parent_notified_at__isnull=False
        ).first()
        if child is None:
            raise UnresolvedReference("the child run of this on_callback handler has not ended")
        return child_summary(child)

    def __call__(self, ref: Reference) -> Any:
        root, rest = ref[0], ref[1:]
        if root == "variables":
            return resolve_in(self._get_run().variables, rest)
        if root == "run":
            run = self._get_run()
            fields = {
                "id": str(run.pk),
                "name": run.name,
                "attempt": run.attempt_number,
                "priority": run.priority,
            }
            return resolve_in(fields, rest)
        if root == "step":
            current = {"id": self.step.pk, "name": self.step.name, "attempt": self.attempt}
            return resolve_in(current, rest)
        if root == "secrets":
            return self._secret(rest)
        if root == "error":
            original = self.step.handler_for
            if original is None or not original.error:
                raise UnresolvedReference("no error: not an on_error handler")
            fields = {**original.error, "step": original.name}
            return resolve_in(fields, rest)
        if root == "callback":
            return resolve_in(self._callback(), rest)
        if root == "steps":
            values = self._step_values(self.step.task_id, self.step.generation, str(rest[0]))
            return resolve_in(values, rest[1:])
        if root == "tasks":
            task = self.step.task
            sibling = (
                Task.objects.filter(agent_id=task.agent_id, name=str(rest[0]))
                .order_by("-generation")
                .values("id", "status", "retry_count")
                .first()
            )
            if sibling is None:
                raise UnresolvedReference(f"task {rest[0]!r} not found")
            if rest[1] == "status":
                return resolve_in({"status": sibling["status"]}, rest[1:])
            values = self._step_values(sibling["id"], sibling["retry_count"], str(rest[2]))
            return resolve_in(values, rest[3:])
        raise UnresolvedReference(f"cannot resolve {format_reference(ref)}")


def render_params(params: dict[str, Any], verbatim: frozenset[str], context: StepContext) -> Any:
    """A step's parameters with their templates rendered, but for those its tool takes
    as written (a child run's plan, a poll's conditions)."""
    if not verbatim:
        return render_value(params, context)
    rendered = render_value({k: v for k, v in params.items() if k not in verbatim}, context)
    return {**rendered, **{k: params[k] for k in verbatim if k in params}}
