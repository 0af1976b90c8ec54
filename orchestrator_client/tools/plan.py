"""A plan written in Python: the same JSON plan as a YAML or JSON plan file, its steps
built from the decorated functions themselves, so that mypy checks each step's params
against the function's parameters (docs/plans-in-python.md).

    from orchestrator_client.tools.plan import Agent, Plan, Task, ref, step

    fetch = step("http", url="https://example.com/${variables.page}").with_options(name="fetch")
    plan = Plan("digest", [Agent("reader", [Task("read", [
        fetch,
        step(summarize, text=ref(fetch, "output.body"), max_words=40),
    ])])], variables={"page": "news"})
    client.submit(plan)

- ``step(tool, **params)``: a step of a ``@tool`` function, its params checked by mypy
  (and, at run time, bound to its signature: a missing or unknown one raises
  ``TypeError``); ``step("http", url=...)``: a built-in tool by name, its params not
  checked here (the server checks them at ``POST /runs``). The step's own fields
  (``name``, ``depends_on``, ``when``, ``retry``, ``timeout``, ``on_error``...) come with
  ``.with_options(...)``: a tool's params and the step's fields never share a namespace.
- ``ref("steps.fetch.output")`` or ``ref(fetch, "output.body")``: a ``${...}`` template,
  typed ``Any`` so that it stands where the parameter wants an ``int`` or a model (a
  template is read when the step runs). A plain string may hold templates too.
- ``Task``, ``Agent`` and ``Plan`` take their children and the fields a plan file writes,
  named as it names them (``timeout="30s"``, ``failure_mode="continue"``); ``retry``,
  ``cache``, ``timeouts``, ``escalation``... are dicts typed by their keys. A field the
  builder does not name goes in ``extra={...}`` at its level, as written in JSON.
- ``Plan(...)`` checks what needs no server: names, duplicates, ``depends_on`` (known,
  not itself, not twice, a ``dag`` parent, no cycle), handlers; ``PlanBuildError`` lists
  every problem with its path, as ``invalid_plan`` does. Tools, params and templates are
  the server's to check.
- ``plan.to_dict()`` is the plan as JSON data; ``to_json()``, ``to_yaml()`` its text.
  ``Client.submit(plan)`` (and ``create_run``, ``fork_run``, ``create_schedule``) take it.
"""

from __future__ import annotations

import collections
import dataclasses
import difflib
import inspect
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from decimal import Decimal
from typing import Any, Literal, ParamSpec, Required, TypedDict

from orchestrator_client.plans import yaml_flow
from orchestrator_client.tools import schema
from orchestrator_client.tools.definition import Tool

P = ParamSpec("P")

Mode = Literal["sequential", "parallel", "dag"]
FailureMode = Literal["fail-fast", "continue", "retry"]
# "250ms", "30s", "5m", "1.5h", "7d", or a number of seconds (docs/api.md, "Durations").
Duration = str | int | float

# The server's rule for a name a template reads back (runs/plan/fields.py).
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
NAME_MAX_LENGTH = 100


class Retry(TypedDict, total=False):
    """A step's ``retry`` (docs/api.md): only retryable error codes are retried."""

    max_attempts: int
    max_failures: int
    backoff: Literal["fixed", "linear", "exponential"]
    base_delay_ms: int
    max_delay_ms: int
    multiplier: float
    jitter: float
    retry_on: Sequence[str]
    on_exhausted: Literal["fail", "escalate"]


class Cache(TypedDict, total=False):
    """A step's ``cache`` (docs/api.md, "A step cache")."""

    key: Required[str]
    ttl: Required[Duration]
    inputs: bool


class RateLimit(TypedDict, total=False):
    """Units of one of the organization's rate limits a step spends (docs/rate-limits.md)."""

    name: Required[str]
    units: int | str
    key: str


class Timeouts(TypedDict, total=False):
    """The plan's ``timeouts``: defaults by level, and limits by run state."""

    run: Duration
    agent: Duration
    task: Duration
    step: Duration
    pending: Duration
    paused: Duration
    resuming: Duration
    retrying: Duration
    escalated: Duration


class Escalation(TypedDict, total=False):
    """The plan's ``escalation`` (docs/escalation.md)."""

    enabled: bool
    window: Duration
    max_errors: int
    max_error_rate: float
    min_attempts: int


class Replan(TypedDict, total=False):
    """The plan's ``replan`` (docs/escalation.md)."""

    enabled: bool
    agent_failure_ratio: float
    task_failures: int
    max_replans: int
    planner: str


class Concurrency(TypedDict, total=False):
    """The plan's ``concurrency`` (docs/fairness.md)."""

    key: Required[str]
    max_runs: int


@dataclasses.dataclass(frozen=True)
class Problem:
    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}" if self.path else self.message


class PlanBuildError(ValueError):
    """The plan cannot be what a server would take; ``problems`` lists each, with its path
    in the plan (``agents[0].tasks[1].depends_on[0]``)."""

    def __init__(self, problems: Sequence[Problem]) -> None:
        self.problems = list(problems)
        lines = "\n".join(f"  {problem}" for problem in self.problems)
        super().__init__(f"the plan is invalid:\n{lines}")


# --------------------------------------------------------------------------- templates
def ref(target: str | Step, path: str = "") -> Any:
    """A ``${...}`` template: ``ref("variables.topic")``, ``ref(fetch, "output.body")``
    (``${steps.fetch.output.body}``: a step of the same task; another task's step is
    ``ref("tasks.T.steps.S.output")``). Typed ``Any`` so that it stands for any
    parameter's value; at run time it is the template's text, which also goes in an
    f-string (``f"hello {ref('variables.who')}"``)."""
    where = f"steps.{target.name}" if isinstance(target, Step) else target
    expression = f"{where}.{path}" if path else where
    if not expression.strip() or "${" in expression or "}" in expression:
        raise ValueError(f"ref({expression!r}): a path such as 'steps.fetch.output'")
    return "${" + expression + "}"


# --------------------------------------------------------------------------- steps
@dataclasses.dataclass(frozen=True)
class Step:
    """One step, as ``step()`` builds it; ``with_options`` sets its own fields."""

    name: str
    tool: str
    params: Mapping[str, Any]
    when: str = ""
    retry: Retry | None = None
    timeout: Duration | None = None
    depends_on: tuple[str, ...] = ()
    on_error: tuple[Step, ...] = ()
    on_callback: tuple[Step, ...] = ()
    rate_limits: tuple[RateLimit, ...] = ()
    cache: Cache | None = None
    extra: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    def with_options(
        self,
        *,
        name: str | None = None,
        depends_on: Iterable[str | Step] | None = None,
        when: str | None = None,
        retry: Retry | None = None,
        timeout: Duration | None = None,
        on_error: Iterable[Step] | None = None,
        on_callback: Iterable[Step] | None = None,
        rate_limits: Iterable[RateLimit] | None = None,
        cache: Cache | None = None,
        demands: Mapping[str, Any] | None = None,
        extra: Mapping[str, Any] | None = None,
    ) -> Step:
        """This step with the fields given (those left out stay as they are).

        ``depends_on``: steps of the same task (or their names), in a ``dag`` task.
        ``on_error``: steps run in order once this one has failed for good;
        ``on_callback``: those of a ``run`` step in ``async_callback`` mode.
        ``demands``: which ``orch worker`` may take the step (its ``params.demands``).
        ``extra``: step fields the builder does not name, as JSON writes them."""
        changes: dict[str, Any] = {
            key: value
            for key, value in (
                ("name", name),
                ("when", when),
                ("retry", retry),
                ("timeout", timeout),
                ("cache", cache),
                ("extra", extra),
            )
            if value is not None
        }
        if depends_on is not None:
            changes["depends_on"] = _names(depends_on)
        for key, steps in (("on_error", on_error), ("on_callback", on_callback)):
            if steps is not None:
                changes[key] = tuple(steps)
        if rate_limits is not None:
            changes["rate_limits"] = tuple(rate_limits)
        if demands is not None:
            changes["params"] = {**self.params, "demands": schema.to_json(demands)}
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        """The step as a plan writes it: the fields it sets, nothing else."""
        data: dict[str, Any] = {"name": self.name, "tool": self.tool}
        if self.params:
            data["params"] = dict(self.params)
        _put(data, "when", self.when or None)
        _put(data, "retry", _json(self.retry))
        _put(data, "timeout", self.timeout)
        _put(data, "depends_on", list(self.depends_on) or None)
        _put(data, "on_error", [handler.to_dict() for handler in self.on_error] or None)
        _put(data, "on_callback", [handler.to_dict() for handler in self.on_callback] or None)
        _put(data, "rate_limits", _json(list(self.rate_limits)) or None)
        _put(data, "cache", _json(self.cache))
        return _with_extra(data, self.extra)


# One signature, no overloads: a tool given by name leaves P unsolved, which mypy reads
# as any params, and a decorated one gets mypy's plain words ("Unexpected keyword
# argument", "Missing positional argument") rather than "No overload variant matches".
def step(tool: Tool[P] | str, /, *args: P.args, **kwargs: P.kwargs) -> Step:
    """A step that calls ``tool`` with these params: a ``@tool`` function (its params
    typed by its parameters, bound as a call would bind them) or a tool's name (a
    built-in one such as ``"http"``, or a tool of the fleet or of a worker, its params
    as the server takes them). Named after the tool (``acme.summarize``: ``summarize``)
    until ``with_options(name=...)``. Values are written as JSON (dataclasses, TypedDicts
    and pydantic models as objects, enums by value)."""
    if isinstance(tool, str):
        if args:
            raise TypeError(f"step({tool!r}, ...): a tool named by text takes its params by name")
        return Step(name=tool, tool=tool, params=_params(kwargs))
    return Step(
        name=tool.name.rsplit(".", 1)[-1], tool=tool.name, params=_bound(tool, args, kwargs)
    )


def _bound(tool: Tool[Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
    """The params as the function would receive them, those left to their defaults left
    out (the tool fills them in when it runs)."""
    parameters = list(inspect.signature(tool.function).parameters.values())
    if tool.takes_context:
        parameters = parameters[1:]
    try:
        bound = inspect.Signature(parameters).bind(*args, **kwargs)
    except TypeError as exc:
        raise TypeError(f"step({tool.name}): {exc}") from None
    return _params(bound.arguments)


def _params(values: Mapping[str, Any]) -> dict[str, Any]:
    params: dict[str, Any] = {}
    for key, value in values.items():
        try:
            params[key] = schema.to_json(value)
        except ValueError as exc:
            raise TypeError(f"param {key!r}: {exc}") from None
    return params


def _names(items: Iterable[str | Step | Task | Agent]) -> tuple[str, ...]:
    return tuple(item if isinstance(item, str) else item.name for item in items)


# --------------------------------------------------------------------------- levels
@dataclasses.dataclass(frozen=True)
class Task:
    """A task: its steps run ``sequential`` (the default), ``parallel`` or as a ``dag``."""

    name: str
    steps: Sequence[Step]
    _: dataclasses.KW_ONLY
    mode: Mode | None = None
    failure_mode: FailureMode | None = None
    max_concurrent_steps: int | None = None
    depends_on: Sequence[str | Task] = ()
    timeout: Duration | None = None
    extra: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        _freeze(self, "steps", "depends_on")

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {"name": self.name}
        _put(data, "mode", self.mode)
        _put(data, "failure_mode", self.failure_mode)
        _put(data, "max_concurrent_steps", self.max_concurrent_steps)
        _put(data, "depends_on", list(_names(self.depends_on)) or None)
        _put(data, "timeout", self.timeout)
        data["steps"] = [item.to_dict() for item in self.steps]
        return _with_extra(data, self.extra)


@dataclasses.dataclass(frozen=True)
class Agent:
    """An agent: its tasks run ``sequential`` (the default), ``parallel`` or as a ``dag``."""

    name: str
    tasks: Sequence[Task]
    _: dataclasses.KW_ONLY
    mode: Mode | None = None
    failure_mode: FailureMode | None = None
    max_concurrent_tasks: int | None = None
    depends_on: Sequence[str | Agent] = ()
    timeout: Duration | None = None
    extra: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        _freeze(self, "tasks", "depends_on")

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {"name": self.name}
        _put(data, "mode", self.mode)
        _put(data, "failure_mode", self.failure_mode)
        _put(data, "max_concurrent_tasks", self.max_concurrent_tasks)
        _put(data, "depends_on", list(_names(self.depends_on)) or None)
        _put(data, "timeout", self.timeout)
        data["tasks"] = [task.to_dict() for task in self.tasks]
        return _with_extra(data, self.extra)


@dataclasses.dataclass(frozen=True)
class Plan:
    """A run's plan: its agents run ``parallel`` (the default) or as a ``dag``. Checked
    when built (``PlanBuildError``); ``to_dict()`` is what ``POST /runs`` takes as
    ``plan``."""

    name: str
    agents: Sequence[Agent]
    _: dataclasses.KW_ONLY
    priority: int | None = None
    mode: Mode | None = None
    failure_mode: FailureMode | None = None
    max_attempts: int | None = None
    max_agents: int | None = None
    credits: Decimal | str | int | None = None
    variables: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    timeouts: Timeouts | None = None
    escalation: Escalation | None = None
    replan: Replan | None = None
    concurrency: Concurrency | None = None
    extra: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        _freeze(self, "agents")
        problems = _Checker().plan(self)
        if problems:
            raise PlanBuildError(problems)

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {"name": self.name}
        _put(data, "priority", self.priority)
        _put(data, "mode", self.mode)
        _put(data, "failure_mode", self.failure_mode)
        _put(data, "max_attempts", self.max_attempts)
        _put(data, "max_agents", self.max_agents)
        _put(data, "credits", None if self.credits is None else str(self.credits))
        _put(data, "variables", _json(self.variables) or None)
        for key in ("timeouts", "escalation", "replan", "concurrency"):
            _put(data, key, _json(getattr(self, key)))
        data["agents"] = [agent.to_dict() for agent in self.agents]
        return _with_extra(data, self.extra)

    def to_json(self, *, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent, ensure_ascii=False)

    def to_yaml(self) -> str:
        """The plan as a YAML plan file: block style, every text quoted (a YAML reader
        takes it back as ``to_dict()``, whatever the text looks like)."""
        return "\n".join(_yaml_block(self.to_dict(), "")) + "\n"


def _freeze(node: object, *names: str) -> None:
    """The lists a level was given, as tuples: a plan checked when built stays as it was
    checked."""
    for name in names:
        object.__setattr__(node, name, tuple(getattr(node, name)))


def _put(data: dict[str, Any], key: str, value: Any) -> None:
    if value is not None:
        data[key] = value


def _json(value: Any) -> Any:
    return None if value is None else schema.to_json(value)


def _with_extra(data: dict[str, Any], extra: Mapping[str, Any]) -> dict[str, Any]:
    return {**data, **_json(extra)} if extra else data


# --------------------------------------------------------------------------- checks
class _Checker:
    """What a plan must satisfy that the client can know: the server's own checks of
    names and dependencies, in the same words."""

    def __init__(self) -> None:
        self.problems: list[Problem] = []

    def error(self, path: str, message: str) -> None:
        self.problems.append(Problem(path, message))

    def plan(self, plan: Plan) -> list[Problem]:
        if not plan.name.strip():
            self.error("name", "must not be blank")
        self.siblings(plan.agents, "", "agents", "agent", plan.mode or "parallel", "the run")
        for index, agent in enumerate(plan.agents):
            path = f"agents[{index}]"
            self.siblings(agent.tasks, path, "tasks", "task", agent.mode or "sequential", path)
            for task_index, task in enumerate(agent.tasks):
                where = f"{path}.tasks[{task_index}]"
                self.siblings(task.steps, where, "steps", "step", task.mode or "sequential", where)
                for step_index, item in enumerate(task.steps):
                    self.handlers(item, f"{where}.steps[{step_index}]")
        self.extras(plan)
        return self.problems

    def siblings(
        self,
        items: Sequence[Agent | Task | Step],
        path: str,
        key: str,
        what: str,
        mode: str,
        parent: str,
    ) -> None:
        where = f"{path}.{key}" if path else key
        if not items:
            self.error(where, f"needs at least one {what}")
            return
        seen = self.unique([item.name for item in items], path, key, what)
        graph: dict[str, list[str]] = {}
        for index, item in enumerate(items):
            deps = _names(item.depends_on)
            at = f"{where}[{index}].depends_on"
            if deps and mode != "dag":
                self.error(at, f"needs mode 'dag' on {parent} (it is '{mode}')")
                continue
            kept: list[str] = []
            for dep_index, dep in enumerate(deps):
                if dep == item.name:
                    self.error(f"{at}[{dep_index}]", f"{what} '{dep}' cannot depend on itself")
                elif dep not in seen:
                    self.error(f"{at}[{dep_index}]", f"unknown {what} '{dep}'{_suggest(dep, seen)}")
                elif dep in kept:
                    self.error(f"{at}[{dep_index}]", f"duplicate dependency '{dep}'")
                else:
                    kept.append(dep)
            graph.setdefault(item.name, kept)
        for cycle in _cycles(graph):
            self.error(
                f"{where}[{seen[cycle[0]]}].depends_on", f"dependency cycle: {' -> '.join(cycle)}"
            )

    def handlers(self, item: Step, path: str) -> None:
        for key, handlers in (("on_error", item.on_error), ("on_callback", item.on_callback)):
            self.unique([handler.name for handler in handlers], path, key, "handler")
            for index, handler in enumerate(handlers):
                for field in ("depends_on", "on_error", "on_callback", "cache"):
                    if getattr(handler, field):
                        self.error(f"{path}.{key}[{index}].{field}", "a handler has none")

    def unique(self, names: list[str], path: str, key: str, what: str) -> dict[str, int]:
        """Each name checked and its first place; a name seen before is a problem."""
        where = f"{path}.{key}" if path else key
        seen: dict[str, int] = {}
        for index, name in enumerate(names):
            self.name(name, f"{where}[{index}].name")
            if name in seen:
                self.error(
                    f"{where}[{index}].name",
                    f"duplicate {what} name '{name}' (also {key}[{seen[name]}])",
                )
            seen.setdefault(name, index)
        return seen

    def name(self, name: str, path: str) -> None:
        if len(name) > NAME_MAX_LENGTH or not NAME_RE.match(name):
            self.error(
                path,
                f"{name!r}: letters, digits, '_', '-' and '.', starting with a letter or "
                f"digit, at most {NAME_MAX_LENGTH} characters",
            )

    def extras(self, plan: Plan) -> None:
        """``extra`` is for fields the builder does not name: one it names would be
        written twice, and one of the two lost."""
        nodes: list[tuple[str, Plan | Agent | Task | Step]] = [("", plan)]
        for index, agent in enumerate(plan.agents):
            nodes.append((f"agents[{index}]", agent))
            for task_index, task in enumerate(agent.tasks):
                nodes.append((f"agents[{index}].tasks[{task_index}]", task))
                for step_index, item in enumerate(task.steps):
                    nodes.append((f"agents[{index}].tasks[{task_index}].steps[{step_index}]", item))
        for path, node in nodes:
            named = {f.name for f in dataclasses.fields(node)} | {"params"}
            for key in node.extra:
                if key in named:
                    where = f"{path}.extra" if path else "extra"
                    self.error(where, f"{key!r} is a field of its own here: give it as {key}=")


def _suggest(word: str, choices: Iterable[str]) -> str:
    """The server's hint for a near miss (runs/plan/errors.py)."""
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f"; did you mean '{close[0]}'?" if close else ""


def _cycles(graph: Mapping[str, Sequence[str]]) -> list[list[str]]:
    """One cycle per set of names that depend on each other, from the first of them in
    ``graph``'s order, by a shortest way back: ``["a", "b", "a"]`` reads "a depends on b,
    which depends on a"."""
    behind: dict[str, list[str]] = {name: [] for name in graph}
    for name, deps in graph.items():
        for dep in deps:
            behind.setdefault(dep, []).append(name)
    cycles: list[list[str]] = []
    done: set[str] = set()
    for start in graph:
        if start in done:
            continue
        ahead = _reach(graph, start)
        if start not in ahead:
            continue
        members = ahead & _reach(behind, start)
        done |= members
        cycles.append(_shortest_loop(graph, start, members))
    return cycles


def _shortest_loop(graph: Mapping[str, Sequence[str]], start: str, members: set[str]) -> list[str]:
    """``start``, the fewest ``members`` it depends on through, and ``start`` again."""
    came_from: dict[str, str] = {}
    queue = collections.deque([start])
    while queue:
        node = queue.popleft()
        for dep in graph.get(node, ()):
            if dep == start:
                back = [node]
                while back[-1] != start:
                    back.append(came_from[back[-1]])
                return [*reversed(back), start]
            if dep in members and dep not in came_from:
                came_from[dep] = node
                queue.append(dep)
    raise AssertionError(f"{start} is in a cycle, yet no way back was found")


def _reach(graph: Mapping[str, Sequence[str]], start: str) -> set[str]:
    """The names reached from ``start`` by one edge or more."""
    reached: set[str] = set()
    stack = list(graph.get(start, ()))
    while stack:
        node = stack.pop()
        if node not in reached:
            reached.add(node)
            stack.extend(graph.get(node, ()))
    return reached


# --------------------------------------------------------------------------- YAML
_PLAIN_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# Words YAML 1.1 readers (PyYAML) take for booleans or null, not text.
_YAML_WORDS = frozenset({"y", "n", "yes", "no", "on", "off", "true", "false", "null"})


def _yaml_key(key: str) -> str:
    return key if _PLAIN_KEY.match(key) and key.lower() not in _YAML_WORDS else yaml_flow(key)


def _yaml_scalar(value: Any) -> str:
    if isinstance(value, float):
        # PyYAML reads 1e-07 as text: a float's exponent needs a dot before it.
        text = repr(value)
        return text.replace("e", ".0e", 1) if "e" in text and "." not in text else text
    return yaml_flow(value)


def _yaml_nested(value: Any) -> bool:
    return isinstance(value, dict | list) and bool(value)


def _yaml_block(value: Any, indent: str) -> list[str]:
    if isinstance(value, dict) and value:
        lines: list[str] = []
        for key, item in value.items():
            head = f"{indent}{_yaml_key(str(key))}:"
            if _yaml_nested(item):
                lines.append(head)
                lines.extend(_yaml_block(item, indent + "  "))
            else:
                lines.append(f"{head} {_yaml_scalar(item)}")
        return lines
    if isinstance(value, list) and value:
        lines = []
        for item in value:
            inner = _yaml_block(item, indent + "  ")
            lines.append(f"{indent}- {inner[0][len(indent) + 2 :]}")
            lines.extend(inner[1:])
        return lines
    return [indent + _yaml_scalar(value)]
