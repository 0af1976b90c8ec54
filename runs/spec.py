"""The run specification: its schema, its validator, and the normalised plan.

``parse_plan(data)`` checks a submitted plan completely before anything is stored or
reserved and reports *every* problem at once, each with its path
(``agents[0].tasks[1].depends_on[0]: unknown task 'gahter'``). It refuses unknown
fields (a typo must not be silently ignored), unknown tools, duplicate names, dangling
dependencies, cycles, malformed durations, templates and conditions, references to work
that cannot have finished yet, and plans over the size limits in settings.

Whatever JSON-like value it is given, ``parse_plan`` either returns a plan or raises
``PlanInvalid``: a wrong type anywhere is a reported problem, never a crash.

On success it returns a :class:`Plan` with every default filled in; the stored
specification stays exactly as submitted, and the plan is derived from it again when a
worker materialises the run.
"""

from __future__ import annotations

import difflib
import json
import math
import re
from collections.abc import Collection, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from typing import Any

from django.conf import settings

from billing.models import SECRET_NAME_RE
from common.errors import ERROR_CODES, RETRYABLE_CODES
from common.expressions import Expression, ExpressionError
from common.templates import (
    Reference,
    Template,
    TemplateError,
    format_reference,
    json_type_name,
)
from common.text import text_problem
from common.tools import registry
from common.tools.registry import WAITING_TOOLS, tool_names

NAME_MAX_LENGTH = 100
RUN_NAME_MAX_LENGTH = 200
NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
# At most 15 integer digits: anything longer is no duration, and must not cost a huge
# number conversion to refuse.
DURATION_RE = re.compile(r"\s*([0-9]{1,15}(?:\.[0-9]{1,9})?)\s*(ms|s|m|h|d)\s*")
DURATION_UNITS_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
# No timeout may exceed this: larger values overflow date arithmetic further on.
MAX_DURATION_MS = 365 * DURATION_UNITS_MS["d"]
# Credits are stored as DECIMAL(18, 6): at most 12 integer digits and 6 decimals.
CREDITS_RE = re.compile(r"[0-9]+(?:\.[0-9]+)?")
MAX_CREDITS = Decimal(10**12)
CREDITS_QUANTUM = Decimal("0.000001")
FAILURE_MODES = ("fail-fast", "continue", "retry")
MODES = ("sequential", "parallel", "dag")
BACKOFFS = ("fixed", "linear", "exponential")
TIMEOUT_KEYS = ("run", "agent", "task", "step", "pending", "paused", "resuming", "retrying")
STEP_OUTPUT_FIELDS = ("output", "status", "error", "attempts", "cost")
RUN_FIELDS = ("id", "name", "attempt", "priority")
# The step being executed: e.g. an idempotency key `${run.id}-${step.id}-${step.attempt}`
# for an external service, so that a retried attempt is recognised there.
CURRENT_STEP_FIELDS = ("id", "name", "attempt")
ERROR_FIELDS = ("code", "message", "step", "retryable")

RUN_KEYS = (
    "name",
    "priority",
    "failure_mode",
    "mode",
    "max_attempts",
    "credits",
    "variables",
    "timeouts",
    "max_agents",
    "agents",
)
AGENT_KEYS = (
    "name",
    "mode",
    "failure_mode",
    "max_concurrent_tasks",
    "depends_on",
    "timeout",
    "tasks",
)
TASK_KEYS = (
    "name",
    "mode",
    "failure_mode",
    "max_concurrent_steps",
    "depends_on",
    "timeout",
    "steps",
)
STEP_KEYS = ("name", "tool", "params", "when", "retry", "timeout", "depends_on", "on_error")
# Handlers run one after another once their step has failed for good: no dependencies,
# no handlers of their own.
HANDLER_KEYS = ("name", "tool", "params", "when", "retry", "timeout")
RETRY_KEYS = (
    "max_attempts",
    "max_failures",
    "backoff",
    "base_delay_ms",
    "max_delay_ms",
    "multiplier",
    "jitter",
    "retry_on",
)


@dataclass(frozen=True)
class Limits:
    max_spec_bytes: int
    max_agents: int
    max_tasks_per_agent: int
    max_steps_per_task: int
    max_steps_per_run: int
    max_on_error: int
    max_json_depth: int
    max_variables_bytes: int
    max_retry_attempts: int
    max_step_timeout_ms: int

    @classmethod
    def from_settings(cls) -> Limits:
        return cls(**settings.ORCHESTRATOR_PLAN_LIMITS)


@dataclass(frozen=True)
class PlanError:
    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}" if self.path else self.message


class PlanInvalid(Exception):
    """The plan has problems; ``errors`` lists all of them. API: 400 `invalid_plan`."""

    code = "invalid_plan"

    def __init__(self, errors: list[PlanError]) -> None:
        self.errors = errors
        super().__init__("; ".join(str(error) for error in errors))


@dataclass(frozen=True)
class RetryPolicy:
    max_attempts: int = 3
    max_failures: int = 3
    backoff: str = "exponential"
    base_delay_ms: int = 100
    max_delay_ms: int = 30_000
    multiplier: float = 2.0
    jitter: float = 0.1
    retry_on: tuple[str, ...] = ()  # empty: every retryable code

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RetryPolicy:
        """The policy a step row stores (``as_dict``); a key it lacks takes the plan's
        default, so there is one set of defaults (these fields)."""
        known = {name: data[name] for name in cls.__dataclass_fields__ if name in data}
        known["retry_on"] = tuple(known.get("retry_on", ()))
        if "max_failures" not in known and "max_attempts" in known:
            known["max_failures"] = known["max_attempts"]  # as the validator defaults it
        return cls(**known)

    def as_dict(self) -> dict[str, Any]:
        return {
            "max_attempts": self.max_attempts,
            "max_failures": self.max_failures,
            "backoff": self.backoff,
            "base_delay_ms": self.base_delay_ms,
            "max_delay_ms": self.max_delay_ms,
            "multiplier": self.multiplier,
            "jitter": self.jitter,
            "retry_on": list(self.retry_on),
        }


@dataclass(frozen=True)
class StepPlan:
    name: str
    tool: str
    params: dict[str, Any]
    when: str
    retry: RetryPolicy
    timeout_ms: int | None
    depends_on: tuple[str, ...]
    on_error: tuple[StepPlan, ...]


@dataclass(frozen=True)
class TaskPlan:
    name: str
    mode: str
    failure_mode: str
    max_concurrent_steps: int
    depends_on: tuple[str, ...]
    timeout_ms: int | None
    steps: tuple[StepPlan, ...]


@dataclass(frozen=True)
class AgentPlan:
    name: str
    mode: str
    failure_mode: str
    max_concurrent_tasks: int
    depends_on: tuple[str, ...]
    timeout_ms: int | None
    tasks: tuple[TaskPlan, ...]


@dataclass(frozen=True)
class Plan:
    name: str
    priority: int
    failure_mode: str
    mode: str
    max_attempts: int
    max_agents: int
    credits: Decimal | None
    variables: dict[str, Any]
    timeouts_ms: dict[str, int]
    agents: tuple[AgentPlan, ...]

    @property
    def step_count(self) -> int:
        return sum(len(task.steps) for agent in self.agents for task in agent.tasks)


def parse_duration_ms(value: Any) -> int | None:
    """``"30s"``, ``"250ms"``, ``"1.5h"``, ``"7d"``, or a number of seconds, in whole
    milliseconds; None unless it is at least 1ms. Never raises."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        ms = value * 1000
    elif isinstance(value, float):
        if not math.isfinite(value):
            return None
        ms = int(Decimal(value) * 1000)  # exact: no float rounding, no overflow
    elif isinstance(value, str):
        match = DURATION_RE.fullmatch(value)
        if not match:
            return None
        ms = int(Decimal(match.group(1)) * DURATION_UNITS_MS[match.group(2)])
    else:
        return None
    return ms if ms > 0 else None


def format_duration_ms(ms: int) -> str:
    """The largest unit that divides ``ms`` exactly: ``3_600_000`` is ``"1h"``."""
    for unit in ("d", "h", "m", "s"):
        if ms % DURATION_UNITS_MS[unit] == 0:
            return f"{ms // DURATION_UNITS_MS[unit]}{unit}"
    return f"{ms}ms"


def json_depth(value: Any, limit: int) -> int:
    """Nesting depth of a JSON value, stopping early once past ``limit``."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    deepest = 0
    while stack:
        item, depth = stack.pop()
        deepest = max(deepest, depth)
        if deepest > limit:
            return deepest
        if isinstance(item, dict):
            stack.extend((child, depth + 1) for child in item.values())
        elif isinstance(item, list | tuple):
            stack.extend((child, depth + 1) for child in item)
    return deepest


def json_size(value: Any) -> int | None:
    """Bytes of ``value`` as compact UTF-8 JSON; None if it cannot be written as JSON."""
    try:
        text = json.dumps(value, separators=(",", ":"), ensure_ascii=False, default=str)
    except (TypeError, ValueError, RecursionError):
        return None
    return len(text.encode("utf-8", "surrogatepass"))


def strongly_connected(depends: dict[str, list[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components of a dependency graph, iteratively.

    Dependencies that are not keys of ``depends`` are ignored (reported elsewhere).
    """
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    components: list[list[str]] = []
    for root in depends:
        if root in index:
            continue
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        work: list[tuple[str, Iterable[str]]] = [(root, iter(depends[root]))]
        while work:
            node, children = work[-1]
            descended = False
            for child in children:
                if child not in depends:
                    continue
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(depends[child])))
                    descended = True
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            if descended:
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component: list[str] = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                components.append(component)
    return components


def find_cycles(depends: dict[str, list[str]], order: list[str] | None = None) -> list[list[str]]:
    """One cycle per group of names that depend on each other, first name repeated last.

    Each cycle starts at the member that comes first in ``order`` (default: the order of
    ``depends``) and is a shortest way back to it: ``["a", "b", "a"]`` reads "a depends
    on b, which depends on a".
    """
    rank = {name: i for i, name in enumerate(order if order is not None else depends)}
    cycles: list[list[str]] = []
    for component in strongly_connected(depends):
        if len(component) < 2:
            continue  # self-dependencies never enter the graph
        members = set(component)
        start = min(component, key=lambda name: rank.get(name, len(rank)))
        came_from: dict[str, str] = {}
        frontier = [start]
        closing = ""
        while frontier and not closing:
            following: list[str] = []
            for node in frontier:
                for dep in depends[node]:
                    if dep == start:
                        closing = node
                        break
                    if dep in members and dep not in came_from:
                        came_from[dep] = node
                        following.append(dep)
                if closing:
                    break
            frontier = following
        path = [start]
        node = closing
        while node != start:
            path.append(node)
            node = came_from[node]
        path.append(start)
        # `path` walks the cycle backwards from `start`; read it forwards.
        cycles.append([start, *reversed(path[1:-1]), start])
    cycles.sort(key=lambda cycle: rank.get(cycle[0], len(rank)))
    return cycles


class _Finished(Collection[str]):
    """The sibling names guaranteed to have finished before one child starts.

    A bitmask over the siblings' positions, so a long dependency chain costs a few
    kilobytes rather than a set per child (5,000 steps in a chain would be 12.5 million
    set entries).
    """

    __slots__ = ("_extra", "_index", "_mask")

    def __init__(self, index: dict[str, int], mask: int, extra: frozenset[str] = frozenset()):
        self._index = index
        self._mask = mask
        self._extra = extra

    def __contains__(self, name: object) -> bool:
        if name in self._extra:
            return True
        position = self._index.get(name) if isinstance(name, str) else None
        return position is not None and bool(self._mask >> position & 1)

    def __iter__(self) -> Iterator[str]:
        yield from self._extra
        yield from (
            n for n, i in self._index.items() if self._mask >> i & 1 and n not in self._extra
        )

    def __len__(self) -> int:
        return sum(1 for _ in self)

    def including(self, name: str) -> _Finished:
        return _Finished(self._index, self._mask, self._extra | {name})


def finished_before(mode: str, names: list[str], depends: dict[str, list[str]]) -> list[_Finished]:
    """For each child (by position), the siblings guaranteed to finish before it starts:
    the earlier ones when sequential, none when parallel, its transitive dependencies in
    a dag (cycles and dangling names are reported elsewhere and simply ignored here)."""
    index: dict[str, int] = {}
    for position, name in enumerate(names):
        if name:
            index.setdefault(name, position)
    if mode == "sequential":
        return [_Finished(index, (1 << position) - 1) for position in range(len(names))]
    if mode != "dag":
        return [_Finished(index, 0) for _ in names]
    masks: dict[str, int] = {}
    seen: set[str] = set()
    for root in depends:
        if root in seen:
            continue
        seen.add(root)
        work: list[tuple[str, Iterable[str]]] = [(root, iter(depends[root]))]
        while work:  # depth-first, iteratively: a long chain must not hit the recursion limit
            node, deps = work[-1]
            for dep in deps:
                if dep in depends and dep not in seen:
                    seen.add(dep)
                    work.append((dep, iter(depends[dep])))
                    break
            else:
                work.pop()
                mask = 0
                for dep in depends[node]:
                    if dep in index:
                        mask |= masks.get(dep, 0) | 1 << index[dep]
                masks[node] = mask
    return [_Finished(index, masks.get(name, 0)) for name in names]


def _name_of(item: Any) -> str:
    """A child's name if it is a string, else "" (its problem is reported elsewhere)."""
    if isinstance(item, dict) and isinstance(item.get("name"), str):
        return str(item["name"])
    return ""


def _dependency_mode(data: dict[str, Any], mode: str) -> str:
    """The mode to check children's ``depends_on`` against: when the parent's own mode
    was refused, check them as in a dag rather than report a second, misleading problem."""
    return "dag" if "mode" in data and data["mode"] not in MODES else mode


def _show(value: Any) -> str:
    """A submitted value, short, as the plan's author wrote it."""
    if isinstance(value, str):
        text = repr(value)
    else:
        try:
            text = json.dumps(value, separators=(",", ":"), default=str)
        except (TypeError, ValueError, RecursionError):
            text = json_type_name(value)
    return text if len(text) <= 40 else f"{text[:37]}..."


def _a(value: Any) -> str:
    name = json_type_name(value)
    if name == "null":
        return name
    return f"an {name}" if name[0] in "aeiou" else f"a {name}"


def _suggest(word: str, choices: Collection[str]) -> str:
    """``"; did you mean 'x'?"`` for a near miss, else "".

    Only among a few choices: a plan can have thousands of siblings and make thousands
    of mistakes, and each comparison costs.
    """
    if len(choices) > 50 or len(word) > 100:
        return ""
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f"; did you mean '{close[0]}'?" if close else ""


def _listing(names: Collection[str]) -> str:
    return ", ".join(sorted(names)) or "none"


@dataclass
class _Scope:
    """What templates and conditions at one place in the plan may refer to."""

    variables: set[str]
    task_steps: dict[str, set[str]]  # every task of the agent -> its step names
    visible_tasks: Collection[str]
    visible_steps: Collection[str]
    current_task: str
    in_handler: bool = False


@dataclass
class _Validator:
    limits: Limits
    errors: list[PlanError] = field(default_factory=list)
    tools: frozenset[str] = field(default_factory=tool_names)
    total_steps: int = 0

    # ------------------------------------------------------------------ primitives
    def error(self, path: str, message: str) -> None:
        self.errors.append(PlanError(path, message))

    def mapping(self, value: Any, path: str, allowed: Iterable[str]) -> dict[str, Any] | None:
        if not isinstance(value, dict):
            self.error(path, f"must be an object, got {_a(value)}")
            return None
        allowed = list(allowed)
        for key in value:
            if key not in allowed:
                hint = _suggest(str(key), allowed) or f"; allowed: {', '.join(allowed)}"
                self.error(join(path, str(key)), f"unknown field{hint}")
        return value

    def name(self, data: dict[str, Any], path: str, free_text: bool = False) -> str:
        """A node's name (referenced by templates: a restricted alphabet), or with
        ``free_text`` the run's name (any printable text people will read)."""
        where = join(path, "name")
        if "name" not in data:
            self.error(where, "is required")
            return ""
        value = data["name"]
        if not isinstance(value, str):
            self.error(where, f"must be a string, got {_a(value)}")
            return ""
        limit = RUN_NAME_MAX_LENGTH if free_text else NAME_MAX_LENGTH
        if not value.strip():
            self.error(where, "must not be empty")
        elif len(value) > limit:
            self.error(where, f"is {len(value)} characters long; at most {limit}")
        elif free_text:
            if not value.isprintable():
                self.error(where, "must be printable text (no control characters)")
        elif not NAME_RE.fullmatch(value):
            self.error(
                where,
                f"{_show(value)} is not a valid name: use letters, digits, '_', '-' and '.', "
                "starting with a letter or digit",
            )
        return value

    def integer(
        self, data: dict[str, Any], key: str, path: str, default: int, low: int, high: int
    ) -> int:
        if key not in data:
            return default
        value = data[key]
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            self.error(
                join(path, key), f"must be an integer from {low} to {high}, got {_show(value)}"
            )
            return default
        return value

    def number(
        self, data: dict[str, Any], key: str, path: str, default: float, low: float, high: float
    ) -> float:
        if key not in data:
            return default
        value = data[key]
        if (
            isinstance(value, bool)
            or not isinstance(value, int | float)
            or not low <= value <= high  # also refuses NaN
        ):
            self.error(
                join(path, key), f"must be a number from {low} to {high}, got {_show(value)}"
            )
            return default
        return float(value)

    def choice(
        self, data: dict[str, Any], key: str, path: str, default: str, choices: tuple[str, ...]
    ) -> str:
        if key not in data:
            return default
        value = data[key]
        if not isinstance(value, str) or value not in choices:
            hint = _suggest(value, choices) if isinstance(value, str) else ""
            self.error(
                join(path, key), f"must be one of {', '.join(choices)}, got {_show(value)}{hint}"
            )
            return default
        return value

    def duration(self, value: Any, path: str, maximum_ms: int | None = None) -> int | None:
        ms = parse_duration_ms(value)
        if ms is None:
            self.error(
                path,
                "must be a duration of at least 1ms such as '250ms', '30s', '5m', '1.5h', "
                f"'7d' or a number of seconds, got {_show(value)}",
            )
            return None
        limit = min(maximum_ms, MAX_DURATION_MS) if maximum_ms is not None else MAX_DURATION_MS
        if ms > limit:
            self.error(path, f"must be at most {format_duration_ms(limit)}, got {_show(value)}")
            return None
        return ms

    def optional_duration(
        self, data: dict[str, Any], key: str, path: str, maximum_ms: int | None = None
    ) -> int | None:
        if key not in data:
            return None
        return self.duration(data[key], join(path, key), maximum_ms)

    def children(self, data: dict[str, Any], key: str, path: str, maximum: int) -> list[Any]:
        where = join(path, key)
        if key not in data:
            self.error(where, "is required")
            return []
        value = data[key]
        if not isinstance(value, list):
            self.error(where, f"must be a non-empty list, got {_a(value)}")
            return []
        if not value:
            self.error(where, "must not be empty")
            return []
        if len(value) > maximum:
            self.error(where, f"has {len(value)} entries; at most {maximum} allowed")
            return []
        return value

    def unique_names(self, names: list[str], path: str, key: str, what: str) -> None:
        seen: dict[str, int] = {}
        for index, name in enumerate(names):
            if not name:
                continue
            if name in seen:
                self.error(
                    f"{join(path, key)}[{index}].name",
                    f"duplicate {what} name '{name}' (also {key}[{seen[name]}])",
                )
            else:
                seen[name] = index

    def dependencies(
        self,
        items: list[Any],
        names: list[str],
        mode: str,
        path: str,
        key: str,
        what: str,
    ) -> dict[str, list[str]]:
        """Check every ``depends_on`` of the children of one parent; return the graph."""
        graph: dict[str, list[str]] = {}
        known = {name for name in names if name}
        for index, (item, name) in enumerate(zip(items, names, strict=True)):
            if name and name not in graph:
                graph[name] = []
            if not isinstance(item, dict) or "depends_on" not in item:
                continue
            where = f"{join(path, key)}[{index}].depends_on"
            raw = item["depends_on"]
            if not isinstance(raw, list) or not all(isinstance(dep, str) for dep in raw):
                self.error(where, f"must be a list of {what} names, got {_show(raw)}")
                continue
            if raw and mode != "dag":
                parent = path or "the run"
                self.error(where, f"needs mode 'dag' on {parent} (it is '{mode}')")
                continue
            deps: list[str] = []
            for dep_index, dep in enumerate(raw):
                dep_path = f"{where}[{dep_index}]"
                if name and dep == name:
                    self.error(dep_path, f"{what} '{name}' cannot depend on itself")
                elif dep not in known:
                    self.error(dep_path, f"unknown {what} '{dep}'{_suggest(dep, known)}")
                elif dep in deps:
                    self.error(dep_path, f"duplicate dependency '{dep}'")
                else:
                    deps.append(dep)
            if name and not graph[name]:
                graph[name] = deps
        if mode == "dag":
            for cycle in find_cycles(graph, names):
                self.error(
                    f"{join(path, key)}[{names.index(cycle[0])}].depends_on",
                    f"dependency cycle: {' -> '.join(cycle)}",
                )
        return graph

    # ------------------------------------------------------------------ references
    def check_reference(
        self, ref: Reference, path: str, scope: _Scope, condition: bool = False
    ) -> None:
        shown = f"${{{format_reference(ref)}}}"
        root = ref[0]
        if root == "secrets":
            # Resolved on the worker only when the tool runs, and redacted from what it
            # leaves behind: a condition's outcome would reveal a value bit by bit.
            if condition:
                self.error(path, f"{shown}: secrets cannot be used in conditions")
            elif len(ref) != 2 or not (
                isinstance(ref[1], str) and SECRET_NAME_RE.fullmatch(ref[1])
            ):
                self.error(
                    path,
                    f"{shown}: name one secret, e.g. ${{secrets.API_TOKEN}} (a letter or _, "
                    "then letters, digits or _, at most 100 characters)",
                )
        elif root == "variables":
            if len(ref) < 2:
                self.error(path, f"{shown}: name a variable, e.g. ${{variables.topic}}")
            elif ref[1] not in scope.variables:
                known = scope.variables
                hint = (
                    f" (known: {_listing(known)})"
                    if len(known) <= 20
                    else _suggest(str(ref[1]), known)
                )
                self.error(path, f"unknown variable '{ref[1]}' in {shown}{hint}")
        elif root == "run":
            if len(ref) != 2 or ref[1] not in RUN_FIELDS:
                self.error(path, f"{shown}: run exposes {', '.join(RUN_FIELDS)}")
        elif root == "step":
            if len(ref) != 2 or ref[1] not in CURRENT_STEP_FIELDS:
                self.error(path, f"{shown}: step exposes {', '.join(CURRENT_STEP_FIELDS)}")
        elif root == "error":
            if not scope.in_handler:
                self.error(path, f"{shown}: 'error' is only available in on_error handlers")
            elif len(ref) != 2 or ref[1] not in ERROR_FIELDS:
                self.error(path, f"{shown}: error exposes {', '.join(ERROR_FIELDS)}")
        elif root == "steps":
            self.check_step_reference(
                ref[1:], shown, path, scope.current_task, scope.visible_steps, scope
            )
        elif root == "tasks":
            self.check_task_reference(ref, shown, path, scope)
        else:
            self.error(
                path,
                f"{shown}: unknown root '{root}'; use variables, run, step, steps, tasks or "
                "error (or secrets.NAME for a secret)",
            )

    def check_task_reference(self, ref: Reference, shown: str, path: str, scope: _Scope) -> None:
        usage = f"{shown}: use tasks.<task>.status or tasks.<task>.steps.<step>.<field>"
        if len(ref) < 3:
            self.error(path, usage)
            return
        task = ref[1]
        if not isinstance(task, str) or task not in scope.task_steps:
            self.error(path, f"unknown task '{task}' in {shown}")
        elif task == scope.current_task:
            self.error(path, f"{shown}: a step reads its own task's steps as steps.<step>...")
        elif task not in scope.visible_tasks:
            self.error(
                path,
                f"{shown}: task '{task}' is not guaranteed to finish before this step "
                "(only earlier tasks of a sequential agent, or dependencies in a dag)",
            )
        elif ref[2] == "status" and len(ref) == 3:
            return
        elif ref[2] == "steps":
            steps = scope.task_steps[task]
            self.check_step_reference(ref[3:], shown, path, task, steps, scope)
        else:
            self.error(path, usage)

    def check_step_reference(
        self,
        rest: tuple[str | int, ...],
        shown: str,
        path: str,
        task: str,
        visible: Collection[str],
        scope: _Scope,
    ) -> None:
        if len(rest) < 2 or rest[1] not in STEP_OUTPUT_FIELDS:
            self.error(path, f"{shown}: use steps.<step>.({'|'.join(STEP_OUTPUT_FIELDS)})")
            return
        step = rest[0]
        if not isinstance(step, str) or step not in scope.task_steps.get(task, set()):
            owner = (
                next((t for t, steps in scope.task_steps.items() if step in steps), None)
                if task == scope.current_task
                else None
            )
            hint = (
                f"; it is a step of task '{owner}': tasks.{owner}.steps.{step}..." if owner else ""
            )
            self.error(path, f"unknown step '{step}' in {shown}{hint}")
        elif step not in visible:
            self.error(
                path,
                f"{shown}: step '{step}' is not guaranteed to finish before this one "
                "(only earlier steps of a sequential task, or dependencies in a dag)",
            )

    def check_templates(self, params: dict[str, Any], path: str, scope: _Scope) -> None:
        """Every string of ``params``: its template syntax, then its references, each
        reported at the path of that string (``...params.headers.Authorization``)."""
        stack: list[tuple[str, Any]] = [(path, params)]
        while stack:
            where, item = stack.pop()
            if isinstance(item, str):
                if "$" not in item:
                    continue
                try:
                    references = Template.parse(item).references
                except TemplateError as exc:
                    self.error(where, f"bad template: {exc}")
                    continue
                except ValueError:  # int() of a list index past Python's 4,300-digit limit
                    self.error(where, "bad template: a list index is too long")
                    continue
                for ref in references:
                    self.check_reference(ref, where, scope)
            elif isinstance(item, dict):
                stack.extend(reversed([(join(where, str(k)), v) for k, v in item.items()]))
            elif isinstance(item, list | tuple):
                stack.extend(reversed([(f"{where}[{i}]", v) for i, v in enumerate(item)]))

    def check_condition(self, when: Any, path: str, scope: _Scope) -> str:
        if not isinstance(when, str) or not when.strip():
            self.error(path, f"must be a non-empty expression string, got {_show(when)}")
            return ""
        try:
            expression = Expression.parse(when)
        except (ExpressionError, TemplateError) as exc:
            self.error(path, f"bad condition: {exc}")
            return when
        for ref in expression.references:
            self.check_reference(ref, path, scope, condition=True)
        return when

    # ------------------------------------------------------------------ levels
    def retry_policy(self, value: Any, path: str) -> RetryPolicy:
        data = self.mapping(value, path, RETRY_KEYS)
        if data is None:
            return RetryPolicy()
        limit = self.limits.max_retry_attempts
        max_attempts = self.integer(data, "max_attempts", path, 3, 1, limit)
        max_failures = self.integer(data, "max_failures", path, max_attempts, 1, limit)
        base = self.integer(data, "base_delay_ms", path, 100, 0, 3_600_000)
        cap = self.integer(data, "max_delay_ms", path, max(30_000, base), 0, 3_600_000)
        if cap < base:
            self.error(
                join(path, "max_delay_ms"), f"must be at least base_delay_ms ({base}), got {cap}"
            )
        codes: list[str] = []
        if "retry_on" in data:
            where = join(path, "retry_on")
            retry_on = data["retry_on"]
            if not isinstance(retry_on, list):
                self.error(where, f"must be a list of error codes, got {_a(retry_on)}")
                retry_on = []
            for index, code in enumerate(retry_on):
                if not isinstance(code, str) or code not in ERROR_CODES:
                    hint = _suggest(code, ERROR_CODES) if isinstance(code, str) else ""
                    self.error(f"{where}[{index}]", f"unknown error code {_show(code)}{hint}")
                elif code not in RETRYABLE_CODES:
                    self.error(
                        f"{where}[{index}]",
                        f"'{code}' is never retried; retry_on can only narrow the retryable "
                        f"codes ({_listing(RETRYABLE_CODES)})",
                    )
                elif code not in codes:
                    codes.append(code)
        return RetryPolicy(
            max_attempts=max_attempts,
            max_failures=max_failures,
            backoff=self.choice(data, "backoff", path, "exponential", BACKOFFS),
            base_delay_ms=base,
            max_delay_ms=cap,
            multiplier=self.number(data, "multiplier", path, 2.0, 1.0, 10.0),
            jitter=self.number(data, "jitter", path, 0.1, 0.0, 1.0),
            retry_on=tuple(codes),
        )

    def tool(self, data: dict[str, Any], path: str, handler: bool) -> str:
        where = join(path, "tool")
        if "tool" not in data:
            self.error(where, "is required")
            return ""
        tool = data["tool"]
        if not isinstance(tool, str):
            self.error(where, f"must be a tool name, got {_a(tool)}")
            return ""
        if tool not in self.tools:
            hint = _suggest(tool, self.tools)
            self.error(where, f"unknown tool {_show(tool)}{hint}; known: {_listing(self.tools)}")
        elif handler and tool in WAITING_TOOLS:
            self.error(where, f"'{tool}' cannot be used in an on_error handler")
        return tool

    def check_tool_params(self, tool: str, params: dict[str, Any], path: str) -> None:
        """The tool's own checks of its parameters (values still templated pass)."""
        spec = registry.get(tool)
        if spec is None or spec.validate is None:
            return
        try:
            problems = spec.validate(params)
        except (TypeError, ValueError, AttributeError) as exc:
            problems = [("", f"invalid parameters for {tool}: {exc}")]
        for relative, message in problems:
            self.error(join(path, relative) if relative else path, message)

    def step(
        self,
        value: Any,
        path: str,
        scope: _Scope,
        default_timeout: int | None,
        handler: bool,
        depends_on: tuple[str, ...] = (),
    ) -> StepPlan | None:
        data = self.mapping(value, path, HANDLER_KEYS if handler else STEP_KEYS)
        if data is None:
            return None
        self.total_steps += 1
        name = self.name(data, path)
        tool = self.tool(data, path, handler)
        params = data.get("params", {})
        if not isinstance(params, dict):
            self.error(join(path, "params"), f"must be an object, got {_a(params)}")
            params = {}
        else:
            self.check_templates(params, join(path, "params"), scope)
            self.check_tool_params(tool, params, join(path, "params"))
        when = (
            self.check_condition(data["when"], join(path, "when"), scope) if "when" in data else ""
        )
        timeout = self.optional_duration(data, "timeout", path, self.limits.max_step_timeout_ms)
        retry = (
            self.retry_policy(data["retry"], join(path, "retry"))
            if "retry" in data
            else RetryPolicy()
        )
        on_error = () if handler else self.handlers(data, path, name, scope, default_timeout)
        return StepPlan(
            name=name,
            tool=tool,
            params=params,
            when=when,
            retry=retry,
            timeout_ms=timeout or default_timeout,
            depends_on=depends_on,
            on_error=on_error,
        )

    def handlers(
        self,
        data: dict[str, Any],
        path: str,
        name: str,
        scope: _Scope,
        default_timeout: int | None,
    ) -> tuple[StepPlan, ...]:
        if "on_error" not in data:
            return ()
        where = join(path, "on_error")
        raw_handlers = data["on_error"]
        if not isinstance(raw_handlers, list):
            self.error(where, f"must be a list of steps, got {_a(raw_handlers)}")
            return ()
        if len(raw_handlers) > self.limits.max_on_error:
            self.error(
                where,
                f"has {len(raw_handlers)} handlers; at most {self.limits.max_on_error} allowed",
            )
            return ()
        # A handler runs once its step has failed for good: it may read that step too.
        handler_scope = _Scope(
            variables=scope.variables,
            task_steps=scope.task_steps,
            visible_tasks=scope.visible_tasks,
            visible_steps=(
                scope.visible_steps.including(name)
                if isinstance(scope.visible_steps, _Finished)
                else {*scope.visible_steps, name}
            ),
            current_task=scope.current_task,
            in_handler=True,
        )
        self.unique_names([_name_of(h) for h in raw_handlers], path, "on_error", "handler")
        parsed = (
            self.step(raw, f"{where}[{index}]", handler_scope, default_timeout, True)
            for index, raw in enumerate(raw_handlers)
        )
        return tuple(handler for handler in parsed if handler is not None)

    def task(
        self,
        data: dict[str, Any],
        path: str,
        variables: set[str],
        task_steps: dict[str, set[str]],
        visible_tasks: Collection[str],
        timeouts: dict[str, int],
        depends_on: tuple[str, ...],
    ) -> TaskPlan:
        name = self.name(data, path)
        mode = self.choice(data, "mode", path, "sequential", MODES)
        raw_steps = self.children(data, "steps", path, self.limits.max_steps_per_task)
        names = [_name_of(s) for s in raw_steps]
        self.unique_names(names, path, "steps", "step")
        graph = self.dependencies(
            raw_steps, names, _dependency_mode(data, mode), path, "steps", "step"
        )
        visible = finished_before(mode, names, graph)
        steps: list[StepPlan] = []
        for index, raw in enumerate(raw_steps):
            scope = _Scope(
                variables=variables,
                task_steps=task_steps,
                visible_tasks=visible_tasks,
                visible_steps=visible[index],
                current_task=name,
            )
            parsed = self.step(
                raw,
                f"{join(path, 'steps')}[{index}]",
                scope,
                timeouts.get("step"),
                False,
                tuple(graph.get(names[index], ())),
            )
            if parsed:
                steps.append(parsed)
        return TaskPlan(
            name=name,
            mode=mode,
            failure_mode=self.choice(data, "failure_mode", path, "fail-fast", FAILURE_MODES),
            max_concurrent_steps=self.integer(data, "max_concurrent_steps", path, 3, 1, 10_000),
            depends_on=depends_on,
            timeout_ms=self.optional_duration(data, "timeout", path) or timeouts.get("task"),
            steps=tuple(steps),
        )

    def agent(
        self,
        data: dict[str, Any],
        path: str,
        variables: set[str],
        timeouts: dict[str, int],
        depends_on: tuple[str, ...],
    ) -> AgentPlan:
        name = self.name(data, path)
        mode = self.choice(data, "mode", path, "sequential", MODES)
        raw_tasks = self.children(data, "tasks", path, self.limits.max_tasks_per_agent)
        task_dicts = [
            self.mapping(raw, f"{join(path, 'tasks')}[{index}]", TASK_KEYS)
            for index, raw in enumerate(raw_tasks)
        ]
        names = [_name_of(t) for t in task_dicts]
        self.unique_names(names, path, "tasks", "task")
        graph = self.dependencies(
            task_dicts, names, _dependency_mode(data, mode), path, "tasks", "task"
        )
        visible = finished_before(mode, names, graph)
        task_steps: dict[str, set[str]] = {}
        for task_name, task in zip(names, task_dicts, strict=True):
            if task_name and task_name not in task_steps and task is not None:
                raw_steps = task.get("steps")
                step_names = raw_steps if isinstance(raw_steps, list) else []
                task_steps[task_name] = {_name_of(s) for s in step_names} - {""}
        tasks = [
            self.task(
                task,
                f"{join(path, 'tasks')}[{index}]",
                variables,
                task_steps,
                visible[index],
                timeouts,
                tuple(graph.get(names[index], ())),
            )
            for index, task in enumerate(task_dicts)
            if task is not None
        ]
        return AgentPlan(
            name=name,
            mode=mode,
            failure_mode=self.choice(data, "failure_mode", path, "fail-fast", FAILURE_MODES),
            max_concurrent_tasks=self.integer(data, "max_concurrent_tasks", path, 5, 1, 10_000),
            depends_on=depends_on,
            timeout_ms=self.optional_duration(data, "timeout", path) or timeouts.get("agent"),
            tasks=tuple(tasks),
        )

    def variables(self, root: dict[str, Any]) -> dict[str, Any]:
        if "variables" not in root:
            return {}
        variables = root["variables"]
        if not isinstance(variables, dict):
            self.error("variables", f"must be an object, got {_a(variables)}")
            return {}
        size = json_size(variables)
        if size is None or size > self.limits.max_variables_bytes:
            self.error(
                "variables",
                f"must be at most {self.limits.max_variables_bytes} bytes as JSON, got {size}",
            )
        return variables

    def credits(self, root: dict[str, Any]) -> Decimal | None:
        if "credits" not in root:
            return None
        raw = root["credits"]
        value: Decimal | None = None
        if isinstance(raw, str) and CREDITS_RE.fullmatch(raw.strip()):
            value = Decimal(raw.strip())
        elif isinstance(raw, int | float) and not isinstance(raw, bool):
            try:
                value = Decimal(str(raw))
            except (InvalidOperation, ValueError):  # ValueError: an int of 4,300+ digits
                value = None
        if (
            value is None
            or not value.is_finite()
            or not 0 < value < MAX_CREDITS
            or value != value.quantize(CREDITS_QUANTUM)
        ):
            self.error(
                "credits",
                f"must be a positive number below {MAX_CREDITS} with at most 6 decimals, "
                f"got {_show(raw)}",
            )
            return None
        return value

    def timeouts(self, root: dict[str, Any]) -> dict[str, int]:
        timeouts: dict[str, int] = {}
        if "timeouts" not in root:
            return timeouts
        checked = self.mapping(root["timeouts"], "timeouts", TIMEOUT_KEYS)
        for key, value in (checked or {}).items():
            if key in TIMEOUT_KEYS:
                maximum = self.limits.max_step_timeout_ms if key == "step" else None
                ms = self.duration(value, f"timeouts.{key}", maximum)
                if ms:
                    timeouts[key] = ms
        return timeouts

    def plan(self, data: Any) -> Plan | None:
        root = self.mapping(data, "", RUN_KEYS)
        if root is None:
            return None
        name = self.name(root, "", free_text=True)

        variables = self.variables(root)
        credits = self.credits(root)
        timeouts = self.timeouts(root)
        max_agents = self.integer(
            root, "max_agents", "", min(10, self.limits.max_agents), 1, self.limits.max_agents
        )
        mode = self.choice(root, "mode", "", "parallel", MODES)
        raw_agents = self.children(root, "agents", "", self.limits.max_agents)
        agent_dicts = [
            self.mapping(raw, f"agents[{index}]", AGENT_KEYS)
            for index, raw in enumerate(raw_agents)
        ]
        names = [_name_of(a) for a in agent_dicts]
        self.unique_names(names, "", "agents", "agent")
        agent_graph = self.dependencies(
            agent_dicts, names, _dependency_mode(root, mode), "", "agents", "agent"
        )
        agents = [
            self.agent(
                agent,
                f"agents[{index}]",
                set(variables),
                timeouts,
                tuple(agent_graph.get(names[index], ())),
            )
            for index, agent in enumerate(agent_dicts)
            if agent is not None
        ]
        if self.total_steps > self.limits.max_steps_per_run:
            self.error(
                "agents",
                f"plan has {self.total_steps} steps (on_error handlers included); "
                f"at most {self.limits.max_steps_per_run} allowed",
            )
        return Plan(
            name=name,
            priority=self.integer(root, "priority", "", 5, 0, 9),
            failure_mode=self.choice(root, "failure_mode", "", "fail-fast", FAILURE_MODES),
            mode=mode,
            max_attempts=self.integer(root, "max_attempts", "", 3, 1, 10),
            max_agents=max_agents,
            credits=credits,
            variables=variables,
            timeouts_ms=timeouts,
            agents=tuple(agents),
        )


def join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def unstorable_values(data: Any) -> list[PlanError]:
    """Every string (keys too) PostgreSQL cannot store, and every NaN or infinity, with
    its path. Iterative: the plan's depth is bounded before this runs, not by it."""
    problems: list[PlanError] = []
    stack: list[tuple[str, Any]] = [("", data)]
    while stack:
        path, item = stack.pop()
        if isinstance(item, str):
            problem = text_problem(item)
            if problem:
                problems.append(PlanError(path, problem))
        elif isinstance(item, float):
            if item != item or item in (float("inf"), float("-inf")):
                problems.append(PlanError(path, "NaN and Infinity are not JSON numbers"))
        elif isinstance(item, dict):
            for key, value in reversed(list(item.items())):
                shown = str(key)
                key_problem = text_problem(shown)
                if key_problem:
                    shown = repr(shown).encode("ascii", "backslashreplace").decode()
                    problems.append(PlanError(join(path, shown), f"key {key_problem}"))
                stack.append((join(path, shown), value))
        elif isinstance(item, list | tuple):
            stack.extend(reversed([(f"{path}[{i}]", value) for i, value in enumerate(item)]))
    return problems


def parse_plan(data: Any, *, limits: Limits | None = None, size_hint: int | None = None) -> Plan:
    """Validate a submitted plan; return the normalised plan or raise ``PlanInvalid``.

    ``size_hint`` is the request body's size when known, to refuse oversized plans
    before walking them.
    """
    limits = limits or Limits.from_settings()
    # Depth first: it is measured without recursion, and a too-deep value must not reach
    # json.dumps (which recurses) when measuring the size.
    depth = json_depth(data, limits.max_json_depth)
    if depth > limits.max_json_depth:
        raise PlanInvalid([PlanError("", f"plan nests deeper than {limits.max_json_depth} levels")])
    size = size_hint if size_hint is not None else json_size(data)
    if size is None:
        raise PlanInvalid([PlanError("", "plan cannot be written as JSON")])
    if size > limits.max_spec_bytes:
        raise PlanInvalid(
            [PlanError("", f"plan is {size} bytes; at most {limits.max_spec_bytes} allowed")]
        )
    # Every path that creates a run comes here (API, admin, shell, CLI): values that
    # PostgreSQL would refuse at insert are reported like any other problem, not as a
    # database error after the fact.
    unstorable = unstorable_values(data)
    if unstorable:
        raise PlanInvalid(unstorable)
    validator = _Validator(limits)
    plan = validator.plan(data)
    if validator.errors or plan is None:
        raise PlanInvalid(validator.errors)
    return plan


def errors_as_dicts(errors: list[PlanError]) -> list[dict[str, str]]:
    return [{"path": error.path, "message": error.message} for error in errors]
