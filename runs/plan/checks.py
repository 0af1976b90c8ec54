"""What a plan must satisfy as a whole, beyond the shape of each field.

``runs.plan.model`` checks each field where it stands; these checks relate fields to one
another and to the world: tools that exist and the parameters they take, names unique
among siblings, dependencies that exist, are not repeated, need a ``dag`` parent and form
no cycle, templates and conditions that parse and refer only to work guaranteed to have
finished, and the total number of steps.

They run on the submitted JSON, after the structural pass and whatever it found, so that
every problem is reported at once: a value of the wrong shape was reported there and is
simply passed over here.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field, replace
from typing import Any, TypeGuard

from billing.models import SECRET_NAME_RE
from common.expressions import Expression, ExpressionError
from common.templates import (
    Reference,
    Template,
    TemplateError,
    format_reference,
    secret_references,
)
from common.tools import registry
from common.tools.published import WORKER, Catalogue, is_published_name, params_problems
from common.tools.registry import WAITING_TOOLS, tool_names
from runs.plan.errors import PlanError, join, listing, show, suggest
from runs.plan.graph import Finished, find_cycles, finished_before
from runs.plan.guard import Limits
from runs.plan.model import MODES, AgentPlan, Plan, PlanModel, TaskPlan

STEP_OUTPUT_FIELDS = ("output", "status", "error", "attempts", "cost")
RUN_FIELDS = ("id", "name", "attempt", "priority")
# The step being executed: e.g. an idempotency key `${run.id}-${step.id}-${step.attempt}`
# for an external service, so that a retried attempt is recognised there.
CURRENT_STEP_FIELDS = ("id", "name", "attempt")
ERROR_FIELDS = ("code", "message", "step", "retryable")
# What `${callback.*}` reads: in a `callback` step's parameters, the URL it opened; in a
# `run` step's on_callback handlers, how its child run ended.
CALLBACK_URL_FIELDS = ("url",)
CALLBACK_FIELDS = ("child_run", "status", "outputs", "error")
KEPT_KEYS = "{} stored and shown as rendered, which would hold the value in clear"


def _kept_by(tool: str) -> str:
    """Why a tool's parameter may not read a secret (``ToolSpec.stored``)."""
    if is_published_name(tool):
        return (
            f"{tool} runs on your workers: its parameters are kept with its job as rendered, "
            "which would hold the value in clear; let the worker read the secret itself"
        )
    if tool == "run":
        return (
            "a child run keeps its variables (and a plan rendered from a template) as "
            "given, which would hold the value in clear; write ${secrets.NAME} in the "
            "child's plan written out, where the child reads it itself"
        )
    return f"the {tool} tool keeps this parameter as rendered, which would hold the value in clear"


def check_plan(data: Any, limits: Limits, catalogue: Catalogue | None = None) -> list[PlanError]:
    """Every whole-plan problem of ``data``, in the order the plan is walked.

    ``catalogue``: the published tools the plan's organization may name, and their
    schemas (``runs.catalogue``). Without one (a plan read again, already checked), a
    published tool's name passes as it is."""
    checker = _Checker(limits, catalogue=catalogue)
    if isinstance(data, dict):
        checker.plan(data)
    return checker.errors


def _name_of(item: Any) -> str:
    """A child's name if it is a string, else "" (its problem is reported elsewhere)."""
    if isinstance(item, dict) and isinstance(item.get("name"), str):
        return str(item["name"])
    return ""


def _is_list(value: Any) -> TypeGuard[list[Any] | tuple[Any, ...]]:
    return isinstance(value, list | tuple)


def _mode(data: dict[str, Any], level: type[PlanModel]) -> str:
    """The mode a level runs in: its own, or its level's default when absent or refused."""
    mode = data.get("mode")
    if isinstance(mode, str) and mode in MODES:
        return mode
    return str(level.model_fields["mode"].default)


def _dependency_mode(data: dict[str, Any], mode: str) -> str:
    """The mode to check children's ``depends_on`` against: when the parent's own mode
    was refused, check them as in a dag rather than report a second, misleading problem."""
    return "dag" if "mode" in data and data["mode"] not in MODES else mode


@dataclass
class _Scope:
    """What templates and conditions at one place in the plan may refer to."""

    variables: set[str]
    task_steps: dict[str, set[str]]  # every task of the agent -> its step names
    visible_tasks: Collection[str]
    visible_steps: Collection[str]
    current_task: str
    in_handler: bool = False
    callback_fields: tuple[str, ...] = ()


@dataclass
class _Checker:
    limits: Limits
    errors: list[PlanError] = field(default_factory=list)
    tools: frozenset[str] = field(default_factory=tool_names)
    catalogue: Catalogue | None = None
    total_steps: int = 0

    def error(self, path: str, message: str) -> None:
        self.errors.append(PlanError(path, message))

    def children(self, data: dict[str, Any], key: str, maximum: int) -> list[Any]:
        """A level's children, or none when they were refused (not a list, empty, too many)."""
        value = data.get(key)
        return list(value) if _is_list(value) and 0 < len(value) <= maximum else []

    # ------------------------------------------------------------------ levels
    def plan(self, root: dict[str, Any]) -> None:
        raw_variables = root.get("variables")
        variables = set(raw_variables) if isinstance(raw_variables, dict) else set()
        mode = _mode(root, Plan)
        agents = self.children(root, "agents", self.limits.max_agents)
        names = [_name_of(agent) for agent in agents]
        self.unique_names(names, "", "agents", "agent")
        self.dependencies(agents, names, _dependency_mode(root, mode), "", "agents", "agent")
        for index, agent in enumerate(agents):
            if isinstance(agent, dict):
                self.agent(agent, f"agents[{index}]", variables)
        self.concurrency(root.get("concurrency"), variables)
        if self.total_steps > self.limits.max_steps_per_run:
            self.error(
                "agents",
                f"plan has {self.total_steps} steps (on_error handlers included); "
                f"at most {self.limits.max_steps_per_run} allowed",
            )

    def concurrency(self, data: Any, variables: set[str]) -> None:
        """A concurrency key reads the run's variables only: it is rendered when the run
        is created, before anything has run."""
        key = data.get("key") if isinstance(data, dict) else None
        if not isinstance(key, str) or "$" not in key:
            return
        try:
            references = Template.parse(key).references
        except TemplateError as exc:
            self.error("concurrency.key", f"bad template: {exc}")
            return
        scope = _Scope(
            variables=variables,
            task_steps={},
            visible_tasks=(),
            visible_steps=(),
            current_task="",
        )
        for ref in references:
            if ref[0] != "variables":
                self.error(
                    "concurrency.key",
                    f"${{{format_reference(ref)}}}: a concurrency key reads ${{variables...}} only",
                )
            else:
                self.check_reference(ref, "concurrency.key", scope)

    def agent(self, data: dict[str, Any], path: str, variables: set[str]) -> None:
        mode = _mode(data, AgentPlan)
        tasks = self.children(data, "tasks", self.limits.max_tasks_per_agent)
        names = [_name_of(task) for task in tasks]
        self.unique_names(names, path, "tasks", "task")
        graph = self.dependencies(tasks, names, _dependency_mode(data, mode), path, "tasks", "task")
        visible = finished_before(mode, names, graph)
        task_steps: dict[str, set[str]] = {}
        for task_name, task in zip(names, tasks, strict=True):
            if task_name and task_name not in task_steps and isinstance(task, dict):
                raw_steps = task.get("steps")
                step_names = raw_steps if _is_list(raw_steps) else []
                task_steps[task_name] = {_name_of(s) for s in step_names} - {""}
        for index, task in enumerate(tasks):
            if isinstance(task, dict):
                where = f"{join(path, 'tasks')}[{index}]"
                self.task(task, where, variables, task_steps, visible[index])

    def task(
        self,
        data: dict[str, Any],
        path: str,
        variables: set[str],
        task_steps: dict[str, set[str]],
        visible_tasks: Collection[str],
    ) -> None:
        name = _name_of(data)
        mode = _mode(data, TaskPlan)
        steps = self.children(data, "steps", self.limits.max_steps_per_task)
        names = [_name_of(step) for step in steps]
        self.unique_names(names, path, "steps", "step")
        graph = self.dependencies(steps, names, _dependency_mode(data, mode), path, "steps", "step")
        visible = finished_before(mode, names, graph)
        for index, raw in enumerate(steps):
            scope = _Scope(
                variables=variables,
                task_steps=task_steps,
                visible_tasks=visible_tasks,
                visible_steps=visible[index],
                current_task=name,
            )
            self.step(raw, f"{join(path, 'steps')}[{index}]", scope, handler="")

    def step(self, data: Any, path: str, scope: _Scope, handler: str) -> None:
        """One step; ``handler`` names the handlers it is one of (on_error,
        on_callback), "" for a step of the task."""
        if not isinstance(data, dict):
            return
        self.total_steps += 1
        tool = data.get("tool")
        if isinstance(tool, str):
            self.check_tool(tool, join(path, "tool"), handler)
        params = data.get("params", {})
        if isinstance(params, dict):
            published = isinstance(tool, str) and is_published_name(tool)
            spec = registry.get(tool) if isinstance(tool, str) and not published else None
            verbatim = spec.verbatim(params) if spec is not None else frozenset()
            rendered = {key: value for key, value in params.items() if key not in verbatim}
            param_scope = (
                replace(scope, callback_fields=CALLBACK_URL_FIELDS) if tool == "callback" else scope
            )
            self.check_templates(rendered, join(path, "params"), param_scope)
            if isinstance(tool, str):
                self.check_tool_params(tool, params, join(path, "params"))
            if spec is not None:
                stored = spec.stored(params)
                kept = {key: value for key, value in params.items() if key in stored}
                self.no_secrets(kept, join(path, "params"), _kept_by(str(tool)))
            elif published and self.catalogue is not None:
                found = self.catalogue.get(str(tool))
                if found is not None and found.placement == WORKER:
                    self.no_secrets(params, join(path, "params"), _kept_by(str(tool)))
        when = data.get("when")
        if isinstance(when, str) and when.strip():
            self.check_condition(when, join(path, "when"), scope)
        uses = data.get("rate_limits")
        if _is_list(uses):
            # A key and templated units are rendered as the step runs, like its params.
            for index, use in enumerate(uses):
                if isinstance(use, dict):
                    texts = {k: v for k in ("key", "units") if isinstance(v := use.get(k), str)}
                    where = f"{join(path, 'rate_limits')}[{index}]"
                    self.check_templates(texts, where, scope)
                    self.no_secrets(
                        texts, where, KEPT_KEYS.format("a rate limit's key and units are")
                    )
        cache = data.get("cache")
        if isinstance(cache, dict) and isinstance(cache.get("key"), str):
            self.check_templates({"key": cache["key"]}, join(path, "cache"), scope)
            self.no_secrets(
                {"key": cache["key"]}, join(path, "cache"), KEPT_KEYS.format("a cache key is")
            )
        if not handler:
            self.handlers(data, path, _name_of(data), scope)
            self.callback_handlers(data, path, _name_of(data), scope)

    def handlers(self, data: dict[str, Any], path: str, name: str, scope: _Scope) -> None:
        raw_handlers = data.get("on_error")
        if not _is_list(raw_handlers) or len(raw_handlers) > self.limits.max_on_error:
            return
        # A handler runs once its step has failed for good: it may read that step too.
        handler_scope = _Scope(
            variables=scope.variables,
            task_steps=scope.task_steps,
            visible_tasks=scope.visible_tasks,
            visible_steps=(
                scope.visible_steps.including(name)
                if isinstance(scope.visible_steps, Finished)
                else {*scope.visible_steps, name}
            ),
            current_task=scope.current_task,
            in_handler=True,
        )
        self.unique_names([_name_of(h) for h in raw_handlers], path, "on_error", "handler")
        for index, raw in enumerate(raw_handlers):
            self.step(raw, f"{join(path, 'on_error')}[{index}]", handler_scope, "on_error")

    def callback_handlers(self, data: dict[str, Any], path: str, name: str, scope: _Scope) -> None:
        """A `run` step in async_callback mode has on_callback steps, and no other step
        has: they run once its child has ended, reading ``${callback.*}``."""
        raw_handlers = data.get("on_callback")
        params = data.get("params")
        mode = params.get("execution_mode") if isinstance(params, dict) else None
        expects = data.get("tool") == "run" and mode == "async_callback"
        if not _is_list(raw_handlers) or not raw_handlers:
            if expects:
                self.error(
                    join(path, "on_callback"),
                    "a run step in async_callback mode needs on_callback steps, run when its "
                    "child ends (async_poll starts a child without waiting for it)",
                )
            return
        if not expects:
            self.error(
                join(path, "on_callback"),
                "only a run step with execution_mode async_callback has on_callback steps",
            )
            return
        if len(raw_handlers) > self.limits.max_on_error:
            return
        # They run after the step completed: they may read it, and what it could read.
        callback_scope = replace(
            scope,
            visible_steps=(
                scope.visible_steps.including(name)
                if isinstance(scope.visible_steps, Finished)
                else {*scope.visible_steps, name}
            ),
            callback_fields=CALLBACK_FIELDS,
        )
        self.unique_names([_name_of(h) for h in raw_handlers], path, "on_callback", "handler")
        for index, raw in enumerate(raw_handlers):
            self.step(raw, f"{join(path, 'on_callback')}[{index}]", callback_scope, "on_callback")

    # ------------------------------------------------------------------ names, tools
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

    def check_tool(self, tool: str, path: str, handler: str) -> None:
        if is_published_name(tool) and tool not in self.tools:
            if self.catalogue is not None and self.catalogue.get(tool) is None:
                names = self.catalogue.names()
                hint = suggest(tool, names)
                self.error(
                    path,
                    f"unknown tool {show(tool)}{hint}: neither the fleet nor a worker of your "
                    f"organization has published it (docs/tools.md)"
                    + (f"; published: {listing(names)}" if names else ""),
                )
        elif tool not in self.tools:
            hint = suggest(tool, self.tools)
            self.error(path, f"unknown tool {show(tool)}{hint}; known: {listing(self.tools)}")
        elif handler and tool in WAITING_TOOLS:
            self.error(path, f"'{tool}' cannot be used in an {handler} handler")

    def check_tool_params(self, tool: str, params: dict[str, Any], path: str) -> None:
        """The tool's own checks of its parameters (values still templated pass); a
        published tool's, its schema's."""
        if is_published_name(tool):
            found = self.catalogue.get(tool) if self.catalogue is not None else None
            for relative, message in params_problems(found, params) if found else []:
                self.error(join(path, relative) if relative else path, message)
            return
        spec = registry.get(tool)
        if spec is None or spec.validate is None:
            return
        try:
            problems = spec.validate(params)
        except (TypeError, ValueError, AttributeError) as exc:
            problems = [("", f"invalid parameters for {tool}: {exc}")]
        for relative, message in problems:
            self.error(join(path, relative) if relative else path, message)

    # ------------------------------------------------------------------ dependencies
    def dependencies(
        self,
        items: list[Any],
        names: list[str],
        mode: str,
        path: str,
        key: str,
        what: str,
    ) -> dict[str, list[str]]:
        """Check every ``depends_on`` of the children of one parent; return the graph.
        A ``depends_on`` that is no list of names was refused by the model."""
        graph: dict[str, list[str]] = {}
        known = {name for name in names if name}
        for index, (item, name) in enumerate(zip(items, names, strict=True)):
            if name and name not in graph:
                graph[name] = []
            raw = item.get("depends_on") if isinstance(item, dict) else None
            if not _is_list(raw) or not all(isinstance(dep, str) for dep in raw):
                continue
            where = f"{join(path, key)}[{index}].depends_on"
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
                    self.error(dep_path, f"unknown {what} '{dep}'{suggest(dep, known)}")
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
                    f" (known: {listing(known)})"
                    if len(known) <= 20
                    else suggest(str(ref[1]), known)
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
        elif root == "callback":
            if not scope.callback_fields:
                self.error(
                    path,
                    f"{shown}: 'callback' is only available in a callback step's parameters "
                    "and in a run step's on_callback handlers",
                )
            elif len(ref) < 2 or ref[1] not in scope.callback_fields:
                self.error(path, f"{shown}: callback exposes {', '.join(scope.callback_fields)}")
            elif ref[1] == "url" and len(ref) != 2:
                self.error(path, f"{shown}: callback.url is a string")
        elif root == "steps":
            self.check_step_reference(
                ref[1:], shown, path, scope.current_task, scope.visible_steps, scope
            )
        elif root == "tasks":
            self.check_task_reference(ref, shown, path, scope)
        else:
            self.error(
                path,
                f"{shown}: unknown root '{root}'; use variables, run, step, steps, tasks, "
                "error or callback (or secrets.NAME for a secret)",
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

    def no_secrets(self, value: dict[str, Any], path: str, why: str) -> None:
        """A value kept or shown as rendered reads no secret, in any spelling."""
        for where, ref in secret_references(value, path):
            self.error(where, f"${{{format_reference(ref)}}}: secrets cannot be used here: {why}")

    def check_condition(self, when: Any, path: str, scope: _Scope) -> str:
        if not isinstance(when, str) or not when.strip():
            self.error(path, f"must be a non-empty expression string, got {show(when)}")
            return ""
        try:
            expression = Expression.parse(when)
        except (ExpressionError, TemplateError) as exc:
            self.error(path, f"bad condition: {exc}")
            return when
        for ref in expression.references:
            self.check_reference(ref, path, scope, condition=True)
        return when
