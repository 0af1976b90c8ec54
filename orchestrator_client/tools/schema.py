"""Type hints as JSON Schema, and JSON values as the types the hints name (and back).

What a tool takes and returns is read from its annotations: ``str``, ``int``, ``float``,
``bool``, ``None``, ``Any``, ``list[T]``, ``tuple[T, ...]``, ``dict[str, T]``,
``Literal[...]``, ``enum.Enum`` subclasses, unions (``T | None``), ``datetime``, ``date``,
``Decimal`` (a string), dataclasses, ``TypedDict`` and pydantic models (when pydantic is
installed; this package does not need it). A dataclass's or TypedDict's fields, and a
function's parameters, take their descriptions from the docstring's ``Args:`` (or
``Attributes:``) section and their defaults from the code.

``from_json`` turns a JSON value into the annotated type, refusing what does not fit
with the path of the first problem (``InvalidValue``): the same rules as the schema, so
a value the server let through (it validates against the schema) converts, and a
harness call is checked as the server would check it.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import enum
import inspect
import re
import types
import typing
from collections.abc import Callable, Mapping
from decimal import Decimal, InvalidOperation
from typing import Any, Literal, Union, cast, get_args, get_origin, get_type_hints

JsonSchema = dict[str, Any]

try:  # pydantic is optional: models are supported where it is installed
    import pydantic

    _BaseModel: type | None = pydantic.BaseModel
except ImportError:  # pragma: no cover - the project's environment has it
    _BaseModel = None


class UnsupportedType(TypeError):
    """An annotation this module cannot describe as JSON (raised when decorating)."""


class InvalidValue(ValueError):
    """A JSON value that does not fit its annotation; ``path`` says where."""

    def __init__(self, path: str, message: str) -> None:
        super().__init__(f"{path}: {message}" if path else message)
        self.path = path
        self.message = message


# --------------------------------------------------------------------------- docstrings
_SECTION = re.compile(r"^\s*(Args|Arguments|Parameters|Attributes|Fields)\s*:\s*$")
_ENTRY = re.compile(r"^(\s*)(\*{0,2}\w+)\s*(?:\([^)]*\))?\s*:\s*(.*)$")


def summary(doc: str | None) -> str:
    """A docstring's text before its first section (``Args:``, ``Returns:``...)."""
    lines = []
    for line in inspect.cleandoc(doc or "").splitlines():
        if re.match(r"^\s*\w+( \w+)?\s*:\s*$", line):
            break
        lines.append(line)
    return " ".join(" ".join(lines).split())


def field_docs(doc: str | None) -> dict[str, str]:
    """The descriptions a Google-style ``Args:`` or ``Attributes:`` section gives."""
    found: dict[str, str] = {}
    inside = False
    indent: int | None = None
    current = ""
    for line in inspect.cleandoc(doc or "").splitlines():
        if _SECTION.match(line):
            inside, indent, current = True, None, ""
            continue
        if not inside:
            continue
        if not line.strip():
            continue
        entry = _ENTRY.match(line)
        depth = len(line) - len(line.lstrip())
        if entry and (indent is None or depth == indent):
            indent = depth
            current = entry.group(2).lstrip("*")
            found[current] = entry.group(3).strip()
        elif current and indent is not None and depth > indent:
            found[current] = f"{found[current]} {line.strip()}".strip()
        elif depth == 0:
            inside = False
    return found


# --------------------------------------------------------------------------- kinds
def _is_typeddict(kind: Any) -> bool:
    return isinstance(kind, type) and typing.is_typeddict(kind)


def _is_model(kind: Any) -> bool:
    return _BaseModel is not None and isinstance(kind, type) and issubclass(kind, _BaseModel)


def _is_union(origin: Any) -> bool:
    return origin is Union or origin is types.UnionType


def _hints(owner: Any) -> dict[str, Any]:
    try:
        return get_type_hints(owner, include_extras=False)
    except NameError as exc:
        raise UnsupportedType(f"cannot resolve the annotations of {owner!r}: {exc}") from exc


# --------------------------------------------------------------------------- schema
def schema_of(kind: Any, defs: dict[str, JsonSchema]) -> JsonSchema:
    """The JSON Schema of an annotation; named types (dataclasses, TypedDicts, models,
    enums) go to ``defs`` once and are referred to as ``#/$defs/Name``."""
    if kind is Any or kind is object:
        return {}
    if kind is None or kind is type(None):
        return {"type": "null"}
    if kind is bool:
        return {"type": "boolean"}
    if kind is int:
        return {"type": "integer"}
    if kind is float:
        return {"type": "number"}
    if kind is str:
        return {"type": "string"}
    if kind is Decimal:
        return {"type": "string", "format": "decimal"}
    if kind is dt.datetime:
        return {"type": "string", "format": "date-time"}
    if kind is dt.date:
        return {"type": "string", "format": "date"}
    origin = get_origin(kind)
    args = get_args(kind)
    if origin is Literal:
        return {"enum": list(args)}
    if _is_union(origin):
        return {"anyOf": [schema_of(arg, defs) for arg in args]}
    if origin in (list, tuple, set, frozenset) or kind in (list, tuple):
        if origin is tuple and args and args[-1] is not Ellipsis:
            return {
                "type": "array",
                "prefixItems": [schema_of(arg, defs) for arg in args],
                "minItems": len(args),
                "maxItems": len(args),
            }
        item = args[0] if args else Any
        return {"type": "array", "items": schema_of(item, defs)}
    if origin in (dict, Mapping) or kind is dict:
        if args and args[0] is not str:
            raise UnsupportedType(f"{kind!r}: a JSON object's keys are strings")
        value = args[1] if len(args) > 1 else Any
        return {"type": "object", "additionalProperties": schema_of(value, defs)}
    if isinstance(kind, type) and issubclass(kind, enum.Enum):
        return _named(kind, defs, lambda: {"enum": [member.value for member in kind]})
    if _is_model(kind):
        return _named(kind, defs, lambda: _model_schema(kind, defs))
    if dataclasses.is_dataclass(kind) and isinstance(kind, type):
        return _named(kind, defs, lambda: _fields_schema(kind, _dataclass_fields(kind), defs))
    if _is_typeddict(kind):
        return _named(kind, defs, lambda: _fields_schema(kind, _typeddict_fields(kind), defs))
    raise UnsupportedType(f"{kind!r} cannot be described as JSON")


def _named(kind: type, defs: dict[str, JsonSchema], build: Callable[[], JsonSchema]) -> JsonSchema:
    name = kind.__name__
    if name not in defs:
        defs[name] = {}  # a recursive type refers to itself while it is built
        defs[name] = build()
    return {"$ref": f"#/$defs/{name}"}


@dataclasses.dataclass(frozen=True)
class Field:
    """A field of an object: a function's parameter, a dataclass's or TypedDict's."""

    name: str
    kind: Any
    required: bool
    default: Any = None
    description: str = ""


def _dataclass_fields(kind: type) -> list[Field]:
    hints = _hints(kind)
    docs = field_docs(kind.__doc__)
    fields = []
    for item in dataclasses.fields(kind):
        if not item.init:
            continue
        default: Any = None
        required = True
        if item.default is not dataclasses.MISSING:
            default, required = item.default, False
        elif item.default_factory is not dataclasses.MISSING:
            default, required = item.default_factory(), False
        description = str(item.metadata.get("description", "")) or docs.get(item.name, "")
        fields.append(Field(item.name, hints[item.name], required, default, description))
    return fields


def _typeddict_fields(kind: type) -> list[Field]:
    # With the extras: ``NotRequired[...]`` written as text (``from __future__ import
    # annotations``) is seen only here, not in ``__required_keys__``.
    try:
        hints = get_type_hints(kind, include_extras=True)
    except NameError as exc:
        raise UnsupportedType(f"cannot resolve the annotations of {kind!r}: {exc}") from exc
    docs = field_docs(kind.__doc__)
    declared = getattr(kind, "__required_keys__", frozenset(hints))
    fields = []
    for name, hint in hints.items():
        required = name in declared
        while (origin := get_origin(hint)) in _WRAPPERS:
            if origin is not typing.Annotated:
                required = origin is typing.Required
            hint = get_args(hint)[0]
        fields.append(Field(name, hint, required, None, docs.get(name, "")))
    return fields


_WRAPPERS = (typing.Required, typing.NotRequired, typing.Annotated)


def _fields_schema(kind: type, fields: list[Field], defs: dict[str, JsonSchema]) -> JsonSchema:
    return object_schema(fields, defs, title=kind.__name__, description=summary(kind.__doc__))


def object_schema(
    fields: list[Field], defs: dict[str, JsonSchema], *, title: str = "", description: str = ""
) -> JsonSchema:
    """An object with ``fields`` as its properties, no others."""
    properties: dict[str, JsonSchema] = {}
    for item in fields:
        prop = dict(schema_of(item.kind, defs))
        if item.description:
            prop["description"] = item.description
        if not item.required:
            prop["default"] = to_json(item.default)
        properties[item.name] = prop
    schema: JsonSchema = {"type": "object", "properties": properties}
    if title:
        schema["title"] = title
    if description:
        schema["description"] = description
    required = [item.name for item in fields if item.required]
    if required:
        schema["required"] = required
    schema["additionalProperties"] = False
    return schema


def _model_schema(kind: Any, defs: dict[str, JsonSchema]) -> JsonSchema:
    schema: JsonSchema = kind.model_json_schema(ref_template="#/$defs/{model}")
    for name, nested in schema.pop("$defs", {}).items():
        defs.setdefault(name, nested)
    return schema


# --------------------------------------------------------------------------- JSON -> Python
def _join(path: str, key: str | int) -> str:
    if isinstance(key, int):
        return f"{path}[{key}]"
    return f"{path}.{key}" if path else key


def _type_name(value: Any) -> str:
    if value is None:
        return "null"
    return {bool: "a boolean", int: "an integer", float: "a number", str: "a string"}.get(
        type(value), "an array" if isinstance(value, list) else "an object"
    )


def from_json(value: Any, kind: Any, path: str = "") -> Any:
    """``value`` (decoded JSON) as ``kind``; ``InvalidValue`` where it does not fit."""
    if kind is Any or kind is object:
        return value
    if kind is None or kind is type(None):
        if value is not None:
            raise InvalidValue(path, f"must be null, got {_type_name(value)}")
        return None
    if kind is bool:
        if not isinstance(value, bool):
            raise InvalidValue(path, f"must be a boolean, got {_type_name(value)}")
        return value
    if kind is int:
        if isinstance(value, bool) or not isinstance(value, int):
            if isinstance(value, float) and value.is_integer():
                return int(value)
            raise InvalidValue(path, f"must be an integer, got {_type_name(value)}")
        return value
    if kind is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise InvalidValue(path, f"must be a number, got {_type_name(value)}")
        return float(value)
    if kind is str:
        if not isinstance(value, str):
            raise InvalidValue(path, f"must be a string, got {_type_name(value)}")
        return value
    if kind in (Decimal, dt.datetime, dt.date):
        return _scalar(value, kind, path)
    origin = get_origin(kind)
    args = get_args(kind)
    if origin is Literal:
        if value not in args:
            raise InvalidValue(path, f"must be one of {list(args)!r}, got {value!r}")
        return value
    if _is_union(origin):
        problems = []
        for arg in args:
            try:
                return from_json(value, arg, path)
            except InvalidValue as exc:
                problems.append(exc.message)
        raise InvalidValue(path, " or ".join(dict.fromkeys(problems)))
    if origin in (list, tuple, set, frozenset) or kind in (list, tuple):
        return _sequence(value, kind, origin, args, path)
    if origin in (dict, Mapping) or kind is dict:
        if not isinstance(value, dict):
            raise InvalidValue(path, f"must be an object, got {_type_name(value)}")
        item = args[1] if len(args) > 1 else Any
        return {key: from_json(v, item, _join(path, key)) for key, v in value.items()}
    if isinstance(kind, type) and issubclass(kind, enum.Enum):
        try:
            return kind(value)
        except ValueError:
            allowed = [member.value for member in kind]
            raise InvalidValue(path, f"must be one of {allowed!r}, got {value!r}") from None
    if _is_model(kind):
        try:
            return kind.model_validate(value)
        except pydantic.ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(part) for part in first["loc"])
            raise InvalidValue(_join(path, where) if where else path, first["msg"]) from None
    if dataclasses.is_dataclass(kind) and isinstance(kind, type):
        return kind(**fields_from_json(value, _dataclass_fields(kind), path))
    if _is_typeddict(kind):
        return fields_from_json(value, _typeddict_fields(kind), path, defaults=False)
    raise InvalidValue(path, f"cannot read a value as {kind!r}")


def _scalar(value: Any, kind: Any, path: str) -> Any:
    if not isinstance(value, str):
        if kind is Decimal and isinstance(value, int | float) and not isinstance(value, bool):
            return Decimal(str(value))
        raise InvalidValue(path, f"must be a string, got {_type_name(value)}")
    try:
        if kind is Decimal:
            return Decimal(value)
        if kind is dt.datetime:
            return dt.datetime.fromisoformat(value)
        return dt.date.fromisoformat(value)
    except (ValueError, InvalidOperation):
        what = {Decimal: "a decimal number", dt.datetime: "an ISO 8601 time"}.get(
            kind, "an ISO 8601 date"
        )
        raise InvalidValue(path, f"must be {what}, got {value!r}") from None


def _sequence(value: Any, kind: Any, origin: Any, args: tuple[Any, ...], path: str) -> Any:
    if not isinstance(value, list):
        raise InvalidValue(path, f"must be an array, got {_type_name(value)}")
    if origin is tuple and args and args[-1] is not Ellipsis:
        if len(value) != len(args):
            raise InvalidValue(path, f"must have {len(args)} items, got {len(value)}")
        pairs = enumerate(zip(value, args, strict=True))
        return tuple(from_json(v, a, _join(path, i)) for i, (v, a) in pairs)
    item = args[0] if args else Any
    items = [from_json(v, item, _join(path, i)) for i, v in enumerate(value)]
    if origin is tuple or kind is tuple:
        return tuple(items)
    if origin in (set, frozenset):
        return origin(items)
    return items


def fields_from_json(
    value: Any, fields: list[Field], path: str = "", *, defaults: bool = True
) -> dict[str, Any]:
    """An object's fields converted: unknown ones refused, missing required ones too;
    ``defaults``: absent optional fields given their default (a TypedDict leaves them out)."""
    if not isinstance(value, dict):
        raise InvalidValue(path, f"must be an object, got {_type_name(value)}")
    known = {item.name: item for item in fields}
    unknown = sorted(set(value) - set(known))
    if unknown:
        raise InvalidValue(
            _join(path, unknown[0]), "is not a parameter" if not path else "is not a field"
        )
    out: dict[str, Any] = {}
    for item in fields:
        if item.name in value:
            out[item.name] = from_json(value[item.name], item.kind, _join(path, item.name))
        elif item.required:
            raise InvalidValue(_join(path, item.name), "is required")
        elif defaults:
            out[item.name] = item.default
    return out


# --------------------------------------------------------------------------- Python -> JSON
def to_json(value: Any) -> Any:
    """A tool's value as JSON: dataclasses and TypedDicts as objects, models dumped,
    enums by value, times and decimals as text, tuples and sets as arrays."""
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            raise ValueError(f"{value!r} is not a JSON number")
        return value
    if isinstance(value, enum.Enum):
        return to_json(value.value)
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, dt.datetime | dt.date):
        return value.isoformat()
    if _BaseModel is not None and isinstance(value, _BaseModel):
        return cast(Any, value).model_dump(mode="json")
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {item.name: to_json(getattr(value, item.name)) for item in dataclasses.fields(value)}
    if isinstance(value, Mapping):
        return {str(key): to_json(item) for key, item in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [to_json(item) for item in value]
    raise ValueError(f"a {type(value).__name__} is not JSON")
