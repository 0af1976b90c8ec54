"""Print the definition of the hot path's function (``runs.engine.hotpath``): the SQL a
new migration must run after the statements it is made of change
(``tests/runs/engine/test_hotpath_function.py`` fails until one does; see
``runs/migrations/0018_engine_step_completed.py`` for the form)."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand

from runs.engine.hotpath import function_sql


class Command(BaseCommand):
    help = "Print the SQL that defines the hot path's function anew."

    def handle(self, *args: Any, **options: Any) -> None:
        for statement in function_sql():
            self.stdout.write(f"{statement};\n")
