"""Statements written once, in ``.sql`` files by name (the manner of procrastinate's
``queries.sql``): an app keeps its hot statements in a folder of its own, one statement
per file, ``queries/<name>.sql``, and runs them by that name with the parameters the
file's header names (``%(run)s``). Nothing assembles SQL from Python strings.

The database's functions and triggers are another matter: they are installed from each
app's ``sql/`` folder in the schema named for the app (``common.database_code``;
docs/engine.md, "Database code"); the files here are plain statements, read once per
process.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any, TypeVar

from django.db import connection
from django.db.models import Model

M = TypeVar("M", bound=Model)


def named(folder: Path) -> Mapping[str, str]:
    """Each ``folder/<name>.sql``'s text by ``name``."""
    return MappingProxyType({path.stem: path.read_text() for path in sorted(folder.glob("*.sql"))})


def fetch(sql: str, params: Mapping[str, Any]) -> tuple[list[str], list[tuple[Any, ...]]]:
    """Run one statement on the default connection: its column names and its rows."""
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        names = [column.name for column in cursor.description or ()]
        return names, cursor.fetchall()


def dicts(
    model: type[Model], names: list[str], rows: list[tuple[Any, ...]]
) -> list[dict[str, Any]]:
    """``rows`` of a statement whose columns are ``names`` as dicts, each column that is
    one of ``model``'s fields converted as the ORM would (a JSON column arrives as text),
    the others as they came: a page of rows to write out, without making a model
    instance of each (a tenth of the cost)."""
    decode = [(names[index], fn) for index, fn in _layout(model, tuple(names))[2] if fn is not None]
    made = []
    for row in rows:
        record = dict(zip(names, row, strict=True))
        for name, fn in decode:
            record[name] = fn(record[name])
        made.append(record)
    return made


def instances(model: type[M], names: list[str], rows: list[tuple[Any, ...]]) -> list[M]:
    """``model`` instances made from ``rows`` of a statement whose columns are ``names``,
    as the ORM makes them (its fields' ``from_db_value``: a JSON column arrives as text);
    a column that is not one of the model's fields becomes an attribute of that name (a
    count, a sum). Fields the statement did not read are deferred, as with ``only()``."""
    fields, extras, convert = _layout(model, tuple(names))
    made = []
    for row in rows:
        values = [row[index] if fn is None else fn(row[index]) for index, fn in convert]
        instance = model.from_db(connection.alias, fields, values)
        for name, index in extras:
            setattr(instance, name, row[index])
        made.append(instance)
    return made


Converter = Callable[[Any], Any]


@functools.cache
def _layout(
    model: type[Model], names: tuple[str, ...]
) -> tuple[frozenset[str], list[tuple[str, int]], list[tuple[int, Converter | None]]]:
    """For ``model`` and columns ``names``: the fields read, the extra columns with their
    positions, and for each field read, in the model's field order (``from_db`` takes
    values in that order), its column's position and its converter."""
    position = {name: index for index, name in enumerate(names)}
    convert: list[tuple[int, Converter | None]] = []
    for field in model._meta.concrete_fields:
        if field.attname in position:
            from_db = getattr(field, "from_db_value", None)
            fn = None if from_db is None else functools.partial(_from_db, from_db)
            convert.append((position[field.attname], fn))
    attnames = {field.attname for field in model._meta.concrete_fields}
    extras = [(name, index) for index, name in enumerate(names) if name not in attnames]
    return frozenset(names) & attnames, extras, convert


def _from_db(from_db_value: Callable[..., Any], value: Any) -> Any:
    return from_db_value(value, None, connection)
