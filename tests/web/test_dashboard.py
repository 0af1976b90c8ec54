"""The operators' dashboard (web/dashboard.py, /admin/dashboard/): each figure
from real rows in the test PostgreSQL and a real Redis, the page for staff only, the page
with the broker down, and (integration) a real worker listed as online."""

from __future__ import annotations

import itertools
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import Any

import pytest
import redis
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from billing.models import Organization
from config.celery import ALL_QUEUES, queue_keys
from runs.models import EscalationTicket, Run, Runner, Step, StepFailure, Task
from tests import factories
from tests.api import states
from tests.support import ROOT, free_port
from web import dashboard

pytestmark = pytest.mark.django_db

PANELS = (
    "panel-runs",
    "panel-throughput",
    "panel-failures",
    "panel-queues",
    "panel-workers",
    "panel-pending",
    "panel-runners",
    "panel-escalations",
)
_names = itertools.count()


@pytest.fixture(autouse=True)
def _no_cached_workers() -> Iterator[None]:
    dashboard.forget_workers()
    yield
    dashboard.forget_workers()


@pytest.fixture
def quiet_broker(settings: Any) -> Iterator[redis.Redis[bytes]]:
    """The test Redis, in a database of its own that no worker listens on."""
    settings.CELERY_BROKER_URL = settings.CELERY_BROKER_URL.rsplit("/", 1)[0] + "/11"
    client: redis.Redis[bytes] = redis.Redis.from_url(settings.CELERY_BROKER_URL)
    client.flushdb()
    yield client
    client.flushdb()
    client.close()


@pytest.fixture
def dead_broker(settings: Any) -> str:
    """A loopback port nothing listens on."""
    settings.CELERY_BROKER_URL = f"redis://127.0.0.1:{free_port()}/0"
    return str(settings.CELERY_BROKER_URL)


@pytest.fixture
def staff(client: Client) -> Client:
    client.force_login(User.objects.create_superuser("ops", "ops@example.com", "a-long-password"))
    return client


def _run(organization: Organization, status: str, changed_at: datetime, **fields: Any) -> Run:
    run = Run.objects.create(
        organization=organization, name=f"run-{next(_names)}", plan={}, status=status, **fields
    )
    Run.objects.filter(pk=run.pk).update(status_changed_at=changed_at)
    return run


def _hierarchy(status: str, changed_at: datetime) -> tuple[Run, Task, Step]:
    run, _, task, step = factories.hierarchy({"run": status})
    Run.objects.filter(pk=run.pk).update(status_changed_at=changed_at)
    return run, task, step


def _completed(task: Task, at: datetime, count: int = 1) -> None:
    for _ in range(count):
        Step.objects.create(
            run_id=task.run_id,
            task=task,
            attempt_number=1,
            name=f"done-{next(_names)}",
            position=0,
            tool="noop",
            status="completed",
            completed_at=at,
        )


def _failed(step: Step, at: datetime, code: str, count: int = 1) -> None:
    for attempt in range(count):
        StepFailure.objects.create(
            run_id=step.run_id,
            attempt_number=1,
            step=step,
            step_attempt=attempt + 1,
            code=code,
            created_at=at,
        )


def _count(html: str, attribute: str, value: str) -> int:
    """The data-count inside the element marked ``attribute="value"``."""
    found = re.search(rf'{attribute}="{re.escape(value)}".*?data-count="(\d+)"', html, re.DOTALL)
    assert found, f"no {attribute}={value} on the page"
    return int(found.group(1))


# --------------------------------------------------------------------------- figures
def test_runs_by_status_counts_live_runs_whenever_and_the_rest_within_a_day() -> None:
    now = timezone.now()
    org = factories.org(credits=0)
    _run(org, "running", now - timedelta(days=3))  # live: counted however old
    _run(org, "pending", now - timedelta(hours=1))
    _run(org, "escalated", now - timedelta(days=9))
    _run(org, "completed", now - timedelta(hours=2))
    _run(org, "completed", now - timedelta(hours=25))  # ended before the window
    _run(org, "failed", now - timedelta(minutes=30))
    _run(org, "created", now - timedelta(hours=1))
    _run(org, "created", now - timedelta(days=2))  # never started, nothing in the window

    runs = dashboard.runs_by_status(now)

    counts = {row.status: row.count for row in runs.statuses}
    assert counts == {
        "created": 1,
        "pending": 1,
        "running": 1,
        "waiting_approval": 0,
        "paused": 0,
        "resuming": 0,
        "retrying": 0,
        "escalated": 1,
        "completed": 1,
        "failed": 1,
        "cancelled": 0,
    }
    assert runs.total == 6
    assert runs.since == now - timedelta(hours=24)
    assert {row.status for row in runs.statuses if row.live} == set(dashboard.LIVE)


def test_steps_per_minute_counts_completions_and_failed_attempts_of_the_last_hour() -> None:
    now = timezone.now().replace(second=30, microsecond=0)
    _, task, step = _hierarchy("running", now - timedelta(hours=5))
    _completed(task, now, 3)  # the current minute, so far
    _completed(task, now - timedelta(minutes=10), 2)
    _completed(task, now - timedelta(minutes=59), 1)  # the oldest minute shown
    _completed(task, now - timedelta(minutes=60, seconds=31), 4)  # before it
    _failed(step, now - timedelta(minutes=10), "timeout", 2)
    _failed(step, now - timedelta(minutes=5), "http_error")
    # A run that ended two hours ago has nothing in the window; one that ended ten
    # minutes ago still counts what it did in it.
    _, old_task, _ = _hierarchy("completed", now - timedelta(hours=2))
    _completed(old_task, now - timedelta(hours=2), 5)
    _, recent_task, _ = _hierarchy("completed", now - timedelta(minutes=10))
    _completed(recent_task, now - timedelta(minutes=20))

    minutes = dashboard.steps_per_minute(now)

    assert len(minutes) == 60
    assert minutes[-1].minute == now.replace(second=0)
    assert minutes[0].minute == now.replace(second=0) - timedelta(minutes=59)
    by_age = {59 - index: (m.completed, m.failed) for index, m in enumerate(minutes) if m.total}
    assert by_age == {0: (3, 0), 5: (0, 1), 10: (2, 2), 20: (1, 0), 59: (1, 0)}


def test_the_chart_scales_to_the_busiest_minute() -> None:
    start = timezone.now().replace(second=0, microsecond=0)
    minutes = [dashboard.MinuteCount(start + timedelta(minutes=n), 0, 0) for n in range(60)]
    minutes[10] = dashboard.MinuteCount(minutes[10].minute, 30, 10)
    minutes[20] = dashboard.MinuteCount(minutes[20].minute, 5, 0)

    chart = dashboard.throughput_chart(minutes)

    busiest, other, idle = chart.bars[10], chart.bars[20], chart.bars[0]
    tallest = dashboard.CHART_HEIGHT - dashboard.CHART_TOP
    assert busiest.completed_height + busiest.failed_height == pytest.approx(tallest)
    assert busiest.completed_height == pytest.approx(3 * busiest.failed_height)
    assert busiest.failed_y + busiest.failed_height == pytest.approx(busiest.completed_y)
    assert other.completed_height == pytest.approx(tallest / 8)
    assert idle.completed_height == idle.failed_height == 0
    assert (chart.peak, chart.total_completed, chart.total_failed) == (40, 35, 10)
    assert chart.per_minute == 0.8
    assert [value for _, value in chart.gridlines] == [20, 40]


@pytest.mark.parametrize(
    ("seconds", "shown"),
    [(0, "0 s"), (40, "40 s"), (425, "7 min 5 s"), (7200, "2 h 0 min"), (273_600, "3 d 4 h")],
)
def test_a_workers_uptime_reads_in_its_two_largest_units(seconds: int, shown: str) -> None:
    worker = dashboard.Worker("w@host", 2, 0, 0, seconds, 1, "")
    assert worker.uptime == shown


def test_top_failure_codes_of_the_last_day_most_frequent_first() -> None:
    now = timezone.now()
    _, _, step = _hierarchy("running", now - timedelta(days=2))
    _, _, other = _hierarchy("failed", now - timedelta(hours=3))
    _failed(step, now - timedelta(hours=1), "service_unavailable", 2)
    _failed(other, now - timedelta(hours=4), "service_unavailable")
    _failed(step, now - timedelta(minutes=5), "timeout")
    _failed(step, now - timedelta(hours=30), "rate_limited", 5)  # before the window
    _, _, ended = _hierarchy("failed", now - timedelta(days=2))
    _failed(ended, now - timedelta(days=2), "rate_limited", 5)

    failures = dashboard.top_failure_codes(now)

    rows = [(row.code, row.attempts, row.runs) for row in failures.codes]
    assert rows == [("service_unavailable", 3, 2), ("timeout", 1, 1)]
    assert failures.codes[0].last_at == now - timedelta(hours=1)
    assert failures.total == 4


def test_steps_waiting_for_rate_limits_are_counted_by_limit_with_the_soonest_due() -> None:
    now = timezone.now()
    _, task, _ = _hierarchy("running", now)
    for n, (reason, due) in enumerate(
        [("rate_limited:openai", 5), ("rate_limited:openai", 2), ("rate_limited:tool:http", 9)]
    ):
        Step.objects.create(
            run_id=task.run_id, task=task, attempt_number=1, name=f"w{n}", position=n + 1,
            tool="noop", status="pending", waiting_reason=reason,
            next_run_at=now + timedelta(seconds=due),
        )  # fmt: skip

    waits = dashboard.rate_limit_waits()

    assert [(w.limit, w.steps) for w in waits] == [("openai", 2), ("tool:http", 1)]
    assert waits[0].next_at == now + timedelta(seconds=2)


def test_steps_waiting_for_a_worker_that_offers_their_tool_are_counted_by_tool() -> None:
    now = timezone.now()
    _, task, _ = _hierarchy("running", now)
    for n, (tool, status, reason) in enumerate(
        [
            ("acme.embed", "running", "no_worker_offers_tool"),
            ("acme.embed", "running", "no_worker_offers_tool"),
            ("acme.summarize", "running", "no_worker_offers_tool"),
            ("acme.summarize", "running", ""),
        ]
    ):
        Step.objects.create(
            run_id=task.run_id, task=task, attempt_number=1, name=f"t{n}", position=n + 1,
            tool=tool, status=status, waiting_reason=reason,
        )  # fmt: skip

    waits = dashboard.worker_tool_waits()

    assert [(w.tool, w.steps) for w in waits] == [("acme.embed", 2), ("acme.summarize", 1)]


def test_top_failure_codes_shows_ten_and_counts_every_failure() -> None:
    now = timezone.now()
    _, _, step = _hierarchy("running", now)
    for index in range(12):
        _failed(step, now - timedelta(minutes=index), f"code_{index:02d}", 12 - index)

    failures = dashboard.top_failure_codes(now)

    assert [row.code for row in failures.codes] == [f"code_{i:02d}" for i in range(10)]
    assert failures.total == sum(range(1, 13))


def test_queue_depths_are_read_from_the_brokers_lists(quiet_broker: redis.Redis[bytes]) -> None:
    normal = queue_keys("runs.normal")
    quiet_broker.lpush("steps", "a", "b", "c")
    quiet_broker.lpush(normal[0], "x")
    quiet_broker.lpush(normal[-1], "y", "z")  # a lower priority's own list
    quiet_broker.hset("unacked", "tag-1", "message")

    queues = dashboard.queue_depths()

    assert queues.reachable
    assert {row.queue: row.depth for row in queues.queues} == {
        "runs.high_priority": 0,
        "runs.normal": 3,
        "steps": 3,
        "sweeps": 0,
        "webhooks": 0,
    }
    assert [row.queue for row in queues.queues] == list(ALL_QUEUES)
    assert queues.unacked == 1


def test_no_worker_listening_is_no_worker_online(quiet_broker: redis.Redis[bytes]) -> None:
    workers = dashboard.workers_online(timeout=0.1)

    assert workers.reachable
    assert workers.workers == []


def test_an_unreachable_broker_is_reported_at_once(dead_broker: str) -> None:
    queues = dashboard.queue_depths()
    started = timezone.now()
    workers = dashboard.workers_online()

    assert not queues.reachable
    assert "Connection refused" in queues.error or "Error 111" in queues.error
    assert not workers.reachable
    assert workers.error
    assert timezone.now() - started < timedelta(seconds=2)  # no connection retries


def test_the_workers_answer_is_kept_briefly(dead_broker: str) -> None:
    first = dashboard.workers_online()
    assert dashboard.workers_online() is first
    dashboard.forget_workers()
    assert dashboard.workers_online() is not first


def test_runners_online_first_stale_ones_named_deregistered_ones_left_out() -> None:
    org = factories.org()
    assert dashboard.runners_online() == dashboard.Runners(0, 0, 0, [])
    online = states.runner(org, "host-a")
    stale = states.runner(org, "host-b")
    gone = states.runner(org, "host-c")
    now = timezone.now()
    Runner.objects.filter(pk=stale.pk).update(last_heartbeat=now - timedelta(hours=1))
    Runner.objects.filter(pk=gone.pk).update(deregistered_at=now)
    states.runner_job(org, holder=online)  # claimed by host-a
    states.runner_job(org)  # waiting for a runner

    runners = dashboard.runners_online(now)

    assert (runners.registered, runners.online, runners.jobs_waiting) == (2, 1, 1)
    rows = [(r.hostname, r.online, r.jobs_held) for r in runners.runners]
    assert rows == [("host-a", True, 1), ("host-b", False, 0)]
    assert runners.runners[0].admin_url == reverse("admin:runs_runner_change", args=[online.pk])
    assert runners.runners[0].tags == ["gpu"]


def test_the_oldest_pending_run_with_its_age_and_reason() -> None:
    now = timezone.now()
    assert dashboard.oldest_pending_run(now) == dashboard.Pending(0, None)
    org = factories.org(credits=0)
    waiting = _run(
        org, "pending", now - timedelta(hours=2), queued_reason="organization limit: 2 running"
    )
    _run(org, "pending", now - timedelta(minutes=10))
    _run(org, "running", now - timedelta(days=1))

    pending = dashboard.oldest_pending_run(now)

    assert pending.count == 2
    assert pending.oldest is not None
    assert pending.oldest.id == str(waiting.pk)
    assert pending.oldest.age == timedelta(hours=2)
    assert pending.oldest.queued_reason == "organization limit: 2 running"
    assert pending.oldest.admin_url == reverse("admin:runs_run_change", args=[waiting.pk])


def test_open_escalations_most_severe_then_oldest_resolved_left_out() -> None:
    now = timezone.now()
    assert dashboard.open_escalations(now) == dashboard.Escalations(0, [])
    org = factories.org()
    older, newer, critical, resolved = (states.escalation(org) for _ in range(4))
    EscalationTicket.objects.filter(pk=older.pk).update(opened_at=now - timedelta(hours=3))
    EscalationTicket.objects.filter(pk=newer.pk).update(opened_at=now - timedelta(hours=1))
    EscalationTicket.objects.filter(pk=critical.pk).update(
        severity="critical", status="acknowledged", opened_at=now - timedelta(minutes=5)
    )
    EscalationTicket.objects.filter(pk=resolved.pk).update(status="resolved")

    escalations = dashboard.open_escalations(now)

    assert escalations.count == 3
    assert [t.id for t in escalations.tickets] == [str(critical.pk), str(older.pk), str(newer.pk)]
    first = escalations.tickets[0]
    assert first.admin_url == reverse("admin:runs_escalationticket_change", args=[critical.pk])
    assert first.run_admin_url == reverse("admin:runs_run_change", args=[critical.run_id])
    assert first.age == timedelta(minutes=5)


# --------------------------------------------------------------------------- the page
def test_the_page_shows_every_panel_with_its_figures(
    staff: Client,
    quiet_broker: redis.Redis[bytes],
    monkeypatch: pytest.MonkeyPatch,
    settings: Any,
) -> None:
    monkeypatch.setattr(dashboard, "INSPECT_TIMEOUT_S", 0.1)
    settings.DASHBOARD_FLOWER_URL = "https://flower.test/"
    now = timezone.now()
    _, task, step = _hierarchy("running", now - timedelta(hours=1))
    _completed(task, now - timedelta(seconds=1), 4)
    _failed(step, now - timedelta(seconds=1), "service_unavailable", 3)
    org = factories.org(credits=0)
    _run(org, "completed", now - timedelta(hours=1))
    _run(org, "completed", now - timedelta(hours=2))
    pending = _run(org, "pending", now - timedelta(hours=2), queued_reason="2 runs ahead")
    ticket = states.escalation(factories.org())
    quiet_broker.lpush("sweeps", "a", "b")

    response = staff.get("/admin/dashboard/")

    assert response.status_code == 200
    html = response.content.decode()
    assert 'id="dashboard"' in html
    for panel in PANELS:
        assert f'id="{panel}"' in html, panel
    assert _count(html, "data-status", "running") == 1
    assert _count(html, "data-status", "escalated") == 1
    assert _count(html, "data-status", "completed") == 2
    assert _count(html, "data-status", "pending") == 1
    assert re.search(r'id="throughput-completed">4<', html)
    assert re.search(r'id="throughput-failed">3<', html)
    assert _count(html, "data-code", "service_unavailable") == 3
    assert _count(html, "data-queue", "sweeps") == 2
    assert _count(html, "data-queue", "steps") == 0
    assert 'id="workers-none"' in html
    assert 'id="runners-none"' in html
    assert reverse("admin:runs_run_change", args=[pending.pk]) in html
    assert "2 runs ahead" in html
    assert reverse("admin:runs_escalationticket_change", args=[ticket.pk]) in html
    assert 'id="flower-link" href="https://flower.test/"' in html
    assert "<script" not in html.split('id="dashboard"', 1)[1]  # server-rendered


def test_the_page_renders_with_the_broker_down(staff: Client, dead_broker: str) -> None:
    states.runner(factories.org())

    response = staff.get("/admin/dashboard/")

    assert response.status_code == 200
    html = response.content.decode()
    assert 'id="queues-unreachable"' in html
    assert 'id="workers-unreachable"' in html
    assert "The broker is unreachable" in html
    for panel in PANELS:
        assert f'id="{panel}"' in html, panel
    assert 'data-runner="' in html


@pytest.mark.parametrize("who", ["anonymous", "not staff"])
def test_only_staff_see_the_page(client: Client, who: str) -> None:
    if who == "not staff":
        client.force_login(User.objects.create_user("someone", password="a-long-password"))

    response = client.get("/admin/dashboard/")

    assert response.status_code == 302
    assert response["Location"] == f"{reverse('admin:login')}?next=/admin/dashboard/"


def test_the_admin_index_links_to_the_dashboard(staff: Client) -> None:
    response = staff.get(reverse("admin:index"))

    assert response.status_code == 200
    html = response.content.decode()
    assert f'id="dashboard-link" href="{reverse("admin-dashboard")}"' in html
    assert 'id="content-main"' in html  # Django's own index is still there


@pytest.mark.parametrize(
    ("environment", "url"),
    [
        ({}, "http://127.0.0.1:5555/"),
        ({"FLOWER_ADDRESS": "::1", "FLOWER_PORT": "6000"}, "http://[::1]:6000/"),
        ({"DASHBOARD_FLOWER_URL": "https://ops.example/flower/"}, "https://ops.example/flower/"),
    ],
)
def test_flower_url_defaults_to_where_flower_listens(environment: dict[str, str], url: str) -> None:
    names = ("DASHBOARD_FLOWER_URL", "FLOWER_ADDRESS", "FLOWER_PORT")
    env = {k: v for k, v in os.environ.items() if k not in names} | environment
    env["DJANGO_SETTINGS_MODULE"] = "config.settings.test"
    read = "from django.conf import settings; print(settings.DASHBOARD_FLOWER_URL)"
    result = subprocess.run(
        [sys.executable, "-c", read], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == url


# --------------------------------------------------------------------------- a real worker
@pytest.mark.integration
def test_a_running_worker_is_listed_online(
    celery_worker: str, staff: Client, settings: Any
) -> None:
    settings.DASHBOARD_FLOWER_URL = "https://flower.example/"

    workers = dashboard.workers_online()

    assert workers.reachable
    listed = {w.name: w for w in workers.workers}
    assert celery_worker in listed
    worker = listed[celery_worker]
    assert worker.concurrency == 2
    assert worker.pid is not None
    assert worker.flower_url == f"https://flower.example/worker/{celery_worker}"
    html = staff.get("/admin/dashboard/").content.decode()
    assert f'data-worker="{celery_worker}"' in html
