"""The hot path: a plain step completion recorded by one call of a database function.

Most step outcomes are the plainest case: the attempt succeeded, the step is not an
on_error handler, and nothing above its agent changes. The general path
(``outcomes._record``) spends ten to twenty-five ORM statements on it. Here it is one
call of ``runs.step_completed`` (``runs/sql/step_completed.sql``, which reads as
the path of one step: the locks, the shape, the charge, the next claim), in its own
transaction: no round trip to the worker while a lock is held. With 32 worker processes
on two cores, a lock held across round trips was often held by a process waiting for a
CPU (docs/engine.md). The function changes exactly what the general path would, and only
when it is sure to; otherwise it writes nothing and the caller takes the general path.
The same goes for a run just picked up (``start``: ``runs.run_begin``).
``tests/runs/engine/test_hotpath.py`` plays plans with the hot path on and off and
compares everything they leave behind.
"""

from __future__ import annotations

import dataclasses
import json
import uuid
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Any

from django.db import connection

from billing.services import to_credits
from runs.admission.fairness import Choice
from runs.engine.dispatch import DISPATCHED
from runs.models import Run
from runs.states import is_allowed
from runs.transitions import claimed_from_json

if not is_allowed("step", "running", "completed"):
    raise RuntimeError("runs.states no longer allows step running -> completed; fix the hot path")

_COMPLETE_SQL = (
    "SELECT * FROM runs.step_completed(%(step)s, %(attempt)s, %(run)s, %(output)s, "
    "%(cost)s, %(cost_text)s, %(amount)s, %(claim)s, %(worker)s, %(task_id)s, %(lease)s, "
    "%(choose)s, %(me)s, %(full)s::uuid[], %(skip)s::uuid[], %(held)s, %(batch)s)"
)


@dataclass(frozen=True)
class Completed:
    """What the recording did: the steps it dispatched, as the columns
    ``dispatch.step_from_row`` takes, and the run's priority to announce them with."""

    dispatched: list[dict[str, Any]]
    priority: int
    # It completed the run itself (its last step).
    run_finished: bool = False


@dataclass(frozen=True)
class Choose:
    """A worker's fair choice made with the recording (``fairness.next_run``'s terms:
    its slot's holder name, the organizations and runs it leaves out, the organization
    of the slot it holds)."""

    me: str
    full: frozenset[Any]
    skip: frozenset[Any]
    held: Any


@dataclass(frozen=True)
class Claim:
    """Who claims the next step with the recording (``claim_next_step``'s terms): the
    run's, or with ``choose`` that of the run its fair choice gives; ``batch``: up to that
    many of the run's next steps at once (runs.step_claim's batch)."""

    worker: str
    task_id: str
    lease_seconds: float
    choose: Choose | None = None
    batch: int = 1


@dataclass(frozen=True)
class Next:
    """What the recording claimed for the worker (``claim_next_step``'s fields), and the
    choice it made when asked to (None: not asked; a Choice whose run is None: nothing
    ready that the worker may take). ``held``: the rest of a batch, after ``claimed``, in
    plan order. ``running``: the hot path recorded the step, so the run was RUNNING then
    (steps the worker holds may start, as a step claimed with the recording does).
    ``waited``: the seconds the hot path's recording waited for its locks (None: it did
    not record, or asked to claim and claimed nothing)."""

    claimed: dict[str, Any] | None = None
    chosen: Choice | None = None
    held: tuple[dict[str, Any], ...] = ()
    running: bool = False
    waited: float | None = None


def eligible(error: object, skipped: bool, cost: Decimal) -> bool:
    """Whether the outcome may take the hot path at all (the function checks the rest:
    the run RUNNING with no approval waiting, the step running this attempt, and so on).
    A negative cost is left to the general path, where credits_charge refuses it."""
    return error is None and not skipped and cost >= 0


def complete(
    run_id: Any,
    step_id: int,
    attempt: int,
    *,
    output: Any,
    cost: Decimal,
    claim: Claim | None = None,
) -> tuple[Completed | None, Next]:
    """Complete ``step_id``'s ``attempt`` and advance its run, in one call of
    ``runs.step_completed`` (in the caller's transaction, or its own).

    Returns what it recorded, None when the step is not the plain case or not running
    this attempt (nothing was written: the general path decides), and, with ``claim``,
    what it claimed and chose for that worker (``Next``; nothing when the step was no
    longer running this attempt)."""
    choose = claim.choose if claim is not None else None
    with connection.cursor() as cursor:
        cursor.execute(
            _COMPLETE_SQL,
            {
                "step": step_id,
                "attempt": attempt,
                "run": run_id,
                # None is SQL NULL, as the ORM stores it, not a JSON null.
                "output": None if output is None else json.dumps(output),
                "cost": cost,
                "cost_text": str(cost),
                "amount": to_credits(cost),
                "claim": claim is not None,
                "worker": claim.worker if claim else "",
                "task_id": claim.task_id if claim else "",
                "lease": claim.lease_seconds if claim else 0.0,
                "choose": choose is not None,
                "me": choose.me if choose else "",
                "full": list(choose.full) if choose else [],
                "skip": list(choose.skip) if choose else [],
                "held": choose.held if choose else None,
                "batch": claim.batch if claim else 1,
            },
        )
        rows = cursor.fetchall()
    chosen, recorded, waited = None, [], None
    batch: list[dict[str, Any]] = []
    for row in rows:
        if row[0] == "claimed":
            batch.append(claimed_from_json(row[9]))
            waited = float(batch[-1].get("waited") or 0.0)
        elif row[0] == "waited":
            extra = json.loads(row[9]) if isinstance(row[9], str) else row[9]
            waited = float(extra["waited"] or 0.0)
        elif row[0] == "chosen":
            extra = json.loads(row[9]) if isinstance(row[9], str) else row[9]
            organization = extra["organization_id"]
            chosen = Choice(
                run_id=row[6],
                organization_id=uuid.UUID(organization) if organization else None,
                priority=int(row[1] or 0),
                pickup=bool(extra["pickup"]),
                busy=int(extra.get("busy") or 0),
            )
        else:
            recorded.append(row)
    claimed = batch[0] if batch else None
    if chosen is not None and claimed is not None:
        # Claimed from the chosen run, or (nothing claimable before the recording) from
        # this one after it: then the worker goes on with this run, and chooses again
        # after its next step.
        if claimed["run_id"] == chosen.run_id:
            chosen = dataclasses.replace(chosen, claimed=claimed)
        else:
            chosen = None
    after = Next(claimed, chosen, tuple(batch[1:]), bool(recorded), waited)
    if not recorded:
        return None, after
    dispatched = [dict(zip(DISPATCHED, row[3:9], strict=True)) for row in recorded if row[3]]
    shape = recorded[0][0]
    return Completed(dispatched, int(recorded[0][1]), shape == "last_in_run"), after


@dataclass(frozen=True)
class Started:
    """What ``start`` did: how many agents started, and the steps it dispatched."""

    agents: int
    dispatched: list[dict[str, Any]]


def start(run: Run, now: datetime) -> Started | None:
    """Start the ready agents, tasks and steps of a run just picked up, in one call of
    ``runs.run_begin``; None when it is not that plain case (nothing was written): the
    caller dispatches the general way."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT * FROM runs.run_begin(%s, %s)", [run.pk, now])
        rows = cursor.fetchall()
    if not rows:
        return None
    dispatched = [dict(zip(DISPATCHED, row[1:], strict=True)) for row in rows if row[1] is not None]
    return Started(int(rows[0][0]), dispatched)
