"""The hot path's function in the database is the one its statements make.

``runs.engine.hotpath`` generates ``engine_step_completed`` from the statements it holds;
a migration freezes that definition. A change to a statement without a migration that
defines the function anew would leave databases recording steps the old way: this
fails until one does (``manage.py engine_function`` prints the SQL to put in it).
"""

from __future__ import annotations

import pytest
from django.db import connection

from runs.engine.hotpath import FUNCTION_NAME, function_body

pytestmark = pytest.mark.django_db


def test_the_migrated_function_is_the_one_the_statements_make() -> None:
    with connection.cursor() as cursor:
        cursor.execute("SELECT prosrc FROM pg_proc WHERE proname = %s", [FUNCTION_NAME])
        rows = cursor.fetchall()

    assert len(rows) == 1, f"{FUNCTION_NAME} is defined {len(rows)} times"
    assert rows[0][0] == function_body(), (
        "runs/engine/hotpath.py changed without a migration defining the function anew "
        "(python manage.py engine_function prints it; see runs/migrations/0019)"
    )


def test_the_command_prints_what_defines_the_function() -> None:
    from io import StringIO

    from django.core.management import call_command

    out = StringIO()
    call_command("engine_function", stdout=out)

    assert f"DROP FUNCTION IF EXISTS {FUNCTION_NAME};" in out.getvalue()
    assert function_body() in out.getvalue()
