"""Child processes for race tests, started with the `spawn` method.

A forked child inherits the test process's threads and locks (the Celery app's, the
logging module's) in whatever state they were, and can hang on them; a spawned child
starts clean, sets Django up against the test database, and runs one side of the race.
This module imports nothing from Django at import time for that reason.
"""

from __future__ import annotations

import os
from typing import Any


def contender(
    database_url: str, operation: str, run_ids: list[str], barrier: Any, results: Any
) -> None:
    os.environ["DATABASE_URL"] = database_url
    os.environ["DJANGO_SETTINGS_MODULE"] = "config.settings.test"
    import django

    django.setup()
    from django.conf import settings
    from django.db import connections

    from runs.states import InvalidTransition

    settings.ORCHESTRATOR_DISPATCH_ENABLED = False
    do = OPERATIONS[operation]
    outcomes = []
    try:
        for run_id in run_ids:
            barrier.wait()
            try:
                # An operation may say it lost (False) without raising, or name its
                # outcome.
                said = do(run_id)
                if not isinstance(said, str):
                    said = "refused" if said is False else "won"
                outcomes.append(said)
            except InvalidTransition:
                outcomes.append("refused")
    finally:
        connections.close_all()
        results.put((operation, outcomes))


def _complete(run_id: str) -> None:
    from django.db import transaction

    from runs import services
    from tests.factories import finish_all_work

    # As the engine does: the last piece of work and the run finish in one transaction,
    # which takes the run's lock first (the lock order is run -> agent -> task -> step).
    with transaction.atomic():
        run = services.lock_run(run_id)
        finish_all_work(run)
        services.run_complete(run_id=run_id)


def _fail(run_id: str) -> None:
    from runs import services

    services.run_fail(run_id=run_id, code="tool_error", message="lost the race?")


def _start(run_id: str) -> None:
    from runs.engine.start import run_start

    run_start(run_id=run_id)


def _cancel(run_id: str) -> None:
    from runs import services

    services.run_cancel(run_id=run_id, reason="race")


def _start_admitted(pair: str, side: int) -> bool:
    """Start one run of the pair: was it admitted at once?"""
    from runs.engine.start import run_start

    return run_start(run_id=pair.split("|")[side]).admitted_at is not None


def _start_outcome(run_id: str) -> str:
    """Start the run as a client would: what came of it (running, waiting, or the code
    of the refusal)."""
    from billing.services import InsufficientCredits
    from runs.admission import TooManyPendingRuns
    from runs.engine.start import run_start

    try:
        run = run_start(run_id=run_id)
    except (TooManyPendingRuns, InsufficientCredits) as refused:
        return refused.code
    return "running" if run.status == "running" else "waiting"


def _take_slot(organization_id: str) -> bool:
    from runs import fairness

    return fairness.acquire_slot(organization_id, f"taker-{os.getpid()}") is not None


def _free_and_take_slot(organization_id: str) -> bool:
    """Let the slot held by "leaving" go, then take one: as a worker that finished a
    step and starts the next while another worker takes a slot."""
    from runs import fairness
    from runs.models import StepSlot

    leaving = StepSlot.objects.get(organization_id=organization_id, holder="leaving")
    fairness.release_slot(fairness.Slot(leaving.pk, organization_id, leaving.slot, "leaving"))
    return fairness.acquire_slot(organization_id, f"taker-{os.getpid()}") is not None


def _record(step_name: str) -> Any:
    """Record the claimed step ``step_name`` of the run as completed, as its worker does
    (the hot path's function, or the general path where that declines)."""

    def record(run_id: str) -> bool:
        from decimal import Decimal

        from runs.engine.outcomes import Outcome, record
        from runs.models import Step

        step = Step.objects.get(run_id=run_id, name=step_name)
        return record(step.pk, run_id, step.attempts, Outcome({"by": step_name}, Decimal("0.01")))

    return record


def _record_and_claim(step_name: str) -> Any:
    """``_record``, with the worker's next step of the run claimed in the same call."""

    def record(run_id: str) -> bool:
        from decimal import Decimal

        from runs.engine import hotpath
        from runs.engine.outcomes import Outcome, record_and_claim
        from runs.models import Step

        step = Step.objects.get(run_id=run_id, name=step_name)
        claim = hotpath.Claim(worker=f"w-{step_name}", task_id=step_name, lease_seconds=600)
        outcome = Outcome({"by": step_name}, Decimal("0.01"))
        return record_and_claim(step.pk, run_id, step.attempts, outcome, claim)[0]

    return record


def _record_and_claim_batch(step_name: str) -> Any:
    """``_record_and_claim``, claiming up to four of the run's next steps at once (a
    server's batch)."""

    def record(run_id: str) -> bool:
        from decimal import Decimal

        from runs.engine import hotpath
        from runs.engine.outcomes import Outcome, record_and_claim
        from runs.models import Step

        step = Step.objects.get(run_id=run_id, name=step_name)
        claim = hotpath.Claim(f"w-{step_name}", step_name, 600, batch=4)
        outcome = Outcome({"by": step_name}, Decimal("0.01"))
        return record_and_claim(step.pk, run_id, step.attempts, outcome, claim)[0]

    return record


def _hand_back(run_id: str) -> bool:
    """Hand back the steps the worker "held" claimed and did not start (as a server
    that stops with a batch in hand): whether any became claimable."""
    from runs.models import Step
    from runs.transitions import hand_back_steps

    held = Step.objects.filter(run_id=run_id, status="running", worker="held")
    steps = list(held.values_list("pk", "attempts"))
    return hand_back_steps(run_id, steps, actor="held") > 0


def _pause(run_id: str) -> None:
    from runs import services

    services.run_pause(run_id=run_id, actor="race")


OPERATIONS = {
    "record_a": _record("a"),
    "record_b": _record("b"),
    "record_a_claiming": _record_and_claim("a"),
    "record_b_claiming": _record_and_claim("b"),
    "record_a_batch": _record_and_claim_batch("a"),
    "record_b_batch": _record_and_claim_batch("b"),
    "hand_back": _hand_back,
    "pause": _pause,
    "complete": _complete,
    "fail": _fail,
    "start": _start,
    "cancel": _cancel,
    "start_left": lambda pair: _start_admitted(pair, 0),
    "start_right": lambda pair: _start_admitted(pair, 1),
    "start_outcome": _start_outcome,
    "take_slot": _take_slot,
    "take_slot_too": _take_slot,
    "free_and_take_slot": _free_and_take_slot,
}
