"""The line of a shared bucket (runs.admission.step_admission), in process against PostgreSQL:
organizations take turns by share (one organization's priority-0 stream never pushes
another's steps back for ever), priority orders each organization's own steps, a
re-planning moves a bounded number of steps, and a wait of days has no message in the
broker until the wake sweep sends it, on time (runs.engine.dispatch.wake_asleep)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import datetime, timedelta
from typing import Any

import pytest

from billing.models import Organization
from config.celery import app
from orchestrator.transport import EXECUTE_STEP_TASK, CeleryTransport
from ratelimits import selectors as limits
from ratelimits.models import RateGrant, RateLimit
from runs.admission import step_admission
from runs.engine import dispatch
from runs.models import Step
from runs.outbox import use_transport
from tests import factories
from tests.runs.engine.harness import EngineRun, RecordingTransport

pytestmark = pytest.mark.django_db

PERIOD_MS = 10_000  # one unit every 10 s: the test's own time never frees one


@pytest.fixture
def shared_tool() -> Iterator[RateLimit]:
    """An operators' limit on the `noop` tool: one bucket for every organization."""
    limit = RateLimit.objects.create(name="noop", tool="noop", limit=1, period_ms=PERIOD_MS)
    limits.forget_tool_limits()
    yield limit
    limits.forget_tool_limits()


@pytest.fixture
def fan(
    transport: RecordingTransport, django_capture_on_commit_callbacks: Any
) -> Callable[..., EngineRun]:
    """A started run of ``width`` parallel `noop` steps s0, s1, ..."""

    def start(
        width: int, *, priority: int = 5, organization: Organization | None = None
    ) -> EngineRun:
        spec = factories.plan(name="fan", steps=0, priority=priority)
        spec["agents"][0]["tasks"][0] = {
            "name": "t",
            "mode": "parallel",
            "max_concurrent_steps": width,
            "steps": [factories.step(f"s{n}") for n in range(width)],
        }
        return EngineRun(
            spec, transport, django_capture_on_commit_callbacks, organization=organization
        )

    return start


def ask(run: EngineRun, name: str) -> step_admission.Admission:
    """A worker claims the step and asks for its units, as the executor does."""
    attempt = run.claim(name)
    step = run.step(name)
    with run.committed():
        return step_admission.admit(
            step_id=step.pk, run_id=run.run.pk, attempt=attempt, tool="noop", wanted=()
        )


def line() -> list[int | None]:
    """The steps waiting in the bucket, in the order of their moments."""
    return list(
        RateGrant.objects.filter(bucket="t:noop", used=False)
        .order_by("granted_at", "id")
        .values_list("step_id", flat=True)
    )


def moment(run: EngineRun, name: str) -> datetime:
    grant = RateGrant.objects.get(step_id=run.step(name).pk, used=False)
    return grant.granted_at


def test_a_priority_0_flood_takes_turns_with_another_organizations_steps(
    shared_tool: RateLimit, fan: Callable[..., EngineRun]
) -> None:
    flood = fan(12, priority=0)
    calm = fan(3, priority=9)
    assert ask(flood, "s0").go  # the bucket's one unit
    for n in range(1, 6):
        assert ask(flood, f"s{n}").until is not None
    for n in range(3):
        assert ask(calm, f"s{n}").until is not None
    # The flood goes on, priority 0, while the other organization's steps wait.
    for n in range(6, 12):
        ask(flood, f"s{n}")

    waiting = line()
    flood_ids = [flood.step(f"s{n}").pk for n in range(1, 12)]
    calm_ids = [calm.step(f"s{n}").pk for n in range(3)]
    # Turns: one of each organization's in its order, while both have steps waiting.
    assert waiting[:6] == [
        flood_ids[0], calm_ids[0], flood_ids[1], calm_ids[1], flood_ids[2], calm_ids[2]
    ]  # fmt: skip
    assert waiting[6:] == flood_ids[3:]
    # Each step's row says when it is woken, as its reservation does.
    for n in range(3):
        assert calm.step(f"s{n}").next_run_at == moment(calm, f"s{n}")
    assert max(moment(calm, f"s{n}") for n in range(3)) < moment(flood, "s6")


def test_priority_orders_an_organizations_own_steps(
    shared_tool: RateLimit, fan: Callable[..., EngineRun]
) -> None:
    organization = factories.org()
    later = fan(3, priority=9, organization=organization)
    urgent = fan(2, priority=0, organization=organization)
    assert ask(later, "s0").go
    ask(later, "s1")
    ask(later, "s2")
    ask(urgent, "s0")
    ask(urgent, "s1")

    assert line() == [
        urgent.step("s0").pk, urgent.step("s1").pk, later.step("s1").pk, later.step("s2").pk
    ]  # fmt: skip


def test_an_organization_of_share_2_gets_two_turns_for_one(
    shared_tool: RateLimit, fan: Callable[..., EngineRun]
) -> None:
    heavy = factories.org()
    Organization.objects.filter(pk=heavy.pk).update(share=2)
    one = fan(5)
    two = fan(4, organization=heavy)
    assert ask(one, "s0").go
    for n in range(1, 5):
        ask(one, f"s{n}")
    for n in range(4):
        ask(two, f"s{n}")

    owner = {step.pk: "one" for step in Step.objects.filter(run=one.run)}
    owner |= {step.pk: "two" for step in Step.objects.filter(run=two.run)}
    assert [owner[step_id] for step_id in line()] == [
        "two", "one", "two", "two", "one", "two", "one", "one"
    ]  # fmt: skip


def test_a_step_jumps_the_line_by_at_most_the_replanning_bound(
    shared_tool: RateLimit, fan: Callable[..., EngineRun], settings: Any
) -> None:
    settings.RATE_LIMIT_REPLAN_MAX = 5
    flood = fan(21)
    assert ask(flood, "s0").go
    for n in range(1, 21):
        ask(flood, f"s{n}")
    before = set(RateGrant.objects.values_list("pk", flat=True))

    ask(fan(1), "s0")

    after = set(RateGrant.objects.values_list("pk", flat=True))
    # Five steps re-planned, the newcomer and the four at the back of the line: it goes
    # before those four, not before the sixteen ahead of them.
    assert len(after - before) == 5
    newcomer = line().index(Step.objects.exclude(run__in=[flood.run]).get().pk)
    assert newcomer == 16


def test_a_wait_of_days_has_no_message_until_the_wake_sweep_sends_it_on_time(
    shared_tool: RateLimit,
    fan: Callable[..., EngineRun],
    settings: Any,
    monkeypatch: pytest.MonkeyPatch,
    django_capture_on_commit_callbacks: Any,
) -> None:
    RateLimit.objects.filter(pk=shared_tool.pk).update(period_ms=86_400_000)  # one a day
    limits.forget_tool_limits()
    sent: list[tuple[str, Any, Any]] = []

    def send_task(name: str, args: Any = (), **options: Any) -> None:
        sent.append((name, tuple(args), options.get("countdown")))

    monkeypatch.setattr(app, "send_task", send_task)
    run = fan(3)
    use_transport(CeleryTransport())  # as a worker publishes (the fixture restores it)
    assert ask(run, "s0").go
    ask(run, "s1")
    ask(run, "s2")  # two days ahead

    # Nothing in the broker for a wait beyond the horizon: the rows hold it.
    assert sent == []
    asleep = Step.objects.filter(run=run.run, asleep=True).order_by("next_run_at")
    assert [step.name for step in asleep] == ["s1", "s2"]
    assert settings.RATE_LIMIT_MAX_COUNTDOWN_S == 300
    first = asleep[0]
    assert first.next_run_at is not None
    assert dispatch.asleep_next_due() == first.next_run_at - timedelta(seconds=300)

    # The wake sweep sends nothing before it is needed...
    with django_capture_on_commit_callbacks(execute=True):
        assert dispatch.wake_asleep(now=first.next_run_at - timedelta(seconds=301)) == 0
    assert sent == []
    # ... then the step's own message, with the countdown to its moment, once.
    with django_capture_on_commit_callbacks(execute=True):
        assert dispatch.wake_asleep(now=first.next_run_at - timedelta(seconds=100)) == 1
        assert dispatch.wake_asleep(now=first.next_run_at - timedelta(seconds=99)) == 0
    assert sent == [(EXECUTE_STEP_TASK, (first.pk,), 100.0)]
    assert list(Step.objects.filter(run=run.run, asleep=True)) == [run.step("s2")]
