"""The state machines of runs, agents, tasks and steps: one transition table each.

Every caller (API, admin, CLI, workers, sweeps) changes state through
``runs.transitions``, which consults these tables and nothing else. ``resuming ->
cancelled`` and ``retrying -> cancelled`` are there so that a run can be cancelled in
every non-terminal state.

Terminal states never change, with one exception: a FAILED run may go to RETRYING while
attempts remain (checked by the retry service, not by the table).
"""

from __future__ import annotations

from django.db import models


class RunStatus(models.TextChoices):
    CREATED = "created"
    PENDING = "pending"
    RUNNING = "running"
    WAITING_APPROVAL = "waiting_approval"
    PAUSED = "paused"
    RESUMING = "resuming"
    RETRYING = "retrying"
    ESCALATED = "escalated"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"


class NodeStatus(models.TextChoices):
    """States of agents and tasks."""

    PENDING = "pending"
    RUNNING = "running"
    PAUSED = "paused"
    COMPLETED = "completed"
    FAILED = "failed"
    SKIPPED = "skipped"
    CANCELLED = "cancelled"


class StepStatus(models.TextChoices):
    PENDING = "pending"
    RUNNING = "running"
    WAITING_APPROVAL = "waiting_approval"
    PAUSED = "paused"
    COMPLETED = "completed"
    FAILED = "failed"
    SKIPPED = "skipped"
    CANCELLED = "cancelled"


R, N, S = RunStatus, NodeStatus, StepStatus

RUN_TRANSITIONS: dict[str, frozenset[str]] = {
    R.CREATED: frozenset({R.PENDING, R.CANCELLED}),
    R.PENDING: frozenset({R.RUNNING, R.CANCELLED, R.FAILED}),
    R.RUNNING: frozenset(
        {R.COMPLETED, R.FAILED, R.PAUSED, R.WAITING_APPROVAL, R.ESCALATED, R.CANCELLED}
    ),
    R.WAITING_APPROVAL: frozenset({R.RUNNING, R.FAILED, R.CANCELLED}),
    # paused -> failed: a step that was running when the pause came failed for good
    # meanwhile, and the run's failure mode (fail-fast) propagates it at once.
    R.PAUSED: frozenset({R.RESUMING, R.CANCELLED, R.FAILED}),
    R.RESUMING: frozenset({R.RUNNING, R.FAILED, R.CANCELLED}),
    R.FAILED: frozenset({R.RETRYING}),
    R.RETRYING: frozenset({R.PENDING, R.FAILED, R.CANCELLED}),
    R.ESCALATED: frozenset({R.RUNNING, R.FAILED, R.CANCELLED}),
    R.COMPLETED: frozenset(),
    R.CANCELLED: frozenset(),
}

# Agents and tasks. A child that fails for good under a parent whose failure mode is
# `continue` ends SKIPPED (its error kept), hence running -> skipped. pending -> failed:
# a run that fails (timeout, lost worker) fails the agents it had not started yet too,
# so that a FAILED run always has a FAILED agent (the invariant runs.state_consistency).
NODE_TRANSITIONS: dict[str, frozenset[str]] = {
    N.PENDING: frozenset({N.RUNNING, N.PAUSED, N.FAILED, N.SKIPPED, N.CANCELLED}),
    N.RUNNING: frozenset({N.COMPLETED, N.FAILED, N.SKIPPED, N.PAUSED, N.CANCELLED}),
    # paused -> completed/failed/skipped: the steps that were running when the pause came
    # finish and keep their results; the last of them finishes its task (and agent).
    N.PAUSED: frozenset({N.PENDING, N.CANCELLED, N.COMPLETED, N.FAILED, N.SKIPPED}),
    N.COMPLETED: frozenset(),
    N.FAILED: frozenset(),
    N.SKIPPED: frozenset(),
    N.CANCELLED: frozenset(),
}

# Steps. running -> pending is a retry with backoff or a reclaim of a lost lease; a
# running step is never paused (it finishes and keeps its result).
STEP_TRANSITIONS: dict[str, frozenset[str]] = {
    S.PENDING: frozenset({S.RUNNING, S.WAITING_APPROVAL, S.PAUSED, S.SKIPPED, S.CANCELLED}),
    S.RUNNING: frozenset({S.COMPLETED, S.FAILED, S.SKIPPED, S.PENDING, S.CANCELLED}),
    S.WAITING_APPROVAL: frozenset({S.COMPLETED, S.FAILED, S.CANCELLED}),
    S.PAUSED: frozenset({S.PENDING, S.CANCELLED}),
    S.COMPLETED: frozenset(),
    S.FAILED: frozenset(),
    S.SKIPPED: frozenset(),
    S.CANCELLED: frozenset(),
}

TABLES: dict[str, dict[str, frozenset[str]]] = {
    "run": RUN_TRANSITIONS,
    "agent": NODE_TRANSITIONS,
    "task": NODE_TRANSITIONS,
    "step": STEP_TRANSITIONS,
}

RUN_TERMINAL = frozenset({R.COMPLETED, R.FAILED, R.CANCELLED})
NODE_TERMINAL = frozenset({N.COMPLETED, N.FAILED, N.SKIPPED, N.CANCELLED})
# Agents and tasks not yet ended: what a cancellation or a failure closes.
NODE_OPEN = (N.PENDING, N.RUNNING, N.PAUSED)
STEP_TERMINAL = frozenset({S.COMPLETED, S.FAILED, S.SKIPPED, S.CANCELLED})
# Steps not yet ended, the same for steps (which may also wait for an approval).
STEP_OPEN = (S.PENDING, S.RUNNING, S.WAITING_APPROVAL, S.PAUSED)
TERMINAL: dict[str, frozenset[str]] = {
    "run": RUN_TERMINAL,
    "agent": NODE_TERMINAL,
    "task": NODE_TERMINAL,
    "step": STEP_TERMINAL,
}
# A run picked up and not yet ended: what an organization's limit of running runs counts
# (a paused or escalated run holds its place: it may go on at any moment).
RUN_STARTED = frozenset({R.RUNNING, R.WAITING_APPROVAL, R.PAUSED, R.RESUMING, R.ESCALATED})


class InvalidTransition(Exception):
    """A transition the table does not allow. The API answers 409 `invalid_transition`."""

    code = "invalid_transition"

    def __init__(self, entity: str, from_state: str, to_state: str, detail: str = "") -> None:
        self.entity = entity
        self.from_state = str(from_state)
        self.to_state = str(to_state)
        self.detail = detail
        message = f"{entity} cannot go from {self.from_state} to {self.to_state}"
        super().__init__(f"{message}: {detail}" if detail else message)


def is_allowed(entity: str, from_state: str, to_state: str) -> bool:
    return to_state in TABLES[entity][from_state]


def check_transition(entity: str, from_state: str, to_state: str) -> bool:
    """True if the state changes, False for a same-state no-op; raise if not allowed."""
    if from_state == to_state:
        return False
    if not is_allowed(entity, from_state, to_state):
        raise InvalidTransition(entity, from_state, to_state)
    return True
