"""Run by tests/client/test_generated_client.py with the python of openapi-python-client's
own virtualenv, which holds nothing of this project: the client generated from the served
OpenAPI document (the package ``orchestrator_api``) creates a dag run, starts it, follows
it to its end and reads its steps and events, a page of five at a time. What it read goes
to stdout as one JSON document, for the test to check; any answer the generated code
cannot read, or that is not the one expected, ends it with a message and exit status 1.

Usage: python drive_generated_client.py GENERATED_DIR BASE_URL API_KEY
"""

from __future__ import annotations

import json
import sys
import time
import uuid
from typing import Any
from urllib.parse import parse_qs, urlsplit

GENERATED, BASE_URL, API_KEY = sys.argv[1:]
sys.path.insert(0, GENERATED)

# The generated package exists only while the test runs (mypy never sees it).
from orchestrator_api import AuthenticatedClient  # type: ignore[import-not-found]  # noqa: E402
from orchestrator_api.api.runs import (  # type: ignore[import-not-found]  # noqa: E402
    runs_create,
    runs_events,
    runs_retrieve,
    runs_start,
    runs_steps,
)
from orchestrator_api.models import (  # type: ignore[import-not-found]  # noqa: E402
    CreateInputRequest,
    CursorPaginatedEventList,
    ModeEnum,
    PaginatedStepList,
    Plan,
    PlanAgent,
    PlanStep,
    PlanStepParams,
    PlanTask,
    PlanVariables,
    RunDetailOutput,
    RunStatusEnum,
    ToolEnum,
)
from orchestrator_api.types import UNSET  # type: ignore[import-not-found]  # noqa: E402

TERMINAL = {RunStatusEnum.COMPLETED, RunStatusEnum.FAILED, RunStatusEnum.CANCELLED}
FOLLOW_FOR_S = 60


def answer(response: Any, status: int, model: type) -> Any:
    """The parsed body of ``response``, which must be ``status`` and read as ``model``."""
    if response.status_code != status or not isinstance(response.parsed, model):
        sys.exit(
            f"expected {status} {model.__name__}, got {response.status_code}: {response.content!r}"
        )
    return response.parsed


def task(name: str, depends_on: list[str], **params: Any) -> PlanTask:
    """A task of one echo step ``s``, whose output is its (rendered) params."""
    step = PlanStep(name="s", tool=ToolEnum.ECHO, params=PlanStepParams.from_dict(params))
    return PlanTask(name=name, depends_on=depends_on, steps=[step])


# A diamond and its outputs passed along: fetch, then left and right at once, then join.
PLAN = Plan(
    name="generated-client-dag",
    variables=PlanVariables.from_dict({"topic": "chips"}),
    agents=[
        PlanAgent(
            name="research",
            mode=ModeEnum.DAG,
            max_concurrent_tasks=4,
            tasks=[
                task("fetch", [], topic="${variables.topic}"),
                task("left", ["fetch"], side="left", topic="${tasks.fetch.steps.s.output.topic}"),
                task("right", ["fetch"], side="right", topic="${tasks.fetch.steps.s.output.topic}"),
                task(
                    "join",
                    ["left", "right"],
                    left="${tasks.left.steps.s.output.side}",
                    right="${tasks.right.steps.s.output.side}",
                ),
            ],
        )
    ],
)


def main() -> None:
    with AuthenticatedClient(
        base_url=BASE_URL, token=API_KEY, raise_on_unexpected_status=True
    ) as client:
        body = CreateInputRequest(plan=PLAN)
        key = str(uuid.uuid4())
        run = answer(
            runs_create.sync_detailed(client=client, body=body, idempotency_key=key),
            201,
            RunDetailOutput,
        )
        statuses = [run.status]
        run = answer(runs_start.sync_detailed(run.id, client=client), 200, RunDetailOutput)
        statuses.append(run.status)

        deadline = time.monotonic() + FOLLOW_FOR_S
        while run.status not in TERMINAL:
            if time.monotonic() > deadline:
                sys.exit(f"run {run.id} still {run.status} after {FOLLOW_FOR_S} s")
            time.sleep(0.2)
            run = answer(runs_retrieve.sync_detailed(run.id, client=client), 200, RunDetailOutput)
            statuses.append(run.status)

        steps = answer(
            runs_steps.sync_detailed(run.id, client=client, page_size=100), 200, PaginatedStepList
        )

        # Events by cursor, five a page: `next` carries the cursor of the page after.
        events, pages, cursor = [], 0, UNSET
        while True:
            page = answer(
                runs_events.sync_detailed(run.id, client=client, cursor=cursor, page_size=5),
                200,
                CursorPaginatedEventList,
            )
            events += page.results
            pages += 1
            if page.next_ is None or not page.results:
                break
            cursor = parse_qs(urlsplit(page.next_).query)["cursor"][0]

    # Everything below is read from the generated models: enums by value, dates parsed.
    json.dump(
        {
            "id": str(run.id),
            "statuses": [status.value for status in statuses],
            "progress": run.progress.to_dict(),
            "outputs": run.outputs.to_dict(),
            "steps": [
                {
                    "path": f"{step.agent_name}.{step.task_name}.{step.name}",
                    "status": step.status.value,
                    "started_at": step.started_at and step.started_at.isoformat(),
                    "completed_at": step.completed_at and step.completed_at.isoformat(),
                    "output": step.output,
                }
                for step in steps.results
            ],
            "step_count": steps.count,
            "events": [
                {
                    "id": event.id,
                    "entity": event.entity,
                    "path": event.path,
                    "kind": event.kind.value,
                    "to_status": event.to_status,
                }
                for event in events
            ],
            "event_pages": pages,
        },
        sys.stdout,
    )


if __name__ == "__main__":
    main()
