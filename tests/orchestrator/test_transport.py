"""Publishing after commit survives a broker outage: the request that committed the
state does not fail, and the lost-message sweep sends the message later."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import transaction
from kombu.exceptions import OperationalError as BrokerError

from config.celery import app
from orchestrator.transport import PICK_UP_TASK
from runs.outbox import Outbox, RunMessage, StepMessage, enqueue_run_message

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def broker_down(monkeypatch: pytest.MonkeyPatch, settings: Any) -> list[str]:
    settings.ORCHESTRATOR_DISPATCH_ENABLED = True
    tried: list[str] = []

    def refuse(name: str, *args: Any, **kwargs: Any) -> None:
        tried.append(name)
        raise BrokerError("Error 111 connecting to 127.0.0.1:6379. Connection refused.")

    monkeypatch.setattr(app, "send_task", refuse)
    return tried


def test_a_run_message_the_broker_refuses_is_logged_not_raised(
    broker_down: list[str], caplog: pytest.LogCaptureFixture
) -> None:
    with transaction.atomic():
        enqueue_run_message(RunMessage.PICK_UP, "00000000-0000-4000-8000-000000000001", 5)

    assert broker_down == [PICK_UP_TASK]
    assert "not published" in caplog.text
    assert "lost-message sweep" in caplog.text


def test_a_publish_that_breaks_otherwise_fails_no_request_and_resets_the_pools(
    monkeypatch: pytest.MonkeyPatch, settings: Any, caplog: pytest.LogCaptureFixture
) -> None:
    # What kombu raised in make chaos when a Redis restart closed a pooled producer's
    # channel under it: not a broker error, and it came out of the after-commit hook.
    settings.ORCHESTRATOR_DISPATCH_ENABLED = True
    closed: list[str] = []

    def broken(name: str, *args: Any, **kwargs: Any) -> None:
        raise AttributeError("'NoneType' object has no attribute 'client'")

    monkeypatch.setattr(app, "send_task", broken)
    monkeypatch.setattr(
        app.amqp.producer_pool, "force_close_all", lambda **kw: closed.append("producers")
    )
    monkeypatch.setattr(app.pool, "force_close_all", lambda **kw: closed.append("connections"))

    with transaction.atomic():
        enqueue_run_message(RunMessage.PICK_UP, "00000000-0000-4000-8000-000000000001", 5)

    assert "not published; the lost-message sweep will resend" in caplog.text
    assert closed == ["producers", "connections"]


def test_step_messages_the_broker_refuses_are_logged_not_raised(
    broker_down: list[str], caplog: pytest.LogCaptureFixture
) -> None:
    with transaction.atomic():
        Outbox().add(StepMessage(step_id=1, run_id="r", priority=5, timeout_s=30))

    assert broker_down == ["orchestrator.steps.doorbell"]
    assert "step messages not published" in caplog.text


def test_nothing_is_published_when_the_transaction_rolls_back(broker_down: list[str]) -> None:
    def enqueue_then_fail() -> None:
        with transaction.atomic():
            enqueue_run_message(RunMessage.PICK_UP, "00000000-0000-4000-8000-000000000001", 5)
            raise RuntimeError("rolled back")

    with pytest.raises(RuntimeError):
        enqueue_then_fail()

    assert broker_down == []


def test_no_step_message_is_delayed_beyond_the_longest_countdown(
    monkeypatch: pytest.MonkeyPatch, settings: Any
) -> None:
    # A countdown beyond the broker's visibility timeout would be delivered twice
    # (celery#2599): a step due in a year gets a message ENGINE_MAX_COUNTDOWN ahead.
    settings.ORCHESTRATOR_DISPATCH_ENABLED = True
    settings.ENGINE_MAX_COUNTDOWN = 600
    sent: list[Any] = []
    monkeypatch.setattr(app, "send_task", lambda name, **kwargs: sent.append(kwargs["countdown"]))

    with transaction.atomic():
        outbox = Outbox()
        outbox.add(StepMessage(1, "00000000-0000-4000-8000-000000000001", 5, 60.0, 366 * 86_400))
        outbox.add(StepMessage(2, "00000000-0000-4000-8000-000000000001", 5, 60.0, 2.5))

    assert sorted(sent) == [2.5, 600]
