"""common/copy.py: rows inserted with COPY are the rows bulk_create would have written."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest
from django.forms.models import model_to_dict

from common.copy import copy_insert
from runs.models import Step
from tests import factories

pytestmark = pytest.mark.django_db


def _steps(task: Any, prefix: str) -> list[Step]:
    """Steps with every kind of column set: JSON of every shape, text with quotes,
    tabs, newlines and backslashes (COPY's own escapes), NULLs, decimals."""
    return [
        Step(
            run_id=task.run_id,
            task=task,
            attempt_number=task.attempt_number,
            name=f"{prefix}{index}",
            position=index,
            tool="http",
            params={"url": "http://127.0.0.1/\t\\N\n", "nested": [1, {"a": None}], "q": "'\""},
            when="${steps.x.output.ok} == true" if index % 2 else "",
            on_error=[{"name": "fix", "tool": "noop"}] if index == 1 else [],
            retry={"max_attempts": 3, "jitter": 0.5},
            timeout_ms=None if index else 1500,
            depends_on=[f"{prefix}{index - 1}"] if index else [],
            pending_dependencies=1 if index else 0,
            dependents=[f"{prefix}{index + 1}"],
            output=None if index else {"\\N": "\\N"},
            cost=Decimal("1.250000"),
        )
        for index in range(4)
    ]


def _columns(step: Step) -> dict[str, Any]:
    values = model_to_dict(step, exclude=["id"])
    values["name"] = values["name"][1:]  # the prefixes differ by design
    values["depends_on"] = [name[1:] for name in values["depends_on"]]
    values["dependents"] = [name[1:] for name in values["dependents"]]
    return values


def test_copy_insert_writes_what_bulk_create_writes() -> None:
    _, _, task, _ = factories.hierarchy()

    Step.objects.bulk_create(_steps(task, "b"))
    assert copy_insert(Step, iter(_steps(task, "c"))) == 4

    created = {s.name: s for s in Step.objects.filter(task=task, name__regex=r"^[bc]\d$")}
    for index in range(4):
        bulk, copied = created[f"b{index}"], created[f"c{index}"]
        assert _columns(copied) == _columns(bulk)
        assert copied.created_at is not None
        assert copied.status_changed_at is not None
