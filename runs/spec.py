"""The run specification: its schema, its validator, and the normalised plan.

``parse_plan(data)`` checks a submitted plan completely before anything is stored or
reserved and reports *every* problem at once, each with its path
(``agents[0].tasks[1].depends_on[0]: unknown task 'gahter'``). It refuses unknown
fields (a typo must not be silently ignored), unknown tools, duplicate names, dangling
dependencies, cycles, malformed durations, templates and conditions, references to work
that cannot have finished yet, and plans over the size limits in settings.

On success it returns a :class:`Plan` with every default filled in; the stored
specification stays exactly as submitted, and the plan is derived from it again when a
worker materialises the run.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from typing import Any

from django.conf import settings

from orchestrator.errors import ERROR_CODES
from orchestrator.expressions import Expression, ExpressionError
from orchestrator.templates import Reference, TemplateError, find_references, template_errors
from orchestrator.tools.registry import WAITING_TOOLS, tool_names

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$")
DURATION_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)\s*$")
DURATION_UNITS_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
FAILURE_MODES = ("fail-fast", "continue", "retry")
MODES = ("sequential", "parallel", "dag")
BACKOFFS = ("fixed", "linear", "exponential")
TIMEOUT_KEYS = ("run", "agent", "task", "step", "pending", "paused", "resuming", "retrying")
STEP_OUTPUT_FIELDS = ("output", "status", "error", "attempts", "cost")
RUN_FIELDS = ("id", "name", "attempt", "priority")
ERROR_FIELDS = ("code", "message", "step", "retryable")


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
    """``"30s"``, ``"250ms"``, ``"1.5h"``, ``"7d"``, or a number of seconds; None if bad."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return int(value * 1000) if value > 0 else None
    if isinstance(value, str):
        match = DURATION_RE.match(value)
        if match:
            ms = int(float(match.group(1)) * DURATION_UNITS_MS[match.group(2)])
            return ms if ms > 0 else None
    return None


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
        elif isinstance(item, list):
            stack.extend((child, depth + 1) for child in item)
    return deepest


def predecessors(mode: str, names: list[str], depends: dict[str, list[str]]) -> dict[str, set[str]]:
    """For each child, the siblings guaranteed to have finished before it starts."""
    if mode == "sequential":
        return {name: set(names[:index]) for index, name in enumerate(names)}
    if mode == "parallel":
        return {name: set() for name in names}
    closure: dict[str, set[str]] = {}

    def visit(name: str, trail: frozenset[str]) -> set[str]:
        if name in closure:
            return closure[name]
        found: set[str] = set()
        for dep in depends.get(name, []):
            if dep in trail or dep not in depends:
                continue  # cycles and dangling names are reported elsewhere
            found |= {dep} | visit(dep, trail | {dep})
        closure[name] = found
        return found

    for name in names:
        visit(name, frozenset({name}))
    return closure


def find_cycle(depends: dict[str, list[str]]) -> list[str] | None:
    """One dependency cycle as a list of names (first repeated at the end), or None."""
    state: dict[str, int] = {}  # 1 visiting, 2 done
    for start in depends:
        if state.get(start):
            continue
        path: list[str] = []
        stack: list[tuple[str, Iterable[str]]] = [(start, iter(depends[start]))]
        state[start] = 1
        path.append(start)
        while stack:
            node, children = stack[-1]
            for child in children:
                if child not in depends:
                    continue
                if state.get(child) == 1:
                    return [*path[path.index(child) :], child]
                if not state.get(child):
                    state[child] = 1
                    path.append(child)
                    stack.append((child, iter(depends[child])))
                    break
            else:
                state[node] = 2
                path.pop()
                stack.pop()
    return None


@dataclass
class _Scope:
    """What templates and conditions at one place in the plan may refer to."""

    variables: set[str]
    task_steps: dict[str, set[str]]  # every task of the agent -> its step names
    visible_tasks: set[str]
    visible_steps: set[str]
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
            self.error(path, f"must be an object, got {type(value).__name__}")
            return None
        allowed = set(allowed)
        for key in value:
            if key not in allowed:
                self.error(join(path, key), "unknown field")
        return value

    def required(self, data: dict[str, Any], key: str, path: str) -> Any:
        if key not in data:
            self.error(join(path, key), "is required")
        return data.get(key)

    def name(self, data: dict[str, Any], path: str) -> str:
        value = self.required(data, "name", path)
        if value is None:
            return ""
        if not isinstance(value, str) or not NAME_RE.match(value):
            self.error(
                join(path, "name"),
                "must be 1-100 characters: letters, digits, '_', '-', '.', "
                "starting with a letter or digit",
            )
            return value if isinstance(value, str) else ""
        return value

    def integer(
        self, data: dict[str, Any], key: str, path: str, default: int, low: int, high: int
    ) -> int:
        value = data.get(key, default)
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            self.error(join(path, key), f"must be an integer from {low} to {high}")
            return default
        return value

    def number(
        self, data: dict[str, Any], key: str, path: str, default: float, low: float, high: float
    ) -> float:
        value = data.get(key, default)
        if (
            isinstance(value, bool)
            or not isinstance(value, int | float)
            or not low <= value <= high
        ):
            self.error(join(path, key), f"must be a number from {low} to {high}")
            return default
        return float(value)

    def choice(
        self, data: dict[str, Any], key: str, path: str, default: str, choices: tuple[str, ...]
    ) -> str:
        value = data.get(key, default)
        if value not in choices:
            self.error(join(path, key), f"must be one of {', '.join(choices)}; got {value!r}")
            return default
        return str(value)

    def duration(self, value: Any, path: str, maximum_ms: int | None = None) -> int | None:
        ms = parse_duration_ms(value)
        if ms is None:
            self.error(
                path,
                "must be a positive duration such as '250ms', '30s', '5m', '1h', '7d'; "
                f"got {value!r}",
            )
        elif maximum_ms is not None and ms > maximum_ms:
            self.error(path, f"must be at most {maximum_ms // 1000}s")
            return None
        return ms

    def optional_duration(
        self, data: dict[str, Any], key: str, path: str, maximum_ms: int | None = None
    ) -> int | None:
        if key not in data:
            return None
        return self.duration(data[key], join(path, key), maximum_ms)

    def children(self, data: dict[str, Any], key: str, path: str, maximum: int) -> list[Any]:
        value = self.required(data, key, path)
        if value is None:
            return []
        if not isinstance(value, list) or not value:
            self.error(join(path, key), "must be a non-empty list")
            return []
        if len(value) > maximum:
            self.error(join(path, key), f"has {len(value)} entries; at most {maximum} allowed")
            return []
        return value

    def unique_names(self, names: list[str], path: str, key: str, what: str) -> None:
        seen: dict[str, int] = {}
        for index, name in enumerate(names):
            if not name:
                continue
            if name in seen:
                self.error(
                    f"{path}.{key}[{index}].name" if path else f"{key}[{index}].name",
                    f"duplicate {what} name '{name}' (also {key}[{seen[name]}])",
                )
            else:
                seen[name] = index

    def dependencies(
        self,
        items: list[dict[str, Any]],
        names: list[str],
        mode: str,
        path: str,
        key: str,
        what: str,
    ) -> dict[str, list[str]]:
        """Check every ``depends_on`` of the children of one parent; return the graph."""
        graph: dict[str, list[str]] = {}
        known = set(names)
        for index, (item, name) in enumerate(zip(items, names, strict=True)):
            item_path = f"{join(path, key)}[{index}]"
            raw = item.get("depends_on", []) if isinstance(item, dict) else []
            if raw and mode != "dag":
                self.error(join(item_path, "depends_on"), "requires mode 'dag' in the parent")
                graph[name] = []
                continue
            if not isinstance(raw, list) or not all(isinstance(dep, str) for dep in raw):
                self.error(join(item_path, "depends_on"), "must be a list of names")
                graph[name] = []
                continue
            deps: list[str] = []
            for dep_index, dep in enumerate(raw):
                dep_path = f"{join(item_path, 'depends_on')}[{dep_index}]"
                if dep == name:
                    self.error(dep_path, f"{what} '{name}' cannot depend on itself")
                elif dep not in known:
                    self.error(dep_path, f"unknown {what} '{dep}'")
                elif dep in deps:
                    self.error(dep_path, f"duplicate dependency '{dep}'")
                else:
                    deps.append(dep)
            if name:
                graph[name] = deps
        if mode == "dag":
            cycle = find_cycle(graph)
            if cycle:
                first = names.index(cycle[0])
                self.error(
                    f"{join(path, key)}[{first}].depends_on",
                    f"dependency cycle: {' -> '.join(cycle)}",
                )
        return graph

    # ------------------------------------------------------------------ references
    def check_reference(self, ref: Reference, path: str, scope: _Scope) -> None:
        text = ".".join(str(part) for part in ref)
        root = ref[0]
        if root == "variables":
            if len(ref) < 2:
                self.error(path, "'variables' needs a name, e.g. ${variables.topic}")
            elif ref[1] not in scope.variables:
                self.error(path, f"unknown variable '{ref[1]}' in ${{{text}}}")
        elif root == "run":
            if len(ref) != 2 or ref[1] not in RUN_FIELDS:
                self.error(path, f"${{{text}}}: run exposes {', '.join(RUN_FIELDS)}")
        elif root == "error":
            if not scope.in_handler:
                self.error(path, f"${{{text}}}: 'error' is only available in on_error handlers")
            elif len(ref) != 2 or ref[1] not in ERROR_FIELDS:
                self.error(path, f"${{{text}}}: error exposes {', '.join(ERROR_FIELDS)}")
        elif root == "steps":
            self.check_step_reference(
                ref[1:], text, path, scope.current_task, scope.visible_steps, scope
            )
        elif root == "tasks":
            if len(ref) < 3:
                self.error(path, f"${{{text}}}: use tasks.<task>.status or tasks.<task>.steps...")
                return
            task = str(ref[1])
            if task not in scope.task_steps:
                self.error(path, f"unknown task '{task}' in ${{{text}}}")
            elif task not in scope.visible_tasks:
                self.error(
                    path,
                    f"${{{text}}}: task '{task}' is not guaranteed to finish before this step "
                    "(only earlier tasks of a sequential agent, or dependencies in a dag)",
                )
            elif ref[2] == "status" and len(ref) == 3:
                return
            elif ref[2] == "steps":
                steps = scope.task_steps[task]
                self.check_step_reference(ref[3:], text, path, task, steps, scope)
            else:
                self.error(path, f"${{{text}}}: use tasks.<task>.status or tasks.<task>.steps...")
        else:
            self.error(
                path,
                f"${{{text}}}: unknown root '{root}'; use variables, run, steps, tasks or error",
            )

    def check_step_reference(
        self,
        rest: tuple[str | int, ...],
        text: str,
        path: str,
        task: str,
        visible: set[str],
        scope: _Scope,
    ) -> None:
        if len(rest) < 2 or rest[1] not in STEP_OUTPUT_FIELDS:
            self.error(path, f"${{{text}}}: use steps.<step>.({'|'.join(STEP_OUTPUT_FIELDS)})")
            return
        step = str(rest[0])
        if step not in scope.task_steps.get(task, set()):
            self.error(path, f"unknown step '{step}' in ${{{text}}}")
        elif step not in visible:
            self.error(
                path,
                f"${{{text}}}: step '{step}' is not guaranteed to finish before this one "
                "(only earlier steps of a sequential task, or dependencies in a dag)",
            )

    def check_templates(self, params: Any, path: str, scope: _Scope) -> None:
        problems = template_errors(params, path)
        for problem_path, message in problems:
            self.error(problem_path, f"bad template: {message}")
        if problems:
            return
        for ref in find_references(params):
            self.check_reference(ref, path, scope)

    def check_condition(self, when: Any, path: str, scope: _Scope) -> str:
        if not isinstance(when, str) or not when.strip():
            self.error(path, "must be a non-empty expression string")
            return ""
        try:
            expression = Expression.parse(when)
        except (ExpressionError, TemplateError) as exc:
            self.error(path, f"bad condition: {exc}")
            return when
        for ref in expression.references:
            self.check_reference(ref, path, scope)
        return when

    # ------------------------------------------------------------------ levels
    def retry_policy(self, value: Any, path: str) -> RetryPolicy:
        if value is None:
            return RetryPolicy()
        data = self.mapping(
            value,
            path,
            (
                "max_attempts",
                "max_failures",
                "backoff",
                "base_delay_ms",
                "max_delay_ms",
                "multiplier",
                "jitter",
                "retry_on",
            ),
        )
        if data is None:
            return RetryPolicy()
        limit = self.limits.max_retry_attempts
        max_attempts = self.integer(data, "max_attempts", path, 3, 1, limit)
        max_failures = self.integer(data, "max_failures", path, max_attempts, 1, limit)
        base = self.integer(data, "base_delay_ms", path, 100, 0, 3_600_000)
        cap = self.integer(data, "max_delay_ms", path, max(30_000, base), 0, 3_600_000)
        if cap < base:
            self.error(join(path, "max_delay_ms"), "must be at least base_delay_ms")
        retry_on = data.get("retry_on", [])
        codes: list[str] = []
        if not isinstance(retry_on, list):
            self.error(join(path, "retry_on"), "must be a list of error codes")
        else:
            for index, code in enumerate(retry_on):
                if code not in ERROR_CODES:
                    self.error(f"{join(path, 'retry_on')}[{index}]", f"unknown error code {code!r}")
                else:
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

    def step(
        self,
        value: Any,
        path: str,
        scope: _Scope,
        default_timeout: int | None,
        handler: bool,
        depends_on: tuple[str, ...] = (),
    ) -> StepPlan | None:
        keys = ["name", "tool", "params", "when", "retry", "timeout", "depends_on"]
        if not handler:
            keys.append("on_error")
        data = self.mapping(value, path, keys)
        if data is None:
            return None
        self.total_steps += 1
        name = self.name(data, path)
        tool = self.required(data, "tool", path)
        if tool is not None and tool not in self.tools:
            self.error(
                join(path, "tool"), f"unknown tool {tool!r}; known: {', '.join(sorted(self.tools))}"
            )
        if handler and tool in WAITING_TOOLS:
            self.error(join(path, "tool"), f"'{tool}' cannot be used in an on_error handler")
        params = data.get("params", {})
        if not isinstance(params, dict):
            self.error(join(path, "params"), "must be an object")
            params = {}
        else:
            self.check_templates(params, join(path, "params"), scope)
        when = (
            self.check_condition(data["when"], join(path, "when"), scope) if "when" in data else ""
        )
        timeout = self.optional_duration(data, "timeout", path, self.limits.max_step_timeout_ms)
        on_error: list[StepPlan] = []
        raw_handlers = data.get("on_error", [])
        if raw_handlers:
            if not isinstance(raw_handlers, list) or len(raw_handlers) > self.limits.max_on_error:
                self.error(
                    join(path, "on_error"),
                    f"must be a list of at most {self.limits.max_on_error} steps",
                )
            else:
                handler_scope = _Scope(
                    variables=scope.variables,
                    task_steps=scope.task_steps,
                    visible_tasks=scope.visible_tasks,
                    visible_steps=scope.visible_steps | {name},
                    current_task=scope.current_task,
                    in_handler=True,
                )
                handler_names = [
                    h.get("name", "") if isinstance(h, dict) else "" for h in raw_handlers
                ]
                self.unique_names(handler_names, path, "on_error", "handler")
                for index, raw in enumerate(raw_handlers):
                    parsed = self.step(
                        raw,
                        f"{join(path, 'on_error')}[{index}]",
                        handler_scope,
                        default_timeout,
                        True,
                    )
                    if parsed:
                        on_error.append(parsed)
        return StepPlan(
            name=name,
            tool=str(tool or ""),
            params=params,
            when=when,
            retry=self.retry_policy(data.get("retry"), join(path, "retry")),
            timeout_ms=timeout or default_timeout,
            depends_on=depends_on,
            on_error=tuple(on_error),
        )

    def task(
        self,
        data: dict[str, Any],
        path: str,
        variables: set[str],
        task_steps: dict[str, set[str]],
        visible_tasks: set[str],
        timeouts: dict[str, int],
    ) -> TaskPlan:
        name = self.name(data, path)
        mode = self.choice(data, "mode", path, "sequential", MODES)
        raw_steps = self.children(data, "steps", path, self.limits.max_steps_per_task)
        step_dicts = [s if isinstance(s, dict) else {} for s in raw_steps]
        names = [
            s.get("name", "") if isinstance(s.get("name", ""), str) else "" for s in step_dicts
        ]
        self.unique_names(names, path, "steps", "step")
        graph = self.dependencies(step_dicts, names, mode, path, "steps", "step")
        visible = predecessors(mode, names, graph)
        steps: list[StepPlan] = []
        for index, raw in enumerate(raw_steps):
            scope = _Scope(
                variables=variables,
                task_steps=task_steps,
                visible_tasks=visible_tasks,
                visible_steps=visible.get(names[index], set()),
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
            max_concurrent_steps=self.integer(data, "max_concurrent_steps", path, 3, 1, 1000),
            depends_on=tuple(graph.get(name, ())),
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
        task_dicts: list[dict[str, Any]] = []
        for index, raw in enumerate(raw_tasks):
            checked = self.mapping(
                raw,
                f"{join(path, 'tasks')}[{index}]",
                (
                    "name",
                    "mode",
                    "failure_mode",
                    "max_concurrent_steps",
                    "depends_on",
                    "timeout",
                    "steps",
                ),
            )
            task_dicts.append(checked or {})
        names = [
            t.get("name", "") if isinstance(t.get("name", ""), str) else "" for t in task_dicts
        ]
        self.unique_names(names, path, "tasks", "task")
        graph = self.dependencies(task_dicts, names, mode, path, "tasks", "task")
        visible = predecessors(mode, names, graph)
        task_steps = {
            task_name: {
                s["name"]
                for s in task.get("steps", [])
                if isinstance(task.get("steps"), list)
                and isinstance(s, dict)
                and isinstance(s.get("name"), str)
            }
            for task_name, task in zip(names, task_dicts, strict=True)
            if task_name
        }
        tasks = [
            self.task(
                task,
                f"{join(path, 'tasks')}[{index}]",
                variables,
                task_steps,
                visible.get(names[index], set()),
                timeouts,
            )
            for index, task in enumerate(task_dicts)
            if task
        ]
        return AgentPlan(
            name=name,
            mode=mode,
            failure_mode=self.choice(data, "failure_mode", path, "fail-fast", FAILURE_MODES),
            max_concurrent_tasks=self.integer(data, "max_concurrent_tasks", path, 5, 1, 1000),
            depends_on=depends_on,
            timeout_ms=self.optional_duration(data, "timeout", path) or timeouts.get("agent"),
            tasks=tuple(tasks),
        )

    def plan(self, data: Any) -> Plan | None:
        root = self.mapping(
            data,
            "",
            (
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
            ),
        )
        if root is None:
            return None
        name = self.name(root, "")
        variables = root.get("variables", {})
        if not isinstance(variables, dict):
            self.error("variables", "must be an object")
            variables = {}
        elif len(json.dumps(variables)) > self.limits.max_variables_bytes:
            self.error(
                "variables", f"must be at most {self.limits.max_variables_bytes} bytes as JSON"
            )
        credits = None
        if "credits" in root:
            try:
                raw = root["credits"]
                if isinstance(raw, bool) or not isinstance(raw, int | float | str):
                    raise InvalidOperation
                credits = Decimal(str(raw))
                if not credits.is_finite() or credits <= 0 or credits.as_tuple().exponent < -6:  # type: ignore[operator]
                    raise InvalidOperation
            except InvalidOperation:
                self.error("credits", "must be a positive number with at most 6 decimals")
                credits = None
        timeouts: dict[str, int] = {}
        raw_timeouts = root.get("timeouts", {})
        checked = self.mapping(raw_timeouts, "timeouts", TIMEOUT_KEYS)
        for key, value in (checked or {}).items():
            if key in TIMEOUT_KEYS:
                maximum = self.limits.max_step_timeout_ms if key == "step" else None
                ms = self.duration(value, f"timeouts.{key}", maximum)
                if ms:
                    timeouts[key] = ms
        max_agents = self.integer(root, "max_agents", "", 10, 1, self.limits.max_agents)
        mode = self.choice(root, "mode", "", "parallel", MODES)
        raw_agents = self.children(root, "agents", "", self.limits.max_agents)
        agent_dicts: list[dict[str, Any]] = []
        for index, raw in enumerate(raw_agents):
            checked_agent = self.mapping(
                raw,
                f"agents[{index}]",
                (
                    "name",
                    "mode",
                    "failure_mode",
                    "max_concurrent_tasks",
                    "depends_on",
                    "timeout",
                    "tasks",
                ),
            )
            agent_dicts.append(checked_agent or {})
        names = [
            a.get("name", "") if isinstance(a.get("name", ""), str) else "" for a in agent_dicts
        ]
        self.unique_names(names, "", "agents", "agent")
        agent_graph = self.dependencies(agent_dicts, names, mode, "", "agents", "agent")
        agents = [
            self.agent(
                agent,
                f"agents[{index}]",
                set(variables),
                timeouts,
                tuple(agent_graph.get(names[index], ())),
            )
            for index, agent in enumerate(agent_dicts)
            if agent
        ]
        if self.total_steps > self.limits.max_steps_per_run:
            self.error(
                "agents",
                f"plan has {self.total_steps} steps; "
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


def parse_plan(data: Any, *, limits: Limits | None = None, size_hint: int | None = None) -> Plan:
    """Validate a submitted plan; return the normalised plan or raise ``PlanInvalid``.

    ``size_hint`` is the request body's size when known, to refuse oversized plans
    before walking them.
    """
    limits = limits or Limits.from_settings()
    size = size_hint if size_hint is not None else len(json.dumps(data, default=str))
    if size > limits.max_spec_bytes:
        raise PlanInvalid(
            [PlanError("", f"plan is {size} bytes; at most {limits.max_spec_bytes} allowed")]
        )
    depth = json_depth(data, limits.max_json_depth)
    if depth > limits.max_json_depth:
        raise PlanInvalid([PlanError("", f"plan nests deeper than {limits.max_json_depth} levels")])
    validator = _Validator(limits)
    plan = validator.plan(data)
    if validator.errors or plan is None:
        raise PlanInvalid(validator.errors)
    return plan


def errors_as_dicts(errors: list[PlanError]) -> list[dict[str, str]]:
    return [{"path": error.path, "message": error.message} for error in errors]
