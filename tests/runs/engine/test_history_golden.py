"""Golden histories: what clients read of representative runs, kept equal in kinds,
order and fields whatever the engine stores per step.

Each story below plays one run through the engine in this process, its steps' attempts
made by the worker's own code in the order the story names (tests/runs/engine/
history.py), then reads it as a client does: every page of ``GET /api/v1/runs/{id}/
events`` (following ``next``), the steps' final status, attempts, failures and cost, and
the run's credits (reserved, charged, refunded, held) from the API. That, with only the
values that must differ between runs replaced (ids by order of first appearance, times,
the worker's process id, a local server's port), must equal the story's file in
tests/runs/engine/golden/. The ledger's entries are not compared: how many a step writes
is the engine's choice; what they add up to (the credits) is not. One story is also read
through the event stream, in two parts resumed by ``Last-Event-ID``, as a client that
reconnects does.

When a history changes on purpose, regenerate the files and review their diff::

    UPDATE_GOLDEN=1 PYTEST_ONLY=1 make test PYTEST_ARGS="tests/runs/engine/test_history_golden.py"

A history that changes otherwise fails with the unified diff of its file.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from django.test import Client
from rest_framework.test import APIClient

from billing.models import ApiKey
from billing.pricing import tool_price
from runs.engine.outcomes import Outcome
from runs.models import Run
from tests.api.sse import Block, blocks
from tests.http_fixture import HttpServer
from tests.runs.engine.harness import EngineRun
from tests.runs.engine.history import Driver, History, golden_text, normalised, read
from tests.tenants import Tenant, make_tenant

GOLDEN = Path(__file__).parent / "golden"
UPDATE = os.environ.get("UPDATE_GOLDEN") == "1"

Start = Callable[..., EngineRun]


def steps(*names: str, tool: str = "noop", **fields: Any) -> list[dict[str, Any]]:
    return [{"name": name, "tool": tool, **fields} for name in names]


def task(name: str, *planned: dict[str, Any], **fields: Any) -> dict[str, Any]:
    return {"name": name, "steps": list(planned), **fields}


def agent(name: str, *tasks: dict[str, Any], **fields: Any) -> dict[str, Any]:
    return {"name": name, "tasks": list(tasks), **fields}


def plan(name: str, *agents: dict[str, Any], **fields: Any) -> dict[str, Any]:
    return {"name": name, "agents": list(agents), **fields}


def echo(name: str, **params: Any) -> dict[str, Any]:
    return {"name": name, "tool": "echo", "params": params}


# A retry with no jitter: its backoff is the same on every run.
RETRY = {"max_attempts": 3, "base_delay_ms": 250, "jitter": 0}


# --------------------------------------------------------------------------- stories
def sequence(start: Callable[[dict[str, Any]], Driver]) -> list[Run]:
    run = start(
        plan(
            "sequence",
            agent(
                "writer",
                task(
                    "draft",
                    echo("outline", topic="${variables.topic}"),
                    echo("body", outline="${steps.outline.output.topic}"),
                    *steps("publish"),
                ),
            ),
            variables={"topic": "tides"},
        )
    )
    for name in ("outline", "body", "publish"):
        run.attempt(f"writer.draft.{name}")
    return [run.run]


def fan(start: Callable[[dict[str, Any]], Driver]) -> list[Run]:
    """Four parallel steps, two at a time, then a task that joins them."""
    run = start(
        plan(
            "fan",
            agent(
                "a",
                task("fan", *(echo(f"f{n}", n=n) for n in range(4)), mode="parallel",
                     max_concurrent_steps=2),
                task("join", *steps("merge")),
            ),
        )
    )  # fmt: skip
    # Out of plan order on purpose: the second ends first, the first last.
    for name in ("f1", "f2", "f0", "f3"):
        run.attempt(f"a.fan.{name}")
    run.attempt("a.join.merge")
    return [run.run]


def dag(start: Callable[[dict[str, Any]], Driver]) -> list[Run]:
    """Steps by their dependencies, and agents by theirs."""
    run = start(
        plan(
            "dag",
            agent(
                "extract",
                task(
                    "t",
                    *steps("fetch"),
                    *steps("parse", "index", depends_on=["fetch"]),
                    *steps("merge", depends_on=["parse", "index"]),
                    mode="dag",
                ),
            ),
            agent("load", task("t", *steps("store")), depends_on=["extract"]),
            mode="dag",
        )
    )
    for path in ("extract.t.fetch", "extract.t.index", "extract.t.parse", "extract.t.merge"):
        run.attempt(path)
    run.attempt("load.t.store")
    return [run.run]


def step_retry(start: Callable[[dict[str, Any]], Driver]) -> list[Run]:
    """A retryable failure, its backoff, then a success."""
    flaky = {"name": "flaky", "tool": "fail", "retry": RETRY,
             "params": {"until_attempt": 1, "code": "timeout", "retryable": True}}  # fmt: skip
    run = start(plan("step_retry", agent("a", task("t", flaky, *steps("after")))))
    run.attempt("a.t.flaky", expect="failed")
    run.attempt("a.t.flaky")
    run.attempt("a.t.after")
    return [run.run]


def level_retry(start: Callable[[dict[str, Any]], Driver]) -> list[Run]:
    """A task that retries as a whole: its step fails for good once, and the task's
    next generation runs from its first step again."""
    broken = {"name": "convert", "tool": "fail", "params": {"code": "invalid_input"}}
    run = start(
        plan(
            "level_retry",
            agent("a", task("t", *steps("prepare"), broken, failure_mode="retry")),
        )
    )
    run.attempt("a.t.prepare")
    run.attempt("a.t.convert", expect="failed")
    run.attempt("a.t.prepare")  # generation 1
    # The tool's good day: what `fail` answers past its `until_attempt`.
    run.attempt_as(
        "a.t.convert", Outcome(output={"succeeded_on_attempt": 1}, cost=tool_price("fail"))
    )
    return [run.run]


def replan(start: Callable[[dict[str, Any]], Driver]) -> list[Run]:
    """An agent fails after its retries; the rule planner runs it again with twice the
    attempts, and the run completes."""
    flaky = {"name": "s", "tool": "fail", "retry": {**RETRY, "max_attempts": 2},
             "params": {"until_attempt": 2, "code": "timeout", "retryable": True}}  # fmt: skip
    run = start(
        plan(
            "replan",
            agent("a", task("t", flaky)),
            agent("b", task("t", *steps("s"))),
            failure_mode="continue",
            replan={"agent_failure_ratio": 0.4},
        )
    )
    run.attempt("a.t.s", expect="failed")
    run.attempt("a.t.s", expect="failed")
    run.attempt("b.t.s")
    assert run.replan() == "spawned"
    run.attempt("a-replan1.t.s", expect="failed")
    run.attempt("a-replan1.t.s", expect="failed")
    run.attempt("a-replan1.t.s")
    return [run.run]


def wait(start: Callable[[dict[str, Any]], Driver]) -> list[Run]:
    """A `wait` step parks on its timer, holding no worker, and its claim wakes it."""
    pause = {"name": "pause", "tool": "wait", "params": {"for": "20s"}}
    run = start(plan("wait", agent("a", task("t", *steps("before"), pause, *steps("after")))))
    run.attempt("a.t.before")
    run.attempt("a.t.pause", expect="waiting")
    run.attempt("a.t.pause")
    run.attempt("a.t.after")
    return [run.run]


def callback(
    start: Callable[[dict[str, Any]], Driver], http_server: HttpServer, client: Client
) -> list[Run]:
    """A `callback` step hands its URL to a service and waits; the service's post to the
    URL completes it."""
    http_server.respond("/jobs", status=202, json={"queued": True})
    hook = {
        "name": "hook",
        "tool": "callback",
        "params": {
            "timeout": "1h",
            "request": {
                "url": f"{http_server.url}/jobs",
                "method": "POST",
                "json": {"reply_to": "${callback.url}"},
            },
        },
    }
    run = start(plan("callback", agent("a", task("t", hook, *steps("after")))))
    run.attempt("a.t.hook", expect="completed")
    (sent,) = http_server.requests
    url = sent.json()["reply_to"]
    with run.committed():
        answer = client.post(
            url[url.index("/api/") :],
            {"status": "completed", "result": {"converted": 3}},
            content_type="application/json",
        )
    assert answer.status_code == 200, answer.content
    run.attempt("a.t.after")
    return [run.run]


CHILD = plan(
    "child",
    agent("c", task("t", echo("one", word="${variables.word}"), *steps("two"))),
    variables={"word": "plain"},
)


def child_run(start: Callable[[dict[str, Any]], Driver]) -> list[Run]:
    """A `run` step starts a child run and waits for its end (sync)."""
    params = {"plan": CHILD, "execution_mode": "sync", "variables": {"word": "given"}}
    spawn = {"name": "spawn", "tool": "run", "params": params}
    run = start(plan("parent", agent("a", task("t", spawn, *steps("after")))))
    run.attempt("a.t.spawn", expect="completed")
    child = Run.objects.get(parent_run=run.run)
    run.pick_up(child)
    run.attempt("c.t.one", run=child)
    run.attempt("c.t.two", run=child)
    run.child_ended(Run.objects.get(pk=child.pk))
    run.attempt("a.t.after")
    return [run.run, Run.objects.get(pk=child.pk)]


def approval(start: Callable[[dict[str, Any]], Driver]) -> list[Run]:
    """An approval step waits for a person; the run waits with it; a client approves."""
    review = {"name": "review", "tool": "approval"}
    run = start(plan("approval", agent("a", task("t", *steps("draft"), review, *steps("ship")))))
    run.attempt("a.t.draft")
    assert run.run.status == "waiting_approval"
    run.post("approve", {"comment": "looks right"})
    run.attempt("a.t.ship")
    return [run.run]


def on_error(start: Callable[[dict[str, Any]], Driver]) -> list[Run]:
    """A step fails for good; its on_error handlers run in turn and handle it."""
    risky = {
        "name": "risky",
        "tool": "fail",
        "params": {"code": "invalid_input", "message": "no such sheet"},
        "on_error": [*steps("cleanup"), echo("notify", channel="ops")],
    }
    run = start(plan("on_error", agent("a", task("t", risky, *steps("after")))))
    run.attempt("a.t.risky", expect="failed")
    run.attempt("a.t.risky.on_error.cleanup")
    run.attempt("a.t.risky.on_error.notify")
    run.attempt("a.t.after")
    return [run.run]


def cancel_mid_fan(start: Callable[[dict[str, Any]], Driver]) -> list[Run]:
    """A client cancels a fan with one step done, one running and three not started:
    the running attempt's late result is dropped."""
    run = start(
        plan(
            "cancel",
            agent("a", task("fan", *(echo(f"f{n}", n=n) for n in range(5)), mode="parallel")),
        )
    )
    run.attempt("a.fan.f0")
    running = run.claim("a.fan.f1")
    run.post("cancel", {"reason": "enough"})
    assert not run.record_late(running, Outcome(output={"n": 1}, cost=tool_price("echo")))
    return [run.run]


STORIES: dict[str, Callable[..., list[Run]]] = {
    story.__name__: story
    for story in (
        sequence,
        fan,
        dag,
        step_retry,
        level_retry,
        replan,
        wait,
        callback,
        child_run,
        approval,
        on_error,
        cancel_mid_fan,
    )
}


# --------------------------------------------------------------------------- comparing
def assert_golden(name: str, tenant: Tenant, histories: list[History], *, write: bool) -> None:
    """The story's histories equal its golden file, or the diff says how they differ
    (``UPDATE_GOLDEN=1``: the file is written instead, when ``write``)."""
    path = GOLDEN / f"{name}.json"
    prefix = ApiKey.objects.get(organization=tenant.organization).prefix
    actual = golden_text(normalised(histories, {prefix: "<api key>"}))
    if UPDATE and write:
        path.write_text(actual)
        return
    assert path.exists(), f"no golden file {path}: run with UPDATE_GOLDEN=1 to write it"
    expected = path.read_text()
    if actual != expected:
        diff = difflib.unified_diff(
            expected.splitlines(),
            actual.splitlines(),
            fromfile=f"golden/{name}.json",
            tofile="this run",
            lineterm="",
        )
        pytest.fail(f"the history of {name!r} changed:\n" + "\n".join(diff), pytrace=False)


@pytest.fixture
def tenant(db: None) -> Tenant:
    return make_tenant()


@pytest.fixture
def start(engine_run: Start, tenant: Tenant) -> Callable[[dict[str, Any]], Driver]:
    def started(spec: dict[str, Any]) -> Driver:
        return Driver(engine_run(spec, organization=tenant.organization), tenant.client)

    return started


@pytest.mark.django_db
@pytest.mark.parametrize("name", list(STORIES))
def test_a_runs_history_as_clients_list_it_equals_its_golden_file(
    name: str,
    start: Callable[[dict[str, Any]], Driver],
    tenant: Tenant,
    request: pytest.FixtureRequest,
) -> None:
    story = STORIES[name]
    extra = {
        parameter: request.getfixturevalue(parameter)
        for parameter in story.__code__.co_varnames[1 : story.__code__.co_argcount]
    }
    runs = story(start, **extra)
    assert_golden(name, tenant, [read(tenant.client, run.pk) for run in runs], write=True)


# --------------------------------------------------------------------------- the stream
def stream_lines(response: Any) -> Iterator[str]:
    """The stream's lines as they arrive (frames may hold several events)."""
    rest = ""
    for chunk in response.streaming_content:
        rest += chunk.decode()
        *lines, rest = rest.split("\n")
        yield from lines


def streamed(client: APIClient, run_id: Any, *, after: int | None, stop: int | None) -> list[Any]:
    """The events the run's stream sends after ``after`` (from the start with None),
    until the server closes it or ``stop`` events came (the client then hangs up)."""
    headers = {"Accept": "text/event-stream"}
    if after is not None:
        headers["Last-Event-ID"] = str(after)
    response = client.get(f"/api/v1/runs/{run_id}/events/stream", headers=headers)
    assert response.status_code == 200
    events: list[Block] = []
    try:
        for block in blocks(stream_lines(response)):
            if not block.keepalive:
                events.append(block)
            if stop is not None and len(events) == stop:
                break
    finally:
        response.close()
    return [block.data for block in events]


@pytest.mark.django_db(transaction=True)
def test_a_history_read_through_the_stream_resumed_by_last_event_id_equals_its_golden_file(
    start: Callable[[dict[str, Any]], Driver], tenant: Tenant
) -> None:
    """Committed, as the stream sends only what no transaction can still add to."""
    (run,) = fan(start)
    listed = read(tenant.client, run.pk)

    first = streamed(tenant.client, run.pk, after=None, stop=9)
    rest = streamed(tenant.client, run.pk, after=first[-1]["id"], stop=None)

    assert first + rest == listed.events
    assert_golden("fan", tenant, [History(listed.run, first + rest, listed.steps)], write=False)
