"""Tools written with ``@tool``, end to end with real processes: gunicorn serving the API,
the Celery worker running the fleet's tools (the example package's ``acme.word_stats``,
loaded from its entry point), and ``orch worker`` processes serving tools of their own
(tests/integration/worker_tools.py, examples/acme_tools)."""

from __future__ import annotations

import signal
import sys
from collections.abc import Iterator
from datetime import timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.utils import timezone

from billing.pricing import tool_price
from billing.services import api_key_create
from orchestrator.tools import packages
from runs import catalogue, selectors, services
from runs.models import NO_WORKER_OFFERS_TOOL, Run, Runner, RunnerJob, Step
from runs.plan import PlanInvalid
from runs.waits import runners
from tests import factories
from tests.integration.engine_support import assert_books_balanced, submit, wait_for
from tests.integration.web_support import gunicorn
from tests.support import Child, child_env, wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("celery_worker")]

TOOLS = "tests.integration.worker_tools"


@pytest.fixture(scope="module")
def web(django_db_setup: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with gunicorn(tmp_path_factory) as web:
        yield web.url


class WorkerProcess:
    """``orch worker`` in a process of its own."""

    def __init__(self, organization: Any, url: str, log: Path, *args: str) -> None:
        _, key = api_key_create(organization=organization, name=log.stem, scope="runner")
        self.organization = organization
        self.hostname = log.stem
        orch = str(Path(sys.executable).parent / "orch")
        command = [orch, "worker", *args, "--hostname", self.hostname, "--grace-period", "1"]
        self.child = Child(command, child_env(ORCH_URL=url, ORCH_API_KEY=key), log)

    def registered(self) -> Runner:
        def found() -> Runner | None:
            if not self.child.alive():
                raise AssertionError(f"worker exited:\n{self.child.output()}")
            return Runner.objects.filter(
                organization=self.organization, hostname=self.hostname, deregistered_at=None
            ).first()

        return wait_until(found, timeout=30, what=f"worker {self.hostname} to register")


@pytest.fixture
def start_worker(web: str, tmp_path: Path) -> Iterator[Any]:
    started: list[WorkerProcess] = []

    def start(organization: Any, name: str, *args: str) -> WorkerProcess:
        worker = WorkerProcess(organization, web, tmp_path / f"{name}.log", *args)
        started.append(worker)
        worker.registered()
        return worker

    yield start
    for worker in started:
        worker.child.stop(timeout=20)
        worker.child.kill_group()


def one_task(*steps: dict[str, Any], mode: str = "sequential") -> dict[str, Any]:
    return {
        "name": "tools",
        "agents": [{"name": "a", "tasks": [{"name": "t", "mode": mode, "steps": list(steps)}]}],
    }


def job_of(run: Run, name: str) -> RunnerJob:
    return wait_until(
        lambda: RunnerJob.objects.filter(run=run, step__name=name).order_by("-attempt").first(),
        timeout=30,
        what=f"the job of step {name}",
    )


def test_a_fleet_tool_and_a_worker_tool_run_in_one_dag(start_worker: Any) -> None:
    packages.publish("fleet-test")  # what each fleet worker does at its start
    organization = factories.org()
    start_worker(organization, "summarizer", "acme_tools.worker")
    text = "Tools are functions. They run anywhere. The fleet counts. The worker summarizes."
    plan = {
        "name": "fleet and worker",
        "agents": [
            {
                "name": "writer",
                "mode": "dag",
                "tasks": [
                    {
                        "name": "read",
                        "steps": [
                            {"name": "stats", "tool": "acme.word_stats", "params": {"text": text}}
                        ],
                    },
                    {
                        "name": "write",
                        "depends_on": ["read"],
                        "steps": [
                            {
                                "name": "summary",
                                "tool": "acme.summarize",
                                "params": {
                                    "text": text,
                                    "max_words": "${tasks.read.steps.stats.output.sentences}",
                                },
                            }
                        ],
                    },
                ],
            }
        ],
    }

    run = wait_for(submit(plan, organization=organization), timeout=60)

    assert run.status == "completed", run.last_error
    steps = {step.name: step for step in Step.objects.filter(run=run)}
    assert steps["stats"].output == {"words": 12, "sentences": 4, "top": ["the", "tools", "are"]}
    assert steps["summary"].output == {"summary": "Tools are functions.", "sentences": 1}
    job = RunnerJob.objects.get(step=steps["summary"])
    assert (job.tool, job.tool_version, job.status) == ("acme.summarize", "1", "completed")
    assert job.params == {"text": text, "max_words": 4}
    assert not RunnerJob.objects.filter(step=steps["stats"]).exists()  # ran on the fleet
    # The fleet tool's own cost rule (0.01), the worker tool at its price.
    assert steps["stats"].cost == Decimal("0.01")
    assert steps["summary"].cost == tool_price("acme.summarize")
    assert_books_balanced(run)


def test_progress_and_a_cancel_reach_the_function(start_worker: Any, tmp_path: Path) -> None:
    organization = factories.org()
    start_worker(organization, "counter", TOOLS)
    marker = tmp_path / "counting"
    run = submit(
        one_task(
            {
                "name": "count",
                "tool": "testing.count",
                "timeout": "5m",
                "params": {"to": 10_000, "pause": 0.05, "marker": str(marker)},
            }
        ),
        organization=organization,
    )
    job = job_of(run, "count")

    progressed = wait_until(
        lambda: RunnerJob.objects.filter(pk=job.pk, progress__counted__gte=2).first(),
        timeout=30,
        what="the tool's progress to reach the server",
    )
    services.run_cancel(run_id=run.pk)

    stopped = wait_until(
        lambda: RunnerJob.objects.filter(pk=job.pk, status="stopped").first(),
        timeout=30,
        what="the job to be stopped",
    )
    assert progressed.progress["of"] == 10_000
    # The function saw the cancel (Context.sleep raised) and ended within its grace.
    assert stopped.signal == "SIGTERM"
    assert Step.objects.get(pk=job.step_id).status == "cancelled"
    assert_books_balanced(wait_for(run))


def test_a_fleet_tools_progress_is_read_with_its_step_and_a_cancel_ends_it() -> None:
    packages.publish("fleet-test")
    organization = factories.org()
    text = " ".join(f"Sentence {n} is here." for n in range(2_000))
    run = submit(
        one_task(
            {
                "name": "stats",
                "tool": "acme.word_stats",
                "timeout": "5m",
                "params": {"text": text, "pause": 0.05},
            }
        ),
        organization=organization,
    )

    # Written by the step's lease renewal (ENGINE_HEARTBEAT_SECONDS), read as the API
    # reads the steps.
    def progress() -> Any:
        _, rows = selectors.steps_page(run=run, query={}, limit=10, offset=0)
        said = rows[0]["progress"] if rows else None
        return said if said and said["sentence"] >= 2 else None

    said = wait_until(progress, timeout=30, what="the tool's progress to be kept")
    services.run_cancel(run_id=run.pk)

    done = wait_for(run, timeout=30)
    assert said["of"] == 2_000
    step = Step.objects.get(run=run, name="stats")
    assert (done.status, step.status, step.output) == ("cancelled", "cancelled", None)
    assert_books_balanced(done)


def test_a_tool_that_ignores_a_stop_is_ended_after_the_grace_period(
    start_worker: Any, tmp_path: Path
) -> None:
    organization = factories.org()
    start_worker(organization, "stubborn", TOOLS, "--concurrency", "1")
    marker = tmp_path / "started"
    run = submit(
        one_task(
            {
                "name": "s",
                "tool": "testing.stubborn",
                "timeout": "5m",
                "params": {"marker": str(marker)},
            }
        ),
        organization=organization,
    )
    job = job_of(run, "s")
    wait_until(marker.exists, timeout=30, what="the stubborn tool to start")

    runners.stop_job(organization=organization, job_id=job.pk)

    stopped = wait_until(
        lambda: RunnerJob.objects.filter(pk=job.pk, status="stopped").first(),
        timeout=30,
        what="the job to be ended",
    )
    assert stopped.signal == "SIGKILL"
    # Its slot was given back: the worker (concurrency 1) takes the next job.
    second = submit(one_task({"name": "c", "tool": "testing.count", "params": {"to": 1}}),
                    organization=organization)  # fmt: skip
    assert wait_for(second, timeout=30).status == "completed"


def test_a_worker_killed_mid_job_has_its_job_retried_on_another_billed_once(
    start_worker: Any, tmp_path: Path
) -> None:
    organization = factories.org()
    first = start_worker(organization, "first", TOOLS)
    release = tmp_path / "release"
    run = submit(
        one_task(
            {
                "name": "w",
                "tool": "testing.when_released",
                "timeout": "5m",
                "retry": {"max_attempts": 3, "base_delay_ms": 10},
                "params": {"release": str(release)},
            }
        ),
        organization=organization,
    )
    lost = wait_until(
        lambda: RunnerJob.objects.filter(run=run, status="running").first(),
        timeout=30,
        what="the first worker to start the job",
    )
    first.child.stop(signal.SIGKILL)
    release.write_text("go")
    second = start_worker(organization, "second", TOOLS)
    # Time passes: the first worker has been silent past the stale time (its poll, held
    # by the server, claims nothing more from now on), and the beat's sweep comes.
    silent = timezone.now() - timedelta(seconds=settings.RUNNER_STALE_AFTER + 1)
    Runner.objects.filter(pk=lost.runner_id).update(last_heartbeat=silent)
    assert runners.sweep()["runner_lost"] == 1

    done = wait_for(run, timeout=60)

    assert done.status == "completed", done.last_error
    jobs = list(RunnerJob.objects.filter(run=run).order_by("attempt"))
    assert [(j.attempt, j.status, j.error_code) for j in jobs] == [
        (1, "failed", ""),
        (2, "completed", ""),
    ]
    assert (jobs[0].pk, jobs[0].result) == (lost.pk, None)
    assert jobs[1].runner_id == second.registered().pk
    step = Step.objects.get(run=run, name="w")
    assert (step.status, step.attempts, step.output) == ("completed", 2, jobs[1].result)
    # The lost attempt cost nothing; the one that completed, the tool's price once.
    assert step.cost == tool_price("testing.when_released")
    assert_books_balanced(done)


def test_two_workers_with_different_labels_each_take_the_steps_that_demand_theirs(
    start_worker: Any,
) -> None:
    organization = factories.org()
    gpu = start_worker(organization, "gpu", TOOLS, "--tags", "gpu").registered()
    cpu = start_worker(organization, "cpu", TOOLS, "--tags", "cpu").registered()
    steps = [
        {"name": f"{tag}{n}", "tool": "testing.count",
         "params": {"to": 1, "demands": {"tags": [tag]}}}
        for tag in ("gpu", "cpu")
        for n in range(3)
    ]  # fmt: skip

    run = wait_for(submit(one_task(*steps, mode="parallel"), organization=organization))

    assert run.status == "completed", run.last_error
    taken = {job.step.name: job.runner_id for job in RunnerJob.objects.filter(run=run)}
    assert taken == {f"{tag}{n}": holder.pk for tag, holder in (("gpu", gpu), ("cpu", cpu))
                     for n in range(3)}  # fmt: skip


def test_a_step_whose_tool_no_worker_offers_waits_and_runs_once_one_does(
    start_worker: Any, tmp_path: Path
) -> None:
    organization = factories.org()
    # Published by a worker that has since left.
    gone = start_worker(organization, "gone", TOOLS)
    gone.child.stop()
    wait_until(
        lambda: Runner.objects.filter(hostname="gone", deregistered_at__isnull=False).exists(),
        timeout=30,
        what="the worker to deregister",
    )
    run = submit(
        one_task({"name": "c", "tool": "testing.count", "params": {"to": 2}}),
        organization=organization,
    )
    waiting = wait_until(
        lambda: Step.objects.filter(run=run, waiting_reason=NO_WORKER_OFFERS_TOOL).first(),
        timeout=30,
        what="the step to wait for a worker",
    )
    assert waiting.status == "running"

    start_worker(organization, "back", TOOLS)

    assert wait_for(run, timeout=30).status == "completed"
    assert Step.objects.get(pk=waiting.pk).waiting_reason == ""


def test_a_tool_version_bump_checks_new_plans_against_it_and_sends_their_jobs_to_its_workers(
    start_worker: Any,
) -> None:
    organization = factories.org()
    old = start_worker(organization, "v1", TOOLS).registered()
    count = {"name": "c", "tool": "testing.count", "params": {"to": 4}}
    before = wait_for(submit(one_task(count), organization=organization))
    new = start_worker(organization, "v2", f"{TOOLS}_v2").registered()

    with pytest.raises(PlanInvalid) as refused:
        services.run_create(organization=organization, plan=one_task(count))
    bumped = {**count, "params": {"to": 4, "by": 2}}
    after = wait_for(submit(one_task(bumped), organization=organization))

    assert before.status == after.status == "completed"
    assert [(e.path, e.message) for e in refused.value.errors] == [
        ("agents[0].tasks[0].steps[0].params.by", "is required")
    ]
    jobs = {job.run_id: job for job in RunnerJob.objects.filter(run__in=[before, after])}
    assert (jobs[before.pk].tool_version, jobs[before.pk].runner_id) == ("1", old.pk)
    assert (jobs[after.pk].tool_version, jobs[after.pk].runner_id) == ("2", new.pk)
    assert jobs[after.pk].result == {"counted": [2, 4], "version": 2}
    current = catalogue.current_version(organization.pk, "testing.count")
    assert current is not None
    assert [row.version for row in catalogue.versions(current)] == ["2", "1"]
