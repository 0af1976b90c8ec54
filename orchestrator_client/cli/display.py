"""How ``orch`` shows a run: its summary lines, its events, and a watched run's
progress, live at a terminal or a line per change in logs and pipes."""

from __future__ import annotations

from typing import Any, NoReturn

import typer
from rich.markup import escape
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)

from orchestrator_client.cli.base import (
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_OK,
    Output,
    amount,
    when,
)
from orchestrator_client.client import Client
from orchestrator_client.types import Event, RunDetail
from orchestrator_client.watch import WatchUpdate


def _steps_line(counts: dict[str, int]) -> str:
    return ", ".join(f"{status} {n}" for status, n in sorted(counts.items())) or "none yet"


def _progress_text(run: RunDetail) -> str:
    progress = run["progress"]
    return f"{progress['steps_finished']}/{progress['steps_total']} steps ({progress['percent']}%)"


def run_lines(run: RunDetail) -> list[str]:
    credits = run["credits"]
    lines = [
        f"run       {run['id']}  {run['name']}",
        f"status    {run['status']} (attempt {run['attempt_number']} of {run['max_attempts']})",
        f"progress  {_progress_text(run)}",
        f"steps     {_steps_line(run['counts']['steps'])}",
        f"credits   reserved {amount(credits['reserved'])}, charged "
        f"{amount(credits['charged'])}, refunded {amount(credits['refunded'])}, held "
        f"{amount(credits['held'])}",
        f"created   {when(run['created_at'])} by {run['created_by']}",
    ]
    if run["completed_at"]:
        lines.append(f"ended     {when(run['completed_at'])}")
    if run["queued_reason"]:
        lines.append(f"queued    {run['queued_reason']}")
    if run["cancel_reason"]:
        lines.append(f"cancelled {run['cancel_reason']}")
    if run["last_error"]:
        error = run["last_error"]
        lines.append(f"error     {error['code']}: {error['message']}")
    return lines


def _event_label(event: Event, step_attempt: int | None) -> str:
    if not event["path"]:
        if event["entity"] == "run":
            return "run"
        return f"{event['entity']} {event['entity_id']}"
    if event["entity"] == "step" and step_attempt:
        return f"{event['path']} (attempt {step_attempt})"
    return event["path"]


def event_line(event: Event, step_attempt: int | None) -> str:
    """One event for people: id, time, kind, what (its plan path and, for a step, its
    attempt), the change of status and the message."""
    change = ""
    if event["from_status"] or event["to_status"]:
        change = f"  {event['from_status'] or '-'} -> {event['to_status'] or '-'}"
    message = f"  {event['message']}" if event["message"] else ""
    run_attempt = (
        f"  [run attempt {event['attempt_number']}]" if event["attempt_number"] > 1 else ""
    )
    return (
        f"{event['id']:>7}  {when(event['created_at'])}  {event['kind']:<10}  "
        f"{_event_label(event, step_attempt)}{change}{message}{run_attempt}"
    )


def _outcome(run: RunDetail) -> str:
    if run["status"] == "completed":
        charged = amount(run["credits"]["charged"])
        return f"run {run['id']} completed: {_progress_text(run)}, {charged} credits charged"
    error = run["last_error"]
    why = f": {error['code']}: {error['message']}" if error else ""
    if run["status"] == "cancelled" and run["cancel_reason"]:
        why = f": {run['cancel_reason']}"
    return f"run {run['id']} {run['status']}{why}"


def _exit_for(run: RunDetail) -> int:
    return EXIT_OK if run["status"] == "completed" else EXIT_FAILED


# --------------------------------------------------------------------------- watching
class PlainDisplay:
    """For logs and pipes: a line whenever the status, the progress or an agent changes."""

    def __init__(self, out: Output) -> None:
        self.out = out
        self._last = ""

    def __enter__(self) -> PlainDisplay:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def update(self, update: WatchUpdate) -> None:
        for failure in update.failures:
            self.out.line(_failure_line(failure))
        for approval in update.approvals:
            self.out.line(_approval_line(update.run["id"], approval))
        run = update.run
        agents = " | ".join(
            f"{a.name} {a.steps_finished}/{a.steps_total or '?'} {a.status}" for a in update.agents
        )
        line = f"[{run['status']}] {_progress_text(run)}" + (f" | {agents}" if agents else "")
        if line != self._last:
            self.out.line(line)
            self._last = line


class LiveDisplay:
    """For a person at a terminal: an overall bar, one bar per agent, failures above."""

    def __init__(self, out: Output, run: RunDetail) -> None:
        self.out = out
        self.progress = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[status]}"),
            TimeElapsedColumn(),
            console=out.console,
        )
        self.overall = self.progress.add_task(
            escape(f"run {run['name']}"), total=None, status=run["status"]
        )
        self.agents: dict[str, TaskID] = {}

    def __enter__(self) -> LiveDisplay:
        self.progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.progress.stop()

    def update(self, update: WatchUpdate) -> None:
        console = self.progress.console
        for failure in update.failures:
            style = "red" if failure.final else "yellow"
            console.print(f"[{style}]{escape(_failure_line(failure))}[/]")
        for approval in update.approvals:
            console.print(f"[cyan]{escape(_approval_line(update.run['id'], approval))}[/]")
        run = update.run
        total = run["progress"]["steps_total"] or None
        self.progress.update(
            self.overall,
            total=total,
            completed=run["progress"]["steps_finished"],
            status=run["status"],
        )
        for agent in update.agents:
            if agent.name not in self.agents:
                self.agents[agent.name] = self.progress.add_task(
                    escape(f"  {agent.name}"), total=None, status=agent.status
                )
            self.progress.update(
                self.agents[agent.name],
                total=agent.steps_total or None,
                completed=min(agent.steps_finished, agent.steps_total or agent.steps_finished),
                status=agent.status,
            )


def _failure_line(failure: Any) -> str:
    attempt = f" (attempt {failure.attempt})" if failure.attempt else ""
    what = "FAILED" if failure.final else "attempt failed, retrying:"
    return f"{what} {failure.path}{attempt}: {failure.code}: {failure.message}"


def _approval_line(run_id: str, approval: Any) -> str:
    return (
        f"WAITING {approval.path} (step {approval.step_id}) for approval: "
        f"orch runs approve {run_id} --step {approval.step_id}"
    )


def watch_run(api: Client, out: Output, run: RunDetail, interval: float) -> NoReturn:
    """Follow the run to its end with a display; exit 0 if it completed, else 1."""
    final = run
    try:
        if out.as_json:
            final = api.wait(run["id"], interval=interval)
        else:
            display: LiveDisplay | PlainDisplay = (
                LiveDisplay(out, run) if out.live else PlainDisplay(out)
            )
            with display:
                for update in api.watch(run["id"], interval=interval):
                    display.update(update)
                    final = update.run
    except KeyboardInterrupt:
        out.errors.print(
            f"stopped watching run {run['id']}; it goes on (orch runs watch {run['id']})",
            markup=False,
        )
        raise typer.Exit(EXIT_INTERRUPTED) from None
    if out.as_json:
        out.json(final)
    else:
        out.line(_outcome(final))
    raise typer.Exit(_exit_for(final))
