"""``orch jobs``: runner jobs, the attempts of `runner` steps: list, show and stop them."""

from __future__ import annotations

import json
from typing import Annotated

import typer
from rich.markup import escape

from orchestrator_client.cli.base import (
    JsonOption,
    LimitOption,
    Output,
    act,
    client,
    group,
    guarded,
    page_for,
    table_of,
    when,
)
from orchestrator_client.types import RunnerJob

app = group("Runner jobs: the attempts of `runner` steps, list, show and stop them.")


def _job_lines(job: RunnerJob) -> list[str]:
    lines = [
        f"job       {job['id']}  {job['type']}",
        *([f"tool      {job['tool']} {job['tool_version']}"] if job.get("tool") else []),
        f"status    {job['status']}",
        f"run       {job['run']} (step {job['step']}, attempt {job['attempt']})",
        f"runner    {job['runner_id'] or 'none yet'}",
        f"created   {when(job['created_at'])}",
    ]
    if job["started_at"]:
        lines.append(f"started   {when(job['started_at'])}")
    if job["stop_requested_at"]:
        lines.append(f"stopping  since {when(job['stop_requested_at'])}")
    if job["completed_at"]:
        lines.append(f"ended     {when(job['completed_at'])}")
    if job.get("progress") is not None:
        lines.append(f"progress  {json.dumps(job['progress'])}")
    if job["error"]:
        code = f"{job['error_code']}: " if job.get("error_code") else ""
        lines.append(f"error     {code}{job['error']}")
    return lines


@app.command("ls")
@guarded
def jobs_ls(
    run: Annotated[str | None, typer.Option("--run", help="One run's jobs.")] = None,
    step: Annotated[int | None, typer.Option("--step", help="One step's jobs.")] = None,
    status: Annotated[
        list[str] | None, typer.Option("--status", help="Only these statuses (repeatable).")
    ] = None,
    runner: Annotated[str | None, typer.Option("--runner", help="One runner's jobs.")] = None,
    limit: LimitOption = 20,
    as_json: JsonOption = False,
) -> None:
    """Your runner jobs, newest first."""
    out = Output(as_json)
    with client() as api:
        jobs = list(
            api.runner_jobs(
                run=run,
                step=step,
                status=status or None,
                runner_id=runner,
                page_size=page_for(limit),
                limit=limit or None,
            )
        )
    if as_json:
        out.json(jobs)
        return
    table = table_of("ID", "STATUS", "RUN", "STEP", "ATTEMPT", "RUNNER", "CREATED (UTC)")
    for job in jobs:
        table.add_row(
            job["id"],
            job["status"],
            job["run"],
            str(job["step"]),
            str(job["attempt"]),
            escape(job["runner_id"] or ""),
            when(job["created_at"], labelled=False),
        )
    out.console.print(table) if jobs else out.line("no jobs")


JobArgument = Annotated[
    str, typer.Argument(help="The job's id.", metavar="JOB_ID", show_default=False)
]


@app.command("show")
@guarded
def jobs_show(job_id: JobArgument, as_json: JsonOption = False) -> None:
    """One runner job: its status, run and step, runner and times."""
    out = Output(as_json)
    with client() as api:
        job = api.get_runner_job(job_id)
    if as_json:
        out.json(job)
        return
    for line in _job_lines(job):
        out.line(line)


@app.command("stop")
@guarded
def jobs_stop(job_id: JobArgument, as_json: JsonOption = False) -> None:
    """Stop a claimed or running job: its runner is told at once (the API answers 409
    for a job that is not running)."""
    act(
        as_json,
        lambda api: api.stop_runner_job(job_id),
        lambda job: f"job {job['id']}: {job['status']}",
    )
