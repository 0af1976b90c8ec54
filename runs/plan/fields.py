"""The field types a plan is declared with (``runs.plan.model``).

Each is a marker in ``Annotated[...]`` that states its constraint once: as pydantic-core
constraints where JSON Schema can say it too (so validation and the OpenAPI schema agree
by construction), in Python where it cannot, or where it depends on the plan limits a
validation runs with (``context={"limits": ...}``; the schema shows the limits in
settings). And each says, in the plan's own words, what it refuses: a refused value is
reported as ``must be an integer from 0 to 9, got 10``, never as pydantic's message.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Any, TypeGuard, get_args

from django.conf import settings
from pydantic import GetCoreSchemaHandler, GetJsonSchemaHandler, ValidationError, ValidationInfo
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import CoreSchema, PydanticCustomError, PydanticOmit, core_schema

from common.errors import ERROR_CODES, RETRYABLE_CODES
from common.tools.published import NAME_RE
from common.tools.registry import tool_names
from runs.plan.durations import (
    DURATION_HELP,
    DURATION_RE,
    MAX_DURATION_MS,
    DurationRefused,
    read_duration_ms,
)
from runs.plan.errors import a, listing, show, suggest
from runs.plan.guard import Limits, json_size

# The error types of what the plan's fields refuse: the message is the project's own.
REFUSED = "plan_refused"
UNKNOWN_FIELD = "plan_unknown_field"

NAME_MAX_LENGTH = 100
RUN_NAME_MAX_LENGTH = 200
# Names are read back in templates (`${tasks.<task>.steps.<step>.output}`): a restricted
# alphabet. Anchored for pydantic-core's regex engine and for JSON Schema readers.
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]*$"
# Credits are stored as DECIMAL(18, 6): at most 12 integer digits and 6 decimals.
CREDITS_RE = re.compile(r"[0-9]+(?:\.[0-9]+)?")
MAX_CREDITS = Decimal(10**12)
CREDITS_QUANTUM = Decimal("0.000001")


def refused(message: str) -> PydanticCustomError:
    """The error a field raises for a value it refuses; ``message`` is shown as is."""
    return PydanticCustomError(REFUSED, "{message}", {"message": message})


def limits_of(info: ValidationInfo) -> Limits:
    """The limits this validation runs with: ``parse_plan``'s, else those in settings."""
    limits = info.context.get("limits") if isinstance(info.context, dict) else None
    return limits if isinstance(limits, Limits) else Limits.from_settings()


def _settings_limit(name: str) -> int:
    """A plan limit as settings have it when the schema is generated."""
    value: int = getattr(Limits.from_settings(), name)
    return value


def _worded(
    inner: CoreSchema,
    refusal: Callable[[Any, Limits], str],
    check: Callable[[Any, Limits], bool] | None = None,
) -> CoreSchema:
    """``inner``, with every refusal worded by ``refusal(value, limits)``, and ``check``
    (if any) run on what ``inner`` accepted."""

    def validate(
        value: Any, handler: core_schema.ValidatorFunctionWrapHandler, info: ValidationInfo
    ) -> Any:
        try:
            result = handler(value)
        except ValidationError:
            raise refused(refusal(value, limits_of(info))) from None
        if check is not None and not check(result, limits_of(info)):
            raise refused(refusal(value, limits_of(info)))
        return result

    return core_schema.with_info_wrap_validator_function(validate, inner)


def _is_list(value: Any) -> TypeGuard[list[Any] | tuple[Any, ...]]:
    return isinstance(value, list | tuple)


# --------------------------------------------------------------------------- numbers
@dataclass(frozen=True)
class Whole:
    """An integer from ``low`` to ``high``; ``high`` may name a plan limit."""

    low: int
    high: int | str

    def __get_pydantic_core_schema__(
        self, source: Any, handler: GetCoreSchemaHandler
    ) -> CoreSchema:
        high = self.high
        inner = core_schema.int_schema(ge=self.low, le=high if isinstance(high, int) else None)

        def top(limits: Limits) -> int:
            return high if isinstance(high, int) else int(getattr(limits, high))

        def refusal(value: Any, limits: Limits) -> str:
            return f"must be an integer from {self.low} to {top(limits)}, got {show(value)}"

        check = None if isinstance(high, int) else (lambda value, limits: value <= top(limits))
        return _worded(inner, refusal, check)

    def __get_pydantic_json_schema__(
        self, schema: CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        json_schema = handler(schema)
        if isinstance(self.high, str):
            json_schema["maximum"] = _settings_limit(self.high)
        return json_schema


@dataclass(frozen=True)
class Number:
    """A number (integers included) from ``low`` to ``high``."""

    low: float
    high: float

    def __get_pydantic_core_schema__(
        self, source: Any, handler: GetCoreSchemaHandler
    ) -> CoreSchema:
        inner = core_schema.float_schema(ge=self.low, le=self.high, allow_inf_nan=False)
        return _worded(
            inner,
            lambda value, _: f"must be a number from {self.low} to {self.high}, got {show(value)}",
        )


# --------------------------------------------------------------------------- text
class OneOf:
    """One of the values of the field's ``Literal[...]``."""

    def __get_pydantic_core_schema__(
        self, source: Any, handler: GetCoreSchemaHandler
    ) -> CoreSchema:
        choices: tuple[str, ...] = get_args(source)

        def refusal(value: Any, _: Limits) -> str:
            hint = suggest(value, choices) if isinstance(value, str) else ""
            return f"must be one of {', '.join(choices)}, got {show(value)}{hint}"

        return _worded(handler(source), refusal)


class NodeName:
    """The name of an agent, task or step: templates read it back, so a restricted
    alphabet (letters, digits, ``_``, ``-``, ``.``) and length."""

    def __get_pydantic_core_schema__(
        self, source: Any, handler: GetCoreSchemaHandler
    ) -> CoreSchema:
        inner = core_schema.str_schema(pattern=NAME_PATTERN, max_length=NAME_MAX_LENGTH)
        return _worded(inner, lambda value, _: _name_refusal(value, NAME_MAX_LENGTH))


class RunName:
    """A run's name: any printable text people will read, bounded."""

    def __get_pydantic_core_schema__(
        self, source: Any, handler: GetCoreSchemaHandler
    ) -> CoreSchema:
        inner = core_schema.str_schema(min_length=1, max_length=RUN_NAME_MAX_LENGTH)
        return _worded(
            inner,
            lambda value, _: _name_refusal(value, RUN_NAME_MAX_LENGTH, free_text=True),
            lambda value, _: bool(value.strip()) and value.isprintable(),
        )


# --------------------------------------------------------------------------- rate limits
RATE_LIMIT_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.:-]*$"
RATE_LIMIT_NAME_MAX_LENGTH = 64
RATE_KEY_MAX_LENGTH = 200
MAX_RATE_UNITS = 1_000_000_000


class RateLimitName:
    """The name of one of the organization's rate limits (``PUT /rate-limits/{name}``)."""

    def __get_pydantic_core_schema__(
        self, source: Any, handler: GetCoreSchemaHandler
    ) -> CoreSchema:
        inner = core_schema.str_schema(
            pattern=RATE_LIMIT_NAME_PATTERN, max_length=RATE_LIMIT_NAME_MAX_LENGTH
        )
        return _worded(
            inner,
            lambda value, _: (
                f"must be a rate limit's name (letters, digits, '_', '.', ':', '-', at most "
                f"{RATE_LIMIT_NAME_MAX_LENGTH} characters), got {show(value)}"
            ),
        )


class RateUnits:
    """Units a step spends: a whole number, or text with a `${...}` template that
    renders to one when the step runs (an `llm` step's estimated tokens)."""

    def __get_pydantic_core_schema__(
        self, source: Any, handler: GetCoreSchemaHandler
    ) -> CoreSchema:
        inner = core_schema.union_schema(
            [
                core_schema.int_schema(ge=1, le=MAX_RATE_UNITS),
                core_schema.str_schema(
                    min_length=1, max_length=RATE_KEY_MAX_LENGTH, pattern=r"\$\{"
                ),
            ]
        )
        return _worded(
            inner,
            lambda value, _: (
                f"must be an integer from 1 to {MAX_RATE_UNITS} or a `${{...}}` template, "
                f"got {show(value)}"
            ),
        )


class RateKey:
    """A rate limit's key: text, `${...}` templates rendered when the step runs; each
    rendered key has a window of its own."""

    def __get_pydantic_core_schema__(
        self, source: Any, handler: GetCoreSchemaHandler
    ) -> CoreSchema:
        inner = core_schema.str_schema(max_length=RATE_KEY_MAX_LENGTH)
        return _worded(
            inner,
            lambda value, _: (
                f"must be text of at most {RATE_KEY_MAX_LENGTH} characters, got {show(value)}"
            ),
        )


MAX_RATE_LIMITS_PER_STEP = 8
CACHE_KEY_MAX_LENGTH = 1000


class CacheKey:
    """A step cache's key: text, `${...}` templates rendered when the step runs."""

    def __get_pydantic_core_schema__(
        self, source: Any, handler: GetCoreSchemaHandler
    ) -> CoreSchema:
        inner = core_schema.str_schema(min_length=1, max_length=CACHE_KEY_MAX_LENGTH)
        return _worded(
            inner,
            lambda value, _: (
                f"must be text of 1 to {CACHE_KEY_MAX_LENGTH} characters, got {show(value)}"
            ),
        )


class RateLimitUses:
    """A step's ``rate_limits``: at most ``MAX_RATE_LIMITS_PER_STEP``, names unique."""

    def __get_pydantic_core_schema__(
        self, source: Any, handler: GetCoreSchemaHandler
    ) -> CoreSchema:
        def validate(
            value: Any, handler: core_schema.ValidatorFunctionWrapHandler, info: ValidationInfo
        ) -> Any:
            if not _is_list(value):
                raise refused(f"must be a list of rate limits, got {a(value)}")
            if len(value) > MAX_RATE_LIMITS_PER_STEP:
                raise refused(
                    f"has {len(value)} rate limits; at most {MAX_RATE_LIMITS_PER_STEP} allowed"
                )
            uses = handler(value)
            names = [use.name for use in uses]
            if len(set(names)) < len(names):
                raise refused("names a rate limit twice")
            return uses

        return core_schema.with_info_wrap_validator_function(validate, _lax_tuple(handler(source)))

    def __get_pydantic_json_schema__(
        self, schema: CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        return {**handler(schema), "maxItems": MAX_RATE_LIMITS_PER_STEP}


CONCURRENCY_KEY_MAX_LENGTH = 255


class ConcurrencyKey:
    """A concurrency key: printable text, bounded; `${variables...}` templates in it are
    rendered when the run is created (a whole-plan check reads them)."""

    def __get_pydantic_core_schema__(
        self, source: Any, handler: GetCoreSchemaHandler
    ) -> CoreSchema:
        inner = core_schema.str_schema(min_length=1, max_length=CONCURRENCY_KEY_MAX_LENGTH)
        return _worded(
            inner,
            lambda value, _: _name_refusal(value, CONCURRENCY_KEY_MAX_LENGTH, free_text=True),
            lambda value, _: bool(value.strip()) and value.isprintable(),
        )


def _name_refusal(value: Any, limit: int, free_text: bool = False) -> str:
    if not isinstance(value, str):
        return f"must be a string, got {a(value)}"
    if not value.strip():
        return "must not be empty"
    if len(value) > limit:
        return f"is {len(value)} characters long; at most {limit}"
    if free_text:
        return "must be printable text (no control characters)"
    return (
        f"{show(value)} is not a valid name: use letters, digits, '_', '-' and '.', "
        "starting with a letter or digit"
    )


class ToolName:
    """A tool's name. Whether the tool exists is a whole-plan check (``runs.plan.checks``),
    reported with the known tools; the schema lists those registered."""

    def __get_pydantic_core_schema__(
        self, source: Any, handler: GetCoreSchemaHandler
    ) -> CoreSchema:
        return _worded(
            core_schema.str_schema(), lambda value, _: f"must be a tool name, got {a(value)}"
        )

    def __get_pydantic_json_schema__(
        self, schema: CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        # A published tool (docs/tools.md) has a dotted name; which exist is the
        # organization's catalogue's (GET /api/v1/tools), checked at submission. The
        # built-in names stay the API's component ToolEnum (api.schema), the type
        # generated clients name them by.
        return {
            **handler(schema),
            "anyOf": [
                {"type": "string", "enum": sorted(tool_names()), "x-component": "ToolEnum"},
                {"pattern": NAME_RE.pattern, "description": "a published tool: GET /api/v1/tools"},
            ],
        }


class PlannerName:
    """A planner's name: one of ``settings.ORCH_PLANNERS`` (operators configure planners;
    a plan may only pick among them)."""

    def __get_pydantic_core_schema__(
        self, source: Any, handler: GetCoreSchemaHandler
    ) -> CoreSchema:
        def refusal(value: Any, _: Limits) -> str:
            names = sorted(settings.ORCH_PLANNERS)
            hint = suggest(value, names) if isinstance(value, str) else ""
            return f"must be one of {', '.join(names)}, got {show(value)}{hint}"

        return _worded(
            core_schema.str_schema(), refusal, lambda value, _: value in settings.ORCH_PLANNERS
        )

    def __get_pydantic_json_schema__(
        self, schema: CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        return {**handler(schema), "enum": sorted(settings.ORCH_PLANNERS)}


class Condition:
    """A ``when`` condition: its syntax and references are whole-plan checks."""

    def __get_pydantic_core_schema__(
        self, source: Any, handler: GetCoreSchemaHandler
    ) -> CoreSchema:
        return _worded(
            core_schema.str_schema(min_length=1),
            lambda value, _: f"must be a non-empty expression string, got {show(value)}",
            lambda value, _: bool(value.strip()),
        )


# --------------------------------------------------------------------------- objects
@dataclass(frozen=True)
class JsonObject:
    """A JSON object of anything, at most ``max_bytes`` (a plan limit) as JSON."""

    max_bytes: str | None = None

    def __get_pydantic_core_schema__(
        self, source: Any, handler: GetCoreSchemaHandler
    ) -> CoreSchema:
        max_bytes = self.max_bytes

        def size_of(value: Any, limits: Limits) -> tuple[int | None, int]:
            return json_size(value), int(getattr(limits, max_bytes or ""))

        def refusal(value: Any, limits: Limits) -> str:
            if not isinstance(value, dict) or max_bytes is None:
                return f"must be an object, got {a(value)}"
            size, limit = size_of(value, limits)
            return f"must be at most {limit} bytes as JSON, got {size}"

        def check(value: Any, limits: Limits) -> bool:
            if max_bytes is None:
                return True
            size, limit = size_of(value, limits)
            return size is not None and size <= limit

        return _worded(handler(source), refusal, check)


# --------------------------------------------------------------------------- lists
@dataclass(frozen=True)
class Children:
    """A level's children: a non-empty list of at most ``limit`` (a plan limit) entries.

    Counted before the entries are read: a list far over the limit is not walked.
    """

    limit: str

    def __get_pydantic_core_schema__(
        self, source: Any, handler: GetCoreSchemaHandler
    ) -> CoreSchema:
        limit = self.limit

        def validate(
            value: Any, handler: core_schema.ValidatorFunctionWrapHandler, info: ValidationInfo
        ) -> Any:
            if not _is_list(value):
                raise refused(f"must be a non-empty list, got {a(value)}")
            if not value:
                raise refused("must not be empty")
            maximum = getattr(limits_of(info), limit)
            if len(value) > maximum:
                raise refused(f"has {len(value)} entries; at most {maximum} allowed")
            return handler(value)  # the entries' own problems, at their paths

        return core_schema.with_info_wrap_validator_function(validate, _lax_tuple(handler(source)))

    def __get_pydantic_json_schema__(
        self, schema: CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        return {**handler(schema), "minItems": 1, "maxItems": _settings_limit(self.limit)}


class Handlers:
    """A step's ``on_error`` handlers: at most ``max_on_error``, possibly none."""

    def __get_pydantic_core_schema__(
        self, source: Any, handler: GetCoreSchemaHandler
    ) -> CoreSchema:
        def validate(
            value: Any, handler: core_schema.ValidatorFunctionWrapHandler, info: ValidationInfo
        ) -> Any:
            if not _is_list(value):
                raise refused(f"must be a list of steps, got {a(value)}")
            maximum = limits_of(info).max_on_error
            if len(value) > maximum:
                raise refused(f"has {len(value)} handlers; at most {maximum} allowed")
            return handler(value)

        return core_schema.with_info_wrap_validator_function(validate, _lax_tuple(handler(source)))

    def __get_pydantic_json_schema__(
        self, schema: CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        return {**handler(schema), "maxItems": _settings_limit("max_on_error")}


@dataclass(frozen=True)
class SiblingNames:
    """``depends_on``: names of siblings (``what``: agent, task or step). Whether they
    exist, repeat or form a cycle are whole-plan checks."""

    what: str

    def __get_pydantic_core_schema__(
        self, source: Any, handler: GetCoreSchemaHandler
    ) -> CoreSchema:
        return _worded(
            _lax_tuple(handler(source)),
            lambda value, _: f"must be a list of {self.what} names, got {show(value)}",
        )


class ErrorCodes:
    """``retry_on``: retryable error codes, each once (a repeat is dropped)."""

    def __get_pydantic_core_schema__(
        self, source: Any, handler: GetCoreSchemaHandler
    ) -> CoreSchema:
        def validate(value: Any, handler: core_schema.ValidatorFunctionWrapHandler) -> Any:
            if not _is_list(value):
                raise refused(f"must be a list of error codes, got {a(value)}")
            return tuple(dict.fromkeys(handler(value)))

        inner = _lax_tuple(handler(source))
        return core_schema.no_info_wrap_validator_function(validate, inner)


class ErrorCode:
    """One of ``retry_on``: a retryable error code."""

    def __get_pydantic_core_schema__(
        self, source: Any, handler: GetCoreSchemaHandler
    ) -> CoreSchema:
        def refusal(value: Any, _: Limits) -> str:
            if not isinstance(value, str) or value not in ERROR_CODES:
                hint = suggest(value, ERROR_CODES) if isinstance(value, str) else ""
                return (
                    f"unknown error code {show(value)}{hint}; retry_on takes the retryable "
                    f"codes ({listing(RETRYABLE_CODES)})"
                )
            return (
                f"'{value}' is never retried; retry_on can only narrow the retryable codes "
                f"({listing(RETRYABLE_CODES)})"
            )

        return _worded(core_schema.literal_schema(sorted(RETRYABLE_CODES)), refusal)

    def __get_pydantic_json_schema__(
        self, schema: CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        return {**handler(schema), "type": "string"}


def _lax_tuple(schema: CoreSchema) -> CoreSchema:
    """A tuple field that takes the JSON list it is given (a strict tuple takes only a
    tuple); its entries stay strict."""
    return {**schema, "strict": False}


class NotForHandlers:
    """A step's field that its ``on_error`` handlers do not have: refused there as an
    unknown field, and left out of their schema."""

    def __get_pydantic_core_schema__(
        self, source: Any, handler: GetCoreSchemaHandler
    ) -> CoreSchema:
        def refuse(value: Any) -> Any:
            raise PydanticCustomError(UNKNOWN_FIELD, "unknown field")

        return core_schema.no_info_plain_validator_function(refuse)

    def __get_pydantic_json_schema__(
        self, schema: CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        raise PydanticOmit


# --------------------------------------------------------------------------- values
@dataclass(frozen=True)
class Duration:
    """A duration in whole milliseconds, written ``"30s"``, ``"250ms"``, ``"1.5h"``,
    ``"7d"`` or as a number of seconds; at most a year, or ``maximum`` (a plan limit)."""

    maximum: str | None = None

    def __get_pydantic_core_schema__(
        self, source: Any, handler: GetCoreSchemaHandler
    ) -> CoreSchema:
        maximum = self.maximum

        def validate(value: Any, info: ValidationInfo) -> int:
            limit = MAX_DURATION_MS
            if maximum is not None:
                limit = min(limit, int(getattr(limits_of(info), maximum)))
            try:
                return read_duration_ms(value, maximum_ms=limit)
            except DurationRefused as exc:
                raise refused(str(exc)) from None

        written = core_schema.union_schema(
            [
                core_schema.str_schema(pattern=f"^{DURATION_RE.pattern}$"),
                core_schema.float_schema(gt=0),
            ]
        )
        return core_schema.with_info_plain_validator_function(
            validate, json_schema_input_schema=written
        )

    def __get_pydantic_json_schema__(
        self, schema: CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        return {**handler(schema), "description": DURATION_HELP}


class Credits:
    """Credits: a positive decimal below 10^12 with at most 6 decimals, as a number or a
    string (``"12.5"``)."""

    def __get_pydantic_core_schema__(
        self, source: Any, handler: GetCoreSchemaHandler
    ) -> CoreSchema:
        written = core_schema.union_schema(
            [
                core_schema.str_schema(pattern=rf"^\s*{CREDITS_RE.pattern}\s*$"),
                core_schema.float_schema(gt=0, lt=float(MAX_CREDITS)),
            ]
        )
        return core_schema.no_info_plain_validator_function(
            _credits, json_schema_input_schema=written
        )


def _credits(raw: Any) -> Decimal:
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
        raise refused(
            f"must be a positive number below {MAX_CREDITS} with at most 6 decimals, "
            f"got {show(raw)}"
        )
    return value
