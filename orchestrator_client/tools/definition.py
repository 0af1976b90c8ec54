"""``@tool``: a typed Python function (sync or ``async``) as a step's tool.

    @tool(name="acme.summarize", version="2", cost="0.02")
    def summarize(ctx: Context, text: str, max_words: int = 50) -> Summary:
        '''Summarize a text.

        Args:
            text: what to summarize.
            max_words: at most this many words.
        '''

The function's parameters (after an optional first ``ctx: Context``) are the step's
``params``; its return value is the step's output. From the annotations come the JSON
Schema of both (``orchestrator_client.tools.schema``), published to the server, which
checks a plan's steps against it at ``POST /runs``. The docstring's first paragraph
describes the tool, its ``Args:`` the parameters.

- ``name``: dotted and lower case (``acme.summarize``): the name a plan's step gives as
  its ``tool``. Defaults to the function's top-level package and its name.
- ``version``: what the schema belongs to; publish a new one when the parameters or the
  output change (the server refuses a version published again with another schema).
- ``cost``: credits one call costs on the fleet, a number (as text or ``Decimal``), or a
  function of the output returning one; without it the operators' price for the tool
  name applies (``BILLING_TOOL_PRICES``). On an ``orch worker`` the server prices the
  job itself (docs/tools.md, "Billing").
- ``errors``: which of the function's own exceptions mean which engine error code
  (``{TimeoutError: "timeout"}``: retried); ``ToolFailure`` names one directly, and
  anything else is ``tool_error``, not retried.
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import logging
import re
from collections.abc import Awaitable, Callable, Mapping
from decimal import Decimal, InvalidOperation
from typing import (
    Any,
    Concatenate,
    Generic,
    ParamSpec,
    Protocol,
    TypeVar,
    cast,
    get_type_hints,
    overload,
)

from orchestrator_client.tools import schema
from orchestrator_client.tools.context import Context
from orchestrator_client.tools.failures import ERROR_CODES, Cancelled, ToolFailure, classify

logger = logging.getLogger("orchestrator_client.tools")

P = ParamSpec("P")
R = TypeVar("R")

NAME_RE = re.compile(r"^[a-z][a-z0-9_]*(\.[a-z][a-z0-9_]*)+$")
NAME_MAX_LENGTH = 64  # what a step row keeps of its tool's name
VERSION_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]{0,39}$")
# A step of a tool that runs on an `orch worker` may say which workers may take it:
# ``params.demands`` (docs/tools.md), so no tool may have a parameter of that name.
RESERVED_PARAMS = frozenset({"demands"})

CostRule = Decimal | str | int | float | Callable[[Any], Decimal | str | int | float]


@dataclasses.dataclass(frozen=True)
class Outcome:
    """What one call of a tool came to: its output as JSON, or a failure."""

    output: Any = None
    failure: ToolFailure | None = None
    cost: Decimal | None = None

    @property
    def ok(self) -> bool:
        return self.failure is None


def _credits(value: Decimal | str | int | float, name: str) -> Decimal:
    try:
        amount = Decimal(str(value))
    except InvalidOperation:
        raise ValueError(f"{name}: cost must be a number of credits, got {value!r}") from None
    if not amount.is_finite() or amount < 0:
        raise ValueError(f"{name}: cost must be a number of credits from 0, got {value!r}")
    return amount


class Tool(Generic[P]):
    """A decorated function: what the server is told of it (``definition``) and how it
    is called with a step's params (``run``, ``arun``). Calling the object calls the
    function as written."""

    def __init__(
        self,
        function: Callable[..., Any],
        *,
        name: str,
        version: str,
        description: str,
        cost: CostRule | None,
        errors: Mapping[type[BaseException], str],
    ) -> None:
        self.function = function
        self.name = name
        self.version = version
        self.is_async = inspect.iscoroutinefunction(function)
        self.errors = dict(errors)
        hints = get_type_hints(function)
        parameters = list(inspect.signature(function).parameters.values())
        self.takes_context = bool(parameters) and hints.get(parameters[0].name) is Context
        if self.takes_context:
            parameters = parameters[1:]
        docs = schema.field_docs(function.__doc__)
        self.fields: list[schema.Field] = []
        for parameter in parameters:
            self._check_parameter(parameter, hints)
            required = parameter.default is inspect.Parameter.empty
            self.fields.append(
                schema.Field(
                    parameter.name,
                    hints[parameter.name],
                    required,
                    None if required else parameter.default,
                    docs.get(parameter.name, ""),
                )
            )
        self.description = description or schema.summary(function.__doc__)
        self.params_schema = _with_defs(lambda defs: schema.object_schema(self.fields, defs))
        self.output_kind = hints.get("return", Any)
        self.output_schema = _with_defs(lambda defs: schema.schema_of(self.output_kind, defs))
        self.cost = cost
        if cost is not None and not callable(cost):
            self.cost = _credits(cost, name)
        self.__doc__ = function.__doc__
        self.__name__ = getattr(function, "__name__", name)
        self.__wrapped__ = function

    def _check_parameter(self, parameter: inspect.Parameter, hints: dict[str, Any]) -> None:
        where = f"{self.name}: parameter {parameter.name!r}"
        if parameter.kind in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD):
            raise TypeError(f"{where}: a tool's parameters are named (no *args or **kwargs)")
        if parameter.kind is inspect.Parameter.POSITIONAL_ONLY:
            raise TypeError(f"{where}: a tool's parameters are passed by name")
        if parameter.name not in hints:
            raise TypeError(f"{where} has no type annotation")
        if hints[parameter.name] is Context:
            raise TypeError(f"{where}: the Context parameter comes first")
        if parameter.name in RESERVED_PARAMS:
            raise TypeError(f"{where}: 'demands' is the step's own (which workers may take it)")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.function(*args, **kwargs)

    def __repr__(self) -> str:
        return f"<tool {self.name} v{self.version}>"

    # ------------------------------------------------------------------ the server's view
    def cost_rule(self) -> dict[str, Any]:
        """The cost rule as published: ``{"credits": "0.02"}``, ``{"computed": true}``
        (from the output), or ``{}`` (the operators' price for the name)."""
        if self.cost is None:
            return {}
        if callable(self.cost):
            return {"computed": True}
        return {"credits": str(self.cost)}

    def definition(self) -> dict[str, Any]:
        """What the server keeps of this version: published by the fleet at start, by an
        ``orch worker`` when it registers."""
        return {
            "name": self.name,
            "version": self.version,
            "description": self.description,
            "params_schema": self.params_schema,
            "output_schema": self.output_schema,
            "cost": self.cost_rule(),
        }

    # ------------------------------------------------------------------ calls
    def arguments(self, params: Mapping[str, Any]) -> dict[str, Any]:
        """The step's params as the function's arguments; ``ToolFailure`` (``invalid_input``,
        not retried) naming the first that does not fit."""
        try:
            return schema.fields_from_json(dict(params), self.fields)
        except schema.InvalidValue as exc:
            raise ToolFailure("invalid_input", str(exc), retryable=False) from None

    def result(self, value: Any) -> Outcome:
        """The function's return value as the step's output (and its cost)."""
        try:
            output = schema.to_json(value)
        except ValueError as exc:
            return Outcome(failure=ToolFailure("invalid_output", str(exc), retryable=False))
        cost = None
        if callable(self.cost):
            try:
                cost = _credits(self.cost(value), self.name)
            except Exception as exc:  # noqa: BLE001 (the rule is the tool's code)
                return Outcome(failure=classify(exc, self.errors))
        elif isinstance(self.cost, Decimal):
            cost = self.cost
        return Outcome(output=output, cost=cost)

    def _call(self, params: Mapping[str, Any], context: Context) -> Any:
        kwargs = self.arguments(params)
        if self.takes_context:
            return self.function(context, **kwargs)
        return self.function(**kwargs)

    def run(
        self,
        params: Mapping[str, Any],
        context: Context,
        *,
        passing: tuple[type[BaseException], ...] = (),
    ) -> Outcome:
        """Call the tool with a step's params, in this thread (an ``async`` tool in an
        event loop of its own); what it raises classified (``failures.classify``) but
        ``passing``, raised on (what the caller's machinery raises through the tool: a
        time limit's exception)."""
        try:
            value = self._call(params, context)
            if inspect.isawaitable(value):
                value = asyncio.run(_awaited(value))
        except passing:
            raise
        except Exception as exc:  # noqa: BLE001 (whatever the tool raises is its outcome)
            return Outcome(failure=self._failure(exc))
        if context.stop_event.is_set() and self.takes_context:
            # It returned after a stop was asked for: not recorded (the step is over).
            return Outcome(failure=classify(_cancelled(), self.errors))
        return self.result(value)

    async def arun(self, params: Mapping[str, Any], context: Context) -> Outcome:
        """``run`` for an event loop: an ``async`` tool awaited in it, a sync one in a
        thread of the loop's executor."""
        try:
            if self.is_async:
                value = await self._call(params, context)
            else:
                value = await asyncio.get_running_loop().run_in_executor(
                    None, self._call, params, context
                )
        except asyncio.CancelledError:
            return Outcome(failure=classify(_cancelled(), self.errors))
        except Exception as exc:  # noqa: BLE001 (whatever the tool raises is its outcome)
            return Outcome(failure=self._failure(exc))
        return self.result(value)

    def _failure(self, exc: Exception) -> ToolFailure:
        failure = classify(exc, self.errors)
        if failure is not exc and not isinstance(exc, Cancelled):
            # Not a failure the tool meant: its traceback is the author's to read.
            logger.warning("tool %s raised %s", self.name, failure.message, exc_info=exc)
        return failure


def _with_defs(build: Callable[[dict[str, schema.JsonSchema]], schema.JsonSchema]) -> Any:
    """A schema with the named types it refers to under ``$defs``."""
    defs: dict[str, schema.JsonSchema] = {}
    built = build(defs)
    return {**built, "$defs": defs} if defs else built


def _cancelled() -> BaseException:
    return Cancelled("the step was cancelled while running")


async def _awaited(value: Awaitable[R]) -> R:
    return await value


class _Decorator(Protocol):
    @overload
    def __call__(self, function: Callable[Concatenate[Context, P], Any], /) -> Tool[P]: ...
    @overload
    def __call__(self, function: Callable[P, Any], /) -> Tool[P]: ...


def _default_name(function: Callable[..., Any]) -> str:
    package = str(getattr(function, "__module__", "") or "").split(".")[0].strip("_").lower()
    return f"{package}.{getattr(function, '__name__', '')}".lower()


def _make(
    function: Callable[..., Any],
    name: str | None,
    version: str,
    description: str,
    cost: CostRule | None,
    errors: Mapping[type[BaseException], str] | None,
) -> Tool[Any]:
    tool_name = name or _default_name(function)
    if not NAME_RE.match(tool_name) or len(tool_name) > NAME_MAX_LENGTH:
        raise ValueError(
            f"tool name {tool_name!r}: dotted and lower case, such as 'acme.summarize' "
            f"(at most {NAME_MAX_LENGTH} characters); give one with @tool(name=...)"
        )
    if not VERSION_RE.match(version):
        raise ValueError(f"{tool_name}: version {version!r}: letters, digits and . _ + -")
    for kind, code in (errors or {}).items():
        if code not in ERROR_CODES:
            raise ValueError(f"{tool_name}: errors: {kind.__name__} -> unknown code {code!r}")
    return Tool(
        function,
        name=tool_name,
        version=version,
        description=description,
        cost=cost,
        errors=errors or {},
    )


# The builder (``orchestrator_client.tools.plan.step``) checks a step's params against
# the function's parameters, the Context aside: hence Tool[P] without it.
@overload
def tool(function: Callable[Concatenate[Context, P], Any], /) -> Tool[P]: ...


@overload
def tool(function: Callable[P, Any], /) -> Tool[P]: ...


@overload
def tool(
    *,
    name: str | None = None,
    version: str = "1",
    description: str = "",
    cost: CostRule | None = None,
    errors: Mapping[type[BaseException], str] | None = None,
) -> _Decorator: ...


def tool(
    function: Callable[..., Any] | None = None,
    /,
    *,
    name: str | None = None,
    version: str = "1",
    description: str = "",
    cost: CostRule | None = None,
    errors: Mapping[type[BaseException], str] | None = None,
) -> Tool[Any] | _Decorator:
    """Make ``function`` a tool (the module's doc); ``@tool`` or ``@tool(...)``."""
    if function is not None:
        return _make(function, name, version, description, cost, errors)

    def decorate(target: Callable[..., Any]) -> Tool[Any]:
        return _make(target, name, version, description, cost, errors)

    return cast(_Decorator, decorate)
