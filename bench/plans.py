"""The plans the benchmark's engine scenarios run (bench/scenarios.py), built as a
client writes them, and their sizes."""

from __future__ import annotations

import random
from typing import Any

# fan_20000: 20,000 steps, the most a run may have (PLAN_MAX_STEPS_PER_RUN, default
# 20,000), so 19,999 parallel steps and the join; at most 5,000 of them per task
# (PLAN_MAX_STEPS_PER_TASK; a task's max_concurrent_steps stops at 10,000 anyway).
WIDE_FAN_WIDTH = 19_999
WIDE_FAN_PER_TASK = 5_000
# fan_sleep / group_sleep: this many steps (tasks) that each sleep this long, so that a
# run's parallelism, not the engine's cost per step, is what is measured; efficiency =
# the ideal wall (width x seconds / the fleet's worker slots) / the measured wall.
SLEEP_WIDTH = 2_000
SLEEP_S = 0.05


# fan_2000_tool: fan_2000's steps run this decorated no-op tool of the fleet
# (bench/fleet_tools.py) instead of the built-in `noop`.
FLEET_NOOP = "bench.fleet_noop"


def _noop(name: str, tool: str = "noop") -> dict[str, Any]:
    return {"name": name, "tool": tool}


def sequential_plan(steps: int) -> dict[str, Any]:
    """One agent, one task, ``steps`` no-op steps one after another."""
    return {
        "name": f"bench-seq-{steps}",
        "agents": [
            {
                "name": "agent",
                "mode": "sequential",
                "tasks": [
                    {
                        "name": "task",
                        "mode": "sequential",
                        "steps": [_noop(f"s{i}") for i in range(steps)],
                    }
                ],
            }
        ],
    }


def fan_plan(width: int, tool: str = "noop") -> dict[str, Any]:
    """``width`` parallel no-op steps, all allowed at once, then one join step, each of
    the no-op ``tool``."""
    return {
        "name": f"bench-fan-{width}",
        "agents": [
            {
                "name": "agent",
                "mode": "sequential",
                "tasks": [
                    {
                        "name": "fan",
                        "mode": "parallel",
                        "max_concurrent_steps": width,
                        "steps": [_noop(f"s{i}", tool) for i in range(width)],
                    },
                    {"name": "join", "steps": [_noop("join", tool)]},
                ],
            }
        ],
    }


def sleep_fan_plan(width: int = SLEEP_WIDTH, seconds: float = SLEEP_S) -> dict[str, Any]:
    """``fan_plan`` whose parallel steps each sleep ``seconds`` (the ``sleep`` tool)."""
    plan = fan_plan(width)
    plan["name"] = f"bench-fan-sleep-{width}"
    plan["agents"][0]["tasks"][0]["steps"] = [
        {"name": f"s{i}", "tool": "sleep", "params": {"seconds": seconds}} for i in range(width)
    ]
    return plan


def wide_fan_plan(width: int, per_task: int = WIDE_FAN_PER_TASK) -> dict[str, Any]:
    """``width`` parallel no-op steps, all allowed at once, then one join step: the
    fan of ``fan_plan`` split into parallel tasks of at most ``per_task`` steps (the
    plan limits refuse a task of more than 5,000 steps, or a ``max_concurrent_steps``
    above 10,000), which a dag agent runs at once; the join task depends on them all.
    """
    tasks: list[dict[str, Any]] = []
    for index, first in enumerate(range(0, width, per_task)):
        size = min(per_task, width - first)
        tasks.append(
            {
                "name": f"fan{index}",
                "mode": "parallel",
                "max_concurrent_steps": size,
                "steps": [_noop(f"s{i}") for i in range(first, first + size)],
            }
        )
    fans = [task["name"] for task in tasks]
    tasks.append({"name": "join", "depends_on": fans, "steps": [_noop("join")]})
    return {
        "name": f"bench-wide-fan-{width}",
        "agents": [
            {"name": "agent", "mode": "dag", "max_concurrent_tasks": len(tasks), "tasks": tasks}
        ],
    }


def dag_edges(nodes: int, seed: int = 42, fan_in: int = 3) -> list[list[int]]:
    """For each node, up to ``fan_in`` distinct earlier nodes: acyclic by construction."""
    rng = random.Random(seed)  # noqa: S311 - a reproducible graph, not a secret
    return [sorted(rng.sample(range(i), min(fan_in, i))) for i in range(nodes)]


def dag_plan(nodes: int, seed: int = 42) -> dict[str, Any]:
    """One agent in dag mode: ``nodes`` one-step tasks wired by ``dag_edges``."""
    tasks: list[dict[str, Any]] = []
    for i, deps in enumerate(dag_edges(nodes, seed)):
        task: dict[str, Any] = {"name": f"t{i}", "steps": [_noop("s")]}
        if deps:
            task["depends_on"] = [f"t{d}" for d in deps]
        tasks.append(task)
    return {
        "name": f"bench-dag-{nodes}",
        "agents": [{"name": "agent", "mode": "dag", "max_concurrent_tasks": nodes, "tasks": tasks}],
    }
