"""What every ``orch`` command shares: its output (text or JSON), its errors as exit
codes, the client it calls, and how it writes credits, times and tables."""

from __future__ import annotations

import functools
import json
import os
import sys
from collections.abc import Callable
from datetime import UTC, datetime, tzinfo
from decimal import Decimal
from typing import Annotated, Any, Literal, NoReturn, TypeVar
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import typer
from rich.console import Console
from rich.table import Table

from orchestrator_client import config
from orchestrator_client.client import Client
from orchestrator_client.errors import OrchestratorError
from orchestrator_client.plans import PlanFileError

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130

# Boxed, coloured help and usage errors for a person at a terminal; plain click text in
# pipes and logs, where a box only wraps the message at 80 columns.
MARKUP: Literal["rich"] | None = "rich" if sys.stdout.isatty() and sys.stderr.isatty() else None

JsonOption = Annotated[
    bool, typer.Option("--json", help="Print JSON (for scripts) instead of text.")
]
IntervalOption = Annotated[
    float,
    typer.Option("--interval", min=0.05, help="Seconds between polls of the server."),
]
LimitOption = Annotated[int, typer.Option("--limit", min=0, help="At most this many (0: all).")]


def group(help: str) -> typer.Typer:
    """A group of commands (``orch runs``...), shown as the root is."""
    return typer.Typer(help=help, no_args_is_help=True, rich_markup_mode=MARKUP)


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


Answer = TypeVar("Answer")


def act(as_json: bool, call: Callable[[Client], Answer], said: Callable[[Answer], str]) -> None:
    """One call to the server (a run cancelled, a schedule paused...), its answer printed:
    as JSON, or as the line ``said`` makes of it."""
    out = Output(as_json)
    with client() as api:
        answer = call(api)
    if as_json:
        out.json(answer)
    else:
        out.line(said(answer))


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
def amount(value: str) -> str:
    """A decimal string without trailing zeros: 0.510000 -> 0.51."""
    number = Decimal(value).normalize()
    return f"{number:f}" if number != 0 else "0"


def page_for(limit: int) -> int:
    """The page size for ``--limit``: no more than needed, at most the API's 500."""
    return min(limit, 500) if limit else 500


def when(
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


def table_of(*columns: str) -> Table:
    table = Table(box=None, pad_edge=False, show_edge=False, header_style="bold")
    for column in columns:
        table.add_column(column, overflow="fold")
    return table
