"""What the admin's actions share: the refusals an operator reads, who acts, and the run
page's control actions (each the API's service, with the operator as the actor)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from django.http import HttpRequest

from billing.services import InsufficientCredits
from runs import admission, approvals, escalations, services
from runs.models import Run
from runs.states import RUN_TRANSITIONS, InvalidTransition, RunStatus

# What the services refuse for a reason an operator should read (not a crash): shown as
# the admin's error message, the run untouched.
REFUSALS: tuple[type[Exception], ...] = (
    InvalidTransition,
    services.AttemptsExhausted,
    services.RunDeleted,
    InsufficientCredits,
    escalations.EscalationNotFound,
    escalations.EscalationResolved,
    escalations.ReplanLimitReached,
    admission.TooManyPendingRuns,
    approvals.NothingWaiting,
    services.StepNotFound,
)


def actor_of(request: HttpRequest) -> str:
    return f"admin:{request.user.get_username()}"


@dataclass(frozen=True)
class Control:
    """One of the run page's control actions: what the button and the confirmation say,
    and the service it calls (the API's, with the operator as the actor)."""

    verb: str
    question: str
    perform: Callable[[Run, str, int | None, str], Any]
    takes_step: bool = False


def _cancel(run: Run, actor: str, step_id: int | None, comment: str) -> Any:
    reason = comment or f"cancelled by {actor}"
    return services.run_cancel(run_id=run.pk, reason=reason, actor=actor)


def _decision(approve: bool) -> Callable[[Run, str, int | None, str], Any]:
    decide = approvals.run_approve if approve else approvals.run_reject

    def perform(run: Run, actor: str, step_id: int | None, comment: str) -> Any:
        result = decide(
            run_id=run.pk, step_id=step_id, comment=comment or f"by {actor} in the admin",
            actor=actor,
        )  # fmt: skip
        if not result.changed:
            raise approvals.NothingWaiting(f"no step of {run.pk} waits for approval")
        return result

    return perform


def offered(run: Run, waiting: bool) -> set[str]:
    """The controls the run's state machine allows now (the page offers only these; the
    services still decide, a stale page is refused with the reason)."""
    allowed = RUN_TRANSITIONS.get(run.status, frozenset())
    offered = {
        name
        for name, target in (
            ("cancel", RunStatus.CANCELLED),
            ("pause", RunStatus.PAUSED),
            ("resume", RunStatus.RESUMING),
            ("retry", RunStatus.RETRYING),
        )
        if target in allowed
    }
    return offered | ({"approve", "reject"} if waiting else set())


CONTROLS: dict[str, Control] = {
    "cancel": Control("Cancel", "Cancel this run? Running steps are stopped.", _cancel),
    "pause": Control(
        "Pause",
        "Pause this run? Running steps finish; nothing new starts.",
        lambda run, actor, _s, _c: services.run_pause(run_id=run.pk, actor=actor),
    ),
    "resume": Control(
        "Resume",
        "Resume this run?",
        lambda run, actor, _s, _c: services.run_resume(run_id=run.pk, actor=actor),
    ),
    "retry": Control(
        "Retry",
        "Retry this run as a new attempt? Credits are reserved again.",
        lambda run, actor, _s, _c: services.run_retry(run_id=run.pk, actor=actor),
    ),
    "approve": Control("Approve", "Approve", _decision(True), takes_step=True),
    "reject": Control("Reject", "Reject", _decision(False), takes_step=True),
}
