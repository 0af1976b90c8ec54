"""common.statements: named placeholders converted once, the same rows either way."""

from __future__ import annotations

import uuid
from decimal import Decimal

import pytest
from django.db import IntegrityError, connection, transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from common.statements import Statement

pytestmark = pytest.mark.django_db

# Long on purpose: psycopg caches its own conversion only up to 4,096 characters.
PADDING = "\n".join(f"-- line {n} of a comment that makes the statement long" for n in range(90))
TYPED = Statement(
    PADDING
    + """
SELECT %(id)s::uuid, %(amount)s::numeric + %(amount)s, %(when)s::timestamptz,
       %(name)s || '%%', %(missing)s::text IS NULL
"""
)


def test_names_become_numbers_once_each_and_percent_signs_unescape() -> None:
    statement = Statement("SELECT %(b)s, %(a)s, %(b)s, '100%%' WHERE x LIKE 'a%%'")

    assert statement.native == "SELECT $1, $2, $1, '100%' WHERE x LIKE 'a%'"
    assert statement.names == ("b", "a")
    assert len(TYPED.text) > 4096


def test_positional_placeholders_are_refused() -> None:
    with pytest.raises(ValueError, match="named placeholders only"):
        Statement("SELECT %s")


def test_the_raw_path_and_the_logged_path_return_the_same_rows() -> None:
    params = {
        "id": uuid.uuid4(),
        "amount": Decimal("1.25"),
        "when": timezone.now(),
        "name": "fifty",
        "missing": None,
        "unused": object(),  # ignored, as psycopg ignores a mapping's extra keys
    }

    raw = TYPED.rows(params)
    with CaptureQueriesContext(connection) as logged_queries:
        logged = TYPED.rows(params)

    assert raw == logged == [(params["id"], Decimal("2.50"), params["when"], "fifty%", True)]
    # The logged path is in the query log, with the named text.
    assert [query["sql"] for query in logged_queries.captured_queries][-1].startswith("-- line 0")


def test_a_statement_without_rows_returns_none_and_errors_are_djangos() -> None:
    with connection.cursor() as cursor:
        cursor.execute("CREATE TEMPORARY TABLE statement_probe (id int PRIMARY KEY)")
    insert = Statement("INSERT INTO statement_probe (id) VALUES (%(id)s)")

    assert insert.rows({"id": 1}) == []
    with pytest.raises(IntegrityError), transaction.atomic():
        insert.rows({"id": 1})
