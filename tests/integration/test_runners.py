"""The reference runner end to end, with real processes: gunicorn serving the API, the
Celery worker, and `python -m orchestrator.runner` running a command per job."""

from __future__ import annotations

import textwrap
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from billing.services import api_key_create
from runs.models import Runner, RunnerJob
from tests import factories
from tests.integration.engine_support import assert_books_balanced, steps_of, wait_for
from tests.support import Child, child_env, free_port, python_cmd, wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("celery_worker")]


@pytest.fixture(scope="module")
def web(django_db_setup: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """gunicorn on a free loopback port, against the test database; yields its URL."""
    port = free_port()
    log = tmp_path_factory.mktemp("web") / "web.log"
    server = Child(
        python_cmd(
            "-m", "gunicorn", "config.wsgi:application",
            "--bind", f"127.0.0.1:{port}",
            "--worker-class", "gthread", "--threads", "16", "--workers", "1",
            "--timeout", "60",
        ),
        child_env(),
        log,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"

    def up() -> bool:
        if not server.alive():
            raise AssertionError(f"gunicorn exited:\n{server.output()}")
        try:
            return httpx.get(f"{url}/api/schema/", timeout=1).status_code == 200
        except httpx.TransportError:
            return False

    try:
        wait_until(up, timeout=60, what="gunicorn to serve the API")
        yield url
    finally:
        server.stop(timeout=10)
        server.kill_group()


class RunnerProcess:
    def __init__(
        self, organization: Any, url: str, key: str, script: str, log: Path, **options: str
    ) -> None:
        self.organization = organization
        self.script = log.with_suffix(".py")
        self.script.write_text(textwrap.dedent(script))
        args = [
            "-m", "orchestrator.runner",
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


def runner_plan(prompt: str = "hello", **step: Any) -> dict[str, Any]:
    spec = factories.plan(name="runner-e2e")
    spec["agents"][0]["tasks"][0]["steps"] = [
        {"name": "agent", "tool": "runner", "params": {"prompt": prompt}, **step}
    ]
    return spec


def submit_in(organization: Any, spec: dict[str, Any]) -> Any:
    from runs import services

    run = services.run_create(organization=organization, plan=spec)
    return services.run_start(run_id=run.pk)


def test_a_job_runs_on_the_reference_runner_and_completes_its_step(start_runner: Any) -> None:
    organization = factories.org(credits=100)
    runner = start_runner(organization, ECHO)
    registered = runner.registered()

    run = wait_for(submit_in(organization, runner_plan("write a haiku")), timeout=60)

    assert run.status == "completed", steps_of(run)
    step = steps_of(run)["agent"]
    job = RunnerJob.objects.get(step=step)
    assert step.output == {"echo": "write a haiku", "job": str(job.pk), "step": step.pk}
    assert (job.status, job.runner_id) == ("completed", registered.pk)
    assert job.started_at is not None
    assert_books_balanced(run)


def test_a_failing_command_fails_the_step_with_the_tail_of_its_stderr(start_runner: Any) -> None:
    organization = factories.org(credits=100)
    start_runner(organization, FAIL).registered()

    run = wait_for(submit_in(organization, runner_plan(retry={"max_attempts": 1})), timeout=60)

    assert run.status == "failed"
    job = RunnerJob.objects.get(step=steps_of(run)["agent"])
    assert job.status == "failed"
    assert job.error == "the agent crashed"  # trimmed, as every text field is
    assert_books_balanced(run)


def test_cancelling_the_run_stops_its_job_with_sigterm_then_sigkill(
    start_runner: Any, tmp_path: Path
) -> None:
    from runs import services

    organization = factories.org(credits=100)
    runner = start_runner(organization, STUBBORN, kill_after="1")
    runner.registered()
    run = submit_in(organization, runner_plan(timeout="10m"))
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
    run = wait_for(submit_in(organization, runner_plan()), timeout=60)
    assert run.status == "completed", second.child.output()
