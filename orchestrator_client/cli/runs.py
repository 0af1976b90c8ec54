"""``orch runs``: submit, list, show, follow and steer runs."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape

from orchestrator_client.cli.base import (
    EXIT_INTERRUPTED,
    IntervalOption,
    JsonOption,
    LimitOption,
    Output,
    act,
    amount,
    client,
    group,
    guarded,
    page_for,
    table_of,
    when,
)
from orchestrator_client.cli.display import event_line, run_lines, watch_run
from orchestrator_client.client import Client
from orchestrator_client.plans import PlanFile
from orchestrator_client.types import STATUS_ONLY, Event, RunDetail, Step
from orchestrator_client.types import Run as RunSummary
from orchestrator_client.watch import StepAttempts

# How many runner steps and `run` steps `orch runs show` lists (their jobs, child runs).
SHOWN_WORK = 20

app = group("Runs: submit, list, show, follow and steer them.")

RunArgument = Annotated[
    str, typer.Argument(help="The run's id.", metavar="RUN_ID", show_default=False)
]


@app.command("submit")
@guarded
def runs_submit(
    plan_file: Annotated[
        Path,
        typer.Argument(
            exists=True,
            dir_okay=False,
            readable=True,
            help="The plan: a .json, .yaml or .yml file holding the plan itself.",
            metavar="PLAN_FILE",
            show_default=False,
        ),
    ],
    watch: Annotated[bool, typer.Option("--watch", help="Follow the run until it ends.")] = False,
    start: Annotated[
        bool, typer.Option("--start/--no-start", help="Start the run (reserve and enqueue).")
    ] = True,
    interval: IntervalOption = 1.0,
    as_json: JsonOption = False,
) -> None:
    """Create a run from a plan file and start it; with --watch, follow it to its end
    (exit 0 completed, 1 failed or cancelled)."""
    out = Output(as_json)
    plan = PlanFile.read(plan_file)
    with client() as api:
        run = api.submit_text(plan.text, format=plan.format, start=start)
        if watch:
            if not out.as_json:
                out.line(f"run {run['id']} ({run['name']}) created: {run['status']}")
            watch_run(api, out, run, interval)
    if as_json:
        out.json(run)
    else:
        out.line(f"run {run['id']} ({run['name']}) created: {run['status']}")
        out.line(f"follow it: orch runs watch {run['id']}")


@app.command("watch")
@guarded
def runs_watch(
    run_id: RunArgument, interval: IntervalOption = 1.0, as_json: JsonOption = False
) -> None:
    """Follow a run until it ends (exit 0 completed, 1 failed or cancelled)."""
    out = Output(as_json)
    with client() as api:
        watch_run(api, out, api.get_run(run_id, exclude=STATUS_ONLY), interval)


@app.command("ls")
@guarded
def runs_ls(
    status: Annotated[
        list[str] | None, typer.Option("--status", help="Only these statuses (repeatable).")
    ] = None,
    name: Annotated[str | None, typer.Option("--name", help="Part of the name.")] = None,
    limit: LimitOption = 20,
    as_json: JsonOption = False,
) -> None:
    """Your runs, newest first."""
    out = Output(as_json)
    with client() as api:
        runs: list[RunSummary] = list(
            api.runs(
                status=status or None, name=name, page_size=page_for(limit), limit=limit or None
            )
        )
    if as_json:
        out.json(runs)
        return
    table = table_of("ID", "NAME", "STATUS", "ATTEMPT", "CREATED (UTC)", "CHARGED")
    for run in runs:
        table.add_row(
            run["id"],
            escape(run["name"]),
            run["status"],
            str(run["attempt_number"]),
            when(run["created_at"], labelled=False),
            amount(run["credits"]["charged"]),
        )
    out.console.print(table) if runs else out.line("no runs")


@app.command("show")
@guarded
def runs_show(run_id: RunArgument, as_json: JsonOption = False) -> None:
    """One run: status, progress, credits, last error, failed steps, the runner jobs and
    child runs its steps started, and what its running steps wait for or their tools
    last said of their progress."""
    out = Output(as_json)
    with client() as api:
        run = api.get_run(run_id)
        failed = (
            list(api.steps(run_id, status="failed")) if run["counts"]["steps"].get("failed") else []
        )
        # The current attempt's work elsewhere, a page of each at most.
        jobs = list(api.steps(run_id, tool="runner", page_size=SHOWN_WORK, limit=SHOWN_WORK))
        children = list(api.steps(run_id, tool="run", page_size=SHOWN_WORK, limit=SHOWN_WORK))
        # Parked steps say what they wait for (a worker tool nobody offers now, say),
        # running published tools how far they got.
        running = (
            list(api.steps(run_id, status="running", page_size=SHOWN_WORK, limit=SHOWN_WORK))
            if run["counts"]["steps"].get("running")
            else []
        )
    if as_json:
        out.json(run)
        return
    for line in run_lines(run):
        out.line(line)
    for step in failed:
        error = step["error"] or {}
        out.line(
            f"failed    {_step_path(step)} (step {step['id']}, attempt {step['attempts']}): "
            f"{error.get('code', 'error')}: {error.get('message', '')}"
        )
    for step in jobs:
        job = f"job {step['job']}" if step["job"] else "no job yet"
        out.line(f"runner    {_step_path(step)} (step {step['id']}, {step['status']}): {job}")
    for step in children:
        child = f"child run {step['child_run']}" if step["child_run"] else "no child run yet"
        out.line(f"child     {_step_path(step)} (step {step['id']}, {step['status']}): {child}")
    for step in running:
        if step["waiting_reason"]:
            out.line(
                f"waiting   {_step_path(step)} (step {step['id']}, {step['tool']}): "
                f"{step['waiting_reason']}"
            )
        elif step.get("progress") is not None:  # a published tool's, fleet or worker
            out.line(
                f"progress  {_step_path(step)} (step {step['id']}, {step['tool']}): "
                f"{json.dumps(step['progress'])}"
            )


def _step_path(step: Step) -> str:
    return f"{step['agent_name']}.{step['task_name']}.{step['name']}"


@app.command("events")
@guarded
def runs_events(
    run_id: RunArgument,
    follow: Annotated[
        bool, typer.Option("--follow", "-f", help="Keep printing events until the run ends.")
    ] = False,
    kind: Annotated[str | None, typer.Option("--kind", help="Only events of this kind.")] = None,
    attempt: Annotated[int | None, typer.Option("--attempt", help="One attempt's.")] = None,
    after: Annotated[int | None, typer.Option("--after", help="Events after this id.")] = None,
    # Accepted for the scripts that pass it: --follow no longer polls (it streams).
    interval: Annotated[float, typer.Option("--interval", min=0.05, hidden=True)] = 1.0,
    as_json: JsonOption = False,
) -> None:
    """The run's history, oldest first, each event named by its plan path and attempt.
    With --follow, the events as they happen (the server's event stream, resumed where it
    left off if the connection drops) until the run ends.
    With --json: a JSON array, or with --follow one JSON object per line."""
    out = Output(as_json)
    with client() as api:
        events: Iterable[Event]
        if follow:
            events = (
                event
                for event in api.stream_events(run_id, last_event_id=after)
                if (kind is None or event["kind"] == kind)
                and (attempt is None or event["attempt_number"] == attempt)
            )
        else:
            events = api.events(run_id, after=after, kind=kind, attempt=attempt, page_size=500)
        if as_json and not follow:
            out.json(list(events))
            return
        attempts = StepAttempts()
        try:
            for event in events:
                if as_json:
                    out.json(event, compact=True)
                else:
                    out.line(event_line(event, attempts.see(event)))
        except KeyboardInterrupt:
            raise typer.Exit(EXIT_INTERRUPTED) from None


def _control(run_id: str, as_json: bool, call: Callable[[Client], RunDetail]) -> None:
    act(as_json, call, lambda run: f"run {run['id']}: {run['status']}")


@app.command("cancel")
@guarded
def runs_cancel(
    run_id: RunArgument,
    reason: Annotated[str | None, typer.Option("--reason", help="Why; kept with the run.")] = None,
    as_json: JsonOption = False,
) -> None:
    """Cancel a run: running steps are stopped, unused credits refunded."""
    _control(run_id, as_json, lambda api: api.cancel_run(run_id, reason=reason))


@app.command("pause")
@guarded
def runs_pause(run_id: RunArgument, as_json: JsonOption = False) -> None:
    """Pause a running run: nothing new starts."""
    _control(run_id, as_json, lambda api: api.pause_run(run_id))


@app.command("resume")
@guarded
def runs_resume(run_id: RunArgument, as_json: JsonOption = False) -> None:
    """Resume a paused run."""
    _control(run_id, as_json, lambda api: api.resume_run(run_id))


@app.command("retry")
@guarded
def runs_retry(
    run_id: RunArgument,
    reuse_completed: Annotated[
        bool,
        typer.Option(
            "--reuse-completed",
            help="Take the steps the failed attempt completed as done: not run, not charged.",
        ),
    ] = False,
    as_json: JsonOption = False,
) -> None:
    """Retry a failed run: a new attempt with a new reservation."""
    reuse = "completed" if reuse_completed else None
    _control(run_id, as_json, lambda api: api.retry_run(run_id, reuse=reuse))


@app.command("fork")
@guarded
def runs_fork(
    run_id: RunArgument,
    from_step: Annotated[
        str,
        typer.Option(
            "--from", help="The step (agent.task.step) it runs again from.", show_default=False
        ),
    ],
    plan_file: Annotated[
        Path | None,
        typer.Option(
            "--plan",
            exists=True,
            dir_okay=False,
            readable=True,
            help="An edited plan, a .json, .yaml or .yml file as `runs submit` takes: the "
            "steps it reuses must be unchanged.",
        ),
    ] = None,
    variables: Annotated[
        str | None, typer.Option("--variables", help="A JSON object laid over the variables.")
    ] = None,
    start: Annotated[bool, typer.Option("--start/--no-start", help="Start the fork.")] = True,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Show what it would reuse and run; create nothing.")
    ] = False,
    as_json: JsonOption = False,
) -> None:
    """Fork an ended run from a step: what came before it and completed is reused."""
    out = Output(as_json)
    plan = PlanFile.read(plan_file) if plan_file else None
    values = _json_object(variables, "--variables") if variables is not None else None
    with client() as api:
        if dry_run:
            preview = api.fork_preview(run_id, from_step, plan=plan, variables=values)
            if as_json:
                out.json(preview)
                return
            out.line(f"reuse: {', '.join(preview['reuse']) or '-'}")
            out.line(f"run: {', '.join(preview['run']) or '-'}")
            out.line(f"reservation: {preview['reservation']}")
            return
        run = api.fork_run(run_id, from_step, plan=plan, variables=values, start=start)
    if as_json:
        out.json(run)
    else:
        out.line(f"run {run['id']} forked from {run_id} at {from_step}: {run['status']}")


def _json_object(text: str, option: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise typer.BadParameter(f"not JSON: {exc}", param_hint=option) from None
    if not isinstance(value, dict):
        raise typer.BadParameter("must be a JSON object", param_hint=option)
    return value


StepOption = Annotated[
    int | None, typer.Option("--step", min=1, help="One waiting step's id (default: all).")
]
CommentOption = Annotated[str | None, typer.Option("--comment", help="Kept with the decision.")]


def _decide(
    run_id: str, approve: bool, step: int | None, comment: str | None, as_json: bool
) -> None:
    out = Output(as_json)
    with client() as api:
        decide = api.approve if approve else api.reject
        decision = decide(run_id, step_id=step, comment=comment)
    if as_json:
        out.json(decision)
        return
    verb = "approved" if approve else "rejected"
    steps = ", ".join(str(step_id) for step_id in decision["steps"]) or "nothing was waiting"
    out.line(f"{verb}: {steps}; run {run_id}: {decision['run']['status']}")


@app.command("approve")
@guarded
def runs_approve(
    run_id: RunArgument,
    step: StepOption = None,
    comment: CommentOption = None,
    as_json: JsonOption = False,
) -> None:
    """Approve the steps waiting for approval (one with --step)."""
    _decide(run_id, True, step, comment, as_json)


@app.command("reject")
@guarded
def runs_reject(
    run_id: RunArgument,
    step: StepOption = None,
    comment: CommentOption = None,
    as_json: JsonOption = False,
) -> None:
    """Reject the steps waiting for approval (they fail with approval_rejected)."""
    _decide(run_id, False, step, comment, as_json)
