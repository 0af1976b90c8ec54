"""runs.0026 keeps one step cache entry per organization, tool and key, the newest, before
it makes them unique: a table that piled up one entry per miss migrates."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from django.utils import timezone

from common import database_code
from runs.models import Run, Step
from tests import factories

pytestmark = pytest.mark.django_db(transaction=True)

BEFORE = [("runs", "0025_fewer_index_entries")]
AFTER = [("runs", "0026_one_cache_entry_per_key")]


def test_the_newest_entry_of_each_key_is_kept_and_the_others_dropped() -> None:
    run, _, _, step = factories.hierarchy()
    other_run, _, _, other_step = factories.hierarchy()
    executor = MigrationExecutor(connection)
    executor.migrate(BEFORE)
    executor.loader.build_graph()
    try:
        old = executor.loader.project_state(BEFORE).apps
        entry = old.get_model("runs", "StepCacheEntry")
        now = timezone.now()

        def add(on: Run, at: Step, key: str, tool: str, minutes_ago: int) -> int:
            return int(
                entry.objects.create(
                    organization_id=on.organization_id,
                    run_id=on.pk,
                    step_id=at.pk,
                    key=key,
                    tool=tool,
                    created_at=now - timedelta(minutes=minutes_ago),
                ).pk
            )

        add(run, step, "k", "echo", 30)
        add(run, step, "k", "echo", 20)
        newest = add(run, step, "k", "echo", 10)
        tied = [add(run, step, "tie", "echo", 5), add(run, step, "tie", "echo", 5)]
        other_tool = add(run, step, "k", "http", 40)
        other_organization = add(other_run, other_step, "k", "echo", 50)

        executor.loader.build_graph()
        executor.migrate(AFTER)

        new = executor.loader.project_state(AFTER).apps.get_model("runs", "StepCacheEntry")
        kept = set(new.objects.values_list("pk", flat=True))
        assert kept == {newest, max(tied), other_tool, other_organization}
        assert set(new.objects.values_list("inputs", flat=True)) == {""}
    finally:
        executor.loader.build_graph()
        executor.migrate(executor.loader.graph.leaf_nodes())
        database_code.install(connection)  # the latest schema's code, as `migrate` installs it
