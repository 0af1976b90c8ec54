"""The reference runner end to end, with real processes: gunicorn serving the API, the
Celery worker, and `python -m orchestrator_client.runner` running a command per job."""

from __future__ import annotations

import hashlib
import textwrap
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
from django.db import connection

from artifacts import storage
from artifacts.models import Artifact
from billing import quotas
from billing.services import api_key_create
from runs import services
from runs.models import Runner, RunnerJob
from runs.selectors import run_history
from runs.waits import runners
from tests import factories
from tests.integration.engine_support import assert_books_balanced, steps_of, submit, wait_for
from tests.integration.web_support import gunicorn
from tests.support import Child, child_env, python_cmd, wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("celery_worker")]


@pytest.fixture(scope="module")
def web(django_db_setup: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """gunicorn on a free loopback port, against the test database; yields its URL."""
    with gunicorn(tmp_path_factory) as web:
        yield web.url


class RunnerProcess:
    def __init__(
        self, organization: Any, url: str, key: str, script: str, log: Path, **options: str
    ) -> None:
        self.organization = organization
        self.script = log.with_suffix(".py")
        self.script.write_text(textwrap.dedent(script))
        args = [
            "-m", "orchestrator_client.runner",
            "--url", url,
            "--api-key", key,
            "--command", f"{python_cmd()[0]} {self.script}",
            "--hostname", options.pop("hostname", "test-host"),
            "--project-dir", options.pop("project_dir", str(log.parent)),
            "--kill-after", options.pop("kill_after", "1"),
        ]  # fmt: skip
        for name, value in options.items():
            args += [f"--{name.replace('_', '-')}", value]
        self.child = Child(python_cmd(*args), child_env(), log)

    def registered(self) -> Runner:
        def found() -> Runner | None:
            if not self.child.alive():
                raise AssertionError(f"runner exited:\n{self.child.output()}")
            return (
                Runner.objects.filter(organization=self.organization, deregistered_at__isnull=True)
                .order_by("-registered_at")
                .first()
            )

        return wait_until(found, timeout=30, what="the runner to register")

    def stop(self) -> int:
        code = self.child.stop(timeout=20)
        self.child.kill_group()
        return code


@pytest.fixture
def start_runner(web: str, tmp_path: Path) -> Iterator[Any]:
    started: list[RunnerProcess] = []

    def start(organization: Any, script: str, **options: str) -> RunnerProcess:
        _, key = api_key_create(organization=organization, name="runner", scope="runner")
        log = tmp_path / f"runner-{len(started)}.log"
        runner = RunnerProcess(organization, web, key, script, log, **options)
        started.append(runner)
        return runner

    yield start
    for runner in started:
        runner.stop()


ECHO = """
    import json, sys
    job = json.load(sys.stdin)
    print(json.dumps({"echo": job["prompt"], "job": job["id"], "step": job["step"]}))
"""

FAIL = """
    import sys
    sys.stderr.write("the agent crashed\\n")
    sys.exit(3)
"""

# Ignores SIGTERM: only SIGKILL ends it. It says it is ready in a file next to itself.
STUBBORN = """
    import pathlib, signal, sys, time
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    pathlib.Path(sys.argv[0]).with_suffix(".ready").write_text("ready")
    time.sleep(600)
"""


# Uploads what it made as an artifact of the job's run, with the runner's own key, and
# names it in its result (docs/artifacts.md).
UPLOADS = """
    import json, os, sys
    import httpx
    job = json.load(sys.stdin)
    url = f"{os.environ['ORCH_URL']}/api/v1/runs/{os.environ['ORCH_RUN_ID']}/artifacts"
    answer = httpx.post(
        url,
        headers={"Authorization": f"Bearer {os.environ['ORCH_API_KEY']}"},
        data={"name": "report.md"},
        files={"file": ("report.md", b"# made by " + job["prompt"].encode(), "text/markdown")},
        timeout=30,
    )
    answer.raise_for_status()
    print(json.dumps({"artifact": answer.json()["id"]}))
"""


def runner_plan(prompt: str = "hello", **step: Any) -> dict[str, Any]:
    spec = factories.plan(name="runner-e2e")
    spec["agents"][0]["tasks"][0]["steps"] = [
        {"name": "agent", "tool": "runner", "params": {"prompt": prompt}, **step}
    ]
    return spec


def test_a_job_runs_on_the_reference_runner_and_completes_its_step(start_runner: Any) -> None:
    organization = factories.org(credits=100)
    runner = start_runner(organization, ECHO)
    registered = runner.registered()

    run = wait_for(submit(runner_plan("write a haiku"), organization=organization), timeout=60)

    assert run.status == "completed", steps_of(run)
    step = steps_of(run)["agent"]
    job = RunnerJob.objects.get(step=step)
    assert step.output == {"echo": "write a haiku", "job": str(job.pk), "step": step.pk}
    assert (job.status, job.runner_id) == ("completed", registered.pk)
    assert job.started_at is not None
    assert_books_balanced(run)


def test_a_runners_command_uploads_an_artifact_with_the_runners_key(start_runner: Any) -> None:
    organization = factories.org(credits=100)
    start_runner(organization, UPLOADS).registered()

    run = wait_for(submit(runner_plan("the runner"), organization=organization), timeout=60)

    assert run.status == "completed", steps_of(run)
    artifact = Artifact.objects.get(run=run)
    assert steps_of(run)["agent"].output == {"artifact": str(artifact.pk)}
    assert (artifact.name, artifact.size, artifact.status) == ("report.md", 20, "available")
    assert artifact.content_type == "text/markdown"
    data = b"".join(storage.backend().chunks(artifact.key))
    assert data == b"# made by the runner"
    assert artifact.sha256 == hashlib.sha256(data).hexdigest()


def test_a_failing_command_fails_the_step_with_the_tail_of_its_stderr(start_runner: Any) -> None:
    organization = factories.org(credits=100)
    start_runner(organization, FAIL).registered()

    spec = runner_plan(retry={"max_attempts": 1})
    run = wait_for(submit(spec, organization=organization), timeout=60)

    assert run.status == "failed"
    job = RunnerJob.objects.get(step=steps_of(run)["agent"])
    assert job.status == "failed"
    assert job.error == "the agent crashed"  # trimmed, as every text field is
    assert_books_balanced(run)


def test_cancelling_the_run_stops_its_job_with_sigterm_then_sigkill(
    start_runner: Any, tmp_path: Path
) -> None:
    organization = factories.org(credits=100)
    runner = start_runner(organization, STUBBORN, kill_after="1")
    runner.registered()
    run = submit(runner_plan(timeout="10m"), organization=organization)
    ready = runner.script.with_suffix(".ready")
    wait_until(ready.exists, timeout=60, what="the job's command to start")

    services.run_cancel(run_id=run.pk)

    def stopped() -> RunnerJob | None:
        job = RunnerJob.objects.get(run=run)
        return job if job.status == "stopped" else None

    job = wait_until(stopped, timeout=30, what="the runner to report the job stopped")
    assert job.signal == "SIGKILL"  # it ignored SIGTERM
    assert wait_for(run).status == "cancelled"
    assert_books_balanced(run)


def test_a_restarted_runner_reconnects_with_the_same_id(start_runner: Any) -> None:
    organization = factories.org(credits=100)
    hostname = f"host-{uuid.uuid4().hex[:6]}"
    first = start_runner(organization, ECHO, hostname=hostname)
    registered = first.registered()

    assert first.stop() == 0  # SIGTERM: it deregisters on its way out
    registered.refresh_from_db()
    assert registered.deregistered_at is not None
    second = start_runner(organization, ECHO, hostname=hostname)
    again = second.registered()

    assert again.pk == registered.pk
    run = wait_for(submit(runner_plan(), organization=organization), timeout=60)
    assert run.status == "completed", second.child.output()


def _poll(url: str, key: str, runner_id: str, wait: int) -> tuple[httpx.Response, float]:
    response = httpx.get(
        f"{url}/api/v1/runner/jobs",
        params={"runner_id": runner_id, "wait": wait},
        headers={"Authorization": f"Bearer {key}"},
        timeout=wait + 20,
    )
    return response, time.time()


def _poll_until_answered(url: str, key: str, runner_id: str) -> tuple[httpx.Response, float]:
    """Poll again each time a poll ends empty (204), as a runner does: so that every poll is
    held at once even when starting two hundred takes longer than one poll's wait on a busy
    machine (the first would end before the last began)."""
    deadline = time.monotonic() + 240
    while True:
        response, at = _poll(url, key, runner_id, 30)
        if response.status_code != 204 or time.monotonic() > deadline:
            return response, at


def test_a_job_reaches_a_held_poll_within_a_second(web: str, broker: Any) -> None:
    organization = factories.org(credits=100)
    _, key = api_key_create(organization=organization, name="runner", scope="runner")
    runner = runners.register(
        organization=organization, hostname="h", project_dir="/p", executor_type="t"
    ).runner
    channel = runners.organization_channel(organization.pk)
    with ThreadPoolExecutor(max_workers=1) as pool:
        held = pool.submit(_poll, web, key, runner.pk, 20)
        wait_until(
            lambda: dict(broker.pubsub_numsub(channel)).get(channel.encode(), 0) >= 1,
            timeout=10,
            what="the poll to be held",
        )
        run = submit(runner_plan(), organization=organization)
        response, received = held.result(timeout=30)

    assert response.status_code == 200, response.text
    job = RunnerJob.objects.get(run=run)
    assert response.json()["job"]["id"] == str(job.pk)
    latency = received - job.created_at.timestamp()
    print(f"job created -> delivered to the held poll: {latency * 1000:.0f} ms")
    assert latency < 1.0


HELD_POLLS = 200


def database_connections() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()")
        (count,) = cursor.fetchone()
    return int(count)


def test_hundreds_of_held_polls_hold_no_connection_and_do_not_starve_the_api(
    web: str, broker: Any
) -> None:
    organization = factories.org(credits=100)
    quotas.quotas_set(organization.pk, actor="test", runner_polls=HELD_POLLS)  # 100 by default
    _, key = api_key_create(organization=organization, name="runner", scope="runner")
    _, full = api_key_create(organization=organization, name="client", scope="full")
    ids = [
        runners.register(
            organization=organization, hostname=f"h{n}", project_dir="/p", executor_type="t"
        ).runner.pk
        for n in range(HELD_POLLS)
    ]
    channel = runners.organization_channel(organization.pk)
    baseline = database_connections()
    with ThreadPoolExecutor(max_workers=HELD_POLLS) as pool:
        polls = [pool.submit(_poll_until_answered, web, key, runner_id) for runner_id in ids]
        wait_until(
            lambda: dict(broker.pubsub_numsub(channel)).get(channel.encode(), 0) == HELD_POLLS,
            timeout=60,
            what=f"{HELD_POLLS} polls to be held",
        )
        # Every poll is held: the API still answers, and none of them holds PostgreSQL.
        listed = httpx.get(
            f"{web}/api/v1/runners",
            params={"page_size": 1},
            headers={"Authorization": f"Bearer {full}"},
            timeout=10,
        )
        # A poll subscribes, looks once more, then gives its connection back and waits:
        # once all have reached their wait, the web holds what its pool keeps (at most
        # DATABASE_POOL_SIZE, 10: config/gunicorn.py), not a connection per poll.
        connections = wait_until(
            lambda: (count := database_connections()) <= baseline + 10 + 2 and count,
            timeout=30,
            what="the held polls to release their database connections",
        )
        still_held = sum(not poll.done() for poll in polls)
        print(f"{still_held} polls held; database connections {baseline} before, {connections}")
        assert listed.status_code == 200
        assert listed.json()["count"] == HELD_POLLS
        assert still_held == HELD_POLLS
        # Deregistered and woken, each held poll answers at once.
        for runner_id in ids:
            runners.deregister(organization=organization, runner_id=runner_id)
            broker.publish(runners.runner_channel(runner_id), b"wake")
        answers = [poll.result(timeout=30)[0] for poll in polls]

    assert {answer.status_code for answer in answers} == {200}
    assert all(answer.json() == {"deregistered": True} for answer in answers)


def test_two_runners_share_two_hundred_jobs_each_claimed_once(start_runner: Any) -> None:
    organization = factories.org(credits=1000)
    first = start_runner(organization, ECHO, hostname="one", concurrency="4")
    second = start_runner(organization, ECHO, hostname="two", concurrency="4")
    first.registered()
    second.registered()
    spec = factories.plan(name="many-jobs")
    spec["agents"][0]["tasks"][0].update(
        mode="parallel",
        max_concurrent_steps=200,
        steps=[
            {"name": f"job-{n}", "tool": "runner", "params": {"prompt": f"p{n}"}, "timeout": "5m"}
            for n in range(200)
        ],
    )

    run = wait_for(submit(spec, organization=organization), timeout=240)

    assert run.status == "completed"
    jobs = RunnerJob.objects.filter(run=run)
    assert jobs.count() == 200
    assert set(jobs.values_list("status", flat=True)) == {"completed"}
    claims = run_history(run).filter(kind="runner", message__contains="claimed by")
    assert claims.count() == 200  # once each
    by_runner = Counter(jobs.values_list("runner__hostname", flat=True))
    print(f"jobs per runner: {dict(by_runner)}")
    assert set(by_runner) <= {"one", "two"}
    assert_books_balanced(run)
