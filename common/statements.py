"""Long SQL statements of the hot path, sent without psycopg parsing them on every call.

psycopg turns ``%(name)s`` placeholders into PostgreSQL's own ``$1, $2...`` and caches
the result, but only for a query of at most 4,096 characters
(``psycopg._queries.MAX_CACHED_STATEMENT_LENGTH``). The engine's one-statement paths
(``runs.engine.hotpath``) are two to nine kilobytes of CTEs, so every step paid a regex
split of its statement in the worker: about 0.3 ms, an eighth of a sequential step's
whole cost. A ``Statement`` is written with named placeholders like any other query,
converted once when its module is imported, and executed through a ``psycopg.RawCursor``
(PostgreSQL-style placeholders: the text goes out as it is, only the values are adapted,
as psycopg adapts them for the named form). The text is the same on every call, so
psycopg still prepares it after its connection's ``prepare_threshold``.

The raw cursor goes through Django's cursor wrapper (``make_cursor``), so database
errors are Django's and ``execute_wrapper`` hooks see it. Django's query log cannot
render ``$n`` placeholders, so while queries are logged (``DEBUG``, or a test's
``CaptureQueriesContext``) the named text goes through an ordinary cursor instead: the
same statement, parsed the slow way, and in the log.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from django.db import connection
from psycopg import RawCursor

# A psycopg placeholder, or its escaped percent sign.
_PLACEHOLDER = re.compile(r"%\((\w+)\)s|%%|%s")


class Statement:
    """One SQL statement with ``%(name)s`` placeholders, run in the caller's transaction
    on the default database."""

    def __init__(self, text: str) -> None:
        self.text = text
        numbers: dict[str, int] = {}

        def native(match: re.Match[str]) -> str:
            if match.group(0) == "%%":
                return "%"
            name = match.group(1)
            if name is None:
                raise ValueError("a Statement takes named placeholders only, not %s")
            # A name used twice is one parameter, sent once.
            return f"${numbers.setdefault(name, len(numbers) + 1)}"

        self.native = _PLACEHOLDER.sub(native, text)
        self.names = tuple(numbers)

    def rows(self, params: Mapping[str, Any]) -> list[tuple[Any, ...]]:
        """Execute it with ``params`` (a value for each name; more are ignored) and return
        its rows (none for a statement that returns none)."""
        if connection.queries_logged:
            with connection.cursor() as cursor:
                cursor.execute(self.text, params)
                return cursor.fetchall() if cursor.description else []
        values = [params[name] for name in self.names]
        connection.ensure_connection()
        # Typed as taking Django's wrapper in django-stubs; Django wraps a DB-API cursor.
        raw: Any = RawCursor(connection.connection)
        with connection.make_cursor(raw) as cursor:
            cursor.execute(self.native, values)
            return cursor.fetchall() if cursor.description else []
