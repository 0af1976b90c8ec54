"""``orch``: the orchestrator from a terminal or a script (docs/cli.md).

    orch login --url http://127.0.0.1:8000 --api-key ork_...
    orch runs submit plan.yaml --watch
    orch runs ls --status failed
    orch runs events RUN --follow
    orch balance --json

Exit codes: 0 success (a watched run completed); 1 the API refused (the error's code and
message are printed), the server could not be reached, or a watched run failed or was
cancelled; 2 a usage error (an unknown command or option, a missing or unreadable plan
file, no URL or API key configured). ``--json`` on every command prints JSON on stdout
(one document; ``events --follow`` prints one event per line) and errors as
``{"error": {status, code, message, details}}``.
"""

from __future__ import annotations

import functools
import json
import os
import sys
from collections.abc import Callable, Iterable
from datetime import UTC, datetime, tzinfo
from decimal import Decimal
from pathlib import Path
from typing import Annotated, Any, Literal, NoReturn, TypeVar
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Table

from orchestrator_client import config
from orchestrator_client._version import __version__
from orchestrator_client.client import Client, api_root
from orchestrator_client.errors import OrchestratorError
from orchestrator_client.plans import PlanFile, PlanFileError
from orchestrator_client.types import (
    STATUS_ONLY,
    Event,
    RunDetail,
    RunnerJob,
    Schedule,
    ScheduleDetail,
    ScheduleFire,
    Step,
)
from orchestrator_client.types import Run as RunSummary
from orchestrator_client.watch import StepAttempts, WatchUpdate

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130
# How many runner steps and `run` steps `orch runs show` lists (their jobs, child runs).
SHOWN_WORK = 20

# Boxed, coloured help and usage errors for a person at a terminal; plain click text in
# pipes and logs, where a box only wraps the message at 80 columns.
MARKUP: Literal["rich"] | None = "rich" if sys.stdout.isatty() and sys.stderr.isatty() else None

app = typer.Typer(
    name="orch",
    help="The run orchestrator's command line: submit, watch and steer runs.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=MARKUP,
)
runs_app = typer.Typer(
    help="Runs: submit, list, show, follow and steer them.",
    no_args_is_help=True,
    rich_markup_mode=MARKUP,
)
app.add_typer(runs_app, name="runs")
jobs_app = typer.Typer(
    help="Runner jobs: the attempts of `runner` steps, list, show and stop them.",
    no_args_is_help=True,
    rich_markup_mode=MARKUP,
)
app.add_typer(jobs_app, name="jobs")
schedules_app = typer.Typer(
    help="Schedules: run a plan by cron or every interval; list, create, pause, resume, "
    "trigger and remove them.",
    no_args_is_help=True,
    rich_markup_mode=MARKUP,
)
app.add_typer(schedules_app, name="schedules")

JsonOption = Annotated[
    bool, typer.Option("--json", help="Print JSON (for scripts) instead of text.")
]
RunArgument = Annotated[
    str, typer.Argument(help="The run's id.", metavar="RUN_ID", show_default=False)
]
IntervalOption = Annotated[
    float,
    typer.Option("--interval", min=0.05, help="Seconds between polls of the server."),
]
LimitOption = Annotated[int, typer.Option("--limit", min=0, help="At most this many (0: all).")]


# --------------------------------------------------------------------------- output
class Output:
    """Where results and errors go: text for people, or JSON for scripts."""

    def __init__(self, as_json: bool) -> None:
        self.as_json = as_json
        self.console = Console(
            highlight=False, width=None if sys.stdout.isatty() else 200, soft_wrap=False
        )
        self.errors = Console(stderr=True, highlight=False, soft_wrap=True)

    @property
    def live(self) -> bool:
        """A person at a terminal: a live progress display is welcome."""
        return not self.as_json and self.console.is_terminal

    def json(self, value: Any, *, compact: bool = False) -> None:
        text = json.dumps(value, ensure_ascii=False, indent=None if compact else 2)
        sys.stdout.write(text + "\n")
        sys.stdout.flush()

    def line(self, text: str) -> None:
        """A line of plain text (never read as markup)."""
        self.console.print(text, markup=False, soft_wrap=True)

    def fail(self, code: int, error: str, message: str) -> NoReturn:
        """A problem found here, before any request (no HTTP status)."""
        if self.as_json:
            body = {"status": None, "code": error, "message": message, "details": None}
            self.json({"error": body})
        self.errors.print(f"error: {error}: {message}", markup=False)
        raise typer.Exit(code)

    def api_error(self, exc: OrchestratorError) -> NoReturn:
        status = f" (HTTP {exc.status})" if exc.status else ""
        if self.as_json:
            body = {
                "status": exc.status,
                "code": exc.code,
                "message": exc.message,
                "details": exc.details,
            }
            self.json({"error": body})
        self.errors.print(f"error: {exc.code}: {exc.message}{status}", markup=False)
        for line in _detail_lines(exc.details):
            self.errors.print(f"  {line}", markup=False)
        raise typer.Exit(EXIT_FAILED)


def _detail_lines(details: Any) -> list[str]:
    if isinstance(details, list):
        lines = []
        for item in details:
            if isinstance(item, dict) and "message" in item:
                where = item.get("path") or ""
                lines.append(f"{where}: {item['message']}" if where else str(item["message"]))
            else:
                lines.append(str(item))
        return lines
    if isinstance(details, dict):
        return [f"{key}: {value}" for key, value in details.items()]
    return []


Command = TypeVar("Command", bound=Callable[..., Any])


def guarded(command: Command) -> Command:
    """Errors as exit codes: the API's or the network's 1, the user's 2."""

    @functools.wraps(command)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        out = Output(bool(kwargs.get("as_json", False)))
        try:
            return command(*args, **kwargs)
        except OrchestratorError as exc:
            out.api_error(exc)
        except config.ConfigError as exc:
            out.fail(EXIT_USAGE, "not_configured", str(exc))
        except PlanFileError as exc:
            out.fail(EXIT_USAGE, "plan_file", str(exc))

    return wrapper  # type: ignore[return-value]


def client() -> Client:
    """A client for the configured server. ``ORCH_TIMEOUT``: seconds per request (30);
    ``ORCH_RETRIES``: tries after a transient failure (3)."""
    try:
        timeout = float(os.environ.get("ORCH_TIMEOUT") or 30)
        retries = int(os.environ.get("ORCH_RETRIES") or 3)
        return Client.from_config(timeout=timeout, retries=retries)
    except ValueError as exc:
        raise config.ConfigError(str(exc)) from exc


# --------------------------------------------------------------------------- formats
def _credits(value: str) -> str:
    """A decimal string without trailing zeros: 0.510000 -> 0.51."""
    number = Decimal(value).normalize()
    return f"{number:f}" if number != 0 else "0"


def _page(limit: int) -> int:
    """The page size for ``--limit``: no more than needed, at most the API's 500."""
    return min(limit, 500) if limit else 500


def _when(
    value: str | None, zone: str | None = None, *, seconds: bool = True, labelled: bool = True
) -> str:
    """A time of the API (ISO 8601 with its offset) with its zone: read in ``zone`` (an
    IANA name, a schedule's) and named, else in UTC and labelled so (``labelled=False``:
    a table's column says "(UTC)" once instead); "" for none. A zone this machine does
    not know is read as UTC."""
    if not value:
        return ""
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        return value  # not a time: as it came
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    label, where = _zone(zone)
    written = moment.astimezone(where).strftime(
        "%Y-%m-%d %H:%M:%S" if seconds else "%Y-%m-%d %H:%M"
    )
    return f"{written} {label}" if labelled else written


def _zone(name: str | None) -> tuple[str, tzinfo]:
    """The zone ``name`` (IANA) and its name; UTC for none, or one unknown here."""
    if name and name != "UTC":
        try:
            return name, ZoneInfo(name)
        except (ZoneInfoNotFoundError, ValueError):
            pass
    return "UTC", UTC


def _table(*columns: str) -> Table:
    table = Table(box=None, pad_edge=False, show_edge=False, header_style="bold")
    for column in columns:
        table.add_column(column, overflow="fold")
    return table


def _steps_line(counts: dict[str, int]) -> str:
    return ", ".join(f"{status} {n}" for status, n in sorted(counts.items())) or "none yet"


def _progress_text(run: RunDetail) -> str:
    progress = run["progress"]
    return f"{progress['steps_finished']}/{progress['steps_total']} steps ({progress['percent']}%)"


def _run_lines(run: RunDetail) -> list[str]:
    credits = run["credits"]
    lines = [
        f"run       {run['id']}  {run['name']}",
        f"status    {run['status']} (attempt {run['attempt_number']} of {run['max_attempts']})",
        f"progress  {_progress_text(run)}",
        f"steps     {_steps_line(run['counts']['steps'])}",
        f"credits   reserved {_credits(credits['reserved'])}, charged "
        f"{_credits(credits['charged'])}, refunded {_credits(credits['refunded'])}, held "
        f"{_credits(credits['held'])}",
        f"created   {_when(run['created_at'])} by {run['created_by']}",
    ]
    if run["completed_at"]:
        lines.append(f"ended     {_when(run['completed_at'])}")
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


def _event_line(event: Event, step_attempt: int | None) -> str:
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
        f"{event['id']:>7}  {_when(event['created_at'])}  {event['kind']:<10}  "
        f"{_event_label(event, step_attempt)}{change}{message}{run_attempt}"
    )


def _outcome(run: RunDetail) -> str:
    if run["status"] == "completed":
        charged = _credits(run["credits"]["charged"])
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


# --------------------------------------------------------------------------- commands
def _version(value: bool) -> None:
    if value:
        sys.stdout.write(f"orch {__version__}\n")
        raise typer.Exit(EXIT_OK)


@app.callback()
def root(
    version: Annotated[
        bool,
        typer.Option("--version", callback=_version, is_eager=True, help="Print the version."),
    ] = False,
) -> None:
    """Set the server with `orch login` (or ORCH_URL and ORCH_API_KEY), then use `orch runs`."""


@app.command()
@guarded
def login(
    url: Annotated[str, typer.Option("--url", prompt="Server URL", help="The server's root URL.")],
    api_key: Annotated[
        str,
        typer.Option("--api-key", prompt="API key", hide_input=True, help="An API key (ork_...)."),
    ],
    verify: Annotated[
        bool, typer.Option("--verify/--no-verify", help="Check the key with the server first.")
    ] = True,
    as_json: JsonOption = False,
) -> None:
    """Keep the server's URL and an API key in your config directory (mode 600)."""
    out = Output(as_json)
    try:
        settings = config.Config(url=api_root(url), api_key=api_key.strip())
    except ValueError as exc:
        raise config.ConfigError(str(exc)) from exc
    organization = None
    if verify:
        with Client(settings.url, settings.api_key) as api:
            organization = api.organization()
    path = config.save(settings)
    if as_json:
        out.json({"url": settings.url, "config": str(path), "organization": organization})
        return
    who = f" as organization {organization['name']}" if organization else ""
    out.line(f"logged in to {settings.url}{who}; saved to {path}")


@runs_app.command("submit")
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


@runs_app.command("watch")
@guarded
def runs_watch(
    run_id: RunArgument, interval: IntervalOption = 1.0, as_json: JsonOption = False
) -> None:
    """Follow a run until it ends (exit 0 completed, 1 failed or cancelled)."""
    out = Output(as_json)
    with client() as api:
        watch_run(api, out, api.get_run(run_id, exclude=STATUS_ONLY), interval)


@runs_app.command("ls")
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
            api.runs(status=status or None, name=name, page_size=_page(limit), limit=limit or None)
        )
    if as_json:
        out.json(runs)
        return
    table = _table("ID", "NAME", "STATUS", "ATTEMPT", "CREATED (UTC)", "CHARGED")
    for run in runs:
        table.add_row(
            run["id"],
            escape(run["name"]),
            run["status"],
            str(run["attempt_number"]),
            _when(run["created_at"], labelled=False),
            _credits(run["credits"]["charged"]),
        )
    out.console.print(table) if runs else out.line("no runs")


@runs_app.command("show")
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
    for line in _run_lines(run):
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


@runs_app.command("events")
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
                    out.line(_event_line(event, attempts.see(event)))
        except KeyboardInterrupt:
            raise typer.Exit(EXIT_INTERRUPTED) from None


def _control(run_id: str, as_json: bool, act: Callable[[Client], RunDetail]) -> None:
    out = Output(as_json)
    with client() as api:
        run = act(api)
    if as_json:
        out.json(run)
    else:
        out.line(f"run {run['id']}: {run['status']}")


@runs_app.command("cancel")
@guarded
def runs_cancel(
    run_id: RunArgument,
    reason: Annotated[str | None, typer.Option("--reason", help="Why; kept with the run.")] = None,
    as_json: JsonOption = False,
) -> None:
    """Cancel a run: running steps are stopped, unused credits refunded."""
    _control(run_id, as_json, lambda api: api.cancel_run(run_id, reason=reason))


@runs_app.command("pause")
@guarded
def runs_pause(run_id: RunArgument, as_json: JsonOption = False) -> None:
    """Pause a running run: nothing new starts."""
    _control(run_id, as_json, lambda api: api.pause_run(run_id))


@runs_app.command("resume")
@guarded
def runs_resume(run_id: RunArgument, as_json: JsonOption = False) -> None:
    """Resume a paused run."""
    _control(run_id, as_json, lambda api: api.resume_run(run_id))


@runs_app.command("retry")
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


@runs_app.command("fork")
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


@runs_app.command("approve")
@guarded
def runs_approve(
    run_id: RunArgument,
    step: StepOption = None,
    comment: CommentOption = None,
    as_json: JsonOption = False,
) -> None:
    """Approve the steps waiting for approval (one with --step)."""
    _decide(run_id, True, step, comment, as_json)


@runs_app.command("reject")
@guarded
def runs_reject(
    run_id: RunArgument,
    step: StepOption = None,
    comment: CommentOption = None,
    as_json: JsonOption = False,
) -> None:
    """Reject the steps waiting for approval (they fail with approval_rejected)."""
    _decide(run_id, False, step, comment, as_json)


@app.command()
@guarded
def balance(as_json: JsonOption = False) -> None:
    """Your credits: available, reserved (held by runs in progress), spent, total."""
    out = Output(as_json)
    with client() as api:
        amounts = api.balance()
    if as_json:
        out.json(amounts)
        return
    table = _table("AVAILABLE", "RESERVED", "SPENT", "TOTAL")
    table.add_row(
        _credits(amounts["available"]),
        _credits(amounts["reserved"]),
        _credits(amounts["spent"]),
        _credits(amounts["total"]),
    )
    out.console.print(table)


@app.command()
@guarded
def ledger(
    type: Annotated[
        str | None, typer.Option("--type", help="grant, reserve, charge or refund.")
    ] = None,
    run: Annotated[str | None, typer.Option("--run", help="One run's entries.")] = None,
    limit: LimitOption = 20,
    as_json: JsonOption = False,
) -> None:
    """Every movement of your credits, newest first."""
    out = Output(as_json)
    with client() as api:
        entries = list(api.ledger(type=type, run=run, page_size=_page(limit), limit=limit or None))
    if as_json:
        out.json(entries)
        return
    table = _table("CREATED (UTC)", "TYPE", "AMOUNT", "RUN", "REASON")
    for entry in entries:
        table.add_row(
            _when(entry["created_at"], labelled=False),
            entry["type"],
            _credits(entry["amount"]),
            entry["run"] or "",
            escape(entry["reason"]),
        )
    out.console.print(table) if entries else out.line("no entries")


# --------------------------------------------------------------------------- worker
@app.command()
@guarded
def worker(
    modules: Annotated[
        list[str],
        typer.Argument(
            help="Where the @tool functions are: modules (pkg.tools) or attributes "
            "(pkg.tools:summarize).",
            show_default=False,
        ),
    ],
    concurrency: Annotated[int, typer.Option("--concurrency", min=1, help="Jobs at once.")] = 8,
    tags: Annotated[
        str, typer.Option("--tags", help="Labels steps may demand, comma separated.")
    ] = "",
    hostname: Annotated[
        str | None, typer.Option("--hostname", help="Its name (default: this host's).")
    ] = None,
    project_dir: Annotated[
        str | None,
        typer.Option("--project-dir", help="With the hostname, its identity (default: cwd)."),
    ] = None,
    grace_period: Annotated[
        float,
        typer.Option("--grace-period", min=0, help="Seconds a stopped tool has to end."),
    ] = 5.0,
) -> None:
    """Serve your @tool functions from this host (docs/tools.md): register as a runner
    offering them, run their steps, until SIGINT or SIGTERM."""
    from orchestrator_client.worker import serve  # imports the tools' modules

    serve(
        modules,
        concurrency=concurrency,
        tags=[tag.strip() for tag in tags.split(",") if tag.strip()],
        hostname=hostname,
        project_dir=project_dir,
        grace_period=grace_period,
    )


# --------------------------------------------------------------------------- runner jobs
def _job_lines(job: RunnerJob) -> list[str]:
    lines = [
        f"job       {job['id']}  {job['type']}",
        *([f"tool      {job['tool']} {job['tool_version']}"] if job.get("tool") else []),
        f"status    {job['status']}",
        f"run       {job['run']} (step {job['step']}, attempt {job['attempt']})",
        f"runner    {job['runner_id'] or 'none yet'}",
        f"created   {_when(job['created_at'])}",
    ]
    if job["started_at"]:
        lines.append(f"started   {_when(job['started_at'])}")
    if job["stop_requested_at"]:
        lines.append(f"stopping  since {_when(job['stop_requested_at'])}")
    if job["completed_at"]:
        lines.append(f"ended     {_when(job['completed_at'])}")
    if job.get("progress") is not None:
        lines.append(f"progress  {json.dumps(job['progress'])}")
    if job["error"]:
        code = f"{job['error_code']}: " if job.get("error_code") else ""
        lines.append(f"error     {code}{job['error']}")
    return lines


@jobs_app.command("ls")
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
                page_size=_page(limit),
                limit=limit or None,
            )
        )
    if as_json:
        out.json(jobs)
        return
    table = _table("ID", "STATUS", "RUN", "STEP", "ATTEMPT", "RUNNER", "CREATED (UTC)")
    for job in jobs:
        table.add_row(
            job["id"],
            job["status"],
            job["run"],
            str(job["step"]),
            str(job["attempt"]),
            escape(job["runner_id"] or ""),
            _when(job["created_at"], labelled=False),
        )
    out.console.print(table) if jobs else out.line("no jobs")


JobArgument = Annotated[
    str, typer.Argument(help="The job's id.", metavar="JOB_ID", show_default=False)
]


@jobs_app.command("show")
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


@jobs_app.command("stop")
@guarded
def jobs_stop(job_id: JobArgument, as_json: JsonOption = False) -> None:
    """Stop a claimed or running job: its runner is told at once (the API answers 409
    for a job that is not running)."""
    out = Output(as_json)
    with client() as api:
        job = api.stop_runner_job(job_id)
    if as_json:
        out.json(job)
    else:
        out.line(f"job {job['id']}: {job['status']}")


# --------------------------------------------------------------------------- schedules
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
    return _when(schedule["next_due_at"], schedule["timezone"], seconds=seconds) or "-"


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
        f"last due  {_when(schedule['last_due_at'], zone) or '-'}",
        f"last run  {_run_ref(schedule, 'last_run')}",
    ]
    if schedule["start_at"] or schedule["end_at"]:
        start, end = _when(schedule["start_at"], zone), _when(schedule["end_at"], zone)
        lines.append(f"window    {start or '-'} to {end or '-'}")
    if schedule["variables"]:
        lines.append(f"variables {json.dumps(schedule['variables'], ensure_ascii=False)}")
    return lines


def _fire_line(fire: ScheduleFire, zone: str) -> str:
    why = f"  {fire['reason']}: {fire['message']}" if fire["status"] == "skipped" else ""
    run = f"  run {_run_ref(fire, 'run')}" if fire["run"] else ""
    return f"{_when(fire['due_at'], zone)}  {fire['kind']:<9}  {fire['status']:<7}{run}{why}"


def _variables(pairs: list[str] | None) -> dict[str, str] | None:
    variables: dict[str, str] = {}
    for pair in pairs or []:
        name, equals, value = pair.partition("=")
        if not equals or not name.strip():
            raise typer.BadParameter(f"{pair!r} is not NAME=VALUE", param_hint="--var")
        variables[name.strip()] = value
    return variables or None


@schedules_app.command("ls")
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
                page_size=_page(limit),
                limit=limit or None,
            )
        )
    if as_json:
        out.json(schedules)
        return
    # The next due time in the schedule's zone, named in the column beside it.
    table = _table("ID", "NAME", "STATUS", "WHEN", "NEXT DUE", "TIMEZONE", "LAST RUN")
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


@schedules_app.command("show")
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


@schedules_app.command("create")
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
    schedule_id: str, as_json: bool, act: Callable[[Client], ScheduleDetail]
) -> None:
    out = Output(as_json)
    with client() as api:
        schedule = act(api)
    if as_json:
        out.json(schedule)
    else:
        status = schedule["status"]
        due = "" if status == "paused" else f", next due {_next_due(schedule)}"
        out.line(f"schedule {schedule['id']}: {status}{due}")


@schedules_app.command("pause")
@guarded
def schedules_pause(schedule_id: ScheduleArgument, as_json: JsonOption = False) -> None:
    """Stop firing (runs already started go on)."""
    _schedule_control(schedule_id, as_json, lambda api: api.pause_schedule(schedule_id))


@schedules_app.command("resume")
@guarded
def schedules_resume(schedule_id: ScheduleArgument, as_json: JsonOption = False) -> None:
    """Fire again from the next due time (missed ones are not caught up)."""
    _schedule_control(schedule_id, as_json, lambda api: api.resume_schedule(schedule_id))


@schedules_app.command("trigger")
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


@schedules_app.command("rm")
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


def main() -> None:
    """The console script ``orch``."""
    app()
