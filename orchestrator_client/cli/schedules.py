"""``orch schedules``: run a plan by cron or every interval; list, create, pause,
resume, trigger and remove schedules (docs/schedules.md)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Literal

import typer
from rich.markup import escape

from orchestrator_client.cli.base import (
    EXIT_USAGE,
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
from orchestrator_client.client import Client
from orchestrator_client.plans import PlanFile
from orchestrator_client.types import Schedule, ScheduleDetail, ScheduleFire

app = group(
    "Schedules: run a plan by cron or every interval; list, create, pause, resume, "
    "trigger and remove them."
)

ScheduleArgument = Annotated[
    str, typer.Argument(help="The schedule's id.", metavar="SCHEDULE_ID", show_default=False)
]
SHOWN_FIRES = 10


def _cadence(schedule: Schedule) -> str:
    return f"every {schedule['interval']}" if schedule["interval"] else f"cron {schedule['cron']}"


def _next_due(schedule: Schedule, *, seconds: bool = True) -> str:
    """In the schedule's zone, named; none while paused (resuming computes it again),
    with why when it paused itself (`paused (insufficient_credits)`)."""
    if schedule["status"] == "paused":
        reason = schedule.get("paused_reason")
        return f"paused ({reason})" if reason and reason != "manual" else "paused"
    return when(schedule["next_due_at"], schedule["timezone"], seconds=seconds) or "-"


def _run_ref(schedule: Schedule | ScheduleFire, key: Literal["last_run", "run"]) -> str:
    run = schedule.get(key)
    return f"{run['id']} ({run['status']})" if isinstance(run, dict) else "-"


def _schedule_lines(schedule: ScheduleDetail) -> list[str]:
    zone = schedule["timezone"]
    lines = [
        f"schedule  {schedule['id']}  {schedule['name']}",
        f"status    {schedule['status']}",
        f"when      {_cadence(schedule)} ({schedule['timezone']})",
        f"policies  overlap {schedule['overlap']}, catchup {schedule['catchup']}",
        f"next due  {_next_due(schedule)}",
        f"last due  {when(schedule['last_due_at'], zone) or '-'}",
        f"last run  {_run_ref(schedule, 'last_run')}",
    ]
    if schedule["start_at"] or schedule["end_at"]:
        start, end = when(schedule["start_at"], zone), when(schedule["end_at"], zone)
        lines.append(f"window    {start or '-'} to {end or '-'}")
    if schedule["variables"]:
        lines.append(f"variables {json.dumps(schedule['variables'], ensure_ascii=False)}")
    return lines


def _fire_line(fire: ScheduleFire, zone: str) -> str:
    why = f"  {fire['reason']}: {fire['message']}" if fire["status"] == "skipped" else ""
    run = f"  run {_run_ref(fire, 'run')}" if fire["run"] else ""
    return f"{when(fire['due_at'], zone)}  {fire['kind']:<9}  {fire['status']:<7}{run}{why}"


def _variables(pairs: list[str] | None) -> dict[str, str] | None:
    variables: dict[str, str] = {}
    for pair in pairs or []:
        name, equals, value = pair.partition("=")
        if not equals or not name.strip():
            raise typer.BadParameter(f"{pair!r} is not NAME=VALUE", param_hint="--var")
        variables[name.strip()] = value
    return variables or None


@app.command("ls")
@guarded
def schedules_ls(
    status: Annotated[str | None, typer.Option("--status", help="active, paused or ended.")] = None,
    name: Annotated[str | None, typer.Option("--name", help="Part of the name.")] = None,
    limit: LimitOption = 20,
    as_json: JsonOption = False,
) -> None:
    """Your schedules, newest first, with their next due time and last run."""
    out = Output(as_json)
    with client() as api:
        schedules: list[Schedule] = list(
            api.schedules(
                status=status,  # type: ignore[arg-type]
                name=name,
                page_size=page_for(limit),
                limit=limit or None,
            )
        )
    if as_json:
        out.json(schedules)
        return
    # The next due time in the schedule's zone, named in the column beside it.
    table = table_of("ID", "NAME", "STATUS", "WHEN", "NEXT DUE", "TIMEZONE", "LAST RUN")
    for schedule in schedules:
        table.add_row(
            schedule["id"],
            escape(schedule["name"]),
            schedule["status"],
            escape(_cadence(schedule)),
            _next_due(schedule, seconds=False).removesuffix(f" {schedule['timezone']}"),
            schedule["timezone"],
            _run_ref(schedule, "last_run"),
        )
    out.console.print(table) if schedules else out.line("no schedules")


@app.command("show")
@guarded
def schedules_show(schedule_id: ScheduleArgument, as_json: JsonOption = False) -> None:
    """One schedule: timing, policies, next and last due time, last run, and what became
    of its latest due times."""
    out = Output(as_json)
    with client() as api:
        schedule = api.get_schedule(schedule_id)
        fires = list(api.schedule_fires(schedule_id, page_size=SHOWN_FIRES, limit=SHOWN_FIRES))
    if as_json:
        out.json({**schedule, "fires": fires})
        return
    for line in _schedule_lines(schedule):
        out.line(line)
    for fire in fires:
        out.line(f"fired     {_fire_line(fire, schedule['timezone'])}")


@app.command("create")
@guarded
def schedules_create(
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
    cron: Annotated[
        str | None,
        typer.Option("--cron", help="Five cron fields ('30 2 * * *') or @daily, @hourly..."),
    ] = None,
    interval: Annotated[
        str | None,
        typer.Option("--interval", "--every", help="Every so long: '30s', '5m', '1h'..."),
    ] = None,
    name: Annotated[
        str | None, typer.Option("--name", help="The schedule's name (default: the file's).")
    ] = None,
    timezone: Annotated[
        str | None, typer.Option("--timezone", help="IANA name the cron is read in (UTC).")
    ] = None,
    start_at: Annotated[
        str | None, typer.Option("--start-at", help="ISO 8601: the anchor, first due time.")
    ] = None,
    end_at: Annotated[
        str | None, typer.Option("--end-at", help="ISO 8601: nothing is due after it.")
    ] = None,
    overlap: Annotated[
        str | None, typer.Option("--overlap", help="skip (default), allow or cancel_previous.")
    ] = None,
    catchup: Annotated[
        str | None, typer.Option("--catchup", help="none (default), latest or all.")
    ] = None,
    var: Annotated[
        list[str] | None,
        typer.Option("--var", help="NAME=VALUE laid over the plan's variables (repeatable)."),
    ] = None,
    as_json: JsonOption = False,
) -> None:
    """Run a plan file by --cron or every --interval (docs/schedules.md)."""
    out = Output(as_json)
    if (cron is None) == (interval is None):
        out.fail(EXIT_USAGE, "usage", "give either --cron or --interval")
    plan = PlanFile.read(plan_file)
    with client() as api:
        schedule = api.create_schedule_text(
            plan.text,
            format=plan.format,
            name=name or plan_file.stem,
            cron=cron,
            interval=interval,
            timezone=timezone,
            start_at=start_at,
            end_at=end_at,
            overlap=overlap,
            catchup=catchup,
            variables=_variables(var),
        )
    if as_json:
        out.json(schedule)
        return
    out.line(f"schedule {schedule['id']} ({schedule['name']}) created: {_cadence(schedule)}")
    out.line(f"next due  {_next_due(schedule)}")


def _schedule_control(
    schedule_id: str, as_json: bool, call: Callable[[Client], ScheduleDetail]
) -> None:
    def said(schedule: ScheduleDetail) -> str:
        status = schedule["status"]
        due = "" if status == "paused" else f", next due {_next_due(schedule)}"
        return f"schedule {schedule['id']}: {status}{due}"

    act(as_json, call, said)


@app.command("pause")
@guarded
def schedules_pause(schedule_id: ScheduleArgument, as_json: JsonOption = False) -> None:
    """Stop firing (runs already started go on)."""
    _schedule_control(schedule_id, as_json, lambda api: api.pause_schedule(schedule_id))


@app.command("resume")
@guarded
def schedules_resume(schedule_id: ScheduleArgument, as_json: JsonOption = False) -> None:
    """Fire again from the next due time (missed ones are not caught up)."""
    _schedule_control(schedule_id, as_json, lambda api: api.resume_schedule(schedule_id))


@app.command("trigger")
@guarded
def schedules_trigger(schedule_id: ScheduleArgument, as_json: JsonOption = False) -> None:
    """Start a run of the schedule's plan now."""
    out = Output(as_json)
    with client() as api:
        fire = api.trigger_schedule(schedule_id)
    if as_json:
        out.json(fire)
        return
    run = fire["run"]
    started = f"run {run['id']} started: {run['status']}" if run else "no run started"
    out.line(f"schedule {fire['schedule']}: {started}")


@app.command("rm")
@guarded
def schedules_rm(schedule_id: ScheduleArgument, as_json: JsonOption = False) -> None:
    """Delete a schedule (its runs stay)."""
    out = Output(as_json)
    with client() as api:
        api.delete_schedule(schedule_id)
    if as_json:
        out.json({"id": schedule_id, "deleted": True})
    else:
        out.line(f"schedule {schedule_id} deleted")
