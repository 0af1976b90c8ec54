"""Runner jobs in the engine, in process: a `runner` step parks, a runner claims its job,
and the job's reports end the step's attempt (runs.waits.runners, runs.engine.waiting)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from billing.models import Organization, Reservation
from orchestrator.tools.builtin import runner as runner_tool
from orchestrator.tools.builtin import validate_runner
from runs import services
from runs.engine.outcomes import Outcome
from runs.models import Run, Runner, RunnerJob
from runs.queries import QUERIES
from runs.states import InvalidTransition
from runs.waits import runners
from runs.waits.runners import DuplicateRunner, NotJobOwner, Report, RunnerNotFound
from tests.runs.engine.harness import EngineRun

pytestmark = pytest.mark.django_db

Start = Callable[[dict[str, Any]], EngineRun]


def runner_plan(params: dict[str, Any] | None = None, **step: Any) -> dict[str, Any]:
    return {
        "name": "runner plan",
        "agents": [
            {
                "name": "a",
                "tasks": [
                    {
                        "name": "t",
                        "steps": [
                            {"name": "job", "tool": "runner", "params": params or {"prompt": "hi"}},
                            {"name": "after", "tool": "noop"},
                        ],
                    }
                ],
            }
        ],
        **step,
    }


def park(engine: EngineRun, name: str = "job") -> RunnerJob:
    """Run the step's tool as a worker would, and record its wait."""
    step = engine.step(name)
    result = runner_tool(dict(step.params), None)  # type: ignore[arg-type]
    engine.finish(name, Outcome(wait=result.wait))
    return RunnerJob.objects.get(step=engine.step(name), attempt=engine.step(name).attempts)


def register(organization: Organization, hostname: str = "host-a", **kwargs: Any) -> Runner:
    return runners.register(
        organization=organization,
        hostname=hostname,
        project_dir=kwargs.pop("project_dir", "/srv/project"),
        executor_type=kwargs.pop("executor_type", "claude-code"),
        tags=kwargs.pop("tags", []),
    ).runner


def claim(engine: EngineRun, runner: Runner) -> runners.Poll:
    return runners.poll(organization=engine.run.organization, runner_id=runner.pk)


def send(engine: EngineRun, runner: Runner, job: RunnerJob, kind: str, **fields: Any) -> Any:
    with engine._committed():
        return runners.report(
            organization=engine.run.organization,
            runner_id=runner.pk,
            job_id=job.pk,
            report=Report(kind, **fields),
        )


def test_a_runner_step_parks_without_a_lease_and_its_job_waits_for_a_runner(
    engine_run: Start,
) -> None:
    engine = engine_run(runner_plan({"prompt": "write a haiku", "agent_name": "poet"}))

    job = park(engine)

    step = engine.step("job")
    assert (step.status, step.lease_expires_at, step.celery_task_id) == ("running", None, "")
    assert job.status == "pending"
    assert job.prompt == "write a haiku"
    assert job.agent_name == "poet"
    assert job.session_id.startswith("ses_")
    assert job.attempt == 1
    assert job.timeout_at > timezone.now() + timedelta(seconds=290)
    # The organization's held polls were woken, after commit.
    assert engine.transport.woken[-1] == (str(engine.run.organization_id), [])


def test_a_match_timeout_written_as_a_duration_bounds_the_wait_for_a_runner(
    engine_run: Start,
) -> None:
    engine = engine_run(runner_plan({"prompt": "hi", "match_timeout": "2m"}))
    before = timezone.now()

    job = park(engine)

    assert (
        before + timedelta(seconds=120) <= job.timeout_at <= timezone.now() + timedelta(seconds=120)
    )


def test_a_claimed_job_completes_its_step_with_the_result_and_is_charged_once(
    engine_run: Start,
) -> None:
    engine = engine_run(runner_plan())
    job = park(engine)
    runner = register(engine.run.organization)

    polled = claim(engine, runner)
    assert polled.job is not None
    assert polled.job.pk == job.pk
    assert claim(engine, runner).empty  # claimed once, by one runner
    send(engine, runner, job, "started")
    send(engine, runner, job, "completed", result={"answer": 42})
    charged = Reservation.objects.get(run_id=engine.run.pk).charged
    # A repeated identical report changes nothing: no second charge.
    send(engine, runner, job, "completed", result={"answer": 42})

    step = engine.step("job")
    assert (step.status, step.output) == ("completed", {"answer": 42})
    assert step.cost == Decimal("0.50")
    assert Reservation.objects.get(run_id=engine.run.pk).charged == charged
    assert engine.statuses()["after"] == "pending"
    assert engine.sent()[-1] == "after"
    with pytest.raises(InvalidTransition):
        send(engine, runner, job, "completed", result={"answer": 43})
    with pytest.raises(InvalidTransition):
        send(engine, runner, job, "started")


def test_only_the_runner_holding_a_job_may_report_on_it(engine_run: Start) -> None:
    engine = engine_run(runner_plan())
    job = park(engine)
    holder = register(engine.run.organization, "host-a")
    other = register(engine.run.organization, "host-b")
    claim(engine, holder)

    with pytest.raises(NotJobOwner):
        send(engine, other, job, "completed", result=None)
    assert RunnerJob.objects.get(pk=job.pk).status == "claimed"


def test_demands_match_exactly_and_require_every_tag(engine_run: Start) -> None:
    demands = {"hostname": "gpu-1", "tags": ["gpu", "cuda"]}
    engine = engine_run(runner_plan({"prompt": "train", "demands": demands}))
    job = park(engine)
    organization = engine.run.organization
    wrong_host = register(organization, "gpu-2", tags=["gpu", "cuda"])
    missing_tag = register(organization, "gpu-1", tags=["gpu"], project_dir="/a")
    matching = register(organization, "gpu-1", tags=["cuda", "gpu", "big"], project_dir="/b")

    assert claim(engine, wrong_host).empty
    assert claim(engine, missing_tag).empty
    polled = claim(engine, matching)
    assert polled.job is not None
    assert polled.job.pk == job.pk


def test_a_poll_claims_through_the_named_statement_in_runs_queries(engine_run: Start) -> None:
    engine = engine_run(runner_plan())
    job = park(engine)
    holder = register(engine.run.organization)
    statement = QUERIES["runner_jobs_claim"]

    with CaptureQueriesContext(connection) as ran:
        polled = claim(engine, holder)

    assert polled.job is not None
    assert polled.job.pk == job.pk
    claims = [
        query["sql"] for query in ran.captured_queries if "runs_runnerjob AS j" in query["sql"]
    ]
    assert len(claims) == 1
    assert claims[0].startswith(statement.split("%(", 1)[0])  # the file, up to its first parameter


def test_a_poll_claims_no_more_than_its_limit_whatever_plan_the_planner_picks(
    engine_run: Start,
) -> None:
    # A nested loop rescans its inner side for each outer row: a LIMIT ... SKIP LOCKED
    # there, rescanned, skips the rows this statement has just claimed and returns the
    # next ones, claiming past the limit (the poll then hands over fewer than it took).
    plan = runner_plan()
    task = plan["agents"][0]["tasks"][0]
    task["mode"], task["max_concurrent_steps"] = "parallel", 3
    task["steps"] = [
        {"name": f"job{n}", "tool": "runner", "params": {"prompt": "hi"}} for n in range(3)
    ]
    engine = engine_run(plan)
    jobs = [park(engine, f"job{n}") for n in range(3)]
    holder = register(engine.run.organization)
    with connection.cursor() as cursor:
        # The plan that rescans: the pick on the inner side of a nested loop, the outer
        # scan of every job (a table grown past a few pages chose it in a fresh clone's
        # suite; here the other plans are priced out).
        for setting in ("hashjoin", "mergejoin", "material", "hashagg", "sort"):
            cursor.execute(f"SET LOCAL enable_{setting} = off")

    polled = runners.poll(organization=engine.run.organization, runner_id=holder.pk, limit=1)

    assert [job.pk for job in polled.jobs] == [jobs[0].pk]
    statuses = RunnerJob.objects.filter(pk__in=[job.pk for job in jobs]).order_by("created_at")
    assert list(statuses.values_list("status", flat=True)) == ["claimed", "pending", "pending"]


def test_a_failure_report_is_retried_by_the_steps_policy_with_a_new_job(
    engine_run: Start,
) -> None:
    plan = runner_plan()
    plan["agents"][0]["tasks"][0]["steps"][0]["retry"] = {"max_attempts": 2, "base_delay_ms": 0}
    engine = engine_run(plan)
    first = park(engine)
    runner = register(engine.run.organization)
    claim(engine, runner)

    send(engine, runner, first, "failed", error="the agent crashed")

    step = engine.step("job")
    assert step.status == "pending"
    assert step.error["code"] == "runner_failed"
    second = park(engine)
    assert second.pk != first.pk
    assert second.attempt == 2
    assert RunnerJob.objects.get(pk=first.pk).status == "failed"


def test_a_stopped_report_fails_the_step_for_good(engine_run: Start) -> None:
    plan = runner_plan()
    plan["agents"][0]["tasks"][0]["steps"][0]["retry"] = {"max_attempts": 3}
    engine = engine_run(plan)
    job = park(engine)
    runner = register(engine.run.organization)
    claim(engine, runner)
    with engine._committed():
        runners.stop_job(organization=engine.run.organization, job_id=job.pk)

    assert engine.transport.woken[-1] == (None, [runner.pk])
    polled = claim(engine, runner)
    assert polled.stop_jobs == [str(job.pk)]
    assert claim(engine, runner).empty  # a stop command is handed over once
    send(engine, runner, job, "stopped", signal="SIGTERM")

    step = engine.step("job")
    assert step.status == "failed"
    assert step.error["code"] == "runner_stopped"


def test_cancelling_the_run_stops_its_jobs(engine_run: Start) -> None:
    engine = engine_run(runner_plan())
    job = park(engine)
    runner = register(engine.run.organization)
    claim(engine, runner)
    send(engine, runner, job, "started")

    with engine._committed():
        services.run_cancel(run_id=engine.run.pk)

    assert RunnerJob.objects.get(pk=job.pk).status == "stopping"
    assert claim(engine, runner).stop_jobs == [str(job.pk)]
    send(engine, runner, job, "stopped", signal="SIGKILL")  # accepted; the step stays cancelled
    assert engine.step("job").status == "cancelled"
    assert RunnerJob.objects.get(pk=job.pk).signal == "SIGKILL"


def test_a_pending_job_of_a_cancelled_run_ends_without_a_runner(engine_run: Start) -> None:
    engine = engine_run(runner_plan())
    job = park(engine)

    with engine._committed():
        services.run_cancel(run_id=engine.run.pk)

    assert RunnerJob.objects.get(pk=job.pk).status == "stopped"
    assert claim(engine, register(engine.run.organization)).empty


def test_the_sweep_recovers_a_stale_runners_jobs_and_fails_unmatched_ones(
    engine_run: Start, settings: Any
) -> None:
    plan = runner_plan()
    plan["agents"][0]["tasks"][0]["steps"][0]["retry"] = {"max_attempts": 2, "base_delay_ms": 0}
    plan["agents"][0]["tasks"][0]["steps"][0]["timeout"] = "1h"
    held = engine_run(plan)
    held_job = park(held)
    runner = register(held.run.organization)
    claim(held, runner)
    waits_long = runner_plan({"prompt": "x", "demands": {"tags": ["nobody"]}})
    waits_long["agents"][0]["tasks"][0]["steps"][0]["timeout"] = "1h"
    unmatched = engine_run(waits_long)
    unmatched_job = park(unmatched)

    later = timezone.now() + timedelta(seconds=settings.RUNNER_MATCH_TIMEOUT + 1)
    # Beat's look: the runner goes stale first, before the sweep below acts.
    assert timezone.now() < runners.next_due() <= later
    with held._committed():
        swept = runners.sweep(later)

    assert swept == {"runner_lost": 1, "no_matching_runner": 1, "timeout": 0}
    assert held.step("job").error["code"] == "runner_lost"
    assert held.step("job").status == "pending"  # retried
    assert RunnerJob.objects.get(pk=held_job.pk).status == "failed"
    assert unmatched.step("job").status == "failed"
    assert unmatched.step("job").error["code"] == "no_matching_runner"
    assert RunnerJob.objects.get(pk=unmatched_job.pk).status == "failed"
    with held._committed():
        assert runners.sweep(later) == {"runner_lost": 0, "no_matching_runner": 0, "timeout": 0}


def test_a_parked_step_times_out_by_its_own_limit_and_its_job_is_stopped(
    engine_run: Start,
) -> None:
    plan = runner_plan()
    plan["agents"][0]["tasks"][0]["steps"][0]["timeout"] = "90s"
    plan["agents"][0]["tasks"][0]["steps"][0]["retry"] = {"max_attempts": 1}
    engine = engine_run(plan)
    job = park(engine)
    runner = register(engine.run.organization)
    claim(engine, runner)

    # Beat's look: due when the step's own limit passes, between the two sweeps below.
    due = runners.next_due()
    assert due is not None
    assert timezone.now() + timedelta(seconds=60) < due <= timezone.now() + timedelta(seconds=91)
    with engine._committed():
        assert runners.sweep(timezone.now() + timedelta(seconds=60))["timeout"] == 0
    with engine._committed():
        assert runners.sweep(timezone.now() + timedelta(seconds=91))["timeout"] == 1

    step = engine.step("job")
    assert step.status == "failed"  # a timeout, with no attempt left
    job.refresh_from_db()
    assert job.status == "stopping"
    assert job.error == "the step timed out waiting for its runner job"
    assert engine.transport.woken[-1] == (None, [runner.pk])
    assert claim(engine, runner).stop_jobs == [str(job.pk)]


def test_an_identity_registers_once_while_online_and_reconnects_after(
    engine_run: Start, settings: Any
) -> None:
    engine = engine_run(runner_plan())
    organization = engine.run.organization
    first = register(organization)

    with pytest.raises(DuplicateRunner) as duplicate:
        register(organization)
    assert duplicate.value.details["runner_id"] == first.pk
    Runner.objects.filter(pk=first.pk).update(
        last_heartbeat=timezone.now() - timedelta(seconds=settings.RUNNER_STALE_AFTER + 1)
    )
    again = runners.register(
        organization=organization,
        hostname="host-a",
        project_dir="/srv/project",
        executor_type="claude-code",
    )
    assert again.reconnected
    assert again.runner.pk == first.pk
    runners.deregister(organization=organization, runner_id=first.pk)
    assert claim(engine, first).deregistered
    assert register(organization).pk == first.pk  # deregistered: a reconnection


def test_a_poll_held_across_a_restart_claims_nothing_for_the_gone_process(
    engine_run: Start,
) -> None:
    engine = engine_run(runner_plan())
    organization = engine.run.organization
    runner = register(organization)
    held = claim(engine, runner)  # nothing yet: the server holds this poll
    # The runner restarts (deregisters, registers again) while that poll is still held.
    runners.deregister(organization=organization, runner_id=runner.pk)
    assert register(organization).pk == runner.pk
    job = park(engine)

    later = runners.poll(
        organization=organization, runner_id=runner.pk, registered_at=held.registered_at
    )

    assert later.deregistered
    assert later.job is None
    assert RunnerJob.objects.get(pk=job.pk).status == "pending"
    fresh = claim(engine, runner)  # the new process's poll takes it
    assert fresh.job is not None
    assert fresh.job.pk == job.pk


def test_only_a_polls_first_look_is_a_heartbeat_and_a_stale_runners_later_look_claims_nothing(
    engine_run: Start,
) -> None:
    """A runner whose host vanished leaves its poll held by the server: the poll's later
    looks must neither keep it alive nor claim a job that nobody will run."""
    engine = engine_run(runner_plan())
    organization = engine.run.organization
    runner = register(organization)
    held = claim(engine, runner)  # the first look: a heartbeat, nothing to claim yet
    silent_since = timezone.now() - timedelta(seconds=3600)
    Runner.objects.filter(pk=runner.pk).update(last_heartbeat=silent_since)
    job = park(engine)

    later = runners.poll(
        organization=organization, runner_id=runner.pk, registered_at=held.registered_at
    )

    assert later.job is None
    assert not later.deregistered
    assert RunnerJob.objects.get(pk=job.pk).status == "pending"
    assert Runner.objects.get(pk=runner.pk).last_heartbeat == silent_since
    again = claim(engine, runner)  # a new poll: the runner is there, and takes it
    assert again.job is not None
    assert again.job.pk == job.pk
    assert Runner.objects.get(pk=runner.pk).last_heartbeat > silent_since


def test_a_held_polls_later_look_claims_for_a_live_runner_without_beating(
    engine_run: Start,
) -> None:
    engine = engine_run(runner_plan())
    organization = engine.run.organization
    runner = register(organization)
    held = claim(engine, runner)
    beat = Runner.objects.get(pk=runner.pk).last_heartbeat
    job = park(engine)

    later = runners.poll(
        organization=organization, runner_id=runner.pk, registered_at=held.registered_at
    )

    assert later.job is not None
    assert later.job.pk == job.pk
    assert Runner.objects.get(pk=runner.pk).last_heartbeat == beat


def test_another_organizations_runner_is_not_found(engine_run: Start) -> None:
    engine = engine_run(runner_plan())
    theirs = register(engine_run(runner_plan()).run.organization)

    with pytest.raises(RunnerNotFound):
        runners.poll(organization=engine.run.organization, runner_id=theirs.pk)


def test_resume_session_goes_to_the_runner_that_holds_the_session(engine_run: Start) -> None:
    first = engine_run(runner_plan())
    started = park(first)
    organization = first.run.organization
    holder = register(organization, "host-a")
    other = register(organization, "host-b")
    claim(first, holder)
    send(first, holder, started, "completed", result={})
    resume = {"prompt": "go on", "type": "resume_session", "session_id": started.session_id}
    second = engine_run(runner_plan(resume))
    job = park_in(second, organization)

    assert job.required_runner_id == holder.pk
    assert claim(first, other).empty
    polled = claim(first, holder)
    assert polled.job is not None
    assert polled.job.pk == job.pk


def park_in(engine: EngineRun, organization: Organization) -> RunnerJob:
    """``park``, for a run moved to ``organization`` (the harness gives each run an
    organization of its own; a session lives in one)."""
    Run.objects.filter(pk=engine.run.pk).update(organization=organization)
    engine.refresh()
    return park(engine)


@pytest.mark.parametrize(
    ("params", "problem"),
    [
        ({}, "prompt"),
        ({"prompt": "x", "type": "fork"}, "type"),
        ({"prompt": "x", "type": "resume_session"}, "session_id"),
        ({"prompt": "x", "demands": {"gpu": True}}, "demands.gpu"),
        ({"prompt": "x", "demands": {"tags": "gpu"}}, "demands.tags"),
        ({"prompt": "x", "match_timeout": 0}, "match_timeout"),
        ({"prompt": "x", "colour": "red"}, "colour"),
    ],
)
def test_runner_parameters_are_checked(params: dict[str, Any], problem: str) -> None:
    assert problem in [key for key, _ in validate_runner(params)]
