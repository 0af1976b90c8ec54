"""The levels alike: a run's agents, an agent's tasks and a task's steps are each a
parent's children, counted and finished the same way."""

from __future__ import annotations

from typing import Any

from runs.models import Agent, Run, Step, Task

MAX_LEVEL_RETRIES = 3  # a task, agent or run is retried as a whole at most 3 times


def model_of(node: Run | Agent | Task | Step) -> Any:
    """The node's model class, typed loosely: the engine treats the levels alike."""
    return type(node)
