"""Every plan in examples/ run for real, as its own first lines say to run it: the
installed `orch` against the live server (real HTTP on 127.0.0.1) and the session's real
Celery worker (tests/conftest.py); the runner job claimed by the reference runner, a
process of its own; the schedule fired by a real `celery beat`. Each test first holds
the example's comment to the command it runs, so that the two cannot drift apart."""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Iterator
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command

from billing.models import Organization
from orchestrator.tools import packages
from runs.models import Run, Runner, RunnerJob
from schedules.models import ScheduleFire
from tests import factories
from tests.client.conftest import Orch, orch_env
from tests.integration.engine_support import steps_of, wait_for
from tests.support import ROOT, Child, child_env, python_cmd, wait_until

pytestmark = [
    pytest.mark.integration,
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("celery_worker"),
]

EXAMPLES = ROOT / "examples"


def example(name: str, *commands: str) -> str:
    """``examples/<name>``, as its comment names it, once the comment is seen to give
    each of ``commands`` (its lines joined where they end with a backslash)."""
    text = (EXAMPLES / name).read_text()
    comment = " ".join(
        line.lstrip("#").strip().removesuffix("\\") for line in text.splitlines() if line[:1] == "#"
    )
    comment = re.sub(r"\s+", " ", comment)
    for command in commands:
        assert command in comment, f"examples/{name} no longer says {command!r}"
    return f"examples/{name}"


def run_of(result: subprocess.CompletedProcess[str]) -> Run:
    """The run a `submit --watch` created, once it has exited 0."""
    assert result.returncode == 0, (result.stdout, result.stderr)
    found = re.search(r"^run (\S+) \(", result.stdout, re.M)
    assert found, result.stdout
    return Run.objects.get(pk=found[1])


def read_until(process: subprocess.Popen[str], pattern: str) -> re.Match[str]:
    """Lines of a running ``orch`` until one matches (it prints as it goes)."""
    assert process.stdout is not None
    seen = []
    for line in process.stdout:
        seen.append(line)
        if found := re.search(pattern, line):
            return found
    raise AssertionError(f"orch ended without printing {pattern!r}:\n{''.join(seen)}")


@pytest.fixture
def tenant(live_server: Any) -> tuple[Organization, str]:
    return factories.org_with_key()


@pytest.fixture
def orch(live_server: Any, tenant: tuple[Organization, str], tmp_path: Path) -> Orch:
    """`orch`, logged in to the live server as ``tenant``, run from the checkout (where
    the examples' paths start)."""
    _, key = tenant
    return Orch(orch_env(tmp_path, ORCH_URL=live_server.url, ORCH_API_KEY=key), ROOT)


def test_every_example_has_its_test_here() -> None:
    assert sorted(path.name for path in EXAMPLES.iterdir()) == [
        "acme_tools",  # the package of tools.yaml's tools (its own test below)
        "approval.yaml",
        "dag.yaml",
        "hello.yaml",
        "runner-job.yaml",
        "schedule.yaml",
        "tools.yaml",
    ]


def test_hello_runs_its_sequence_to_completion(orch: Orch) -> None:
    plan = example("hello.yaml", ".venv/bin/orch runs submit examples/hello.yaml --watch")

    run = run_of(orch.run("runs", "submit", plan, "--watch", "--interval", "0.2", timeout=120))

    assert run.status == "completed"
    steps = steps_of(run)
    assert [steps[name].status for name in ("hello", "think", "reply")] == ["completed"] * 3
    assert steps["reply"].output == {"heard": "hello, world"}


def test_the_dag_retries_its_flaky_step_and_reports_what_it_gathered(orch: Orch) -> None:
    plan = example("dag.yaml", ".venv/bin/orch runs submit examples/dag.yaml --watch")

    run = run_of(orch.run("runs", "submit", plan, "--watch", "--interval", "0.2", timeout=120))

    assert run.status == "completed"
    steps = steps_of(run)
    assert {step.status for step in steps.values()} == {"completed"}
    assert (steps["flaky"].attempts, steps["flaky"].failures) == (2, 1)
    assert steps["c"].output == {"words": 2, "characters": 8}
    assert steps["summary"].output == {"topic": "AI chips", "words": 2}


def test_the_approval_waits_for_a_person_then_publishes(orch: Orch) -> None:
    plan = example(
        "approval.yaml",
        ".venv/bin/orch runs submit examples/approval.yaml --watch",
        '.venv/bin/orch runs approve RUN_ID --comment "looks right"',
    )
    watching = orch.start("runs", "submit", plan, "--watch", "--interval", "0.2")
    try:
        run_id = read_until(watching, r"run (\S+) \(release\) created")[1]
        read_until(watching, r"WAITING publisher\.release\.sign-off \(step \d+\) for approval")
        waiting = Run.objects.get(pk=run_id).status
        approved = orch.run("runs", "approve", run_id, "--comment", "looks right")
        code = watching.wait(timeout=60)
    finally:
        watching.kill()
        watching.communicate()

    assert waiting == "waiting_approval"
    assert approved.returncode == 0, approved.stderr
    assert code == 0
    run = Run.objects.get(pk=run_id)
    assert run.status == "completed"
    assert steps_of(run)["publish"].output == {"published": "v1.2: faster starts"}


def test_the_runner_job_is_claimed_by_a_runner_and_completes(
    orch: Orch, tenant: tuple[Organization, str], live_server: Any, tmp_path: Path
) -> None:
    plan = example(
        "runner-job.yaml",
        ".venv/bin/python -m orchestrator_client.runner --url $URL --api-key $KEY "
        "--tags example --command cat",
        ".venv/bin/orch runs submit examples/runner-job.yaml --watch",
    )
    organization, key = tenant
    runner = Child(
        python_cmd(
            "-m", "orchestrator_client.runner", "--url", live_server.url, "--api-key", key,
            "--tags", "example", "--command", "cat",
        ),
        child_env(),
        tmp_path / "runner.log",
    )  # fmt: skip

    def registered() -> Runner | None:
        if not runner.alive():
            raise AssertionError(f"the runner exited:\n{runner.output()}")
        return Runner.objects.filter(organization=organization).first()

    try:
        online = wait_until(registered, timeout=30, what="the runner to register")
        run = run_of(orch.run("runs", "submit", plan, "--watch", "--interval", "0.2", timeout=120))
    finally:
        runner.stop(timeout=20)
        runner.kill_group()

    assert run.status == "completed"
    job = RunnerJob.objects.get(run=run)
    assert (job.status, job.runner_id, job.demands) == (
        "completed",
        online.pk,
        {"tags": ["example"]},
    )
    # `cat` hands the job back: the job as the runner received it is the step's output.
    assert job.result["prompt"] == "Research AI chips"
    assert steps_of(run)["read"].output == {"prompt": "Research AI chips"}


def test_the_tools_run_one_on_the_fleet_and_one_on_a_worker(
    orch: Orch, tenant: tuple[Organization, str], live_server: Any, tmp_path: Path
) -> None:
    plan = example(
        "tools.yaml",
        ".venv/bin/orch worker acme_tools.worker",
        ".venv/bin/orch runs submit examples/tools.yaml --watch",
    )
    packages.publish("fleet")  # what each fleet worker does at its start
    organization, key = tenant
    orch_bin = str(Path(sys.executable).parent / "orch")
    worker = Child(
        [orch_bin, "worker", "acme_tools.worker"],
        child_env(ORCH_URL=live_server.url, ORCH_API_KEY=key),
        tmp_path / "worker.log",
    )

    def registered() -> Runner | None:
        if not worker.alive():
            raise AssertionError(f"the worker exited:\n{worker.output()}")
        return Runner.objects.filter(organization=organization).first()

    try:
        online = wait_until(registered, timeout=30, what="the worker to register")
        run = run_of(orch.run("runs", "submit", plan, "--watch", "--interval", "0.2", timeout=120))
    finally:
        worker.stop(timeout=20)
        worker.kill_group()

    assert run.status == "completed"
    steps = steps_of(run)
    assert steps["stats"].output["sentences"] == 4
    assert steps["summary"].output == {
        "summary": "Tools are typed Python functions. The fleet runs some of them.",
        "sentences": 2,
    }
    job = RunnerJob.objects.get(run=run)
    assert (job.tool, job.runner_id, job.status) == ("acme.summarize", online.pk, "completed")


@pytest.fixture
def beat(transactional_db: None, celery_worker: str, tmp_path: Path) -> Iterator[Child]:
    """The periodic tasks installed as `make run` installs them, then a real beat."""
    call_command("setup_periodic_tasks", stdout=StringIO())
    beat = Child(
        python_cmd("-m", "celery", "-A", "config", "beat", "--pidfile=", "--loglevel", "INFO"),
        child_env(LOG_LEVEL="INFO"),
        tmp_path / "beat.log",
    )
    try:
        yield beat
    finally:
        beat.stop(timeout=10)
        beat.kill_group()


def test_the_schedule_fires_a_run_when_due(orch: Orch, beat: Child) -> None:
    plan = example(
        "schedule.yaml",
        ".venv/bin/orch schedules create examples/schedule.yaml --every 1m --var service=billing",
        ".venv/bin/orch schedules pause SCHEDULE_ID",
    )
    # Every second rather than every minute: the first due time comes one interval after
    # the schedule's creation, and a test does not wait a minute for it.
    schedule = orch.json("schedules", "create", plan, "--every", "1s", "--var", "service=billing")

    def fired() -> ScheduleFire | None:
        if not beat.alive():
            raise AssertionError(f"beat exited:\n{beat.output()}")
        return ScheduleFire.objects.filter(schedule_id=schedule["id"], status="fired").first()

    fire = wait_until(fired, timeout=60, what="the schedule's first due time to fire")
    paused = orch.json("schedules", "pause", schedule["id"])
    assert fire.run_id is not None
    run = wait_for(Run.objects.get(pk=fire.run_id), timeout=60)

    assert paused["status"] == "paused"
    assert fire.kind == "scheduled"
    assert (run.status, run.created_by) == ("completed", f"schedule:{schedule['id']}")
    assert steps_of(run)["ping"].output == {"service": "billing", "run": str(run.pk)}
