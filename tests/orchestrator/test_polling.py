"""A poll's readings (orchestrator/polling.py), in process against servers on 127.0.0.1:
bounded as the http tool's requests are (a gzip bomb, a server that drips its headers),
stored as text PostgreSQL can hold, counted in the organization's step slots, stopped
while it is suspended, and ending the step as documented whatever a reading met. The
engine plays the worker (tests/runs/engine/harness.py); poll messages are recorded,
not sent. With the real worker: tests/integration/test_waits.py.
"""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

import pytest
from django.db import DataError
from django.utils import timezone

from billing.models import Organization
from common.tools.base import ToolContext
from orchestrator import polling
from orchestrator.tools.asynchronous import poll
from runs.admission import fairness
from runs.engine import control
from runs.engine.outcomes import Outcome
from runs.models import StepWait
from runs.people import suspension
from runs.waits import callbacks
from runs.waits.callbacks import POLL_BODY_LIMIT
from tests import factories
from tests.http_fixture import MEMORY_BOUND, DrippingReceiver, HttpServer, gzip_bomb, peak_memory
from tests.runs.engine.harness import EngineRun

pytestmark = pytest.mark.django_db

MARGIN_S = 1.5  # what a timed reading may overrun its deadline by, on a busy machine
INTERVAL = 2.0


def watching(url: str, **params: Any) -> dict[str, Any]:
    return {
        "name": "p",
        "agents": [{"name": "a", "tasks": [{"name": "t", "steps": [{
            "name": "watch", "tool": "poll", "retry": {"max_attempts": 1},
            "params": {"url": url, "interval": INTERVAL, "max_attempts": 50,
                       "done_when": "${response.body.state} == 'done'", **params},
        }]}]}],
    }  # fmt: skip


def started(engine: EngineRun) -> StepWait:
    """The poll tool run as a worker would, and its wait recorded (reading 1 sent)."""
    step = engine.step("watch")
    ctx = ToolContext(step_id=step.pk, run_id=str(step.run_id), attempt=1, timeout_s=30)
    engine.finish("watch", Outcome(wait=poll(dict(step.params), ctx).wait))
    return StepWait.objects.get(step=step)


def read(engine: EngineRun, wait: StepWait, number: int) -> bool:
    """Reading ``number``'s message, delivered once its countdown has passed (its
    after-commit messages recorded)."""
    StepWait.objects.filter(pk=wait.pk).update(next_poll_at=timezone.now())
    with engine._committed():
        return polling.poll_once(str(wait.pk), number)


def stored(wait: StepWait) -> StepWait:
    return StepWait.objects.get(pk=wait.pk)


# --------------------------------------------------------------------------- bounded
def test_a_reading_of_a_gzip_bomb_keeps_its_first_bytes_having_inflated_little(
    engine_run: Any, http_server: HttpServer
) -> None:
    http_server.respond("/job", body=gzip_bomb(), headers={"Content-Encoding": "gzip"})
    engine = engine_run(watching(f"{http_server.url}/job"))
    wait = started(engine)

    with peak_memory() as peak:
        assert read(engine, wait, 1)

    # Zeros are NUL characters: kept as U+FFFD, up to the cap of the decoded body.
    assert stored(wait).last_response["body"] == "\ufffd" * POLL_BODY_LIMIT
    assert stored(wait).polls == 1
    assert peak() < MEMORY_BOUND


@pytest.mark.timeout(30)  # read by read, a dripping server would hold it for an hour
def test_a_reading_is_cut_at_the_polls_timeout_while_a_server_drips_its_headers(
    engine_run: Any, settings: Any
) -> None:
    settings.HTTP_TOOL_ALLOWED_NETWORKS = ["127.0.0.1/32"]
    with DrippingReceiver() as receiver:
        engine = engine_run(watching(f"{receiver.url}/job", timeout="60s"))
        wait = started(engine)
        # The poll has half a second left: the reading gets no more.
        StepWait.objects.filter(pk=wait.pk).update(
            expires_at=timezone.now() + timedelta(seconds=0.5)
        )
        began = time.monotonic()
        assert read(engine, wait, 1)
        elapsed = time.monotonic() - began
        assert receiver.answered == 1

    assert elapsed < 0.5 + MARGIN_S
    assert stored(wait).last_response["error"].startswith("timeout: no whole answer within")
    # Its next reading would fall past the poll's timeout: the step ends as documented.
    step = engine.step("watch")
    assert (step.status, step.error["cause"]) == ("failed", "timeout")


# --------------------------------------------------------------------------- stored
@pytest.mark.parametrize(
    ("answer", "body"),
    [
        ({"body": b"ok\x00\x00"}, "ok\ufffd\ufffd"),
        ({"json": {"state": "\x00"}}, '{"state": "\\u0000"}'),  # kept as its text
        ({"json": {"state": "\ud800"}}, '{"state": "\\ud800"}'),
        (
            {"body": b'{"state": NaN}', "headers": {"Content-Type": "application/json"}},
            '{"state": NaN}',
        ),
    ],
    ids=["nul in text", "nul in json", "lone surrogate in json", "nan in json"],
)
def test_a_reading_postgresql_could_not_store_is_stored_as_text_it_can(
    engine_run: Any, http_server: HttpServer, answer: dict[str, Any], body: str
) -> None:
    http_server.respond("/job", **answer, times=1)
    http_server.respond("/job", json={"state": "done"})
    engine = engine_run(watching(f"{http_server.url}/job"))
    wait = started(engine)

    assert read(engine, wait, 1)
    assert stored(wait).last_response["body"] == body
    assert engine.transport.polls[-1] == (str(wait.pk), 2, INTERVAL)  # polled on
    assert read(engine, wait, 2)

    assert engine.step("watch").status == "completed"


def test_a_reading_postgresql_still_refuses_counts_as_one_that_got_no_answer(
    engine_run: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A response whatever it holds, as a reader that did not make it storable returns.
    monkeypatch.setattr(polling, "fetch", lambda *args: {"status": 200, "body": "\x00"})
    engine = engine_run(watching("https://status.example/job", timeout="60s"))
    wait = started(engine)

    assert read(engine, wait, 1)

    counted = stored(wait)
    assert counted.polls == 1
    assert counted.last_response == {"error": "the response could not be stored (DataError)"}
    assert engine.transport.polls[-1] == (str(wait.pk), 2, INTERVAL)


def test_a_poll_whose_readings_keep_failing_ends_at_its_timeout_with_timeout(
    engine_run: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(polling, "record_reading", refusing_answers(callbacks.record_reading))
    monkeypatch.setattr(polling, "fetch", lambda *args: {"status": 200, "body": "x"})
    engine = engine_run(watching("https://status.example/job", timeout="60s"))
    wait = started(engine)
    assert read(engine, wait, 1)
    assert read(engine, wait, 2)
    # The poll's timeout comes before its next reading would.
    StepWait.objects.filter(pk=wait.pk).update(expires_at=timezone.now() + timedelta(seconds=1))

    assert read(engine, wait, 3)

    step = engine.step("watch")
    assert (step.status, step.error["cause"]) == ("failed", "timeout")
    assert stored(wait).polls == 3


def refusing_answers(record: Any) -> Any:
    """``record_reading`` refusing every reading that got an answer, as PostgreSQL did a
    NUL: only the readings recorded as answerless go through."""

    def recording(wait_id: Any, number: int, reading: Any) -> bool:
        if "error" not in reading.response:
            raise DataError("\\u0000 cannot be converted to text.")
        return bool(record(wait_id, number, reading))

    return recording


# --------------------------------------------------------------------------- slots
def one_slot_org() -> Organization:
    organization = factories.org()
    Organization.objects.filter(pk=organization.pk).update(max_running_steps=1)
    return organization


def test_a_reading_waits_while_its_organizations_step_slots_are_all_held(
    engine_run: Any, http_server: HttpServer
) -> None:
    http_server.respond("/job", json={"state": "done"})
    organization = one_slot_org()
    engine = engine_run(watching(f"{http_server.url}/job"), organization=organization)
    wait = started(engine)
    held = fairness.acquire_slot(organization.pk, "a step of the same organization")
    assert held is not None

    assert not read(engine, wait, 1)

    assert http_server.requests == []
    assert stored(wait).polls == 0
    assert engine.transport.polls[-1] == (str(wait.pk), 1, polling.NO_SLOT_DELAY_S)
    assert stored(wait).next_poll_at > timezone.now()  # the sweep will not resend it
    fairness.release_slot(held)
    assert read(engine, wait, 1)
    assert len(http_server.requests) == 1
    assert engine.step("watch").status == "completed"


def test_a_reading_holds_one_of_its_organizations_step_slots_while_it_reads(
    engine_run: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    organization = one_slot_org()
    executing: list[int] = []

    def fetch(*args: Any) -> dict[str, Any]:
        executing.append(fairness.steps_executing(organization.pk))
        return {"status": 200, "body": {"state": "running"}}

    monkeypatch.setattr(polling, "fetch", fetch)
    engine = engine_run(watching("https://status.example/job"), organization=organization)
    wait = started(engine)

    assert read(engine, wait, 1)

    assert executing == [1]
    assert fairness.steps_executing(organization.pk) == 0  # given back


# --------------------------------------------------------------------------- suspension
def test_no_reading_leaves_for_a_suspended_organization_and_readings_resume_after(
    engine_run: Any, http_server: HttpServer
) -> None:
    http_server.respond("/job", json={"state": "done"})
    engine = engine_run(watching(f"{http_server.url}/job"))
    wait = started(engine)
    organization = engine.run.organization
    suspension.organization_suspend(organization=organization, reason="abuse")

    assert not read(engine, wait, 1)
    assert not read(engine, wait, 1)  # looked at again after an interval: still held

    assert http_server.requests == []
    assert stored(wait).polls == 0
    assert engine.transport.polls[-1] == (str(wait.pk), 1, INTERVAL)
    assert stored(wait).next_poll_at > timezone.now()
    with engine._committed():
        suspension.organization_unsuspend(organization=organization)
        control.resume(engine.run.pk)  # the resume message the unsuspension sent
    assert read(engine, wait, 1)
    assert len(http_server.requests) == 1
    assert stored(wait).polls == 1
